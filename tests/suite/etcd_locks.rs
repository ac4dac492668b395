//! etcd's lock and election services (`v3lockpb.Lock`, `v3electionpb.Election`) on a router,
//! driven by etcd's Rust client (`etcd-client`): locks held in turn with growing fencing
//! tokens (the header's revision), handed on when a holder's lease is revoked, waiters
//! removed when their caller hangs up, stale keys unlocking nothing; elections led in turn
//! with growing revisions, values proclaimed only by the leader and observed.

use etcd_client::{Client, GetOptions, LeaderKey, LockOptions, ObserveStream, ProclaimOptions, ResignOptions};
use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::LockInfoRequest;

use crate::support::routed::{client, cluster_with_groups, start_router_with_etcd, TIMEOUT};

async fn etcd_client(addr: std::net::SocketAddr) -> Client {
    Client::connect([format!("http://{addr}")], None).await.expect("etcd client connects")
}

/// The router's native `LockInfo` of the lock at `path`.
async fn lock_info(native: &mut WardenClient<Channel>, path: &str) -> warden_proto::v1::LockInfoResponse {
    native.lock_info(LockInfoRequest { path: path.into(), routing: None }).await.expect("lock info").into_inner()
}

/// The leases holding the lock at `path`, and those waiting for it in order.
async fn lock_queue(native: &mut WardenClient<Channel>, path: &str) -> (Vec<i64>, Vec<i64>) {
    let info = lock_info(native, path).await;
    let leases = |waiters: &[warden_proto::v1::LockWaiter]| waiters.iter().map(|waiter| i64::try_from(waiter.session_id).expect("lease")).collect();
    (leases(&info.holders), leases(&info.waiters))
}

/// The fencing token of a Lock answer.
fn token(answer: &etcd_client::LockResponse) -> i64 {
    answer.header().expect("a header").revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_locks_are_held_in_turn_with_growing_fencing_tokens() {
    const LOCK: &str = "/locks/deploy";
    let cluster = cluster_with_groups(&[]).await;
    let (router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut native = client(router.addr);
    let mut etcd = etcd_client(etcd_addr).await;
    let a = etcd.lease_grant(60, None).await.expect("grant").id();
    let b = etcd.lease_grant(60, None).await.expect("grant").id();
    let c = etcd.lease_grant(60, None).await.expect("grant").id();
    let with = |lease: i64| Some(LockOptions::new().with_lease(lease));

    let first = etcd.lock(LOCK, with(a)).await.expect("lock");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![a], vec![]));
    let holder = lock_info(&mut native, LOCK).await.holders[0].token;
    assert_eq!(u64::try_from(token(&first)), Ok(holder), "the revision is the hold's fencing token");
    let again = etcd.lock(LOCK, with(a)).await.expect("lock again with the same lease");
    assert_eq!((again.key(), token(&again)), (first.key(), token(&first)), "a lease holds a lock once, as in etcd");

    // A second locker waits; a third hangs up while waiting, and its waiter goes.
    let mut waiting = etcd.clone();
    let second = tokio::spawn(async move { waiting.lock(LOCK, Some(LockOptions::new().with_lease(b))).await });
    warden_testkit::wait_until("the second locker waits", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![a], vec![b])).await;
    let mut hanging_up = etcd.clone();
    let third = tokio::spawn(async move { hanging_up.lock(LOCK, Some(LockOptions::new().with_lease(c))).await });
    warden_testkit::wait_until("the third locker waits", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![a], vec![b, c])).await;
    third.abort();
    warden_testkit::wait_until("the waiter of a locker that hung up is gone", TIMEOUT, async || {
        lock_queue(&mut native, LOCK).await == (vec![a], vec![b])
    })
    .await;
    assert!(!second.is_finished(), "the second locker must wait while the first holds the lock");

    etcd.unlock(first.key()).await.expect("unlock");
    let second = tokio::time::timeout(TIMEOUT, second).await.expect("the second locker holds in time").expect("task").expect("lock");
    assert!(token(&second) > token(&first), "fencing tokens grow: {} after {}", token(&second), token(&first));
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![b], vec![]));

    // The holder's lease is revoked: the lock passes to the waiter.
    let mut waiting = etcd.clone();
    let relocked = tokio::spawn(async move { waiting.lock(LOCK, Some(LockOptions::new().with_lease(a))).await });
    warden_testkit::wait_until("the first lease waits again", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![b], vec![a])).await;
    etcd.lease_revoke(b).await.expect("revoke the holder's lease");
    let relocked = tokio::time::timeout(TIMEOUT, relocked).await.expect("the waiter holds in time").expect("task").expect("lock");
    assert!(token(&relocked) > token(&second), "fencing tokens grow: {} after {}", token(&relocked), token(&second));

    // Stale keys unlock nothing, not even one of an earlier hold of the holding lease.
    etcd.unlock(second.key()).await.expect("unlocking a hold that ended is harmless");
    etcd.unlock(first.key()).await.expect("unlocking the holding lease's earlier hold is harmless");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![a], vec![]), "the current hold stays");
    let refused = etcd.lock(LOCK, with(b)).await.expect_err("a revoked lease cannot lock");
    assert!(refused.to_string().contains("requested lease not found"), "{refused}");
    etcd.unlock(relocked.key()).await.expect("unlock");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![], vec![]));
}

/// The next leader `observed` reports (within [`TIMEOUT`]): its key and value.
async fn next_leader(observed: &mut ObserveStream) -> (Vec<u8>, String) {
    let answer = tokio::time::timeout(TIMEOUT, observed.message()).await.expect("a leader in time").expect("observing").expect("an answer");
    let kv = answer.kv().expect("the leader's key");
    (kv.key().to_vec(), String::from_utf8_lossy(kv.value()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_elections_are_led_in_turn_with_growing_revisions() {
    const ELECTION: &str = "/elect/web";
    let cluster = cluster_with_groups(&[]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let (first_lease, second_lease) = (etcd.lease_grant(60, None).await.expect("grant").id(), etcd.lease_grant(60, None).await.expect("grant").id());
    let mut observed = etcd.observe(ELECTION).await.expect("observe");
    let refused = etcd.leader(ELECTION).await.expect_err("no leader yet");
    assert!(refused.to_string().contains("election: no leader"), "{refused}");

    let first = etcd.campaign(ELECTION, "web-1", first_lease).await.expect("campaign").leader().expect("a leader key").clone();
    let leader = etcd.leader(ELECTION).await.expect("leader");
    let kv = leader.kv().expect("the leader's key");
    assert_eq!((kv.key(), kv.value(), kv.lease(), kv.create_revision()), (first.key(), b"web-1".as_slice(), first_lease, first.rev()));
    assert_eq!(next_leader(&mut observed).await, (first.key().to_vec(), "web-1".to_string()));

    // A second candidate waits behind the first.
    let mut campaigning = etcd.clone();
    let second = tokio::spawn(async move { campaigning.campaign(ELECTION, "web-2", second_lease).await });
    let candidates = warden_testkit::wait_until("the second candidate waits", TIMEOUT, async || {
        let candidates = etcd.get(format!("{ELECTION}/"), Some(GetOptions::new().with_prefix())).await.expect("get").kvs().to_vec();
        (candidates.len() == 2).then_some(candidates)
    })
    .await;
    assert!(!second.is_finished(), "the second candidate must not lead while the first does");
    assert_eq!(etcd.leader(ELECTION).await.expect("leader").kv().expect("kv").value(), b"web-1");

    // The leader proclaims a value; a candidate that does not lead cannot.
    etcd.proclaim("web-1b", Some(ProclaimOptions::new().with_leader(first.clone()))).await.expect("proclaim");
    assert_eq!(next_leader(&mut observed).await, (first.key().to_vec(), "web-1b".to_string()));
    assert_eq!(etcd.leader(ELECTION).await.expect("leader").kv().expect("kv").value(), b"web-1b");
    let waiting = &candidates[1];
    let waiting_key = LeaderKey::new().with_name(ELECTION).with_key(waiting.key()).with_rev(waiting.create_revision()).with_lease(second_lease);
    let refused = etcd.proclaim("web-2 too early", Some(ProclaimOptions::new().with_leader(waiting_key))).await.expect_err("not the leader");
    assert!(refused.to_string().contains("election: not leader"), "{refused}");

    // The leader resigns: the second candidate leads, with a greater revision.
    etcd.resign(Some(ResignOptions::new().with_leader(first.clone()))).await.expect("resign");
    let second = tokio::time::timeout(TIMEOUT, second).await.expect("the second candidate leads in time").expect("task").expect("campaign");
    let second = second.leader().expect("a leader key").clone();
    assert_eq!(second.key(), waiting.key());
    assert!(second.rev() > first.rev(), "leader revisions grow: {} after {}", second.rev(), first.rev());
    assert_eq!(next_leader(&mut observed).await, (second.key().to_vec(), "web-2".to_string()));
    assert_eq!(etcd.leader(ELECTION).await.expect("leader").kv().expect("kv").value(), b"web-2");
    let refused = etcd.proclaim("web-1c", Some(ProclaimOptions::new().with_leader(first))).await.expect_err("a resigned leader");
    assert!(refused.to_string().contains("election: not leader"), "{refused}");

    etcd.resign(Some(ResignOptions::new().with_leader(second))).await.expect("resign");
    let refused = etcd.leader(ELECTION).await.expect_err("no leader left");
    assert!(refused.to_string().contains("election: no leader"), "{refused}");
}
