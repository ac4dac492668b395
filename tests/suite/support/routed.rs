//! An in-process cluster with a placement group and shard groups for prefixes, and routers
//! on their own runtimes: what the router and cross-group tests start from.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_proto::follow::{CallKind, Follow};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::CreateGroupRequest;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;
use warden_shard_node::service::error_of;

/// How long any one step may take.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// A cluster of 5 nodes with placement on nodes 1-3, the root group, and a group per prefix.
pub async fn cluster_with_groups(prefixes: &[&str]) -> Arc<Cluster> {
    cluster_of(ShardNodeFactory::default(), prefixes).await
}

/// [`cluster_with_groups`] with the state machines `factory` makes (other limits).
pub async fn cluster_of(factory: ShardNodeFactory, prefixes: &[&str]) -> Arc<Cluster> {
    let config = ClusterConfig { serve_api: true, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(factory)).expect("cluster starts"));
    cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap");
    for prefix in prefixes {
        create_group(&cluster, prefix).await;
    }
    cluster
}

/// Has placement create a shard group for `prefix` (retried until placement answers).
pub async fn create_group(cluster: &Cluster, prefix: &str) {
    let deadline = Instant::now() + TIMEOUT;
    let mut retried = false;
    loop {
        let leader = cluster.wait_leader(warden_placement::PLACEMENT_GROUP_ID, TIMEOUT).await.expect("placement leader");
        let addr = cluster.addr(leader).expect("addr");
        let mut client = PlacementClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy());
        match client.create_group(CreateGroupRequest { prefix: prefix.into() }).await {
            Ok(_) => return,
            // An earlier attempt whose answer was lost (a leader change, a timeout) may have
            // created the group: the retry then finds the prefix taken, by that group.
            Err(status) if retried && status.code() == tonic::Code::AlreadyExists => return,
            Err(status) => assert!(Instant::now() < deadline, "creating {prefix}: {status}"),
        }
        retried = true;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A router on its own runtime (as a separate process would be): dropping it stops every
/// task and connection it had.
pub struct Router {
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Router {
    /// Stops the router and waits until every task it ran (listener, connections) is gone,
    /// so each connection it had is closed when this returns (dropping it only starts that).
    pub async fn stop(mut self) {
        if let Some(runtime) = self.runtime.take() {
            // A runtime may only be shut down and waited for off the async threads.
            let stopped = tokio::task::spawn_blocking(move || runtime.shutdown_timeout(TIMEOUT)).await;
            assert!(stopped.is_ok(), "the router's runtime did not shut down");
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A router on a fresh loopback port (or `port`), seeded with every node.
pub fn start_router(cluster: &Cluster, port: u16) -> Router {
    start_router_with(cluster, port, true)
}

/// A router that never re-reads its routing table unless a shard-node says it is stale
/// (WRONG_GROUP): no placement watch, a poll every hour.
pub fn start_stale_router(cluster: &Cluster, port: u16) -> Router {
    start_router_with(cluster, port, false)
}

/// A router on `addr` again, once the router dropped there has let the port go (its runtime
/// shuts down in the background, so the port is free a moment after the drop, not at once).
pub async fn restart_router(cluster: &Cluster, addr: std::net::SocketAddr) -> Router {
    let deadline = Instant::now() + TIMEOUT;
    let listener = loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => break listener,
            Err(error) => assert!(Instant::now() < deadline, "{addr} is still taken after {TIMEOUT:?}: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    serve_router(cluster, listener, true)
}

/// Waits until nothing accepts connections at `addr`: a dropped router's runtime shuts down
/// in the background, so its listener and connections close a moment after the drop.
pub async fn wait_refused(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + TIMEOUT;
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "{addr} still accepts connections after {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn start_router_with(cluster: &Cluster, port: u16, watch_placement: bool) -> Router {
    serve_router(cluster, std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind"), watch_placement)
}

/// A router with `tls` (its certificate naming a router) on a fresh loopback port, limiting
/// each client principal to `requests_per_s` calls per second if set.
pub fn start_secure_router(cluster: &Cluster, tls: Arc<warden_proto::tls::Tls>, requests_per_s: Option<std::num::NonZeroU32>) -> Router {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    serve_router_with(
        cluster,
        listener,
        true,
        warden_router::RouterConfig { tls: Some(tls), requests_per_s_per_principal: requests_per_s, ..warden_router::RouterConfig::new(Vec::new()) },
    )
}

/// A router on a fresh loopback port that also serves etcd's v3 API on another one
/// (answered second).
pub fn start_router_with_etcd(cluster: &Cluster) -> (Router, std::net::SocketAddr) {
    serve_router_with_etcd(cluster, true)
}

/// [`start_router_with_etcd`] for a router that re-reads its routing table only when a
/// shard-node says it is stale (as [`start_stale_router`]).
pub fn start_stale_router_with_etcd(cluster: &Cluster) -> (Router, std::net::SocketAddr) {
    serve_router_with_etcd(cluster, false)
}

fn serve_router_with_etcd(cluster: &Cluster, watch_placement: bool) -> (Router, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let etcd = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the etcd port");
    let etcd_addr = etcd.local_addr().expect("addr");
    let config = warden_router::RouterConfig { etcd_listen: Some(Arc::new(etcd)), ..warden_router::RouterConfig::new(Vec::new()) };
    (serve_router_with(cluster, listener, watch_placement, config), etcd_addr)
}

fn serve_router(cluster: &Cluster, listener: std::net::TcpListener, watch_placement: bool) -> Router {
    serve_router_with(cluster, listener, watch_placement, warden_router::RouterConfig::new(Vec::new()))
}

/// Serves a router configured as `config` (its seeds, timeouts and table refresh set here).
fn serve_router_with(cluster: &Cluster, listener: std::net::TcpListener, watch_placement: bool, config: warden_router::RouterConfig) -> Router {
    let refresh = if watch_placement { Duration::from_secs(1) } else { Duration::from_secs(3600) };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    let seeds = cluster.node_ids().into_iter().filter_map(|id| cluster.addr(id)).map(|a| a.to_string()).collect();
    let config =
        warden_router::RouterConfig { seeds, request_timeout: Duration::from_secs(10), table_refresh_interval: refresh, watch_placement, ..config };
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
        let _ = warden_router::serve(listener, config).await;
    });
    Router { addr, runtime: Some(runtime) }
}

/// A `warden.v1.Warden` client of the router at `addr`.
pub fn client(addr: std::net::SocketAddr) -> WardenClient<Channel> {
    WardenClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").timeout(TIMEOUT).connect_lazy())
}

/// Hands `group`'s leadership to node `to` (asked again until it lands: raft abandons a
/// transfer whose target does not catch up in an election timeout).
pub async fn transfer_leader(cluster: &Cluster, group: u64, to: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let leader = cluster.wait_leader(group, TIMEOUT).await.expect("a leader");
        if leader == to {
            return;
        }
        assert!(Instant::now() < deadline, "group {group}'s leadership never moved from {leader} to {to}");
        if let Some(handle) = cluster.handle(leader) {
            let _ = handle.transfer_leader(group, to).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A lazily connected client of node `node`'s placement API.
pub fn placement_client(cluster: &Cluster, node: u64) -> PlacementClient<Channel> {
    let addr = cluster.addr(node).expect("addr");
    PlacementClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy())
}

/// Calls `call` on the running nodes in turn (following NOT_LEADER hints) until it succeeds
/// or is refused, retried as an idempotent call by the rule of `warden_proto::follow`, for up
/// to [`TIMEOUT`].
pub async fn at_placement_leader<T, F, Fut>(cluster: &Cluster, call: F) -> Result<T, WardenError>
where
    F: Fn(PlacementClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut follow = Follow::new(CallKind::Idempotent, tokio::time::Instant::now() + TIMEOUT);
    let mut node = cluster.running()[0];
    loop {
        let status = match call(placement_client(cluster, node)).await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) => status,
        };
        if let Err(status) = follow.retry_after(status).await {
            return Err(error_of(&status).unwrap_or(WardenError {
                code: Code::Unavailable as i32,
                message: status.to_string(),
                ..WardenError::default()
            }));
        }
        let turn = follow.turn();
        let running = cluster.running();
        node = turn.hint.filter(|id| running.contains(id) && *id != node).unwrap_or(running[turn.attempt % running.len()]);
    }
}

/// The group serving `path`, as the router's answer names it.
pub async fn group_serving(router: &mut WardenClient<Channel>, path: &str) -> u64 {
    let request = warden_proto::v1::ExistsRequest { path: path.into(), ..Default::default() };
    let exists = router.exists(request).await.expect("exists").into_inner();
    exists.header.expect("header").group_id
}

/// A session of `ttl_ms` homed in the group serving `hint`.
pub async fn session_homed_at(router: &mut WardenClient<Channel>, hint: &str, ttl_ms: u64) -> u64 {
    let request = warden_proto::v1::CreateSessionRequest { ttl_ms, path_hint: hint.into(), ..Default::default() };
    router.create_session(request).await.expect("create session").into_inner().session_id
}

/// A router with `tls` (its certificate naming a router) on a fresh loopback port that also
/// serves etcd's v3 API, with the same TLS, on another one (answered second).
pub fn start_secure_router_with_etcd(cluster: &Cluster, tls: Arc<warden_proto::tls::Tls>) -> (Router, std::net::SocketAddr) {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let etcd = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the etcd port");
    let etcd_addr = etcd.local_addr().expect("addr");
    let config = warden_router::RouterConfig { tls: Some(tls), etcd_listen: Some(Arc::new(etcd)), ..warden_router::RouterConfig::new(Vec::new()) };
    (serve_router_with(cluster, listener, true, config), etcd_addr)
}
