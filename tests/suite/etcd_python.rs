//! etcd's v3 API on a router, driven by the Python etcd client `etcd3` (python-etcd3 0.12.0,
//! installed by `make setup`) unchanged: `tests/etcd3/scenarios.py` runs its calls against an
//! in-process cluster whose keys live in two groups (`/` and `/py/g`) and checks each answer;
//! `tests/etcd3/leader_kill.py` holds a lock through the SIGKILL of its group's leader, a
//! real `warden node` process.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::GetRequest;

use crate::support::processes::{self, ProcessCluster, STEP_TIMEOUT};
use crate::support::routed::{cluster_with_groups, start_router_with_etcd};

/// The scenarios, a plain python script taking the etcd endpoint `host:port`.
const SCENARIOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/etcd3/scenarios.py");

/// How long the scenarios may run before they are killed (they take a few seconds).
const SCENARIOS_DEADLINE: Duration = Duration::from_secs(120);

/// The lock held through a leader's kill, a python script taking the etcd endpoint and
/// talking to the test in lines (its protocol is at its top).
const LEADER_KILL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/etcd3/leader_kill.py");

/// How long the leader-kill script may run before it is killed: it waits for the test to
/// kill a leader and see the next elected (each up to [`STEP_TIMEOUT`]), then a TTL.
const LEADER_KILL_DEADLINE: Duration = Duration::from_secs(240);

/// The key of the lock `leader_kill.py` takes (python-etcd3's `/locks/` + its name).
const LEADER_KILL_LOCK: &str = "/locks/leader-kill";

/// The TTL of the lease of that lock (the script's `LOCK_TTL_S`).
const LEADER_KILL_LOCK_TTL_S: u64 = 5;

/// A python script of `tests/etcd3/` running with python-etcd3, which the test may talk to
/// in lines (its standard input and output); killed if dropped while it runs, and when it
/// runs past its deadline.
struct Script {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    /// The lines read from its standard output so far.
    printed: String,
    /// Its standard error, read to its end meanwhile (a full pipe never blocks the script).
    stderr: tokio::task::JoinHandle<String>,
    /// When it is killed if it has not ended.
    deadline: tokio::time::Instant,
    runs_for: Duration,
}

impl Script {
    /// Starts `python3 script args`, which may run for `runs_for`.
    fn start(script: &str, args: &[&str], runs_for: Duration) -> Script {
        let mut child = tokio::process::Command::new("python3")
            .arg("-u")
            .arg(script)
            .args(args)
            // etcd3 0.12's generated protobuf modules predate protobuf 4: they load with the
            // pure-Python implementation only (scripts/setup.sh).
            .env("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs (make setup installs etcd3)");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut read = Vec::new();
            let _ = stderr.read_to_end(&mut read).await;
            String::from_utf8_lossy(&read).into_owned()
        });
        let deadline = tokio::time::Instant::now() + runs_for;
        Script { child, stdin, stdout, printed: String::new(), stderr, deadline, runs_for }
    }

    /// The next line the script prints, `what` the test waits for; fails the test with all
    /// the script printed if it ends first or runs past its deadline.
    async fn line(&mut self, what: &str) -> String {
        if let Ok(Ok(Some(line))) = tokio::time::timeout_at(self.deadline, self.stdout.next_line()).await {
            self.printed.push_str(&line);
            self.printed.push('\n');
            return line;
        }
        let (output, _) = self.end().await;
        panic!("{}", report(&format!("the script ended or ran past {:?} before printing {what} ({})", self.runs_for, output.status), &output));
    }

    /// Writes `line` to the script's standard input.
    async fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the script's standard input is open until it ends");
        if stdin.write_all(format!("{line}\n").as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            let (output, _) = self.end().await;
            panic!("{}", report(&format!("the script ended before reading {line:?} ({})", output.status), &output));
        }
    }

    /// Closes the script's standard input and waits for it to end: what it printed and how
    /// it ended. Fails the test if it runs past its deadline (it is killed).
    async fn finish(mut self) -> Output {
        let (output, killed) = self.end().await;
        assert!(!killed, "{}", report(&format!("the script ran past {:?} and was killed", self.runs_for), &output));
        output
    }

    /// Closes the standard input, reads the script's output to its end and waits for it to
    /// exit, killing it at its deadline: what it printed, and whether it was killed.
    async fn end(&mut self) -> (Output, bool) {
        drop(self.stdin.take());
        let (stdout, printed, child) = (&mut self.stdout, &mut self.printed, &mut self.child);
        let ended = async {
            while let Ok(Some(line)) = stdout.next_line().await {
                printed.push_str(&line);
                printed.push('\n');
            }
            child.wait().await
        };
        let (status, killed) = match tokio::time::timeout_at(self.deadline, ended).await {
            Ok(status) => (status, false),
            Err(_) => {
                let _ = self.child.start_kill();
                (self.child.wait().await, true)
            }
        };
        let status = status.expect("python3 ends");
        let stderr = (&mut self.stderr).await.unwrap_or_default();
        (Output { status, stdout: self.printed.clone().into_bytes(), stderr: stderr.into_bytes() }, killed)
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
    let started = Instant::now();
    let output = Script::start(SCENARIOS, &[&etcd_addr.to_string()], SCENARIOS_DEADLINE).finish().await;
    println!("{}", report(&format!("the scenarios ran in {:.1?}", started.elapsed()), &output));
    assert!(output.status.success(), "{}", report(&format!("the scenarios failed ({})", output.status), &output));
}

/// A python-etcd3 program holding `client.lock` (its lease refreshed every second) keeps it
/// when the leader of the lock's group dies (SIGKILL of a real `warden node`): more than a
/// TTL after the new leader's election its refreshes still answer the granted TTL and the
/// lock key is still its own; a second client's `acquire` is refused; puts and gets are
/// served; a watch made before the kill (resumed from the revision after its last event if
/// its stream ended) and a watch from a revision after the kill see every put exactly once
/// in order; on release the second client acquires the lock with a greater revision (the
/// fencing token). The killed node then comes back on its data directory and catches up.
/// (About 15 s: the cluster's start, an election and a TTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_etcd3_lock_is_held_through_a_leader_kill_and_handed_on_with_a_greater_revision() {
    // Only the root group: the lock, its lease and the watched key live in the group whose
    // leader dies.
    let mut cluster = ProcessCluster::start(&[]).await;
    let (_etcd_router, router_addr, etcd_addr) = cluster.start_etcd_router().await;
    let mut native = WardenClient::new(processes::channel(&router_addr, Duration::from_secs(10)));
    let started = Instant::now();
    let mut script = Script::start(LEADER_KILL, &[&etcd_addr.to_string()], LEADER_KILL_DEADLINE);
    let held = script.line("`held REVISION`").await;
    let revision: i64 =
        held.strip_prefix("held ").and_then(|revision| revision.parse().ok()).unwrap_or_else(|| panic!("not `held REVISION`: {held:?}"));
    assert!(revision > 0, "the lock key's revision: {held:?}");

    let got = native.get(GetRequest { path: LEADER_KILL_LOCK.into(), ..GetRequest::default() }).await.expect("read the lock's key").into_inner();
    let group = got.header.expect("a header").group_id;
    let leader = warden_testkit::wait_until("a leader of the lock's group", STEP_TIMEOUT, || cluster.group_leader(group, None)).await;
    cluster.kill(leader);
    let successor = warden_testkit::wait_until("a new leader of the lock's group", STEP_TIMEOUT, || cluster.group_leader(group, Some(leader))).await;
    let elected_by = tokio::time::Instant::now();
    eprintln!("node {leader} (leader of group {group}) SIGKILLed; node {successor} leads it");
    // Not a synchronisation: the new leader gave the lease a whole TTL when it was elected,
    // and only the script's refreshes can keep it past that. The script then waits (with a
    // deadline) for a refresh sent after this line.
    tokio::time::sleep_until(elected_by + Duration::from_secs(LEADER_KILL_LOCK_TTL_S + 1)).await;
    script.send("killed").await;
    let output = script.finish().await;
    println!("{}", report(&format!("the leader-kill script ran in {:.1?}", started.elapsed()), &output));
    assert!(output.status.success(), "{}", report(&format!("the leader-kill script failed ({})", output.status), &output));

    cluster.restart(leader);
    cluster.wait_caught_up(leader, &[group]).await;
}
