#!/usr/bin/env bash
# Installs etcd (Debian's etcd-server package) for `make bench` when it is
# missing. Never run by `make test`: the tests need no etcd.
set -euo pipefail

if command -v etcd >/dev/null || [ -n "${ETCD_BIN:-}" ]; then
  exit 0
fi
echo "fencelock-bench: etcd not found; installing Debian's etcd-server" >&2
if [ "$(id -u)" = 0 ]; then
  sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo="sudo -n"
else
  echo "error: etcd is missing; install it with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y etcd-server" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "error: no apt-get here; install etcd 3.4+ and put it on PATH (or set ETCD_BIN)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# The package's service is not started (nothing here needs it: the
# benchmark starts its own members on free loopback ports).
$sudo apt-get install -y -qq etcd-server >/dev/null
echo "fencelock-bench: installed $(etcd --version | head -1)" >&2
