//! The Python client package (`client/python`, distribution `warden-client`, import package
//! `warden`) passes its own pytest suite (`client/python/tests`) against real `warden`
//! processes: this checkout's package is installed into a scratch directory first (its gRPC
//! stubs generated from this checkout's `proto/proto` by its build step), so the commit's own
//! client and protos are tested, then pytest runs with the scratch directory as `PYTHONPATH`
//! and this build's binary as `WARDEN_BIN` (the suite starts its own five-node cluster,
//! routers and a `warden dev --secure`). `make setup` installs grpcio, grpcio-tools,
//! grpcio-status, pytest, setuptools and wheel (scripts/setup.sh).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::child::{self, Ran};

/// The `warden` binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_warden");
/// The repository root (this package's directory).
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// How long building and installing the package may take.
const INSTALL_DEADLINE: Duration = Duration::from_secs(180);
/// How long the whole suite may take on a loaded machine (it takes about a minute).
const SUITE_DEADLINE: Duration = Duration::from_secs(300);

/// Runs `command` in a process group of its own (with every `warden` process it starts);
/// panics with its output if it runs past `deadline` (its group killed).
fn run_within(what: &str, command: &mut Command, deadline: Duration) -> Ran {
    let ran = child::run_within(command, deadline).unwrap_or_else(|e| panic!("{what}: python3 runs (make setup): {e}"));
    assert!(ran.status.is_some(), "{what} ran past {deadline:?} and was killed\n{}", ran.report());
    ran
}

/// `pip install` of this checkout's `client/python` into a scratch directory, then its pytest
/// suite against this build's binary: namespace calls, typed errors (also decoded with plain
/// grpcio and `grpc_status`), failover and unknown outcomes with routers paused and killed,
/// sessions (expiry, jeopardy and its callbacks), locks (FIFO, shared, lock-delay,
/// `keep_queued`, the SIGKILL of the lock group's leader), watches (resumed through another
/// router after a SIGKILL), recipes, TLS and bearer tokens, and docs/python.md's example.
#[test]
fn the_python_client_passes_its_suite_against_real_processes() {
    let target = tempfile::tempdir().expect("tempdir");
    let package = Path::new(ROOT).join("client/python");
    // Dependencies come from the machine (scripts/setup.sh); nothing is fetched.
    let install = run_within(
        "pip install",
        Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation", "--target"])
            .arg(target.path())
            .arg(&package)
            .current_dir(ROOT),
        INSTALL_DEADLINE,
    );
    assert!(install.success(), "pip install of client/python failed\n{}", install.report());
    let started = Instant::now();
    let suite = run_within(
        "pytest",
        Command::new("python3")
            .args(["-m", "pytest", "-p", "no:cacheprovider", "-q", "-ra", "--durations=10"])
            .arg(package.join("tests"))
            .env("PYTHONPATH", target.path())
            .env("WARDEN_BIN", BIN)
            .env_remove("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION")
            .current_dir(ROOT),
        SUITE_DEADLINE,
    );
    println!("the Python client's suite ran in {:.1?}\n{}", started.elapsed(), suite.report());
    assert!(suite.success(), "the Python client's suite failed\n{}", suite.report());
}
