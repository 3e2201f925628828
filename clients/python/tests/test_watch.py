"""Watches and elections against the scripted fake server: event decoding,
the start's routing, resuming after the last revision without a duplicate,
which endings resume, close, and the election's campaign/leader/observe."""

import asyncio
import threading
import time
from typing import Any, Iterator

import grpc
import pytest

from fencelock import (Client, ClientConfig, GrpcError, Leader, LockHeldError, PermissionDeniedError, Reason,
                       RejectedError, Revision, UnavailableError, WatchEvent, WatchEventKind)
from fencelock.aio import AsyncClient
from fencelock.config import MAX_WAIT_TIMEOUT_MS
from fencelock.v1 import lock_pb2
from fake_server import (Abort, FakeServer, error_status, grant, released, renew_all, until_cancelled, wait_until,
                         watch_event)

FAST = ClientConfig(call_timeout_ms=3000, attempt_timeout_ms=1000, backoff_base_ms=10, backoff_max_ms=50)
K = lock_pb2


def rev(e: WatchEvent) -> tuple[int, int, int]:
    assert e.revision is not None
    return (e.revision.epoch, e.revision.index, e.revision.seq)


def after_of(req: Any) -> Any:
    return (req.after.epoch, req.after.index, req.after.seq) if req.HasField("after") else None


def test_events_are_decoded_into_typed_values(fake: FakeServer) -> None:
    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        yield watch_event(K.WATCH_EVENT_KIND_STATE, (3, 10, 0), held=True, token=(3 << 40) | 10,
                          value=b"10.0.0.7:8443", expires_at_ms=1234, shard=5)
        yield watch_event(K.WATCH_EVENT_KIND_VALUE_CHANGED, (3, 11, 0), held=True, token=(3 << 40) | 10,
                          value=b"10.0.0.7:9443", shard=5)
        yield watch_event(K.WATCH_EVENT_KIND_RELEASED, (3, 12, 0), token=(3 << 40) | 10, shard=5)
        yield watch_event(K.WATCH_EVENT_KIND_GRANTED, (3, 13, 0), held=True, token=(3 << 40) | 13, shard=5)
        yield watch_event(K.WATCH_EVENT_KIND_EXPIRED, (3, 14, 0), token=(3 << 40) | 13, shard=5)
        yield watch_event(K.WATCH_EVENT_KIND_CANCELLED, (3, 14, 1), token=(3 << 40) | 14, shard=5)
        yield watch_event(99, (4, 1, 0), shard=5)  # a kind from a newer server
        yield from until_cancelled(ctx)

    fake.handlers["Watch"] = watch
    with Client([fake.address], FAST) as c, c.watch("acme/db") as w:
        events = [next(w) for _ in range(7)]
    first = events[0]
    assert first == WatchEvent(kind=WatchEventKind.STATE, revision=Revision(3, 10, 0), held=True,
                               fencing_token=(3 << 40) | 10, value=b"10.0.0.7:8443", expires_at_ms=1234,
                               gap=False, shard_id=5)
    assert [e.kind for e in events] == [
        WatchEventKind.STATE, WatchEventKind.VALUE_CHANGED, WatchEventKind.RELEASED, WatchEventKind.GRANTED,
        WatchEventKind.EXPIRED, WatchEventKind.CANCELLED, WatchEventKind.UNSPECIFIED,
    ]
    assert events[1].value == b"10.0.0.7:9443" and events[1].held
    assert not events[2].held and events[2].fencing_token == (3 << 40) | 10
    assert events[3].fencing_token == (3 << 40) | 13
    assert [rev(e) for e in events] == sorted(rev(e) for e in events)
    assert fake.requests("Watch")[0].resource == "acme/db"
    assert not fake.requests("Watch")[0].HasField("after"), "no after: start with the state now"


def test_revisions_order_print_and_parse() -> None:
    assert Revision(3, 9, 5) < Revision(3, 10, 0) < Revision(3, 10, 1) < Revision(4, 0, 0)
    assert str(Revision(3, 1204, 0)) == "3.1204.0"
    assert Revision.parse("3.1204.0") == Revision(3, 1204, 0)
    with pytest.raises(ValueError):
        Revision.parse("3.1204")


def test_the_start_follows_a_leader_hint_and_sends_after(fake: FakeServer, fake2: FakeServer) -> None:
    fake.handlers["Watch"] = lambda req, ctx: (_ for _ in ()).throw(Abort(error_status(
        Reason.NOT_LEADER, grpc.StatusCode.UNAVAILABLE, leader=fake2.address, shard_id=2)))

    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        yield watch_event(K.WATCH_EVENT_KIND_GRANTED, (1, 8, 0), held=True, token=8)
        yield from until_cancelled(ctx)

    fake2.handlers["Watch"] = watch
    with Client([fake.address], FAST) as c:
        for _ in range(5):
            with c.watch("acme/db", after=Revision(1, 7, 2)) as w:
                assert next(w).fencing_token == 8
                assert w.after == Revision(1, 8, 0)
    assert len(fake.requests("Watch")) == 1, "the hint is learned"
    assert [after_of(r) for r in fake2.requests("Watch")] == [(1, 7, 2)] * 5


def test_a_refused_start_is_raised_not_retried(fake: FakeServer) -> None:
    fake.handlers["Watch"] = lambda req, ctx: (_ for _ in ()).throw(Abort(error_status(
        Reason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)))
    with Client([fake.address], FAST) as c:
        for _ in range(5):
            # By watch() itself, or (when the refusal overtakes the call's
            # headers in grpc's client) by the first iteration.
            with pytest.raises(PermissionDeniedError):
                next(c.watch("beta/db", resume=True))
    assert len(fake.requests("Watch")) == 5


def test_a_node_that_never_answers_the_start_is_given_up_on(fake: FakeServer) -> None:
    blocked = threading.Event()

    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        blocked.wait(5)  # no headers: the node is stuck
        raise Abort(error_status(Reason.SHUTTING_DOWN, grpc.StatusCode.UNAVAILABLE))

    fake.handlers["Watch"] = watch
    config = ClientConfig(call_timeout_ms=1200, attempt_timeout_ms=300, connect_timeout_ms=300, backoff_base_ms=10,
                          backoff_max_ms=50)
    started = time.monotonic()
    with Client([fake.address], config) as c:
        with pytest.raises(UnavailableError) as e:
            c.watch("acme/db")
    blocked.set()
    assert time.monotonic() - started < 3
    assert "no answer to the watch within" in e.value.last_error
    assert len(fake.requests("Watch")) >= 2


def _three_then(ending: Any) -> Any:
    """A fake Watch: the first stream sends revisions 1.1-1.3 then ends with
    `ending`; later streams replay from before the resume point (a buggy
    node) and go on with 1.4 and 1.5."""

    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        if not req.HasField("after"):
            yield watch_event(K.WATCH_EVENT_KIND_STATE, (1, 1, 0))
            yield watch_event(K.WATCH_EVENT_KIND_GRANTED, (1, 2, 0), held=True, token=2, value=b"a")
            yield watch_event(K.WATCH_EVENT_KIND_RELEASED, (1, 3, 0), token=2)
            if ending is None:
                return
            raise Abort(ending)
        yield watch_event(K.WATCH_EVENT_KIND_GRANTED, (1, 2, 0), held=True, token=2, value=b"a")
        yield watch_event(K.WATCH_EVENT_KIND_RELEASED, (1, 3, 0), token=2)
        yield watch_event(K.WATCH_EVENT_KIND_GRANTED, (1, 4, 0), held=True, token=4)
        yield watch_event(K.WATCH_EVENT_KIND_RELEASED, (1, 5, 0), token=4)
        yield from until_cancelled(ctx)

    return watch


class _Transport(grpc.Status):
    """An ending without an ErrorDetail (a broken connection)."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code, self.details, self.trailing_metadata = code, "connection reset", ()


def _transport(code: grpc.StatusCode) -> Any:
    return _Transport(code)


@pytest.mark.parametrize("ending", [
    error_status(Reason.SERVER_BUSY, grpc.StatusCode.RESOURCE_EXHAUSTED),
    error_status(Reason.EPOCH_NOT_MATCH, grpc.StatusCode.FAILED_PRECONDITION),
    error_status(Reason.SHUTTING_DOWN, grpc.StatusCode.UNAVAILABLE),
    _transport(grpc.StatusCode.UNAVAILABLE),
    _transport(grpc.StatusCode.INTERNAL),
    None,  # the stream just ended
], ids=["server_busy", "epoch_not_match", "shutting_down", "unavailable", "internal", "clean_end"])
def test_resume_continues_after_the_last_revision_without_a_duplicate(fake: FakeServer, ending: Any) -> None:
    fake.handlers["Watch"] = _three_then(ending)
    with Client([fake.address], FAST) as c, c.watch("acme/db", resume=True) as w:
        events = [next(w) for _ in range(5)]
    assert [rev(e) for e in events] == [(1, 1, 0), (1, 2, 0), (1, 3, 0), (1, 4, 0), (1, 5, 0)]
    assert [e.kind for e in events] == [WatchEventKind.STATE, WatchEventKind.GRANTED, WatchEventKind.RELEASED,
                                        WatchEventKind.GRANTED, WatchEventKind.RELEASED]
    reqs = fake.requests("Watch")
    assert len(reqs) == 2
    assert after_of(reqs[0]) is None and after_of(reqs[1]) == (1, 3, 0)


def test_without_resume_the_ending_is_raised_with_its_resume_point(fake: FakeServer) -> None:
    fake.handlers["Watch"] = _three_then(error_status(Reason.SHUTTING_DOWN, grpc.StatusCode.UNAVAILABLE))
    with Client([fake.address], FAST) as c:
        w = c.watch("acme/db")
        assert [rev(next(w)) for _ in range(3)] == [(1, 1, 0), (1, 2, 0), (1, 3, 0)]
        with pytest.raises(RejectedError) as e:
            next(w)
        assert e.value.reason is Reason.SHUTTING_DOWN and e.value.resumes_watch
        assert w.after == Revision(1, 3, 0)
        with pytest.raises(StopIteration):
            next(w)
        # Watching again from the resume point: the rest, nothing twice.
        with c.watch("acme/db", after=w.after) as again:
            assert [rev(next(again)) for _ in range(2)] == [(1, 4, 0), (1, 5, 0)]


def test_a_clean_end_without_resume_stops_the_iteration(fake: FakeServer) -> None:
    fake.handlers["Watch"] = _three_then(None)
    with Client([fake.address], FAST) as c:
        assert [rev(e) for e in c.watch("acme/db")] == [(1, 1, 0), (1, 2, 0), (1, 3, 0)]


def test_an_ending_a_new_watch_cannot_resolve_is_raised_even_when_resuming(fake: FakeServer) -> None:
    fake.handlers["Watch"] = _three_then(error_status(Reason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED))
    with Client([fake.address], FAST) as c:
        w = c.watch("acme/db", resume=True)
        assert len([next(w) for _ in range(3)]) == 3
        with pytest.raises(PermissionDeniedError) as e:
            next(w)
        assert not e.value.resumes_watch
    assert len(fake.requests("Watch")) == 1


def test_resumes_watch_says_which_endings_a_new_watch_resolves() -> None:
    from fencelock import ErrorDetail
    from fencelock.errors import rejected

    for r in (Reason.SERVER_BUSY, Reason.EPOCH_NOT_MATCH, Reason.SHUTTING_DOWN):
        assert rejected(ErrorDetail(reason=r), "UNAVAILABLE").resumes_watch, r
    for r in (Reason.PERMISSION_DENIED, Reason.INVALID_RESOURCE, Reason.NOT_LEADER):
        assert not rejected(ErrorDetail(reason=r), "UNAVAILABLE").resumes_watch, r
    for code in ("UNAVAILABLE", "UNKNOWN", "INTERNAL"):
        assert GrpcError(code, "h2 error").resumes_watch
    assert not GrpcError("UNIMPLEMENTED", "not fencelock").resumes_watch
    assert not UnavailableError(1000, 3, "down").resumes_watch


def test_close_from_another_thread_ends_a_blocked_iteration(fake: FakeServer) -> None:
    fake.handlers["Watch"] = lambda req, ctx: until_cancelled(ctx)
    with Client([fake.address], FAST) as c:
        w = c.watch("acme/db", resume=True)
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(list(w)))
        t.start()
        time.sleep(0.2)
        w.close()
        t.join(5)
        assert not t.is_alive() and got == [[]]
    assert len(fake.requests("Watch")) == 1


def test_a_gap_state_is_passed_on(fake: FakeServer) -> None:
    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        yield watch_event(K.WATCH_EVENT_KIND_STATE, (2, 90, 0), held=True, token=77, gap=True)
        yield from until_cancelled(ctx)

    fake.handlers["Watch"] = watch
    with Client([fake.address], FAST) as c, c.watch("acme/db", after=Revision(1, 3, 0)) as w:
        e = next(w)
    assert e.kind is WatchEventKind.STATE and e.gap and e.held and e.fencing_token == 77


def test_async_watch_resumes_without_a_duplicate(fake: FakeServer) -> None:
    fake.handlers["Watch"] = _three_then(error_status(Reason.EPOCH_NOT_MATCH, grpc.StatusCode.FAILED_PRECONDITION))

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            got = []
            async with await c.watch("acme/db", resume=True) as w:
                async for e in w:
                    got.append(rev(e))
                    if len(got) == 5:
                        break
            assert got == [(1, 1, 0), (1, 2, 0), (1, 3, 0), (1, 4, 0), (1, 5, 0)]
            w2 = await c.watch("acme/db")
            assert rev(await w2.__anext__()) == (1, 1, 0)
            w2.close()
            with pytest.raises(StopAsyncIteration):
                await w2.__anext__()

    asyncio.run(main())
    assert after_of(fake.requests("Watch")[1]) == (1, 3, 0)


def test_async_watch_raises_the_ending_and_a_refused_start(fake: FakeServer) -> None:
    fake.handlers["Watch"] = _three_then(error_status(Reason.SERVER_BUSY, grpc.StatusCode.RESOURCE_EXHAUSTED))

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            w = await c.watch("acme/db")
            for _ in range(3):
                await w.__anext__()
            with pytest.raises(RejectedError) as e:
                await w.__anext__()
            assert e.value.reason is Reason.SERVER_BUSY and e.value.resumes_watch
            assert w.after == Revision(1, 3, 0)
            fake.handlers["Watch"] = lambda req, ctx: (_ for _ in ()).throw(Abort(error_status(
                Reason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)))
            with pytest.raises(PermissionDeniedError):
                await (await c.watch("beta/db")).__anext__()

    asyncio.run(main())


def _campaign_fake(fake: FakeServer, refusals: int) -> list[Any]:
    seen: list[Any] = []

    def acquire(req: Any) -> Any:
        seen.append(req)
        if len(seen) <= refusals:
            raise Abort(error_status(Reason.WAIT_TIMED_OUT, grpc.StatusCode.ABORTED))
        return grant(token=(1 << 40) | 9)(req)

    fake.handlers.update(Acquire=acquire, RenewBatch=renew_all(), Release=released,
                         Renew=lambda r: lock_pb2.RenewResponse(lease_ttl_ms=5000))
    return seen


def test_a_campaign_queues_again_until_it_leads(fake: FakeServer) -> None:
    seen = _campaign_fake(fake, refusals=2)
    with Client([fake.address], FAST) as c:
        election = c.election("acme/election/db")
        lease = election.campaign("10.0.0.7:5432", ttl=5)
        assert lease.token == (1 << 40) | 9 and lease.held
        lease.release()
    assert len(seen) == 3
    assert all(r.value == b"10.0.0.7:5432" and r.wait_timeout_ms == MAX_WAIT_TIMEOUT_MS for r in seen)
    assert all(r.lease_ttl_ms == 5000 for r in seen)
    assert len({r.request_id for r in seen}) == 3, "each wait is its own logical acquire"


def test_a_campaign_ends_on_any_other_refusal(fake: FakeServer) -> None:
    fake.handlers["Acquire"] = lambda r: (_ for _ in ()).throw(Abort(error_status(
        Reason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)))
    with Client([fake.address], FAST) as c:
        with pytest.raises(PermissionDeniedError):
            c.election("beta/election/db").campaign(b"x", ttl=5)


def test_leader_and_observe(fake: FakeServer) -> None:
    states = [lock_pb2.GetResponse(held=True, fencing_token=41, value=b"10.0.0.7:5432", shard_id=1),
              lock_pb2.GetResponse(held=False, shard_id=1)]
    fake.handlers["Get"] = lambda r: states.pop(0)

    def watch(req: Any, ctx: Any) -> Iterator[Any]:
        yield watch_event(K.WATCH_EVENT_KIND_GRANTED, (1, 9, 0), held=True, token=41, value=b"10.0.0.7:5432")
        yield from until_cancelled(ctx)

    fake.handlers["Watch"] = watch
    with Client([fake.address], FAST) as c:
        election = c.election("acme/election/db")
        assert election.leader() == Leader(value=b"10.0.0.7:5432", fencing_token=41)
        assert election.leader() is None
        with election.observe(after=Revision(1, 8, 0)) as w:
            e = next(w)
        assert (e.kind, e.value, e.fencing_token) == (WatchEventKind.GRANTED, b"10.0.0.7:5432", 41)
    assert [r.resource for r in fake.requests("Get")] == ["acme/election/db"] * 2
    assert after_of(fake.requests("Watch")[0]) == (1, 8, 0)


def test_async_election(fake: FakeServer) -> None:
    seen = _campaign_fake(fake, refusals=1)
    fake.handlers["Get"] = lambda r: lock_pb2.GetResponse(held=True, fencing_token=(1 << 40) | 9, value=b"me")

    async def main() -> None:
        async with AsyncClient([fake.address], FAST) as c:
            election = c.election("acme/election/db")
            lease = await election.campaign(b"me", ttl=5)
            assert lease.token == (1 << 40) | 9
            assert await election.leader() == Leader(b"me", lease.token)
            await lease.release()

    asyncio.run(main())
    assert len(seen) == 2 and seen[0].value == b"me"
