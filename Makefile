# fencelock — two commands set up a fresh machine:
#   make run    build and start a local 3-node cluster
#   make test   the full test suite (what CI runs)
SHELL := /bin/bash

# Build artifacts live outside the clone so that CI and fresh clones on the
# same machine reuse the (slow to build) RocksDB objects.
CARGO_TARGET_DIR ?= $(HOME)/.cache/fencelock/target
export CARGO_TARGET_DIR
CARGO ?= cargo

.PHONY: deps build test test-clients lint fmt run install clean check-deploy

deps:
	@deploy/scripts/ensure-deps.sh

build: deps
	$(CARGO) build --locked --workspace --all-targets

test: deps
	$(CARGO) test --locked --workspace
	$(MAKE) test-clients

# The Python client's unit tests and mypy, Node's own tests when clients/node
# has them, and the conformance suite of every client (Python, Rust, Node)
# against a real cluster of the binary built above (clients/test.sh).
test-clients:
	FENCELOCK_BIN=$${FENCELOCK_BIN:-$(CARGO_TARGET_DIR)/debug/fencelock} \
	FENCELOCK_BENCH_BIN=$${FENCELOCK_BENCH_BIN:-$(CARGO_TARGET_DIR)/debug/fencelock-bench} \
	clients/test.sh

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

# Puts `fencelock` on PATH: cargo's bin directory (~/.cargo/bin, on PATH
# wherever rustup installed Rust), or $(PREFIX)/bin when PREFIX is given.
# The release build is the one `make run` made (same CARGO_TARGET_DIR).
PREFIX ?=
install: deps
	$(CARGO) install --locked --path crates/cli --bin fencelock --force $(if $(PREFIX),--root $(PREFIX))

clean:
	$(CARGO) clean

# ---- Benchmarks (loadtest/, docs/benchmarks.md) ---------------------------
# `make bench` runs the side-by-side comparison with etcd end to end:
# installs etcd if missing, builds release binaries, runs every profile
# against a fresh local 3-node cluster of each system (`watch` and
# `failover` against fencelock only: etcd has no counterpart), and writes
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

# Where the nodes' CPU goes under load, by part (gRPC, Raft, RocksDB, the
# state machine, the kernel's network path, ...): a `perf` profile of the
# three release nodes at PROFILE_RATE lock ops/s, written to
# $(BENCH_OUT)/profile/profile.md (docs/benchmarks.md, "Where the CPU goes").
# Needs root and Debian's linux-perf (installed when missing).
PROFILE_RATE ?= 20000
PROFILE_SECS ?= 30
.PHONY: bench-profile
bench-profile: deps
	@command -v perf >/dev/null || (echo "installing linux-perf" && apt-get install -y linux-perf)
	$(CARGO) build --locked --release --workspace
	loadtest/scripts/cpu_profile.py --bench $(CARGO_TARGET_DIR)/release/fencelock-bench \
		--fencelock $(CARGO_TARGET_DIR)/release/fencelock --rate $(PROFILE_RATE) \
		--seconds $(PROFILE_SECS) --out $(BENCH_OUT)/profile

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

# A soak (docs/testing.md, "Soak"): SOAK_SECS of the chaos load plus a
# seed-shaped background load (SOAK_RATE acquires a second, 10 × as many
# leases held), one fault every SOAK_FAULT_EVERY_SECS; the whole history is
# checked and every node's memory, open files and data directory must be
# flat after the warm-up. SOAK_OUT keeps the history and resources.csv.
SOAK_SECS ?= 3600
SOAK_FAULT_EVERY_SECS ?= 180
SOAK_FAULTS ?= all
SOAK_RATE ?= 100
SOAK_SEED ?=
SOAK_OUT ?=
.PHONY: soak
soak: deps
	$(CARGO) build --locked --workspace --all-targets
	$(CARGO_TARGET_DIR)/debug/nemesis soak --duration-secs $(SOAK_SECS) \
		--fault-every-secs $(SOAK_FAULT_EVERY_SECS) --faults $(SOAK_FAULTS) \
		--rate $(SOAK_RATE) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) \
		$(if $(SOAK_OUT),--out $(SOAK_OUT))

# A rolling upgrade under load (docs/operations.md, "Upgrades"): the previous
# release (PREVIOUS_RELEASE, a commit of this repository's history) is built
# in a worktree with its own target directory, a 3-node cluster of it is
# loaded, each node is stopped and started from this build in turn, and the
# whole history is checked. UPGRADE_OUT keeps the history and logs.
PREVIOUS_RELEASE ?= 73b04db
PREVIOUS_DIR ?= $(HOME)/.cache/fencelock/previous-$(PREVIOUS_RELEASE)
UPGRADE_OUT ?=
.PHONY: upgrade-test
upgrade-test: deps
	$(CARGO) build --locked --workspace --all-targets
	test -d $(PREVIOUS_DIR)/src || git worktree add --detach $(PREVIOUS_DIR)/src $(PREVIOUS_RELEASE)
	cd $(PREVIOUS_DIR)/src && CARGO_TARGET_DIR=$(PREVIOUS_DIR)/target $(CARGO) build --locked --bin fencelock
	$(CARGO_TARGET_DIR)/debug/nemesis upgrade --from $(PREVIOUS_DIR)/target/debug/fencelock \
		$(if $(UPGRADE_OUT),--out $(UPGRADE_OUT))

# ---- Fuzzing (fuzz/, docs/testing.md "Fuzzing") ---------------------------
# Coverage-guided libFuzzer runs with cargo-fuzz, FUZZ_SECS seconds per
# target (default 60), every target or the ones in FUZZ_TARGET
# (comma-separated). The bounded smoke of the same targets is part of
# `make test`. cargo-fuzz passes nightly-only flags (-Zsanitizer=address);
# RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them. New inputs go to
# $(FUZZ_WORK)/<target> (the committed corpus in fuzz/corpus stays as it
# is); crashes to fuzz/artifacts/<target>/. FUZZ_ARGS go to libFuzzer
# (for example FUZZ_ARGS="-jobs=2 -workers=2").
FUZZ_SECS ?= 60
FUZZ_TARGET ?= all
FUZZ_ARGS ?=
FUZZ_WORK ?= $(CARGO_TARGET_DIR)/fuzz-corpus
FUZZ_ALL := command_decode snapshot_decode export_import placement_decode \
	lock_table_apply placement_apply api_requests log_payload raft_batch
fuzz_comma := ,
FUZZ_SELECTED = $(if $(filter all,$(FUZZ_TARGET)),$(FUZZ_ALL),$(subst $(fuzz_comma), ,$(FUZZ_TARGET)))
.PHONY: fuzz
fuzz: deps
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz build
	cd fuzz && for t in $(FUZZ_SELECTED); do \
		mkdir -p $(FUZZ_WORK)/$$t && \
		echo "== fuzz $$t for $(FUZZ_SECS) s" && \
		RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$t $(FUZZ_WORK)/$$t corpus/$$t -- \
			-max_total_time=$(FUZZ_SECS) -max_len=4096 -timeout=10 -print_final_stats=1 $(FUZZ_ARGS) \
			|| exit 1; \
	done

# Deterministic simulation of the multi-Raft layer (docs/testing.md): the
# real store of three nodes under one seeded RNG. `make test` runs 200
# seeds; this runs SIM_SEEDS of them. SIM_SEED=S replays exactly seed S.
# Its own crate (crates/simulation): it builds without the gRPC edge.
SIM_SEEDS ?= 2000
SIM_SEED ?=
.PHONY: sim
sim: deps
	$(if $(SIM_SEED),FENCELOCK_SIM_SEED=$(SIM_SEED),FENCELOCK_SIM_SEEDS=$(SIM_SEEDS)) \
		$(CARGO) test --locked -p fencelock-simulation --test simulation -- --nocapture
