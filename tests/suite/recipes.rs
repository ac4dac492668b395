//! The client's recipes (`warden_client::recipes`) against a real in-process cluster through a
//! real router: mutual exclusion of a fenced resource through client crashes and a shard
//! leader kill, leader election with failover and without herd effect, membership converging
//! after crashes, a semaphore never over its permits, barriers, a CAS counter and a node cache.
//!
//! A "crash" is a client process dying: each crashable client runs on its own runtime
//! ([`Process`]), and shutting that runtime down stops its keepalives and everything else at
//! once, closing nothing — its session expires on the server after its TTL.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use crate::support::fleet::{Fleet, Reach, Security};
use crate::support::routed::{cluster_with_groups, start_router, TIMEOUT};
use tokio::sync::{mpsc, oneshot};
use warden_client::recipes::*;
use warden_client::*;

/// Session TTL of these tests: the server's minimum.
const TTL: Duration = Duration::from_secs(3);
/// Grace period of these tests' sessions.
const GRACE: Duration = Duration::from_secs(8);
/// Longest wait for a crashed session's grants to pass on: its TTL, the time to elect a new
/// leader, and slack for a loaded machine.
const TAKEOVER: Duration = Duration::from_secs(15);

async fn connect(router: SocketAddr) -> Client {
    Client::connect(ClientConfig::new([router.to_string()])).await.expect("connect")
}

async fn session(client: &Client, path_hint: &str) -> Session {
    client.session(SessionConfig { ttl: TTL, grace_period: GRACE, path_hint: Some(path_hint.into()) }).await.expect("session")
}

/// A client process of its own: a one-thread runtime. [`Process::crash`] shuts it down at
/// once — keepalives stop, nothing is closed or unlocked — as killing the process would.
struct Process {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Process {
    fn start(task: impl Future<Output = ()> + Send + 'static) -> Process {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        runtime.spawn(task);
        Process { runtime: Some(runtime) }
    }

    fn crash(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.crash();
    }
}

/// A resource protected by fencing: it admits a write only with a token no lower than any
/// admitted before, and logs what it admitted.
#[derive(Default)]
struct Resource {
    fence: FenceGuard,
    /// Admitted writes: (token, writer, step).
    log: StdMutex<Vec<(u64, usize, u32)>>,
    refused: AtomicU64,
}

impl Resource {
    fn write(&self, token: u64, writer: usize, step: u32) -> bool {
        let admitted = self.fence.admit_then(token, || self.log.lock().expect("log").push((token, writer, step))).is_ok();
        if !admitted {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Checks that holds never interleaved: tokens never go down, each token is one writer's,
    /// and each hold's steps are contiguous and in order. Returns the number of holds.
    fn check_exclusive(&self) -> usize {
        let log = self.log.lock().expect("log");
        assert!(log.windows(2).all(|w| w[0].0 <= w[1].0), "admitted tokens never go down");
        let mut holds: Vec<(u64, usize, Vec<u32>)> = Vec::new();
        for &(token, writer, step) in log.iter() {
            match holds.last_mut() {
                Some((last, owner, steps)) if *last == token => {
                    assert_eq!(*owner, writer, "token {token} written by two writers");
                    steps.push(step);
                }
                _ => {
                    assert!(holds.iter().all(|(t, ..)| *t != token), "hold {token} interleaved with another");
                    holds.push((token, writer, vec![step]));
                }
            }
        }
        for (token, _, steps) in &holds {
            assert!(steps.windows(2).all(|w| w[1] == w[0] + 1), "hold {token}: steps {steps:?} out of order");
        }
        holds.len()
    }
}

/// Steps one lock hold writes.
const STEPS_PER_HOLD: u32 = 3;

/// One lock client: lock → fenced writes → unlock, until `stop`; if `crash` is set when it has
/// just taken the lock, it reports on `holding` and stops there (to be crashed mid-hold).
async fn lock_worker(
    router: Reach,
    path: &'static str,
    writer: usize,
    resource: Arc<Resource>,
    holds: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    crash: Option<(Arc<AtomicBool>, oneshot::Sender<()>)>,
) {
    let client = router.connect().await;
    let session = session(&client, path).await;
    let mutex = Mutex::new(&session, path);
    let mut crash = crash;
    while !stop.load(Ordering::Relaxed) {
        let guard = match mutex.lock().await {
            Ok(guard) => guard,
            // The group failing over: try again.
            Err(error) => {
                assert!(!session.state().has_ended(), "worker {writer}'s session ended: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if crash.as_ref().is_some_and(|(now, _)| now.load(Ordering::Relaxed)) {
            if let Some((_, holding)) = crash.take() {
                let _ = holding.send(());
            }
            std::future::pending::<()>().await;
        }
        for step in 0..STEPS_PER_HOLD {
            if !guard.is_valid() || !resource.write(guard.fencing_token(), writer, step) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        holds.fetch_add(1, Ordering::Relaxed);
        let _ = guard.unlock().await;
    }
    let _ = session.close().await;
}

async fn wait_for_progress(holds: &AtomicUsize, more: usize, within: Duration, what: &str) {
    let target = holds.load(Ordering::Relaxed) + more;
    let deadline = Instant::now() + within;
    while holds.load(Ordering::Relaxed) < target {
        assert!(Instant::now() < deadline, "no progress {what}: {} holds", holds.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_excludes_through_client_crashes_and_a_leader_kill() {
    mutex_scenario(Security::Off).await;
}

/// The same with security on: TLS, the workers a principal with a grant, their sessions
/// and locks checked against it on the router and the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_excludes_through_client_crashes_and_a_leader_kill_with_security_on() {
    mutex_scenario(Security::On).await;
}

async fn mutex_scenario(security: Security) {
    const PATH: &str = "/locks/resource";
    let fleet = Fleet::start(&["/locks"], security).await;
    let (cluster, router) = (&fleet.cluster, &fleet.reach);
    let resource = Arc::new(Resource::default());
    let holds = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // Two clients that live throughout, two that crash mid-hold.
    let mut steady = Vec::new();
    for writer in 0..2 {
        steady.push(tokio::spawn(lock_worker(router.clone(), PATH, writer, resource.clone(), holds.clone(), stop.clone(), None)));
    }
    let mut crashers = Vec::new();
    for writer in 2..4 {
        let (now, (holding, held)) = (Arc::new(AtomicBool::new(false)), oneshot::channel());
        let worker = lock_worker(router.clone(), PATH, writer, resource.clone(), holds.clone(), stop.clone(), Some((now.clone(), holding)));
        crashers.push((Process::start(worker), now, held));
    }
    wait_for_progress(&holds, 20, TIMEOUT, "at first").await;

    // The first crash, mid-hold: the lock passes on once its session expired.
    let (mut process, now, held) = crashers.remove(0);
    now.store(true, Ordering::Relaxed);
    tokio::time::timeout(TIMEOUT, held).await.expect("the crasher took the lock").expect("signal");
    process.crash();
    wait_for_progress(&holds, 10, TAKEOVER, "after a holder crashed").await;

    // Kill the leader of the lock's group; then the second crash, mid-hold, while it is down.
    let group = client_group(router, PATH).await;
    let leader = cluster.wait_leader(group, TIMEOUT).await.expect("leader of the lock's group");
    cluster.kill(leader);
    wait_for_progress(&holds, 10, TAKEOVER, "after the leader was killed").await;
    let (mut process, now, held) = crashers.remove(0);
    now.store(true, Ordering::Relaxed);
    tokio::time::timeout(TAKEOVER, held).await.expect("the second crasher took the lock").expect("signal");
    process.crash();
    wait_for_progress(&holds, 10, TAKEOVER, "after the second crash").await;
    cluster.restart(leader).expect("restart");
    wait_for_progress(&holds, 10, TAKEOVER, "after the restart").await;

    stop.store(true, Ordering::Relaxed);
    for worker in steady {
        tokio::time::timeout(TIMEOUT, worker).await.expect("workers stop").expect("worker");
    }
    let count = resource.check_exclusive();
    assert!(count >= 50, "{count} holds");
    // The crashers took the lock and wrote nothing after: every hold but theirs is whole.
    let log = resource.log.lock().expect("log");
    let mut steps: HashMap<u64, u32> = HashMap::new();
    for (token, ..) in log.iter() {
        *steps.entry(*token).or_default() += 1;
    }
    let partial = steps.values().filter(|n| **n != STEPS_PER_HOLD).count();
    assert!(partial <= 2, "{partial} holds were cut short ({} writes refused)", resource.refused.load(Ordering::Relaxed));
}

/// The group serving `path` (as a lock's sequencer names it).
async fn client_group(router: &Reach, path: &str) -> u64 {
    let client = router.connect().await;
    let session = session(&client, path).await;
    let probe = format!("{path}-probe");
    let guard = session.lock(&probe).await.expect("probe lock");
    let group = guard.sequencer().group_id;
    guard.unlock().await.expect("unlock");
    session.close().await.expect("close");
    group
}

/// A candidate process: campaigns, then writes to the resource as leader while its
/// leadership is valid, reporting (writer, token) when it starts leading.
async fn candidate(router: SocketAddr, path: &'static str, writer: usize, resource: Arc<Resource>, leading: mpsc::UnboundedSender<(usize, u64)>) {
    let client = connect(router).await;
    let session = session(&client, path).await;
    let election = Election::new(&session, path);
    let Ok(leadership) = election.campaign(format!("candidate-{writer}").into_bytes()).await else { return };
    let _ = leading.send((writer, leadership.fencing_token()));
    let mut step = 0;
    while leadership.is_valid() && resource.write(leadership.fencing_token(), writer, step) {
        step += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_fails_over_to_one_new_leader_when_the_leader_crashes() {
    const PATH: &str = "/election/e";
    let cluster = cluster_with_groups(&["/election"]).await;
    let router = start_router(&cluster, 0);
    let resource = Arc::new(Resource::default());
    let (leading, mut leaders) = mpsc::unbounded_channel();
    let mut processes: Vec<Process> =
        (0..3).map(|writer| Process::start(candidate(router.addr, PATH, writer, resource.clone(), leading.clone()))).collect();

    let observer_client = connect(router.addr).await;
    let observer_session = session(&observer_client, PATH).await;
    let election = Election::new(&observer_session, PATH);
    let mut observer = election.observe().await.expect("observe");

    let (first, first_token) = tokio::time::timeout(TIMEOUT, leaders.recv()).await.expect("a leader").expect("channel");
    let seen = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Some(leader) = observer.next().await.expect("observer") {
                if leader.fencing_token == first_token {
                    return leader;
                }
            }
        }
    })
    .await
    .expect("the observer sees the leader");
    assert_eq!(seen.value, format!("candidate-{first}").into_bytes());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(leaders.try_recv().is_err(), "one leader at a time");

    processes[first].crash();
    let crashed_at = Instant::now();
    let (second, second_token) = tokio::time::timeout(TAKEOVER, leaders.recv()).await.expect("a new leader").expect("channel");
    assert_ne!(second, first);
    assert!(second_token > first_token, "the new leader's fencing token is higher");
    assert!(crashed_at.elapsed() >= Duration::from_secs(2), "not before the crashed session could expire ({:?})", crashed_at.elapsed());
    let next = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Some(leader) = observer.next().await.expect("observer") {
                if leader.fencing_token == second_token {
                    return leader;
                }
            }
        }
    })
    .await
    .expect("the observer sees the new leader");
    assert_eq!(next.value, format!("candidate-{second}").into_bytes());
    assert_eq!(election.leader().await.expect("leader").map(|l| l.fencing_token), Some(second_token));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(leaders.try_recv().is_err(), "still one leader");
    assert_eq!(resource.check_exclusive(), 2, "two leaders wrote, one after the other");
    drop(processes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_proclaims_and_resigns() {
    const PATH: &str = "/election/p";
    let cluster = cluster_with_groups(&["/election"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(router.addr).await;
    let (a, b) = (session(&client, PATH).await, session(&client, PATH).await);
    let (ea, eb) = (Election::new(&a, PATH), Election::new(&b, PATH));
    assert_eq!(ea.leader().await.expect("leader"), None);
    let leadership = ea.campaign(b"a".to_vec()).await.expect("campaign");
    assert!(leadership.is_valid());
    let mut observer = eb.observe().await.expect("observe");
    assert_eq!(observer.next().await.expect("next").map(|l| l.value), Some(b"a".to_vec()));
    leadership.proclaim(b"a2".to_vec()).await.expect("proclaim");
    let seen = tokio::time::timeout(TIMEOUT, observer.next()).await.expect("in time").expect("next").expect("a leader");
    assert_eq!((seen.value.as_slice(), seen.fencing_token), (&b"a2"[..], leadership.fencing_token()));

    let waiting = tokio::spawn(async move { eb.campaign(b"b".to_vec()).await.map(|l| (eb, l)) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "b waits while a leads");
    let token = leadership.fencing_token();
    leadership.resign().await.expect("resign");
    let (eb, second) = tokio::time::timeout(TIMEOUT, waiting).await.expect("b leads").expect("task").expect("campaign");
    assert!(second.fencing_token() > token);
    assert_eq!(eb.leader().await.expect("leader").map(|l| l.value), Some(b"b".to_vec()));
    let seen = tokio::time::timeout(TIMEOUT, observer.next()).await.expect("in time").expect("next").expect("a leader");
    assert_eq!(seen.fencing_token, second.fencing_token());
    second.resign().await.expect("resign");
    assert_eq!(tokio::time::timeout(TIMEOUT, observer.next()).await.expect("in time").expect("next"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_among_100_candidates_wakes_one_not_all() {
    const PATH: &str = "/election/herd";
    const CANDIDATES: usize = 100;
    let cluster = cluster_with_groups(&["/election"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(router.addr).await;
    let mut sessions = Vec::new();
    for _ in 0..CANDIDATES {
        sessions.push(session(&client, PATH).await);
    }
    let elections: Vec<Arc<Election>> = sessions.iter().map(|s| Arc::new(Election::new(s, PATH))).collect();
    let (leading, mut leaders) = mpsc::unbounded_channel();
    for (index, election) in elections.iter().enumerate() {
        let (election, leading) = (election.clone(), leading.clone());
        tokio::spawn(async move {
            if let Ok(leadership) = election.campaign(vec![]).await {
                let _ = leading.send((index, leadership));
            }
        });
    }
    let (first, leadership) = tokio::time::timeout(TIMEOUT, leaders.recv()).await.expect("a leader").expect("channel");
    // Every candidate queued and watching its predecessor.
    let deadline = Instant::now() + TIMEOUT;
    while client.children(PATH, ChildrenOptions::default()).all().await.expect("candidates").len() < CANDIDATES {
        assert!(Instant::now() < deadline, "candidates queue");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let notifications = |elections: &[Arc<Election>]| elections.iter().map(|e| e.watch_notifications()).sum::<u64>();
    let before = notifications(&elections);

    leadership.resign().await.expect("resign");
    // Kept: dropping it would resign.
    let (second, _second_leadership) = tokio::time::timeout(TIMEOUT, leaders.recv()).await.expect("a new leader").expect("channel");
    assert_ne!(second, first);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let woken = notifications(&elections) - before;
    assert!((1..=3).contains(&woken), "one leader change caused {woken} watch notifications among {CANDIDATES} candidates");
    assert!(leaders.try_recv().is_err(), "one new leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_converges_to_the_live_members_after_crashes() {
    const PATH: &str = "/groups/workers";
    let cluster = cluster_with_groups(&["/groups"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(router.addr).await;
    let mut watch = MembersWatch::open(&client, PATH).await.expect("watch");
    assert!(watch.members().is_empty());

    let live_session = session(&client, PATH).await;
    let live = Membership::join(&live_session, PATH, "live", b"l".to_vec()).await.expect("join");
    assert!(matches!(Membership::join(&live_session, PATH, "live", vec![]).await, Err(Error::NodeExists { .. })));
    let leaving_session = session(&client, PATH).await;
    let leaving = Membership::join(&leaving_session, PATH, "leaving", vec![]).await.expect("join");
    let (joined, mut joins) = mpsc::unbounded_channel();
    let mut crashed: Vec<Process> = (0..2)
        .map(|n| {
            let joined = joined.clone();
            Process::start(async move {
                let client = connect(router.addr).await;
                let session = session(&client, PATH).await;
                let _membership = Membership::join(&session, PATH, &format!("crash-{n}"), vec![n]).await.expect("join");
                let _ = joined.send(());
                std::future::pending::<()>().await;
            })
        })
        .collect();
    for _ in 0..2 {
        tokio::time::timeout(TIMEOUT, joins.recv()).await.expect("joined").expect("channel");
    }
    let ids = |members: &[Member]| members.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    let all = ["crash-0", "crash-1", "leaving", "live"];
    let deadline = Instant::now() + TIMEOUT;
    while ids(&watch.members()) != all {
        assert!(Instant::now() < deadline, "the watch sees every member: {:?}", watch.members());
        tokio::time::timeout(TIMEOUT, watch.next()).await.expect("a change").expect("watch");
    }
    assert_eq!(ids(&live.members().await.expect("members")), all);

    for process in &mut crashed {
        process.crash();
    }
    leaving.leave().await.expect("leave");
    let deadline = Instant::now() + TAKEOVER;
    while ids(&watch.members()) != ["live"] {
        assert!(Instant::now() < deadline, "converged to the live member: {:?}", watch.members());
        tokio::time::timeout(TAKEOVER, watch.next()).await.expect("a change").expect("watch");
    }
    assert_eq!(watch.members()[0].data, b"l");
    assert_eq!(ids(&live.members().await.expect("members")), ["live"]);
    assert!(live.is_valid());
    drop(leaving_session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_exceeds_its_permits() {
    const PATH: &str = "/sem/s";
    const PERMITS: usize = 2;
    let cluster = cluster_with_groups(&["/sem"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(router.addr).await;
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let session = session(&client, PATH).await;
        let (holders, most, tokens) = (holders.clone(), most.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let semaphore = Semaphore::new(&session, PATH, PERMITS);
            for _ in 0..3 {
                let permit = semaphore.acquire().await.expect("acquire");
                assert!(permit.is_valid());
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokens.lock().expect("tokens").push(permit.fencing_token());
                tokio::time::sleep(Duration::from_millis(100)).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
            session.close().await.expect("close");
        }));
    }
    for task in tasks {
        tokio::time::timeout(TAKEOVER * 2, task).await.expect("every acquirer finishes").expect("task");
    }
    assert_eq!(most.load(Ordering::SeqCst), PERMITS, "never more than {PERMITS} holders, and the permits were used");
    let mut tokens = tokens.lock().expect("tokens").clone();
    let count = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "every permit has its own fencing token");
    let zero = session(&client, PATH).await;
    assert!(matches!(Semaphore::new(&zero, "/sem/none", 0).acquire().await, Err(Error::InvalidArgument { .. })));

    // A holder crashes mid-hold: its permit still counts until its session expires (no early
    // release), so of two live acquirers one gets a permit at once and the other only then.
    let (held, holding) = oneshot::channel();
    let addr = router.addr;
    let mut crashing = Process::start(async move {
        let client = connect(addr).await;
        let session = session(&client, PATH).await;
        let permit = Semaphore::new(&session, PATH, PERMITS).acquire().await.expect("acquire");
        let _ = held.send(permit.fencing_token());
        std::future::pending::<()>().await;
    });
    tokio::time::timeout(TAKEOVER, holding).await.expect("the crashing holder got a permit").expect("sent");
    crashing.crash();
    let crashed_at = Instant::now();
    let (first, second) = (session(&client, PATH).await, session(&client, PATH).await);
    let _free = tokio::time::timeout(TAKEOVER, Semaphore::new(&first, PATH, PERMITS).acquire()).await.expect("one permit is free").expect("acquire");
    let waiting = tokio::spawn(async move {
        let permit = Semaphore::new(&second, PATH, PERMITS).acquire().await.expect("acquire");
        (permit.fencing_token(), second)
    });
    // The crashed session's last keepalive was at most TTL / 3 before the crash.
    tokio::time::sleep((TTL * 2 / 3).saturating_sub(crashed_at.elapsed() + Duration::from_millis(200))).await;
    assert!(!waiting.is_finished(), "the crashed holder's permit is not given away while its session lives");
    let (_token, _session) = tokio::time::timeout(TAKEOVER, waiting).await.expect("freed once the session expired").expect("task");
    assert!(crashed_at.elapsed() >= TTL * 2 / 3, "freed after {:?}: before the session could expire", crashed_at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barriers_counter_and_node_cache() {
    let cluster = cluster_with_groups(&["/sync"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(router.addr).await;

    // Barrier: waiters wait while it is set and go when it is removed.
    let barrier = Barrier::new(&client, "/sync/barrier");
    barrier.wait().await.expect("a barrier not set does not hold anyone");
    barrier.set().await.expect("set");
    barrier.set().await.expect("set twice");
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let barrier = Barrier::new(&client, "/sync/barrier");
            tokio::spawn(async move { barrier.wait().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "held while set");
    barrier.remove().await.expect("remove");
    for waiter in waiters {
        tokio::time::timeout(TIMEOUT, waiter).await.expect("released").expect("task").expect("wait");
    }

    // Double barrier: nobody enters until all three have; nobody leaves until all have.
    const PARTIES: usize = 3;
    let mut sessions = Vec::new();
    for _ in 0..PARTIES {
        sessions.push(session(&client, "/sync").await);
    }
    let barriers: Vec<Arc<DoubleBarrier>> = sessions.iter().map(|s| Arc::new(DoubleBarrier::new(s, "/sync/double", PARTIES))).collect();
    let early: Vec<_> = barriers[..PARTIES - 1]
        .iter()
        .map(|b| {
            tokio::spawn({
                let b = b.clone();
                async move { b.enter().await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(early.iter().all(|e| !e.is_finished()), "two of three wait to enter");
    barriers[PARTIES - 1].enter().await.expect("the last enters");
    for entering in early {
        tokio::time::timeout(TIMEOUT, entering).await.expect("entered").expect("task").expect("enter");
    }
    let leaving: Vec<_> = barriers[..PARTIES - 1]
        .iter()
        .map(|b| {
            tokio::spawn({
                let b = b.clone();
                async move { b.leave().await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(leaving.iter().all(|l| !l.is_finished()), "two of three wait for the third to leave");
    barriers[PARTIES - 1].leave().await.expect("the last leaves");
    for left in leaving {
        tokio::time::timeout(TIMEOUT, left).await.expect("left").expect("task").expect("leave");
    }
    assert_eq!(client.exists("/sync/double/ready").await.expect("exists"), None, "ready for the next round");

    // Counter: concurrent adds, each value returned once.
    let counter = Counter::new(&client, "/sync/counter");
    assert_eq!(counter.get().await.expect("get"), 0);
    let adders: Vec<_> = (0..4)
        .map(|_| {
            let counter = Counter::new(&client, "/sync/counter");
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for _ in 0..10 {
                    seen.push(counter.add(1).await.expect("add"));
                }
                seen
            })
        })
        .collect();
    let mut values = Vec::new();
    for adder in adders {
        values.extend(tokio::time::timeout(TIMEOUT, adder).await.expect("adds").expect("task"));
    }
    values.sort_unstable();
    assert_eq!(values, (1..=40).collect::<Vec<i64>>());
    assert_eq!(counter.add(-50).await.expect("add"), -10);
    assert_eq!(counter.get().await.expect("get"), -10);
    client.set("/sync/counter", b"x".to_vec(), None).await.expect("set");
    assert!(matches!(counter.add(1).await, Err(Error::InvalidArgument { .. })));

    // Node cache: follows sets and deletes, never going back.
    let cache = NodeCache::new(&client, "/sync/cached");
    cache.ready().await.expect("ready");
    assert_eq!(cache.get().await.expect("get"), None);
    client.create("/sync/cached", b"0".to_vec(), &CreateOptions::persistent()).await.expect("create");
    let mut last_version = None;
    for i in 1..=20u64 {
        client.set("/sync/cached", i.to_string(), None).await.expect("set");
        if let Some(Some(node)) = cache.cached() {
            assert!(last_version.is_none_or(|v| node.stat.version >= v), "the cache never goes back");
            last_version = Some(node.stat.version);
        }
    }
    let deadline = Instant::now() + TIMEOUT;
    while cache.cached().flatten().map(|n| n.data) != Some(b"20".to_vec()) {
        assert!(Instant::now() < deadline, "the cache catches up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cache.get().await.expect("get").map(|n| n.stat.version), Some(20));
    client.delete("/sync/cached", &DeleteOptions::default()).await.expect("delete");
    let deadline = Instant::now() + TIMEOUT;
    while cache.cached() != Some(None) {
        assert!(Instant::now() < deadline, "the cache sees the delete");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlock_shares_reads_and_excludes_writes() {
    const PATH: &str = "/locks/rw";
    let cluster = cluster_with_groups(&["/locks"]).await;
    let router = start_router(&cluster, 0);
    let client = connect(router.addr).await;
    let (a, b, c) = (session(&client, PATH).await, session(&client, PATH).await, session(&client, PATH).await);
    let (ra, rb) = (RwLock::new(&a, PATH), RwLock::new(&b, PATH));
    let read_a = ra.read().await.expect("read");
    let read_b = tokio::time::timeout(TIMEOUT, rb.read()).await.expect("readers share").expect("read");
    let writer = tokio::spawn(async move {
        let guard = RwLock::new(&c, PATH).write().await;
        (c, guard)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!writer.is_finished(), "the writer waits for the readers");
    let token = read_a.fencing_token().max(read_b.fencing_token());
    read_a.unlock().await.expect("unlock");
    read_b.unlock().await.expect("unlock");
    let (c, write) = tokio::time::timeout(TIMEOUT, writer).await.expect("the writer gets it").expect("task");
    let write = write.expect("write");
    assert!(write.fencing_token() > token);
    assert!(Mutex::new(&a, PATH).try_lock().await.expect("try_lock").is_none(), "held for writing");
    write.unlock().await.expect("unlock");
    let mutex = Mutex::new(&a, PATH);
    let held = mutex.try_lock().await.expect("try_lock").expect("free");
    held.unlock().await.expect("unlock");
    drop(c);
}
