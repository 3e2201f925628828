"""The Python package's watches and elections against the real cluster
(three `fencelock serve` processes with mutual TLS): a watcher sees a
grant and its release with the holder's token, a watch resumed after a
revision goes on from there, and an election hands over from a resigning
leader to the candidate queued behind it, which observe() reports."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from typing import Callable, Iterator, TypeVar

import pytest

from agents import selected_agents
from cluster import Cluster
from fencelock import Client, ClientConfig, RejectedError, Reason, TlsConfig, Watch, WatchEvent, WatchEventKind
from fencelock.aio import AsyncClient

pytestmark = pytest.mark.skipif("python" not in selected_agents()[0], reason="python agent not selected")

T = TypeVar("T")
K = WatchEventKind


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


def _config(cluster: Cluster) -> ClientConfig:
    tls = cluster.client_tls()
    return ClientConfig(call_timeout_ms=10_000, tls=TlsConfig.from_files(tls["ca_file"], tls["cert_file"],
                                                                         tls["key_file"]))


def fresh(what: str) -> str:
    return f"acme/py-{what}-{os.getpid()}-{time.monotonic_ns()}"


def within(seconds: float, f: Callable[[], T], what: str) -> T:
    """``f()`` on a thread, failing the test if it takes longer (a watch
    that never sees the event would otherwise hang the suite)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(f).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"timed out after {seconds}s waiting for {what}") from None
    finally:
        pool.shutdown(wait=False)


def next_event(w: Watch, what: str) -> WatchEvent:
    return within(20, lambda: next(w), what)


def wait_for_values(c: Client) -> None:
    """Values (an election's address) are refused with FEATURE_NOT_ENABLED
    until the placement controller has seen every member read them."""
    end = time.monotonic() + 60
    while True:
        try:
            c.acquire(fresh("values-probe"), ttl=5, value=b"probe").release()
            return
        except RejectedError as e:
            if e.reason is not Reason.FEATURE_NOT_ENABLED or time.monotonic() > end:
                raise
        time.sleep(0.5)


def test_a_watcher_sees_the_grant_and_the_release_with_the_holders_token(
        cluster: Cluster, client: Callable[[], Client]) -> None:
    watcher, holder = client(), client()
    resource = fresh("watch")
    with watcher.watch(resource) as w:
        state = next_event(w, "the state now")
        assert state.kind is K.STATE and not state.held and state.fencing_token == 0
        lease = holder.acquire(resource, ttl=30)
        granted = next_event(w, "GRANTED")
        assert granted.kind is K.GRANTED and granted.held
        assert granted.fencing_token == lease.token
        assert lease.release()
        released = next_event(w, "RELEASED")
        assert released.kind is K.RELEASED and not released.held
        assert released.fencing_token == lease.token
        assert state.revision and granted.revision and released.revision
        assert state.revision < granted.revision < released.revision
        assert w.after == released.revision

    # Resumed after the grant: the release follows, the grant is not repeated.
    with watcher.watch(resource, after=granted.revision, resume=True) as again:
        first = next_event(again, "the change after the grant")
        assert (first.kind, first.revision, first.fencing_token) == (K.RELEASED, released.revision, lease.token)
        second = holder.acquire(resource, ttl=30)
        nxt = next_event(again, "the next grant")
        assert nxt.kind is K.GRANTED and nxt.fencing_token == second.token > lease.token
        second.release()


def test_an_election_hands_over_to_the_next_candidate_and_observe_sees_it(
        cluster: Cluster, client: Callable[[], Client]) -> None:
    a, b, watcher = client(), client(), client()
    wait_for_values(a)
    name = fresh("election")
    with watcher.election(name).observe(resume=True) as seen:
        assert next_event(seen, "the state now").kind is K.STATE
        leader_a = a.election(name).campaign(b"10.0.0.1:5432", ttl=30)
        assert b.election(name).leader() == watcher.election(name).leader()
        leader = b.election(name).leader()
        assert leader is not None and (leader.value, leader.fencing_token) == (b"10.0.0.1:5432", leader_a.token)

        pool = concurrent.futures.ThreadPoolExecutor(1)
        try:
            campaigning = pool.submit(b.election(name).campaign, "10.0.0.2:5432", 30)
            end = time.monotonic() + 20
            while b.get(name).queue_length != 1:  # b waits in the queue
                assert time.monotonic() < end, "the second candidate never queued"
                time.sleep(0.05)
            assert not campaigning.done()
            assert leader_a.release()  # resign
            leader_b = campaigning.result(timeout=20)
        finally:
            pool.shutdown(wait=False)
        assert leader_b.token > leader_a.token

        changes = [next_event(seen, f"change {i}") for i in range(3)]
        assert [(e.kind, e.value, e.fencing_token) for e in changes] == [
            (K.GRANTED, b"10.0.0.1:5432", leader_a.token),
            (K.RELEASED, b"", leader_a.token),
            (K.GRANTED, b"10.0.0.2:5432", leader_b.token),
        ]
        now = a.election(name).leader()
        assert now is not None and (now.value, now.fencing_token) == (b"10.0.0.2:5432", leader_b.token)
        leader_b.release()


def test_asyncio_watch_and_election(cluster: Cluster, client: Callable[[], Client]) -> None:
    wait_for_values(client())
    name = fresh("aio-election")

    async def main() -> None:
        async with AsyncClient(cluster.endpoints, _config(cluster)) as c:
            election = c.election(name)
            async with await election.observe() as seen:
                assert (await asyncio.wait_for(seen.__anext__(), 20)).kind is K.STATE
                lease = await asyncio.wait_for(election.campaign("10.0.0.3:5432", ttl=30), 20)
                granted = await asyncio.wait_for(seen.__anext__(), 20)
                assert (granted.kind, granted.value, granted.fencing_token) == (K.GRANTED, b"10.0.0.3:5432",
                                                                               lease.token)
                leader = await election.leader()
                assert leader is not None and leader.fencing_token == lease.token
                await lease.release()
                released = await asyncio.wait_for(seen.__anext__(), 20)
                assert (released.kind, released.fencing_token) == (K.RELEASED, lease.token)
                assert await election.leader() is None

    asyncio.run(main())
