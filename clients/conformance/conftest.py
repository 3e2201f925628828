"""Fixtures of the conformance suite: one real TLS cluster per session,
the fenced store, and an agent per selected client (python, rust, node)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agents import Agent, selected_agents  # noqa: E402
from cluster import Cluster, find_binary  # noqa: E402
from fenced_store import FencedStore  # noqa: E402

AGENTS, MISSING = selected_agents()


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"conformance agents that run: {', '.join(AGENTS) or 'NONE'}"]
    if MISSING:
        lines.append(f"conformance agents NOT found (not run): {', '.join(MISSING)}")
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"conformance agents run: {', '.join(AGENTS) or 'NONE'}"
                                + (f"; not found: {', '.join(MISSING)}" if MISSING else ""))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "agent_name" in metafunc.fixturenames:
        metafunc.parametrize("agent_name", AGENTS)


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    keep = os.environ.get("CONFORMANCE_KEEP")
    d = Path(tempfile.mkdtemp(prefix="fencelock-conformance-"))
    yield d
    if not keep:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(workdir: Path) -> Iterator[Cluster]:
    c = Cluster(find_binary(), workdir / "cluster")
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def store() -> Iterator[FencedStore]:
    s = FencedStore()
    yield s
    s.close()


class AgentFactory:
    def __init__(self, name: str, cluster: Cluster, logs: Path, env: dict[str, str]) -> None:
        self.name = name
        self.cluster = cluster
        self.logs = logs
        self.env = env
        self.started: list[Agent] = []

    def __call__(self, endpoints: list[str] | None = None, tenant: str = "acme", worker: str = "worker-1",
                 **config: int) -> Agent:
        a = Agent.start(self.name, self.logs, self.env)
        self.started.append(a)
        hello = a.ok("hello", timeout=30)
        assert hello["protocol"] == 1, hello.data
        a.ok("connect", endpoints=endpoints or self.cluster.endpoints,
             tls=self.cluster.client_tls(tenant, worker), **config)
        return a

    def close(self) -> None:
        for a in self.started:
            a.close()


def make_factory(name: str, cluster: Cluster, workdir: Path, env: dict[str, str]) -> AgentFactory:
    return AgentFactory(name, cluster, workdir / "agents", env)


@pytest.fixture
def agents(agent_name: str, cluster: Cluster, workdir: Path) -> Iterator[AgentFactory]:
    f = make_factory(agent_name, cluster, workdir, {})
    yield f
    f.close()
