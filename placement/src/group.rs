//! Shard groups: their ids, epochs, what placement records about them ([`GroupInfo`]) and
//! what a group serves ([`GroupDescriptor`], checked with [`serves`]).

use serde::{Deserialize, Serialize};

use crate::paths::is_at_or_below;

/// The placement group's own id. Outside the shard-group id range (shard ids fit in 24 bits,
/// since a session id carries its home group in its high 24 bits), so it never collides.
pub const PLACEMENT_GROUP_ID: u64 = 1 << 32;
/// The first shard group, created by `Bootstrap`; it owns `/` forever.
pub const ROOT_GROUP_ID: u64 = 1;
/// Highest shard-group id `CreateGroup` allocates (24 bits).
pub const SHARD_GROUP_ID_MAX: u64 = (1 << 24) - 1;

pub use warden_paths::{home_group, SESSION_SEQUENCE_BITS};

/// The id of the `sequence`-th session of `group`.
pub fn session_id(group: u64, sequence: u64) -> u64 {
    (group << SESSION_SEQUENCE_BITS) | (sequence & ((1 << SESSION_SEQUENCE_BITS) - 1))
}

/// A group's version, carried in requests so a replica can refuse stale routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epoch {
    /// Grows when the group's replica set changes (a learner added, promoted or removed).
    pub conf_ver: u64,
    /// Grows when the set of paths the group serves changes.
    pub version: u64,
}

impl Epoch {
    /// The epoch of a new group.
    pub const INITIAL: Epoch = Epoch { conf_ver: 1, version: 1 };

    /// Whether `self` comes after `other` in one group's history: neither counter is behind
    /// and at least one is ahead. (Both counters only grow, so any two epochs of one group
    /// are ordered this way.)
    pub fn is_newer_than(&self, other: &Epoch) -> bool {
        self.conf_ver >= other.conf_ver && self.version >= other.version && self != other
    }
}

/// A shard group as placement records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The group id (raft group id on every shard-node).
    pub id: u64,
    /// The subtree the group owns (see [`GroupDescriptor`] for the carve-outs).
    pub prefix: String,
    /// Node ids of its voting replicas, in the order the placement policy picked them (a
    /// replacement takes the place of the replica it replaced).
    pub replicas: Vec<u64>,
    /// Replicas being added (at most one): recorded before the node creates the replica, so
    /// a node hosting a replica placement does not list knows it is stale. A learner is
    /// promoted (replacing a voter in one joint change) or removed.
    #[serde(default)]
    pub learners: Vec<u64>,
    /// Its current epoch.
    pub epoch: Epoch,
    /// The group has a leader and its route is committed; until then no path routes to it.
    pub ready: bool,
    /// While it is being created by a split (`Command::SplitGroup`): the group whose existing
    /// subtree it takes over, with its data. `None` once ready, and for an empty new group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_from: Option<u64>,
    /// While it gives its whole subtree back to the group serving its parent path
    /// (`Command::MergeGroup`); `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merging: Option<Merging>,
    /// Merged away (`Command::RetireGroup`): no route, it serves no path (its descriptor
    /// excludes its own prefix), and it stays only as the home of the sessions it homes,
    /// until they end (`RemoveGroup`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
}

/// A merge in progress (`Command::MergeGroup`, run by `shard-node/src/placement/merge.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Merging {
    /// The operation's id, taken from the group ids (so operations, splits included, only
    /// grow): the groups' logs use it to settle the merge exactly once.
    pub operation: u64,
    /// The group serving the parent path, which takes the subtree.
    pub into: u64,
}

impl GroupInfo {
    /// Whether `node` hosts (or is about to host) a replica of the group: a voter or a learner.
    pub fn has_member(&self, node: u64) -> bool {
        self.replicas.contains(&node) || self.learners.contains(&node)
    }

    /// Voters and learners.
    pub fn members(&self) -> impl Iterator<Item = u64> + '_ {
        self.replicas.iter().chain(&self.learners).copied()
    }
}

/// What a shard group serves: every path at or below `prefix` except the paths at or below
/// any `excluded` prefix (subtrees routed to other ready groups). A shard-node checks each
/// request against it and returns it in `WrongGroup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDescriptor {
    /// The group id.
    pub id: u64,
    /// The subtree the group owns.
    pub prefix: String,
    /// Prefixes of the ready groups directly carved out of the subtree, sorted.
    pub excluded: Vec<String>,
    /// Node ids of its replicas.
    pub replicas: Vec<u64>,
    /// The epoch the descriptor is valid for.
    pub epoch: Epoch,
}

/// Whether the group described by `descriptor` serves `path` (segment-wise: `/ab` is not
/// below `/a`).
pub fn serves(descriptor: &GroupDescriptor, path: &str) -> bool {
    is_at_or_below(path, &descriptor.prefix) && !descriptor.excluded.iter().any(|excluded| is_at_or_below(path, excluded))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_are_ordered_componentwise() {
        let base = Epoch { conf_ver: 2, version: 3 };
        assert!(Epoch { conf_ver: 3, version: 3 }.is_newer_than(&base));
        assert!(Epoch { conf_ver: 2, version: 4 }.is_newer_than(&base));
        assert!(Epoch { conf_ver: 3, version: 4 }.is_newer_than(&base));
        assert!(!base.is_newer_than(&base));
        assert!(!Epoch { conf_ver: 1, version: 9 }.is_newer_than(&base));
        assert!(!Epoch { conf_ver: 9, version: 1 }.is_newer_than(&base));
        assert!(!Epoch::INITIAL.is_newer_than(&base));
    }

    #[test]
    fn serves_respects_exclusions_and_segments() {
        let descriptor = GroupDescriptor { id: 2, prefix: "/a".into(), excluded: vec!["/a/b".into()], replicas: vec![1], epoch: Epoch::INITIAL };
        assert!(serves(&descriptor, "/a"));
        assert!(serves(&descriptor, "/a/c"));
        assert!(serves(&descriptor, "/a/bc"));
        assert!(!serves(&descriptor, "/a/b"));
        assert!(!serves(&descriptor, "/a/b/c"));
        assert!(!serves(&descriptor, "/ab"));
        assert!(!serves(&descriptor, "/"));
    }

    #[test]
    fn reserved_ids_do_not_collide() {
        const { assert!(PLACEMENT_GROUP_ID > SHARD_GROUP_ID_MAX) };
        const { assert!(SHARD_GROUP_ID_MAX < 1 << (64 - SESSION_SEQUENCE_BITS)) };
        const { assert!(ROOT_GROUP_ID <= SHARD_GROUP_ID_MAX) };
    }
}
