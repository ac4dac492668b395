# The two commands of README.md: `make dev` (a local cluster) and `make test` (every test).
# Both install missing system packages first. Tests, benchmarks and `warden dev` share the
# release profile so RocksDB's C++ is compiled once; the target directory lives outside the
# checkout so CI runs on fresh clones reuse it.

CARGO_TARGET_DIR ?= $(HOME)/.cache/warden-target
export CARGO_TARGET_DIR

.PHONY: setup dev test lint bench build compare compare-python torture

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

# Every test target through cargo-nextest (`.config/nextest.toml`), two tests at a time: the
# cluster tests mostly wait on ticks and timeouts, and those that start `warden dev` on its
# fixed ports never overlap. The ten slowest tests are printed after the run, passed or not. The criterion
# benches (`benches/`) then run once each in test mode, and the doctests last (nextest runs
# no doctests).
test: lint
	@command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest
	status=0; cargo nextest run --release --workspace --lib --bins --tests --examples || status=$$?; \
	  python3 scripts/slowest-tests.py target/nextest/default/junit.xml; exit $$status
	cargo test --release --workspace --bench '*'
	cargo test --release --workspace --doc

bench: build
	$(CARGO_TARGET_DIR)/release/warden bench engine $(ARGS)

# Side-by-side load runs against a 5-member etcd and a 5-server ZooKeeper on this machine
# (installed from Debian when missing), writing the first section of docs/benchmarks.md and benchmarks/results/. Not part
# of `make test`: it installs servers and takes a while. ARGS=--quick tries it in short runs.
compare: setup
	bash scripts/bench-vs $(ARGS)

# Put, get and lock+unlock at 1, 16 and 64 threads through each service's usual Python client
# (client/python/bench/bench.py): `warden` against `warden dev`, etcd3 against the 5-member etcd
# and kazoo against the 5-server ZooKeeper of `make compare`, each system alone, into
# benchmarks/results/<UTC date>-python-clients/ (docs/python.md, "Benchmark"). Builds nothing
# (ARGS=--build builds warden first); BENCH_DURATION_S=2 BENCH_THREADS=1,16 tries it.
compare-python: setup
	bash scripts/bench-python $(ARGS)

# The long torture run (tests/suite/torture): HISTORIES seeded histories (default 100) of
# five node processes on test hosts under partitions, pauses and kills, each checked; files
# and summary in OUT (default $(CARGO_TARGET_DIR)/torture/<seed>). E.g.
# `make torture SEED=42 HISTORIES=3 SECONDS=20 FAULTS=kill,halves`. Needs root (namespaces).
torture: setup
	WARDEN_TORTURE_SEED=$(SEED) WARDEN_TORTURE_HISTORIES=$(HISTORIES) WARDEN_TORTURE_SECONDS=$(SECONDS) \
	  WARDEN_TORTURE_FAULTS=$(FAULTS) WARDEN_TORTURE_OUT=$(OUT) \
	  cargo test --release --test suite torture::long_run -- --ignored --nocapture
