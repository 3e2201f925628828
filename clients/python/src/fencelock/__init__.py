"""fencelock: exclusive leases with fencing tokens.

Sync API::

    from fencelock import Client

    with Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as client:
        with client.lock("acme/orders/42", ttl=30, wait=5) as lease:
            write(order, fencing_token=lease.token)   # the store rejects lower tokens
            if lease.lost.is_set(): ...               # stop: the lock is gone

asyncio API: ``fencelock.aio.AsyncClient`` (the same, with ``async with``).
PostgreSQL fencing: ``fencelock.fencing.PgFenceStore`` (extra ``postgres``).
"""

from ._version import __version__
from .aio import AsyncClient, AsyncLease
from .client import Client, ClientStats, Lease
from .config import ClientConfig, TlsConfig
from .errors import (
    ErrorDetail,
    FencelockError,
    GrpcError,
    InvalidArgumentError,
    InvalidConfigError,
    LeaseEndedError,
    LeaseLostError,
    LeaseState,
    LockHeldError,
    LostReason,
    PermissionDeniedError,
    Reason,
    RejectedError,
    RetryPolicy,
    UnavailableError,
)

__all__ = [
    "__version__",
    "AsyncClient",
    "AsyncLease",
    "Client",
    "ClientConfig",
    "ClientStats",
    "ErrorDetail",
    "FencelockError",
    "GrpcError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "Lease",
    "LeaseEndedError",
    "LeaseLostError",
    "LeaseState",
    "LockHeldError",
    "LostReason",
    "PermissionDeniedError",
    "Reason",
    "RejectedError",
    "RetryPolicy",
    "TlsConfig",
    "UnavailableError",
]
