//! The `warden` binary: `warden dev` runs a local cluster, `warden node` / `warden router` /
//! `warden admin` a real deployment, `warden bench …` runs benchmarks, and the command line
//! (`warden get/set/create/rm/ls/stat/watch/txn/lock/elect/session/status`, in [`cli`]) uses
//! a cluster.

mod admin;
mod allocator;
mod backup;
mod bench;
mod cli;
mod dev;
mod node;
mod tls_args;

use clap::{Parser, Subcommand};

/// mimalloc, with a count of the heap in use for measurements (see allocator.rs).
#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

/// Warden: a sharded distributed lock and coordination service.
#[derive(Parser)]
#[command(name = "warden", version, about, after_help = cli::EXIT_CODES_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    global: cli::GlobalArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local cluster on loopback (5 nodes, placement, shard groups, a router) and
    /// keep it running until Ctrl-C.
    Dev(dev::DevArgs),
    /// Run a router: the public API, forwarded to shard groups by path.
    Router(RouterArgs),
    /// Run one shard-node of a multi-machine cluster.
    Node(node::NodeArgs),
    /// Cluster administration (bootstrap, shard groups).
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// Run a benchmark and print one JSON object per line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    #[command(flatten)]
    Cli(cli::CliCommand),
}

/// Flags of `warden router`.
#[derive(clap::Args)]
struct RouterArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: std::net::SocketAddr,
    /// Shard-node addresses to learn the cluster from (comma-separated `host:port`).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")]
    seeds: Vec<String>,
    /// Deadline of a request that sets none, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    request_timeout_ms: u64,
    /// Long-lived streams per node that carry forwarded calls in batches (0: one unary gRPC
    /// call per request).
    #[arg(long, default_value_t = 1)]
    batch_streams: usize,
    /// Calls per second each client principal (its certificate's name) may start through
    /// this router; over it, calls are refused RATE_LIMITED. Needs TLS. Default: no limit.
    #[arg(long)]
    requests_per_s_per_principal: Option<std::num::NonZeroU32>,
    /// Where to serve Prometheus metrics (`GET /metrics`). Default: not served.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Where to serve etcd's v3 API, for etcdctl and etcd client libraries (docs/etcd.md).
    /// Default: not served.
    #[arg(long)]
    etcd_listen: Option<std::net::SocketAddr>,
}

async fn run_router(args: RouterArgs, tls: &tls_args::TlsArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let config = warden_router::RouterConfig {
        request_timeout: std::time::Duration::from_millis(args.request_timeout_ms),
        batch_streams: args.batch_streams,
        tls: tls.load()?,
        requests_per_s_per_principal: args.requests_per_s_per_principal,
        metrics_listen: args.metrics_listen.map(std::net::TcpListener::bind).transpose()?.map(std::sync::Arc::new),
        etcd_listen: args.etcd_listen.map(std::net::TcpListener::bind).transpose()?.map(std::sync::Arc::new),
        ..warden_router::RouterConfig::new(args.seeds)
    };
    let metrics = args.metrics_listen.map(|addr| format!(", metrics on http://{addr}/metrics")).unwrap_or_default();
    let etcd = args.etcd_listen.map(|addr| format!(", etcd API on {addr}")).unwrap_or_default();
    println!("router listening on {}{metrics}{etcd}", args.listen);
    tokio::select! {
        served = warden_router::serve(listener, config) => served?,
        stop = tokio::signal::ctrl_c() => stop?,
    }
    Ok(())
}

/// A server process (`warden node`, `warden dev`) aborts on a panic in any thread or task,
/// after the panic is reported: a task that died (a transport sender, a service) could leave
/// part of a node dead while the process lives on, and a supervisor restarts a process that
/// ended, not one that half works. The engine's own threads fail the node the same way (its
/// `FatalPolicy`).
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!("a thread panicked: aborting the process so that a supervisor restarts it");
        std::process::abort();
    }));
}

/// Turns transparent huge pages off for this process (and the processes it starts). mimalloc
/// asks for huge pages on its arenas, and the kernel then zeroes a whole 2 MiB page at each
/// first touch of one: profiled under 1,000 put clients, `clear_page_erms` was 21% of
/// `warden dev`'s CPU, and with huge pages off the server CPU per put fell from 134 to 107 µs.
/// A kernel that refuses is no reason to stop: the process only runs slower.
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes no memory of ours.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result != 0 {
        eprintln!("warden: could not turn transparent huge pages off: {}", std::io::Error::last_os_error());
    }
}

fn main() {
    disable_transparent_huge_pages();
    let cli = Cli::parse();
    if let Command::Bench(command) = &cli.command {
        if command.measures_heap() {
            allocator::count_from_now();
        }
    }
    // Servers log what an operator needs (leader changes, snapshots, nodes down/up, storage
    // errors, slow fsyncs) at `info`; client commands keep stderr for their own errors.
    // `RUST_LOG` overrides both.
    let default_level = match cli.command {
        Command::Dev(_) | Command::Router(_) | Command::Node(_) => "info",
        Command::Admin(_) | Command::Bench(_) | Command::Cli(_) => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if matches!(cli.command, Command::Dev(_) | Command::Node(_)) {
        abort_on_panic();
    }
    let out = cli.global.output();
    let ran = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(anyhow::Error::from).and_then(|runtime| {
        runtime.block_on(async {
            match cli.command {
                Command::Dev(args) => dev::run(args).await,
                Command::Router(args) => run_router(args, &cli.global.tls).await,
                Command::Node(args) => node::run(args, &cli.global.tls).await,
                Command::Admin(command) => admin::run(command, out, &cli.global.tls).await,
                Command::Bench(command) => bench::run(command).await,
                Command::Cli(command) => cli::run(command, cli.global).await,
            }
        })
    });
    if let Err(error) = ran {
        if error.downcast_ref::<cli::ExitWith>().is_none() {
            eprintln!("error: {}", cli::describe(&error));
        }
        std::process::exit(cli::exit_code(&error));
    }
}
