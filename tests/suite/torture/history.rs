//! One history: a fresh cluster of six node processes on test hosts and a router, the
//! workload's clients running through the router, the nemesis playing a seeded plan of
//! faults, then every fault undone, the checks run, and the history, the faults and the
//! verdict written to the history's folder.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use warden_torture::TestNet;

use super::nemesis::{plan, Applied, FaultKind, Nemesis, Planned};
use super::timeline;
use crate::support::processes::{ClusterOptions, ProcessCluster};
use crate::support::routed::group_serving;
use crate::support::workload::{probes, Anomaly, Attempt, Checked, Workload, CALL_TIMEOUT, PREFIXES};

/// Quiet time after the last fault before the clients stop: the service settles and the
/// history ends with fault-free operations.
const SETTLE_AFTER: Duration = Duration::from_secs(3);

/// The part of a fault counted as "after the election": its first seconds are the time
/// groups take to notice and elect (up to two election timeouts of 1–2 s each and a call's
/// retry), so availability is measured from here to the fault's end.
pub const ELECTION_ALLOWANCE: Duration = Duration::from_secs(3);

/// How one history is run.
#[derive(Clone, Debug)]
pub struct HistorySpec {
    pub seed: u64,
    pub kinds: Vec<FaultKind>,
    /// Faults start within this time from the history's start.
    pub duration: Duration,
    /// Where its files go (made if missing).
    pub dir: PathBuf,
}

/// What one history did and what was found: the verdict.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Verdict {
    pub seed: u64,
    pub valid: bool,
    pub anomalies: Vec<Anomaly>,
    /// Calls made, and how many succeeded.
    pub operations: usize,
    pub succeeded: usize,
    pub creates: usize,
    pub sequenced: usize,
    pub holds: usize,
    /// Of them, holds taken through the etcd API.
    pub etcd_holds: usize,
    /// etcd election leaders' terms that wrote to the fenced resource.
    pub etcd_leader_terms: usize,
    /// etcd leased keys read gone after their lease's revoke, and found while it held.
    pub etcd_leased_keys_revoked: usize,
    pub etcd_leased_keys_found: usize,
    pub ephemeral_reads: usize,
    pub abandoned_holds: usize,
    pub register_ops: usize,
    /// Register changes the watchers delivered, their resumes from a revision, and watches
    /// that found their events compacted away (see `Checked`).
    pub watch_events: usize,
    /// Of them, those delivered through the etcd API.
    pub etcd_watch_events: usize,
    pub watch_resumes: usize,
    pub watch_compactions: usize,
    /// Creates the quota refused, and listings of its subtree checked.
    pub quota_refusals: usize,
    pub quota_listings: usize,
    pub faults: Vec<Applied>,
    pub availability: Availability,
    /// Milliseconds the history took, from the workload's start to its last call.
    pub length_ms: u64,
}

/// Availability measured from the history. A window is "up" when every group completed at
/// least one successful call in it: the clients go round the groups, so a group that stops
/// answering soon stops every client, and throughput alone would hide it (the other
/// clients get the CPU it frees).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Availability {
    /// Share of [`WINDOW`]s up with no fault on (from the second second of each quiet spell:
    /// the first belongs to the recovery from the fault before).
    pub fault_free_up_share: f64,
    /// Share of windows up during faults, after [`ELECTION_ALLOWANCE`].
    pub faulted_up_share: f64,
    /// `faulted_up_share / fault_free_up_share` (goal: at least 0.99).
    pub ratio: f64,
    /// Successful calls per second with no fault on, and during faults after the allowance.
    pub fault_free_ok_per_s: f64,
    pub faulted_ok_per_s: f64,
    /// For each isolation of a group's leader: milliseconds from the isolation to the first
    /// acknowledged write in that group invoked after it (`None`: none before the fault ended).
    pub leader_isolation_to_write_ms: Vec<Option<u64>>,
}

/// The length of the windows availability is counted in.
pub const WINDOW: Duration = Duration::from_millis(500);

/// Runs one history on `net` (a host per node) and writes its files; answers its verdict.
pub async fn run(net: Arc<TestNet>, spec: &HistorySpec) -> Verdict {
    std::fs::create_dir_all(&spec.dir).expect("the history's folder");
    let planned = plan(spec.seed, &spec.kinds, spec.duration);
    let options = ClusterOptions { nodes: super::NODES, hosts: Some(net.clone()), ..ClusterOptions::default() };
    let mut cluster = ProcessCluster::start_with(options, &PREFIXES).await;
    let mut router = cluster.router();
    let mut workload = Workload::start_with_quota(cluster.router_addr(), &cluster.placement_clients(CALL_TIMEOUT)).await;
    // Kept until the history ends (the process is killed when dropped).
    let (_etcd_router, _, etcd_addr) = cluster.start_etcd_router().await;
    workload.start_etcd_clients(&etcd_addr.to_string()).await;
    let mut group_of_prefix = BTreeMap::new();
    for probe in probes() {
        let prefix = probe.trim_end_matches("/probe").to_string();
        group_of_prefix.insert(prefix, group_serving(&mut router, probe).await);
    }
    let groups: Vec<u64> = group_of_prefix.values().copied().collect();

    let mut nemesis = Nemesis::new(net, spec.seed, groups.clone());
    let mut applied = Vec::new();
    let now_ms = |workload: &Workload| workload.now() / 1_000_000;
    for step in &planned {
        // The nemesis keeps to its plan's clock; a late start (a slow leader lookup) shifts
        // only this fault.
        tokio::time::sleep(Duration::from_millis(step.start_ms.saturating_sub(now_ms(&workload)))).await;
        let mut fault = nemesis.start(&mut cluster, step.kind).await;
        // From the moment the fault is in place (finding a leader to isolate takes a call).
        fault.start_ms = now_ms(&workload);
        workload.log(format!("{} ms: {}", fault.start_ms, fault.what));
        tokio::time::sleep(Duration::from_millis((step.start_ms + step.length_ms).saturating_sub(now_ms(&workload)))).await;
        nemesis.end(&mut cluster, &mut fault, now_ms(&workload)).await;
        applied.push(fault);
    }
    nemesis.finish(&mut applied).await;
    tokio::time::sleep(SETTLE_AFTER).await;
    // Every node back and caught up on the groups placed on it before the final reads.
    cluster.wait_all_caught_up().await;
    let name = format!("history of seed {}", spec.seed);
    let checked = workload.finish(&name).await;
    let group_of = |path: &str| group_of_prefix.iter().rev().find(|(prefix, _)| path.starts_with(prefix.as_str())).map(|(_, group)| *group);
    let availability = availability(&checked.attempts, &applied, checked.stopped_ns / 1_000_000, group_of);
    let length_ms = checked.attempts.iter().map(|a| a.completed_ns / 1_000_000).max().unwrap_or(0);
    let verdict = Verdict {
        seed: spec.seed,
        valid: checked.anomalies.is_empty(),
        anomalies: checked.anomalies.clone(),
        operations: checked.attempts.len(),
        succeeded: checked.attempts.iter().filter(|a| a.ok).count(),
        creates: checked.creates,
        sequenced: checked.sequenced,
        holds: checked.holds,
        etcd_holds: checked.etcd_holds,
        etcd_leader_terms: checked.etcd_leader_terms,
        etcd_leased_keys_revoked: checked.etcd_leased_keys_revoked,
        etcd_leased_keys_found: checked.etcd_leased_keys_found,
        ephemeral_reads: checked.ephemeral_reads,
        abandoned_holds: checked.abandoned_holds,
        register_ops: checked.register_ops,
        watch_events: checked.watch_events,
        etcd_watch_events: checked.etcd_watch_events,
        watch_resumes: checked.watch_resumes,
        watch_compactions: checked.watch_compactions,
        quota_refusals: checked.quota_refusals,
        quota_listings: checked.quota_listings,
        faults: applied,
        availability,
        length_ms,
    };
    write_files(&spec.dir, &planned, &checked, &verdict);
    cluster.copy_logs(&spec.dir);
    verdict
}

/// Availability (see [`Availability`]) of `attempts` around `faults`, until the clients were
/// stopped at `end_ms` (calls still running then are left alone, not counted); `group_of`
/// maps a path to its group.
fn availability(attempts: &[Attempt], faults: &[Applied], end_ms: u64, group_of: impl Fn(&str) -> Option<u64>) -> Availability {
    let allowance_ms = ELECTION_ALLOWANCE.as_millis() as u64;
    let window_ms = WINDOW.as_millis() as u64;
    // Spans [from, to) in ms: faults after the allowance, and quiet spells after their first second.
    let faulted: Vec<(u64, u64)> = faults.iter().map(|f| (f.start_ms + allowance_ms, f.end_ms)).filter(|(from, to)| from < to).collect();
    let mut quiet = Vec::new();
    let mut from = 0;
    for fault in faults {
        quiet.push((from + 1_000, fault.start_ms));
        from = fault.end_ms;
    }
    quiet.push((from + 1_000, end_ms));
    quiet.retain(|(from, to)| from < to);

    // Per window: the groups that completed a successful call in it.
    let groups: std::collections::BTreeSet<u64> = attempts.iter().filter_map(|a| group_of(&a.path)).collect();
    let mut served: BTreeMap<u64, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for attempt in attempts.iter().filter(|a| a.ok) {
        if let Some(group) = group_of(&attempt.path) {
            served.entry(attempt.completed_ns / 1_000_000 / window_ms).or_default().insert(group);
        }
    }
    let up_share = |spans: &[(u64, u64)]| {
        // Whole windows inside a span only.
        let windows: Vec<u64> = spans.iter().flat_map(|(from, to)| from.div_ceil(window_ms)..to / window_ms).collect();
        let up = windows.iter().filter(|w| served.get(w).is_some_and(|s| s.len() == groups.len())).count();
        if windows.is_empty() {
            1.0
        } else {
            up as f64 / windows.len() as f64
        }
    };
    let seconds = |spans: &[(u64, u64)]| spans.iter().map(|(from, to)| to - from).sum::<u64>() as f64 / 1_000.0;
    let in_spans = |spans: &[(u64, u64)], at_ms: u64| spans.iter().any(|(from, to)| (*from..*to).contains(&at_ms));
    let ok_per_s = |spans: &[(u64, u64)]| {
        let ok = attempts.iter().filter(|a| a.ok && in_spans(spans, a.completed_ns / 1_000_000)).count() as f64;
        if seconds(spans) > 0.0 {
            ok / seconds(spans)
        } else {
            0.0
        }
    };
    let (fault_free_up_share, faulted_up_share) = (up_share(&quiet), up_share(&faulted));
    let is_write = |a: &Attempt| matches!(a.kind, "set" | "cas" | "create" | "sequential");
    let leader_isolation_to_write_ms = faults
        .iter()
        .filter(|f| f.kind == FaultKind::IsolateGroupLeader)
        .map(|f| {
            let start_ns = f.start_ms * 1_000_000;
            attempts
                .iter()
                .filter(|a| a.ok && is_write(a) && a.invoked_ns >= start_ns && a.completed_ns <= f.end_ms * 1_000_000 && group_of(&a.path) == f.group)
                .map(|a| (a.completed_ns - start_ns) / 1_000_000)
                .min()
        })
        .collect();
    Availability {
        fault_free_up_share,
        faulted_up_share,
        ratio: if fault_free_up_share > 0.0 { faulted_up_share / fault_free_up_share } else { 0.0 },
        fault_free_ok_per_s: ok_per_s(&quiet),
        faulted_ok_per_s: ok_per_s(&faulted),
        leader_isolation_to_write_ms,
    }
}

/// `history.jsonl` (every call, every register operation with its input and output, every
/// fenced write, every watch event and compaction gap, every fault), `schedule.json` (the plan and what was applied),
/// `verdict.json` and `timeline.html`.
fn write_files(dir: &Path, planned: &[Planned], checked: &Checked, verdict: &Verdict) {
    let mut lines = Vec::new();
    for attempt in &checked.attempts {
        lines.push(serde_json::json!({ "type": "call", "call": attempt }));
    }
    for (client, invoked_ns, completed_ns, input, output) in &checked.records {
        let (input, output) = (format!("{input:?}"), output.as_ref().map(|o| format!("{o:?}")));
        lines.push(serde_json::json!({ "type": "register", "client": client, "invoked_ns": invoked_ns, "completed_ns": completed_ns, "input": input, "output": output }));
    }
    for write in &checked.fenced_writes {
        lines.push(serde_json::json!({ "type": "fenced-write", "write": write }));
    }
    for log in &checked.watch_logs {
        for event in &log.delivered {
            let value = String::from_utf8_lossy(&event.value);
            let (group, revision, received_ns) = (event.group, event.revision, event.received_ns);
            lines.push(serde_json::json!({ "type": "watch-event", "watcher": log.name, "group": group, "revision": revision, "value": value, "received_ns": received_ns }));
        }
        for error in &log.errors {
            let resume: BTreeMap<String, u64> = error.resume_revisions.iter().map(|(group, next)| (group.to_string(), *next)).collect();
            lines.push(serde_json::json!({ "type": "watch-error", "watcher": log.name, "at_ns": error.at_ns, "error": error.error, "resume_revisions": resume }));
        }
        for gap in &log.gaps {
            lines.push(serde_json::json!({ "type": "watch-gap", "watcher": log.name, "after_events": gap.after, "reopened_ns": gap.reopened_ns, "error": gap.error }));
        }
    }
    for fault in &verdict.faults {
        lines.push(serde_json::json!({ "type": "fault", "fault": fault }));
    }
    let mut history = std::io::BufWriter::new(std::fs::File::create(dir.join("history.jsonl")).expect("history.jsonl"));
    for line in lines {
        writeln!(history, "{line}").expect("write history.jsonl");
    }
    history.flush().expect("write history.jsonl");
    let schedule = serde_json::json!({ "seed": verdict.seed, "planned": planned, "applied": verdict.faults });
    let pretty = |value: &serde_json::Value| serde_json::to_string_pretty(value).expect("json");
    std::fs::write(dir.join("schedule.json"), pretty(&schedule)).expect("schedule.json");
    std::fs::write(dir.join("verdict.json"), pretty(&serde_json::to_value(verdict).expect("verdict"))).expect("verdict.json");
    std::fs::write(dir.join("timeline.html"), timeline::render(verdict, &checked.attempts)).expect("timeline.html");
}
