//! `warden lock PATH -- COMMAND…` (like `consul lock`): runs a command while holding a lock.
//!
//! The lock is acquired first (waiting as long as it takes). The command then runs with
//! `WARDEN_FENCING_TOKEN` and `WARDEN_LOCK_PATH` in its environment. If the hold can no longer
//! be relied on (the session is in jeopardy or has ended) the command is killed (SIGTERM, then
//! SIGKILL after `--kill-grace`). When the command exits the lock is released and `warden`
//! exits with the command's status (128 + N when killed by signal N). SIGTERM and Ctrl-C are
//! passed on to the command. Warden's own "acquired"/"released" lines go to stderr: the
//! command's stdout is exactly its own.

use std::process::ExitStatus;
use std::time::Duration;

use serde_json::json;
use tokio::process::{Child, Command};
use warden_client::{Client, LockMode, LockOptions, SessionConfig};

use super::output::Output;
use super::{catch_stop_signals, parse_millis, stop_requested, ExitWith};

/// Exit status when the command cannot be run (as in POSIX shells).
const EXIT_CANNOT_RUN: i32 = 126;
/// Exit status when the command is not found (as in POSIX shells).
const EXIT_NOT_FOUND: i32 = 127;

/// How long a lost lock's release is tried before giving up.
const RELEASE_PATIENCE: Duration = Duration::from_secs(2);

/// Flags of `warden lock`.
#[derive(clap::Args)]
pub struct LockArgs {
    /// The lock (a node path).
    path: String,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<String>,
    /// A shared lock (any number of shared holders, no exclusive one) instead of exclusive.
    #[arg(long)]
    shared: bool,
    /// Give up (exit 1) if the lock is not acquired within this many milliseconds.
    #[arg(long, value_parser = parse_millis, value_name = "MS")]
    wait: Option<Duration>,
    /// TTL of the session holding the lock, in milliseconds.
    #[arg(long, default_value = "10000", value_parser = parse_millis, value_name = "MS")]
    session_ttl: Duration,
    /// Time the command gets to exit after SIGTERM before SIGKILL, in milliseconds.
    #[arg(long, default_value = "5000", value_parser = parse_millis, value_name = "MS")]
    kill_grace: Duration,
}

/// Why the command stopped running.
enum Ended {
    /// It exited by itself.
    Exited(ExitStatus),
    /// The lock could not be relied on any more; it was killed.
    LockLost(String),
    /// We were asked to stop; the signal was passed on and it exited.
    Stopped(ExitStatus),
}

/// Acquires the lock, runs the command, releases the lock; fails with the command's exit
/// status when it is not 0.
pub async fn run(args: LockArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    catch_stop_signals();
    let config = SessionConfig { path_hint: Some(args.path.clone()), ..SessionConfig::new(args.session_ttl) };
    let session = client.session(config).await?;
    let mode = if args.shared { LockMode::Shared } else { LockMode::Exclusive };
    // Without `--wait`, as long as it takes, keeping its place in the queue.
    let options = LockOptions { mode, wait: args.wait.unwrap_or(Duration::MAX), ..LockOptions::default() };
    let acquiring = session.lock_with(&args.path, &options);
    let guard = tokio::select! {
        acquired = acquiring => acquired?,
        () = stop_requested() => None,
    };
    let Some(guard) = guard else {
        session.close().await?;
        anyhow::bail!("{}: lock not acquired", args.path);
    };
    let token = guard.fencing_token();
    let value = json!({ "event": "acquired", "path": args.path, "fencing_token": token, "session_id": session.id().to_string() });
    out.status(value, || format!("acquired {} (fencing token {token})", args.path))?;

    let spawned = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("WARDEN_FENCING_TOKEN", token.to_string())
        .env("WARDEN_LOCK_PATH", &args.path)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            guard.unlock().await?;
            session.close().await?;
            let code = if error.kind() == std::io::ErrorKind::NotFound { EXIT_NOT_FOUND } else { EXIT_CANNOT_RUN };
            eprintln!("error: {}: {error}", args.command[0]);
            return Err(ExitWith(code).into());
        }
    };

    let mut states = session.states();
    let ended = tokio::select! {
        status = child.wait() => Ended::Exited(status?),
        state = states.wait_for(|state| !state.is_live()) => {
            let why = state.map_or_else(|_| "the session ended".to_string(), |s| format!("session {:?}", *s).to_lowercase());
            stop(&mut child, args.kill_grace).await?;
            Ended::LockLost(why)
        }
        () = stop_requested() => Ended::Stopped(stop(&mut child, args.kill_grace).await?),
    };
    match ended {
        Ended::Exited(status) | Ended::Stopped(status) => {
            guard.unlock().await?;
            session.close().await?;
            let code = exit_status_code(status);
            out.status(json!({ "event": "released", "path": args.path, "exit_code": code }), || format!("released {}", args.path))?;
            match code {
                0 => Ok(()),
                code => Err(ExitWith(code).into()),
            }
        }
        Ended::LockLost(why) => {
            // The hold may still exist (jeopardy): release it if the cluster answers soon.
            let _ = tokio::time::timeout(RELEASE_PATIENCE, async {
                let _ = guard.unlock().await;
                let _ = session.close().await;
            })
            .await;
            anyhow::bail!("{}: lock lost ({why}); the command was killed", args.path)
        }
    }
}

/// Asks the child to stop (SIGTERM), then kills it after `grace`; returns its status.
async fn stop(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    if let Some(pid) = child.id().and_then(|pid| libc::pid_t::try_from(pid).ok()) {
        // SAFETY: kill(2) with the pid of our own child, which has not been reaped yet (we
        // hold its handle and have not waited for it).
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            child.kill().await?;
            child.wait().await
        }
    }
}

/// A shell's view of an exit status: the code, or 128 + the signal that killed it.
fn exit_status_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(super::EXIT_FAILURE)
}
