#!/usr/bin/env bash
# The clients' tests, one entry point (`make test-clients`):
#   1. a venv at ${CLIENTS_VENV:-~/.cache/fencelock/venv} (created if missing)
#      with the Python package built as a wheel and installed;
#   2. the Python unit tests and `mypy --strict` on the installed package;
#   3. the Rust conformance agent (cargo build of the client crate's example);
#   4. fencelock-bench (cargo build; FENCELOCK_BENCH_BIN, else
#      $CARGO_TARGET_DIR/debug/fencelock-bench) for the tools test;
#   5. Node's own tests (clients/node/test.sh) if clients/node exists;
#   6. the conformance suite (clients/conformance) for every agent found,
#      against a real cluster of `fencelock serve` processes
#      (FENCELOCK_BIN, else $CARGO_TARGET_DIR/debug/fencelock, else
#      /work/main/target/debug/fencelock); its tools test also runs
#      `fencelock-bench client-load` (step 4's binary).
# Set FENCELOCK_AGENTS=python,rust,node to require exactly those agents.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CLIENTS_VENV:-$HOME/.cache/fencelock/venv}"
python="${PYTHON:-python3}"
CARGO="${CARGO:-cargo}"

step() { printf '\n== %s\n' "$*"; }

step "venv $venv"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
fi
# Test tools; the package's own dependencies come with its wheel below.
"$venv/bin/python" -m pip install -q -r "$repo/clients/python/requirements-dev.txt"

step "build and install the Python package (wheel)"
wheel_dir="$(mktemp -d)"
trap 'rm -rf "$wheel_dir"' EXIT
"$venv/bin/python" -m pip wheel -q --no-deps -w "$wheel_dir" "$repo/clients/python" 2>&1 \
    | grep -v -e 'Warning' -e '^\s*$' -e '!!' -e '\*\*\*' || true
"$venv/bin/python" -m pip install -q --force-reinstall "$wheel_dir"/fencelock-*.whl

# Run from outside the source tree so the INSTALLED package is tested.
cd "$wheel_dir"

step "Python unit tests"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/clients/python/tests"

step "mypy --strict on the installed package"
"$venv/bin/python" -m mypy --config-file "$repo/clients/python/pyproject.toml" --strict \
    --cache-dir "$wheel_dir/.mypy_cache" -p fencelock

step "Rust conformance agent"
(cd "$repo" && "$CARGO" build --locked -q -p fencelock-client --example conformance_agent)

step "fencelock-bench (its client-load subcommand is run by the conformance tools test)"
(cd "$repo" && "$CARGO" build --locked -q -p fencelock-bench --bin fencelock-bench)
export FENCELOCK_BENCH_BIN="${FENCELOCK_BENCH_BIN:-${CARGO_TARGET_DIR:-$repo/target}/debug/fencelock-bench}"

if [[ -x "$repo/clients/node/test.sh" ]]; then
    step "Node client tests (clients/node/test.sh)"
    "$repo/clients/node/test.sh"
elif [[ -e "$repo/clients/node" ]]; then
    step "clients/node exists but has no executable test.sh: Node's own tests NOT run"
fi

step "conformance suite"
export CLIENTS_PYTHON="$venv/bin/python"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$repo/clients/conformance"
