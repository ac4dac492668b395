//! `warden elect PATH VALUE`: campaign in an election and hold leadership until Ctrl-C (or
//! `--observe`: print the leader as it changes), with the client's election recipe.

use std::time::Duration;

use serde_json::{json, Value};
use warden_client::recipes::election::{Election, Leader};
use warden_client::{Client, Session, SessionConfig};

use super::output::{data_inline, Output};
use super::{catch_stop_signals, parse_millis, stop_requested, UsageError};

/// Flags of `warden elect`.
#[derive(clap::Args)]
pub struct ElectArgs {
    /// The election (candidates are its children).
    path: String,
    /// The value to campaign with (what observers see as the leader's value).
    value: Option<String>,
    /// Do not campaign: print the leader each time it changes, until Ctrl-C.
    #[arg(long, conflicts_with = "value")]
    observe: bool,
    /// Exit after this many leader changes (with `--observe`).
    #[arg(long, value_name = "N", requires = "observe")]
    count: Option<u64>,
    /// TTL of the session holding the candidacy, in milliseconds.
    #[arg(long, default_value = "10000", value_parser = parse_millis, value_name = "MS")]
    session_ttl: Duration,
}

/// Campaigns (or observes) until Ctrl-C; leadership is resigned on the way out.
pub async fn run(args: ElectArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    catch_stop_signals();
    let config = SessionConfig { path_hint: Some(args.path.clone()), ..SessionConfig::new(args.session_ttl) };
    let session = client.session(config).await?;
    let election = Election::new(&session, args.path.clone());
    let outcome = if args.observe {
        observe(&election, &args, out).await
    } else {
        let value = args.value.clone().ok_or_else(|| UsageError("elect needs a VALUE (or --observe)".into()))?;
        campaign(&election, &session, &args.path, value, out).await
    };
    let closed = session.close().await;
    outcome?;
    Ok(closed?)
}

/// Campaigns, prints when leader, holds until Ctrl-C or the session ends, then resigns.
async fn campaign(election: &Election, session: &Session, path: &str, value: String, out: Output) -> anyhow::Result<()> {
    let leadership = tokio::select! {
        won = election.campaign(value.clone().into_bytes()) => won?,
        () = stop_requested() => return Ok(()),
    };
    let token = leadership.fencing_token();
    let shown = json!({ "event": "elected", "path": path, "value": value, "fencing_token": token, "candidate": leadership.path() });
    out.emit(shown, || format!("elected leader of {path} with {value:?} (fencing token {token}); Ctrl-C resigns"))?;
    let mut states = session.states();
    tokio::select! {
        () = stop_requested() => {}
        state = states.wait_for(|state| !state.is_live()) => {
            let state = state.map_or_else(|_| "ended".to_string(), |s| format!("{:?}", *s).to_lowercase());
            anyhow::bail!("{path}: leadership lost (session {state})");
        }
    }
    leadership.resign().await?;
    Ok(out.emit(json!({ "event": "resigned", "path": path }), || format!("resigned leadership of {path}"))?)
}

/// Prints the leader, then each change, until Ctrl-C or `--count` changes.
async fn observe(election: &Election, args: &ElectArgs, out: Output) -> anyhow::Result<()> {
    let mut observer = election.observe().await?;
    let mut seen = 0;
    while args.count.is_none_or(|count| seen < count) {
        let leader = tokio::select! {
            () = stop_requested() => return Ok(()),
            leader = observer.next() => leader?,
        };
        out.emit(leader_json(&args.path, leader.as_ref()), || leader_text(&args.path, leader.as_ref()))?;
        seen += 1;
    }
    Ok(())
}

fn leader_json(path: &str, leader: Option<&Leader>) -> Value {
    match leader {
        Some(leader) => {
            json!({ "path": path, "leader": { "value": String::from_utf8_lossy(&leader.value), "fencing_token": leader.fencing_token, "candidate": leader.path } })
        }
        None => json!({ "path": path, "leader": null }),
    }
}

fn leader_text(path: &str, leader: Option<&Leader>) -> String {
    match leader {
        Some(leader) => format!("leader of {path}: {} (fencing token {})", data_inline(&leader.value), leader.fencing_token),
        None => format!("{path}: no leader"),
    }
}
