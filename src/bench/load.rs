//! `warden bench load`: `warden-loadgen`'s workloads (the same code, the same flags) against
//! an in-process 5-node cluster with a placement group, a shard group per `/bench/pN`
//! prefix and a router, all fsyncing to disk. (To drive a running cluster, or etcd or
//! ZooKeeper, use `warden-loadgen`: here `--endpoints` is the CLI's global flag and is set to
//! the in-process router.) Server CPU per operation covers the whole process here (cluster,
//! router and load generator together), so it is an upper bound of the servers' share.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;
use warden_loadgen::election::CandidateCommand;
use warden_loadgen::options::{prefix, LoadArgs};
use warden_loadgen::target::TargetKind;
use warden_loadgen::CpuScope;
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::CreateGroupRequest;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;

/// Flags of `warden bench load`: the load generator's, plus the in-process cluster's.
#[derive(clap::Args)]
pub struct LoadBenchArgs {
    #[command(flatten)]
    load: LoadArgs,
    /// Shard groups of the in-process cluster, one per prefix `/bench/p0` … (default:
    /// `--prefixes`).
    #[arg(long)]
    groups: Option<usize>,
    /// Where node directories go (wiped). Default: ~/.cache/warden-bench.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

/// An in-process cluster with a router in front, for one run.
pub struct LoadCluster {
    cluster: Arc<Cluster>,
    router: tokio::task::JoinHandle<()>,
    /// Where the router listens.
    pub router_addr: std::net::SocketAddr,
    dir: PathBuf,
}

impl LoadCluster {
    /// Starts 5 nodes in `dir` (wiped), placement on nodes 1-3, a shard group per prefix
    /// `/bench/p0` … `/bench/p{groups - 1}`, and a router on a free loopback port.
    pub async fn start(dir: PathBuf, groups: usize) -> anyhow::Result<LoadCluster> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let config = ClusterConfig { nodes: super::NODES, tick_ms: 100, serve_api: true, ..ClusterConfig::default() };
        let cluster = Arc::new(Cluster::start_at(config, Arc::new(ShardNodeFactory::default()), &dir)?);
        cluster.bootstrap_placement(&[1, 2, 3]).await?;
        for group in 0..groups {
            let leader = cluster.wait_leader(PLACEMENT_GROUP_ID, Duration::from_secs(30)).await?;
            let addr = cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address for node {leader}"))?;
            let mut placement = PlacementClient::new(Channel::from_shared(format!("http://{addr}"))?.connect().await?);
            placement.create_group(CreateGroupRequest { prefix: prefix(group) }).await?;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let router_addr = listener.local_addr()?;
        let seeds = cluster.node_ids().into_iter().filter_map(|id| cluster.addr(id)).map(|a| a.to_string()).collect();
        let router = tokio::spawn(async move {
            if let Err(error) = warden_router::serve(listener, warden_router::RouterConfig::new(seeds)).await {
                tracing::error!(%error, "the benchmark's router stopped");
            }
        });
        Ok(LoadCluster { cluster, router, router_addr, dir })
    }

    /// Stops the router and the cluster and removes the data.
    pub fn finish(self) -> anyhow::Result<()> {
        self.router.abort();
        drop(self.cluster);
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
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
    let root = args.data_dir.unwrap_or_else(super::default_data_dir);
    let cluster = LoadCluster::start(root.join("load"), args.groups.unwrap_or(load.prefixes)).await?;
    load.endpoints = vec![cluster.router_addr.to_string()];
    let cpu = CpuScope { pids: vec![std::process::id()], scope: "process: cluster, router and load generator".into() };
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
