//! The client library's dependency tree carries nothing only servers need: no HTTP server
//! framework, metrics exporter or certificate generator (those live in `warden-server-kit`,
//! and tonic's `router` feature is turned on by the servers only). Checked with `cargo tree`,
//! offline, as an application depending on `warden-client` would resolve it.

use std::process::Command;

/// Crates a client application must not be made to build.
const SERVER_ONLY: [&str; 4] = ["axum", "prometheus", "rcgen", "x509-parser"];

#[test]
fn the_client_library_depends_on_no_server_only_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let output = Command::new(cargo)
        .args(["tree", "--offline", "--manifest-path", manifest, "-p", "warden-client", "-e", "normal", "--prefix", "none"])
        .output()
        .expect("cargo tree runs");
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let crates: Vec<&str> = tree.lines().filter_map(|line| line.split_whitespace().next()).collect();
    assert!(crates.contains(&"warden-client") && crates.contains(&"tonic"), "not the client's tree:\n{tree}");
    let found: Vec<&str> = SERVER_ONLY.into_iter().filter(|name| crates.contains(name)).collect();
    assert!(found.is_empty(), "warden-client depends on {found:?}:\n{tree}");
}
