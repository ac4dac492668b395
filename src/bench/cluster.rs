//! `warden bench cluster`: Warden's scaling on isolated nodes. A real multi-process cluster on
//! loopback — N `warden node` processes and R `warden router` processes, each started from this
//! binary, each with a data directory of its own — where every node and router process runs
//! in a CPU cgroup of its own with the same quota (`--cpu-per-process`). That models N + R
//! machines of that size on one host: a group's leader is held to its node's share of CPU as
//! it would be on a machine of its own, so what more shard groups buy shows, as it would not
//! on processes that share the host's cores freely.
//!
//! For each configuration — a node count and a shard-group count — a fresh cluster is
//! bootstrapped with groups `/bench/p0` …; the load generator's workloads (in this process,
//! uncapped: the client is not a machine of the cluster) spread their keys over every group
//! and their connections over every router. `--nodes 5,10,15 --groups-per-node 2` is the
//! scale-out series: N nodes, 2N groups, a router per 5 nodes.
//!
//! Each fresh cluster is first watched idle (`--idle-seconds`): one JSON line with each
//! process's CPU doing nothing. Then one JSON line per (configuration, workload): throughput, latency, errors, the CPU per
//! operation of all node and router processes, each process's CPU in cores, the load
//! generator's own CPU, and the nodes' fsyncs per second. A run that reached a limit of the
//! host instead of the cluster's — the load generator using the cores the quotas leave, or the
//! shared disk at the fsync rate it managed alone ([`super::host_limits`]) — is marked
//! `"host_limited"` and its figure left out of the summary's ratios.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use warden_loadgen::cpu::CpuSample;
use warden_loadgen::election::CandidateCommand;
use warden_loadgen::options::{prefix, LoadArgs, Workload};
use warden_loadgen::report::LoadReport;
use warden_loadgen::target::TargetKind;
use warden_loadgen::CpuScope;

use super::cgroup::CpuQuotas;
use super::host_limits;
use crate::cli::status::group_health;

/// Flags of `warden bench cluster`.
#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Node counts to run, each on fresh clusters (at least 3 nodes: the placement group's
    /// replicas are on nodes 1-3).
    #[arg(long, value_delimiter = ',', default_value = "5")]
    nodes: Vec<u64>,
    /// `warden router` processes; the clients' connections spread over all of them. Default:
    /// one per 5 nodes (at least 1).
    #[arg(long)]
    routers: Option<u64>,
    /// Shard-group counts to run, each on a freshly bootstrapped cluster (groups `/bench/p0` …;
    /// the clients spread their keys over all of them).
    #[arg(long, value_delimiter = ',', default_value = "1,16", conflicts_with = "groups_per_node")]
    groups: Vec<usize>,
    /// Shard groups per node instead of `--groups`: N nodes run N × this many groups.
    #[arg(long)]
    groups_per_node: Option<usize>,
    /// CPU quota of every node and router process, in cores: each runs in a CPU cgroup of its
    /// own (needs root and Linux cgroups, v1 or v2). 0: uncapped.
    #[arg(long, default_value_t = 0.25)]
    cpu_per_process: f64,
    /// The load generator's workloads to run on each cluster.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "put,lock")]
    workloads: Vec<Workload>,
    /// The APIs each workload runs through, one run each on the same cluster: Warden's own
    /// (`native`), and etcd's v3 API served by the same routers (`etcd`: each router also
    /// listens with `--etcd-listen`, and the load generator's etcd target calls it).
    #[arg(long, value_delimiter = ',', value_enum, default_value = "native")]
    apis: Vec<Api>,
    /// Closed-loop clients.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Closed-loop clients per node instead of `--clients` (a fleet's offered load grows with
    /// it): N nodes get N × this many clients, and `--conns` connections per 5 nodes.
    #[arg(long, conflicts_with = "clients")]
    clients_per_node: Option<usize>,
    /// Clients call group leaders directly (the client library's direct calls, given every
    /// node's address), the routers taking only what a router must (sessions, keepalives).
    #[arg(long)]
    direct: bool,
    /// Connections the clients share (at least one per router).
    #[arg(long, default_value_t = 10)]
    conns: usize,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Unmeasured seconds before each run.
    #[arg(long, default_value_t = 2.0)]
    warmup_seconds: f64,
    /// Seconds each fresh cluster is watched idle (no client) before its runs, for what a node
    /// costs doing nothing (0: not measured).
    #[arg(long, default_value_t = 5.0)]
    idle_seconds: f64,
    /// Port of router 1; routers take `base-port` … `base-port + routers - 1`, nodes the ports
    /// after them. (The default stays clear of `warden dev`'s 7100-7105.)
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    #[command(flatten)]
    data_dir: super::DataDir,
}

/// An API a benchmark run goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Api {
    /// Warden's own gRPC API, the load generator's `warden` target.
    Native,
    /// etcd's v3 API on the same routers, the load generator's `etcd` target.
    Etcd,
}

impl Api {
    /// The name in JSON lines.
    fn name(self) -> &'static str {
        match self {
            Api::Native => "native",
            Api::Etcd => "etcd",
        }
    }
}

/// Ops/s by (workload, API) and (nodes, groups); `None`: the run was limited by the host.
type Rates = BTreeMap<(&'static str, Api), BTreeMap<(u64, usize), Option<f64>>>;

/// Placement replicas: nodes 1-3, as `warden dev` has them.
const PLACEMENT_VOTERS: [u64; 3] = [1, 2, 3];
/// How long a cluster may take to bootstrap and elect every group's leader.
const READY_DEADLINE: Duration = Duration::from_secs(120);
/// How long the routing table is asked for in one readiness check.
const TABLE_PATIENCE: Duration = Duration::from_secs(5);
/// The node metric counting its store's fsyncs.
const FSYNCS_METRIC: &str = "warden_storage_fsyncs_total ";
/// Longest a metrics page may be, bytes.
const METRICS_PAGE_BYTES_MAX: u64 = 4 << 20;
/// Longest a metrics scrape may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The body of `GET path` from the HTTP/1.0 server at `addr` (a node's metrics endpoint),
/// within [`SCRAPE_TIMEOUT`] and [`METRICS_PAGE_BYTES_MAX`].
async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
        let mut response = Vec::new();
        stream.take(METRICS_PAGE_BYTES_MAX).read_to_end(&mut response).await?;
        anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
    };
    let response =
        tokio::time::timeout(SCRAPE_TIMEOUT, fetch).await.map_err(|_| anyhow::anyhow!("{addr}{path}: no answer in {SCRAPE_TIMEOUT:?}"))??;
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("{addr}{path}: not an HTTP response"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.split(' ').nth(1) == Some("200"),
        "{addr}{path}: {}",
        head.lines().next().unwrap_or_default()
    );
    Ok(body.to_string())
}

/// One cluster to run: its node, router and shard-group counts.
#[derive(Clone, Copy, Debug)]
struct Shape {
    nodes: u64,
    routers: u64,
    groups: usize,
}

impl Shape {
    /// Every configuration `args` asks for, node count by node count.
    fn all(args: &ClusterArgs) -> Vec<Shape> {
        let mut shapes = Vec::new();
        for &nodes in &args.nodes {
            let routers = args.routers.unwrap_or(nodes.div_ceil(5)).max(1);
            match args.groups_per_node {
                Some(per_node) => shapes.push(Shape { nodes, routers, groups: per_node * nodes as usize }),
                None => shapes.extend(args.groups.iter().map(|&groups| Shape { nodes, routers, groups })),
            }
        }
        shapes
    }

    /// The CPU the quotas hold for the cluster's processes, in cores (0: uncapped).
    fn quota_cores(&self, cpu_per_process: f64) -> f64 {
        (self.nodes + self.routers) as f64 * cpu_per_process
    }
}

/// `load`'s flags parsed with their defaults (the runs then set what they change).
#[derive(clap::Parser)]
struct LoadCli {
    #[command(flatten)]
    load: LoadArgs,
}

/// A server process of the cluster: its label (`node-1`, `router-1`) and the child.
struct Process {
    label: String,
    child: Child,
    log: PathBuf,
}

/// The cluster's processes and their cgroups. Dropping it kills the processes, then (its
/// `quotas` field dropping after `Drop::drop`) removes the cgroups.
struct ProcessCluster {
    processes: Vec<Process>,
    quotas: Option<CpuQuotas>,
    node_addrs: Vec<(u64, String)>,
    router_addrs: Vec<String>,
    /// Each router's etcd API (`--etcd-listen`), in the order of `router_addrs`.
    etcd_addrs: Vec<String>,
    /// Each node's metrics endpoint (`host:port`), where its fsyncs are counted.
    metrics_addrs: Vec<String>,
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for process in &mut self.processes {
            if let Err(error) = process.child.kill() {
                tracing::debug!(label = %process.label, %error, "killing a benchmark process");
            }
        }
        for process in &mut self.processes {
            if let Err(error) = process.child.wait() {
                tracing::warn!(label = %process.label, %error, "waiting for a benchmark process");
            }
        }
    }
}

impl ProcessCluster {
    /// Starts the node and router processes in `dir`, each in its cgroup as soon as it runs.
    fn start(args: &ClusterArgs, shape: Shape, dir: &Path) -> anyhow::Result<ProcessCluster> {
        let quotas = if args.cpu_per_process > 0.0 { Some(CpuQuotas::create(&format!("warden-bench-{}", std::process::id()))?) } else { None };
        let port = |offset: u64| -> anyhow::Result<String> {
            let port =
                u16::try_from(u64::from(args.base_port) + offset).map_err(|_| anyhow::anyhow!("--base-port leaves no room for every process"))?;
            Ok(format!("127.0.0.1:{port}"))
        };
        let router_addrs: Vec<String> = (0..shape.routers).map(port).collect::<Result<_, _>>()?;
        let node_addrs: Vec<(u64, String)> = (1..=shape.nodes).map(|id| Ok((id, port(shape.routers + id - 1)?))).collect::<anyhow::Result<_>>()?;
        let metrics_addrs: Vec<String> = (1..=shape.nodes).map(|id| port(shape.routers + shape.nodes + id - 1)).collect::<Result<_, _>>()?;
        let etcd_addrs: Vec<String> = (0..shape.routers).map(|index| port(shape.routers + 2 * shape.nodes + index)).collect::<Result<_, _>>()?;
        let mut cluster = ProcessCluster { processes: Vec::new(), quotas, node_addrs, router_addrs, etcd_addrs, metrics_addrs };
        let peers = cluster.node_addrs.iter().map(|(id, addr)| format!("{id}={addr}")).collect::<Vec<_>>().join(",");
        for ((id, addr), metrics) in cluster.node_addrs.clone().into_iter().zip(cluster.metrics_addrs.clone()) {
            let data = dir.join(format!("node-{id}"));
            let data = data.to_str().ok_or_else(|| anyhow::anyhow!("{}: not UTF-8", data.display()))?;
            cluster.spawn(
                dir,
                &format!("node-{id}"),
                args.cpu_per_process,
                &["node", "--id", &id.to_string(), "--listen", &addr, "--data-dir", data, "--peers", &peers, "--metrics-listen", &metrics],
            )?;
        }
        let seeds = cluster.node_addrs.iter().map(|(_, addr)| addr.clone()).collect::<Vec<_>>().join(",");
        for (index, (addr, etcd)) in cluster.router_addrs.clone().iter().zip(cluster.etcd_addrs.clone()).enumerate() {
            let mut router_args = vec!["router", "--listen", addr, "--seeds", &seeds];
            if args.apis.contains(&Api::Etcd) {
                router_args.extend(["--etcd-listen", &etcd]);
            }
            cluster.spawn(dir, &format!("router-{}", index + 1), args.cpu_per_process, &router_args)?;
        }
        Ok(cluster)
    }

    /// Starts this binary with `args` as process `label` (output to `dir/label.log`) and, with
    /// a quota, moves it into a cgroup of its own at once.
    fn spawn(&mut self, dir: &Path, label: &str, cores: f64, args: &[&str]) -> anyhow::Result<()> {
        let log = dir.join(format!("{label}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(std::env::current_exe()?).args(args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).spawn()?;
        let pid = child.id();
        self.processes.push(Process { label: label.to_string(), child, log });
        if let Some(quotas) = &mut self.quotas {
            quotas.add(label, cores, pid)?;
        }
        Ok(())
    }

    /// Fails if a process has exited (naming its log).
    fn check_running(&mut self) -> anyhow::Result<()> {
        for process in &mut self.processes {
            if let Some(status) = process.child.try_wait()? {
                anyhow::bail!("{} exited ({status}) during startup; its log: {}", process.label, process.log.display());
            }
        }
        Ok(())
    }

    /// Bootstraps placement, creates a group per prefix, and waits until every router knows a
    /// leader of every group.
    async fn prepare(&mut self, prefixes: &[String]) -> anyhow::Result<()> {
        self.check_running()?;
        crate::admin::bootstrap(&self.node_addrs, &PLACEMENT_VOTERS).await?;
        let seeds: Vec<String> = self.node_addrs.iter().filter(|(id, _)| PLACEMENT_VOTERS.contains(id)).map(|(_, addr)| addr.clone()).collect();
        for prefix in prefixes {
            crate::admin::create_group(&seeds, prefix).await?;
        }
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            self.check_running()?;
            if self.ready(&seeds, prefixes).await {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "the cluster's groups had no leader after {READY_DEADLINE:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether every group of the routing table is ready, every prefix has its group, and
    /// every router answers for every group with a leader.
    async fn ready(&self, seeds: &[String], prefixes: &[String]) -> bool {
        let Ok(table) = crate::admin::routing_table(seeds, TABLE_PATIENCE).await else { return false };
        let routed: Vec<&str> = table.groups.iter().filter(|g| g.ready).filter_map(|g| g.descriptor.as_ref()).map(|d| d.prefix.as_str()).collect();
        if table.groups.iter().any(|g| !g.ready) || !prefixes.iter().all(|p| routed.contains(&p.as_str())) {
            return false;
        }
        for router in &self.router_addrs {
            let health = group_health(std::slice::from_ref(router), &table.groups).await;
            if health.iter().any(|h| h.leader.is_none()) {
                return false;
            }
        }
        true
    }

    /// Each process's CPU, in cores, over `window` with no client: what the cluster costs
    /// doing nothing (heartbeats, ticks, placement's rounds) — the JSON line of the idle run.
    async fn idle(&self, shape: Shape, window: Duration) -> anyhow::Result<serde_json::Value> {
        let pids: Vec<u32> = self.processes.iter().map(|p| p.child.id()).collect();
        let before = CpuSample::take(&pids)?;
        tokio::time::sleep(window).await;
        let used = CpuSample::take(&pids)?.since(&before);
        let cores: serde_json::Map<String, serde_json::Value> =
            self.processes.iter().zip(&used.per_process).map(|(process, cpu)| (process.label.clone(), json!(round3(cpu.cores)))).collect();
        let nodes: Vec<f64> = self
            .processes
            .iter()
            .zip(&used.per_process)
            .filter(|(process, _)| process.label.starts_with("node-"))
            .map(|(_, cpu)| cpu.cores)
            .collect();
        let node_mean = nodes.iter().sum::<f64>() / nodes.len().max(1) as f64;
        let node_max = nodes.iter().copied().fold(0.0, f64::max);
        Ok(json!({"bench": "cluster", "run": "idle", "nodes": shape.nodes, "routers": shape.routers, "groups": shape.groups,
                  "seconds": used.window.as_secs_f64(), "node_cores_mean": round3(node_mean), "node_cores_max": round3(node_max), "cpu_cores": cores}))
    }

    /// Synced writes of every node's store so far (`warden_storage_fsyncs_total`, summed).
    async fn fsyncs_total(&self) -> anyhow::Result<f64> {
        let mut total = 0.0;
        for addr in &self.metrics_addrs {
            let page = http_get(addr, "/metrics").await?;
            let line = page.lines().find(|line| line.starts_with(FSYNCS_METRIC)).ok_or_else(|| anyhow::anyhow!("{addr}: no {FSYNCS_METRIC}"))?;
            let value = line.rsplit(' ').next().unwrap_or_default();
            total += value.parse::<f64>().map_err(|e| anyhow::anyhow!("{addr}: {FSYNCS_METRIC} {value:?}: {e}"))?;
        }
        Ok(total)
    }

    /// How many of `prefixes`' groups each node leads, by label (`node-1` …), as a router
    /// sees it now.
    async fn leaders(&self, prefixes: &[String]) -> anyhow::Result<BTreeMap<String, usize>> {
        let seeds: Vec<String> = self.node_addrs.iter().map(|(_, addr)| addr.clone()).collect();
        let table = crate::admin::routing_table(&seeds, TABLE_PATIENCE).await?;
        let groups: Vec<_> = table.groups.into_iter().filter(|g| g.descriptor.as_ref().is_some_and(|d| prefixes.contains(&d.prefix))).collect();
        let mut leaders: BTreeMap<String, usize> = self.node_addrs.iter().map(|(id, _)| (format!("node-{id}"), 0)).collect();
        for health in group_health(&self.router_addrs, &groups).await {
            if let Some(count) = health.leader.and_then(|id| leaders.get_mut(&format!("node-{id}"))) {
                *count += 1;
            }
        }
        Ok(leaders)
    }
}

/// Runs every configuration and workload, one JSON line each, then the summary line.
pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.nodes.is_empty() && args.nodes.iter().all(|&n| n >= PLACEMENT_VOTERS.len() as u64),
        "--nodes must list node counts of at least {}",
        PLACEMENT_VOTERS.len()
    );
    anyhow::ensure!(args.routers != Some(0), "--routers must be at least 1");
    anyhow::ensure!(!args.groups.is_empty() && args.groups.iter().all(|&g| g > 0), "--groups must list positive group counts");
    anyhow::ensure!(args.groups_per_node != Some(0), "--groups-per-node must be positive");
    anyhow::ensure!(args.cpu_per_process.is_finite() && args.cpu_per_process >= 0.0, "--cpu-per-process must be a number of cores (0: uncapped)");
    anyhow::ensure!(
        !args.workloads.iter().any(|w| matches!(w, Workload::Watch | Workload::Election)),
        "watch and election have their own setups; use warden-loadgen against a running cluster for those"
    );
    // Ctrl-C drops the run, which stops the processes and removes the cgroups.
    tokio::select! {
        ran = run_all(&args) => ran,
        stop = tokio::signal::ctrl_c() => {
            stop?;
            anyhow::bail!("interrupted")
        }
    }
}

/// What limited one run: the cluster, or (`host_limited`) the host the model runs on.
struct HostUse {
    /// The load generator's CPU, cores, over the run (its warm-up included).
    loadgen_cores: f64,
    /// The cores the processes' quotas leave for the load generator (the host's without quotas).
    spare_cores: f64,
    /// The nodes' fsyncs per second over the run (its warm-up included).
    fsyncs_per_sec: f64,
    /// What the disk did alone, from as many writers as nodes.
    disk_fsyncs_per_sec: f64,
}

impl HostUse {
    /// Why the run's figure is the host's limit rather than the cluster's (`None`: it is the
    /// cluster's).
    fn limit(&self) -> Option<&'static str> {
        if host_limits::at_limit(self.loadgen_cores, self.spare_cores) {
            Some("the load generator used the cores the quotas leave")
        } else if host_limits::at_limit(self.fsyncs_per_sec, self.disk_fsyncs_per_sec) {
            Some("the shared disk was at the fsync rate it reaches alone")
        } else {
            None
        }
    }
}

async fn run_all(args: &ClusterArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    // Figures by workload and configuration (`None`: limited by the host).
    let mut rates = Rates::new();
    for shape in Shape::all(args) {
        let dir = super::fresh_dir(&root, "cluster")?;
        let disk_fsyncs_per_sec = host_limits::fsyncs_per_sec(&dir, shape.nodes as usize)?;
        let prefixes: Vec<String> = (0..shape.groups).map(prefix).collect();
        let mut cluster = ProcessCluster::start(args, shape, &dir)?;
        cluster.prepare(&prefixes).await?;
        if args.idle_seconds > 0.0 {
            println!("{}", cluster.idle(shape, Duration::from_secs_f64(args.idle_seconds)).await?);
        }
        for (&workload, &api) in args.workloads.iter().flat_map(|w| args.apis.iter().map(move |a| (w, a))) {
            let fsyncs_before = cluster.fsyncs_total().await?;
            let own_before = CpuSample::take(&[std::process::id()])?;
            let started = Instant::now();
            let report = load(args, &cluster, workload, api, shape).await?;
            let elapsed_s = started.elapsed().as_secs_f64();
            let own = CpuSample::take(&[std::process::id()])?.since(&own_before);
            let host = HostUse {
                loadgen_cores: own.per_process.first().map_or(0.0, |process| process.cores),
                spare_cores: if args.cpu_per_process > 0.0 {
                    host_limits::host_cores() - shape.quota_cores(args.cpu_per_process)
                } else {
                    host_limits::host_cores()
                },
                fsyncs_per_sec: (cluster.fsyncs_total().await? - fsyncs_before) / elapsed_s,
                disk_fsyncs_per_sec,
            };
            let leaders = cluster.leaders(&prefixes).await?;
            let cores: serde_json::Map<String, serde_json::Value> = cluster
                .processes
                .iter()
                .map(|process| {
                    let cores = report.server_processes.iter().find(|p| p.pid == process.child.id()).map(|p| round3(p.cores));
                    (process.label.clone(), json!(cores))
                })
                .collect();
            let total_cores: f64 = report.server_processes.iter().map(|p| p.cores).sum();
            let limit = host.limit();
            println!(
                "{}",
                json!({"bench": "cluster", "groups": shape.groups, "workload": workload.name(), "api": api.name(), "nodes": shape.nodes, "routers": shape.routers,
                       "cpu_per_process": args.cpu_per_process, "clients": report.clients, "clients_per_node": args.clients_per_node, "direct": args.direct,
                       "duration_s": report.duration_s,
                       "ops_per_sec": report.ops_per_sec, "p50_ms": report.p50_ms, "p99_ms": report.p99_ms,
                       "errors": report.errors, "errors_by_kind": report.errors_by_kind,
                       "server_cpu_us_per_op": report.server_cpu_us_per_op, "cpu_cores": cores,
                       "cpu_cores_total": round3(total_cores), "leaders": leaders,
                       "loadgen_cores": round3(host.loadgen_cores), "spare_cores": round3(host.spare_cores),
                       "fsyncs_per_sec": host.fsyncs_per_sec.round(), "disk_fsyncs_per_sec": host.disk_fsyncs_per_sec.round(),
                       "host_limited": limit})
            );
            let figure = if limit.is_none() { Some(report.ops_per_sec) } else { None };
            rates.entry((workload.name(), api)).or_default().insert((shape.nodes, shape.groups), figure);
        }
        drop(cluster);
    }
    std::fs::remove_dir_all(root.join("cluster"))?;
    println!("{}", summary(args, &rates));
    Ok(())
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// One workload's run through every router of `cluster` (of `shape`) and `api`, keys over
/// its groups' prefixes, with the CPU of every node and router process.
async fn load(args: &ClusterArgs, cluster: &ProcessCluster, workload: Workload, api: Api, shape: Shape) -> anyhow::Result<LoadReport> {
    let groups = shape.groups;
    let mut load = LoadCli::try_parse_from(["warden-loadgen", workload.name()])?.load;
    (load.target, load.endpoints) = match api {
        Api::Native => (TargetKind::Warden, cluster.router_addrs.clone()),
        Api::Etcd => (TargetKind::Etcd, cluster.etcd_addrs.clone()),
    };
    if args.direct && api == Api::Native {
        load.nodes = cluster.node_addrs.iter().map(|(_, addr)| addr.clone()).collect();
    }
    let nodes = shape.nodes as usize;
    (load.clients, load.conns) = match args.clients_per_node {
        Some(per_node) => (per_node * nodes, (args.conns * nodes).div_ceil(5)),
        None => (args.clients, args.conns),
    };
    // At least a connection per router, so every router takes a share of the clients.
    load.conns = load.conns.max(cluster.router_addrs.len());
    load.duration = args.seconds;
    load.warmup = args.warmup_seconds;
    load.prefixes = groups;
    load.label = format!("groups={groups}");
    // Election, the one workload that starts candidate processes, is refused above.
    let candidates = CandidateCommand { program: std::env::current_exe()?, args_prefix: Vec::new() };
    let cpu = CpuScope {
        pids: cluster.processes.iter().map(|p| p.child.id()).collect(),
        threads: warden_loadgen::cpu::Threads::All,
        scope: "node and router processes".into(),
    };
    Ok(warden_loadgen::run_load(&load, &candidates, Some(cpu)).await?)
}

/// The summary line: per workload (through the etcd API: `put via etcd` …), ops/s by
/// configuration (`null`: limited by the host), and the ratios of the largest configuration
/// over the smallest — by nodes when several node counts ran, else by groups; with both
/// APIs, each configuration's etcd-API rate over the native one (`etcd_vs_native`).
fn summary(args: &ClusterArgs, rates: &Rates) -> serde_json::Value {
    let mut workloads: serde_json::Map<String, serde_json::Value> = rates
        .iter()
        .map(|((workload, api), by_shape)| {
            let ratio = match (by_shape.first_key_value(), by_shape.last_key_value()) {
                (Some(((nodes_low, groups_low), Some(low))), Some(((nodes_high, groups_high), Some(high))))
                    if (nodes_high, groups_high) > (nodes_low, groups_low) && *low > 0.0 =>
                {
                    json!({"ratio": high / low, "of": {"nodes": nodes_high, "groups": groups_high}, "vs": {"nodes": nodes_low, "groups": groups_low}})
                }
                _ => serde_json::Value::Null,
            };
            let runs: Vec<serde_json::Value> =
                by_shape.iter().map(|((nodes, groups), rate)| json!({"nodes": nodes, "groups": groups, "ops_per_sec": rate})).collect();
            let name = match api {
                Api::Native => workload.to_string(),
                Api::Etcd => format!("{workload} via etcd"),
            };
            (name, json!({"runs": runs, "scaling": ratio}))
        })
        .collect();
    for ((workload, api), through_etcd) in rates {
        let Some(native) = rates.get(&(*workload, Api::Native)).filter(|_| *api == Api::Etcd) else { continue };
        let ratios: Vec<serde_json::Value> = through_etcd
            .iter()
            .map(|((nodes, groups), rate)| {
                let ratio = match (rate, native.get(&(*nodes, *groups)).copied().flatten()) {
                    (Some(etcd), Some(native)) if native > 0.0 => Some(etcd / native),
                    _ => None,
                };
                json!({"nodes": nodes, "groups": groups, "ratio": ratio})
            })
            .collect();
        if let Some(entry) = workloads.get_mut(&format!("{workload} via etcd")).and_then(|v| v.as_object_mut()) {
            entry.insert("etcd_vs_native".into(), json!(ratios));
        }
    }
    json!({"bench": "cluster", "run": "summary", "cpu_per_process": args.cpu_per_process, "workloads": workloads})
}
