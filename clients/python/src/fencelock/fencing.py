"""Fencing on the protected side (the same semantics as ``crates/fencing``):
accept a write for a resource only if its fencing token is at least the
highest token already accepted for that resource, and record it, in one
atomic step. Equal tokens are accepted (one holder writes many times);
lower ones raise ``StaleTokenError`` and change nothing. Records are never
forgotten: forgetting the highest token would let a stale holder through.

``PgFenceStore`` (PostgreSQL, psycopg 3; ``pip install 'fencelock[postgres]'``)
makes the check and the write one conditional statement::

    INSERT INTO t AS f (resource, fence_token, value) VALUES (%s, %s, %s)
    ON CONFLICT (resource) DO UPDATE SET fence_token = EXCLUDED.fence_token, value = EXCLUDED.value
    WHERE f.fence_token <= EXCLUDED.fence_token RETURNING f.fence_token

so PostgreSQL's row lock makes it atomic across any number of connections
and processes. On a connection without autocommit it runs inside the
caller's transaction: the fence and the caller's other writes then commit
(or roll back) together. ``MemoryFenceStore`` is the same primitive in one
process (for a token-checking proxy that is the single writer).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .errors import FencelockError

if TYPE_CHECKING:
    import psycopg

#: Longest resource key, in bytes (fencelock's names are at most 256).
MAX_RESOURCE_LEN = 256
#: Largest value one fenced write may carry, in bytes.
MAX_VALUE_LEN = 1 << 20
#: The in-memory store's default capacity (resources).
DEFAULT_MAX_RESOURCES = 1_000_000

_TABLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class FenceError(FencelockError):
    """Base of the fencing errors."""


class StaleTokenError(FenceError):
    """The token is lower than the highest accepted for the resource: the
    writer's lock was superseded. Nothing was changed; stop the work."""

    def __init__(self, resource: str, presented: int, highest: int) -> None:
        super().__init__(
            f"stale fencing token for {resource!r}: presented {presented}, highest accepted {highest}")
        self.resource = resource
        self.presented = presented
        self.highest = highest


class InvalidTokenError(FenceError):
    def __init__(self, presented: int) -> None:
        super().__init__(f"invalid fencing token {presented}: tokens are positive")
        self.presented = presented


class InvalidResourceKeyError(FenceError):
    pass


class ValueTooLargeError(FenceError):
    pass


class InvalidTableNameError(FenceError):
    pass


class CapacityExceededError(FenceError):
    pass


@dataclass(frozen=True)
class FencedValue:
    #: The highest fencing token accepted for the resource.
    token: int
    #: The last accepted value; None if the fence was only raised with
    #: ``check_and_record``.
    value: Optional[bytes]


def _validate_resource(resource: str) -> None:
    if not isinstance(resource, str) or not resource:
        raise InvalidResourceKeyError("invalid resource key: empty")
    n = len(resource.encode())
    if n > MAX_RESOURCE_LEN:
        raise InvalidResourceKeyError(f"invalid resource key: {n} bytes, at most {MAX_RESOURCE_LEN}")
    if "\0" in resource:
        raise InvalidResourceKeyError("invalid resource key: contains a NUL byte")


def _validate(resource: str, token: int, value: Optional[bytes]) -> None:
    _validate_resource(resource)
    if not isinstance(token, int) or isinstance(token, bool) or token <= 0 or token >= 1 << 63:
        raise InvalidTokenError(token)
    if value is not None and len(value) > MAX_VALUE_LEN:
        raise ValueTooLargeError(f"value of {len(value)} bytes is larger than the limit of {MAX_VALUE_LEN}")


class MemoryFenceStore:
    """The fence in one process's memory (thread-safe)."""

    def __init__(self, max_resources: int = DEFAULT_MAX_RESOURCES) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, FencedValue] = {}
        self._max = max_resources
        self.rejections = 0

    def _fence(self, resource: str, token: int, value: Optional[bytes], write: bool) -> None:
        _validate(resource, token, value)
        with self._lock:
            rec = self._records.get(resource)
            if rec is None and len(self._records) >= self._max:
                raise CapacityExceededError(f"fence store is full: {self._max} resources")
            if rec is not None and token < rec.token:
                self.rejections += 1
                raise StaleTokenError(resource, token, rec.token)
            kept = value if write else (rec.value if rec else None)
            self._records[resource] = FencedValue(token, kept)

    def write(self, resource: str, token: int, value: bytes) -> None:
        self._fence(resource, token, bytes(value), True)

    def check_and_record(self, resource: str, token: int) -> None:
        self._fence(resource, token, None, False)

    def read(self, resource: str) -> Optional[FencedValue]:
        _validate_resource(resource)
        with self._lock:
            return self._records.get(resource)


class PgFenceStore:
    """The fence in a PostgreSQL table (psycopg 3 connection)."""

    def __init__(self, conn: "psycopg.Connection[Any]", table: str = "fencelock_fence") -> None:
        self.table = check_table_name(table)
        self.conn = conn
        self.rejections = 0
        conn.execute(self.create_table_sql(table))
        if not conn.autocommit:
            conn.commit()
        t = self.table
        self._write = (f"INSERT INTO {t} AS f (resource, fence_token, value) VALUES (%s, %s, %s) "
                       "ON CONFLICT (resource) DO UPDATE SET fence_token = EXCLUDED.fence_token, "
                       "value = EXCLUDED.value WHERE f.fence_token <= EXCLUDED.fence_token "
                       "RETURNING f.fence_token")
        self._check = (f"INSERT INTO {t} AS f (resource, fence_token) VALUES (%s, %s) "
                       "ON CONFLICT (resource) DO UPDATE SET fence_token = EXCLUDED.fence_token "
                       "WHERE f.fence_token <= EXCLUDED.fence_token RETURNING f.fence_token")
        self._read = f"SELECT fence_token, value FROM {t} WHERE resource = %s"

    @classmethod
    def connect(cls, conninfo: str, table: str = "fencelock_fence") -> "PgFenceStore":
        """A store on its own autocommit connection."""
        import psycopg

        check_table_name(table)
        return cls(psycopg.connect(conninfo, autocommit=True), table)

    @staticmethod
    def create_table_sql(table: str) -> str:
        t = check_table_name(table)
        return (f"CREATE TABLE IF NOT EXISTS {t} (resource text PRIMARY KEY, "
                "fence_token bigint NOT NULL CHECK (fence_token > 0), value bytea)")

    def _fence(self, sql: str, resource: str, token: int, value: Optional[bytes]) -> None:
        _validate(resource, token, value)
        params: tuple[Any, ...] = (resource, token, value) if value is not None else (resource, token)
        row = self.conn.execute(sql, params).fetchone()
        if row is not None:
            return
        self.rejections += 1
        rec = self.read(resource)
        raise StaleTokenError(resource, token, rec.token if rec else token + 1)

    def write(self, resource: str, token: int, value: bytes) -> None:
        """Stores ``value`` if ``token`` is at least the highest accepted
        for ``resource``; else raises StaleTokenError and changes nothing."""
        self._fence(self._write, resource, token, bytes(value))

    def check_and_record(self, resource: str, token: int) -> None:
        """The bare fence, for guarding a side effect done in the same
        transaction: raises the highest token without touching the value."""
        self._fence(self._check, resource, token, None)

    def read(self, resource: str) -> Optional[FencedValue]:
        _validate_resource(resource)
        row = self.conn.execute(self._read, (resource,)).fetchone()
        if row is None:
            return None
        return FencedValue(int(row[0]), bytes(row[1]) if row[1] is not None else None)

    def close(self) -> None:
        self.conn.close()


def check_table_name(name: str) -> str:
    if not _TABLE_RE.match(name or ""):
        raise InvalidTableNameError(
            f"invalid table name {name!r}: use 1 to 63 of [a-z0-9_], not starting with a digit")
    return name
