//! `warden session …`: sessions by hand (to own ephemeral nodes created with
//! `warden create --session ID`, or to inspect and end a program's session).

use std::time::Duration;

use serde_json::{json, Value};
use warden_client::{Client, SessionConfig, SessionId, SessionLease, SessionState};

use super::output::Output;
use super::{catch_stop_signals, parse_millis, parse_session_id, stop_requested};

/// `warden session` subcommands.
#[derive(clap::Subcommand)]
pub enum SessionCommand {
    /// Create a session, print its id, and keep it alive until Ctrl-C (then close it).
    Create {
        /// The lease asked for, in milliseconds (the server may raise or cap it).
        #[arg(long, default_value = "10000", value_parser = parse_millis, value_name = "MS")]
        ttl: Duration,
        /// Home the session in the group serving this path (near its ephemerals).
        #[arg(long)]
        path_hint: Option<String>,
    },
    /// Print a session's lease and number of ephemeral nodes.
    Info {
        /// The session (`0x…` or decimal).
        #[arg(value_parser = parse_session_id)]
        id: SessionId,
    },
    /// Renew a session's lease once.
    Keepalive {
        /// The session (`0x…` or decimal).
        #[arg(value_parser = parse_session_id)]
        id: SessionId,
    },
    /// Close a session now (its ephemeral nodes and locks go with it).
    Close {
        /// The session (`0x…` or decimal).
        #[arg(value_parser = parse_session_id)]
        id: SessionId,
    },
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn lease_json(id: SessionId, lease: &SessionLease) -> Value {
    json!({
        "session_id": id.to_string(),
        "alive": lease.alive,
        "granted_ttl_ms": ms(lease.granted_ttl),
        "remaining_ms": ms(lease.remaining),
    })
}

fn lease_text(id: SessionId, lease: &SessionLease) -> String {
    match lease.alive {
        true => format!("session {id}: alive, ttl {} ms, {} ms left", ms(lease.granted_ttl), ms(lease.remaining)),
        false => format!("session {id}: ended"),
    }
}

/// Runs a session command.
pub async fn run(command: SessionCommand, client: &Client, out: Output) -> anyhow::Result<()> {
    match command {
        SessionCommand::Create { ttl, path_hint } => {
            catch_stop_signals();
            let session = client.session(SessionConfig { path_hint, ..SessionConfig::new(ttl) }).await?;
            let id = session.id();
            let value = json!({ "session_id": id.to_string(), "ttl_ms": ms(session.ttl()) });
            out.emit(value, || id.to_string())?;
            eprintln!("session {id} (ttl {} ms) is kept alive until Ctrl-C, then closed", ms(session.ttl()));
            let mut states = session.states();
            tokio::select! {
                () = stop_requested() => Ok(session.close().await?),
                _ = states.wait_for(|state| *state == SessionState::Expired) => anyhow::bail!("session {id} expired"),
            }
        }
        SessionCommand::Info { id } => {
            let info = client.session_info(id).await?;
            let mut value = lease_json(id, &info.lease);
            if let Value::Object(object) = &mut value {
                object.insert("ephemerals".into(), Value::from(info.ephemerals));
            }
            Ok(out.emit(value, || format!("{}, {} ephemeral nodes", lease_text(id, &info.lease), info.ephemerals))?)
        }
        SessionCommand::Keepalive { id } => {
            let lease = client.keep_alive(id, client.request_timeout()).await?;
            out.emit(lease_json(id, &lease), || lease_text(id, &lease))?;
            match lease.alive {
                true => Ok(()),
                false => Err(warden_client::Error::SessionExpired.into()),
            }
        }
        SessionCommand::Close { id } => {
            let deleted = client.close_session(id).await?;
            let value = json!({ "session_id": id.to_string(), "closed": true, "deleted": deleted });
            Ok(out.emit(value, || format!("closed session {id} ({deleted} ephemeral nodes deleted)"))?)
        }
    }
}
