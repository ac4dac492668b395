//! The documentation, kept true by running it.
//!
//! - Every fenced block of README.md and `docs/*.md` must be tagged. A `console` block is
//!   run: each line starting with `$ ` is a command, run with `sh -c` against one `warden dev`
//!   that this test starts on the default ports (so the commands need no flags), with the
//!   binary under test first in `PATH`, in file order, in one scratch directory. It must exit
//!   0; the lines after it are expected output, checked loosely (each must appear among the
//!   command's output lines, whitespace runs counting as one space, `…` matching anything).
//!   A `sh no-run` block is only shown (several machines, `make`, long benchmarks, commands
//!   that run until Ctrl-C): counted and listed. Other tags (`text`, `json`, …) are not
//!   commands.
//! - `docs/api.md` is generated from the `.proto` comments; the test fails if the file
//!   differs (`WARDEN_UPDATE_DOCS=1` rewrites it), and another if any service, message, enum,
//!   rpc, field or value in it has no description.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::child::{self, Group};

const BIN: &str = env!("CARGO_BIN_EXE_warden");
/// The repository root (this package's directory).
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// Longest a documented command may take.
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);
/// Longest `warden dev` may take to serve a healthy cluster.
const START_DEADLINE: Duration = Duration::from_secs(120);
/// The ports `warden dev` uses by default: router, nodes 1–5, router and node metrics, and
/// the router's etcd API.
const DEV_PORTS: [u16; 13] = [7100, 7101, 7102, 7103, 7104, 7105, 7300, 7301, 7302, 7303, 7304, 7305, 2379];
/// The `.proto` files of the API reference, in its order.
const API_PROTOS: [&str; 2] = ["warden.proto", "placement.proto"];
/// Where the API reference is written.
const API_DOC: &str = "docs/api.md";

/// How a fenced block is treated.
#[derive(Debug, PartialEq)]
enum Kind {
    /// `console`: its `$ ` lines are run.
    Run,
    /// `sh no-run`: shown only.
    Shown,
    /// Any other tag: not commands (`text`, `json`, `proto`, …).
    Other,
}

/// A fenced block of a markdown file.
#[derive(Debug)]
struct Block {
    /// `file:line` of its opening fence.
    place: String,
    kind: Kind,
    lines: Vec<String>,
}

/// A documented command and the output lines it shows.
#[derive(Debug)]
struct Step {
    place: String,
    command: String,
    expected: Vec<String>,
}

/// The fenced blocks of `text` (from `file`); an untagged block, a shell block that is
/// neither `console` nor `sh no-run`, or an unclosed fence is an error.
fn blocks(file: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut found = Vec::new();
    let mut open: Option<Block> = None;
    for (index, line) in text.lines().enumerate() {
        let Some(info) = line.strip_prefix("```") else {
            if let Some(block) = open.as_mut() {
                block.lines.push(line.to_owned());
            }
            continue;
        };
        match open.take() {
            Some(block) => found.push(block),
            None => {
                open = Some(Block {
                    place: format!("{file}:{}", index + 1),
                    kind: kind(info.trim()).map_err(|e| format!("{file}:{}: {e}", index + 1))?,
                    lines: Vec::new(),
                })
            }
        }
    }
    match open {
        Some(block) => Err(format!("{}: the block is not closed", block.place)),
        None => Ok(found),
    }
}

/// The kind of a block from its tag.
fn kind(info: &str) -> Result<Kind, String> {
    match info {
        "" => Err("a fenced block without a tag: use ```console (run by tests/suite/docs.rs), ```sh no-run (shown only) or ```text".into()),
        "console" => Ok(Kind::Run),
        "sh no-run" => Ok(Kind::Shown),
        "sh" | "bash" | "shell" => Err(format!("```{info}: commands are ```console (run) or ```sh no-run (shown only)")),
        _ => Ok(Kind::Other),
    }
}

/// The commands of a `console` block with their expected output.
fn steps(block: &Block) -> Result<Vec<Step>, String> {
    let mut found: Vec<Step> = Vec::new();
    for (offset, line) in block.lines.iter().enumerate() {
        match (line.strip_prefix("$ "), found.last_mut()) {
            (Some(command), _) => {
                found.push(Step { place: format!("{} +{}", block.place, offset + 1), command: command.to_owned(), expected: Vec::new() })
            }
            (None, Some(step)) if !line.trim().is_empty() => step.expected.push(line.clone()),
            (None, Some(_)) => {}
            (None, None) => return Err(format!("{}: a console block must start with a `$ ` command", block.place)),
        }
    }
    Ok(found)
}

/// README.md and `docs/*.md`, in that order (the docs by name), with their text.
fn documents() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("read docs/")
        .map(|entry| entry.expect("docs/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(Path::new(ROOT).join(&name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
            (name, text)
        })
        .collect()
}

/// Whitespace runs as one space, ends trimmed.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `line` matches `pattern`, where `…` matches anything.
fn matches(pattern: &str, line: &str) -> bool {
    let mut parts = pattern.split('…');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The expected lines of `step` that no line of `output` matches.
fn missing_lines(step: &Step, output: &str) -> Vec<String> {
    let lines: Vec<String> = output.lines().map(squeeze).collect();
    step.expected.iter().filter(|want| !lines.iter().any(|line| matches(&squeeze(want), line))).cloned().collect()
}

/// Runs `command` to completion: its exit code and its stdout then stderr; `None` past
/// `deadline` (its process group killed).
fn run_within(command: &mut Command, deadline: Duration) -> Option<(Option<i32>, String)> {
    let ran = child::run_within(command, deadline).expect("spawn");
    ran.status.is_some().then(|| (ran.code(), format!("{}{}", ran.stdout, ran.stderr)))
}

/// The `warden dev` the documented commands run against, and their scratch directory.
struct Dev {
    _dev: Group,
    dir: tempfile::TempDir,
}

impl Dev {
    /// Starts `warden dev` on the default ports and waits until `warden status` is healthy.
    fn start() -> Dev {
        let taken: Vec<u16> = DEV_PORTS.into_iter().filter(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_err()).collect();
        assert!(
            taken.is_empty(),
            "ports {taken:?} are in use: the doc test runs `warden dev` on its default ports; stop what holds them (a `make dev`?)"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("work")).expect("work dir");
        let log = std::fs::File::create(dir.path().join("dev.log")).expect("dev log");
        let data = dir.path().join("data");
        let mut command = Command::new(BIN);
        command.args(["dev", "--fresh", "--data-dir"]).arg(&data).stdout(log.try_clone().expect("dev log")).stderr(log).env_remove("RUST_LOG");
        let dev = Dev { _dev: child::spawn_group(&mut command).expect("spawn"), dir };
        dev.wait_healthy();
        dev
    }

    /// Waits until `warden dev` has printed its last start-up line (every example group made,
    /// the router listening) and `warden status` exits 0, failing with the dev log past the
    /// deadline.
    fn wait_healthy(&self) {
        let end = Instant::now() + START_DEADLINE;
        let log = self.dir.path().join("dev.log");
        while Instant::now() < end {
            let started = std::fs::read_to_string(&log).is_ok_and(|text| text.contains("Ctrl-C stops"));
            if started && run_within(&mut self.shell("warden status"), COMMAND_DEADLINE).is_some_and(|(code, _)| code == Some(0)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("warden dev was not healthy within {START_DEADLINE:?}:\n{text}");
    }

    /// `sh -c LINE` in the scratch directory, `warden` being the binary under test.
    fn shell(&self, line: &str) -> Command {
        let bin_dir = Path::new(BIN).parent().expect("the binary's directory");
        let path =
            std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())))
                .expect("PATH");
        let mut command = Command::new("sh");
        command.args(["-c", line]).current_dir(self.dir.path().join("work")).env("PATH", path).env("RUST_LOG", "warn");
        for name in ["WARDEN_ENDPOINTS", "WARDEN_CA", "WARDEN_CERT", "WARDEN_KEY", "WARDEN_TOKEN", "WARDEN_TOKENS"] {
            command.env_remove(name);
        }
        command
    }

    /// Runs one documented command; a description of what went wrong, if anything did.
    fn check(&self, step: &Step) -> Option<String> {
        let Some((code, output)) = run_within(&mut self.shell(&step.command), COMMAND_DEADLINE) else {
            return Some(format!("{}: `{}` ran longer than {COMMAND_DEADLINE:?}", step.place, step.command));
        };
        let missing = missing_lines(step, &output);
        match (code, missing.is_empty()) {
            (Some(0), true) => None,
            (code, _) => {
                Some(format!("{}: `{}` exited {code:?}; expected lines not printed: {missing:?}; output:\n{}", step.place, step.command, output))
            }
        }
    }
}

#[test]
fn every_documented_command_runs_against_warden_dev() {
    let mut run = Vec::new();
    let mut shown = Vec::new();
    for (name, text) in documents() {
        for block in blocks(&name, &text).unwrap_or_else(|e| panic!("{e}")) {
            match block.kind {
                Kind::Run => run.extend(steps(&block).unwrap_or_else(|e| panic!("{e}"))),
                Kind::Shown => shown.push(format!("{}: {}", block.place, block.lines.first().map(String::as_str).unwrap_or_default())),
                Kind::Other => {}
            }
        }
    }
    assert!(!run.is_empty(), "no console block found");
    let started = Instant::now();
    let dev = Dev::start();
    let up = started.elapsed();
    let failures: Vec<String> = run.iter().filter_map(|step| dev.check(step)).collect();
    println!("ran {} documented commands in {:?} (warden dev up in {up:?}); {} blocks shown only:", run.len(), started.elapsed() - up, shown.len());
    for block in &shown {
        println!("  {block}");
    }
    assert!(failures.is_empty(), "{} of {} documented commands failed:\n{}", failures.len(), run.len(), failures.join("\n"));
}

#[test]
fn blocks_must_be_tagged_and_console_blocks_start_with_a_command() {
    assert!(blocks("x.md", "```\nls\n```\n").is_err_and(|e| e.contains("x.md:1") && e.contains("without a tag")));
    assert!(blocks("x.md", "```sh\nls\n```\n").is_err());
    assert!(blocks("x.md", "```console\n$ ls\n").is_err_and(|e| e.contains("not closed")));
    let found = blocks("x.md", "text\n```console\n$ warden get /a\nvalue …\n\n$ warden ls /\n```\n```sh no-run\nmake dev\n```\n").expect("blocks");
    assert_eq!(found.iter().map(|b| &b.kind).collect::<Vec<_>>(), [&Kind::Run, &Kind::Shown]);
    let run = steps(&found[0]).expect("steps");
    assert_eq!(run.iter().map(|s| s.command.as_str()).collect::<Vec<_>>(), ["warden get /a", "warden ls /"]);
    assert_eq!(run[0].expected, ["value …"]);
    assert!(missing_lines(&run[0], "value  42\n").is_empty());
    assert_eq!(missing_lines(&run[0], "other\n"), ["value …"]);
    assert!(steps(&Block { place: "x.md:1".into(), kind: Kind::Run, lines: vec!["output first".into()] }).is_err());
    assert!(matches("group … serves /a on nodes …", "group 5 serves /a on nodes [1, 2]"));
    assert!(!matches("group … serves /a", "group 5 serves /b"));
}

/// The API reference, generated from the `.proto` comments.
mod api {
    /// What a section documents.
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Service,
        Message,
        Enum,
    }

    /// One service, message or enum, with its rows (rpcs, fields or values).
    struct Section {
        kind: Kind,
        name: String,
        comment: String,
        rows: Vec<[String; 3]>,
    }

    /// An open `{ … }` of the file being read.
    struct Scope {
        /// The section it adds rows to.
        section: usize,
        /// Its full name (`Outer.Inner`), for nested definitions.
        name: String,
        /// `Some(name)` inside a `oneof`.
        oneof: Option<String>,
    }

    /// A `.proto` file read into sections.
    struct Proto {
        package: String,
        header: String,
        sections: Vec<Section>,
    }

    /// Joins comment lines into one paragraph, `|` escaped for tables.
    fn paragraph(comment: &[String]) -> String {
        comment.join(" ").replace('|', "\\|")
    }

    /// `keyword Name {` → `Name`.
    fn opened(line: &str, keyword: &str) -> Option<String> {
        let rest = line.strip_prefix(keyword)?.strip_prefix(' ')?;
        Some(rest.split(|c: char| c == '{' || c.is_whitespace()).next()?.to_owned())
    }

    /// `rpc Name(Request) returns (Response);` → `[Name, Request → Response]`.
    fn rpc(line: &str) -> Option<[String; 2]> {
        let rest = line.strip_prefix("rpc ")?;
        let (name, rest) = rest.split_once('(')?;
        let (request, rest) = rest.split_once(')')?;
        let response = rest.split_once('(')?.1.split_once(')')?.0;
        Some([format!("`{}`", name.trim()), format!("`{}` → `{}`", request.trim(), response.trim())])
    }

    /// `repeated Type name = 3 [opts];` → `[name, repeated Type, 3]`; enum values have no type.
    fn field(line: &str) -> Option<[String; 3]> {
        let (left, right) = line.trim_end_matches(';').split_once('=')?;
        let number = right.split_whitespace().next()?.trim_end_matches(';').to_owned();
        let (kind, name) = left.trim().rsplit_once(char::is_whitespace).unwrap_or(("", left.trim()));
        Some([format!("`{}`", name.trim()), kind.trim().to_owned(), number])
    }

    impl Proto {
        /// Reads a `.proto` file: comments directly above a definition, rpc, field or value
        /// describe it; the comment above `syntax` describes the file.
        fn read(text: &str) -> Proto {
            let mut proto = Proto { package: String::new(), header: String::new(), sections: Vec::new() };
            let mut comment: Vec<String> = Vec::new();
            let mut scopes: Vec<Scope> = Vec::new();
            for raw in text.lines() {
                let line = raw.trim();
                if let Some(text) = line.strip_prefix("//") {
                    comment.push(text.trim().to_owned());
                    continue;
                }
                proto.line(line, &comment, &mut scopes);
                comment.clear();
            }
            proto
        }

        /// Takes one line that is not a comment, `comment` being the lines just above it.
        fn line(&mut self, line: &str, comment: &[String], scopes: &mut Vec<Scope>) {
            if line.starts_with("syntax") {
                self.header = paragraph(comment);
            } else if let Some(package) = line.strip_prefix("package ") {
                self.package = package.trim_end_matches(';').to_owned();
            } else if let Some(name) = opened(line, "service") {
                self.open(Kind::Service, name, comment, scopes);
            } else if let Some(name) = opened(line, "message") {
                self.open(Kind::Message, name, comment, scopes);
            } else if let Some(name) = opened(line, "enum") {
                self.open(Kind::Enum, name, comment, scopes);
            } else if let (Some(name), Some(scope)) = (opened(line, "oneof"), scopes.last()) {
                scopes.push(Scope { section: scope.section, name: scope.name.clone(), oneof: Some(name) });
            } else if line.starts_with('}') {
                scopes.pop();
            } else if let Some(scope) = scopes.last() {
                self.row(line, comment, scope);
            }
            if line.ends_with('}') && line.contains('{') {
                scopes.pop();
            }
        }

        /// Starts the section of a service, message or enum.
        fn open(&mut self, kind: Kind, name: String, comment: &[String], scopes: &mut Vec<Scope>) {
            let name = match scopes.last() {
                Some(outer) => format!("{}.{name}", outer.name),
                None => name,
            };
            self.sections.push(Section { kind, name: name.clone(), comment: paragraph(comment), rows: Vec::new() });
            scopes.push(Scope { section: self.sections.len() - 1, name, oneof: None });
        }

        /// Adds an rpc, field or enum value to the innermost section.
        fn row(&mut self, line: &str, comment: &[String], scope: &Scope) {
            let section = &mut self.sections[scope.section];
            let mut description = paragraph(comment);
            if let Some(oneof) = &scope.oneof {
                description = format!("(oneof `{oneof}`) {description}").trim_end().to_owned();
            }
            let row = match section.kind {
                Kind::Service => rpc(line).map(|[name, signature]| [name, signature, description]),
                Kind::Message => field(line)
                    .filter(|_| !line.starts_with("reserved"))
                    .map(|[name, kind, number]| [format!("{name} = {number}"), format!("`{kind}`"), description]),
                Kind::Enum => field(line).map(|[name, _, number]| [name, number, description]),
            };
            section.rows.extend(row);
        }

        /// The file's part of the reference.
        fn render(&self, file: &str, out: &mut String) {
            out.push_str(&format!("## `{file}` (package `{}`)\n\n", self.package));
            if !self.header.is_empty() {
                out.push_str(&format!("{}\n\n", self.header));
            }
            for section in &self.sections {
                section.render(out);
            }
        }
    }

    impl Section {
        /// A heading, the comment and a table of the rows.
        fn render(&self, out: &mut String) {
            let (what, columns) = match self.kind {
                Kind::Service => ("service", "| rpc | request → response | description |"),
                Kind::Message => ("message", "| field = number | type | description |"),
                Kind::Enum => ("enum", "| value | number | description |"),
            };
            out.push_str(&format!("### {what} `{}`\n\n", self.name));
            if !self.comment.is_empty() {
                out.push_str(&format!("{}\n\n", self.comment));
            }
            if self.rows.is_empty() {
                return;
            }
            out.push_str(&format!("{columns}\n|---|---|---|\n"));
            for [a, b, c] in &self.rows {
                out.push_str(&format!("| {a} | {b} | {c} |\n"));
            }
            out.push('\n');
        }
    }

    /// The whole reference for `files` (name and text), in their order.
    pub fn reference(files: &[(&str, String)]) -> String {
        let mut out = String::from(
            "# API reference\n\nGenerated by `tests/suite/docs.rs` from the comments of `proto/proto/warden.proto` (the public client API, \
             served by routers and nodes) and `proto/proto/placement.proto` (placement and administration, served by the nodes \
             holding a placement replica). Do not edit: change the `.proto` comments and run \
             `WARDEN_UPDATE_DOCS=1 cargo test --release --test suite docs::api_reference`. What a client in any language does \
             besides sending these messages (routers and failover, deadlines, errors and retries, sessions, locks, watches, \
             TLS and tokens, limits) is in [clients.md](clients.md).\n\n",
        );
        for (file, text) in files {
            Proto::read(text).render(file, &mut out);
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    }

    /// What a reference made by [`reference`] leaves undescribed, in its order: every file,
    /// service, message or enum without its paragraph, and every table row (rpc, field or
    /// value) whose description is empty (a `oneof` mark alone says nothing: empty too).
    pub fn undescribed(reference: &str) -> Vec<String> {
        let lines: Vec<&str> = reference.lines().collect();
        let mut missing = Vec::new();
        let mut section = String::new();
        let mut in_table = false;
        for (index, line) in lines.iter().enumerate() {
            if let Some(heading) = line.strip_prefix("### ").or_else(|| line.strip_prefix("## ")) {
                section = heading.to_owned();
                let next = lines[index + 1..].iter().find(|next| !next.trim().is_empty());
                if next.is_none_or(|next| next.starts_with('|') || next.starts_with('#')) {
                    missing.push(format!("{section}: no paragraph"));
                }
            } else if line.starts_with("|---") {
                in_table = true;
            } else if !line.starts_with('|') {
                in_table = false;
            } else if in_table {
                let row = line.strip_suffix(" |").unwrap_or(line);
                // Cells are separated by ` | `; a `|` inside a description is escaped (`\|`).
                let description = row.rsplit_once(" | ").map_or("", |(_, description)| description);
                let description = match description.strip_prefix("(oneof `").and_then(|rest| rest.split_once("`)")) {
                    Some((_, rest)) => rest,
                    None => description,
                };
                if description.trim().is_empty() {
                    let name = row.trim_start_matches("| ").split(" | ").next().unwrap_or_default();
                    missing.push(format!("{section}: {name} has no description"));
                }
            }
        }
        missing
    }
}

/// The `.proto` files of the API reference, with their text.
fn api_protos() -> Vec<(&'static str, String)> {
    API_PROTOS.iter().map(|name| (*name, std::fs::read_to_string(Path::new(ROOT).join("proto/proto").join(name)).expect("read a .proto"))).collect()
}

#[test]
fn api_reference_is_generated_from_the_proto_comments() {
    let generated = api::reference(&api_protos());
    let path: PathBuf = Path::new(ROOT).join(API_DOC);
    if std::env::var_os("WARDEN_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &generated).expect("write docs/api.md");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "{API_DOC} is not what the .proto comments generate; refresh it with\n  WARDEN_UPDATE_DOCS=1 cargo test --release --test suite docs::api_reference"
    );
}

#[test]
fn the_api_reference_reads_services_messages_enums_and_oneofs() {
    let proto = "// The file.\nsyntax = \"proto3\";\npackage p.v1;\n\n// Calls.\nservice S {\n  // Does it.\n  rpc Do(DoRequest) returns (stream DoResponse);\n}\n\n// A request.\nmessage DoRequest {\n  // The path.\n  string path = 1;\n  map<uint64, uint64> revisions = 2;\n  enum Mode {\n    // Default.\n    FAST = 0;\n  }\n  oneof op {\n    Mode mode = 3;\n  }\n  reserved 4;\n}\nmessage Empty {}\n";
    let doc = api::reference(&[("p.proto", proto.to_owned())]);
    for want in [
        "## `p.proto` (package `p.v1`)\n\nThe file.",
        "### service `S`\n\nCalls.",
        "| `Do` | `DoRequest` → `stream DoResponse` | Does it. |",
        "### message `DoRequest`\n\nA request.",
        "| `path` = 1 | `string` | The path. |",
        "| `revisions` = 2 | `map<uint64, uint64>` |  |",
        "### enum `DoRequest.Mode`",
        "| `FAST` | 0 | Default. |",
        "| `mode` = 3 | `Mode` | (oneof `op`) |",
        "### message `Empty`",
    ] {
        assert!(doc.contains(want), "{want:?} missing from:\n{doc}");
    }
    assert!(!doc.contains("reserved"), "{doc}");
}

#[test]
fn every_service_message_enum_field_and_value_of_the_api_reference_is_described() {
    let missing = api::undescribed(&api::reference(&api_protos()));
    assert!(
        missing.is_empty(),
        "{} parts of {API_DOC} have no description: describe each in a `//` comment on the line(s) just above it in its .proto \
         (what it means to a client, its unit, default and limits, which calls use it), then refresh {API_DOC}:\n  {}",
        missing.len(),
        missing.join("\n  ")
    );
}

#[test]
fn the_description_check_names_every_undescribed_part() {
    let proto = "// The file.\nsyntax = \"proto3\";\npackage p.v1;\n\n// Calls.\nservice S {\n  // Does it.\n  rpc Do(DoRequest) returns (DoResponse);\n  rpc Undo(DoRequest) returns (DoResponse);\n}\n\n// A request.\nmessage DoRequest {\n  // The path, with a | in it.\n  string path = 1;\n  uint64 count = 2;\n  oneof op {\n    // Fast.\n    bool fast = 3;\n    bool slow = 4;\n  }\n}\nmessage DoResponse {\n  // Done.\n  bool done = 1;\n}\n// How.\nenum Mode {\n  // Quick.\n  QUICK = 0;\n  CAREFUL = 1;\n}\n// Nothing.\nmessage Empty {}\nmessage Bare {}\n";
    let doc = api::reference(&[("p.proto", proto.to_owned())]);
    assert_eq!(
        api::undescribed(&doc),
        [
            "service `S`: `Undo` has no description",
            "message `DoRequest`: `count` = 2 has no description",
            "message `DoRequest`: `slow` = 4 has no description",
            "message `DoResponse`: no paragraph",
            "enum `Mode`: `CAREFUL` has no description",
            "message `Bare`: no paragraph",
        ],
        "{doc}"
    );
    let described = "// The file.\nsyntax = \"proto3\";\npackage p.v1;\n\n// A request.\nmessage DoRequest {\n  // The path.\n  string path = 1;\n  oneof op {\n    // Fast.\n    bool fast = 3;\n  }\n}\n// Nothing.\nmessage Empty {}\n";
    let doc = api::reference(&[("p.proto", described.to_owned())]);
    assert_eq!(api::undescribed(&doc), Vec::<String>::new(), "{doc}");
    let headless = "syntax = \"proto3\";\npackage p.v1;\n\n// A.\nmessage A {}\n";
    assert_eq!(api::undescribed(&api::reference(&[("p.proto", headless.to_owned())])), ["`p.proto` (package `p.v1`): no paragraph"]);
}
