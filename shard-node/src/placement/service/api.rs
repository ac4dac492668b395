//! The RPCs of `warden.placement.Placement`: each checks who calls (an administrator of the
//! prefix, a node, a router) and hands the work to the service's concern modules.

use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2};
use tonic::{Request, Response, Status};
use warden_access::acl_to_proto;
use warden_placement::{acl, Command, NodeState, Outcome, PLACEMENT_GROUP_ID};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::query::Query as NamespaceQuery;
use warden_proto::namespace::query_result::Result as NamespaceAnswer;
use warden_proto::namespace::SetDescriptor;
use warden_proto::placement::placement_server::Placement as PlacementApi;
use warden_proto::placement::NodeState as ProtoNodeState;
use warden_proto::placement::*;
use warden_proto::tls::{caller, calling_node, peer_identity, Role};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use super::wire::{internal, invalid_argument, node_entry, now_ms, routing_table};
use super::{PlacementService, ROUTING_TABLES_QUEUED_MAX};
use crate::placement::heartbeat::GROUPS_PER_HEARTBEAT_MAX;

/// Missing replicas one heartbeat answer tells a node to create, at most (the rest follow in
/// the next answers).
const MISSING_REPLICAS_PER_HEARTBEAT_MAX: usize = 16;
use crate::service::{engine_status, status};
use warden_engine::error::EngineError;
use warden_engine::host::ReadConsistency;

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
        self.run_creation(prefix).await
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
        // Only placement's leader takes heartbeats: elsewhere NOT_LEADER names it.
        self.ensure_leader()?;
        // What this replica applied answers a registered node. The one part a node acts on
        // for good, the groups it should destroy, stays true of any later state (placement
        // never reuses a group id below its next one); the rest (peers' addresses, the ACL
        // and limits, newer versions only) is refreshed by the next heartbeat.
        let mut state = self.state_as(ReadConsistency::Stale).await?;
        if super::liveness::only_alive(&state, node_id, &request.addr, &request.zone) {
            self.heartbeats_heard.record(node_id);
        } else {
            let command = Command::RegisterNode { id: node_id, addr: request.addr, zone: request.zone, now_ms: now_ms() };
            self.propose(&command).await?;
            state = self.state().await?;
        }
        self.leaders_heard.record(node_id, request.led_groups);
        // Placement records a group before any replica of it exists and never reuses an id:
        // a hosted group below the next id that placement does not have is gone for good.
        let removed_groups = request
            .hosted_groups
            .iter()
            .copied()
            .filter(|group| *group != PLACEMENT_GROUP_ID && *group < state.next_group_id() && state.group(*group).is_none())
            .collect();
        // Replicas a creation went on without: judged again on a linearizable read before
        // the node is told, since a stale state may not show a move that already took the
        // replica away. A truncated `hosted_groups` cannot show what is missing.
        let mut missing_replicas = Vec::new();
        if request.hosted_groups.len() < GROUPS_PER_HEARTBEAT_MAX {
            let hosted = &request.hosted_groups;
            if !super::creation::missing_replicas(&state, node_id, hosted, MISSING_REPLICAS_PER_HEARTBEAT_MAX).is_empty() {
                state = self.state().await?;
                missing_replicas = super::creation::missing_replicas(&state, node_id, hosted, MISSING_REPLICAS_PER_HEARTBEAT_MAX);
            }
        }
        // The ACL goes only to a node that has an older one.
        let acl = (state.acl().version() > request.acl_version).then(|| acl_to_proto(state.acl()));
        // So do the apply limits.
        let limits = (state.apply_limits().version > request.limits_version).then(|| crate::placement::limits::cluster_limits(&state)).transpose()?;
        Ok(Response::new(HeartbeatResponse {
            routing_version: state.routing_version(),
            nodes: state.nodes().values().map(node_entry).collect(),
            removed_groups,
            acl,
            limits,
            missing_replicas,
        }))
    }

    async fn bootstrap(&self, request: Request<BootstrapRequest>) -> Result<Response<BootstrapResponse>, Status> {
        calling_node(&request)?;
        Ok(Response::new(BootstrapResponse { root: Some(self.bootstrap_root().await?) }))
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

    type BackupGroupStream = crate::placement::backup::BackupStream;

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

    async fn get_etcd_auth(&self, request: Request<GetEtcdAuthRequest>) -> Result<Response<EtcdAuthRecord>, Status> {
        require_router_or_node(&request)?;
        let record = self.state().await?.etcd_auth().clone();
        Ok(Response::new(EtcdAuthRecord { version: record.version, encoded: record.encoded }))
    }

    async fn set_etcd_auth(&self, request: Request<SetEtcdAuthRequest>) -> Result<Response<EtcdAuthRecord>, Status> {
        require_router_or_node(&request)?;
        self.ensure_leader()?;
        let SetEtcdAuthRequest { expected_version, encoded } = request.into_inner();
        match self.propose(&Command::SetEtcdAuth { expected_version, encoded: encoded.clone() }).await? {
            Outcome::EtcdAuthVersion(version) => Ok(Response::new(EtcdAuthRecord { version, encoded })),
            other => Err(internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn get_limits(&self, request: Request<GetLimitsRequest>) -> Result<Response<warden_proto::v1::ApplyLimits>, Status> {
        self.require_admin(&request, "/", false)?;
        Ok(Response::new(crate::placement::limits::cluster_limits(&self.state().await?)?))
    }

    async fn set_quota(&self, request: Request<SetQuotaRequest>) -> Result<Response<QuotaState>, Status> {
        // Administered from above the prefix: a tenant's admin does not lift its own quota.
        self.require_admin(&request, acl::quota_authority(&request.get_ref().prefix), false)?;
        self.ensure_leader()?;
        let SetQuotaRequest { prefix, limits, remove } = request.into_inner();
        let limits = (!remove).then(|| crate::placement::quota::limits_from_proto(limits.as_ref()));
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
        Ok(Response::new(self.run_removal(prefix).await?))
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

impl PlacementService {
    /// The answer to an ACL change.
    fn acl_changed(&self, outcome: Outcome) -> Result<Response<ChangeAclResponse>, Status> {
        match outcome {
            Outcome::AclChanged(version) => Ok(Response::new(ChangeAclResponse { version })),
            other => Err(internal(format!("unexpected outcome {other:?}"))),
        }
    }
}

/// Admits routers and nodes only (with TLS; without it nobody is authenticated): the etcd
/// auth record holds password hashes, and routers check their callers' rights themselves.
fn require_router_or_node<T>(request: &Request<T>) -> Result<(), Status> {
    let Some(peer) = request.extensions().get::<warden_proto::tls::PeerInfo>() else { return Ok(()) };
    match peer.identity.as_ref().map(|identity| identity.role) {
        _ if !peer.tls => Ok(()),
        Some(Role::Router | Role::Node) => Ok(()),
        _ => Err(Status::permission_denied("only routers and nodes read or change the etcd auth record")),
    }
}
