//! `warden bench …`: benchmarks of the hot paths, each printing JSON lines.

mod engine;
mod locks;
mod namespace;

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
}

/// Runs a benchmark.
pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Engine(args) => engine::run(args).await,
        BenchCommand::Namespace(args) => namespace::run(args).await,
        BenchCommand::Locks(args) => locks::run(args).await,
    }
}

/// Default directory for benchmark data: on the ordinary disk (not tmpfs), outside the
/// source tree.
pub fn default_data_dir() -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("warden-bench")
}
