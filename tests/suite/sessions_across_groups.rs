//! Sessions across groups (DESIGN.md rule 7), end to end through a router: a session homed
//! in group A holds a lock (an ephemeral waiter) in group B. When its client dies, B
//! releases the lock only after A has expired the session; while B cannot reach A, B keeps
//! the lock (and says so in its metrics) and releases it once A's verdict arrives. Before
//! the first ephemeral B confirms the session with A. Sessions without a hint spread over
//! the groups.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;
use warden_shard_node::cluster::Cluster;

use crate::support::routed::{client, cluster_with_groups, group_serving, session_homed_at, start_router, Router, TIMEOUT};

/// Shortest TTL granted (3 s): what these sessions ask for.
const TTL_MS: u64 = 3_000;

fn home_of(session: u64) -> u64 {
    warden_placement::home_group(session)
}

async fn lock(router: &mut WardenClient<Channel>, path: &str, session: u64) -> Result<LockResponse, tonic::Status> {
    let request = LockRequest { path: path.into(), session_id: session, wait: false, ..LockRequest::default() };
    router.lock(request).await.map(tonic::Response::into_inner)
}

/// The sessions holding the lock at `path`.
async fn holders(router: &mut WardenClient<Channel>, path: &str) -> Vec<u64> {
    let info = router.lock_info(LockInfoRequest { path: path.into(), ..LockInfoRequest::default() }).await.expect("lock info").into_inner();
    info.holders.iter().map(|h| h.session_id).collect()
}

/// Whether the home group still counts `session` as alive.
async fn alive(router: &mut WardenClient<Channel>, session: u64) -> bool {
    let info =
        router.session_info(SessionInfoRequest { session_id: session, ..SessionInfoRequest::default() }).await.expect("session info").into_inner();
    info.lease.is_some_and(|lease| lease.alive)
}

/// Renews `session` every second until the returned task is aborted (the client "dies").
fn keep_alive(mut router: WardenClient<Channel>, session: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let _ = router.keep_alive(KeepAliveRequest { session_ids: vec![session], ..KeepAliveRequest::default() }).await;
            tokio::time::sleep(Duration::from_millis(1_000)).await;
        }
    })
}

/// The remote-session metrics of `group`'s leader.
async fn leader_metrics(cluster: &Cluster, group: u64) -> std::sync::Arc<warden_shard_node::service::RemoteSessionMetrics> {
    let leader = cluster.wait_leader(group, TIMEOUT).await.expect("leader");
    cluster.remote_session_metrics(leader).expect("running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_in_another_group_is_released_only_on_the_home_groups_verdict() {
    let cluster = cluster_with_groups(&["/a", "/b"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let (group_a, group_b) = (group_serving(&mut router, "/a").await, group_serving(&mut router, "/b").await);
    assert_ne!(group_a, group_b);

    // A session homed in A (its hint) takes a lock in B.
    let session = session_homed_at(&mut router, "/a/app", TTL_MS).await;
    assert_eq!(home_of(session), group_a, "the hint's group is the home");
    let renewals = keep_alive(router.clone(), session);
    let held = lock(&mut router, "/b/lock", session).await.expect("lock in B");
    assert!(held.acquired);
    assert_eq!(held.sequencer.as_ref().map(|s| s.group_id), Some(group_b));
    // Renewed at home, it keeps the lock across several of B's checks.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    assert_eq!(holders(&mut router, "/b/lock").await, vec![session], "a live remote session keeps its lock");
    assert_eq!(leader_metrics(&cluster, group_b).await.remote_sessions.load(Ordering::Relaxed), 1, "B records the session as remote");

    // The client dies. B must not release the lock while A still counts the session alive
    // (read the lock first: a free lock followed by a live session would be an early release).
    renewals.abort();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut expired_at = None;
    loop {
        let held_now = holders(&mut router, "/b/lock").await.contains(&session);
        let alive_now = alive(&mut router, session).await;
        assert!(held_now || !alive_now, "B released the lock while A still had the session");
        if !alive_now && expired_at.is_none() {
            expired_at = Some(Instant::now());
        }
        if !held_now {
            break;
        }
        assert!(Instant::now() < deadline, "B never released the lock of an expired session");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // (The loop's deadline bounds how long the release may take; a tighter bound on it would
    // flake on a loaded machine.)
    assert!(expired_at.is_some(), "A expired the session first");
    assert!(leader_metrics(&cluster, group_b).await.ended.load(Ordering::Relaxed) >= 1, "ended on A's verdict");

    // Another session can take the lock now.
    let next = session_homed_at(&mut router, "/b", TTL_MS).await;
    assert!(lock(&mut router, "/b/lock", next).await.expect("lock").acquired);
}

/// Groups A (`/a`) and B (`/b`) behind a router, and a session homed in A, kept alive,
/// holding a lock in B (so B records it as remote).
struct HeldInB {
    cluster: std::sync::Arc<Cluster>,
    _router: Router,
    router: WardenClient<Channel>,
    group_a: u64,
    group_b: u64,
    session: u64,
    renewals: tokio::task::JoinHandle<()>,
}

async fn held_in_b(lock_path: &str) -> HeldInB {
    let cluster = cluster_with_groups(&["/a", "/b"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let (group_a, group_b) = (group_serving(&mut router, "/a").await, group_serving(&mut router, "/b").await);
    let session = session_homed_at(&mut router, "/a", TTL_MS).await;
    let renewals = keep_alive(router.clone(), session);
    assert!(lock(&mut router, lock_path, session).await.expect("lock in B").acquired, "B now records the session");
    HeldInB { cluster, _router: router_process, router, group_a, group_b, session, renewals }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_cut_off_from_the_home_group_keeps_the_lock_until_the_verdict_arrives() {
    let HeldInB { cluster, _router, mut router, group_a, group_b, session, renewals } = held_in_b("/b/lock").await;

    // B can no longer ask A; then the client dies and A expires the session.
    cluster.faults().cut_group_link(group_b, group_a);
    renewals.abort();
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive(&mut router, session).await {
        assert!(Instant::now() < deadline, "A never expired the session");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several of B's rounds pass without a verdict: the lock stays, and B says why.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    assert_eq!(holders(&mut router, "/b/lock").await, vec![session], "no early release without A's verdict");
    let metrics = leader_metrics(&cluster, group_b).await;
    assert!(metrics.unreachable_homes.load(Ordering::Relaxed) >= 1, "B reports its home group unreachable");
    assert_eq!(metrics.unconfirmed_sessions.load(Ordering::Relaxed), 1);
    // A new ephemeral of a session homed in A cannot be confirmed either: refused, unchanged.
    let other = session_homed_at(&mut router, "/a/x", TTL_MS).await;
    let refused = lock(&mut router, "/b/other", other).await.expect_err("A cannot confirm");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused}");
    assert!(holders(&mut router, "/b/other").await.is_empty());

    // The link heals: A's verdict arrives and B releases the lock.
    cluster.faults().heal();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !holders(&mut router, "/b/lock").await.is_empty() {
        assert!(Instant::now() < deadline, "B kept the lock after A's verdict could arrive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(leader_metrics(&cluster, group_b).await.unreachable_homes.load(Ordering::Relaxed), 0);
}

/// A group that already records a session homed elsewhere grants it nothing new without
/// asking the home group in the same call: while the home group is out of reach a new lock
/// or ephemeral is refused (what the session holds stays), and once the home group ended the
/// session neither is granted, even before the group's own check ends its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_at_home_takes_no_new_lock_or_ephemeral_in_another_group() {
    /// How long one refused call may retry in the router before its client gives up.
    const REFUSED_WITHIN: Duration = Duration::from_secs(2);
    let HeldInB { cluster, _router, mut router, group_a, group_b, session, renewals } = held_in_b("/b/held").await;

    // Granted nothing new in B without the home group's word in the call.
    let refused_use = async |router: &mut WardenClient<Channel>, what: &str| {
        let mut request = tonic::Request::new(LockRequest { path: format!("/b/{what}-lock"), session_id: session, ..LockRequest::default() });
        request.set_timeout(REFUSED_WITHIN);
        let locked = router.lock(request).await;
        assert!(locked.as_ref().is_err(), "{what}: a lock was granted: {locked:?}");
        let mut request = tonic::Request::new(CreateRequest { path: format!("/b/{what}-e"), session_id: session, ..CreateRequest::default() });
        request.set_timeout(REFUSED_WITHIN);
        let created = router.create(request).await;
        assert!(created.as_ref().is_err(), "{what}: an ephemeral was created: {created:?}");
        assert!(holders(router, &format!("/b/{what}-lock")).await.is_empty(), "{what}: nobody holds the new lock");
        let exists = router.exists(ExistsRequest { path: format!("/b/{what}-e"), ..ExistsRequest::default() }).await.expect("exists").into_inner();
        assert!(exists.stat.is_none(), "{what}: nothing was created");
        (locked.err().map(|s| s.code()), created.err().map(|s| s.code()))
    };
    cluster.faults().cut_group_link(group_b, group_a);
    let (locked, created) = refused_use(&mut router, "unconfirmed").await;
    assert!(matches!(locked, Some(tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)), "{locked:?}");
    assert!(matches!(created, Some(tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)), "{created:?}");
    assert_eq!(holders(&mut router, "/b/held").await, vec![session], "what the session holds stays");

    // The client dies and the home group expires the session; B cannot hear it yet.
    renewals.abort();
    warden_testkit::wait_until("the home group expires the session", TIMEOUT, async || !alive(&mut router, session).await).await;
    refused_use(&mut router, "expired").await;

    // B reaches the home group again: the session is refused as ended.
    cluster.faults().heal();
    let refused = lock(&mut router, "/b/after", session).await.expect_err("the session ended at home");
    assert_eq!(warden_proto::error_of(&refused).map(|e| e.code), Some(warden_error::Code::SessionExpired as i32), "{refused}");
    assert!(holders(&mut router, "/b/after").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemerals_of_ended_sessions_are_refused_and_sessions_spread_over_groups() {
    let cluster = cluster_with_groups(&["/a", "/b"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);

    // A closed session homed in A cannot create an ephemeral in B: B asks A first.
    let closed = session_homed_at(&mut router, "/a", TTL_MS).await;
    router.close_session(CloseSessionRequest { session_id: closed, ..CloseSessionRequest::default() }).await.expect("close");
    let create = CreateRequest { path: "/b/e".into(), session_id: closed, ..CreateRequest::default() };
    let refused = router.create(create).await.expect_err("the session ended");
    assert_eq!(warden_proto::error_of(&refused).map(|e| e.code), Some(warden_error::Code::SessionExpired as i32), "{refused}");
    let exists = router.exists(ExistsRequest { path: "/b/e".into(), ..ExistsRequest::default() }).await.expect("exists").into_inner();
    assert!(exists.stat.is_none(), "nothing was created");

    // A live one can, and closing it at home ends it in B before the close is answered: its
    // ephemeral there is gone, and B refuses it a new one (B does not wait for its next
    // check of the session).
    let live = session_homed_at(&mut router, "/a", TTL_MS).await;
    let create = CreateRequest { path: "/b/e".into(), session_id: live, ..CreateRequest::default() };
    router.create(create).await.expect("ephemeral in B");
    // B refuses to close a session it only records as remote.
    let group_b = group_serving(&mut router, "/b").await;
    let wrong = CloseSessionRequest { session_id: live, routing: Some(Routing { group_id: group_b, ..Routing::default() }) };
    let mut node_b = WardenClient::new(
        Channel::from_shared(format!("http://{}", cluster.addr(cluster.wait_leader(group_b, TIMEOUT).await.expect("leader")).expect("addr")))
            .expect("uri")
            .connect_lazy(),
    );
    assert!(node_b.close_session(wrong).await.is_err(), "only the home group ends a session");
    router.close_session(CloseSessionRequest { session_id: live, ..CloseSessionRequest::default() }).await.expect("close at home");
    let exists = router.exists(ExistsRequest { path: "/b/e".into(), ..ExistsRequest::default() }).await.expect("exists").into_inner();
    assert!(exists.stat.is_none(), "the ephemeral in B went with the close: {exists:?}");
    let create = CreateRequest { path: "/b/after-close".into(), session_id: live, ..CreateRequest::default() };
    let refused = router.create(create).await.expect_err("the session was closed");
    assert_eq!(warden_proto::error_of(&refused).map(|e| e.code), Some(warden_error::Code::SessionExpired as i32), "{refused}");
    let exists = router.exists(ExistsRequest { path: "/b/after-close".into(), ..ExistsRequest::default() }).await.expect("exists").into_inner();
    assert!(exists.stat.is_none(), "nothing was created");

    // A close whose home group cannot tell B in time says so; B ends the session at its
    // next check, which reaches the home group.
    let group_a = group_serving(&mut router, "/a").await;
    let untold = session_homed_at(&mut router, "/a", TTL_MS).await;
    let create = CreateRequest { path: "/b/untold".into(), session_id: untold, ..CreateRequest::default() };
    router.create(create).await.expect("ephemeral in B");
    cluster.faults().cut_group_link(group_a, group_b);
    let mut close = tonic::Request::new(CloseSessionRequest { session_id: untold, ..CloseSessionRequest::default() });
    close.set_timeout(Duration::from_secs(3));
    let closed = router.close_session(close).await.expect("closed at home").into_inner();
    assert_eq!(closed.not_ended_in, vec![group_b], "the answer names the group it could not tell");
    cluster.faults().heal();
    warden_testkit::wait_until("B ends the closed session at its next check", TIMEOUT, async || {
        router.exists(ExistsRequest { path: "/b/untold".into(), ..ExistsRequest::default() }).await.expect("exists").into_inner().stat.is_none()
    })
    .await;

    // Without a hint, sessions spread over the groups.
    let mut homes = std::collections::BTreeSet::new();
    for _ in 0..48 {
        let request = CreateSessionRequest { ttl_ms: TTL_MS, ..CreateSessionRequest::default() };
        homes.insert(home_of(router.create_session(request).await.expect("create").into_inner().session_id));
    }
    assert_eq!(homes.len(), 3, "48 sessions spread over the 3 groups: {homes:?}");
}
