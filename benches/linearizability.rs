//! The WGL linearizability checker (`warden_loadgen::linearizability::check_kv`) on a
//! 2,000-operation history of one register, as the linearizability tests check after a run.
//!
//! The history is generated deterministically (seeded): 8 clients, each issuing one
//! operation at a time (45% get, 35% put, 20% compare-and-set), with overlapping intervals of
//! 5–60 time units; every operation takes effect at a random point inside its interval, in
//! which order the register model gives the outputs, so the history is linearizable. A few
//! puts time out (their outcome is unknown; half of them took effect), as under faults.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use warden_loadgen::linearizability::{check_kv, CheckResult, History, KvInput, KvModel, KvOutput, Model};

const OPERATIONS: usize = 2_000;
const CLIENTS: usize = 8;
/// Search steps allowed (the tests' budget is of this order); the generated history needs
/// far fewer.
const MAX_STEPS: u64 = 10_000_000;

/// One planned operation.
struct Planned {
    client: usize,
    invoked_at: u64,
    /// Where it takes effect, inside its interval.
    point: u64,
    completed_at: u64,
    /// Its outcome is never known (a timeout); `applied` says whether it took effect.
    timed_out: bool,
    applied: bool,
}

fn history() -> History<KvInput, KvOutput> {
    let mut rng = StdRng::seed_from_u64(2_000);
    let key = b"register".to_vec();
    // 1. Intervals: each client's operations one after another, clients overlapping.
    let mut free_at = [0u64; CLIENTS];
    let mut planned: Vec<Planned> = (0..OPERATIONS)
        .map(|n| {
            let client = n % CLIENTS;
            let invoked_at = free_at[client] + rng.random_range(0..20);
            let completed_at = invoked_at + rng.random_range(5..60);
            free_at[client] = completed_at;
            let point = rng.random_range(invoked_at..=completed_at);
            let timed_out = rng.random_ratio(1, 250);
            Planned { client, invoked_at, point, completed_at, timed_out, applied: rng.random_bool(0.5) }
        })
        .collect();
    // 2. Inputs and outputs in effect order, from the register model.
    planned.sort_by_key(|op| op.point);
    let mut state = KvModel.init();
    let mut written = 0u64;
    let mut recorded: Vec<(Planned, KvInput, Option<KvOutput>)> = Vec::with_capacity(OPERATIONS);
    for op in planned {
        let input = match rng.random_range(0..100) {
            0..45 => KvInput::Get { key: key.clone() },
            45..80 => {
                written += 1;
                KvInput::Put { key: key.clone(), value: format!("v{written}").into_bytes() }
            }
            _ => {
                written += 1;
                // Half the swaps expect the current value (and succeed), half a stale one.
                let expected = if rng.random_bool(0.5) { state.get(&key).cloned() } else { Some(b"v0".to_vec()) };
                KvInput::Cas { key: key.clone(), expected, new: format!("v{written}").into_bytes() }
            }
        };
        let timed_out = op.timed_out && !matches!(input, KvInput::Get { .. });
        let (next, output) = KvModel.step(&state, &input);
        if !timed_out || op.applied {
            state = next;
        }
        recorded.push((op, input, (!timed_out).then_some(output)));
    }
    // 3. The history, recorded in invocation order.
    recorded.sort_by_key(|(op, _, _)| op.invoked_at);
    let mut history = History::new();
    for (op, input, output) in recorded {
        let index = history.invoke(op.client, input, op.invoked_at);
        if let Some(output) = output {
            history.complete(index, output, op.completed_at);
        }
    }
    history
}

fn wgl(c: &mut Criterion) {
    let history = history();
    assert_eq!(history.operations().len(), OPERATIONS);
    assert_eq!(check_kv(&history, MAX_STEPS), CheckResult::Linearizable);
    let mut group = c.benchmark_group("linearizability");
    group.throughput(Throughput::Elements(OPERATIONS as u64));
    group.bench_function(format!("check_kv/{OPERATIONS}_ops_{CLIENTS}_clients"), |b| b.iter(|| check_kv(&history, MAX_STEPS)));
    group.finish();
}

criterion_group!(benches, wgl);
criterion_main!(benches);
