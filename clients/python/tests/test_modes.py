"""Shared locks and semaphores against the scripted fake server: the mode
and permits an acquire sends, the local check of permits (nothing sent),
MODE_MISMATCH and INVALID_PERMITS as typed errors that are never retried,
and Get and watch STATE holders decoded."""

import asyncio
from typing import Any, Iterator

import grpc
import pytest

from fencelock import (Client, ClientConfig, Holding, InvalidArgumentError, InvalidPermitsError, LockState, Mode,
                       ModeMismatchError, Reason, RejectedError, WatchEventKind)
from fencelock.aio import AsyncClient
from fencelock.v1 import lock_pb2
from fake_server import Abort, FakeServer, error_status, grant, released, renew_all, until_cancelled, watch_event

FAST = ClientConfig(call_timeout_ms=3000, attempt_timeout_ms=1000, backoff_base_ms=10, backoff_max_ms=100)
T1, T2 = (3 << 40) | 10, (3 << 40) | 12


def sent(fake: FakeServer) -> list[tuple[int, int]]:
    return [(r.mode, r.permits) for r in fake.requests("Acquire")]


def test_acquire_sends_the_mode_and_the_permits(fake: FakeServer) -> None:
    fake.handlers.update(Acquire=grant(), Release=released, RenewBatch=renew_all())
    with Client([fake.address], FAST) as c:
        c.acquire("acme/m", ttl=5).release()
        c.acquire("acme/m", ttl=5, mode="exclusive").release()
        c.acquire("acme/m", ttl=5, mode="shared").release()
        c.acquire("acme/m", ttl=5, mode=Mode.SHARED).release()
        c.acquire("acme/s", ttl=5, mode="semaphore", permits=3).release()
        c.acquire("acme/s", ttl=5, mode=Mode.SEMAPHORE, permits=1024).release()
        with c.lock("acme/s", ttl=5, mode="semaphore", permits=2):
            pass
        with c.lock("acme/m", ttl=5):
            pass
        c.election("acme/e").campaign(b"addr", ttl=5).release()  # elections stay exclusive
    assert sent(fake) == [
        (lock_pb2.ACQUIRE_MODE_EXCLUSIVE, 0), (lock_pb2.ACQUIRE_MODE_EXCLUSIVE, 0),
        (lock_pb2.ACQUIRE_MODE_SHARED, 0), (lock_pb2.ACQUIRE_MODE_SHARED, 0),
        (lock_pb2.ACQUIRE_MODE_SEMAPHORE, 3), (lock_pb2.ACQUIRE_MODE_SEMAPHORE, 1024),
        (lock_pb2.ACQUIRE_MODE_SEMAPHORE, 2), (lock_pb2.ACQUIRE_MODE_EXCLUSIVE, 0),
        (lock_pb2.ACQUIRE_MODE_EXCLUSIVE, 0),
    ]


@pytest.mark.parametrize("mode, permits", [
    ("semaphore", 0), ("semaphore", 1025), ("semaphore", -1), (Mode.SEMAPHORE, True),
    ("exclusive", 3), ("shared", 1), (Mode.SHARED, 2),
    ("reader", 0), ("SHARED", 0), (Mode.UNKNOWN, 0), (1, 0),
])
def test_bad_permits_or_modes_are_refused_before_any_call(fake: FakeServer, mode: Any, permits: Any) -> None:
    fake.handlers.update(Acquire=grant(), Release=released)
    with Client([fake.address], FAST) as c:
        with pytest.raises(InvalidArgumentError):
            c.acquire("acme/bad", ttl=5, mode=mode, permits=permits)
        with pytest.raises(InvalidArgumentError):
            with c.lock("acme/bad", ttl=5, mode=mode, permits=permits):
                pass

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            with pytest.raises(InvalidArgumentError):
                await c.acquire("acme/bad", ttl=5, mode=mode, permits=permits)

    asyncio.run(main())
    assert not fake.requests("Acquire"), "nothing may be sent"


def test_mode_mismatch_and_invalid_permits_are_typed_and_never_retried(fake: FakeServer) -> None:
    def mismatch(req: Any) -> Any:
        raise Abort(error_status(Reason.MODE_MISMATCH, grpc.StatusCode.FAILED_PRECONDITION,
                                 "in use as a semaphore of 3", field="permits", min_allowed=3, max_allowed=3))

    fake.handlers["Acquire"] = mismatch
    with Client([fake.address], FAST) as c:
        with pytest.raises(ModeMismatchError) as e:
            c.acquire("acme/sem", ttl=5, mode="semaphore", permits=2)
        assert isinstance(e.value, RejectedError) and not e.value.is_lock_held
        assert e.value.reason is Reason.MODE_MISMATCH and e.value.code == "FAILED_PRECONDITION"
        assert (e.value.detail.field, e.value.detail.min_allowed) == ("permits", 3)
        assert len(fake.requests("Acquire")) == 1, "MODE_MISMATCH is never retried"

        fake.handlers["Acquire"] = lambda r: (_ for _ in ()).throw(Abort(error_status(
            Reason.INVALID_PERMITS, grpc.StatusCode.INVALID_ARGUMENT, min_allowed=1, max_allowed=1024)))
        with pytest.raises(InvalidPermitsError) as p:
            c.acquire("acme/sem", ttl=5, mode="semaphore", permits=5)
        assert p.value.reason is Reason.INVALID_PERMITS and p.value.detail.max_allowed == 1024
        assert len(fake.requests("Acquire")) == 2, "INVALID_PERMITS is never retried"

    fake.handlers["Acquire"] = mismatch

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            with pytest.raises(ModeMismatchError):
                await c.acquire("acme/sem", ttl=5, mode="shared")

    asyncio.run(main())
    assert len(fake.requests("Acquire")) == 3
    assert sent(fake)[-1] == (lock_pb2.ACQUIRE_MODE_SHARED, 0)


def _two_readers(req: Any) -> Any:
    return lock_pb2.GetResponse(
        held=True, fencing_token=T1, expires_at_ms=1000, queue_length=1, last_token=T2, shard_id=3, epoch=3,
        value=b"r1", mode=lock_pb2.ACQUIRE_MODE_SEMAPHORE, permits=2,
        holders=[
            lock_pb2.Holding(fencing_token=T1, expires_at_ms=1000, value=b"r1", mode=lock_pb2.ACQUIRE_MODE_SEMAPHORE),
            lock_pb2.Holding(fencing_token=T2, expires_at_ms=2000, value=b"", mode=lock_pb2.ACQUIRE_MODE_SEMAPHORE),
        ],
    )


EXPECTED = LockState(
    held=True, fencing_token=T1, expires_at_ms=1000, queue_length=1, last_token=T2, shard_id=3, epoch=3,
    value=b"r1", mode=Mode.SEMAPHORE, permits=2,
    holders=(Holding(T1, 1000, b"r1", Mode.SEMAPHORE), Holding(T2, 2000, b"", Mode.SEMAPHORE)),
)


def test_get_decodes_the_mode_the_permits_and_every_holder(fake: FakeServer) -> None:
    fake.handlers["Get"] = _two_readers
    with Client([fake.address], FAST) as c:
        assert c.get("acme/sem") == EXPECTED

        fake.handlers["Get"] = lambda r: lock_pb2.GetResponse(shard_id=1, epoch=1, last_token=5)
        free = c.get("acme/free")
        assert not free.held and free.holders == () and free.mode is Mode.EXCLUSIVE and free.permits == 0

        # A mode from a newer server is UNKNOWN, not a crash.
        fake.handlers["Get"] = lambda r: lock_pb2.GetResponse(
            held=True, fencing_token=9, mode=7, holders=[lock_pb2.Holding(fencing_token=9, mode=7)])
        newer = c.get("acme/newer")
        assert newer.mode is Mode.UNKNOWN and newer.holders[0].mode is Mode.UNKNOWN

    fake.handlers["Get"] = _two_readers

    async def main() -> LockState:
        async with AsyncClient([fake.address], FAST) as c:
            return await c.get("acme/sem")

    assert asyncio.run(main()) == EXPECTED


def test_a_state_event_lists_every_holder(fake: FakeServer) -> None:
    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        state = watch_event(lock_pb2.WATCH_EVENT_KIND_STATE, (3, 12, 0), held=True, token=T1, shard=3)
        state.holders.extend([
            lock_pb2.Holding(fencing_token=T1, expires_at_ms=1000, mode=lock_pb2.ACQUIRE_MODE_SHARED),
            lock_pb2.Holding(fencing_token=T2, expires_at_ms=2000, value=b"x", mode=lock_pb2.ACQUIRE_MODE_SHARED),
        ])
        yield state
        # T1 released; T2 still holds.
        yield watch_event(lock_pb2.WATCH_EVENT_KIND_RELEASED, (3, 13, 0), held=True, token=T1, shard=3)
        yield from until_cancelled(ctx)

    fake.handlers["Watch"] = watch
    with Client([fake.address], FAST) as c, c.watch("acme/readers") as w:
        state, ended = next(w), next(w)
    assert state.kind is WatchEventKind.STATE
    assert state.holders == (Holding(T1, 1000, b"", Mode.SHARED), Holding(T2, 2000, b"x", Mode.SHARED))
    assert (ended.kind, ended.fencing_token, ended.held, ended.holders) == (WatchEventKind.RELEASED, T1, True, ())
