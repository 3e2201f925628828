"""The Python client's load tool (clients/python/bench.py) runs against the
real cluster and reports ops/s. No speed is asserted: only that it works."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
