//! `warden bench …`: benchmarks of the hot paths, each printing JSON lines.

mod cgroup;
mod cluster;
mod election;
mod engine;
mod host_limits;
mod idle;
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
    /// What idle groups cost: CPU per node and heartbeats per second with every group idle,
    /// hibernation on and off.
    Idle(idle::IdleArgs),
}

impl BenchCommand {
    /// Whether the benchmark reads the heap in use, so the allocator must count from the
    /// process's start (see allocator.rs).
    pub fn measures_heap(&self) -> bool {
        matches!(self, BenchCommand::Watch(_))
    }
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
        BenchCommand::Idle(args) => idle::run(args).await,
    }
}

/// A closed-loop run: how many clients, each sending its next request when the last is
/// answered, and for how long it is measured (each run or configuration of a benchmark).
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct ClosedLoop {
    /// Closed-loop clients in total, spread over the run's groups (the writers of a watch run).
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Measured seconds of each run.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
}

/// Where a benchmark's node directories (and its processes' logs) go: wiped before each run
/// or configuration.
#[derive(Clone, Debug, clap::Args)]
pub struct DataDir {
    /// Where node directories go (wiped before each run). Default: ~/.cache/warden-bench.
    #[arg(long = "data-dir")]
    path: Option<std::path::PathBuf>,
}

impl DataDir {
    /// The directory given, else `~/.cache/warden-bench`: on the ordinary disk (not tmpfs),
    /// outside the source tree.
    pub fn root(&self) -> std::path::PathBuf {
        self.path.clone().unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
            home.join(".cache").join("warden-bench")
        })
    }
}

/// Nodes of every benchmark cluster.
pub const NODES: u64 = 5;

/// Name prefixes of the threads that do the in-process cluster's work: each node's host-loop
/// workers (`node-{id}-w{i}`) and tokio runtime (`node-{id}-io`: transport, gRPC services),
/// store writers, snapshot builders, RocksDB's background threads (`rocksdb:…`, flushes and
/// compactions) and the benchmark's router ([`ROUTER_THREAD`]). The benchmarks' clients run on
/// the CLI's runtime, whose threads carry none of these names, so they are not counted.
pub const SERVER_THREADS: [&str; 5] = ["node-", "store-writer-", "snapshot-", "rocksdb:", ROUTER_THREAD];

/// Thread name of the benchmarks' in-process router's runtime.
const ROUTER_THREAD: &str = "bench-router";

/// Channels of the benchmarks' setup and of their calls straight to nodes: tonic's defaults,
/// to any node when TLS is on.
const TO_NODE: warden_proto::channel::ChannelSettings = warden_proto::channel::ChannelSettings::new(warden_proto::tls::Expected::AnyNode);

/// Which threads of this process count as server CPU.
pub fn server_threads() -> warden_loadgen::cpu::Threads {
    warden_loadgen::cpu::Threads::Named(SERVER_THREADS.iter().map(|prefix| prefix.to_string()).collect())
}

/// The in-process servers' CPU over a benchmark's measured window ([`SERVER_THREADS`] of this
/// process; a thread that exits inside the window, such as a snapshot builder, takes its CPU
/// with it). Sampled either at fixed times beside a timed load ([`ServerCpu::window`]) or from
/// now until [`ServerCpu::finish`] ([`ServerCpu::start`]).
pub enum ServerCpu {
    /// A side task sampling at the window's start and end.
    Timed(tokio::task::JoinHandle<Result<warden_loadgen::cpu::CpuUsed, warden_loadgen::cpu::CpuError>>),
    /// Sampled at the start; the end is sampled by `finish`.
    Started(warden_loadgen::cpu::CpuSample),
}

/// Server CPU over a window: per acknowledged operation and in cores.
#[derive(Clone, Copy, Debug)]
pub struct ServerCpuFigures {
    /// Server CPU µs over the operations acknowledged in the window (`None` without any).
    pub us_per_op: Option<f64>,
    /// Server CPU seconds over the window's seconds: the cores kept busy on average.
    pub cores: f64,
}

impl ServerCpu {
    /// A window that opens `warmup` from now and lasts `measure`: the same as
    /// `warden_loadgen::closed_loop`'s measured window when started right before it.
    pub fn window(warmup: std::time::Duration, measure: std::time::Duration) -> ServerCpu {
        ServerCpu::Timed(tokio::spawn(async move {
            use warden_loadgen::cpu::CpuSample;
            tokio::time::sleep(warmup).await;
            let start = CpuSample::take_threads(&[std::process::id()], &server_threads())?;
            tokio::time::sleep(measure).await;
            Ok(CpuSample::take_threads(&[std::process::id()], &server_threads())?.since(&start))
        }))
    }

    /// A window that opens now and closes at [`ServerCpu::finish`].
    pub fn start() -> anyhow::Result<ServerCpu> {
        Ok(ServerCpu::Started(warden_loadgen::cpu::CpuSample::take_threads(&[std::process::id()], &server_threads())?))
    }

    /// Closes the window (or waits for the timed one to close) and divides by `ops`, the
    /// operations acknowledged in it.
    pub async fn finish(self, ops: u64) -> anyhow::Result<ServerCpuFigures> {
        let used = match self {
            ServerCpu::Timed(task) => task.await??,
            ServerCpu::Started(start) => warden_loadgen::cpu::CpuSample::take_threads(&[std::process::id()], &server_threads())?.since(&start),
        };
        let cpu_s = used.total().as_secs_f64();
        Ok(ServerCpuFigures {
            us_per_op: (ops > 0).then(|| cpu_s * 1e6 / ops as f64),
            cores: cpu_s / used.window.as_secs_f64().max(f64::MIN_POSITIVE),
        })
    }
}

impl ServerCpuFigures {
    /// Adds `server_cpu_us_per_op` (null without operations) and `server_cpu_cores` to a JSON
    /// line (an object).
    pub fn insert(&self, line: &mut serde_json::Value) {
        if let Some(line) = line.as_object_mut() {
            line.insert("server_cpu_us_per_op".into(), self.us_per_op.into());
            line.insert("server_cpu_cores".into(), self.cores.into());
        }
    }
}

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
        let factory = std::sync::Arc::new(warden_namespace::NamespaceFactory::default());
        let cluster = std::sync::Arc::new(Cluster::start_at(config, factory, &dir)?);
        let voters: Vec<u64> = (1..=NODES).collect();
        for group in 1..=groups {
            cluster.create_group(group, &voters).await?;
        }
        let mut channels = std::collections::HashMap::new();
        for id in cluster.node_ids() {
            let addr = cluster.addr(id).ok_or_else(|| anyhow::anyhow!("no address for node {id}"))?;
            channels.insert(id, warden_proto::channel::connect(&addr.to_string(), None, &TO_NODE).await?);
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
    /// With TLS: the client `root`'s, the router's and a node's TLS of the cluster's CA.
    pub tls: Option<BenchTls>,
    router: RouterRuntime,
    dir: std::path::PathBuf,
}

/// The benchmark clients' TLS ([`RoutedCluster::tls`]).
pub struct BenchTls {
    /// For calls through the router.
    pub client: std::sync::Arc<warden_proto::tls::Tls>,
    /// The router's.
    pub router: std::sync::Arc<warden_proto::tls::Tls>,
    /// For calls straight to a node's peer port and the benchmark's setup: node 1's (the
    /// system's own calls, which no grant checks; a router's certificate speaks only for
    /// the principals it forwards for).
    pub node: std::sync::Arc<warden_proto::tls::Tls>,
}

impl RoutedCluster {
    /// A channel to `addr`, a router (`expected` Router: as a client) or a node's peer port
    /// (as a node), with TLS when the cluster has it.
    pub async fn channel(&self, addr: std::net::SocketAddr, expected: warden_proto::tls::Expected) -> anyhow::Result<tonic::transport::Channel> {
        let tls = self.tls.as_ref().map(|tls| if expected == warden_proto::tls::Expected::Router { &tls.client } else { &tls.node });
        Ok(warden_proto::channel::connect(&addr.to_string(), tls, &warden_proto::channel::ChannelSettings::new(expected)).await?)
    }
}

/// The router's own tokio runtime (threads named [`ROUTER_THREAD`]), so its CPU is told apart
/// from the benchmark clients' on the CLI's runtime and counted as a server's.
struct RouterRuntime(Option<tokio::runtime::Runtime>);

impl Drop for RouterRuntime {
    fn drop(&mut self) {
        // A runtime may not be dropped, nor shut down with a wait, on an async thread: as a
        // node does, shut it down on a thread of its own and wait for that.
        if let Some(runtime) = self.0.take() {
            let _ = std::thread::spawn(move || runtime.shutdown_timeout(std::time::Duration::from_secs(2))).join();
        }
    }
}

impl RoutedCluster {
    /// Starts it in `dir` (which [`fresh_dir`] made), with a shard group for each of `prefixes`
    /// and a router on a free loopback port; with `tls`, TLS on every link (a CA in
    /// `dir/tls`).
    pub async fn start(dir: std::path::PathBuf, prefixes: &[String], tls: bool) -> anyhow::Result<RoutedCluster> {
        use warden_proto::placement::{placement_client::PlacementClient, CreateGroupRequest};
        use warden_proto::tls::{Identity, Tls};
        use warden_server_kit::authority::Authority;
        use warden_shard_node::cluster::{Cluster, ClusterConfig};
        let tls_dir = tls.then(|| dir.join("tls"));
        let config = ClusterConfig { nodes: NODES, tick_ms: 100, serve_api: true, tls_dir: tls_dir.clone(), ..ClusterConfig::default() };
        let factory = std::sync::Arc::new(warden_shard_node::placement::ShardNodeFactory::default());
        let cluster = std::sync::Arc::new(Cluster::start_at(config, factory, &dir)?);
        cluster.bootstrap_placement(&[1, 2, 3]).await?;
        let tls = match &tls_dir {
            Some(tls_dir) => {
                let authority = Authority::load(tls_dir)?;
                let client = Tls::load(authority.issue_files(tls_dir, &Identity::client("root"))?)?;
                let node = cluster.tls(1).ok_or_else(|| anyhow::anyhow!("node 1 has no TLS"))?;
                Some(BenchTls { client, router: Tls::load(authority.issue_files(tls_dir, &Identity::router("bench"))?)?, node })
            }
            None => None,
        };
        for prefix in prefixes {
            let leader = cluster.wait_leader(warden_placement::PLACEMENT_GROUP_ID, std::time::Duration::from_secs(30)).await?;
            let addr = cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address for node {leader}"))?;
            let channel = warden_proto::channel::connect(&addr.to_string(), tls.as_ref().map(|tls| &tls.node), &TO_NODE).await?;
            PlacementClient::new(channel).create_group(CreateGroupRequest { prefix: prefix.clone() }).await?;
        }
        let router_tls = tls.as_ref().map(|tls| tls.router.clone());
        // Bound here, made a tokio listener on the router's runtime (which it must belong to).
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let router_addr = listener.local_addr()?;
        let seeds = cluster.node_ids().into_iter().filter_map(|id| cluster.addr(id)).map(|a| a.to_string()).collect();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(ROUTER_THREAD).enable_all().build()?;
        runtime.spawn(async move {
            let served = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => {
                    let config = warden_router::RouterConfig { tls: router_tls, ..warden_router::RouterConfig::new(seeds) };
                    warden_router::serve(listener, config).await.map_err(anyhow::Error::from)
                }
                Err(error) => Err(error.into()),
            };
            if let Err(error) = served {
                tracing::error!(%error, "the benchmark's router stopped");
            }
        });
        Ok(RoutedCluster { cluster, router_addr, tls, router: RouterRuntime(Some(runtime)), dir })
    }

    /// Stops the router and the cluster and removes the directory.
    pub fn finish(self) -> anyhow::Result<()> {
        drop(self.router);
        drop(self.cluster);
        std::fs::remove_dir_all(&self.dir)?;
        Ok(())
    }
}
