#!/usr/bin/env python3
"""Where a fencelock node's CPU goes, by part: a sampled profile of the
`fencelock` processes under a `saturate` load, grouped into the parts issue
#19 asks about (gRPC, Raft, RocksDB, the state machine, the store loop,
allocation, the kernel's network and disk paths, ...).

    loadtest/scripts/cpu_profile.py --bench target/release/fencelock-bench \
        --fencelock target/release/fencelock --seconds 30 --out target/bench/profile

`make bench-profile` runs it on the release build. It starts
`fencelock-bench run --profile saturate` with a first step long enough to
outlast the sampling at `--rate` lock ops/s (open loop: the figure belongs
to a known offered rate), waits for the load to build, samples every CPU with
`perf record -e cpu-clock -p <the three nodes>` (a software clock: this
machine's virtual CPUs have no hardware counters) and reads the samples
back with `perf report`. A part is chosen per sampled function
by its name (Rust paths name their crate; C++ RocksDB is `rocksdb::`;
kernel functions are `[k]`), first match wins; what matches nothing is
`other`. Self time only: a function's callees count for their own part.

Writes `profile.md` (the table) and `symbols.txt` (the 60 hottest
functions) under --out, and prints the table. Needs root (or
kernel.perf_event_paranoid <= 0) and Debian's linux-perf.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

# (part, pattern over "[k] name" / "[.] name"), first match wins.
PARTS = [
    ("kernel: network (TCP over loopback)", r"^\[k\] .*(tcp_|ip_|ipv4|ipv6|skb|sock|net_|netif|__dev_|loopback|napi|inet)"),
    ("kernel: disk and file system", r"^\[k\] .*(ext4|jbd2|blk_|bio_|submit_bio|filemap|iomap|file_write|vfs_fsync|writeback|page_cache)"),
    ("kernel: scheduling, futex, epoll", r"^\[k\] .*(futex|schedule|sched_|epoll|ep_|wake_up|try_to_wake|finish_task|pick_next|enqueue|dequeue|hrtimer|timerfd)"),
    ("kernel: other (syscall entry, memory, ...)", r"^\[k\] "),
    ("RocksDB", r"rocksdb::|rocksdb_|crc32c|Snappy|LZ4"),
    ("raft-rs", r"\braft::|raft_proto::|protobuf::"),
    ("gRPC and HTTP/2 (tonic, h2, hyper, tower, prost)", r"\btonic::|\baxum::|\bh2::|\bhyper::|hyper_util::|\btower::|\bprost::|\bhttp::|http_body|bytes::"),
    ("TLS", r"rustls::|ring::|aws_lc"),
    ("channels (crossbeam, tokio::sync)", r"crossbeam|tokio::sync::"),
    ("tokio runtime", r"\btokio::|mio::"),
    ("state machine (fencelock_statemachine)", r"fencelock_statemachine::"),
    ("store loop (fencelock_multiraft)", r"fencelock_multiraft::"),
    ("storage (fencelock_storage)", r"fencelock_storage::"),
    ("codec (fencelock_codec)", r"fencelock_codec::"),
    ("transport (fencelock_transport)", r"fencelock_transport::"),
    ("router and server", r"fencelock_router::|fencelock_server::|fencelock_api::|fencelock_security::"),
    ("other fencelock crates", r"fencelock_"),
    ("metrics (prometheus)", r"prometheus::"),
    ("allocator (jemalloc)", r"_rjem_|\bje_|jemalloc|malloc|\bfree\b|realloc|sdallocx"),
    ("libc memcpy, memmove, memcmp (callers not resolved)", r"__mem(move|cpy|set|cmp)|\bmem(cpy|move|cmp|set)\b"),
    ("hashing and collections", r"hashbrown::|BTreeMap|btree::|core::hash|siphash|ahash"),
    ("libc and std (locks, threads, time)", r"pthread_|__lll_|clock_gettime|std::|core::|alloc::|libc\.so|__GI_"),
]
COMPILED = [(name, re.compile(pattern)) for name, pattern in PARTS]
LINE = re.compile(r"^\s*([0-9.]+)%\s+(\S+)\s+(\[[.k]\])\s+(.*)$")


def part_of(kind, symbol):
    key = f"{kind} {symbol}"
    for name, pattern in COMPILED:
        if pattern.search(key):
            return name
    return "other"


def parse_report(text):
    """(percent, dso, kind, symbol) per line of `perf report --stdio
    --sort dso,sym --no-children`."""
    rows = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = LINE.match(line)
        if m:
            rows.append((float(m.group(1)), m.group(2), m.group(3), m.group(4).strip()))
    return rows


def group(rows):
    totals = {}
    for percent, _dso, kind, symbol in rows:
        name = part_of(kind, symbol)
        totals[name] = totals.get(name, 0.0) + percent
    return sorted(totals.items(), key=lambda kv: -kv[1])


def node_pids(cluster_dir):
    """The running `fencelock serve` processes whose config is in
    `cluster_dir` (this run's nodes, not any other cluster's)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and any(cluster_dir.encode() in a for a in args):
            pids.append(int(pid))
    return pids


def cpu_seconds(pids):
    """CPU seconds (user + system) of `pids`, all their threads."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="the fencelock-bench binary")
    ap.add_argument("--fencelock", required=True, help="the fencelock binary")
    ap.add_argument("--seconds", type=float, default=30.0, help="sampling time")
    ap.add_argument("--warmup-s", type=float, default=15.0, help="load before sampling")
    ap.add_argument("--rate", type=float, default=20000.0,
                    help="offered lock ops/s (acquire + release)")
    ap.add_argument("--out", default="target/bench/profile")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("perf not found: apt-get install linux-perf")
    os.makedirs(args.out, exist_ok=True)
    data = os.path.join(args.out, "perf.data")
    cluster_dir = os.path.abspath(os.path.join(args.out, "cluster"))
    # One step at `rate`, longer than warm-up and sampling together; the
    # run is stopped once sampled.
    step_s = int(args.warmup_s + args.seconds + 30)
    load = subprocess.Popen(
        [
            args.bench, "run", "--target", "fencelock", "--profile", "saturate",
            "--mode", "open", "--start-rate", str(args.rate),
            "--step-s", str(step_s),
            "--fencelock-bin", args.fencelock,
            "--work-dir", cluster_dir,
            "--out", os.path.join(args.out, "run"), "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(args.out, "load.log"), "w"),
    )
    try:
        time.sleep(args.warmup_s)
        if load.poll() is not None:
            sys.exit(f"the load ended early; see {args.out}/load.log")
        pids = node_pids(cluster_dir)
        if len(pids) != 3:
            sys.exit(f"expected the cluster's 3 nodes under {cluster_dir}, found {pids}")
        cpu_before = cpu_seconds(pids)
        subprocess.run(
            ["perf", "record", "-e", "cpu-clock", "-F", "499",
             "-p", ",".join(map(str, pids)), "-o", data,
             "--", "sleep", str(args.seconds)],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        cores = (cpu_seconds(pids) - cpu_before) / args.seconds
    finally:
        load.send_signal(signal.SIGINT)
        try:
            load.wait(timeout=60)
        except subprocess.TimeoutExpired:
            load.kill()
        # Interrupted, the harness does not stop its nodes: they are the
        # processes whose config lies in this run's cluster directory.
        subprocess.run(["pkill", "-KILL", "-f", os.path.abspath(cluster_dir)], check=False)
    report = subprocess.run(
        ["perf", "report", "-i", data, "--stdio", "--no-children",
         "--sort", "dso,sym", "--percent-limit", "0"],
        check=True, capture_output=True, text=True,
    ).stdout
    rows = parse_report(report)
    if not rows:
        sys.exit("no samples of `fencelock` processes: was the load running?")
    scale = 100.0 / sum(r[0] for r in rows)
    lines = [
        f"Offered {args.rate:.0f} lock ops/s; the nodes' CPU while sampled: "
        f"{cores:.2f} cores (all three `fencelock` processes).",
        "",
        "| part | share of the nodes' CPU |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {share * scale:.1f}% |" for name, share in group(rows)]
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "profile.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "symbols.txt"), "w") as f:
        for percent, dso, kind, symbol in sorted(rows, key=lambda r: -r[0])[:60]:
            f.write(f"{percent * scale:6.2f}%  {part_of(kind, symbol):45.45}  {dso:20.20}  {symbol}\n")
    print(table)


if __name__ == "__main__":
    main()
