# The two commands of README.md: `make dev` (a local cluster) and `make test` (every test).
# Both install missing system packages first. Tests, benchmarks and `warden dev` share the
# release profile so RocksDB's C++ is compiled once; the target directory lives outside the
# checkout so CI runs on fresh clones reuse it.

CARGO_TARGET_DIR ?= $(HOME)/.cache/warden-target
export CARGO_TARGET_DIR

.PHONY: setup dev test bench build

setup:
	@bash scripts/setup.sh

build: setup
	cargo build --release --bin warden

dev: build
	$(CARGO_TARGET_DIR)/release/warden dev $(ARGS)

# Cluster tests start many nodes; one test at a time keeps a 2-core machine from thrashing.
test: setup
	cargo test --release --workspace --all-targets -- --test-threads=1

bench: build
	$(CARGO_TARGET_DIR)/release/warden bench engine $(ARGS)
