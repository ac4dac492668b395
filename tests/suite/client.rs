//! The Rust client library (`warden-client`) against a real in-process cluster through real
//! routers: the namespace API with typed errors, failover between routers, sessions through
//! jeopardy (a paused TCP proxy between client and router) to safety or expiry, lock
//! contention with growing fencing tokens, and watches that survive router restarts without
//! losing or repeating an event; direct calls to group leaders that need no router and
//! fall back to one.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::proxy::Proxy;
use crate::support::routed::{
    at_placement_leader, client as raw_client, cluster_with_groups, group_serving, restart_router, start_router, wait_refused, TIMEOUT,
};
use warden_client::*;
use warden_testkit::wait_until;

/// Session TTL of these tests: the server's minimum (1.5 × the 1 s election timeout, floored
/// at 3 s).
const TTL: Duration = Duration::from_secs(3);
/// Grace period of these tests' sessions.
const GRACE: Duration = Duration::from_secs(8);

async fn connect(routers: &[SocketAddr]) -> Client {
    Client::connect(ClientConfig::new(routers.iter().map(SocketAddr::to_string))).await.expect("connect")
}

fn session_config(path_hint: &str) -> SessionConfig {
    SessionConfig { ttl: TTL, grace_period: GRACE, path_hint: Some(path_hint.into()) }
}

/// Records every state a session goes through until it reaches one of `last`.
fn record_states(session: &Session, last: &'static [SessionState]) -> tokio::task::JoinHandle<Vec<SessionState>> {
    let mut states = session.states();
    tokio::spawn(async move {
        let mut seen = vec![*states.borrow_and_update()];
        while states.changed().await.is_ok() {
            let state = *states.borrow_and_update();
            seen.push(state);
            if last.contains(&state) {
                break;
            }
        }
        seen
    })
}

async fn wait_for_state(session: &Session, wanted: SessionState, within: Duration) {
    let mut states = session.states();
    tokio::time::timeout(within, states.wait_for(|state| *state == wanted))
        .await
        .unwrap_or_else(|_| panic!("no {wanted:?} within {within:?} (state {:?})", session.state()))
        .expect("session state channel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_cas_transactions_and_listings_through_a_router() {
    let cluster = cluster_with_groups(&["/b"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(&[router.addr]).await;
    let parents = CreateOptions::persistent().create_parents();

    // Create, read, exists; typed refusals.
    let created = client.create("/a/x", b"1".to_vec(), &parents).await.expect("create");
    assert_eq!((created.path.as_str(), created.stat.version, created.stat.kind), ("/a/x", 0, NodeKind::Persistent));
    let node = client.get("/a/x").await.expect("get");
    assert_eq!((node.path.as_str(), node.data.as_slice()), ("/a/x", &b"1"[..]));
    assert_eq!(node.stat, created.stat);
    assert_eq!(client.exists("/a/x").await.expect("exists").map(|s| s.create_revision), Some(created.stat.create_revision));
    assert_eq!(client.exists("/a/missing").await.expect("exists"), None);
    assert_eq!(client.get("/a/missing").await, Err(Error::NoNode { path: "/a/missing".into() }));
    assert_eq!(client.create("/a/x", b"again".to_vec(), &parents).await, Err(Error::NodeExists { path: "/a/x".into() }));
    assert!(matches!(client.get("/a//x").await, Err(Error::InvalidPath { .. })), "a malformed path is refused, typed");

    // Compare-and-swap.
    let stat = client.set("/a/x", b"2".to_vec(), Some(0)).await.expect("set at the expected version");
    assert_eq!(stat.version, 1);
    assert_eq!(client.set("/a/x", b"3".to_vec(), Some(0)).await, Err(Error::BadVersion { path: "/a/x".into() }));
    assert_eq!(client.get("/a/x").await.expect("get").data, b"2", "a failed CAS changes nothing");

    // The other group, sequential and container nodes, deletes.
    let in_b = client.create("/b/y", b"b".to_vec(), &CreateOptions::persistent()).await.expect("create in group 2");
    assert_eq!(client.get("/b/y").await.expect("get").stat, in_b.stat);
    let queue = CreateOptions::persistent().sequential().create_parents();
    let first = client.create("/a/q/item-", b"".to_vec(), &queue).await.expect("sequential");
    let second = client.create("/a/q/item-", b"".to_vec(), &queue).await.expect("sequential");
    assert_eq!((first.path.as_str(), second.path.as_str()), ("/a/q/item-0000000000", "/a/q/item-0000000001"));
    client.create("/a/box", b"".to_vec(), &CreateOptions::container()).await.expect("container");
    client.create("/a/box/item", b"".to_vec(), &CreateOptions::persistent()).await.expect("child of the container");
    assert_eq!(client.delete("/a/box/item", &DeleteOptions::default()).await.expect("delete"), 2, "the emptied container goes too");
    assert_eq!(client.exists("/a/box").await.expect("exists"), None);
    assert!(matches!(client.delete("/a/q", &DeleteOptions::default()).await, Err(Error::NotEmpty { .. })));
    let stale_version = DeleteOptions { expected_version: Some(7), recursive: false };
    assert!(matches!(client.delete("/a/q/item-0000000000", &stale_version).await, Err(Error::BadVersion { .. })));
    assert_eq!(client.delete("/a/q", &DeleteOptions { expected_version: None, recursive: true }).await.expect("recursive delete"), 3);

    // A transaction: compares, then its `then` branch; again, its `else` branch.
    let txn = Txn::new()
        .when(Compare::version("/a/x", CompareOp::Equal, 1))
        .when(Compare::exists("/a/t", false))
        .then(TxnOp::set("/a/x", b"t".to_vec(), None))
        .then(TxnOp::create("/a/t", b"new".to_vec(), CreateOptions::default()))
        .then(TxnOp::get("/a/x"))
        .or_else(TxnOp::get("/a/x"))
        .or_else(TxnOp::get("/a/never"));
    let ran = client.txn(&txn).await.expect("txn");
    assert!(ran.succeeded);
    let [TxnOpResult::Set(set), TxnOpResult::Created(made), TxnOpResult::Got(Some(got))] = ran.results.as_slice() else {
        panic!("unexpected results {:?}", ran.results);
    };
    assert_eq!((set.version, made.path.as_str(), got.data.as_slice()), (2, "/a/t", &b"t"[..]));
    assert_eq!((set.mod_revision, made.stat.create_revision), (ran.revision, ran.revision), "one revision for the whole transaction");
    let again = client.txn(&txn).await.expect("txn");
    assert!(!again.succeeded);
    assert_eq!(again.revision, ran.revision, "a failed transaction takes no revision");
    match again.results.as_slice() {
        [TxnOpResult::Got(Some(x)), TxnOpResult::Got(None)] => assert_eq!(x.data, b"t"),
        other => panic!("unexpected else results {other:?}"),
    }
    let spanning = Txn::new().then(TxnOp::get("/a/x")).then(TxnOp::get("/b/y"));
    assert!(matches!(client.txn(&spanning).await, Err(Error::InvalidArgument { .. })), "a transaction may not span groups");

    // Listings: pages of two, stats included, in name order; the root lists the other
    // group's prefix too.
    for i in (0..5).rev() {
        client.create(&format!("/a/list/c{i}"), vec![i as u8], &parents).await.expect("child");
    }
    let paged = ChildrenOptions { with_stats: true, page_size: 2 };
    let mut listing = client.children("/a/list", paged);
    let mut pages = Vec::new();
    while let Some(page) = listing.next_page().await.expect("page") {
        assert_eq!(page.parent.num_children, 5);
        pages.push(page.children.len());
    }
    assert_eq!(pages, vec![2, 2, 1]);
    let children = client.children("/a/list", paged).all().await.expect("listing");
    let names: Vec<&str> = children.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["c0", "c1", "c2", "c3", "c4"]);
    assert!(children.iter().all(|c| c.stat.as_ref().is_some_and(|s| s.data_length == 1)));
    let root = client.children("/", ChildrenOptions::default()).all().await.expect("root listing");
    assert_eq!(root.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
    assert!(matches!(client.children("/nowhere", paged).all().await, Err(Error::NoNode { .. })));

    // Stale reads and sync.
    assert!(client.with_consistency(Consistency::Stale).exists("/a").await.is_ok());
    assert!(client.sync(0).await.expect("sync") >= ran.revision);
}

/// Direct calls: given the nodes' addresses, the client sends what one group serves to that
/// group's leader — it goes on working with every router stopped — and leaves to a router
/// what only a router does (a transaction across groups, a sync). A subtree split off after
/// the client read the table (its node answers WRONG_GROUP) and a killed leader cost the
/// caller nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_calls_reach_group_leaders_and_fall_back_to_a_router() {
    let cluster = cluster_with_groups(&["/d"]).await;
    let router = start_router(&cluster, 0);
    let nodes = cluster.node_ids().into_iter().filter_map(|id| cluster.addr(id)).map(|addr| addr.to_string()).collect();
    let config = ClientConfig { nodes, request_timeout: Duration::from_secs(5), ..ClientConfig::new([router.addr.to_string()]) };
    let client = Client::connect(config).await.expect("connect");
    let parents = CreateOptions::persistent().create_parents();
    client.create("/d/x", b"0".to_vec(), &parents).await.expect("create");
    client.create("/d/sub/y", b"0".to_vec(), &parents).await.expect("create");
    let spanning = Txn::new().then(TxnOp::get("/d/x")).then(TxnOp::get("/elsewhere"));
    assert!(matches!(client.txn(&spanning).await, Err(Error::InvalidArgument { .. })), "the router refuses a transaction across groups");
    // Sessions of two home groups, renewed together per group (one call carries many).
    let mut sessions = Vec::new();
    for hint in ["/d", "/"].into_iter().cycle().take(12) {
        sessions.push(client.session(session_config(hint)).await.expect("session"));
    }
    let states: Vec<_> = sessions.iter().map(Session::states).collect();

    // Every router stops: what one group serves still works, straight at its leader.
    let router_addr = router.addr;
    router.stop().await;
    wait_refused(router_addr).await;
    for i in 1..=3u8 {
        let stat = client.set("/d/x", vec![i], None).await.expect("a direct set");
        assert_eq!(stat.version, u64::from(i));
        assert_eq!(client.get("/d/x").await.expect("a direct get").data, vec![i]);
    }
    let txn = Txn::new().when(Compare::version("/d/x", CompareOp::Equal, 3)).then(TxnOp::set("/d/sub/y", b"t".to_vec(), None));
    assert!(client.txn(&txn).await.expect("a direct transaction").succeeded);
    assert!(client.exists("/d/sub/y").await.expect("a direct exists").is_some());
    assert!(client.sync(0).await.is_err(), "a sync is a router's: none is there");
    // Keepalives go straight to each home group's leader: with no router for longer than
    // the TTL, every session stays connected.
    tokio::time::sleep(TTL * 2).await;
    for (session, states) in sessions.iter().zip(&states) {
        assert_eq!(session.state(), SessionState::Connected, "session {} without routers", session.id());
        assert!(!states.has_changed().expect("session state channel"), "session {} never left Connected", session.id());
    }

    // A subtree the client's table still places in /d's group moves to a group of its own:
    // the old group answers WRONG_GROUP, and the call goes through the router instead.
    let router = restart_router(&cluster, router_addr).await;
    let mut raw = raw_client(router.addr);
    let parent_group = group_serving(&mut raw, "/d/x").await;
    let split = |mut placement: warden_proto::placement::placement_client::PlacementClient<tonic::transport::Channel>| async move {
        placement.split_group(warden_proto::placement::CreateGroupRequest { prefix: "/d/sub".into() }).await
    };
    at_placement_leader(&cluster, split).await.expect("split /d/sub off");
    wait_until("/d/sub has a group of its own", TIMEOUT, async || group_serving(&mut raw, "/d/sub/y").await != parent_group).await;
    let moved = client.set("/d/sub/y", b"moved".to_vec(), None).await.expect("a set of the moved subtree");
    assert_eq!(moved.version, 2);
    assert_eq!(client.get("/d/sub/y").await.expect("get").data, b"moved");

    // The group's leader dies: a read finds the broken connection first (a write sent on it
    // would rightly be OUTCOME_UNKNOWN), then writes go on at the next leader.
    let leader = cluster.wait_leader(parent_group, TIMEOUT).await.expect("leader");
    cluster.kill(leader);
    assert_eq!(client.get("/d/x").await.expect("a get after the leader died").data, vec![3]);
    let stat = client.set("/d/x", b"after".to_vec(), None).await.expect("a set after the leader died");
    assert_eq!(stat.version, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_and_keepalives_fail_over_to_the_next_router() {
    let cluster = cluster_with_groups(&[]).await;
    let first = start_router(&cluster, 0);
    let second = start_router(&cluster, 0);
    let client = connect(&[first.addr, second.addr]).await;
    client.create("/f", b"0".to_vec(), &CreateOptions::persistent()).await.expect("create through the first router");
    let session = client.session(session_config("/")).await.expect("session");
    let states = session.states();

    // The first router goes away: its connection is closed, new ones are refused.
    let first_addr = first.addr;
    first.stop().await;
    wait_refused(first_addr).await;
    // A read first: it finds the closed connection and moves on (reads are always retried).
    // A write sent on a connection as it closes is rightly OUTCOME_UNKNOWN (it may have been
    // sent), so the writes below start once the client has seen the close.
    assert_eq!(client.get("/f").await.expect("get after the first router went away").data, b"0".to_vec());
    for i in 1..=5u8 {
        // Writes too: from now on a connection to the first router is refused, which proves a
        // write was never sent.
        let stat = client.set("/f", vec![i], None).await.expect("set after the first router went away");
        assert_eq!(stat.version, u64::from(i));
        assert_eq!(client.get("/f").await.expect("get").data, vec![i]);
    }
    // Keepalives moved too: the session stays connected over several TTLs.
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(session.state(), SessionState::Connected);
    assert!(session.info().await.expect("info").lease.alive);
    assert!(!states.has_changed().expect("session state channel"), "never out of Connected");
    session.close().await.expect("close");
}

/// Chubby's grace period at work: the client's link is cut for longer than the TTL, so its
/// local lease lapses (jeopardy, the lock guard is no longer valid); meanwhile the session's
/// group fails over, and the new leader grants every session a fresh full TTL — so when the
/// link comes back within the grace period the session is alive (safe) with its lock.
/// (Without a failover the server would expire a session not heard from for a TTL; see the
/// next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_jeopardy_is_safe_again_when_it_survived() {
    let cluster = cluster_with_groups(&[]).await;
    let router = start_router(&cluster, 0);
    let proxy = Proxy::start(router.addr).await;
    let client = connect(&[proxy.addr()]).await;
    let outside = connect(&[router.addr]).await;
    let session = client.session(session_config("/")).await.expect("session");
    assert_eq!(session.ttl(), TTL);
    let guard = session.lock("/locks/j").await.expect("lock");
    assert!(guard.is_valid());
    let states = record_states(&session, &[SessionState::Safe, SessionState::Expired]);

    proxy.pause();
    let paused_at = Instant::now();
    // The last keepalive the leader saw came at most a keepalive interval (TTL / 3) before
    // the pause, so it keeps the session until at least pause + 2 s: fail it over before.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader of the root group");
    cluster.kill(leader);
    wait_for_state(&session, SessionState::Jeopardy, TTL).await;
    assert!(!guard.is_valid(), "a lock guard is not valid while its session is in jeopardy");
    // Keep the link down for longer than the TTL.
    tokio::time::sleep((TTL + Duration::from_millis(100)).saturating_sub(paused_at.elapsed())).await;
    proxy.resume();

    let seen = tokio::time::timeout(GRACE, states).await.expect("a state after jeopardy within the grace period").expect("recorder");
    assert_eq!(seen, vec![SessionState::Connected, SessionState::Jeopardy, SessionState::Safe]);
    // (Safe, not Expired, is what says it came back within the grace period; the time since
    // the pause is not asserted, since the grace period counts from the local lease's end.)
    assert!(guard.is_valid(), "valid again once safe");
    assert!(outside.session_info(session.id()).await.expect("session info").lease.alive, "the session survived");
    assert!(outside.check_sequencer(guard.sequencer()).await.expect("check"), "and so did its lock");
    cluster.restart(leader).expect("restart");
    guard.unlock().await.expect("unlock");
    session.close().await.expect("close");
}

/// A client cut off for longer than its grace period gives its session up (expired), and
/// the server has ended it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_off_past_its_grace_period_expires() {
    let cluster = cluster_with_groups(&[]).await;
    let router = start_router(&cluster, 0);
    let proxy = Proxy::start(router.addr).await;
    let client = connect(&[proxy.addr()]).await;
    let outside = connect(&[router.addr]).await;
    let session = client.session(session_config("/")).await.expect("session");
    let guard = session.lock("/locks/e").await.expect("lock");
    let states = record_states(&session, &[SessionState::Safe, SessionState::Expired]);

    proxy.pause();
    let paused_at = Instant::now();
    let seen = tokio::time::timeout(TTL + GRACE + Duration::from_secs(2), states).await.expect("expired in time").expect("recorder");
    assert_eq!(seen, vec![SessionState::Connected, SessionState::Jeopardy, SessionState::Expired]);
    assert!(paused_at.elapsed() >= GRACE, "not given up before the grace period ({:?})", paused_at.elapsed());
    assert!(!guard.is_valid());
    proxy.resume();
    let info = outside.session_info(session.id()).await.expect("session info");
    assert!(!info.lease.alive, "the server expired it as well");
    let next = outside.session(session_config("/")).await.expect("another session");
    let taken = next.try_lock("/locks/e").await.expect("try_lock").expect("the expired session's lock is free");
    assert!(taken.fencing_token() > guard.fencing_token());
    assert_eq!(session.close().await, Err(Error::SessionExpired));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_lock_passes_on_release_with_growing_fencing_tokens() {
    let cluster = cluster_with_groups(&["/locks"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(&[router.addr]).await;
    let path = "/locks/l";
    let (first, second) =
        (client.session(session_config(path)).await.expect("session"), client.session(session_config(path)).await.expect("session"));
    let fence = FenceGuard::new();

    let held = first.lock(path).await.expect("a free lock");
    fence.admit(held.fencing_token()).expect("first token");
    assert!(second.try_lock(path).await.expect("try_lock").is_none(), "held by the first session");
    let waiting = tokio::spawn(async move {
        let guard = second.lock(path).await;
        (second, guard)
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished(), "the second session waits while the first holds");
    let info = client.lock_info(path).await.expect("lock info");
    assert_eq!(info.holders.iter().map(|h| h.session).collect::<Vec<_>>(), vec![first.id()]);
    assert_eq!(info.holders[0].token, held.fencing_token());

    let released = held.sequencer().clone();
    drop(held); // released in the background
    let (second, next) = tokio::time::timeout(TIMEOUT, waiting).await.expect("granted after the release").expect("task");
    let next = next.expect("lock");
    assert!(next.fencing_token() > released.token, "fencing tokens grow");
    fence.admit(next.fencing_token()).expect("the new holder's token is admitted");
    assert!(fence.admit(released.token).is_err(), "the old holder's token is refused");
    assert!(!client.check_sequencer(&released).await.expect("check"), "the released hold is gone");
    assert!(client.check_sequencer(next.sequencer()).await.expect("check"));

    let token = next.fencing_token();
    next.unlock().await.expect("unlock");
    let last = first.try_lock(path).await.expect("try_lock").expect("free again");
    assert!(last.fencing_token() > token);
    let shared = LockOptions { mode: LockMode::Shared, wait: Duration::from_millis(300), ..LockOptions::default() };
    assert!(second.lock_with(path, &shared).await.expect("lock_with").is_none(), "no shared hold beside an exclusive one");
    drop(last);
    first.close().await.expect("close");
    second.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_router_restarts_without_losing_or_repeating_events() {
    let cluster = cluster_with_groups(&["/w"]).await;
    let mut first = Some(start_router(&cluster, 0));
    let mut second = Some(start_router(&cluster, 0));
    let addrs: Vec<SocketAddr> = [&first, &second].iter().filter_map(|r| r.as_ref().map(|r| r.addr)).collect();
    let client = connect(&addrs).await;
    let created = client.create("/w/k", b"init".to_vec(), &CreateOptions::persistent()).await.expect("create");
    let options = WatchOptions { recursive: true, start_revision: created.stat.create_revision + 1, ..WatchOptions::new("/w") };
    let mut watcher = client.watch(options).await.expect("watch");

    let mut written = Vec::new();
    let mut seen: Vec<WatchEvent> = Vec::new();
    for round in 0..3 {
        for n in 0..3 {
            let value = format!("r{round}-{n}");
            client.set("/w/k", value.clone().into_bytes(), None).await.expect("set");
            written.push(value);
        }
        while seen.len() < written.len() {
            let event = tokio::time::timeout(TIMEOUT, watcher.next()).await.expect("an event in time").expect("watch").expect("not ended");
            seen.push(event);
        }
        match round {
            // Kill the router the watcher is on: it resumes on the second.
            0 => {
                first = None;
                wait_refused(addrs[0]).await;
                // A write on the client's connection to the dead router could be reported
                // OUTCOME_UNKNOWN (it may have been sent); a read is retried, so it carries the
                // client over to the live router first.
                client.get("/w/k").await.expect("a read fails over to the live router");
            }
            // Bring the first back on its address and kill the second: back to the first.
            1 => {
                first = Some(restart_router(&cluster, addrs[0]).await);
                second = None;
                wait_refused(addrs[1]).await;
                client.get("/w/k").await.expect("a read fails over to the live router");
            }
            _ => {}
        }
    }
    client.create("/w/n", b"".to_vec(), &CreateOptions::persistent()).await.expect("create");
    client.delete("/w/n", &DeleteOptions::default()).await.expect("delete");
    for kind in [EventKind::Created, EventKind::Deleted] {
        let event = tokio::time::timeout(TIMEOUT, watcher.next()).await.expect("in time").expect("watch").expect("event");
        assert_eq!((event.kind, event.node.path.as_str()), (kind, "/w/n"));
        seen.push(event);
    }

    let data: Vec<String> = seen.iter().take(written.len()).map(|e| String::from_utf8_lossy(&e.node.data).into_owned()).collect();
    assert_eq!(data, written, "every change once, in order");
    assert!(seen.iter().take(written.len()).all(|e| e.kind == EventKind::Changed && e.node.path == "/w/k"));
    assert!(seen.windows(2).all(|w| w[0].revision < w[1].revision), "revisions strictly grow (no repeats)");
    assert!(seen.iter().all(|e| e.group_id == 2), "all from group 2, which serves /w");
    let last = seen.last().expect("events");
    assert_eq!(watcher.resume_revisions().get(&last.group_id), Some(&(last.revision + 1)));
    assert!(first.is_some() && second.is_none());
}
