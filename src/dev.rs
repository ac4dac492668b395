//! `warden dev`: a local cluster on loopback for trying Warden out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::kv::KvFactory;
use warden_shard_node::EngineError;

/// Flags of `warden dev`.
#[derive(clap::Args)]
pub struct DevArgs {
    /// Data directory, kept across restarts.
    #[arg(long, default_value = "warden-data")]
    data_dir: PathBuf,
    /// Wipe the data directory first.
    #[arg(long)]
    fresh: bool,
    /// Port of node 1; node i listens on base + i - 1.
    #[arg(long, default_value_t = 7101)]
    base_port: u16,
    /// Shard groups to host (5 replicas each).
    #[arg(long, default_value_t = 4)]
    groups: u64,
}

const NODES: u64 = 5;

/// Starts the cluster and waits for Ctrl-C.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.fresh && args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir)?;
    }
    std::fs::create_dir_all(&args.data_dir)?;
    let config = ClusterConfig { nodes: NODES, tick_ms: 100, base_port: Some(args.base_port), ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start_at(config, Arc::new(KvFactory), &args.data_dir)?);
    let voters: Vec<u64> = (1..=NODES).collect();
    for group in 1..=args.groups {
        match cluster.create_group(group, &voters).await {
            Ok(()) | Err(EngineError::GroupExists(_)) => {}
            Err(error) => return Err(error.into()),
        }
    }
    for group in 1..=args.groups {
        let leader = cluster.wait_leader(group, Duration::from_secs(30)).await?;
        println!("group {group}: leader node {leader}");
    }
    for id in cluster.node_ids() {
        println!("node {id}: raft transport on 127.0.0.1:{}", u64::from(args.base_port) + id - 1);
    }
    println!("data in {}; Ctrl-C stops", args.data_dir.display());
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    drop(cluster);
    Ok(())
}
