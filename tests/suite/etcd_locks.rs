//! etcd's lock and election services (`v3lockpb.Lock`, `v3electionpb.Election`) on a router,
//! driven by etcd's Rust client (`etcd-client`): locks held in turn with growing fencing
//! tokens (the header's revision), handed on when a holder's lease is revoked, waiters
//! removed when their caller hangs up, stale keys unlocking nothing; elections led in turn
//! with growing revisions, values proclaimed only by the leader and observed; and, with real
//! `warden` processes, a lock held through the SIGKILL of its group's leader.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, LeaderKey, LockOptions, ObserveStream, ProclaimOptions, ResignOptions};
use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{GetRequest, LockInfoRequest};

use crate::support::etcdctl::RealEtcd;
use crate::support::processes::{self, ProcessCluster, STEP_TIMEOUT};
use crate::support::routed::{client, cluster_with_groups, start_router_with_etcd, Router, TIMEOUT};
use warden_shard_node::cluster::Cluster;

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

/// What the lock tests of the root group start from.
struct RootGroup {
    /// Kept running for the test.
    _cluster: Arc<Cluster>,
    _router: Router,
    /// The router's etcd API.
    etcd_addr: std::net::SocketAddr,
    /// A native client and an etcd client of the router.
    native: WardenClient<Channel>,
    etcd: Client,
    /// Leases of 60 s.
    leases: Vec<i64>,
}

/// A cluster of the root group alone, a router serving etcd's API, and `count` leases.
async fn root_group_with_leases(count: usize) -> RootGroup {
    let cluster = cluster_with_groups(&[]).await;
    let (router, etcd_addr) = start_router_with_etcd(&cluster);
    let native = client(router.addr);
    let mut etcd = etcd_client(etcd_addr).await;
    let mut leases = Vec::with_capacity(count);
    for _ in 0..count {
        leases.push(etcd.lease_grant(60, None).await.expect("grant").id());
    }
    RootGroup { _cluster: cluster, _router: router, etcd_addr, native, etcd, leases }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_locks_are_held_in_turn_with_growing_fencing_tokens() {
    const LOCK: &str = "/locks/deploy";
    let RootGroup { _cluster, _router, mut native, mut etcd, leases, .. } = root_group_with_leases(3).await;
    let [a, b, c] = leases[..] else { unreachable!("three leases") };
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

/// A holder's own Lock called again (a client library retrying after UNAVAILABLE, a call
/// with a short deadline, one cancelled) shares the lease's hold; when such a call ends
/// without its answer, its clean-up must not release the hold an earlier call was answered
/// with, or the next waiter would be granted while the holder still holds. The real etcd
/// keeps the holder's lock through any number of such calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_repeated_lock_that_ends_early_keeps_its_hold() {
    use warden_proto::etcd::v3lockpb::{lock_client::LockClient, LockRequest};
    const LOCK: &str = "/locks/repeated";
    /// Calls of each kind: the defect let the waiter in after three to five.
    const CALLS: u64 = 40;
    let RootGroup { _cluster, _router, etcd_addr, mut native, mut etcd, leases } = root_group_with_leases(2).await;
    let [a, b] = leases[..] else { unreachable!("two leases") };
    let first = etcd.lock(LOCK, Some(LockOptions::new().with_lease(a))).await.expect("lock");
    let mut waiting = etcd.clone();
    let second = tokio::spawn(async move { waiting.lock(LOCK, Some(LockOptions::new().with_lease(b))).await });
    warden_testkit::wait_until("the second locker waits", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![a], vec![b])).await;

    let raw = LockClient::new(Channel::from_shared(format!("http://{etcd_addr}")).expect("uri").connect_lazy());
    let request = || LockRequest { name: LOCK.into(), lease: a };
    for call in 0..CALLS {
        // Deadlines from 1 ms: most end before the router's answer, some get it.
        let mut short = tonic::Request::new(request());
        short.set_timeout(Duration::from_millis(1 + call % 8));
        let _ = raw.clone().lock(short).await;
        // A call its client gives up on while it is under way.
        let mut cancelled = raw.clone();
        let _ = tokio::time::timeout(Duration::from_millis(call % 4), cancelled.lock(request())).await;
        assert!(!second.is_finished(), "the waiter was granted while the holder held the lock (after {} early ends)", 2 * call + 2);
    }
    // The clean-ups run after their calls ended: the queue must stay as it is meanwhile.
    let watched_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watched_until {
        assert_eq!(lock_queue(&mut native, LOCK).await, (vec![a], vec![b]), "the holder keeps its lock, the waiter waits");
        tokio::task::yield_now().await;
    }
    assert!(!second.is_finished(), "the waiter must wait while the holder holds the lock");
    let again = etcd.lock(LOCK, Some(LockOptions::new().with_lease(a))).await.expect("lock again");
    assert_eq!((again.key(), token(&again)), (first.key(), token(&first)), "the hold is the one first answered");
    etcd.unlock(first.key()).await.expect("unlock");
    let second = tokio::time::timeout(TIMEOUT, second).await.expect("the waiter holds in time").expect("task").expect("lock");
    assert!(token(&second) > token(&first), "fencing tokens grow: {} after {}", token(&second), token(&first));
}

/// A delete over a held lock's keys (`del --prefix` of the lock's name) is refused whole:
/// the holder keeps its lock and the waiter waits, since a lock is released by its `Unlock` or
/// its lease's end, never by a write that could not tell its holder. The real etcd deletes the
/// keys and hands the lock to the waiter while the holder never unlocked (run side by side
/// here); docs/etcd.md names the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_over_a_held_locks_keys_is_refused_whole_where_etcd_hands_the_lock_on() {
    const LOCK: &str = "/locks/deleted";
    let prefix = || Some(etcd_client::DeleteOptions::new().with_prefix());
    let RootGroup { _cluster, _router, mut native, mut etcd, leases, .. } = root_group_with_leases(2).await;
    let [a, b] = leases[..] else { unreachable!("two leases") };
    let first = etcd.lock(LOCK, Some(LockOptions::new().with_lease(a))).await.expect("lock");
    let mut waiting = etcd.clone();
    let second = tokio::spawn(async move { waiting.lock(LOCK, Some(LockOptions::new().with_lease(b))).await });
    warden_testkit::wait_until("the second locker waits", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![a], vec![b])).await;
    let listed = etcd.get(format!("{LOCK}/"), Some(GetOptions::new().with_prefix().with_keys_only())).await.expect("get");
    assert_eq!(listed.count(), 2, "the holder and the waiter are listed as keys");
    let refused = etcd.delete(format!("{LOCK}/"), prefix()).await.expect_err("a delete over a held lock").to_string();
    assert!(refused.contains("lock"), "refused for the lock it would release: {refused}");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![a], vec![b]), "nothing deleted: the holder holds, the waiter waits");
    assert!(!second.is_finished(), "the waiter must wait while the holder holds the lock");
    etcd.unlock(first.key()).await.expect("unlock");
    tokio::time::timeout(TIMEOUT, second).await.expect("the waiter holds in time").expect("task").expect("lock");

    let real = RealEtcd::start();
    let mut etcd = etcd_client(real.addr).await;
    let (a, b) = (etcd.lease_grant(60, None).await.expect("grant").id(), etcd.lease_grant(60, None).await.expect("grant").id());
    etcd.lock(LOCK, Some(LockOptions::new().with_lease(a))).await.expect("lock");
    let mut waiting = etcd.clone();
    let second = tokio::spawn(async move { waiting.lock(LOCK, Some(LockOptions::new().with_lease(b))).await });
    let mut lister = etcd.clone();
    warden_testkit::wait_until("the second locker's key is written", TIMEOUT, async || {
        lister.get(format!("{LOCK}/"), Some(GetOptions::new().with_prefix().with_count_only())).await.is_ok_and(|answer| answer.count() == 2)
    })
    .await;
    let deleted = etcd.delete(format!("{LOCK}/"), prefix()).await.expect("etcd deletes the lock's keys");
    assert_eq!(deleted.deleted(), 2, "the holder's key and the waiter's");
    tokio::time::timeout(TIMEOUT, second).await.expect("etcd hands the lock on").expect("task").expect("lock");
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

/// A lease renewed every [`RENEW_EVERY`] as etcd's clients renew theirs, on a keepalive
/// stream opened again whenever it ends (a router that cannot reach the lease's group in
/// time ends the stream with the error, and clients open another).
struct KeptAlive {
    task: tokio::task::JoinHandle<()>,
    /// When each renewal was answered, and the TTL it answered (0: the lease had ended).
    renewals: Arc<Mutex<Vec<(Instant, i64)>>>,
}

/// How often [`KeptAlive`] renews its lease.
const RENEW_EVERY: Duration = Duration::from_secs(1);

impl KeptAlive {
    fn start(mut etcd: Client, lease: i64) -> KeptAlive {
        let renewals = Arc::new(Mutex::new(Vec::new()));
        let record = renewals.clone();
        let task = tokio::spawn(async move {
            loop {
                // Opening the stream renews the lease once (the client reads that answer).
                if let Ok((mut keeper, mut answers)) = etcd.lease_keep_alive(lease).await {
                    while keeper.keep_alive().await.is_ok() {
                        let Ok(Ok(Some(answer))) = tokio::time::timeout(TIMEOUT, answers.message()).await else { break };
                        record.lock().expect("renewals").push((Instant::now(), answer.ttl()));
                        tokio::time::sleep(RENEW_EVERY).await;
                    }
                }
                tokio::time::sleep(RENEW_EVERY).await;
            }
        });
        KeptAlive { task, renewals }
    }

    /// The TTL of the last renewal answered after `after`, if any.
    fn renewed_after(&self, after: Instant) -> Option<i64> {
        self.renewals.lock().expect("renewals").iter().rev().find(|(at, _)| *at > after).map(|(_, ttl)| *ttl)
    }

    /// Every renewal answered so far (the time and the TTL answered).
    fn renewals(&self) -> Vec<(Instant, i64)> {
        self.renewals.lock().expect("renewals").clone()
    }
}

impl Drop for KeptAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A user holding a lock through etcd's lock service, its lease kept alive, keeps it when
/// the leader of the lock's group dies (SIGKILL of a real `warden node`): after the
/// failover its keepalives still renew the lease, past a whole TTL from the new leader's
/// election; another client's `Lock` waits while it holds the lock and gets it once it
/// unlocks, with a strictly greater fencing token (the revision); and once the killed node
/// is back on its data directory, the lock is handed on again when the holder's lease is
/// revoked, with a greater token still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_lock_is_held_through_a_leader_kill_and_handed_on_with_greater_tokens() {
    const LOCK: &str = "/locks/deploy";
    /// Short, so the test waits a whole TTL after the failover in a few seconds; long enough
    /// for a renewal to get through while the router finds the new leader.
    const LEASE_TTL_S: i64 = 5;
    // Only the root group: the lock and both leases (sessions homed there) live in the group
    // whose leader dies.
    let mut cluster = ProcessCluster::start(&[]).await;
    let (_etcd_router, router_addr, etcd_addr) = cluster.start_etcd_router().await;
    let mut native = WardenClient::new(processes::channel(&router_addr, Duration::from_secs(10)));
    let (mut holder, mut contender) = (etcd_client(etcd_addr).await, etcd_client(etcd_addr).await);
    let a = holder.lease_grant(LEASE_TTL_S, None).await.expect("grant").id();
    let b = contender.lease_grant(LEASE_TTL_S, None).await.expect("grant").id();
    let kept_a = KeptAlive::start(holder.clone(), a);
    let kept_b = KeptAlive::start(contender.clone(), b);
    let first = holder.lock(LOCK, Some(LockOptions::new().with_lease(a))).await.expect("lock");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![a], vec![]));

    let got = native.get(GetRequest { path: LOCK.into(), ..GetRequest::default() }).await.expect("read the lock's node").into_inner();
    let group = got.header.expect("a header").group_id;
    let leader = warden_testkit::wait_until("a leader of the lock's group", STEP_TIMEOUT, || cluster.group_leader(group, None)).await;
    cluster.kill(leader);
    let successor = warden_testkit::wait_until("a new leader of the lock's group", STEP_TIMEOUT, || cluster.group_leader(group, Some(leader))).await;
    let elected_by = Instant::now();
    eprintln!("node {leader} (leader of group {group}) SIGKILLed; node {successor} leads it");

    // The new leader re-grants every lease a full TTL when it is elected: a renewal answered
    // more than a TTL after that shows the keepalives themselves kept the lease.
    let renewed_past = elected_by + Duration::from_secs(LEASE_TTL_S as u64 + 1);
    let ttl = warden_testkit::wait_until("a renewal of the holder's lease a TTL after the failover", STEP_TIMEOUT, async || {
        kept_a.renewed_after(renewed_past)
    })
    .await;
    assert_eq!(ttl, LEASE_TTL_S, "the renewal answers the granted TTL: the lease lives");
    assert!(holder.lease_time_to_live(a, None).await.expect("time to live").ttl() > 0, "the holder's lease is alive");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![a], vec![]), "the holder keeps the lock through the failover");

    // A second client's Lock waits while the first holds it, and gets it once it unlocks.
    let mut waiting = contender.clone();
    let second = tokio::spawn(async move { waiting.lock(LOCK, Some(LockOptions::new().with_lease(b))).await });
    warden_testkit::wait_until("the second client waits", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![a], vec![b])).await;
    assert!(!second.is_finished(), "the second client must wait while the first holds the lock");
    holder.unlock(first.key()).await.expect("unlock");
    let second = tokio::time::timeout(TIMEOUT, second).await.expect("the second client holds in time").expect("task").expect("lock");
    assert!(token(&second) > token(&first), "fencing tokens grow across the failover: {} after {}", token(&second), token(&first));
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![b], vec![]));

    // The killed node comes back on its data directory; the lock goes on working: the first
    // client waits again and gets the lock when the second's lease is revoked.
    cluster.restart(leader);
    cluster.wait_caught_up(leader, &[group]).await;
    let mut relocking = holder.clone();
    let third = tokio::spawn(async move { relocking.lock(LOCK, Some(LockOptions::new().with_lease(a))).await });
    warden_testkit::wait_until("the first client waits again", TIMEOUT, async || lock_queue(&mut native, LOCK).await == (vec![b], vec![a])).await;
    drop(kept_b);
    contender.lease_revoke(b).await.expect("revoke the second client's lease");
    let third = tokio::time::timeout(TIMEOUT, third).await.expect("the first client holds again in time").expect("task").expect("lock");
    assert!(token(&third) > token(&second), "fencing tokens grow: {} after {}", token(&third), token(&second));
    holder.unlock(third.key()).await.expect("unlock");
    assert_eq!(lock_queue(&mut native, LOCK).await, (vec![], vec![]));
    let lost: Vec<_> = kept_a.renewals().into_iter().filter(|(_, ttl)| *ttl <= 0).collect();
    assert!(lost.is_empty(), "a renewal of the holder's lease found it ended: {lost:?}");
}
