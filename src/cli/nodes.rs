//! Node commands: `get`, `set`, `create`, `rm`, `ls`, `stat`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde_json::{json, Map, Value};
use warden_client::{ChildrenOptions, Client, CreateMode, CreateOptions, DeleteOptions, Error, SessionConfig, SessionId, SessionState};

use super::output::{kind_name, node_json, rfc3339, stat_json, stat_text, Output};
use super::{catch_stop_signals, data_arg, parse_millis, parse_session_id, stop_requested};

/// Flags of `warden get`.
#[derive(clap::Args)]
pub struct GetArgs {
    /// The node.
    path: String,
    /// Also print the node's stat (after the data).
    #[arg(short = 'w', long = "with-stat")]
    with_stat: bool,
}

/// Flags of `warden set`.
#[derive(clap::Args)]
pub struct SetArgs {
    /// The node.
    path: String,
    /// The new data (`-` reads it from stdin).
    data: String,
    /// Only if the node is at this version (compare-and-swap).
    #[arg(long)]
    version: Option<u64>,
}

/// Flags of `warden create`.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// The node (for `--sequential`, the prefix of its name).
    path: String,
    /// Its data (`-` reads it from stdin; none: empty).
    data: Option<String>,
    /// Ephemeral: owned by a session created for this command, and deleted when the command
    /// ends (it runs until Ctrl-C). With `--session`, owned by that session instead (the
    /// command returns at once).
    #[arg(short = 'e', long, conflicts_with_all = ["container", "ttl"])]
    ephemeral: bool,
    /// The session owning the ephemeral node (`0x…` as printed by `warden session create`);
    /// implies `--ephemeral`.
    #[arg(long, value_parser = parse_session_id, conflicts_with_all = ["container", "ttl"])]
    session: Option<SessionId>,
    /// TTL of the session created for `--ephemeral`, in milliseconds.
    #[arg(long, default_value = "10000", value_parser = parse_millis, value_name = "MS")]
    session_ttl: Duration,
    /// Append a 10-digit counter to the name.
    #[arg(short = 's', long)]
    sequential: bool,
    /// A container: removed with its last child.
    #[arg(short = 'c', long, conflicts_with = "ttl")]
    container: bool,
    /// A TTL node: removed after this many milliseconds without a change and children.
    #[arg(long, value_parser = parse_millis, value_name = "MS")]
    ttl: Option<Duration>,
    /// Create missing parents.
    #[arg(short = 'p', long)]
    parents: bool,
}

/// Flags of `warden rm`.
#[derive(clap::Args)]
pub struct RmArgs {
    /// The node.
    path: String,
    /// Delete the whole subtree.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// Only if the node is at this version.
    #[arg(long)]
    version: Option<u64>,
}

/// Flags of `warden ls`.
#[derive(clap::Args)]
pub struct LsArgs {
    /// The node whose children are listed.
    #[arg(default_value = "/")]
    path: String,
    /// Long listing: kind, version, children, data length, modification time, name.
    #[arg(short = 'l', long)]
    long: bool,
}

/// Flags of `warden stat`.
#[derive(clap::Args)]
pub struct StatArgs {
    /// The node.
    path: String,
}

/// `warden get`: the data as raw bytes (a newline added only on a terminal).
pub async fn get(args: GetArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let node = client.get(&args.path).await?;
    if out.json {
        let mut value = node_json(&node);
        if !args.with_stat {
            if let Value::Object(object) = &mut value {
                object.remove("stat");
            }
        }
        return Ok(out.emit(value, String::new)?);
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&node.data)?;
    let ends_line = node.data.last() == Some(&b'\n') || node.data.is_empty();
    if args.with_stat {
        if !ends_line {
            writeln!(stdout)?;
        }
        writeln!(stdout, "{}", stat_text(&node.stat))?;
    } else if !ends_line && stdout.is_terminal() {
        writeln!(stdout)?;
    }
    Ok(stdout.flush()?)
}

/// `warden set`.
pub async fn set(args: SetArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let stat = client.set(&args.path, data_arg(Some(&args.data))?, args.version).await?;
    let value = json!({ "path": args.path, "stat": stat_json(&stat) });
    Ok(out.emit(value, || format!("{} version {}", args.path, stat.version))?)
}

/// `warden create`: prints the created path; an ephemeral node without `--session` lives
/// until Ctrl-C.
pub async fn create(args: CreateArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let data = data_arg(args.data.as_deref())?;
    let own_session = match (args.ephemeral, args.session) {
        (true, None) => {
            catch_stop_signals();
            let config = SessionConfig { path_hint: Some(args.path.clone()), ..SessionConfig::new(args.session_ttl) };
            Some(client.session(config).await?)
        }
        _ => None,
    };
    let mode = match (args.session.or(own_session.as_ref().map(|s| s.id())), args.ttl) {
        (Some(session), _) => CreateMode::Ephemeral(session),
        (None, Some(ttl)) => CreateMode::Ttl(ttl),
        (None, None) if args.container => CreateMode::Container,
        (None, None) => CreateMode::Persistent,
    };
    let options = CreateOptions { mode, sequential: args.sequential, create_parents: args.parents };
    let created = client.create(&args.path, data, &options).await?;
    let session_id = own_session.as_ref().map(|s| s.id().to_string());
    let value = json!({ "path": created.path, "stat": stat_json(&created.stat), "session_id": session_id });
    out.emit(value, || created.path.clone())?;
    let Some(session) = own_session else { return Ok(()) };
    eprintln!("{}: ephemeral node of session {}; it lives until this command ends (Ctrl-C)", created.path, session.id());
    let mut states = session.states();
    tokio::select! {
        () = stop_requested() => {}
        ended = states.wait_for(|state| *state == SessionState::Expired) => {
            if ended.is_ok() {
                return Err(Error::SessionExpired.into());
            }
        }
    }
    Ok(session.close().await?)
}

/// `warden rm`: prints how many nodes went.
pub async fn rm(args: RmArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let options = DeleteOptions { expected_version: args.version, recursive: args.recursive };
    let deleted = client.delete(&args.path, &options).await?;
    let value = json!({ "path": args.path, "deleted": deleted });
    Ok(out.emit(value, || format!("deleted {deleted} node{}", if deleted == 1 { "" } else { "s" }))?)
}

/// `warden ls`: one child per line, page by page.
pub async fn ls(args: LsArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let mut children = client.children(&args.path, ChildrenOptions { with_stats: args.long, page_size: 0 });
    let base = args.path.trim_end_matches('/');
    while let Some(page) = children.next_page().await? {
        for child in page.children {
            let path = format!("{base}/{}", child.name);
            let mut object = Map::new();
            object.insert("name".into(), Value::from(child.name.clone()));
            object.insert("path".into(), Value::from(path));
            if let Some(stat) = &child.stat {
                object.insert("stat".into(), stat_json(stat));
            }
            out.emit(Value::Object(object), || match &child.stat {
                Some(stat) => format!(
                    "{:<10} v{:<5} {:>6} children {:>8} B  {}  {}",
                    kind_name(stat),
                    stat.version,
                    stat.num_children,
                    stat.data_length,
                    rfc3339(stat.mtime),
                    child.name
                ),
                None => child.name.clone(),
            })?;
        }
    }
    Ok(())
}

/// `warden stat`.
pub async fn stat(args: StatArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let stat = client.exists(&args.path).await?.ok_or_else(|| Error::NoNode { path: args.path.clone() })?;
    let mut object = Map::new();
    object.insert("path".into(), Value::from(args.path.clone()));
    object.insert("stat".into(), stat_json(&stat));
    Ok(out.emit(Value::Object(object), || format!("path: {}\n{}", args.path, stat_text(&stat)))?)
}
