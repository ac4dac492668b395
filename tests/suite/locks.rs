//! Locks over gRPC on a 5-replica group: mutual exclusion under contention (50 clients) while clients
//! crash and leaders are killed (checked with a fenced resource), waiting calls that time out
//! and remove their waiter, and sequencers after their lock is lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::api::{namespace_cluster, ApiClient};
use ::warden_client::FenceGuard;
use warden_proto::v1::*;
use warden_shard_node::cluster::ClusterConfig;

const TIMEOUT: Duration = Duration::from_secs(30);
const TTL_MS: u64 = 3_000;

async fn open_session(api: &ApiClient) -> u64 {
    api.call(TIMEOUT, false, |mut c| async move { c.create_session(CreateSessionRequest { ttl_ms: TTL_MS, ..Default::default() }).await })
        .await
        .expect("session")
        .session_id
}

fn keep_alive(api: ApiClient, session: u64, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let request = KeepAliveRequest { session_ids: vec![session], routing: None };
            let _ = api
                .call(Duration::from_secs(2), true, |mut c| {
                    let request = request.clone();
                    async move { c.keep_alive(request).await }
                })
                .await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

async fn lock(api: &ApiClient, path: &str, session_id: u64, request_id: u64, wait_ms: u64) -> Option<Sequencer> {
    let request = LockRequest {
        path: path.into(),
        session_id,
        mode: LockMode::Exclusive as i32,
        wait: wait_ms > 0,
        timeout_ms: wait_ms,
        request_id,
        ..LockRequest::default()
    };
    // Retrying with the same request id is safe: the server returns the same waiter.
    let response = api
        .call(TIMEOUT, true, |mut c| {
            let mut request = tonic::Request::new(request.clone());
            request.set_timeout(Duration::from_millis(wait_ms + 5_000));
            async move { c.lock(request).await }
        })
        .await;
    match response {
        Ok(response) if response.acquired => response.sequencer,
        _ => None,
    }
}

async fn unlock(api: &ApiClient, sequencer: Sequencer) {
    let request = UnlockRequest { sequencer: Some(sequencer), routing: None };
    let _ = api
        .call(TIMEOUT, true, |mut c| {
            let request = request.clone();
            async move { c.unlock(request).await }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_crashing_clients_and_leaders_never_admits_two_holders() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    // The fenced resource: admits writes in token order; `inside` counts live holders.
    let fence = Arc::new(FenceGuard::new());
    let inside = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(Mutex::new(Vec::<u64>::new()));
    let stale_refused = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(14);
    let mut clients = Vec::new();
    for client in 0..50u64 {
        let (api, fence, inside, admitted, stale_refused) = (api.clone(), fence.clone(), inside.clone(), admitted.clone(), stale_refused.clone());
        clients.push(tokio::spawn(async move {
            let mut round = 0u64;
            while Instant::now() < deadline {
                round += 1;
                let session = open_session(&api).await;
                let stop = Arc::new(AtomicBool::new(false));
                let keeper = keep_alive(api.clone(), session, stop.clone());
                let request_id = client * 1_000_000 + round;
                let Some(sequencer) = lock(&api, "/locks/counter", session, request_id, 8_000).await else {
                    stop.store(true, Ordering::Relaxed);
                    keeper.await.expect("keeper");
                    continue;
                };
                let token = sequencer.token;
                let before = inside.fetch_add(1, Ordering::SeqCst);
                assert_eq!(before, 0, "two clients inside the critical section at once");
                fence.admit_then(token, || admitted.lock().expect("lock").push(token)).expect("a live holder's token is never stale");
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                let crash = round % 4 == client % 4;
                if crash {
                    // The client "crashes": no unlock, no more keepalives. Its lock passes on
                    // once the session expires; a late write with its old token is refused
                    // if anyone wrote after it.
                    stop.store(true, Ordering::Relaxed);
                    keeper.await.expect("keeper");
                    tokio::time::sleep(Duration::from_millis(TTL_MS + 1_500)).await;
                    if fence.admit(token).is_err() {
                        stale_refused.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    unlock(&api, sequencer).await;
                    stop.store(true, Ordering::Relaxed);
                    keeper.await.expect("keeper");
                    let _ = api
                        .call(
                            TIMEOUT,
                            false,
                            |mut c| async move { c.close_session(CloseSessionRequest { session_id: session, routing: None }).await },
                        )
                        .await;
                }
            }
        }));
    }
    // The nemesis kills a leader twice while clients contend.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(4)).await;
        if let Some(leader) = cluster.leader(1).await {
            cluster.kill(leader);
            tokio::time::sleep(Duration::from_millis(800)).await;
            cluster.restart(leader).expect("restart");
        }
    }
    for client in clients {
        client.await.expect("client");
    }
    let admitted = admitted.lock().expect("lock").clone();
    assert!(admitted.len() >= 10, "too few acquisitions ({}) to mean anything", admitted.len());
    assert!(admitted.windows(2).all(|w| w[0] < w[1]), "tokens were admitted in strictly increasing order: {admitted:?}");
    assert!(stale_refused.load(Ordering::Relaxed) > 0, "crashed holders' late writes were refused by the fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_calls_time_out_cleanly_and_sequencers_report_loss() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let holder = open_session(&api).await;
    let waiter = open_session(&api).await;
    let stop = Arc::new(AtomicBool::new(false));
    let keepers = [keep_alive(api.clone(), holder, stop.clone()), keep_alive(api.clone(), waiter, stop.clone())];
    let held = lock(&api, "/l", holder, 1, 0).await.expect("free lock is acquired without waiting");
    assert!(lock(&api, "/l", waiter, 2, 0).await.is_none(), "a held lock is not acquired without waiting");
    let started = Instant::now();
    assert!(lock(&api, "/l", waiter, 3, 700).await.is_none(), "the wait times out");
    assert!(started.elapsed() >= Duration::from_millis(700));
    let info =
        api.call(TIMEOUT, true, |mut c| async move { c.lock_info(LockInfoRequest { path: "/l".into(), routing: None }).await }).await.expect("info");
    assert_eq!((info.holders.len(), info.waiters.len()), (1, 0), "timed-out and non-waiting calls removed their waiters");
    // A waiting call is granted as soon as the holder unlocks.
    let waiting = tokio::spawn({
        let api = api.clone();
        async move { lock(&api, "/l", waiter, 4, 10_000).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(check(&api, held.clone()).await);
    unlock(&api, held.clone()).await;
    let granted = waiting.await.expect("task").expect("granted after the unlock");
    assert!(granted.token > held.token);
    assert!(!check(&api, held).await, "the old sequencer no longer holds");
    assert!(check(&api, granted).await);
    stop.store(true, Ordering::Relaxed);
    for keeper in keepers {
        keeper.await.expect("keeper");
    }
}

async fn check(api: &ApiClient, sequencer: Sequencer) -> bool {
    let request = CheckSequencerRequest { sequencer: Some(sequencer), routing: None };
    api.call(TIMEOUT, true, |mut c| {
        let request = request.clone();
        async move { c.check_sequencer(request).await }
    })
    .await
    .expect("check")
    .holds
}

async fn revision(api: &ApiClient) -> u64 {
    let response = api.call(TIMEOUT, true, |mut c| async move { c.sync(SyncRequest { routing: None }).await }).await.expect("sync");
    response.header.expect("header").revision
}

/// A waiting `Lock` call that is dropped (its client hung up) and retried at once with
/// the same request id, over and over while the lock passes between clients. The dropped
/// call's release must never take a hold the retry was told it has: a fenced resource sees
/// no two holders at once, and every hold is still valid when its holder unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_retried_waiting_calls_never_make_two_holders() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let fence = Arc::new(FenceGuard::new());
    let inside = Arc::new(AtomicU64::new(0));
    let holds = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut clients = Vec::new();
    for client in 0..6u64 {
        let (api, fence, inside, holds) = (api.clone(), fence.clone(), inside.clone(), holds.clone());
        clients.push(tokio::spawn(async move {
            let session = open_session(&api).await;
            let stop = Arc::new(AtomicBool::new(false));
            let keeper = keep_alive(api.clone(), session, stop.clone());
            let mut round = 0u64;
            while Instant::now() < deadline {
                round += 1;
                let request_id = client * 1_000_000 + round;
                let first = tokio::spawn({
                    let api = api.clone();
                    async move { lock(&api, "/locks/retried", session, request_id, 5_000).await }
                });
                // Drop the waiting call at varying moments (so some drops race with grants),
                // and retry it at once.
                tokio::time::sleep(Duration::from_millis((round * 7 + client * 3) % 40)).await;
                first.abort();
                let Some(sequencer) = lock(&api, "/locks/retried", session, request_id, 5_000).await else { continue };
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders at once");
                fence.admit(sequencer.token).expect("a live holder's token is never stale");
                tokio::time::sleep(Duration::from_millis(10)).await;
                assert!(check(&api, sequencer.clone()).await, "a hold the retry was told it has was taken away");
                inside.fetch_sub(1, Ordering::SeqCst);
                holds.fetch_add(1, Ordering::Relaxed);
                unlock(&api, sequencer).await;
            }
            stop.store(true, Ordering::Relaxed);
            keeper.await.expect("keeper");
        }));
    }
    for client in clients {
        client.await.expect("client");
    }
    assert!(holds.load(Ordering::Relaxed) >= 10, "too few holds ({}) to mean anything", holds.load(Ordering::Relaxed));
}

/// A try-lock (`wait = false`) of a lock someone holds is refused without changing
/// anything: no waiter is added and removed again, the revision stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_try_lock_changes_nothing() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let holder = open_session(&api).await;
    let other = open_session(&api).await;
    let stop = Arc::new(AtomicBool::new(false));
    let keepers = [keep_alive(api.clone(), holder, stop.clone()), keep_alive(api.clone(), other, stop.clone())];
    lock(&api, "/try", holder, 1, 0).await.expect("a free lock is taken");
    let before = revision(&api).await;
    for request_id in 2..5 {
        assert!(lock(&api, "/try", other, request_id, 0).await.is_none(), "a held lock is not taken");
    }
    assert_eq!(revision(&api).await, before, "refused try-locks took no revision");
    stop.store(true, Ordering::Relaxed);
    for keeper in keepers {
        keeper.await.expect("keeper");
    }
}

/// A waiter whose session expires while its `Lock` call waits is answered
/// SESSION_EXPIRED when the session ends, not "not acquired" when the wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_session_dies_mid_wait_gets_session_expired() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let holder = open_session(&api).await;
    let stop = Arc::new(AtomicBool::new(false));
    let keeper = keep_alive(api.clone(), holder, stop.clone());
    lock(&api, "/doomed", holder, 1, 0).await.expect("a free lock is taken");
    // A session without keepalives: it expires after its TTL.
    let doomed = open_session(&api).await;
    // Start waiting late in its lease (but before it runs out), so the session dies during the
    // wait rather than before it.
    let within = Instant::now() + TIMEOUT;
    loop {
        let request = SessionInfoRequest { session_id: doomed, ..SessionInfoRequest::default() };
        let info = api.call(TIMEOUT, true, |mut c| async move { c.session_info(request).await }).await.expect("session info");
        if info.lease.is_none_or(|lease| lease.remaining_ms <= 1_500) {
            break;
        }
        assert!(Instant::now() < within, "the lease never ran down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A client of the leader without the test client's cap on how long a call may take.
    let leader = cluster.leader(1).await.expect("leader");
    let addr = cluster.addr(leader).expect("addr");
    let mut client = warden_proto::v1::warden_client::WardenClient::new(
        tonic::transport::Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy(),
    );
    let mut request = tonic::Request::new(LockRequest {
        path: "/doomed".into(),
        session_id: doomed,
        mode: LockMode::Exclusive as i32,
        wait: true,
        timeout_ms: 60_000,
        lock_delay_ms: 0,
        request_id: 1,
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(65));
    let status = client.lock(request).await.expect_err("the waiter's session ended during the wait");
    let error = warden_shard_node::service::error_of(&status).expect("typed error");
    assert_eq!(error.code, warden_error::Code::SessionExpired as i32, "{status}");
    stop.store(true, Ordering::Relaxed);
    keeper.await.expect("keeper");
}

/// Waiters keep their place in the queue while they wait, across the server's limit on
/// one call's wait (the client library re-attaches to its waiter with the same request id), and
/// are granted in the order they queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_keep_their_place_across_calls_and_are_granted_fifo() {
    use ::warden_client::{Client, ClientConfig, LockOptions, SessionConfig};
    let cluster = crate::support::routed::cluster_with_groups(&[]).await;
    let router = crate::support::routed::start_router(&cluster, 0);
    let client = Client::connect(ClientConfig::new([router.addr.to_string()])).await.expect("connect");
    let config = || SessionConfig { ttl: Duration::from_secs(10), grace_period: Duration::from_secs(10), path_hint: Some("/fifo".into()) };
    let holder = client.session(config()).await.expect("session");
    let held = holder.try_lock("/fifo").await.expect("try").expect("a free lock is taken");
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for index in 1..=3usize {
        let session = client.session(config()).await.expect("session");
        let granted = granted.clone();
        waiters.push(tokio::spawn(async move {
            let options = LockOptions { wait: Duration::from_secs(120), ..LockOptions::default() };
            let guard = session.lock_with("/fifo", &options).await.expect("lock").expect("acquired within the wait");
            granted.lock().expect("lock").push((index, guard.fencing_token()));
            guard.unlock().await.expect("unlock");
            session.close().await.expect("close");
        }));
        let within = Instant::now() + TIMEOUT;
        while client.lock_info("/fifo").await.expect("info").waiters.len() < index {
            assert!(Instant::now() < within, "waiter {index} never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let queued: Vec<u64> = client.lock_info("/fifo").await.expect("info").waiters.iter().map(|w| w.token).collect();
    // Hold the lock across more than two of the server's per-call waits (its request timeout,
    // 5 s): the queue must stay as it is the whole time.
    let hold_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < hold_until {
        let now: Vec<u64> = client.lock_info("/fifo").await.expect("info").waiters.iter().map(|w| w.token).collect();
        assert_eq!(now, queued, "waiters kept their place while waiting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    held.unlock().await.expect("unlock");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    let granted = granted.lock().expect("lock").clone();
    assert_eq!(granted, queued.iter().enumerate().map(|(i, token)| (i + 1, *token)).collect::<Vec<_>>(), "granted in queue order");
}
