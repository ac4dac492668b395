//! Issue 16: a split crashed at each step of its sequence (a test per step, numbered as in
//! `shard-node/src/placement/split.rs`: 3 freeze, 4 copy, 5 hand-over, 6 target descriptor,
//! 7 route). At the held step the source group's leader, the target group's leader, or the
//! placement leader is killed (a crash: its in-process node stops at once) and restarted
//! on its data; the split then finishes or rolls back, and afterwards every path of the
//! subtree is served by exactly one group with its data, and takes writes.

mod support;

use std::time::Duration;

use tokio::time::Instant;
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::placement::{CreateGroupRequest, GetRoutingTableRequest, RoutingTable};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::Cluster;
use warden_shard_node::service::error_of;

use support::routed::{at_placement_leader, client, cluster_with_groups, placement_client, start_router, TIMEOUT};

/// Nodes in each moved subtree.
const NODES: usize = 200;
/// How long a crashed split may take to settle (a new placement leader looks every 5 s).
const SETTLE_WAIT: Duration = Duration::from_secs(60);

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

/// Splits a fresh subtree, holds the split before `step`, crashes `crashed`'s node there,
/// lets it go on, and checks the outcome.
async fn crash_at(
    cluster: &Cluster,
    router: &mut warden_proto::v1::warden_client::WardenClient<tonic::transport::Channel>,
    step: u8,
    crashed: Crashed,
) {
    let subtree = format!("/s{step}-{crashed:?}").to_lowercase();
    router.create(CreateRequest { path: subtree.clone(), ..CreateRequest::default() }).await.expect("subtree");
    let then = (0..NODES)
        .map(|i| TxnOp {
            op: Some(txn_op::Op::Create(CreateRequest { path: format!("{subtree}/n{i}"), data: vec![i as u8], ..CreateRequest::default() })),
        })
        .collect::<Vec<_>>();
    for chunk in then.chunks(100) {
        router.txn(TxnRequest { then: chunk.to_vec(), ..TxnRequest::default() }).await.expect("fill");
    }

    cluster.faults().hold_split_at(step);
    let placement_leader = cluster.wait_leader(PLACEMENT_GROUP_ID, TIMEOUT).await.expect("placement leader");
    let mut placement = placement_client(cluster, placement_leader);
    let prefix = subtree.clone();
    let call = tokio::spawn(async move { placement.split_group(CreateGroupRequest { prefix }).await });
    let deadline = Instant::now() + TIMEOUT;
    while cluster.faults().split_reached() != Some(step) {
        assert!(Instant::now() < deadline, "the split never reached step {step}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let target = table(cluster).await.groups.iter().find(|g| !g.ready).and_then(|g| g.descriptor.as_ref()).map(|d| d.group_id).expect("target");
    let victim = match crashed {
        Crashed::Source => cluster.wait_leader(1, TIMEOUT).await.expect("source leader"),
        Crashed::Target => cluster.wait_leader(target, TIMEOUT).await.expect("target leader"),
        Crashed::Placement => placement_leader,
    };
    cluster.kill(victim);
    cluster.faults().release_split();
    cluster.restart(victim).expect("restart");
    // The call's own answer does not matter (its node may be gone); the outcome does.
    let _ = tokio::time::timeout(SETTLE_WAIT, call).await;

    let deadline = Instant::now() + SETTLE_WAIT;
    let table = loop {
        let table = table(cluster).await;
        if table.groups.iter().all(|g| g.ready) {
            break table;
        }
        assert!(Instant::now() < deadline, "step {step}, {crashed:?}: the split never settled: {table:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let finished = table.groups.iter().any(|g| g.descriptor.as_ref().is_some_and(|d| d.group_id == target));
    let owner = if finished { target } else { 1 };
    let other = if finished { 1 } else { target };
    eprintln!("step {step}, {crashed:?} crashed: the split {}", if finished { "finished" } else { "rolled back" });
    assert!(finished || step < 6, "step {step}, {crashed:?}: after the hand-over a split only finishes");

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
        if let Some(refused) = at(other).await {
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

async fn crash_every_participant_at(step: u8) {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    for crashed in [Crashed::Source, Crashed::Target, Crashed::Placement] {
        crash_at(&cluster, &mut router, step, crashed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_freeze_settles_the_split() {
    crash_every_participant_at(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_copy_settles_the_split() {
    crash_every_participant_at(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_hand_over_settles_the_split() {
    crash_every_participant_at(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_hand_over_finishes_the_split() {
    crash_every_participant_at(6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_route_finishes_the_split() {
    crash_every_participant_at(7).await;
}
