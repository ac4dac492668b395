//! How results are printed: human-readable text or one JSON object per result.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};
use warden_client::{Node, NodeKind, Stat};

/// The output mode of a command.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    /// JSON instead of text.
    pub json: bool,
}

impl Output {
    /// JSON when `json`, else text.
    pub fn new(json: bool) -> Output {
        Output { json }
    }

    /// Prints one result on stdout: `value` as one JSON line in JSON mode, else the lines of
    /// `text`.
    pub fn emit(&self, value: Value, text: impl FnOnce() -> String) -> std::io::Result<()> {
        self.write_to(&mut std::io::stdout().lock(), value, text)
    }

    /// Prints one status line on stderr, in the same form as [`Output::emit`]. For commands
    /// that wrap another program (`warden lock -- CMD`): its stdout must stay exactly its own,
    /// so a pipe consumer never sees warden's lines (as with `flock` and `consul lock`).
    pub fn status(&self, value: Value, text: impl FnOnce() -> String) -> std::io::Result<()> {
        self.write_to(&mut std::io::stderr().lock(), value, text)
    }

    fn write_to(&self, sink: &mut impl Write, value: Value, text: impl FnOnce() -> String) -> std::io::Result<()> {
        if self.json {
            writeln!(sink, "{value}")?;
        } else {
            writeln!(sink, "{}", text())?;
        }
        sink.flush()
    }
}

/// Milliseconds since the Unix epoch (0 for earlier times).
pub fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A wall time as RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(time: SystemTime) -> String {
    let ms = epoch_ms(time);
    let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (h, m, s, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

/// The name of a node kind, as printed.
pub fn kind_name(stat: &Stat) -> &'static str {
    match (stat.ephemeral_owner, stat.kind) {
        (Some(_), _) => "ephemeral",
        (None, NodeKind::Persistent) => "persistent",
        (None, NodeKind::Container) => "container",
        (None, NodeKind::Ttl) => "ttl",
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A stat as a JSON object.
pub fn stat_json(stat: &Stat) -> Value {
    json!({
        "create_revision": stat.create_revision,
        "mod_revision": stat.mod_revision,
        "version": stat.version,
        "cversion": stat.cversion,
        "ephemeral_owner": stat.ephemeral_owner.map(|id| id.to_string()),
        "num_children": stat.num_children,
        "ctime_ms": epoch_ms(stat.ctime),
        "mtime_ms": epoch_ms(stat.mtime),
        "data_length": stat.data_length,
        "kind": kind_name(stat),
        "ttl_ms": stat.ttl.map(duration_ms),
    })
}

/// A stat as `key: value` lines.
pub fn stat_text(stat: &Stat) -> String {
    let mut lines = vec![
        format!("create_revision: {}", stat.create_revision),
        format!("mod_revision: {}", stat.mod_revision),
        format!("version: {}", stat.version),
        format!("cversion: {}", stat.cversion),
        format!("num_children: {}", stat.num_children),
        format!("data_length: {}", stat.data_length),
        format!("kind: {}", kind_name(stat)),
        format!("ctime: {}", rfc3339(stat.ctime)),
        format!("mtime: {}", rfc3339(stat.mtime)),
    ];
    if let Some(owner) = stat.ephemeral_owner {
        lines.push(format!("ephemeral_owner: {owner}"));
    }
    if let Some(ttl) = stat.ttl {
        lines.push(format!("ttl_ms: {}", duration_ms(ttl)));
    }
    lines.join("\n")
}

/// Data in JSON: `"data"` as a string when it is UTF-8, else `"data_hex"`.
pub fn insert_data(object: &mut Map<String, Value>, data: &[u8]) {
    match std::str::from_utf8(data) {
        Ok(text) => object.insert("data".into(), Value::from(text)),
        Err(_) => object.insert("data_hex".into(), Value::from(data.iter().map(|b| format!("{b:02x}")).collect::<String>())),
    };
}

/// A node (path, data, stat) as a JSON object.
pub fn node_json(node: &Node) -> Value {
    let mut object = Map::new();
    object.insert("path".into(), Value::from(node.path.clone()));
    insert_data(&mut object, &node.data);
    object.insert("stat".into(), stat_json(&node.stat));
    Value::Object(object)
}

/// Data for one line of text: quoted, with control characters and invalid UTF-8 escaped.
pub fn data_inline(data: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_wall_times() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(1_764_427_313_123)), "2025-11-29T14:41:53.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00.000Z");
    }
}
