//! etcd's v3 API on a router, driven by the Python etcd client `etcd3` (python-etcd3 0.12.0,
//! installed by `make setup`) unchanged: `tests/etcd3/scenarios.py` runs its calls against an
//! in-process cluster whose keys live in two groups (`/` and `/py/g`) and checks each answer.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::routed::{cluster_with_groups, start_router_with_etcd};

/// The scenarios, a plain python script taking the etcd endpoint `host:port`.
const SCENARIOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/etcd3/scenarios.py");

/// How long the whole script may run before it is killed (it takes a few seconds).
const DEADLINE: Duration = Duration::from_secs(120);

/// Runs the scenarios against `addr`, killing python past [`DEADLINE`].
fn run_scenarios(addr: std::net::SocketAddr) -> Output {
    let child = Command::new("python3")
        .arg("-u")
        .arg(SCENARIOS)
        .arg(addr.to_string())
        // etcd3 0.12's generated protobuf modules predate protobuf 4: they load with the
        // pure-Python implementation only (scripts/setup.sh).
        .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (make setup installs etcd3)");
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    let (send, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || send.send(child.wait_with_output()));
    match ended.recv_timeout(DEADLINE) {
        Ok(output) => output.expect("python3 ends"),
        Err(_) => {
            // SAFETY: signals the child this test started; it is not reaped until
            // `wait_with_output` (still waiting) returns.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let output = ended.recv().expect("the waiting thread answers").expect("python3 ends");
            panic!("{}", report(&format!("the scenarios ran past {DEADLINE:?} and were killed"), &output));
        }
    }
}

/// What the script printed, for a failure message.
fn report(what: &str, output: &Output) -> String {
    format!("{what}\n--- stdout ---\n{}\n--- stderr ---\n{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// python-etcd3 works unchanged against a router's etcd API: puts, gets, prefix reads in
/// key order across two groups, deletes, `prev_kv`, `replace` and transactions; a lease
/// owns keys in both groups until revoked and is kept by refreshes; watches see puts and
/// deletes in order, resume from a revision with exactly the events from it on, and end
/// when cancelled; `client.lock` (a transaction on `/locks/<name>` and a watch for its
/// deletion) has one holder at a time, hands over to a waiter on release with a greater
/// revision (the fencing token); `status()` and `members` answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_etcd3_works_unchanged_against_the_etcd_api() {
    let cluster = cluster_with_groups(&["/py/g"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let started = std::time::Instant::now();
    let output = tokio::task::spawn_blocking(move || run_scenarios(etcd_addr)).await.expect("the scenarios' thread");
    println!("{}", report(&format!("the scenarios ran in {:.1?}", started.elapsed()), &output));
    assert!(output.status.success(), "{}", report(&format!("the scenarios failed ({})", output.status), &output));
}
