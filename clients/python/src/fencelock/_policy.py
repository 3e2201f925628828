"""The error contract's retry policy, backoff and lease timing: pure logic
shared by the sync and the asyncio clients (the same rules as the Rust
client, ``crates/client/src/retry.rs`` and ``lease.rs``)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Optional

from .errors import ErrorDetail, Reason, RetryPolicy

#: Immediate retries allowed per call before backing off.
MAX_IMMEDIATE_RETRIES = 5
#: Cap on backoff doublings (the step is capped by backoff_max_ms anyway).
_MAX_DOUBLINGS = 16

#: Renew at a third of the TTL after the last renewal was sent ...
RENEW_AT_TTL_DIVISOR = 3
#: ... give or take 10% (jitter, so many clients do not renew in lockstep).
RENEW_JITTER_PERCENT = 10
#: Leases due within a quarter of their renew interval go out together.
RENEW_COALESCE_DIVISOR = 4
#: A failed renewal is retried with backoff capped at a tenth of the TTL.
RENEW_RETRY_MAX_TTL_DIVISOR = 10
#: One renewal attempt lasts at most a third of the shortest TTL in it.
RENEW_ATTEMPT_TTL_DIVISOR = 3
#: The server's largest RenewBatch.
MAX_RENEW_BATCH = 1024

_P = RetryPolicy
_DEFAULT_RETRY: dict[Reason, RetryPolicy] = {}
for _r in (
    Reason.UNSPECIFIED, Reason.INVALID_RESOURCE, Reason.INVALID_REQUEST_ID,
    Reason.INVALID_LEASE_ID, Reason.TTL_OUT_OF_RANGE, Reason.WAIT_TIMEOUT_OUT_OF_RANGE,
    Reason.BATCH_TOO_LARGE, Reason.REQUEST_ID_REUSED, Reason.INVALID_ADMIN_REQUEST,
    Reason.PERMISSION_DENIED, Reason.LEASE_NOT_HELD, Reason.HOLD_LIMIT_REACHED,
    Reason.PLACEMENT_CONFLICT, Reason.WAIT_CANCELLED, Reason.SHARD_NOT_FOUND,
    Reason.NODE_NOT_FOUND, Reason.MALFORMED_REQUEST, Reason.MESSAGE_TOO_LARGE,
    Reason.VALUE_TOO_LARGE, Reason.FEATURE_NOT_ENABLED, Reason.MODE_MISMATCH, Reason.INVALID_PERMITS,
):
    _DEFAULT_RETRY[_r] = _P.NEVER
for _r in (Reason.LEASE_ID_COLLISION, Reason.NOT_LEADER, Reason.OUTCOME_UNKNOWN,
           Reason.EPOCH_NOT_MATCH):
    _DEFAULT_RETRY[_r] = _P.IMMEDIATELY
for _r in (
    Reason.LOCK_HELD, Reason.WAIT_TIMED_OUT, Reason.QUEUE_FULL, Reason.TENANT_WAITERS_EXCEEDED,
    Reason.DEDUP_TABLE_FULL, Reason.TABLE_FULL, Reason.TENANT_QUOTA_EXCEEDED,
    Reason.RATE_LIMITED, Reason.VALUES_FULL, Reason.LEADER_UNKNOWN, Reason.NO_QUORUM, Reason.LEADER_NOT_READY,
    Reason.TOKEN_SPACE_EXHAUSTED, Reason.SHUTTING_DOWN, Reason.SERVER_BUSY, Reason.INTERNAL,
):
    _DEFAULT_RETRY[_r] = _P.BACKOFF

#: Answers that end an acquire although their advice is BACKOFF: they answer
#: what was asked; whether to try again later is the caller's decision.
ACQUIRE_CONTENTION_REASONS = frozenset(
    {Reason.LOCK_HELD, Reason.WAIT_TIMED_OUT, Reason.QUEUE_FULL,
     Reason.TENANT_WAITERS_EXCEEDED, Reason.TENANT_QUOTA_EXCEEDED}
)

#: gRPC codes of transport failures: retried with backoff at another node.
_TRANSPORT_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})


def default_retry(reason: Reason) -> RetryPolicy:
    """The retry advice documented on ``reason`` in errors.proto."""
    return _DEFAULT_RETRY[reason]


class Advice(enum.Enum):
    FAIL = "fail"
    NOW = "now"
    AFTER = "after"
    BACKOFF = "backoff"


class Reroute(enum.Enum):
    STAY = "stay"
    TO = "to"  # the hinted leader
    ELSEWHERE = "elsewhere"  # forget this node for the resource, next seed
    REFRESH = "refresh"  # forget what is known of the resource's shard


@dataclass(frozen=True)
class Failure:
    advice: Advice
    reroute: Reroute
    #: AFTER: the delay; BACKOFF: the first step if the server suggested one.
    delay_s: Optional[float]
    #: Reroute.TO: the leader's address.
    to: Optional[str]
    detail: Optional[ErrorDetail]
    code: str
    summary: str


def classify(code: str, message: str, detail: Optional[ErrorDetail]) -> Failure:
    """What to do after a failed attempt ending with gRPC ``code``."""
    if detail is None or detail.known_reason is None:
        # No detail (a transport failure), or a reason this client does not
        # know (a newer server): decided by the gRPC code.
        summary = f"{code}: {message}" if detail is None else f"{detail} ({code})"
        if code in _TRANSPORT_CODES:
            return Failure(Advice.BACKOFF, Reroute.ELSEWHERE, None, None, detail, code, summary)
        return Failure(Advice.FAIL, Reroute.STAY, None, None, detail, code, summary)
    reason = detail.known_reason
    hinted = detail.leader_address or None
    if reason in (Reason.NOT_LEADER, Reason.SHUTTING_DOWN):
        reroute = Reroute.TO if hinted else Reroute.ELSEWHERE
    elif reason in (Reason.LEADER_UNKNOWN, Reason.NO_QUORUM):
        reroute = Reroute.ELSEWHERE
    elif reason in (Reason.EPOCH_NOT_MATCH, Reason.SHARD_NOT_FOUND):
        reroute = Reroute.REFRESH
    else:
        reroute = Reroute.STAY
    try:
        policy = RetryPolicy(detail.retry)
    except ValueError:
        policy = RetryPolicy.UNSPECIFIED
    if policy is RetryPolicy.UNSPECIFIED:
        policy = default_retry(reason)
    after = detail.retry_after_ms / 1000.0
    delay: Optional[float] = None
    if policy is RetryPolicy.NEVER:
        advice = Advice.FAIL
    elif policy is RetryPolicy.IMMEDIATELY:
        advice = Advice.NOW
    elif policy is RetryPolicy.AFTER:
        advice, delay = Advice.AFTER, after
    elif reroute is Reroute.TO:
        # BACKOFF with a leader to go to: go there now.
        advice = Advice.NOW
    else:
        advice = Advice.BACKOFF
        delay = after if detail.retry_after_ms > 0 else None
    return Failure(advice, reroute, delay, hinted if reroute is Reroute.TO else None,
                   detail, code, f"{detail} ({code})")


def jitter_up_to(limit_s: float) -> float:
    return random.uniform(0.0, max(0.0, limit_s))


class Backoff:
    """Exponential backoff with jitter into the upper half of each step, a
    bounded number of immediate retries, AFTER = delay + up to 25%."""

    def __init__(self, base_s: float, max_s: float) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self.doublings = 0
        self.immediate_left = MAX_IMMEDIATE_RETRIES

    def delay(self, failure: Failure) -> float:
        if failure.advice is Advice.FAIL:
            return 0.0
        if failure.advice is Advice.NOW:
            if self.immediate_left > 0:
                self.immediate_left -= 1
                return 0.0
            return self._exponential(None)
        if failure.advice is Advice.AFTER:
            d = failure.delay_s or 0.0
            return d + jitter_up_to(d / 4)
        return self._exponential(failure.delay_s)

    def _exponential(self, first_s: Optional[float]) -> float:
        start = min(first_s if first_s is not None else self.base_s, self.max_s)
        step = min(start * (1 << min(self.doublings, _MAX_DOUBLINGS)), self.max_s)
        self.doublings += 1
        return step / 2 + jitter_up_to(step / 2)


def renew_interval_s(ttl_ms: int) -> float:
    return ttl_ms / 1000.0 / RENEW_AT_TTL_DIVISOR


def jittered_renew_interval_s(ttl_ms: int) -> float:
    interval = renew_interval_s(ttl_ms)
    spread = interval * RENEW_JITTER_PERCENT / 100
    return interval - spread + jitter_up_to(2 * spread)


def stop_by_margin_s(ttl_ms: int, margin_percent: int) -> float:
    """The drift margin: a percentage of the TTL, never zero."""
    return max(ttl_ms * margin_percent // 100, 1) / 1000.0


def stop_by(sent_at: float, granted_ttl_ms: int, margin_percent: int) -> float:
    """The stop-by deadline: the SEND time of the answered request (monotonic
    clock) plus the GRANTED TTL, minus the drift margin."""
    return sent_at + granted_ttl_ms / 1000.0 - stop_by_margin_s(granted_ttl_ms, margin_percent)


def renew_backoff(ttl_ms: int, base_ms: int, max_ms: int) -> Backoff:
    cap_ms = max(min(max_ms, ttl_ms // RENEW_RETRY_MAX_TTL_DIVISOR), 1)
    return Backoff(min(base_ms, cap_ms) / 1000.0, cap_ms / 1000.0)
