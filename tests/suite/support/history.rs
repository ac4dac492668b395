//! Register histories recorded by concurrent clients, checked for linearizability with the
//! WGL checker (`warden_loadgen::linearizability`), and explained when they are not.

use warden_loadgen::linearizability::{check_kv, CheckResult, Counterexample, History, KvInput, KvOutput};

/// Search steps the checker may take per key.
pub const CHECK_STEPS: u64 = 50_000_000;

/// One recorded operation: client, invoked at, completed at (`None`: unknown outcome), input,
/// output (`None`: unknown outcome). Times are nanoseconds of one clock shared by all clients.
pub type Record = (usize, u64, Option<u64>, KvInput, Option<KvOutput>);

/// Builds the history of `records` (in invocation order), checks it, and answers how many
/// operations completed, or why the history is not (known to be) linearizable.
pub fn check_records(mut records: Vec<Record>) -> Result<usize, String> {
    records.sort_by_key(|record| record.1);
    let completed = records.iter().filter(|r| r.2.is_some()).count();
    let mut history = History::new();
    for (client, invoked, completed, input, output) in records {
        let index = history.invoke(client, input, invoked);
        if let (Some(at), Some(output)) = (completed, output) {
            history.complete(index, output, at);
        }
    }
    match check_kv(&history, CHECK_STEPS) {
        CheckResult::Linearizable => Ok(completed),
        CheckResult::NotLinearizable(counterexample) => {
            Err(format!("history of {completed} completed operations is not linearizable:\n{}", explain(&history, &counterexample)))
        }
        CheckResult::Unknown => Err(format!("history of {completed} completed operations: the checker ran out of its {CHECK_STEPS} steps")),
    }
}

/// The blocked operation and every operation on its key that overlaps the second before it,
/// in invocation order, marked with their place in the linearized prefix: what a reader
/// needs to see why no order works.
pub fn explain(history: &History<KvInput, KvOutput>, counterexample: &Counterexample) -> String {
    let operations = history.operations();
    let blocked = &operations[counterexample.blocked];
    let window_start = blocked.invoked_at().saturating_sub(1_000_000_000);
    let mut lines = vec![format!("blocked: #{} {:?}", counterexample.blocked, blocked)];
    let mut related: Vec<(usize, _)> = operations
        .iter()
        .enumerate()
        .filter(|(_, op)| op.input().key() == blocked.input().key())
        .filter(|(_, op)| op.completed_at().is_none_or(|at| at >= window_start) && op.invoked_at() <= blocked.completed_at().unwrap_or(u64::MAX))
        .collect();
    related.sort_by_key(|(_, op)| op.invoked_at());
    for (index, op) in related {
        let place = counterexample.prefix.iter().position(|i| *i == index).map_or("-".to_string(), |p| p.to_string());
        lines.push(format!(
            "#{index} prefix@{place} client {} [{} .. {:?}] {:?} -> {:?}",
            op.client(),
            op.invoked_at(),
            op.completed_at(),
            op.input(),
            op.output()
        ));
    }
    lines.join("\n")
}
