"""The client's typed errors and the error contract of ``errors.proto``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional


class Reason(enum.IntEnum):
    """``fencelock.v1.Reason`` (errors.proto). A unit test checks that this
    mirror matches the generated enum value for value."""

    UNSPECIFIED = 0
    INVALID_RESOURCE = 1
    INVALID_REQUEST_ID = 2
    INVALID_LEASE_ID = 3
    TTL_OUT_OF_RANGE = 4
    WAIT_TIMEOUT_OUT_OF_RANGE = 5
    BATCH_TOO_LARGE = 6
    REQUEST_ID_REUSED = 7
    LOCK_HELD = 8
    WAIT_TIMED_OUT = 9
    LEASE_ID_COLLISION = 10
    QUEUE_FULL = 11
    TENANT_WAITERS_EXCEEDED = 12
    DEDUP_TABLE_FULL = 13
    TABLE_FULL = 14
    LEASE_NOT_HELD = 15
    HOLD_LIMIT_REACHED = 16
    WAIT_CANCELLED = 17
    NOT_LEADER = 18
    LEADER_UNKNOWN = 19
    NO_QUORUM = 20
    LEADER_NOT_READY = 21
    TOKEN_SPACE_EXHAUSTED = 22
    SHUTTING_DOWN = 23
    OUTCOME_UNKNOWN = 24
    EPOCH_NOT_MATCH = 25
    SHARD_NOT_FOUND = 26
    NODE_NOT_FOUND = 27
    PLACEMENT_CONFLICT = 28
    INVALID_ADMIN_REQUEST = 29
    INTERNAL = 30
    SERVER_BUSY = 31
    PERMISSION_DENIED = 32
    TENANT_QUOTA_EXCEEDED = 33
    RATE_LIMITED = 34
    MALFORMED_REQUEST = 35
    MESSAGE_TOO_LARGE = 36
    VALUE_TOO_LARGE = 37
    VALUES_FULL = 38
    FEATURE_NOT_ENABLED = 39
    MODE_MISMATCH = 40
    INVALID_PERMITS = 41


class RetryPolicy(enum.IntEnum):
    """``fencelock.v1.RetryPolicy``."""

    UNSPECIFIED = 0
    NEVER = 1
    IMMEDIATELY = 2
    AFTER = 3
    BACKOFF = 4


class LostReason(str, enum.Enum):
    """Why a lease was lost."""

    #: A renewal was answered LEASE_NOT_HELD: released with its id, expired
    #: or superseded.
    NOT_HELD = "not_held"
    #: The stop-by deadline passed without a confirmed renewal.
    UNCONFIRMED = "unconfirmed"


class LeaseState(enum.IntEnum):
    """``fencelock.v1.LeaseState``."""

    UNSPECIFIED = 0
    HELD = 1
    RELEASED = 2
    EXPIRED = 3
    CANCELLED = 4


@dataclass(frozen=True)
class ErrorDetail:
    """The server's ``fencelock.v1.ErrorDetail``, decoded. ``reason`` is the
    raw number (a newer server may send one this client does not know);
    ``known_reason`` the enum member or None."""

    reason: int
    message: str = ""
    retry: int = 0
    retry_after_ms: int = 0
    leader_node_id: int = 0
    leader_address: str = ""
    shard_id: int = 0
    current_epoch: int = 0
    map_version: int = 0
    holder_expires_at_ms: int = 0
    queue_length: int = 0
    min_allowed: int = 0
    max_allowed: int = 0
    field: str = ""

    @property
    def known_reason(self) -> Optional[Reason]:
        try:
            return Reason(self.reason)
        except ValueError:
            return None

    @property
    def reason_name(self) -> str:
        r = self.known_reason
        return r.name if r is not None else f"REASON_{self.reason}"

    def __str__(self) -> str:
        return f"{self.reason_name}: {self.message}"


#: The reasons a watch ends with that a new watch from the last revision
#: received resolves (lock.proto ``Watch``): the watcher fell behind, the
#: resource moved, the replica stopped serving it.
WATCH_RESUME_REASONS = frozenset({Reason.SERVER_BUSY, Reason.EPOCH_NOT_MATCH, Reason.SHUTTING_DOWN})
#: gRPC codes of a broken watch stream (no ErrorDetail): resumed too.
WATCH_RESUME_CODES = frozenset({"UNAVAILABLE", "UNKNOWN", "INTERNAL"})


class FencelockError(Exception):
    """Base of every error this package raises."""

    @property
    def resumes_watch(self) -> bool:
        """True when a watch that ended with this error is resumed by
        watching again after the last revision received: the watcher fell
        behind (SERVER_BUSY), the resource moved (EPOCH_NOT_MATCH), the
        replica stopped serving it (SHUTTING_DOWN), or the connection
        broke. ``Client.watch(..., resume=True)`` does that by itself."""
        return False


class InvalidConfigError(FencelockError):
    """The client configuration is invalid (nothing was sent)."""


class InvalidArgumentError(FencelockError):
    """An argument was refused by the client before any call."""


class RejectedError(FencelockError):
    """The server's definitive answer: an ``ErrorDetail`` whose retry
    policy is NEVER, or an acquire's contention answer (LOCK_HELD,
    WAIT_TIMED_OUT, QUEUE_FULL, ...)."""

    def __init__(self, detail: ErrorDetail, code: str) -> None:
        super().__init__(f"{detail} (gRPC {code})")
        self.detail = detail
        #: The gRPC status code name, e.g. ``ABORTED``.
        self.code = code

    @property
    def reason(self) -> Optional[Reason]:
        return self.detail.known_reason

    @property
    def is_lock_held(self) -> bool:
        """True for LOCK_HELD and WAIT_TIMED_OUT: someone else holds it."""
        return self.reason in (Reason.LOCK_HELD, Reason.WAIT_TIMED_OUT)

    @property
    def resumes_watch(self) -> bool:
        return self.reason in WATCH_RESUME_REASONS


class LockHeldError(RejectedError):
    """LOCK_HELD or WAIT_TIMED_OUT: the lock is held by someone else."""


class PermissionDeniedError(RejectedError):
    """PERMISSION_DENIED: the caller's identity may not do this."""


class ModeMismatchError(RejectedError):
    """MODE_MISMATCH: the resource is in use in another kind (a lock while
    this acquire asked for a semaphore, or the reverse, or a semaphore of
    another permit count; ``detail.field`` is ``mode`` or ``permits``, whose
    ``min_allowed`` is the count in force). Nothing was changed; never
    retried: agree on one kind and one count per resource."""


class InvalidPermitsError(RejectedError):
    """INVALID_PERMITS: the server refused a semaphore's permit count (this
    client refuses one outside 1..=1024, or permits with another mode, with
    ``InvalidArgumentError`` before sending). Never retried."""


class UnavailableError(FencelockError):
    """No definitive answer before the call's deadline: the outcome of a
    write is unknown. ``request_id`` (acquires) lets a later
    ``acquire(..., request_id=...)`` learn that outcome without a second
    grant."""

    def __init__(
        self,
        timeout_ms: int,
        attempts: int,
        last_error: str,
        request_id: Optional[bytes] = None,
        last_detail: Optional[ErrorDetail] = None,
        last_code: Optional[str] = None,
    ) -> None:
        super().__init__(
            f"no definitive answer within {timeout_ms} ms after {attempts} attempt(s); "
            f"last error: {last_error}"
        )
        self.timeout_ms = timeout_ms
        self.attempts = attempts
        self.last_error = last_error
        self.request_id = request_id
        self.last_detail = last_detail
        self.last_code = last_code

    @property
    def outcome_unknown(self) -> bool:
        return True


class LeaseEndedError(FencelockError):
    """An acquire with an explicit request id found its grant already ended
    (released, expired or cancelled): nothing is held."""

    def __init__(self, state: LeaseState, fencing_token: int) -> None:
        super().__init__(
            f"the grant of this request id has already ended ({state.name}, token {fencing_token})"
        )
        self.state = state
        self.fencing_token = fencing_token


class GrpcError(FencelockError):
    """A gRPC failure without a fencelock ErrorDetail that is not a
    transport failure (for example UNIMPLEMENTED: not a fencelock node)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"gRPC {code}: {message}")
        self.code = code
        self.message = message

    @property
    def resumes_watch(self) -> bool:
        return self.code in WATCH_RESUME_CODES


class LeaseLostError(FencelockError):
    """Raised by ``Lease.check()`` when the lease is lost or past its
    stop-by deadline: stop the protected work."""

    def __init__(self, reason: Optional[LostReason]) -> None:
        super().__init__(f"the lease is lost ({reason.value if reason else 'stop-by passed'})")
        self.reason = reason


def rejected(detail: ErrorDetail, code: str) -> RejectedError:
    """The most specific RejectedError subclass for ``detail``."""
    r = detail.known_reason
    if r in (Reason.LOCK_HELD, Reason.WAIT_TIMED_OUT):
        return LockHeldError(detail, code)
    if r is Reason.PERMISSION_DENIED:
        return PermissionDeniedError(detail, code)
    if r is Reason.MODE_MISMATCH:
        return ModeMismatchError(detail, code)
    if r is Reason.INVALID_PERMITS:
        return InvalidPermitsError(detail, code)
    return RejectedError(detail, code)
