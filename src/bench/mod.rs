//! `warden bench …`: benchmarks of the hot paths, each printing JSON lines.

mod cgroup;
mod cluster;
mod election;
mod engine;
mod load;
mod locks;
mod namespace;
mod router;
mod watch;

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// The multi-Raft engine: writes through propose → group commit → replicate → apply.
    Engine(engine::EngineArgs),
    /// The public namespace API over gRPC: create / set / get / txn.
    Namespace(namespace::NamespaceArgs),
    /// Locks and sessions over gRPC: uncontended cycles, contended hand-off, keepalives.
    Locks(locks::LocksArgs),
    /// Watches over gRPC: delivery latency by watcher count, memory per idle watch, events
    /// per second on a recursive watch under write load.
    Watch(watch::WatchArgs),
    /// Writes through a router: aggregate writes/s by shard-group count, and the latency
    /// the router adds.
    Router(router::RouterArgs),
    /// `warden-loadgen`'s workloads (same flags) against an in-process cluster behind a router,
    /// or against `--endpoints`.
    Load(load::LoadBenchArgs),
    /// The client's recipes through a router: leader-election failover after a crash, and
    /// lock hand-off latency.
    Election(election::ElectionArgs),
    /// Scaling on isolated nodes: `warden node` and `warden router` processes, each in a CPU
    /// cgroup of its own with the same quota, under the load generator's workloads, by shard-group
    /// count (needs root for the cgroups).
    Cluster(cluster::ClusterArgs),
}

/// Runs a benchmark.
pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Engine(args) => engine::run(args).await,
        BenchCommand::Namespace(args) => namespace::run(args).await,
        BenchCommand::Locks(args) => locks::run(args).await,
        BenchCommand::Watch(args) => watch::run(args).await,
        BenchCommand::Router(args) => router::run(args).await,
        BenchCommand::Election(args) => election::run(args).await,
        BenchCommand::Load(args) => load::run(args).await,
        BenchCommand::Cluster(args) => cluster::run(args).await,
    }
}

/// Default directory for benchmark data: on the ordinary disk (not tmpfs), outside the
/// source tree.
pub fn default_data_dir() -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("warden-bench")
}

/// Nodes of every benchmark cluster.
pub const NODES: u64 = 5;

/// A fresh (wiped) directory `root/name` for one benchmark configuration.
pub fn fresh_dir(root: &std::path::Path, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = root.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A 5-node cluster serving the public API, with `groups` namespace groups on every node and
/// a client of each group's leader.
pub struct ApiCluster {
    /// The cluster.
    pub cluster: std::sync::Arc<warden_shard_node::cluster::Cluster>,
    /// A client connected to each group's leader.
    pub leaders: std::collections::HashMap<u64, warden_proto::v1::warden_client::WardenClient<tonic::transport::Channel>>,
    dir: std::path::PathBuf,
}

impl ApiCluster {
    /// Starts it in `root/name` (wiped first).
    pub async fn start(root: &std::path::Path, name: &str, groups: u64) -> anyhow::Result<ApiCluster> {
        use warden_shard_node::cluster::{Cluster, ClusterConfig};
        anyhow::ensure!(groups > 0, "group counts must be positive");
        let dir = fresh_dir(root, name)?;
        let config = ClusterConfig { nodes: NODES, tick_ms: 100, serve_api: true, ..ClusterConfig::default() };
        let factory = std::sync::Arc::new(warden_shard_node::namespace::NamespaceFactory::default());
        let cluster = std::sync::Arc::new(Cluster::start_at(config, factory, &dir)?);
        let voters: Vec<u64> = (1..=NODES).collect();
        for group in 1..=groups {
            cluster.create_group(group, &voters).await?;
        }
        let mut channels = std::collections::HashMap::new();
        for id in cluster.node_ids() {
            let addr = cluster.addr(id).ok_or_else(|| anyhow::anyhow!("no address for node {id}"))?;
            channels.insert(id, tonic::transport::Channel::from_shared(format!("http://{addr}"))?.connect().await?);
        }
        let mut leaders = std::collections::HashMap::new();
        for group in 1..=groups {
            let leader = cluster.wait_leader(group, std::time::Duration::from_secs(30)).await?;
            leaders.insert(group, warden_proto::v1::warden_client::WardenClient::new(channels[&leader].clone()));
        }
        Ok(ApiCluster { cluster, leaders, dir })
    }

    /// Stops the cluster and removes its directory.
    pub fn finish(self) -> anyhow::Result<()> {
        drop(self.cluster);
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}

/// A 5-node cluster with a placement group (nodes 1-3), a shard group per prefix and a
/// router in front: what the benchmarks through a router start from.
pub struct RoutedCluster {
    /// The cluster.
    pub cluster: std::sync::Arc<warden_shard_node::cluster::Cluster>,
    /// Where the router listens.
    pub router_addr: std::net::SocketAddr,
    router: tokio::task::JoinHandle<()>,
    dir: std::path::PathBuf,
}

impl RoutedCluster {
    /// Starts it in `dir` (which [`fresh_dir`] made), with a shard group for each of `prefixes`
    /// and a router on a free loopback port.
    pub async fn start(dir: std::path::PathBuf, prefixes: &[String]) -> anyhow::Result<RoutedCluster> {
        use warden_proto::placement::{placement_client::PlacementClient, CreateGroupRequest};
        use warden_shard_node::cluster::{Cluster, ClusterConfig};
        let config = ClusterConfig { nodes: NODES, tick_ms: 100, serve_api: true, ..ClusterConfig::default() };
        let factory = std::sync::Arc::new(warden_shard_node::placement::ShardNodeFactory::default());
        let cluster = std::sync::Arc::new(Cluster::start_at(config, factory, &dir)?);
        cluster.bootstrap_placement(&[1, 2, 3]).await?;
        for prefix in prefixes {
            let leader = cluster.wait_leader(warden_placement::PLACEMENT_GROUP_ID, std::time::Duration::from_secs(30)).await?;
            let addr = cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address for node {leader}"))?;
            let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))?.connect().await?;
            PlacementClient::new(channel).create_group(CreateGroupRequest { prefix: prefix.clone() }).await?;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let router_addr = listener.local_addr()?;
        let seeds = cluster.node_ids().into_iter().filter_map(|id| cluster.addr(id)).map(|a| a.to_string()).collect();
        let router = tokio::spawn(async move {
            if let Err(error) = warden_router::serve(listener, warden_router::RouterConfig::new(seeds)).await {
                tracing::error!(%error, "the benchmark's router stopped");
            }
        });
        Ok(RoutedCluster { cluster, router_addr, router, dir })
    }

    /// Stops the router and the cluster and removes the directory.
    pub fn finish(self) -> anyhow::Result<()> {
        self.router.abort();
        drop(self.cluster);
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}
