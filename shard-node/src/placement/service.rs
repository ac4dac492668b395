//! `warden.placement.Placement`, served by every shard-node. Reads of the routing table are
//! linearizable reads of the placement group; changes are proposed to it, so they are
//! answered by its leader (elsewhere: NOT_LEADER with the leader's address). Creating a
//! group is a sequence run by the placement leader:
//!
//! 1. `CreateGroup` is committed: placement allocates the id and picks the replicas.
//! 2. Each picked node creates its replica (`CreateReplica`); the first one campaigns.
//! 3. The group answers a linearizable `Sync`: it has a leader.
//! 4. The new group gets its descriptor (creating its prefix node), then each group giving
//!    paths away gets its new one (`SetDescriptor`, refused if it holds nodes there) — both
//!    as placement will compute them once the group is ready — and last the new group's
//!    revision is raised above the givers' (fencing tokens never go backwards).
//! 5. `GroupReady` is committed: the route exists from now on.
//!
//! The leader runs one such sequence at a time. If 2–5 fail, the group is rolled back:
//! `DropGroup` forgets it and gives the groups it carved paths out of a newer descriptor
//! (replicas already made stay idle on their nodes; nothing routes to them). A creation left
//! half-way (the call failed before its rollback, or the leader went away) is resumed, or
//! else rolled back, before the next creation and periodically by the placement leader.
//! Between 4 and 5 a request for the prefix may be answered WRONG_GROUP by the old owner
//! while the route is not yet committed: routers retry.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message as _;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use warden_placement::{
    AppliedSettings, Command, GroupDescriptor, NodeState, Outcome, Placement, PlacementConfig, PlacementError, PLACEMENT_GROUP_ID,
};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::query::Query as NamespaceQuery;
use warden_proto::namespace::query_result::Result as NamespaceAnswer;
use warden_proto::namespace::{Command as NamespaceCommand, CommandResult, SetDescriptor};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::placement_server::{Placement as PlacementApi, PlacementServer};
use warden_proto::placement::NodeState as ProtoNodeState;
use warden_proto::placement::*;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{Routing, SyncRequest, WardenError};

use super::scheduler::{LeadersHeard, Running};
use super::state_machine::{decode_result, decode_state, encode_command};
use crate::service::{engine_status, status};
use warden_engine::error::EngineError;
use warden_engine::host::{NodeHandle, ReadConsistency};
use warden_engine::transport::PeerDirectory;
use warden_placement::acl;
use warden_placement::quota::QuotaError;
use warden_proto::tls::{caller, calling_node, peer_identity, Caller, Expected, Role, Tls};
use warden_router::access::{acl_to_proto, AclCache};

/// How long a new group may take to elect its first leader.
const GROUP_LEADER_WAIT: Duration = Duration::from_secs(10);
/// Pause between checks for that leader.
const GROUP_LEADER_POLL: Duration = Duration::from_millis(50);
/// How often the placement leader runs a scheduling round.
pub const SCHEDULE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the placement leader looks for group creations left half-way.
pub const SETTLE_CREATIONS_INTERVAL: Duration = Duration::from_secs(5);

/// The placement service of one node.
#[derive(Clone)]
pub struct PlacementService {
    pub(super) node: NodeHandle,
    pub(super) directory: Arc<PeerDirectory>,
    pub(super) timeout: Duration,
    /// The routing version this node's placement replica applied (`None`: no placement
    /// state machines on this node's factory).
    routing_versions: Option<tokio::sync::watch::Receiver<u64>>,
    /// The placement group's configuration (what its leader's scheduler judges by).
    config: PlacementConfig,
    /// Held through every group lifecycle change this node runs as placement leader.
    pub(super) lifecycle: Arc<tokio::sync::Mutex<()>>,
    /// The groups each node said it leads (heard while this node led placement).
    pub(super) leaders_heard: Arc<LeadersHeard>,
    /// Groups with a scheduler operator running from this node.
    pub(super) running: Arc<Running>,
    /// Fault injection (tests): where a split stops (`split.rs`).
    pub(super) faults: Arc<warden_engine::transport::NetFaults>,
    /// This node's TLS, for its calls to other nodes (`None`: plaintext).
    tls: Option<Arc<Tls>>,
    /// The ACL as this node last heard it: who may administer what (security on).
    acl: Arc<AclCache>,
    /// Held while this node moves room between the groups' quota shares (one change at a
    /// time; placement's log keeps the shares within the limits whatever runs).
    pub(super) quota_changes: Arc<tokio::sync::Mutex<()>>,
    /// Held while this node changes the apply limits (`limits.rs`: one read-merge-commit at
    /// a time).
    pub(super) limits_changes: Arc<tokio::sync::Mutex<()>>,
    /// The apply limits a bootstrap by this node records (`limits.rs`).
    bootstrap_limits: warden_proto::v1::ApplyLimits,
    /// The node's store, read by backups (`backup.rs`; `None`: backups are refused here).
    pub(super) store: Option<Arc<warden_engine::storage::Db>>,
    /// Leave to read one backup here (at most [`super::backup::BACKUPS_MAX`] at once).
    pub(super) backups: Arc<tokio::sync::Semaphore>,
}

/// Tables queued on one `WatchRoutingTable` stream (a watcher only needs the latest).
const ROUTING_TABLES_QUEUED_MAX: usize = 2;

/// A node's security: its TLS for calls to other nodes, and the ACL its checks use.
pub struct Security {
    /// This node's TLS (`None`: plaintext, security off).
    pub tls: Option<Arc<Tls>>,
    /// The ACL as this node last heard it.
    pub acl: Arc<AclCache>,
}

impl PlacementService {
    /// The service of `node`.
    pub fn new(
        node: NodeHandle,
        directory: Arc<PeerDirectory>,
        timeout: Duration,
        routing_versions: Option<tokio::sync::watch::Receiver<u64>>,
        config: PlacementConfig,
        faults: Arc<warden_engine::transport::NetFaults>,
        security: Security,
    ) -> PlacementService {
        PlacementService {
            tls: security.tls,
            acl: security.acl,
            node,
            directory,
            timeout,
            routing_versions,
            config,
            lifecycle: Arc::default(),
            leaders_heard: Arc::default(),
            running: Arc::default(),
            faults,
            quota_changes: Arc::default(),
            limits_changes: Arc::default(),
            bootstrap_limits: warden_proto::v1::ApplyLimits::default(),
            store: None,
            backups: Arc::new(tokio::sync::Semaphore::new(super::backup::BACKUPS_MAX)),
        }
    }

    /// The service, reading backups of the groups hosted in `store` (see `backup.rs`).
    pub fn with_store(self, store: Arc<warden_engine::storage::Db>) -> PlacementService {
        PlacementService { store: Some(store), ..self }
    }

    /// The service, recording `limits` when it bootstraps a cluster (default: none, groups
    /// keep the first release's).
    pub fn with_bootstrap_limits(self, limits: warden_proto::v1::ApplyLimits) -> PlacementService {
        PlacementService { bootstrap_limits: limits, ..self }
    }

    /// The service, wrapped for tonic.
    pub fn server(self) -> PlacementServer<PlacementService> {
        PlacementServer::new(self)
    }

    /// Sends the table on `tables` whenever this replica applies a newer routing version,
    /// until the watcher goes away or the table cannot be read.
    async fn send_tables(
        &self,
        mut versions: tokio::sync::watch::Receiver<u64>,
        mut sent: u64,
        tables: tokio::sync::mpsc::Sender<Result<RoutingTable, Status>>,
    ) {
        loop {
            let version = *versions.borrow_and_update();
            if version > sent {
                let table = match self.state().await {
                    Ok(state) => routing_table(&state),
                    Err(status) => {
                        let _ = tables.send(Err(status)).await;
                        return;
                    }
                };
                sent = table.version;
                if tables.send(Ok(table)).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                changed = versions.changed() => if changed.is_err() { return },
                () = tables.closed() => return,
            }
        }
    }

    /// Refuses a caller that may not administer `prefix`: with security on, a principal
    /// needs `admin` there; nodes may (they run placement), and routers too when
    /// `routers_too` (they read the routing table). Security off: everyone may.
    fn require_admin<T>(&self, request: &Request<T>, prefix: &str, routers_too: bool) -> Result<(), Status> {
        match peer_identity(request).map(|identity| identity.role) {
            Some(Role::Node) => return Ok(()),
            Some(Role::Router) if routers_too => return Ok(()),
            _ => {}
        }
        match caller(request)? {
            Caller::Principal(principal) if !self.acl.get().allows(&principal, prefix, acl::ADMIN) => {
                let message = format!("{principal} may not administer {prefix}");
                Err(status(WardenError { code: Code::PermissionDenied as i32, path: prefix.to_string(), message, ..WardenError::default() }))
            }
            _ => Ok(()),
        }
    }

    /// Proposes `command` to the placement group (this node must lead it).
    pub(super) async fn propose(&self, command: &Command) -> Result<Outcome, Status> {
        let output = self
            .node
            .propose(PLACEMENT_GROUP_ID, encode_command(command), self.timeout)
            .await
            .map_err(|e| engine_status(&self.directory, PLACEMENT_GROUP_ID, e))?;
        decode_result(&output).map_err(internal)?.map_err(placement_status)
    }

    /// The placement state as committed (linearizable).
    pub(super) async fn state(&self) -> Result<Placement, Status> {
        let bytes = self
            .node
            .read(PLACEMENT_GROUP_ID, Vec::new(), ReadConsistency::Linearizable, self.timeout)
            .await
            .map_err(|e| engine_status(&self.directory, PLACEMENT_GROUP_ID, e))?;
        // The configuration only steers the leader's decisions, not what the table says.
        decode_state(&bytes, self.config.clone()).map_err(internal)
    }

    /// Steps 2 and 3: the replicas exist and the group has a leader.
    pub(super) async fn start_group(&self, group: &warden_placement::GroupInfo, state: &Placement) -> Result<(), Status> {
        for (position, replica) in group.replicas.iter().enumerate() {
            let addr = state.node(*replica).map(|n| n.addr.clone()).ok_or_else(|| internal(format!("node {replica} has no address")))?;
            let request = CreateReplicaRequest { group_id: group.id, voters: group.replicas.clone(), campaign: position == 0 };
            let mut client = PlacementClient::new(self.channel(&addr)?);
            client.create_replica(request).await?;
        }
        let first = state.node(group.replicas[0]).map(|n| n.addr.clone()).unwrap_or_default();
        let mut client = WardenClient::new(self.channel(&first)?);
        let deadline = tokio::time::Instant::now() + GROUP_LEADER_WAIT;
        loop {
            let sync = SyncRequest { routing: Some(Routing { group_id: group.id, ..Routing::default() }) };
            match client.sync(sync).await {
                Ok(_) => return Ok(()),
                Err(error) if tokio::time::Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(GROUP_LEADER_POLL).await,
            }
        }
    }
}

impl PlacementService {
    /// Steps 2–5 for a group placement has committed as creating. Safe to run again on a
    /// group an earlier attempt left half-way: every step is idempotent.
    async fn finish_creation(&self, group: &warden_placement::GroupInfo) -> Result<(), Status> {
        let state = self.state().await?;
        self.start_group(group, &state).await?;
        self.hand_over(group, &state).await?;
        self.propose(&Command::GroupReady { group_id: group.id }).await?;
        Ok(())
    }

    /// Refuses NOT_LEADER unless this node leads the placement group as far as it knows, so a
    /// lifecycle change never runs on two nodes that both know the true leader.
    pub(super) fn ensure_leader(&self) -> Result<(), Status> {
        self.leading_term().map(drop)
    }

    /// The placement group's term at which this node leads it, as far as it knows;
    /// NOT_LEADER when it does not lead.
    pub(super) fn leading_term(&self) -> Result<u64, Status> {
        let info = self.node.leader_info(PLACEMENT_GROUP_ID);
        if info.leader_id == self.node.node_id() {
            return Ok(info.term);
        }
        let not_leader = EngineError::NotLeader { group: PLACEMENT_GROUP_ID, leader_hint: Some(info.leader_id).filter(|id| *id != 0) };
        Err(engine_status(&self.directory, PLACEMENT_GROUP_ID, not_leader))
    }

    /// Forgets a creation that failed, and gives the groups it would have carved paths out
    /// of their descriptor again (a newer version, which replaces any the failed hand-over
    /// delivered), so they serve those paths again. Best effort: failures are logged, and
    /// a group still excluding the prefix answers WRONG_GROUP (never serves it twice).
    pub(super) async fn roll_back(&self, group_id: u64) {
        let bumped = match self.propose(&Command::DropGroup { group_id }).await {
            Ok(Outcome::GroupDropped { bumped, .. }) => bumped,
            Ok(other) => return tracing::warn!(group = group_id, ?other, "unexpected outcome of dropping a group"),
            Err(error) => return tracing::warn!(group = group_id, %error, "could not drop a group whose creation failed"),
        };
        let state = match self.state().await {
            Ok(state) => state,
            Err(error) => return tracing::warn!(group = group_id, %error, "could not read placement to roll a creation back"),
        };
        for giver in bumped {
            let Some(descriptor) = state.descriptor(giver.id) else { continue };
            if let Err(error) = self.set_descriptor_at(&state, &descriptor, 0).await {
                tracing::warn!(group = giver.id, %error, "could not give a group its paths back after a failed creation");
            }
        }
    }

    /// Finishes, or else rolls back, every group placement records as being created. The
    /// caller holds `lifecycle`, so none of them is being created by this node right now.
    pub(super) async fn settle_creations(&self) -> Result<(), Status> {
        let state = self.state().await?;
        for group in state.groups().values().filter(|g| g.merging.is_some()) {
            tracing::info!(group = group.id, prefix = %group.prefix, "resuming a merge left half-way");
            // Rolled back or not settled yet (then placement refuses other changes): logged.
            if let Err(error) = self.finish_or_settle_merge(group).await {
                tracing::warn!(group = group.id, %error, "a merge left half-way did not finish");
            }
        }
        for group in state.groups().values().filter(|g| g.retired) {
            if let Err(error) = self.remove_retired(group.id).await {
                tracing::debug!(group = group.id, %error, "could not remove a merged group now");
            }
        }
        for group in state.groups().values().filter(|g| !g.ready) {
            tracing::info!(group = group.id, prefix = %group.prefix, "resuming a group creation left half-way");
            if group.split_from.is_some() {
                self.finish_or_settle_split(group).await?;
                continue;
            }
            if let Err(error) = self.finish_creation(group).await {
                tracing::warn!(group = group.id, %error, "rolling back a group creation that cannot be finished");
                self.roll_back(group.id).await;
            }
        }
        Ok(())
    }

    /// While this node leads the placement group, settles creations left half-way (by a
    /// call that failed mid-way or a leader that went away) every `interval`, so no prefix
    /// stays unserved. Runs until the runtime stops.
    pub async fn settle_creations_periodically(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A creation in progress here settles what it finds itself.
            let Ok(_lifecycle) = self.lifecycle.try_lock() else { continue };
            if self.ensure_leader().is_err() {
                continue;
            }
            if let Err(error) = self.settle_creations().await {
                tracing::debug!(%error, "could not settle group creations");
            }
        }
    }

    /// Step 4: the descriptors placement will have once `group` is ready, new group first,
    /// then each group giving paths away; last the new group's revision is raised above every
    /// revision those groups reached when they stopped serving the paths, so a fencing token
    /// of a moved path never goes backwards (DESIGN.md rule 5). Safe to run again: a group
    /// accepts the descriptor it already has.
    async fn hand_over(&self, group: &warden_placement::GroupInfo, state: &Placement) -> Result<(), Status> {
        let mut next = state.clone();
        let bumped = match next.apply(&Command::GroupReady { group_id: group.id }).map_err(placement_status)? {
            Outcome::GroupReady { bumped, .. } => bumped,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        let descriptor_of = |id: u64| next.descriptor(id).ok_or_else(|| internal(format!("group {id} has no descriptor")));
        let new = descriptor_of(group.id)?;
        self.set_descriptor_at(state, &new, 0).await?;
        let mut floor = 0;
        for giver in &bumped {
            floor = floor.max(self.set_descriptor_at(state, &descriptor_of(giver.id)?, 0).await?);
        }
        self.set_descriptor_at(state, &new, floor).await?;
        Ok(())
    }

    /// Removes `group` (claimed by the caller, so no replica move runs on it), a sequence
    /// that can be run again from the start if any step fails (each step is idempotent):
    ///
    /// 1. Placement as it will be once the group is removed gives the descriptors (and
    ///    refuses here the root group, a group not ready, a move in flight).
    /// 2. The group retires: it serves nothing from then on (refused NOT_EMPTY while its
    ///    prefix node has children or sessions are homed in it). Its revision then bounds
    ///    every fencing token it issued.
    /// 3. The group serving the parent path takes the prefix back, its revision first raised
    ///    above the retired group's (tokens never go backwards, DESIGN.md rule 5).
    /// 4. `RemoveGroup` is committed: the route is gone.
    /// 5. The nodes destroy their replicas when their heartbeats learn placement no longer
    ///    has the group.
    ///
    /// Between 2 and 4 requests for the prefix are answered WRONG_GROUP (routers retry).
    async fn remove_claimed(&self, state: &Placement, group: &warden_placement::GroupInfo) -> Result<RemoveGroupResponse, Status> {
        // 1.
        let mut next = state.clone();
        let gainers = match next.apply(&Command::RemoveGroup { group_id: group.id }).map_err(placement_status)? {
            Outcome::GroupRemoved { bumped, .. } => bumped,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        // 2.
        let retired_at = self.set_descriptor_at(state, &retiring_descriptor(state, group.id)?, 0).await?;
        // 3.
        for gainer in &gainers {
            let descriptor = next.descriptor(gainer.id).ok_or_else(|| internal(format!("group {} has no descriptor", gainer.id)))?;
            self.set_descriptor_at(state, &descriptor, retired_at).await?;
        }
        // 4.
        self.propose(&Command::RemoveGroup { group_id: group.id }).await?;
        tracing::info!(group = group.id, prefix = %group.prefix, "group removed");
        let parent_group_id = next.route(&group.prefix).map_or(0, |parent| parent.id);
        Ok(RemoveGroupResponse { group_id: group.id, parent_group_id })
    }

    /// The answer to a group creation or split: the group as placement has it now.
    /// The answer to an ACL change.
    fn acl_changed(&self, outcome: Outcome) -> Result<Response<ChangeAclResponse>, Status> {
        match outcome {
            Outcome::AclChanged(version) => Ok(Response::new(ChangeAclResponse { version })),
            other => Err(internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn created(&self, group_id: u64) -> Result<Response<CreateGroupResponse>, Status> {
        let state = self.state().await?;
        let entry = state.descriptor(group_id).map(|d| GroupEntry {
            descriptor: Some(descriptor_proto(&d)),
            ready: state.group(group_id).is_some_and(|g| g.ready),
            learners: Vec::new(),
            merging_into: 0,
            retired: false,
        });
        Ok(Response::new(CreateGroupResponse { group: entry, routing_version: state.routing_version() }))
    }

    /// Asks a namespace query of a group this node hosts; its answer, or the typed refusal.
    async fn query_namespace(&self, group: u64, query: NamespaceQuery, consistency: ReadConsistency) -> Result<NamespaceAnswer, Status> {
        let query = warden_proto::namespace::Query { query: Some(query) };
        let bytes =
            self.node.read(group, query.encode_to_vec(), consistency, self.timeout).await.map_err(|e| engine_status(&self.directory, group, e))?;
        match warden_proto::namespace::QueryResult::decode(bytes.as_slice()).map_err(internal)?.result {
            Some(NamespaceAnswer::Error(error)) => Err(status(error)),
            Some(answer) => Ok(answer),
            None => Err(internal("a namespace query without an answer")),
        }
    }

    /// Proposes a namespace command of placement's (a descriptor, a split step, a quota share)
    /// to `group`, which this node must lead; answers its outcome once applied (a refusal as
    /// its status).
    async fn propose_namespace(&self, group: u64, op: CommandOp) -> Result<CommandOutcome, Status> {
        let command = NamespaceCommand { now_ms: now_ms(), principal: String::new(), op: Some(op) };
        let output = self.node.propose(group, command.encode_to_vec(), self.timeout).await.map_err(|e| engine_status(&self.directory, group, e))?;
        match CommandResult::decode(output.as_slice()).map_err(internal)?.result {
            Some(CommandOutcome::Error(error)) => Err(status(error)),
            Some(outcome) => Ok(outcome),
            None => Err(internal("a namespace command without an outcome")),
        }
    }

    /// As [`Self::propose_namespace`], for a command answered by a transaction: the group's
    /// revision once it applied.
    async fn propose_namespace_txn(&self, group: u64, op: CommandOp) -> Result<u64, Status> {
        match self.propose_namespace(group, op).await? {
            CommandOutcome::Txn(txn) => Ok(txn.header.map_or(0, |h| h.revision)),
            other => Err(internal(format!("unexpected outcome of a placement command: {other:?}"))),
        }
    }

    /// Has the leader of `descriptor`'s group apply it (its revision raised to at least
    /// `revision_floor` first). Answers the group's revision once applied.
    pub(super) async fn set_descriptor_at(&self, state: &Placement, descriptor: &GroupDescriptor, revision_floor: u64) -> Result<u64, Status> {
        let request = SetDescriptorRequest { descriptor: Some(descriptor_proto(descriptor)), revision_floor };
        let answer = self
            .at_replicas(state, &descriptor.replicas, |mut client| {
                let request = request.clone();
                async move { client.set_descriptor(request).await }
            })
            .await?;
        Ok(answer.revision)
    }

    /// Calls the leader of `group` (see [`Self::at_replicas`]).
    pub(super) async fn at_group_leader<T, F, Fut>(&self, state: &Placement, group: &warden_placement::GroupInfo, call: F) -> Result<T, Status>
    where
        F: Fn(PlacementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        self.at_replicas(state, &group.replicas, call).await
    }

    /// Makes a call only a group's leader answers, trying the group's `replicas` in turn and
    /// following NOT_LEADER hints, until the timeout.
    async fn at_replicas<T, F, Fut>(&self, state: &Placement, replicas: &[u64], call: F) -> Result<T, Status>
    where
        F: Fn(PlacementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut target = replicas.first().copied();
        let mut turn = 0usize;
        loop {
            let addr = target.and_then(|id| state.node(id)).map(|n| n.addr.clone()).unwrap_or_default();
            let status = match call(PlacementClient::new(self.channel(&addr)?)).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            let error = crate::service::error_of(&status);
            let retry = error.as_ref().is_none_or(|e| e.code == Code::NotLeader as i32 || e.code == Code::Unavailable as i32);
            if !retry || tokio::time::Instant::now() >= deadline {
                return Err(status);
            }
            turn += 1;
            let hint = error.map(|e| e.leader_id).filter(|id| *id != 0 && replicas.contains(id));
            target = hint.or_else(|| replicas.get(turn % replicas.len().max(1)).copied());
            tokio::time::sleep(GROUP_LEADER_POLL).await;
        }
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl PlacementService {
    /// A lazily connected channel to the node at `addr` (`host:port`).
    pub(super) fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let endpoint = Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| internal(format!("address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(1));
        Ok(warden_proto::tls::lazy_channel(endpoint, self.tls.as_ref(), Expected::AnyNode))
    }
}

pub(crate) fn internal(error: impl std::fmt::Display) -> Status {
    status(WardenError { code: Code::Unknown as i32, message: error.to_string(), ..WardenError::default() })
}

/// The typed status of a refused placement command.
pub(super) fn placement_status(error: PlacementError) -> Status {
    let code = match &error {
        PlacementError::InvalidPrefix { .. } => Code::InvalidPath,
        PlacementError::PrefixTaken { .. } | PlacementError::AlreadyBootstrapped | PlacementError::DuplicateNode(_) => Code::NodeExists,
        PlacementError::NotBootstrapped | PlacementError::NotEnoughNodes { .. } => Code::Unavailable,
        PlacementError::GroupIdsExhausted | PlacementError::LimitsTooLarge(_) => Code::TooLarge,
        PlacementError::NodeNotServing(_) | PlacementError::ChangeInProgress { .. } | PlacementError::GroupNotReady(_) => Code::Unavailable,
        PlacementError::ReplicaExists { .. } => Code::NodeExists,
        PlacementError::NodeNotEmpty { .. } => Code::NotEmpty,
        PlacementError::NoGroupAt(_) => Code::NoNode,
        PlacementError::UnknownNode(_)
        | PlacementError::NotMerging(_)
        | PlacementError::UnknownGroup(_)
        | PlacementError::GroupNotCreating(_)
        | PlacementError::InvalidNode { .. }
        | PlacementError::RootGroup
        | PlacementError::NodeTombstoned(_)
        | PlacementError::NodeStateChange { .. }
        | PlacementError::NotALearner { .. }
        | PlacementError::NotAVoter { .. } => Code::InvalidArgument,
        PlacementError::Acl(warden_placement::AclError::Full { .. }) => Code::TooLarge,
        PlacementError::Acl(_) => Code::InvalidArgument,
        PlacementError::Quota(QuotaError::InvalidPrefix(_)) => Code::InvalidPath,
        PlacementError::Quota(QuotaError::TooMany { .. }) => Code::TooLarge,
        PlacementError::Quota(QuotaError::Unknown(_)) => Code::NoNode,
        // Lost a race with another change of the shares: the caller tries again.
        PlacementError::Quota(QuotaError::OverAllotted { .. } | QuotaError::Stale { .. }) => Code::Unavailable,
        PlacementError::BadSnapshot(_) | PlacementError::Inconsistent(_) => Code::Unknown,
    };
    status(WardenError { code: code as i32, message: error.to_string(), ..WardenError::default() })
}

/// The refusal of a lifecycle change while a replica move runs on `group`.
pub(super) fn busy(group: u64) -> Status {
    status(WardenError { code: Code::Unavailable as i32, message: format!("group {group} is moving a replica; try again"), ..WardenError::default() })
}

/// The descriptor that retires `group_id` (removed or merged away): its next version,
/// excluding its own prefix, so it serves nothing.
pub(super) fn retiring_descriptor(state: &Placement, group_id: u64) -> Result<GroupDescriptor, Status> {
    let mut retiring = state.descriptor(group_id).ok_or_else(|| internal(format!("group {group_id} has no descriptor")))?;
    retiring.epoch.version += 1;
    retiring.excluded = vec![retiring.prefix.clone()];
    Ok(retiring)
}

/// The wire form of a descriptor.
pub fn descriptor_proto(descriptor: &GroupDescriptor) -> warden_proto::v1::GroupDescriptor {
    warden_proto::v1::GroupDescriptor {
        group_id: descriptor.id,
        prefix: descriptor.prefix.clone(),
        excluded: descriptor.excluded.clone(),
        replicas: descriptor.replicas.clone(),
        conf_ver: descriptor.epoch.conf_ver,
        version: descriptor.epoch.version,
    }
}

/// The routing table of a placement state.
pub fn routing_table(state: &Placement) -> RoutingTable {
    let nodes = state.nodes().values().map(node_entry).collect();
    let groups = state
        .groups()
        .values()
        .filter_map(|g| {
            state.descriptor(g.id).map(|d| GroupEntry {
                descriptor: Some(descriptor_proto(&d)),
                // A retired group is not routed: only its id is looked up (its sessions).
                ready: g.ready && !g.retired,
                learners: g.learners.clone(),
                merging_into: g.merging.map_or(0, |m| m.into),
                retired: g.retired,
            })
        })
        .collect();
    RoutingTable { version: state.routing_version(), nodes, groups, scheduler_paused: state.scheduler_paused(), acl: Some(acl_to_proto(state.acl())) }
}

/// The wire form of a node.
fn node_entry(node: &warden_placement::NodeInfo) -> NodeEntry {
    let state = match node.state {
        NodeState::Serving => ProtoNodeState::Serving,
        NodeState::Draining => ProtoNodeState::Draining,
        NodeState::Decommissioning => ProtoNodeState::Decommissioning,
        NodeState::Tombstone => ProtoNodeState::Tombstone,
    };
    NodeEntry {
        id: node.id,
        addr: node.addr.clone(),
        zone: node.zone.clone(),
        up: node.up,
        last_heartbeat_ms: node.last_heartbeat_ms,
        state: state as i32,
    }
}

pub(super) fn invalid_argument(message: impl Into<String>) -> Status {
    status(WardenError { code: Code::InvalidArgument as i32, message: message.into(), ..WardenError::default() })
}

#[tonic::async_trait]
impl PlacementApi for PlacementService {
    async fn get_routing_table(&self, request: Request<GetRoutingTableRequest>) -> Result<Response<RoutingTable>, Status> {
        self.require_admin(&request, "/", true)?;
        Ok(Response::new(routing_table(&self.state().await?)))
    }

    type WatchRoutingTableStream = tokio_stream::wrappers::ReceiverStream<Result<RoutingTable, Status>>;

    async fn watch_routing_table(&self, request: Request<WatchRoutingTableRequest>) -> Result<Response<Self::WatchRoutingTableStream>, Status> {
        self.require_admin(&request, "/", true)?;
        let versions = self.routing_versions.clone().ok_or_else(|| Status::unimplemented("this node has no placement state machine"))?;
        // Only a node hosting a placement replica sees the versions as they apply (elsewhere
        // this read fails WRONG_GROUP and the watcher tries another node).
        self.state().await?;
        let (tables, stream) = tokio::sync::mpsc::channel(ROUTING_TABLES_QUEUED_MAX);
        let service = self.clone();
        let after_version = request.into_inner().after_version;
        tokio::spawn(async move { service.send_tables(versions, after_version, tables).await });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(stream)))
    }

    async fn create_group(&self, request: Request<CreateGroupRequest>) -> Result<Response<CreateGroupResponse>, Status> {
        self.require_admin(&request, &request.get_ref().prefix, false)?;
        let prefix = request.into_inner().prefix;
        // One lifecycle change at a time: a creation computes descriptors from the state it
        // read, which another creation's `GroupReady` would make stale.
        let _lifecycle = self.lifecycle.lock().await;
        self.ensure_leader()?;
        // A creation an earlier call (or an earlier leader) left half-way is finished or
        // rolled back first, so its prefix is not lost and it cannot race with this one.
        self.settle_creations().await?;
        let group = match self.propose(&Command::CreateGroup { prefix, now_ms: now_ms() }).await? {
            Outcome::GroupCreated(group) => group,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        if let Err(error) = self.finish_creation(&group).await {
            self.roll_back(group.id).await;
            return Err(error);
        }
        self.created(group.id).await
    }

    async fn split_group(&self, request: Request<CreateGroupRequest>) -> Result<Response<CreateGroupResponse>, Status> {
        self.require_admin(&request, &request.get_ref().prefix, false)?;
        let prefix = request.into_inner().prefix;
        let _lifecycle = self.lifecycle.lock().await;
        self.ensure_leader()?;
        self.settle_creations().await?;
        let group = self.split(prefix).await?;
        self.created(group.id).await
    }

    async fn merge_group(&self, request: Request<RemoveGroupRequest>) -> Result<Response<RemoveGroupResponse>, Status> {
        self.require_admin(&request, &request.get_ref().prefix, false)?;
        let prefix = request.into_inner().prefix;
        let _lifecycle = self.lifecycle.lock().await;
        self.ensure_leader()?;
        self.settle_creations().await?;
        Ok(Response::new(self.merge(prefix).await?))
    }

    async fn split_step(&self, request: Request<SplitStepRequest>) -> Result<Response<SplitStepResponse>, Status> {
        calling_node(&request)?;
        let SplitStepRequest { group_id, step } = request.into_inner();
        let op = match step {
            Some(split_step_request::Step::Freeze(freeze)) => CommandOp::FreezeSubtree(freeze),
            Some(split_step_request::Step::Ingest(ingest)) => CommandOp::IngestSubtree(ingest),
            Some(split_step_request::Step::Hand(hand)) => CommandOp::HandSubtree(hand),
            Some(split_step_request::Step::Abort(abort)) => CommandOp::AbortSplit(abort),
            None => return Err(invalid_argument("a split step names its step")),
        };
        let revision = self.propose_namespace_txn(group_id, op).await?;
        Ok(Response::new(SplitStepResponse { revision }))
    }

    async fn export_subtree(&self, request: Request<ExportSubtreeRequest>) -> Result<Response<ExportSubtreeResponse>, Status> {
        calling_node(&request)?;
        let ExportSubtreeRequest { group_id, export } = request.into_inner();
        let export = export.ok_or_else(|| invalid_argument("an export request names what to export"))?;
        match self.query_namespace(group_id, NamespaceQuery::ExportSubtree(export), ReadConsistency::Linearizable).await? {
            NamespaceAnswer::SubtreePage(page) => Ok(Response::new(ExportSubtreeResponse { page: Some(page) })),
            other => Err(internal(format!("unexpected answer to an export: {other:?}"))),
        }
    }

    async fn group_writes(&self, request: Request<GroupWritesRequest>) -> Result<Response<GroupWritesResponse>, Status> {
        self.require_admin(&request, "/", false)?;
        let group_id = request.into_inner().group_id;
        // This replica's own counts: no leader needed (each reading compares with the last).
        match self.query_namespace(group_id, NamespaceQuery::ChildWrites(true), ReadConsistency::Stale).await? {
            NamespaceAnswer::ChildWrites(writes) => Ok(Response::new(GroupWritesResponse { writes: Some(writes) })),
            other => Err(internal(format!("unexpected answer to child writes: {other:?}"))),
        }
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        // With TLS on, a node registers (and moves the address of) itself only.
        let caller = calling_node(&request)?;
        let request = request.into_inner();
        let node_id = request.node_id;
        if caller.is_some_and(|caller| caller != node_id) {
            return Err(Status::permission_denied(format!("node {caller:?} sent the heartbeat of node {node_id}")));
        }
        let command = Command::RegisterNode { id: node_id, addr: request.addr, zone: request.zone, now_ms: now_ms() };
        self.propose(&command).await?;
        self.leaders_heard.record(node_id, request.led_groups);
        let state = self.state().await?;
        // Placement records a group before any replica of it exists and never reuses an id:
        // a hosted group below the next id that placement does not have is gone for good.
        let removed_groups = request
            .hosted_groups
            .into_iter()
            .filter(|group| *group != PLACEMENT_GROUP_ID && *group < state.next_group_id() && state.group(*group).is_none())
            .collect();
        // The ACL goes only to a node that has an older one.
        let acl = (state.acl().version() > request.acl_version).then(|| acl_to_proto(state.acl()));
        // So do the apply limits.
        let limits = (state.apply_limits().version > request.limits_version).then(|| super::limits::cluster_limits(&state)).transpose()?;
        Ok(Response::new(HeartbeatResponse {
            routing_version: state.routing_version(),
            nodes: state.nodes().values().map(node_entry).collect(),
            removed_groups,
            acl,
            limits,
        }))
    }

    async fn bootstrap(&self, request: Request<BootstrapRequest>) -> Result<Response<BootstrapResponse>, Status> {
        calling_node(&request)?;
        let nodes =
            self.directory.ids().into_iter().filter_map(|id| self.directory.get(id).map(|addr| (id, addr.to_string(), String::new()))).collect();
        let limits =
            if self.bootstrap_limits == warden_proto::v1::ApplyLimits::default() { Vec::new() } else { self.bootstrap_limits.encode_to_vec() };
        let root =
            match self.propose(&Command::Bootstrap { nodes, now_ms: now_ms(), limits, settings: Some(AppliedSettings::of(&self.config)) }).await? {
                Outcome::Bootstrapped(root) => root,
                other => return Err(internal(format!("unexpected outcome {other:?}"))),
            };
        let state = self.state().await?;
        self.start_group(&root, &state).await?;
        let descriptor = state.descriptor(root.id).ok_or_else(|| internal("the root group has no descriptor"))?;
        self.set_descriptor_at(&state, &descriptor, 0).await?;
        Ok(Response::new(BootstrapResponse {
            root: Some(GroupEntry {
                descriptor: Some(descriptor_proto(&descriptor)),
                ready: true,
                learners: Vec::new(),
                merging_into: 0,
                retired: false,
            }),
        }))
    }

    async fn set_descriptor(&self, request: Request<SetDescriptorRequest>) -> Result<Response<SetDescriptorResponse>, Status> {
        calling_node(&request)?;
        let SetDescriptorRequest { descriptor, revision_floor } = request.into_inner();
        let descriptor = descriptor
            .ok_or_else(|| status(WardenError { code: Code::InvalidArgument as i32, message: "no descriptor".into(), ..WardenError::default() }))?;
        let group = descriptor.group_id;
        let set = SetDescriptor { descriptor: Some(descriptor), revision_floor };
        let revision = self.propose_namespace_txn(group, CommandOp::SetDescriptor(set)).await?;
        Ok(Response::new(SetDescriptorResponse { revision }))
    }

    async fn change_peers(&self, request: Request<ChangePeersRequest>) -> Result<Response<ChangePeersResponse>, Status> {
        calling_node(&request)?;
        let ChangePeersRequest { group_id, changes, placement_term, expect_voters } = request.into_inner();
        if changes.is_empty() || group_id == PLACEMENT_GROUP_ID {
            return Err(invalid_argument("a peer change names at least one change of a shard group"));
        }
        if expect_voters.len() > warden_engine::host::conf_fence::EXPECT_VOTERS_MAX {
            return Err(invalid_argument(format!("a peer change expects at most {} voters", warden_engine::host::conf_fence::EXPECT_VOTERS_MAX)));
        }
        let mut singles = Vec::with_capacity(changes.len());
        for change in changes {
            let kind = match peer_change::Kind::try_from(change.kind) {
                Ok(peer_change::Kind::AddLearner) => ConfChangeType::AddLearnerNode,
                Ok(peer_change::Kind::AddVoter) => ConfChangeType::AddNode,
                Ok(peer_change::Kind::Remove) => ConfChangeType::RemoveNode,
                Err(_) => return Err(invalid_argument(format!("unknown peer change kind {}", change.kind))),
            };
            if change.node_id == 0 {
                return Err(invalid_argument("node id 0 is raft's no-peer"));
            }
            let mut single = ConfChangeSingle::default();
            single.set_change_type(kind);
            single.node_id = change.node_id;
            singles.push(single);
        }
        // Checked by every replica when the change applies (`host/conf_fence.rs`). A sender of
        // an earlier release names term 0 and no voters: refused once the group is fenced.
        let context = warden_engine::host::conf_fence::ConfChangeFence { term: placement_term, expect_voters }.encode();
        let change = ConfChangeV2 { changes: singles.into(), context: context.into(), ..ConfChangeV2::default() };
        let conf = self.node.conf_change(group_id, change, self.timeout).await.map_err(|e| engine_status(&self.directory, group_id, e))?;
        Ok(Response::new(ChangePeersResponse { voters: conf.voters, learners: conf.learners }))
    }

    async fn transfer_leader(&self, request: Request<TransferLeaderRequest>) -> Result<Response<TransferLeaderResponse>, Status> {
        calling_node(&request)?;
        let TransferLeaderRequest { group_id, to } = request.into_inner();
        self.node.transfer_leader(group_id, to).await.map_err(|e| engine_status(&self.directory, group_id, e))?;
        Ok(Response::new(TransferLeaderResponse {}))
    }

    async fn replica_status(&self, request: Request<ReplicaStatusRequest>) -> Result<Response<ReplicaStatusResponse>, Status> {
        self.require_admin(&request, "/", false)?;
        let group_id = request.into_inner().group_id;
        let s = self.node.status(group_id).await.map_err(|e| engine_status(&self.directory, group_id, e))?;
        Ok(Response::new(ReplicaStatusResponse {
            group_id,
            node_id: s.node_id,
            term: s.term,
            leader_id: s.leader_id,
            commit: s.commit,
            applied: s.applied,
            last_index: s.last_index,
            voters: s.voters,
            learners: s.learners,
            hibernating: s.asleep,
            failure: s.failure.unwrap_or_default(),
        }))
    }

    async fn set_node_state(&self, request: Request<SetNodeStateRequest>) -> Result<Response<SetNodeStateResponse>, Status> {
        self.require_admin(&request, "/", false)?;
        let SetNodeStateRequest { node_id, state } = request.into_inner();
        let state = match ProtoNodeState::try_from(state) {
            Ok(ProtoNodeState::Serving) => NodeState::Serving,
            Ok(ProtoNodeState::Draining) => NodeState::Draining,
            Ok(ProtoNodeState::Decommissioning) => NodeState::Decommissioning,
            // Only the scheduler makes a tombstone, once the node hosts nothing.
            Ok(ProtoNodeState::Tombstone) | Err(_) => return Err(invalid_argument("a node can be set serving, draining or decommissioning")),
        };
        self.ensure_leader()?;
        match self.propose(&Command::SetNodeState { id: node_id, state }).await? {
            Outcome::NodeStateSet(node) => Ok(Response::new(SetNodeStateResponse { node: Some(node_entry(&node)) })),
            other => Err(internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn set_scheduler_paused(&self, request: Request<SetSchedulerPausedRequest>) -> Result<Response<SetSchedulerPausedResponse>, Status> {
        self.require_admin(&request, "/", false)?;
        let paused = request.into_inner().paused;
        self.propose(&Command::SetSchedulerPaused { paused }).await?;
        Ok(Response::new(SetSchedulerPausedResponse {}))
    }

    async fn change_acl(&self, request: Request<ChangeAclRequest>) -> Result<Response<ChangeAclResponse>, Status> {
        self.require_admin(&request, &request.get_ref().prefix, false)?;
        let ChangeAclRequest { prefix, principal, permissions, revoke } = request.into_inner();
        self.acl_changed(self.propose(&Command::ChangeAcl { prefix, principal, permissions, revoke }).await?)
    }

    async fn change_acl_group(&self, request: Request<ChangeAclGroupRequest>) -> Result<Response<ChangeAclResponse>, Status> {
        self.require_admin(&request, "/", false)?;
        let ChangeAclGroupRequest { group, principal, remove } = request.into_inner();
        self.acl_changed(self.propose(&Command::ChangeAclGroup { group, principal, remove }).await?)
    }

    async fn list_acl(&self, request: Request<ListAclRequest>) -> Result<Response<AclState>, Status> {
        let seen_by = match peer_identity(&request).map(|identity| identity.role) {
            Some(Role::Node | Role::Router) => None,
            _ => caller(&request)?.principal().map(str::to_string),
        };
        let state = self.state().await?;
        let list = match seen_by {
            Some(principal) => state.acl().visible_to(&principal),
            None => state.acl().clone(),
        };
        Ok(Response::new(acl_to_proto(&list)))
    }

    async fn set_limits(&self, request: Request<SetLimitsRequest>) -> Result<Response<warden_proto::v1::ApplyLimits>, Status> {
        self.require_admin(&request, "/", false)?;
        let changes = request.into_inner().changes.unwrap_or_default();
        Ok(Response::new(self.change_limits(&changes).await?))
    }

    type BackupGroupStream = super::backup::BackupStream;

    async fn backup_group(&self, request: Request<BackupGroupRequest>) -> Result<Response<Self::BackupGroupStream>, Status> {
        self.require_admin(&request, "/", false)?;
        Ok(Response::new(self.backup_stream(request.into_inner()).await?))
    }

    async fn restore_page(&self, request: Request<RestorePageRequest>) -> Result<Response<RestorePageResponse>, Status> {
        self.require_admin(&request, "/", false)?;
        let RestorePageRequest { group_id, page } = request.into_inner();
        let page = page.ok_or_else(|| invalid_argument("a restore request carries a page"))?;
        if group_id == PLACEMENT_GROUP_ID {
            return Err(invalid_argument("placement's state is restored through its API"));
        }
        let revision = self.propose_namespace_txn(group_id, CommandOp::RestorePage(page)).await?;
        Ok(Response::new(RestorePageResponse { revision }))
    }

    async fn get_limits(&self, request: Request<GetLimitsRequest>) -> Result<Response<warden_proto::v1::ApplyLimits>, Status> {
        self.require_admin(&request, "/", false)?;
        Ok(Response::new(super::limits::cluster_limits(&self.state().await?)?))
    }

    async fn set_quota(&self, request: Request<SetQuotaRequest>) -> Result<Response<QuotaState>, Status> {
        // Administered from above the prefix: a tenant's admin does not lift its own quota.
        self.require_admin(&request, acl::quota_authority(&request.get_ref().prefix), false)?;
        self.ensure_leader()?;
        let SetQuotaRequest { prefix, limits, remove } = request.into_inner();
        let limits = (!remove).then(|| super::quota::limits_from_proto(limits.as_ref()));
        let version = match self.propose(&Command::SetQuota { prefix: prefix.clone(), limits }).await? {
            Outcome::QuotaShareVersion(version) => version,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        Ok(Response::new(self.share_out(&prefix, version).await?))
    }

    async fn list_quotas(&self, request: Request<ListQuotasRequest>) -> Result<Response<QuotaList>, Status> {
        let seen_by = match peer_identity(&request).map(|identity| identity.role) {
            Some(Role::Node | Role::Router) => None,
            _ => caller(&request)?.principal().map(str::to_string),
        };
        let acl = self.acl.get();
        let shown = |prefix: &str| seen_by.as_ref().is_none_or(|principal| acl.allows(principal, prefix, acl::ADMIN));
        Ok(Response::new(QuotaList { quotas: self.quota_states(shown).await? }))
    }

    async fn request_quota(&self, request: Request<RequestQuotaRequest>) -> Result<Response<RequestQuotaResponse>, Status> {
        calling_node(&request)?;
        self.ensure_leader()?;
        let RequestQuotaRequest { group_id, prefix, kind, need } = request.into_inner();
        let kind = usize::try_from(kind).ok().filter(|kind| *kind < warden_placement::quota::COUNTED_KINDS);
        let kind = kind.ok_or_else(|| invalid_argument("only nodes, bytes, sessions and lock waiters are shared among groups"))?;
        Ok(Response::new(RequestQuotaResponse { granted: self.grant(group_id, &prefix, kind, need.max(1)).await? }))
    }

    async fn set_quota_share(&self, request: Request<SetQuotaShareRequest>) -> Result<Response<warden_proto::namespace::QuotaShare>, Status> {
        calling_node(&request)?;
        let SetQuotaShareRequest { group_id, share } = request.into_inner();
        let share = share.ok_or_else(|| invalid_argument("no share"))?;
        match self.propose_namespace(group_id, CommandOp::SetQuotaShare(share)).await? {
            CommandOutcome::QuotaShare(record) => Ok(Response::new(record)),
            other => Err(internal(format!("unexpected outcome of a quota share: {other:?}"))),
        }
    }

    async fn remove_group(&self, request: Request<RemoveGroupRequest>) -> Result<Response<RemoveGroupResponse>, Status> {
        self.require_admin(&request, &request.get_ref().prefix, false)?;
        let prefix = request.into_inner().prefix;
        self.ensure_leader()?;
        // One lifecycle change at a time (a creation below this prefix is refused in step 1).
        let _lifecycle = self.lifecycle.lock().await;
        self.settle_creations().await?;
        let state = self.state().await?;
        let Some(group) = state.groups().values().find(|g| g.prefix == prefix).cloned() else {
            return Err(status(WardenError {
                code: Code::NoNode as i32,
                path: prefix.clone(),
                message: format!("no group has the prefix {prefix}"),
                ..WardenError::default()
            }));
        };
        if !self.running.claim(group.id) {
            return Err(busy(group.id));
        }
        let removed = self.remove_claimed(&state, &group).await;
        self.running.release(group.id);
        Ok(Response::new(removed?))
    }

    async fn create_replica(&self, request: Request<CreateReplicaRequest>) -> Result<Response<CreateReplicaResponse>, Status> {
        calling_node(&request)?;
        let request = request.into_inner();
        if request.campaign && request.voters.is_empty() {
            return Err(invalid_argument("a replica without voters waits for a snapshot and cannot campaign"));
        }
        // No voters: a replica added to a running group, empty until its snapshot arrives.
        match self.node.create_group(request.group_id, request.voters).await {
            // Idempotent: a retried creation finds its replica.
            Ok(()) | Err(EngineError::GroupExists(_)) => {}
            Err(error) => return Err(engine_status(&self.directory, request.group_id, error)),
        }
        if request.campaign {
            self.node.campaign(request.group_id).await.map_err(|e| engine_status(&self.directory, request.group_id, e))?;
        }
        Ok(Response::new(CreateReplicaResponse {}))
    }
}
