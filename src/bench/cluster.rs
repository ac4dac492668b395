//! `warden bench cluster`: Warden's scaling on isolated nodes. A real multi-process cluster on
//! loopback — N `warden node` processes and R `warden router` processes, each started from this
//! binary, each with a data directory of its own — where every node and router process runs
//! in a CPU cgroup of its own with the same quota (`--cpu-per-process`). That models N + R
//! machines of that size on one host: a group's leader is held to its node's share of CPU as
//! it would be on a machine of its own, so what more shard groups buy shows, as it would not
//! on processes that share the host's cores freely.
//!
//! For each shard-group count a fresh cluster is bootstrapped with groups `/bench/p0` …; the
//! load generator's workloads (in this process, uncapped: the client is not a machine of the
//! cluster) spread their keys over every group through all routers. One JSON line per (groups,
//! workload): throughput, latency, errors, the CPU per operation of all node and router
//! processes, and each process's CPU in cores; then a summary line with the ratios.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;
use warden_loadgen::election::CandidateCommand;
use warden_loadgen::options::{prefix, LoadArgs, Workload};
use warden_loadgen::report::LoadReport;
use warden_loadgen::CpuScope;

use super::cgroup::CpuQuotas;
use crate::cli::status::group_health;

/// Flags of `warden bench cluster`.
#[derive(clap::Args)]
pub struct ClusterArgs {
    /// `warden node` processes (at least 3: the placement group's replicas are on nodes 1-3).
    #[arg(long, default_value_t = 5)]
    nodes: u64,
    /// `warden router` processes; the clients spread over all of them.
    #[arg(long, default_value_t = 1)]
    routers: u64,
    /// Shard-group counts to run, each on a freshly bootstrapped cluster (groups `/bench/p0` …;
    /// the clients spread their keys over all of them).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    groups: Vec<usize>,
    /// CPU quota of every node and router process, in cores: each runs in a CPU cgroup of its
    /// own (needs root and Linux cgroups, v1 or v2). 0: uncapped.
    #[arg(long, default_value_t = 0.25)]
    cpu_per_process: f64,
    /// The load generator's workloads to run on each cluster.
    #[arg(long, value_delimiter = ',', value_enum, default_value = "put,lock")]
    workloads: Vec<Workload>,
    /// Closed-loop clients.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Connections the clients share.
    #[arg(long, default_value_t = 10)]
    conns: usize,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Unmeasured seconds before each run.
    #[arg(long, default_value_t = 2.0)]
    warmup_seconds: f64,
    /// Port of router 1; routers take `base-port` … `base-port + routers - 1`, nodes the ports
    /// after them. (The default stays clear of `warden dev`'s 7100-7105.)
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    #[command(flatten)]
    data_dir: super::DataDir,
}

/// Placement replicas: nodes 1-3, as `warden dev` has them.
const PLACEMENT_VOTERS: [u64; 3] = [1, 2, 3];
/// How long a cluster may take to bootstrap and elect every group's leader.
const READY_DEADLINE: Duration = Duration::from_secs(120);
/// How long the routing table is asked for in one readiness check.
const TABLE_PATIENCE: Duration = Duration::from_secs(5);

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
    fn start(args: &ClusterArgs, dir: &Path) -> anyhow::Result<ProcessCluster> {
        let quotas = if args.cpu_per_process > 0.0 { Some(CpuQuotas::create(&format!("warden-bench-{}", std::process::id()))?) } else { None };
        let port = |offset: u64| -> anyhow::Result<String> {
            let port =
                u16::try_from(u64::from(args.base_port) + offset).map_err(|_| anyhow::anyhow!("--base-port leaves no room for every process"))?;
            Ok(format!("127.0.0.1:{port}"))
        };
        let router_addrs: Vec<String> = (0..args.routers).map(port).collect::<Result<_, _>>()?;
        let node_addrs: Vec<(u64, String)> = (1..=args.nodes).map(|id| Ok((id, port(args.routers + id - 1)?))).collect::<anyhow::Result<_>>()?;
        let mut cluster = ProcessCluster { processes: Vec::new(), quotas, node_addrs, router_addrs };
        let peers = cluster.node_addrs.iter().map(|(id, addr)| format!("{id}={addr}")).collect::<Vec<_>>().join(",");
        for (id, addr) in cluster.node_addrs.clone() {
            let data = dir.join(format!("node-{id}"));
            let data = data.to_str().ok_or_else(|| anyhow::anyhow!("{}: not UTF-8", data.display()))?;
            cluster.spawn(
                dir,
                &format!("node-{id}"),
                args.cpu_per_process,
                &["node", "--id", &id.to_string(), "--listen", &addr, "--data-dir", data, "--peers", &peers],
            )?;
        }
        let seeds = cluster.node_addrs.iter().map(|(_, addr)| addr.clone()).collect::<Vec<_>>().join(",");
        for (index, addr) in cluster.router_addrs.clone().iter().enumerate() {
            cluster.spawn(dir, &format!("router-{}", index + 1), args.cpu_per_process, &["router", "--listen", addr, "--seeds", &seeds])?;
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

/// Runs every group count and workload, one JSON line each, then the summary line.
pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes >= PLACEMENT_VOTERS.len() as u64, "--nodes must be at least {}", PLACEMENT_VOTERS.len());
    anyhow::ensure!(args.routers >= 1, "--routers must be at least 1");
    anyhow::ensure!(!args.groups.is_empty() && args.groups.iter().all(|&g| g > 0), "--groups must list positive group counts");
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

async fn run_all(args: &ClusterArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    let mut rates: BTreeMap<&'static str, BTreeMap<usize, f64>> = BTreeMap::new();
    for &groups in &args.groups {
        let dir = super::fresh_dir(&root, "cluster")?;
        let prefixes: Vec<String> = (0..groups).map(prefix).collect();
        let mut cluster = ProcessCluster::start(args, &dir)?;
        cluster.prepare(&prefixes).await?;
        for &workload in &args.workloads {
            let report = load(args, &cluster, workload, groups).await?;
            let leaders = cluster.leaders(&prefixes).await?;
            let cores: serde_json::Map<String, serde_json::Value> = cluster
                .processes
                .iter()
                .map(|process| {
                    let cores = report.server_processes.iter().find(|p| p.pid == process.child.id()).map(|p| (p.cores * 1000.0).round() / 1000.0);
                    (process.label.clone(), json!(cores))
                })
                .collect();
            let total_cores: f64 = report.server_processes.iter().map(|p| p.cores).sum();
            println!(
                "{}",
                json!({"bench": "cluster", "groups": groups, "workload": workload.name(), "nodes": args.nodes, "routers": args.routers,
                       "cpu_per_process": args.cpu_per_process, "clients": report.clients, "duration_s": report.duration_s,
                       "ops_per_sec": report.ops_per_sec, "p50_ms": report.p50_ms, "p99_ms": report.p99_ms,
                       "errors": report.errors, "errors_by_kind": report.errors_by_kind,
                       "server_cpu_us_per_op": report.server_cpu_us_per_op, "cpu_cores": cores,
                       "cpu_cores_total": (total_cores * 1000.0).round() / 1000.0, "leaders": leaders})
            );
            rates.entry(workload.name()).or_default().insert(groups, report.ops_per_sec);
        }
        drop(cluster);
    }
    std::fs::remove_dir_all(root.join("cluster"))?;
    println!("{}", summary(args, &rates));
    Ok(())
}

/// One workload's run through every router of `cluster`, keys over `groups` prefixes, with the
/// CPU of every node and router process.
async fn load(args: &ClusterArgs, cluster: &ProcessCluster, workload: Workload, groups: usize) -> anyhow::Result<LoadReport> {
    let mut load = LoadCli::try_parse_from(["warden-loadgen", workload.name()])?.load;
    load.endpoints = cluster.router_addrs.clone();
    load.clients = args.clients;
    load.conns = args.conns;
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

/// The summary line: per workload, ops/s by group count and the largest count's over the
/// smallest's.
fn summary(args: &ClusterArgs, rates: &BTreeMap<&'static str, BTreeMap<usize, f64>>) -> serde_json::Value {
    let workloads: serde_json::Map<String, serde_json::Value> = rates
        .iter()
        .map(|(workload, by_groups)| {
            let ratio = match (by_groups.first_key_value(), by_groups.last_key_value()) {
                (Some((fewest, low)), Some((most, high))) if most > fewest && *low > 0.0 => {
                    json!({"ratio": high / low, "of_groups": most, "vs_groups": fewest})
                }
                _ => serde_json::Value::Null,
            };
            let by_groups: serde_json::Map<String, serde_json::Value> = by_groups.iter().map(|(g, rate)| (g.to_string(), json!(rate))).collect();
            (workload.to_string(), json!({"ops_per_sec_by_groups": by_groups, "scaling": ratio}))
        })
        .collect();
    json!({"bench": "cluster", "run": "summary", "nodes": args.nodes, "routers": args.routers, "cpu_per_process": args.cpu_per_process, "workloads": workloads})
}
