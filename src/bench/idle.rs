//! `warden bench idle`: what idle groups cost. An in-process 5-node
//! cluster (namespace groups, 100 ms ticks as `warden dev`, one host-loop worker per node)
//! gets `--groups` groups of 5 replicas, one write each; once they settled (with hibernation
//! on: once every replica sleeps) nothing is asked of them for `--seconds`, over which the
//! benchmark reads each node's CPU (its threads: `node-{id}-*` host loop and I/O runtime,
//! `store-writer-{id}`; RocksDB's background threads are shared by the nodes and reported
//! apart) and the raft heartbeats the nodes sent. One JSON line per setting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::json;
use warden_engine::RaftMetricsSnapshot;
use warden_loadgen::cpu::{CpuSample, Threads};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{CreateRequest, Routing};
use warden_shard_node::cluster::{Cluster, ClusterConfig};

use super::NODES;

/// Flags of `warden bench idle`.
#[derive(clap::Args)]
pub struct IdleArgs {
    /// Groups (5 replicas each, one on every node).
    #[arg(long, default_value_t = 2000)]
    groups: u64,
    /// Hibernation on, off, or both (one line each).
    #[arg(long, value_enum, default_value_t = Hibernate::Both)]
    hibernate: Hibernate,
    /// Measured seconds per setting.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Longest wait for the groups to settle (every replica asleep, with hibernation on).
    #[arg(long, default_value_t = 300)]
    settle_seconds_max: u64,
    #[command(flatten)]
    data_dir: super::DataDir,
}

/// Which settings `warden bench idle` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Hibernate {
    On,
    Off,
    Both,
}

/// Ticks of the benchmark's nodes: `warden dev`'s.
const TICK_MS: u64 = 100;
/// Groups created or written at once while setting up.
const SETUP_CONCURRENCY: usize = 32;
/// Settling time with hibernation off (elections and the writes' last heartbeats are over).
const SETTLE_OFF: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the settings asked for.
pub async fn run(args: IdleArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.groups > 0 && args.seconds > 0, "--groups and --seconds must be positive");
    let root = args.data_dir.root();
    let settings: &[bool] = match args.hibernate {
        Hibernate::On => &[true],
        Hibernate::Off => &[false],
        Hibernate::Both => &[true, false],
    };
    for &hibernate in settings {
        println!("{}", run_one(&args, &root, hibernate).await?);
    }
    Ok(())
}

async fn run_one(args: &IdleArgs, root: &std::path::Path, hibernate: bool) -> anyhow::Result<serde_json::Value> {
    let setting = if hibernate { "on" } else { "off" };
    let dir = super::fresh_dir(root, &format!("idle-g{}-{setting}", args.groups))?;
    let hibernate_after_ticks = if hibernate { warden_engine::config::HIBERNATE_AFTER_TICKS_ON } else { 0 };
    let config = ClusterConfig { nodes: NODES, tick_ms: TICK_MS, serve_api: true, hibernate_after_ticks, ..ClusterConfig::default() };
    let factory = Arc::new(warden_namespace::NamespaceFactory::default());
    let cluster = Arc::new(Cluster::start_at(config, factory, &dir)?);
    let setup_started = Instant::now();
    setup(&cluster, args.groups).await?;
    let setup_s = setup_started.elapsed().as_secs_f64();

    // Settle: with hibernation on, until every replica sleeps (or the limit).
    let settle_started = Instant::now();
    let replicas = args.groups * NODES;
    if hibernate {
        let limit = Duration::from_secs(args.settle_seconds_max);
        while sleeping(&cluster) < replicas && settle_started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    } else {
        tokio::time::sleep(SETTLE_OFF).await;
    }
    let settle_s = settle_started.elapsed().as_secs_f64();

    // The measured window: nothing is asked of the groups.
    let threads = node_threads();
    let all = super::server_threads();
    let pid = [std::process::id()];
    let metrics_before = metrics(&cluster);
    let cpu_before: Vec<CpuSample> = threads.iter().map(|t| CpuSample::take_threads(&pid, t)).collect::<Result<_, _>>()?;
    let all_before = CpuSample::take_threads(&pid, &all)?;
    let sleeping_before = sleeping(&cluster);
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let cpu_after: Vec<CpuSample> = threads.iter().map(|t| CpuSample::take_threads(&pid, t)).collect::<Result<_, _>>()?;
    let all_used = CpuSample::take_threads(&pid, &all)?.since(&all_before);
    let metrics_after = metrics(&cluster);
    let sleeping_after = sleeping(&cluster);

    let window_s = all_used.window.as_secs_f64();
    let node_pct: Vec<f64> =
        cpu_after.iter().zip(&cpu_before).map(|(after, before)| after.since(before).total().as_secs_f64() / window_s * 100.0).collect();
    let nodes_pct: f64 = node_pct.iter().sum();
    let total_pct = all_used.total().as_secs_f64() / window_s * 100.0;
    let per_sec = |field: fn(&RaftMetricsSnapshot) -> u64| -> Vec<f64> {
        metrics_after.iter().zip(&metrics_before).map(|(after, before)| field(after).saturating_sub(field(before)) as f64 / window_s).collect()
    };
    let heartbeats = per_sec(|m| m.heartbeats_sent);
    let messages = per_sec(|m| m.messages_sent);
    let round = |values: &[f64]| values.iter().map(|v| (v * 100.0).round() / 100.0).collect::<Vec<f64>>();
    let line = json!({
        "bench": "idle",
        "groups": args.groups,
        "replicas": replicas,
        "hibernate": setting,
        "tick_ms": TICK_MS,
        "hibernate_after_ticks": hibernate_after_ticks,
        "seconds": window_s,
        "setup_s": setup_s,
        "settle_s": settle_s,
        "sleeping_replicas_at_start": sleeping_before,
        "sleeping_replicas_at_end": sleeping_after,
        "cpu_pct_per_node": round(&node_pct),
        "cpu_pct_node_max": node_pct.iter().copied().fold(0.0, f64::max),
        "cpu_pct_shared": (total_pct - nodes_pct).max(0.0),
        "cpu_pct_total": total_pct,
        "cpu_pct_total_per_node": total_pct / NODES as f64,
        "heartbeats_per_sec_per_node": round(&heartbeats),
        "heartbeats_per_sec": heartbeats.iter().sum::<f64>(),
        "raft_msgs_per_sec": messages.iter().sum::<f64>(),
    });
    drop(cluster);
    std::fs::remove_dir_all(&dir)?;
    Ok(line)
}

/// Creates the groups, waits for their leaders and writes one node in each.
async fn setup(cluster: &Arc<Cluster>, groups: u64) -> anyhow::Result<()> {
    let voters: Vec<u64> = (1..=NODES).collect();
    let created: Vec<anyhow::Result<()>> = futures::stream::iter(1..=groups)
        .map(|group| {
            let (cluster, voters) = (cluster.clone(), voters.clone());
            async move { Ok(cluster.create_group(group, &voters).await?) }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    created.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let mut channels = std::collections::HashMap::new();
    for id in cluster.node_ids() {
        let addr = cluster.addr(id).ok_or_else(|| anyhow::anyhow!("no address for node {id}"))?;
        channels.insert(id, warden_proto::channel::connect(&addr.to_string(), None, &super::TO_NODE).await?);
    }
    let channels = Arc::new(channels);
    let written: Vec<anyhow::Result<()>> = futures::stream::iter(1..=groups)
        .map(|group| {
            let (cluster, channels) = (cluster.clone(), channels.clone());
            async move {
                let deadline = Instant::now() + REQUEST_TIMEOUT;
                loop {
                    let leader = cluster.wait_leader(group, REQUEST_TIMEOUT).await?;
                    let channel = channels.get(&leader).ok_or_else(|| anyhow::anyhow!("no channel to node {leader}"))?.clone();
                    let routing = Some(Routing { group_id: group, ..Routing::default() });
                    let request = CreateRequest { path: "/idle".into(), data: b"written once".to_vec(), routing, ..CreateRequest::default() };
                    match WardenClient::new(channel).create(request).await {
                        Ok(_) => return Ok(()),
                        // NOT_LEADER or a new leader not ready yet (UNAVAILABLE: nothing was written).
                        Err(status) if Instant::now() < deadline && status.code() == tonic::Code::Unavailable => {
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                        Err(status) => return Err(anyhow::anyhow!("group {group}: create: {status}")),
                    }
                }
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    written.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// Each node's threads: its host loop and I/O runtime, and its store writer.
fn node_threads() -> Vec<Threads> {
    (1..=NODES).map(|id| Threads::Named(vec![format!("node-{id}-"), format!("store-writer-{id}")])).collect()
}

fn metrics(cluster: &Cluster) -> Vec<RaftMetricsSnapshot> {
    (1..=NODES).map(|id| cluster.raft_metrics(id).unwrap_or_default()).collect()
}

fn sleeping(cluster: &Cluster) -> u64 {
    metrics(cluster).iter().map(|m| m.sleeping_replicas).sum()
}
