"""Starting and talking to conformance agents (PROTOCOL.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
#: python-asyncio is the Python agent driving fencelock.aio.AsyncClient.
ALL_AGENTS = ("python", "python-asyncio", "rust", "node")


def _rust_agent() -> Optional[Path]:
    if os.environ.get("FENCELOCK_RUST_AGENT"):
        return Path(os.environ["FENCELOCK_RUST_AGENT"])
    roots = []
    if os.environ.get("CARGO_TARGET_DIR"):
        roots.append(Path(os.environ["CARGO_TARGET_DIR"]))
    roots += [Path("/work/main/target"), Path.home() / ".cache" / "fencelock" / "target"]
    for r in roots:
        p = r / "debug" / "examples" / "conformance_agent"
        if p.is_file():
            return p
    return None


def agent_command(name: str) -> Optional[list[str]]:
    """The agent's command line, or None if it is not available here."""
    if name in ("python", "python-asyncio"):
        python = os.environ.get("CLIENTS_PYTHON", sys.executable)
        return [python, str(REPO / "clients" / "python" / "conformance_agent.py")]
    if name == "rust":
        p = _rust_agent()
        return [str(p)] if p is not None else None
    if name == "node":
        override = os.environ.get("FENCELOCK_NODE_AGENT")
        script = Path(override) if override else REPO / "clients" / "node" / "conformance" / "agent.mjs"
        return ["node", str(script)] if script.is_file() else None
    raise ValueError(f"unknown agent {name!r}")


def selected_agents() -> tuple[list[str], list[str]]:
    """(agents to run, agents not found). With FENCELOCK_AGENTS set, every
    agent named there must be available (else an error)."""
    wanted = os.environ.get("FENCELOCK_AGENTS")
    if wanted:
        names = [n.strip() for n in wanted.split(",") if n.strip()]
        for n in names:
            if n not in ALL_AGENTS:
                raise RuntimeError(f"FENCELOCK_AGENTS names unknown agent {n!r}; known: {ALL_AGENTS}")
        missing = [n for n in names if agent_command(n) is None]
        if missing:
            raise RuntimeError(f"FENCELOCK_AGENTS asks for {missing}, which cannot be started here")
        return names, []
    run = [n for n in ALL_AGENTS if agent_command(n) is not None]
    return run, [n for n in ALL_AGENTS if n not in run]


class AgentError(AssertionError):
    pass


@dataclass
class Reply:
    ok: bool
    data: dict[str, Any]

    @property
    def error(self) -> dict[str, Any]:
        return dict(self.data.get("error") or {})

    def __getitem__(self, k: str) -> Any:
        return self.data[k]


@dataclass
class Agent:
    name: str
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    next_id: int = 1
    eof: bool = False

    @classmethod
    def start(cls, name: str, log_dir: Path, env: Optional[dict[str, str]] = None) -> "Agent":
        cmd = agent_command(name)
        if cmd is None:
            raise RuntimeError(f"agent {name} is not available")
        log_dir.mkdir(parents=True, exist_ok=True)
        stderr_path = log_dir / f"agent-{name}-{time.monotonic_ns()}.log"
        full_env = dict(os.environ)
        full_env.update(env or {})
        if name != "python":  # test modes are for the Python agent only
            full_env.pop("FENCELOCK_AGENT_BROKEN", None)
        full_env["FENCELOCK_AGENT_API"] = "asyncio" if name == "python-asyncio" else "sync"
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    cwd=REPO, env=full_env)
        agent = cls(name, proc, stderr_path)
        threading.Thread(target=agent._read, daemon=True).start()
        return agent

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                msg = {"event": "garbage", "line": raw.decode(errors="replace")}
            with self.cond:
                if "id" in msg and msg.get("id") is not None:
                    self.replies[int(msg["id"])] = msg
                else:
                    self.events.append(msg)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def send(self, op: str, **args: Any) -> int:
        with self.cond:
            i = self.next_id
            self.next_id += 1
        line = json.dumps({"id": i, "op": op, **args}) + "\n"
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode())
        self.proc.stdin.flush()
        return i

    def wait(self, i: int, timeout: float) -> Reply:
        end = time.monotonic() + timeout
        with self.cond:
            while i not in self.replies:
                left = end - time.monotonic()
                if left <= 0:
                    raise AgentError(f"agent {self.name}: no reply to command {i} within {timeout}s\n"
                                     f"--- agent stderr\n{self.stderr()}")
                if self.eof:
                    raise AgentError(f"agent {self.name} exited ({self.proc.poll()}) before replying\n"
                                     f"--- agent stderr\n{self.stderr()}")
                self.cond.wait(timeout=left)
            msg = self.replies.pop(i)
        return Reply(bool(msg.get("ok")), msg)

    def call(self, op: str, timeout: float = 30.0, **args: Any) -> Reply:
        return self.wait(self.send(op, **args), timeout)

    def ok(self, op: str, timeout: float = 30.0, **args: Any) -> Reply:
        """A command that must succeed."""
        r = self.call(op, timeout, **args)
        if not r.ok:
            raise AgentError(f"agent {self.name}: {op} {args} failed: {r.error}\n--- agent stderr\n{self.stderr()}")
        return r

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=5)


def AGENT_NAMES_FOR_META() -> list[str]:
    """The agents this run uses (for tests that need a particular one)."""
    return selected_agents()[0]
