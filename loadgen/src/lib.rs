//! Warden's load generator: drives an operation from many concurrent closed-loop clients
//! for a fixed time and reports throughput and latency percentiles (hdrhistogram).

pub mod linearizability;
pub mod target;
pub mod watch_check;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Highest latency the histogram tracks (longer ones are clamped to it).
const LATENCY_US_MAX: u64 = 60_000_000;

/// Result of one closed-loop run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunReport {
    /// Concurrent clients.
    pub clients: usize,
    /// Operations that succeeded inside the measured window.
    pub ops: u64,
    /// Operations that failed inside the measured window.
    pub errors: u64,
    /// Length of the measured window.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_sec: f64,
    /// Median latency of successful operations.
    pub p50_ms: f64,
    /// 99th percentile latency.
    pub p99_ms: f64,
    /// 99.9th percentile latency.
    pub p999_ms: f64,
    /// Slowest operation.
    pub max_ms: f64,
}

fn new_histogram() -> Histogram<u64> {
    // Three significant digits between 1 µs and a minute: bounded memory (~100 KiB).
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("constant histogram bounds are valid")
}

/// Runs `op(client, seq)` in a loop on each of `clients` tasks: first for `warmup` (not
/// measured), then for `measure`. Each client starts its next operation when the previous
/// one finishes (closed loop).
pub async fn closed_loop<F, Fut, E>(clients: usize, warmup: Duration, measure: Duration, op: F) -> RunReport
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    E: Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let measure_from = start + warmup;
    let measure_until = measure_from + measure;
    let mut tasks = Vec::with_capacity(clients);
    for client in 0..clients {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut errors = 0u64;
            let mut seq = 0u64;
            loop {
                let began = Instant::now();
                if began >= measure_until {
                    break;
                }
                let result = op(client, seq).await;
                seq += 1;
                let ended = Instant::now();
                if began < measure_from || ended > measure_until {
                    continue;
                }
                match result {
                    Ok(()) => {
                        let micros = (ended - began).as_micros().clamp(1, u128::from(LATENCY_US_MAX)) as u64;
                        let _ = histogram.record(micros);
                    }
                    Err(_) => errors += 1,
                }
            }
            (histogram, errors)
        }));
    }
    let mut histogram = new_histogram();
    let mut errors = 0;
    for task in tasks {
        if let Ok((client_histogram, client_errors)) = task.await {
            let _ = histogram.add(&client_histogram);
            errors += client_errors;
        }
    }
    report(clients, &histogram, errors, measure)
}

/// Builds a report from a latency histogram in microseconds.
pub fn report(clients: usize, histogram: &Histogram<u64>, errors: u64, window: Duration) -> RunReport {
    let seconds = window.as_secs_f64();
    let ms = |micros: u64| micros as f64 / 1000.0;
    RunReport {
        clients,
        ops: histogram.len(),
        errors,
        seconds,
        ops_per_sec: histogram.len() as f64 / seconds,
        p50_ms: ms(histogram.value_at_quantile(0.50)),
        p99_ms: ms(histogram.value_at_quantile(0.99)),
        p999_ms: ms(histogram.value_at_quantile(0.999)),
        max_ms: ms(histogram.max()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_only_the_measured_window_and_errors_apart() {
        let report = closed_loop(4, Duration::from_millis(50), Duration::from_millis(200), |client, _| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if client == 0 {
                Err(())
            } else {
                Ok(())
            }
        })
        .await;
        assert_eq!(report.clients, 4);
        assert!(report.errors > 0, "client 0 always fails");
        assert!(report.ops > 0, "clients 1..4 succeed");
        // Three successful clients at ≥ 5 ms per op over 200 ms cannot exceed 120 ops.
        assert!(report.ops <= 3 * 200 / 5, "ops {} counted outside the window", report.ops);
        assert!(report.p50_ms >= 5.0);
    }
}
