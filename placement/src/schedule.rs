//! The schedulers, as one pure function of the placement state ([`Placement::schedule`]):
//! PD's replica checker (repair a group with a replica on a node down for `down_after_ms`,
//! grow a group with fewer replicas than wanted), the drain of nodes an operator is emptying,
//! then balance-region and balance-leader. The placement leader runs it about once a second
//! and carries the [`Operator`]s out; what is in flight is in the state itself (a group's
//! learner is a replica move under way), so a new leader plans from where the last one was.
//!
//! Rules, in priority order (a group gets at most one operator at a time):
//! 1. **Tombstone** a decommissioning node that hosts nothing.
//! 2. **Repair**: a voter on a node silent for `down_after_ms` is replaced by a new replica
//!    (learner → joint change promoting it and removing the dead one). The target keeps the
//!    group's zone spread first, then is the least loaded node.
//! 3. **Drain**: a draining or decommissioning node first hands over the leadership of every
//!    group it leads (to the voter on the node leading fewest groups), then each of its replicas
//!    is moved as a repair would (only while the group's other voters are all live, so a move
//!    never costs a group a live voter).
//! 4. **Grow** a group with fewer voters than wanted once a node can take one.
//! 5. **Balance** (unless paused, and only when no rule above has work anywhere, so balancing
//!    never fights repair or a drain): replica counts per serving node to within one of each
//!    other, never lowering a group's zone spread; then leader counts likewise.
//!
//! Limits ([`ScheduleLimits`]): replica moves in flight in the cluster and per target node
//! (each is a snapshot to send), moves started and leader transfers per round.
//!
//! **Architecture invariant:** no clock and no I/O (time is `now_ms`, leaders are what the
//! caller heard in heartbeats), so the same inputs give the same plan.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::group::GroupInfo;
use crate::node::{NodeInfo, NodeState};
use crate::state::Placement;

/// How much the scheduler may start at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleLimits {
    /// Replica moves (learners) in flight in the whole cluster.
    pub moves_in_flight_max: usize,
    /// Replica moves in flight towards one node (snapshots it receives at once).
    pub moves_per_node_max: usize,
    /// Replica moves started per round (the placement leader runs a round about once a
    /// second, so this is also the repairs per second).
    pub moves_per_round_max: usize,
    /// Leader transfers started per round.
    pub leader_transfers_per_round_max: usize,
}

impl Default for ScheduleLimits {
    fn default() -> Self {
        ScheduleLimits { moves_in_flight_max: 8, moves_per_node_max: 2, moves_per_round_max: 4, leader_transfers_per_round_max: 8 }
    }
}

/// Why a replica moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveReason {
    /// Its node is down for good (`down_after_ms`).
    Repair,
    /// Its node is being drained or decommissioned.
    Drain,
    /// The group has fewer voters than wanted.
    Grow,
    /// Replica counts per node are uneven.
    Balance,
}

/// One step the placement leader should carry out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    /// Add a replica of `group_id` on `to` (learner, caught up by snapshot), then promote it
    /// and remove `from` (if any) in one joint change.
    MoveReplica {
        /// The group.
        group_id: u64,
        /// The voter it replaces (`None`: the group grows).
        from: Option<u64>,
        /// The node that gets the new replica.
        to: u64,
        /// Why.
        reason: MoveReason,
    },
    /// Hand the leadership of `group_id` from `from` to `to` (a voter).
    TransferLeader {
        /// The group.
        group_id: u64,
        /// Its leader now.
        from: u64,
        /// The new leader.
        to: u64,
        /// `Drain` or `Balance`.
        reason: MoveReason,
    },
    /// A decommissioned node hosts nothing any more: make it a tombstone.
    Tombstone {
        /// The node.
        node: u64,
    },
}

impl Placement {
    /// The operators to start now, given the time and the leader of each group as heard
    /// from the nodes (`group → node`; groups missing are led by nobody known).
    pub fn schedule(&self, now_ms: u64, leaders: &BTreeMap<u64, u64>, limits: &ScheduleLimits) -> Vec<Operator> {
        let mut plan = Plan::new(self, now_ms, leaders, limits);
        plan.tombstones();
        plan.repairs_and_drains();
        plan.grow();
        if !self.scheduler_paused && !plan.urgent {
            plan.balance_replicas();
            plan.balance_leaders();
        }
        plan.operators
    }

    /// Whether `node` counts as live at `now_ms`: up and heard from within the heartbeat
    /// timeout.
    pub fn is_live(&self, node: &NodeInfo, now_ms: u64) -> bool {
        node.up && node.state != NodeState::Tombstone && !self.is_stale(node, now_ms)
    }

    /// Whether `node` has been silent for `down_after_ms` at `now_ms` (its replicas are
    /// replaced).
    pub fn is_gone(&self, node: &NodeInfo, now_ms: u64) -> bool {
        !self.is_live(node, now_ms) && now_ms.saturating_sub(node.last_heartbeat_ms) >= self.config.down_after_ms
    }
}

/// A round's plan being built: what the state says is in flight plus what this round adds.
struct Plan<'a> {
    state: &'a Placement,
    now_ms: u64,
    leaders: BTreeMap<u64, u64>,
    limits: &'a ScheduleLimits,
    /// Groups with a move in flight or an operator this round.
    busy: BTreeSet<u64>,
    /// Moves in flight towards each node (learners), this round's included.
    incoming: BTreeMap<u64, usize>,
    /// Replicas (voters and learners) per node, this round's moves included.
    load: BTreeMap<u64, usize>,
    moves_in_flight: usize,
    moves_started: usize,
    transfers_started: usize,
    /// A repair, drain or growth has work (done or waiting for room): no balancing.
    urgent: bool,
    operators: Vec<Operator>,
}

impl<'a> Plan<'a> {
    fn new(state: &'a Placement, now_ms: u64, leaders: &BTreeMap<u64, u64>, limits: &'a ScheduleLimits) -> Plan<'a> {
        let mut plan = Plan {
            state,
            now_ms,
            // A leader placement does not list as a voter is stale news.
            leaders: leaders
                .iter()
                .filter(|(group, node)| state.groups.get(group).is_some_and(|g| g.replicas.contains(node)))
                .map(|(g, n)| (*g, *n))
                .collect(),
            limits,
            busy: BTreeSet::new(),
            incoming: BTreeMap::new(),
            load: BTreeMap::new(),
            moves_in_flight: 0,
            moves_started: 0,
            transfers_started: 0,
            urgent: false,
            operators: Vec::new(),
        };
        for group in state.groups.values() {
            if !group.ready || !group.learners.is_empty() {
                plan.busy.insert(group.id);
            }
            for learner in &group.learners {
                *plan.incoming.entry(*learner).or_default() += 1;
                plan.moves_in_flight += 1;
            }
            for member in group.members() {
                *plan.load.entry(member).or_default() += 1;
            }
        }
        plan
    }

    fn node(&self, id: u64) -> Option<&'a NodeInfo> {
        self.state.nodes.get(&id)
    }

    fn live(&self, id: u64) -> bool {
        self.node(id).is_some_and(|node| self.state.is_live(node, self.now_ms))
    }

    fn gone(&self, id: u64) -> bool {
        self.node(id).is_some_and(|node| self.state.is_gone(node, self.now_ms))
    }

    fn emptying(&self, id: u64) -> bool {
        self.node(id).is_some_and(|node| node.state.is_emptying())
    }

    /// Live serving nodes: those that take replicas and leaders.
    fn serving(&self) -> Vec<u64> {
        self.state.nodes.values().filter(|node| node.state.takes_replicas() && self.state.is_live(node, self.now_ms)).map(|node| node.id).collect()
    }

    fn zone(&self, id: u64) -> &'a str {
        self.node(id).map_or("", |node| node.zone.as_str())
    }

    fn zones(&self, nodes: impl IntoIterator<Item = u64>) -> usize {
        nodes.into_iter().map(|id| self.zone(id)).collect::<BTreeSet<_>>().len()
    }

    fn can_start_move(&self) -> bool {
        self.moves_in_flight < self.limits.moves_in_flight_max && self.moves_started < self.limits.moves_per_round_max
    }

    /// The best node for a new replica of `group` replacing `removing`: a live serving node
    /// not in the group, in a zone the remaining voters use least, then least loaded, then
    /// lowest id, among those with room for a snapshot. `None` also when every node of the
    /// best zones is full: waiting a round beats lowering the group's zone spread.
    fn pick_target(&self, group: &GroupInfo, removing: Option<u64>) -> Option<u64> {
        let mut zone_use: BTreeMap<&str, usize> = BTreeMap::new();
        for voter in group.replicas.iter().filter(|id| Some(**id) != removing) {
            *zone_use.entry(self.zone(*voter)).or_default() += 1;
        }
        let zone_use_of = |id: u64| zone_use.get(self.zone(id)).copied().unwrap_or(0);
        let candidates: Vec<u64> = self.serving().into_iter().filter(|id| !group.has_member(*id)).collect();
        let best_zone_use = candidates.iter().map(|id| zone_use_of(*id)).min()?;
        candidates
            .into_iter()
            .filter(|id| zone_use_of(*id) == best_zone_use && self.incoming.get(id).copied().unwrap_or(0) < self.limits.moves_per_node_max)
            .min_by_key(|id| (self.load.get(id).copied().unwrap_or(0), *id))
    }

    fn start_move(&mut self, group_id: u64, from: Option<u64>, to: u64, reason: MoveReason) {
        self.busy.insert(group_id);
        *self.incoming.entry(to).or_default() += 1;
        *self.load.entry(to).or_default() += 1;
        if let Some(from) = from {
            if let Some(load) = self.load.get_mut(&from) {
                *load = load.saturating_sub(1);
            }
        }
        self.moves_in_flight += 1;
        self.moves_started += 1;
        self.operators.push(Operator::MoveReplica { group_id, from, to, reason });
    }

    fn start_transfer(&mut self, group_id: u64, from: u64, to: u64, reason: MoveReason) {
        self.busy.insert(group_id);
        self.leaders.insert(group_id, to);
        self.transfers_started += 1;
        self.operators.push(Operator::TransferLeader { group_id, from, to, reason });
    }

    /// Leaders per live serving node (0 for those leading nothing).
    fn leader_counts(&self) -> BTreeMap<u64, usize> {
        let mut counts: BTreeMap<u64, usize> = self.serving().into_iter().map(|id| (id, 0)).collect();
        for leader in self.leaders.values() {
            if let Some(count) = counts.get_mut(leader) {
                *count += 1;
            }
        }
        counts
    }

    /// Rule 1.
    fn tombstones(&mut self) {
        for node in self.state.nodes.values().filter(|node| node.state == NodeState::Decommissioning) {
            if !self.state.groups.values().any(|group| group.has_member(node.id)) {
                self.operators.push(Operator::Tombstone { node: node.id });
            }
        }
    }

    /// Rules 2 and 3, group by group.
    fn repairs_and_drains(&mut self) {
        for group in self.state.groups.values() {
            if self.busy.contains(&group.id) {
                // A move in flight on a group with work left is still urgent work.
                if group.ready && group.replicas.iter().any(|id| self.gone(*id) || self.emptying(*id)) {
                    self.urgent = true;
                }
                continue;
            }
            if let Some(dead) = group.replicas.iter().copied().find(|id| self.gone(*id)) {
                self.urgent = true;
                if self.can_start_move() {
                    if let Some(to) = self.pick_target(group, Some(dead)) {
                        self.start_move(group.id, Some(dead), to, MoveReason::Repair);
                    }
                }
                continue;
            }
            let Some(leaving) = group.replicas.iter().copied().find(|id| self.emptying(*id)) else { continue };
            self.urgent = true;
            let leader = self.leaders.get(&group.id).copied();
            if leader == Some(leaving) {
                if self.transfers_started < self.limits.leader_transfers_per_round_max {
                    if let Some(to) = self.leader_target(group, leaving) {
                        self.start_transfer(group.id, leaving, to, MoveReason::Drain);
                    }
                }
                continue;
            }
            // Moved only with a known leader elsewhere and every other voter live.
            let others_live = group.replicas.iter().filter(|id| **id != leaving).all(|id| self.live(*id));
            if leader.is_some() && (others_live || !self.live(leaving)) && self.can_start_move() {
                if let Some(to) = self.pick_target(group, Some(leaving)) {
                    self.start_move(group.id, Some(leaving), to, MoveReason::Drain);
                }
            }
        }
    }

    /// The voter on a live serving node leading fewest groups (ties: lowest id).
    fn leader_target(&self, group: &GroupInfo, from: u64) -> Option<u64> {
        let counts = self.leader_counts();
        group.replicas.iter().copied().filter(|id| *id != from && counts.contains_key(id)).min_by_key(|id| (counts[id], *id))
    }

    /// Rule 4.
    fn grow(&mut self) {
        let wanted = self.state.replicas_wanted();
        for group in self.state.groups.values() {
            if self.busy.contains(&group.id) || group.replicas.len() >= wanted || !group.replicas.iter().all(|id| self.live(*id)) {
                continue;
            }
            if let Some(to) = self.pick_target(group, None) {
                self.urgent = true;
                if self.can_start_move() {
                    self.start_move(group.id, None, to, MoveReason::Grow);
                }
            }
        }
    }

    /// Rule 5, replicas: from the most loaded serving node to the least loaded, while they
    /// differ by more than one.
    fn balance_replicas(&mut self) {
        while self.can_start_move() {
            let serving = self.serving();
            let load = |id: &u64| self.load.get(id).copied().unwrap_or(0);
            let Some(most) = serving.iter().copied().max_by_key(|id| (load(id), std::cmp::Reverse(*id))) else { return };
            let Some(least) = serving
                .iter()
                .copied()
                .filter(|id| self.incoming.get(id).copied().unwrap_or(0) < self.limits.moves_per_node_max)
                .min_by_key(|id| (load(id), *id))
            else {
                return;
            };
            if load(&most) <= load(&least) + 1 {
                return;
            }
            let candidate = self.state.groups.values().find(|group| {
                !self.busy.contains(&group.id)
                    && group.replicas.contains(&most)
                    && !group.has_member(least)
                    && self.leaders.get(&group.id).is_some_and(|leader| *leader != most)
                    && group.replicas.iter().all(|id| self.live(*id))
                    && self.zones(group.replicas.iter().copied().filter(|id| *id != most).chain([least]))
                        >= self.zones(group.replicas.iter().copied())
            });
            match candidate {
                Some(group) => self.start_move(group.id, Some(most), least, MoveReason::Balance),
                None => return,
            }
        }
    }

    /// Rule 5, leaders: from the serving node leading most groups to one of the group's voters
    /// leading at least two fewer, while such a pair exists.
    fn balance_leaders(&mut self) {
        while self.transfers_started < self.limits.leader_transfers_per_round_max {
            let counts = self.leader_counts();
            let mut best: Option<(u64, u64, u64)> = None;
            for (group_id, leader) in &self.leaders {
                let Some(group) = self.state.groups.get(group_id) else { continue };
                let (Some(from_count), false) = (counts.get(leader), self.busy.contains(group_id)) else { continue };
                let target = group
                    .replicas
                    .iter()
                    .copied()
                    .filter(|id| counts.get(id).is_some_and(|c| c + 1 < *from_count))
                    .min_by_key(|id| (counts[id], *id));
                if let Some(to) = target {
                    let better = best.is_none_or(|(_, from, _)| counts[&from] < *from_count);
                    if better {
                        best = Some((*group_id, *leader, to));
                    }
                }
            }
            match best {
                Some((group_id, from, to)) => self.start_transfer(group_id, from, to, MoveReason::Balance),
                None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::state::PlacementConfig;
    use crate::testutil::{bootstrapped, create_ready};

    const DOWN_AFTER_MS: u64 = 60_000;

    /// Nodes 1..=`nodes` in one zone, `groups` groups beside the root, everyone heartbeating at 0.
    fn cluster(nodes: u64, groups: usize) -> Placement {
        let mut placement = bootstrapped(nodes, 5);
        for index in 0..groups {
            create_ready(&mut placement, &format!("/g{index}"));
        }
        placement
    }

    /// Everyone but `silent` heartbeats at `now_ms`.
    fn heartbeat(placement: &mut Placement, now_ms: u64, silent: &[u64]) {
        let ids: Vec<u64> = placement.nodes().values().filter(|n| n.state != NodeState::Tombstone && !silent.contains(&n.id)).map(|n| n.id).collect();
        placement.apply(&Command::Heartbeat { ids, now_ms }).unwrap();
        let stale = placement.nodes_to_mark_down(now_ms);
        placement.apply(&Command::MarkDown { ids: stale, now_ms }).unwrap();
    }

    /// The first voter of each ready group leads it.
    fn first_voters_lead(placement: &Placement) -> BTreeMap<u64, u64> {
        placement.groups().values().filter(|g| g.ready).map(|g| (g.id, g.replicas[0])).collect()
    }

    /// Carries an operator out at once, as the executor would when every step succeeds.
    fn carry_out(placement: &mut Placement, leaders: &mut BTreeMap<u64, u64>, operator: &Operator) {
        match operator {
            Operator::MoveReplica { group_id, from, to, .. } => {
                placement.apply(&Command::AddLearner { group_id: *group_id, node: *to }).unwrap();
                placement.apply(&Command::PromoteLearner { group_id: *group_id, node: *to, replacing: *from }).unwrap();
            }
            Operator::TransferLeader { group_id, to, .. } => {
                leaders.insert(*group_id, *to);
            }
            Operator::Tombstone { node } => {
                placement.apply(&Command::SetNodeState { id: *node, state: NodeState::Tombstone }).unwrap();
            }
        }
    }

    /// Rounds until the plan is empty (at most `rounds_max`); every round is checked.
    fn run_to_fixpoint(placement: &mut Placement, leaders: &mut BTreeMap<u64, u64>, now_ms: u64, rounds_max: usize) -> usize {
        for round in 0..rounds_max {
            let plan = placement.schedule(now_ms, leaders, &ScheduleLimits::default());
            if plan.is_empty() {
                return round;
            }
            for operator in &plan {
                carry_out(placement, leaders, operator);
            }
            placement.check_invariants().unwrap();
        }
        panic!("no fixpoint after {rounds_max} rounds");
    }

    fn replica_counts(placement: &Placement) -> BTreeMap<u64, usize> {
        let mut counts: BTreeMap<u64, usize> =
            placement.nodes().values().filter(|n| n.up && n.state == NodeState::Serving).map(|n| (n.id, 0)).collect();
        for member in placement.groups().values().flat_map(|g| g.members()) {
            *counts.entry(member).or_default() += 1;
        }
        counts
    }

    fn spread(counts: impl IntoIterator<Item = usize>) -> usize {
        let counts: Vec<usize> = counts.into_iter().collect();
        counts.iter().max().copied().unwrap_or(0) - counts.iter().min().copied().unwrap_or(0)
    }

    #[test]
    fn a_dead_node_is_repaired_only_after_down_after() {
        let mut placement = cluster(6, 4);
        let mut leaders = first_voters_lead(&placement);
        // Node 1 hosts a replica of every group (five of six nodes each).
        heartbeat(&mut placement, 30_000, &[1]);
        assert!(placement
            .schedule(30_000, &leaders, &ScheduleLimits::default())
            .iter()
            .all(|op| !matches!(op, Operator::MoveReplica { reason: MoveReason::Repair, .. })));
        heartbeat(&mut placement, DOWN_AFTER_MS, &[1]);
        let plan = placement.schedule(DOWN_AFTER_MS, &leaders, &ScheduleLimits::default());
        assert!(plan.iter().any(|op| matches!(op, Operator::MoveReplica { from: Some(1), reason: MoveReason::Repair, .. })), "{plan:?}");
        leaders.retain(|_, leader| *leader != 1);
        run_to_fixpoint(&mut placement, &mut leaders, DOWN_AFTER_MS, 20);
        for group in placement.groups().values() {
            assert_eq!(group.replicas.len(), 5);
            assert!(!group.replicas.contains(&1), "group {} still on the dead node", group.id);
        }
    }

    #[test]
    fn limits_bound_what_one_round_starts() {
        let mut placement = cluster(7, 10);
        heartbeat(&mut placement, DOWN_AFTER_MS, &[1]);
        let limits = ScheduleLimits { moves_in_flight_max: 3, moves_per_node_max: 1, moves_per_round_max: 3, leader_transfers_per_round_max: 1 };
        let plan = placement.schedule(DOWN_AFTER_MS, &BTreeMap::new(), &limits);
        let moves: Vec<_> = plan.iter().filter(|op| matches!(op, Operator::MoveReplica { .. })).collect();
        // Only two live nodes (6 and 7) are free of some group, one snapshot each at most.
        assert!(!moves.is_empty() && moves.len() <= 3, "{plan:?}");
        let mut targets: BTreeMap<u64, usize> = BTreeMap::new();
        for op in &moves {
            if let Operator::MoveReplica { to, .. } = op {
                *targets.entry(*to).or_default() += 1;
            }
        }
        assert!(targets.values().all(|count| *count <= 1), "{targets:?}");
    }

    #[test]
    fn drain_moves_leaders_first_then_replicas_and_decommission_ends_in_a_tombstone() {
        let mut placement = cluster(7, 6);
        let mut leaders = first_voters_lead(&placement);
        heartbeat(&mut placement, 1_000, &[]);
        placement.apply(&Command::SetNodeState { id: 1, state: NodeState::Decommissioning }).unwrap();
        let plan = placement.schedule(1_000, &leaders, &ScheduleLimits::default());
        for op in &plan {
            if let Operator::MoveReplica { group_id, from: Some(1), .. } = op {
                assert_ne!(leaders.get(group_id), Some(&1), "a replica moved while its node leads the group");
            }
        }
        assert!(plan.iter().any(|op| matches!(op, Operator::TransferLeader { from: 1, .. })), "{plan:?}");
        run_to_fixpoint(&mut placement, &mut leaders, 1_000, 40);
        assert_eq!(placement.node(1).unwrap().state, NodeState::Tombstone);
        assert!(placement.groups().values().all(|g| !g.has_member(1)));
        assert_eq!(
            placement.apply(&Command::RegisterNode { id: 1, addr: "n1:7000".into(), zone: "z".into(), now_ms: 2_000 }),
            Err(crate::PlacementError::NodeTombstoned(1))
        );
    }

    #[test]
    fn a_new_node_is_filled_to_within_one_and_leaders_spread() {
        let mut placement = cluster(6, 11);
        let mut leaders = first_voters_lead(&placement);
        placement.apply(&Command::RegisterNode { id: 7, addr: "n7:7000".into(), zone: "z".into(), now_ms: 0 }).unwrap();
        assert_eq!(replica_counts(&placement)[&7], 0);
        run_to_fixpoint(&mut placement, &mut leaders, 0, 60);
        let counts = replica_counts(&placement);
        assert!(spread(counts.values().copied()) <= 1, "{counts:?}");
        let mut led: BTreeMap<u64, usize> = (1..=7).map(|id| (id, 0)).collect();
        for leader in leaders.values() {
            *led.get_mut(leader).unwrap() += 1;
        }
        assert!(spread(led.values().copied()) <= 1, "{led:?}");
    }

    #[test]
    fn pausing_stops_balancing_but_not_repair() {
        let mut placement = cluster(6, 4);
        placement.apply(&Command::SetSchedulerPaused { paused: true }).unwrap();
        placement.apply(&Command::RegisterNode { id: 7, addr: "n7:7000".into(), zone: "z".into(), now_ms: 0 }).unwrap();
        assert_eq!(placement.schedule(0, &first_voters_lead(&placement), &ScheduleLimits::default()), Vec::new());
        heartbeat(&mut placement, DOWN_AFTER_MS, &[2]);
        let plan = placement.schedule(DOWN_AFTER_MS, &first_voters_lead(&placement), &ScheduleLimits::default());
        assert!(plan.iter().all(|op| matches!(op, Operator::MoveReplica { reason: MoveReason::Repair, .. })) && !plan.is_empty(), "{plan:?}");
    }

    #[test]
    fn repair_keeps_zone_spread() {
        let mut placement = Placement::new(PlacementConfig::default());
        let nodes = (1..=8).map(|id| (id, format!("n{id}:1"), ["a", "b", "c", "d"][(id as usize - 1) % 4].to_string())).collect();
        placement.apply(&Command::Bootstrap { nodes, now_ms: 0, limits: Vec::new(), settings: None }).unwrap();
        let root = placement.groups()[&1].replicas.clone();
        // Zones a,b,c,d,a: kill the d replica; the replacement must be in zone d.
        let victim = *root.iter().find(|id| placement.node(**id).unwrap().zone == "d").unwrap();
        heartbeat(&mut placement, DOWN_AFTER_MS, &[victim]);
        let plan = placement.schedule(DOWN_AFTER_MS, &BTreeMap::new(), &ScheduleLimits::default());
        let Some(Operator::MoveReplica { to, .. }) = plan.first() else { panic!("{plan:?}") };
        assert_eq!(placement.node(*to).unwrap().zone, "d");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Event {
            /// Node stops heartbeating (at most two silent at once).
            Fail(u64),
            /// A silent node heartbeats again.
            Revive(u64),
            /// A new node registers.
            Join,
            Drain(u64),
            Undrain(u64),
            Decommission(u64),
            /// Time passes by this much, everyone live heartbeats.
            Wait(u64),
            /// A round: every operator's first step, or all of it.
            Round {
                finish: bool,
            },
            /// Moves in flight are rolled back (a failed step).
            RollBack,
        }

        fn event() -> impl Strategy<Value = Event> {
            prop_oneof![
                (1..10u64).prop_map(Event::Fail),
                (1..10u64).prop_map(Event::Revive),
                Just(Event::Join),
                (1..10u64).prop_map(Event::Drain),
                (1..10u64).prop_map(Event::Undrain),
                (1..10u64).prop_map(Event::Decommission),
                (1_000..90_000u64).prop_map(Event::Wait),
                any::<bool>().prop_map(|finish| Event::Round { finish }),
                any::<bool>().prop_map(|finish| Event::Round { finish }),
                any::<bool>().prop_map(|finish| Event::Round { finish }),
                Just(Event::RollBack),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
            /// Over random failures (at most two nodes silent at once: what a 5-replica group
            /// survives), joins, drains and rounds: the state stays consistent, no group ever
            /// has fewer than a quorum of voters on nodes that were not failed, no node hosts
            /// two replicas of a group (the invariant check), and no move lowers a group's zone
            /// spread when the zones allow keeping it.
            #[test]
            fn schedules_keep_quorums_and_spread(events in proptest::collection::vec(event(), 1..80)) {
                let mut placement = Placement::new(PlacementConfig::default());
                let nodes = (1..=7).map(|id| (id, format!("n{id}:1"), ["a", "b", "c"][(id as usize) % 3].to_string())).collect();
                placement.apply(&Command::Bootstrap { nodes, now_ms: 0, limits: Vec::new(), settings: None }).unwrap();
                for index in 0..5 {
                    create_ready(&mut placement, &format!("/g{index}"));
                }
                let mut leaders = first_voters_lead(&placement);
                let mut silent: BTreeSet<u64> = BTreeSet::new();
                let mut now_ms = 0;
                let mut next_id = 8;
                for event in events {
                    match event {
                        Event::Fail(id) if silent.len() < 2 && placement.node(id).is_some() => { silent.insert(id); }
                        Event::Revive(id) => { silent.remove(&id); }
                        Event::Join if next_id < 12 => {
                            let zone = ["a", "b", "c"][(next_id as usize) % 3].to_string();
                            placement.apply(&Command::RegisterNode { id: next_id, addr: format!("n{next_id}:1"), zone, now_ms }).unwrap();
                            next_id += 1;
                        }
                        Event::Drain(id) => { let _ = placement.apply(&Command::SetNodeState { id, state: NodeState::Draining }); }
                        Event::Undrain(id) => { let _ = placement.apply(&Command::SetNodeState { id, state: NodeState::Serving }); }
                        Event::Decommission(id) => { let _ = placement.apply(&Command::SetNodeState { id, state: NodeState::Decommissioning }); }
                        Event::Wait(ms) => now_ms += ms,
                        Event::Round { finish } => {
                            let live_leaders: BTreeMap<u64, u64> = leaders.iter().filter(|(_, n)| !silent.contains(n)).map(|(g, n)| (*g, *n)).collect();
                            for op in placement.schedule(now_ms, &live_leaders, &ScheduleLimits::default()) {
                                match &op {
                                    Operator::MoveReplica { group_id, from, to, .. } => {
                                        let group = placement.group(*group_id).unwrap().clone();
                                        // A node that just went silent still counts as live until its heartbeat times out.
                                        prop_assert!(placement.is_live(placement.node(*to).unwrap(), now_ms), "a replica moved to a node known down: {op:?}");
                                        prop_assert!(!group.has_member(*to));
                                        let remaining: Vec<u64> = group.replicas.iter().copied().filter(|id| Some(*id) != *from).collect();
                                        let zone = |id: u64| placement.node(id).unwrap().zone.clone();
                                        let before: BTreeSet<String> = group.replicas.iter().map(|id| zone(*id)).collect();
                                        let after: BTreeSet<String> = remaining.iter().chain([to]).map(|id| zone(*id)).collect();
                                        let mut possible: BTreeSet<String> = remaining.iter().map(|id| zone(*id)).collect();
                                        possible.extend(placement.nodes().values().filter(|n| placement.is_live(n, now_ms) && n.state == NodeState::Serving && !group.has_member(n.id)).map(|n| n.zone.clone()));
                                        prop_assert!(after.len() >= before.len().min(possible.len()), "{op:?} lowers zone spread {before:?} -> {after:?}");
                                        placement.apply(&Command::AddLearner { group_id: *group_id, node: *to }).unwrap();
                                        if finish {
                                            placement.apply(&Command::PromoteLearner { group_id: *group_id, node: *to, replacing: *from }).unwrap();
                                        }
                                    }
                                    _ if finish => carry_out(&mut placement, &mut leaders, &op),
                                    _ => {}
                                }
                            }
                        }
                        Event::RollBack => {
                            let learners: Vec<(u64, u64)> = placement.groups().values().flat_map(|g| g.learners.iter().map(move |l| (g.id, *l))).collect();
                            for (group_id, node) in learners {
                                placement.apply(&Command::RemoveLearner { group_id, node }).unwrap();
                            }
                        }
                        _ => {}
                    }
                    heartbeat(&mut placement, now_ms, &silent.iter().copied().collect::<Vec<_>>());
                    placement.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
                    for group in placement.groups().values() {
                        let live = group.replicas.iter().filter(|id| !silent.contains(id)).count();
                        prop_assert!(live > group.replicas.len() / 2 || group.replicas.len() < 3, "group {} has {live} live of {:?}", group.id, group.replicas);
                    }
                }
            }
        }
    }
}
