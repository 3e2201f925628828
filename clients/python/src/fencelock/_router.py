"""Where to send a call: seeds, learned shard leaders, bounded caches (the
rules of ``crates/client/src/router.rs``)."""

from __future__ import annotations

import threading
from typing import Optional, Sequence

from ._policy import Failure, Reroute
from .config import MAX_ENDPOINTS
from .errors import InvalidArgumentError

MAX_CACHED_RESOURCES = 65_536
MAX_CACHED_SHARDS = 4_096


def normalize(endpoint: str, tls: bool) -> str:
    """``host:port`` or a URL -> the canonical ``scheme://host:port``."""
    e = endpoint.strip()
    if "://" not in e:
        e = ("https://" if tls else "http://") + e
    scheme, _, rest = e.partition("://")
    if scheme not in ("http", "https"):
        raise InvalidArgumentError(f"endpoint {endpoint!r}: scheme must be http or https")
    rest = rest.rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in rest:
        raise InvalidArgumentError(f"endpoint {endpoint!r}: expected host:port")
    return f"{scheme}://{rest}"


def target_of(url: str) -> tuple[str, bool]:
    """A canonical URL -> (gRPC target ``host:port``, TLS?)."""
    scheme, _, rest = url.partition("://")
    return rest, scheme == "https"


class Router:
    def __init__(self, endpoints: Sequence[str], tls: bool) -> None:
        if isinstance(endpoints, str):
            raise InvalidArgumentError("endpoints must be a list of host:port strings, not one string")
        if not endpoints:
            raise InvalidArgumentError("at least one endpoint is needed")
        if len(endpoints) > MAX_ENDPOINTS:
            raise InvalidArgumentError(f"at most {MAX_ENDPOINTS} endpoints are accepted")
        seeds: list[str] = []
        for e in endpoints:
            url = normalize(e, tls)
            if url not in seeds:
                seeds.append(url)
        self.seeds = seeds
        self.scheme = seeds[0].partition("://")[0]
        self._lock = threading.Lock()
        self._shard_routes: dict[int, str] = {}
        self._resource_shards: dict[str, int] = {}
        self._preferred = 0

    def _seed(self) -> str:
        return self.seeds[self._preferred % len(self.seeds)]

    def target(self, resource: Optional[str]) -> str:
        with self._lock:
            if resource is not None:
                shard = self._resource_shards.get(resource)
                if shard is not None and shard in self._shard_routes:
                    return self._shard_routes[shard]
            return self._seed()

    def target_for_shard(self, shard_id: int) -> str:
        with self._lock:
            return self._shard_routes.get(shard_id) or self._seed()

    def learn(self, resource: Optional[str], shard_id: int, url: str) -> None:
        if shard_id == 0:
            return
        with self._lock:
            if resource is not None:
                if len(self._resource_shards) >= MAX_CACHED_RESOURCES and resource not in self._resource_shards:
                    self._resource_shards.clear()
                self._resource_shards[resource] = shard_id
            if len(self._shard_routes) >= MAX_CACHED_SHARDS and shard_id not in self._shard_routes:
                self._shard_routes.clear()
            self._shard_routes[shard_id] = url

    def reroute(self, failure: Failure, resource: Optional[str], shard_id: Optional[int], failed_url: str) -> str:
        if failure.reroute is Reroute.STAY:
            return failed_url
        if failure.reroute is Reroute.TO and failure.to:
            try:
                url = normalize(failure.to, self.scheme == "https")
            except InvalidArgumentError:
                url = None
            if url is not None:
                if shard_id:
                    self.learn(resource, shard_id, url)
                return url
        with self._lock:
            if failure.reroute in (Reroute.ELSEWHERE, Reroute.TO):
                for s in [s for s, u in self._shard_routes.items() if u == failed_url]:
                    del self._shard_routes[s]
                if self._seed() == failed_url:
                    self._preferred = (self._preferred + 1) % len(self.seeds)
            elif failure.reroute is Reroute.REFRESH:
                if resource is not None:
                    self._resource_shards.pop(resource, None)
                if shard_id:
                    self._shard_routes.pop(shard_id, None)
        if resource is not None:
            return self.target(resource)
        if shard_id:
            return self.target_for_shard(shard_id)
        return self.target(None)
