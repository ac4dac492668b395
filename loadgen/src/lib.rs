//! Warden's load generator: the workloads users run against Warden, etcd or ZooKeeper
//! (`warden-loadgen`, `warden bench load`), closed or open loop, reported as a table, JSON or
//! an HTML page; and the closed-loop helper, linearizability checker and watch validators the
//! other benchmarks and tests use.
//!
//! Code map: [`options`] (the command line) → [`run_load`] picks the [`target`] and the
//! workload ([`workload`], [`watch_delivery`], [`election`]) → [`driver`] paces the clients
//! and records latencies → [`report`] / [`html`] show them; [`cpu`] reads the servers' CPU.

pub mod cpu;
pub mod driver;
pub mod election;
pub mod html;
pub mod linearizability;
pub mod options;
pub mod report;
pub mod target;
pub mod watch_check;
pub mod watch_delivery;
pub mod workload;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use driver::{ClientLoop, Measured, Progress, Schedule, Stop};
use election::CandidateCommand;
use options::{LoadArgs, Workload};
use report::LoadReport;
use target::{ConnectOptions, OpError, Target, TargetKind};

/// Why a run could not be made (operation failures during the run are counted in the report
/// instead).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A flag is out of range.
    #[error(transparent)]
    InvalidOption(#[from] options::InvalidOption),
    /// Connecting, or creating the key space, failed.
    #[error("setup failed: {0}")]
    Setup(#[from] OpError),
    /// The servers' CPU time could not be read.
    #[error(transparent)]
    Cpu(#[from] cpu::CpuError),
    /// The HTML report could not be written.
    #[error("writing the HTML report: {0}")]
    Html(std::io::Error),
    /// The running program's path (to start election candidates) is unknown.
    #[error("finding the running program: {0}")]
    Program(std::io::Error),
}

/// Where the servers' CPU time is read: `threads` of `pids`, described as `scope` in the report.
#[derive(Clone, Debug)]
pub struct CpuScope {
    /// The processes.
    pub pids: Vec<u32>,
    /// Which of their threads count.
    pub threads: cpu::Threads,
    /// What they are (e.g. "server" or "process: cluster, router and load generator").
    pub scope: String,
}

/// Runs the workload `args` describe and returns its report (also writing `--html` if asked).
/// `candidates` says how to start election candidates; `cpu` where server CPU is read (the
/// `--server-pids` when `None`).
pub async fn run_load(args: &LoadArgs, candidates: &CandidateCommand, cpu: Option<CpuScope>) -> Result<LoadReport, LoadError> {
    args.validate()?;
    let cpu = cpu.or_else(|| {
        (!args.server_pids.is_empty()).then(|| CpuScope { pids: args.server_pids.clone(), threads: cpu::Threads::All, scope: "server".into() })
    });
    let options = connect_options(args, args.conns);
    let report = match args.target {
        TargetKind::Warden => run_on(&target::warden::WardenTarget::connect(&options).await?, args, candidates, cpu).await?,
        TargetKind::Etcd => run_on(&target::etcd::EtcdTarget::connect(&options).await?, args, candidates, cpu).await?,
        TargetKind::Zookeeper => run_on(&target::zookeeper::ZookeeperTarget::connect(&options).await?, args, candidates, cpu).await?,
    };
    if let Some(path) = &args.html {
        std::fs::write(path, html::render(&report)).map_err(LoadError::Html)?;
    }
    Ok(report)
}

/// Election candidate mode (`--candidate NAME`): campaign, say so, lead until killed.
pub async fn run_candidate(args: &LoadArgs, name: &str) -> Result<(), LoadError> {
    let options = connect_options(args, 1);
    match args.target {
        TargetKind::Warden => election::candidate(&target::warden::WardenTarget::connect(&options).await?, name).await?,
        TargetKind::Etcd => election::candidate(&target::etcd::EtcdTarget::connect(&options).await?, name).await?,
        TargetKind::Zookeeper => election::candidate(&target::zookeeper::ZookeeperTarget::connect(&options).await?, name).await?,
    }
    Ok(())
}

/// How the targets connect for `args`, with `conns` shared connections.
fn connect_options(args: &LoadArgs, conns: usize) -> ConnectOptions {
    ConnectOptions {
        endpoints: args.endpoints(),
        nodes: args.nodes.clone(),
        conns,
        session_ttl: Duration::from_millis(args.session_ttl_ms),
        request_timeout: Duration::from_millis(args.request_timeout_ms),
    }
}

/// Sets up and runs the workload on `target`, measuring server CPU over the measured window.
async fn run_on<T: Target>(target: &T, args: &LoadArgs, candidates: &CandidateCommand, cpu: Option<CpuScope>) -> Result<LoadReport, LoadError> {
    let progress = Progress::default();
    let bar = progress_bar(args, &progress);
    // The CPU sample at the start of the measured window is taken when the warmup ends.
    let warmup = Duration::from_secs_f64(args.warmup);
    let start_cpu_clock = || {
        cpu.clone().map(|cpu| {
            tokio::spawn(async move {
                tokio::time::sleep(warmup).await;
                cpu::CpuSample::take_threads(&cpu.pids, &cpu.threads)
            })
        })
    };
    let (measured, writer, cpu_start) = match args.workload {
        Workload::Watch => {
            let cpu_start = start_cpu_clock();
            let (delivered, wrote) = watch_delivery::run(target, args, &progress).await?;
            (delivered, Some(wrote), cpu_start)
        }
        Workload::Election => {
            let cpu_start = start_cpu_clock();
            (election::run(candidates, args, &progress).await?, None, cpu_start)
        }
        _ => {
            // The clients' setup (the key space; a session each for lock, which takes seconds
            // at 1,000 clients) comes before the driver's warmup, so the CPU clock starts with
            // the driver: otherwise the window would cover setup the operations do not.
            let clients = workload::key_clients(target, args).await?;
            let cpu_start = start_cpu_clock();
            (driver::run(clients, args.schedule(), &progress).await, None, cpu_start)
        }
    };
    let server_cpu = match (cpu, cpu_start) {
        (Some(cpu), Some(start)) => {
            let start = start.await.map_err(|error| OpError::new("internal", format!("the CPU sampler failed: {error}")))??;
            Some((cpu::CpuSample::take_threads(&cpu.pids, &cpu.threads)?.since(&start), cpu.scope))
        }
        _ => None,
    };
    if let Some(bar) = bar {
        bar.abort();
    }
    Ok(LoadReport::new(args, &measured, writer.as_ref(), server_cpu))
}

/// Shows progress on stderr while a run lasts (only when stderr is a terminal); the returned
/// task is aborted when the run ends.
fn progress_bar(args: &LoadArgs, progress: &Progress) -> Option<tokio::task::JoinHandle<()>> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let (length, by_ops) = match args.schedule().stop {
        Stop::After(duration) => (((args.warmup + duration.as_secs_f64()) * 10.0) as u64, false),
        Stop::Total(total) => (total, true),
    };
    let bar = indicatif::ProgressBar::new(length);
    let template = if by_ops { "{bar:40} {pos}/{len} ops {msg}" } else { "{bar:40} {elapsed}/{duration} {msg}" };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    let progress = progress.clone();
    let started = tokio::time::Instant::now();
    Some(tokio::spawn(async move {
        let mut last = (started, 0u64);
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let (now, completed) = (tokio::time::Instant::now(), progress.completed());
            let rate = (completed - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
            last = (now, completed);
            bar.set_position(if by_ops { completed } else { (now.duration_since(started).as_secs_f64() * 10.0) as u64 });
            bar.set_message(format!("{completed} ops, {rate:.0} ops/s"));
        }
    }))
}

/// Result of one closed-loop run (the `warden bench` commands' summary).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunReport {
    /// Concurrent clients.
    pub clients: usize,
    /// Operations that succeeded inside the measured window.
    pub ops: u64,
    /// Operations that failed inside the measured window.
    pub errors: u64,
    /// Length of the measured window.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_sec: f64,
    /// Median latency of successful operations.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// 99.9th percentile latency.
    pub p999_ms: f64,
    /// Slowest operation.
    pub max_ms: f64,
}

/// A closed-loop client made of a closure: `op(client, seq)`.
struct FnClient<F> {
    op: Arc<F>,
    index: usize,
}

impl<F, Fut, E> ClientLoop for FnClient<F>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Send,
{
    async fn op(&mut self, seq: u64) -> Result<(), OpError> {
        (self.op)(self.index, seq).await.map_err(|_| OpError::new("failed", "the operation failed"))
    }
}

/// Runs `op(client, seq)` in a loop on each of `clients` tasks: first for `warmup` (not
/// measured), then for `measure`. Each client starts its next operation when the previous
/// one finishes (closed loop).
pub async fn closed_loop<F, Fut, E>(clients: usize, warmup: Duration, measure: Duration, op: F) -> RunReport
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Send,
{
    let op = Arc::new(op);
    let clients_loops = (0..clients).map(|index| FnClient { op: op.clone(), index }).collect();
    let schedule = Schedule { warmup, stop: Stop::After(measure), rate_per_sec: None };
    let measured = driver::run(clients_loops, schedule, &Progress::default()).await;
    summary(clients, &measured)
}

/// The closed-loop summary of what a run measured.
fn summary(clients: usize, measured: &Measured) -> RunReport {
    let (histogram, seconds) = (&measured.histogram, measured.window.as_secs_f64().max(f64::MIN_POSITIVE));
    let ms = |micros: u64| micros as f64 / 1000.0;
    RunReport {
        clients,
        ops: histogram.len(),
        errors: measured.errors(),
        seconds,
        ops_per_sec: histogram.len() as f64 / seconds,
        p50_ms: ms(histogram.value_at_quantile(0.50)),
        p99_ms: ms(histogram.value_at_quantile(0.99)),
        p999_ms: ms(histogram.value_at_quantile(0.999)),
        max_ms: ms(histogram.max()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_only_the_measured_window_and_errors_apart() {
        let report = closed_loop(4, Duration::from_millis(50), Duration::from_millis(200), |client, _| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if client == 0 {
                Err(())
            } else {
                Ok(())
            }
        })
        .await;
        assert_eq!(report.clients, 4);
        assert!(report.errors > 0, "client 0 always fails");
        assert!(report.ops > 0, "clients 1..4 succeed");
        // Three successful clients at ≥ 5 ms per op over 200 ms cannot exceed 120 ops.
        assert!(report.ops <= 3 * 200 / 5, "ops {} counted outside the window", report.ops);
        assert!(report.p50_ms >= 5.0);
    }
}
