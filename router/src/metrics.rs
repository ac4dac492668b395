//! A router's Prometheus metrics, served at `GET /metrics` on `--metrics-listen`.
//!
//! Labels are bounded: `method` is one of the forwarded unary RPCs, `code` a gRPC code.

use std::time::Instant;

use prometheus::{HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tonic::Status;
use warden_server_kit::metrics::{histogram_opts, registered, LATENCY_BUCKETS};

/// One router's metrics.
pub struct RouterMetrics {
    registry: Registry,
    requests: IntCounterVec,
    forward_seconds: HistogramVec,
    /// Attempts after the first (another replica, the hinted leader, after a table refresh).
    pub retries: IntCounter,
    table_version: IntGauge,
}

impl Default for RouterMetrics {
    fn default() -> Self {
        RouterMetrics::new()
    }
}

impl RouterMetrics {
    /// Every metric, registered, zero.
    pub fn new() -> RouterMetrics {
        let registry = Registry::new();
        let requests = registered(
            &registry,
            IntCounterVec::new(Opts::new("warden_router_requests_total", "Forwarded calls, by method and gRPC code."), &["method", "code"]),
        );
        let forward_seconds = registered(
            &registry,
            HistogramVec::new(
                histogram_opts("warden_router_forward_seconds", "Time to answer a forwarded call, retries included, by method.", &LATENCY_BUCKETS),
                &["method"],
            ),
        );
        let retries = registered(&registry, IntCounter::new("warden_router_retries_total", "Attempts of a forwarded call after its first."));
        let table_version =
            registered(&registry, IntGauge::new("warden_router_routing_table_version", "The routing table version the router routes by."));
        RouterMetrics { registry, requests, forward_seconds, retries, table_version }
    }

    /// A forwarded `method` call started at `started` ended with `result`.
    pub fn forwarded<T>(&self, method: &str, started: Instant, result: &Result<T, Status>) {
        let code = match result {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.requests.with_label_values(&[method, &format!("{code:?}")]).inc();
        self.forward_seconds.with_label_values(&[method]).observe(started.elapsed().as_secs_f64());
    }

    /// The metrics in the Prometheus text format, with the table at `table_version`.
    pub fn render(&self, table_version: u64) -> String {
        self.table_version.set(i64::try_from(table_version).unwrap_or(i64::MAX));
        warden_server_kit::metrics::render(&self.registry)
    }
}
