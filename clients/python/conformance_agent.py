#!/usr/bin/env python3
"""The Python conformance agent (clients/conformance/PROTOCOL.md): drives
the `fencelock` package's sync client on behalf of the conformance suite,
JSON lines on stdin/stdout.

FENCELOCK_AGENT_API=asyncio drives fencelock.aio.AsyncClient instead (the
suite's agent "python-asyncio").

Test modes (FENCELOCK_AGENT_BROKEN), to prove the suite can fail; they
break the client from the outside (monkeypatching), the package has no
such switch:
  no-renew          background renewals are never sent;
  reuse-request-id  every acquire of this process uses one fixed request id;
  ignore-stop-by    the lost signal never fires when stop-by passes (only a
                    LEASE_NOT_HELD answer would fire it).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Optional

import fencelock
from fencelock import (Client, ClientConfig, FencelockError, InvalidArgumentError, InvalidConfigError,
                       LeaseEndedError, Lease, RejectedError, TlsConfig, UnavailableError)
from fencelock import _core

BROKEN = os.environ.get("FENCELOCK_AGENT_BROKEN", "")
API = os.environ.get("FENCELOCK_AGENT_API", "sync")

_out_lock = threading.Lock()


def emit(msg: dict[str, Any]) -> None:
    line = json.dumps(msg, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def error(kind: str, message: str, reason: Optional[str] = None, code: Optional[str] = None) -> dict[str, Any]:
    return {"kind": kind, "reason": reason, "code": code, "message": message}


def map_error(e: BaseException) -> dict[str, Any]:
    if isinstance(e, RejectedError):
        return error("rejected", str(e), e.detail.reason_name, e.code)
    if isinstance(e, UnavailableError):
        d = e.last_detail
        return error("unavailable", str(e), d.reason_name if d else None, e.last_code)
    if isinstance(e, LeaseEndedError):
        return error("lease_ended", str(e), e.state.name)
    if isinstance(e, InvalidConfigError):
        return error("invalid_config", str(e))
    if isinstance(e, InvalidArgumentError):
        return error("invalid_argument", str(e))
    if isinstance(e, FencelockError):
        return error("rejected", str(e))
    return error("agent", f"{type(e).__name__}: {e}")


class _AsyncAdapter:
    """Runs fencelock.aio on a loop thread behind the sync client's API, so
    the same agent code drives either."""

    def __init__(self, endpoints: list[str], config: ClientConfig) -> None:
        import asyncio

        from fencelock.aio import AsyncClient

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def make() -> AsyncClient:
            return AsyncClient(endpoints, config)

        self.client = self.run(make())

    def run(self, coro: Any) -> Any:
        return self._asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def acquire(self, resource: str, ttl: float, wait: float, request_id: Optional[bytes]) -> Any:
        return _AsyncLeaseAdapter(self, self.run(self.client.acquire(resource, ttl=ttl, wait=wait, request_id=request_id)))

    def get(self, resource: str) -> Any:
        return self.run(self.client.get(resource))

    @property
    def stats(self) -> Any:
        return self.client.stats

    def close(self, release_timeout: float) -> None:
        self.run(self.client.close(release_timeout=release_timeout))


class _AsyncLeaseAdapter:
    def __init__(self, adapter: _AsyncAdapter, lease: Any) -> None:
        self._a = adapter
        self._lease = lease
        self._core = lease._core
        self.lost = self  # .is_set()

    def is_set(self) -> bool:
        return bool(self._lease.lost.is_set())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lease, name)

    def wait_lost(self, timeout: float) -> None:
        async def w() -> None:
            try:
                await self._a._asyncio.wait_for(self._lease.lost.wait(), timeout=timeout)
            except self._a._asyncio.TimeoutError:
                pass
        self._a.run(w())

    def release(self) -> bool:
        return bool(self._a.run(self._lease.release()))


class Agent:
    def __init__(self) -> None:
        self.client: Optional[Client] = None
        self.leases: dict[str, Lease] = {}
        self.lock = threading.Lock()
        self.n = 0

    def lease(self, handle: str) -> Lease:
        with self.lock:
            lease = self.leases.get(handle)
        if lease is None:
            raise KeyError(f"unknown handle {handle!r}")
        return lease

    def op_hello(self, m: dict[str, Any]) -> dict[str, Any]:
        return {"agent": "python" if API == "sync" else "python-asyncio", "client_version": fencelock.__version__, "protocol": 1}

    def op_connect(self, m: dict[str, Any]) -> dict[str, Any]:
        tls = m.get("tls")
        overrides = {k: int(m[k]) for k in ("stop_by_margin_percent", "call_timeout_ms", "attempt_timeout_ms") if k in m}
        config = ClientConfig(
            tls=TlsConfig.from_files(tls["ca_file"], tls["cert_file"], tls["key_file"]) if tls else None,
            **overrides,
        )
        self.client = Client(list(m["endpoints"]), config) if API == "sync" else _AsyncAdapter(list(m["endpoints"]), config)  # type: ignore[assignment]
        if BROKEN == "no-renew":
            async def no_renew(url: str, leases: Any) -> None:
                return None
            target = self.client.client if isinstance(self.client, _AsyncAdapter) else self.client
            target._renew_batch = no_renew if API != "sync" else (lambda url, leases: None)  # type: ignore
        elif BROKEN == "reuse-request-id":
            _core.new_request_id = lambda: b"conformance-fixed-request-id"
        elif BROKEN == "ignore-stop-by":
            plan = _core.plan_pass

            def plan_without_deadline(*args: Any, **kwargs: Any) -> Any:
                due, next_wake, _lost = plan(*args, **kwargs)
                return due, next_wake, []

            _core.plan_pass = plan_without_deadline
            fencelock.client.Lease._refresh = lambda self: None  # type: ignore[method-assign]
        elif BROKEN:
            raise ValueError(f"unknown FENCELOCK_AGENT_BROKEN={BROKEN!r}")
        return {}

    def op_acquire(self, m: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None, "connect first"
        rid = bytes.fromhex(m["request_id"]) if m.get("request_id") else None
        lease = self.client.acquire(m["resource"], ttl=m.get("ttl_ms", 0) / 1000.0,
                                    wait=m.get("wait_ms", 0) / 1000.0, request_id=rid)
        with self.lock:
            self.n += 1
            handle = str(m.get("handle") or f"h{self.n}")
            self.leases[handle] = lease
        lease._core.on_lost.append(lambda reason, h=handle, l=lease: emit(
            {"event": "lost", "handle": h, "lost_reason": reason.value,
             "stop_by_in_ms": int((l.stop_by - time.monotonic()) * 1000)}))
        return {"handle": handle, "token": str(lease.token), "lease_ttl_ms": lease.lease_ttl_ms,
                "deduplicated": lease.deduplicated, "shard_id": lease.shard_id,
                "request_id": lease.request_id.hex(),
                "stop_by_in_ms": int((lease.stop_by - time.monotonic()) * 1000)}

    def _status(self, lease: Lease) -> dict[str, Any]:
        held = lease.held
        reason = lease.lost_reason
        return {"held": held, "lost": lease.lost.is_set(), "lost_reason": reason.value if reason else None,
                "stop_by_in_ms": int((lease.stop_by - time.monotonic()) * 1000), "token": str(lease.token)}

    def op_status(self, m: dict[str, Any]) -> dict[str, Any]:
        return self._status(self.lease(m["handle"]))

    def op_wait_lost(self, m: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(m["handle"])
        lease.wait_lost(timeout=m.get("timeout_ms", 0) / 1000.0)
        st = self._status(lease)
        return {"lost": st["lost"], "lost_reason": st["lost_reason"], "stop_by_in_ms": st["stop_by_in_ms"]}

    def op_release(self, m: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(m["handle"])
        released = lease.release()
        with self.lock:
            self.leases.pop(m["handle"], None)
        return {"released": released}

    def op_get(self, m: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None, "connect first"
        g = self.client.get(m["resource"])
        return {"held": g.held, "token": str(g.fencing_token), "last_token": str(g.last_token),
                "queue_length": g.queue_length, "shard_id": g.shard_id, "epoch": g.epoch}

    def op_fenced_write(self, m: dict[str, Any]) -> dict[str, Any]:
        lease = self.lease(m["handle"])
        if m.get("check_lease", True) and not lease.held:
            raise _Lost()
        host, port = m["store"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.settimeout(5)
            line = json.dumps({"key": m["key"], "token": str(lease.token), "value": m.get("value", "")})
            s.sendall(line.encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        reply = json.loads(data)
        if "error" in reply:
            raise RuntimeError(f"fenced store: {reply['error']}")
        return {"accepted": bool(reply["accepted"]), "highest": str(reply["highest"])}

    def op_stats(self, m: dict[str, Any]) -> dict[str, Any]:
        assert self.client is not None, "connect first"
        s = self.client.stats
        return {"renew_calls": s.renew_batch_calls, "renewed_items": s.renewed_items,
                "renew_failures": s.renew_failures}

    def handle(self, m: dict[str, Any]) -> None:
        i = m.get("id")
        op = m.get("op")
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            emit({"id": i, "ok": False, "error": error("unsupported", f"unknown op {op!r}")})
            return
        try:
            result = fn(m)
            emit({"id": i, "ok": True, **result})
        except _Lost:
            emit({"id": i, "ok": False, "error": error("lost", "the lease is lost or past its stop-by; nothing was written")})
        except (KeyError, AssertionError, ValueError, OSError, RuntimeError) as e:
            if isinstance(e, FencelockError):
                emit({"id": i, "ok": False, "error": map_error(e)})
            else:
                emit({"id": i, "ok": False, "error": error("agent", f"{type(e).__name__}: {e}")})
        except BaseException as e:
            emit({"id": i, "ok": False, "error": map_error(e)})


class _Lost(Exception):
    pass


def main() -> int:
    agent = Agent()
    threads = []
    for raw in sys.stdin:
        raw = raw.strip()
        if not raw:
            continue
        try:
            m = json.loads(raw)
        except ValueError as e:
            emit({"id": None, "ok": False, "error": error("agent", f"bad JSON: {e}")})
            continue
        # Commands run concurrently (wait_lost, a waiting acquire, ...).
        t = threading.Thread(target=agent.handle, args=(m,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout=2)
    if agent.client is not None:
        agent.client.close(release_timeout=2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
