//! The replicated commands ([`Command`]), what applying one returns ([`Outcome`]), and
//! [`Placement::apply`].
//!
//! Every command is checked in full before anything changes, so a refused command changes
//! nothing. Time comes only from the command (`now_ms`, stamped by the proposing leader).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::error::PlacementError;
use crate::etcd_auth::{EtcdAuthRecord, ETCD_AUTH_BYTES_MAX};
use crate::group::{Epoch, GroupInfo, Merging, ROOT_GROUP_ID, SHARD_GROUP_ID_MAX};
use crate::limits::{ApplyLimitsRecord, APPLY_LIMITS_BYTES_MAX};
use crate::node::{validate_node, NodeInfo, NodeState};
use crate::paths::{is_strictly_below, validate_prefix};
use crate::state::{AppliedSettings, Placement};

/// A change to the placement state, proposed to the placement group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Registers the first nodes, as `(id, addr, zone)`, and creates group 1 owning `/`,
    /// ready at once.
    Bootstrap {
        /// The founding nodes: `(id, addr, zone)`.
        nodes: Vec<(u64, String, String)>,
        /// Leader time: their first heartbeat.
        now_ms: u64,
        /// The bootstrapping binary's apply limits (encoded `warden.v1.ApplyLimits`; empty:
        /// none, groups keep the first release's).
        #[serde(default)]
        limits: Vec<u8>,
        /// The settings placement's apply reads from now on (`None`: the first release's).
        #[serde(default)]
        settings: Option<AppliedSettings>,
    },
    /// Records new apply limits: the version grows by one.
    SetApplyLimits {
        /// The encoded `warden.v1.ApplyLimits`, validated by the proposer.
        encoded: Vec<u8>,
    },
    /// Replaces the etcd API's auth record if it is still at `expected_version`: the
    /// version grows by one.
    SetEtcdAuth {
        /// The version the change was made from.
        expected_version: u64,
        /// The router's encoding of the new record.
        encoded: Vec<u8>,
    },
    /// Adds a node or updates its address and zone; marks it up.
    RegisterNode {
        /// Node id (not 0).
        id: u64,
        /// Where it is reached.
        addr: String,
        /// Its failure-domain label (may be empty).
        zone: String,
        /// Leader time: counts as a heartbeat.
        now_ms: u64,
    },
    /// Heartbeats of known nodes: each is up, last heard of at `now_ms`.
    Heartbeat {
        /// The nodes heard from.
        ids: Vec<u64>,
        /// Leader time.
        now_ms: u64,
    },
    /// The leader found these nodes silent for the heartbeat timeout. Apply re-checks each
    /// against `now_ms`, so a node whose heartbeat applied in between stays up.
    MarkDown {
        /// The nodes to mark down.
        ids: Vec<u64>,
        /// Leader time of the decision.
        now_ms: u64,
    },
    /// Creates a group for `prefix` on new replicas; it is routed only once `GroupReady`.
    CreateGroup {
        /// The subtree it will own.
        prefix: String,
        /// Leader time: nodes silent for the heartbeat timeout by then get no replica.
        now_ms: u64,
    },
    /// Creates a group for `prefix`, an existing subtree of the ready group serving it now,
    /// which the new group takes over with its data (the split sequence of
    /// `shard-node/src/placement/split.rs`). Routed only once `GroupReady`; `DropGroup` rolls
    /// it back.
    SplitGroup {
        /// The subtree it will own.
        prefix: String,
        /// Leader time: nodes silent for the heartbeat timeout by then get no replica.
        now_ms: u64,
    },
    /// The group's replicas exist and it has a leader: commit its route.
    GroupReady {
        /// The group being created.
        group_id: u64,
    },
    /// Sets a node's administrative state (`warden admin drain|undrain|decommission`; the
    /// scheduler makes a decommissioned node a `Tombstone` once it hosts nothing). Allowed:
    /// `Serving` ↔ `Draining`, `Serving`/`Draining` → `Decommissioning` → `Serving` (undo),
    /// `Decommissioning` → `Tombstone` only when no group lists the node; a tombstone is final.
    SetNodeState {
        /// The node.
        id: u64,
        /// Its new state.
        state: NodeState,
    },
    /// Pauses or resumes the balance schedulers (repair and drains go on).
    SetSchedulerPaused {
        /// `true` to pause.
        paused: bool,
    },
    /// A replica of a ready group is about to be added on `node` as a learner (recorded first,
    /// so the node can tell a replica placement knows of from a stale one). One at a time per
    /// group; the node must be up, `Serving`, and not host the group already.
    AddLearner {
        /// The group.
        group_id: u64,
        /// The node that creates the replica.
        node: u64,
    },
    /// The group applied the joint change promoting learner `node` (and removing voter
    /// `replacing`, if any): it takes `replacing`'s place among the voters.
    PromoteLearner {
        /// The group.
        group_id: u64,
        /// The learner, a voter now.
        node: u64,
        /// The voter it replaced, removed from the group (`None`: the group grew).
        replacing: Option<u64>,
    },
    /// The learner `node` was removed from the group, or never added (a move rolled back).
    RemoveLearner {
        /// The group.
        group_id: u64,
        /// The learner.
        node: u64,
    },
    /// Removes a ready group (not the root): its route goes, and the group serving its
    /// parent path serves its prefix again (that group's version grows). Placement does not
    /// check the subtree is empty: the one removing it retires the group first. A retired
    /// group (merged away) is removed once it homes no session.
    RemoveGroup {
        /// The group.
        group_id: u64,
    },
    /// Starts the merge of the ready group with exactly `prefix` (not the root) into the
    /// group serving its parent path: an operation id is allocated and recorded in the group
    /// (`GroupInfo::merging`). One lifecycle change at a time: refused while a group is
    /// being created or merged, or either group moves a replica. `RemoveGroup` finishes it,
    /// `MergeAborted` rolls it back.
    MergeGroup {
        /// The merging group's prefix.
        prefix: String,
    },
    /// The merging group handed its subtree over and the group serving its parent path
    /// serves it now: its route goes (that group's version grows), and it stays, serving
    /// nothing (its version grows too), as the home of its sessions until `RemoveGroup`.
    RetireGroup {
        /// The merging group.
        group_id: u64,
    },
    /// The merge of the group will not happen (its source group aborted it): forgotten.
    MergeAborted {
        /// The group that was merging.
        group_id: u64,
    },
    /// Grants (or revokes) permissions of a principal or `group:NAME` at a prefix
    /// ([`Acl::change`](crate::Acl::change)). Whoever proposes it checked the caller may.
    ChangeAcl {
        /// Where the grant holds (and below).
        prefix: String,
        /// Whom it is for.
        principal: String,
        /// Permission bits ([`crate::acl`]).
        permissions: u32,
        /// Remove these bits instead of adding them.
        revoke: bool,
    },
    /// Adds a principal to a group of principals, or removes it.
    ChangeAclGroup {
        /// The group's name (without `group:`).
        group: String,
        /// The member.
        principal: String,
        /// Remove it instead of adding it.
        remove: bool,
    },
    /// Sets the limits of the subtree quota on a prefix, or removes it (`None`)
    /// ([`Quotas::set`](crate::quota::Quotas::set)).
    SetQuota {
        /// The subtree.
        prefix: String,
        /// Its limits.
        limits: Option<crate::quota::Limits>,
    },
    /// A new version of a group's share of a quota, before the group shrinks it.
    BumpQuotaShare {
        /// The quota's prefix.
        prefix: String,
        /// The group.
        group_id: u64,
    },
    /// Gives a group a (bigger) share of a quota, if the shares stay within its limits.
    RaiseQuotaShare {
        /// The quota's prefix.
        prefix: String,
        /// The group.
        group_id: u64,
        /// Its new share of each counted kind.
        allotment: crate::quota::Counts,
    },
    /// What a group kept of its share when it shrank for `version`.
    LowerQuotaShare {
        /// The quota's prefix.
        prefix: String,
        /// The group.
        group_id: u64,
        /// What it kept of each counted kind.
        allotment: crate::quota::Counts,
        /// The version it shrank for.
        version: u64,
    },
    /// Forgets a group whose creation failed (never ready). The groups it would have carved
    /// paths out of get a newer epoch, so their current descriptor can be sent again over one
    /// an aborted hand-over may have given them (the creation is rolled back).
    DropGroup {
        /// The group being created.
        group_id: u64,
    },
}

/// What an accepted command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Bootstrap created the root group.
    Bootstrapped(GroupInfo),
    /// The node as it is now registered.
    NodeRegistered(NodeInfo),
    /// `Heartbeat`: the nodes that were down and are up again, by id.
    NodesUp(Vec<u64>),
    /// `MarkDown`: the nodes actually marked down (up and still silent at `now_ms`), by id.
    NodesDown(Vec<u64>),
    /// The new group, not yet ready.
    GroupCreated(GroupInfo),
    /// The group is routed now.
    GroupReady {
        /// The group, ready.
        group: GroupInfo,
        /// The groups whose served paths changed (their `epoch.version` grew), by id: the
        /// ready group that owned the prefix before, and any group being created between
        /// the two.
        bumped: Vec<GroupInfo>,
    },
    /// `SetNodeState`: the node as it is now.
    NodeStateSet(NodeInfo),
    /// `SetSchedulerPaused`: whether balancing is paused now.
    SchedulerPaused(bool),
    /// `AddLearner`, `PromoteLearner`, `RemoveLearner`: the group as it is now (its
    /// `epoch.conf_ver` grew).
    ReplicasChanged(GroupInfo),
    /// The group that was removed, and the group serving its prefix again (its version grew).
    GroupRemoved {
        /// The group, forgotten.
        group: GroupInfo,
        /// The groups whose served paths grew, with their new epoch.
        bumped: Vec<GroupInfo>,
    },
    /// `MergeGroup`: the merging group, with its operation.
    MergeStarted(GroupInfo),
    /// `RetireGroup`: the retired group, and the groups whose served paths grew.
    GroupRetired {
        /// The group, retired.
        group: GroupInfo,
        /// The groups serving its prefix now, with their new epoch.
        bumped: Vec<GroupInfo>,
    },
    /// `MergeAborted`: the group, no longer merging.
    MergeAborted(GroupInfo),
    /// `ChangeAcl`, `ChangeAclGroup`: the ACL's new version.
    AclChanged(u64),
    /// `SetApplyLimits`: the limits' new version.
    ApplyLimitsVersion(u64),
    /// `SetEtcdAuth`: the etcd auth record's new version.
    EtcdAuthVersion(u64),
    /// `LowerQuotaShare`: done.
    QuotaChanged,
    /// `SetQuota`, `BumpQuotaShare`, `RaiseQuotaShare`: the new version.
    QuotaShareVersion(u64),
    /// The group that was dropped.
    GroupDropped {
        /// The group, forgotten.
        group: GroupInfo,
        /// The groups it would have carved paths out of, by id, with their new epoch: each
        /// must be sent its descriptor again.
        bumped: Vec<GroupInfo>,
    },
}

impl Placement {
    /// Applies `command`: deterministic (no clock, no I/O). On refusal nothing changes.
    pub fn apply(&mut self, command: &Command) -> Result<Outcome, PlacementError> {
        if !self.is_bootstrapped() && !matches!(command, Command::Bootstrap { .. }) {
            return Err(PlacementError::NotBootstrapped);
        }
        match command {
            Command::Bootstrap { nodes, now_ms, limits, settings } => self.bootstrap(nodes, *now_ms, limits, settings.unwrap_or_default()),
            Command::SetApplyLimits { encoded } => {
                if encoded.len() > APPLY_LIMITS_BYTES_MAX {
                    return Err(PlacementError::LimitsTooLarge(encoded.len()));
                }
                self.apply_limits = ApplyLimitsRecord { version: self.apply_limits.version + 1, encoded: encoded.clone() };
                Ok(Outcome::ApplyLimitsVersion(self.apply_limits.version))
            }
            Command::SetEtcdAuth { expected_version, encoded } => {
                if encoded.len() > ETCD_AUTH_BYTES_MAX {
                    return Err(PlacementError::EtcdAuthTooLarge(encoded.len()));
                }
                if *expected_version != self.etcd_auth.version {
                    return Err(PlacementError::EtcdAuthStale { expected: *expected_version, current: self.etcd_auth.version });
                }
                self.etcd_auth = EtcdAuthRecord { version: self.etcd_auth.version + 1, encoded: encoded.clone() };
                Ok(Outcome::EtcdAuthVersion(self.etcd_auth.version))
            }
            Command::RegisterNode { id, addr, zone, now_ms } => self.register_node(*id, addr, zone, *now_ms),
            Command::Heartbeat { ids, now_ms } => self.heartbeat(ids, *now_ms),
            Command::MarkDown { ids, now_ms } => self.mark_down(ids, *now_ms),
            Command::CreateGroup { prefix, now_ms } => self.create_group(prefix, *now_ms, false),
            Command::SplitGroup { prefix, now_ms } => self.create_group(prefix, *now_ms, true),
            Command::GroupReady { group_id } => self.group_ready(*group_id),
            Command::DropGroup { group_id } => self.drop_group(*group_id),
            Command::SetNodeState { id, state } => self.set_node_state(*id, *state),
            Command::SetSchedulerPaused { paused } => {
                if self.scheduler_paused != *paused {
                    self.scheduler_paused = *paused;
                    self.bump_routing_version();
                }
                Ok(Outcome::SchedulerPaused(*paused))
            }
            Command::AddLearner { group_id, node } => self.add_learner(*group_id, *node),
            Command::PromoteLearner { group_id, node, replacing } => self.promote_learner(*group_id, *node, *replacing),
            Command::RemoveLearner { group_id, node } => self.remove_learner(*group_id, *node),
            Command::RemoveGroup { group_id } => self.remove_group(*group_id),
            Command::MergeGroup { prefix } => self.merge_group(prefix),
            Command::RetireGroup { group_id } => self.retire_group(*group_id),
            Command::ChangeAcl { prefix, principal, permissions, revoke } => {
                let version = self.acl.change(prefix, principal, *permissions, *revoke, &self.acl_maxima())?;
                // Routers learn the list with the routing table.
                self.bump_routing_version();
                Ok(Outcome::AclChanged(version))
            }
            Command::ChangeAclGroup { group, principal, remove } => {
                let version = self.acl.change_group(group, principal, *remove, &self.acl_maxima())?;
                self.bump_routing_version();
                Ok(Outcome::AclChanged(version))
            }
            Command::SetQuota { prefix, limits } => Ok(Outcome::QuotaShareVersion(self.quotas.set(prefix, *limits, self.settings.quotas_max)?)),
            Command::BumpQuotaShare { prefix, group_id } => Ok(Outcome::QuotaShareVersion(self.quotas.bump(prefix, *group_id)?)),
            Command::RaiseQuotaShare { prefix, group_id, allotment } => {
                let groups = &self.groups;
                Ok(Outcome::QuotaShareVersion(self.quotas.raise(prefix, *group_id, *allotment, |group| groups.contains_key(&group))?))
            }
            Command::LowerQuotaShare { prefix, group_id, allotment, version } => {
                self.quotas.lower(prefix, *group_id, *allotment, *version)?;
                Ok(Outcome::QuotaChanged)
            }
            Command::MergeAborted { group_id } => {
                let group = self.groups.get_mut(group_id).ok_or(PlacementError::UnknownGroup(*group_id))?;
                if group.merging.take().is_none() {
                    return Err(PlacementError::NotMerging(*group_id));
                }
                let group = group.clone();
                self.bump_routing_version();
                Ok(Outcome::MergeAborted(group))
            }
        }
    }

    fn bootstrap(
        &mut self,
        nodes: &[(u64, String, String)],
        now_ms: u64,
        limits: &[u8],
        settings: AppliedSettings,
    ) -> Result<Outcome, PlacementError> {
        if self.is_bootstrapped() {
            return Err(PlacementError::AlreadyBootstrapped);
        }
        if nodes.is_empty() {
            return Err(PlacementError::NotEnoughNodes { wanted: 1, up: 0 });
        }
        if limits.len() > APPLY_LIMITS_BYTES_MAX {
            return Err(PlacementError::LimitsTooLarge(limits.len()));
        }
        // Built aside and swapped in whole: the state before bootstrap is empty.
        let mut next = Placement::new(self.config.clone());
        next.settings = settings;
        for (id, addr, zone) in nodes {
            validate_node(*id, addr, zone).map_err(|reason| PlacementError::InvalidNode { id: *id, reason })?;
            let node = NodeInfo { id: *id, addr: addr.clone(), zone: zone.clone(), last_heartbeat_ms: now_ms, up: true, state: NodeState::Serving };
            if next.nodes.insert(*id, node).is_some() {
                return Err(PlacementError::DuplicateNode(*id));
            }
        }
        let replicas = next.pick_replicas(next.replicas_wanted().min(nodes.len()))?;
        let root = GroupInfo {
            id: ROOT_GROUP_ID,
            prefix: "/".into(),
            replicas,
            learners: Vec::new(),
            epoch: Epoch::INITIAL,
            ready: true,
            split_from: None,
            merging: None,
            retired: false,
        };
        next.groups.insert(ROOT_GROUP_ID, root.clone());
        next.routes.insert(root.prefix.clone(), ROOT_GROUP_ID);
        if !limits.is_empty() {
            next.apply_limits = ApplyLimitsRecord { version: 1, encoded: limits.to_vec() };
        }
        next.bump_routing_version();
        *self = next;
        Ok(Outcome::Bootstrapped(root))
    }

    fn register_node(&mut self, id: u64, addr: &str, zone: &str, now_ms: u64) -> Result<Outcome, PlacementError> {
        validate_node(id, addr, zone).map_err(|reason| PlacementError::InvalidNode { id, reason })?;
        self.check_not_tombstone(&[id])?;
        // A node re-registering keeps the state an operator gave it (a drained node stays so).
        let state = self.nodes.get(&id).map_or(NodeState::Serving, |old| old.state);
        let node = NodeInfo { id, addr: addr.into(), zone: zone.into(), last_heartbeat_ms: now_ms, up: true, state };
        let routing_changed = match self.nodes.get(&id) {
            Some(old) => old.addr != node.addr || old.zone != node.zone || !old.up,
            None => true,
        };
        self.nodes.insert(id, node.clone());
        if routing_changed {
            self.bump_routing_version();
        }
        Ok(Outcome::NodeRegistered(node))
    }

    fn heartbeat(&mut self, ids: &[u64], now_ms: u64) -> Result<Outcome, PlacementError> {
        self.check_known(ids)?;
        self.check_not_tombstone(ids)?;
        let mut revived = BTreeSet::new();
        for id in ids {
            if let Some(node) = self.nodes.get_mut(id) {
                node.last_heartbeat_ms = now_ms;
                if !node.up {
                    node.up = true;
                    revived.insert(*id);
                }
            }
        }
        if !revived.is_empty() {
            self.bump_routing_version();
        }
        Ok(Outcome::NodesUp(revived.into_iter().collect()))
    }

    fn mark_down(&mut self, ids: &[u64], now_ms: u64) -> Result<Outcome, PlacementError> {
        self.check_known(ids)?;
        let silent: BTreeSet<u64> = ids.iter().copied().filter(|id| self.nodes.get(id).is_some_and(|node| self.is_stale(node, now_ms))).collect();
        for id in &silent {
            if let Some(node) = self.nodes.get_mut(id) {
                node.up = false;
            }
        }
        if !silent.is_empty() {
            self.bump_routing_version();
        }
        Ok(Outcome::NodesDown(silent.into_iter().collect()))
    }

    fn create_group(&mut self, prefix: &str, now_ms: u64, split: bool) -> Result<Outcome, PlacementError> {
        validate_prefix(prefix).map_err(|reason| PlacementError::InvalidPrefix { prefix: prefix.to_string(), reason })?;
        if let Some(owner) = self.groups.values().find(|group| group.prefix == prefix) {
            return Err(PlacementError::PrefixTaken { prefix: prefix.to_string(), group: owner.id });
        }
        self.check_no_merge()?;
        // A split takes its subtree from the ready group serving it, one creation at a time:
        // the source's descriptor changes only through this split until it is settled.
        let split_from = match split {
            false => None,
            true => {
                if let Some(creating) = self.groups.values().find(|group| !group.ready) {
                    return Err(PlacementError::ChangeInProgress { group: creating.id, learner: 0 });
                }
                let source = self.route(prefix).ok_or(PlacementError::NotBootstrapped)?;
                if let Some(learner) = source.learners.first() {
                    return Err(PlacementError::ChangeInProgress { group: source.id, learner: *learner });
                }
                Some(source.id)
            }
        };
        let id = self.next_group_id;
        if id > SHARD_GROUP_ID_MAX {
            return Err(PlacementError::GroupIdsExhausted);
        }
        let replicas =
            self.pick_replicas_among(self.replicas_wanted(), |node| node.up && node.state.takes_replicas() && !self.is_stale(node, now_ms))?;
        let group = GroupInfo {
            id,
            prefix: prefix.to_string(),
            replicas,
            learners: Vec::new(),
            epoch: Epoch::INITIAL,
            ready: false,
            split_from,
            merging: None,
            retired: false,
        };
        self.groups.insert(id, group.clone());
        self.next_group_id += 1;
        self.bump_routing_version();
        Ok(Outcome::GroupCreated(group))
    }

    fn group_ready(&mut self, group_id: u64) -> Result<Outcome, PlacementError> {
        let mut group = self.creating_group(group_id)?.clone();
        group.ready = true;
        group.split_from = None;
        let bumped = self.bump_ancestors_changed_by(&group.prefix, |placement| {
            placement.routes.insert(group.prefix.clone(), group_id);
            placement.groups.insert(group_id, group.clone());
        });
        self.bump_routing_version();
        Ok(Outcome::GroupReady { group, bumped })
    }

    fn drop_group(&mut self, group_id: u64) -> Result<Outcome, PlacementError> {
        let group = self.creating_group(group_id)?.clone();
        // A hand-over computes the descriptors `GroupReady` would give (each carved-from group
        // at its version + 1, excluding the prefix) and may have delivered some before it
        // failed. Skipping past that version lets the rollback's descriptor (the paths served
        // again) replace them: a group refuses an equal version with other contents.
        let mut ready = self.clone();
        let carved = match ready.group_ready(group_id)? {
            Outcome::GroupReady { bumped, .. } => bumped,
            other => return Err(PlacementError::Inconsistent(format!("GroupReady answered {other:?}"))),
        };
        let mut bumped = Vec::new();
        for carved in carved {
            if let Some(giver) = self.groups.get_mut(&carved.id) {
                giver.epoch.version = carved.epoch.version + 1;
                bumped.push(giver.clone());
            }
        }
        self.groups.remove(&group_id);
        self.bump_routing_version();
        Ok(Outcome::GroupDropped { group, bumped })
    }

    fn set_node_state(&mut self, id: u64, state: NodeState) -> Result<Outcome, PlacementError> {
        self.check_known(&[id])?;
        let from = self.nodes.get(&id).map_or(NodeState::Serving, |node| node.state);
        use NodeState::*;
        let allowed = match (from, state) {
            (Tombstone, _) => false,
            (_, Tombstone) => from == Decommissioning,
            _ => true,
        };
        if !allowed {
            return Err(PlacementError::NodeStateChange { id, from, to: state });
        }
        if state == Tombstone {
            if let Some(group) = self.groups.values().find(|group| group.has_member(id)) {
                return Err(PlacementError::NodeNotEmpty { id, group: group.id });
            }
        }
        let node = self.nodes.get_mut(&id).ok_or(PlacementError::UnknownNode(id))?;
        if node.state != state {
            node.state = state;
            if state == Tombstone {
                node.up = false;
            }
            self.routing_version += 1;
        }
        Ok(Outcome::NodeStateSet(node.clone()))
    }

    fn add_learner(&mut self, group_id: u64, node: u64) -> Result<Outcome, PlacementError> {
        let group = self.ready_group(group_id)?;
        // A merge sends both groups descriptors naming their replicas.
        if let Some(merging) = self.groups.values().find(|g| g.merging.is_some_and(|m| g.id == group_id || m.into == group_id)) {
            return Err(PlacementError::ChangeInProgress { group: merging.id, learner: 0 });
        }
        let info = self.nodes.get(&node).ok_or(PlacementError::UnknownNode(node))?;
        if !info.up || !info.state.takes_replicas() {
            return Err(PlacementError::NodeNotServing(node));
        }
        if group.has_member(node) {
            return Err(PlacementError::ReplicaExists { group: group_id, node });
        }
        if let Some(learner) = group.learners.first() {
            return Err(PlacementError::ChangeInProgress { group: group_id, learner: *learner });
        }
        self.change_replicas(group_id, |group| group.learners.push(node))
    }

    fn promote_learner(&mut self, group_id: u64, node: u64, replacing: Option<u64>) -> Result<Outcome, PlacementError> {
        let group = self.ready_group(group_id)?;
        if !group.learners.contains(&node) {
            return Err(PlacementError::NotALearner { group: group_id, node });
        }
        let position = match replacing {
            Some(voter) => Some(group.replicas.iter().position(|id| *id == voter).ok_or(PlacementError::NotAVoter { group: group_id, node: voter })?),
            None => None,
        };
        self.change_replicas(group_id, |group| {
            group.learners.retain(|id| *id != node);
            match position {
                Some(position) => group.replicas[position] = node,
                None => group.replicas.push(node),
            }
        })
    }

    fn remove_learner(&mut self, group_id: u64, node: u64) -> Result<Outcome, PlacementError> {
        let group = self.ready_group(group_id)?;
        if !group.learners.contains(&node) {
            return Err(PlacementError::NotALearner { group: group_id, node });
        }
        self.change_replicas(group_id, |group| group.learners.retain(|id| *id != node))
    }

    /// Applies `change` to a group's replicas (checked by the caller) and grows its `conf_ver`.
    fn change_replicas(&mut self, group_id: u64, change: impl FnOnce(&mut GroupInfo)) -> Result<Outcome, PlacementError> {
        let group = self.groups.get_mut(&group_id).ok_or(PlacementError::UnknownGroup(group_id))?;
        change(group);
        group.epoch.conf_ver += 1;
        let group = group.clone();
        self.bump_routing_version();
        Ok(Outcome::ReplicasChanged(group))
    }

    fn remove_group(&mut self, group_id: u64) -> Result<Outcome, PlacementError> {
        if group_id == ROOT_GROUP_ID {
            return Err(PlacementError::RootGroup);
        }
        let group = self.ready_group(group_id)?.clone();
        if let Some(learner) = group.learners.first() {
            // A replica move in flight would add a replica to a group that is gone.
            return Err(PlacementError::ChangeInProgress { group: group_id, learner: *learner });
        }
        if let Some(below) = self.groups.values().find(|other| !other.ready && is_strictly_below(&other.prefix, &group.prefix)) {
            // Its descriptor was computed with this group carving paths out of it.
            return Err(PlacementError::ChangeInProgress { group: below.id, learner: 0 });
        }
        let bumped = self.bump_ancestors_changed_by(&group.prefix, |placement| {
            placement.routes.remove(&group.prefix);
            placement.groups.remove(&group_id);
        });
        self.bump_routing_version();
        Ok(Outcome::GroupRemoved { group, bumped })
    }

    /// Applies `change` (which routes or unroutes `prefix`) and grows the version of every
    /// group above `prefix` whose served paths it changed; answers those groups. Only groups
    /// whose prefix is an ancestor of `prefix` can gain or lose paths by it.
    fn bump_ancestors_changed_by(&mut self, prefix: &str, change: impl FnOnce(&mut Placement)) -> Vec<GroupInfo> {
        let ancestors: Vec<u64> = self.groups.values().filter(|other| is_strictly_below(prefix, &other.prefix)).map(|other| other.id).collect();
        let before: Vec<_> = ancestors.iter().map(|id| self.descriptor(*id)).collect();
        change(self);
        let mut bumped = Vec::new();
        for (id, old) in ancestors.iter().zip(before) {
            if self.descriptor(*id) != old {
                if let Some(ancestor) = self.groups.get_mut(id) {
                    ancestor.epoch.version += 1;
                    bumped.push(ancestor.clone());
                }
            }
        }
        bumped
    }

    /// The group `group_id` if it exists and is ready.
    fn merge_group(&mut self, prefix: &str) -> Result<Outcome, PlacementError> {
        let group = self.groups.values().find(|group| group.prefix == prefix).ok_or_else(|| PlacementError::NoGroupAt(prefix.to_string()))?;
        let group_id = group.id;
        if group_id == ROOT_GROUP_ID {
            return Err(PlacementError::RootGroup);
        }
        if group.retired {
            return Err(PlacementError::NotMerging(group_id));
        }
        self.ready_group(group_id)?;
        if let Some(creating) = self.groups.values().find(|group| !group.ready) {
            return Err(PlacementError::ChangeInProgress { group: creating.id, learner: 0 });
        }
        self.check_no_merge()?;
        let parent_path = crate::paths::parent(prefix).ok_or(PlacementError::RootGroup)?;
        let into = self.route(parent_path).map(|parent| parent.id).ok_or(PlacementError::NotBootstrapped)?;
        for id in [group_id, into] {
            if let Some(learner) = self.groups.get(&id).and_then(|g| g.learners.first()) {
                return Err(PlacementError::ChangeInProgress { group: id, learner: *learner });
            }
        }
        let operation = self.next_group_id;
        if operation > SHARD_GROUP_ID_MAX {
            return Err(PlacementError::GroupIdsExhausted);
        }
        self.next_group_id += 1;
        let group = self.groups.get_mut(&group_id).ok_or(PlacementError::UnknownGroup(group_id))?;
        group.merging = Some(Merging { operation, into });
        let group = group.clone();
        self.bump_routing_version();
        Ok(Outcome::MergeStarted(group))
    }

    fn retire_group(&mut self, group_id: u64) -> Result<Outcome, PlacementError> {
        let group = self.ready_group(group_id)?.clone();
        if group.merging.is_none() {
            return Err(PlacementError::NotMerging(group_id));
        }
        if let Some(learner) = group.learners.first() {
            return Err(PlacementError::ChangeInProgress { group: group_id, learner: *learner });
        }
        let bumped = self.bump_ancestors_changed_by(&group.prefix, |placement| {
            placement.routes.remove(&group.prefix);
        });
        let retired = self.groups.get_mut(&group_id).ok_or(PlacementError::UnknownGroup(group_id))?;
        retired.merging = None;
        retired.retired = true;
        retired.epoch.version += 1;
        let group = retired.clone();
        self.bump_routing_version();
        Ok(Outcome::GroupRetired { group, bumped })
    }

    /// Refuses a lifecycle change while a merge is in progress.
    fn check_no_merge(&self) -> Result<(), PlacementError> {
        match self.groups.values().find(|group| group.merging.is_some()) {
            Some(merging) => Err(PlacementError::ChangeInProgress { group: merging.id, learner: 0 }),
            None => Ok(()),
        }
    }

    fn ready_group(&self, group_id: u64) -> Result<&GroupInfo, PlacementError> {
        match self.groups.get(&group_id) {
            None => Err(PlacementError::UnknownGroup(group_id)),
            Some(group) if !group.ready => Err(PlacementError::GroupNotReady(group_id)),
            Some(group) => Ok(group),
        }
    }

    /// Refuses the whole command if any id names a tombstoned node.
    fn check_not_tombstone(&self, ids: &[u64]) -> Result<(), PlacementError> {
        match ids.iter().find(|id| self.nodes.get(id).is_some_and(|node| node.state == NodeState::Tombstone)) {
            Some(id) => Err(PlacementError::NodeTombstoned(*id)),
            None => Ok(()),
        }
    }

    /// The group `group_id` if it exists and is not ready yet.
    fn creating_group(&self, group_id: u64) -> Result<&GroupInfo, PlacementError> {
        match self.groups.get(&group_id) {
            None => Err(PlacementError::UnknownGroup(group_id)),
            Some(group) if group.ready => Err(PlacementError::GroupNotCreating(group_id)),
            Some(group) => Ok(group),
        }
    }

    /// Refuses the whole command if any id is not a registered node.
    fn check_known(&self, ids: &[u64]) -> Result<(), PlacementError> {
        match ids.iter().find(|id| !self.nodes.contains_key(id)) {
            Some(unknown) => Err(PlacementError::UnknownNode(*unknown)),
            None => Ok(()),
        }
    }

    /// The ACL's maxima (recorded: never this binary's defaults).
    fn acl_maxima(&self) -> crate::acl::AclMaxima {
        crate::acl::AclMaxima { grants: self.settings.acl_grants_max, groups: self.settings.acl_groups_max, members: self.settings.acl_members_max }
    }

    /// Replicas a group gets (the recorded setting: never this binary's default).
    pub(crate) fn replicas_wanted(&self) -> usize {
        self.settings.replicas_per_group.max(1)
    }
}
