//! etcd's client-side lock and election recipes (Go's `clientv3/concurrency`: `Mutex`,
//! `Election`, `Session`; ported call for call in `support::etcd_concurrency`) on a
//! router's etcd API, with the cases of etcd's own tests (`mutex_test.go`,
//! `election_test.go`, `v3_lock_test.go`, `v3_election_test.go`) that apply. Unlike
//! `etcd_locks` (etcd's Lock and Election *services*), these recipes use only KV, Lease and
//! Watch, so they prove the semantics they rely on hold through Warden: a transaction
//! comparing a key's create revision with 0 (or with its own), ranges of a prefix sorted by
//! create revision with a limit and filtered by a maximum create revision, watches from a
//! revision that see a key's delete, and leases whose end deletes their keys.
//!
//! Locks: lockers hold in turn in create revision order, each holder's key the prefix's
//! first created; `TryLock` fails while the lock is held and succeeds after; a holder's
//! lease revoked or expired hands the lock on; a waiter whose session ends fails; a session
//! relocks at once; a waiter waits for the current holder when the waiter before it leaves.
//! Elections: candidates lead in campaign order and observers see each; a leader's session
//! ending fails over; proclaimed values are observed, proclaims without leading refused;
//! resigning hands over; a resumed election observes the next leader; a candidate wins on
//! a prefix of existing keys; a session campaigning again, or after a restart, proclaims;
//! a proclaim after the leader's lease ended is refused as not leading.
//!
//! The recipes' keys live in a group of their own (`/conc`), beside the root group, which
//! serves `/_etcd`, where the escaped key of a prefix like `/conc/lock/` lives: each
//! recipe's range of a prefix spans both groups, and so does its watch of an election's
//! prefix. Leases are homed in either group (Warden spreads them). So locks must be handed
//! on, and proclaims observed, while the root group's revision is ahead of the recipes'
//! group's, and a watch across both groups must answer its creation before its events.

use std::sync::Arc;

use etcd_client::EventType::{Delete, Put};
use etcd_client::{Client, Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions};
use tokio::sync::mpsc;
use warden_proto::v1::GetRequest;
use warden_shard_node::cluster::Cluster;

use crate::support::etcd_concurrency::{Election, Error, Mutex, Observer, Session};
use crate::support::routed::{client, cluster_with_groups, start_router_with_etcd, Router, TIMEOUT};

/// The group the recipes' keys live in.
const GROUP: &str = "/conc";
/// The lock's prefix (its keys are `/conc/lock/<lease in hex>`).
const LOCK: &str = "/conc/lock";
/// The election's prefix (its candidates are `/conc/elect/<lease in hex>`).
const ELECTION: &str = "/conc/elect";
/// Go's default session TTL: such sessions outlive every test.
const SESSION_TTL_S: i64 = 60;
/// The shortest session TTL Warden grants (the in-process cluster's floor): for sessions
/// a test lets expire.
const SHORT_TTL_S: i64 = 3;

/// A cluster with the recipes' group, a router serving etcd's API, and its client.
struct Fixture {
    _cluster: Arc<Cluster>,
    router: Router,
    etcd: Client,
}

impl Fixture {
    /// Starts `waiter` locking [`LOCK`] in a task of its own and waits (`what`) until its key
    /// is queued behind the holder's; the task answers the mutex once it holds.
    async fn queue_behind_holder(&self, waiter: Mutex, what: &str) -> tokio::task::JoinHandle<Result<Mutex, Error>> {
        let waiting = tokio::spawn(async move {
            let mut waiter = waiter;
            waiter.lock().await.map(|()| waiter)
        });
        warden_testkit::wait_until(what, TIMEOUT, async || self.keys(LOCK).await.len() == 2).await;
        waiting
    }

    async fn start() -> Fixture {
        let cluster = cluster_with_groups(&[GROUP]).await;
        let (router, etcd_addr) = start_router_with_etcd(&cluster);
        let etcd = Client::connect([format!("http://{etcd_addr}")], None).await.expect("etcd client connects");
        Fixture { _cluster: cluster, router, etcd }
    }

    /// The id of the group serving `path` (read with the router's native API).
    async fn group_of(&self, path: &str) -> u64 {
        let got = client(self.router.addr).get(GetRequest { path: path.into(), ..GetRequest::default() }).await.expect("read a node");
        got.into_inner().header.expect("a header").group_id
    }

    /// Puts keys in the root group until its revision is more than `AHEAD` past the
    /// recipes' group's, as traffic elsewhere makes it; answers both revisions. A recipe's
    /// range of its prefix asks the root group too: the prefix's own key (`/conc/lock/`) is
    /// escaped, under `/_etcd`.
    async fn put_root_ahead(&self) -> (i64, i64) {
        /// How far ahead.
        const AHEAD: i64 = 10;
        let mut etcd = self.etcd.clone();
        for index in 0..1000 {
            let put = etcd.put(format!("/ahead/{index}"), "", None).await.expect("put in the root group");
            let root = put.header().expect("a header").revision();
            let group = etcd.get(format!("{GROUP}/ahead"), None).await.expect("get in the recipes' group").header().expect("a header").revision();
            if root > group + AHEAD {
                return (root, group);
            }
        }
        panic!("the root group's revision stays behind the recipes' group's");
    }

    /// A session of `ttl_s` kept alive.
    async fn session(&self, ttl_s: i64) -> Session {
        Session::new(&self.etcd, ttl_s).await.expect("a session")
    }

    /// The keys below `prefix + "/"`, in key order.
    async fn keys(&self, prefix: &str) -> Vec<KeyValue> {
        self.etcd.clone().get(format!("{prefix}/"), Some(GetOptions::new().with_prefix())).await.expect("get the prefix").kvs().to_vec()
    }

    /// The key below `prefix + "/"` created first, read as the recipes read it.
    async fn first_created(&self, prefix: &str) -> Option<KeyValue> {
        let first = GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1);
        self.etcd.clone().get(format!("{prefix}/"), Some(first)).await.expect("get the first created key").kvs().first().cloned()
    }

    /// Whether `key` exists.
    async fn exists(&self, key: &str) -> bool {
        !self.etcd.clone().get(key, None).await.expect("get").kvs().is_empty()
    }
}

/// The next answer of `observer` (within [`TIMEOUT`]): the leader's value and the answer.
async fn next_observed(observer: &mut Observer) -> (String, crate::support::etcd_concurrency::Observation) {
    let observed = tokio::time::timeout(TIMEOUT, observer.next()).await.expect("an observation in time").expect("observing goes on");
    (observed.value(), observed)
}

/// Asserts `result` is `expected`'s error (compared by message).
fn assert_error<T: std::fmt::Debug>(result: Result<T, Error>, expected: Error) {
    let error = result.expect_err(&format!("expected {expected}"));
    assert_eq!(error.to_string(), expected.to_string());
}

/// Go's `testMutexLock` (5 waiters) and `ExampleMutex_Lock`: lockers holding the lock one at
/// a time, in the order of their keys' create revisions, each holder's key the prefix's
/// first created, and each holder's `IsOwner` compare fencing a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_lockers_hold_the_lock_one_at_a_time_in_create_revision_order() {
    const LOCKERS: usize = 5;
    let f = Fixture::start().await;
    let mut sessions = Vec::new();
    for _ in 0..LOCKERS {
        sessions.push(f.session(SESSION_TTL_S).await);
    }
    let (locked, mut holders) = mpsc::unbounded_channel();
    for session in &sessions {
        let (mut mutex, locked) = (Mutex::new(session, LOCK), locked.clone());
        tokio::spawn(async move {
            let result = mutex.lock().await;
            let _ = locked.send(result.map(|()| mutex));
        });
    }
    warden_testkit::wait_until("every locker has its key", TIMEOUT, async || f.keys(LOCK).await.len() == LOCKERS).await;

    let mut etcd = f.etcd.clone();
    let mut previous_revision = 0;
    for turn in 0..LOCKERS {
        let mut holder = tokio::time::timeout(TIMEOUT, holders.recv()).await.expect("a locker holds in time").expect("lockers").expect("lock");
        assert!(holders.try_recv().is_err(), "turn {turn}: another locker holds the lock too");
        let first = f.first_created(LOCK).await.expect("the holder's key");
        assert_eq!((first.key(), first.create_revision()), (holder.key().as_bytes(), holder.revision()), "turn {turn}: the holder's key is first");
        assert!(holder.revision() > previous_revision, "turn {turn}: held out of create revision order");
        assert!(holder.header_revision() >= holder.revision(), "turn {turn}: the lock is given at or after its key's creation");
        assert_eq!(f.keys(LOCK).await.len(), LOCKERS - turn, "turn {turn}: the waiters keep their keys");
        previous_revision = holder.revision();

        // The holder's `IsOwner` fences a write; a compare with another revision fails.
        let fenced = |owner: Compare| Txn::new().when([owner]).and_then([TxnOp::put("/conc/fenced", format!("{turn}"), None)]);
        assert!(etcd.txn(fenced(holder.is_owner())).await.expect("fenced txn").succeeded(), "turn {turn}: the holder's write is fenced in");
        let stale = Compare::create_revision(holder.key(), CompareOp::Equal, holder.revision() - 1);
        assert!(!etcd.txn(fenced(stale)).await.expect("fenced txn").succeeded(), "turn {turn}: a stale revision is fenced out");
        holder.unlock().await.expect("unlock");
    }
    assert!(f.keys(LOCK).await.is_empty(), "every locker unlocked");
}

/// Go's `testMutexTryLock` (5 lockers) and `ExampleMutex_TryLock`: of lockers trying at
/// once, one holds and the others fail with `ErrLocked`, leaving no key; a `TryLock` while
/// the lock is held fails, and succeeds once it is unlocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_fails_with_locked_while_held_and_succeeds_after_unlock() {
    const LOCKERS: usize = 5;
    let f = Fixture::start().await;
    let mut sessions = Vec::new();
    for _ in 0..LOCKERS {
        sessions.push(f.session(SESSION_TTL_S).await);
    }
    let tries: Vec<_> = sessions
        .iter()
        .map(|session| {
            let mut mutex = Mutex::new(session, LOCK);
            tokio::spawn(async move { (mutex.try_lock().await, mutex) })
        })
        .collect();
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for tried in tries {
        match tokio::time::timeout(TIMEOUT, tried).await.expect("TryLock answers in time").expect("task") {
            (Ok(()), mutex) => held.push(mutex),
            (Err(Error::Locked), mutex) => refused.push(mutex),
            (Err(error), _) => panic!("TryLock failed: {error}"),
        }
    }
    assert_eq!((held.len(), refused.len()), (1, LOCKERS - 1), "exactly one TryLock holds the lock");
    let mut holder = held.pop().expect("a holder");
    let keys: Vec<Vec<u8>> = f.keys(LOCK).await.iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(keys, vec![holder.key().as_bytes().to_vec()], "a failed TryLock leaves no key");

    let mut second = refused.pop().expect("a refused locker");
    assert_error(second.try_lock().await, Error::Locked);
    assert_error(second.unlock().await, Error::LockReleased);
    holder.unlock().await.expect("unlock");
    second.try_lock().await.expect("TryLock after the unlock");
    assert_eq!(f.first_created(LOCK).await.expect("the holder's key").key(), second.key().as_bytes());
    second.unlock().await.expect("unlock");
}

/// Go's `TestMutexUnlock`: unlocking a mutex that never locked, or unlocking twice, fails
/// with `ErrLockReleased`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_of_a_mutex_holding_nothing_fails_with_lock_released() {
    let f = Fixture::start().await;
    let session = f.session(SESSION_TTL_S).await;
    let mut mutex = Mutex::new(&session, LOCK);
    assert_error(mutex.unlock().await, Error::LockReleased);
    mutex.lock().await.expect("lock");
    let key = mutex.key().to_string();
    assert!(f.exists(&key).await, "the holder's key");
    mutex.unlock().await.expect("unlock");
    assert!(!f.exists(&key).await, "unlock deletes the key");
    assert_error(mutex.unlock().await, Error::LockReleased);
}

/// A lock whose holder's session is closed (its lease revoked) passes to the waiter; one
/// whose holder stops renewing its lease passes on when the lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_passes_to_its_waiter_when_the_holder_lease_is_revoked_or_expires() {
    let f = Fixture::start().await;
    let first = f.session(SESSION_TTL_S).await;
    let mut second = f.session(SHORT_TTL_S).await;
    let third = f.session(SESSION_TTL_S).await;
    let mut holder = Mutex::new(&first, LOCK);
    holder.lock().await.expect("lock");

    let waiter = Mutex::new(&second, LOCK);
    let waiting = f.queue_behind_holder(waiter, "the second locker waits").await;
    assert!(!waiting.is_finished(), "the second locker must wait while the first holds the lock");
    first.close().await.expect("revoke the holder's lease");
    let second_holder = tokio::time::timeout(TIMEOUT, waiting).await.expect("the waiter holds in time").expect("task").expect("lock");
    assert!(!f.exists(holder.key()).await, "the revoked lease's key is gone");
    assert_eq!(f.first_created(LOCK).await.expect("the holder's key").key(), second_holder.key().as_bytes());

    // The second holder's session stops renewing: its lease expires and the lock passes on.
    let waiter = Mutex::new(&third, LOCK);
    let waiting = f.queue_behind_holder(waiter, "the third locker waits").await;
    second.orphan();
    let mut third_holder = tokio::time::timeout(TIMEOUT, waiting).await.expect("the waiter holds in time").expect("task").expect("lock");
    assert!(!f.exists(second_holder.key()).await, "the expired lease's key is gone");
    assert!(third_holder.revision() > second_holder.revision(), "create revisions grow from holder to holder");
    third_holder.unlock().await.expect("unlock");
}

/// Go's `TestMutexLockSessionExpired`: a locker waiting while its own session is closed
/// fails with `ErrSessionExpired` once the holder unlocks, rather than holding the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_locker_whose_session_is_closed_fails_with_session_expired() {
    let f = Fixture::start().await;
    let first = f.session(SESSION_TTL_S).await;
    let second = f.session(SESSION_TTL_S).await;
    let mut holder = Mutex::new(&first, LOCK);
    holder.lock().await.expect("lock");
    let mut waiter = Mutex::new(&second, LOCK);
    let waiting = tokio::spawn(async move { waiter.lock().await });
    warden_testkit::wait_until("the second locker waits", TIMEOUT, async || f.keys(LOCK).await.len() == 2).await;
    let waiter_key = format!("{LOCK}/{:x}", second.lease());
    second.close().await.expect("revoke the waiter's lease");
    // A revoke deletes a lease's keys outside its home group (Warden homes it in either
    // group) at that group's next check of the session (docs/etcd.md), not in the revoke's
    // revision as etcd does. Go's test unlocks at once; had the waiter's key lingered past
    // the unlock, its Lock would succeed, so wait for the key to go first.
    warden_testkit::wait_until("the waiter's key is deleted", TIMEOUT, async || !f.exists(&waiter_key).await).await;
    assert!(!waiting.is_finished(), "the waiter waits for the holder, not for its own key");
    holder.unlock().await.expect("unlock");
    let waited = tokio::time::timeout(TIMEOUT, waiting).await.expect("the waiter answers in time").expect("task");
    assert_error(waited, Error::SessionExpired);
}

/// Go's `TestMutexSessionRelock`: a second mutex of the same session locks the lock the
/// session holds at once, with the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_relocks_a_lock_it_holds_at_once() {
    let f = Fixture::start().await;
    let session = f.session(SESSION_TTL_S).await;
    let mut first = Mutex::new(&session, LOCK);
    first.lock().await.expect("lock");
    let mut again = Mutex::new(&session, LOCK);
    tokio::time::timeout(TIMEOUT, again.lock()).await.expect("relocking does not wait").expect("lock");
    assert_eq!((again.key(), again.revision()), (first.key(), first.revision()), "the same key, created once");
    assert_eq!(f.keys(LOCK).await.len(), 1);
}

/// Go's `TestMutexWaitsOnCurrentHolder`: a locker waits until every key created before its
/// own is deleted, not only the one just before it: when the waiter ahead of it leaves, it
/// goes on waiting for the holder; the departed waiter's Lock fails once the holder unlocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_waits_for_the_current_holder_when_the_waiter_before_it_leaves() {
    let f = Fixture::start().await;
    let mut etcd = f.etcd.clone();
    // Every put and delete of the lock's keys, from before the first lock on.
    let mut events = etcd.watch(format!("{LOCK}/"), Some(WatchOptions::new().with_prefix())).await.expect("watch the lock's keys");
    let mut next_events = async || loop {
        let answer = tokio::time::timeout(TIMEOUT, events.message()).await.expect("watch events in time").expect("watching").expect("an answer");
        if !answer.events().is_empty() {
            return answer.events().iter().map(|event| event.event_type()).collect::<Vec<_>>();
        }
    };
    let first = f.session(SESSION_TTL_S).await;
    let mut holder = Mutex::new(&first, LOCK);
    holder.lock().await.expect("lock");
    assert_eq!(next_events().await, vec![Put], "the holder's key");
    let victim_session = f.session(SESSION_TTL_S).await;
    let mut victim = Mutex::new(&victim_session, LOCK);
    let victim_waiting = tokio::spawn(async move { victim.lock().await });
    assert_eq!(next_events().await, vec![Put], "the victim's key");
    let new_owner_session = f.session(SESSION_TTL_S).await;
    let new_owner = Mutex::new(&new_owner_session, LOCK);
    let new_owner_waiting = tokio::spawn(async move {
        let mut new_owner = new_owner;
        new_owner.lock().await.map(|()| new_owner)
    });
    assert_eq!(next_events().await, vec![Put], "the new owner's key");

    // The waiter next in line goes; the holder still holds the lock.
    victim_session.close().await.expect("revoke the victim's lease");
    assert_eq!(next_events().await, vec![Delete], "the victim's key is deleted");
    assert!(!new_owner_waiting.is_finished(), "the new owner holds the lock before the holder unlocked it");
    assert_eq!(f.first_created(LOCK).await.expect("the holder's key").key(), holder.key().as_bytes());

    holder.unlock().await.expect("unlock");
    let new_owner = tokio::time::timeout(TIMEOUT, new_owner_waiting).await.expect("the new owner holds in time").expect("task").expect("lock");
    assert_eq!(f.first_created(LOCK).await.expect("the new owner's key").key(), new_owner.key().as_bytes());
    let victim = tokio::time::timeout(TIMEOUT, victim_waiting).await.expect("the victim's Lock ends in time").expect("task");
    assert_error(victim, Error::SessionExpired);
}

/// Go's `TestElectionWait` (3 candidates, 3 observers) and `ExampleElection_Campaign`:
/// candidates campaigning at once lead one at a time in the order of their keys' create
/// revisions, each until it resigns; every observer sees each leader in turn, and `Leader`
/// answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_lead_in_campaign_order_and_observers_see_each_leader() {
    const CANDIDATES: usize = 3;
    const OBSERVERS: usize = 3;
    let f = Fixture::start().await;
    let watcher = f.session(SESSION_TTL_S).await;
    let mut observers: Vec<Observer> = (0..OBSERVERS).map(|_| Election::new(&watcher, ELECTION).observe()).collect();
    let mut sessions = Vec::new();
    for _ in 0..CANDIDATES {
        sessions.push(f.session(SESSION_TTL_S).await);
    }
    let (elected, mut leaders) = mpsc::unbounded_channel();
    for (index, session) in sessions.iter().enumerate() {
        let (mut election, elected) = (Election::new(session, ELECTION), elected.clone());
        tokio::spawn(async move {
            let value = format!("candidate-{index}");
            let result = election.campaign(&value).await;
            let _ = elected.send(result.map(|()| (value, election)));
        });
    }
    warden_testkit::wait_until("every candidate has its key", TIMEOUT, async || f.keys(ELECTION).await.len() == CANDIDATES).await;

    let mut previous_revision = 0;
    for round in 0..CANDIDATES {
        let (value, mut leader) =
            tokio::time::timeout(TIMEOUT, leaders.recv()).await.expect("a leader in time").expect("candidates").expect("campaign");
        assert!(leaders.try_recv().is_err(), "round {round}: another candidate leads too");
        assert!(leader.revision() > previous_revision, "round {round}: led out of campaign order");
        previous_revision = leader.revision();
        let answered = leader.leader().await.expect("a leader");
        let kv = &answered.kvs()[0];
        assert_eq!((kv.key(), kv.value(), kv.create_revision()), (leader.key().as_bytes(), value.as_bytes(), leader.revision()));
        for (index, observer) in observers.iter_mut().enumerate() {
            let (observed, observation) = next_observed(observer).await;
            assert_eq!(observed, value, "round {round}: observer {index} sees the leader");
            assert_eq!(observation.kv.key(), leader.key().as_bytes());
        }
        leader.resign().await.expect("resign");
    }
    assert_error(Election::new(&watcher, ELECTION).leader().await, Error::NoLeader);
}

/// Go's `TestElectionFailover`: when the leader's session is closed, the waiting candidate
/// leads, and a new observer sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_fails_over_to_the_waiting_candidate_when_the_leader_session_ends() {
    let f = Fixture::start().await;
    let (first, second, third) = (f.session(SESSION_TTL_S).await, f.session(SESSION_TTL_S).await, f.session(SESSION_TTL_S).await);
    let mut leader = Election::new(&first, ELECTION);
    leader.campaign("foo").await.expect("campaign");
    let mut observer = leader.observe();
    assert_eq!(next_observed(&mut observer).await.0, "foo");

    let mut next = Election::new(&second, ELECTION);
    let campaigning = tokio::spawn(async move { next.campaign("bar").await.map(|()| next) });
    warden_testkit::wait_until("the second candidate waits", TIMEOUT, async || f.keys(ELECTION).await.len() == 2).await;
    assert!(!campaigning.is_finished(), "the second candidate must not lead while the first does");
    first.close().await.expect("revoke the leader's lease");
    let next = tokio::time::timeout(TIMEOUT, campaigning).await.expect("the second candidate leads in time").expect("task").expect("campaign");
    assert!(next.revision() > leader.revision());
    assert_eq!(next_observed(&mut observer).await.0, "bar", "the first observer sees the failover");
    let mut fresh = Election::new(&third, ELECTION).observe();
    assert_eq!(next_observed(&mut fresh).await.0, "bar", "a new observer sees the new leader");
}

/// Go's `TestElectionObserveFreshResponsesOnProclaim` and `TestElectionObserveCompacted`,
/// and `ErrElectionNotLeader`: values the leader proclaims are observed in turn (versions
/// 1, 2, 3, growing revisions); a compaction does not disturb observing (Warden has nothing
/// to compact); an election that never campaigned, or that resigned, is refused `Proclaim`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_proclaims_values_observers_see_and_a_non_leader_is_refused() {
    let f = Fixture::start().await;
    let (first, second) = (f.session(SESSION_TTL_S).await, f.session(SESSION_TTL_S).await);
    let mut leader = Election::new(&first, ELECTION);
    leader.campaign("abc").await.expect("campaign");
    let revision = f.etcd.clone().put("/conc/other", "bar", None).await.expect("put").header().expect("a header").revision();
    f.etcd.clone().compact(revision, None).await.expect("compact");

    let mut observer = leader.observe();
    let mut answers = Vec::new();
    answers.push(next_observed(&mut observer).await);
    leader.proclaim("def").await.expect("proclaim");
    answers.push(next_observed(&mut observer).await);
    leader.proclaim("ghi").await.expect("proclaim");
    answers.push(next_observed(&mut observer).await);
    let values: Vec<_> = answers.iter().map(|(value, _)| value.as_str()).collect();
    assert_eq!(values, ["abc", "def", "ghi"]);
    let versions: Vec<_> = answers.iter().map(|(_, observed)| observed.kv.version()).collect();
    assert_eq!(versions, [1, 2, 3]);
    assert!(answers.windows(2).all(|pair| pair[0].1.revision < pair[1].1.revision), "revisions grow: {answers:?}");
    assert_eq!(leader.header_revision(), answers[2].1.kv.mod_revision(), "Proclaim's header is the put's revision");

    // Not leading: never campaigned, the leader key gone with its lease, resigned.
    let mut bystander = Election::new(&second, ELECTION);
    assert_error(bystander.proclaim("jkl").await, Error::NotLeader);
    leader.resign().await.expect("resign");
    assert_error(leader.proclaim("jkl").await, Error::NotLeader);
}

/// `ErrElectionNotLeader` when the leader's key is gone with its lease: `Proclaim`'s
/// transaction compares the key's create revision, which fails, so its put (with the ended
/// lease) does not run and the transaction answers `succeeded: false`, as in etcd, which
/// judges only the operations of the branch taken. The leader's lease is homed in another
/// group than the election's keys (Warden picks a lease's home group at random; the test
/// grants until one is), where a transaction naming a remote session checks it first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_leader_lease_ended_fails_with_not_leader() {
    let f = Fixture::start().await;
    let election_group = f.group_of(GROUP).await;
    let mut sessions = Vec::new();
    let first = loop {
        let session = f.session(SESSION_TTL_S).await;
        if warden_paths::home_group(u64::try_from(session.lease()).expect("a lease id")) != election_group {
            break session;
        }
        assert!(sessions.len() < 32, "every lease granted is homed in the election's group");
        sessions.push(session);
    };
    let mut leader = Election::new(&first, ELECTION);
    leader.campaign("abc").await.expect("campaign");
    let gone = leader.key().to_string();
    first.close().await.expect("revoke the leader's lease");
    warden_testkit::wait_until("the leader's key is deleted", TIMEOUT, async || !f.exists(&gone).await).await;
    assert_error(leader.proclaim("def").await, Error::NotLeader);
    assert_eq!(leader.key(), "", "a refused Proclaim forgets the leader key");
    assert!(!f.exists(&gone).await, "a refused Proclaim puts nothing");
}

/// A leader resigning hands leadership to the waiting candidate; once it resigns too, there
/// is no leader; resigning again is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigning_leader_hands_over_and_the_last_leaves_no_leader() {
    let f = Fixture::start().await;
    let (first, second) = (f.session(SESSION_TTL_S).await, f.session(SESSION_TTL_S).await);
    let mut leader = Election::new(&first, ELECTION);
    leader.campaign("one").await.expect("campaign");
    let mut next = Election::new(&second, ELECTION);
    let campaigning = tokio::spawn(async move { next.campaign("two").await.map(|()| next) });
    warden_testkit::wait_until("the second candidate waits", TIMEOUT, async || f.keys(ELECTION).await.len() == 2).await;
    assert_eq!(leader.leader().await.expect("a leader").kvs()[0].value(), b"one");
    assert!(!campaigning.is_finished(), "the second candidate must not lead while the first does");

    leader.resign().await.expect("resign");
    let mut next = tokio::time::timeout(TIMEOUT, campaigning).await.expect("the second candidate leads in time").expect("task").expect("campaign");
    assert_eq!(next.leader().await.expect("a leader").kvs()[0].value(), b"two");
    assert!(next.revision() > leader.revision());
    next.resign().await.expect("resign");
    assert_error(next.leader().await, Error::NoLeader);
    next.resign().await.expect("resigning again is harmless");
    assert!(f.keys(ELECTION).await.is_empty());
}

/// Go's `TestResumeElection`: an election resumed from its leader's key and revision
/// observes the leader, ignores writes outside the election, and observes the next leader
/// after it resigns. As in Go, the resumed election's prefix is the prefix as given, the
/// new election's that prefix + `/`. Go's test names a prefix ending in `/`: the first
/// leader's key (`prefix` + `/` + lease) is then escaped, in the root group, and the resumed
/// election's next leader's key is plain, in the prefix's group; an empty range over both
/// groups has no one revision a watch of both can start from (docs/etcd.md), so this test
/// names the prefix without it (every key plain, in one group).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_election_observes_the_next_leader() {
    const PREFIX: &str = "/conc/resume";
    let f = Fixture::start().await;
    let session = f.session(SESSION_TTL_S).await;
    let mut election = Election::new(&session, PREFIX);
    election.campaign("candidate1").await.expect("campaign");
    let leader = election.leader().await.expect("a leader");
    let kv = &leader.kvs()[0];
    let key = String::from_utf8(kv.key().to_vec()).expect("a text key");
    assert_eq!(key, format!("{PREFIX}/{:x}", session.lease()));
    let mut resumed = Election::resume(&session, PREFIX, &key, kv.create_revision());
    let mut observer = resumed.observe();
    assert_eq!(next_observed(&mut observer).await.0, "candidate1");

    f.etcd.clone().put("foo", "bar", None).await.expect("put a key outside the election");
    resumed.resign().await.expect("resign");
    resumed.campaign("candidate2").await.expect("campaign");
    let (value, observed) = next_observed(&mut observer).await;
    assert_eq!(value, "candidate2", "the resign is no observation; the next leader is");
    assert!(observed.kv.key().starts_with(PREFIX.as_bytes()));
}

/// An observer of an election at a prefix ending in `/` (its candidates' keys, `prefix` + `/`
/// + lease, are escaped: they live in the root group, here far ahead of the prefix's own
/// group) sees no former leader: with no candidate, the range of the prefix answers the root
/// group's revision, so the watch `Observe` starts from there replays none of the older
/// candidates. (`Observe`'s steps, taken one by one so the range is sure to find none.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_of_an_election_at_a_prefix_ending_in_a_slash_sees_no_former_leader() {
    const PREFIX: &str = "/conc/slash/";
    let f = Fixture::start().await;
    f.put_root_ahead().await;
    let session = f.session(SESSION_TTL_S).await;
    let mut election = Election::new(&session, PREFIX);
    election.campaign("former").await.expect("campaign");
    election.resign().await.expect("resign");
    let mut etcd = f.etcd.clone();
    let candidates = format!("{PREFIX}/");
    let none = etcd.get(candidates.as_str(), Some(GetOptions::new().with_prefix())).await.expect("range the candidates");
    assert!(none.kvs().is_empty(), "the former leader resigned: {:?}", none.kvs());
    let from = none.header().expect("a header").revision();
    let mut watch = etcd.watch(candidates.as_str(), Some(WatchOptions::new().with_prefix().with_start_revision(from))).await.expect("watch");
    election.campaign("next").await.expect("campaign");
    loop {
        let answer = tokio::time::timeout(TIMEOUT, watch.message()).await.expect("an event in time").expect("the watch goes on").expect("open");
        let Some(put) = answer.events().iter().find(|event| event.event_type() == Put) else { continue };
        let kv = put.kv().expect("a put's key");
        assert_eq!(kv.value(), b"next", "the first put seen from the range's revision is the next candidate's: {kv:?}");
        assert!(kv.mod_revision() >= from);
        break;
    }
}

/// Go's `TestElectionOnPrefixOfExistingKey`: a candidate is elected at once on a prefix
/// that begins existing keys' names (`/conc/electa`) and is itself a key (`/conc/elect`:
/// in Warden's tree the candidates are its children, which a key without a lease may have).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_is_elected_on_a_prefix_of_existing_keys() {
    let f = Fixture::start().await;
    let mut etcd = f.etcd.clone();
    etcd.put(format!("{ELECTION}a"), "value", None).await.expect("put");
    etcd.put(ELECTION, "value", None).await.expect("put");
    let session = f.session(SESSION_TTL_S).await;
    let mut election = Election::new(&session, ELECTION);
    tokio::time::timeout(TIMEOUT, election.campaign("abc")).await.expect("elected in time").expect("campaign");
    assert_eq!(election.leader().await.expect("a leader").kvs()[0].value(), b"abc");

    // A key with a lease cannot have keys below it in Warden (docs/etcd.md): an election
    // whose prefix is a leased key refuses the candidates' puts, where etcd elects them.
    let leased = f.session(SESSION_TTL_S).await;
    etcd.put("/conc/leased", "value", Some(PutOptions::new().with_lease(leased.lease()))).await.expect("put with a lease");
    let refused = Election::new(&session, "/conc/leased").campaign("abc").await.expect_err("no keys below a leased key");
    assert!(refused.to_string().contains("ephemeral nodes cannot have children"), "{refused}");
}

/// Go's `TestElectionSessionRecampaign`: a second election of the same session campaigning
/// with another value does not wait for itself: it proclaims the new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_campaigning_again_proclaims_its_new_value() {
    let f = Fixture::start().await;
    let session = f.session(SESSION_TTL_S).await;
    let mut election = Election::new(&session, ELECTION);
    election.campaign("abc").await.expect("campaign");
    let mut again = Election::new(&session, ELECTION);
    tokio::time::timeout(TIMEOUT, again.campaign("def")).await.expect("campaigning again does not wait").expect("campaign");
    assert_eq!(again.revision(), election.revision(), "the same candidate key");
    let mut observer = election.observe();
    assert_eq!(next_observed(&mut observer).await.0, "def");
}

/// Go's `TestElectionOnSessionRestart`: a leader whose program restarts with a new session
/// on the same lease campaigns again and keeps leading (with its new value) ahead of a
/// candidate that was waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarting_its_session_on_the_same_lease_keeps_leading() {
    let f = Fixture::start().await;
    let mut session = f.session(SESSION_TTL_S).await;
    Election::new(&session, ELECTION).campaign("abc").await.expect("campaign");
    let waiter = f.session(SESSION_TTL_S).await;
    let mut waiting = Election::new(&waiter, ELECTION);
    let campaigning = tokio::spawn(async move { waiting.campaign("123").await });
    warden_testkit::wait_until("the waiting candidate has its key", TIMEOUT, async || f.keys(ELECTION).await.len() == 2).await;

    session.orphan();
    let restarted = Session::with_lease(&f.etcd, session.lease(), SESSION_TTL_S).await.expect("a session on the same lease");
    let mut election = Election::new(&restarted, ELECTION);
    tokio::time::timeout(TIMEOUT, election.campaign("def")).await.expect("campaigning again does not wait").expect("campaign");
    let mut observer = election.observe();
    assert_eq!(next_observed(&mut observer).await.0, "def");
    assert!(!campaigning.is_finished(), "the waiting candidate must not lead");
    campaigning.abort();
}

/// etcd's header revision of a range is a revision from which a watch of any key of the
/// range sees every later change of it: `Mutex.Lock` reads the keys of the lock's prefix
/// created before its own and watches the last of them from that range's revision, to see
/// its delete. Here the range of `/conc/lock/` spans two groups (the escaped key
/// `/conc/lock/` lives in the root group, the lockers' keys in `/conc`) and the root group's
/// revision is ahead (as traffic elsewhere makes it): the waiter must still see the holder's
/// unlock and hold the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_handed_on_while_the_root_group_revision_is_ahead_of_the_lock_group() {
    let f = Fixture::start().await;
    let (first, second) = (f.session(SESSION_TTL_S).await, f.session(SESSION_TTL_S).await);
    let (root, group) = f.put_root_ahead().await;
    eprintln!("root group at revision {root}, {GROUP} at {group}");
    let mut holder = Mutex::new(&first, LOCK);
    holder.lock().await.expect("lock");
    let waiter = Mutex::new(&second, LOCK);
    let waiting = f.queue_behind_holder(waiter, "the second locker waits").await;
    holder.unlock().await.expect("unlock");
    let mut waiter = tokio::time::timeout(TIMEOUT, waiting).await.expect("the waiter holds the lock after the unlock").expect("task").expect("lock");
    waiter.unlock().await.expect("unlock");
}

/// As [`a_lock_is_handed_on_while_the_root_group_revision_is_ahead_of_the_lock_group`], for
/// `Election.Observe`: it reads the leader with a range of the election's prefix and
/// watches the leader's key from that range's revision + 1 for its next values; with the
/// root group's revision ahead of the election's group, an observer must still see what the
/// leader proclaims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_proclaims_while_the_root_group_revision_is_ahead_of_the_election_group() {
    let f = Fixture::start().await;
    let session = f.session(SESSION_TTL_S).await;
    let (root, group) = f.put_root_ahead().await;
    eprintln!("root group at revision {root}, {GROUP} at {group}");
    let mut leader = Election::new(&session, ELECTION);
    leader.campaign("abc").await.expect("campaign");
    let mut observer = leader.observe();
    assert_eq!(next_observed(&mut observer).await.0, "abc");
    leader.proclaim("def").await.expect("proclaim");
    assert_eq!(next_observed(&mut observer).await.0, "def", "the observer sees the proclaimed value");
}

/// etcd answers a watch's creation before any of its events, and Go's client relies on it
/// (`watchGRPCStream.run`: a response for a watch id not created yet is dropped and that id
/// cancelled): `Election.Observe` of an election without leader watches its prefix from
/// the revision it read, and the prefix's own key (`/conc/elect/`, escaped, in the root
/// group) may have events from that revision on. Here one does: the watch's first response
/// must still be its creation, then the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_prefix_across_groups_answers_created_before_its_events() {
    let f = Fixture::start().await;
    let mut etcd = f.etcd.clone();
    let prefix = format!("{ELECTION}/");
    let put = etcd.put(prefix.as_str(), "", None).await.expect("put the prefix's own key");
    let revision = put.header().expect("a header").revision();
    let mut watch = etcd.watch(prefix.as_str(), Some(WatchOptions::new().with_prefix().with_start_revision(revision))).await.expect("watch");
    let mut next = async || tokio::time::timeout(TIMEOUT, watch.message()).await.expect("an answer in time").expect("watching").expect("an answer");
    let first = next().await;
    assert!(first.created() && first.events().is_empty(), "the first answer is the creation: {first:?}");
    let second = next().await;
    let events: Vec<_> = second.events().iter().map(|event| (event.event_type(), event.kv().map(|kv| kv.key().to_vec()))).collect();
    assert_eq!(events, [(Put, Some(prefix.into_bytes()))]);
}
