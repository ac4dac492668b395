//! The placement leader's scheduler on a real in-process cluster of six nodes. A
//! node killed for good has its replicas replaced on the others after `down_after_ms`; a
//! drained node ends up hosting nothing while the groups keep serving, and a decommissioned
//! one becomes a tombstone; a removed group gives its prefix back to the root group and its
//! replicas are destroyed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::routed::{at_placement_leader, placement_client};

use tonic::transport::Channel;
use warden_placement::PlacementConfig;
use warden_proto::placement::*;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;
use warden_shard_node::service::error_of;

const TIMEOUT: Duration = Duration::from_secs(20);
/// How long a repair may take once the node counts as gone (the issue allows 60 s).
const REPAIR_WAIT: Duration = Duration::from_secs(60);
const DOWN_AFTER_MS: u64 = 3_000;

/// Six nodes, placement on 1–3, a group for `/a` beside the root group.
async fn fleet() -> Arc<Cluster> {
    let placement = PlacementConfig { heartbeat_timeout_ms: 1_500, down_after_ms: DOWN_AFTER_MS, ..PlacementConfig::default() };
    let factory = ShardNodeFactory { placement, ..ShardNodeFactory::default() };
    let config = ClusterConfig { nodes: 6, serve_api: true, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(factory)).expect("cluster starts"));
    cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap");
    at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/a".into() }).await }).await.expect("group /a");
    cluster
}

async fn table(cluster: &Cluster) -> RoutingTable {
    at_placement_leader(cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table")
}

fn replicas_of(table: &RoutingTable) -> Vec<(u64, Vec<u64>, Vec<u64>)> {
    table.groups.iter().filter_map(|g| g.descriptor.as_ref().map(|d| (d.group_id, d.replicas.clone(), g.learners.clone()))).collect()
}

/// Waits until every group has five voters, none on `away`, and no move in flight; then checks
/// each group's leader has applied the same voters.
async fn wait_groups_leave(cluster: &Cluster, away: u64, wait: Duration) {
    let deadline = Instant::now() + wait;
    loop {
        let groups = replicas_of(&table(cluster).await);
        if groups.iter().all(|(_, voters, learners)| voters.len() == 5 && !voters.contains(&away) && learners.is_empty()) {
            for (group, voters, _) in groups {
                let leader = cluster.wait_leader(group, TIMEOUT).await.expect("leader");
                let status =
                    placement_client(cluster, leader).replica_status(ReplicaStatusRequest { group_id: group }).await.expect("status").into_inner();
                let (mut applied, mut listed) = (status.voters.clone(), voters.clone());
                applied.sort_unstable();
                listed.sort_unstable();
                assert_eq!(applied, listed, "group {group}: the leader's voters are what placement lists");
            }
            return;
        }
        assert!(Instant::now() < deadline, "groups still on node {away}: {groups:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn write(cluster: &Cluster, path: &str) {
    create_in(cluster, if path.starts_with("/a/") { 2 } else { 1 }, path).await;
}

/// Creates `path` (holding its own name) at the leader of `group`.
async fn create_in(cluster: &Cluster, group: u64, path: &str) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let leader = cluster.wait_leader(group, TIMEOUT).await.expect("leader");
        let addr = cluster.addr(leader).expect("addr");
        let mut api = WardenClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy());
        let routing = Some(Routing { group_id: group, ..Routing::default() });
        let create = CreateRequest { path: path.into(), data: path.as_bytes().to_vec(), create_parents: true, routing, ..CreateRequest::default() };
        match api.create(create).await {
            Ok(_) => return,
            Err(status) if error_of(&status).is_some_and(|e| e.code == Code::NodeExists as i32) => return,
            Err(status) => assert!(Instant::now() < deadline, "write {path}: {status}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn read(cluster: &Cluster, path: &str) -> Vec<u8> {
    let group = if path.starts_with("/a/") { 2 } else { 1 };
    let leader = cluster.wait_leader(group, TIMEOUT).await.expect("leader");
    let addr = cluster.addr(leader).expect("addr");
    let mut api = WardenClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy());
    let routing = Some(Routing { group_id: group, ..Routing::default() });
    api.get(GetRequest { path: path.into(), routing, ..GetRequest::default() }).await.expect("read").into_inner().data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gone_for_good_has_its_replicas_replaced_and_no_write_is_lost() {
    let cluster = fleet().await;
    let paths: Vec<String> = (0..20).flat_map(|i| [format!("/k{i}"), format!("/a/k{i}")]).collect();
    for path in &paths[..20] {
        write(&cluster, path).await;
    }
    // A node outside placement that hosts a replica of the root group.
    let before = table(&cluster).await;
    let root = replicas_of(&before).into_iter().find(|(id, _, _)| *id == 1).expect("root group");
    let victim = [4, 5, 6].into_iter().find(|id| root.1.contains(id)).expect("a victim");
    cluster.kill(victim);
    let killed = Instant::now();
    for path in &paths[20..] {
        write(&cluster, path).await;
    }
    wait_groups_leave(&cluster, victim, Duration::from_millis(DOWN_AFTER_MS) + REPAIR_WAIT).await;
    eprintln!("repaired {:?} after the kill", killed.elapsed());
    for path in &paths {
        assert_eq!(read(&cluster, path).await, path.as_bytes(), "{path} survived the repair");
    }
    let after = table(&cluster).await;
    for (id, group) in after.groups.iter().filter_map(|g| g.descriptor.as_ref()).map(|d| (d.group_id, d)) {
        let old = before.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.group_id == id).expect("same groups");
        assert!(group.conf_ver > old.conf_ver && group.version >= old.version, "group {id}: epochs only grow");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_hosts_nothing_and_a_decommissioned_one_becomes_a_tombstone() {
    let cluster = fleet().await;
    for i in 0..10 {
        write(&cluster, &format!("/a/d{i}")).await;
    }
    let drained = 4;
    let set = |state: NodeState| {
        let cluster = cluster.clone();
        async move {
            at_placement_leader(
                &cluster,
                |mut c| async move { c.set_node_state(SetNodeStateRequest { node_id: drained, state: state as i32 }).await },
            )
            .await
            .expect("state set")
        }
    };
    set(NodeState::Draining).await;
    // Writes go on while the node is drained.
    for i in 10..20 {
        write(&cluster, &format!("/a/d{i}")).await;
    }
    wait_groups_leave(&cluster, drained, REPAIR_WAIT).await;
    for i in 0..20 {
        let path = format!("/a/d{i}");
        assert_eq!(read(&cluster, &path).await, path.as_bytes());
    }
    let node = |table: &RoutingTable| table.nodes.iter().find(|n| n.id == drained).cloned().expect("node");
    assert_eq!(node(&table(&cluster).await).state, NodeState::Draining as i32, "a drained node stays until undrained");
    set(NodeState::Decommissioning).await;
    let deadline = Instant::now() + TIMEOUT;
    while node(&table(&cluster).await).state != NodeState::Tombstone as i32 {
        assert!(Instant::now() < deadline, "never became a tombstone");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = at_placement_leader(&cluster, |mut c| async move {
        c.set_node_state(SetNodeStateRequest { node_id: drained, state: NodeState::Serving as i32 }).await
    })
    .await;
    assert_eq!(refused.err().map(|e| e.code), Some(Code::InvalidArgument as i32), "a tombstone is final");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_group_gives_an_empty_prefix_back_to_the_parent_and_destroys_the_replicas() {
    let cluster = fleet().await;
    let drop_a = || at_placement_leader(&cluster, |mut c| async move { c.remove_group(RemoveGroupRequest { prefix: "/a".into() }).await });
    write(&cluster, "/a/x").await;
    let refused = drop_a().await.err().map(|e| e.code);
    assert_eq!(refused, Some(Code::NotEmpty as i32), "a group whose prefix has children stays");
    assert_eq!(read(&cluster, "/a/x").await, b"/a/x", "a refused removal changes nothing");
    let leader = cluster.wait_leader(2, TIMEOUT).await.expect("leader of /a");
    let mut api = WardenClient::new(Channel::from_shared(format!("http://{}", cluster.addr(leader).expect("addr"))).expect("uri").connect_lazy());
    let routing = || Some(Routing { group_id: 2, ..Routing::default() });
    api.delete(DeleteRequest { path: "/a/x".into(), routing: routing(), ..DeleteRequest::default() }).await.expect("delete /a/x");
    let last_revision = api.sync(SyncRequest { routing: routing() }).await.expect("sync").into_inner().header.expect("header").revision;

    let removed = drop_a().await.expect("an empty group is removed");
    assert_eq!((removed.group_id, removed.parent_group_id), (2, 1));
    assert!(table(&cluster).await.groups.iter().all(|g| g.descriptor.as_ref().is_some_and(|d| d.group_id != 2)), "group 2 left the table");
    // The root group serves the prefix now, with revisions above every one group 2 issued.
    create_in(&cluster, 1, "/a/y").await;
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    let mut root = WardenClient::new(Channel::from_shared(format!("http://{}", cluster.addr(leader).expect("addr"))).expect("uri").connect_lazy());
    let got = root
        .get(GetRequest { path: "/a/y".into(), routing: Some(Routing { group_id: 1, ..Routing::default() }), ..GetRequest::default() })
        .await
        .expect("/a/y in the root group")
        .into_inner();
    let stat = got.stat.expect("stat");
    assert!(stat.create_revision > last_revision, "revision {} of /a/y is above group 2's last {last_revision}", stat.create_revision);
    // Every node destroys its replica of group 2 (told by its heartbeats).
    let deadline = Instant::now() + TIMEOUT;
    for node in cluster.running() {
        while placement_client(&cluster, node).replica_status(ReplicaStatusRequest { group_id: 2 }).await.is_ok() {
            assert!(Instant::now() < deadline, "node {node} still hosts group 2");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Removed is removed: asking again finds no group.
    assert_eq!(drop_a().await.err().map(|e| e.code), Some(Code::NoNode as i32));
}
