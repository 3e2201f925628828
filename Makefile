# fencelock — two commands set up a fresh machine:
#   make run    build and start a local 3-node cluster
#   make test   the full test suite (what CI runs)
SHELL := /bin/bash

# Build artifacts live outside the clone so that CI and fresh clones on the
# same machine reuse the (slow to build) RocksDB objects.
CARGO_TARGET_DIR ?= $(HOME)/.cache/fencelock/target
export CARGO_TARGET_DIR
CARGO ?= cargo

.PHONY: deps build test lint fmt run clean check-deploy

deps:
	@deploy/scripts/ensure-deps.sh

build: deps
	$(CARGO) build --locked --workspace --all-targets

test: deps
	$(CARGO) test --locked --workspace

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

# Prometheus rules and config in deploy/ (also checked by `make test`).
check-deploy: deps
	cd deploy/prometheus && promtool check rules alerts.yml \
		&& promtool check config prometheus.yml \
		&& promtool test rules alerts_test.yml

run: deps
	@deploy/scripts/dev-cluster.sh

clean:
	$(CARGO) clean

# ---- Benchmarks (loadtest/, docs/benchmarks.md) ---------------------------
# `make bench` runs the side-by-side comparison with etcd end to end:
# installs etcd if missing, builds release binaries, runs every profile
# against a fresh local 3-node cluster of each system, and writes
# target/bench/{results.json,report.html,tables.md}. Extra harness flags go
# in BENCH_ARGS (for example BENCH_ARGS="--quick"). `make bench-smoke` is the
# short run that `make test` already includes.
BENCH_OUT ?= target/bench
BENCH_ARGS ?=

.PHONY: bench bench-smoke

bench: deps
	@loadtest/scripts/ensure-etcd.sh
	$(CARGO) build --locked --release --workspace
	$(CARGO_TARGET_DIR)/release/fencelock-bench compare --out $(BENCH_OUT) \
		--work-dir $(BENCH_OUT)/clusters \
		--fencelock-bin $(CARGO_TARGET_DIR)/release/fencelock $(BENCH_ARGS)

bench-smoke: deps
	$(CARGO) build --locked --workspace --all-targets
	$(CARGO) test --locked -p fencelock-bench

# Longer fault injection than the bounded run in `make test`: real `fencelock
# serve` processes in network namespaces (needs root), every fault kind, the
# whole history checked (docs/testing.md). CHAOS_SECS sets the fault phase,
# CHAOS_SEED replays a schedule, CHAOS_FAULTS selects kinds (comma-separated).
CHAOS_SECS ?= 600
CHAOS_FAULTS ?= all
CHAOS_SEED ?=
.PHONY: chaos
chaos: deps
	$(CARGO) build --locked --workspace --all-targets
	$(CARGO_TARGET_DIR)/debug/nemesis run --duration-secs $(CHAOS_SECS) \
		--faults $(CHAOS_FAULTS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))
