//! `warden dev`: a local cluster on loopback for trying Warden out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::namespace::NamespaceFactory;
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
}

const NODES: u64 = 5;
/// The one shard group `warden dev` runs until the router issue brings more.
const GROUP: u64 = 1;

/// Starts the cluster and waits for Ctrl-C.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.fresh && args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir)?;
    }
    std::fs::create_dir_all(&args.data_dir)?;
    let config = ClusterConfig { nodes: NODES, tick_ms: 100, base_port: Some(args.base_port), serve_api: true, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start_at(config, Arc::new(NamespaceFactory::default()), &args.data_dir)?);
    let voters: Vec<u64> = (1..=NODES).collect();
    match cluster.create_group(GROUP, &voters).await {
        Ok(()) | Err(EngineError::GroupExists(_)) => {}
        Err(error) => return Err(error.into()),
    }
    let leader = cluster.wait_leader(GROUP, Duration::from_secs(30)).await?;
    for id in cluster.node_ids() {
        let role = if id == leader { " (leader)" } else { "" };
        println!("node {id}: 127.0.0.1:{}{role}", u64::from(args.base_port) + id - 1);
    }
    let leader_port = u64::from(args.base_port) + leader - 1;
    println!("one shard group (5 replicas) serves the namespace API warden.v1.Warden on every node;");
    println!("writes go to the leader (others answer NOT_LEADER with its address). Try:");
    println!("  grpcurl -plaintext -d '{{\"path\":\"/hello\",\"data\":\"d29ybGQ=\"}}' 127.0.0.1:{leader_port} warden.v1.Warden/Create");
    println!("  grpcurl -plaintext -d '{{\"path\":\"/hello\"}}' 127.0.0.1:{leader_port} warden.v1.Warden/Get");
    println!("data in {}; Ctrl-C stops", args.data_dir.display());
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    drop(cluster);
    Ok(())
}
