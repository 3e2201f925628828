"""The synchronous client: ``Client``, ``Lease``.

Calls are routed (shard leaders learned from answers and NOT_LEADER hints),
retried per the error contract (errors.proto) within a deadline, acquires
keep ONE request id across retries, and held leases are renewed by one
background thread per client, batched per node with RenewBatch.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Optional, Sequence, TypeVar

import grpc
from google.protobuf.message import Message

from . import _core, _policy
from ._core import LeaseCore, RenewOutcome
from ._policy import Advice, Backoff, Failure
from ._router import Router, target_of
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
from .election import Election
from .v1 import lock_pb2
from .state import LockState, Mode, ModeArg, acquire_mode
from .watch import Revision, Watch

_SERVICE = "/fencelock.v1.LockService/"
#: Times one logical acquire may start over with a fresh request id after
#: its id's acquire is known to hold nothing (WAIT_CANCELLED, ended grant).
MAX_ACQUIRE_RESTARTS = 3

R = TypeVar("R", bound=Message)


@dataclass
class Answer:
    value: Any
    first_sent_at: float
    last_sent_at: float
    url: str


@dataclass
class ClientStats:
    retries: int = 0
    renew_batch_calls: int = 0
    renewed_items: int = 0
    renew_failures: int = 0
    leases_lost: int = 0


def _ms(seconds: float) -> int:
    if seconds < 0:
        raise InvalidArgumentError(f"durations must not be negative, got {seconds}")
    return int(round(seconds * 1000))


class _Calls:
    """Routing, channels and the retry loop, for the sync API."""

    def __init__(self, endpoints: Sequence[str], config: ClientConfig) -> None:
        config.validate()
        self.config = config
        self.router = Router(endpoints, tls=config.tls is not None)
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self.stats = ClientStats()

    def channel(self, url: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(url)
            if ch is None:
                target, tls = target_of(url)
                if tls:
                    if self.config.tls is None:
                        raise InvalidArgumentError(f"{url}: https needs a TlsConfig")
                    ch = grpc.secure_channel(target, _core.credentials(self.config.tls), _core.CHANNEL_OPTIONS)
                else:
                    ch = grpc.insecure_channel(target, _core.CHANNEL_OPTIONS)
                self._channels[url] = ch
            return ch

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    def rpc(self, url: str, method: str, response_type: type[R]) -> Callable[..., R]:
        return self.channel(url).unary_unary(
            _SERVICE + method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )

    def call(
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
        attempt: Optional[Callable[[str, float], Any]] = None,
    ) -> Answer:
        """One logical call. ``attempt(url, timeout)``, when given, makes one
        attempt instead of the unary ``method`` (a watch's start)."""
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
                    response = attempt(url, timeout)
                else:
                    response = self.rpc(url, method, response_type)(request, timeout=timeout)
                return Answer(response, first_sent, sent_at, url)
            except grpc.RpcError as e:
                err: BaseException = e
            failure = _core.classify_error(err)
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
            time.sleep(delay)


class Client:
    """A fencelock client (sync API). Thread-safe; one background thread
    renews every lease of the client.

    >>> with Client(["127.0.0.1:7001"]) as client:          # doctest: +SKIP
    ...     with client.lock("acme/orders/42", ttl=30, wait=5) as lease:
    ...         write(order, fencing_token=lease.token)
    """

    def __init__(self, endpoints: Sequence[str], config: Optional[ClientConfig] = None) -> None:
        self.config = config or ClientConfig()
        self._calls = _Calls(endpoints, self.config)
        self._leases: dict[int, LeaseCore] = {}
        self._keys = itertools.count(1)
        self._cond = threading.Condition()
        self._closed = False
        self._renewer: Optional[threading.Thread] = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fencelock-renew")

    # ---- lifecycle -------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, release_timeout: float = 2.0) -> None:
        """Releases held leases (best effort, bounded), stops the renewer and
        closes the connections."""
        with self._cond:
            if self._closed:
                return
            leases = list(self._leases.values())
        deadline = time.monotonic() + release_timeout
        for core in leases:
            if time.monotonic() >= deadline:
                break
            try:
                self._release(core, deadline)
            except FencelockError:
                pass
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._calls.close()

    @property
    def stats(self) -> ClientStats:
        return self._calls.stats

    @property
    def held_leases(self) -> int:
        with self._cond:
            return len(self._leases)

    # ---- locks -----------------------------------------------------------

    def lock(self, resource: str, ttl: float = 30.0, wait: float = 0.0, mode: ModeArg = Mode.EXCLUSIVE,
             permits: int = 0) -> "_LockContext":
        """A context manager: acquires on entry (``ttl`` and ``wait`` in
        seconds; ``mode`` and ``permits`` as ``acquire``), releases on exit."""
        return _LockContext(self, resource, ttl, wait, mode, permits)

    def acquire(
        self, resource: str, ttl: float = 30.0, wait: float = 0.0, request_id: Optional[bytes] = None,
        value: bytes = b"", mode: ModeArg = Mode.EXCLUSIVE, permits: int = 0,
    ) -> "Lease":
        """Takes the lease, waiting up to ``wait`` seconds in the resource's
        queue (0 = fail at once with LockHeldError). ``ttl`` 0 = the server's
        default. ``request_id``: only to learn the outcome of an earlier
        acquire that failed with UnavailableError (it carries its id).
        ``value``: what the lease publishes while it holds (``get`` returns
        it; at most 4096 bytes), e.g. an elected leader's address.

        ``mode``: ``"exclusive"`` (the default: the only holder),
        ``"shared"`` (one of any number of readers, never beside an exclusive
        holder) or ``"semaphore"`` (one of at most ``permits`` holders,
        1..=1024; ``permits`` only with a semaphore, else
        InvalidArgumentError before any call). Every grant has its own
        token. A resource used in another kind (a lock as a semaphore, a
        semaphore with another count) raises ModeMismatchError."""
        _core.check_resource(resource)
        ttl_ms, wait_ms = _ms(ttl), _ms(wait)
        if wait_ms > MAX_WAIT_TIMEOUT_MS:
            raise InvalidArgumentError(f"wait of {wait_ms} ms is over the maximum {MAX_WAIT_TIMEOUT_MS}")
        explicit = request_id is not None
        if request_id is not None and not 1 <= len(request_id) <= MAX_REQUEST_ID_LEN:
            raise InvalidArgumentError(f"request id must be 1..={MAX_REQUEST_ID_LEN} bytes")
        if len(value) > MAX_VALUE_LEN:
            raise InvalidArgumentError(f"value of {len(value)} bytes is over the maximum {MAX_VALUE_LEN}")
        wire_mode, wire_permits = acquire_mode(mode, permits)
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
                answer = self._calls.call(
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
            return self._hold(resource, rid, answer, deadline)

    def _hold(self, resource: str, rid: bytes, answer: Answer, acquire_deadline: float) -> "Lease":
        resp = answer.value
        c = self.config
        ttl_ms = int(resp.lease_ttl_ms)
        sent_at = answer.first_sent_at  # the grant may have come from the first attempt
        stop_by = _policy.stop_by(sent_at, ttl_ms, c.stop_by_margin_percent)
        next_renew = sent_at + _policy.jittered_renew_interval_s(ttl_ms)
        core = LeaseCore(
            key=next(self._keys), resource=resource, lease_id=bytes(resp.lease_id),
            token=int(resp.fencing_token), shard_id=int(resp.shard_id),
            deduplicated=bool(resp.deduplicated), request_id=rid, ttl_ms=ttl_ms,
            expires_at_ms=int(resp.expires_at_ms), stop_by=stop_by, next_renew_at=next_renew, config=c,
        )
        # A deduplicated answer grants only what is left of the original
        # grant; an acquire that waited long may have a short deadline:
        # renew once now, so the lease starts with a full one.
        if core.deduplicated or time.monotonic() >= sent_at + _policy.renew_interval_s(ttl_ms):
            deadline = max(acquire_deadline, time.monotonic() + c.attempt_timeout_ms / 1000.0)
            try:
                renew_sent, renewed = self._renew_one(core, deadline)
                core.apply(renew_sent, RenewOutcome(int(renewed.lease_ttl_ms), int(renewed.expires_at_ms)))
            except FencelockError as e:
                if getattr(e, "reason", None) is Reason.LEASE_NOT_HELD or time.monotonic() >= core.stop_by:
                    threading.Thread(target=self._release_quietly, args=(core,), daemon=True).start()
                    raise
        lease = Lease(self, core)
        with self._cond:
            self._leases[core.key] = core
            self._ensure_renewer()
            self._cond.notify_all()
        return lease

    def _renew_one(self, core: LeaseCore, deadline: float) -> tuple[float, Any]:
        req = lock_pb2.RenewRequest(resource=core.resource, lease_id=core.lease_id, lease_ttl_ms=0)
        a = self._calls.call("Renew", req, lock_pb2.RenewResponse, resource=core.resource,
                             shard_id=core.shard_id, deadline=deadline)
        return a.last_sent_at, a.value

    def _release_in_background(self, core: LeaseCore) -> None:
        with core.lock:
            core.released = True
        with self._cond:
            self._leases.pop(core.key, None)
            closed = self._closed
        if not closed:
            try:
                self._pool.submit(self._release_quietly, core)
            except RuntimeError:  # closing
                pass

    def _release_quietly(self, core: LeaseCore) -> None:
        try:
            self._release(core, time.monotonic() + 2.0)
        except FencelockError:
            pass

    def _release(self, core: LeaseCore, deadline: Optional[float] = None) -> bool:
        with core.lock:
            core.released = True
        with self._cond:
            self._leases.pop(core.key, None)
        if deadline is None:
            deadline = time.monotonic() + self.config.call_timeout_ms / 1000.0
        req = lock_pb2.ReleaseRequest(resource=core.resource, lease_id=core.lease_id)
        a = self._calls.call("Release", req, lock_pb2.ReleaseResponse, resource=core.resource,
                             shard_id=None, deadline=deadline)
        return bool(a.value.released)

    def _proclaim(self, core: LeaseCore, value: bytes) -> int:
        if len(value) > MAX_VALUE_LEN:
            raise InvalidArgumentError(f"value of {len(value)} bytes is over the maximum {MAX_VALUE_LEN}")
        deadline = time.monotonic() + self.config.call_timeout_ms / 1000.0
        req = lock_pb2.ProclaimRequest(resource=core.resource, lease_id=core.lease_id, value=value)
        a = self._calls.call("Proclaim", req, lock_pb2.ProclaimResponse, resource=core.resource,
                             shard_id=None, deadline=deadline)
        return int(a.value.fencing_token)

    def get(self, resource: str) -> LockState:
        """The resource's lock state (a linearizable read): a ``LockState``
        with the fields of ``GetResponse``, every holding in ``holders``."""
        _core.check_resource(resource)
        deadline = time.monotonic() + self.config.call_timeout_ms / 1000.0
        a = self._calls.call("Get", lock_pb2.GetRequest(resource=resource), lock_pb2.GetResponse,
                             resource=resource, shard_id=None, deadline=deadline)
        self._calls.router.learn(resource, int(a.value.shard_id), a.url)
        return LockState.from_proto(a.value)

    def watch(self, resource: str, after: Optional[Revision] = None, resume: bool = False) -> Watch:
        """Watches ``resource`` (lock.proto ``Watch``) on a node with a
        replica of its shard: its state now (``after`` None, a STATE event),
        then every change as it commits (GRANTED, VALUE_CHANGED, RELEASED,
        EXPIRED, CANCELLED); with ``after`` (the last revision received),
        the changes after it. Returns once a node has taken the watch
        (routing and availability failures are retried until the call
        deadline; refusals such as PERMISSION_DENIED are raised); iterate
        the ``Watch`` for the events.

        The stream has no deadline. When it ends with an error, iteration
        raises it; its ``resumes_watch`` says whether watching again after
        ``watch.after`` continues. ``resume=True`` does that by itself,
        skipping nothing and repeating nothing (a ``gap`` STATE event says
        the node no longer had the changes)."""
        _core.check_resource(resource)
        return Watch(self._calls, resource, after, resume)

    def election(self, name: str) -> Election:
        """The election on resource ``name`` (``tenant/path``):
        ``campaign``, ``leader``, ``observe``."""
        _core.check_resource(name)
        return Election(self, name)

    # ---- the renewer -----------------------------------------------------

    def _ensure_renewer(self) -> None:
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_loop, name="fencelock-renewer", daemon=True)
            self._renewer.start()

    def _renew_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                leases = list(self._leases.values())
            now = time.monotonic()
            due, next_wake, lost = _core.plan_pass(leases, now, self._calls.router.target_for_shard)
            for core in lost:
                self._lose(core, LostReason.UNCONFIRMED)
            for url, group in due.items():
                for i in range(0, len(group), _policy.MAX_RENEW_BATCH):
                    chunk = group[i:i + _policy.MAX_RENEW_BATCH]
                    try:
                        self._pool.submit(self._renew_batch, url, chunk)
                    except RuntimeError:  # pool shut down: closing
                        return
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(timeout=max(next_wake - time.monotonic(), 0.005))

    def _lose(self, core: LeaseCore, reason: LostReason) -> None:
        if core.mark_lost(reason):
            self._calls.stats.leases_lost += 1
            with self._cond:
                self._leases.pop(core.key, None)

    def _renew_batch(self, url: str, leases: list[LeaseCore]) -> None:
        self._calls.stats.renew_batch_calls += 1
        req = lock_pb2.RenewBatchRequest(items=[
            lock_pb2.RenewRequest(resource=x.resource, lease_id=x.lease_id, lease_ttl_ms=0) for x in leases
        ])
        timeout = _core.renew_attempt_timeout_s(leases, self.config)
        sent_at = time.monotonic()
        outcomes: list[RenewOutcome]
        try:
            resp = self._calls.rpc(url, "RenewBatch", lock_pb2.RenewBatchResponse)(req, timeout=timeout)
            outcomes = _core.batch_outcomes(resp.results, len(leases))
        except grpc.RpcError as e:
            f = _core.classify_error(e)
            outcomes = [RenewOutcome(failure=f) for _ in leases]
        except Exception as e:  # never let the renewer die silently
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
        with self._cond:
            self._cond.notify_all()


class _LockContext:
    def __init__(self, client: Client, resource: str, ttl: float, wait: float, mode: ModeArg,
                 permits: int) -> None:
        self._args = (client, resource, ttl, wait, mode, permits)
        self._lease: Optional[Lease] = None

    def __enter__(self) -> "Lease":
        client, resource, ttl, wait, mode, permits = self._args
        self._lease = client.acquire(resource, ttl=ttl, wait=wait, mode=mode, permits=permits)
        return self._lease

    def __exit__(self, et: Optional[type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._lease is not None:
            self._lease.release(quiet=True)


class Lease:
    """One held lease. ``token`` goes with every protected write;
    ``stop_by`` (``time.monotonic()`` seconds) is when work must stop at the
    latest; ``lost`` is set when the lease is lost (a renewal answered
    LEASE_NOT_HELD, or stop-by passed unconfirmed)."""

    def __init__(self, client: Client, core: LeaseCore) -> None:
        self._client = client
        self._core = core
        #: Set when the lease is lost (not when you release it).
        self.lost = threading.Event()
        lost = self.lost  # not self: the client must not keep this object alive
        core.on_lost.append(lambda _reason: lost.set())

    def __del__(self) -> None:
        # Dropped without release: stop renewing, release in the background
        # (as dropping a Rust LockGuard does).
        try:
            core = self._core
            with core.lock:
                if core.released:
                    return
            self._client._release_in_background(core)
        except Exception:
            pass

    def __repr__(self) -> str:  # never the lease id: it is a credential
        return f"Lease(resource={self.resource!r}, token={self.token}, held={self.held})"

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release(quiet=True)

    @property
    def resource(self) -> str:
        return self._core.resource

    @property
    def token(self) -> int:
        """The fencing token: send it with every protected write."""
        return self._core.token

    @property
    def lease_id(self) -> bytes:
        """The credential for renew and release. Never log it."""
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
    def expires_at_ms(self) -> int:
        with self._core.lock:
            return self._core.expires_at_ms

    @property
    def stop_by(self) -> float:
        """The conservative deadline on ``time.monotonic()``: the send time
        of the last answered acquire/renewal + the granted TTL − the drift
        margin."""
        with self._core.lock:
            return self._core.stop_by

    @property
    def lost_reason(self) -> Optional[LostReason]:
        self._refresh()
        with self._core.lock:
            return self._core.lost_reason

    @property
    def held(self) -> bool:
        """Held as far as the client knows, and stop-by not passed."""
        self._refresh()
        return self._core.is_held()

    def _refresh(self) -> None:
        # The lost signal fires at stop-by even if the renewer is late.
        with self._core.lock:
            passed = self._core.lost_reason is None and not self._core.released and time.monotonic() >= self._core.stop_by
        if passed:
            self._client._lose(self._core, LostReason.UNCONFIRMED)

    def check(self) -> None:
        """Raises LeaseLostError unless the lease is held: call it before
        each protected step."""
        if not self.held:
            raise LeaseLostError(self.lost_reason)

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[LostReason]:
        """Blocks until the lease is lost (returns why) or ``timeout``
        seconds pass (returns None). Fires at stop-by at the latest."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            self._refresh()
            if self.lost.is_set():
                return self.lost_reason
            with self._core.lock:
                if self._core.released:
                    return None
                step = self._core.stop_by - time.monotonic()
            if end is not None:
                step = min(step, end - time.monotonic())
                if step <= 0:
                    return None
            self.lost.wait(timeout=max(step, 0.001))

    def proclaim(self, value: bytes) -> int:
        """Replaces the value this lease publishes (``get`` returns it): an
        election's Proclaim. The token does not change; it is returned.
        LeaseNotHeld (a RejectedError) means the lock is lost."""
        return self._client._proclaim(self._core, value)

    def release(self, quiet: bool = False) -> bool:
        """Stops renewing and ends the lease: True if this ended the
        holding. ``quiet``: errors are swallowed (returns False)."""
        try:
            return self._client._release(self._core)
        except FencelockError:
            if quiet:
                return False
            raise
