//! Serving Prometheus metrics: `GET /metrics` in the text format, from a
//! registry a node or a router owns (one per instance, so several in one process, as in
//! `warden dev` and the tests, each serve their own).
//!
//! Naming (Prometheus conventions): `warden_<subsystem>_<what>_<unit>`, counters end in
//! `_total`, times in `_seconds`, sizes in `_bytes`. No label takes values that grow with
//! paths, sessions or groups: per-group figures are aggregated per node.

use std::sync::Arc;

use prometheus::{Encoder as _, HistogramOpts, Registry, TextEncoder};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a scrape answers: the registry rendered, after `refresh` brought the values kept
/// elsewhere (atomics, gauges read on demand) into it.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut text = Vec::new();
    match TextEncoder::new().encode(&registry.gather(), &mut text) {
        Ok(()) => String::from_utf8_lossy(&text).into_owned(),
        Err(error) => format!("# the metrics could not be encoded: {error}\n"),
    }
}

/// Serves `GET /metrics` on `listener` with what `render` answers at each scrape, until the
/// future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, render: Render) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], render()) }
        }),
    );
    axum::serve(listener, app).await
}

/// Latency buckets, seconds: 100 µs to 10 s (an fsync, an apply, a forwarded call).
pub const LATENCY_BUCKETS: [f64; 16] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Count buckets (entries per fsync): 1 to 4096.
pub const COUNT_BUCKETS: [f64; 13] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0];

/// Size buckets (bytes per fsync): 256 B to 16 MiB.
pub const BYTES_BUCKETS: [f64; 10] = [256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 8388608.0, 16777216.0];

/// Makes and registers one metric of a constant name (a failure is a bug: an invalid name
/// or one registered twice).
pub fn registered<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: Result<M, prometheus::Error>) -> M {
    let metric = metric.unwrap_or_else(|e| unreachable!("a metric of a constant name: {e}"));
    registry.register(Box::new(metric.clone())).unwrap_or_else(|e| unreachable!("a metric registered twice: {e}"));
    metric
}

/// Histogram options: `name`, `help`, `buckets`.
pub fn histogram_opts(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(buckets.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter and a histogram come out in the text format, with their help and type.
    #[test]
    fn a_registry_renders_in_the_text_format() {
        let registry = Registry::new();
        let counter = prometheus::IntCounter::new("warden_test_things_total", "Things.").expect("counter");
        let histogram = prometheus::Histogram::with_opts(histogram_opts("warden_test_seconds", "Time.", &LATENCY_BUCKETS)).expect("histogram");
        registry.register(Box::new(counter.clone())).expect("register");
        registry.register(Box::new(histogram.clone())).expect("register");
        counter.inc_by(3);
        histogram.observe(0.002);
        let text = render(&registry);
        assert!(text.contains("# TYPE warden_test_things_total counter\nwarden_test_things_total 3"), "{text}");
        assert!(text.contains("warden_test_seconds_bucket{le=\"0.0025\"} 1") && text.contains("warden_test_seconds_count 1"), "{text}");
    }
}
