"""A real fencelock cluster for the conformance suite: three `fencelock
serve` processes on loopback with mutual TLS (certificates from `fencelock
dev certs`), as crates/server/tests/real_process/*.rs starts them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import grpc

from fencelock.v1 import lock_pb2

FORWARDED = ("x-fencelock-forwarded", "1")
#: Tenants with client certificates: `acme` is the agents' tenant, `beta`
#: the other one (wrong-tenant checks).
TENANT = "acme"
WORKER = "worker-1"


def find_binary() -> Path:
    """$FENCELOCK_BIN, else $CARGO_TARGET_DIR/debug/fencelock, else
    /work/main/target/debug/fencelock, else ~/.cache/fencelock/target
    (the Makefile's default target dir)."""
    candidates = []
    if os.environ.get("FENCELOCK_BIN"):
        candidates.append(Path(os.environ["FENCELOCK_BIN"]))
    else:
        if os.environ.get("CARGO_TARGET_DIR"):
            candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "fencelock")
        candidates.append(Path("/work/main/target/debug/fencelock"))
        candidates.append(Path.home() / ".cache" / "fencelock" / "target" / "debug" / "fencelock")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise RuntimeError(
        "no fencelock binary: looked at " + ", ".join(map(str, candidates))
        + " (build it with `cargo build -p fencelock-cli` or set FENCELOCK_BIN)"
    )


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Cluster:
    def __init__(self, binary: Path, workdir: Path, nodes: int = 3) -> None:
        self.binary = binary
        self.dir = workdir
        self.n = nodes
        self.ports = free_ports(nodes)
        self.procs: dict[int, Optional[subprocess.Popen[bytes]]] = {}
        self.tls_dir = workdir / "tls"
        self._channels: dict[int, grpc.Channel] = {}

    # ---- setup -------------------------------------------------------------

    def address(self, node_id: int) -> str:
        return f"127.0.0.1:{self.ports[node_id - 1]}"

    @property
    def endpoints(self) -> list[str]:
        return [self.address(i) for i in range(1, self.n + 1)]

    def client_tls(self, tenant: str = TENANT, name: str = WORKER) -> dict[str, str]:
        d = self.tls_dir
        return {"ca_file": str(d / "ca.crt"), "cert_file": str(d / f"client-{tenant}-{name}.crt"),
                "key_file": str(d / f"client-{tenant}-{name}.key")}

    def start(self, timeout: float = 60.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [str(self.binary), "dev", "certs", "--out", str(self.tls_dir), "--nodes", str(self.n),
             "--host", "127.0.0.1", "--host", "localhost",
             "--tenant", f"{TENANT}:{WORKER}", "--tenant", "beta:batch", "--admin", "conformance"],
            check=True, capture_output=True, timeout=60,
        )
        peers = ", ".join(f'{{ id = {i}, addr = "{self.address(i)}" }}' for i in range(1, self.n + 1))
        for i in range(1, self.n + 1):
            data = self.dir / f"data{i}"
            (self.dir / f"node{i}.toml").write_text(
                f'node_id = {i}\nlisten_addr = "{self.address(i)}"\ndata_dir = "{data}"\n'
                f"peers = [{peers}]\nshard_count = 4\n\n"
                "[raft]\ntick_interval_ms = 50\nelection_ticks = 10\nproposal_timeout_ms = 2000\n\n"
                f'[tls]\nca_file = "{self.tls_dir / "ca.crt"}"\n'
                f'cert_file = "{self.tls_dir / f"node-{i}.crt"}"\nkey_file = "{self.tls_dir / f"node-{i}.key"}"\n'
            )
        for i in range(1, self.n + 1):
            self.spawn(i)
        self.wait_ready(timeout)

    def spawn(self, node_id: int) -> None:
        log = open(self.dir / f"node{node_id}.log", "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_TLS_")}
        env["RUST_LOG"] = "warn"
        self.procs[node_id] = subprocess.Popen(
            [str(self.binary), "serve", "--config", str(self.dir / f"node{node_id}.toml")],
            stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True,
        )
        log.close()

    def wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < end:
            for i, p in self.procs.items():
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"node {i} exited with {p.returncode}: {self.log_tail(i)}")
            try:
                # Every shard has a leader: one Get per shard-ish spread.
                for k in range(8):
                    self.get(f"{TENANT}/probe-{k}", timeout=2.0)
                return
            except Exception as e:  # not ready yet
                last = e
                time.sleep(0.2)
        raise RuntimeError(f"cluster not ready within {timeout}s: {last}\n{self.log_tail(1)}")

    def log_tail(self, node_id: int, n: int = 2000) -> str:
        try:
            return (self.dir / f"node{node_id}.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        for p in self.procs.values():
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs.values():
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass

    # ---- faults ------------------------------------------------------------

    def kill(self, node_id: int) -> None:
        """SIGKILL (kill -9) of one node's process."""
        p = self.procs[node_id]
        assert p is not None and p.poll() is None, f"node {node_id} is not running"
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        self.procs[node_id] = None
        ch = self._channels.pop(node_id, None)
        if ch is not None:
            ch.close()

    def pause_all(self) -> None:
        """SIGSTOP every node: no majority anywhere, nothing is answered."""
        for p in self.procs.values():
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGSTOP)

    def resume_all(self, timeout: float = 60.0) -> None:
        for p in self.procs.values():
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGCONT)
        self.wait_ready(timeout)

    def restart(self, node_id: int, timeout: float = 60.0) -> None:
        if self.procs.get(node_id) is None:
            self.spawn(node_id)
        self.wait_ready(timeout)

    # ---- the suite's own view (raw gRPC, admin identity) -------------------

    def _channel(self, node_id: int) -> grpc.Channel:
        ch = self._channels.get(node_id)
        if ch is None:
            d = self.tls_dir
            creds = grpc.ssl_channel_credentials(
                (d / "ca.crt").read_bytes(), (d / "admin-conformance.key").read_bytes(),
                (d / "admin-conformance.crt").read_bytes())
            ch = grpc.secure_channel(self.address(node_id), creds)
            self._channels[node_id] = ch
        return ch

    def _get_at(self, node_id: int, resource: str, timeout: float, forwarded: bool) -> Any:
        call = self._channel(node_id).unary_unary(
            "/fencelock.v1.LockService/Get",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lock_pb2.GetResponse.FromString,
        )
        md = [FORWARDED] if forwarded else None
        return call(lock_pb2.GetRequest(resource=resource), timeout=timeout, metadata=md)

    def live_nodes(self) -> list[int]:
        return [i for i, p in self.procs.items() if p is not None and p.poll() is None]

    def get(self, resource: str, timeout: float = 10.0) -> Any:
        """A linearizable Get through any live node (which forwards to the
        leader), retried until `timeout`."""
        end = time.monotonic() + timeout
        last: Optional[Exception] = None
        while time.monotonic() < end:
            for i in self.live_nodes():
                try:
                    return self._get_at(i, resource, min(2.0, max(end - time.monotonic(), 0.1)), False)
                except grpc.RpcError as e:
                    last = e
            time.sleep(0.1)
        raise RuntimeError(f"Get {resource} failed for {timeout}s: {last}")

    def leader_of(self, resource: str, timeout: float = 10.0) -> int:
        """The node leading the resource's shard: the one that answers a Get
        marked as forwarded (the others answer NOT_LEADER)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for i in self.live_nodes():
                try:
                    self._get_at(i, resource, 2.0, True)
                    return i
                except grpc.RpcError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"no leader for {resource} within {timeout}s")
