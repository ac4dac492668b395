//! Wire forms of placement's state (descriptors, nodes, the routing table) and the typed
//! refusals of the placement service.

use tonic::Status;
use warden_access::acl_to_proto;
use warden_placement::quota::QuotaError;
use warden_placement::{GroupDescriptor, NodeState, Placement, PlacementError};
use warden_proto::placement::NodeState as ProtoNodeState;
use warden_proto::placement::{GroupEntry, NodeEntry, RoutingTable};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use crate::service::status;

/// Milliseconds since the Unix epoch by this node's stepless clock
/// (`warden_engine::wall_clock::stepless_ms`): the time placement's leader stamps on the
/// commands it proposes and judges which nodes are silent by. Not the wall clock: a step of
/// it between a heartbeat's stamp and the judgement would mark every node down at once.
pub(crate) fn now_ms() -> u64 {
    warden_engine::wall_clock::stepless_ms()
}

/// An unexpected failure, as a status of code UNKNOWN.
pub(crate) fn internal(error: impl std::fmt::Display) -> Status {
    status(WardenError { code: Code::Unknown as i32, message: error.to_string(), ..WardenError::default() })
}

/// The typed status of a refused placement command.
pub(crate) fn placement_status(error: PlacementError) -> Status {
    let code = match &error {
        PlacementError::InvalidPrefix { .. } => Code::InvalidPath,
        PlacementError::PrefixTaken { .. } | PlacementError::AlreadyBootstrapped | PlacementError::DuplicateNode(_) => Code::NodeExists,
        PlacementError::NotBootstrapped | PlacementError::NotEnoughNodes { .. } => Code::Unavailable,
        PlacementError::GroupIdsExhausted | PlacementError::LimitsTooLarge(_) | PlacementError::EtcdAuthTooLarge(_) => Code::TooLarge,
        // Lost a race with another router's change: the router reads again and retries.
        PlacementError::EtcdAuthStale { .. } => Code::BadVersion,
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
pub(crate) fn busy(group: u64) -> Status {
    status(WardenError { code: Code::Unavailable as i32, message: format!("group {group} is moving a replica; try again"), ..WardenError::default() })
}

/// The descriptor that retires `group_id` (removed or merged away): its next version,
/// excluding its own prefix, so it serves nothing.
pub(crate) fn retiring_descriptor(state: &Placement, group_id: u64) -> Result<GroupDescriptor, Status> {
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
pub(super) fn node_entry(node: &warden_placement::NodeInfo) -> NodeEntry {
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

/// A refusal of an argument, as a status of code INVALID_ARGUMENT.
pub(crate) fn invalid_argument(message: impl Into<String>) -> Status {
    status(WardenError { code: Code::InvalidArgument as i32, message: message.into(), ..WardenError::default() })
}
