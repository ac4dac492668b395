//! The engine's layering (ARCHITECTURE.md, "Architecture invariant" of `node_services.rs`):
//! the multi-Raft engine imports nothing from what runs on it, so it can be read, tested and
//! changed without the namespace, watches, services or placement.

use std::path::{Path, PathBuf};

/// Engine sources, relative to this crate's `src/`.
const ENGINE: [&str; 6] = ["host", "storage", "transport", "store_writer.rs", "state_machine.rs", "config.rs"];
/// Modules the engine must not name.
const FORBIDDEN: [&str; 6] = ["namespace", "watch", "service", "placement", "group_links", "node_services"];

fn rust_files(path: &Path, files: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("read engine directory") {
            rust_files(&entry.expect("directory entry").path(), files);
        }
    } else if path.extension().is_some_and(|ext| ext == "rs") {
        files.push(path.to_path_buf());
    }
}

#[test]
fn the_engine_imports_nothing_that_runs_on_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for part in ENGINE {
        rust_files(&src.join(part), &mut files);
    }
    assert!(files.len() >= 10, "engine sources not found under {}: {files:?}", src.display());
    let mut offences = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read source");
        for (number, line) in text.lines().enumerate() {
            for module in FORBIDDEN {
                // `crate::watch` but not `tokio::sync::watch` or a local `watch` variable.
                if line.contains(&format!("crate::{module}")) || line.contains(&format!("super::super::{module}")) {
                    offences.push(format!("{}:{}: {}", file.display(), number + 1, line.trim()));
                }
            }
        }
    }
    assert!(offences.is_empty(), "the engine names modules that run on it:\n{}", offences.join("\n"));
}
