//! The election workload: candidates in separate processes campaign in one election; the
//! leader's process is killed with SIGKILL (a crash: no resignation, no session close), and
//! the latency is from the kill until another candidate says it leads. That is the failover
//! time a user's service sees: the dead leader's session must expire (its TTL) before the
//! next candidate is elected. A new candidate replaces each one killed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::driver::{Measured, Progress, Stop};
use crate::options::{prefix, LoadArgs};
use crate::target::{Connection, OpError, Target};

/// What a candidate prints when it leads.
const LEADS: &str = "LEADS";
/// Lines a candidate may print before the reader stops listening to it.
const CANDIDATE_LINES_MAX: usize = 64;

/// How the load generator starts itself as a candidate: its program and the arguments that
/// come before the load flags (`["bench", "load"]` for `warden bench load`).
#[derive(Clone, Debug)]
pub struct CandidateCommand {
    /// The program (the running executable).
    pub program: PathBuf,
    /// Arguments before the workload's own.
    pub args_prefix: Vec<String>,
}

/// The election's node.
fn election_path() -> String {
    format!("{}/election", prefix(0))
}

/// Candidate mode: campaign as `name`, say so on stdout when leading, then hold the
/// leadership until killed.
pub async fn candidate<T: Target>(target: &T, name: &str) -> Result<(), OpError> {
    let mut connection = target.connect(0, true).await?;
    connection.upsert(&election_path(), b"").await?;
    connection.open_session().await?;
    connection.campaign(&election_path(), name).await?;
    println!("{LEADS} {name}");
    // Lead until killed: the parent's SIGKILL is the end of this process.
    std::future::pending::<()>().await;
    Ok(())
}

/// One running candidate process.
struct Candidate {
    name: String,
    child: Child,
}

/// Starts candidate `name`; its "leads" line goes to `leads`.
fn spawn(command: &CandidateCommand, args: &LoadArgs, name: &str, leads: mpsc::Sender<(String, Instant)>) -> Result<Candidate, OpError> {
    let mut child = Command::new(&command.program);
    child
        .args(&command.args_prefix)
        .arg("election")
        .args(["--target", args.target.name()])
        .args(["--endpoints", &args.endpoints().join(",")])
        .args(["--session-ttl-ms", &args.session_ttl_ms.to_string()])
        .args(["--request-timeout-ms", &args.request_timeout_ms.to_string()])
        .args(["--candidate", name])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = child.spawn().map_err(|error| OpError::new("spawn", format!("starting candidate {name}: {error}")))?;
    let stdout = child.stdout.take().ok_or_else(|| OpError::new("spawn", "a candidate without stdout"))?;
    let name_owned = name.to_string();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        for _ in 0..CANDIDATE_LINES_MAX {
            match lines.next_line().await {
                Ok(Some(line)) if line.trim() == format!("{LEADS} {name_owned}") => {
                    let _ = leads.send((name_owned.clone(), Instant::now())).await;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    });
    Ok(Candidate { name: name.to_string(), child })
}

/// Runs failovers until the stop and returns their latencies (kill → next leader).
pub async fn run(command: &CandidateCommand, args: &LoadArgs, progress: &Progress) -> Result<Measured, OpError> {
    let (leads_sender, mut leads) = mpsc::channel(super::options::CANDIDATES_MAX * 2);
    let mut candidates = Vec::with_capacity(args.clients);
    let mut spawned = 0usize;
    let mut next_name = || {
        spawned += 1;
        format!("candidate-{spawned}")
    };
    for _ in 0..args.clients {
        candidates.push(spawn(command, args, &next_name(), leads_sender.clone())?);
    }
    // Long enough for a session to expire and a campaign to finish on a loaded machine.
    let failover_timeout = Duration::from_millis(args.session_ttl_ms) * 4 + Duration::from_secs(30);
    let first = tokio::time::timeout(failover_timeout, leads.recv()).await;
    let Ok(Some((mut leader, _))) = first else {
        return Err(OpError::new("no_leader", format!("no candidate led within {failover_timeout:?}")));
    };
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let mut measured = Measured::empty();
    let mut failovers = 0u64;
    loop {
        let now = Instant::now();
        let done = match args.schedule().stop {
            Stop::After(duration) => now >= measure_from + duration,
            Stop::Total(total) => failovers >= total,
        };
        if done {
            break;
        }
        let Some(position) = candidates.iter().position(|candidate| candidate.name == leader) else {
            return Err(OpError::new("internal", format!("the leader {leader} is not a running candidate")));
        };
        let mut killed = candidates.swap_remove(position);
        // SIGKILL: the leader crashes without resigning.
        killed.child.start_kill().map_err(|error| OpError::new("kill", format!("killing {}: {error}", killed.name)))?;
        let killed_at = Instant::now();
        let _ = killed.child.wait().await;
        candidates.push(spawn(command, args, &next_name(), leads_sender.clone())?);
        let next = loop {
            match tokio::time::timeout(failover_timeout, leads.recv()).await {
                // A stale line of the killed leader itself cannot come after its kill, but
                // be strict: only another candidate counts.
                Ok(Some((name, at))) if name != leader => break Some((name, at)),
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break None,
            }
        };
        let Some((name, at)) = next else {
            measured.record_error(OpError::new("no_leader", format!("no new leader within {failover_timeout:?} of killing {leader}")));
            break;
        };
        if killed_at >= measure_from {
            measured.record_ok(at.saturating_duration_since(killed_at), at.saturating_duration_since(measure_from).as_secs() as usize);
            failovers += 1;
        }
        progress.add(1);
        leader = name;
    }
    measured.window = Instant::now().saturating_duration_since(measure_from);
    Ok(measured)
}
