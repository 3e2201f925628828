"""The sync client against a scripted fake server: request ids, routing,
retries, renewals, the lost signal."""

import time
from typing import Any

import grpc
import pytest

from fencelock import (Client, ClientConfig, InvalidArgumentError, InvalidConfigError, LockHeldError,
                       LostReason, PermissionDeniedError, Reason, UnavailableError)
from fencelock.v1 import lock_pb2
from fake_server import Abort, FakeServer, error_status, grant, released, renew_all, wait_until

FAST = ClientConfig(call_timeout_ms=3000, attempt_timeout_ms=1000, backoff_base_ms=10, backoff_max_ms=100)


def test_outcome_unknown_is_retried_with_the_same_request_id(fake: FakeServer) -> None:
    attempts = []

    def acquire(req: Any) -> Any:
        attempts.append(req.request_id)
        if len(attempts) < 3:
            raise Abort(error_status(Reason.OUTCOME_UNKNOWN, grpc.StatusCode.UNAVAILABLE))
        return grant(dedup=len(attempts) > 1)(req)

    fake.handlers.update(Acquire=acquire, RenewBatch=renew_all(), Renew=lambda r: lock_pb2.RenewResponse(lease_ttl_ms=5000), Release=released)
    with Client([fake.address], FAST) as c:
        lease = c.acquire("acme/x", ttl=5)
        assert lease.deduplicated and lease.token == (1 << 40) | 7
        assert len(attempts) == 3 and len(set(attempts)) == 1 and len(attempts[0]) == 16
        # A deduplicated grant is renewed at once, before acquire returns.
        assert len(fake.requests("Renew")) == 1
        lease.release()
        c.acquire("acme/x", ttl=5).release()
        lease2_id = attempts[-1]
        assert lease2_id != attempts[0], "a new logical acquire must use a new request id"


def test_not_leader_hints_are_followed_and_learned(fake: FakeServer, fake2: FakeServer) -> None:
    fake.handlers["Acquire"] = lambda r: (_ for _ in ()).throw(Abort(error_status(
        Reason.NOT_LEADER, grpc.StatusCode.UNAVAILABLE, leader=fake2.address, shard_id=4)))
    fake2.handlers.update(Acquire=grant(shard=4), Release=released, RenewBatch=renew_all())
    with Client([fake.address], FAST) as c:
        lease = c.acquire("acme/y", ttl=5)
        assert len(fake.requests("Acquire")) == 1 and len(fake2.requests("Acquire")) == 1
        assert fake.requests("Acquire")[0].request_id == fake2.requests("Acquire")[0].request_id
        assert lease.release() is True
        assert len(fake2.requests("Release")) == 1 and not fake.requests("Release")


def test_never_and_contention_answers_are_typed_and_not_retried(fake: FakeServer) -> None:
    fake.handlers["Acquire"] = lambda r: (_ for _ in ()).throw(Abort(error_status(
        Reason.LOCK_HELD, grpc.StatusCode.ABORTED, holder_expires_at_ms=5)))
    with Client([fake.address], FAST) as c:
        with pytest.raises(LockHeldError) as e:
            c.acquire("acme/z", ttl=5)
        assert e.value.reason is Reason.LOCK_HELD and e.value.code == "ABORTED"
        assert e.value.detail.holder_expires_at_ms == 5
        assert len(fake.requests("Acquire")) == 1
        fake.handlers["Acquire"] = lambda r: (_ for _ in ()).throw(Abort(error_status(
            Reason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)))
        with pytest.raises(PermissionDeniedError):
            c.acquire("beta/z", ttl=5)
        assert len(fake.requests("Acquire")) == 2


def test_unreachable_cluster_fails_within_the_deadline_with_the_request_id() -> None:
    cfg = ClientConfig(call_timeout_ms=800, attempt_timeout_ms=200, connect_timeout_ms=200, backoff_base_ms=10, backoff_max_ms=50)
    with Client(["127.0.0.1:1"], cfg) as c:
        t0 = time.monotonic()
        with pytest.raises(UnavailableError) as e:
            c.acquire("acme/a", ttl=5)
        assert time.monotonic() - t0 < 5
        assert e.value.request_id is not None and len(e.value.request_id) == 16


def test_stop_by_counts_from_the_send_not_the_reply(fake: FakeServer) -> None:
    fake.handlers.update(Acquire=grant(ttl_ms=3000, delay=0.6), RenewBatch=renew_all(3000), Release=released)
    with Client([fake.address], FAST) as c:
        before = time.monotonic()
        lease = c.acquire("acme/s", ttl=3)
        after = time.monotonic()
        assert after - before >= 0.6
        # send time + 3 s - 5% (150 ms): before the reply arrived + 3 s.
        assert before + 2.85 - 0.05 <= lease.stop_by <= before + 2.85 + 0.05
        lease.release()


def test_renewals_are_batched_and_move_stop_by(fake: FakeServer) -> None:
    fake.handlers.update(Acquire=grant(ttl_ms=1500), RenewBatch=renew_all(1500), Release=released)
    with Client([fake.address], FAST) as c:
        leases = [c.acquire(f"acme/b{i}", ttl=1.5) for i in range(3)]
        first = [x.stop_by for x in leases]
        wait_until(lambda: all(x.stop_by > f for x, f in zip(leases, first)), 5, "renewals")
        batches = fake.requests("RenewBatch")
        assert any(len(b.items) > 1 for b in batches), [len(b.items) for b in batches]
        time.sleep(2.0)  # longer than the TTL: renewals keep it held
        assert all(x.held for x in leases)
        for x in leases:
            x.release()


def test_lease_not_held_on_renew_sets_lost(fake: FakeServer) -> None:
    def renew(req: Any) -> Any:
        return lock_pb2.RenewBatchResponse(results=[lock_pb2.RenewResult(error=lock_pb2.RenewResult().error.__class__(
            reason=Reason.LEASE_NOT_HELD)) for _ in req.items])
    fake.handlers.update(Acquire=grant(ttl_ms=1200), RenewBatch=renew, Release=released)
    with Client([fake.address], FAST) as c:
        lease = c.acquire("acme/l", ttl=1.2)
        assert lease.lost.wait(timeout=5)
        assert lease.lost_reason is LostReason.NOT_HELD and not lease.held


def test_unconfirmed_renewals_lose_the_lease_at_stop_by(fake: FakeServer) -> None:
    fake.handlers.update(Acquire=grant(ttl_ms=1000), Release=released,
                         RenewBatch=lambda r: (_ for _ in ()).throw(Abort(error_status(Reason.NO_QUORUM, grpc.StatusCode.UNAVAILABLE))))
    with Client([fake.address], FAST) as c:
        lease = c.acquire("acme/u", ttl=1)
        reason = lease.wait_lost(timeout=5)
        assert reason is LostReason.UNCONFIRMED
        assert time.monotonic() >= lease.stop_by
        assert time.monotonic() - lease.stop_by < 0.5, "lost must fire at stop-by, not much later"
        assert len(fake.requests("RenewBatch")) >= 2, "failed renewals are retried before the deadline"


def test_context_manager_releases_and_config_is_validated(fake: FakeServer) -> None:
    fake.handlers.update(Acquire=grant(), Release=released, RenewBatch=renew_all())
    with Client([fake.address], FAST) as c:
        with c.lock("acme/cm", ttl=5, wait=1) as lease:
            assert lease.held and lease.token > 0
            assert "lease_id" not in repr(lease) and "LLLL" not in repr(lease)
        assert len(fake.requests("Release")) == 1
        assert not lease.held
        assert fake.requests("Acquire")[0].wait_timeout_ms == 1000
    with pytest.raises(InvalidConfigError):
        Client(["127.0.0.1:1"], ClientConfig(stop_by_margin_percent=0))
    with pytest.raises(InvalidArgumentError):
        Client("127.0.0.1:1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Client(["ftp://x:1"])
    with Client(["127.0.0.1:1"]) as c:
        with pytest.raises(InvalidArgumentError):
            c.acquire("acme/w", wait=301)


def test_a_dropped_lease_stops_renewing_and_is_released(fake: FakeServer) -> None:
    import gc

    fake.handlers.update(Acquire=grant(ttl_ms=1500), RenewBatch=renew_all(1500), Release=released)
    with Client([fake.address], FAST) as c:
        lease = c.acquire("acme/dropped", ttl=1.5)
        assert c.held_leases == 1
        del lease
        gc.collect()
        wait_until(lambda: len(fake.requests("Release")) == 1, 5, "the background release")
        assert c.held_leases == 0
