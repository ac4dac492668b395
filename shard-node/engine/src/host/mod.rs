//! The multi-Raft host: a node runs a small fixed pool of worker threads (groups are spread
//! over them by id), one store writer, and a transport, and serves requests to its groups
//! through a cloneable [`NodeHandle`]. [`Engine::start`] starts all of it; the node crate
//! serves the engine's transport ([`Engine::transport_service`]) on the node's peer port.

mod command;
pub mod conf_fence;
pub mod drain;
mod failed;
mod fatal;
mod hibernate;
mod membership;
pub mod msg;
mod query;
mod ready;
mod replica;
pub mod transfer;
mod worker;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use protobuf::Message as _;
use raft::eraftpb::{ConfChangeV2, ConfState, Message};
use tokio::sync::oneshot;

pub use fatal::Fatal;
pub use msg::{GroupStatus, ReadConsistency, WorkerMsg};
pub use replica::{Replica, ReplicaError};

use crate::config::NodeConfig;
use crate::error::{EngineError, StorageError};
use crate::leaders::{LeaderInfo, LeaderTable};
use crate::metrics::{HostMetrics, NodeMetrics, Sources};
use crate::state_machine::{ApplyOutput, StateMachineFactory};
use crate::storage::{Db, PeerStorage};
use crate::store_writer::{StoreMetricsSnapshot, StoreWriter};
use crate::transport::server::RaftTransportService;
use crate::transport::{Inbox, NetFaults, PeerDirectory, RaftSender, Transport, TransportLimits, TransportMetrics};
use warden_proto::transport::raft_transport_server::RaftTransportServer;

/// A point-in-time copy of a node's raft counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RaftMetricsSnapshot {
    /// Raft messages this node handed to its transport.
    pub messages_sent: u64,
    /// Of those, leader heartbeats.
    pub heartbeats_sent: u64,
    /// Replicas of this node asleep now (hibernating groups).
    pub sleeping_replicas: u64,
    /// Times a replica of this node fell asleep.
    pub hibernations: u64,
}

/// A cheap, cloneable handle for talking to a node's groups from any thread or task.
#[derive(Clone)]
pub struct NodeHandle {
    node_id: u64,
    leaders: Arc<LeaderTable>,
    workers: Arc<[Sender<WorkerMsg>]>,
    /// Extra time the caller waits past a request's deadline for the worker's own answer
    /// (the worker checks deadlines once per tick).
    deadline_slack: Duration,
    /// What the services tell a graceful stop (`drain.rs`).
    activity: Arc<drain::Activity>,
    /// The node's metrics (`metrics.rs`).
    metrics: Arc<NodeMetrics>,
}

impl NodeHandle {
    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<NodeMetrics> {
        &self.metrics
    }

    /// Calls arriving and proposals in flight, for a graceful stop (`drain.rs`).
    pub fn activity(&self) -> &drain::Activity {
        &self.activity
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Leadership of `group` as this node last saw it.
    pub fn leader_info(&self, group: u64) -> LeaderInfo {
        self.leaders.get(group)
    }

    /// The hosted groups this node leads (as last seen), in id order.
    pub fn led_groups(&self) -> Vec<u64> {
        self.leaders.led_by(self.node_id)
    }

    /// Every group this node hosts a replica of, in id order.
    pub fn hosted_groups(&self) -> Vec<u64> {
        self.leaders.groups()
    }

    fn worker(&self, group: u64) -> &Sender<WorkerMsg> {
        &self.workers[(group % self.workers.len() as u64) as usize]
    }

    fn try_send(&self, group: u64, message: WorkerMsg) -> Result<(), EngineError> {
        self.worker(group).try_send(message).map_err(|error| match error {
            TrySendError::Full(_) => EngineError::busy(format!("node {}: worker inbox full", self.node_id)),
            TrySendError::Disconnected(_) => EngineError::Stopped,
        })
    }

    async fn ask<T>(
        &self,
        group: u64,
        timeout: Duration,
        make: impl FnOnce(oneshot::Sender<Result<T, EngineError>>) -> WorkerMsg,
    ) -> Result<T, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.try_send(group, make(reply))?;
        match tokio::time::timeout(timeout + self.deadline_slack, answer).await {
            Ok(Ok(result)) => result,
            // The worker went away with the request (the node stopped): a proposal may
            // already be on a quorum, so the outcome is unknown.
            Ok(Err(_)) => {
                Err(EngineError::Unavailable { reason: format!("group {group}: the node stopped before answering"), outcome_unknown: true })
            }
            Err(_) => Err(EngineError::Unavailable { reason: format!("group {group}: no answer in {timeout:?}"), outcome_unknown: true }),
        }
    }

    /// Proposes `command` to `group` (this node must lead it); answers with the state
    /// machine's output once the entry is durable on a quorum and applied here.
    pub async fn propose(&self, group: u64, command: Vec<u8>, timeout: Duration) -> ApplyOutput {
        let started = Instant::now();
        let deadline = started + timeout;
        self.metrics.proposals_pending.inc();
        let output = self.ask(group, timeout, |reply| WorkerMsg::Propose { group, command, deadline, reply }).await;
        self.metrics.proposals_pending.dec();
        self.metrics.proposed(output.is_ok(), started.elapsed().as_secs_f64());
        output
    }

    /// Answers `query` from `group`'s state machine with the given consistency.
    pub async fn read(&self, group: u64, query: Vec<u8>, consistency: ReadConsistency, timeout: Duration) -> Result<Vec<u8>, EngineError> {
        let deadline = Instant::now() + timeout;
        self.ask(group, timeout, |reply| WorkerMsg::Read { group, query, consistency, deadline, reply }).await
    }

    /// Proposes a configuration change; answers with the new configuration once applied.
    pub async fn conf_change(&self, group: u64, change: ConfChangeV2, timeout: Duration) -> Result<ConfState, EngineError> {
        let deadline = Instant::now() + timeout;
        let bytes = self.ask(group, timeout, |reply| WorkerMsg::ConfChange { group, change, deadline, reply }).await?;
        ConfState::parse_from_bytes(&bytes).map_err(|e| EngineError::Invalid(format!("conf state: {e}")))
    }

    /// Creates a replica of `group` here (see [`WorkerMsg::CreateGroup`]).
    pub async fn create_group(&self, group: u64, voters: Vec<u64>) -> Result<(), EngineError> {
        self.ask(group, Duration::from_secs(10), |reply| WorkerMsg::CreateGroup { group, voters, reply }).await
    }

    /// Destroys this node's replica of `group`, which placement no longer has (see
    /// [`WorkerMsg::DestroyGroup`]).
    pub async fn destroy_group(&self, group: u64) -> Result<(), EngineError> {
        self.ask(group, Duration::from_secs(5), |reply| WorkerMsg::DestroyGroup { group, reply }).await
    }

    /// Asks this node's replica (the leader) to hand leadership to `to`; refused (unavailable,
    /// nothing changed) when `to` is silent or lags far behind (see [`transfer`]).
    pub async fn transfer_leader(&self, group: u64, to: u64) -> Result<(), EngineError> {
        self.ask(group, Duration::from_secs(5), |reply| WorkerMsg::TransferLeader { group, to, reply }).await
    }

    /// Makes this node's replica campaign now.
    pub async fn campaign(&self, group: u64) -> Result<(), EngineError> {
        self.ask(group, Duration::from_secs(5), |reply| WorkerMsg::Campaign { group, reply }).await
    }

    /// Asks this node's replica of `group`, which must lead, a leader-only question (see
    /// `StateMachine::leader_call`); answered after a ReadIndex round confirms it leads.
    pub async fn leader_call(&self, group: u64, request: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, EngineError> {
        let deadline = Instant::now() + timeout;
        self.ask(group, timeout, |reply| WorkerMsg::LeaderCall { group, request, deadline, reply }).await
    }

    /// Registers interest in notification `key` of `group` on this node (see
    /// `SmWrites::notify`) and returns at once; the receiver resolves when apply notifies the
    /// key, or with an error at the deadline. Register first, then check the state: a
    /// notification that comes after the registration is never missed.
    pub fn register_await(&self, group: u64, key: Vec<u8>, timeout: Duration) -> Result<oneshot::Receiver<Result<(), EngineError>>, EngineError> {
        let (reply, answer) = oneshot::channel();
        self.try_send(group, WorkerMsg::Await { group, key, deadline: Instant::now() + timeout, reply })?;
        Ok(answer)
    }

    /// This node's view of `group`.
    pub async fn status(&self, group: u64) -> Result<GroupStatus, EngineError> {
        self.ask(group, Duration::from_secs(5), |reply| WorkerMsg::Status { group, reply }).await
    }
}

/// The transport delivers here: each message to the worker its group maps to.
impl Inbox for NodeHandle {
    fn node_id(&self) -> u64 {
        self.node_id
    }

    fn deliver(&self, group: u64, message: Message) -> Result<(), EngineError> {
        self.try_send(group, WorkerMsg::Raft { group, message: Box::new(message) })
    }

    fn report_unreachable(&self, group: u64, to: u64) {
        let _ = self.worker(group).try_send(WorkerMsg::Unreachable { group, to });
    }

    fn try_report_snapshot(&self, group: u64, to: u64, status: raft::SnapshotStatus) -> Result<(), raft::SnapshotStatus> {
        match self.worker(group).try_send(WorkerMsg::SnapshotStatus { group, to, status }) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
            Err(TrySendError::Full(_)) => Err(status),
        }
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A replica could not be loaded.
    #[error("group {group}: {source}")]
    Replica { group: u64, source: ReplicaError },
    /// A thread, socket or runtime could not be created.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The configuration is unusable.
    #[error("config: {0}")]
    Config(String),
}

/// A running engine: the store, the store writer, the workers hosting the node's replicas,
/// and the transport's client side, on the node's I/O runtime. Dropping it stops them all.
pub struct Engine {
    config: Arc<NodeConfig>,
    handle: NodeHandle,
    stop: Arc<AtomicBool>,
    fatal: Fatal,
    workers: Vec<JoinHandle<()>>,
    store: Option<StoreWriter>,
    /// The node's store, so that stopping can wait for snapshot builds still reading it.
    db: Arc<Db>,
    host_metrics: Arc<HostMetrics>,
    transport_metrics: Arc<TransportMetrics>,
    transport_limits: TransportLimits,
    runtime: Option<tokio::runtime::Runtime>,
    listen_addr: SocketAddr,
}

impl Engine {
    /// Opens the node's store, loads every replica it hosts, and starts the workers, the
    /// store writer and the transport's client side. `listen_addr` is where the node's peer
    /// port listens (recorded in `directory`); the caller serves
    /// [`Engine::transport_service`] there once this returns, so messages arrive only once
    /// workers can take them.
    pub fn start(
        config: NodeConfig,
        listen_addr: SocketAddr,
        directory: Arc<PeerDirectory>,
        faults: Arc<NetFaults>,
        factory: Arc<dyn StateMachineFactory>,
    ) -> Result<Engine, NodeError> {
        if config.node_id == 0 || config.workers == 0 || config.tick_ms == 0 {
            return Err(NodeError::Config("node_id, workers and tick_ms must be positive".into()));
        }
        let config = Arc::new(config);
        let node_id = config.node_id;
        directory.insert(node_id, listen_addr);
        let db = Db::open(&config.data_dir)?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name(format!("node-{node_id}-io")).enable_all().build()?;

        // 1. Channels first: the handle, transport and workers all refer to them. Every engine
        //    thread fails the whole node if it dies (see `fatal`).
        let stop = Arc::new(AtomicBool::new(false));
        let fatal = Fatal::new(node_id, config.fatal, stop.clone());
        let store_watch = fatal.watch_thread(format!("store-writer-{node_id}"));
        let store = StoreWriter::start(db.clone(), config.workers * config.write_tasks_in_flight_max, node_id, store_watch)?;
        let mut inboxes = Vec::new();
        let mut senders = Vec::new();
        for _ in 0..config.workers {
            let (sender, inbox) = crossbeam_channel::bounded(config.inbox_msgs_max);
            senders.push(sender);
            inboxes.push(inbox);
        }
        let leaders = Arc::new(LeaderTable::default());
        let handle = NodeHandle {
            node_id,
            leaders: leaders.clone(),
            workers: senders.into(),
            deadline_slack: Duration::from_millis(config.tick_ms * 2),
            activity: Arc::default(),
            metrics: Arc::new(NodeMetrics::new()),
        };
        let limits = TransportLimits::default();
        let transport = Transport::new(
            Arc::new(handle.clone()),
            handle.metrics.clone(),
            directory.clone(),
            faults.clone(),
            runtime.handle().clone(),
            limits,
            config.tls.clone(),
        );
        let transport_metrics = transport.metrics();
        let transport: Arc<dyn RaftSender> = Arc::new(transport);
        let host_metrics = Arc::new(HostMetrics::default());
        handle.metrics.attach(Sources {
            node_id,
            leaders: leaders.clone(),
            transport: transport_metrics.clone(),
            store: store.metrics(),
            db: db.clone(),
            data_dir: config.data_dir.clone(),
            host: host_metrics.clone(),
        });

        // 2. Replicas from disk, each on the worker its id maps to.
        let mut replicas: Vec<HashMap<u64, Replica>> = (0..config.workers).map(|_| HashMap::new()).collect();
        for group in PeerStorage::list_groups(&db)? {
            let replica = Replica::load(&config, db.clone(), group, factory.as_ref()).map_err(|source| NodeError::Replica { group, source })?;
            leaders.set(group, LeaderInfo::default());
            replicas[(group % config.workers as u64) as usize].insert(group, replica);
        }

        // 3. Workers.
        let mut workers = Vec::new();
        for (index, (inbox, replicas)) in inboxes.into_iter().zip(replicas).enumerate() {
            let (persisted_tx, persisted_rx) = crossbeam_channel::bounded(config.write_tasks_in_flight_max);
            let awake = replicas.keys().copied().collect();
            let worker = worker::Worker {
                node_metrics: handle.metrics.clone(),
                config: config.clone(),
                db: db.clone(),
                factory: factory.clone(),
                sender: transport.clone(),
                inbox,
                store: store.sender(),
                persisted_tx,
                persisted_rx,
                stop: stop.clone(),
                fatal: fatal.clone(),
                leaders: leaders.clone(),
                replicas,
                failed: HashMap::new(),
                awake,
                touched: std::collections::HashSet::new(),
                metrics: host_metrics.clone(),
                tasks_in_flight: 0,
                tick: 0,
                next_read_ctx: 1,
            };
            workers.push(std::thread::Builder::new().name(format!("node-{node_id}-w{index}")).spawn(move || worker.run())?);
        }

        Ok(Engine {
            config,
            handle,
            stop,
            fatal,
            workers,
            store: Some(store),
            db,
            host_metrics,
            transport_metrics,
            transport_limits: limits,
            runtime: Some(runtime),
            listen_addr,
        })
    }

    /// The engine's own gRPC service (`RaftTransport`: raft messages and snapshots from the
    /// other nodes), for the node to serve on its peer port.
    pub fn transport_service(&self) -> RaftTransportServer<RaftTransportService> {
        RaftTransportService::server(Arc::new(self.handle.clone()), self.handle.metrics.clone(), self.transport_limits)
    }

    /// The node's I/O runtime, for the tasks of what runs on the engine (its servers among
    /// them); shut down when the engine stops.
    pub fn runtime(&self) -> tokio::runtime::Handle {
        self.runtime.as_ref().map(|runtime| runtime.handle().clone()).unwrap_or_else(|| unreachable!("the runtime lives as long as the engine"))
    }

    /// The node's store (for reads of a whole group's data off the workers, and read faults
    /// in tests).
    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }

    /// The node's configuration.
    pub fn config(&self) -> &Arc<NodeConfig> {
        &self.config
    }

    /// What ends the node when a part it cannot go on without fails (a server the node
    /// runs, for instance), as its [`FatalPolicy`](crate::config::FatalPolicy) says.
    pub fn fatal(&self) -> Fatal {
        self.fatal.clone()
    }

    /// A handle to this node's groups.
    pub fn handle(&self) -> NodeHandle {
        self.handle.clone()
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.config.node_id
    }

    /// Where the node's gRPC server listens.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The store writer's counters.
    pub fn store_metrics(&self) -> StoreMetricsSnapshot {
        self.store.as_ref().map(|store| store.metrics().snapshot()).unwrap_or_default()
    }

    /// The node's raft counters: messages and heartbeats sent, replicas asleep.
    pub fn raft_metrics(&self) -> RaftMetricsSnapshot {
        RaftMetricsSnapshot {
            messages_sent: self.transport_metrics.messages_sent.load(Ordering::Relaxed),
            heartbeats_sent: self.transport_metrics.heartbeats_sent.load(Ordering::Relaxed),
            sleeping_replicas: self.host_metrics.sleeping_replicas.load(Ordering::Relaxed),
            hibernations: self.host_metrics.hibernations.load(Ordering::Relaxed),
        }
    }

    /// Stops everything at once, as a crash would: workers stop between rounds, writes not
    /// yet handed to RocksDB are lost, connections drop. What was acknowledged is on disk.
    /// Returns once the node's threads are gone and its directory can be reopened.
    pub fn kill(self) {
        drop(self);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        if let Some(store) = self.store.take() {
            store.stop();
        }
        // A snapshot build holds the store open on its own thread, and a restart must be able
        // to reopen it: let running builds end (each reads one group once).
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.db.snapshot_builds() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(runtime) = self.runtime.take() {
            let _ = std::thread::spawn(move || runtime.shutdown_timeout(Duration::from_secs(2))).join();
        }
    }
}
