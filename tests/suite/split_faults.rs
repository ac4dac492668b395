//! A split crashed at each step of its sequence (a test per step, numbered as in
//! `shard-node/src/placement/split.rs`: 3 freeze, 4 copy, 5 hand-over, 6 target descriptor,
//! 7 route), and a merge crashed at its steps (`shard-node/src/placement/merge.rs`: 3 copy,
//! 4 hand-over, 5 parent's descriptor, 6 route). At the held step the source group's leader,
//! the target group's leader, or the placement leader is killed (a crash: its in-process
//! node stops at once) and restarted on its data; the operation then finishes or rolls back,
//! and afterwards every path of the subtree is served by exactly one group with its data,
//! and takes writes. A replica move held between two of its steps
//! (`shard-node/src/placement/scheduler.rs`) while the placement leader running it is
//! deposed: its successor settles the move, and the deposed leader's later steps must not
//! change the group.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::placement::{
    CreateGroupRequest, GetRoutingTableRequest, NodeState, RemoveGroupRequest, RoutingTable, SetNodeStateRequest, SetSchedulerPausedRequest,
};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;
use warden_shard_node::service::error_of;

use crate::support::routed::{
    at_placement_leader, client, cluster_with_groups, create_group, group_serving, placement_client, start_router, transfer_leader, TIMEOUT,
};

/// Nodes in each moved subtree.
const NODES: usize = 200;
/// How long a crashed split may take to settle (a new placement leader looks every 5 s).
const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// The operation crashed.
#[derive(Clone, Copy, Debug)]
enum Operation {
    /// A subtree of the root group split into a new group.
    Split,
    /// A group of its own merged into the root group.
    Merge,
}

impl Operation {
    /// The first step held after the hand-over: from there the operation only finishes.
    fn decided_at(self) -> u8 {
        match self {
            Operation::Split => 6,
            Operation::Merge => 5,
        }
    }
}

/// Whose node is crashed at the held step.
#[derive(Clone, Copy, Debug)]
enum Crashed {
    Source,
    Target,
    Placement,
}

async fn table(cluster: &Cluster) -> RoutingTable {
    at_placement_leader(cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table")
}

/// Splits a fresh subtree of the root group (or merges a fresh group into it), holds the
/// operation before `step`, crashes `crashed`'s node there, lets it go on, and checks the
/// outcome.
async fn crash_at(
    cluster: &Cluster,
    router: &mut warden_proto::v1::warden_client::WardenClient<tonic::transport::Channel>,
    operation: Operation,
    step: u8,
    crashed: Crashed,
) {
    let subtree = format!("/{operation:?}{step}-{crashed:?}").to_lowercase();
    if let Operation::Merge = operation {
        create_group(cluster, &subtree).await;
    }
    fill(router, &subtree).await;
    let serving = group_serving(router, &subtree).await;

    cluster.faults().hold_split_at(step);
    let placement_leader = cluster.wait_leader(PLACEMENT_GROUP_ID, TIMEOUT).await.expect("placement leader");
    let mut placement = placement_client(cluster, placement_leader);
    let prefix = subtree.clone();
    let call = tokio::spawn(async move {
        match operation {
            Operation::Split => placement.split_group(CreateGroupRequest { prefix }).await.map(drop),
            Operation::Merge => placement.merge_group(RemoveGroupRequest { prefix }).await.map(drop),
        }
    });
    let deadline = Instant::now() + TIMEOUT;
    while cluster.faults().split_reached() != Some(step) {
        assert!(Instant::now() < deadline, "the {operation:?} never reached step {step}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (source, target) = match operation {
        Operation::Split => {
            let created = table(cluster).await.groups.iter().find(|g| !g.ready).and_then(|g| g.descriptor.as_ref()).map(|d| d.group_id);
            (serving, created.expect("target"))
        }
        Operation::Merge => (serving, 1),
    };
    let victim = match crashed {
        Crashed::Source => cluster.wait_leader(source, TIMEOUT).await.expect("source leader"),
        Crashed::Target => cluster.wait_leader(target, TIMEOUT).await.expect("target leader"),
        Crashed::Placement => placement_leader,
    };
    cluster.kill(victim);
    cluster.faults().release_split();
    cluster.restart(victim).expect("restart");
    // The call's own answer does not matter (its node may be gone); the outcome does.
    let _ = tokio::time::timeout(SETTLE_WAIT, call).await;

    let owner = settled_owner(cluster, &format!("{subtree}/n0")).await;
    let finished = owner == target;
    assert!(finished || owner == source, "{operation:?} step {step}, {crashed:?}: {subtree} is served by group {owner}");
    let other = if finished { source } else { target };
    eprintln!("{operation:?} step {step}, {crashed:?} crashed: {}", if finished { "finished" } else { "rolled back" });
    assert!(finished || step < operation.decided_at(), "{operation:?} step {step}, {crashed:?}: after the hand-over it only finishes");
    // A group merged away (or a split's target rolled back) is gone: only a group placement
    // still has is asked whether it refuses the subtree.
    let other_exists = table(cluster).await.groups.iter().any(|g| g.descriptor.as_ref().is_some_and(|d| d.group_id == other));

    // Exactly one group serves the subtree: its owner answers, the other refuses.
    for i in [0, NODES / 2, NODES - 1] {
        let path = format!("{subtree}/n{i}");
        let at = |group: u64| {
            let path = path.clone();
            async move {
                let leader = cluster.wait_leader(group, TIMEOUT).await.ok()?;
                let addr = cluster.addr(leader)?;
                let mut node = warden_proto::v1::warden_client::WardenClient::new(
                    tonic::transport::Channel::from_shared(format!("http://{addr}")).ok()?.connect_lazy(),
                );
                let routing = Some(Routing { group_id: group, ..Routing::default() });
                Some(node.get(GetRequest { path, routing, ..GetRequest::default() }).await)
            }
        };
        let answer = at(owner).await.expect("the owner's leader");
        assert_eq!(answer.expect("the owner serves it").into_inner().data, vec![i as u8], "step {step}, {crashed:?}: {path}'s data");
        if let Some(refused) = if other_exists { at(other).await } else { None } {
            let code = refused.err().and_then(|status| error_of(&status)).map(|e| e.code);
            assert_eq!(code, Some(Code::WrongGroup as i32), "step {step}, {crashed:?}: group {other} must not serve {path}");
        }
    }
    // Through the router: every node is there, and the subtree takes writes (no freeze left).
    for i in 0..NODES {
        let node = router.get(GetRequest { path: format!("{subtree}/n{i}"), ..GetRequest::default() }).await.expect("node").into_inner();
        assert_eq!(node.data, vec![i as u8]);
    }
    router.set(SetRequest { path: format!("{subtree}/n0"), data: b"after".to_vec(), ..SetRequest::default() }).await.expect("writable");
    cluster.faults().heal();
}

async fn crash_every_participant_at(operation: Operation, steps: &[u8]) {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    for step in steps {
        for crashed in [Crashed::Source, Crashed::Target, Crashed::Placement] {
            crash_at(&cluster, &mut router, operation, *step, crashed).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_freeze_settles_the_split() {
    crash_every_participant_at(Operation::Split, &[3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_copy_settles_the_split() {
    crash_every_participant_at(Operation::Split, &[4]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_hand_over_settles_the_split() {
    crash_every_participant_at(Operation::Split, &[5]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_hand_over_finishes_the_split() {
    crash_every_participant_at(Operation::Split, &[6]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_route_finishes_the_split() {
    crash_every_participant_at(Operation::Split, &[7]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_a_merge_hands_over_settles_it() {
    crash_every_participant_at(Operation::Merge, &[3, 4]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_merge_handed_over_finishes_it() {
    crash_every_participant_at(Operation::Merge, &[5, 6]).await;
}

/// Fills `subtree` with [`NODES`] nodes through the router (its root node may exist: a
/// group's prefix node is created with the group).
async fn fill(router: &mut warden_proto::v1::warden_client::WardenClient<tonic::transport::Channel>, subtree: &str) {
    if let Err(status) = router.create(CreateRequest { path: subtree.into(), ..CreateRequest::default() }).await {
        assert_eq!(error_of(&status).map(|e| e.code), Some(Code::NodeExists as i32), "subtree root: {status}");
    }
    let then = (0..NODES)
        .map(|i| TxnOp {
            op: Some(txn_op::Op::Create(CreateRequest { path: format!("{subtree}/n{i}"), data: vec![i as u8], ..CreateRequest::default() })),
        })
        .collect::<Vec<_>>();
    for chunk in then.chunks(100) {
        router.txn(TxnRequest { then: chunk.to_vec(), ..TxnRequest::default() }).await.expect("fill");
    }
}

/// The group the routing table sends `path` to, once no creation is pending.
async fn settled_owner(cluster: &Cluster, path: &str) -> u64 {
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let table = table(cluster).await;
        // Settled: no creation pending (a retired group is not routed, but not pending) and
        // no merge.
        if table.groups.iter().all(|g| (g.ready || g.retired) && g.merging_into == 0) {
            let owner = table
                .groups
                .iter()
                .filter_map(|g| g.descriptor.as_ref())
                .filter(|d| {
                    warden_placement::is_at_or_below(path, &d.prefix) && !d.excluded.iter().any(|e| warden_placement::is_at_or_below(path, e))
                })
                .map(|d| d.group_id)
                .collect::<Vec<_>>();
            assert_eq!(owner.len(), 1, "exactly one descriptor serves {path}: {table:?}");
            return owner[0];
        }
        assert!(Instant::now() < deadline, "the split or merge never settled: {table:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A split whose copy fails is rolled back (the source serves the subtree again, unfrozen,
/// and a later split of it works); one that fails after the hand-over cannot roll back and
/// finishes once its steps go through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_failing_before_the_hand_over_rolls_back_and_after_it_finishes() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let split = |prefix: &'static str| {
        at_placement_leader(&cluster, move |mut c| async move { c.split_group(CreateGroupRequest { prefix: prefix.into() }).await })
    };

    fill(&mut router, "/r").await;
    cluster.faults().fail_split_at(4);
    let failed = split("/r").await.expect_err("the copy fails");
    assert_eq!(settled_owner(&cluster, "/r/n0").await, 1, "rolled back to the source: {failed:?}");
    router.set(SetRequest { path: "/r/n0".into(), data: b"unfrozen".to_vec(), ..SetRequest::default() }).await.expect("writable again");
    cluster.faults().heal();
    let again = split("/r").await.expect("a later split of the same subtree").group.and_then(|g| g.descriptor).expect("descriptor");
    assert_eq!(settled_owner(&cluster, "/r/n0").await, again.group_id);
    assert_eq!(router.get(GetRequest { path: "/r/n0".into(), ..GetRequest::default() }).await.expect("moved").into_inner().data, b"unfrozen");

    fill(&mut router, "/f").await;
    cluster.faults().fail_split_at(6);
    split("/f").await.expect_err("the target's descriptor fails");
    // Handed over: the source no longer serves it, and nothing rolls it back.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(table(&cluster).await.groups.iter().any(|g| !g.ready), "still pending while the step fails");
    cluster.faults().heal();
    let owner = settled_owner(&cluster, "/f/n0").await;
    assert_ne!(owner, 1, "finished: the new group serves it");
    for i in 0..NODES {
        let node = router.get(GetRequest { path: format!("/f/n{i}"), ..GetRequest::default() }).await.expect("node").into_inner();
        assert_eq!(node.data, vec![i as u8]);
    }
}

/// A merge whose hand-over fails after the copy is rolled back: the merging group serves its
/// subtree again, unfrozen, and the parent's group drops the pages it ingested, so a node
/// deleted before the next merge stays deleted after it. One failing after the hand-over
/// cannot roll back and finishes once its steps go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_failing_before_the_hand_over_rolls_back_and_after_it_finishes() {
    let cluster = cluster_with_groups(&["/r", "/f"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let merge = |prefix: &'static str| {
        at_placement_leader(&cluster, move |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: prefix.into() }).await })
    };
    let merging = group_serving(&mut router, "/r").await;

    fill(&mut router, "/r").await;
    cluster.faults().fail_split_at(4);
    let failed = merge("/r").await.expect_err("the hand-over fails");
    assert_eq!(settled_owner(&cluster, "/r/n0").await, merging, "rolled back to the merging group: {failed:?}");
    router.set(SetRequest { path: "/r/n0".into(), data: b"unfrozen".to_vec(), ..SetRequest::default() }).await.expect("writable again");
    router.delete(DeleteRequest { path: "/r/n1".into(), ..DeleteRequest::default() }).await.expect("delete before the next merge");
    cluster.faults().heal();
    let merged = merge("/r").await.expect("a later merge of the same group");
    assert_eq!((merged.group_id, merged.parent_group_id), (merging, 1));
    assert_eq!(settled_owner(&cluster, "/r/n0").await, 1);
    assert_eq!(router.get(GetRequest { path: "/r/n0".into(), ..GetRequest::default() }).await.expect("moved").into_inner().data, b"unfrozen");
    let gone = router.get(GetRequest { path: "/r/n1".into(), ..GetRequest::default() }).await.expect_err("deleted before the merge");
    assert_eq!(error_of(&gone).map(|e| e.code), Some(Code::NoNode as i32), "nothing the first attempt copied is left behind");
    let root = router.get(GetRequest { path: "/r".into(), ..GetRequest::default() }).await.expect("root").into_inner();
    assert_eq!(root.stat.expect("stat").num_children, NODES as u64 - 1, "the subtree root keeps its children");

    fill(&mut router, "/f").await;
    cluster.faults().fail_split_at(5);
    merge("/f").await.expect_err("the parent's descriptor fails");
    // Handed over: the merging group no longer serves it, and nothing rolls it back.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(table(&cluster).await.groups.iter().any(|g| g.merging_into != 0), "still pending while the step fails");
    cluster.faults().heal();
    assert_eq!(settled_owner(&cluster, "/f/n0").await, 1, "finished: the parent's group serves it");
    for i in 0..NODES {
        let node = router.get(GetRequest { path: format!("/f/n{i}"), ..GetRequest::default() }).await.expect("node").into_inner();
        assert_eq!(node.data, vec![i as u8]);
    }
}

/// Six nodes (placement on 1–3, so a group of five always has a node to move to), the root
/// group and a group for `/a`, with balancing paused: only the moves a test starts run.
async fn six_nodes_balance_paused() -> Arc<Cluster> {
    let config = ClusterConfig { nodes: 6, serve_api: true, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(ShardNodeFactory::default())).expect("cluster starts"));
    cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap");
    at_placement_leader(&cluster, |mut c| async move { c.set_scheduler_paused(SetSchedulerPausedRequest { paused: true }).await })
        .await
        .expect("balance paused");
    create_group(&cluster, "/a").await;
    cluster
}

async fn set_node_state(cluster: &Cluster, node_id: u64, state: NodeState) {
    at_placement_leader(cluster, |mut c| async move { c.set_node_state(SetNodeStateRequest { node_id, state: state as i32 }).await })
        .await
        .expect("node state set");
}

fn sorted(mut ids: Vec<u64>) -> Vec<u64> {
    ids.sort_unstable();
    ids
}

/// Waits until placement lists no learner, then checks every group's leader has applied the
/// voters placement lists, and no learner.
async fn check_groups_as_placement_lists(cluster: &Cluster, what: &str) {
    let deadline = Instant::now() + SETTLE_WAIT;
    let table = loop {
        let table = table(cluster).await;
        if table.groups.iter().all(|g| g.learners.is_empty()) {
            break table;
        }
        assert!(Instant::now() < deadline, "{what}: a move never settled: {table:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for descriptor in table.groups.iter().filter_map(|g| g.descriptor.as_ref()) {
        let group = descriptor.group_id;
        let leader = cluster.wait_leader(group, TIMEOUT).await.expect("group leader");
        let status = cluster.handle(leader).expect("leader node").status(group).await.expect("status");
        assert_eq!(sorted(status.voters.clone()), sorted(descriptor.replicas.clone()), "{what}: group {group}'s voters are what placement lists");
        assert!(status.learners.is_empty(), "{what}: group {group} has learners placement does not list: {status:?}");
    }
}

/// Drains a node of `/a`'s group so placement moves its replica, holds the move before
/// `step` on the placement leader running it, hands placement leadership to another node
/// (the old leader keeps running, its move still held), lets the new leader settle the
/// move, and only then lets the deposed leader's move go on.
async fn depose_the_placement_leader_before_move_step(
    cluster: &Cluster,
    router: &mut warden_proto::v1::warden_client::WardenClient<tonic::transport::Channel>,
    step: u8,
) {
    let what = format!("deposed before step {step}");
    let group = group_serving(router, "/a/x").await;
    let replicas = table(cluster).await.groups.iter().filter_map(|g| g.descriptor.clone()).find(|d| d.group_id == group).expect("/a").replicas;
    let drained = [4, 5, 6].into_iter().find(|node| replicas.contains(node)).expect("a replica outside placement");
    let deposed = cluster.wait_leader(PLACEMENT_GROUP_ID, TIMEOUT).await.expect("placement leader");
    let successor = [1, 2, 3].into_iter().find(|node| *node != deposed).expect("another placement replica");

    let deposed_term = cluster.handle(deposed).expect("placement leader").status(PLACEMENT_GROUP_ID).await.expect("status").term;
    cluster.faults().hold_move_at(deposed, group, step);
    set_node_state(cluster, drained, NodeState::Draining).await;
    let deadline = Instant::now() + SETTLE_WAIT;
    while cluster.faults().move_reached() != Some(step) {
        assert!(Instant::now() < deadline, "{what}: the move never reached step {step}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing more to move once the move is undone: the successor only settles it.
    set_node_state(cluster, drained, NodeState::Serving).await;
    transfer_leader(cluster, PLACEMENT_GROUP_ID, successor).await;
    // The successor settles the learner the held move added to placement.
    let deadline = Instant::now() + SETTLE_WAIT;
    while table(cluster).await.groups.iter().any(|g| !g.learners.is_empty()) {
        assert!(Instant::now() < deadline, "{what}: the new placement leader never settled the move");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Now the deposed leader's move goes on, and ends (it cannot commit to placement).
    cluster.faults().release_moves();
    let deadline = Instant::now() + SETTLE_WAIT;
    while !cluster.faults().held_move_ended() {
        assert!(Instant::now() < deadline, "{what}: the deposed leader's move never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    check_groups_as_placement_lists(cluster, &what).await;
    // The settlement raised the group's fence above the deposed leader's term.
    let leader = cluster.wait_leader(group, TIMEOUT).await.expect("group leader");
    let fence = cluster.handle(leader).expect("leader node").status(group).await.expect("status").conf_fence;
    assert!(fence > deposed_term, "{what}: the group's fence {fence} is not above the deposed leader's term {deposed_term}");
    let path = format!("/a/after-{step}");
    router.create(CreateRequest { path: path.clone(), data: b"after".to_vec(), ..CreateRequest::default() }).await.expect("the group takes writes");
    let read = router.get(GetRequest { path, ..GetRequest::default() }).await.expect("read back").into_inner();
    assert_eq!(read.data, b"after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_placement_leaders_replica_move_cannot_change_the_group_after_its_successor_settled_the_move() {
    let cluster = six_nodes_balance_paused().await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    // Before the learner is added (step 3), and before the joint change that promotes it (5).
    for step in [3, 5] {
        depose_the_placement_leader_before_move_step(&cluster, &mut router, step).await;
    }
}
