//! Warden's stateless router (DESIGN.md code map, `router/`): serves the whole public API
//! (`warden.v1.Warden`) and forwards each call to the shard group serving its path, using a
//! cached routing table read from the placement group and a leader cache per group.
//!
//! - [`table`]: the routing table copy (longest prefix by segments).
//! - [`upstream`]: table refresh, channels, leader cache, and the retrying call.
//! - [`service`]: the `Warden` service: forwarding, `GetChildren` merging, keepalive streams.
//! - [`watch`]: watch streams proxied over one upstream stream per group; recursive watches
//!   span the groups below their path.
//! - [`batch`]: the long-lived streams per node that carry forwarded unary calls in
//!   batches.
//! - [`fan_out`]: recursive deletes of subtrees several groups serve parts of.
//! - [`limits`]: per-principal request rate limits.
//! - [`etcd`]: the etcd v3 API: etcd keys and ranges as Warden paths.
//!
//! **Architecture invariant:** a router holds nothing that cannot be rebuilt from placement
//! and the shard-nodes; killing one loses nothing (clients reconnect to any router).

pub mod batch;
pub mod etcd;
pub mod fan_out;
pub mod limits;
pub mod metrics;
pub mod principal;
pub mod service;
pub mod upstream;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use warden_proto::tls::{Admit, Tls};

pub use service::RouterService;
pub use upstream::Upstreams;

/// How a router runs.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Node addresses (`host:port`) to learn the cluster from.
    pub seeds: Vec<String>,
    /// Deadline of a request when the caller sets none (a shorter caller deadline wins).
    pub request_timeout: Duration,
    /// How often the routing table is re-read while placement cannot be watched (and how
    /// long to wait before watching again after a watch ends).
    pub table_refresh_interval: Duration,
    /// Watch placement for new tables (`WatchRoutingTable`); off, the router learns of
    /// changes only by polling and from WRONG_GROUP.
    pub watch_placement: bool,
    /// Batch streams per node that carry the forwarded unary calls (0: each call its own
    /// unary gRPC call).
    pub batch_streams: usize,
    /// TLS: clients connect with TLS and a certificate of the CA, and the router
    /// reaches nodes' peer ports with its router certificate (`None`: plaintext).
    pub tls: Option<Arc<Tls>>,
    /// Calls per second each client principal may start through this router (`None`: no
    /// limit; applies only with TLS, which names principals).
    pub requests_per_s_per_principal: Option<std::num::NonZeroU32>,
    /// Where the router serves its Prometheus metrics (`GET /metrics`; `None`: not served).
    pub metrics_listen: Option<Arc<std::net::TcpListener>>,
    /// Where the router serves etcd's v3 API ([`etcd`]; `None`: not served), with the
    /// router's TLS when it has one.
    pub etcd_listen: Option<Arc<std::net::TcpListener>>,
}

impl RouterConfig {
    /// Defaults (5 s requests, placement watched, table re-read every second while it cannot
    /// be, one batch stream per node) for `seeds`.
    pub fn new(seeds: Vec<String>) -> RouterConfig {
        RouterConfig {
            seeds,
            request_timeout: Duration::from_secs(5),
            table_refresh_interval: Duration::from_secs(1),
            watch_placement: true,
            batch_streams: 1,
            tls: None,
            requests_per_s_per_principal: None,
            metrics_listen: None,
            etcd_listen: None,
        }
    }
}

/// Serves the router on `listener` until the future is dropped, refreshing the routing
/// table in the background.
pub async fn serve(listener: tokio::net::TcpListener, mut config: RouterConfig) -> Result<(), tonic::transport::Error> {
    let upstreams = Arc::new(Upstreams::batched(config.seeds.clone(), config.batch_streams, config.tls.clone()));
    let metrics = config.metrics_listen.take().map(|listener| {
        let upstreams = upstreams.clone();
        tokio::spawn(async move {
            let render: warden_server_kit::metrics::Render = Arc::new(move || upstreams.metrics.render(upstreams.table().version));
            let listener = listener.try_clone().and_then(|l| l.set_nonblocking(true).map(|()| l)).and_then(tokio::net::TcpListener::from_std);
            if let Err(error) = async { warden_server_kit::metrics::serve(listener?, render).await }.await {
                tracing::error!(%error, "the metrics endpoint stopped");
            }
        })
    });
    let refresher = {
        let upstreams = upstreams.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(config.table_refresh_interval);
            loop {
                ticker.tick().await;
                // 1. A poll: the table now (and the nodes to watch at).
                if let Err(status) = upstreams.refresh().await {
                    tracing::debug!(%status, "routing table refresh");
                    continue;
                }
                // 2. Then watch placement: every change arrives as it applies. When the
                //    watch ends (its node went away), poll again after the interval.
                if config.watch_placement {
                    if let Err(status) = upstreams.watch_table().await {
                        tracing::debug!(%status, "routing table watch");
                    }
                }
            }
        })
    };
    let incoming = warden_proto::tls::incoming(listener, config.tls.clone(), Admit::Clients);
    // Reflection lets grpcurl and similar tools call the router without the .proto files.
    let reflection =
        tonic_reflection::server::Builder::configure().register_encoded_file_descriptor_set(warden_proto::FILE_DESCRIPTOR_SET).build_v1().ok();
    let limits = config.requests_per_s_per_principal.map(limits::PrincipalLimits::new);
    let etcd = match config.etcd_listen.take() {
        Some(listener) => Some(tokio::spawn(etcd::serve(listener, upstreams.clone(), config.request_timeout, config.tls.clone()))),
        None => None,
    };
    let service = RouterService::server(upstreams, config.request_timeout);
    let admit = move |request| match &limits {
        Some(limits) => limits.admit(request),
        None => Ok(request),
    };
    let served = tonic::transport::Server::builder()
        .add_service(tonic::service::interceptor::InterceptedService::new(principal::WithPrincipal::new(service), admit))
        .add_optional_service(reflection)
        .serve_with_incoming(incoming)
        .await;
    refresher.abort();
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    if let Some(etcd) = etcd {
        etcd.abort();
    }
    served
}
