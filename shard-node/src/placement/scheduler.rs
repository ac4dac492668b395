//! The placement leader's scheduler: about once a second it reads the placement state, asks
//! `Placement::schedule` for operators (repair, drain, grow, balance) and carries each out on
//! the shard-nodes as a task of its own. A replica move is a numbered sequence:
//!
//! 1. `AddLearner` is committed to placement first, so the replica about to exist is known.
//! 2. The target node creates an empty replica (`CreateReplica` without voters).
//! 3. The group's leader adds it as a learner (`ChangePeers`); raft-rs sends it a snapshot.
//! 4. Wait until the learner has applied the leader's commit index (caught up).
//! 5. One joint change promotes it and removes the replaced voter (raft-rs enters and leaves
//!    the joint configuration itself), so the group never has fewer voters than before.
//! 6. `PromoteLearner` is committed: the table names the new replica set.
//!
//! A move runs at the placement term its leader led at when it began: before each step the
//! leader checks it still leads at that term (and stops otherwise), and the changes of steps
//! 3 and 5 carry that term and the voters placement lists (`ChangePeersRequest`). The check
//! alone cannot close the gap between it and the change's arrival, so the group closes it:
//! every replica refuses, when the change applies, a term below the highest it applied (the
//! group's fence) or a group whose voters are not the ones expected (`host/conf_fence.rs`).
//!
//! A move that fails, or a learner a previous placement leader left behind, is settled: if
//! the group's leader already counts the learner as a voter the promotion is committed (step
//! 6), otherwise the learner is removed from the group — always, even when the group's
//! leader does not list it, for the removal raises the group's fence to the settling
//! leader's term, and then no step of the move a deposed leader may still send applies — and
//! `RemoveLearner` is committed. The replaced replica learns it was removed from its group
//! (or, when its node is down, from a removal notice once it returns) and destroys itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use warden_placement::{Command, GroupInfo, Operator, Outcome, Placement, ScheduleLimits};
use warden_proto::placement::peer_change::Kind;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::*;
use warden_proto::v1::warden_error::Code;

use super::service::{internal, PlacementService};

/// How long a learner may take to catch up (its snapshot included).
const CATCH_UP_WAIT: Duration = Duration::from_secs(120);
/// Pause between checks of a learner's progress.
const CATCH_UP_POLL: Duration = Duration::from_millis(200);
/// Leaders heard in heartbeats older than this are not used for planning.
const LEADERS_FRESH_FOR: Duration = Duration::from_secs(5);
/// Groups tracked as led per node, at most (a heartbeat's list is cut here).
pub const LED_GROUPS_PER_NODE_MAX: usize = 100_000;

/// What the placement leader heard from each node: the groups it leads, and when.
#[derive(Default)]
pub struct LeadersHeard {
    by_node: Mutex<BTreeMap<u64, (Vec<u64>, Instant)>>,
}

impl LeadersHeard {
    /// Records node `node`'s report.
    pub fn record(&self, node: u64, mut led_groups: Vec<u64>) {
        led_groups.truncate(LED_GROUPS_PER_NODE_MAX);
        self.by_node.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(node, (led_groups, Instant::now()));
    }

    /// Group → leader from the fresh reports.
    fn leaders(&self) -> BTreeMap<u64, u64> {
        let by_node = self.by_node.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut leaders = BTreeMap::new();
        for (node, (groups, at)) in by_node.iter() {
            if at.elapsed() <= LEADERS_FRESH_FOR {
                for group in groups {
                    leaders.insert(*group, *node);
                }
            }
        }
        leaders
    }
}

/// Groups with an operator running on this node (one at a time per group).
#[derive(Default)]
pub struct Running {
    groups: Mutex<BTreeSet<u64>>,
}

impl Running {
    /// Claims `group`; `false` if an operator already runs on it.
    pub(super) fn claim(&self, group: u64) -> bool {
        self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(group)
    }

    pub(super) fn release(&self, group: u64) {
        self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&group);
    }
}

impl PlacementService {
    /// While this node leads the placement group, runs a scheduling round every `interval`:
    /// settles learners nobody is moving, then starts the operators the schedule plans.
    /// Runs until the runtime stops.
    pub async fn schedule_periodically(self, interval: Duration, limits: ScheduleLimits) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if self.ensure_leader().is_err() {
                continue;
            }
            if let Err(error) = self.schedule_round(&limits).await {
                tracing::debug!(%error, "scheduling round");
            }
        }
    }

    async fn schedule_round(&self, limits: &ScheduleLimits) -> Result<(), tonic::Status> {
        let state = self.state().await?;
        self.reconcile_quotas(&state).await;
        for group in state.groups().values() {
            for learner in group.learners.clone() {
                if self.running.claim(group.id) {
                    let service = self.clone();
                    let group = group.clone();
                    tokio::spawn(async move {
                        if let Err(error) = service.settle_learner(&group, learner).await {
                            tracing::warn!(group = group.id, learner, %error, "could not settle a replica move");
                        }
                        service.running.release(group.id);
                    });
                }
            }
        }
        let plan = state.schedule(super::service::now_ms(), &self.leaders_heard.leaders(), limits);
        for operator in plan {
            let group_id = match &operator {
                Operator::MoveReplica { group_id, .. } | Operator::TransferLeader { group_id, .. } => *group_id,
                Operator::Tombstone { node } => {
                    let command = Command::SetNodeState { id: *node, state: warden_placement::NodeState::Tombstone };
                    match self.propose(&command).await {
                        Ok(_) => tracing::info!(node, "decommissioned node is a tombstone now"),
                        Err(error) => tracing::warn!(node, %error, "could not make a decommissioned node a tombstone"),
                    }
                    continue;
                }
            };
            if !self.running.claim(group_id) {
                continue;
            }
            tracing::info!(?operator, "starting operator");
            let service = self.clone();
            tokio::spawn(async move {
                let result = match &operator {
                    Operator::MoveReplica { group_id, from, to, .. } => service.move_replica(*group_id, *from, *to).await,
                    Operator::TransferLeader { group_id, from, to, .. } => service.transfer_leader_of(*group_id, *from, *to).await,
                    Operator::Tombstone { .. } => Ok(()),
                };
                match result {
                    Ok(()) => tracing::info!(?operator, "operator done"),
                    Err(error) => tracing::warn!(?operator, %error, "operator failed"),
                }
                service.running.release(group_id);
            });
        }
        Ok(())
    }

    /// Steps 1–6 of a move; on failure the learner is settled (finished or rolled back).
    async fn move_replica(&self, group_id: u64, from: Option<u64>, to: u64) -> Result<(), tonic::Status> {
        let result = self.run_move(group_id, from, to).await;
        self.faults.move_ended(self.node.node_id(), group_id);
        result
    }

    async fn run_move(&self, group_id: u64, from: Option<u64>, to: u64) -> Result<(), tonic::Status> {
        let term = self.leading_term()?;
        // 1.
        let group = match self.propose(&Command::AddLearner { group_id, node: to }).await? {
            Outcome::ReplicasChanged(group) => group,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        match self.add_and_promote(&group, from, to, term).await {
            Ok(()) => Ok(()),
            Err(error) => {
                let group = self.state().await?.group(group_id).cloned().ok_or_else(|| internal(format!("group {group_id} is gone")))?;
                self.settle_learner(&group, to).await?;
                Err(error)
            }
        }
    }

    /// Fault injection (tests): waits while this node's moves of `group` are held before
    /// `step`, so a test can depose the placement leader right there.
    async fn move_fault_point(&self, group: u64, step: u8) {
        while self.faults.move_held(self.node.node_id(), group, step) {
            tokio::time::sleep(super::split::FAULT_POLL).await;
        }
    }

    /// Steps 2–6, each once this node is known to lead placement still at `term`, the term
    /// the move began at (`group`: as step 1 left it, its replicas the voters expected).
    async fn add_and_promote(&self, group: &GroupInfo, from: Option<u64>, to: u64, term: u64) -> Result<(), tonic::Status> {
        let state = self.state().await?;
        // 2.
        self.next_step(group.id, 2, term).await?;
        let request = CreateReplicaRequest { group_id: group.id, voters: Vec::new(), campaign: false };
        PlacementClient::new(self.channel(&node_addr(&state, to)?)?).create_replica(request).await?;
        // 3.
        self.next_step(group.id, 3, term).await?;
        self.change_peers(&state, group, vec![peer(Kind::AddLearner, to)], term, group.replicas.clone()).await?;
        // 4.
        self.next_step(group.id, 4, term).await?;
        self.wait_caught_up(&state, group, to).await?;
        // 5.
        self.next_step(group.id, 5, term).await?;
        let mut changes = vec![peer(Kind::AddVoter, to)];
        changes.extend(from.map(|from| peer(Kind::Remove, from)));
        self.change_peers(&state, group, changes, term, group.replicas.clone()).await?;
        // 6.
        self.next_step(group.id, 6, term).await?;
        self.propose(&Command::PromoteLearner { group_id: group.id, node: to, replacing: from }).await?;
        Ok(())
    }

    /// Before step `step` of a move begun at placement term `term`: refuses unless this node
    /// still leads placement at that term (a leader deposed, or deposed and elected again,
    /// stops; its successor settles the move). The check is cheap but cannot be exact — the
    /// leadership may change right after it — which is what the group's fence is for.
    async fn next_step(&self, group: u64, step: u8, term: u64) -> Result<(), tonic::Status> {
        let leading = self.leading_term()?;
        if leading != term {
            return Err(internal(format!("group {group}: the move began at placement term {term}, this node leads at {leading} now")));
        }
        // After the check: the window a test deposes the leader in.
        self.move_fault_point(group, step).await;
        Ok(())
    }

    /// Finishes or rolls back the move that made `learner` a learner of `group`, judged by the
    /// configuration the group's leader has applied.
    async fn settle_learner(&self, group: &GroupInfo, learner: u64) -> Result<(), tonic::Status> {
        let term = self.leading_term()?;
        let state = self.state().await?;
        let status = self.leader_status(&state, group).await?;
        if status.voters.contains(&learner) {
            // Promoted: the voter placement lists that the group no longer has was replaced.
            let replacing = group.replicas.iter().copied().find(|voter| !status.voters.contains(voter));
            self.propose(&Command::PromoteLearner { group_id: group.id, node: learner, replacing }).await?;
            tracing::info!(group = group.id, learner, ?replacing, "finished a replica move left half-way");
            return Ok(());
        }
        // Sent even when the leader does not list the learner (a move held before step 3):
        // applied, it raises the group's fence to this term, so the steps of the move a
        // deposed leader may still send are refused. It expects the voters just read: if a
        // deposed leader's step 5 lands first, it is refused, and the next round finds the
        // learner a voter and commits the promotion instead.
        self.change_peers(&state, group, vec![peer(Kind::Remove, learner)], term, status.voters.clone()).await?;
        self.propose(&Command::RemoveLearner { group_id: group.id, node: learner }).await?;
        tracing::info!(group = group.id, learner, "rolled back a replica move");
        Ok(())
    }

    /// Step 4: polls the learner until it has applied what the leader had committed.
    async fn wait_caught_up(&self, state: &Placement, group: &GroupInfo, learner: u64) -> Result<(), tonic::Status> {
        let target = self.leader_status(state, group).await?.commit;
        let deadline = tokio::time::Instant::now() + CATCH_UP_WAIT;
        let mut client = PlacementClient::new(self.channel(&node_addr(state, learner)?)?);
        loop {
            if let Ok(status) = client.replica_status(ReplicaStatusRequest { group_id: group.id }).await {
                if status.into_inner().applied >= target {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(internal(format!("group {}: the replica on node {learner} did not catch up in {CATCH_UP_WAIT:?}", group.id)));
            }
            tokio::time::sleep(CATCH_UP_POLL).await;
        }
    }

    /// Hands the leadership of `group_id` from `from` to `to`.
    async fn transfer_leader_of(&self, group_id: u64, from: u64, to: u64) -> Result<(), tonic::Status> {
        let state = self.state().await?;
        let request = TransferLeaderRequest { group_id, to };
        PlacementClient::new(self.channel(&node_addr(&state, from)?)?).transfer_leader(request).await?;
        Ok(())
    }

    /// Has the group's leader make `changes`, fenced at placement term `term`, expecting the
    /// group's voters to be `expect_voters`.
    async fn change_peers(
        &self,
        state: &Placement,
        group: &GroupInfo,
        changes: Vec<PeerChange>,
        term: u64,
        expect_voters: Vec<u64>,
    ) -> Result<ChangePeersResponse, tonic::Status> {
        let request = ChangePeersRequest { group_id: group.id, changes, placement_term: term, expect_voters };
        self.at_group_leader(state, group, |mut client| {
            let request = request.clone();
            async move { client.change_peers(request).await }
        })
        .await
    }

    async fn leader_status(&self, state: &Placement, group: &GroupInfo) -> Result<ReplicaStatusResponse, tonic::Status> {
        // Any replica answers; the one that leads answers with the group's configuration.
        for voter in &group.replicas {
            let Ok(addr) = node_addr(state, *voter) else { continue };
            let Ok(channel) = self.channel(&addr) else { continue };
            let Ok(status) = PlacementClient::new(channel).replica_status(ReplicaStatusRequest { group_id: group.id }).await else { continue };
            let status = status.into_inner();
            if status.leader_id == status.node_id {
                return Ok(status);
            }
        }
        Err(crate::service::status(warden_proto::v1::WardenError {
            code: Code::Unavailable as i32,
            message: format!("group {} has no leader among {:?}", group.id, group.replicas),
            ..Default::default()
        }))
    }
}

fn peer(kind: Kind, node_id: u64) -> PeerChange {
    PeerChange { kind: kind as i32, node_id }
}

fn node_addr(state: &Placement, node: u64) -> Result<String, tonic::Status> {
    state.node(node).map(|n| n.addr.clone()).ok_or_else(|| internal(format!("node {node} has no address")))
}
