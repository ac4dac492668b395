//! `warden txn`: a transaction written in a small line format on stdin.

use std::io::Read;

use serde_json::{json, Value};
use warden_client::{Client, Compare, CompareOp, CreateMode, CreateOptions, DeleteOptions, Txn, TxnOp, TxnOpResult, TxnResult};

use super::output::{data_inline, node_json, stat_json, Output};
use super::UsageError;

/// The long help of `warden txn` (the input format).
pub const HELP: &str = "\
Run a transaction read from stdin: if every `compare` holds, the `then` operations run,
else the `else` ones; atomically, at one revision, in the one shard group serving every path.

One statement per line; blank lines and lines starting with # are ignored. Words are separated
by spaces; quote data containing spaces with \"…\" or '…' (\\n, \\t, \\\\ and \\\" work inside \"…\").

  compare version PATH OP N           OP is one of = != < >
  compare create_revision PATH OP N   (create_revision = 0: the node does not exist)
  compare mod_revision PATH OP N
  compare value PATH OP DATA
  compare exists PATH
  compare missing PATH
  then|else get PATH
  then|else set PATH DATA [--version N]
  then|else create PATH [DATA] [-p] [-s] [--container] [--ttl MS]
  then|else rm PATH [-r] [--version N]

Example:
  compare version /a = 3
  compare exists /b
  then set /a new-data
  then create /c data
  else get /a

Prints whether the compares held (SUCCEEDED or FAILED) and the result of each operation that
ran. Exits 0 either way (a malformed input exits 2).";

/// Flags of `warden txn` (the transaction itself comes from stdin).
#[derive(clap::Args)]
pub struct TxnArgs {}

/// Reads the transaction from stdin, runs it and prints the results.
pub async fn run(_args: TxnArgs, client: &Client, out: Output) -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let txn = parse(&input)?;
    let result = client.txn(&txn).await?;
    Ok(out.emit(result_json(&result), || result_text(&result))?)
}

/// Parses the input format of [`HELP`].
pub fn parse(input: &str) -> Result<Txn, UsageError> {
    let mut txn = Txn::new();
    for (index, line) in input.lines().enumerate() {
        let line_error = |message: String| UsageError(format!("txn line {}: {message}", index + 1));
        let words = split_words(line).map_err(line_error)?;
        let Some((keyword, rest)) = words.split_first() else { continue };
        if keyword.starts_with('#') {
            continue;
        }
        match keyword.as_str() {
            "compare" => txn.compares.push(parse_compare(rest).map_err(line_error)?),
            "then" => txn.then.push(parse_op(rest).map_err(line_error)?),
            "else" => txn.otherwise.push(parse_op(rest).map_err(line_error)?),
            other => return Err(line_error(format!("expected compare, then or else, not {other:?}"))),
        }
    }
    Ok(txn)
}

/// Splits a line into words, honoring quotes.
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let Some(&first) = chars.peek() else { return Ok(words) };
        let mut word = String::new();
        if first == '"' || first == '\'' {
            chars.next();
            loop {
                match (chars.next(), first) {
                    (None, _) => return Err(format!("unterminated {first}")),
                    (Some(c), quote) if c == quote => break,
                    (Some('\\'), '"') => match chars.next() {
                        Some('n') => word.push('\n'),
                        Some('t') => word.push('\t'),
                        Some(c) => word.push(c),
                        None => return Err("a line ends with \\".into()),
                    },
                    (Some(c), _) => word.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                word.push(c);
            }
        }
        words.push(word);
    }
}

fn number(word: &str) -> Result<u64, String> {
    word.parse().map_err(|_| format!("{word:?} is not a number"))
}

fn compare_op(word: &str) -> Result<CompareOp, String> {
    match word {
        "=" | "==" => Ok(CompareOp::Equal),
        "!=" => Ok(CompareOp::NotEqual),
        "<" => Ok(CompareOp::Less),
        ">" => Ok(CompareOp::Greater),
        other => Err(format!("{other:?} is not one of = != < >")),
    }
}

fn parse_compare(words: &[String]) -> Result<Compare, String> {
    match words {
        [target, path] if target == "exists" => Ok(Compare::exists(path, true)),
        [target, path] if target == "missing" => Ok(Compare::exists(path, false)),
        [target, path, op, value] => {
            let op = compare_op(op)?;
            match target.as_str() {
                "version" => Ok(Compare::version(path, op, number(value)?)),
                "create_revision" => Ok(Compare::create_revision(path, op, number(value)?)),
                "mod_revision" => Ok(Compare::mod_revision(path, op, number(value)?)),
                "value" => Ok(Compare::value(path, op, value.as_bytes().to_vec())),
                other => Err(format!("unknown compare target {other:?}")),
            }
        }
        _ => Err("expected `compare TARGET PATH OP VALUE`, `compare exists PATH` or `compare missing PATH`".into()),
    }
}

/// The flags after an operation's positional words.
#[derive(Default)]
struct OpFlags {
    version: Option<u64>,
    ttl_ms: Option<u64>,
    recursive: bool,
    parents: bool,
    sequential: bool,
    container: bool,
}

/// Splits `words` into positional words and flags.
fn op_flags(words: &[String]) -> Result<(Vec<&String>, OpFlags), String> {
    let mut positional = Vec::new();
    let mut flags = OpFlags::default();
    let mut words = words.iter();
    while let Some(word) = words.next() {
        let mut value = |name: &str| words.next().ok_or_else(|| format!("{name} needs a value")).and_then(|v| number(v));
        match word.as_str() {
            "--version" => flags.version = Some(value("--version")?),
            "--ttl" => flags.ttl_ms = Some(value("--ttl")?),
            "-r" | "--recursive" => flags.recursive = true,
            "-p" | "--parents" => flags.parents = true,
            "-s" | "--sequential" => flags.sequential = true,
            "--container" => flags.container = true,
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            _ => positional.push(word),
        }
    }
    Ok((positional, flags))
}

fn parse_op(words: &[String]) -> Result<TxnOp, String> {
    let Some((op, rest)) = words.split_first() else { return Err("expected get, set, create or rm".into()) };
    let (positional, flags) = op_flags(rest)?;
    match (op.as_str(), positional.as_slice()) {
        ("get", [path]) => Ok(TxnOp::get(*path)),
        ("set", [path, data]) => Ok(TxnOp::set(*path, data.as_bytes().to_vec(), flags.version)),
        ("create", [path, data @ ..]) if data.len() <= 1 => {
            let mode = match (flags.ttl_ms, flags.container) {
                (Some(ms), _) => CreateMode::Ttl(std::time::Duration::from_millis(ms)),
                (None, true) => CreateMode::Container,
                (None, false) => CreateMode::Persistent,
            };
            let options = CreateOptions { mode, sequential: flags.sequential, create_parents: flags.parents };
            Ok(TxnOp::create(*path, data.first().map(|d| d.as_bytes().to_vec()).unwrap_or_default(), options))
        }
        ("rm" | "delete", [path]) => Ok(TxnOp::delete(*path, DeleteOptions { expected_version: flags.version, recursive: flags.recursive })),
        ("get" | "set" | "create" | "rm" | "delete", _) => Err(format!("wrong arguments for {op} (see `warden txn --help`)")),
        (other, _) => Err(format!("unknown operation {other:?} (get, set, create or rm)")),
    }
}

fn op_result_json(result: &TxnOpResult) -> Value {
    match result {
        TxnOpResult::Created(created) => json!({ "op": "create", "path": created.path, "stat": stat_json(&created.stat) }),
        TxnOpResult::Set(stat) => json!({ "op": "set", "stat": stat_json(stat) }),
        TxnOpResult::Deleted(deleted) => json!({ "op": "rm", "deleted": deleted }),
        TxnOpResult::Got(node) => json!({ "op": "get", "node": node.as_ref().map(node_json) }),
    }
}

fn op_result_text(result: &TxnOpResult) -> String {
    match result {
        TxnOpResult::Created(created) => format!("created {}", created.path),
        TxnOpResult::Set(stat) => format!("set: version {}", stat.version),
        TxnOpResult::Deleted(deleted) => format!("deleted {deleted}"),
        TxnOpResult::Got(Some(node)) => format!("get {}: {} (version {})", node.path, data_inline(&node.data), node.stat.version),
        TxnOpResult::Got(None) => "get: no node".into(),
    }
}

fn result_json(result: &TxnResult) -> Value {
    json!({
        "succeeded": result.succeeded,
        "revision": result.revision,
        "results": result.results.iter().map(op_result_json).collect::<Vec<_>>(),
    })
}

fn result_text(result: &TxnResult) -> String {
    let verdict = if result.succeeded { "SUCCEEDED" } else { "FAILED" };
    let mut lines = vec![format!("{verdict} (revision {})", result.revision)];
    lines.extend(result.results.iter().map(op_result_text));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let txn = parse("# move\ncompare version /a = 3\ncompare exists /b\n\nthen set /a new-data\nthen create /c \"two words\" -p\nelse get /a\n")
            .unwrap();
        let expected = Txn::new()
            .when(Compare::version("/a", CompareOp::Equal, 3))
            .when(Compare::exists("/b", true))
            .then(TxnOp::set("/a", b"new-data".to_vec(), None))
            .then(TxnOp::create("/c", b"two words".to_vec(), CreateOptions::persistent().create_parents()))
            .or_else(TxnOp::get("/a"));
        assert_eq!(txn, expected);
    }

    #[test]
    fn refuses_malformed_lines_with_their_number() {
        assert!(parse("compare version /a ~ 3").unwrap_err().0.starts_with("txn line 1:"));
        assert!(parse("then get /a\nthen fly /a").unwrap_err().0.starts_with("txn line 2:"));
        assert!(parse("then set /a 'open").is_err());
        assert_eq!(
            parse("then rm /a -r --version 2").unwrap().then,
            vec![TxnOp::delete("/a", DeleteOptions { expected_version: Some(2), recursive: true })]
        );
    }
}
