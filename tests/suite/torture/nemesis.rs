//! The nemesis: a seeded schedule of faults and the hand that applies them to a
//! [`ProcessCluster`] on test hosts. A schedule alternates quiet spells and faults; each
//! fault's victims are chosen when it starts (a group's leader is whoever leads then), by the
//! schedule's own random stream, and written down with it. Adding a fault kind is one variant
//! of [`FaultKind`] (with its name), one arm in [`Nemesis::start`] and, if it needs more
//! than healing the network (which also removes link impairments), one [`Undo`].

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use warden_proto::placement::{CreateGroupRequest, GetRoutingTableRequest, GroupEntry, NodeState, RemoveGroupRequest, SetNodeStateRequest};
use warden_torture::{End, Impairment, TestNet};

use tonic::transport::Channel;
use warden_proto::placement::placement_client::PlacementClient;

use crate::support::processes::{placement_leader_among, ProcessCluster, PLACEMENT_NODES};
use crate::support::workload::SESSION_TTL;

/// Every kind of fault the nemesis makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// One node cut off from every other node, the router and the clients.
    IsolateNode,
    /// The leader of one shard group (as it stands when the fault starts) isolated.
    IsolateGroupLeader,
    /// The placement group's leader isolated.
    IsolatePlacementLeader,
    /// Two nodes against the others; the router and clients reach both sides.
    Halves,
    /// Two sides (two nodes and the rest) that cannot reach each other, and one node both
    /// sides reach.
    Bridge,
    /// One node hears nothing from one other (it still reaches it): an asymmetric link.
    OneWay,
    /// The router's (and clients') packets to one node are dropped; the nodes among
    /// themselves are whole.
    RouterCut,
    /// One node stopped (SIGSTOP) for longer than a session's TTL, then continued.
    Pause,
    /// One node killed (SIGKILL) and started again on its data directory when the fault ends.
    Kill,
    /// Every packet to one node, and from it to the other nodes, held 20–120 ms more, with
    /// as much jitter again (so packets pass each other): a slow, uneven link.
    SlowNode,
    /// 10–30% of the packets to one node, and from it to the other nodes, lost: TCP
    /// retransmits, calls slow down unevenly.
    LossyNode,
    /// One node isolated and, while it is, a subtree split off into a group of its own; when
    /// the fault ends, the network heals and the subtree is merged back: both moves made in
    /// the middle of faults, the registers under it in use throughout.
    SplitMerge,
    /// One node's wall clock stepped 30–120 s forward or back (an NTP step), and put right
    /// when the fault ends; the node is the placement leader, a group's leader or any node.
    ClockJump,
    /// One node's wall clock running 5–20% fast or slow, put right when the fault ends.
    ClockDrift,
    /// One node isolated and, while it is, another drained: placement moves each replica the
    /// drained node holds to a node without one of that group (the cluster has a node more
    /// than a group has replicas), each move a learner added, caught up and promoted in the
    /// middle of the fault. When the fault ends the network heals; once the drained node is
    /// empty (or the moves' time is up) it serves again, and balancing may fill it.
    MoveReplicas,
}

impl FaultKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FaultKind; 15] = [
        FaultKind::IsolateNode,
        FaultKind::IsolateGroupLeader,
        FaultKind::IsolatePlacementLeader,
        FaultKind::Halves,
        FaultKind::Bridge,
        FaultKind::OneWay,
        FaultKind::RouterCut,
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::SlowNode,
        FaultKind::LossyNode,
        FaultKind::SplitMerge,
        FaultKind::ClockJump,
        FaultKind::ClockDrift,
        FaultKind::MoveReplicas,
    ];

    /// The kind's name in schedules, verdicts and `FAULTS=` lists (its serialized form).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::IsolateNode => "isolate-node",
            FaultKind::IsolateGroupLeader => "isolate-group-leader",
            FaultKind::IsolatePlacementLeader => "isolate-placement-leader",
            FaultKind::Halves => "halves",
            FaultKind::Bridge => "bridge",
            FaultKind::OneWay => "one-way",
            FaultKind::RouterCut => "router-cut",
            FaultKind::Pause => "pause",
            FaultKind::Kill => "kill",
            FaultKind::SlowNode => "slow-node",
            FaultKind::LossyNode => "lossy-node",
            FaultKind::SplitMerge => "split-merge",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::ClockDrift => "clock-drift",
            FaultKind::MoveReplicas => "move-replicas",
        }
    }

    /// The kinds named in `list` (comma-separated; `all` for every kind).
    pub fn parse_list(list: &str) -> Result<Vec<FaultKind>, String> {
        if list.trim() == "all" {
            return Ok(FaultKind::ALL.to_vec());
        }
        let kinds: Vec<FaultKind> = list
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| FaultKind::ALL.into_iter().find(|kind| kind.name() == name).ok_or_else(|| format!("no fault kind {name:?}")))
            .collect::<Result<_, _>>()?;
        if kinds.is_empty() {
            return Err("no fault kind named".into());
        }
        Ok(kinds)
    }

    /// The shortest the fault lasts: a pause outlives a session's TTL (the case where a
    /// paused holder resurfaces after its session could have expired).
    fn length_min(self) -> Duration {
        match self {
            FaultKind::Pause => SESSION_TTL + Duration::from_secs(2),
            _ => Duration::from_secs(5),
        }
    }
}

impl serde::Serialize for FaultKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// The subtree [`FaultKind::SplitMerge`] moves: two of the workload's registers live under
/// it (in the root group), so their history spans both moves.
pub const MOVED_SUBTREE: &str = "/a";
/// Longest the nemesis waits for a split or a merge (retrying while placement has no
/// leader it reaches); one that did not finish is written down, not waited for.
const MOVE_TIMEOUT: Duration = Duration::from_secs(20);
/// A placement call's own deadline within [`MOVE_TIMEOUT`].
const PLACEMENT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Quiet time between two faults, and how long a fault lasts beyond its kind's minimum.
const QUIET_MS: std::ops::Range<u64> = 2_000..4_000;
const EXTRA_LENGTH_MS: std::ops::Range<u64> = 0..5_000;

/// One planned fault: when it starts (from the history's start) and how long it lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Planned {
    pub kind: FaultKind,
    pub start_ms: u64,
    pub length_ms: u64,
}

/// The faults of one history: from `seed`, kinds drawn from `kinds`, starting within
/// `duration`. The same seed and arguments give the same plan.
pub fn plan(seed: u64, kinds: &[FaultKind], duration: Duration) -> Vec<Planned> {
    assert!(!kinds.is_empty(), "a plan needs at least one fault kind");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut planned = Vec::new();
    let mut at_ms = rng.random_range(QUIET_MS);
    let end_ms = duration.as_millis() as u64;
    while at_ms < end_ms {
        let kind = kinds[rng.random_range(0..kinds.len())];
        let length_ms = kind.length_min().as_millis() as u64 + rng.random_range(EXTRA_LENGTH_MS);
        planned.push(Planned { kind, start_ms: at_ms, length_ms });
        at_ms += length_ms + rng.random_range(QUIET_MS);
    }
    planned
}

/// What has to happen for a fault to end, besides healing every link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Undo {
    /// Links only.
    Heal,
    /// SIGCONT to the node.
    Resume(u64),
    /// Start the node again on its data.
    Restart(u64),
    /// Merge [`MOVED_SUBTREE`] back into its parent's group (after healing).
    Merge,
    /// Put the node's wall clock right.
    Clock(u64),
    /// Let the node serve again once its replicas have moved (after healing).
    Undrain(u64),
}

/// A fault as it was applied: its victims, and when it really started and ended.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Applied {
    pub kind: FaultKind,
    /// What was done, in words ("isolated node 3 (leader of group 4)").
    pub what: String,
    /// Nodes the fault cut off, stopped or killed.
    pub victims: Vec<u64>,
    /// The group whose leader was the target (isolate-group-leader), if any.
    pub group: Option<u64>,
    /// Milliseconds from the history's start.
    pub start_ms: u64,
    pub end_ms: u64,
    pub undo: Undo,
}

/// Applies faults to a cluster of [`super::NODES`] nodes (one more than a group's replicas,
/// so a replica has somewhere to move), node `id` on host `id - 1` of `net`.
pub struct Nemesis {
    net: std::sync::Arc<TestNet>,
    rng: StdRng,
    /// Shard groups whose leaders may be targeted.
    groups: Vec<u64>,
    /// The split a [`FaultKind::SplitMerge`] or the drain a [`FaultKind::MoveReplicas`]
    /// started, answering what came of it.
    splitting: Option<tokio::task::JoinHandle<String>>,
    /// Moves still going on after their fault ended (a merge waits for its split): the
    /// fault's index among those started, and the task answering what came of it.
    moves: Vec<(usize, tokio::task::JoinHandle<String>)>,
    /// Faults started so far.
    started: usize,
}

impl Nemesis {
    /// A nemesis choosing its victims from `seed`'s stream (not the plan's: a plan stays the
    /// same whatever the victims were).
    pub fn new(net: std::sync::Arc<TestNet>, seed: u64, groups: Vec<u64>) -> Nemesis {
        Nemesis { net, rng: StdRng::seed_from_u64(seed ^ 0x6e65_6d65_7369_7321), groups, splitting: None, moves: Vec::new(), started: 0 }
    }

    /// Starts a fault of `kind`; answers what was done (the caller sets its `start_ms` once
    /// this returns, [`Nemesis::end`] its `end_ms`).
    pub async fn start(&mut self, cluster: &mut ProcessCluster, kind: FaultKind) -> Applied {
        let mut ids = cluster.node_ids();
        ids.shuffle(&mut self.rng);
        let host = |id: u64| End::Host(id as usize - 1);
        let ends = |ids: &[u64]| ids.iter().map(|id| host(*id)).collect::<Vec<_>>();
        self.started += 1;
        let mut applied = Applied { kind, what: String::new(), victims: Vec::new(), group: None, start_ms: 0, end_ms: 0, undo: Undo::Heal };
        match kind {
            FaultKind::IsolateNode => {
                self.net.isolate(ids[0] as usize - 1).expect("isolate a node");
                applied.what = format!("isolated node {}", ids[0]);
                applied.victims = vec![ids[0]];
            }
            FaultKind::IsolateGroupLeader => {
                let group = self.groups[self.rng.random_range(0..self.groups.len())];
                let leader = cluster.group_leader(group, None).await;
                let victim = leader.unwrap_or(ids[0]);
                self.net.isolate(victim as usize - 1).expect("isolate a group's leader");
                applied.what = match leader {
                    Some(leader) => format!("isolated node {leader}, leader of group {group}"),
                    None => format!("isolated node {victim} (group {group} had no known leader)"),
                };
                applied.victims = vec![victim];
                applied.group = Some(group);
            }
            FaultKind::IsolatePlacementLeader => {
                let leader = cluster.placement_leader(None).await;
                let victim = leader.unwrap_or(PLACEMENT_NODES[self.rng.random_range(0..PLACEMENT_NODES.len())]);
                self.net.isolate(victim as usize - 1).expect("isolate the placement leader");
                applied.what = match leader {
                    Some(leader) => format!("isolated node {leader}, the placement leader"),
                    None => format!("isolated placement node {victim} (no known placement leader)"),
                };
                applied.victims = vec![victim];
            }
            FaultKind::Halves => {
                let (minority, majority) = ids.split_at(2);
                self.net.partition(&ends(minority), &ends(majority)).expect("partition into halves");
                applied.what = format!("partitioned {minority:?} from {majority:?}");
                applied.victims = minority.to_vec();
            }
            FaultKind::Bridge => {
                let (bridge, rest) = ids.split_first().expect("nodes");
                let (left, right) = rest.split_at(rest.len() / 2);
                self.net.partition(&ends(left), &ends(right)).expect("partition around a bridge");
                applied.what = format!("partitioned {left:?} from {right:?}; node {bridge} reaches both");
                applied.victims = left.to_vec();
            }
            FaultKind::OneWay => {
                self.net.cut(host(ids[0]), host(ids[1])).expect("cut one way");
                applied.what = format!("node {} hears nothing from node {}", ids[1], ids[0]);
                applied.victims = vec![ids[1]];
            }
            FaultKind::RouterCut => {
                self.net.cut(End::Machine, host(ids[0])).expect("cut the router's link");
                applied.what = format!("the router's and clients' packets to node {} are dropped", ids[0]);
                applied.victims = vec![ids[0]];
            }
            FaultKind::Pause => {
                cluster.pause(ids[0]);
                applied.what = format!("paused node {} (SIGSTOP)", ids[0]);
                applied.victims = vec![ids[0]];
                applied.undo = Undo::Resume(ids[0]);
            }
            FaultKind::Kill => {
                cluster.kill(ids[0]);
                applied.what = format!("killed node {} (SIGKILL)", ids[0]);
                applied.victims = vec![ids[0]];
                applied.undo = Undo::Restart(ids[0]);
            }
            FaultKind::SlowNode => {
                let delay_ms = self.rng.random_range(20..=120);
                let impairment = Impairment { delay_ms, jitter_ms: delay_ms, loss_percent: 0 };
                self.impair_node(ids[0], impairment);
                applied.what = format!("node {}'s links slowed by {delay_ms} ms + up to {delay_ms} ms of jitter", ids[0]);
                applied.victims = vec![ids[0]];
            }
            FaultKind::LossyNode => {
                let loss_percent = self.rng.random_range(10..=30);
                self.impair_node(ids[0], Impairment { delay_ms: 0, jitter_ms: 0, loss_percent });
                applied.what = format!("node {}'s links lose {loss_percent}% of their packets", ids[0]);
                applied.victims = vec![ids[0]];
            }
            FaultKind::SplitMerge => {
                self.net.isolate(ids[0] as usize - 1).expect("isolate a node");
                let clients = cluster.placement_clients(PLACEMENT_CALL_TIMEOUT);
                // In the background: the fault is on from now, and the split happens in it.
                self.splitting = Some(tokio::spawn(placement_call(clients, "split", |mut placement| async move {
                    placement.split_group(CreateGroupRequest { prefix: MOVED_SUBTREE.into() }).await.map(|r| {
                        let group = r.into_inner().group.and_then(|g| g.descriptor).map_or(0, |d| d.group_id);
                        format!("into group {group}")
                    })
                })));
                applied.what = format!("isolated node {}, then split {MOVED_SUBTREE} off", ids[0]);
                applied.victims = vec![ids[0]];
                applied.undo = Undo::Merge;
            }
            FaultKind::MoveReplicas => {
                let (isolated, drained) = (ids[0], ids[1]);
                self.net.isolate(isolated as usize - 1).expect("isolate a node");
                let clients = cluster.placement_clients(PLACEMENT_CALL_TIMEOUT);
                // In the background, as a split: the moves happen in the fault.
                self.splitting = Some(tokio::spawn(set_node_state(clients, drained, NodeState::Draining)));
                applied.what = format!("isolated node {isolated}, then drained node {drained}");
                applied.victims = vec![isolated, drained];
                applied.undo = Undo::Undrain(drained);
            }
            FaultKind::ClockJump | FaultKind::ClockDrift => {
                let (victim, role) = self.clock_victim(cluster, ids[0]).await;
                let sign = if self.rng.random_bool(0.5) { 1 } else { -1 };
                if kind == FaultKind::ClockJump {
                    let offset_ms = sign * self.rng.random_range(30_000..=120_000);
                    cluster.set_clock(victim, offset_ms, 0);
                    applied.what = format!("stepped the wall clock of node {victim}{role} by {offset_ms} ms");
                } else {
                    let drift_ppm = sign * self.rng.random_range(50_000..=200_000);
                    cluster.set_clock(victim, 0, drift_ppm);
                    applied.what =
                        format!("node {victim}{role}'s wall clock runs {}% {}", drift_ppm.abs() / 10_000, if sign > 0 { "fast" } else { "slow" });
                }
                applied.victims = vec![victim];
                applied.undo = Undo::Clock(victim);
            }
        }
        applied
    }

    /// Whose clock a clock fault moves: the placement leader (it judges which nodes are
    /// down by its wall clock), a shard group's leader (lock-delays and commands' times), or
    /// `any`, a third of the time each; and its role, in words.
    async fn clock_victim(&mut self, cluster: &ProcessCluster, any: u64) -> (u64, String) {
        match self.rng.random_range(0..3) {
            0 => match cluster.placement_leader(None).await {
                Some(leader) => (leader, " (the placement leader)".into()),
                None => (any, String::new()),
            },
            1 => {
                let group = self.groups[self.rng.random_range(0..self.groups.len())];
                match cluster.group_leader(group, None).await {
                    Some(leader) => (leader, format!(" (leader of group {group})")),
                    None => (any, String::new()),
                }
            }
            _ => (any, String::new()),
        }
    }

    /// Impairs every link into node `id` (from the other nodes and from the machine: the
    /// router and the clients) and from it to the other nodes. (Its answers to the machine
    /// pass unimpaired: the machine is no test host, and impairments are made where packets
    /// arrive.)
    fn impair_node(&self, id: u64, impairment: Impairment) {
        let host = id as usize - 1;
        for other in (0..self.net.hosts().len()).filter(|other| *other != host) {
            self.net.impair(End::Host(other), host, impairment).expect("impair a link into the node");
            self.net.impair(End::Host(host), other, impairment).expect("impair a link from the node");
        }
        self.net.impair(End::Machine, host, impairment).expect("impair the machine's link to the node");
    }

    /// Ends `applied` at `end_ms`: heals every link (and impairment) and resumes or
    /// restarts its victim, or merges the moved subtree back, or undrains the drained node
    /// once it is empty (the last two written down in its `what`).
    pub async fn end(&mut self, cluster: &mut ProcessCluster, applied: &mut Applied, end_ms: u64) {
        self.net.heal_all().expect("heal every link");
        applied.end_ms = end_ms;
        match applied.undo {
            Undo::Heal => {}
            Undo::Resume(id) => cluster.resume(id),
            Undo::Restart(id) => cluster.restart(id),
            Undo::Clock(id) => cluster.set_clock(id, 0, 0),
            Undo::Merge => {
                // In the background too: the plan goes on while the split finishes and the
                // merge is made; [`Nemesis::finish`] waits for both.
                let splitting = self.splitting.take();
                let clients = cluster.placement_clients(PLACEMENT_CALL_TIMEOUT);
                let moves = tokio::spawn(async move {
                    let split = match splitting {
                        Some(task) => task.await.unwrap_or_else(|e| format!("the split's task failed: {e}")),
                        None => "never started".to_string(),
                    };
                    let merge = placement_call(clients, "merge", |mut placement| async move {
                        placement.merge_group(RemoveGroupRequest { prefix: MOVED_SUBTREE.into() }).await.map(|r| {
                            let merged = r.into_inner();
                            format!("group {} into group {}", merged.group_id, merged.parent_group_id)
                        })
                    })
                    .await;
                    format!(": {split}; healed, then merged it back: {merge}")
                });
                self.moves.push((self.started - 1, moves));
            }
            Undo::Undrain(drained) => {
                let draining = self.splitting.take();
                let clients = cluster.placement_clients(PLACEMENT_CALL_TIMEOUT);
                let moves = tokio::spawn(async move {
                    let drain = match draining {
                        Some(task) => task.await.unwrap_or_else(|e| format!("the drain's task failed: {e}")),
                        None => "never started".to_string(),
                    };
                    let emptied = wait_empty(&clients, drained).await;
                    let undrain = set_node_state(clients, drained, NodeState::Serving).await;
                    format!(": {drain}; healed, {emptied}; undrained: {undrain}")
                });
                self.moves.push((self.started - 1, moves));
            }
        }
    }

    /// Waits for the moves still going on and writes what came of each into its fault
    /// (`applied`: every fault started, in order).
    pub async fn finish(&mut self, applied: &mut [Applied]) {
        for (index, task) in self.moves.drain(..) {
            let outcome = task.await.unwrap_or_else(|e| format!(": the moves' task failed: {e}"));
            if let Some(fault) = applied.get_mut(index) {
                fault.what.push_str(&outcome);
            }
        }
    }
}

/// Sets node `id`'s state at the placement leader ([`placement_call`]).
async fn set_node_state(clients: Vec<(u64, PlacementClient<Channel>)>, id: u64, state: NodeState) -> String {
    placement_call(clients, "node state", move |mut placement| async move {
        placement.set_node_state(SetNodeStateRequest { node_id: id, state: state as i32 }).await.map(|_| format!("node {id} {}", state.as_str_name()))
    })
    .await
}

/// Waits (up to [`MOVE_TIMEOUT`]) until placement's routing table places no replica on node
/// `id`; answers how that went, in words.
async fn wait_empty(clients: &[(u64, PlacementClient<Channel>)], id: u64) -> String {
    let started = std::time::Instant::now();
    while started.elapsed() < MOVE_TIMEOUT {
        if let Some(leader) = placement_leader_among(clients, None).await {
            if let Some((_, placement)) = clients.iter().find(|(node, _)| *node == leader) {
                if let Ok(table) = placement.clone().get_routing_table(GetRoutingTableRequest {}).await {
                    let holds =
                        |group: &GroupEntry| group.learners.contains(&id) || group.descriptor.as_ref().is_some_and(|d| d.replicas.contains(&id));
                    if !table.into_inner().groups.iter().any(holds) {
                        return format!("node {id} emptied in {} ms", started.elapsed().as_millis());
                    }
                }
            }
        }
        // A pause between looks, not a wait for something: the loop ends at the timeout.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    format!("node {id} still held replicas after {MOVE_TIMEOUT:?}")
}

/// Makes a placement call (`call` on a client of the placement leader, as the placement
/// nodes behind `clients` see it) until it succeeds or [`MOVE_TIMEOUT`] passes; answers
/// what came of it, in words, for the fault's record: a move refused or unfinished under a
/// fault is a finding to read, not a harness failure (the checks judge what the clients saw).
async fn placement_call<F, Fut>(clients: Vec<(u64, PlacementClient<Channel>)>, what: &'static str, call: F) -> String
where
    F: Fn(PlacementClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<String, tonic::Status>>,
{
    let started = std::time::Instant::now();
    let mut last = String::from("no placement leader found");
    while started.elapsed() < MOVE_TIMEOUT {
        let leader = placement_leader_among(&clients, None).await;
        if let Some((_, placement)) = clients.iter().find(|(id, _)| Some(*id) == leader) {
            match call(placement.clone()).await {
                Ok(done) => return format!("{done} in {} ms", started.elapsed().as_millis()),
                // A retry of a split whose first try's answer was lost finds it made.
                Err(status) if status.code() == tonic::Code::AlreadyExists => {
                    return format!("{} ({what} made by an earlier try) in {} ms", status.message(), started.elapsed().as_millis())
                }
                Err(status) => last = format!("{:?}: {}", status.code(), status.message()),
            }
        }
        // A pause between tries, not a wait for something: the loop ends at the timeout.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    format!("{what} not done in {MOVE_TIMEOUT:?} (last: {last})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_plan_within_the_duration_and_of_the_kinds_asked() {
        let kinds = [FaultKind::Pause, FaultKind::Halves];
        let plan_a = plan(7, &kinds, Duration::from_secs(60));
        assert_eq!(plan_a, plan(7, &kinds, Duration::from_secs(60)), "the same seed plans the same faults");
        assert_ne!(plan_a, plan(8, &kinds, Duration::from_secs(60)), "another seed plans others");
        assert!(plan_a.len() >= 4, "a minute holds several faults: {plan_a:?}");
        for pair in plan_a.windows(2) {
            assert!(pair[0].start_ms + pair[0].length_ms < pair[1].start_ms, "faults do not overlap: {pair:?}");
        }
        assert!(plan_a.iter().all(|p| p.start_ms < 60_000 && kinds.contains(&p.kind)));
        let pause_ms = SESSION_TTL.as_millis() as u64;
        assert!(plan_a.iter().filter(|p| p.kind == FaultKind::Pause).all(|p| p.length_ms > pause_ms), "pauses outlive a session");
    }

    #[test]
    fn fault_lists_parse_by_name_and_refuse_unknown_names() {
        assert_eq!(FaultKind::parse_list("all"), Ok(FaultKind::ALL.to_vec()));
        assert_eq!(FaultKind::parse_list("kill, pause"), Ok(vec![FaultKind::Kill, FaultKind::Pause]));
        assert!(FaultKind::parse_list("kill,flood").is_err_and(|e| e.contains("flood")));
        assert!(FaultKind::parse_list(" ,").is_err());
    }
}
