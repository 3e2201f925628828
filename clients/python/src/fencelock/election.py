"""Leader election on a fenced lock (``Client.election``,
``AsyncClient.election``): candidates queue FIFO on one resource; the
holder leads, publishes its value (an address) with its lease, and every
write it makes as leader carries the lease's fencing token, so a leader
that lost its lease cannot overwrite its successor.

==================  ==============================================
etcd v3election     here
==================  ==============================================
Campaign            ``election.campaign(value, ttl)`` -> a lease
Proclaim            ``lease.proclaim(value)``
Resign              ``lease.release()`` (or leave its ``with``)
Leader              ``election.leader()`` -> ``Optional[Leader]``
Observe             ``election.observe(after)`` (a watch)
==================  ==============================================
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

from .config import MAX_WAIT_TIMEOUT_MS
from .errors import LockHeldError
from .watch import Leader, Revision, Watch

if TYPE_CHECKING:
    from .aio import AsyncClient, AsyncLease, AsyncWatch
    from .client import Client, Lease

#: The longest one acquire may wait (seconds); a campaign queues again after.
_MAX_WAIT_S = MAX_WAIT_TIMEOUT_MS / 1000.0


def _bytes(value: Union[bytes, str]) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class Election:
    """One election: the resource ``name`` (``tenant/path``) candidates
    campaign on."""

    def __init__(self, client: "Client", name: str) -> None:
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"Election(name={self.name!r})"

    def campaign(self, value: Union[bytes, str] = b"", ttl: float = 30.0) -> "Lease":
        """Waits in the resource's FIFO queue, for as long as it takes, until
        this candidate leads; its lease publishes ``value`` (``str`` is sent
        as UTF-8) from then on. Returns the ``Lease``: ``lease.token`` goes
        with every write made as leader, ``lease.lost`` says when leadership
        is lost, ``lease.release()`` resigns. ``ttl`` in seconds."""
        data = _bytes(value)
        while True:
            try:
                return self._client.acquire(self.name, ttl=ttl, wait=_MAX_WAIT_S, value=data)
            except LockHeldError:
                continue  # waited the longest one acquire may: queue again

    def leader(self) -> Optional[Leader]:
        """Who leads now (a linearizable read), or None between leaders."""
        state = self._client.get(self.name)
        if not state.held:
            return None
        return Leader(value=bytes(state.value), fencing_token=int(state.fencing_token))

    def observe(self, after: Optional[Revision] = None, resume: bool = False) -> Watch:
        """Every change of leadership as it commits: a watch of the
        resource (``Client.watch``)."""
        return self._client.watch(self.name, after, resume=resume)


class AsyncElection:
    """``Election`` for asyncio (``AsyncClient.election``)."""

    def __init__(self, client: "AsyncClient", name: str) -> None:
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"AsyncElection(name={self.name!r})"

    async def campaign(self, value: Union[bytes, str] = b"", ttl: float = 30.0) -> "AsyncLease":
        """See ``Election.campaign``. Cancel it to stop campaigning: the
        waiting acquire leaves the queue."""
        data = _bytes(value)
        while True:
            try:
                return await self._client.acquire(self.name, ttl=ttl, wait=_MAX_WAIT_S, value=data)
            except LockHeldError:
                continue

    async def leader(self) -> Optional[Leader]:
        state = await self._client.get(self.name)
        if not state.held:
            return None
        return Leader(value=bytes(state.value), fencing_token=int(state.fencing_token))

    async def observe(self, after: Optional[Revision] = None, resume: bool = False) -> "AsyncWatch":
        return await self._client.watch(self.name, after, resume=resume)
