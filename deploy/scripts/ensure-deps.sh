#!/usr/bin/env bash
# Installs (or names) the system packages the build needs on a fresh machine.
#
# - a C/C++ toolchain and libclang: RocksDB's Rust bindings build RocksDB from
#   source and generate their FFI with bindgen, which loads libclang;
# - no `protoc`: our protos are compiled in build.rs by protox (pure Rust).
#
# Installs with apt-get when it can (root, or sudo without a password);
# otherwise prints the exact command and fails.
set -euo pipefail

missing=()
# libclang itself (libclang.so, libclang-14.so.1, ...), not its siblings:
# libclang-cpp.so comes with other LLVM packages and bindgen cannot use it.
have_libclang() {
  ldconfig -p 2>/dev/null | grep -Eq 'libclang(-[0-9.]+)?\.so' && return 0
  compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null \
    || compgen -G '/usr/lib/llvm-*/lib/libclang-[0-9]*.so*' >/dev/null
}
have_libclang || missing+=(libclang-dev)
command -v c++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v cargo >/dev/null || {
  echo "error: cargo not found. Install Rust (https://rustup.rs) >= 1.88, then re-run." >&2
  exit 1
}

# PostgreSQL server binaries (initdb, pg_ctl, postgres): the fencing tests
# start a throwaway server (crates/fencing/src/testing/pg_server.rs).
have_pg_server() {
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null
}
have_pg_server || missing+=(postgresql)

# Python gRPC packages for the Python client example and its test
# (crates/server/tests/external/python_client.rs), from pip at the versions pinned in
# examples/python/requirements.txt: Debian's python3-grpc-tools (1.14) is far
# older than its python3-grpcio (1.51) and generates code the protobuf
# runtime beside them rejects. A no-op when the pins are already installed.
# A failure only warns, so the Rust tests still run; the Python test then
# fails and names the command.
python_requirements="$(cd "$(dirname "$0")/../.." && pwd)/examples/python/requirements.txt"
python_install="python3 -m pip install -r $python_requirements"
if ! command -v python3 >/dev/null; then
  echo "warning: python3 not found; install it (apt-get install -y python3 python3-pip), then: $python_install" >&2
elif ! PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
    -r "$python_requirements" >&2; then
  echo "warning: could not install the Python gRPC packages; install them with: $python_install" >&2
fi

# promtool (Debian package `prometheus`): tests/real_process/deploy.rs checks the alert
# rules and the Prometheus config in deploy/prometheus/ with it.
command -v promtool >/dev/null || missing+=(prometheus)

# Headless Chromium: tests/real_process/status_page.rs loads the operator status page in
# it and reads the values the page shows.
command -v chromium >/dev/null || missing+=(chromium)

# Disk: one debug build of the workspace (RocksDB linked into every test
# binary) takes about 10 GB in the target directory, and the tests write
# RocksDB data under the temp directory. Warn early instead of failing at
# link time with "No space left on device".
target_dir="${CARGO_TARGET_DIR:-target}"
probe="$target_dir"
while [ ! -d "$probe" ]; do probe="$(dirname "$probe")"; done
free_kb="$(df -Pk "$probe" | awk 'NR == 2 { print $4 }')"
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((15 * 1024 * 1024)) ]; then
  echo "warning: only $((free_kb / 1024 / 1024)) GB free for $target_dir; the build needs about 15 GB." \
    "Free space, or clear stale artifacts with: cargo clean --target-dir $target_dir" >&2
fi

[ ${#missing[@]} -eq 0 ] && exit 0

echo "fencelock: installing missing build packages: ${missing[*]}" >&2
if [ "$(id -u)" = 0 ]; then
  sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo="sudo -n"
else
  echo "error: missing packages ${missing[*]}; install them with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get here; install the equivalents of: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
echo "fencelock: installed ${missing[*]}" >&2
