//! `warden watch`: prints a node's (or subtree's) changes as they happen.

use serde_json::Value;
use warden_client::{Client, EventKind, WatchEvent, WatchOptions};

use super::output::{data_inline, node_json, Output};
use super::{catch_stop_signals, stop_requested};

/// Flags of `warden watch`.
#[derive(clap::Args)]
pub struct WatchArgs {
    /// The node watched.
    path: String,
    /// Also every node below it.
    #[arg(short = 'r', long, visible_alias = "prefix")]
    recursive: bool,
    /// Start at this revision (inclusive; events already past are replayed); default: changes
    /// from now on.
    #[arg(long, value_name = "N", default_value_t = 0)]
    rev: u64,
    /// Exit after this many events.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Also print each node's previous data.
    #[arg(long)]
    prev: bool,
}

/// Runs the watch until Ctrl-C, `--count` events, or the server ends it.
pub async fn run(args: WatchArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    catch_stop_signals();
    let options = WatchOptions { recursive: args.recursive, start_revision: args.rev, prev_data: args.prev, ..WatchOptions::new(args.path.clone()) };
    let mut watcher = client.watch(options).await?;
    let mut seen = 0;
    while args.count.is_none_or(|count| seen < count) {
        let event = tokio::select! {
            () = stop_requested() => return Ok(()),
            event = watcher.next() => event?,
        };
        let Some(event) = event else { return Ok(()) };
        out.emit(event_json(&event), || event_text(&event))?;
        seen += 1;
    }
    Ok(())
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Created => "created",
        EventKind::Changed => "changed",
        EventKind::Deleted => "deleted",
    }
}

fn event_json(event: &WatchEvent) -> Value {
    let mut value = node_json(&event.node);
    if let Value::Object(object) = &mut value {
        object.insert("type".into(), Value::from(kind_name(event.kind)));
        object.insert("revision".into(), Value::from(event.revision));
        object.insert("group_id".into(), Value::from(event.group_id));
        if let Some(prev) = &event.prev {
            object.insert("prev".into(), node_json(prev));
        }
    }
    value
}

fn event_text(event: &WatchEvent) -> String {
    let mut line = format!("{} {} rev {}", kind_name(event.kind).to_uppercase(), event.node.path, event.revision);
    if event.kind != EventKind::Deleted {
        line.push(' ');
        line.push_str(&data_inline(&event.node.data));
    }
    if let Some(prev) = &event.prev {
        line.push_str(&format!(" (was {})", data_inline(&prev.data)));
    }
    line
}
