//! `warden bench engine`: an in-process 5-node cluster (fsync on, 5 replicas per group),
//! closed-loop writers on every group, one JSON line per configuration. Server CPU per write
//! counts the cluster's threads ([`super::SERVER_THREADS`]), not the writers'.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use warden_engine::kv::{self, KvFactory};
use warden_shard_node::cluster::{Cluster, ClusterConfig};

use super::NODES;

/// Flags of `warden bench engine`.
#[derive(clap::Args)]
pub struct EngineArgs {
    /// Group counts to run, one configuration each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    groups: Vec<u64>,
    /// Closed-loop clients per group.
    #[arg(long, default_value_t = 1)]
    clients_per_group: usize,
    /// Measured seconds per configuration.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Unmeasured seconds before measuring.
    #[arg(long, default_value_t = 2)]
    warmup_seconds: u64,
    /// Bytes per written value.
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Host-loop threads per node.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    #[command(flatten)]
    data_dir: super::DataDir,
}

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs every configuration and a summary line with the ratios the targets are about.
pub async fn run(args: EngineArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    let mut results = Vec::new();
    for &groups in &args.groups {
        anyhow::ensure!(groups > 0, "--groups takes positive counts");
        let line = run_one(&args, &root, groups).await?;
        println!("{line}");
        results.push(line);
    }
    let find = |groups: u64| results.iter().find(|line| line["groups"] == groups);
    if let (Some(one), Some(many)) = (find(1), results.iter().max_by_key(|line| line["groups"].as_u64())) {
        let ratio = |field: &str| many[field].as_f64().unwrap_or(0.0) / one[field].as_f64().unwrap_or(f64::NAN);
        println!(
            "{}",
            json!({
                "bench": "engine_summary",
                "groups_max": many["groups"],
                "writes_per_sec_ratio_max_vs_1": ratio("writes_per_sec"),
                "fsyncs_per_sec_ratio_max_vs_1": ratio("fsyncs_per_sec"),
            })
        );
    }
    Ok(())
}

async fn run_one(args: &EngineArgs, root: &std::path::Path, groups: u64) -> anyhow::Result<serde_json::Value> {
    let dir = super::fresh_dir(root, &format!("engine-g{groups}-c{}", args.clients_per_group))?;
    let config = ClusterConfig { nodes: NODES, tick_ms: 100, workers: args.workers, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start_at(config, Arc::new(KvFactory), &dir)?);
    let voters: Vec<u64> = (1..=NODES).collect();
    for group in 1..=groups {
        cluster.create_group(group, &voters).await?;
    }
    for group in 1..=groups {
        cluster.wait_leader(group, Duration::from_secs(30)).await?;
    }
    let clients = groups as usize * args.clients_per_group;
    let value = vec![b'v'; args.value_bytes];
    let warmup = Duration::from_secs(args.warmup_seconds);
    let measure = Duration::from_secs(args.seconds);

    // Store counters at the start and end of the measured window, read beside the load.
    let metrics_task = tokio::spawn({
        let cluster = cluster.clone();
        async move {
            tokio::time::sleep(warmup).await;
            let before = cluster.store_metrics();
            tokio::time::sleep(measure).await;
            (before, cluster.store_metrics())
        }
    });
    let cpu = super::ServerCpu::window(warmup, measure);
    let report = warden_loadgen::closed_loop(clients, warmup, measure, {
        let cluster = cluster.clone();
        let per_group = args.clients_per_group;
        move |client, _seq| {
            let cluster = cluster.clone();
            let group = 1 + (client / per_group) as u64;
            let command = kv::put(format!("client-{client}").as_bytes(), &value);
            async move { cluster.propose(group, command, REQUEST_TIMEOUT).await.map(|_| ()) }
        }
    })
    .await;
    let (before, after) = metrics_task.await?;
    let cpu = cpu.finish(report.ops).await?;
    let fsyncs = after.fsyncs.saturating_sub(before.fsyncs);
    let entries = after.entries.saturating_sub(before.entries);
    let bytes = after.bytes.saturating_sub(before.bytes);
    let seconds = measure.as_secs_f64();
    let mut line = json!({
        "bench": "engine",
        "groups": groups,
        "clients": clients,
        "clients_per_group": args.clients_per_group,
        "value_bytes": args.value_bytes,
        "seconds": seconds,
        "writes": report.ops,
        "errors": report.errors,
        "writes_per_sec": report.ops_per_sec,
        "p50_ms": report.p50_ms,
        "p99_ms": report.p99_ms,
        "fsyncs_per_sec": fsyncs as f64 / seconds,
        "entries_per_fsync": if fsyncs == 0 { 0.0 } else { entries as f64 / fsyncs as f64 },
        "bytes_per_fsync": if fsyncs == 0 { 0.0 } else { bytes as f64 / fsyncs as f64 },
    });
    cpu.insert(&mut line);
    drop(cluster);
    std::fs::remove_dir_all(&dir)?;
    Ok(line)
}
