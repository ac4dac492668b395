//! `warden.placement.Placement`, served by every shard-node. Reads of the routing table are
//! linearizable reads of the placement group; changes are proposed to it, so they are
//! answered by its leader (elsewhere: NOT_LEADER with the leader's address).
//!
//! By concern:
//! - [`api`]: the RPCs, each checking its caller and delegating to one of the below;
//! - [`creation`]: creating a group (and bootstrapping the root group), the sequence the
//!   placement leader runs, resumed or rolled back when left half-way;
//! - [`removal`]: removing a group, giving its prefix back to its parent path's group;
//! - [`group_calls`]: calls to the groups themselves: namespace queries and commands of a
//!   hosted group, and calls only a group's leader answers;
//! - [`liveness`]: the heartbeats of registered nodes, written to placement's log in batches;
//! - [`wire`]: wire forms (descriptors, the routing table) and the typed refusals.
//!
//! Splits, merges, quotas, limits, backups and the scheduler are the sibling modules of
//! `placement/`; they use this service's plumbing (`propose`, `state`, `ensure_leader`).

mod api;
mod creation;
mod group_calls;
mod liveness;
mod removal;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Status};
use warden_access::AclCache;
use warden_placement::{acl, Command, Outcome, Placement, PlacementConfig, PLACEMENT_GROUP_ID};
use warden_proto::channel::{ChannelCache, ChannelSettings};
use warden_proto::placement::placement_server::PlacementServer;
use warden_proto::placement::RoutingTable;
use warden_proto::tls::{caller, peer_identity, Caller, Expected, Role, Tls};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use super::scheduler::{LeadersHeard, Running};
use super::state_machine::{decode_result, decode_state, encode_command};
use crate::service::{engine_status, status};
use warden_engine::error::EngineError;
use warden_engine::host::{NodeHandle, ReadConsistency};
use warden_engine::transport::PeerDirectory;

pub use liveness::HEARTBEATS_FLUSH_INTERVAL;
pub(crate) use wire::internal;
pub(super) use wire::{busy, invalid_argument, now_ms, placement_status};
pub use wire::{descriptor_proto, routing_table};

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
    /// Registered nodes heard from since placement's log last recorded their heartbeats.
    heartbeats_heard: Arc<liveness::HeartbeatsHeard>,
    /// Groups with a scheduler operator running from this node.
    pub(super) running: Arc<Running>,
    /// Fault injection (tests): where a split stops (`split.rs`).
    pub(super) faults: Arc<warden_engine::transport::NetFaults>,
    /// Channels for this node's calls to other nodes (over its TLS when on), one per address.
    channels: Arc<ChannelCache>,
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
            channels: Arc::new(ChannelCache::new(security.tls, ChannelSettings::new(Expected::AnyNode).with_connect_timeout(Duration::from_secs(1)))),
            acl: security.acl,
            node,
            directory,
            timeout,
            routing_versions,
            config,
            lifecycle: Arc::default(),
            leaders_heard: Arc::default(),
            heartbeats_heard: Arc::default(),
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
        self.state_as(ReadConsistency::Linearizable).await
    }

    /// The placement state, read with `consistency`.
    pub(super) async fn state_as(&self, consistency: ReadConsistency) -> Result<Placement, Status> {
        let bytes = self
            .node
            .read(PLACEMENT_GROUP_ID, Vec::new(), consistency, self.timeout)
            .await
            .map_err(|e| engine_status(&self.directory, PLACEMENT_GROUP_ID, e))?;
        // The configuration only steers the leader's decisions, not what the table says.
        decode_state(&bytes, self.config.clone()).map_err(internal)
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
}
