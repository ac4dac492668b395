//! Drives client loops for a run: closed loop (each client sends its next operation when the
//! last one answered) or open loop (operations are due at a fixed arrival rate, and latency
//! counts from when an operation was due, so a stalled server shows up in every operation
//! that waited behind the stall — no coordinated omission).
//!
//! Architecture invariant: the driver knows nothing of targets or workloads; it calls
//! [`ClientLoop::op`] and records how long it took and how it ended.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::target::OpError;

/// Highest latency the histograms track, µs (longer ones are clamped to it).
pub const LATENCY_US_MAX: u64 = 60_000_000;
/// Longest measured window the timeline keeps per-second counts for (a longer run's last
/// bucket gathers the rest).
const TIMELINE_SECONDS_MAX: usize = 24 * 3600;

/// One client's work: an operation at a time, never two at once.
pub trait ClientLoop: Send + 'static {
    /// Performs operation number `seq` of this client.
    fn op(&mut self, seq: u64) -> impl Future<Output = Result<(), OpError>> + Send;
}

/// When a run stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this long measured (after the warmup).
    After(Duration),
    /// After this many measured operations (successes and errors).
    Total(u64),
}

/// How operations are paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// Unmeasured time first (connections warm, caches filled, leaders settled).
    pub warmup: Duration,
    /// When the measured part ends.
    pub stop: Stop,
    /// Open loop at this many operations per second in total (spread evenly over the
    /// clients); `None`: closed loop.
    pub rate_per_sec: Option<f64>,
}

/// What a run measured: latencies of successful operations, errors by kind, and completions
/// per second.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Latency of each successful measured operation, µs.
    pub histogram: Histogram<u64>,
    /// Failed measured operations, by [`OpError::kind`].
    pub errors_by_kind: BTreeMap<&'static str, u64>,
    /// One message per error kind (the first seen), to tell the user what went wrong.
    pub error_examples: BTreeMap<&'static str, String>,
    /// Successful operations completed in each second of the measured window.
    pub timeline: Vec<u64>,
    /// Length of the measured window.
    pub window: Duration,
}

/// A histogram of latencies in µs between 1 µs and [`LATENCY_US_MAX`].
pub fn new_histogram() -> Histogram<u64> {
    // Three significant digits between 1 µs and a minute: bounded memory (~100 KiB).
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("constant histogram bounds are valid")
}

impl Measured {
    /// Nothing measured yet.
    pub fn empty() -> Measured {
        Measured {
            histogram: new_histogram(),
            errors_by_kind: BTreeMap::new(),
            error_examples: BTreeMap::new(),
            timeline: Vec::new(),
            window: Duration::ZERO,
        }
    }

    /// Records one successful operation that took `latency` and completed `second` seconds
    /// into the measured window.
    pub fn record_ok(&mut self, latency: Duration, second: usize) {
        let micros = latency.as_micros().clamp(1, u128::from(LATENCY_US_MAX)) as u64;
        // In range by the clamp: recording cannot fail.
        let _ = self.histogram.record(micros);
        let second = second.min(TIMELINE_SECONDS_MAX - 1);
        if self.timeline.len() <= second {
            self.timeline.resize(second + 1, 0);
        }
        self.timeline[second] += 1;
    }

    /// Records one failed operation.
    pub fn record_error(&mut self, error: OpError) {
        *self.errors_by_kind.entry(error.kind).or_default() += 1;
        self.error_examples.entry(error.kind).or_insert(error.message);
    }

    /// Adds `other`'s records to these (histograms, error counts, timelines bucket by bucket).
    pub fn merge(&mut self, other: &Measured) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.histogram.add(&other.histogram);
        for (kind, count) in &other.errors_by_kind {
            *self.errors_by_kind.entry(kind).or_default() += count;
        }
        for (kind, message) in &other.error_examples {
            self.error_examples.entry(kind).or_insert_with(|| message.clone());
        }
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize(other.timeline.len(), 0);
        }
        for (bucket, count) in self.timeline.iter_mut().zip(&other.timeline) {
            *bucket += count;
        }
        self.window = self.window.max(other.window);
    }

    /// Failed operations of every kind.
    pub fn errors(&self) -> u64 {
        self.errors_by_kind.values().sum()
    }
}

/// Progress shared with whoever shows it: operations completed so far (warmup included).
#[derive(Clone, Debug, Default)]
pub struct Progress {
    completed: Arc<AtomicU64>,
}

impl Progress {
    /// Operations completed so far.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    /// Counts `ops` more completed operations.
    pub fn add(&self, ops: u64) {
        self.completed.fetch_add(ops, Ordering::Relaxed);
    }
}

/// Runs `clients` (one task each) as `schedule` says and merges what they measured. The
/// measured window starts when the warmup ends; it ends at the stop (closed loop: an
/// operation still running then is not counted; open loop: operations due inside the window
/// are waited for and counted, however late — that lateness is what the open loop measures).
pub async fn run<C: ClientLoop>(clients: Vec<C>, schedule: Schedule, progress: &Progress) -> Measured {
    let client_count = clients.len().max(1);
    let start = Instant::now();
    let measure_from = start + schedule.warmup;
    let measure_until = match schedule.stop {
        Stop::After(duration) => Some(measure_from + duration),
        Stop::Total(_) => None,
    };
    // With a total: operations started inside the measured window, taken by the clients.
    let started_measured = Arc::new(AtomicU64::new(0));
    let total = match schedule.stop {
        Stop::Total(total) => Some(total),
        Stop::After(_) => None,
    };
    let mut tasks = Vec::with_capacity(client_count);
    for (index, mut client) in clients.into_iter().enumerate() {
        let progress = progress.clone();
        let started_measured = started_measured.clone();
        tasks.push(tokio::spawn(async move {
            let mut measured = Measured::empty();
            let mut seq = 0u64;
            loop {
                // When the operation is due: closed loop now, open loop on its slot of the
                // arrival schedule (client `index` takes every `client_count`-th slot).
                let due = match schedule.rate_per_sec {
                    None => Instant::now(),
                    Some(rate) => {
                        let slot = seq as f64 * client_count as f64 + index as f64;
                        start + Duration::from_secs_f64(slot / rate)
                    }
                };
                if measure_until.is_some_and(|until| due >= until) {
                    break;
                }
                let in_window = due >= measure_from;
                if in_window && total.is_some_and(|total| started_measured.fetch_add(1, Ordering::Relaxed) >= total) {
                    break;
                }
                tokio::time::sleep_until(due).await;
                let result = client.op(seq).await;
                seq += 1;
                let ended = Instant::now();
                progress.add(1);
                // Closed loop: an operation cut by the end of the window is not counted
                // (its latency is not known in full). Open loop: it is.
                let cut = schedule.rate_per_sec.is_none() && measure_until.is_some_and(|until| ended > until);
                if !in_window || cut {
                    continue;
                }
                match result {
                    Ok(()) => measured.record_ok(ended - due, (ended.saturating_duration_since(measure_from)).as_secs() as usize),
                    Err(error) => measured.record_error(error),
                }
            }
            measured
        }));
    }
    let mut measured = Measured::empty();
    for task in tasks {
        // A client task that panicked measured nothing; the others still count.
        if let Ok(client) = task.await {
            measured.merge(&client);
        }
    }
    measured.window = match measure_until {
        Some(until) => until.saturating_duration_since(measure_from),
        None => Instant::now().saturating_duration_since(measure_from),
    };
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose operations take `op_ms`, except those started while the shared
    /// "server" is stalled, which wait for the stall to end.
    struct Stalling {
        op: Duration,
        stall_from: Instant,
        stall_until: Instant,
        fail: bool,
    }

    impl ClientLoop for Stalling {
        async fn op(&mut self, _seq: u64) -> Result<(), OpError> {
            let now = Instant::now();
            if now >= self.stall_from && now < self.stall_until {
                tokio::time::sleep_until(self.stall_until).await;
            }
            tokio::time::sleep(self.op).await;
            if self.fail {
                return Err(OpError::new("other", "always fails"));
            }
            Ok(())
        }
    }

    fn stalling(clients: usize, stall_after: Duration, stall: Duration, fail_first: bool) -> Vec<Stalling> {
        let now = Instant::now();
        (0..clients)
            .map(|client| Stalling {
                op: Duration::from_millis(1),
                stall_from: now + stall_after,
                stall_until: now + stall_after + stall,
                fail: fail_first && client == 0,
            })
            .collect()
    }

    // Time is paused (tokio's test clock): the schedule is exact and the machine's load
    // cannot change the outcome.
    #[tokio::test(start_paused = true)]
    async fn open_loop_latency_counts_from_when_an_operation_was_due_so_a_stall_shows() {
        // 100 ops/s for 10 s from one client; the server stalls for 1 s in the middle.
        let schedule = Schedule { warmup: Duration::ZERO, stop: Stop::After(Duration::from_secs(10)), rate_per_sec: Some(100.0) };
        let open = run(stalling(1, Duration::from_secs(5), Duration::from_secs(1), false), schedule, &Progress::default()).await;
        // Every operation due during the stall (about 100) waited for its end: ≥ 1 % of
        // operations took ≥ 500 ms, and the worst about the whole second.
        assert!(open.histogram.len() >= 990, "open loop ran its schedule: {}", open.histogram.len());
        assert!(open.histogram.value_at_quantile(0.99) >= 500_000, "p99 {} µs hides the stall", open.histogram.value_at_quantile(0.99));
        assert!(open.histogram.max() >= 900_000);
        // The closed loop, same stall: one operation saw it, the percentiles do not.
        let closed = Schedule { rate_per_sec: None, ..schedule };
        let closed = run(stalling(1, Duration::from_secs(5), Duration::from_secs(1), false), closed, &Progress::default()).await;
        assert!(closed.histogram.value_at_quantile(0.99) < 10_000, "closed loop p99 {} µs", closed.histogram.value_at_quantile(0.99));
        assert!(closed.histogram.max() >= 900_000, "the one stalled operation is still the max");
    }

    #[tokio::test(start_paused = true)]
    async fn open_loop_keeps_its_rate_when_the_server_keeps_up() {
        let schedule = Schedule { warmup: Duration::from_secs(1), stop: Stop::After(Duration::from_secs(4)), rate_per_sec: Some(250.0) };
        let measured = run(stalling(5, Duration::from_secs(3600), Duration::ZERO, false), schedule, &Progress::default()).await;
        // 250/s over 4 s measured: 1,000 operations, 250 in each second.
        assert_eq!(measured.histogram.len(), 1000);
        assert_eq!(measured.timeline.iter().sum::<u64>(), 1000);
        assert!(measured.timeline.iter().all(|&second| (249..=251).contains(&second)), "{:?}", measured.timeline);
        assert!(measured.histogram.max() < 2_000, "no operation waited: max {} µs", measured.histogram.max());
    }

    #[tokio::test(start_paused = true)]
    async fn counts_only_the_measured_window_and_errors_by_kind() {
        let schedule = Schedule { warmup: Duration::from_millis(50), stop: Stop::After(Duration::from_millis(200)), rate_per_sec: None };
        let measured = run(stalling(4, Duration::from_secs(3600), Duration::ZERO, true), schedule, &Progress::default()).await;
        assert!(measured.errors_by_kind.get("other").is_some_and(|&count| count > 0), "client 0 always fails");
        assert_eq!(measured.errors_by_kind.len(), 1);
        // Three successful clients at ≥ 1 ms per op over 200 ms: at most 600 ops.
        assert!(!measured.histogram.is_empty() && measured.histogram.len() <= 600, "{} ops counted", measured.histogram.len());
        assert_eq!(measured.window, Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_total_stops_after_exactly_that_many_measured_operations() {
        let schedule = Schedule { warmup: Duration::from_millis(10), stop: Stop::Total(500), rate_per_sec: None };
        let measured = run(stalling(7, Duration::from_secs(3600), Duration::ZERO, false), schedule, &Progress::default()).await;
        assert_eq!(measured.histogram.len(), 500);
    }

    #[test]
    fn merging_adds_histograms_errors_and_timelines_bucket_by_bucket() {
        let mut a = Measured::empty();
        a.record_ok(Duration::from_millis(1), 0);
        a.record_ok(Duration::from_millis(3), 2);
        a.record_error(OpError::new("timeout", "first"));
        let mut b = Measured::empty();
        b.record_ok(Duration::from_millis(100), 0);
        b.record_error(OpError::new("timeout", "second"));
        b.record_error(OpError::new("unavailable", "no leader"));
        a.merge(&b);
        assert_eq!(a.histogram.len(), 3);
        assert_eq!(a.timeline, vec![2, 0, 1]);
        assert_eq!(a.errors_by_kind.get("timeout"), Some(&2));
        assert_eq!(a.errors_by_kind.get("unavailable"), Some(&1));
        assert_eq!(a.error_examples.get("timeout").map(String::as_str), Some("first"), "the first example is kept");
        assert_eq!(a.errors(), 3);
        // Percentiles of the merge are those of all three latencies.
        assert!(a.histogram.max() >= 99_000 && a.histogram.min() <= 1_001);
    }
}
