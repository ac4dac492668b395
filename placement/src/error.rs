//! Why placement refuses a command or a snapshot. A refused command changes nothing.

use serde::{Deserialize, Serialize};

use crate::node::{NodeError, NodeState};
use crate::paths::PrefixError;

/// A refusal by [`crate::Placement::apply`] or [`crate::Placement::from_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PlacementError {
    /// Only `Bootstrap` is accepted before the first group exists.
    #[error("placement is not bootstrapped")]
    NotBootstrapped,
    /// `Bootstrap` was already applied.
    #[error("placement is already bootstrapped")]
    AlreadyBootstrapped,
    /// No node has this id.
    #[error("unknown node {0}")]
    UnknownNode(u64),
    /// A node id appears twice in `Bootstrap`.
    #[error("node {0} is listed twice")]
    DuplicateNode(u64),
    /// A node's registration fields are refused.
    #[error("node {id}: {reason}")]
    InvalidNode {
        /// The node id given.
        id: u64,
        /// What is wrong with it.
        reason: NodeError,
    },
    /// No group has this id.
    #[error("unknown group {0}")]
    UnknownGroup(u64),
    /// Another group (ready or being created) already owns this prefix.
    #[error("prefix {prefix} is taken by group {group}")]
    PrefixTaken {
        /// The prefix asked for.
        prefix: String,
        /// The group that has it.
        group: u64,
    },
    /// The prefix is not a valid group prefix.
    #[error("invalid prefix {prefix:?}: {reason}")]
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
        /// What is wrong with it.
        reason: PrefixError,
    },
    /// Fewer eligible (up) nodes than replicas wanted.
    #[error("{wanted} replicas wanted, {up} nodes up")]
    NotEnoughNodes {
        /// Replicas the group needs.
        wanted: usize,
        /// Nodes eligible to host one.
        up: usize,
    },
    /// The group is ready (routed): it can neither become ready again nor be dropped.
    #[error("group {0} is not being created")]
    GroupNotCreating(u64),
    /// Every shard-group id up to `SHARD_GROUP_ID_MAX` has been allocated.
    #[error("shard group ids are exhausted")]
    GroupIdsExhausted,
    /// The group exists but is still being created.
    #[error("group {0} is not ready")]
    GroupNotReady(u64),
    /// The root group owns `/` forever.
    #[error("the root group cannot be removed")]
    RootGroup,
    /// An apply-limits record longer than `APPLY_LIMITS_BYTES_MAX`.
    #[error("an apply-limits record of {0} bytes is too large")]
    LimitsTooLarge(usize),
    /// An etcd auth record longer than `ETCD_AUTH_BYTES_MAX`.
    #[error("an etcd auth record of {0} bytes is too large")]
    EtcdAuthTooLarge(usize),
    /// The etcd auth record changed since the version a change was made from.
    #[error("the etcd auth record is at version {current}, not {expected}")]
    EtcdAuthStale {
        /// The version the change was made from.
        expected: u64,
        /// The record's version.
        current: u64,
    },
    /// The node was decommissioned: it may not come back, and its id is not reused.
    #[error("node {0} is a tombstone (decommissioned)")]
    NodeTombstoned(u64),
    /// The node state change is not allowed.
    #[error("node {id} cannot go from {from:?} to {to:?}")]
    NodeStateChange {
        /// The node.
        id: u64,
        /// Its state.
        from: NodeState,
        /// The state asked for.
        to: NodeState,
    },
    /// The node still hosts a replica (of `group`, at least).
    #[error("node {id} still hosts a replica of group {group}")]
    NodeNotEmpty {
        /// The node.
        id: u64,
        /// A group it hosts.
        group: u64,
    },
    /// The node is down or not `Serving`, so it takes no new replica.
    #[error("node {0} is down or not serving")]
    NodeNotServing(u64),
    /// The node already hosts a replica of the group.
    #[error("node {node} already hosts a replica of group {group}")]
    ReplicaExists {
        /// The group.
        group: u64,
        /// The node.
        node: u64,
    },
    /// No group has this exact prefix.
    #[error("no group has the prefix {0}")]
    NoGroupAt(String),
    /// The group is not merging.
    #[error("group {0} is not merging")]
    NotMerging(u64),
    /// Another replica change (or group creation below it) is in progress on the group.
    #[error("group {group} has a change in progress (learner {learner})")]
    ChangeInProgress {
        /// The group.
        group: u64,
        /// Its learner (0: a creation below it).
        learner: u64,
    },
    /// The node is not a learner of the group.
    #[error("node {node} is not a learner of group {group}")]
    NotALearner {
        /// The group.
        group: u64,
        /// The node.
        node: u64,
    },
    /// The node is not a voter of the group.
    #[error("node {node} is not a voter of group {group}")]
    NotAVoter {
        /// The group.
        group: u64,
        /// The node.
        node: u64,
    },
    /// An ACL change was refused.
    #[error(transparent)]
    Acl(#[from] crate::acl::AclError),
    /// A quota change was refused.
    #[error(transparent)]
    Quota(#[from] crate::quota::QuotaError),
    /// A snapshot could not be decoded.
    #[error("bad placement snapshot: {0}")]
    BadSnapshot(String),
    /// The state breaks one of placement's invariants (a corrupt snapshot, or a bug).
    #[error("inconsistent placement state: {0}")]
    Inconsistent(String),
}
