"""The Python package's shared locks and semaphores against the real
cluster (three `fencelock serve` processes with mutual TLS): two readers
hold at once with their own rising tokens while a writer is refused, a
semaphore of 2 grants two permits and refuses a third, and a resource used
in another kind raises ModeMismatchError."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable, Iterator

import pytest

from agents import selected_agents
from cluster import Cluster
from fencelock import (Client, ClientConfig, LockHeldError, Mode, ModeMismatchError, Reason, RejectedError, TlsConfig,
                       WatchEventKind)
from fencelock.aio import AsyncClient

pytestmark = pytest.mark.skipif("python" not in selected_agents()[0], reason="python agent not selected")


def _config(cluster: Cluster) -> ClientConfig:
    tls = cluster.client_tls()
    return ClientConfig(call_timeout_ms=10_000, tls=TlsConfig.from_files(tls["ca_file"], tls["cert_file"],
                                                                         tls["key_file"]))


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Callable[[], Client]]:
    made: list[Client] = []

    def make() -> Client:
        c = Client(cluster.endpoints, _config(cluster))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def fresh(what: str) -> str:
    return f"acme/py-{what}-{os.getpid()}-{time.monotonic_ns()}"


def wait_for_modes(c: Client) -> None:
    """Shared and semaphore acquires are refused with FEATURE_NOT_ENABLED
    until the placement controller has raised the cluster format to 5."""
    end = time.monotonic() + 60
    while True:
        try:
            c.acquire(fresh("modes-probe"), ttl=5, mode="shared").release()
            return
        except RejectedError as e:
            if e.reason is not Reason.FEATURE_NOT_ENABLED or time.monotonic() > end:
                raise
        time.sleep(0.5)


def test_two_readers_hold_at_once_with_rising_tokens_and_a_writer_is_refused(
        cluster: Cluster, client: Callable[[], Client]) -> None:
    a, b, writer = client(), client(), client()
    wait_for_modes(a)
    resource = fresh("readers")
    r1 = a.acquire(resource, ttl=30, mode="shared")
    r2 = b.acquire(resource, ttl=30, mode=Mode.SHARED)
    assert r1.held and r2.held
    assert r2.token > r1.token > 0, "every grant mints its own, larger token"

    with pytest.raises(LockHeldError) as e:
        writer.acquire(resource, ttl=30, wait=0)
    assert e.value.reason is Reason.LOCK_HELD

    state = writer.get(resource)
    assert state.held and state.mode is Mode.SHARED and state.permits == 0
    assert state.fencing_token == r1.token
    assert [(h.fencing_token, h.mode) for h in state.holders] == [(r1.token, Mode.SHARED), (r2.token, Mode.SHARED)]
    with writer.watch(resource) as w:
        first = next(w)
    assert first.kind is WatchEventKind.STATE and first.held
    assert [h.fencing_token for h in first.holders] == [r1.token, r2.token]

    assert r1.release() and r2.release()
    w_lease = writer.acquire(resource, ttl=30, wait=0)
    assert w_lease.token > r2.token
    assert [h.mode for h in writer.get(resource).holders] == [Mode.EXCLUSIVE]
    w_lease.release()


def test_a_semaphore_of_two_grants_two_and_refuses_a_third(cluster: Cluster, client: Callable[[], Client]) -> None:
    a, b, c = client(), client(), client()
    wait_for_modes(a)
    resource = fresh("semaphore")
    p1 = a.acquire(resource, ttl=30, mode="semaphore", permits=2)
    p2 = b.acquire(resource, ttl=30, mode="semaphore", permits=2)
    assert p2.token > p1.token
    with pytest.raises(LockHeldError) as e:
        c.acquire(resource, ttl=30, mode="semaphore", permits=2)
    assert e.value.reason is Reason.LOCK_HELD
    state = c.get(resource)
    assert (state.mode, state.permits) == (Mode.SEMAPHORE, 2)
    assert [h.fencing_token for h in state.holders] == [p1.token, p2.token]

    assert p1.release()
    p3 = c.acquire(resource, ttl=30, mode="semaphore", permits=2)
    assert p3.token > p2.token
    assert [h.fencing_token for h in c.get(resource).holders] == [p2.token, p3.token]
    p2.release()
    p3.release()


def test_a_resource_in_use_as_another_kind_raises_mode_mismatch(
        cluster: Cluster, client: Callable[[], Client]) -> None:
    a, b = client(), client()
    wait_for_modes(a)
    semaphore = fresh("mismatch-sem")
    held = a.acquire(semaphore, ttl=30, mode="semaphore", permits=2)
    with pytest.raises(ModeMismatchError) as e:
        b.acquire(semaphore, ttl=30, mode="semaphore", permits=3)
    assert e.value.reason is Reason.MODE_MISMATCH and e.value.code == "FAILED_PRECONDITION"
    assert e.value.detail.field == "permits" and e.value.detail.min_allowed == 2
    for mode in ("exclusive", "shared"):
        with pytest.raises(ModeMismatchError):
            b.acquire(semaphore, ttl=30, mode=mode)  # type: ignore[arg-type]
    held.release()

    lock = fresh("mismatch-lock")
    reader = a.acquire(lock, ttl=30, mode="shared")
    with pytest.raises(ModeMismatchError):
        b.acquire(lock, ttl=30, mode="semaphore", permits=2)
    reader.release()
    # Free again: now it may be a semaphore.
    b.acquire(lock, ttl=30, mode="semaphore", permits=2).release()


def test_asyncio_shared_and_mismatch(cluster: Cluster, client: Callable[[], Client]) -> None:
    wait_for_modes(client())
    resource = fresh("aio-readers")

    async def main() -> None:
        async with AsyncClient(cluster.endpoints, _config(cluster)) as a, \
                AsyncClient(cluster.endpoints, _config(cluster)) as b:
            async with a.lock(resource, ttl=30, mode="shared") as r1, b.lock(resource, ttl=30, mode="shared") as r2:
                assert r2.token > r1.token
                state = await a.get(resource)
                assert [h.fencing_token for h in state.holders] == [r1.token, r2.token]
                with pytest.raises(LockHeldError):
                    await b.acquire(resource, ttl=30)
                with pytest.raises(ModeMismatchError):
                    await b.acquire(resource, ttl=30, mode="semaphore", permits=2)
            assert not (await a.get(resource)).held

    asyncio.run(asyncio.wait_for(main(), 60))
