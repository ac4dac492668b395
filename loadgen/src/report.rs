//! The report of one run: built from what the driver measured and the run's options, shown
//! as a table, one JSON object, or an HTML page ([`crate::html`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::cpu::{CpuUsed, ProcessCpu};
use crate::driver::Measured;
use crate::options::{LoadArgs, Workload};
use crate::target::ReadConsistency;
use crate::workload::reads_with;

/// Quantiles of the latency curve kept in a report (the HTML plot's points): 0, then
/// `1 - 10^(-k/10)` for k = 1..=50 (90 %, 99 %, 99.9 % … to 99.999 %).
fn curve_quantiles() -> impl Iterator<Item = f64> {
    std::iter::once(0.0).chain((1..=50).map(|k| 1.0 - 10f64.powf(-(k as f64) / 10.0)))
}

/// One run, as the table, `--json` and `--html` show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadReport {
    /// The system driven.
    pub target: &'static str,
    /// The workload.
    pub workload: &'static str,
    /// Concurrent clients (watch: watchers; election: candidates).
    pub clients: usize,
    /// Connections shared by the clients.
    pub conns: usize,
    /// Open-loop arrival rate (operations per second), `None` for a closed loop.
    pub rate: Option<f64>,
    /// Seconds measured.
    pub duration_s: f64,
    /// Successful measured operations (watch: events delivered; election: failovers).
    pub ops: u64,
    /// `ops / duration_s`.
    pub ops_per_sec: f64,
    /// Latency percentiles of the successful operations, ms.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Slowest.
    pub max_ms: f64,
    /// Failed measured operations.
    pub errors: u64,
    /// Failed measured operations by kind.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// The first message of each error kind.
    pub error_examples: BTreeMap<String, String>,
    /// Bytes of each value written.
    pub value_bytes: usize,
    /// Keys of the run.
    pub key_space: usize,
    /// Subtrees the keys are spread over.
    pub prefixes: usize,
    /// How reads were served (get and mixed only).
    pub consistency: Option<ReadConsistency>,
    /// Clients per lock (lock only).
    pub contention: Option<usize>,
    /// Fraction of gets (mixed only).
    pub read_ratio: Option<f64>,
    /// The user's label.
    pub label: String,
    /// Server CPU time over the measured window per successful operation, µs (with
    /// `--server-pids`, or for `warden bench load`'s in-process cluster).
    pub server_cpu_us_per_op: Option<f64>,
    /// What `server_cpu_us_per_op` covers.
    pub cpu_scope: Option<String>,
    /// Each server process's CPU over the measured window (pid, CPU seconds, cores), in the
    /// order the pids were given; empty without server pids.
    pub server_processes: Vec<ProcessCpu>,
    /// Successful operations completed in each second of the measured window.
    pub timeline: Vec<u64>,
    /// The latency curve: `[quantile, ms]` points from 0 to 99.999 %.
    pub percentiles: Vec<[f64; 2]>,
    /// Watch: the writer's acknowledged writes per second.
    pub writes_per_sec: Option<f64>,
    /// Watch: the writer's p99 write latency, ms.
    pub write_p99_ms: Option<f64>,
    /// When the run ended (seconds since the Unix epoch).
    pub finished_unix_s: u64,
}

/// Milliseconds of a µs histogram value.
fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

impl LoadReport {
    /// The report of a run of `args` that measured `measured` (and, for watch, a writer that
    /// measured `writer`), with `server_cpu` used by the servers over the window.
    pub fn new(args: &LoadArgs, measured: &Measured, writer: Option<&Measured>, server_cpu: Option<(CpuUsed, String)>) -> LoadReport {
        let histogram = &measured.histogram;
        let seconds = measured.window.as_secs_f64().max(f64::MIN_POSITIVE);
        let ops = histogram.len();
        let quantile = |q: f64| if ops == 0 { 0.0 } else { ms(histogram.value_at_quantile(q)) };
        let server_processes = server_cpu.as_ref().map_or_else(Vec::new, |(cpu, _)| cpu.per_process.clone());
        let (server_cpu_us_per_op, cpu_scope) = match server_cpu {
            Some((cpu, scope)) if ops > 0 => (Some(cpu.total().as_secs_f64() * 1e6 / ops as f64), Some(scope)),
            _ => (None, None),
        };
        LoadReport {
            target: args.target.name(),
            workload: args.workload.name(),
            clients: args.clients,
            conns: args.conns,
            rate: args.rate,
            duration_s: seconds,
            ops,
            ops_per_sec: ops as f64 / seconds,
            p50_ms: quantile(0.50),
            p90_ms: quantile(0.90),
            p99_ms: quantile(0.99),
            p999_ms: quantile(0.999),
            max_ms: if ops == 0 { 0.0 } else { ms(histogram.max()) },
            errors: measured.errors(),
            errors_by_kind: measured.errors_by_kind.iter().map(|(kind, count)| (kind.to_string(), *count)).collect(),
            error_examples: measured.error_examples.iter().map(|(kind, message)| (kind.to_string(), message.clone())).collect(),
            value_bytes: args.value_bytes,
            key_space: args.key_space,
            prefixes: args.prefixes,
            consistency: reads_with(args),
            contention: (args.workload == Workload::Lock).then_some(args.contention),
            read_ratio: (args.workload == Workload::Mixed).then_some(args.read_ratio),
            label: args.label.clone(),
            server_cpu_us_per_op,
            cpu_scope,
            server_processes,
            timeline: measured.timeline.clone(),
            percentiles: curve_quantiles().map(|q| [q, quantile(q)]).collect(),
            writes_per_sec: writer.map(|writer| writer.histogram.len() as f64 / writer.window.as_secs_f64().max(f64::MIN_POSITIVE)),
            write_p99_ms: writer.map(|writer| if writer.histogram.is_empty() { 0.0 } else { ms(writer.histogram.value_at_quantile(0.99)) }),
            finished_unix_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs()),
        }
    }

    /// The run's parameters as `(name, value)` rows (the table's header and the HTML page's).
    pub fn parameters(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![
            ("target", self.target.to_string()),
            ("workload", self.workload.to_string()),
            ("clients", self.clients.to_string()),
            ("conns", self.conns.to_string()),
            ("loop", self.rate.map_or("closed".to_string(), |rate| format!("open, {rate} ops/s"))),
            ("measured", format!("{:.1} s", self.duration_s)),
            ("value bytes", self.value_bytes.to_string()),
            ("key space", self.key_space.to_string()),
            ("prefixes", self.prefixes.to_string()),
        ];
        if let Some(consistency) = self.consistency {
            rows.push(("consistency", format!("{consistency:?}").to_lowercase()));
        }
        if let Some(contention) = self.contention {
            rows.push(("contention", contention.to_string()));
        }
        if let Some(ratio) = self.read_ratio {
            rows.push(("read ratio", ratio.to_string()));
        }
        if !self.label.is_empty() {
            rows.push(("label", self.label.clone()));
        }
        rows
    }

    /// The results as `(name, value)` rows.
    pub fn results(&self) -> Vec<(&'static str, String)> {
        let mut rows = vec![
            ("throughput", format!("{:.1} ops/s ({} ops)", self.ops_per_sec, self.ops)),
            ("p50", format!("{:.3} ms", self.p50_ms)),
            ("p90", format!("{:.3} ms", self.p90_ms)),
            ("p99", format!("{:.3} ms", self.p99_ms)),
            ("p99.9", format!("{:.3} ms", self.p999_ms)),
            ("max", format!("{:.3} ms", self.max_ms)),
        ];
        if let (Some(writes), Some(p99)) = (self.writes_per_sec, self.write_p99_ms) {
            rows.push(("writer", format!("{writes:.1} writes/s, p99 {p99:.3} ms")));
        }
        if let Some(cpu) = self.server_cpu_us_per_op {
            let scope = self.cpu_scope.as_deref().unwrap_or("server");
            rows.push(("cpu per op", format!("{cpu:.1} µs ({scope})")));
        }
        if !self.server_processes.is_empty() {
            let cores: Vec<String> = self.server_processes.iter().map(|process| format!("{} {:.2}", process.pid, process.cores)).collect();
            rows.push(("cores by pid", cores.join(", ")));
        }
        rows.push(("errors", self.errors.to_string()));
        for (kind, count) in &self.errors_by_kind {
            let example = self.error_examples.get(kind).map(|message| format!(" (e.g. {message})")).unwrap_or_default();
            rows.push(("  error", format!("{kind}: {count}{example}")));
        }
        rows
    }

    /// The plain-text table printed after a run.
    pub fn table(&self) -> String {
        let rows: Vec<_> = self.parameters().into_iter().chain(std::iter::once(("", String::new()))).chain(self.results()).collect();
        let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (name, value) in rows {
            if name.is_empty() {
                let _ = writeln!(out, "{}", "-".repeat(width + 24));
            } else {
                let _ = writeln!(out, "{name:<width$}  {value}");
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: LoadArgs,
    }

    pub(crate) fn args(flags: &[&str]) -> LoadArgs {
        Cli::parse_from(std::iter::once("warden-loadgen").chain(flags.iter().copied())).args
    }

    pub(crate) fn measured() -> Measured {
        let mut measured = Measured::empty();
        for latency_ms in 1..=100 {
            measured.record_ok(Duration::from_millis(latency_ms), (latency_ms / 50) as usize);
        }
        measured.record_error(crate::target::OpError::new("timeout", "deadline exceeded"));
        measured.window = Duration::from_secs(2);
        measured
    }

    /// CPU used by processes 1, 2, … (`cpu_s` each) over `window`.
    fn used(cpu_s: &[f64], window: Duration) -> CpuUsed {
        let per_process = (1..).zip(cpu_s).map(|(pid, &cpu_s)| ProcessCpu { pid, cpu_s, cores: cpu_s / window.as_secs_f64() }).collect();
        CpuUsed { per_process, window }
    }

    #[test]
    fn the_report_has_the_fields_the_json_promises() {
        let report = LoadReport::new(
            &args(&["lock", "--clients", "8", "--contention", "4"]),
            &measured(),
            None,
            Some((used(&[0.03, 0.02], Duration::from_secs(2)), "server".into())),
        );
        let json: serde_json::Value = serde_json::to_value(&report).expect("a report serializes");
        for field in
            ["target", "workload", "clients", "ops_per_sec", "p50_ms", "p99_ms", "errors", "errors_by_kind", "timeline", "server_cpu_us_per_op"]
        {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["target"], "warden");
        assert_eq!(json["workload"], "lock");
        assert_eq!(json["clients"], 8);
        assert_eq!(json["contention"], 4);
        assert_eq!(json["errors"], 1);
        assert_eq!(json["errors_by_kind"]["timeout"], 1);
        assert_eq!(json["ops_per_sec"], 50.0, "100 ops over 2 s");
        assert_eq!(json["timeline"], serde_json::json!([49, 50, 1]));
        // 50 ms of server CPU over 100 operations.
        assert!((report.server_cpu_us_per_op.unwrap_or_default() - 500.0).abs() < 1e-6);
        assert_eq!(json["server_processes"][1], serde_json::json!({"pid": 2, "cpu_s": 0.02, "cores": 0.01}));
        assert!((report.p50_ms - 50.0).abs() < 0.1 && (report.p99_ms - 99.0).abs() < 0.1, "{} {}", report.p50_ms, report.p99_ms);
        assert!(report.percentiles.windows(2).all(|pair| pair[0][0] < pair[1][0] && pair[0][1] <= pair[1][1]), "the curve rises");
    }

    #[test]
    fn the_table_shows_percentiles_errors_by_kind_and_the_parameters() {
        let report = LoadReport::new(&args(&["get", "--consistency", "stale", "--rate", "500"]), &measured(), None, None);
        let table = report.table();
        for expected in ["workload", "get", "consistency", "stale", "open, 500 ops/s", "p99.9", "timeout: 1 (e.g. deadline exceeded)", "50.0 ops/s"] {
            assert!(table.contains(expected), "{expected:?} missing from\n{table}");
        }
        assert!(!table.contains("cpu per op"), "no CPU without --server-pids");
    }

    #[test]
    fn an_empty_run_reports_zeros_not_garbage() {
        let report = LoadReport::new(&args(&["put"]), &Measured::empty(), None, Some((used(&[1.0], Duration::from_secs(1)), "server".into())));
        assert_eq!(report.ops, 0);
        assert_eq!(report.p99_ms, 0.0);
        assert_eq!(report.server_cpu_us_per_op, None, "no operation to divide by");
        assert!(report.ops_per_sec.is_finite());
    }
}
