#!/usr/bin/env bash
# Builds the fencelock binary (release) and starts a local cluster with
# `fencelock dev`; `make run` calls this. Arguments go to `fencelock dev`:
#
#   deploy/scripts/dev-cluster.sh                       # 3 nodes on 7001-7003
#   deploy/scripts/dev-cluster.sh --nodes 5 --fresh     # see `fencelock dev --help`
#
# Configs and data live in .fencelock-dev/ (relative to the current
# directory) and survive restarts; Ctrl-C stops every node. The dev cluster
# runs without TLS (`[tls] insecure = true`, development only) unless given
# `--tls` (mutual TLS with generated development certificates; see
# docs/security.md).
set -euo pipefail

# The same default as the Makefile: build output outside the clone, so the
# RocksDB build is shared between clones and CI runs.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fencelock/target}"
CARGO="${CARGO:-cargo}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$CARGO" build --release --locked -p fencelock-cli --manifest-path "$repo_root/Cargo.toml"

exec "$CARGO_TARGET_DIR/release/fencelock" dev "$@"
