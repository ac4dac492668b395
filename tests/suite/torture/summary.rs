//! The summary of a run of histories (`summary.md`, `summary.json`): one row per history,
//! then the totals — histories, operations, faults by kind, anomalies by kind, availability
//! during faults and the time from a leader's isolation to its group's next write.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::history::Verdict;

/// Figures over every history of a run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Totals {
    pub histories: usize,
    pub operations: usize,
    pub succeeded: usize,
    pub faults_by_kind: BTreeMap<&'static str, usize>,
    pub anomalies_by_kind: BTreeMap<&'static str, usize>,
    /// Availability during faults (after the election) over fault-free availability (see
    /// `history::Availability`): the mean over histories, and the lowest.
    pub availability_ratio_mean: f64,
    pub availability_ratio_min: f64,
    /// Leader isolations, how many saw a write in their group before the fault ended, and
    /// the median and largest time to it (ms).
    pub leader_isolations: usize,
    pub leader_isolations_with_write: usize,
    pub leader_isolation_to_write_ms_median: Option<u64>,
    pub leader_isolation_to_write_ms_max: Option<u64>,
}

/// The totals of `verdicts`.
pub fn totals(verdicts: &[Verdict]) -> Totals {
    let mut faults_by_kind = BTreeMap::new();
    let mut anomalies_by_kind = BTreeMap::new();
    for verdict in verdicts {
        for fault in &verdict.faults {
            *faults_by_kind.entry(fault.kind.name()).or_insert(0) += 1;
        }
        for anomaly in &verdict.anomalies {
            *anomalies_by_kind.entry(anomaly.kind).or_insert(0) += 1;
        }
    }
    let ratios: Vec<f64> = verdicts.iter().map(|v| v.availability.ratio).collect();
    let isolations: Vec<Option<u64>> = verdicts.iter().flat_map(|v| v.availability.leader_isolation_to_write_ms.iter().copied()).collect();
    let mut times: Vec<u64> = isolations.iter().flatten().copied().collect();
    times.sort_unstable();
    Totals {
        histories: verdicts.len(),
        operations: verdicts.iter().map(|v| v.operations).sum(),
        succeeded: verdicts.iter().map(|v| v.succeeded).sum(),
        faults_by_kind,
        anomalies_by_kind,
        availability_ratio_mean: if ratios.is_empty() { 0.0 } else { ratios.iter().sum::<f64>() / ratios.len() as f64 },
        availability_ratio_min: ratios.iter().copied().reduce(f64::min).unwrap_or(0.0),
        leader_isolations: isolations.len(),
        leader_isolations_with_write: times.len(),
        leader_isolation_to_write_ms_median: times.get(times.len() / 2).copied(),
        leader_isolation_to_write_ms_max: times.last().copied(),
    }
}

/// The run's summary as Markdown: a row per history, then the totals.
pub fn markdown(verdicts: &[Verdict], totals: &Totals) -> String {
    let mut text = String::from(
        "| seed | seconds | calls | succeeded | faults | anomalies | up fault-free | up in faults (ratio) | ok/s fault-free / in faults | leader isolated → write (ms) |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for v in verdicts {
        let a = &v.availability;
        let isolations: Vec<String> = a.leader_isolation_to_write_ms.iter().map(|t| t.map_or("none".into(), |t| t.to_string())).collect();
        let _ = writeln!(
            text,
            "| {} | {:.0} | {} | {:.1}% | {} | {} | {:.1}% | {:.1}% ({:.3}) | {:.0} / {:.0} | {} |",
            v.seed,
            v.length_ms as f64 / 1e3,
            v.operations,
            100.0 * v.succeeded as f64 / v.operations.max(1) as f64,
            v.faults.len(),
            v.anomalies.len(),
            a.fault_free_up_share * 100.0,
            a.faulted_up_share * 100.0,
            a.ratio,
            a.fault_free_ok_per_s,
            a.faulted_ok_per_s,
            if isolations.is_empty() { "-".into() } else { isolations.join(", ") }
        );
    }
    let by_kind = |map: &BTreeMap<&str, usize>| {
        if map.is_empty() {
            "none".to_string()
        } else {
            map.iter().map(|(kind, n)| format!("{kind} {n}")).collect::<Vec<_>>().join(", ")
        }
    };
    let _ = write!(
        text,
        "\n- histories: {}\n- calls: {} ({:.2}% succeeded)\n- faults by kind: {}\n- anomalies by kind: {}\n\
         - windows of {} ms with every group serving, during faults (after {} s for the election) over fault-free: mean {:.3}, lowest {:.3}\n\
         - leader isolations: {}, a write in the group before the fault ended in {}; median {} ms, longest {} ms\n",
        totals.histories,
        totals.operations,
        100.0 * totals.succeeded as f64 / totals.operations.max(1) as f64,
        by_kind(&totals.faults_by_kind),
        by_kind(&totals.anomalies_by_kind),
        super::history::WINDOW.as_millis(),
        super::history::ELECTION_ALLOWANCE.as_secs(),
        totals.availability_ratio_mean,
        totals.availability_ratio_min,
        totals.leader_isolations,
        totals.leader_isolations_with_write,
        totals.leader_isolation_to_write_ms_median.map_or("-".into(), |t| t.to_string()),
        totals.leader_isolation_to_write_ms_max.map_or("-".into(), |t| t.to_string()),
    );
    text
}
