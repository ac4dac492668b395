//! Node wiring: what a shard-node serves beside its raft transport — the public API
//! (`warden.v1.Warden`, the routers' batch streams of it, and the session checks between groups), the placement API, and the
//! node's placement heartbeats — put together from the namespace, watch, service and
//! placement modules and handed to the engine as routes.
//!
//! Architecture invariant: the engine (`warden-engine`) knows nothing of these services,
//! and the compiler enforces it (they live in crates above it); the node's serving
//! (`node.rs`) sees them only as [`NodeServices`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{Either, Ready};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::{http, Service};
use tonic::server::NamedService;
use warden_placement::{PlacementConfig, ScheduleLimits};

use crate::group_links::GroupLinks;
use crate::node::{NodeRoutes, NodeServices, ServiceContext};
use crate::placement::gauges::PlacementGauges;
use crate::placement::heartbeat::Heard;
use crate::placement::limits::{bootstrap_record, spread_periodically};
use crate::placement::service::{PlacementService, Security, HEARTBEATS_FLUSH_INTERVAL, SCHEDULE_INTERVAL, SETTLE_CREATIONS_INTERVAL};
use crate::placement::ShardNodeFactory;
use crate::service::{RemoteSessionMetrics, WardenService};
use warden_engine::host::NodeError;
use warden_engine::kv::KvFactory;
use warden_engine::state_machine::StateMachineFactory;
use warden_namespace::limits::LimitsBoard;
use warden_namespace::watch::WatchHubs;
use warden_namespace::{Limits, NamespaceFactory};

/// A state-machine factory together with what the node's services need from its state
/// machines. The defaults are for factories that make neither namespaces nor a placement
/// group.
pub trait ServingFactory: StateMachineFactory {
    /// Where the namespaces of this factory publish watch events, for the `Watch` service.
    fn watch_hubs(&self) -> Option<WatchHubs> {
        None
    }

    /// The routing version node `node_id`'s placement replica has applied, as it changes.
    fn routing_versions(&self, _node_id: u64) -> Option<watch::Receiver<u64>> {
        None
    }

    /// The placement group's configuration, when this factory makes placement state machines
    /// (then the node runs the placement leader's scheduler while it leads).
    fn placement_config(&self) -> Option<PlacementConfig> {
        None
    }

    /// Where the namespace replicas publish the limits they apply (`None`: no namespace).
    fn limits_board(&self) -> Option<LimitsBoard> {
        None
    }

    /// Where the namespace replicas publish what they hold, for the metrics (`None`: no
    /// namespace).
    fn namespace_counts(&self) -> Option<warden_namespace::counts::NamespaceCounts> {
        None
    }

    /// This binary's limits (the replicated ones are what a bootstrap records).
    fn default_limits(&self) -> Limits {
        Limits::default()
    }
}

impl ServingFactory for KvFactory {}

impl ServingFactory for NamespaceFactory {
    fn watch_hubs(&self) -> Option<WatchHubs> {
        Some(self.hubs.clone())
    }

    fn limits_board(&self) -> Option<LimitsBoard> {
        Some(self.board.clone())
    }

    fn namespace_counts(&self) -> Option<warden_namespace::counts::NamespaceCounts> {
        Some(self.counts.clone())
    }

    fn default_limits(&self) -> Limits {
        self.limits.clone()
    }
}

impl ServingFactory for ShardNodeFactory {
    fn watch_hubs(&self) -> Option<WatchHubs> {
        self.namespace.watch_hubs()
    }

    fn routing_versions(&self, node_id: u64) -> Option<watch::Receiver<u64>> {
        Some(self.routing_versions.sender(node_id).subscribe())
    }

    fn placement_config(&self) -> Option<PlacementConfig> {
        Some(self.placement.clone())
    }

    fn limits_board(&self) -> Option<LimitsBoard> {
        self.namespace.limits_board()
    }

    fn namespace_counts(&self) -> Option<warden_namespace::counts::NamespaceCounts> {
        self.namespace.namespace_counts()
    }

    fn default_limits(&self) -> Limits {
        self.namespace.default_limits()
    }
}

/// The public API, the placement API and placement heartbeats, for every node started with
/// it (one value may serve several in-process nodes).
pub struct ApiServices {
    factory: Arc<dyn ServingFactory>,
    /// What each node's remote-session checks found, by node id (the latest start's).
    remote_metrics: Mutex<HashMap<u64, Arc<RemoteSessionMetrics>>>,
}

impl ApiServices {
    /// Services over the state machines `factory` makes.
    pub fn new(factory: Arc<dyn ServingFactory>) -> ApiServices {
        ApiServices { factory, remote_metrics: Mutex::default() }
    }

    /// What node `node_id`'s last round of remote-session checks found (`None`: never started).
    pub fn remote_session_metrics(&self, node_id: u64) -> Option<Arc<RemoteSessionMetrics>> {
        self.remote_metrics.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&node_id).cloned()
    }
}

impl NodeServices for ApiServices {
    fn start(&self, context: &ServiceContext, routes: &mut NodeRoutes) -> Result<(), NodeError> {
        let config = &context.config;
        let node_id = config.node_id;
        let timeout = Duration::from_millis(config.request_timeout_ms);
        // 1. The public API, and the checks of sessions homed in other groups it depends on.
        let links = Arc::new(GroupLinks::new(context.directory.clone(), context.faults.clone(), config.tls.clone()));
        // The ACL every call is judged by (security on) and the cluster's apply limits, kept
        // current by the heartbeats.
        let heard = Heard::default();
        let acl = heard.acl.clone();
        let board = self.factory.limits_board();
        let api = WardenService::new(
            context.handle.clone(),
            context.directory.clone(),
            timeout,
            config.election_timeout(),
            board.clone().unwrap_or_default(),
            self.factory.watch_hubs(),
            links,
            acl.clone(),
        );
        self.remote_metrics.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(node_id, api.remote_metrics());
        if config.remote_session_check_ms > 0 {
            context.runtime.spawn(api.clone().run_session_checks(Duration::from_millis(config.remote_session_check_ms)));
        }
        // 2. Placement: its API on every node (any node answers for the placement group it
        //    may host) and heartbeats that keep this node's address and liveness known.
        //    While it leads placement, the node also runs the scheduler (repair, drain, balance).
        let placement_config = self.factory.placement_config();
        let placement = PlacementService::new(
            context.handle.clone(),
            context.directory.clone(),
            timeout,
            self.factory.routing_versions(node_id),
            placement_config.clone().unwrap_or_default(),
            context.faults.clone(),
            Security { tls: config.tls.clone(), acl: acl.clone() },
        )
        .with_bootstrap_limits(bootstrap_record(&self.factory.default_limits(), config.election_timeout().as_millis() as u64 * 3 / 2))
        .with_store(context.db.clone());
        context.runtime.spawn(placement.clone().settle_creations_periodically(SETTLE_CREATIONS_INTERVAL));
        context.runtime.spawn(placement.clone().flush_heartbeats_periodically(HEARTBEATS_FLUSH_INTERVAL));
        if placement_config.is_some() {
            context.runtime.spawn(placement.clone().schedule_periodically(SCHEDULE_INTERVAL, ScheduleLimits::default()));
            match PlacementGauges::register(context.handle.metrics().registry()) {
                Ok(gauges) => {
                    context.runtime.spawn(placement.clone().report_gauges_periodically(gauges));
                }
                Err(error) => tracing::warn!(%error, "placement metrics not registered"),
            }
        }
        if let Some(counts) = self.factory.namespace_counts() {
            context.metrics.attach_namespace(counts);
        }
        if let Some(hubs) = self.factory.watch_hubs() {
            context.metrics.attach_watches(hubs);
        }
        if let Some(auto_split) = placement_config.as_ref().and_then(|c| c.auto_split.clone()) {
            context.runtime.spawn(placement.clone().auto_split_periodically(auto_split));
        }
        if config.placement_heartbeat_ms > 0 {
            let interval = Duration::from_millis(config.placement_heartbeat_ms);
            let heartbeat = crate::placement::heartbeat::run(
                context.handle.clone(),
                context.directory.clone(),
                context.listen_addr,
                config.zone.clone(),
                interval,
                config.tls.clone(),
                heard.clone(),
            );
            context.runtime.spawn(heartbeat);
            // Every group this node leads applies the limits placement has (`limits.rs`).
            if let Some(board) = board {
                context.runtime.spawn(spread_periodically(context.handle.clone(), board, heard.limits.clone(), interval, timeout));
            }
        }
        // Health: NOT_SERVING while the node starts, until placement has answered one of its
        // heartbeats or every group it hosts knows its leader (whichever comes first);
        // `host/drain.rs` turns it back off when the node stops.
        let health = context.health.clone();
        let answered = heard.answered.subscribe();
        let node = context.handle.clone();
        context.runtime.spawn(async move {
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
            health.set_not_serving::<warden_proto::v1::warden_server::WardenServer<WardenService>>().await;
            let mut poll = tokio::time::interval(STARTING_POLL);
            loop {
                poll.tick().await;
                let led_known = node.hosted_groups().iter().all(|group| node.leader_info(*group).leader_id != 0);
                if node.activity().is_stopping() {
                    return;
                }
                if *answered.borrow() || led_known {
                    break;
                }
            }
            health.set_service_status("", tonic_health::ServingStatus::Serving).await;
            health.set_serving::<warden_proto::v1::warden_server::WardenServer<WardenService>>().await;
        });
        // 3. The peer port serves everything; the client port the public API and placement's
        //    administration, not its internal calls (replica lifecycle, descriptors, split
        //    steps, heartbeats), nor the session checks and batch streams between nodes and
        //    from routers.
        routes.client.add_service(api.clone().server()).add_service(Only { inner: placement.clone().server(), methods: PLACEMENT_CLIENT_METHODS });
        routes
            .peer
            .add_service(api.clone().session_check_server())
            .add_service(api.clone().batch_server())
            .add_service(api.server())
            .add_service(placement.server());
        Ok(())
    }
}

/// How often a starting node checks whether it is ready to report SERVING.
const STARTING_POLL: Duration = Duration::from_millis(100);

/// The placement methods a node's client port serves: reading the routing table and the
/// administration a person runs (`warden admin`, `warden status`).
const PLACEMENT_CLIENT_METHODS: &[&str] = &[
    "GetRoutingTable",
    "WatchRoutingTable",
    "CreateGroup",
    "SplitGroup",
    "MergeGroup",
    "RemoveGroup",
    "SetNodeState",
    "SetSchedulerPaused",
    "ReplicaStatus",
    "GroupWrites",
    "ChangeAcl",
    "ChangeAclGroup",
    "ListAcl",
    "SetQuota",
    "ListQuotas",
    "SetLimits",
    "GetLimits",
];

/// A gRPC service with only some of its methods; the others answer PERMISSION_DENIED. For a
/// port that serves a service whose other methods belong on another port.
#[derive(Clone)]
struct Only<S> {
    inner: S,
    /// The methods served, by name (the last segment of the request path).
    methods: &'static [&'static str],
}

impl<S: NamedService> NamedService for Only<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Only<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible> + NamedService,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, Ready<Result<http::Response<Body>, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        if self.methods.contains(&method) {
            Either::Left(self.inner.call(request))
        } else {
            let refused = tonic::Status::permission_denied(format!("{}/{method} is not served on this port", S::NAME));
            Either::Right(futures::future::ready(Ok(refused.into_http())))
        }
    }
}
