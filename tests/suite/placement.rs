//! The placement group hosted on shard-nodes: bootstrap, node registration and liveness from
//! heartbeats, and creating a shard group for a prefix (replicas placed, created on their
//! nodes, routed only once the group has a leader), through the `warden.placement` API.

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

async fn placement_cluster(heartbeat_timeout_ms: u64) -> Arc<Cluster> {
    let factory =
        ShardNodeFactory { placement: PlacementConfig { heartbeat_timeout_ms, ..PlacementConfig::default() }, ..ShardNodeFactory::default() };
    // At least four heartbeats per timeout, as in production (1 s against 10 s): a node stays
    // up though a heartbeat or two is late on a loaded machine, or waits for the next write of
    // the heartbeats placement heard.
    let placement_heartbeat_ms = (heartbeat_timeout_ms / 4).min(warden_engine::config::PLACEMENT_HEARTBEAT_MS_DEFAULT);
    let config = ClusterConfig { serve_api: true, placement_heartbeat_ms, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(factory)).expect("cluster starts"));
    let root = cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap");
    assert_eq!((root.group_id, root.prefix.as_str(), root.replicas.len()), (1, "/", 5));
    cluster
}

fn api(cluster: &Cluster, node: u64) -> WardenClient<Channel> {
    let addr = cluster.addr(node).expect("addr");
    WardenClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy())
}

async fn table(cluster: &Cluster) -> RoutingTable {
    at_placement_leader(cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_group_is_placed_created_and_routed_once_it_has_a_leader() {
    let cluster = placement_cluster(10_000).await;
    let root_leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    api(&cluster, root_leader).create(CreateRequest { path: "/teams".into(), ..CreateRequest::default() }).await.expect("create /teams");
    let before = table(&cluster).await;
    assert_eq!(before.groups.len(), 1);
    let created = at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/teams/payments".into() }).await })
        .await
        .expect("group created");
    let entry = created.group.expect("group");
    let descriptor = entry.descriptor.expect("descriptor");
    assert!(entry.ready, "answered once routed");
    assert_eq!((descriptor.group_id, descriptor.prefix.as_str()), (2, "/teams/payments"));
    let mut replicas = descriptor.replicas.clone();
    replicas.sort_unstable();
    replicas.dedup();
    assert_eq!(replicas.len(), 5, "five distinct nodes");
    assert!(created.routing_version > before.version);

    // Requests are checked against the groups' descriptors.
    let root_leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    let mut root_api = api(&cluster, root_leader);
    let misrouted = CreateRequest { path: "/teams/payments/x".into(), ..CreateRequest::default() };
    let refused = root_api.create(misrouted).await.expect_err("the root group no longer serves it");
    let error = error_of(&refused).expect("typed");
    assert_eq!(error.code, Code::WrongGroup as i32);
    assert_eq!(error.descriptor.map(|d| d.excluded), Some(vec!["/teams/payments".to_string()]), "the answer says what it serves");
    let delete_parent = DeleteRequest { path: "/teams".into(), recursive: true, ..DeleteRequest::default() };
    let refused = root_api.delete(delete_parent).await.expect_err("a subtree lives in another group");
    assert_eq!(error_of(&refused).map(|e| e.code), Some(Code::NotEmpty as i32));

    // The routing table has the route; the root group's descriptor carves the prefix out.
    let after = table(&cluster).await;
    let root = after.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.group_id == 1).expect("root group");
    assert_eq!(root.excluded, vec!["/teams/payments".to_string()]);
    assert!(root.version > 1, "the root group's epoch moved");
    // The new group has a leader and takes writes.
    let leader = cluster.wait_leader(2, TIMEOUT).await.expect("leader of the new group");
    let mut group_api = api(&cluster, leader);
    let routing = Some(Routing { group_id: 2, ..Routing::default() });
    let create = CreateRequest { path: "/teams/payments/lock".into(), routing, ..CreateRequest::default() };
    group_api.create(create).await.expect("write to the new group (its prefix node is its root)");
    let outside = GetRequest { path: "/teams".into(), routing, ..GetRequest::default() };
    assert_eq!(error_of(&group_api.get(outside).await.expect_err("outside")).map(|e| e.code), Some(Code::WrongGroup as i32));
    let root_delete = DeleteRequest { path: "/teams/payments".into(), recursive: true, routing, ..DeleteRequest::default() };
    assert_eq!(error_of(&group_api.delete(root_delete).await.expect_err("root")).map(|e| e.code), Some(Code::InvalidArgument as i32));

    // A prefix where the owner already holds nodes cannot be given away (no subtree moves).
    let mut root_api = api(&cluster, cluster.wait_leader(1, TIMEOUT).await.expect("root leader"));
    root_api.create(CreateRequest { path: "/busy/x".into(), create_parents: true, ..CreateRequest::default() }).await.expect("create");
    let busy = at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/busy".into() }).await }).await;
    assert_eq!(busy.err().map(|e| e.code), Some(Code::NotEmpty as i32));
    let after_busy = table(&cluster).await;
    assert!(after_busy.groups.iter().all(|g| g.descriptor.as_ref().is_some_and(|d| d.prefix != "/busy")), "the failed group is dropped");

    // The same prefix again, and a malformed one, are refused, typed, changing nothing.
    let after = table(&cluster).await;
    let again =
        at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/teams/payments".into() }).await }).await;
    assert_eq!(again.err().map(|e| e.code), Some(Code::NodeExists as i32));
    let bad = at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "teams//x".into() }).await }).await;
    assert_eq!(bad.err().map(|e| e.code), Some(Code::InvalidPath as i32));
    assert_eq!(table(&cluster).await.version, after.version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_marked_down_and_comes_back_up_when_it_heartbeats() {
    let cluster = placement_cluster(2_000).await;
    let up = |table: &RoutingTable, id: u64| table.nodes.iter().find(|n| n.id == id).map(|n| n.up);
    // Placement lives on nodes 1-3; node 5 goes silent.
    cluster.kill(5);
    let deadline = Instant::now() + TIMEOUT;
    while up(&table(&cluster).await, 5) != Some(false) {
        assert!(Instant::now() < deadline, "node 5 was never marked down");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(up(&table(&cluster).await, 4), Some(true), "heartbeating nodes stay up");
    cluster.restart(5).expect("restart");
    let deadline = Instant::now() + TIMEOUT;
    while up(&table(&cluster).await, 5) != Some(true) {
        assert!(Instant::now() < deadline, "node 5 never came back up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Heartbeats of registered nodes reach placement's log batched, one command per flush
/// interval for all of them, not one per heartbeat: with five nodes heartbeating every 50 ms
/// (100 heartbeats a second), placement's log grows by a few entries a second, and every node
/// stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_of_every_node_cost_placement_one_command_per_interval() {
    let factory = ShardNodeFactory::default();
    let config = ClusterConfig { serve_api: true, placement_heartbeat_ms: 50, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(factory)).expect("cluster starts"));
    cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap");
    let placement = warden_placement::PLACEMENT_GROUP_ID;
    let leader = cluster.wait_leader(placement, TIMEOUT).await.expect("placement leader");
    let applied = |cluster: Arc<Cluster>| async move {
        cluster.statuses(placement).await.into_iter().find(|status| status.node_id == leader).map(|status| status.applied).expect("leader's status")
    };
    // Registrations and the root group's creation are over once every node is up.
    let deadline = Instant::now() + TIMEOUT;
    while table(&cluster).await.nodes.iter().filter(|node| node.up).count() < 5 {
        assert!(Instant::now() < deadline, "not every node registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let window = Duration::from_secs(2);
    let (before, started) = (applied(cluster.clone()).await, Instant::now());
    tokio::time::sleep(window).await;
    let (after, elapsed) = (applied(cluster.clone()).await, started.elapsed());
    assert_eq!(cluster.wait_leader(placement, TIMEOUT).await.expect("leader"), leader, "the same leader throughout");
    let flushes = elapsed.as_millis() / warden_shard_node::placement::service::HEARTBEATS_FLUSH_INTERVAL.as_millis() + 2;
    let heartbeats = 5 * elapsed.as_millis() / 50;
    assert!(after - before <= flushes as u64, "{} placement entries in {elapsed:?} for ~{heartbeats} heartbeats", after - before);
    assert!(after > before, "the heartbeats were recorded");
    assert!(table(&cluster).await.nodes.iter().all(|node| node.up), "every heartbeating node stays up");
}

/// `WatchRoutingTable` (what routers watch instead of polling): a placement node sends the
/// current table, then each newer version as its replica applies it; a node without a
/// placement replica refuses, so a watcher moves on to another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_table_is_pushed_to_watchers_as_it_changes() {
    let cluster = placement_cluster(10_000).await;
    let mut tables =
        placement_client(&cluster, 2).watch_routing_table(WatchRoutingTableRequest { after_version: 0 }).await.expect("watch").into_inner();
    let first = tables.message().await.expect("stream").expect("the current table");
    assert!(first.groups.iter().any(|g| g.descriptor.as_ref().is_some_and(|d| d.prefix == "/")));
    at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/w".into() }).await })
        .await
        .expect("create group");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let table = tokio::time::timeout(remaining, tables.message()).await.expect("pushed in time").expect("stream").expect("open");
        assert!(table.version > first.version, "only newer versions are sent");
        if table.groups.iter().any(|g| g.ready && g.descriptor.as_ref().is_some_and(|d| d.prefix == "/w")) {
            break;
        }
    }
    let refused = placement_client(&cluster, 5)
        .watch_routing_table(WatchRoutingTableRequest { after_version: 0 })
        .await
        .expect_err("no placement replica on node 5");
    assert_eq!(error_of(&refused).map(|e| e.code), Some(Code::WrongGroup as i32), "{refused}");
}

/// A client of `group`'s current leader, with requests routed to that group.
async fn group_api(cluster: &Cluster, group: u64) -> (WardenClient<Channel>, Option<Routing>) {
    let leader = cluster.wait_leader(group, TIMEOUT).await.expect("group leader");
    (api(cluster, leader), Some(Routing { group_id: group, ..Routing::default() }))
}

/// Takes and releases the lock at `path` in `group` with a new session homed there; answers
/// the fencing token it was granted.
async fn lock_token(cluster: &Cluster, group: u64, path: &str) -> u64 {
    let (mut api, routing) = group_api(cluster, group).await;
    let session = api
        .create_session(CreateSessionRequest { ttl_ms: 10_000, routing, ..CreateSessionRequest::default() })
        .await
        .expect("session")
        .into_inner()
        .session_id;
    let lock = LockRequest { path: path.into(), session_id: session, request_id: 1, routing, ..LockRequest::default() };
    let held = api.lock(lock).await.expect("lock").into_inner();
    assert!(held.acquired, "nobody else holds {path}");
    let sequencer = held.sequencer.expect("sequencer");
    api.close_session(CloseSessionRequest { session_id: session, routing }).await.expect("close releases the lock");
    sequencer.token
}

/// A new shard group starts at revision 0, so a lock path that moves to it
/// could be granted tokens lower than the group serving it before had issued (DESIGN.md rule
/// 5). Placement raises the new group's revision above the giving group's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_growing_when_a_path_moves_to_a_new_group() {
    let cluster = placement_cluster(10_000).await;
    let (mut root, routing) = group_api(&cluster, 1).await;
    for i in 0..60 {
        let create = CreateRequest { path: format!("/writes/n{i}"), create_parents: true, routing, ..CreateRequest::default() };
        root.create(create).await.expect("write");
    }
    let before = lock_token(&cluster, 1, "/t/x").await;
    assert!(before > 60, "the root group's revision is high: token {before}");
    // Nothing is left under /t in the root group, so it can be given away.
    let delete = DeleteRequest { path: "/t".into(), recursive: true, routing, ..DeleteRequest::default() };
    root.delete(delete).await.expect("delete /t");
    let created = at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/t".into() }).await })
        .await
        .expect("group for /t");
    let group = created.group.and_then(|g| g.descriptor).expect("descriptor").group_id;
    let after = lock_token(&cluster, group, "/t/x").await;
    assert!(after > before, "the token of /t/x went backwards when /t moved to group {group}: {after} after {before}");
}

/// Every group's answer for `path`: the groups that serve it (anything but WRONG_GROUP).
async fn groups_serving(cluster: &Cluster, groups: &[u64], path: &str) -> Vec<u64> {
    let mut serving = Vec::new();
    for group in groups {
        let (mut api, routing) = group_api(cluster, *group).await;
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let exists = ExistsRequest { path: path.into(), routing, ..ExistsRequest::default() };
            match api.exists(exists).await {
                Ok(_) => {
                    serving.push(*group);
                    break;
                }
                Err(status) => match error_of(&status).map(|e| Code::try_from(e.code)) {
                    Some(Ok(Code::WrongGroup)) => break,
                    // Anything else is a refusal by a group that serves the path.
                    Some(Ok(code)) if code != Code::NotLeader && code != Code::Unavailable => {
                        serving.push(*group);
                        break;
                    }
                    _ => {
                        assert!(Instant::now() < deadline, "group {group} did not answer for {path}: {status}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        api = group_api(cluster, *group).await.0;
                    }
                },
            }
        }
    }
    serving
}

/// Concurrent `CreateGroup` calls each computed descriptors from a state read
/// before the others' `GroupReady`, and a group accepted an equal descriptor version with other
/// contents, so two groups could serve the same paths. After eight concurrent creations of
/// nested and sibling prefixes, every path is served by exactly one group, the one the
/// routing table names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_group_creations_leave_every_path_served_by_exactly_one_group() {
    let cluster = placement_cluster(10_000).await;
    let prefixes = ["/t", "/t/a", "/t/a/b", "/t/c", "/u", "/u/a", "/v", "/t/a/b/c"];
    let creations: Vec<_> = prefixes
        .iter()
        .map(|prefix| {
            let cluster = cluster.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                at_placement_leader(&cluster, |mut c| {
                    let prefix = prefix.clone();
                    async move { c.create_group(CreateGroupRequest { prefix }).await }
                })
                .await
                .map_err(|e| format!("{prefix}: {e:?}"))
            })
        })
        .collect();
    for creation in creations {
        creation.await.expect("task").expect("every creation succeeds");
    }
    let table = table(&cluster).await;
    let descriptors: Vec<GroupDescriptor> = table.groups.iter().filter(|g| g.ready).filter_map(|g| g.descriptor.clone()).collect();
    assert_eq!(descriptors.len(), prefixes.len() + 1, "every group is ready: {table:?}");
    let groups: Vec<u64> = descriptors.iter().map(|d| d.group_id).collect();
    let owner = |path: &str| {
        descriptors
            .iter()
            .filter(|d| warden_placement::is_at_or_below(path, &d.prefix))
            .max_by_key(|d| d.prefix.len())
            .map(|d| d.group_id)
            .expect("/ is routed")
    };
    let mut paths: Vec<String> = prefixes.iter().flat_map(|p| [p.to_string(), format!("{p}/x")]).collect();
    paths.extend(["/".to_string(), "/w".to_string()]);
    for path in &paths {
        let serving = groups_serving(&cluster, &groups, path).await;
        assert_eq!(serving, vec![owner(path)], "{path} must be served by exactly the group the table routes it to");
    }
}

/// The ready group the routing table routes `prefix` to, once there is one.
async fn wait_routed(cluster: &Cluster, prefix: &str) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let table = table(cluster).await;
        let routed = table.groups.iter().filter(|g| g.ready).filter_map(|g| g.descriptor.as_ref()).find(|d| d.prefix == prefix);
        if let Some(descriptor) = routed {
            return descriptor.group_id;
        }
        assert!(Instant::now() < deadline, "{prefix} was never routed: {table:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A creation left half-way (the placement leader went away after
/// committing `CreateGroup`) stayed "creating" forever and blocked nothing, while its prefix
/// was never served by it. The placement leader resumes it; one that cannot be finished (the
/// owner holds nodes under the prefix) is rolled back, and the owner keeps serving the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_left_half_way_is_resumed_or_rolled_back() {
    use warden_placement::Command;
    use warden_shard_node::placement::state_machine::encode_command;
    let cluster = placement_cluster(10_000).await;
    let (mut root, routing) = group_api(&cluster, 1).await;
    root.create(CreateRequest { path: "/busy/x".into(), create_parents: true, routing, ..CreateRequest::default() }).await.expect("create");
    // Only step 1 of each creation happens, as when the leader stops right after it.
    let placement = warden_placement::PLACEMENT_GROUP_ID;
    let created = cluster.propose(placement, encode_command(&Command::CreateGroup { prefix: "/r".into(), now_ms: 0 }), TIMEOUT).await;
    created.expect("CreateGroup /r committed");
    let group = wait_routed(&cluster, "/r").await;
    assert_eq!(groups_serving(&cluster, &[1, group], "/r/x").await, vec![group], "the resumed group serves /r alone");
    let busy = cluster.propose(placement, encode_command(&Command::CreateGroup { prefix: "/busy".into(), now_ms: 0 }), TIMEOUT).await;
    busy.expect("CreateGroup /busy committed");
    let deadline = Instant::now() + TIMEOUT;
    while table(&cluster).await.groups.iter().any(|g| !g.ready) {
        assert!(Instant::now() < deadline, "the creation of /busy was never rolled back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(table(&cluster).await.groups.iter().all(|g| g.descriptor.as_ref().is_some_and(|d| d.prefix != "/busy")), "/busy dropped");
    assert_eq!(groups_serving(&cluster, &[1, group], "/busy/x").await, vec![1], "the root group still serves /busy");
    // Nothing is left blocking the next creation.
    at_placement_leader(&cluster, |mut c| async move { c.create_group(CreateGroupRequest { prefix: "/s".into() }).await }).await.expect("create /s");
}
