//! Warden's placement: the state machine of the placement group and its replica policy.
//!
//! Warden shards its namespace by path prefix across many shard groups (5-replica Raft
//! groups). One small Raft group, the placement group, replicates this crate's [`Placement`]:
//! the registered nodes and their liveness, every shard group (prefix, replicas, [`Epoch`],
//! ready or being created), and the routing table from prefix to ready group. A path belongs
//! to the ready group with the longest prefix at or above it, by segments
//! ([`Placement::route`]); a group's [`GroupDescriptor`] is its prefix minus the subtrees
//! carved out for groups below it, and [`serves`] is the check a shard-node makes on every
//! request (`WrongGroup` carries the current descriptor).
//!
//! Commands ([`Command`]) go through [`Placement::apply`], which either changes the state and
//! returns an [`Outcome`] or refuses with a typed [`PlacementError`] and changes nothing.
//! A group's life: `CreateGroup` allocates an id and picks replicas ([`Placement::pick_replicas`]:
//! up nodes, spread over zones, least loaded first); once the shard-nodes have created the
//! replicas and elected a leader, `GroupReady` commits its route and bumps the epoch version
//! of the groups it carves paths out of; a creation that fails ends with `DropGroup`.
//!
//! Modules: `paths` (prefix rules and the "at or below" relation), `node` and `group` (the
//! domain types), `state` ([`Placement`], snapshots, invariants), `command` (commands and
//! apply), `query` (routing and descriptors), `policy` (replica placement), `schedule` (repair,
//! drain and balance: [`Placement::schedule`] plans [`Operator`]s for the placement leader).
//!
//! **Architecture invariant:** only the placement group writes the routing table: nothing but
//! [`Placement::apply`] changes a [`Placement`], and routers and shard-nodes hold copies only.
//! **Architecture invariant:** this crate does no I/O and reads no clock: time comes in
//! commands (`now_ms`, stamped by the placement leader), so apply is deterministic and every
//! replica reaches the same state. Liveness is judged by the leader
//! ([`Placement::nodes_to_mark_down`]) and proposed as `MarkDown`, which apply re-checks
//! against the command's own time.

pub mod acl;
mod command;
mod error;
pub mod etcd_auth;
pub mod etcd_keys;
mod group;
pub mod limits;
mod node;
mod paths;
mod policy;
mod query;
pub mod quota;
mod schedule;
mod state;

pub use acl::{Acl, AclError, Grant};
pub use command::{Command, Outcome};
pub use error::PlacementError;
pub use group::{
    home_group, serves, session_id, Epoch, GroupDescriptor, GroupInfo, Merging, PLACEMENT_GROUP_ID, ROOT_GROUP_ID, SESSION_SEQUENCE_BITS,
    SHARD_GROUP_ID_MAX,
};
pub use node::{NodeError, NodeInfo, NodeState, ADDR_BYTES_MAX, ZONE_BYTES_MAX};
pub use paths::{
    is_at_or_below, is_strictly_below, join, name, parent, subtree_end, validate_path, validate_prefix, PathError, PrefixError, PATH_BYTES_MAX,
    PATH_DEPTH_MAX,
};
pub use schedule::{MoveReason, Operator, ScheduleLimits};
pub use state::{AppliedSettings, AutoSplit, Placement, PlacementConfig};

#[cfg(test)]
mod testutil {
    //! Builders shared by the unit tests.

    use crate::{AppliedSettings, Command, Outcome, Placement, PlacementConfig};

    /// A `Bootstrap` at time 0 of nodes `(id, zone)`, addresses `n<id>:7000`.
    pub fn bootstrap_command(nodes: &[(u64, &str)]) -> Command {
        let nodes = nodes.iter().map(|(id, zone)| (*id, format!("n{id}:7000"), zone.to_string())).collect();
        Command::Bootstrap { nodes, now_ms: 0, limits: Vec::new(), settings: None }
    }

    /// A state bootstrapped at time 0 with nodes 1..=`nodes`, all in zone "z", and
    /// `replicas` replicas per group.
    pub fn bootstrapped(nodes: u64, replicas: usize) -> Placement {
        let config = PlacementConfig { replicas_per_group: replicas, ..PlacementConfig::default() };
        let mut placement = Placement::new(config);
        let ids: Vec<(u64, &str)> = (1..=nodes).map(|id| (id, "z")).collect();
        let Command::Bootstrap { nodes, now_ms, limits, .. } = bootstrap_command(&ids) else { unreachable!() };
        let settings = Some(AppliedSettings::of(placement.config()));
        placement.apply(&Command::Bootstrap { nodes, now_ms, limits, settings }).unwrap();
        placement
    }

    /// Creates a group for `prefix` at time 0 and makes it ready; returns its id.
    pub fn create_ready(placement: &mut Placement, prefix: &str) -> u64 {
        let created = placement.apply(&Command::CreateGroup { prefix: prefix.into(), now_ms: 0 }).unwrap();
        let Outcome::GroupCreated(group) = created else { panic!("{created:?}") };
        placement.apply(&Command::GroupReady { group_id: group.id }).unwrap();
        group.id
    }
}
