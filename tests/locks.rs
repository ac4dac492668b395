//! Locks over gRPC on a 5-replica group: mutual exclusion under contention (50 clients) while clients
//! crash and leaders are killed (checked with a fenced resource), waiting calls that time out
//! and remove their waiter, and sequencers after their lock is lost.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::warden_client::FenceGuard;
use support::api::{namespace_cluster, ApiClient};
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
        lock_delay_ms: 0,
        request_id,
        routing: None,
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
    let check = |sequencer: Sequencer| {
        let api = api.clone();
        async move {
            let request = CheckSequencerRequest { sequencer: Some(sequencer), routing: None };
            api.call(TIMEOUT, true, |mut c| {
                let request = request.clone();
                async move { c.check_sequencer(request).await }
            })
            .await
            .expect("check")
            .holds
        }
    };
    assert!(check(held.clone()).await);
    unlock(&api, held.clone()).await;
    let granted = waiting.await.expect("task").expect("granted after the unlock");
    assert!(granted.token > held.token);
    assert!(!check(held).await, "the old sequencer no longer holds");
    assert!(check(granted).await);
    stop.store(true, Ordering::Relaxed);
    for keeper in keepers {
        keeper.await.expect("keeper");
    }
}
