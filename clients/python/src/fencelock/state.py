"""How a resource is held: acquire modes (``Mode``: exclusive, shared, a
semaphore's permit), one holding (``Holding``) and a resource's lock state
(``LockState``, what ``Client.get`` returns).

A resource is a lock (exclusive and shared acquires) or a semaphore of one
permit count until it is free again; an acquire of the other kind is
refused with ``ModeMismatchError`` (docs/fencing.md, "Shared locks and
semaphores", says what the protected side checks for each).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal, Union

from .config import MAX_PERMITS
from .errors import InvalidArgumentError
from .v1 import lock_pb2


class Mode(str, enum.Enum):
    """How an acquire holds its resource (``fencelock.v1.AcquireMode``).
    Acquires take a member or its value (``mode="shared"``)."""

    #: The only holder (the default).
    EXCLUSIVE = "exclusive"
    #: One of any number of shared holders (readers), never beside an
    #: exclusive one.
    SHARED = "shared"
    #: One of at most ``permits`` holders (``acquire(..., permits=N)``).
    SEMAPHORE = "semaphore"
    #: Decoded only: a mode this client does not know (a newer server).
    #: Never accepted by an acquire.
    UNKNOWN = "unknown"

    @classmethod
    def from_proto(cls, value: int) -> "Mode":
        return _FROM_WIRE.get(int(value), cls.UNKNOWN)


#: What ``acquire(mode=...)`` takes.
ModeArg = Union[Mode, Literal["exclusive", "shared", "semaphore"]]

_TO_WIRE = {
    Mode.EXCLUSIVE: lock_pb2.ACQUIRE_MODE_EXCLUSIVE,
    Mode.SHARED: lock_pb2.ACQUIRE_MODE_SHARED,
    Mode.SEMAPHORE: lock_pb2.ACQUIRE_MODE_SEMAPHORE,
}
_FROM_WIRE = {int(v): k for k, v in _TO_WIRE.items()}


def acquire_mode(mode: ModeArg, permits: int) -> tuple[Any, int]:
    """The wire fields (``AcquireRequest.mode``, ``permits``) of an acquire,
    checked as the server checks them (INVALID_PERMITS): a semaphore names
    1..=1024 permits, the other modes none. Raises InvalidArgumentError, so
    nothing is sent."""
    try:
        m = Mode(mode)
    except ValueError:
        raise InvalidArgumentError(
            f"mode must be 'exclusive', 'shared' or 'semaphore', got {mode!r}") from None
    if m is Mode.UNKNOWN:
        raise InvalidArgumentError("mode 'unknown' only describes a holding; acquire with a known mode")
    if not isinstance(permits, int) or isinstance(permits, bool):
        raise InvalidArgumentError(f"permits must be an int, got {type(permits).__name__}")
    if m is Mode.SEMAPHORE:
        if not 1 <= permits <= MAX_PERMITS:
            raise InvalidArgumentError(f"a semaphore needs permits in 1..={MAX_PERMITS}, got {permits}")
    elif permits != 0:
        raise InvalidArgumentError(f"permits ({permits}) go only with mode 'semaphore', not {m.value!r}")
    return _TO_WIRE[m], permits


@dataclass(frozen=True)
class Holding:
    """One holding of a resource (``fencelock.v1.Holding``)."""

    #: Its fencing token (tokens rise in grant order).
    fencing_token: int
    #: When it ends unless renewed (ms since the Unix epoch, the leader's
    #: clock); informational.
    expires_at_ms: int
    #: What it publishes (its acquire's value, or its last proclaim).
    value: bytes
    mode: Mode

    @classmethod
    def from_proto(cls, h: Any) -> "Holding":
        return cls(fencing_token=int(h.fencing_token), expires_at_ms=int(h.expires_at_ms),
                   value=bytes(h.value), mode=Mode.from_proto(h.mode))


def holdings(repeated: Any) -> tuple[Holding, ...]:
    return tuple(Holding.from_proto(h) for h in repeated)


@dataclass(frozen=True)
class LockState:
    """A resource's lock state (``Client.get``; the fields of
    ``fencelock.v1.GetResponse``). Never the holder's lease id.

    ``fencing_token``, ``expires_at_ms``, ``value`` and ``mode`` describe the
    oldest holding; a shared lock or a semaphore may have more, all of them
    in ``holders``, oldest first."""

    #: True if a lease holds the resource (a committed grant not yet ended).
    held: bool
    #: The oldest holding's fencing token; 0 when not held.
    fencing_token: int
    #: When the oldest holding ends unless renewed (ms since the Unix
    #: epoch, the leader's clock); 0 when not held.
    expires_at_ms: int
    #: Acquires waiting in the resource's queue.
    queue_length: int
    #: The highest token ever granted on the resource that the shard still
    #: knows of (0 if unknown); later grants are greater.
    last_token: int
    shard_id: int
    epoch: int
    #: What the oldest holding publishes (empty when not held or none).
    value: bytes
    #: The oldest holding's mode (``Mode.EXCLUSIVE`` when not held).
    mode: Mode
    #: A semaphore's permit count; 0 for a lock.
    permits: int
    #: Every holding, oldest first; empty when not held.
    holders: tuple[Holding, ...]

    @classmethod
    def from_proto(cls, m: Any) -> "LockState":
        return cls(
            held=bool(m.held), fencing_token=int(m.fencing_token), expires_at_ms=int(m.expires_at_ms),
            queue_length=int(m.queue_length), last_token=int(m.last_token), shard_id=int(m.shard_id),
            epoch=int(m.epoch), value=bytes(m.value), mode=Mode.from_proto(m.mode),
            permits=int(m.permits), holders=holdings(m.holders),
        )
