//! A live subtree split into its own group and merged back, end to end through a
//! router on an in-process cluster, under the process tests' workload (register clients
//! whose history the WGL checker judges, a creator, lockers writing to a fenced resource,
//! one lock inside the moving subtree), plus a node written with a counter, ephemerals of
//! sessions homed in three groups and recursive client-library watchers of the subtree and
//! of the whole namespace. Across both moves: the register history is linearizable, no
//! acknowledged write or create is lost, the fenced resource saw no overlap and growing
//! tokens, every watcher saw every acknowledged write of the counter once, in order
//! (`watch_check`'s ordered, unique, atomic and reliable rules on the subtree's events, whose
//! revisions keep growing across groups), the 10,000 nodes keep their data and stat, and a
//! session's end at its home still deletes its moved ephemeral.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use warden_loadgen::watch_check::{self, AckedWrite, Delivery, Event, EventKind};
use warden_proto::placement::{CreateGroupRequest, GetRoutingTableRequest, RemoveGroupRequest};
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

use crate::support::moving::{
    check_moved_ephemerals_follow_their_sessions, counter, counter_writer, ephemerals_of_three_homes, fill, filled, get, keep_alive,
};
use crate::support::routed::{at_placement_leader, client, cluster_with_groups, group_serving, session_homed_at, start_router, TIMEOUT};
use crate::support::workload::{Workload, PREFIXES};

const SUBTREE: &str = "/a";
/// The node written with a counter whose every acknowledged value the watchers must see.
const WRITTEN: &str = "/a/w";
/// A node of the parent path's group written with a counter beside the subtree.
const BESIDE: &str = "/beside";
const NODES: usize = 10_000;
const TTL_MS: u64 = 10_000;
/// The counter's last value: the watchers stop at it.
const LAST: u64 = u64::MAX;

/// A recursive watcher through the client library: the events of the subtree and those of
/// `BESIDE` (revisions are per group, so each is checked on its own), the events of one
/// revision as one response, until the counter's last value.
fn subtree_watcher(mut watcher: ::warden_client::Watcher) -> tokio::task::JoinHandle<[Delivery; 2]> {
    tokio::spawn(async move {
        let mut deliveries: [Vec<Vec<Event>>; 2] = [Vec::new(), Vec::new()];
        loop {
            let event = watcher.next().await.expect("the watch goes on across both moves").expect("not ended");
            let responses = match &event.node.path {
                path if warden_placement::is_at_or_below(path, SUBTREE) => &mut deliveries[0],
                path if path == BESIDE => &mut deliveries[1],
                _ => continue,
            };
            let kind = match event.kind {
                ::warden_client::EventKind::Created => EventKind::Created,
                ::warden_client::EventKind::Changed => EventKind::Changed,
                ::warden_client::EventKind::Deleted => EventKind::Deleted,
            };
            let last = event.node.path == WRITTEN && counter(&event.node.data) == LAST;
            let event = Event { revision: event.revision, path: event.node.path, kind, data: event.node.data };
            // The library hands events one by one: one transaction's make one response.
            match responses.last_mut() {
                Some(response) if response.first().is_some_and(|first| first.revision == event.revision) => response.push(event),
                _ => responses.push(vec![event]),
            }
            if last {
                return deliveries.map(|responses| Delivery { responses });
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subtree_split_off_and_merged_back_under_load_keeps_every_guarantee() {
    let cluster = cluster_with_groups(&PREFIXES).await;
    let router_process = start_router(&cluster, 0);
    let router_addr = router_process.addr.to_string();
    let mut router = client(router_process.addr);
    let root_group = group_serving(&mut router, "/").await;

    // The subtree: 10,000 nodes, the counter node, ephemerals of sessions homed in three groups.
    router.create(CreateRequest { path: SUBTREE.into(), ..CreateRequest::default() }).await.expect("subtree root");
    router.create(CreateRequest { path: WRITTEN.into(), ..CreateRequest::default() }).await.expect("counter node");
    router.create(CreateRequest { path: BESIDE.into(), ..CreateRequest::default() }).await.expect("node beside");
    fill(&mut router, SUBTREE, NODES, 0).await;
    let (sessions, renewals) = ephemerals_of_three_homes(&mut router, SUBTREE, ["/", "/b", "/c"], TTL_MS).await;
    let before = filled(&mut router, SUBTREE, NODES).await;

    // Watchers, the counter writer and the workload run through both moves. The lockers of
    // the lock inside the subtree have their sessions homed in /b: a merge waits for the
    // sessions homed in the merging group to end (docs/design/subtree-moves.md).
    let library = ::warden_client::Client::connect(::warden_client::ClientConfig::new([router_addr.clone()])).await.expect("client");
    let mut watchers = Vec::new();
    for path in [SUBTREE, "/"] {
        let options = ::warden_client::WatchOptions { recursive: true, ..::warden_client::WatchOptions::new(path) };
        watchers.push((path, subtree_watcher(library.watch(options).await.expect("watch"))));
    }
    let workload = Workload::start_with_locks(&router_addr, &[("/a/locks/x", "/b"), ("/b/locks/x", "/b/locks/x")]).await;
    let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let writer = counter_writer(router.clone(), WRITTEN, acked.clone(), stop.clone());
    let beside_writer = counter_writer(router.clone(), BESIDE, acked.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = Instant::now();
    let split = at_placement_leader(&cluster, |mut c| async move { c.split_group(CreateGroupRequest { prefix: SUBTREE.into() }).await })
        .await
        .expect("split");
    let split_ms = started.elapsed().as_millis();
    let split_group = split.group.and_then(|g| g.descriptor).expect("descriptor").group_id;
    workload.log(format!("split {SUBTREE} into group {split_group} in {split_ms} ms"));
    assert_eq!(group_serving(&mut router, SUBTREE).await, split_group);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = Instant::now();
    let merged = at_placement_leader(&cluster, |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: SUBTREE.into() }).await })
        .await
        .expect("merge");
    let merge_ms = started.elapsed().as_millis();
    workload.log(format!("merged group {} back into group {} in {merge_ms} ms", merged.group_id, merged.parent_group_id));
    assert_eq!((merged.group_id, merged.parent_group_id), (split_group, root_group));
    assert_eq!(group_serving(&mut router, SUBTREE).await, root_group, "the parent path's group serves the subtree again");
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop.store(true, Ordering::Relaxed);
    let ((failed, longest), (beside_failed, beside_longest)) = (writer.await.expect("writer"), beside_writer.await.expect("writer"));
    // Figures, not assertions (a loaded machine stretches them).
    println!(
        "{{\"split_merge_nodes\": {NODES}, \"split_ms\": {split_ms}, \"merge_ms\": {merge_ms}, \"write_pause_inside_ms\": {}, \"write_longest_beside_ms\": {}}}",
        longest.as_millis(),
        beside_longest.as_millis()
    );
    assert_eq!(failed, 0, "writes into the moving subtree are retried by the router, not failed");
    assert_eq!(beside_failed, 0, "writes beside the moving subtree never fail");
    router.set(SetRequest { path: WRITTEN.into(), data: LAST.to_be_bytes().to_vec(), ..SetRequest::default() }).await.expect("last write");
    workload.finish_and_check("split and merge").await;

    // Every watcher: ordered, unique and atomic on the subtree's events (revisions grow across
    // the groups: each move raises the next group's revision above the last), and every
    // acknowledged write of the counter delivered.
    let acked = acked.lock().expect("acked").clone();
    for (path, watcher) in watchers {
        let deliveries = tokio::time::timeout(TIMEOUT, watcher).await.expect("the watcher saw the last write").expect("watcher");
        for (written, delivery) in [WRITTEN, BESIDE].into_iter().zip(deliveries) {
            let acked: Vec<AckedWrite> = acked.iter().filter(|w| w.path == written).cloned().collect();
            assert!(acked.len() > 50, "too few writes of {written} ({})", acked.len());
            let (first, last) = (acked.first().map_or(0, |w| w.revision), acked.last().map_or(0, |w| w.revision));
            // The subtree's watcher sees nothing beside it.
            let in_scope = |p: &str| warden_placement::is_at_or_below(p, path);
            watch_check::check_all(&delivery).unwrap_or_else(|violation| panic!("the watch of {path}, {written}: {violation}"));
            watch_check::check_reliable(&delivery, &acked, first, last, in_scope)
                .unwrap_or_else(|violation| panic!("the watch of {path}, {written}: {violation}"));
        }
    }

    // The subtree is whole in the parent's group, listed under its parent, and nothing is
    // left half-way in placement.
    let after = filled(&mut router, SUBTREE, NODES).await;
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((&b.data, &b.stat), (&a.data, &a.stat), "every node keeps its data and stat across both moves");
    }
    let children = router.get_children(GetChildrenRequest { path: "/".into(), ..Default::default() }).await.expect("children").into_inner();
    assert_eq!(children.names.iter().filter(|n| *n == "a").count(), 1, "the subtree root is listed once under its parent");
    let table = at_placement_leader(&cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table");
    assert!(
        table.groups.iter().all(|g| g.ready && g.descriptor.as_ref().is_some_and(|d| d.group_id != split_group)),
        "the merged group is gone: {table:?}"
    );

    check_moved_ephemerals_follow_their_sessions(&cluster, &mut router, SUBTREE, sessions).await;
    renewals.abort();
}

/// A merged group stays the home of the sessions it homes: they keep working (keepalives,
/// their ephemerals, now in the parent's group as remote records under its authority, new
/// ephemerals there), no new session is homed in it, and it is removed once they have ended,
/// taking their ephemerals with them. A merge of the root group or of a prefix no group has
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_group_stays_the_home_of_its_sessions_until_they_end() {
    let cluster = cluster_with_groups(&["/m"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let root_group = group_serving(&mut router, "/").await;
    let merging = group_serving(&mut router, "/m").await;
    router.create(CreateRequest { path: "/m/x".into(), data: b"x".to_vec(), ..CreateRequest::default() }).await.expect("node");
    let session = session_homed_at(&mut router, "/m", TTL_MS).await;
    assert_eq!(warden_placement::home_group(session), merging);
    let renewals = keep_alive(router.clone(), vec![session]);
    router.create(CreateRequest { path: "/m/eph".into(), session_id: session, ..CreateRequest::default() }).await.expect("ephemeral");

    let merge = |prefix: &'static str| {
        at_placement_leader(&cluster, move |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: prefix.into() }).await })
    };
    assert!(merge("/").await.is_err(), "the root group has no parent to merge into");
    assert_eq!(merge("/nothing").await.expect_err("no group").code, warden_proto::v1::warden_error::Code::NoNode as i32);
    let merged = merge("/m").await.expect("merge");
    assert_eq!((merged.group_id, merged.parent_group_id), (merging, root_group));
    assert_eq!(group_serving(&mut router, "/m/x").await, root_group);
    let table = || at_placement_leader(&cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await });
    let retired = table().await.expect("table").groups.into_iter().find(|g| g.descriptor.as_ref().is_some_and(|d| d.group_id == merging));
    assert!(retired.is_some_and(|g| g.retired && !g.ready), "kept, unrouted, as its session's home");

    // The session works on: renewed at its home, its ephemeral moved, a new one allowed.
    let lease = router.keep_alive(KeepAliveRequest { session_ids: vec![session], ..KeepAliveRequest::default() }).await.expect("keepalive");
    assert!(lease.into_inner().leases.iter().all(|l| l.alive), "the session lives on in its retired home");
    let moved = get(&mut router, "/m/eph").await.expect("the moved ephemeral");
    assert_eq!((moved.header.expect("header").group_id, moved.stat.expect("stat").ephemeral_owner), (root_group, session));
    router.create(CreateRequest { path: "/m/eph2".into(), session_id: session, ..CreateRequest::default() }).await.expect("a new ephemeral");
    let fresh = session_homed_at(&mut router, "/m", TTL_MS).await;
    assert_eq!(warden_placement::home_group(fresh), root_group, "a new session is homed where the path is served");

    // Its end at home ends its ephemerals, and the retired group goes.
    renewals.abort();
    router.close_session(CloseSessionRequest { session_id: session, ..Default::default() }).await.expect("close at home");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ephemerals_gone = get(&mut router, "/m/eph").await.is_err() && get(&mut router, "/m/eph2").await.is_err();
        let groups = table().await.expect("table").groups;
        if ephemerals_gone && groups.iter().all(|g| g.descriptor.as_ref().is_some_and(|d| d.group_id != merging)) {
            break;
        }
        assert!(Instant::now() < deadline, "the closed session's ephemerals or its retired home stayed: {groups:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(get(&mut router, "/m/x").await.expect("moved node").data, b"x");
}

/// A watch spanning the merged group and the parent path's group (a recursive watch of `/`)
/// keeps the parent group's own events: the merged group's revisions ran ahead of the
/// parent's, and the writes the parent took between the hand-over and its new descriptor
/// are below the merged group's resume revision, yet each group resumes from its own place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_spanning_a_merge_keeps_the_parent_groups_events() {
    let cluster = cluster_with_groups(&["/m"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    router.create(CreateRequest { path: "/p".into(), ..CreateRequest::default() }).await.expect("parent's node");
    let library = ::warden_client::Client::connect(::warden_client::ClientConfig::new([router_process.addr.to_string()])).await.expect("client");
    let options = ::warden_client::WatchOptions { recursive: true, ..::warden_client::WatchOptions::new("/") };
    let mut watcher = library.watch(options.clone()).await.expect("watch");
    // The merging group's revision runs far ahead of the root group's.
    for n in 0..300u32 {
        router.set(SetRequest { path: "/m".into(), data: n.to_be_bytes().to_vec(), ..SetRequest::default() }).await.expect("write in /m");
    }
    // Held after the hand-over (the watch's part in /m ends MOVED), before the root group
    // serves /m: writes to the root group meanwhile.
    cluster.faults().hold_split_at(5);
    let placement = cluster.clone();
    let merge = tokio::spawn(async move {
        at_placement_leader(&placement, |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: "/m".into() }).await }).await
    });
    let deadline = Instant::now() + TIMEOUT;
    while cluster.faults().split_reached() != Some(5) {
        assert!(Instant::now() < deadline, "the merge never reached its hand-over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut written = Vec::new();
    for n in 0..5u8 {
        router.set(SetRequest { path: "/p".into(), data: vec![n], ..SetRequest::default() }).await.expect("write beside");
        written.push(vec![n]);
    }
    // A watch created now spans /m's old group, which answers MOVED: the library creates it
    // again (the subtree is moving, not gone), and says UNAVAILABLE once its request
    // timeout passes while the move lasts (a caller retries that), never the final MOVED.
    let config = ::warden_client::ClientConfig {
        request_timeout: Duration::from_secs(2),
        ..::warden_client::ClientConfig::new([router_process.addr.to_string()])
    };
    let impatient = ::warden_client::Client::connect(config).await.expect("client");
    match impatient.watch(options.clone()).await {
        Err(::warden_client::Error::Unavailable { .. }) => {}
        Ok(_) => panic!("a watch spanning a subtree that no group serves yet was created"),
        Err(other) => panic!("a watch created while a subtree it spans moves says UNAVAILABLE, not {other:?}"),
    }
    cluster.faults().release_split();
    let mut created_after = impatient.watch(options).await.expect("a watch created once the move settled");
    merge.await.expect("task").expect("merge");
    router.set(SetRequest { path: "/p".into(), data: b"last".to_vec(), ..SetRequest::default() }).await.expect("last write");
    written.push(b"last".to_vec());
    let mut seen = Vec::new();
    while seen.len() < written.len() {
        let event = tokio::time::timeout(TIMEOUT, watcher.next()).await.unwrap_or_else(|_| panic!("an event after {seen:?}"));
        let event = event.expect("the watch goes on").expect("not ended");
        if event.node.path == "/p" && event.kind == ::warden_client::EventKind::Changed {
            seen.push(event.node.data);
        }
    }
    assert_eq!(seen, written, "every write of the parent's group seen once, in order");
    loop {
        let event = tokio::time::timeout(TIMEOUT, created_after.next()).await.expect("the last write's event").expect("watch").expect("not ended");
        if event.node.path == "/p" {
            assert_eq!(event.node.data, b"last", "the watch created after the writes beside sees the last one first");
            break;
        }
    }
}

/// A cluster of one group, a router and its client, the group's id, and the nodes `subtree`
/// and `register` (below it).
async fn one_group_with(
    subtree: &str,
    register: &str,
) -> (Arc<warden_shard_node::cluster::Cluster>, crate::support::routed::Router, warden_client::WardenClient<tonic::transport::Channel>, u64) {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let root_group = group_serving(&mut router, "/").await;
    for path in [subtree, register] {
        router.create(CreateRequest { path: path.into(), ..CreateRequest::default() }).await.expect("node");
    }
    (cluster, router_process, router, root_group)
}

/// A watcher that did not read while its subtree was split off, written in its new group and
/// merged back never skips the new group's writes: the merged group is gone, so the group
/// serving the path again cannot give them, and the watch ends COMPACTED (the client then
/// reads and watches again) instead of going on from that group's later writes. The same
/// holds for a recursive watch of `/` re-created with the places a client holds when its part
/// in the parent's group ran past the merge while its part in the merged group broke before
/// that group's last write: from after the merge in the parent's group, it cannot get that
/// write either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_after_its_subtree_moved_away_and_back_ends_compacted_rather_than_skip_writes() {
    const MOVING: &str = "/h";
    const REGISTER: &str = "/h/r";
    let (cluster, router_process, mut router, root_group) = one_group_with(MOVING, REGISTER).await;
    let library = ::warden_client::Client::connect(::warden_client::ClientConfig::new([router_process.addr.to_string()])).await.expect("client");
    let mut watcher = library.watch(::warden_client::WatchOptions::new(REGISTER)).await.expect("watch");
    let set = |router: &mut warden_proto::v1::warden_client::WardenClient<_>, value: &'static str| {
        let mut router = router.clone();
        async move { router.set(SetRequest { path: REGISTER.into(), data: value.into(), ..SetRequest::default() }).await.expect("write") }
    };
    set(&mut router, "before").await;
    let first = tokio::time::timeout(TIMEOUT, watcher.next()).await.expect("the first write's event").expect("watch").expect("not ended");
    assert_eq!(first.node.data, b"before");

    // Nothing is read from the watch from here until the subtree is back.
    let split =
        at_placement_leader(&cluster, |mut c| async move { c.split_group(CreateGroupRequest { prefix: MOVING.into() }).await }).await.expect("split");
    let split_group = split.group.and_then(|g| g.descriptor).expect("descriptor").group_id;
    assert_eq!(group_serving(&mut router, REGISTER).await, split_group);
    let in_split = set(&mut router, "in the split group").await.into_inner().header.expect("header");
    assert_eq!(in_split.group_id, split_group);
    at_placement_leader(&cluster, |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: MOVING.into() }).await }).await.expect("merge");
    assert_eq!(group_serving(&mut router, REGISTER).await, root_group);
    let after = set(&mut router, "after").await.into_inner().header.expect("header");
    assert_eq!(after.group_id, root_group);

    // Re-created from after the merge in the root group, with a place in the split group
    // at its last write (not received): ended COMPACTED, not started without it.
    let mut recreated = crate::support::watch::WatchConn::over(router.clone()).await.expect("watch stream");
    let places = [(root_group, after.revision), (split_group, in_split.revision)].into();
    let create = WatchCreate { group_start_revisions: places, ..crate::support::watch::persistent("/", true, after.revision) };
    let answer = recreated.create(create).await.expect("an answer");
    let answer = match answer.created {
        // A write after it answers at once a watch that went on.
        Some(_) => {
            set(&mut router, "later").await;
            recreated.next(TIMEOUT).await.expect("stream").expect("the watch's next answer")
        }
        None => answer,
    };
    let ended = answer.canceled.as_ref().and_then(|c| c.error.as_ref()).map(|e| e.code);
    assert_eq!(ended, Some(warden_error::Code::Compacted as i32), "the write in the split group would be skipped: {answer:?}");

    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(TIMEOUT, watcher.next()).await.unwrap_or_else(|_| panic!("the watch answers after {seen:?}")) {
            Ok(Some(event)) => {
                seen.push(String::from_utf8_lossy(&event.node.data).into_owned());
                if event.node.data == b"after" {
                    break;
                }
            }
            Err(::warden_client::Error::Compacted { .. }) => break,
            other => panic!("the watch goes on or ends COMPACTED, not {other:?} (after {seen:?})"),
        }
    }
    assert!(
        seen.is_empty() || seen == ["in the split group", "after"],
        "every write after the first delivered in order, or none before COMPACTED: {seen:?}"
    );
}

/// A watch re-created through a router that knows a subtree merged back, from a place in
/// the parent's group before the merge, on the parent's replica that has not applied the
/// merge yet (cut off from its group): the router spans no part in the merged group, and
/// only a replica that applied the move-in knows the watch would skip that group's last
/// write. The replica catches up before the watch starts (or refuses it UNAVAILABLE, to be
/// created again), then ends it COMPACTED rather than go on from the parent's later writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_created_on_a_replica_behind_its_subtrees_move_in_ends_compacted_rather_than_skip_writes() {
    const MOVING: &str = "/l";
    const REGISTER: &str = "/l/r";
    let (cluster, _router_process, mut router, root_group) = one_group_with(MOVING, REGISTER).await;
    let split =
        at_placement_leader(&cluster, |mut c| async move { c.split_group(CreateGroupRequest { prefix: MOVING.into() }).await }).await.expect("split");
    let split_group = split.group.and_then(|g| g.descriptor).expect("descriptor").group_id;
    let set = |router: &mut warden_proto::v1::warden_client::WardenClient<_>, value: &'static str| {
        let mut router = router.clone();
        async move {
            let response = router.set(SetRequest { path: REGISTER.into(), data: value.into(), ..SetRequest::default() }).await.expect("write");
            response.into_inner().header.expect("header")
        }
    };
    let in_split = set(&mut router, "in the split group").await;
    assert_eq!(in_split.group_id, split_group);

    // The root group's replica a router watches from (its first) applies a write of the
    // root group, then is cut off from every other node; no group it could lead is led there.
    let table = at_placement_leader(&cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table");
    let root = table.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.group_id == root_group).expect("the root group");
    let lagging = root.replicas[0];
    let beside = router.create(CreateRequest { path: "/beside".into(), ..CreateRequest::default() }).await.expect("beside");
    let placed = beside.into_inner().header.expect("header").revision;
    let mut on_lagging = client(cluster.addr(lagging).expect("address"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let stale = ExistsRequest { path: "/beside".into(), consistency: Consistency::Stale as i32, routing: None };
        let applied = on_lagging.exists(stale).await.expect("stale read").into_inner().header.expect("header").revision;
        if applied >= placed {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never applied revision {placed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = cluster.node_ids().into_iter().find(|id| *id != lagging).expect("another node");
    for group in [warden_placement::PLACEMENT_GROUP_ID, root_group, split_group] {
        crate::support::routed::transfer_leader(&cluster, group, other).await;
    }
    // Cut off once the split group handed the subtree over, before the root group serves it.
    cluster.faults().hold_split_at(5);
    let placement = cluster.clone();
    let merge = tokio::spawn(async move {
        at_placement_leader(&placement, |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: MOVING.into() }).await }).await
    });
    let deadline = Instant::now() + TIMEOUT;
    while cluster.faults().split_reached() != Some(5) {
        assert!(Instant::now() < deadline, "the merge never reached its hand-over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.faults().isolate(lagging, &cluster.node_ids());
    cluster.faults().release_split();
    merge.await.expect("task").expect("merge");
    let after = set(&mut router, "after").await;
    assert_eq!(after.group_id, root_group);

    // From the root group's revision after `/beside`, with a place in the split group at its
    // last write (not received).
    let places = [(root_group, placed + 1), (split_group, in_split.revision)].into();
    let create = WatchCreate { group_start_revisions: places, ..crate::support::watch::persistent("/", true, placed + 1) };
    let mut watch = crate::support::watch::WatchConn::over(router.clone()).await.expect("watch stream");
    watch.send(WatchRequestKind::Create(create.clone())).await;
    // A moment for a replica that would start the watch unchecked to answer before it heals.
    let early = watch.next(Duration::from_secs(1)).await.expect("stream");
    cluster.faults().heal();
    let mut answers: Vec<WatchResponse> = early.into_iter().collect();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let canceled = answers.iter().find_map(|a| a.canceled.as_ref()).and_then(|c| c.error.as_ref()).map(|e| e.code);
        let skipped = answers.iter().flat_map(|a| &a.events).any(|e| e.data.as_ref() == b"after");
        assert!(!skipped, "the write in the split group was skipped: {answers:?}");
        match canceled {
            Some(code) if code == warden_error::Code::Compacted as i32 => break,
            // Refused while the replica was cut off: watched again, as a client does.
            Some(code) if code == warden_error::Code::Unavailable as i32 => {
                answers.clear();
                watch.send(WatchRequestKind::Create(create.clone())).await;
            }
            Some(code) => panic!("the watch ends COMPACTED, not {code}: {answers:?}"),
            None => {}
        }
        assert!(Instant::now() < deadline, "the watch never ended COMPACTED: {answers:?}");
        answers.extend(watch.next(Duration::from_millis(200)).await.expect("stream"));
    }
}
