//! A served node: the engine ([`warden_engine::Engine`]) with its listeners. The peer port
//! serves the engine's raft transport, gRPC health and reflection, and the services wired
//! in by the caller ([`NodeServices`]: the public API and placement, `node_services`); the
//! client port those meant for clients; with `NodeConfig::metrics_listen`, `/metrics`.
//! With `NodeConfig::tls`, both ports speak TLS only, and the peer port admits nodes and
//! routers only.

use std::net::SocketAddr;
use std::sync::Arc;

use warden_engine::config::NodeConfig;
use warden_engine::host::drain::{DrainLimits, DrainReport};
use warden_engine::host::{NodeError, NodeHandle, RaftMetricsSnapshot};
use warden_engine::state_machine::StateMachineFactory;
use warden_engine::storage::Db;
use warden_engine::store_writer::StoreMetricsSnapshot;
use warden_engine::transport::server::RaftTransportService;
use warden_engine::transport::{NetFaults, PeerDirectory};
use warden_engine::Engine;
use warden_proto::tls::{Admit, Tls};

use crate::metrics::NamespaceMetrics;

/// What the services a node serves beside its raft transport get to work with.
pub struct ServiceContext {
    /// The node's configuration.
    pub config: Arc<NodeConfig>,
    /// A handle to the node's groups.
    pub handle: NodeHandle,
    /// Where every node listens.
    pub directory: Arc<PeerDirectory>,
    /// The fault injector the node's links consult.
    pub faults: Arc<NetFaults>,
    /// The node's I/O runtime, for the services' background tasks.
    pub runtime: tokio::runtime::Handle,
    /// Where the node's peer port listens (the address other nodes and routers know).
    pub listen_addr: SocketAddr,
    /// The node's gRPC health service, for the services to report themselves serving.
    pub health: tonic_health::server::HealthReporter,
    /// The node's store, for reads of a whole group's data off the workers (backups,
    /// through [`warden_engine::state_machine::SmReader::with_image`]).
    pub db: Arc<Db>,
    /// The node's namespace and watch metrics, for the services to attach their sources to.
    pub metrics: Arc<NamespaceMetrics>,
}

/// Services a node serves beside the raft transport, wired in by the caller so that the
/// node's serving knows nothing of what they are.
pub trait NodeServices: Send + Sync {
    /// Starts the services' background tasks for one node and adds their gRPC services to
    /// the node's `routes`.
    fn start(&self, context: &ServiceContext, routes: &mut NodeRoutes) -> Result<(), NodeError>;
}

/// The gRPC services of a node's two ports.
#[derive(Default)]
pub struct NodeRoutes {
    /// The peer port: the raft transport, placement's internal calls, session checks, and
    /// the public API forwarded by routers. With TLS on, only nodes and routers connect.
    pub peer: tonic::service::RoutesBuilder,
    /// The client port: the public API and placement's administration, for clients and the
    /// CLI (served only when the node has a client listener).
    pub client: tonic::service::RoutesBuilder,
}

/// Where a node listens: its peer port, and its client port if it has one.
pub struct Listeners {
    /// The peer port (its address is the one placement and the other nodes know).
    pub peer: std::net::TcpListener,
    /// The client port.
    pub client: Option<std::net::TcpListener>,
}

impl From<std::net::TcpListener> for Listeners {
    /// A peer port only.
    fn from(peer: std::net::TcpListener) -> Listeners {
        Listeners { peer, client: None }
    }
}

/// Serves `routes` on `listener` until the server fails (it never stops on its own), with
/// TLS admitting `admit` when `tls` is set.
async fn serve(listener: std::net::TcpListener, tls: Option<Arc<Tls>>, admit: Admit, routes: tonic::service::Routes) -> Result<(), String> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| format!("listener: {e}"))?;
    let served = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .add_routes(routes)
        .serve_with_incoming(warden_proto::tls::incoming(listener, tls, admit))
        .await;
    match served {
        Ok(()) => Err("stopped".into()),
        Err(error) => Err(format!("stopped: {error}")),
    }
}

/// A running shard-node: its engine and the servers on its listeners.
pub struct Node {
    engine: Engine,
    /// The node's gRPC health, reported NOT_SERVING once a graceful stop begins.
    health: tonic_health::server::HealthReporter,
    /// Where the node serves its metrics, if it does.
    metrics_addr: Option<SocketAddr>,
}

impl Node {
    /// Starts the engine ([`Engine::start`]: the store, every replica the node hosts, the
    /// workers, the store writer), then the servers on `listeners`: the peer port serves the
    /// raft transport and the peer routes of `services` (the public API and placement, wired
    /// by `node_services`; none for a bare engine); their client routes go on the client
    /// listener, if there is one. With `config.tls`, both ports speak TLS only, and the peer
    /// port admits nodes and routers only.
    pub fn start(
        config: NodeConfig,
        listeners: Listeners,
        directory: Arc<PeerDirectory>,
        faults: Arc<NetFaults>,
        factory: Arc<dyn StateMachineFactory>,
        services: Option<&dyn NodeServices>,
    ) -> Result<Node, NodeError> {
        let Listeners { peer: listener, client: client_listener } = listeners;
        let listen_addr = listener.local_addr()?;
        let engine = Engine::start(config, listen_addr, directory.clone(), faults.clone(), factory)?;
        let config = engine.config().clone();
        let node_id = config.node_id;
        let handle = engine.handle();
        let runtime = engine.runtime();
        let fatal = engine.fatal();
        let metrics = Arc::new(NamespaceMetrics::register(handle.metrics().registry()));
        handle.metrics().on_scrape(Box::new(metrics.clone()));

        // The servers last: messages arrive only once workers can take them. The services
        // the caller wires in (the public API, placement) share the transport's peer port,
        // and those meant for clients also go on the client port.
        listener.set_nonblocking(true)?;
        let transport_service = engine.transport_service();
        let (health_reporter, health) = tonic_health::server::health_reporter();
        let context = ServiceContext {
            db: engine.db().clone(),
            config: config.clone(),
            handle: handle.clone(),
            directory,
            faults,
            runtime: runtime.clone(),
            listen_addr,
            health: health_reporter.clone(),
            metrics,
        };
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(warden_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| NodeError::Config(format!("reflection: {e}")))?;
        let mut routes = NodeRoutes::default();
        routes.peer.add_service(transport_service).add_service(health.clone()).add_service(reflection);
        routes.client.add_service(health);
        if let Some(services) = services {
            services.start(&context, &mut routes)?;
        }
        if let Some(client_listener) = client_listener {
            client_listener.set_nonblocking(true)?;
            let serving = serve(client_listener, config.tls.clone(), Admit::Clients, routes.client.routes());
            let fatal = fatal.clone();
            runtime.spawn(async move {
                // Clients cannot reach a node whose client port is gone: it cannot go on.
                if let Err(error) = serving.await {
                    fatal.fail(&format!("client port: {error}"));
                }
            });
        }
        let metrics_addr = match config.metrics_listen {
            Some(addr) => {
                let listener = std::net::TcpListener::bind(addr)?;
                listener.set_nonblocking(true)?;
                let metrics_addr = listener.local_addr()?;
                let metrics = handle.metrics().clone();
                runtime.spawn(async move {
                    let served = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => warden_server_kit::metrics::serve(listener, Arc::new(move || metrics.render())).await,
                        Err(error) => Err(error),
                    };
                    if let Err(error) = served {
                        tracing::error!(node = node_id, %error, "the metrics endpoint stopped");
                    }
                });
                Some(metrics_addr)
            }
            None => None,
        };
        let serving = serve(listener, config.tls.clone(), Admit::Peers, routes.peer.routes());
        let health = health_reporter.clone();
        runtime.spawn(async move {
            health_reporter.set_serving::<warden_proto::transport::raft_transport_server::RaftTransportServer<RaftTransportService>>().await;
            // A node whose transport server is gone hears nobody: it cannot go on.
            if let Err(error) = serving.await {
                fatal.fail(&format!("transport server: {error}"));
            }
        });
        Ok(Node { engine, health, metrics_addr })
    }

    /// The node's engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// A handle to this node's groups.
    pub fn handle(&self) -> NodeHandle {
        self.engine.handle()
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.engine.id()
    }

    /// Where the node's peer port listens.
    pub fn listen_addr(&self) -> SocketAddr {
        self.engine.listen_addr()
    }

    /// Where the node serves its Prometheus metrics (`NodeConfig::metrics_listen`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The store writer's counters.
    pub fn store_metrics(&self) -> StoreMetricsSnapshot {
        self.engine.store_metrics()
    }

    /// The node's raft counters: messages and heartbeats sent, replicas asleep.
    pub fn raft_metrics(&self) -> RaftMetricsSnapshot {
        self.engine.raft_metrics()
    }

    /// What runs the first part of a graceful stop (SIGTERM): health NOT_SERVING, new calls
    /// refused, every leadership handed to an up-to-date peer, the proposals in flight
    /// answered (`warden_engine::host::drain`). Drop the node afterwards to stop it.
    pub fn drainer(&self) -> Drainer {
        Drainer { node: self.engine.handle(), health: self.health.clone() }
    }

    /// Stops everything at once, as a crash would: workers stop between rounds, writes not
    /// yet handed to RocksDB are lost, connections drop. What was acknowledged is on disk.
    /// Returns once the node's threads are gone and its directory can be reopened.
    pub fn kill(self) {
        drop(self);
    }
}

/// Runs a graceful stop of one node ([`Node::drainer`]).
pub struct Drainer {
    node: NodeHandle,
    health: tonic_health::server::HealthReporter,
}

impl Drainer {
    /// Reports the node NOT_SERVING, then hands over its leaderships and waits for what is
    /// in flight ([`warden_engine::host::drain::drain`]); returns at the deadline whatever
    /// is left.
    pub async fn drain(self, limits: DrainLimits) -> DrainReport {
        for service in ["", "warden.v1.Warden", "warden.placement.Placement"] {
            self.health.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
        }
        warden_engine::host::drain::drain(&self.node, limits).await
    }
}
