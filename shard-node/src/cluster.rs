//! An in-process cluster for tests and benchmarks: N nodes on loopback, each with its own
//! RocksDB directory and gRPC transport, with fault injection (partition, drop, delay),
//! kill, and restart on the same directory and address.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warden_engine::config::{FatalPolicy, NodeConfig};
use warden_engine::error::EngineError;
use warden_proto::channel::ChannelSettings;
use warden_proto::follow::{CallKind, Follow};
use warden_proto::tls::{Expected, Identity, Tls};
use warden_server_kit::authority::Authority;

use crate::node::{Drainer, Listeners, Node};
use crate::node_services::{ApiServices, ServingFactory};
use warden_engine::host::{GroupStatus, NodeError, NodeHandle, RaftMetricsSnapshot, ReadConsistency};
use warden_engine::state_machine::ApplyOutput;
use warden_engine::store_writer::StoreMetricsSnapshot;
use warden_engine::transport::{NetFaults, PeerDirectory};

/// Longest a restart waits for a killed node's store to be let go.
const STORE_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Pause between retries of a request that found no leader.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// A listener on `addr` again: the old one closes as its node's runtime shuts down, so this
/// retries briefly until the port is free.
fn rebind(addr: SocketAddr) -> Result<std::net::TcpListener, NodeError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => return Ok(listener),
            Err(error) if Instant::now() < deadline => {
                tracing::debug!(%error, "rebinding {addr}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Shape of a test cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Number of nodes (ids 1..=nodes).
    pub nodes: u64,
    /// Raft tick interval.
    pub tick_ms: u64,
    /// Ticks before an election.
    pub election_tick: usize,
    /// Ticks between heartbeats.
    pub heartbeat_tick: usize,
    /// Between a node's heartbeats to placement, ms (`NodeConfig::placement_heartbeat_ms`).
    pub placement_heartbeat_ms: u64,
    /// Idle ticks before a group hibernates (0: never; see `NodeConfig`).
    pub hibernate_after_ticks: u64,
    /// Host-loop threads per node.
    pub workers: usize,
    /// Log length that triggers compaction.
    pub log_compact_entries: u64,
    /// Node `i` listens on `base_port + i - 1` (any free port when `None`).
    pub base_port: Option<u16>,
    /// Nodes serve the public namespace API (use with the namespace state machine).
    pub serve_api: bool,
    /// What a node that cannot go on does: stop its engine (the default, so that a test
    /// process outlives it) or abort the process (`warden dev`).
    pub fatal: FatalPolicy,
    /// TLS on every node: the directory of a CA ([`Authority`], made there if
    /// missing) that issues each node a certificate naming it. `None`: plaintext.
    pub tls_dir: Option<PathBuf>,
    /// Each node also opens a client port ([`Cluster::client_addr`]): node `i` on
    /// `base + i - 1`, or any free port when the base is 0. `None`: no client ports.
    pub client_base_port: Option<u16>,
    /// Each node serves its Prometheus metrics ([`Cluster::metrics_addr`]): node `i` on
    /// `base + i - 1`, or any free port when the base is 0. `None`: not served.
    pub metrics_base_port: Option<u16>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 5,
            tick_ms: 50,
            election_tick: 10,
            heartbeat_tick: 2,
            placement_heartbeat_ms: warden_engine::config::PLACEMENT_HEARTBEAT_MS_DEFAULT,
            hibernate_after_ticks: warden_engine::config::HIBERNATE_AFTER_TICKS_DEFAULT,
            workers: 1,
            log_compact_entries: 10_000,
            base_port: None,
            serve_api: false,
            fatal: FatalPolicy::StopNode,
            tls_dir: None,
            client_base_port: None,
            metrics_base_port: None,
        }
    }
}

/// A running in-process cluster.
pub struct Cluster {
    config: ClusterConfig,
    /// Keeps the temporary directory alive (absent when the caller chose the directory).
    _temp: Option<tempfile::TempDir>,
    root: PathBuf,
    directory: Arc<PeerDirectory>,
    faults: Arc<NetFaults>,
    factory: Arc<dyn ServingFactory>,
    /// The public API and placement every node serves (when `serve_api`).
    api: Option<ApiServices>,
    addrs: BTreeMap<u64, SocketAddr>,
    /// Each node's client port (with `client_ports`).
    client_addrs: BTreeMap<u64, SocketAddr>,
    /// Each node's TLS (with `tls_dir`).
    tls: BTreeMap<u64, Arc<Tls>>,
    nodes: Mutex<BTreeMap<u64, Node>>,
    /// Last known leader of each group, so requests do not ask every node each time.
    leaders: Mutex<HashMap<u64, u64>>,
}

impl Cluster {
    /// Starts a cluster in a fresh temporary directory.
    pub fn start(config: ClusterConfig, factory: Arc<dyn ServingFactory>) -> Result<Cluster, NodeError> {
        let temp = tempfile::Builder::new().prefix("warden-cluster-").tempdir()?;
        let root = temp.path().to_path_buf();
        Cluster::start_in(config, factory, &root, Some(temp))
    }

    /// Starts a cluster with node directories under `root` (kept after the cluster stops).
    pub fn start_at(config: ClusterConfig, factory: Arc<dyn ServingFactory>, root: &Path) -> Result<Cluster, NodeError> {
        Cluster::start_in(config, factory, root, None)
    }

    fn start_in(config: ClusterConfig, factory: Arc<dyn ServingFactory>, root: &Path, temp: Option<tempfile::TempDir>) -> Result<Cluster, NodeError> {
        let api = config.serve_api.then(|| ApiServices::new(factory.clone()));
        let mut cluster = Cluster {
            config,
            _temp: temp,
            root: root.to_path_buf(),
            directory: Arc::new(PeerDirectory::new()),
            faults: Arc::new(NetFaults::new()),
            api,
            factory,
            addrs: BTreeMap::new(),
            client_addrs: BTreeMap::new(),
            tls: BTreeMap::new(),
            nodes: Mutex::new(BTreeMap::new()),
            leaders: Mutex::new(HashMap::new()),
        };
        for id in 1..=cluster.config.nodes {
            let port = match cluster.config.base_port {
                Some(base) => base.checked_add((id - 1) as u16).ok_or_else(|| NodeError::Config("port out of range".into()))?,
                None => 0,
            };
            let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
            cluster.addrs.insert(id, listener.local_addr()?);
            let client = match cluster.config.client_base_port {
                Some(base) => {
                    let port =
                        if base == 0 { 0 } else { base.checked_add((id - 1) as u16).ok_or_else(|| NodeError::Config("port out of range".into()))? };
                    let client = std::net::TcpListener::bind(("127.0.0.1", port))?;
                    cluster.client_addrs.insert(id, client.local_addr()?);
                    Some(client)
                }
                None => None,
            };
            if let Some(dir) = &cluster.config.tls_dir {
                let issued = Authority::load_or_create(dir, "warden test cluster").and_then(|ca| ca.issue_files(dir, &Identity::node(id)));
                let tls = issued.and_then(Tls::load).map_err(|e| NodeError::Config(format!("tls of node {id}: {e}")))?;
                cluster.tls.insert(id, tls);
            }
            cluster.start_node(id, Listeners { peer: listener, client })?;
        }
        Ok(cluster)
    }

    /// The configuration node `id` runs with.
    pub fn node_config(&self, id: u64) -> NodeConfig {
        let mut config = NodeConfig::new(id, self.root.join(format!("node-{id}")));
        config.tick_ms = self.config.tick_ms;
        config.election_tick = self.config.election_tick;
        config.heartbeat_tick = self.config.heartbeat_tick;
        config.placement_heartbeat_ms = self.config.placement_heartbeat_ms;
        config.hibernate_after_ticks = self.config.hibernate_after_ticks;
        config.workers = self.config.workers;
        config.log_compact_entries = self.config.log_compact_entries;
        config.fatal = self.config.fatal;
        config.tls = self.tls.get(&id).cloned();
        config.metrics_listen = self.config.metrics_base_port.map(|base| {
            let port = if base == 0 { 0 } else { u16::try_from(u64::from(base) + id - 1).unwrap_or(0) };
            std::net::SocketAddr::from(([127, 0, 0, 1], port))
        });
        config
    }

    /// Where node `id` serves its metrics (`ClusterConfig::metrics_base_port`).
    pub fn metrics_addr(&self, id: u64) -> Option<SocketAddr> {
        self.nodes().get(&id).and_then(Node::metrics_addr)
    }

    fn start_node(&self, id: u64, listeners: Listeners) -> Result<(), NodeError> {
        let services = self.api.as_ref().map(|api| api as &dyn crate::node::NodeServices);
        let node = Node::start(self.node_config(id), listeners, self.directory.clone(), self.faults.clone(), self.factory.clone(), services)?;
        self.nodes().insert(id, node);
        Ok(())
    }

    fn nodes(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Node>> {
        self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fault injector every node's transport consults.
    pub fn faults(&self) -> &NetFaults {
        &self.faults
    }

    /// Ids of every node, running or not.
    pub fn node_ids(&self) -> Vec<u64> {
        self.addrs.keys().copied().collect()
    }

    /// Where node `id`'s peer port listens (raft transport and, when served, the public API).
    pub fn addr(&self, id: u64) -> Option<SocketAddr> {
        self.addrs.get(&id).copied()
    }

    /// Node `id`'s TLS (with `tls_dir`).
    pub fn tls(&self, id: u64) -> Option<Arc<Tls>> {
        self.tls.get(&id).cloned()
    }

    /// Where node `id`'s client port listens (with `client_base_port`).
    pub fn client_addr(&self, id: u64) -> Option<SocketAddr> {
        self.client_addrs.get(&id).copied()
    }

    /// Ids of running nodes.
    pub fn running(&self) -> Vec<u64> {
        self.nodes().keys().copied().collect()
    }

    /// Handle to a running node.
    pub fn handle(&self, id: u64) -> Option<NodeHandle> {
        self.nodes().get(&id).map(Node::handle)
    }

    /// What runs a graceful stop of node `id` (see [`Node::drainer`]; `None`: not running).
    pub fn drainer(&self, id: u64) -> Option<Drainer> {
        self.nodes().get(&id).map(Node::drainer)
    }

    /// Stops node `id` as a crash would (see [`Node::kill`]).
    pub fn kill(&self, id: u64) {
        let node = self.nodes().remove(&id);
        if let Some(node) = node {
            node.kill();
        }
    }

    /// Restarts node `id` on its old directory and address. A task of the killed node that
    /// outlived its runtime's shutdown may hold the store open a moment longer (RocksDB
    /// refuses a second open in one process): the start is tried again until the store is
    /// let go, for at most [`STORE_RELEASE_WAIT`].
    pub fn restart(&self, id: u64) -> Result<(), NodeError> {
        let addr = *self.addrs.get(&id).ok_or_else(|| NodeError::Config(format!("no node {id}")))?;
        self.kill(id);
        let deadline = Instant::now() + STORE_RELEASE_WAIT;
        loop {
            let peer = rebind(addr)?;
            let client = self.client_addr(id).map(rebind).transpose()?;
            match self.start_node(id, Listeners { peer, client }) {
                Err(NodeError::Storage(error)) if error.to_string().contains("lock hold by current process") && Instant::now() < deadline => {
                    tracing::debug!(id, %error, "the killed node's store is still open; starting again");
                    std::thread::sleep(Duration::from_millis(50));
                }
                started => return started,
            }
        }
    }

    /// Creates `group` with a replica on each of `voters` and has one of them campaign, so
    /// leaders of many groups spread over the nodes.
    pub async fn create_group(&self, group: u64, voters: &[u64]) -> Result<(), EngineError> {
        for voter in voters {
            let handle = self.handle(*voter).ok_or(EngineError::Stopped)?;
            handle.create_group(group, voters.to_vec()).await?;
        }
        if let Some(first) = voters.get((group % voters.len().max(1) as u64) as usize) {
            if let Some(handle) = self.handle(*first) {
                handle.campaign(group).await?;
            }
        }
        Ok(())
    }

    /// Creates the placement group on `voters`, then has its leader bootstrap the cluster
    /// (`Placement/Bootstrap`, as `warden admin bootstrap` does): every node registered, the
    /// root shard group (owning `/`) started on the replicas placement picked. Returns the
    /// root group's descriptor. Needs `serve_api` and a factory that runs the placement state
    /// machine for its group (`placement::ShardNodeFactory`).
    pub async fn bootstrap_placement(&self, voters: &[u64]) -> Result<warden_proto::v1::GroupDescriptor, EngineError> {
        use warden_placement::PLACEMENT_GROUP_ID;
        use warden_proto::placement::{placement_client::PlacementClient, BootstrapRequest};
        self.create_group(PLACEMENT_GROUP_ID, voters).await?;
        let mut follow = Follow::new(CallKind::Write, tokio::time::Instant::now() + Duration::from_secs(30));
        loop {
            let leader = self.wait_leader(PLACEMENT_GROUP_ID, Duration::from_secs(30)).await?;
            let addr = self.addr(leader).ok_or(EngineError::Stopped)?;
            // With TLS, the leader bootstraps as itself (only nodes may).
            let settings = ChannelSettings::new(Expected::Node(leader));
            let channel =
                warden_proto::channel::lazy(&addr.to_string(), self.tls.get(&leader), &settings).map_err(|e| EngineError::Invalid(e.to_string()))?;
            match PlacementClient::new(channel).bootstrap(BootstrapRequest {}).await {
                Ok(response) => {
                    let root = response.into_inner().root.and_then(|entry| entry.descriptor);
                    return root.ok_or_else(|| EngineError::Invalid("bootstrap answered no root group".into()));
                }
                // NOT_LEADER and UNAVAILABLE proposed nothing: asked again of the leader then.
                Err(status) => follow.retry_after(status).await.map_err(|status| EngineError::Invalid(format!("bootstrap: {status}")))?,
            }
        }
    }

    /// Every running node's view of `group`.
    pub async fn statuses(&self, group: u64) -> Vec<GroupStatus> {
        let handles: Vec<NodeHandle> = self.nodes().values().map(Node::handle).collect();
        let mut statuses = Vec::new();
        for handle in handles {
            if let Ok(status) = handle.status(group).await {
                statuses.push(status);
            }
        }
        statuses
    }

    /// The running node that leads `group` in the highest term, if any.
    pub async fn leader(&self, group: u64) -> Option<u64> {
        self.statuses(group).await.into_iter().filter(|s| s.is_leader).max_by_key(|s| s.term).map(|s| s.node_id)
    }

    /// Waits until some running node leads `group`.
    pub async fn wait_leader(&self, group: u64, timeout: Duration) -> Result<u64, EngineError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader(group).await {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(EngineError::busy(format!("group {group}: no leader within {timeout:?}")));
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    fn cached_leader(&self, group: u64) -> Option<u64> {
        self.leaders.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&group).copied()
    }

    fn remember_leader(&self, group: u64, leader: Option<u64>) {
        let mut leaders = self.leaders.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match leader {
            Some(leader) => leaders.insert(group, leader),
            None => leaders.remove(&group),
        };
    }

    /// The handle of the node believed to lead `group`: the cached one, else asked for.
    async fn leader_handle(&self, group: u64) -> Option<NodeHandle> {
        if let Some(handle) = self.cached_leader(group).and_then(|leader| self.handle(leader)) {
            return Some(handle);
        }
        let leader = self.leader(group).await;
        self.remember_leader(group, leader);
        leader.and_then(|leader| self.handle(leader))
    }

    /// The `attempt`-th running node, round robin.
    fn any_running(&self, attempt: usize) -> Option<NodeHandle> {
        let nodes = self.nodes();
        let count = nodes.len();
        nodes.values().nth(attempt % count.max(1)).map(Node::handle)
    }

    /// Sends one request to `group`'s leader like a client would: following hints and
    /// retrying what is safe to retry until `timeout`. An error whose outcome is unknown is
    /// returned at once (retrying a write could apply it twice).
    async fn with_leader<T, F, Fut>(&self, group: u64, timeout: Duration, request: F) -> Result<T, EngineError>
    where
        F: Fn(NodeHandle, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<T, EngineError>>,
    {
        let deadline = Instant::now() + timeout;
        let mut attempt = 0usize;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(EngineError::busy(format!("group {group}: no leader answered within {timeout:?}")));
            }
            attempt += 1;
            // With no leader known, ask the running nodes in turn, as a router does: the
            // request wakes a hibernating group whose leader died (`host/hibernate.rs`) and
            // is answered NOT_LEADER until a new leader is elected.
            let known = self.leader_handle(group).await;
            let guessed = known.is_none();
            let Some(handle) = known.or_else(|| self.any_running(attempt)) else {
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            };
            match request(handle.clone(), remaining).await {
                // A node guessed at may host no replica of the group.
                Err(EngineError::GroupNotFound(_)) if guessed => tokio::time::sleep(RETRY_PAUSE).await,
                Err(EngineError::NotLeader { leader_hint, .. }) => {
                    let hint = leader_hint.filter(|hint| *hint != handle.node_id() && self.handle(*hint).is_some());
                    self.remember_leader(group, hint);
                    if hint.is_none() {
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
                Err(error) if error.is_retryable() || error == EngineError::Stopped => {
                    self.remember_leader(group, None);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                result => return result,
            }
        }
    }

    /// Proposes `command` to `group` through its leader (see [`Self::with_leader`]).
    pub async fn propose(&self, group: u64, command: Vec<u8>, timeout: Duration) -> ApplyOutput {
        self.with_leader(group, timeout, |handle, remaining| {
            let command = command.clone();
            async move { handle.propose(group, command, remaining).await }
        })
        .await
    }

    /// A linearizable read of `group` through its leader. A read that timed out is simply
    /// retried: reads change nothing.
    pub async fn read(&self, group: u64, query: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, EngineError> {
        self.with_leader(group, timeout, |handle, remaining| {
            let query = query.clone();
            async move {
                match handle.read(group, query, ReadConsistency::Linearizable, remaining).await {
                    Err(EngineError::Unavailable { reason, .. }) => Err(EngineError::busy(reason)),
                    result => result,
                }
            }
        })
        .await
    }

    /// Store-writer counters summed over running nodes.
    pub fn store_metrics(&self) -> StoreMetricsSnapshot {
        self.nodes().values().map(Node::store_metrics).fold(StoreMetricsSnapshot::default(), |sum, m| StoreMetricsSnapshot {
            fsyncs: sum.fsyncs + m.fsyncs,
            entries: sum.entries + m.entries,
            bytes: sum.bytes + m.bytes,
            tasks: sum.tasks + m.tasks,
        })
    }

    /// Node `id`'s raft counters (`None` if it is not running).
    pub fn raft_metrics(&self, id: u64) -> Option<RaftMetricsSnapshot> {
        self.nodes().get(&id).map(Node::raft_metrics)
    }

    /// What node `id`'s remote-session checks found (`None` if it is not running).
    pub fn remote_session_metrics(&self, id: u64) -> Option<Arc<crate::service::RemoteSessionMetrics>> {
        self.api.as_ref().filter(|_| self.nodes().contains_key(&id)).and_then(|api| api.remote_session_metrics(id))
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use warden_proto::namespace::command::Op as CommandOp;
    use warden_proto::namespace::{query, Command, Query, QueryResult};
    use warden_proto::v1::{txn_op::Op, CreateRequest, ExistsRequest, TxnOp, TxnRequest};

    use super::*;
    use warden_namespace::{store, NamespaceFactory};
    use warden_testkit::wait_until;

    const TIMEOUT: Duration = Duration::from_secs(30);
    const VOTERS: [u64; 3] = [1, 2, 3];

    fn create(path: &str) -> Vec<u8> {
        let then = vec![TxnOp { op: Some(Op::Create(CreateRequest { path: path.into(), ..CreateRequest::default() })) }];
        Command { now_ms: 1, principal: String::new(), op: Some(CommandOp::Txn(TxnRequest { then, ..TxnRequest::default() })) }.encode_to_vec()
    }

    async fn status(cluster: &Cluster, node: u64, group: u64) -> GroupStatus {
        cluster.handle(node).expect("node running").status(group).await.expect("status")
    }

    /// Node `node`'s replica of `group` read as it is (stale): its revision, and whether
    /// `path` exists.
    async fn stale_read(cluster: &Cluster, node: u64, group: u64, path: &str) -> Result<(u64, bool), EngineError> {
        let handle = cluster.handle(node).ok_or(EngineError::Stopped)?;
        let query = Query { query: Some(query::Query::Exists(ExistsRequest { path: path.into(), ..ExistsRequest::default() })) }.encode_to_vec();
        let answer = handle.read(group, query, ReadConsistency::Stale, TIMEOUT).await?;
        let result = QueryResult::decode(answer.as_slice()).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let exists = match result.result {
            Some(warden_proto::namespace::query_result::Result::Exists(exists)) => exists.stat.is_some(),
            other => return Err(EngineError::Invalid(format!("not an exists answer: {other:?}"))),
        };
        Ok((result.revision, exists))
    }

    /// A follower whose store fails a read while it applies a committed write must not skip
    /// the write and go on: it stops applying the group before that entry, says why (status,
    /// metrics), serves nothing of the group, while the others apply the entry, the group
    /// keeps taking writes and the node's other group goes on. Restarted on its directory
    /// with the fault gone, it applies the entry and matches the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_whose_storage_fails_while_applying_stops_before_the_entry_until_restarted() {
        let config = ClusterConfig { nodes: 3, tick_ms: 20, hibernate_after_ticks: 0, ..ClusterConfig::default() };
        let cluster = Cluster::start(config, Arc::new(NamespaceFactory::default())).expect("cluster starts");
        for group in [1, 2] {
            cluster.create_group(group, &VOTERS).await.expect("group created");
        }
        let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
        cluster.propose(1, create("/before"), TIMEOUT).await.expect("first write");
        let failing = VOTERS.into_iter().find(|node| *node != leader).expect("a follower");
        cluster.nodes().get(&failing).expect("running").engine().db().read_faults.fail(1, &store::node_key("/a"));

        // Committed by the leader and the other follower.
        cluster.propose(1, create("/a"), TIMEOUT).await.expect("committed");
        let entry = status(&cluster, leader, 1).await.applied;
        wait_until("the failing follower applied the entry or stopped", TIMEOUT, async || {
            let seen = status(&cluster, failing, 1).await;
            seen.failure.is_some() || seen.applied >= entry
        })
        .await;
        let seen = status(&cluster, failing, 1).await;
        assert!(seen.applied < entry, "node {failing} applied entry {entry} although reading for it failed: {seen:?}");
        let failure = seen.failure.clone().expect("the replica says why it stopped");
        assert!(failure.contains("injected read fault"), "{failure}");
        assert!(!seen.is_leader, "{seen:?}");
        let metrics = cluster.handle(failing).expect("running").metrics().render();
        assert!(metrics.lines().any(|line| line == "warden_raft_groups{role=\"failed\"} 1"), "{metrics}");
        let refused = stale_read(&cluster, failing, 1, "/a").await;
        assert!(matches!(refused, Err(EngineError::ReplicaFailed { group: 1, .. })), "a failed replica serves no read: {refused:?}");

        // The group goes on without it, and so does the node's other group.
        cluster.propose(1, create("/after"), TIMEOUT).await.expect("the group takes writes");
        cluster.propose(2, create("/elsewhere"), TIMEOUT).await.expect("the other group takes writes");
        let others_leader = cluster.wait_leader(2, TIMEOUT).await.expect("leader of the other group");
        let other_applied = status(&cluster, others_leader, 2).await.applied;
        wait_until("the failing node applied the other group's write", TIMEOUT, async || status(&cluster, failing, 2).await.applied >= other_applied)
            .await;
        assert_eq!(status(&cluster, failing, 1).await.applied, seen.applied, "nothing more applied");

        // A restart (a fresh store handle: the fault is gone) applies the entry again.
        cluster.restart(failing).expect("restart");
        let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
        let expected = stale_read(&cluster, leader, 1, "/a").await.expect("the leader reads");
        assert!(expected.1, "/a exists at the leader");
        wait_until("the restarted replica caught up", TIMEOUT, async || {
            stale_read(&cluster, failing, 1, "/a").await.is_ok_and(|read| read == expected)
        })
        .await;
        assert_eq!(status(&cluster, failing, 1).await.failure, None);
    }

    /// Node `node`'s record of subtree moves of `group` and whether it holds a node at or
    /// below `prefix` (straight from its store).
    fn purge_state(cluster: &Cluster, node: u64, group: u64, prefix: &str) -> Option<(warden_proto::namespace::SplitState, bool)> {
        let nodes = cluster.nodes();
        let reader = warden_engine::state_machine::SmReader::new(nodes.get(&node)?.engine().db().clone(), group);
        let state = store::read_split(&reader).ok()?;
        let mut holds = false;
        for (from, to) in store::subtree_node_ranges(prefix) {
            reader
                .scan_range(&from, Some(&to), |_, _| {
                    holds = true;
                    false
                })
                .ok()?;
        }
        Some((state, holds))
    }

    /// The records of a subtree handed over go in pages the group's leader proposes; a
    /// leader that crashes midway leaves the rest to the next one, and every replica, the
    /// crashed one restarted included, ends with nothing of the subtree.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_moved_subtrees_purge_finishes_after_its_leader_crashes_midway() {
        use warden_proto::namespace::{FreezeSubtree, HandSubtree};
        use warden_proto::v1::GroupDescriptor;
        let config = ClusterConfig { nodes: 3, tick_ms: 20, hibernate_after_ticks: 0, ..ClusterConfig::default() };
        let cluster = Cluster::start(config, Arc::new(NamespaceFactory::default())).expect("cluster starts");
        cluster.create_group(1, &VOTERS).await.expect("group created");
        let command = |op: CommandOp| Command { now_ms: 1, principal: String::new(), op: Some(op) }.encode_to_vec();
        cluster.propose(1, create("/moved"), TIMEOUT).await.expect("subtree root");
        cluster.propose(1, create("/stays"), TIMEOUT).await.expect("beside it");
        // 6,000 nodes and their children index: a dozen pages, each a tick apart at least.
        for batch in 0..60 {
            let then = (0..100)
                .map(|i| TxnOp { op: Some(Op::Create(CreateRequest { path: format!("/moved/n{batch:02}-{i:03}"), ..CreateRequest::default() })) })
                .collect();
            cluster.propose(1, command(CommandOp::Txn(TxnRequest { then, ..TxnRequest::default() })), TIMEOUT).await.expect("filled");
        }
        let freeze = FreezeSubtree { prefix: "/moved".into(), target_group: 7, into_group: 0 };
        cluster.propose(1, command(CommandOp::FreezeSubtree(freeze)), TIMEOUT).await.expect("frozen");
        let served =
            GroupDescriptor { group_id: 1, prefix: "/".into(), excluded: vec!["/moved".into()], replicas: VOTERS.to_vec(), conf_ver: 1, version: 1 };
        let hand = HandSubtree { target_group: 7, descriptor: Some(served) };
        let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
        cluster.propose(1, command(CommandOp::HandSubtree(hand)), TIMEOUT).await.expect("handed over");
        // Answered once the leader applied it: its first purge page goes at its next tick.
        let (state, _) = purge_state(&cluster, leader, 1, "/moved").expect("leader's state");
        cluster.kill(leader);
        assert!(!state.purging.is_empty(), "the leader crashed before it purged the subtree: {state:?}");

        let purged = |node: u64| purge_state(&cluster, node, 1, "/moved").is_some_and(|(state, holds)| state.purging.is_empty() && !holds);
        wait_until("the next leader purged the rest", TIMEOUT, async || VOTERS.iter().filter(|node| **node != leader).all(|node| purged(*node)))
            .await;
        cluster.restart(leader).expect("restart");
        wait_until("the restarted replica purged it too", TIMEOUT, async || purged(leader)).await;
        wait_until("the node beside the subtree is read there", TIMEOUT, async || {
            stale_read(&cluster, leader, 1, "/stays").await.is_ok_and(|(_, exists)| exists)
        })
        .await;
    }
}
