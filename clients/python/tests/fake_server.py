"""An in-process fake LockService for unit tests: scripted answers, every
request recorded. Not fencelock: the conformance suite runs the real one."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any, Callable, Iterator

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from fencelock.v1 import errors_pb2, lock_pb2

_CODES = {c.value[0]: c for c in grpc.StatusCode}


def error_status(reason: int, code: grpc.StatusCode, message: str = "", **fields: Any) -> Any:
    leader = fields.pop("leader", None)
    detail = errors_pb2.ErrorDetail(reason=reason, message=message, **fields)
    if leader is not None:
        detail.leader.address = leader
        detail.leader.node_id = 2
    packed = any_pb2.Any()
    packed.Pack(detail)
    return rpc_status.to_status(status_pb2.Status(code=code.value[0], message=message, details=[packed]))


class Abort(Exception):
    def __init__(self, status: Any) -> None:
        self.status = status


Handler = Callable[[Any], Any]


class FakeServer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.handlers: dict[str, Handler] = {}
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        methods = {
            "Acquire": (lock_pb2.AcquireRequest, lock_pb2.AcquireResponse),
            "Renew": (lock_pb2.RenewRequest, lock_pb2.RenewResponse),
            "RenewBatch": (lock_pb2.RenewBatchRequest, lock_pb2.RenewBatchResponse),
            "Release": (lock_pb2.ReleaseRequest, lock_pb2.ReleaseResponse),
            "Get": (lock_pb2.GetRequest, lock_pb2.GetResponse),
        }
        rpc_handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._dispatch(name),
                request_deserializer=req.FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )
            for name, (req, _resp) in methods.items()
        }
        rpc_handlers["Watch"] = grpc.unary_stream_rpc_method_handler(
            self._dispatch_stream("Watch"),
            request_deserializer=lock_pb2.WatchRequest.FromString,
            response_serializer=lambda m: m.SerializeToString(),
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("fencelock.v1.LockService", rpc_handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def _dispatch(self, name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            with self.lock:
                self.calls.append((name, request))
                handler = self.handlers.get(name)
            if handler is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no fake handler for {name}")
            try:
                return handler(request)  # type: ignore[misc]
            except Abort as a:
                context.abort_with_status(a.status)

        return handle

    def _dispatch_stream(self, name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        """A streaming handler is ``h(request, context)``: it raises Abort to
        refuse the call (before any header, as fencelock does), or returns
        an iterable of messages, which may itself raise Abort to end the
        stream with that error after its messages."""

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            with self.lock:
                self.calls.append((name, request))
                handler = self.handlers.get(name)
            if handler is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f"no fake handler for {name}")
            try:
                messages = handler(request, context)  # type: ignore[misc]
            except Abort as a:
                context.abort_with_status(a.status)
            # The node took the watch: headers now, as tonic sends them.
            context.send_initial_metadata(())
            try:
                yield from messages
            except Abort as a:
                context.abort_with_status(a.status)

        return handle

    def requests(self, name: str) -> list[Any]:
        with self.lock:
            return [r for n, r in self.calls if n == name]

    def stop(self) -> None:
        self.server.stop(grace=None)


def grant(token: int = (1 << 40) | 7, ttl_ms: int = 5000, dedup: bool = False, shard: int = 1,
          lease_id: bytes = b"L" * 16, delay: float = 0.0) -> Handler:
    def h(req: Any) -> Any:
        if delay:
            time.sleep(delay)
        return lock_pb2.AcquireResponse(
            lease_id=lease_id, fencing_token=token, expires_at_ms=int(time.time() * 1000) + ttl_ms,
            lease_ttl_ms=ttl_ms, deduplicated=dedup, lease_state=lock_pb2.LEASE_STATE_HELD,
            shard_id=shard, epoch=1,
        )
    return h


def renew_all(ttl_ms: int = 5000) -> Handler:
    def h(req: Any) -> Any:
        return lock_pb2.RenewBatchResponse(results=[
            lock_pb2.RenewResult(renewed=lock_pb2.RenewResponse(expires_at_ms=1, lease_ttl_ms=ttl_ms))
            for _ in req.items
        ])
    return h


def released(req: Any) -> Any:
    return lock_pb2.ReleaseResponse(released=True)


def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)




def until_cancelled(context: grpc.ServicerContext) -> Iterator[Any]:
    """Streams nothing until the client goes away (a quiet watch)."""
    while context.is_active():
        time.sleep(0.01)
    return
    yield


def watch_event(kind: int, rev: tuple[int, int, int], held: bool = False, token: int = 0,
                value: bytes = b"", expires_at_ms: int = 0, gap: bool = False, shard: int = 1) -> Any:
    return lock_pb2.WatchEvent(
        kind=kind, revision=lock_pb2.Revision(epoch=rev[0], index=rev[1], seq=rev[2]), held=held,
        fencing_token=token, value=value, expires_at_ms=expires_at_ms, gap=gap, shard_id=shard,
    )
