"""fencelock: leases with fencing tokens (exclusive, shared, semaphore permits).

Sync API::

    from fencelock import Client

    with Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as client:
        with client.lock("acme/orders/42", ttl=30, wait=5) as lease:
            write(order, fencing_token=lease.token)   # the store rejects lower tokens
            if lease.lost.is_set(): ...               # stop: the lock is gone

    for event in client.watch("acme/orders/42", resume=True):  # STATE, then every change
        print(event.kind.name, event.revision, event.fencing_token)

    lease = client.election("acme/election/db").campaign(b"10.0.0.7:5432", ttl=10)  # leads

    reader = client.acquire("acme/report", mode="shared")               # beside other readers
    permit = client.acquire("acme/gpu", mode="semaphore", permits=4)    # one of at most 4

asyncio API: ``fencelock.aio.AsyncClient`` (the same, with ``async with``).
PostgreSQL fencing: ``fencelock.fencing.PgFenceStore`` (extra ``postgres``).
"""

from ._version import __version__
from .aio import AsyncClient, AsyncLease, AsyncWatch
from .client import Client, ClientStats, Lease
from .config import ClientConfig, TlsConfig
from .election import AsyncElection, Election
from .errors import (
    ErrorDetail,
    FencelockError,
    GrpcError,
    InvalidArgumentError,
    InvalidConfigError,
    InvalidPermitsError,
    LeaseEndedError,
    LeaseLostError,
    LeaseState,
    LockHeldError,
    LostReason,
    ModeMismatchError,
    PermissionDeniedError,
    Reason,
    RejectedError,
    RetryPolicy,
    UnavailableError,
)
from .state import Holding, LockState, Mode
from .watch import Leader, Revision, Watch, WatchEvent, WatchEventKind

__all__ = [
    "__version__",
    "AsyncClient",
    "AsyncElection",
    "AsyncLease",
    "AsyncWatch",
    "Client",
    "ClientConfig",
    "ClientStats",
    "Election",
    "ErrorDetail",
    "FencelockError",
    "GrpcError",
    "Holding",
    "InvalidArgumentError",
    "InvalidConfigError",
    "InvalidPermitsError",
    "Lease",
    "Leader",
    "LeaseEndedError",
    "LeaseLostError",
    "LeaseState",
    "LockHeldError",
    "LockState",
    "LostReason",
    "Mode",
    "ModeMismatchError",
    "PermissionDeniedError",
    "Reason",
    "RejectedError",
    "RetryPolicy",
    "Revision",
    "TlsConfig",
    "UnavailableError",
    "Watch",
    "WatchEvent",
    "WatchEventKind",
]
