"""Watching a resource (lock.proto ``Watch``): typed events, and the sync
``Watch`` iterator that ``Client.watch`` returns (the asyncio one is
``fencelock.aio.AsyncWatch``).

A watch streams the resource's state now (a STATE event), then every change
as its shard applies it, each under a ``Revision`` that only rises. When the
stream ends with an error whose ``resumes_watch`` is true, watching again
with ``after`` = the last revision received continues where it stopped,
nothing missed or repeated; ``resume=True`` does that by itself.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

import grpc

from . import _core, _policy
from ._policy import Advice, Backoff, Failure
from .errors import FencelockError, GrpcError, rejected
from .state import Holding, holdings
from .v1 import lock_pb2

if TYPE_CHECKING:
    from .client import _Calls


class WatchEventKind(enum.IntEnum):
    """``fencelock.v1.WatchEventKind``. A kind this client does not know (a
    newer server) is UNSPECIFIED."""

    UNSPECIFIED = 0
    #: The resource's state as of the revision: the first event of a watch
    #: without ``after``, or (with ``gap``) instead of changes no longer kept.
    STATE = 1
    #: A lease was granted: ``fencing_token``, ``value``, ``expires_at_ms``.
    GRANTED = 2
    #: The holder replaced its value (proclaim); same token.
    VALUE_CHANGED = 3
    #: The lease with ``fencing_token`` was released by its holder ...
    RELEASED = 4
    #: ... expired ...
    EXPIRED = 5
    #: ... or was ended by the service (a cancelled grant).
    CANCELLED = 6


@dataclass(frozen=True, order=True)
class Revision:
    """A place in a resource's history; revisions compare as
    ``(epoch, index, seq)``, the same on every node. ``str()`` gives
    ``EPOCH.INDEX.SEQ`` (what ``fencelock watch`` prints), ``parse`` reads it."""

    epoch: int
    index: int
    seq: int

    def __str__(self) -> str:
        return f"{self.epoch}.{self.index}.{self.seq}"

    @classmethod
    def parse(cls, text: str) -> "Revision":
        parts = text.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{text!r} is not a revision: expected EPOCH.INDEX.SEQ, e.g. 3.1204.0")
        return cls(int(parts[0]), int(parts[1]), int(parts[2]))

    def to_proto(self) -> Any:
        return lock_pb2.Revision(epoch=self.epoch, index=self.index, seq=self.seq)

    @classmethod
    def from_proto(cls, r: Any) -> "Revision":
        return cls(int(r.epoch), int(r.index), int(r.seq))


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch (``fencelock.v1.WatchEvent``)."""

    kind: WatchEventKind
    #: Where it happened; resume after it. None only from a server that
    #: sent none.
    revision: Optional[Revision]
    #: Whether a lease holds the resource after this event (for a shared
    #: lock or a semaphore: any of its holdings).
    held: bool
    #: The token of the lease the event is about (STATE: the holder's, 0
    #: when free).
    fencing_token: int
    #: The holder's value (STATE, GRANTED, VALUE_CHANGED).
    value: bytes
    #: When the lease ends unless renewed (STATE, GRANTED), on the shard's
    #: lease clock (ms since the Unix epoch); informational.
    expires_at_ms: int
    #: STATE only: the changes between the ``after`` asked for and this
    #: state were not kept; this is the state now.
    gap: bool
    #: The shard serving the resource.
    shard_id: int
    #: STATE only: every holding, oldest first (one for an exclusive lock;
    #: ``fencing_token`` is the first's). Other events are about the one
    #: lease ``fencing_token`` names.
    holders: tuple[Holding, ...] = ()

    @classmethod
    def from_proto(cls, m: Any) -> "WatchEvent":
        try:
            kind = WatchEventKind(int(m.kind))
        except ValueError:
            kind = WatchEventKind.UNSPECIFIED
        return cls(
            kind=kind,
            revision=Revision.from_proto(m.revision) if m.HasField("revision") else None,
            held=bool(m.held),
            fencing_token=int(m.fencing_token),
            value=bytes(m.value),
            expires_at_ms=int(m.expires_at_ms),
            gap=bool(m.gap),
            shard_id=int(m.shard_id),
            holders=holdings(m.holders),
        )


@dataclass(frozen=True)
class Leader:
    """Who leads an election: the value its lease publishes and its
    fencing token."""

    value: bytes
    fencing_token: int


def watch_request(resource: str, after: Optional[Revision]) -> Any:
    req = lock_pb2.WatchRequest(resource=resource)
    if after is not None:
        req.after.CopyFrom(after.to_proto())
    return req


def ending_error(failure: Failure) -> FencelockError:
    """The typed error a watch stream ended with."""
    if failure.detail is not None:
        return rejected(failure.detail, failure.code)
    return GrpcError(failure.code, failure.summary)


#: How a stream that ended without an error is reported when resuming
#: (UNAVAILABLE: the Rust CLI's rule).
ENDED_BY_NODE = "the node ended the watch"


class NoHeaders(grpc.RpcError):
    """A watch attempt whose node sent no response headers in time."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__()
        self._message = f"no answer to the watch within {int(timeout_s * 1000)} ms"

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._message


class WatchProgress:
    """What the sync and asyncio watches share: the resume point, the
    duplicate filter, and the decision to resume."""

    def __init__(self, resource: str, after: Optional[Revision], resume: bool, backoff: Backoff) -> None:
        self.resource = resource
        self.after = after
        self.resume = resume
        self.backoff = backoff
        self.events_since_start = 0
        self.shard_id = 0
        #: The deadline of the current start (``call_timeout_ms``).
        self.start_deadline = 0.0

    def new_start_deadline(self, call_timeout_ms: int) -> float:
        self.start_deadline = time.monotonic() + call_timeout_ms / 1000.0
        return self.start_deadline

    def accept(self, message: Any) -> Optional[WatchEvent]:
        """The event, or None for one at or before the resume point (a
        server never sends one; this makes sure)."""
        event = WatchEvent.from_proto(message)
        if event.revision is not None:
            if self.after is not None and event.revision <= self.after:
                return None
            self.after = event.revision
        self.events_since_start += 1
        if self.backoff.doublings:
            self.backoff = Backoff(self.backoff.base_s, self.backoff.max_s)
        if event.shard_id:
            self.shard_id = event.shard_id
        return event

    def ended(self, failure: Failure) -> tuple[FencelockError, float, "Next"]:
        """The error the stream ended with, how long to wait before
        watching again (at once unless the stream gave nothing), and what
        to do: RESTART a start whose refusal raced its headers (an ending
        before any event, within the start's deadline, that is not
        definitive), RESUME an ending a new watch resolves when resuming,
        else RAISE."""
        error = ending_error(failure)
        early = self.events_since_start == 0 and time.monotonic() < self.start_deadline
        delay = 0.0 if self.events_since_start else self.backoff.delay(failure)
        self.events_since_start = 0
        if early and failure.advice is not Advice.FAIL:
            return error, delay, Next.RESTART
        if self.resume and error.resumes_watch:
            return error, delay, Next.RESUME
        return error, delay, Next.RAISE


class Next(enum.Enum):
    RESTART = "restart"
    RESUME = "resume"
    RAISE = "raise"


class Watch(Iterator[WatchEvent]):
    """The events of one resource (``Client.watch``): iterate it; ``close()``
    it (or leave its ``with`` block) to stop. ``after`` is the resume point,
    the revision of the last event received.

    Without ``resume``, iteration raises the error the stream ended with (a
    ``FencelockError``; watch again with ``after`` when its
    ``resumes_watch`` is true) and stops quietly after ``close()``. With
    ``resume``, such endings are resumed by themselves, from ``after``,
    without a duplicate; only the others are raised."""

    def __init__(self, calls: "_Calls", resource: str, after: Optional[Revision], resume: bool) -> None:
        c = calls.config
        self._calls = calls
        self._progress = WatchProgress(
            resource, after, resume, Backoff(c.backoff_base_ms / 1000.0, c.backoff_max_ms / 1000.0)
        )
        self._lock = threading.Lock()
        self._call: Any = None
        self._url = ""
        self._closed = False
        self._start()

    @property
    def resource(self) -> str:
        return self._progress.resource

    @property
    def after(self) -> Optional[Revision]:
        """The revision of the last event received (or the ``after`` the
        watch started with): watch again after it to resume."""
        return self._progress.after

    def __repr__(self) -> str:
        return f"Watch(resource={self.resource!r}, after={self.after}, closed={self._closed})"

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> "Watch":
        return self

    def close(self) -> None:
        """Ends the watch (thread-safe): a blocked iteration stops."""
        with self._lock:
            self._closed = True
            call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _attempt(self, url: str, timeout: float) -> Any:
        request = watch_request(self.resource, self.after)
        call: Any = self._calls.channel(url).unary_stream(
            "/fencelock.v1.LockService/Watch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lock_pb2.WatchEvent.FromString,
        )(request)  # no deadline: it would end the stream
        timer = threading.Timer(timeout, call.cancel)
        timer.daemon = True
        timer.start()
        try:
            call.initial_metadata()  # the headers: the node took the watch
        finally:
            timer.cancel()
        if call.done() and call.code() is not grpc.StatusCode.OK:
            if call.code() is grpc.StatusCode.CANCELLED and not self._closed:
                raise NoHeaders(timeout)
            raise call  # refused (NOT_LEADER, PERMISSION_DENIED, ...): the call is the RpcError
        return call

    def _start(self, deadline: Optional[float] = None) -> None:
        if deadline is None:
            deadline = self._progress.new_start_deadline(self._calls.config.call_timeout_ms)
        answer = self._calls.call(
            "Watch", watch_request(self.resource, self.after), lock_pb2.WatchEvent,
            resource=self.resource, shard_id=None, deadline=deadline, attempt=self._attempt,
        )
        with self._lock:
            if not self._closed:
                self._call, self._url = answer.value, answer.url
                return
        answer.value.cancel()

    def __next__(self) -> WatchEvent:
        progress = self._progress
        while True:
            with self._lock:
                call, closed = self._call, self._closed
            if closed:
                raise StopIteration
            if call is None:
                self._start()
                continue
            try:
                message = next(call)
            except StopIteration:
                if not progress.resume:
                    self.close()
                    raise
                failure = _policy.classify("UNAVAILABLE", ENDED_BY_NODE, None)
            except grpc.RpcError as e:
                if self._closed:
                    raise StopIteration
                failure = _core.classify_error(e)
            else:
                event = progress.accept(message)
                if event is not None:
                    return event
                continue
            with self._lock:
                self._call = None
            error, delay, then = progress.ended(failure)
            shard = (failure.detail.shard_id if failure.detail else 0) or progress.shard_id or None
            self._calls.router.reroute(failure, self.resource, shard, self._url)
            if then is Next.RAISE:
                self.close()
                raise error
            if delay:
                time.sleep(delay)
            self._start(progress.start_deadline if then is Next.RESTART else None)
