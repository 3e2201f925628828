"""The Python client's load tool (clients/python/bench.py) runs against the
real cluster and reports ops/s, alone and driven by `fencelock-bench
client-load` (several client processes, one report). No speed is asserted:
only that it works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import REPO, selected_agents
from cluster import Cluster

pytestmark = pytest.mark.skipif("python" not in selected_agents()[0], reason="python agent not selected")


def test_python_bench_drives_the_cluster(cluster: Cluster) -> None:
    tls = cluster.client_tls()
    python = os.environ.get("CLIENTS_PYTHON", sys.executable)
    out = subprocess.run(
        [python, str(REPO / "clients" / "python" / "bench.py"), "--endpoints", ",".join(cluster.endpoints),
         "--threads", "2", "--seconds", "1.5", "--ttl", "5", "--ca-file", tls["ca_file"],
         "--cert-file", tls["cert_file"], "--key-file", tls["key_file"]],
        capture_output=True, text=True, timeout=90,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["acquired"] > 0 and report["errors"] == 0, report
    assert report["released"] == report["acquired"], report
    assert report["ops_per_s"] > 0


def find_bench_binary() -> Path:
    """$FENCELOCK_BENCH_BIN (clients/test.sh and the Makefile set it), else
    fencelock-bench beside the `fencelock` binaries find_binary() looks at."""
    candidates = []
    if os.environ.get("FENCELOCK_BENCH_BIN"):
        candidates.append(Path(os.environ["FENCELOCK_BENCH_BIN"]))
    else:
        if os.environ.get("CARGO_TARGET_DIR"):
            candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "debug" / "fencelock-bench")
        candidates.append(Path("/work/main/target/debug/fencelock-bench"))
        candidates.append(Path.home() / ".cache" / "fencelock" / "target" / "debug" / "fencelock-bench")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    pytest.fail("no fencelock-bench binary: looked at " + ", ".join(map(str, candidates))
                + " (build it with `cargo build -p fencelock-bench` or set FENCELOCK_BENCH_BIN)")


def client_load(args: list[str], out: Path, python: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_bench_binary()), "client-load", "--python", python,
         "--bench-script", str(REPO / "clients" / "python" / "bench.py"), "--out", str(out), *args],
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )


def test_fencelock_bench_drives_python_client_processes(cluster: Cluster, tmp_path: Path) -> None:
    tls = cluster.client_tls()
    python = os.environ.get("CLIENTS_PYTHON", sys.executable)
    out = client_load(
        ["--endpoints", ",".join(cluster.endpoints), "--client-procs", "2", "--threads", "2",
         "--seconds", "2", "--ttl-s", "5", "--ca-file", tls["ca_file"], "--cert-file", tls["cert_file"],
         "--key-file", tls["key_file"]],
        tmp_path, python,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "client-load.json").read_text())
    procs = report["processes"]
    assert [p["process"] for p in procs] == [1, 2], report
    assert len({p["pid"] for p in procs}) == 2, report
    for p in procs:
        assert p["acquired"] > 0 and p["errors"] == 0, p
        assert p["released"] == p["acquired"], p
        assert p["ops_per_s"] > 0 and p["threads"] == 2, p
        assert set(p["acquire_ms"]) == {"p50", "p95", "p99"}, p
    total = report["total"]
    for k in ("acquired", "released", "errors"):
        assert total[k] == sum(p[k] for p in procs), (k, report)
    assert total["ops_per_s"] == pytest.approx(sum(p["ops_per_s"] for p in procs)), report
    # The table on stdout has a row per process and the total.
    rows = [line.split()[0] for line in out.stdout.splitlines()[2:]]
    assert rows == ["1", "2", "total"], out.stdout


def test_fencelock_bench_says_how_to_install_the_client(tmp_path: Path) -> None:
    # An interpreter without site-packages cannot import the package: the
    # run must stop before any load with the install hint.
    python = os.environ.get("CLIENTS_PYTHON", sys.executable)
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{python}" -S "$@"\n')
    bare.chmod(0o755)
    out = client_load(["--endpoints", "127.0.0.1:1", "--seconds", "1"], tmp_path / "out", str(bare))
    assert out.returncode != 0, out.stdout
    assert "pip install ./clients/python" in out.stderr, out.stderr
    assert not (tmp_path / "out" / "client-load.json").exists()
