# The two commands of README.md: `make dev` (a local cluster) and `make test` (every test).
# Both install missing system packages first. Tests, benchmarks and `warden dev` share the
# release profile so RocksDB's C++ is compiled once; the target directory lives outside the
# checkout so CI runs on fresh clones reuse it.

CARGO_TARGET_DIR ?= $(HOME)/.cache/warden-target
export CARGO_TARGET_DIR

.PHONY: setup dev test lint bench build compare

setup:
	@bash scripts/setup.sh

build: setup
	cargo build --release --bin warden

dev: build
	$(CARGO_TARGET_DIR)/release/warden dev $(ARGS)

# Lints first (cheap, and a red lint fails CI anyway). Clippy runs in the release profile so
# it reuses the release build's RocksDB (build scripts are shared per profile).
lint: setup
	cargo fmt --all --check
	cargo clippy --release --workspace --all-targets -- -D warnings

# Cluster tests start many nodes; one test at a time keeps a 2-core machine from thrashing.
# The criterion benches (`benches/`) run once each in test mode, in a step of their own:
# criterion refuses libtest's `--test-threads`. Doctests run in a last step.
test: lint
	cargo test --release --workspace --lib --bins --tests --examples -- --test-threads=1
	cargo test --release --workspace --bench '*'
	cargo test --release --workspace --doc

bench: build
	$(CARGO_TARGET_DIR)/release/warden bench engine $(ARGS)

# Side-by-side load runs against a 5-member etcd and a 5-server ZooKeeper on this machine
# (installed from Debian when missing), writing BENCHMARKS.md and benchmarks/results/. Not part
# of `make test`: it installs servers and takes a while. ARGS=--quick tries it in short runs.
compare: setup
	bash scripts/bench-vs $(ARGS)
