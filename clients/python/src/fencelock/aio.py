"""The asyncio client: ``AsyncClient``, ``AsyncLease``. Same rules as the
sync client (request ids, routing, retry policy, batched renewals, stop-by,
lost), on ``grpc.aio``; the renewer is one task per client.

    async with AsyncClient(["127.0.0.1:7001"]) as client:
        async with client.lock("acme/orders/42", ttl=30, wait=5) as lease:
            await write(order, fencing_token=lease.token)
            # or: reason = await lease.lost
"""

from __future__ import annotations

import asyncio
import itertools
import time
from types import TracebackType
from typing import Any, AsyncIterator, Awaitable, Callable, Generator, Optional, Sequence, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from . import _core, _policy
from ._core import LeaseCore, RenewOutcome
from ._policy import Advice, Backoff, Failure
from ._router import Router, target_of
from .client import MAX_ACQUIRE_RESTARTS, Answer, ClientStats, _ms
from .config import MAX_REQUEST_ID_LEN, MAX_VALUE_LEN, MAX_WAIT_TIMEOUT_MS, ClientConfig
from .errors import (
    FencelockError,
    GrpcError,
    InvalidArgumentError,
    LeaseEndedError,
    LeaseLostError,
    LeaseState,
    LostReason,
    Reason,
    UnavailableError,
    rejected,
)
from .election import AsyncElection
from .v1 import lock_pb2
from .state import LockState, Mode, ModeArg, acquire_mode
from .watch import ENDED_BY_NODE, Next, NoHeaders, Revision, WatchEvent, WatchProgress, watch_request

_SERVICE = "/fencelock.v1.LockService/"
R = TypeVar("R", bound=Message)


class _AsyncCalls:
    def __init__(self, endpoints: Sequence[str], config: ClientConfig) -> None:
        config.validate()
        self.config = config
        self.router = Router(endpoints, tls=config.tls is not None)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.stats = ClientStats()

    def channel(self, url: str) -> grpc.aio.Channel:
        ch = self._channels.get(url)
        if ch is None:
            target, tls = target_of(url)
            if tls:
                if self.config.tls is None:
                    raise InvalidArgumentError(f"{url}: https needs a TlsConfig")
                ch = grpc.aio.secure_channel(target, _core.credentials(self.config.tls), _core.CHANNEL_OPTIONS)
            else:
                ch = grpc.aio.insecure_channel(target, _core.CHANNEL_OPTIONS)
            self._channels[url] = ch
        return ch

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()

    async def unary(self, url: str, method: str, request: Message, response_type: type[R], timeout: float) -> R:
        call: grpc.aio.UnaryUnaryMultiCallable[Message, R] = self.channel(url).unary_unary(
            _SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        response: R = await call(request, timeout=timeout)
        return response

    async def call(
        self,
        method: str,
        request: Message,
        response_type: type[R],
        *,
        resource: Optional[str],
        shard_id: Optional[int],
        deadline: float,
        until_deadline: bool = False,
        final_reasons: frozenset[Reason] = frozenset(),
        attempt: Optional[Callable[[str, float], Awaitable[Any]]] = None,
    ) -> Answer:
        """See ``client._Calls.call``."""
        started = time.monotonic()
        url = self.router.target_for_shard(shard_id) if resource is None and shard_id else self.router.target(resource)
        c = self.config
        backoff = Backoff(c.backoff_base_ms / 1000.0, c.backoff_max_ms / 1000.0)
        first_sent: Optional[float] = None
        attempts = 0
        last: Optional[Failure] = None

        def unavailable() -> UnavailableError:
            return UnavailableError(
                int((deadline - started) * 1000), attempts,
                last.summary if last else "no attempt fitted",
                last_detail=last.detail if last else None, last_code=last.code if last else None,
            )

        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise unavailable()
            timeout = remaining if until_deadline else min(remaining, c.attempt_timeout_ms / 1000.0)
            sent_at = time.monotonic()
            if first_sent is None:
                first_sent = sent_at
            attempts += 1
            try:
                if attempt is not None:
                    response = await attempt(url, timeout)
                else:
                    response = await self.unary(url, method, request, response_type, timeout)
                return Answer(response, first_sent, sent_at, url)
            except grpc.RpcError as e:
                failure = _core.classify_error(e)
            is_final = failure.detail is not None and failure.detail.known_reason in final_reasons
            if failure.advice is Advice.FAIL or is_final:
                if failure.detail is not None:
                    raise rejected(failure.detail, failure.code)
                raise GrpcError(failure.code, failure.summary)
            failed_shard = (failure.detail.shard_id if failure.detail and failure.detail.shard_id else None) or shard_id
            url = self.router.reroute(failure, resource, failed_shard, url)
            delay = backoff.delay(failure)
            self.stats.retries += 1
            last = failure
            if time.monotonic() + delay >= deadline:
                raise unavailable()
            await asyncio.sleep(delay)


class LostSignal:
    """``await lease.lost`` returns the LostReason when the lease is lost,
    at stop-by at the latest. ``is_set()`` does not wait."""

    def __init__(self, lease: "AsyncLease") -> None:
        self._lease = lease
        self._event = asyncio.Event()

    def _set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        self._lease._refresh()
        return self._event.is_set()

    async def wait(self) -> LostReason:
        core = self._lease._core
        while True:
            self._lease._refresh()
            if self._event.is_set():
                return core.lost_reason or LostReason.UNCONFIRMED
            with core.lock:
                step = core.stop_by - time.monotonic()
            try:
                await asyncio.wait_for(self._event.wait(), timeout=max(step, 0.001))
            except asyncio.TimeoutError:
                pass

    def __await__(self) -> Generator[Any, None, LostReason]:
        return self.wait().__await__()


class AsyncClient:
    """A fencelock client for asyncio. Create it inside a running loop."""

    def __init__(self, endpoints: Sequence[str], config: Optional[ClientConfig] = None) -> None:
        self.config = config or ClientConfig()
        self._calls = _AsyncCalls(endpoints, self.config)
        self._leases: dict[int, LeaseCore] = {}
        self._keys = itertools.count(1)
        self._wake = asyncio.Event()
        self._renewer: Optional[asyncio.Task[None]] = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, release_timeout: float = 2.0) -> None:
        if self._closed:
            return
        leases = list(self._leases.values())
        deadline = time.monotonic() + release_timeout
        for core in leases:
            if time.monotonic() >= deadline:
                break
            try:
                await self._release(core, deadline)
            except FencelockError:
                pass
        self._closed = True
        for t in [self._renewer, *self._tasks]:
            if t is not None:
                t.cancel()
        self._wake.set()
        await self._calls.close()

    @property
    def stats(self) -> ClientStats:
        return self._calls.stats

    def lock(self, resource: str, ttl: float = 30.0, wait: float = 0.0, mode: ModeArg = Mode.EXCLUSIVE,
             permits: int = 0) -> "_AsyncLockContext":
        return _AsyncLockContext(self, resource, ttl, wait, mode, permits)

    async def acquire(
        self, resource: str, ttl: float = 30.0, wait: float = 0.0, request_id: Optional[bytes] = None,
        value: bytes = b"", mode: ModeArg = Mode.EXCLUSIVE, permits: int = 0,
    ) -> "AsyncLease":
        """See ``Client.acquire`` (``mode`` and ``permits`` too). Cancelling
        it while it waits ends its call, which removes the waiter from the
        server's queue."""
        _core.check_resource(resource)
        ttl_ms, wait_ms = _ms(ttl), _ms(wait)
        if wait_ms > MAX_WAIT_TIMEOUT_MS:
            raise InvalidArgumentError(f"wait of {wait_ms} ms is over the maximum {MAX_WAIT_TIMEOUT_MS}")
        if request_id is not None and not 1 <= len(request_id) <= MAX_REQUEST_ID_LEN:
            raise InvalidArgumentError(f"request id must be 1..={MAX_REQUEST_ID_LEN} bytes")
        if len(value) > MAX_VALUE_LEN:
            raise InvalidArgumentError(f"value of {len(value)} bytes is over the maximum {MAX_VALUE_LEN}")
        wire_mode, wire_permits = acquire_mode(mode, permits)
        explicit = request_id is not None
        rid = request_id if request_id is not None else _core.new_request_id()
        deadline = time.monotonic() + (self.config.call_timeout_ms + wait_ms) / 1000.0
        restarts = 0
        while True:
            req = lock_pb2.AcquireRequest(
                resource=resource, request_id=rid, lease_ttl_ms=ttl_ms, wait_timeout_ms=wait_ms, value=value,
                mode=wire_mode, permits=wire_permits,
            )
            may_restart = not explicit and restarts < MAX_ACQUIRE_RESTARTS and time.monotonic() < deadline
            try:
                answer = await self._calls.call(
                    "Acquire", req, lock_pb2.AcquireResponse, resource=resource, shard_id=None,
                    deadline=deadline, until_deadline=wait_ms > 0,
                    final_reasons=_policy.ACQUIRE_CONTENTION_REASONS,
                )
            except UnavailableError as e:
                e.request_id = rid
                raise
            except FencelockError as e:
                if may_restart and getattr(e, "reason", None) is Reason.WAIT_CANCELLED:
                    restarts += 1
                    rid = _core.new_request_id()
                    continue
                raise
            resp = answer.value
            if resp.lease_state != lock_pb2.LEASE_STATE_HELD:
                if may_restart:
                    restarts += 1
                    rid = _core.new_request_id()
                    continue
                raise LeaseEndedError(LeaseState(resp.lease_state), int(resp.fencing_token))
            self._calls.router.learn(resource, int(resp.shard_id), answer.url)
            return await self._hold(resource, rid, answer, deadline)

    async def _hold(self, resource: str, rid: bytes, answer: Answer, acquire_deadline: float) -> "AsyncLease":
        resp = answer.value
        c = self.config
        ttl_ms = int(resp.lease_ttl_ms)
        sent_at = answer.first_sent_at
        core = LeaseCore(
            key=next(self._keys), resource=resource, lease_id=bytes(resp.lease_id),
            token=int(resp.fencing_token), shard_id=int(resp.shard_id),
            deduplicated=bool(resp.deduplicated), request_id=rid, ttl_ms=ttl_ms,
            expires_at_ms=int(resp.expires_at_ms),
            stop_by=_policy.stop_by(sent_at, ttl_ms, c.stop_by_margin_percent),
            next_renew_at=sent_at + _policy.jittered_renew_interval_s(ttl_ms), config=c,
        )
        if core.deduplicated or time.monotonic() >= sent_at + _policy.renew_interval_s(ttl_ms):
            deadline = max(acquire_deadline, time.monotonic() + c.attempt_timeout_ms / 1000.0)
            try:
                req = lock_pb2.RenewRequest(resource=resource, lease_id=core.lease_id, lease_ttl_ms=0)
                a = await self._calls.call("Renew", req, lock_pb2.RenewResponse, resource=resource,
                                           shard_id=core.shard_id, deadline=deadline)
                core.apply(a.last_sent_at, RenewOutcome(int(a.value.lease_ttl_ms), int(a.value.expires_at_ms)))
            except FencelockError as e:
                if getattr(e, "reason", None) is Reason.LEASE_NOT_HELD or time.monotonic() >= core.stop_by:
                    self._spawn(self._release_quietly(core))
                    raise
        lease = AsyncLease(self, core)
        self._leases[core.key] = core
        if self._renewer is None:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())
        self._wake.set()
        return lease

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _release_in_background(self, core: LeaseCore) -> None:
        with core.lock:
            core.released = True
        self._leases.pop(core.key, None)
        if not self._closed:
            try:
                self._spawn(self._release_quietly(core))
            except RuntimeError:  # no running loop
                pass

    async def _release_quietly(self, core: LeaseCore) -> None:
        try:
            await self._release(core, time.monotonic() + 2.0)
        except FencelockError:
            pass

    async def _release(self, core: LeaseCore, deadline: Optional[float] = None) -> bool:
        with core.lock:
            core.released = True
        self._leases.pop(core.key, None)
        if deadline is None:
            deadline = time.monotonic() + self.config.call_timeout_ms / 1000.0
        req = lock_pb2.ReleaseRequest(resource=core.resource, lease_id=core.lease_id)
        a = await self._calls.call("Release", req, lock_pb2.ReleaseResponse, resource=core.resource,
                                   shard_id=None, deadline=deadline)
        return bool(a.value.released)

    async def _proclaim(self, core: LeaseCore, value: bytes) -> int:
        if len(value) > MAX_VALUE_LEN:
            raise InvalidArgumentError(f"value of {len(value)} bytes is over the maximum {MAX_VALUE_LEN}")
        deadline = time.monotonic() + self.config.call_timeout_ms / 1000.0
        req = lock_pb2.ProclaimRequest(resource=core.resource, lease_id=core.lease_id, value=value)
        a = await self._calls.call("Proclaim", req, lock_pb2.ProclaimResponse, resource=core.resource,
                             shard_id=None, deadline=deadline)
        return int(a.value.fencing_token)

    async def get(self, resource: str) -> LockState:
        """See ``Client.get``."""
        _core.check_resource(resource)
        deadline = time.monotonic() + self.config.call_timeout_ms / 1000.0
        a = await self._calls.call("Get", lock_pb2.GetRequest(resource=resource), lock_pb2.GetResponse,
                                   resource=resource, shard_id=None, deadline=deadline)
        self._calls.router.learn(resource, int(a.value.shard_id), a.url)
        return LockState.from_proto(a.value)

    async def watch(self, resource: str, after: Optional[Revision] = None, resume: bool = False) -> "AsyncWatch":
        """See ``Client.watch``: returns once a node has taken the watch;
        ``async for event in watch``."""
        _core.check_resource(resource)
        w = AsyncWatch(self._calls, resource, after, resume)
        await w._start()
        return w

    def election(self, name: str) -> AsyncElection:
        """See ``Client.election``."""
        _core.check_resource(name)
        return AsyncElection(self, name)

    def _lose(self, core: LeaseCore, reason: LostReason) -> None:
        if core.mark_lost(reason):
            self._calls.stats.leases_lost += 1
            self._leases.pop(core.key, None)

    async def _renew_loop(self) -> None:
        while not self._closed:
            now = time.monotonic()
            due, next_wake, lost = _core.plan_pass(list(self._leases.values()), now,
                                                   self._calls.router.target_for_shard)
            for core in lost:
                self._lose(core, LostReason.UNCONFIRMED)
            for url, group in due.items():
                for i in range(0, len(group), _policy.MAX_RENEW_BATCH):
                    self._spawn(self._renew_batch(url, group[i:i + _policy.MAX_RENEW_BATCH]))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(next_wake - time.monotonic(), 0.005))
            except asyncio.TimeoutError:
                pass

    async def _renew_batch(self, url: str, leases: list[LeaseCore]) -> None:
        self._calls.stats.renew_batch_calls += 1
        req = lock_pb2.RenewBatchRequest(items=[
            lock_pb2.RenewRequest(resource=x.resource, lease_id=x.lease_id, lease_ttl_ms=0) for x in leases
        ])
        timeout = _core.renew_attempt_timeout_s(leases, self.config)
        sent_at = time.monotonic()
        outcomes: list[RenewOutcome]
        try:
            resp = await self._calls.unary(url, "RenewBatch", req, lock_pb2.RenewBatchResponse, timeout)
            outcomes = _core.batch_outcomes(resp.results, len(leases))
        except grpc.RpcError as e:
            f = _core.classify_error(e)
            outcomes = [RenewOutcome(failure=f) for _ in leases]
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never let a renewal fail silently
            f = _policy.classify("INTERNAL", repr(e), None)
            outcomes = [RenewOutcome(failure=f) for _ in leases]
        for core, outcome in zip(leases, outcomes):
            if outcome.failure is None:
                self._calls.stats.renewed_items += 1
                self._calls.router.learn(core.resource, core.shard_id, url)
            else:
                self._calls.stats.renew_failures += 1
            lost = core.apply(sent_at, outcome)
            if lost is not None:
                self._lose(core, lost)
            elif outcome.failure is not None:
                shard = (outcome.failure.detail.shard_id if outcome.failure.detail else 0) or core.shard_id
                self._calls.router.reroute(outcome.failure, core.resource, shard, url)
        self._wake.set()


class _AsyncLockContext:
    def __init__(self, client: AsyncClient, resource: str, ttl: float, wait: float, mode: ModeArg,
                 permits: int) -> None:
        self._args = (client, resource, ttl, wait, mode, permits)
        self._lease: Optional[AsyncLease] = None

    async def __aenter__(self) -> "AsyncLease":
        client, resource, ttl, wait, mode, permits = self._args
        self._lease = await client.acquire(resource, ttl=ttl, wait=wait, mode=mode, permits=permits)
        return self._lease

    async def __aexit__(self, et: Optional[type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        if self._lease is not None:
            await self._lease.release(quiet=True)


class AsyncLease:
    """One held lease (asyncio). ``lost`` is awaitable (``await
    lease.lost``); the other properties are those of ``fencelock.Lease``."""

    def __init__(self, client: AsyncClient, core: LeaseCore) -> None:
        self._client = client
        self._core = core
        self.lost = LostSignal(self)
        event = self.lost._event  # not self: the client must not keep this object alive
        core.on_lost.append(lambda _reason: event.set())

    def __del__(self) -> None:
        # Dropped without release: stop renewing, release in the background.
        try:
            core = self._core
            with core.lock:
                if core.released:
                    return
            self._client._release_in_background(core)
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"AsyncLease(resource={self.resource!r}, token={self.token}, held={self.held})"

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release(quiet=True)

    @property
    def resource(self) -> str:
        return self._core.resource

    @property
    def token(self) -> int:
        return self._core.token

    @property
    def lease_id(self) -> bytes:
        return self._core.lease_id

    @property
    def request_id(self) -> bytes:
        return self._core.request_id

    @property
    def shard_id(self) -> int:
        return self._core.shard_id

    @property
    def deduplicated(self) -> bool:
        return self._core.deduplicated

    @property
    def lease_ttl_ms(self) -> int:
        with self._core.lock:
            return self._core.ttl_ms

    @property
    def stop_by(self) -> float:
        with self._core.lock:
            return self._core.stop_by

    @property
    def lost_reason(self) -> Optional[LostReason]:
        self._refresh()
        with self._core.lock:
            return self._core.lost_reason

    @property
    def held(self) -> bool:
        self._refresh()
        return self._core.is_held()

    def _refresh(self) -> None:
        with self._core.lock:
            passed = (self._core.lost_reason is None and not self._core.released
                      and time.monotonic() >= self._core.stop_by)
        if passed:
            self._client._lose(self._core, LostReason.UNCONFIRMED)

    def check(self) -> None:
        if not self.held:
            raise LeaseLostError(self.lost_reason)

    async def proclaim(self, value: bytes) -> int:
        """See ``Lease.proclaim``."""
        return await self._client._proclaim(self._core, value)

    async def release(self, quiet: bool = False) -> bool:
        try:
            return await self._client._release(self._core)
        except FencelockError:
            if quiet:
                return False
            raise


class AsyncWatch(AsyncIterator[WatchEvent]):
    """The events of one resource for asyncio (``AsyncClient.watch``):
    ``async for event in watch``; the rules of ``fencelock.watch.Watch``."""

    def __init__(self, calls: _AsyncCalls, resource: str, after: Optional[Revision], resume: bool) -> None:
        c = calls.config
        self._calls = calls
        self._progress = WatchProgress(
            resource, after, resume, Backoff(c.backoff_base_ms / 1000.0, c.backoff_max_ms / 1000.0)
        )
        self._call: Any = None
        self._url = ""
        self._closed = False

    @property
    def resource(self) -> str:
        return self._progress.resource

    @property
    def after(self) -> Optional[Revision]:
        """The revision of the last event received: watch again after it to resume."""
        return self._progress.after

    def __repr__(self) -> str:
        return f"AsyncWatch(resource={self.resource!r}, after={self.after}, closed={self._closed})"

    async def __aenter__(self) -> "AsyncWatch":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> "AsyncWatch":
        return self

    def close(self) -> None:
        """Ends the watch: a waiting ``__anext__`` stops."""
        self._closed = True
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def _attempt(self, url: str, timeout: float) -> Any:
        call: Any = self._calls.channel(url).unary_stream(
            _SERVICE + "Watch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lock_pb2.WatchEvent.FromString,
        )(watch_request(self.resource, self.after))  # no deadline: it would end the stream
        try:
            await asyncio.wait_for(call.initial_metadata(), timeout)  # the node took the watch
        except asyncio.TimeoutError:
            call.cancel()
            raise NoHeaders(timeout) from None
        if call.done():
            code = await call.code()
            if code is not grpc.StatusCode.OK:  # refused (NOT_LEADER, PERMISSION_DENIED, ...)
                raise grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                           await call.details())
        return call

    async def _start(self, deadline: Optional[float] = None) -> None:
        if deadline is None:
            deadline = self._progress.new_start_deadline(self._calls.config.call_timeout_ms)
        answer = await self._calls.call(
            "Watch", watch_request(self.resource, self.after), lock_pb2.WatchEvent,
            resource=self.resource, shard_id=None, deadline=deadline, attempt=self._attempt,
        )
        if self._closed:
            answer.value.cancel()
        else:
            self._call, self._url = answer.value, answer.url

    async def __anext__(self) -> WatchEvent:
        progress = self._progress
        while True:
            if self._closed:
                raise StopAsyncIteration
            call = self._call
            if call is None:
                await self._start()
                continue
            try:
                message = await call.read()
            except asyncio.CancelledError:
                if self._closed:
                    raise StopAsyncIteration from None
                raise
            except grpc.RpcError as e:
                if self._closed:
                    raise StopAsyncIteration from None
                failure = _core.classify_error(e)
            else:
                if message is grpc.aio.EOF:
                    if not progress.resume:
                        self.close()
                        raise StopAsyncIteration
                    failure = _policy.classify("UNAVAILABLE", ENDED_BY_NODE, None)
                else:
                    event = progress.accept(message)
                    if event is not None:
                        return event
                    continue
            self._call = None
            error, delay, then = progress.ended(failure)
            shard = (failure.detail.shard_id if failure.detail else 0) or progress.shard_id or None
            self._calls.router.reroute(failure, self.resource, shard, self._url)
            if then is Next.RAISE:
                self.close()
                raise error
            if delay:
                await asyncio.sleep(delay)
            await self._start(progress.start_deadline if then is Next.RESTART else None)
