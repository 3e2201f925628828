"""The fencing helper: one set of checks for the in-memory store and
PostgreSQL (a throwaway server from initdb/pg_ctl; the PostgreSQL case
FAILS, not skips, when the server binaries are missing, unless
FENCELOCK_SKIP_POSTGRES=1 says so explicitly)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from fencelock.fencing import (InvalidResourceKeyError, InvalidTableNameError, InvalidTokenError,
                               MemoryFenceStore, PgFenceStore, StaleTokenError)


def _pg_bin() -> Path:
    for d in [os.environ.get("FENCELOCK_PG_BIN", ""), *sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)]:
        if d and (Path(d) / "initdb").is_file():
            return Path(d)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql "
                       "or set FENCELOCK_SKIP_POSTGRES=1")


@pytest.fixture(scope="module")
def pg_conninfo() -> Iterator[str]:
    if os.environ.get("FENCELOCK_SKIP_POSTGRES") == "1":
        pytest.skip("FENCELOCK_SKIP_POSTGRES=1")
    bin_dir = _pg_bin()
    d = Path(tempfile.mkdtemp(prefix="fencelock-pg-"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    pre: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(d, "postgres")
        pre = ["runuser", "-u", "postgres", "--"]
    data = d / "data"
    subprocess.run([*pre, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([*pre, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(d / "log"), "-w", "-t", "60", "-o",
                    f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True, timeout=90)
    try:
        yield f"host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=10"
    finally:
        subprocess.run([*pre, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryFenceStore()
        return
    conninfo = request.getfixturevalue("pg_conninfo")
    table = f"fence_{os.urandom(4).hex()}"
    s = PgFenceStore.connect(conninfo, table)
    yield s
    s.close()


def test_higher_and_equal_tokens_pass_lower_ones_never(store: Any) -> None:
    store.write("acme/a", 41, b"a41")
    store.write("acme/a", 42, b"b42")
    store.write("acme/a", 42, b"b42-again")  # equal: the same holder writes again
    with pytest.raises(StaleTokenError) as e:
        store.write("acme/a", 41, b"stale")
    assert e.value.presented == 41 and e.value.highest == 42
    rec = store.read("acme/a")
    assert rec.token == 42 and rec.value == b"b42-again"
    assert store.rejections == 1
    store.check_and_record("acme/a", 50)
    assert store.read("acme/a").value == b"b42-again"
    with pytest.raises(StaleTokenError):
        store.check_and_record("acme/a", 49)
    assert store.read("acme/nothing") is None


def test_bad_arguments_are_refused_and_not_counted(store: Any) -> None:
    for bad in (0, -1):
        with pytest.raises(InvalidTokenError):
            store.write("acme/b", bad, b"")
    with pytest.raises(InvalidResourceKeyError):
        store.write("", 1, b"")
    with pytest.raises(InvalidResourceKeyError):
        store.write("x" * 257, 1, b"")
    assert store.rejections == 0


def test_concurrent_writers_never_let_a_lower_token_win(store: Any, request: pytest.FixtureRequest) -> None:
    if isinstance(store, PgFenceStore):
        conninfo = request.getfixturevalue("pg_conninfo")
        stores = [PgFenceStore.connect(conninfo, store.table) for _ in range(4)]
    else:
        stores = [store] * 4
    accepted: list[int] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        for t in range(i + 1, 200, 4):
            try:
                stores[i].write("acme/c", t, str(t).encode())
                with lock:
                    accepted.append(t)
            except StaleTokenError:
                pass

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    final = store.read("acme/c")
    assert final.token == max(accepted) and final.value == str(final.token).encode()
    if isinstance(store, PgFenceStore):
        for s in stores:
            s.close()


def test_table_names_are_checked() -> None:
    with pytest.raises(InvalidTableNameError):
        PgFenceStore.create_table_sql("fence; drop table x")
