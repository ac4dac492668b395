//! `deploy/`: the Prometheus alerting rules pass `promtool check rules`
//! and their unit tests (`promtool test rules deploy/alerts_test.yml`: each alert fires on
//! the series that should fire it, and not before its `for`), and the Grafana dashboard is
//! valid JSON whose every panel queries Prometheus. That every metric they name is one the
//! code exports is checked against a live `warden dev` (`tests/suite/cli.rs`, step `metrics`).

use std::path::Path;
use std::process::Command;

fn deploy() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy"))
}

/// Runs `promtool ARGS` in `deploy/`; panics with its output unless it succeeds.
fn promtool(args: &[&str]) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(deploy())
        .output()
        .unwrap_or_else(|e| panic!("promtool ({e}): install Debian's `prometheus` package (`bash scripts/setup.sh` does)"));
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?}:\n{said}");
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["test", "rules", "alerts_test.yml"]);
}

#[test]
fn every_dashboard_panel_queries_prometheus() {
    let text = std::fs::read_to_string(deploy().join("grafana-dashboard.json")).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("no targets: {panel}"));
        assert!(!targets.is_empty() && targets.iter().all(|t| t["expr"].as_str().is_some_and(|e| e.contains("warden_"))), "{panel}");
    }
}
