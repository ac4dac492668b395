//! The `warden` command line, run as the real binary against a `warden dev` cluster started
//! once for the whole file (a dev cluster takes seconds to start). One #[test] runs every
//! step; each step runs even when an earlier one failed, and the test fails listing the
//! steps that did. The cluster is killed when the test ends, panics included.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use warden_testkit::{free_port, free_port_base};

const BIN: &str = env!("CARGO_BIN_EXE_warden");
/// Longest a one-shot command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(40);

/// A child process killed (SIGKILL) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Sends SIGTERM (what Ctrl-C-like stops use) and waits for the exit code.
    fn terminate(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        wait_within(&mut self.0, COMMAND_DEADLINE).status.code()
    }
}

/// Lines of a child's stdout or stderr, read by a thread so reads can time out.
struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    fn of(pipe: impl std::io::Read + Send + 'static) -> Lines {
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Lines(receive)
    }

    fn next_line(&mut self, timeout: Duration) -> Option<String> {
        self.0.recv_timeout(timeout).ok()
    }

    /// The next line, which must come within `timeout`.
    fn line(&mut self, timeout: Duration) -> String {
        self.next_line(timeout).unwrap_or_else(|| panic!("no line within {timeout:?}"))
    }
}

/// Waits for a child, killing it (and failing) past `deadline`.
fn wait_within(child: &mut Child, deadline: Duration) -> Output {
    let end = Instant::now() + deadline;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => break,
            None if Instant::now() > end => {
                let _ = child.kill();
                panic!("a warden command ran longer than {deadline:?}");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let status = child.wait().expect("wait");
    let read = |pipe: Option<&mut dyn std::io::Read>| {
        let mut bytes = Vec::new();
        if let Some(pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    };
    let stdout = read(child.stdout.as_mut().map(|p| p as &mut dyn std::io::Read));
    let stderr = read(child.stderr.as_mut().map(|p| p as &mut dyn std::io::Read));
    Output { status, stdout, stderr }
}

/// A base port whose dev cluster ports are all free now: `base..base + count` (the nodes),
/// `base + 199 ..= base + 200 + count` (the router's and the nodes' metrics) and, with
/// `client_ports`, `base + 100 ..` as many (their client ports under `--secure`).
fn free_port_range(count: u16, client_ports: bool) -> u16 {
    let metrics = METRICS_OFFSET - 1..METRICS_OFFSET + count;
    let offsets: Vec<u16> = (0..count).chain((100..100 + count).filter(|_| client_ports)).chain(metrics).collect();
    free_port_base(&offsets)
}

/// `warden dev` serves node i's metrics at its base port + 200 + i - 1, the router's at + 199.
const METRICS_OFFSET: u16 = 200;

/// A `warden dev` cluster and how to run the CLI against it.
struct Cluster {
    dev: Process,
    router: String,
    nodes: String,
    /// The dev cluster's base port.
    base: u16,
    dir: tempfile::TempDir,
    /// `WARDEN_CA`, `WARDEN_CERT`, `WARDEN_KEY` of the client `root` (`--secure`).
    tls_env: Vec<(&'static str, PathBuf)>,
}

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(false)
    }

    /// `warden dev`, with `--secure` if `secure` (then the CLI runs as the client `root`, and
    /// `nodes` are the nodes' client ports).
    fn start_with(secure: bool) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = free_port_range(5, secure);
        let router = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("dev.log")).expect("log");
        let data = dir.path().join("data");
        let mut command = Command::new(BIN);
        command.args(["dev", "--fresh", "--data-dir", data.to_str().expect("utf8"), "--base-port", &base.to_string(), "--router", &router]);
        if secure {
            command.arg("--secure");
        }
        // Logging at its defaults (`servers_log_leader_changes_by_default` reads this log).
        command.stdout(log.try_clone().expect("log")).stderr(log).env_remove("RUST_LOG");
        // SAFETY: prctl in the forked child before exec: dies with this test process even if
        // it is killed without unwinding.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let dev = Process(command.spawn().expect("spawn warden dev"));
        let first_node = if secure { base + 100 } else { base };
        let nodes = (0..3).map(|i| format!("127.0.0.1:{}", first_node + i)).collect::<Vec<_>>().join(",");
        let tls = data.join("tls");
        let tls_env = match secure {
            true => {
                vec![("WARDEN_CA", tls.join("ca.pem")), ("WARDEN_CERT", tls.join("client-root.pem")), ("WARDEN_KEY", tls.join("client-root.key"))]
            }
            false => Vec::new(),
        };
        let cluster = Cluster { dev, router, nodes, base, dir, tls_env };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let out = cluster.run(&["ls", "/teams"], None);
            if out.status.success() && text(&out.stdout).contains("payments") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the dev cluster did not come up: {}",
                std::fs::read_to_string(cluster.dir.path().join("dev.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        cluster
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command.args(args).env("WARDEN_ENDPOINTS", &self.router).env("RUST_LOG", "warn").current_dir(self.dir.path());
        command.envs(self.tls_env.iter().map(|(name, path)| (*name, path)));
        command
    }

    /// Runs `warden ARGS` to completion, with `stdin` piped in.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = self.command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn warden");
        let mut pipe = child.stdin.take().expect("stdin");
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes()).expect("write stdin");
        }
        drop(pipe);
        wait_within(&mut child, COMMAND_DEADLINE)
    }

    /// Runs `warden ARGS`, which must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, None);
        assert!(out.status.success(), "warden {args:?} failed ({:?}): {}", out.status, text(&out.stderr));
        text(&out.stdout)
    }

    /// `warden --json ARGS`, which must succeed; its stdout's one JSON object.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let stdout = self.ok(&all);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("warden {all:?} printed no JSON object ({e}): {stdout}"))
    }

    /// `warden --json ARGS`, which must succeed; each line of its stdout as JSON.
    fn json_lines(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let stdout = self.ok(&all);
        stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("warden {all:?}: not JSON ({e}): {line}"))).collect()
    }

    /// Starts `warden ARGS` in the background; its stdout lines.
    fn spawn(&self, args: &[&str]) -> (Process, Lines) {
        let mut child = self.command(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn warden");
        let lines = Lines::of(child.stdout.take().expect("stdout"));
        (Process(child), lines)
    }

    /// Starts `warden ARGS` in the background; its stderr lines (where `warden lock` reports).
    fn spawn_reading_stderr(&self, args: &[&str]) -> (Process, Lines) {
        let mut child = self.command(args).stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::piped()).spawn().expect("spawn warden");
        let lines = Lines::of(child.stderr.take().expect("stderr"));
        (Process(child), lines)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts a failure: exit code `code` and exactly one stderr line, `error: …` containing
/// `needle`.
fn assert_fails(out: &Output, code: i32, needle: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line on stderr: {stderr:?}");
    assert!(stderr.starts_with("error: ") && stderr.contains(needle), "{stderr:?} should mention {needle:?}");
}

fn nodes_commands(c: &Cluster) {
    assert_eq!(c.ok(&["create", "-p", "/cli/nodes/a", "hello"]).trim(), "/cli/nodes/a");
    assert_eq!(c.ok(&["get", "/cli/nodes/a"]), "hello", "raw data, no newline when piped");
    let with_stat = c.ok(&["get", "-w", "/cli/nodes/a"]);
    assert!(with_stat.starts_with("hello\n") && with_stat.contains("version: 0"), "{with_stat}");
    // Compare-and-swap: the right version passes, a stale one fails with one line.
    assert_eq!(c.ok(&["set", "/cli/nodes/a", "v1", "--version", "0"]).trim(), "/cli/nodes/a version 1");
    assert_fails(&c.run(&["set", "/cli/nodes/a", "v2", "--version", "0"], None), 1, "version mismatch");
    assert_eq!(c.ok(&["get", "/cli/nodes/a"]), "v1");
    c.ok(&["create", "/cli/nodes/b"]);
    let sequential = c.ok(&["create", "-s", "/cli/nodes/seq-", "x"]);
    assert!(sequential.trim().starts_with("/cli/nodes/seq-00"), "{sequential}");
    assert_eq!(c.ok(&["ls", "/cli/nodes"]).lines().collect::<Vec<_>>(), ["a", "b", sequential.trim().trim_start_matches("/cli/nodes/")]);
    let long = c.ok(&["ls", "-l", "/cli/nodes"]);
    assert!(long.lines().next().is_some_and(|l| l.starts_with("persistent") && l.ends_with(" a")), "{long}");
    let stat = c.ok(&["stat", "/cli/nodes"]);
    assert!(stat.contains("path: /cli/nodes") && stat.contains("num_children: 3"), "{stat}");
    assert_fails(&c.run(&["rm", "/cli/nodes"], None), 1, "has children");
    assert_fails(&c.run(&["create", "/cli/nodes/a"], None), 1, "already exists");
    assert!(c.ok(&["rm", "-r", "/cli/nodes"]).starts_with("deleted 4 nodes"));
    assert_fails(&c.run(&["get", "/cli/nodes/a"], None), 1, "/cli/nodes/a: node does not exist");
    // Data from stdin, TTL and container nodes.
    let out = c.run(&["create", "-p", "/cli/kinds/stdin", "-"], Some("from stdin"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(c.ok(&["get", "/cli/kinds/stdin"]), "from stdin");
    c.ok(&["create", "--ttl", "60000", "/cli/kinds/ttl"]);
    c.ok(&["create", "--container", "/cli/kinds/box"]);
    assert_eq!(c.json(&["stat", "/cli/kinds/ttl"])["stat"]["kind"], "ttl");
    assert_eq!(c.json(&["stat", "/cli/kinds/box"])["stat"]["kind"], "container");
}

fn nonexistent_node(c: &Cluster) {
    assert_fails(&c.run(&["get", "/no/such/node"], None), 1, "error: /no/such/node: node does not exist");
    assert_fails(&c.run(&["stat", "/no/such/node"], None), 1, "node does not exist");
    assert_fails(&c.run(&["ls", "/no/such/node"], None), 1, "node does not exist");
    assert_fails(&c.run(&["create", "/no/such/node"], None), 1, "does not exist");
    let usage = c.run(&["set", "/only-a-path"], None);
    assert_eq!(usage.status.code(), Some(2), "usage errors exit 2");
}

fn json_output(c: &Cluster) {
    let created = c.json(&["create", "-p", "/cli/json/a", "data"]);
    assert_eq!(created["path"], "/cli/json/a");
    let got = c.json(&["get", "-w", "/cli/json/a"]);
    assert_eq!(got["data"], "data");
    assert_eq!(got["stat"]["version"], 0);
    let set = c.json(&["set", "/cli/json/a", "more", "--version", "0"]);
    assert_eq!(set["stat"]["version"], 1);
    c.ok(&["create", "/cli/json/b"]);
    let children = c.json_lines(&["ls", "-l", "/cli/json"]);
    assert_eq!(children.len(), 2);
    assert_eq!(children[0]["name"], "a");
    assert_eq!(children[1]["path"], "/cli/json/b");
    assert_eq!(children[0]["stat"]["data_length"], 4);
    let stat = c.json(&["stat", "/cli/json"]);
    assert_eq!(stat["stat"]["num_children"], 2);
    assert_eq!(c.json(&["rm", "-r", "/cli/json"])["deleted"], 3);
}

fn txn_from_stdin(c: &Cluster) {
    c.ok(&["create", "-p", "/cli/txn/a", "old"]);
    let input = "# a documented example\ncompare version /cli/txn/a = 0\ncompare missing /cli/txn/c\nthen set /cli/txn/a new-data\nthen create /cli/txn/c \"two words\"\nelse get /cli/txn/a\n";
    let out = c.run(&["txn"], Some(input));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    assert!(printed.starts_with("SUCCEEDED"), "{printed}");
    assert!(printed.contains("set: version 1") && printed.contains("created /cli/txn/c"), "{printed}");
    assert_eq!(c.ok(&["get", "/cli/txn/c"]), "two words");
    // Same again: the compares fail now and `else` runs.
    let out = c.run(&["--json", "txn"], Some(input));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(result["succeeded"], false);
    assert_eq!(result["results"][0]["op"], "get");
    assert_eq!(result["results"][0]["node"]["data"], "new-data");
    // A malformed input is a usage error, naming its line.
    assert_fails(&c.run(&["txn"], Some("compare version /cli/txn/a = 1\nthen fly /x\n")), 2, "txn line 2");
}

fn watch_count(c: &Cluster) {
    // History: replayed from the node's creation.
    let created = c.json(&["create", "-p", "/cli/watch/w", "0"]);
    c.ok(&["set", "/cli/watch/w", "1"]);
    c.ok(&["set", "/cli/watch/w", "2"]);
    let from = created["stat"]["create_revision"].as_u64().expect("create revision").to_string();
    let events = c.json_lines(&["watch", "/cli/watch/w", "--rev", &from, "--count", "3"]);
    let kinds: Vec<_> = events.iter().map(|e| (e["type"].as_str().unwrap_or("").to_string(), e["data"].as_str().unwrap_or("").to_string())).collect();
    assert_eq!(kinds, [("created".to_string(), "0".to_string()), ("changed".into(), "1".into()), ("changed".into(), "2".into())]);
    // Live, recursive, human-readable: from the revision after the two sets, so the events
    // written next are reported even if they come before the watch is registered.
    let next = (created["stat"]["create_revision"].as_u64().expect("revision") + 3).to_string();
    let (mut watch, mut lines) = c.spawn(&["watch", "-r", "/cli/watch", "--rev", &next, "--count", "2"]);
    c.ok(&["create", "/cli/watch/x", "hi"]);
    c.ok(&["rm", "/cli/watch/x"]);
    let first = lines.line(Duration::from_secs(20));
    assert!(first.starts_with("CREATED /cli/watch/x rev ") && first.ends_with("\"hi\""), "{first}");
    assert!(lines.line(Duration::from_secs(20)).starts_with("DELETED /cli/watch/x"));
    assert_eq!(wait_within(&mut watch.0, COMMAND_DEADLINE).status.code(), Some(0), "exits after --count events");
}

fn lock_runs_the_command_with_its_token(c: &Cluster) {
    let out = c.run(&["lock", "/cli/locks/one", "--", "sh", "-c", "echo token=$WARDEN_FENCING_TOKEN path=$WARDEN_LOCK_PATH; exit 3"], None);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "the command's exit status; stdout {stdout} stderr {}", text(&out.stderr));
    let token = stdout.lines().find_map(|l| l.strip_prefix("token=")).expect("the command ran");
    let (token, path) = token.split_once(" path=").expect("both variables");
    let token: u64 = token.parse().unwrap_or_else(|_| panic!("a numeric token: {stdout}"));
    assert!(token > 0);
    assert_eq!(path, "/cli/locks/one");
    assert!(text(&out.stderr).contains(&format!("(fencing token {token})")), "{}", text(&out.stderr));
    // Released: a second holder gets it at once, with a higher token.
    let again = c.run(&["--json", "lock", "/cli/locks/one", "--", "true"], None);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let again = json_events(&again.stderr);
    assert_eq!(again.len(), 2, "acquired and released: {again:?}");
    assert_eq!(again[1]["event"], "released");
    let again = &again[0];
    assert!(again["fencing_token"].as_u64().expect("token") > token, "{again}");
    // A command that cannot run.
    let missing = c.run(&["lock", "/cli/locks/one", "--", "/no/such/program"], None);
    assert_eq!(missing.status.code(), Some(127), "{}", text(&missing.stderr));
}

/// The `{"event": …}` JSON objects among the lines of `stderr` (log lines are skipped).
fn json_events(stderr: &[u8]) -> Vec<Value> {
    text(stderr).lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()).filter(|value| value.get("event").is_some()).collect()
}

/// `warden lock /x -- cmd | consumer` hands the consumer exactly the
/// command's output; warden's own "acquired"/"released" lines (text or `--json`) go to
/// stderr, as `flock` and `consul lock` do.
fn lock_leaves_the_commands_stdout_its_own(c: &Cluster) {
    let out = c.run(&["lock", "/cli/locks/stdout", "--", "printf", "exact bytes"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "exact bytes", "nothing but the command's own output on stdout");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("acquired /cli/locks/stdout (fencing token ") && stderr.contains("released /cli/locks/stdout"), "{stderr}");
    let out = c.run(&["--json", "lock", "/cli/locks/stdout", "--", "printf", "exact bytes"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "exact bytes", "nothing but the command's own output on stdout with --json");
    let events: Vec<Value> = json_events(&out.stderr).into_iter().map(|e| e["event"].clone()).collect();
    assert_eq!(events, ["acquired", "released"], "{}", text(&out.stderr));
}

fn lock_waits_for_the_holder(c: &Cluster) {
    let stamp = |name: &str| format!("date +%s%N > {}", c.path(name).display());
    let first_script = format!("{}; sleep 3; {}", stamp("first-start"), stamp("first-end"));
    let (mut first, _first_lines) = c.spawn(&["lock", "/cli/locks/two", "--", "sh", "-c", &first_script]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.path("first-start").exists() {
        assert!(Instant::now() < deadline, "the first holder never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second_script = stamp("second-start");
    let (mut second, _second_lines) = c.spawn(&["lock", "/cli/locks/two", "--", "sh", "-c", &second_script]);
    assert_eq!(wait_within(&mut first.0, COMMAND_DEADLINE).status.code(), Some(0));
    assert_eq!(wait_within(&mut second.0, COMMAND_DEADLINE).status.code(), Some(0));
    let read = |name: &str| -> u128 { std::fs::read_to_string(c.path(name)).expect(name).trim().parse().expect("a timestamp") };
    let (first_end, second_start) = (read("first-end"), read("second-start"));
    assert!(second_start >= first_end, "the second command ran at {second_start}, before the first ended at {first_end}");
}

fn lock_lost_or_stopped_ends_the_command(c: &Cluster) {
    // The holding session is closed behind the command's back: the command is killed.
    let (mut lost, mut lines) = c.spawn_reading_stderr(&["--json", "lock", "--session-ttl", "3000", "/cli/locks/three", "--", "sleep", "60"]);
    let acquired: Value = serde_json::from_str(&lines.line(Duration::from_secs(20))).expect("JSON");
    let session = acquired["session_id"].as_str().expect("session id").to_string();
    c.ok(&["session", "close", &session]);
    // Killed within a keepalive or two; only the wait's deadline bounds it (a tighter bound
    // would flake on a loaded machine).
    assert_eq!(wait_within(&mut lost.0, Duration::from_secs(20)).status.code(), Some(1), "lock lost: exit 1");
    // SIGTERM is passed on to the command (killed by signal 15: 128 + 15), and the lock released.
    let (mut stopped, mut lines) = c.spawn_reading_stderr(&["lock", "/cli/locks/three", "--", "sleep", "60"]);
    assert!(lines.line(Duration::from_secs(20)).starts_with("acquired /cli/locks/three"));
    assert_eq!(stopped.terminate(), Some(143));
    let out = c.run(&["lock", "--wait", "5000", "/cli/locks/three", "--", "true"], None);
    assert!(out.status.success(), "released after the stop: {}", text(&out.stderr));
}

/// With no `RUST_LOG`, servers log at `info` the events an operator
/// needs; the dev cluster's log names each leader its groups elected (it was silent before).
fn servers_log_leader_changes_by_default(c: &Cluster) {
    let log = std::fs::read_to_string(c.path("dev.log")).expect("dev.log");
    let leaders = log.lines().filter(|line| line.contains(" INFO ") && line.contains("became leader")).count();
    assert!(leaders >= 4, "a leader line per group (placement, /, /config, /teams/…): {leaders} in\n{log}");
}

fn sessions(c: &Cluster) {
    // Homed in the group of its ephemeral, which is where `session info` counts ephemerals.
    let (mut keeper, mut lines) = c.spawn(&["--json", "session", "create", "--ttl", "6000", "--path-hint", "/cli/sessions"]);
    let created: Value = serde_json::from_str(&lines.line(Duration::from_secs(20))).expect("JSON");
    let id = created["session_id"].as_str().expect("id").to_string();
    assert!(id.starts_with("0x"), "{id}");
    let info = c.json(&["session", "info", &id]);
    assert_eq!(info["alive"], true);
    assert_eq!(c.ok(&["create", "-p", "--session", &id, "/cli/sessions/eph"]).trim(), "/cli/sessions/eph");
    assert_eq!(c.json(&["stat", "/cli/sessions/eph"])["stat"]["ephemeral_owner"], id.as_str());
    assert_eq!(c.json(&["session", "info", &id])["ephemerals"], 1);
    assert_eq!(c.json(&["session", "keepalive", &id])["alive"], true);
    assert!(c.ok(&["session", "close", &id]).contains("1 ephemeral nodes deleted"));
    assert_fails(&c.run(&["get", "/cli/sessions/eph"], None), 1, "node does not exist");
    keeper.terminate();
    // `create --ephemeral` holds its own session until stopped.
    let (mut holder, mut lines) = c.spawn(&["create", "--ephemeral", "/cli/sessions/mine", "here"]);
    assert_eq!(lines.line(Duration::from_secs(20)), "/cli/sessions/mine");
    assert_eq!(c.json(&["stat", "/cli/sessions/mine"])["stat"]["kind"], "ephemeral");
    assert_eq!(holder.terminate(), Some(0));
    assert_fails(&c.run(&["get", "/cli/sessions/mine"], None), 1, "node does not exist");
}

fn status(c: &Cluster) {
    let status = c.json(&["status", "--nodes", &c.nodes]);
    assert_eq!(status["nodes"].as_array().map(Vec::len), Some(5), "{status}");
    assert!(status["nodes"].as_array().is_some_and(|n| n.iter().all(|n| n["up"] == true)), "{status}");
    let routes: Vec<&str> = status["routes"].as_array().expect("routes").iter().filter_map(|r| r["prefix"].as_str()).collect();
    for prefix in ["/", "/config", "/teams/payments", "/teams/search"] {
        assert!(routes.contains(&prefix), "{prefix} in {routes:?}");
    }
    let groups = status["groups"].as_array().expect("groups");
    let root = groups.iter().find(|g| g["prefix"] == "/").expect("the root group");
    assert_eq!(root["replicas"].as_array().map(Vec::len), Some(5));
    assert!(root["leader"].as_u64().is_some(), "the root group's leader is known: {root}");
    let states = root["replica_states"].as_array().expect("replica states");
    assert!(states.len() == 5 && states.iter().all(|r| r["lag"].is_u64()), "each replica's lag: {root}");
    assert_eq!(status["healthy"], true, "a dev cluster with every node up is healthy (exit 0): {status}");
    let human = c.ok(&["status", "--nodes", &c.nodes]);
    assert!(human.contains("nodes (5):") && human.contains("routes (") && human.contains("/teams/payments"), "{human}");
    assert!(human.contains("healthy: every group has a leader") && human.contains(" lag "), "{human}");
    let listed = c.ok(&["admin", "routes", "--seeds", &c.nodes]);
    assert!(listed.lines().any(|l| l.starts_with("/teams/search")), "{listed}");
    let groups = c.ok(&["--json", "admin", "groups", "--seeds", &c.nodes]);
    assert!(groups.lines().all(|l| serde_json::from_str::<Value>(l).is_ok()) && groups.lines().count() >= 4, "{groups}");
    let hot = c.json(&["status", "--hot", "--hot-window-ms", "200", "--nodes", &c.nodes]);
    assert!(hot["hot"].is_array() && hot["window_ms"] == 200, "{hot}");
}

/// `warden admin split` moves a subtree with its nodes to a new group, served at once, and
/// `warden admin merge` moves it back.
fn split(c: &Cluster) {
    c.ok(&["create", "-p", "/cli/split/a/x", "kept"]);
    let answer = c.ok(&["admin", "split", "/cli/split/a", "--seeds", &c.nodes]);
    assert!(answer.contains("serves /cli/split/a"), "{answer}");
    assert_eq!(c.ok(&["get", "/cli/split/a/x"]), "kept");
    let routes = c.ok(&["admin", "routes", "--seeds", &c.nodes]);
    assert!(routes.lines().any(|l| l.starts_with("/cli/split/a ")), "{routes}");
    // `warden admin merge` gives it back to the parent path's group and removes the group.
    c.ok(&["set", "/cli/split/a/x", "written between"]);
    let answer = c.ok(&["admin", "merge", "/cli/split/a", "--seeds", &c.nodes]);
    assert!(answer.contains("is served by group") && answer.contains("with its data"), "{answer}");
    assert_eq!(c.ok(&["get", "/cli/split/a/x"]), "written between");
    let routes = c.ok(&["admin", "routes", "--seeds", &c.nodes]);
    assert!(!routes.lines().any(|l| l.starts_with("/cli/split/a ")), "{routes}");
}

/// `warden admin quota`: a limit refuses the write past it (exit 1, naming the quota), `list`
/// shows limits and usage, and `remove` lifts it.
fn quota(c: &Cluster) {
    c.ok(&["create", "-p", "/cli/quota/a"]);
    let set = c.json(&["admin", "quota", "set", "/cli/quota", "--nodes", "3", "--bytes", "100", "--seeds", &c.nodes]);
    assert_eq!(
        (set["prefix"].as_str(), set["nodes"]["limit"].as_u64(), set["nodes"]["usage"].as_u64()),
        (Some("/cli/quota"), Some(3), Some(2)),
        "{set}"
    );
    c.ok(&["create", "/cli/quota/b", "x"]);
    assert_fails(&c.run(&["create", "/cli/quota/c"], None), 1, "nodes quota of /cli/quota (3)");
    let listed = c.json_lines(&["admin", "quota", "list", "--seeds", &c.nodes]);
    let quota = listed.iter().find(|q| q["prefix"] == "/cli/quota").unwrap_or_else(|| panic!("listed: {listed:?}"));
    assert_eq!(
        (quota["nodes"]["usage"].as_u64(), quota["bytes"]["usage"].as_u64(), quota["sessions"]["limit"].as_u64()),
        (Some(3), Some(1), None),
        "{quota}"
    );
    let human = c.ok(&["admin", "quota", "list", "--seeds", &c.nodes]);
    assert!(human.lines().any(|l| l.starts_with("/cli/quota\tnodes 3/3\tbytes 1/100")), "{human}");
    assert!(c.ok(&["admin", "quota", "remove", "/cli/quota", "--seeds", &c.nodes]).contains("quota removed"));
    c.ok(&["create", "/cli/quota/c"]);
}

/// `GET /metrics` on `port` (a plain HTTP/1.0 exchange): the body.
fn scrape(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("metrics on {port}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("response");
    assert!(answer.starts_with("HTTP/1.") && answer.contains(" 200 "), "{answer}");
    answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// The sum of the samples named exactly `series` (name and labels) in scraped `texts`.
fn sum_of(texts: &[String], series: &str) -> f64 {
    texts
        .iter()
        .flat_map(|text| text.lines())
        .filter_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .filter_map(|value| value.trim().parse::<f64>().ok())
        .sum()
}

/// Prometheus metrics of `warden dev`: scraped before and after 20 creates through
/// the router, they account for the work: at least 20 more proposals committed over the
/// nodes and applied, 20 more `Create` calls answered OK by the router, fsyncs timed, every group's
/// replicas hosted, and placement's groups reported by its leader alone.
fn metrics(c: &Cluster) {
    let nodes = |c: &Cluster| (0..5).map(|i| scrape(c.base + METRICS_OFFSET + i)).collect::<Vec<_>>();
    let router = |c: &Cluster| vec![scrape(c.base + METRICS_OFFSET - 1)];
    let committed = "warden_raft_proposals_total{outcome=\"committed\"}";
    let creates = "warden_router_requests_total{code=\"Ok\",method=\"create\"}";
    let (nodes_before, router_before) = (nodes(c), router(c));
    for i in 0..20 {
        c.ok(&["create", "-p", &format!("/cli/metrics/n{i}")]);
    }
    let (nodes_after, router_after) = (nodes(c), router(c));
    assert!(sum_of(&nodes_after, committed) >= sum_of(&nodes_before, committed) + 20.0, "{nodes_after:?}");
    assert!(sum_of(&router_after, creates) >= sum_of(&router_before, creates) + 20.0, "{router_after:?}");
    assert!(sum_of(&nodes_after, "warden_storage_fsync_seconds_count") > sum_of(&nodes_before, "warden_storage_fsync_seconds_count"));
    assert!(sum_of(&nodes_after, "warden_raft_apply_seconds_count") >= sum_of(&nodes_before, "warden_raft_apply_seconds_count") + 20.0);
    // Each create's leader applied it before answering.
    let applied = "warden_raft_entries_applied_total";
    assert!(sum_of(&nodes_after, applied) >= sum_of(&nodes_before, applied) + 20.0, "{nodes_after:?}");
    assert!(sum_of(&nodes_after, "warden_storage_fsyncs_total") >= 1.0 && sum_of(&nodes_after, "warden_storage_sst_bytes") >= 0.0);
    // Every group's replicas are hosted, and the placement group's three: waited for, since a
    // replica of a group an earlier step merged away goes only when its node next hears of it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let status = c.json(&["status", "--nodes", &c.nodes]);
        let replicas: usize = status["groups"].as_array().expect("groups").iter().filter_map(|g| g["replicas"].as_array()).map(Vec::len).sum();
        let nodes_now = nodes(c);
        if sum_of(&nodes_now, "warden_raft_groups{role=\"hosted\"}") == (replicas + 3) as f64 {
            assert_eq!(sum_of(&nodes_now, "warden_raft_groups{role=\"leaderless\"}"), 0.0);
            break status;
        }
        assert!(Instant::now() < deadline, "hosted replicas never matched the status's: {status} {nodes_now:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let groups = status["groups"].as_array().expect("groups");
    let ready = groups.iter().filter(|g| g["ready"] == true && g["retired"] == false && g["merging_into"] == 0).count();
    // The placement leader refreshes its gauges every 5 s.
    while sum_of(&nodes(c), "warden_placement_groups{state=\"ready\"}") != ready as f64 {
        assert!(Instant::now() < deadline, "placement's ready groups never reported as {ready}: {:?}", nodes(c));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(router_after[0].contains("warden_router_routing_table_version "), "{}", router_after[0]);
    // Every metric deploy/'s alerts and dashboard name is one a node or the router exports.
    let exported: Vec<&str> =
        nodes_after.iter().chain(&router_after).flat_map(|t| t.lines()).filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    for file in ["alerts.yml", "alerts_test.yml", "grafana-dashboard.json"] {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(file)).expect("deploy file");
        for name in metric_names(&text) {
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(b))).unwrap_or(&name);
            assert!(exported.contains(&base), "deploy/{file} names {name}, which nothing exports");
        }
    }
}

/// The `warden_…` metric names in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("warden_") {
        let name: String = rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// `warden admin limits`: `show` prints the cluster's apply limits (recorded at bootstrap),
/// `set` changes one and keeps the others, a bad value is refused (exit 1) and changes nothing.
fn limits(c: &Cluster) {
    let shown = c.json(&["admin", "limits", "show", "--seeds", &c.nodes]);
    let version = shown["version"].as_u64().unwrap_or_default();
    assert!(version >= 1 && shown["value_bytes_max"] == 1 << 20, "{shown}");
    let set = c.json(&["admin", "limits", "set", "--txn-ops-max", "64", "--seeds", &c.nodes]);
    assert_eq!(
        (set["version"].as_u64(), set["txn_ops_max"].as_u64(), &set["value_bytes_max"]),
        (Some(version + 1), Some(64), &shown["value_bytes_max"])
    );
    assert_fails(&c.run(&["admin", "limits", "set", "--txn-ops-max", "0", "--seeds", &c.nodes], None), 1, "txn_ops_max must be");
    let human = c.ok(&["admin", "limits", "show", "--seeds", &c.nodes]);
    assert!(human.lines().any(|l| l == "txn_ops_max 64"), "{human}");
    c.ok(&["admin", "limits", "set", "--txn-ops-max", "128", "--seeds", &c.nodes]);
}

fn elect(c: &Cluster) {
    let (mut alpha, mut alpha_lines) = c.spawn(&["elect", "/cli/elect/e", "alpha"]);
    assert!(alpha_lines.line(Duration::from_secs(20)).starts_with("elected leader of /cli/elect/e"));
    let observed = c.json(&["elect", "--observe", "--count", "1", "/cli/elect/e"]);
    assert_eq!(observed["leader"]["value"], "alpha");
    let (mut beta, mut beta_lines) = c.spawn(&["--json", "elect", "/cli/elect/e", "beta"]);
    assert!(beta_lines.next_line(Duration::from_secs(2)).is_none(), "beta leads while alpha does");
    assert_eq!(alpha.terminate(), Some(0));
    let elected: Value = serde_json::from_str(&beta_lines.line(Duration::from_secs(20))).expect("JSON");
    assert_eq!(elected["event"], "elected");
    assert_eq!(c.json(&["elect", "--observe", "--count", "1", "/cli/elect/e"])["leader"]["value"], "beta");
    assert_eq!(beta.terminate(), Some(0));
}

/// One named step of the command-line test.
type Step = (&'static str, fn(&Cluster));

#[test]
fn the_command_line_against_a_dev_cluster() {
    let mut cluster = Cluster::start();
    let steps: [Step; 17] = [
        ("nodes_commands", nodes_commands),
        ("nonexistent_node", nonexistent_node),
        ("json_output", json_output),
        ("txn_from_stdin", txn_from_stdin),
        ("watch_count", watch_count),
        ("lock_runs_the_command_with_its_token", lock_runs_the_command_with_its_token),
        ("lock_leaves_the_commands_stdout_its_own", lock_leaves_the_commands_stdout_its_own),
        ("lock_waits_for_the_holder", lock_waits_for_the_holder),
        ("lock_lost_or_stopped_ends_the_command", lock_lost_or_stopped_ends_the_command),
        ("servers_log_leader_changes_by_default", servers_log_leader_changes_by_default),
        ("sessions", sessions),
        ("status", status),
        ("split", split),
        ("quota", quota),
        ("limits", limits),
        ("metrics", metrics),
        ("elect", elect),
    ];
    let mut failed = Vec::new();
    for (name, step) in steps {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&cluster)));
        eprintln!("step {name}: {} in {:?}", if outcome.is_ok() { "ok" } else { "FAILED" }, started.elapsed());
        if outcome.is_err() {
            failed.push(name);
        }
    }
    if !failed.is_empty() {
        let exited = cluster.dev.0.try_wait();
        let log = std::fs::read_to_string(cluster.dir.path().join("dev.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        eprintln!("warden dev: exited {exited:?}; the end of its log:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
    }
    assert!(failed.is_empty(), "failed steps: {failed:?}");
}

/// `warden dev --secure`: TLS everywhere with a throwaway CA; the CLI works with the client
/// certificate it made (from `WARDEN_*` variables or flags) and with one `warden admin
/// certs` issues from the same CA, and fails without one.
#[test]
fn a_secure_dev_cluster_and_its_command_line() {
    let c = Cluster::start_with(true);
    c.ok(&["create", "/teams/payments/secure", "hello"]);
    assert_eq!(c.ok(&["get", "/teams/payments/secure"]), "hello");

    // Without a certificate: refused (the router speaks TLS only).
    let mut plain = c.command(&["get", "/teams/payments/secure"]);
    plain.env_remove("WARDEN_CA").env_remove("WARDEN_CERT").env_remove("WARDEN_KEY");
    let out = wait_within(&mut plain.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn"), COMMAND_DEADLINE);
    assert!(!out.status.success(), "a plaintext client is refused: {}", text(&out.stdout));

    // A certificate `warden admin certs` issues from the dev CA, given as flags.
    let tls = c.tls_env[0].1.parent().expect("tls dir").to_str().expect("utf8").to_string();
    let issued = c.ok(&["admin", "certs", "--dir", &tls, "--clients", "bob"]);
    assert!(issued.contains("warden://client/bob"), "{issued}");
    let (ca, cert, key) = (format!("{tls}/ca.pem"), format!("{tls}/client-bob.pem"), format!("{tls}/client-bob.key"));
    let as_bob = || {
        let mut as_bob = c.command(&["--ca", &ca, "--cert", &cert, "--key", &key, "get", "/teams/payments/secure"]);
        as_bob.env_remove("WARDEN_CA").env_remove("WARDEN_CERT").env_remove("WARDEN_KEY");
        wait_within(&mut as_bob.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn"), COMMAND_DEADLINE)
    };
    // Security is on: bob may read nothing until root grants it.
    let out = as_bob();
    assert!(!out.status.success() && text(&out.stderr).contains("permission denied"), "bob is refused: {}", text(&out.stderr));
    let granted = c.ok(&["admin", "acl", "grant", "/teams/payments", "bob", "read", "--seeds", &c.nodes]);
    assert!(granted.contains("acl version"), "{granted}");
    let listed = c.ok(&["admin", "acl", "list", "--seeds", &c.nodes]);
    assert!(listed.contains("/teams/payments\tbob\tread"), "{listed}");
    // In force once the router and the group's nodes heard of it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = as_bob();
        if out.status.success() || Instant::now() >= deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(out.status.success(), "bob reads once granted: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello");

    // Root's bearer token instead of a certificate, through the router.
    let token = std::fs::read_to_string(format!("{tls}/root.token")).expect("dev wrote root's token");
    let mut with_token = c.command(&["--ca", &ca, "--token", token.trim(), "get", "/teams/payments/secure"]);
    with_token.env_remove("WARDEN_CA").env_remove("WARDEN_CERT").env_remove("WARDEN_KEY");
    let out = wait_within(&mut with_token.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn"), COMMAND_DEADLINE);
    assert!(out.status.success(), "root's token reads: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello");

    // Administration on the nodes' client ports.
    let status = c.json(&["status", "--nodes", &c.nodes]);
    assert!(status["groups"].as_array().is_some_and(|groups| groups.len() >= 4), "{status}");
}
