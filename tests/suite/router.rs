//! The router end to end over an in-process cluster with a placement group: a client works on
//! paths of two groups through a router; killing one group's leader leaves the other
//! untouched and the first recovers within the election time; a router with a stale table
//! recovers from WRONG_GROUP; two routers agree; a router restarted mid-stream loses nothing.

use std::time::Duration;

use crate::support::fleet::{Fleet, Security};
use crate::support::routed::{client, cluster_with_groups, create_group, restart_router, start_router, start_stale_router, TIMEOUT};
use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;

async fn set(router: &mut WardenClient<Channel>, path: &str, data: &str) -> Result<SetResponse, tonic::Status> {
    router.set(SetRequest { path: path.into(), data: data.as_bytes().to_vec(), ..SetRequest::default() }).await.map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_through_a_router_and_a_leader_kill_in_one_leaves_the_other_alone() {
    let cluster = cluster_with_groups(&["/b"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    for path in ["/a/x", "/b/x"] {
        let create = CreateRequest { path: path.into(), data: b"0".to_vec(), create_parents: true, ..CreateRequest::default() };
        let created = router.create(create).await.expect("create through the router").into_inner();
        let expected_group = if path.starts_with("/b") { 2 } else { 1 };
        assert_eq!(created.header.map(|h| h.group_id), Some(expected_group), "{path} is served by group {expected_group}");
    }
    // The root's children include the other group's prefix.
    let children = router
        .get_children(GetChildrenRequest { path: "/".into(), with_stats: true, ..GetChildrenRequest::default() })
        .await
        .expect("ls")
        .into_inner();
    assert_eq!(children.names, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(children.stats.len(), 2);
    // A transaction may not span groups.
    let spanning = TxnRequest {
        then: ["/a/x", "/b/x"]
            .iter()
            .map(|p| TxnOp { op: Some(txn_op::Op::Get(GetRequest { path: p.to_string(), ..GetRequest::default() })) })
            .collect(),
        ..TxnRequest::default()
    };
    assert_eq!(router.txn(spanning).await.expect_err("spans groups").code(), tonic::Code::InvalidArgument);

    // Kill group 2's leader: group 1 keeps answering, group 2 answers after an election,
    // each within the call's deadline. (How fast is not asserted: on a loaded machine any
    // bound tight enough to mean something would flake.)
    let leader_b = cluster.wait_leader(2, TIMEOUT).await.expect("leader of /b");
    cluster.kill(leader_b);
    set(&mut router, "/a/x", "1").await.expect("the other group is unaffected");
    set(&mut router, "/b/x", "1").await.expect("recovers within the deadline");
    let got = router.get(GetRequest { path: "/b/x".into(), ..GetRequest::default() }).await.expect("get").into_inner();
    assert_eq!(got.data, b"1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_router_recovers_from_wrong_group_and_two_routers_agree() {
    let cluster = cluster_with_groups(&[]).await;
    // The first router re-reads its table only when a shard-node says it is stale.
    let first_router = start_stale_router(&cluster, 0);
    let second_router = start_router(&cluster, 0);
    let (mut first, mut second) = (client(first_router.addr), client(second_router.addr));
    // Both routers learn the table while only the root group exists.
    first.sync(SyncRequest::default()).await.expect("sync");
    second.sync(SyncRequest::default()).await.expect("sync");
    create_group(&cluster, "/c").await;
    // The first router still routes /c to the root group, which answers WRONG_GROUP; the
    // router refreshes and goes to group 2.
    let created = first
        .create(CreateRequest { path: "/c/x".into(), data: b"v".to_vec(), ..CreateRequest::default() })
        .await
        .expect("create after a refresh")
        .into_inner();
    assert_eq!(created.header.map(|h| h.group_id), Some(2));
    let seen = second.get(GetRequest { path: "/c/x".into(), ..GetRequest::default() }).await.expect("get").into_inner();
    assert_eq!(seen.data, b"v");
    assert_eq!(seen.header.map(|h| h.group_id), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_restarted_mid_stream_loses_nothing() {
    let cluster = cluster_with_groups(&["/w"]).await;
    let mut router_process = start_router(&cluster, 0);
    let addr = router_process.addr;
    let mut router = client(addr);
    router.create(CreateRequest { path: "/w/k".into(), data: b"0".to_vec(), ..CreateRequest::default() }).await.expect("create");
    let start = router.sync(SyncRequest { routing: Some(Routing { group_id: 2, ..Routing::default() }) }).await.expect("sync").into_inner();
    let mut next = start.header.map_or(1, |h| h.revision + 1);
    let mut seen = Vec::new();
    for round in 0..2 {
        // After the restart the client's connection to the old router may not be seen as
        // closed yet: a call sent on it fails with a transport error, as it would for any
        // client, and the client opens the watch again (from the same revision) until the
        // new router answers.
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let mut stream = loop {
            let (requests, outgoing) = tokio::sync::mpsc::channel(8);
            let create = WatchCreate { path: "/w/k".into(), start_revision: next, ..WatchCreate::default() };
            requests.send(WatchRequest { request: Some(watch_request::Request::Create(create)) }).await.expect("send");
            match router.watch(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await {
                Ok(stream) => break stream.into_inner(),
                Err(status) => {
                    assert!(round > 0 && tokio::time::Instant::now() < deadline, "watch: {status:?}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let created = stream.message().await.expect("created").expect("created");
        assert!(created.created.is_some(), "{created:?}");
        for n in 0..3 {
            let value = format!("r{round}-{n}");
            set(&mut router, "/w/k", &value).await.expect("set");
            let response = tokio::time::timeout(TIMEOUT, stream.message()).await.expect("in time").expect("stream").expect("event");
            for event in response.events {
                next = event.revision + 1;
                seen.push(String::from_utf8(event.data.to_vec()).expect("utf8"));
            }
        }
        if round == 0 {
            // Restart the router on the same address: its streams and connections die, the
            // client reconnects and resumes from the revision after the last event it saw.
            router_process.stop().await;
            router_process = restart_router(&cluster, addr).await;
        }
    }
    assert_eq!(seen, vec!["r0-0", "r0-1", "r0-2", "r1-0", "r1-1", "r1-2"], "every change once, in order");
}

/// Through a router, a recursive watch of `/t` spans the groups serving `/t/x` and `/t/y`
/// (each response says its group; each group's revisions grow), and a recursive delete of
/// `/t` clears all three groups, keeping the groups' roots, with a revision per group.
/// Resuming from the per-group start revisions replays exactly the same events; a resume
/// naming more groups' start revisions than the bound is refused TOO_LARGE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recursive_watch_and_a_recursive_delete_span_the_groups_below() {
    recursive_watch_and_delete(Security::Off).await;
}

/// The same with security on: the watch's parts in every group and the delete's
/// fan-out are the principal's calls, each judged by its group; a principal without `watch`
/// at the watched path is refused the whole recursive watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recursive_watch_and_a_recursive_delete_span_the_groups_below_with_security_on() {
    recursive_watch_and_delete(Security::On).await;
}

async fn recursive_watch_and_delete(security: Security) {
    use crate::support::watch::{persistent, WatchConn};
    let fleet = Fleet::start(&["/t/x", "/t/y"], security).await;
    let mut router = fleet.reach.raw();
    router.create(CreateRequest { path: "/t".into(), ..CreateRequest::default() }).await.expect("create /t");
    let group_of = |path: &str| {
        if path.starts_with("/t/x") {
            2
        } else if path.starts_with("/t/y") {
            3
        } else {
            1
        }
    };

    let mut watch = WatchConn::over(fleet.reach.raw()).await.expect("watch stream");
    let created = watch.create(persistent("/t", true, 0)).await.expect("created").created.expect("not canceled");
    assert_eq!(created.start_revisions.keys().copied().collect::<std::collections::BTreeSet<_>>(), [1, 2, 3].into(), "one part per group");

    let paths = ["/t/a", "/t/x/a", "/t/y/a", "/t/y/a/b"];
    for path in paths {
        router.create(CreateRequest { path: path.into(), ..CreateRequest::default() }).await.expect("create");
    }
    let deleted = router.delete(DeleteRequest { path: "/t".into(), recursive: true, ..DeleteRequest::default() }).await.expect("delete").into_inner();
    assert_eq!(deleted.deleted, 4);
    assert_eq!(deleted.group_revisions.keys().copied().collect::<Vec<_>>().len(), 3, "a revision per group: {:?}", deleted.group_revisions);
    let children = router.get_children(GetChildrenRequest { path: "/t".into(), ..GetChildrenRequest::default() }).await.expect("ls").into_inner();
    assert_eq!(children.names, vec!["x".to_string(), "y".to_string()], "the groups' roots stay");
    let conditional = DeleteRequest { path: "/t".into(), recursive: true, expected_version: Some(0), ..DeleteRequest::default() };
    assert_eq!(router.delete(conditional).await.expect_err("spans groups").code(), tonic::Code::InvalidArgument);

    // Every create and delete arrives once, from the group serving it, in its group's order.
    let seen = collect_events(&mut watch, 2 * paths.len()).await;
    for (group, _, path, _) in &seen {
        assert_eq!(*group, group_of(path), "{path} reported by its group");
    }
    for group in 1..=3 {
        let revisions: Vec<u64> = seen.iter().filter(|e| e.0 == group).map(|e| e.1).collect();
        assert!(revisions.windows(2).all(|w| w[0] <= w[1]), "group {group} in order: {revisions:?}");
    }
    let mut created_paths: Vec<&str> = seen.iter().filter(|e| e.3 == watch_event::Type::Created as i32).map(|e| e.2.as_str()).collect();
    created_paths.sort_unstable();
    assert_eq!(created_paths, paths.to_vec());

    // The same watch from the per-group start revisions replays the same events.
    let mut again = WatchConn::over(fleet.reach.raw()).await.expect("watch stream");
    let resume = WatchCreate {
        start_revision: created.start_revisions[&1],
        group_start_revisions: created.start_revisions.clone(),
        ..persistent("/t", true, 0)
    };
    again.create(resume).await.expect("created");
    let mut replayed = collect_events(&mut again, 2 * paths.len()).await;
    let mut original = seen.clone();
    replayed.sort();
    original.sort();
    assert_eq!(replayed, original);
    // A resume naming more groups' start revisions than a node keeps is refused by the router
    // before any group sees it, and the stream carries on.
    let bound = warden_proto::WATCH_GROUP_START_REVISIONS_MAX as u64;
    let too_many = WatchCreate { watch_id: 7, group_start_revisions: (1..=bound + 1).map(|group| (group, 1)).collect(), ..persistent("/t", true, 0) };
    let answer = again.create(too_many).await.expect("an answer");
    let error = answer.canceled.and_then(|c| c.error).expect("refused");
    assert_eq!((error.code, error.limit), (warden_error::Code::TooLarge as i32, bound), "{error:?}");
    let at_bound = WatchCreate { watch_id: 8, group_start_revisions: (1..=bound).map(|group| (group, 1)).collect(), ..persistent("/t", true, 0) };
    assert!(again.create(at_bound).await.expect("an answer").created.is_some(), "the bound itself is taken");

    if let Some(outsider) = fleet.reach_as("outsider") {
        let mut refused = WatchConn::over(outsider.raw()).await.expect("watch stream");
        let answer = refused.create(persistent("/t", true, 0)).await.expect("an answer");
        let error = answer.canceled.and_then(|c| c.error).expect("refused");
        assert_eq!(error.code, warden_error::Code::PermissionDenied as i32, "{error:?}");
        let listing = outsider.raw().get_children(GetChildrenRequest { path: "/t".into(), ..GetChildrenRequest::default() }).await;
        assert_eq!(listing.expect_err("no read at /t").code(), tonic::Code::PermissionDenied);
    }
}

/// The first `count` events of a watch stream as (group, revision, path, type).
async fn collect_events(watch: &mut crate::support::watch::WatchConn, count: usize) -> Vec<(u64, u64, String, i32)> {
    let mut seen = Vec::new();
    while seen.len() < count {
        let response = watch.next(TIMEOUT).await.expect("stream").unwrap_or_else(|| panic!("events in time; so far {seen:?}"));
        let group = response.header.as_ref().map_or(0, |h| h.group_id);
        assert!(response.canceled.is_none(), "the watch ended: {response:?}");
        for event in &response.events {
            seen.push((group, event.revision, event.path.clone(), event.r#type));
        }
    }
    seen
}
