//! Sessions over gRPC on a 5-replica group: expiry removes exactly the dead session's
//! ephemerals; leader failover neither expires live sessions (nor moves their locks) nor
//! saves dead ones.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::api::{namespace_cluster, ApiClient};
use warden_proto::v1::*;
use warden_shard_node::cluster::ClusterConfig;

const TIMEOUT: Duration = Duration::from_secs(20);
/// The cluster's election timeout is 2 × 10 ticks × 50 ms = 1 s, so the minimum TTL is the
/// namespace's floor of 3 s.
const TTL_MS: u64 = 3_000;

async fn open_session(api: &ApiClient) -> u64 {
    let created = api
        .call(TIMEOUT, false, |mut c| async move { c.create_session(CreateSessionRequest { ttl_ms: TTL_MS, ..Default::default() }).await })
        .await
        .expect("session");
    assert_eq!(created.granted_ttl_ms, TTL_MS);
    created.session_id
}

async fn create_ephemeral(api: &ApiClient, path: &str, session_id: u64) {
    let request = CreateRequest { path: path.into(), session_id, create_parents: true, ..CreateRequest::default() };
    api.call(TIMEOUT, false, |mut c| {
        let request = request.clone();
        async move { c.create(request).await }
    })
    .await
    .expect("ephemeral");
}

async fn exists(api: &ApiClient, path: &str) -> bool {
    let request = ExistsRequest { path: path.into(), ..ExistsRequest::default() };
    api.call(TIMEOUT, true, |mut c| {
        let request = request.clone();
        async move { c.exists(request).await }
    })
    .await
    .expect("exists")
    .stat
    .is_some()
}

/// Keeps `session` alive every 300 ms until `stop`, following leader changes.
fn keep_alive(api: ApiClient, session: u64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut renewals = 0;
        while !stop.load(Ordering::Relaxed) {
            let request = KeepAliveRequest { session_ids: vec![session], routing: None };
            let answer = api
                .call(Duration::from_secs(2), true, |mut c| {
                    let request = request.clone();
                    async move { c.keep_alive(request).await }
                })
                .await;
            if let Ok(response) = answer {
                assert!(response.leases[0].alive, "a session kept alive must never be reported dead");
                renewals += 1;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        renewals
    })
}

async fn wait_gone(api: &ApiClient, path: &str, within: Duration) -> Duration {
    let started = Instant::now();
    while exists(api, path).await {
        assert!(started.elapsed() < within, "{path} still exists after {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_exactly_the_dead_sessions_ephemerals() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    // The lease starts when the session is created (its entry applied on the leader), so
    // measure from before the request.
    let opened = Instant::now();
    let (alive, dead) = (open_session(&api).await, open_session(&api).await);
    for i in 0..3 {
        create_ephemeral(&api, &format!("/members/alive-{i}"), alive).await;
        create_ephemeral(&api, &format!("/members/dead-{i}"), dead).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let keeper = keep_alive(api.clone(), alive, stop.clone());
    tokio::time::sleep(Duration::from_millis(TTL_MS / 2).saturating_sub(opened.elapsed())).await;
    assert!(exists(&api, "/members/dead-0").await, "a TTL is a minimum: nothing expires early");
    wait_gone(&api, "/members/dead-2", Duration::from_secs(10)).await;
    assert!(opened.elapsed() >= Duration::from_millis(TTL_MS), "expired before its TTL");
    for i in 0..3 {
        assert!(!exists(&api, &format!("/members/dead-{i}")).await);
        assert!(exists(&api, &format!("/members/alive-{i}")).await, "the live session keeps its ephemerals");
    }
    let info = api
        .call(TIMEOUT, true, |mut c| async move { c.session_info(SessionInfoRequest { session_id: dead, routing: None }).await })
        .await
        .expect("info");
    assert!(!info.lease.expect("lease").alive);
    stop.store(true, Ordering::Relaxed);
    assert!(keeper.await.expect("keeper") > 0);
    let closed = api
        .call(TIMEOUT, false, |mut c| async move { c.close_session(CloseSessionRequest { session_id: alive, routing: None }).await })
        .await
        .expect("close");
    assert_eq!(closed.deleted, 3, "its three members (/members itself is persistent)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_live_sessions_and_still_expires_dead_ones() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let (alive, dead) = (open_session(&api).await, open_session(&api).await);
    create_ephemeral(&api, "/lock/alive", alive).await;
    create_ephemeral(&api, "/lock/dead", dead).await;
    let stop = Arc::new(AtomicBool::new(false));
    let keeper = keep_alive(api.clone(), alive, stop.clone());
    // The live session holds a lock across the failovers: it must not change hands.
    let lock = LockRequest { path: "/held".into(), session_id: alive, request_id: 1, ..LockRequest::default() };
    let held = api
        .call(TIMEOUT, true, |mut c| {
            let lock = lock.clone();
            async move { c.lock(lock).await }
        })
        .await
        .expect("lock");
    assert!(held.acquired);
    let sequencer = held.sequencer.expect("sequencer");
    // The dead client's session must still expire although the leader that knew its
    // deadline is killed: the new leader grants a full TTL, then expires it.
    let leader = cluster.leader(1).await.expect("leader");
    let killed_at = Instant::now();
    cluster.kill(leader);
    let gone_after = wait_gone(&api, "/lock/dead", Duration::from_millis(TTL_MS) + Duration::from_secs(10)).await;
    assert!(gone_after >= Duration::from_millis(TTL_MS) - Duration::from_millis(500), "a new leader grants a full TTL first ({gone_after:?})");
    // Meanwhile the live session survived the failover.
    assert!(exists(&api, "/lock/alive").await, "a kept-alive session must survive leader failover");
    // A second failover (the new leader restarts in place) while it keeps renewing.
    let leader = cluster.leader(1).await.expect("leader");
    cluster.restart(leader).expect("restart");
    tokio::time::sleep(Duration::from_millis(TTL_MS + 1_000)).await;
    assert!(exists(&api, "/lock/alive").await, "still alive after another failover");
    let check = CheckSequencerRequest { sequencer: Some(sequencer), routing: None };
    let holds = api
        .call(TIMEOUT, true, |mut c| {
            let check = check.clone();
            async move { c.check_sequencer(check).await }
        })
        .await
        .expect("check")
        .holds;
    assert!(holds, "the lock did not change hands across two failovers");
    stop.store(true, Ordering::Relaxed);
    assert!(keeper.await.expect("keeper") > 0);
    assert!(killed_at.elapsed() > Duration::from_millis(TTL_MS));
}
