//! The `warden` command line for using a cluster (like etcdctl, zkCli or `consul lock`):
//! reading and writing nodes, watches, transactions, locks around a command, elections,
//! sessions and a cluster overview. Every command talks to the routers of `--endpoints`.
//!
//! Output is human-readable by default; `--json` prints one JSON object per result (one per
//! line for streams). A failure prints one line `error: …` on stderr and exits with
//! [`EXIT_FAILURE`]; a malformed command line exits with [`EXIT_USAGE`].

mod elect;
mod lock;
mod nodes;
mod output;
mod session;
pub mod status;
mod txn;
mod watch;

use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::watch as signal_flag;

use warden_client::{Client, ClientConfig, SessionId};

pub use output::Output;

/// The exit codes, for `warden --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes of the commands using a cluster: 0 success; 1 failure (one line `error: …` on \
stderr, e.g. a missing node or a failed compare-and-swap); 2 malformed command line or input; \
3 `warden status` found a group without a leader or with fewer than a quorum plus one live \
voters. `warden lock` exits with its command's status (128 + N if killed by signal N; 126/127 if it \
cannot run). Endpoints: --endpoints or WARDEN_ENDPOINTS (default 127.0.0.1:7100, `warden dev`).";

/// Exit code of a command that failed (after printing `error: …`).
pub const EXIT_FAILURE: i32 = 1;
/// Exit code of a malformed command line or input (what clap uses too).
pub const EXIT_USAGE: i32 = 2;
/// Exit code of `warden status` when a group is unhealthy (no leader, or fewer than a
/// quorum plus one live voters), for scripts and probes.
pub const EXIT_UNHEALTHY: i32 = 3;

/// Flags every command takes.
#[derive(clap::Args, Clone, Debug)]
pub struct GlobalArgs {
    /// Router addresses, comma-separated `host:port` (failover in order).
    #[arg(long, global = true, env = "WARDEN_ENDPOINTS", value_delimiter = ',', default_value = "127.0.0.1:7100")]
    pub endpoints: Vec<String>,
    /// Print machine-readable JSON (one object per result, one per line for streams).
    #[arg(long, global = true)]
    pub json: bool,
    /// Deadline of one call to the cluster, in milliseconds (retries included).
    #[arg(long, global = true, default_value_t = 10_000, value_name = "MS")]
    pub timeout: u64,
    /// TLS (`--ca`, `--cert`, `--key`).
    #[command(flatten)]
    pub tls: crate::tls_args::TlsArgs,
}

impl GlobalArgs {
    /// The output mode these flags ask for.
    pub fn output(&self) -> Output {
        Output::new(self.json)
    }

    /// Connects a client to the routers.
    async fn client(&self) -> anyhow::Result<Client> {
        let config = ClientConfig {
            request_timeout: Duration::from_millis(self.timeout),
            tls: self.tls.load()?,
            token: self.tls.token.clone(),
            ..ClientConfig::new(self.endpoints.clone())
        };
        Ok(Client::connect(config).await?)
    }
}

/// The commands of the command line (flattened into `warden`'s own subcommands).
#[derive(clap::Subcommand)]
pub enum CliCommand {
    /// Print a node's data (raw bytes); `-w` also prints its stat.
    Get(nodes::GetArgs),
    /// Replace a node's data (`--version N`: only at that version, compare-and-swap).
    Set(nodes::SetArgs),
    /// Create a node and print its path.
    Create(nodes::CreateArgs),
    /// Delete a node (`-r`: with its subtree).
    Rm(nodes::RmArgs),
    /// List a node's children (`-l`: with their stats).
    Ls(nodes::LsArgs),
    /// Print a node's stat.
    Stat(nodes::StatArgs),
    /// Print the changes of a node (or subtree) as they happen, until Ctrl-C.
    Watch(watch::WatchArgs),
    /// Run a transaction read from stdin.
    #[command(long_about = txn::HELP)]
    Txn(txn::TxnArgs),
    /// Hold a lock while running a command: `warden lock /locks/job -- ./job.sh`.
    Lock(lock::LockArgs),
    /// Campaign for leadership and hold it until Ctrl-C (`--observe`: print leader changes).
    Elect(elect::ElectArgs),
    /// Create, inspect, renew and close sessions.
    #[command(subcommand)]
    Session(session::SessionCommand),
    /// Cluster overview: nodes, shard groups (with their leaders), routes.
    Status(status::StatusArgs),
}

/// Runs a command. A failure is returned for the caller to print with [`describe`] and to
/// exit with [`exit_code`] (an [`ExitWith`] is an exit status to pass on, not printed).
pub async fn run(command: CliCommand, global: GlobalArgs) -> anyhow::Result<()> {
    crate::tls_args::use_for_commands(&global.tls)?;
    let out = global.output();
    match command {
        CliCommand::Get(args) => nodes::get(args, &global.client().await?, out).await,
        CliCommand::Set(args) => nodes::set(args, &global.client().await?, out).await,
        CliCommand::Create(args) => nodes::create(args, &global.client().await?, out).await,
        CliCommand::Rm(args) => nodes::rm(args, &global.client().await?, out).await,
        CliCommand::Ls(args) => nodes::ls(args, &global.client().await?, out).await,
        CliCommand::Stat(args) => nodes::stat(args, &global.client().await?, out).await,
        CliCommand::Watch(args) => watch::run(args, &global.client().await?, out).await,
        CliCommand::Txn(args) => txn::run(args, &global.client().await?, out).await,
        CliCommand::Lock(args) => lock::run(args, &global.client().await?, out).await,
        CliCommand::Elect(args) => elect::run(args, &global.client().await?, out).await,
        CliCommand::Session(command) => session::run(command, &global.client().await?, out).await,
        CliCommand::Status(args) => status::run(args, &global, out).await,
    }
}

/// A malformed input found after parsing the command line (exits with [`EXIT_USAGE`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A command's own exit code, other than success (the exit status of `lock`'s command).
#[derive(Debug, thiserror::Error)]
#[error("exit status {0}")]
pub struct ExitWith(pub i32);

/// The exit code of a failed command.
pub fn exit_code(error: &anyhow::Error) -> i32 {
    if let Some(ExitWith(code)) = error.downcast_ref::<ExitWith>() {
        *code
    } else if error.downcast_ref::<UsageError>().is_some() {
        EXIT_USAGE
    } else {
        EXIT_FAILURE
    }
}

/// One line describing a failure (without the `error: ` prefix), in the words of a command
/// line: `/a/b: node does not exist`.
pub fn describe(error: &anyhow::Error) -> String {
    use warden_client::Error;
    let Some(client_error) = error.downcast_ref::<Error>() else {
        return format!("{error:#}");
    };
    let context = error.chain().next().filter(|_| error.chain().count() > 1).map(|c| format!("{c}: ")).unwrap_or_default();
    let message = match client_error {
        Error::NoNode { path } => format!("{path}: node does not exist"),
        Error::NodeExists { path } => format!("{path}: node already exists"),
        Error::BadVersion { path } => format!("{path}: version mismatch (the node changed)"),
        Error::NotEmpty { path } => format!("{path}: node has children (use -r to delete the subtree)"),
        Error::NoChildrenForEphemerals { path } => format!("{path}: ephemeral nodes cannot have children"),
        Error::InvalidPath { path, message } => format!("{path}: invalid path: {message}"),
        other => other.to_string(),
    };
    format!("{context}{message}")
}

/// Parses a session id: `0x…` hexadecimal (as printed) or decimal.
pub fn parse_session_id(text: &str) -> Result<SessionId, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map(SessionId).map_err(|e| format!("{text:?} is not a session id (0x… or decimal): {e}"))
}

/// Parses a duration in milliseconds.
pub fn parse_millis(text: &str) -> Result<Duration, String> {
    text.parse().map(Duration::from_millis).map_err(|e| format!("{text:?} is not a number of milliseconds: {e}"))
}

/// Set once Ctrl-C or SIGTERM arrived (after [`stop_requested`] was first called).
static STOP: OnceLock<Option<signal_flag::Receiver<bool>>> = OnceLock::new();

/// Starts listening for Ctrl-C and SIGTERM; `None` if the handlers cannot be installed.
fn listen_for_stop() -> Option<signal_flag::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).ok()?;
    let mut interrupt = signal(SignalKind::interrupt()).ok()?;
    let (stop, stopped) = signal_flag::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        stop.send_replace(true);
    });
    Some(stopped)
}

/// Installs the Ctrl-C and SIGTERM handlers of [`stop_requested`] now: a long-running
/// command calls it before it prints anything a caller may answer with a signal.
pub fn catch_stop_signals() {
    STOP.get_or_init(listen_for_stop);
}

/// Resolves once Ctrl-C or SIGTERM arrives (the ways a long-running command is asked to
/// stop). The first call installs the handlers (until then the signals end the process as
/// usual); from then on a signal is remembered, so one arriving between two calls is not
/// lost.
pub async fn stop_requested() {
    let Some(mut stopped) = STOP.get_or_init(listen_for_stop).clone() else {
        return std::future::pending().await;
    };
    if stopped.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reads a data argument: `-` means stdin, anything else is the bytes themselves.
pub fn data_arg(data: Option<&str>) -> anyhow::Result<Vec<u8>> {
    match data {
        Some("-") => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)?;
            Ok(bytes)
        }
        Some(text) => Ok(text.as_bytes().to_vec()),
        None => Ok(Vec::new()),
    }
}
