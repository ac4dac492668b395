//! `warden-loadgen`: drives a workload against a Warden, etcd or ZooKeeper cluster and
//! reports throughput and latency (see `warden-loadgen --help`).

use clap::Parser;
use warden_loadgen::election::CandidateCommand;
use warden_loadgen::options::LoadArgs;

/// Load generator for Warden, etcd and ZooKeeper.
#[derive(Parser)]
#[command(name = "warden-loadgen", version, about)]
struct Cli {
    #[command(flatten)]
    args: LoadArgs,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli.args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("warden-loadgen: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: LoadArgs) -> Result<(), warden_loadgen::LoadError> {
    if let Some(name) = &args.candidate {
        return warden_loadgen::run_candidate(&args, name).await;
    }
    let program = std::env::current_exe().map_err(warden_loadgen::LoadError::Program)?;
    let report = warden_loadgen::run_load(&args, &CandidateCommand { program, args_prefix: Vec::new() }, None).await?;
    if args.json {
        // A report is plain data: serializing it cannot fail.
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
