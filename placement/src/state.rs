//! The placement state ([`Placement`]): nodes, groups and the routing table, with its
//! accessors, snapshot encoding and invariant check. Commands are in `command.rs`, queries in
//! `query.rs`, the replica policy in `policy.rs`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::acl::Acl;
use crate::error::PlacementError;
use crate::etcd_auth::EtcdAuthRecord;
use crate::group::{GroupInfo, ROOT_GROUP_ID, SHARD_GROUP_ID_MAX};
use crate::limits::ApplyLimitsRecord;
use crate::node::{validate_node, NodeInfo, NodeState};
use crate::paths::validate_prefix;
use crate::quota::Quotas;

/// Local settings of a placement replica. Not replicated state: every replica of the
/// placement group must be given the same values, and snapshots do not carry them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementConfig {
    /// Replicas of each new group (a value of 0 is treated as 1), as this node would propose
    /// them at bootstrap: apply and the scheduler read the recorded [`AppliedSettings`].
    pub replicas_per_group: usize,
    /// A node whose last heartbeat is this old may be marked down, as this node would
    /// propose it at bootstrap (see `replicas_per_group`).
    pub heartbeat_timeout_ms: u64,
    /// A node silent this long is given up on: the scheduler repairs every group with a
    /// replica there (`warden node --down-after-ms`).
    pub down_after_ms: u64,
    /// Auto-split (`warden node --auto-split`): a top-level child of a group's prefix taking
    /// at least this many writes per second for [`AutoSplit::windows`] windows in a row is
    /// proposed for a split. `None`: off.
    #[serde(default)]
    pub auto_split: Option<AutoSplit>,
}

/// When the placement leader proposes (and maybe performs) the split of a hot subtree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoSplit {
    /// Writes per second a subtree must take to count as hot.
    pub writes_per_s: u64,
    /// How long each measurement lasts.
    pub window_ms: u64,
    /// Windows in a row a subtree must be hot before its split is proposed.
    pub windows: u32,
    /// Perform the proposed split (otherwise it is only logged).
    pub perform: bool,
}

impl AutoSplit {
    /// Hot above `writes_per_s` for three 10 s windows in a row.
    pub fn new(writes_per_s: u64, perform: bool) -> AutoSplit {
        AutoSplit { writes_per_s, window_ms: 10_000, windows: 3, perform }
    }
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig { replicas_per_group: 5, heartbeat_timeout_ms: 10_000, down_after_ms: 60_000, auto_split: None }
    }
}

/// What apply reads besides its command and the state: recorded by
/// `Bootstrap` from the bootstrapping binary (its [`PlacementConfig`] and its defaults), so
/// replicas running another release, whose defaults differ, apply every command alike. A
/// field missing from a record (one a later release adds) means the first release's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppliedSettings {
    /// Replicas of each new group (0 is treated as 1).
    pub replicas_per_group: usize,
    /// A node whose last heartbeat is this old is stale: no new replica goes there, and the
    /// leader may mark it down.
    pub heartbeat_timeout_ms: u64,
    /// Subtree quotas kept at most.
    pub quotas_max: usize,
    /// ACL grants kept at most.
    pub acl_grants_max: usize,
    /// ACL groups of principals kept at most.
    pub acl_groups_max: usize,
    /// Members of one ACL group at most.
    pub acl_members_max: usize,
}

impl AppliedSettings {
    /// The first release's values: what states and `Bootstrap` commands written before the
    /// settings were recorded were applied with. Frozen: a test fails if they change.
    pub const FIRST_RELEASE: AppliedSettings = AppliedSettings {
        replicas_per_group: 5,
        heartbeat_timeout_ms: 10_000,
        quotas_max: 1_000,
        acl_grants_max: 10_000,
        acl_groups_max: 1_000,
        acl_members_max: 10_000,
    };

    /// The values this binary proposes at bootstrap with `config`.
    pub fn of(config: &PlacementConfig) -> AppliedSettings {
        AppliedSettings {
            replicas_per_group: config.replicas_per_group,
            heartbeat_timeout_ms: config.heartbeat_timeout_ms,
            quotas_max: crate::quota::QUOTAS_MAX,
            acl_grants_max: crate::acl::GRANTS_MAX,
            acl_groups_max: crate::acl::GROUPS_MAX,
            acl_members_max: crate::acl::MEMBERS_MAX,
        }
    }
}

impl Default for AppliedSettings {
    fn default() -> Self {
        AppliedSettings::FIRST_RELEASE
    }
}

/// The whole placement state: what the placement group replicates.
///
/// Only [`Placement::apply`] changes it (the routing table has one writer). The serialized
/// form (see [`Placement::to_bytes`]) leaves out the [`PlacementConfig`]; restore it with
/// [`Placement::from_bytes`], which also checks the invariants (plain deserialization does
/// not, and gives the default config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    #[serde(skip)]
    pub(crate) config: PlacementConfig,
    pub(crate) nodes: BTreeMap<u64, NodeInfo>,
    pub(crate) groups: BTreeMap<u64, GroupInfo>,
    /// Prefix → id of the ready group that owns it.
    pub(crate) routes: BTreeMap<String, u64>,
    pub(crate) routing_version: u64,
    pub(crate) next_group_id: u64,
    /// Balancing is paused (`warden admin scheduler pause`); repair and drains go on.
    #[serde(default)]
    pub(crate) scheduler_paused: bool,
    /// Who may do what where (security on).
    #[serde(default)]
    pub(crate) acl: Acl,
    /// Subtree quotas and their shares.
    #[serde(default)]
    pub(crate) quotas: Quotas,
    /// The limits every group checks in apply.
    #[serde(default)]
    pub(crate) apply_limits: ApplyLimitsRecord,
    /// The etcd API's users, roles and enabled flag (opaque here).
    #[serde(default)]
    pub(crate) etcd_auth: EtcdAuthRecord,
    /// What apply reads beyond the command (recorded at bootstrap).
    #[serde(default)]
    pub(crate) settings: AppliedSettings,
}

impl Placement {
    /// An empty, not yet bootstrapped state.
    pub fn new(config: PlacementConfig) -> Placement {
        Placement {
            config,
            nodes: BTreeMap::new(),
            groups: BTreeMap::new(),
            routes: BTreeMap::new(),
            routing_version: 0,
            next_group_id: ROOT_GROUP_ID + 1,
            scheduler_paused: false,
            acl: Acl::default(),
            quotas: Quotas::default(),
            apply_limits: ApplyLimitsRecord::default(),
            etcd_auth: EtcdAuthRecord::default(),
            settings: AppliedSettings::FIRST_RELEASE,
        }
    }

    /// The access control list.
    pub fn acl(&self) -> &Acl {
        &self.acl
    }

    /// The subtree quotas.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The limits every group checks in apply (version 0: never set).
    pub fn apply_limits(&self) -> &ApplyLimitsRecord {
        &self.apply_limits
    }

    /// The etcd API's auth record (version 0: never set).
    pub fn etcd_auth(&self) -> &EtcdAuthRecord {
        &self.etcd_auth
    }

    /// The settings apply reads, recorded at bootstrap.
    pub fn settings(&self) -> &AppliedSettings {
        &self.settings
    }

    /// The local settings.
    pub fn config(&self) -> &PlacementConfig {
        &self.config
    }

    /// Whether `Bootstrap` has been applied (then `/` is always routed).
    pub fn is_bootstrapped(&self) -> bool {
        !self.routes.is_empty()
    }

    /// Every registered node, by id.
    pub fn nodes(&self) -> &BTreeMap<u64, NodeInfo> {
        &self.nodes
    }

    /// One node.
    pub fn node(&self, id: u64) -> Option<&NodeInfo> {
        self.nodes.get(&id)
    }

    /// Every group, ready or being created, by id.
    pub fn groups(&self) -> &BTreeMap<u64, GroupInfo> {
        &self.groups
    }

    /// One group.
    pub fn group(&self, id: u64) -> Option<&GroupInfo> {
        self.groups.get(&id)
    }

    /// The routing table: prefix → id of the ready group that owns it.
    pub fn routes(&self) -> &BTreeMap<String, u64> {
        &self.routes
    }

    /// Grows by one with every command that changes nodes, groups or routes (heartbeats that
    /// only refresh a timestamp do not count). Routers compare it to refresh their cache.
    pub fn routing_version(&self) -> u64 {
        self.routing_version
    }

    /// Whether the balance schedulers are paused.
    pub fn scheduler_paused(&self) -> bool {
        self.scheduler_paused
    }

    /// The id the next `CreateGroup` allocates.
    pub fn next_group_id(&self) -> u64 {
        self.next_group_id
    }

    /// The snapshot of the replicated state (JSON; the config is left out).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain structs and maps with integer or string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Restores a snapshot taken by [`Placement::to_bytes`], with this replica's `config`.
    /// Refuses bytes that do not decode or a state that breaks an invariant.
    pub fn from_bytes(bytes: &[u8], config: PlacementConfig) -> Result<Placement, PlacementError> {
        let mut placement: Placement = serde_json::from_slice(bytes).map_err(|error| PlacementError::BadSnapshot(error.to_string()))?;
        placement.config = config;
        placement.check_invariants()?;
        Ok(placement)
    }

    /// Checks the invariants every state reached by `apply` keeps: `/` is routed to group 1
    /// once bootstrapped (and nothing exists before); every route names a ready group with
    /// that prefix and every ready group is routed; prefixes are valid and unique; group ids
    /// are below `next_group_id` and in the shard range; replicas are known, distinct nodes.
    pub fn check_invariants(&self) -> Result<(), PlacementError> {
        let fail = |reason: String| Err(PlacementError::Inconsistent(reason));
        if !self.is_bootstrapped() && (!self.nodes.is_empty() || !self.groups.is_empty()) {
            return fail("nodes or groups exist without a route for /".into());
        }
        if self.is_bootstrapped() && self.routes.get("/") != Some(&ROOT_GROUP_ID) {
            return fail(format!("/ is not routed to group {ROOT_GROUP_ID}"));
        }
        if self.next_group_id <= ROOT_GROUP_ID {
            return fail(format!("next group id {} is not above the root group's", self.next_group_id));
        }
        for (id, node) in &self.nodes {
            if node.id != *id {
                return fail(format!("node {} is stored under id {id}", node.id));
            }
            if let Err(reason) = validate_node(node.id, &node.addr, &node.zone) {
                return fail(format!("node {id}: {reason}"));
            }
        }
        for (prefix, id) in &self.routes {
            match self.groups.get(id) {
                Some(group) if group.ready && &group.prefix == prefix => {}
                _ => return fail(format!("route {prefix} names group {id}, which is not its ready owner")),
            }
        }
        let mut prefixes = BTreeSet::new();
        for (id, group) in &self.groups {
            if group.id != *id {
                return fail(format!("group {} is stored under id {id}", group.id));
            }
            if *id == 0 || *id >= self.next_group_id || *id > SHARD_GROUP_ID_MAX {
                return fail(format!("group id {id} is out of range"));
            }
            let prefix_ok = if *id == ROOT_GROUP_ID { group.prefix == "/" } else { validate_prefix(&group.prefix).is_ok() };
            if !prefix_ok {
                return fail(format!("group {id} has prefix {:?}", group.prefix));
            }
            if !prefixes.insert(group.prefix.as_str()) {
                return fail(format!("prefix {} has two groups", group.prefix));
            }
            // A retired group (merged away) is ready but no longer routed.
            let routed = self.routes.get(&group.prefix) == Some(id);
            if (group.ready && !group.retired) != routed || (group.retired && !group.ready) {
                return fail(format!("group {id} is ready={} retired={} but routed={routed}", group.ready, group.retired));
            }
            if group.retired && (group.merging.is_some() || group.split_from.is_some()) {
                return fail(format!("group {id} is retired and still moving"));
            }
            let distinct: BTreeSet<_> = group.replicas.iter().collect();
            if group.replicas.is_empty() || distinct.len() != group.replicas.len() {
                return fail(format!("group {id} has replicas {:?}", group.replicas));
            }
            if group.learners.len() > 1 || group.learners.iter().any(|learner| group.replicas.contains(learner)) {
                return fail(format!("group {id} has learners {:?} beside voters {:?}", group.learners, group.replicas));
            }
            if let Some(unknown) = group.members().find(|node| !self.nodes.contains_key(node)) {
                return fail(format!("group {id} has a replica on unknown node {unknown}"));
            }
            if let Some(gone) = group.members().find(|node| self.nodes.get(node).is_some_and(|n| n.state == NodeState::Tombstone)) {
                return fail(format!("group {id} has a replica on tombstoned node {gone}"));
            }
        }
        Ok(())
    }

    /// Records one change of nodes, groups or routes.
    pub(crate) fn bump_routing_version(&mut self) {
        self.routing_version += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{bootstrapped, create_ready};

    #[test]
    fn new_state_is_empty_and_consistent() {
        let placement = Placement::new(PlacementConfig::default());
        assert!(!placement.is_bootstrapped());
        assert_eq!(placement.routing_version(), 0);
        assert_eq!(placement.next_group_id(), 2);
        assert_eq!(placement.config().replicas_per_group, 5);
        assert_eq!(placement.config().heartbeat_timeout_ms, 10_000);
        assert_eq!(placement.check_invariants(), Ok(()));
    }

    #[test]
    fn snapshot_round_trip() {
        let mut placement = bootstrapped(6, 3);
        create_ready(&mut placement, "/a");
        create_ready(&mut placement, "/a/b");
        let bytes = placement.to_bytes();
        let restored = Placement::from_bytes(&bytes, placement.config().clone()).unwrap();
        assert_eq!(restored, placement);
        let empty = Placement::new(PlacementConfig::default());
        assert_eq!(Placement::from_bytes(&empty.to_bytes(), PlacementConfig::default()).unwrap(), empty);
    }

    #[test]
    fn snapshot_leaves_config_out() {
        let placement = bootstrapped(3, 3);
        let text = String::from_utf8(placement.to_bytes()).unwrap();
        // The local settings stay out; the ones apply reads are recorded (`settings`).
        assert!(!text.contains("down_after_ms") && text.contains("\"settings\""), "{text}");
        let other = PlacementConfig { replicas_per_group: 3, heartbeat_timeout_ms: 1, down_after_ms: 2, auto_split: None };
        let restored = Placement::from_bytes(placement.to_bytes().as_slice(), other.clone()).unwrap();
        assert_eq!(restored.config(), &other);
    }

    #[test]
    fn bad_snapshots_are_refused() {
        assert!(matches!(Placement::from_bytes(b"not json", PlacementConfig::default()), Err(PlacementError::BadSnapshot(_))));
        let mut placement = bootstrapped(3, 3);
        create_ready(&mut placement, "/a");
        let mut broken = placement.clone();
        broken.routes.insert("/b".into(), 2);
        assert!(matches!(Placement::from_bytes(&broken.to_bytes(), PlacementConfig::default()), Err(PlacementError::Inconsistent(_))));
        let mut broken = placement.clone();
        broken.routes.remove("/a");
        assert!(matches!(broken.check_invariants(), Err(PlacementError::Inconsistent(_))));
        let mut broken = placement.clone();
        broken.routes.remove("/");
        assert!(matches!(broken.check_invariants(), Err(PlacementError::Inconsistent(_))));
        let mut broken = placement;
        broken.next_group_id = 2;
        assert!(matches!(broken.check_invariants(), Err(PlacementError::Inconsistent(_))));
    }
}
