//! The `warden` binary: `warden dev` runs a local cluster, `warden bench …` runs benchmarks.

mod bench;
mod dev;

use clap::{Parser, Subcommand};

/// Warden: a sharded distributed lock and coordination service.
#[derive(Parser)]
#[command(name = "warden", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a local 5-node cluster on loopback and keep it running until Ctrl-C.
    Dev(dev::DevArgs),
    /// Run a benchmark and print one JSON object per line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Dev(args) => dev::run(args).await,
            Command::Bench(command) => bench::run(command).await,
        }
    })
}
