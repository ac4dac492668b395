//! etcdctl's output from Warden's etcd API side by side with a real etcd: the same scripted
//! `etcdctl` commands (Debian's `etcdctl` 3.4) against a single-member etcd (Debian's `etcd`,
//! package `etcd-server`) and against a router's etcd port, their outputs compared after
//! normalising only what legitimately differs between two servers. Each normalisation is
//! [`Side::normalise`]'s or named where it is applied; where Warden differs on purpose
//! (docs/etcd.md), the test asserts the documented difference.

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::mpsc;

use serde_json::Value;

use crate::support::etcdctl::{etcdctl_command, RealEtcd};
use crate::support::routed::{cluster_with_groups, start_router_with_etcd, TIMEOUT};

/// What one `etcdctl` run printed: its exit code, standard output and standard error.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Printed {
    code: i32,
    out: String,
    err: String,
}

/// One server under test, and the names it chose that the other server chose otherwise.
struct Side {
    name: &'static str,
    addr: SocketAddr,
    /// Exact strings this side printed and their stand-ins: the lease IDs (hex and decimal)
    /// the script learned from its answers.
    chosen: Vec<(String, String)>,
}

impl Side {
    fn new(name: &'static str, addr: SocketAddr) -> Side {
        Side { name, addr, chosen: Vec::new() }
    }

    /// Runs `etcdctl ARGS` with `input` on its standard input, to completion.
    fn run(&self, args: &[&str], input: &str) -> Printed {
        use std::io::Write as _;
        let mut child = etcdctl_command(self.addr, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs (make setup installs it)");
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("etcdctl's input");
        let output = child.wait_with_output().expect("etcdctl ends");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        Printed { code: output.status.code().unwrap_or(-1), out: text(&output.stdout), err: text(&output.stderr) }
    }

    /// Runs `etcdctl ARGS` and answers what it printed, normalised.
    fn ctl(&self, args: &[&str]) -> Printed {
        self.ctl_with(args, "")
    }

    fn ctl_with(&self, args: &[&str], input: &str) -> Printed {
        let printed = self.run(args, input);
        Printed { code: printed.code, out: self.normalise(&printed.out), err: self.normalise_err(&printed.err) }
    }

    /// Remembers that `value` (printed by this side) stands for `label` in normalised output.
    fn choose(&mut self, value: impl ToString, label: &str) {
        self.chosen.push((value.to_string(), format!("<{label}>")));
    }

    /// What legitimately differs between two servers in text output:
    /// - the endpoint: each server listens on a port of its own;
    /// - lease IDs the script learned (`chosen`): each server picks its own (etcd from its
    ///   member id and a counter; Warden's is the session id, naming its home group:
    ///   docs/etcd.md, `Lease`);
    /// - timings: `took = …` (a health check's latency) and `remaining(…)` (a lease's time
    ///   left, read a moment after its grant);
    /// - the IDs in keys of etcd's lock and election recipes (`name/<lease in hex>`) whose
    ///   leases etcdctl grants itself, so the script cannot learn them first.
    fn normalise(&self, text: &str) -> String {
        let mut text = text.replace(&self.addr.to_string(), "<endpoint>");
        // Longest first: a decimal id may contain a shorter one.
        let mut chosen = self.chosen.clone();
        chosen.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        for (value, label) in &chosen {
            text = replace_token(&text, value, label);
        }
        let lines: Vec<String> = text.lines().map(normalise_line).collect();
        let mut joined = lines.join("\n");
        if text.ends_with('\n') {
            joined.push('\n');
        }
        joined
    }

    /// [`Self::normalise`], after dropping the log lines of etcd's Go client library
    /// (`{"level":"warn","ts":…,"target":"endpoint://client-<random uuid>/…"}`: a timestamp
    /// and a random client id per run). etcdctl's own messages (`Error: …`, a health
    /// verdict) stay.
    fn normalise_err(&self, text: &str) -> String {
        let kept: Vec<&str> = text.lines().filter(|line| !line.starts_with("{\"level\":")).collect();
        self.normalise(&kept.iter().map(|line| format!("{line}\n")).collect::<String>())
    }

    /// A JSON output (one document per line), normalised as [`Self::normalise_json`] says.
    fn json(&self, args: &[&str]) -> Vec<Value> {
        self.json_with(args, "")
    }

    fn json_with(&self, args: &[&str], input: &str) -> Vec<Value> {
        let printed = self.run(args, input);
        assert_eq!(printed.code, 0, "{}: etcdctl {args:?}: {}", self.name, printed.err);
        let documents = printed.out.lines().filter(|line| !line.trim().is_empty());
        documents
            .map(|line| {
                let mut value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: etcdctl {args:?} printed {line}: {e}", self.name));
                self.normalise_json(&mut value);
                value
            })
            .collect()
    }

    /// What legitimately differs in JSON output: besides what [`Self::normalise`] names
    /// (in strings),
    /// - `cluster_id` and `member_id` (and a member's `ID`, a status's `leader`): etcd draws
    ///   them at random when the cluster is formed; Warden's router derives its member id
    ///   from its address and answers one fixed cluster id (docs/etcd.md "Cluster.MemberList");
    /// - revisions (`revision`, `create_revision`, `mod_revision`, `raftIndex`,
    ///   `raftAppliedIndex`): each server counts its own history;
    /// - `raft_term`, `raftTerm`: the term of the answering member's raft, which moves with
    ///   elections (etcd's single member starts at 2); Warden's router belongs to no raft
    ///   group and puts 0 in headers, which etcdctl's JSON leaves out: the field is removed;
    /// - `took`: a latency;
    /// - lease IDs (`lease`, `id`): chosen by each server, mapped to the names `chosen` has.
    fn normalise_json(&self, value: &mut Value) {
        match value {
            Value::Object(fields) => {
                fields.remove("raft_term");
                for (field, inner) in fields.iter_mut() {
                    match field.as_str() {
                        "cluster_id" | "member_id" | "ID" | "leader" | "revision" | "create_revision" | "mod_revision" | "raftIndex"
                        | "raftAppliedIndex" | "raftTerm" | "took" => *inner = Value::String(format!("<{field}>")),
                        "lease" | "id" => *inner = Value::String(self.normalise(&inner.to_string())),
                        _ => self.normalise_json(inner),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.normalise_json(item)),
            Value::String(text) => *text = self.normalise(text),
            _ => {}
        }
    }

    /// A long-running `etcdctl` (a campaign, an observer, a watch) whose output lines
    /// arrive on a channel.
    fn start(&self, args: &[&str]) -> Running {
        let mut child = etcdctl_command(self.addr, args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("etcdctl runs");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || std::io::BufReader::new(stdout).lines().map_while(Result::ok).try_for_each(|line| send.send(line)));
        Running { child, lines }
    }
}

/// `text` with each whole occurrence of `token` (not part of a longer run of letters and
/// digits) replaced by `by`.
fn replace_token(text: &str, token: &str, by: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(token) {
        out.push_str(&rest[..at]);
        let after = rest[at + token.len()..].chars().next();
        let whole = !out.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()) && !after.is_some_and(|c| c.is_ascii_alphanumeric());
        out.push_str(if whole { by } else { token });
        rest = &rest[at + token.len()..];
    }
    out.push_str(rest);
    out
}

/// One line with its timings and recipe lease IDs replaced (see [`Side::normalise`]).
fn normalise_line(line: &str) -> String {
    let mut line = line.to_string();
    // `-w fields`: IDs, revisions and the raft term, as in JSON (see `Side::normalise_json`).
    for field in ["ClusterID", "MemberID", "Revision", "RaftTerm", "CreateRevision", "ModRevision"] {
        if line.starts_with(&format!("\"{field}\" : ")) {
            line = format!("\"{field}\" : <{field}>");
        }
    }
    if let Some(at) = line.find("took = ") {
        line.replace_range(at + "took = ".len().., "<duration>");
    }
    if let Some(at) = line.find("remaining(") {
        let end = line[at..].find(')').map_or(line.len(), |end| at + end);
        line.replace_range(at + "remaining(".len()..end, "<s>");
    }
    // Keys of etcd's lock and election recipes: `name/<lease in hex>`.
    for name in [LOCK, ELECTION] {
        if let Some(id) = line.strip_prefix(&format!("{name}/")) {
            if !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                line = format!("{name}/<recipe lease>");
            }
        }
    }
    line
}

/// The lock name and the election name of the script.
const LOCK: &str = "/locks/x";
const ELECTION: &str = "/elect/web";

/// A long-running `etcdctl`; killed when dropped.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    /// Its next `count` lines (each within [`TIMEOUT`]).
    fn lines(&self, count: usize) -> Vec<String> {
        (0..count).map(|_| self.lines.recv_timeout(TIMEOUT).expect("a line from etcdctl in time")).collect()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The same run against both sides, normalised: asserts the two print the same and answers
/// it.
fn same(etcd: &Side, warden: &Side, args: &[&str]) -> Printed {
    same_with(etcd, warden, args, "")
}

fn same_with(etcd: &Side, warden: &Side, args: &[&str], input: &str) -> Printed {
    let (expected, got) = (etcd.ctl_with(args, input), warden.ctl_with(args, input));
    assert_eq!(got, expected, "etcdctl {args:?} (input {input:?}): Warden's output (left) differs from etcd's (right)");
    expected
}

/// The same JSON run against both sides, normalised (see [`Side::normalise_json`]).
fn same_json(etcd: &Side, warden: &Side, args: &[&str]) -> Vec<Value> {
    let (expected, got) = (etcd.json(args), warden.json(args));
    assert_eq!(got, expected, "etcdctl {args:?}: Warden's JSON (left) differs from etcd's (right)");
    expected
}

/// The revision `key` was last modified at on `side`.
fn mod_revision(side: &Side, key: &str) -> i64 {
    let printed = side.run(&["get", key, "-w", "json"], "");
    let value: Value = serde_json::from_str(printed.out.trim()).unwrap_or_else(|e| panic!("{}: get {key} printed {printed:?}: {e}", side.name));
    value["kvs"][0]["mod_revision"].as_i64().expect("a mod revision")
}

/// The revision in the header of a JSON answer, before normalisation.
fn header_revision(side: &Side, args: &[&str]) -> i64 {
    let printed = side.run(args, "");
    assert_eq!(printed.code, 0, "{}: etcdctl {args:?}: {}", side.name, printed.err);
    let value: Value = serde_json::from_str(printed.out.trim()).expect("JSON");
    value["header"]["revision"].as_i64().expect("a header revision")
}

fn printed(code: i32, out: &str, err: &str) -> Printed {
    Printed { code, out: out.into(), err: err.into() }
}

/// Scripts written for etcd with etcdctl — its text and JSON output, its exit codes and
/// error messages — read Warden's etcd API as they read etcd: the same commands against a
/// real single-member etcd and a Warden router print the same, once what two servers
/// legitimately choose differently (ports, IDs, revisions, timings) is normalised, and
/// differ only where docs/etcd.md says Warden does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_prints_the_same_for_warden_as_for_a_real_etcd() {
    let cluster = cluster_with_groups(&[]).await;
    let (_router, warden_addr) = start_router_with_etcd(&cluster);
    // Every etcdctl run blocks: off the runtime the cluster's tasks run on.
    tokio::task::spawn_blocking(move || script(warden_addr)).await.expect("the script");
}

fn script(warden_addr: SocketAddr) {
    let real = RealEtcd::start();
    let mut etcd = Side::new("etcd", real.addr);
    let mut warden = Side::new("Warden", warden_addr);
    let ok = printed(0, "OK\n", "");

    // Keys, prefixes, key-only and JSON reads.
    for (key, value) in [("/app/a", "1"), ("/app/b", "2"), ("/app/c/d", "3"), ("other", "x")] {
        assert_eq!(same(&etcd, &warden, &["put", key, value]), ok);
    }
    assert_eq!(same(&etcd, &warden, &["get", "--prefix", "/app/"]).out, "/app/a\n1\n/app/b\n2\n/app/c/d\n3\n");
    assert_eq!(same(&etcd, &warden, &["get", "--prefix", "/app/", "--keys-only"]).out, "/app/a\n\n/app/b\n\n/app/c/d\n\n");
    same(&etcd, &warden, &["get", "--from-key", "/app/b", "--keys-only"]);
    same(&etcd, &warden, &["get", "--prefix", "/app/", "--sort-by=MODIFY", "--order=DESCEND", "--limit=2"]);
    same_json(&etcd, &warden, &["get", "--prefix", "/app/", "-w", "json"]);
    same(&etcd, &warden, &["get", "/app/a", "-w", "fields"]);
    // A put answering the previous value; values only; a missing key; a refused put.
    let first_put = [&etcd, &warden].map(|side| mod_revision(side, "/app/a"));
    assert_eq!(same(&etcd, &warden, &["put", "/app/a", "11", "--prev-kv"]).out, "OK\n/app/a\n1\n");
    assert_eq!(same(&etcd, &warden, &["get", "--prefix", "/app/", "--limit", "1", "--print-value-only"]).out, "11\n");
    assert_eq!(same(&etcd, &warden, &["get", "/nope"]), printed(0, "", ""));
    assert_eq!(same(&etcd, &warden, &["put", "--ignore-value", "/missing"]), printed(1, "", "Error: etcdserver: key not found\n"));

    // Documented difference (docs/etcd.md, KV.Range `revision`): Warden keeps no older
    // versions, so a read at an older revision is refused as compacted where etcd answers
    // the value the key had then.
    let (etcd_rev, warden_rev) = (first_put[0].to_string(), first_put[1].to_string());
    assert_eq!(etcd.ctl(&["get", "/app/a", "--rev", &etcd_rev]), printed(0, "/app/a\n1\n", ""));
    let old = warden.ctl(&["get", "/app/a", "--rev", &warden_rev]);
    assert_eq!((old.code, old.out.as_str()), (1, ""), "{old:?}");
    assert!(old.err.contains("required revision has been compacted"), "{old:?}");

    // Transactions from standard input, down either branch, in text and JSON.
    let matching = "value(\"/app/a\") = \"11\"\n\nput /app/t yes\nget /app/a\n\nput /app/t no\n\n";
    assert_eq!(same_with(&etcd, &warden, &["txn"], matching).out, "SUCCESS\n\nOK\n\n/app/a\n11\n");
    let absent = "create(\"/app/t\") = \"0\"\n\nput /app/t again\n\nget /app/t\n\n";
    assert_eq!(same_with(&etcd, &warden, &["txn"], absent).out, "FAILURE\n\n/app/t\nyes\n");
    let txn_json = |side: &Side| side.json_with(&["txn", "-w", "json"], matching);
    let (expected, got) = (txn_json(&etcd), txn_json(&warden));
    assert_eq!(got, expected, "etcdctl txn -w json: Warden's JSON (left) differs from etcd's (right)");

    // Deletes: one key with its previous value, a missing key, a prefix.
    assert_eq!(same(&etcd, &warden, &["del", "/app/b", "--prev-kv"]).out, "1\n/app/b\n2\n");
    assert_eq!(same(&etcd, &warden, &["del", "/nope"]).out, "0\n");
    assert_eq!(same(&etcd, &warden, &["del", "--prefix", "/app/"]).out, "3\n");
    assert_eq!(same(&etcd, &warden, &["get", "--prefix", "/app/"]), printed(0, "", ""));

    // A lease with a key attached: granted, renewed once, its time to live, revoked.
    let mut leases = Vec::new();
    for side in [&mut etcd, &mut warden] {
        let granted = side.run(&["lease", "grant", "60"], "");
        let id = granted.out.split_whitespace().nth(1).unwrap_or_else(|| panic!("{}: lease grant printed {granted:?}", side.name)).to_string();
        side.choose(i64::from_str_radix(&id, 16).expect("a hex lease id"), "lease");
        side.choose(&id, "lease");
        assert_eq!(side.normalise(&granted.out), "lease <lease> granted with TTL(60s)\n", "{}", side.name);
        assert_eq!(side.ctl(&["put", "/app/leased", "v", &format!("--lease={id}")]), ok, "{}", side.name);
        leases.push(id);
    }
    let (etcd_lease, warden_lease) = (leases[0].as_str(), leases[1].as_str());
    // The same command on both sides, each naming its own lease last.
    let both = |words: &[&str]| {
        let run = |side: &Side, lease: &str| side.ctl(&[words, &[lease][..]].concat());
        let (expected, got) = (run(&etcd, etcd_lease), run(&warden, warden_lease));
        assert_eq!(got, expected, "etcdctl {words:?} LEASE: Warden's output (left) differs from etcd's (right)");
        expected
    };
    same_json(&etcd, &warden, &["get", "/app/leased", "-w", "json"]);
    assert_eq!(both(&["lease", "keep-alive", "--once"]).out, "lease <lease> keepalived with TTL(60)\n");
    assert_eq!(both(&["lease", "timetolive"]).out, "lease <lease> granted with TTL(60s), remaining(<s>)\n");
    let attached = both(&["lease", "timetolive", "--keys"]);
    assert_eq!(attached.out, "lease <lease> granted with TTL(60s), remaining(<s>), attached keys([/app/leased])\n");
    assert_eq!(same(&etcd, &warden, &["lease", "list"]).out, "found 1 leases\n<lease>\n");
    assert_eq!(both(&["lease", "revoke"]).out, "lease <lease> revoked\n");
    assert_eq!(same(&etcd, &warden, &["get", "/app/leased"]), printed(0, "", ""), "a revoked lease's key goes with it");
    assert_eq!(both(&["lease", "timetolive"]).out, "lease <lease> already expired\n");
    let renewed = both(&["lease", "keep-alive", "--once"]);
    assert_eq!((renewed.code, renewed.err.as_str()), (2, "Error: etcdserver: requested lease not found\n"), "{renewed:?}");
    let revoked = both(&["lease", "revoke"]);
    assert_eq!((revoked.code, revoked.err.as_str()), (1, "Error: failed to revoke lease (etcdserver: requested lease not found)\n"), "{revoked:?}");

    // etcd's lock recipe (`etcdctl lock`, over transactions, watches and leases): the command
    // runs holding the lock, with the lock's key in its environment; its exit status is
    // etcdctl's error.
    assert_eq!(same(&etcd, &warden, &["lock", LOCK, "echo", "held"]), printed(0, "held\n", ""));
    let key = same(&etcd, &warden, &["lock", LOCK, "--", "sh", "-c", "echo \"$ETCD_LOCK_KEY\""]);
    assert_eq!(key.out, format!("{LOCK}/<recipe lease>\n"));
    assert_eq!(same(&etcd, &warden, &["lock", LOCK, "--", "sh", "-c", "exit 3"]), printed(1, "", "Error: exit status 3\n"));

    // etcd's election recipe: a campaign prints its key and value once it leads; an
    // observer prints the leader's.
    let campaign = |side: &Side| {
        let candidate = side.start(&["elect", ELECTION, "web-1"]);
        let led = candidate.lines(2);
        let observer = side.start(&["elect", "-l", ELECTION]);
        let observed = observer.lines(2);
        (candidate, observer, led.iter().chain(&observed).map(|line| normalise_line(line)).collect::<Vec<_>>())
    };
    let ((etcd_candidate, etcd_observer, etcd_led), (warden_candidate, warden_observer, warden_led)) = (campaign(&etcd), campaign(&warden));
    assert_eq!(etcd_led, [format!("{ELECTION}/<recipe lease>"), "web-1".into(), format!("{ELECTION}/<recipe lease>"), "web-1".into()]);
    assert_eq!(warden_led, etcd_led, "etcdctl elect: Warden's output (left) differs from etcd's (right)");
    drop((etcd_candidate, etcd_observer, warden_candidate, warden_observer));

    // A prefix watch from a revision: every event from it on, with previous values; then a
    // live one.
    let mut starts = Vec::new();
    for side in [&etcd, &warden] {
        starts.push(header_revision(side, &["put", "/w/a", "1", "-w", "json"]).to_string());
        for args in [&["put", "/w/a", "2"][..], &["put", "/w/b", "3"], &["del", "/w/a"], &["put", "/x", "9"]] {
            assert_eq!(side.run(args, "").code, 0, "{}: etcdctl {args:?}", side.name);
        }
    }
    let watch = |side: &Side, start: &str| {
        let watcher = side.start(&["watch", "--prefix", "/w/", &format!("--rev={start}"), "--prev-kv"]);
        let mut lines = watcher.lines(16);
        assert_eq!(side.run(&["put", "/w/c", "4"], "").code, 0);
        lines.extend(watcher.lines(3));
        lines
    };
    let events = watch(&etcd, &starts[0]);
    let expected = "PUT,/w/a,1,PUT,/w/a,1,/w/a,2,PUT,/w/b,3,DELETE,/w/a,2,/w/a,,PUT,/w/c,4";
    assert_eq!(events.join(","), expected, "etcd's watch");
    assert_eq!(watch(&warden, &starts[1]), events, "etcdctl watch: Warden's output (left) differs from etcd's (right)");

    // Health: etcdctl prints its verdict on standard error, and in JSON.
    let health = same(&etcd, &warden, &["endpoint", "health"]);
    assert_eq!(health, printed(0, "", "<endpoint> is healthy: successfully committed proposal: took = <duration>\n"));
    same_json(&etcd, &warden, &["endpoint", "health", "-w", "json"]);

    // The member list: one member, the server reached, by the same fields. Documented
    // differences (docs/etcd.md, `Cluster.MemberList`): Warden's member is the router, named
    // after its id, with no peer URLs (routers have no raft peers).
    let members = |side: &Side| {
        let listed = side.json(&["member", "list", "-w", "json"]);
        listed[0]["members"].as_array().expect("members").clone()
    };
    let (etcd_members, warden_members) = (members(&etcd), members(&warden));
    assert_eq!((etcd_members.len(), warden_members.len()), (1, 1));
    let fields = |member: &Value| {
        let mut fields = member.as_object().expect("a member").keys().cloned().collect::<Vec<_>>();
        fields.sort();
        fields
    };
    assert_eq!(fields(&etcd_members[0]), ["ID", "clientURLs", "name", "peerURLs"]);
    assert_eq!(fields(&warden_members[0]), ["ID", "clientURLs", "name"], "no peer URLs");
    assert_eq!(warden_members[0]["clientURLs"], etcd_members[0]["clientURLs"], "its client URL: where etcdctl reached it");
    let simple = |side: &Side| side.ctl(&["member", "list"]).out.trim_end().split(", ").map(str::to_string).collect::<Vec<_>>();
    let (etcd_row, warden_row) = (simple(&etcd), simple(&warden));
    assert_eq!((etcd_row.len(), warden_row.len()), (6, 6), "{etcd_row:?} {warden_row:?}");
    for row in [&etcd_row, &warden_row] {
        assert!(u64::from_str_radix(&row[0], 16).is_ok(), "a hex member id: {row:?}");
        assert_eq!((row[1].as_str(), row[4].as_str(), row[5].as_str()), ("started", "http://<endpoint>", "false"), "{row:?}");
    }
    assert_eq!(warden_row[2], format!("warden-router-{}", warden_row[0]), "Warden's member is named after the router");
    assert_eq!(warden_row[3], "", "no peer URLs");

    // Status: the same fields but where docs/etcd.md says otherwise (version 3.5.0, db size
    // 0, which JSON leaves out, as the size in use).
    let status = |side: &Side| side.json(&["endpoint", "status", "-w", "json"])[0][0].clone();
    let (etcd_status, warden_status) = (status(&etcd), status(&warden));
    assert_eq!(warden_status["Status"]["version"], "3.5.0");
    let status_fields = |status: &Value| {
        let mut fields = status["Status"].as_object().expect("a status").clone();
        fields.remove("version");
        fields.remove("dbSize");
        fields.remove("dbSizeInUse");
        fields
    };
    assert!(etcd_status["Status"]["dbSize"].as_i64().is_some_and(|size| size > 0), "{etcd_status}");
    assert_eq!((warden_status["Status"].get("dbSize"), warden_status["Status"].get("dbSizeInUse")), (None, None), "{warden_status}");
    assert_eq!(status_fields(&warden_status), status_fields(&etcd_status), "endpoint status: Warden's fields (left) differ from etcd's (right)");
    assert_eq!(warden_status["Endpoint"], etcd_status["Endpoint"]);
}
