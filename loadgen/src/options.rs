//! The command line of `warden-loadgen` (and `warden bench load`): the workload, the target,
//! and etcd-`benchmark`-style knobs.

use std::path::PathBuf;
use std::time::Duration;

use crate::driver::{Schedule, Stop};
use crate::target::{ReadConsistency, TargetKind};

/// What the clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Overwrite existing keys.
    Put,
    /// Read existing keys (`--consistency`).
    Get,
    /// Compare-and-set transactions: set a key if its version is still the one last seen.
    TxnCas,
    /// Create a new key, then delete it (one operation: the pair).
    CreateDelete,
    /// Acquire and release an exclusive lock (one operation: the pair); `--contention`
    /// clients share each lock.
    Lock,
    /// Explicit session keep-alives (Warden `KeepAlive`, etcd `LeaseKeepAlive`).
    SessionKeepalive,
    /// `--clients` watchers of one subtree, one writer; latency from each write's
    /// acknowledgement to its delivery at each watcher.
    Watch,
    /// Leader election failover: the leader's process is killed (SIGKILL); latency from the
    /// kill until another candidate leads.
    Election,
    /// Gets and puts, `--read-ratio` of them gets.
    Mixed,
}

impl Workload {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Get => "get",
            Workload::TxnCas => "txn-cas",
            Workload::CreateDelete => "create-delete",
            Workload::Lock => "lock",
            Workload::SessionKeepalive => "session-keepalive",
            Workload::Watch => "watch",
            Workload::Election => "election",
            Workload::Mixed => "mixed",
        }
    }
}

/// Flags of `warden-loadgen` and `warden bench load`.
#[derive(Clone, Debug, clap::Args)]
pub struct LoadArgs {
    /// What the clients do.
    #[arg(value_enum)]
    pub workload: Workload,
    /// The system under load.
    #[arg(long, value_enum, default_value = "warden")]
    pub target: TargetKind,
    /// `host:port` of the servers (Warden: routers), comma-separated. Default: the target's
    /// local default (Warden 127.0.0.1:7100, etcd 127.0.0.1:2379, ZooKeeper 127.0.0.1:2181).
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Warden only: node addresses (`host:port`, comma-separated) to read the routing table
    /// from; calls one group serves then go straight to its leader, the rest through the
    /// routers (the client library's direct calls). Empty: every call through the routers.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Connections the clients share (ZooKeeper: sessions; session workloads open one per
    /// client there). Warden's connections spread over the routers (connection `c` prefers
    /// router `c % routers`): give at least as many as routers.
    #[arg(long, default_value_t = 1)]
    pub conns: usize,
    /// Concurrent clients (watch: watchers; election: candidate processes, at least 2).
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0, conflicts_with = "total")]
    pub duration: f64,
    /// Stop after this many measured operations instead of after `--duration`.
    #[arg(long)]
    pub total: Option<u64>,
    /// Unmeasured seconds first.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Open loop: operations per second in total, due at fixed intervals; latency counts
    /// from when each was due. Without it: closed loop.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Keys of the run (created before the warmup).
    #[arg(long, default_value_t = 1000)]
    pub key_space: usize,
    /// Bytes of each value written.
    #[arg(long, default_value_t = 256)]
    pub value_bytes: usize,
    /// Spread keys over this many subtrees `/bench/p0` … (on Warden, one shard group each
    /// when created so).
    #[arg(long, default_value_t = 1)]
    pub prefixes: usize,
    /// How gets read.
    #[arg(long, value_enum, default_value = "linearizable")]
    pub consistency: ReadConsistency,
    /// Lock: clients per lock path.
    #[arg(long, default_value_t = 1)]
    pub contention: usize,
    /// Mixed: fraction of operations that are gets.
    #[arg(long, default_value_t = 0.9)]
    pub read_ratio: f64,
    /// Lease of the sessions of lock, session-keepalive and election (ms).
    #[arg(long, default_value_t = 5000)]
    pub session_ttl_ms: u64,
    /// Deadline of one operation (ms).
    #[arg(long, default_value_t = 10_000)]
    pub request_timeout_ms: u64,
    /// Server processes whose CPU time over the measured window, divided by the successful
    /// operations, is reported as `server_cpu_us_per_op`.
    #[arg(long, value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// Free text copied into the report (e.g. `groups=16`).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Print one JSON object for the run on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (charts inline, no network needed).
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Run as one candidate of the election workload (started by the load generator itself).
    #[arg(long, hide = true)]
    pub candidate: Option<String>,
}

/// Upper bounds on the knobs: a typo must not ask for a billion tasks.
pub const CLIENTS_MAX: usize = 100_000;
/// Most connections a run opens.
pub const CONNS_MAX: usize = 10_000;
/// Largest key space.
pub const KEY_SPACE_MAX: usize = 10_000_000;
/// Largest value (Warden's own limit is lower; the server's error is reported).
pub const VALUE_BYTES_MAX: usize = 16 << 20;
/// Most prefixes.
pub const PREFIXES_MAX: usize = 10_000;
/// Most candidate processes of the election workload.
pub const CANDIDATES_MAX: usize = 64;

/// A flag's value is out of range.
#[derive(Debug, thiserror::Error)]
#[error("invalid option: {0}")]
pub struct InvalidOption(pub String);

impl LoadArgs {
    /// Checks every knob against its bounds.
    pub fn validate(&self) -> Result<(), InvalidOption> {
        let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(InvalidOption(what)) };
        check((1..=CLIENTS_MAX).contains(&self.clients), format!("--clients must be 1..={CLIENTS_MAX}"))?;
        check((1..=CONNS_MAX).contains(&self.conns), format!("--conns must be 1..={CONNS_MAX}"))?;
        check((1..=KEY_SPACE_MAX).contains(&self.key_space), format!("--key-space must be 1..={KEY_SPACE_MAX}"))?;
        check(self.value_bytes <= VALUE_BYTES_MAX, format!("--value-bytes must be at most {VALUE_BYTES_MAX}"))?;
        check((1..=PREFIXES_MAX).contains(&self.prefixes), format!("--prefixes must be 1..={PREFIXES_MAX}"))?;
        check(self.contention >= 1, "--contention must be at least 1".into())?;
        check((0.0..=1.0).contains(&self.read_ratio), "--read-ratio must be between 0 and 1".into())?;
        check(self.duration.is_finite() && self.duration > 0.0 && self.duration <= 86_400.0, "--duration must be in (0, 86400] s".into())?;
        check(self.warmup.is_finite() && (0.0..=3600.0).contains(&self.warmup), "--warmup must be in [0, 3600] s".into())?;
        check(self.total != Some(0), "--total must be positive".into())?;
        check(self.rate.is_none_or(|rate| rate.is_finite() && rate > 0.0 && rate <= 10_000_000.0), "--rate must be in (0, 1e7] per second".into())?;
        check(self.session_ttl_ms >= 100, "--session-ttl-ms must be at least 100".into())?;
        check(self.request_timeout_ms >= 1, "--request-timeout-ms must be positive".into())?;
        check(
            self.workload != Workload::Election || (2..=CANDIDATES_MAX).contains(&self.clients),
            format!("election needs 2..={CANDIDATES_MAX} candidates (--clients)"),
        )?;
        Ok(())
    }

    /// The endpoints to use (the flag's, or the target's default).
    pub fn endpoints(&self) -> Vec<String> {
        if self.endpoints.is_empty() {
            vec![self.target.default_endpoint().to_string()]
        } else {
            self.endpoints.clone()
        }
    }

    /// The pacing of the run.
    pub fn schedule(&self) -> Schedule {
        let stop = match self.total {
            Some(total) => Stop::Total(total),
            None => Stop::After(Duration::from_secs_f64(self.duration)),
        };
        Schedule { warmup: Duration::from_secs_f64(self.warmup), stop, rate_per_sec: self.rate }
    }

    /// Key number `index` of the key space: spread round-robin over the prefixes.
    pub fn key(&self, index: usize) -> String {
        format!("{}/k{index}", prefix(index % self.prefixes))
    }
}

/// The subtree of prefix number `index`.
pub fn prefix(index: usize) -> String {
    format!("/bench/p{index}")
}
