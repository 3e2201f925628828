"""What the sync and asyncio clients share: wire helpers (channels, error
details) and the lease bookkeeping of the background renewer."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import grpc

from . import _policy
from ._policy import Advice, Backoff, Failure
from .config import ClientConfig, TlsConfig
from .errors import ErrorDetail, LostReason, Reason

_DETAILS_KEY = "grpc-status-details-bin"
_DETAIL_TYPE = "fencelock.v1.ErrorDetail"
_REQUEST_ID_LEN = 16

#: gRPC channel options: keepalive so a dead peer is noticed, and quick
#: reconnects after a node restarts (the default backoff grows to minutes).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    ("grpc.enable_retries", 0),
]


def new_request_id() -> bytes:
    """A fresh request id for one logical acquire: 16 random bytes."""
    return os.urandom(_REQUEST_ID_LEN)


def credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_pem, private_key=tls.key_pem, certificate_chain=tls.cert_pem
    )


def decode_detail(raw: bytes) -> Optional[ErrorDetail]:
    """The ErrorDetail inside a ``grpc-status-details-bin`` trailer."""
    from google.rpc import status_pb2

    from .v1 import errors_pb2

    try:
        status = status_pb2.Status.FromString(raw)
    except Exception:
        return None
    for any_msg in status.details:
        if any_msg.type_url.rsplit("/", 1)[-1] == _DETAIL_TYPE:
            try:
                return from_proto_detail(errors_pb2.ErrorDetail.FromString(any_msg.value))
            except Exception:
                return None
    return None


def from_proto_detail(d: Any) -> ErrorDetail:
    leader_id, leader_addr = 0, ""
    if d.HasField("leader"):
        leader_id, leader_addr = int(d.leader.node_id), str(d.leader.address)
    return ErrorDetail(
        reason=int(d.reason), message=str(d.message), retry=int(d.retry),
        retry_after_ms=int(d.retry_after_ms), leader_node_id=leader_id,
        leader_address=leader_addr, shard_id=int(d.shard_id), current_epoch=int(d.current_epoch),
        map_version=int(d.map_version), holder_expires_at_ms=int(d.holder_expires_at_ms),
        queue_length=int(d.queue_length), min_allowed=int(d.min_allowed),
        max_allowed=int(d.max_allowed), field=str(d.field),
    )


def error_parts(err: BaseException) -> tuple[str, str, Optional[ErrorDetail]]:
    """(gRPC code name, message, ErrorDetail or None) of a failed call."""
    if isinstance(err, grpc.RpcError):
        code_fn = getattr(err, "code", None)
        code = code_fn() if callable(code_fn) else None
        code_name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
        details_fn = getattr(err, "details", None)
        message = str(details_fn() or "") if callable(details_fn) else str(err)
        detail = None
        md_fn = getattr(err, "trailing_metadata", None)
        metadata = md_fn() if callable(md_fn) else None
        for key, value in metadata or ():
            if key == _DETAILS_KEY and isinstance(value, bytes):
                detail = decode_detail(value)
        return code_name, message, detail
    return "UNAVAILABLE", f"{type(err).__name__}: {err}", None


def classify_error(err: BaseException) -> Failure:
    code, message, detail = error_parts(err)
    return _policy.classify(code, message, detail)


@dataclass
class RenewOutcome:
    """One lease's renewal result, from a RenewBatch."""

    renewed_ttl_ms: int = 0
    expires_at_ms: int = 0
    failure: Optional[Failure] = None


class LeaseCore:
    """The bookkeeping of one held lease: deadline, renewal schedule, lost
    state. Guarded by its own lock; shared by the renewer and the lease
    object the application holds."""

    def __init__(
        self,
        *,
        key: int,
        resource: str,
        lease_id: bytes,
        token: int,
        shard_id: int,
        deduplicated: bool,
        request_id: bytes,
        ttl_ms: int,
        expires_at_ms: int,
        stop_by: float,
        next_renew_at: float,
        config: ClientConfig,
    ) -> None:
        self.key = key
        self.resource = resource
        self.lease_id = lease_id
        self.token = token
        self.shard_id = shard_id
        self.deduplicated = deduplicated
        self.request_id = request_id
        self._config = config
        self.lock = threading.Lock()
        self.ttl_ms = ttl_ms
        self.expires_at_ms = expires_at_ms
        self.stop_by = stop_by
        self.next_renew_at = next_renew_at
        self.retry_at: Optional[float] = None
        self.backoff = self._renew_backoff()
        self.in_flight = False
        self.renewable = True
        self.lost_reason: Optional[LostReason] = None
        self.released = False
        #: Called once (outside the lock) when the lease is lost.
        self.on_lost: list[Callable[[LostReason], None]] = []

    def _renew_backoff(self) -> Backoff:
        c = self._config
        return _policy.renew_backoff(self.ttl_ms, c.backoff_base_ms, c.backoff_max_ms)

    def is_held(self, now: Optional[float] = None) -> bool:
        now = time.monotonic() if now is None else now
        with self.lock:
            return self.lost_reason is None and not self.released and now < self.stop_by

    def eligible_at(self) -> float:
        if self.retry_at is not None:
            return self.retry_at
        window = _policy.renew_interval_s(self.ttl_ms) / _policy.RENEW_COALESCE_DIVISOR
        return self.next_renew_at - window

    def due_at(self) -> float:
        return self.retry_at if self.retry_at is not None else self.next_renew_at

    def mark_lost(self, reason: LostReason) -> bool:
        """True if this call turned the lease lost (callbacks then run)."""
        with self.lock:
            if self.lost_reason is not None or self.released:
                return False
            self.lost_reason = reason
            callbacks = list(self.on_lost)
        for cb in callbacks:
            try:
                cb(reason)
            except Exception:  # a callback's failure must not stop the renewer
                pass
        return True

    def apply(self, sent_at: float, outcome: RenewOutcome) -> Optional[LostReason]:
        """Applies a renewal's result; returns a LostReason if it lost the
        lease (the caller then calls mark_lost)."""
        with self.lock:
            self.in_flight = False
            if self.lost_reason is not None or self.released:
                return None
            f = outcome.failure
            if f is None:
                self.retry_at = None
                granted = outcome.renewed_ttl_ms
                self.stop_by = max(
                    self.stop_by,
                    _policy.stop_by(sent_at, granted, self._config.stop_by_margin_percent),
                )
                if granted > 0:
                    self.ttl_ms = granted
                self.backoff = self._renew_backoff()
                self.expires_at_ms = max(self.expires_at_ms, outcome.expires_at_ms)
                self.next_renew_at = sent_at + _policy.jittered_renew_interval_s(self.ttl_ms)
                return None
            if f.detail is not None and f.detail.known_reason is Reason.LEASE_NOT_HELD:
                return LostReason.NOT_HELD
            if f.advice is Advice.FAIL:
                # HOLD_LIMIT_REACHED and the like: lost at stop-by.
                self.renewable = False
                return None
            self.retry_at = time.monotonic() + self.backoff.delay(f)
            return None


def plan_pass(
    leases: list[LeaseCore], now: float, target_for_shard: Callable[[int], str]
) -> tuple[dict[str, list[LeaseCore]], float, list[LeaseCore]]:
    """One renewer pass: which leases to renew now (grouped by node), when
    to wake next, and which leases passed their stop-by (now lost)."""
    due: dict[str, list[LeaseCore]] = {}
    lost: list[LeaseCore] = []
    next_wake = now + 60.0
    for lease in leases:
        with lease.lock:
            if lease.lost_reason is not None or lease.released:
                continue
            if now >= lease.stop_by:
                lost.append(lease)
                continue
            next_wake = min(next_wake, lease.stop_by)
            if lease.in_flight or not lease.renewable:
                continue
            if now < lease.eligible_at():
                next_wake = min(next_wake, lease.due_at())
                continue
            lease.in_flight = True
        due.setdefault(target_for_shard(lease.shard_id), []).append(lease)
    return due, next_wake, lost


def renew_attempt_timeout_s(leases: list[LeaseCore], config: ClientConfig) -> float:
    shortest = min(lease.ttl_ms for lease in leases)
    return max(min(config.attempt_timeout_ms, shortest // _policy.RENEW_ATTEMPT_TTL_DIVISOR), 1) / 1000.0


def batch_outcomes(results: Any, n: int) -> list[RenewOutcome]:
    """The per-item outcomes of a RenewBatchResponse."""
    if len(results) != n:
        f = _policy.classify("INTERNAL", f"{len(results)} renew results for {n} items", None)
        return [RenewOutcome(failure=f) for _ in range(n)]
    out: list[RenewOutcome] = []
    for r in results:
        which = r.WhichOneof("outcome")
        if which == "renewed":
            out.append(RenewOutcome(int(r.renewed.lease_ttl_ms), int(r.renewed.expires_at_ms)))
        elif which == "error":
            d = from_proto_detail(r.error)
            out.append(RenewOutcome(failure=_policy.classify("UNKNOWN", d.message, d)))
        else:
            f = _policy.classify("INTERNAL", "renew result without an outcome", None)
            out.append(RenewOutcome(failure=f))
    return out


def check_resource(resource: str) -> None:
    """Only the type is checked here: the server validates names (and
    answers INVALID_RESOURCE, a typed error, like every client gets)."""
    from .errors import InvalidArgumentError

    if not isinstance(resource, str):
        raise InvalidArgumentError(f"resource must be a str, got {type(resource).__name__}")
