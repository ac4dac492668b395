//! Sessions over gRPC on a 5-replica group: expiry removes exactly the dead session's
//! ephemerals; leader failover neither expires live sessions (nor moves their locks) nor
//! saves dead ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::api::{namespace_cluster, ApiClient};
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
        .call(TIMEOUT, true, |mut c| async move { c.session_info(SessionInfoRequest { session_id: dead, ..SessionInfoRequest::default() }).await })
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

/// The running node other than `old` that leads group 1, once there is one.
async fn new_leader(cluster: &warden_shard_node::cluster::Cluster, old: u64) -> u64 {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let leader = cluster.statuses(1).await.into_iter().filter(|s| s.is_leader && s.node_id != old).max_by_key(|s| s.term);
        if let Some(leader) = leader {
            return leader.node_id;
        }
        assert!(Instant::now() < deadline, "no new leader without node {old}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn still_leads(cluster: &warden_shard_node::cluster::Cluster, node: u64) -> bool {
    cluster.statuses(1).await.iter().any(|s| s.node_id == node && s.is_leader)
}

/// A leader cut off from its quorum keeps leading until check-quorum
/// notices (up to two election timeouts), while the other four elect a new leader after about
/// one, which grants every session only `now + TTL`. Whatever the old leader answers to
/// keepalives in that window must not let the client's local lease (`sent_at + remaining`,
/// as `warden_client::Session` computes it) outlive the moment the new leader may expire the
/// session. The race between the two timeouts is random, so several partitions are tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_never_renews_a_lease_past_the_new_leaders_expiry() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    for round in 0..4 {
        let session = open_session(&api).await;
        let old = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
        let others: Vec<u64> = cluster.node_ids().into_iter().filter(|id| *id != old).collect();
        cluster.faults().isolate(old, &others);
        // Renew at the old leader for as long as it believes it leads.
        let mut client_lease_end: Option<Instant> = None;
        let mut renewed_at_old = 0;
        let mut old_node = api.node(old);
        let deadline = Instant::now() + TIMEOUT;
        while still_leads(&cluster, old).await {
            assert!(Instant::now() < deadline, "node {old} never noticed it lost its quorum");
            let mut request = tonic::Request::new(KeepAliveRequest { session_ids: vec![session], routing: None });
            request.set_timeout(Duration::from_millis(500));
            let sent_at = Instant::now();
            if let Ok(response) = old_node.keep_alive(request).await {
                let lease = response.into_inner().leases[0];
                if lease.alive {
                    renewed_at_old += 1;
                    let end = sent_at + Duration::from_millis(lease.remaining_ms);
                    client_lease_end = Some(client_lease_end.map_or(end, |known| known.max(end)));
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The new leader's deadline for the session: no keepalive reached it, so it is what it
        // granted when it took over. `received + remaining` is a bound from above (the
        // leader counted `remaining` from a moment before `received`).
        let new = new_leader(&cluster, old).await;
        let info = api
            .node(new)
            .session_info(SessionInfoRequest { session_id: session, ..SessionInfoRequest::default() })
            .await
            .expect("session info at the new leader")
            .into_inner();
        let received = Instant::now();
        let lease = info.lease.expect("lease");
        assert!(lease.alive, "round {round}: the new leader must not have expired the session yet");
        let new_leader_may_expire_at = received + Duration::from_millis(lease.remaining_ms);
        if let Some(end) = client_lease_end {
            // Leases are counted in whole milliseconds on each side: allow that rounding.
            let rounding = Duration::from_millis(5);
            assert!(
                end <= new_leader_may_expire_at + rounding,
                "round {round}: after {renewed_at_old} renewals at the cut-off leader {old} the client's lease ends {:?} after \
                 the new leader {new} may expire the session",
                end - new_leader_may_expire_at
            );
        }
        cluster.faults().heal();
        cluster.wait_leader(1, TIMEOUT).await.expect("leader after healing");
        let _ =
            api.call(TIMEOUT, false, |mut c| async move { c.close_session(CloseSessionRequest { session_id: session, routing: None }).await }).await;
    }
}

/// `warden_namespace_held{kind}` summed over the nodes (each group counted at its leader).
fn held(cluster: &warden_shard_node::cluster::Cluster, kind: &str) -> u64 {
    let series = format!("warden_namespace_held{{kind=\"{kind}\"}} ");
    let value = |text: String| text.lines().find_map(|line| line.strip_prefix(series.as_str())?.trim().parse::<u64>().ok()).unwrap_or_default();
    cluster.running().into_iter().filter_map(|id| cluster.handle(id)).map(|handle| value(handle.metrics().render())).sum()
}

/// The leaders' metrics count what the group holds: nodes, a session, its ephemerals and its
/// lock held; once the session closes they count its nodes no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leaders_metrics_count_nodes_sessions_ephemerals_and_lock_waiters() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let session = open_session(&api).await;
    for path in ["/m/a", "/m/b", "/m/lock"] {
        let request = CreateRequest { path: path.into(), create_parents: true, ..CreateRequest::default() };
        api.call(TIMEOUT, false, |mut c| {
            let request = request.clone();
            async move { c.create(request).await }
        })
        .await
        .expect("create");
    }
    create_ephemeral(&api, "/m/e0", session).await;
    create_ephemeral(&api, "/m/e1", session).await;
    let lock = LockRequest { path: "/m/lock".into(), session_id: session, ..LockRequest::default() };
    let locked = api
        .call(TIMEOUT, false, |mut c| {
            let lock = lock.clone();
            async move { c.lock(lock).await }
        })
        .await
        .expect("lock");
    assert!(locked.acquired, "{locked:?}");
    // Published once each batch is in the leader's store: waited for, not assumed.
    let expect = |nodes, sessions, ephemerals, holders| {
        let cluster = cluster.clone();
        async move {
            let deadline = Instant::now() + TIMEOUT;
            loop {
                let seen = (held(&cluster, "nodes"), held(&cluster, "sessions"), held(&cluster, "ephemerals"), held(&cluster, "lock_holders"));
                if seen == (nodes, sessions, ephemerals, holders) {
                    return;
                }
                assert!(Instant::now() < deadline, "held (nodes, sessions, ephemerals, lock holders): {seen:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // /m, /m/a, /m/b, /m/lock, two ephemerals and the holder's waiter (an ephemeral too).
    expect(7, 1, 3, 1).await;
    api.call(TIMEOUT, false, |mut c| async move { c.close_session(CloseSessionRequest { session_id: session, ..Default::default() }).await })
        .await
        .expect("close");
    expect(4, 0, 0, 0).await;
}
