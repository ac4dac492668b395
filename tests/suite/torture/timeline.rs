//! A history's timeline page (`timeline.html`): successful and failed calls per second and
//! the slowest completions per second, with every fault's span shaded and named, then the
//! faults and the anomalies listed — the picture an operator looks at first. Inline SVG, no
//! script, nothing fetched.

use std::fmt::Write as _;

use warden_loadgen::html::{escape, nice_ticks, page_start, table, Chart};

use super::history::Verdict;
use crate::support::workload::Attempt;

/// Seconds of the history, counting calls by the second they completed in: `(ok, failed,
/// slowest ms)` per second.
fn per_second(attempts: &[Attempt]) -> Vec<(u64, u64, f64)> {
    let seconds = attempts.iter().map(|a| a.completed_ns / 1_000_000_000 + 1).max().unwrap_or(0) as usize;
    let mut buckets = vec![(0u64, 0u64, 0f64); seconds];
    for attempt in attempts {
        let bucket = &mut buckets[(attempt.completed_ns / 1_000_000_000) as usize];
        if attempt.ok {
            bucket.0 += 1;
        } else {
            bucket.1 += 1;
        }
        let latency_ms = attempt.completed_ns.saturating_sub(attempt.invoked_ns) as f64 / 1e6;
        bucket.2 = bucket.2.max(latency_ms);
    }
    buckets
}

/// The page of `verdict`, its calls drawn from `attempts`.
pub fn render(verdict: &Verdict, attempts: &[Attempt]) -> String {
    let buckets = per_second(attempts);
    let seconds = buckets.len().max(1) as f64;
    let bands: Vec<(f64, f64, String)> =
        verdict.faults.iter().map(|f| (f.start_ms as f64 / 1e3, f.end_ms as f64 / 1e3, format!("{}: {}", f.kind.name(), f.what))).collect();
    let marks: Vec<(f64, String)> =
        verdict.anomalies.iter().filter_map(|a| a.at_ms.map(|at_ms| (at_ms as f64 / 1e3, format!("{}: {}", a.kind, a.detail)))).collect();
    // Each second's value drawn across that second.
    let steps = |value: &dyn Fn(&(u64, u64, f64)) -> f64| -> Vec<(f64, f64)> {
        buckets.iter().enumerate().flat_map(|(second, b)| [(second as f64, value(b)), (second as f64 + 1.0, value(b))]).collect()
    };
    let chart = |title, y_label, points| Chart {
        title,
        x_label: "second of the history (faults shaded)",
        y_label,
        x_max: seconds,
        x_ticks: nice_ticks(seconds, 10.0),
        points,
        bands: bands.clone(),
        marks: marks.clone(),
    };
    let verdict_word = if verdict.valid { "valid" } else { "ANOMALIES FOUND" };
    let mut html = page_start(&format!("Torture history, seed {}: {verdict_word}", verdict.seed));
    let availability = &verdict.availability;
    let rows = [
        ("operations", format!("{} ({} succeeded)", verdict.operations, verdict.succeeded)),
        (
            "checked",
            format!(
                "{} creates, {} sequential, {} lock holds, {} register operations",
                verdict.creates, verdict.sequenced, verdict.holds, verdict.register_ops
            ),
        ),
        ("faults", verdict.faults.len().to_string()),
        ("anomalies", verdict.anomalies.len().to_string()),
        (
            "windows with every group serving",
            format!(
                "{:.1}% fault-free, {:.1}% during faults after the election (ratio {:.3})",
                availability.fault_free_up_share * 100.0,
                availability.faulted_up_share * 100.0,
                availability.ratio
            ),
        ),
        (
            "successful calls per second",
            format!("{:.1} fault-free, {:.1} during faults after the election", availability.fault_free_ok_per_s, availability.faulted_ok_per_s),
        ),
        ("leader isolated → next write in its group (ms)", format!("{:?}", availability.leader_isolation_to_write_ms)),
    ];
    html.push_str(&table(&rows));
    html.push_str(&chart("Successful calls per second", "calls", steps(&|b| b.0 as f64)).svg());
    html.push_str(&chart("Failed calls per second", "calls", steps(&|b| b.1 as f64)).svg());
    html.push_str(&chart("Slowest completed call per second", "latency (ms)", steps(&|b| b.2)).svg());
    html.push_str("<h2>Faults</h2><table><tr><th>from (ms)</th><th>to (ms)</th><th>kind</th><th>what</th></tr>");
    for fault in &verdict.faults {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            fault.start_ms,
            fault.end_ms,
            fault.kind.name(),
            escape(&fault.what)
        );
    }
    html.push_str("</table><h2>Anomalies</h2>");
    if verdict.anomalies.is_empty() {
        html.push_str("<p>None.</p>");
    } else {
        html.push_str("<table><tr><th>kind</th><th>at (ms)</th><th>detail</th></tr>");
        for anomaly in &verdict.anomalies {
            let at = anomaly.at_ms.map_or("-".to_string(), |at| at.to_string());
            let _ = write!(html, "<tr><td>{}</td><td>{at}</td><td><pre>{}</pre></td></tr>", escape(anomaly.kind), escape(&anomaly.detail));
        }
        html.push_str("</table>");
    }
    html.push_str("</body></html>\n");
    html
}
