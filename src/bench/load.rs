//! `warden bench load`: `warden-loadgen`'s workloads (the same code, the same flags) against
//! an in-process 5-node cluster with a placement group, a shard group per `/bench/pN`
//! prefix and a router, all fsyncing to disk. (To drive a running cluster, or etcd or
//! ZooKeeper, use `warden-loadgen`: here `--endpoints` is the CLI's global flag and is set to
//! the in-process router.) Server CPU per operation counts the server threads of this process
//! (nodes, store writers, snapshot builders, RocksDB, the router: [`super::SERVER_THREADS`]),
//! not the load generator's.

use warden_loadgen::election::CandidateCommand;
use warden_loadgen::options::{prefix, LoadArgs};
use warden_loadgen::target::TargetKind;
use warden_loadgen::CpuScope;

/// Flags of `warden bench load`: the load generator's, plus the in-process cluster's.
#[derive(clap::Args)]
pub struct LoadBenchArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Shard groups of the in-process cluster, one per prefix `/bench/p0` … (default:
    /// `--prefixes`).
    #[arg(long)]
    groups: Option<usize>,
    #[command(flatten)]
    data_dir: super::DataDir,
}

/// Runs the workload and prints its report (the table, or `--json`).
pub async fn run(args: LoadBenchArgs) -> anyhow::Result<()> {
    let mut load = args.load;
    if let Some(name) = &load.candidate {
        return Ok(warden_loadgen::run_candidate(&load, name).await?);
    }
    load.validate()?;
    anyhow::ensure!(
        load.target == TargetKind::Warden,
        "warden bench load drives its in-process Warden cluster; use warden-loadgen for etcd or ZooKeeper"
    );
    let candidates = CandidateCommand { program: std::env::current_exe()?, args_prefix: vec!["bench".into(), "load".into()] };
    let root = args.data_dir.root();
    let prefixes: Vec<String> = (0..args.groups.unwrap_or(load.prefixes)).map(prefix).collect();
    let cluster = super::RoutedCluster::start(super::fresh_dir(&root, "load")?, &prefixes, false).await?;
    load.endpoints = vec![cluster.router_addr.to_string()];
    let cpu = CpuScope {
        pids: vec![std::process::id()],
        threads: super::server_threads(),
        scope: "in-process server threads: nodes, store writers, snapshots, RocksDB, router".into(),
    };
    let report = warden_loadgen::run_load(&load, &candidates, Some(cpu)).await;
    cluster.finish()?;
    let report = report?;
    if load.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
