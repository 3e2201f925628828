#!/usr/bin/env python3
"""A small load profile driven by the Python client: ops/s of one client
process. Each of --threads threads loops acquire -> (hold) -> release on its
own resources for --seconds; renewals of held leases run in the client's
background thread as usual. Prints one JSON line; asserts nothing about
speed (it measures the client process, mostly its CPU).

    python3 clients/python/bench.py --endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid

from fencelock import Client, ClientConfig, FencelockError, TlsConfig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoints", default="127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003")
    p.add_argument("--tenant", default="acme")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--ttl", type=float, default=30.0)
    p.add_argument("--resources", type=int, default=1000, help="distinct resources per thread")
    p.add_argument("--ca-file"), p.add_argument("--cert-file"), p.add_argument("--key-file")
    a = p.parse_args()
    tls = TlsConfig.from_files(a.ca_file, a.cert_file, a.key_file) if a.ca_file else None
    run = uuid.uuid4().hex[:8]
    counts = {"acquired": 0, "released": 0, "errors": 0}
    latencies: list[float] = []
    lock = threading.Lock()
    with Client(a.endpoints.split(","), ClientConfig(tls=tls)) as client:
        end = time.monotonic() + a.seconds

        def worker(t: int) -> None:
            i = 0
            while time.monotonic() < end:
                r = f"{a.tenant}/bench/{run}/{t}/{i % a.resources}"
                i += 1
                t0 = time.monotonic()
                try:
                    lease = client.acquire(r, ttl=a.ttl)
                    dt = time.monotonic() - t0
                    released = lease.release()
                    with lock:
                        counts["acquired"] += 1
                        counts["released"] += int(released)
                        latencies.append(dt)
                except FencelockError:
                    with lock:
                        counts["errors"] += 1

        started = time.monotonic()
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=a.seconds + 60)
        elapsed = time.monotonic() - started
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2) if latencies else 0.0

    print(json.dumps({
        "profile": "python-acquire-release", "threads": a.threads, "seconds": round(elapsed, 2),
        "ops_per_s": round((counts["acquired"] + counts["released"]) / elapsed, 1),
        "acquires_per_s": round(counts["acquired"] / elapsed, 1), **counts,
        "acquire_ms": {"p50": pct(0.5), "p95": pct(0.95), "p99": pct(0.99)},
        "renew_batch_calls": client.stats.renew_batch_calls,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
