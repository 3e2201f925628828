# fencelock — two commands set up a fresh machine:
#   make run    build and start a local 3-node cluster
#   make test   the full test suite (what CI runs)
SHELL := /bin/bash

# Build artifacts live outside the clone so that CI and fresh clones on the
# same machine reuse the (slow to build) RocksDB objects.
CARGO_TARGET_DIR ?= $(HOME)/.cache/fencelock/target
export CARGO_TARGET_DIR
CARGO ?= cargo

.PHONY: deps build test lint fmt run clean

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

run: deps
	@deploy/scripts/dev-cluster.sh

clean:
	$(CARGO) clean
