"""The asyncio client against the scripted fake server."""

import asyncio
import time
from typing import Any

import grpc
import pytest

from fencelock import AsyncClient, ClientConfig, LockHeldError, LostReason, Reason
from fake_server import Abort, FakeServer, error_status, grant, released, renew_all

FAST = ClientConfig(call_timeout_ms=3000, attempt_timeout_ms=1000, backoff_base_ms=10, backoff_max_ms=100)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def test_async_retries_with_one_request_id_renews_and_releases(fake: FakeServer) -> None:
    attempts = []

    def acquire(req: Any) -> Any:
        attempts.append(req.request_id)
        if len(attempts) == 1:
            raise Abort(error_status(Reason.OUTCOME_UNKNOWN, grpc.StatusCode.UNAVAILABLE))
        return grant(ttl_ms=1500)(req)

    fake.handlers.update(Acquire=acquire, RenewBatch=renew_all(1500), Release=released)

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            async with c.lock("acme/a", ttl=1.5) as lease:
                first = lease.stop_by
                await asyncio.sleep(2.0)
                assert lease.held and lease.stop_by > first
                assert not lease.lost.is_set()
            assert len(fake.requests("Release")) == 1
            assert fake.requests("RenewBatch")
        assert len(set(attempts)) == 1 and len(attempts) == 2

    run(main())


def test_async_lost_is_awaitable_and_fires_at_stop_by(fake: FakeServer) -> None:
    fake.handlers.update(Acquire=grant(ttl_ms=1000), Release=released,
                         RenewBatch=lambda r: (_ for _ in ()).throw(Abort(error_status(Reason.NO_QUORUM, grpc.StatusCode.UNAVAILABLE))))

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            lease = await c.acquire("acme/l", ttl=1)
            reason = await asyncio.wait_for(lease.lost.wait(), timeout=5)
            assert reason is LostReason.UNCONFIRMED
            assert 0 <= time.monotonic() - lease.stop_by < 0.5
            assert not lease.held

    run(main())


def test_async_lock_held_is_typed(fake: FakeServer) -> None:
    fake.handlers["Acquire"] = lambda r: (_ for _ in ()).throw(Abort(error_status(Reason.LOCK_HELD, grpc.StatusCode.ABORTED)))

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            with pytest.raises(LockHeldError):
                await c.acquire("acme/h", ttl=5)

    run(main())


def test_async_dropped_lease_is_released(fake: FakeServer) -> None:
    import gc

    fake.handlers.update(Acquire=grant(ttl_ms=1500), RenewBatch=renew_all(1500), Release=released)

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            lease = await c.acquire("acme/dropped", ttl=1.5)
            del lease
            gc.collect()
            for _ in range(200):
                if fake.requests("Release"):
                    break
                await asyncio.sleep(0.02)
            assert len(fake.requests("Release")) == 1

    run(main())
