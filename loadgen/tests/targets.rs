//! Every [`Connection`] operation of the etcd and ZooKeeper targets against real servers.
//!
//! The tests needing servers are ignored by default: `make test` does not install or start
//! etcd or ZooKeeper. Run them with a server of each (a single member is enough) on the
//! addresses given by the environment:
//!
//! ```text
//! WARDEN_TEST_ETCD=127.0.0.1:2379 WARDEN_TEST_ZOOKEEPER=127.0.0.1:2181 \
//!     cargo test --release -p warden-loadgen --test targets -- --ignored
//! ```
//!
//! Each run works below its own root (`/loadgen-targets-test/<pid>-<time>`), so runs do not
//! see each other's keys.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use warden_loadgen::target::etcd::EtcdTarget;
use warden_loadgen::target::zookeeper::ZookeeperTarget;
use warden_loadgen::target::{ConnectOptions, Connection, ReadConsistency, Target, WatchEvent, UNSUPPORTED};

/// How long anything that should happen may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// Short sessions, so the election's failover after a dropped etcd connection (lease expiry)
/// is quick; the servers raise it to their minimum (etcd ≈ 2 s, ZooKeeper 2 × tickTime).
const SESSION_TTL: Duration = Duration::from_secs(2);

/// How long a client waiting in a lock or election queue is watched not to get ahead of its
/// turn (a bound on a negative assertion, not a synchronisation: ordering is checked by
/// flags). Longer than the session TTL, so it also checks that the holder's session is kept
/// alive in the background: had it expired, the waiter would get ahead.
const NOT_BEFORE_TURN: Duration = Duration::from_secs(SESSION_TTL.as_secs() * 2);

fn options(variable: &str) -> ConnectOptions {
    let endpoints = std::env::var(variable).unwrap_or_else(|_| panic!("set {variable} to the server's host:port (see the module docs)"));
    ConnectOptions {
        endpoints: endpoints.split(',').map(str::to_owned).collect(),
        nodes: Vec::new(),
        conns: 2,
        session_ttl: SESSION_TTL,
        request_timeout: Duration::from_secs(10),
    }
}

/// A root no other run uses.
fn run_root() -> String {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("/loadgen-targets-test/{}-{}", std::process::id(), since_epoch.as_nanos())
}

/// `future`'s output, or a panic naming `what` after [`DEADLINE`].
async fn before_deadline<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future).await.unwrap_or_else(|_| panic!("{what} did not finish within {DEADLINE:?}"))
}

/// Runs every operation of `target`'s connections below a fresh root. `keep_alive_supported`:
/// whether the system has an explicit keep-alive call.
async fn exercise<T: Target>(target: T, keep_alive_supported: bool) {
    let root = run_root();
    key_value(&target, &root).await;
    watch(&target, &root).await;
    sessions_and_lock(&target, &root, keep_alive_supported).await;
    election(&target, &root).await;
    let target = Arc::new(target);
    concurrent_key_value(&target, &root).await;
    contended_lock(&target, &root).await;
}

/// upsert, put, get (both consistencies), CAS success and failure, create, create of an
/// existing key, delete, delete of a missing key.
async fn key_value<T: Target>(target: &T, root: &str) {
    let mut client = target.connect(0, false).await.expect("connect");
    let key = format!("{root}/kv/k0");
    client.upsert(&key, b"v1").await.expect("upsert of a new key (and its parents)");
    client.upsert(&key, b"v2").await.expect("upsert of an existing key");
    client.put(&key, b"v3").await.expect("put");
    client.get(&key, ReadConsistency::Linearizable).await.expect("linearizable get");
    client.get(&key, ReadConsistency::Stale).await.expect("stale get");
    let missing = format!("{root}/kv/missing");
    assert_eq!(client.get(&missing, ReadConsistency::Linearizable).await.expect_err("get of a missing key").kind, "not_found");

    let token = client.cas_token(&key).await.expect("cas_token");
    let new_token = client.compare_and_set(&key, token, b"v4").await.expect("compare_and_set").expect("the compare holds");
    assert_ne!(new_token, token);
    assert_eq!(client.cas_token(&key).await.expect("cas_token"), new_token, "the new token is the key's token");
    assert_eq!(client.compare_and_set(&key, token, b"v5").await.expect("compare_and_set"), None, "a stale token fails the compare");
    assert_eq!(client.cas_token(&key).await.expect("cas_token"), new_token, "a failed compare changes nothing");

    let created = format!("{root}/kv/created");
    client.create(&created, b"c").await.expect("create");
    assert_eq!(client.create(&created, b"c").await.expect_err("create of an existing key").kind, "exists");
    client.delete(&created).await.expect("delete");
    assert_eq!(client.delete(&created).await.expect_err("delete of a missing key").kind, "not_found");
}

/// A recursive watch sees a put (key and value) and a deletion (empty value).
async fn watch<T: Target>(target: &T, root: &str) {
    let mut client = target.connect(1, false).await.expect("connect");
    let prefix = format!("{root}/watched");
    let key = format!("{prefix}/k");
    // Created before the watch, so that ZooKeeper's recursive watch does not also report the
    // creation of the parent.
    client.upsert(&key, b"before").await.expect("upsert");
    let mut events = client.watch(&prefix).await.expect("watch");
    client.put(&key, b"seen").await.expect("put");
    let event = before_deadline("the put's watch event", events.recv()).await.expect("the watch is open").expect("an event");
    assert_eq!(event, WatchEvent { key: key.clone(), value: b"seen".to_vec() });
    client.delete(&key).await.expect("delete");
    let event = before_deadline("the delete's watch event", events.recv()).await.expect("the watch is open").expect("an event");
    assert_eq!(event, WatchEvent { key, value: Vec::new() });
}

/// Sessions, the explicit keep-alive, and a lock two clients contend for: the second gets it
/// only after the first unlocked.
async fn sessions_and_lock<T: Target>(target: &T, root: &str, keep_alive_supported: bool) {
    let mut first = target.connect(2, true).await.expect("connect");
    let mut second = target.connect(3, true).await.expect("connect");
    first.open_session().await.expect("open_session");
    second.open_session().await.expect("open_session");
    match first.keep_alive().await {
        Ok(()) => assert!(keep_alive_supported, "keep_alive answered on a target without one"),
        Err(error) => assert!(!keep_alive_supported && error.kind == UNSUPPORTED, "keep_alive: {error}"),
    }

    let path = format!("{root}/lock");
    before_deadline("the first lock", first.lock(&path)).await.expect("lock");
    let first_unlocking = Arc::new(AtomicBool::new(false));
    let (acquired, mut acquired_rx) = tokio::sync::oneshot::channel();
    let waiter = tokio::spawn({
        let path = path.clone();
        let first_unlocking = first_unlocking.clone();
        async move {
            second.lock(&path).await.expect("the second lock");
            // The ordering check: the first client had started unlocking.
            let _ = acquired.send(first_unlocking.load(Ordering::SeqCst));
            second
        }
    });
    assert!(tokio::time::timeout(NOT_BEFORE_TURN, &mut acquired_rx).await.is_err(), "the second client got a held lock");
    first_unlocking.store(true, Ordering::SeqCst);
    first.unlock(&path).await.expect("unlock");
    let after_unlock = before_deadline("the second lock", acquired_rx).await.expect("the waiter reports");
    assert!(after_unlock, "the second client got the lock before the first unlocked");
    let mut second = waiter.await.expect("the waiter");
    second.unlock(&path).await.expect("unlock");
    assert_eq!(second.unlock(&path).await.expect_err("unlock of a lock not held").kind, "not_held");
}

/// Two candidates: the second leads only after the first's connection is dropped (etcd: its
/// lease expires; ZooKeeper: its session closes).
async fn election<T: Target>(target: &T, root: &str) {
    let mut first = target.connect(4, true).await.expect("connect");
    let mut second = target.connect(5, true).await.expect("connect");
    first.open_session().await.expect("open_session");
    second.open_session().await.expect("open_session");
    let path = format!("{root}/election");
    before_deadline("the first campaign", first.campaign(&path, "first")).await.expect("campaign");
    let first_dropped = Arc::new(AtomicBool::new(false));
    let (leads, mut leads_rx) = tokio::sync::oneshot::channel();
    tokio::spawn({
        let path = path.clone();
        let first_dropped = first_dropped.clone();
        async move {
            second.campaign(&path, "second").await.expect("the second campaign");
            let _ = leads.send(first_dropped.load(Ordering::SeqCst));
        }
    });
    assert!(tokio::time::timeout(NOT_BEFORE_TURN, &mut leads_rx).await.is_err(), "the second candidate led while the first did");
    first_dropped.store(true, Ordering::SeqCst);
    drop(first);
    let after_drop = before_deadline("the second campaign", leads_rx).await.expect("the candidate reports");
    assert!(after_drop, "the second candidate led before the first's connection was dropped");
}

/// Clients sharing the target's connections: 32 clients × 50 puts and gets of their own keys,
/// all succeeding.
async fn concurrent_key_value<T: Target>(target: &Arc<T>, root: &str) {
    const CLIENTS: usize = 32;
    const ROUNDS: usize = 50;
    let mut tasks = Vec::with_capacity(CLIENTS);
    for index in 0..CLIENTS {
        let target = target.clone();
        let key = format!("{root}/concurrent/k{index}");
        tasks.push(tokio::spawn(async move {
            let mut client = target.connect(index, false).await.expect("connect");
            client.upsert(&key, b"0").await.expect("upsert");
            for round in 0..ROUNDS {
                client.put(&key, round.to_string().as_bytes()).await.expect("put");
                client.get(&key, ReadConsistency::Linearizable).await.expect("get");
            }
        }));
    }
    for task in tasks {
        before_deadline("a concurrent client", task).await.expect("a concurrent client");
    }
}

/// Eight clients with their own sessions take turns on one lock, ten times each: never two
/// inside at once, every acquisition served.
async fn contended_lock<T: Target>(target: &Arc<T>, root: &str) {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 10;
    let path = format!("{root}/contended");
    let data = format!("{root}/contended-data");
    target.connect(0, false).await.expect("connect").upsert(&data, b"").await.expect("upsert");
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(CLIENTS);
    for index in 0..CLIENTS {
        let (target, path, data, inside) = (target.clone(), path.clone(), data.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = target.connect(index, true).await.expect("connect");
            client.open_session().await.expect("open_session");
            for _ in 0..ROUNDS {
                client.lock(&path).await.expect("lock");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two clients held the lock at once");
                // A round trip to the server while holding the lock, for the others to get ahead.
                client.put(&data, index.to_string().as_bytes()).await.expect("put");
                inside.fetch_sub(1, Ordering::SeqCst);
                client.unlock(&path).await.expect("unlock");
            }
        }));
    }
    for task in tasks {
        before_deadline("a contending client", task).await.expect("a contending client");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an etcd server: WARDEN_TEST_ETCD=host:port"]
async fn etcd_target_against_a_real_server() {
    let target = EtcdTarget::connect(&options("WARDEN_TEST_ETCD")).await.expect("connect to etcd");
    exercise(target, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a ZooKeeper server: WARDEN_TEST_ZOOKEEPER=host:port"]
async fn zookeeper_target_against_a_real_server() {
    let target = ZookeeperTarget::connect(&options("WARDEN_TEST_ZOOKEEPER")).await.expect("connect to ZooKeeper");
    exercise(target, false).await;
}

/// Options naming a port nothing listens on (1, reserved), with a short request timeout.
fn unreachable_options() -> ConnectOptions {
    ConnectOptions {
        endpoints: vec!["127.0.0.1:1".to_owned()],
        nodes: Vec::new(),
        conns: 1,
        session_ttl: SESSION_TTL,
        request_timeout: Duration::from_secs(2),
    }
}

/// Needs no server: connecting to nothing fails the connection (a setup failure of the
/// loadgen) within the request timeout, rather than hanging or failing the workload later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_fails() {
    let etcd = before_deadline("etcd's failed connection", EtcdTarget::connect(&unreachable_options())).await;
    assert!(etcd.is_err(), "etcd target connected to nothing");
    let zookeeper = before_deadline("ZooKeeper's failed connection", ZookeeperTarget::connect(&unreachable_options())).await;
    assert!(zookeeper.is_err(), "ZooKeeper target connected to nothing");
}
