//! A few seconds of every `warden-loadgen` workload against an in-process cluster
//! (placement, two shard groups, a router), through the same entry point as the
//! `warden-loadgen` binary: each must complete operations and meet no error. The election
//! workload starts its candidates as `warden bench load` processes and kills the leader's.

use crate::support::routed::{cluster_with_groups, start_router};
use clap::Parser;
use warden_loadgen::election::CandidateCommand;
use warden_loadgen::options::LoadArgs;

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadArgs,
}

/// The load generator's options as its command line would give them.
fn load_args(router: &str, flags: &[&str]) -> LoadArgs {
    let base = ["warden-loadgen", "--endpoints", router, "--warmup", "0.3", "--key-space", "64", "--prefixes", "2", "--json"];
    Cli::try_parse_from(base.iter().chain(flags)).expect("valid flags").args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_completes_operations_without_errors_through_a_router() {
    let cluster = cluster_with_groups(&["/bench/p0", "/bench/p1"]).await;
    let router = start_router(&cluster, 0);
    let router_addr = router.addr.to_string();
    let candidates = CandidateCommand { program: env!("CARGO_BIN_EXE_warden").into(), args_prefix: vec!["bench".into(), "load".into()] };
    let runs: &[&[&str]] = &[
        &["put", "--clients", "8", "--duration", "1.5"],
        &["get", "--clients", "8", "--duration", "1.5"],
        &["get", "--clients", "8", "--duration", "1.5", "--consistency", "stale"],
        &["txn-cas", "--clients", "8", "--duration", "1.5"],
        &["create-delete", "--clients", "4", "--duration", "1.5"],
        &["lock", "--clients", "6", "--contention", "3", "--duration", "1.5"],
        &["session-keepalive", "--clients", "4", "--duration", "1.5"],
        &["watch", "--clients", "4", "--duration", "1.5"],
        &["mixed", "--clients", "8", "--duration", "1.5", "--read-ratio", "0.5"],
        // Open loop: a modest rate the cluster keeps up with.
        &["put", "--clients", "4", "--duration", "1.5", "--rate", "100"],
        // One failover: the leader's process is SIGKILLed, another candidate takes over
        // once the dead leader's session expires.
        &["election", "--clients", "2", "--total", "1", "--session-ttl-ms", "1000"],
    ];
    for flags in runs {
        let args = load_args(&router_addr, flags);
        let report = warden_loadgen::run_load(&args, &candidates, None).await.unwrap_or_else(|error| panic!("{flags:?}: {error}"));
        assert!(report.ops > 0, "{flags:?} completed no operation: {report:?}");
        assert_eq!(report.errors, 0, "{flags:?} met errors: {:?}", report.error_examples);
        assert!(report.p99_ms > 0.0 && report.p99_ms <= report.max_ms, "{flags:?}: p99 {} max {}", report.p99_ms, report.max_ms);
        if args.rate.is_some() {
            // 100 ops/s for 1.5 s: the open loop sent what was due, no more.
            assert!((100..=160).contains(&report.ops), "{flags:?}: {} ops at 100/s over 1.5 s", report.ops);
        }
    }
    drop(router);
}

#[test]
fn warden_bench_load_runs_a_workload_on_its_own_cluster_and_prints_json() {
    let data = tempfile::tempdir().expect("tempdir");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_warden"))
        .args(["bench", "load", "put", "--clients", "4", "--duration", "1", "--warmup", "0.3", "--key-space", "32", "--prefixes", "2", "--json"])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .expect("warden runs");
    assert!(output.status.success(), "warden bench load failed: {}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(report["workload"], "put");
    assert_eq!(report["target"], "warden");
    assert_eq!(report["errors"], 0);
    assert!(report["ops_per_sec"].as_f64().is_some_and(|rate| rate > 0.0));
    assert!(report["server_cpu_us_per_op"].as_f64().is_some_and(|cpu| cpu > 0.0), "CPU per op is reported: {report}");
}
