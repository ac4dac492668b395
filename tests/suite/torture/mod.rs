//! Torture runs, in the manner of Jepsen: seeded histories of six real `warden node`
//! processes on test hosts of their own (network namespaces on a bridge) behind a router,
//! the workload's clients (registers, creates, sequential nodes, ephemeral nodes, fenced
//! locks whose holders sometimes crash, native and through a second router's etcd API,
//! watches of registers and one recursive watch spanning every group) running through the router while the nemesis
//! partitions, isolates leaders, cuts links one way, slows and loses packets, pauses and
//! kills nodes, moves a subtree and steps or drifts a node's wall clock; then every history
//! is checked (linearizable registers, every acknowledged create kept, sequential counters
//! unique and increasing and each call's sequential node there once, ephemerals kept while their session's lease holds and gone after,
//! fenced holds exclusive, no lock granted within the lock-delay after its holder crashed,
//! every acknowledged register write delivered once and in order to watchers that follow it
//! across moves or resume from a revision, a subtree's quota never exceeded and a create it
//! refused absent) and its availability measured.
//!
//! - `nemesis`: fault kinds, seeded plans, applying and undoing a fault;
//! - `history`: one history from cluster start to verdict, and its files;
//! - `timeline`: the history's HTML timeline; `summary`: the table over a run.
//!
//! Each history writes `history.jsonl`, `schedule.json`, `verdict.json` and `timeline.html`
//! to `<out>/seed-<seed>/` with the processes' logs; a run writes
//! `summary.md` and `summary.json` to `<out>`. Knobs (environment variables; `make torture`
//! passes `SEED`, `HISTORIES`, `SECONDS`, `FAULTS`, `OUT` to them):
//! - `WARDEN_TORTURE_SEED`: the first history's seed (the others follow it); default: random,
//!   printed;
//! - `WARDEN_TORTURE_HISTORIES`, `WARDEN_TORTURE_SECONDS`: histories and the time their
//!   faults start in;
//! - `WARDEN_TORTURE_FAULTS`: fault kinds, comma-separated, or `all`;
//! - `WARDEN_TORTURE_OUT`: the run's folder (default `$CARGO_TARGET_DIR/torture/<seed>`).

mod history;
mod nemesis;
mod summary;
mod timeline;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use history::{HistorySpec, Verdict};
use nemesis::FaultKind;
use warden_torture::TestNet;

/// Nodes of a history, each on a test host of its own: one more than a group's five
/// replicas, so replicas can move (`move-replicas`, repair of a node marked down).
const NODES: u64 = 6;

fn knob(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

fn number_knob(name: &str, default: u64) -> u64 {
    knob(name).map_or(default, |text| text.trim().parse().unwrap_or_else(|e| panic!("{name}={text}: {e}")))
}

/// How a run is made, from the knobs with `histories` and `seconds` as defaults.
struct RunSpec {
    first_seed: u64,
    histories: u64,
    seconds: u64,
    kinds: Vec<FaultKind>,
    out: PathBuf,
}

impl RunSpec {
    /// The run the `WARDEN_TORTURE_*` knobs ask for; without `WARDEN_TORTURE_FAULTS`, the
    /// fault kinds `default_kinds`.
    fn from_knobs(histories: u64, seconds: u64, default_kinds: &[FaultKind]) -> RunSpec {
        let first_seed = number_knob("WARDEN_TORTURE_SEED", rand::random::<u32>().into());
        let kinds = match knob("WARDEN_TORTURE_FAULTS") {
            Some(list) => FaultKind::parse_list(&list).unwrap_or_else(|e| panic!("WARDEN_TORTURE_FAULTS: {e}")),
            None => default_kinds.to_vec(),
        };
        let default_out = || {
            let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
            target.join("torture").join(first_seed.to_string())
        };
        RunSpec {
            first_seed,
            histories: number_knob("WARDEN_TORTURE_HISTORIES", histories),
            seconds: number_knob("WARDEN_TORTURE_SECONDS", seconds),
            kinds,
            out: knob("WARDEN_TORTURE_OUT").map_or_else(default_out, PathBuf::from),
        }
    }

    /// Runs every history, one after the other on one network of test hosts, and writes the
    /// summary; panics after the last history if any found an anomaly.
    async fn run(&self) -> Vec<Verdict> {
        eprintln!(
            "torture run: seeds {}..{}, {} s of faults each, kinds {:?}, into {}",
            self.first_seed,
            self.first_seed + self.histories,
            self.seconds,
            self.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            self.out.display()
        );
        let net = Arc::new(TestNet::create(NODES as usize).expect("six test hosts (needs root and iproute2)"));
        let mut verdicts = Vec::new();
        for seed in self.first_seed..self.first_seed + self.histories {
            let spec = HistorySpec {
                seed,
                kinds: self.kinds.clone(),
                duration: Duration::from_secs(self.seconds),
                dir: self.out.join(format!("seed-{seed}")),
            };
            let verdict = history::run(net.clone(), &spec).await;
            eprintln!(
                "seed {seed}: {} faults, {} calls, {} anomalies ({})",
                verdict.faults.len(),
                verdict.operations,
                verdict.anomalies.len(),
                spec.dir.display()
            );
            verdicts.push(verdict);
        }
        let totals = summary::totals(&verdicts);
        let table = summary::markdown(&verdicts, &totals);
        std::fs::write(self.out.join("summary.md"), &table).expect("summary.md");
        let json = serde_json::json!({ "totals": totals, "histories": verdicts });
        std::fs::write(self.out.join("summary.json"), serde_json::to_string_pretty(&json).expect("json")).expect("summary.json");
        eprintln!("{table}");
        let failed: Vec<String> = verdicts.iter().filter(|v| !v.valid).map(|v| format!("seed {}: {:?}", v.seed, v.anomalies)).collect();
        assert!(failed.is_empty(), "anomalies found (files in {}):\n{}", self.out.display(), failed.join("\n"));
        verdicts
    }
}

/// The short run of `make test`: two histories, fault kinds drawn from a seed that changes
/// per run (printed; `WARDEN_TORTURE_SEED` repeats one). Each history must do enough for its
/// checks to mean something, and none may show an anomaly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_histories_under_partitions_pauses_and_kills_show_no_anomaly() {
    let verdicts = RunSpec::from_knobs(2, 25, &FaultKind::ALL).run().await;
    for verdict in &verdicts {
        assert!(!verdict.faults.is_empty(), "seed {}: no fault was applied", verdict.seed);
        assert!(verdict.register_ops > 100, "seed {}: {} register operations are too few to check", verdict.seed, verdict.register_ops);
        assert!(verdict.holds >= 3, "seed {}: {} lock holds are too few to check", verdict.seed, verdict.holds);
        assert!(verdict.etcd_holds >= 3, "seed {}: {} etcd lock holds are too few to check", verdict.seed, verdict.etcd_holds);
        assert!(verdict.etcd_leader_terms >= 3, "seed {}: {} etcd leader terms are too few to check", verdict.seed, verdict.etcd_leader_terms);
        let leased = (verdict.etcd_leased_keys_revoked, verdict.etcd_leased_keys_found);
        assert!(leased.0 >= 3 && leased.1 >= 3, "seed {}: etcd leased keys checked gone, found: {leased:?} are too few", verdict.seed);
        assert!(verdict.sequenced >= 10, "seed {}: {} sequential creates are too few to check", verdict.seed, verdict.sequenced);
        assert!(verdict.abandoned_holds >= 1, "seed {}: no holder crashed, so no lock-delay was checked", verdict.seed);
        assert!(verdict.ephemeral_reads >= 10, "seed {}: {} reads of ephemeral nodes are too few to check", verdict.seed, verdict.ephemeral_reads);
        assert!(verdict.watch_events >= 10, "seed {}: {} watch events are too few to check", verdict.seed, verdict.watch_events);
        assert!(verdict.etcd_watch_events >= 10, "seed {}: {} etcd watch events are too few to check", verdict.seed, verdict.etcd_watch_events);
        assert!(verdict.quota_refusals >= 1, "seed {}: the quota never refused a create, so its limit was not checked", verdict.seed);
    }
}

/// The long run (`make torture`): `WARDEN_TORTURE_HISTORIES` histories (default 100) of
/// `WARDEN_TORTURE_SECONDS` (default 30). Not in `make test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long torture run: `make torture`"]
async fn long_run() {
    RunSpec::from_knobs(100, 30, &FaultKind::ALL).run().await;
}
