//! The workload of the process tests: clients writing registers, creating keys (plain and
//! sequential), holding ephemeral nodes and taking fenced locks through a router, watchers
//! of two registers and (when set up with placement) clients filling a quota, recording
//! what they were told, and the checks run on it afterwards (every acknowledged create read
//! back, sequential names unique and increasing and reconciled with the parent's children
//! (each call's create there once, none lost), every fenced hold exclusive, the register
//! history linearizable, every acknowledged register write delivered to each watcher once
//! and in order, the quota never exceeded and a refused create absent).
//! Used by `crash_cycles.rs`, `fleet_processes.rs`, `split_merge.rs` and the torture runs.
//!
//! - `etcd_locks`: lockers and campaigners through a router's etcd API
//!   (`Workload::start_etcd_clients`), judged by the fenced resource's checks, and leased
//!   keys checked against their lease;
//! - `watches`: the watchers and the watch check;
//! - `quotas`: the quota clients and the quota check.

mod etcd_locks;
mod quotas;
mod watches;

pub use watches::WatchLog;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tonic::transport::Channel;
use warden_client::{
    ChildrenOptions, Client, ClientConfig, Compare, CompareOp, CreateOptions, Error, FenceGuard, LockGuard, LockOptions, Session, SessionConfig, Txn,
    TxnOp,
};
use warden_loadgen::linearizability::{KvInput, KvOutput};
use warden_proto::placement::placement_client::PlacementClient;

use super::history::{check_records, Record};
use super::processes::STEP_TIMEOUT;
use quotas::Quotas;
use warden_testkit::wait_until;
use watches::Watches;

/// Shard groups besides the root group.
pub const PREFIXES: [&str; 3] = ["/b", "/c", "/d"];
/// Registers of the linearizability history, spread over the groups.
pub const REGISTERS: [&str; 6] = ["/a/r0", "/a/r1", "/b/r0", "/b/r1", "/c/r0", "/d/r0"];
/// Every register's value when it is created.
const INITIAL_VALUE: &[u8] = b"init";
/// The client id of the workload's own register operations (the creations, the final reads).
const SET_UP_CLIENT: usize = usize::MAX;
/// Fenced lock paths (in two groups) and how many sessions contend for each.
pub const LOCKS: [&str; 2] = ["/b/locks/x", "/c/locks/y"];
pub const LOCKERS_PER_LOCK: usize = 2;
/// Where the sessions of the first lock's lockers are homed in the torture histories: a
/// group other than the lock's.
const REMOTE_HOME: &str = "/d";
pub const REGISTER_CLIENTS: usize = 4;
/// Writes a holder makes to the fenced resource during one hold.
pub const WRITES_PER_HOLD: usize = 3;
/// The lock-delay every locker asks for: once a holder's session expires, its lock is
/// granted to nobody for this long.
pub const LOCK_DELAY: Duration = Duration::from_secs(1);
/// How long a crashing locker waits between two crashes.
const CRASH_EVERY: Duration = Duration::from_secs(5);
/// Session TTL (the server's minimum) and grace period of the lockers' sessions.
pub const SESSION_TTL: Duration = Duration::from_secs(3);
pub const SESSION_GRACE: Duration = Duration::from_secs(20);
/// Deadline of one client call (retries included).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of the router at `router_addr` whose calls give up after [`CALL_TIMEOUT`].
pub async fn connect(router_addr: &str) -> Client {
    let config = ClientConfig { request_timeout: CALL_TIMEOUT, ..ClientConfig::new([router_addr]) };
    Client::connect(config).await.expect("connect to the router")
}

/// Where sequential nodes are created (one parent, so their counters are one sequence).
pub const SEQUENCE_PARENT: &str = "/c/seq";
/// Where the ephemeral owners create their nodes (their sessions homed in the same group).
pub const EPHEMERAL_PARENT: &str = "/b/eph";
/// Ephemeral owners: each holds a session and one ephemeral node and reads it back.
pub const EPHEMERAL_OWNERS: usize = 2;
/// How long, after the workload stops, every ephemeral node may take to go.
const EPHEMERALS_GONE_WITHIN: Duration = Duration::from_secs(30);

/// One call a client made and how it ended: what availability and the timeline count.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attempt {
    /// `set`, `get`, `cas`, `create`, `sequential`, `lock`, `ephemeral`, `ephemeral-read`,
    /// `quota-create`, `quota-delete`, `quota-list`, `etcd-lock`, `etcd-unlock`,
    /// `etcd-campaign`, `etcd-proclaim`, `etcd-resign`, `etcd-put-leased`, `etcd-get-leased`
    /// or `etcd-revoke`.
    pub kind: &'static str,
    pub path: String,
    /// Nanoseconds since the workload started (the history's clock).
    pub invoked_ns: u64,
    pub completed_ns: u64,
    /// The call was answered with success (a lock wait that ran out counts: it was answered).
    pub ok: bool,
}

/// An acknowledged sequential create: when it was invoked and answered, the sequencer's
/// number for the call (part of the name it asked for: `n-<call>-`) and its counter.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Sequenced {
    pub invoked_ns: u64,
    pub completed_ns: u64,
    pub call: u64,
    pub counter: u64,
}

/// A property the history breaks, by kind (`lost-create`, `fencing`, `sequential`,
/// `sequential-lost`, `sequential-applied-twice`, `sequential-counter-repeated`,
/// `sequential-phantom`, `lock-delay`, `ephemeral-gone-early`, `ephemeral-kept`, `not-linearizable`,
/// `checker-gave-up`, `watch-missed`, `watch-repeated`, `watch-out-of-order`,
/// `watch-phantom`, `watch-stalled`, `quota-exceeded`, `quota-refused-write-kept`,
/// `etcd-leased-key-lost`, `etcd-leased-key-kept`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Anomaly {
    pub kind: &'static str,
    pub detail: String,
    /// When it happened (ms from the workload's start), where one moment shows it.
    pub at_ms: Option<u64>,
}

/// What a finished workload did and what its checks found.
pub struct Checked {
    pub anomalies: Vec<Anomaly>,
    /// Acknowledged creates (all read back unless an anomaly says otherwise).
    pub creates: usize,
    /// Acknowledged sequential creates.
    pub sequenced: usize,
    /// Lock holds that wrote to the fenced resource, and those of them taken through the
    /// etcd API.
    pub holds: usize,
    pub etcd_holds: usize,
    /// Terms of etcd election leaders that wrote to the fenced resource.
    pub etcd_leader_terms: usize,
    /// etcd leased keys read gone after their lease's revoke answered, and reads that found
    /// one while its lease held.
    pub etcd_leased_keys_revoked: usize,
    pub etcd_leased_keys_found: usize,
    /// Reads that found an ephemeral node while its session's lease held.
    pub ephemeral_reads: usize,
    /// Holds given up by abandoning their session (each one's lock-delay checked).
    pub abandoned_holds: usize,
    /// Completed register operations in the checked history.
    pub register_ops: usize,
    /// When the clients were told to stop (ns of the history's clock): calls still running
    /// then end after it, alone.
    pub stopped_ns: u64,
    /// Register changes the watchers delivered (all checked), the watchers they dropped to
    /// watch again from the revision after their last event, and the watches that found
    /// their events compacted away (on a replica whose history started over) and watched
    /// again from then.
    pub watch_events: usize,
    /// Of them, those the etcd watcher delivered (zero without the etcd clients).
    pub etcd_watch_events: usize,
    pub watch_resumes: usize,
    pub watch_compactions: usize,
    /// Creates the quota refused, and listings of its subtree checked (zero without the
    /// quota check: [`Workload::start_with_quota`]).
    pub quota_refusals: usize,
    pub quota_listings: usize,
    /// What each watcher delivered.
    pub watch_logs: Vec<WatchLog>,
    /// The register history (invocation order), every call's outcome, the fenced writes.
    pub records: Vec<Record>,
    pub attempts: Vec<Attempt>,
    pub fenced_writes: Vec<FencedWrite>,
}

/// The clock of a history: every call's and fault's time is read from it.
#[derive(Clone, Copy, Debug)]
pub struct HistoryClock(Instant);

impl HistoryClock {
    /// Nanoseconds since the workload started.
    pub fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// The clients and what they recorded.
pub struct Workload {
    client: Client,
    clock: HistoryClock,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    records: Arc<Mutex<Vec<Record>>>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
    acknowledged: Arc<Mutex<Vec<String>>>,
    sequenced: Arc<Mutex<Vec<Sequenced>>>,
    ephemerals: Arc<Ephemerals>,
    resource: Arc<FencedResource>,
    /// What the etcd leased-key client found (nothing without the etcd clients).
    etcd_leased: Arc<etcd_locks::LeasedKeys>,
    watches: Watches,
    quotas: Option<Quotas>,
    events: Mutex<Vec<String>>,
}

/// What the ephemeral owners saw.
#[derive(Default)]
struct Ephemerals {
    /// Every ephemeral node created (acknowledged).
    created: Mutex<Vec<String>>,
    /// Reads that found the node.
    found: AtomicUsize,
    /// Reads that found it gone before its session's local lease lapsed: (ms, what).
    gone_early: Mutex<Vec<(u64, String)>>,
}

impl Workload {
    /// Creates the registers and starts the register clients and their watchers, a
    /// creator, a sequencer, the ephemeral owners and the lockers of [`LOCKS`] (each
    /// locker's session homed in the group of its lock). No quota clients: their quota is
    /// set through placement ([`Self::start_with_quota`]).
    pub async fn start(router_addr: &str) -> Workload {
        Self::start_with_locks(router_addr, &LOCKS.map(|path| (path, path))).await
    }

    /// [`Self::start`] with the lockers of `locks`: `(lock path, path whose group homes the
    /// lockers' sessions)`.
    pub async fn start_with_locks(router_addr: &str, locks: &[(&'static str, &'static str)]) -> Workload {
        Self::start_with(router_addr, locks, None).await
    }

    /// [`Self::start`] and the quota clients: the quota on [`quotas::QUOTA_PREFIX`] is set
    /// through the placement leader among `placement` (clients of the placement nodes by id).
    /// The lockers of the first lock have their sessions homed in another group than the
    /// lock ([`REMOTE_HOME`]): every grant asks that group first, so the torture histories
    /// run sessions across groups under their faults.
    pub async fn start_with_quota(router_addr: &str, placement: &[(u64, PlacementClient<Channel>)]) -> Workload {
        Self::start_with(router_addr, &[(LOCKS[0], REMOTE_HOME), (LOCKS[1], LOCKS[1])], Some(placement)).await
    }

    async fn start_with(
        router_addr: &str,
        locks: &[(&'static str, &'static str)],
        placement: Option<&[(u64, PlacementClient<Channel>)]>,
    ) -> Workload {
        let client = connect(router_addr).await;
        let clock = HistoryClock(Instant::now());
        let records = Arc::new(Mutex::new(Vec::new()));
        for path in probes() {
            client.create(path, b"probe".to_vec(), &CreateOptions::persistent().create_parents()).await.expect("create a probe key");
        }
        let mut watched_from = BTreeMap::new();
        for path in REGISTERS {
            let invoked = clock.now();
            let created = client.create(path, INITIAL_VALUE, &CreateOptions::persistent().create_parents()).await.expect("create a register");
            watched_from.insert(path, created.stat.create_revision + 1);
            let input = KvInput::Put { key: path.as_bytes().to_vec(), value: INITIAL_VALUE.to_vec() };
            records.lock().expect("records").push((SET_UP_CLIENT, invoked, Some(clock.now()), input, Some(KvOutput::Written)));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let outcomes = || Outcomes { clock, stop: stop.clone(), attempts: attempts.clone() };
        let mut tasks = Vec::new();
        let quotas = match placement {
            Some(placement) => Some(Quotas::start(&client, placement, outcomes, &mut tasks).await),
            None => None,
        };
        let mut workload = Workload {
            client: client.clone(),
            clock,
            stop: stop.clone(),
            tasks,
            records,
            attempts: attempts.clone(),
            acknowledged: Arc::new(Mutex::new(Vec::new())),
            sequenced: Arc::new(Mutex::new(Vec::new())),
            ephemerals: Arc::new(Ephemerals::default()),
            resource: Arc::new(FencedResource::default()),
            etcd_leased: Arc::default(),
            // Before the register clients write; from the registers' creation anyway.
            watches: Watches::start(&client, clock, &watched_from).await,
            quotas,
            events: Mutex::new(Vec::new()),
        };
        for id in 0..REGISTER_CLIENTS {
            let (client, records) = (client.clone(), workload.records.clone());
            workload.tasks.push(tokio::spawn(register_client(id, client, outcomes(), records)));
        }
        let acknowledged = workload.acknowledged.clone();
        workload.tasks.push(tokio::spawn(creator(client.clone(), outcomes(), acknowledged)));
        let sequenced = workload.sequenced.clone();
        workload.tasks.push(tokio::spawn(sequencer(client.clone(), outcomes(), sequenced)));
        for owner in 0..EPHEMERAL_OWNERS {
            let ephemerals = workload.ephemerals.clone();
            workload.tasks.push(tokio::spawn(ephemeral_owner(owner, client.clone(), outcomes(), ephemerals)));
        }
        for (path, home) in locks {
            for _ in 0..LOCKERS_PER_LOCK {
                let resource = workload.resource.clone();
                workload.tasks.push(tokio::spawn(locker(client.clone(), path, home, outcomes(), resource)));
            }
            let resource = workload.resource.clone();
            workload.tasks.push(tokio::spawn(crashing_locker(client.clone(), path, home, outcomes(), resource)));
        }
        workload
    }

    /// Starts the clients of the etcd API at `etcd_addr` (a router's `--etcd-listen`): the
    /// lockers and campaigners, whose holds are checked with the native ones, the leased-key
    /// client (see `etcd_locks`), and a
    /// list-then-watch watcher checked with the others (see `watches`).
    pub async fn start_etcd_clients(&mut self, etcd_addr: &str) {
        let (clock, stop, attempts) = (self.clock, self.stop.clone(), self.attempts.clone());
        let outcomes = || Outcomes { clock, stop: stop.clone(), attempts: attempts.clone() };
        etcd_locks::start(etcd_addr, outcomes, &self.resource, &self.etcd_leased, &mut self.tasks).await;
        self.watches.start_etcd(etcd_addr).await;
    }

    /// Nanoseconds since the workload started (the clock of the history).
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Notes a fault for the failure report.
    pub fn log(&self, event: String) {
        eprintln!("{event}");
        self.events.lock().expect("events").push(event);
    }

    /// Waits until a write through the router succeeds in every group.
    pub async fn wait_writable(&self) {
        for probe in probes() {
            wait_until(&format!("a write of {probe} through the router"), STEP_TIMEOUT, || async {
                self.client.set(probe, b"probe".to_vec(), None).await.ok()
            })
            .await;
        }
    }

    /// Stops the clients and checks every property; panics with everything that failed, or
    /// if too little was done for the checks to mean anything.
    pub async fn finish_and_check(self, run: &str) {
        let events = self.events.lock().expect("events").join("\n");
        let checked = self.finish(run).await;
        let (creates, holds, completed) = (checked.creates, checked.holds, checked.register_ops);
        assert!(creates >= 20, "{run}: too few creates were acknowledged ({creates})");
        assert!(holds >= 5, "{run}: too few lock holds ({holds}) for the check to mean anything");
        assert!(completed > 100, "{run}: too few register operations completed ({completed})");
        let failures: Vec<String> = checked.anomalies.iter().map(|a| format!("{}: {}", a.kind, a.detail)).collect();
        assert!(failures.is_empty(), "{run}: {holds} holds, {completed} register operations\n{}\nfaults:\n{events}", failures.join("\n"));
        eprintln!(
            "{run}: {creates} creates read back, {} sequential names in order, {holds} exclusive holds, {completed} register operations linearizable, {} watch events delivered once and in order",
            checked.sequenced, checked.watch_events
        );
    }

    /// Stops the clients, waits until every group takes writes, and checks every property:
    /// acknowledged creates read back, sequential counters unique and increasing in real
    /// time, fenced holds exclusive, the register history (closed by a read of each register
    /// now) linearizable, each watcher delivering every acknowledged write of its register
    /// once and in order (waiting for it to deliver the final value), the quota (if set
    /// up) never exceeded. Answers what was done and every anomaly found.
    pub async fn finish(mut self, run: &str) -> Checked {
        let stopped_ns = self.clock.now();
        self.stop.store(true, Ordering::SeqCst);
        for task in std::mem::take(&mut self.tasks) {
            task.await.expect("a client task");
        }
        self.wait_writable().await;
        let mut anomalies = Vec::new();

        let acknowledged = self.acknowledged.lock().expect("acknowledged").clone();
        for path in &acknowledged {
            let lost = match self.client.get(path).await {
                Ok(node) if node.data == path.as_bytes() => continue,
                Ok(node) => format!("{path} holds {:?}", String::from_utf8_lossy(&node.data)),
                Err(error) => format!("{path}: {error}"),
            };
            anomalies.push(Anomaly { kind: "lost-create", detail: format!("an acknowledged create is lost: {lost}"), at_ms: None });
        }

        let sequenced = self.sequenced.lock().expect("sequenced").clone();
        anomalies.extend(sequence_anomalies(&sequenced).into_iter().map(|(at_ns, detail)| Anomaly {
            kind: "sequential",
            detail,
            at_ms: Some(at_ns / 1_000_000),
        }));
        let children = self.client.children(SEQUENCE_PARENT, ChildrenOptions::default()).all().await;
        let children = children.unwrap_or_else(|error| panic!("{run}: listing {SEQUENCE_PARENT}: {error}"));
        let names: Vec<String> = children.into_iter().map(|child| child.name).collect();
        anomalies.extend(sequence_reconciled(&names, &sequenced).into_iter().map(|(kind, detail)| Anomaly { kind, detail, at_ms: None }));

        let gone_early = self.ephemerals.gone_early.lock().expect("ephemerals").clone();
        anomalies.extend(gone_early.into_iter().map(|(at_ms, detail)| Anomaly { kind: "ephemeral-gone-early", detail, at_ms: Some(at_ms) }));
        // Every session ended with its owner: each ephemeral node goes (at once when its
        // session was closed, after the TTL when the close did not reach the server).
        let created = self.ephemerals.created.lock().expect("ephemerals").clone();
        let gone_by = Instant::now() + EPHEMERALS_GONE_WITHIN;
        for path in created {
            while self.client.exists(&path).await.map_or(true, |stat| stat.is_some()) {
                if Instant::now() >= gone_by {
                    let detail = format!("{path} is still there {EPHEMERALS_GONE_WITHIN:?} after every session ended");
                    anomalies.push(Anomaly { kind: "ephemeral-kept", detail, at_ms: None });
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        let holds = self.resource.holds();
        anomalies.extend(self.resource.violations().into_iter().map(|detail| Anomaly { kind: "fencing", detail, at_ms: None }));
        anomalies.extend(self.etcd_leased.anomalies());
        anomalies.extend(self.resource.lock_delay_violations().into_iter().map(|detail| Anomaly { kind: "lock-delay", detail, at_ms: None }));

        let mut finals = BTreeMap::new();
        for path in REGISTERS {
            let invoked = self.clock.now();
            let node = self.client.get(path).await.unwrap_or_else(|error| panic!("{run}: final read of {path}: {error}"));
            finals.insert(path, node.data.clone());
            let input = KvInput::Get { key: path.as_bytes().to_vec() };
            self.records.lock().expect("records").push((
                SET_UP_CLIENT,
                invoked,
                Some(self.clock.now()),
                input,
                Some(KvOutput::Value(Some(node.data))),
            ));
        }
        let mut records = self.records.lock().expect("records").clone();
        records.sort_by_key(|record| record.1);
        let register_ops = records.iter().filter(|r| r.2.is_some()).count();
        if let Err(failure) = check_records(records.clone()) {
            let kind = if failure.contains("ran out of") { "checker-gave-up" } else { "not-linearizable" };
            anomalies.push(Anomaly { kind, detail: failure, at_ms: None });
        }
        let watched = self.watches.finish(&finals, &records).await;
        anomalies.extend(watched.anomalies);
        let quotas = match self.quotas.take() {
            Some(quotas) => quotas.finish(&self.client).await,
            None => quotas::QuotasChecked::default(),
        };
        anomalies.extend(quotas.anomalies);
        let attempts = self.attempts.lock().expect("attempts").clone();
        let fenced_writes = self.resource.writes();
        let ephemeral_reads = self.ephemerals.found.load(Ordering::Relaxed);
        Checked {
            anomalies,
            creates: acknowledged.len(),
            sequenced: sequenced.len(),
            holds,
            etcd_holds: self.resource.holds_of(etcd_locks::ETCD_RESOURCE),
            etcd_leader_terms: self.resource.holds_of(etcd_locks::ELECTION_RESOURCE),
            etcd_leased_keys_revoked: self.etcd_leased.revoked(),
            etcd_leased_keys_found: self.etcd_leased.found(),
            ephemeral_reads,
            abandoned_holds: self.resource.abandonments(),
            register_ops,
            stopped_ns,
            watch_events: watched.events,
            etcd_watch_events: watched.etcd_events,
            watch_resumes: watched.resumes,
            watch_compactions: watched.compactions,
            quota_refusals: quotas.refusals,
            quota_listings: quotas.listings,
            watch_logs: watched.logs,
            records,
            attempts,
            fenced_writes,
        }
    }
}

/// What is wrong with acknowledged sequential creates, each with the time it shows (ns): a
/// counter handed out twice, or a create that began after another was acknowledged yet got a
/// counter not above it.
pub fn sequence_anomalies(sequenced: &[Sequenced]) -> Vec<(u64, String)> {
    let mut anomalies = Vec::new();
    let mut by_counter = sequenced.to_vec();
    by_counter.sort_by_key(|s| s.counter);
    for pair in by_counter.windows(2) {
        if pair[0].counter == pair[1].counter {
            anomalies.push((pair[1].completed_ns, format!("counter {} handed out twice: {:?} and {:?}", pair[0].counter, pair[0], pair[1])));
        }
    }
    // Real-time order: scanning by invocation, every create must get a counter above the
    // largest one acknowledged before it was invoked.
    let mut by_completion = sequenced.to_vec();
    by_completion.sort_by_key(|s| s.completed_ns);
    let mut by_invocation = sequenced.to_vec();
    by_invocation.sort_by_key(|s| s.invoked_ns);
    let (mut next, mut highest): (usize, Option<Sequenced>) = (0, None);
    for create in by_invocation {
        while next < by_completion.len() && by_completion[next].completed_ns < create.invoked_ns {
            if highest.is_none_or(|h| by_completion[next].counter > h.counter) {
                highest = Some(by_completion[next]);
            }
            next += 1;
        }
        if let Some(earlier) = highest.filter(|h| h.counter >= create.counter) {
            anomalies.push((create.completed_ns, format!("{create:?} got a counter not above {earlier:?}, acknowledged before it began")));
        }
    }
    anomalies
}

/// What the children of [`SEQUENCE_PARENT`] (`names`, read after the workload stopped) say
/// against the acknowledged sequential creates: an acknowledged create missing
/// (`sequential-lost`), one call's create there twice (`sequential-applied-twice`: a write
/// retried although it had been applied), or a counter on two children
/// (`sequential-counter-repeated`). Creates whose outcome was unknown may be there once or
/// not at all. Answers each anomaly by kind.
pub fn sequence_reconciled(names: &[String], sequenced: &[Sequenced]) -> Vec<(&'static str, String)> {
    let mut anomalies = Vec::new();
    let mut by_call: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut by_counter: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for name in names {
        match sequence_name(name) {
            Some((call, counter)) => {
                by_call.entry(call).or_default().push(counter);
                by_counter.entry(counter).or_default().push(name);
            }
            None => anomalies.push(("sequential-phantom", format!("{SEQUENCE_PARENT}/{name} was never asked for"))),
        }
    }
    for (call, counters) in &by_call {
        if counters.len() > 1 {
            anomalies.push(("sequential-applied-twice", format!("call {call} created {} nodes, counters {counters:?}", counters.len())));
        }
    }
    for (counter, names) in &by_counter {
        if names.len() > 1 {
            anomalies.push(("sequential-counter-repeated", format!("counter {counter} is on {names:?}")));
        }
    }
    for create in sequenced {
        if !by_call.get(&create.call).is_some_and(|counters| counters.contains(&create.counter)) {
            anomalies.push((
                "sequential-lost",
                format!("{create:?} was acknowledged, yet {SEQUENCE_PARENT} has no n-{}-{:010}", create.call, create.counter),
            ));
        }
    }
    anomalies
}

/// The sequencer's call number and the counter in a child's name (`n-<call>-<counter>`).
fn sequence_name(name: &str) -> Option<(u64, u64)> {
    let (call, counter) = name.strip_prefix("n-")?.split_once('-')?;
    Some((call.parse().ok()?, counter.parse().ok()?))
}

/// What every client task shares: the history's clock, the stop flag and the log of calls.
struct Outcomes {
    clock: HistoryClock,
    stop: Arc<AtomicBool>,
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

impl Outcomes {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Logs a call of `kind` on `path` invoked at `invoked_ns` that ends now.
    fn note(&self, kind: &'static str, path: &str, invoked_ns: u64, ok: bool) {
        let attempt = Attempt { kind, path: path.to_string(), invoked_ns, completed_ns: self.clock.now(), ok };
        self.attempts.lock().expect("attempts").push(attempt);
    }
}

/// A key in each group that `wait_writable` writes.
pub fn probes() -> [&'static str; 4] {
    ["/a/probe", "/b/probe", "/c/probe", "/d/probe"]
}

/// Sets, reads and compare-and-swaps the registers; records each operation whose outcome
/// could matter (a read that failed did nothing; a write that failed any way but a typed
/// refusal may have taken effect: unknown).
async fn register_client(id: usize, client: Client, outcomes: Outcomes, records: Arc<Mutex<Vec<Record>>>) {
    let now = || outcomes.clock.now();
    let mut last_seen: BTreeMap<&str, Vec<u8>> = REGISTERS.iter().map(|path| (*path, b"init".to_vec())).collect();
    let mut n = 0usize;
    while !outcomes.stopped() {
        n += 1;
        let path = REGISTERS[(id + n) % REGISTERS.len()];
        let key = path.as_bytes().to_vec();
        let invoked = now();
        let (input, outcome) = match n % 3 {
            0 => {
                let value = format!("c{id}-{n}").into_bytes();
                let result = client.set(path, value.clone(), None).await;
                (KvInput::Put { key, value }, result.map(|_| KvOutput::Written))
            }
            1 => {
                let result = client.get(path).await;
                if let Ok(node) = &result {
                    last_seen.insert(path, node.data.clone());
                }
                (KvInput::Get { key }, result.map(|node| KvOutput::Value(Some(node.data))))
            }
            _ => {
                let expected = last_seen[path].clone();
                let new = format!("cas{id}-{n}").into_bytes();
                let txn = Txn::new().when(Compare::value(path, CompareOp::Equal, expected.clone())).then(TxnOp::set(path, new.clone(), None));
                let result = client.txn(&txn).await;
                if result.as_ref().is_ok_and(|r| r.succeeded) {
                    last_seen.insert(path, new.clone());
                }
                (KvInput::Cas { key, expected: Some(expected), new }, result.map(|r| KvOutput::Swapped(r.succeeded)))
            }
        };
        let kind = match input {
            KvInput::Put { .. } => "set",
            KvInput::Get { .. } => "get",
            _ => "cas",
        };
        outcomes.note(kind, path, invoked, outcome.is_ok());
        let record = match outcome {
            Ok(output) => (id, invoked, Some(now()), input, Some(output)),
            Err(_) if matches!(input, KvInput::Get { .. }) => continue,
            Err(error) if is_refusal(&error) => continue,
            Err(_) => (id, invoked, None, input, None),
        };
        records.lock().expect("records").push(record);
    }
}

/// Whether a failed write certainly did nothing: a typed refusal of its content. (NOT_LEADER
/// and UNAVAILABLE also promise that, but the history does not lean on it: they are kept as
/// unknown, which is always sound.)
fn is_refusal(error: &Error) -> bool {
    matches!(
        error,
        Error::NoNode { .. } | Error::NodeExists { .. } | Error::BadVersion { .. } | Error::InvalidArgument { .. } | Error::InvalidPath { .. }
    )
}

/// Creates keys in every group, each holding its own path; records the acknowledged ones.
async fn creator(client: Client, outcomes: Outcomes, acknowledged: Arc<Mutex<Vec<String>>>) {
    let mut n = 0usize;
    while !outcomes.stopped() {
        n += 1;
        let path = format!("{}/created/k{n}", probes()[n % probes().len()].trim_end_matches("/probe"));
        let invoked = outcomes.clock.now();
        let created = client.create(&path, path.clone().into_bytes(), &CreateOptions::persistent().create_parents()).await.is_ok();
        outcomes.note("create", &path, invoked, created);
        if created {
            acknowledged.lock().expect("acknowledged").push(path);
        }
    }
}

/// Creates sequential nodes under [`SEQUENCE_PARENT`], each call asking for a name of its
/// own (`n-<call>-`, so the children can be reconciled with the calls); records the
/// acknowledged ones with the counter the service appended.
async fn sequencer(client: Client, outcomes: Outcomes, sequenced: Arc<Mutex<Vec<Sequenced>>>) {
    let mut call = 0u64;
    while !outcomes.stopped() {
        call += 1;
        let prefix = format!("{SEQUENCE_PARENT}/n-{call}-");
        let invoked_ns = outcomes.clock.now();
        let created = client.create(&prefix, Vec::new(), &CreateOptions::persistent().sequential().create_parents()).await;
        outcomes.note("sequential", SEQUENCE_PARENT, invoked_ns, created.is_ok());
        if let Ok(created) = created {
            let counter = created.path.strip_prefix(&prefix).and_then(|digits| digits.parse().ok());
            let counter = counter.unwrap_or_else(|| panic!("a sequential create answered {}, not {prefix}<counter>", created.path));
            sequenced.lock().expect("sequenced").push(Sequenced { invoked_ns, completed_ns: outcomes.clock.now(), call, counter });
        }
    }
}

/// Holds a session and an ephemeral node of it, reading the node back again and again: a read
/// that finds it gone while the session's local lease holds is an anomaly (the server keeps a
/// session at least that long). When the node is gone (the session ended), starts over with a
/// new session.
async fn ephemeral_owner(owner: usize, client: Client, outcomes: Outcomes, ephemerals: Arc<Ephemerals>) {
    let config = SessionConfig { ttl: SESSION_TTL, grace_period: SESSION_GRACE, path_hint: Some(EPHEMERAL_PARENT.into()) };
    let mut n = 0usize;
    while !outcomes.stopped() {
        let Ok(session) = client.session(config.clone()).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        n += 1;
        let path = format!("{EPHEMERAL_PARENT}/o{owner}-{n}");
        let invoked = outcomes.clock.now();
        let created = client.create(&path, Vec::new(), &CreateOptions::ephemeral(session.id()).create_parents()).await;
        outcomes.note("ephemeral", &path, invoked, created.is_ok());
        if created.is_err() {
            // The session is dropped (closed); its node, if the create took effect, with it.
            continue;
        }
        ephemerals.created.lock().expect("ephemerals").push(path.clone());
        while !outcomes.stopped() && !session.state().has_ended() {
            let invoked = outcomes.clock.now();
            let read = client.exists(&path).await;
            let completed = tokio::time::Instant::now();
            outcomes.note("ephemeral-read", &path, invoked, read.is_ok());
            match read {
                Ok(Some(_)) => {
                    ephemerals.found.fetch_add(1, Ordering::Relaxed);
                    // Paced: a read every 20 ms shows a node gone early well within a TTL.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(None) => {
                    // Read after the read: every keepalive acknowledged by then proves the
                    // session lived until its lease's end.
                    let lease_until = session.lease_until();
                    if completed < lease_until {
                        let early = lease_until - completed;
                        let detail = format!("{path} of session {} was gone {early:?} before the session's local lease lapsed", session.id());
                        ephemerals.gone_early.lock().expect("ephemerals").push((outcomes.clock.now() / 1_000_000, detail));
                    }
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// Takes the lock on `path` again and again with its own session (homed in the group of
/// `home`), writing to the fenced resource a few times per hold while its guard is valid.
async fn locker(client: Client, path: &'static str, home: &'static str, outcomes: Outcomes, resource: Arc<FencedResource>) {
    let (config, options) = locker_settings(home);
    let mut session: Option<Session> = None;
    while !outcomes.stopped() {
        let current = match session.take() {
            Some(current) if !current.state().has_ended() => current,
            _ => match client.session(config.clone()).await {
                Ok(opened) => opened,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let invoked = outcomes.clock.now();
        let locked = current.lock_with(path, &options).await;
        outcomes.note("lock", path, invoked, locked.is_ok());
        match locked {
            Ok(Some(guard)) => {
                let hold_id = resource.next_hold(path);
                hold(path, hold_id, &guard, &resource).await;
                // An unlock that failed may leave the lock held: give the session up (its
                // drop closes it, or the server expires it), so the lock is freed either way.
                if guard.unlock().await.is_ok() {
                    session = Some(current);
                }
            }
            Ok(None) => session = Some(current),
            Err(Error::SessionExpired) => {}
            Err(_) => {
                session = Some(current);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A locker's session (homed in the group of `home`) and lock options (waits of 2 s, the
/// [`LOCK_DELAY`]).
fn locker_settings(home: &str) -> (SessionConfig, LockOptions) {
    let config = SessionConfig { ttl: SESSION_TTL, grace_period: SESSION_GRACE, path_hint: Some(home.into()) };
    (config, LockOptions { wait: Duration::from_secs(2), lock_delay: LOCK_DELAY, ..LockOptions::default() })
}

/// Every [`CRASH_EVERY`], takes the lock on `path` with a session of its own, writes once
/// and abandons the session while holding, as a holder that crashed would: the session
/// expires after its TTL and the lock enters its lock-delay, which the lockers then wait out.
async fn crashing_locker(client: Client, path: &'static str, home: &'static str, outcomes: Outcomes, resource: Arc<FencedResource>) {
    let (config, options) = locker_settings(home);
    while !outcomes.stopped() {
        // A pause between crashes, not a wait for something.
        tokio::time::sleep(CRASH_EVERY).await;
        if outcomes.stopped() {
            // The others stopped meanwhile: a lock taken now would be a call after the
            // workload, alone in its windows (availability would count them down).
            break;
        }
        let Ok(session) = client.session(config.clone()).await else { continue };
        let invoked = outcomes.clock.now();
        let locked = session.lock_with(path, &options).await;
        outcomes.note("lock", path, invoked, locked.is_ok());
        match locked {
            Ok(Some(guard)) => {
                let hold_id = resource.next_hold(path);
                resource.write(path, hold_id, guard.fencing_token(), || guard.is_valid());
                resource.abandoned(path, hold_id, session.lease_until().into_std());
                session.abandon();
            }
            _ => drop(session.close().await),
        }
    }
}

/// One hold: writes to the resource while the guard is valid.
async fn hold(path: &str, hold: u64, guard: &LockGuard, resource: &FencedResource) {
    for _ in 0..WRITES_PER_HOLD {
        if !resource.write(path, hold, guard.fencing_token(), || guard.is_valid()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A resource protected by the locks, as a storage service would keep it: a `FenceGuard`
/// per lock path, and a log of every write a holder made believing it held the lock.
#[derive(Default)]
pub struct FencedResource {
    state: Mutex<ResourceState>,
}

#[derive(Default)]
pub struct ResourceState {
    /// Holds handed out so far (ids of holds).
    holds: u64,
    /// Writes so far (orders them exactly: every write takes the lock).
    sequence: u64,
    fences: BTreeMap<String, FenceGuard>,
    writes: Vec<FencedWrite>,
    /// Every grant: its lock, its hold and when the holder learnt of it.
    grants: Vec<(String, u64, Instant)>,
    /// Holds whose session was abandoned while holding: their lock, the hold, and the end
    /// of the session's local lease when it was abandoned.
    abandoned: Vec<(String, u64, Instant)>,
}

/// One write to the resource by a holder whose guard was valid at that moment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FencedWrite {
    pub path: String,
    pub hold: u64,
    pub token: u64,
    pub sequence: u64,
    #[serde(skip)]
    pub at: Instant,
    /// The fence refused it: a lower token had been outrun by a higher one first.
    pub refused_by: Option<u64>,
}

impl FencedResource {
    /// A hold of the lock on `path`, granted now: its id (holds are numbered in grant
    /// order).
    pub fn next_hold(&self, path: &str) -> u64 {
        let mut state = self.state.lock().expect("resource");
        state.holds += 1;
        let hold = state.holds;
        state.grants.push((path.to_string(), hold, Instant::now()));
        hold
    }

    /// `hold` of the lock on `path` was given up by abandoning its session, whose local
    /// lease ended at `lease_until`: the server keeps the session at least that long, then
    /// the lock-delay follows.
    pub fn abandoned(&self, path: &str, hold: u64, lease_until: Instant) {
        self.state.lock().expect("resource").abandoned.push((path.to_string(), hold, lease_until));
    }

    /// Grants that came too soon after an abandoned hold: the next grant of its lock must
    /// come no sooner than its session's local lease end plus [`LOCK_DELAY`] (the server
    /// expires the session after that lease end, and only then starts the delay).
    pub fn lock_delay_violations(&self) -> Vec<String> {
        let state = self.state.lock().expect("resource");
        let mut violations = Vec::new();
        for (path, hold, lease_until) in &state.abandoned {
            let next = state.grants.iter().filter(|(p, h, _)| p == path && h > hold).min_by_key(|(_, h, _)| *h);
            if let Some((_, next_hold, granted_at)) = next {
                let earliest = *lease_until + LOCK_DELAY;
                if *granted_at < earliest {
                    let early = earliest - *granted_at;
                    violations.push(format!(
                        "{path}: hold {next_hold} was granted {early:?} before the lock-delay after abandoned hold {hold} could have ended"
                    ));
                }
            }
        }
        violations
    }

    /// Holds given up by abandoning their session.
    pub fn abandonments(&self) -> usize {
        self.state.lock().expect("resource").abandoned.len()
    }

    /// A write by `hold` with `token`, made only if `valid()` says the holder still holds,
    /// checked under the resource's lock (so no other write comes between the check and the
    /// write). Returns whether the holder was still valid.
    pub fn write(&self, path: &str, hold: u64, token: u64, valid: impl FnOnce() -> bool) -> bool {
        let mut state = self.state.lock().expect("resource");
        if !valid() {
            return false;
        }
        state.sequence += 1;
        let sequence = state.sequence;
        let refused_by = state.fences.entry(path.to_string()).or_default().admit(token).err().map(|stale| stale.highest);
        state.writes.push(FencedWrite { path: path.to_string(), hold, token, sequence, at: Instant::now(), refused_by });
        true
    }

    /// Every write so far, in the order they were made.
    pub fn writes(&self) -> Vec<FencedWrite> {
        self.state.lock().expect("resource").writes.clone()
    }

    /// Holds that wrote at least once.
    pub fn holds(&self) -> usize {
        self.count_holds(|_| true)
    }

    /// Holds of the lock on `path` that wrote at least once.
    pub fn holds_of(&self, path: &str) -> usize {
        self.count_holds(|write| write.path == path)
    }

    fn count_holds(&self, counted: impl Fn(&FencedWrite) -> bool) -> usize {
        let state = self.state.lock().expect("resource");
        let mut holds: Vec<u64> = state.writes.iter().filter(|w| counted(w)).map(|w| w.hold).collect();
        holds.sort_unstable();
        holds.dedup();
        holds.len()
    }

    /// Everything that shows two holders acting at once: a write the fence refused (its
    /// holder believed it held the lock after a later holder had written), and, per path,
    /// holds (first to last write) that overlap or whose tokens do not strictly grow in
    /// hold order.
    pub fn violations(&self) -> Vec<String> {
        let state = self.state.lock().expect("resource");
        let mut violations: Vec<String> = state
            .writes
            .iter()
            .filter_map(|w| w.refused_by.map(|highest| format!("stale write admitted as valid by its holder: {w:?} after token {highest}")))
            .collect();
        let mut by_path: BTreeMap<&str, BTreeMap<u64, (FencedWrite, FencedWrite)>> = BTreeMap::new();
        for write in &state.writes {
            let holds = by_path.entry(&write.path).or_default();
            holds.entry(write.hold).and_modify(|(_, last)| *last = write.clone()).or_insert_with(|| (write.clone(), write.clone()));
        }
        for (path, holds) in by_path {
            let mut holds: Vec<(FencedWrite, FencedWrite)> = holds.into_values().collect();
            holds.sort_by_key(|(first, _)| first.sequence);
            for pair in holds.windows(2) {
                let ((first_a, _), (first_b, _)) = (&pair[0], &pair[1]);
                if first_b.token <= first_a.token {
                    violations.push(format!("{path}: token {} held after token {} ({first_a:?} then {first_b:?})", first_b.token, first_a.token));
                }
            }
            // The hold that ends last so far must end before the next one starts.
            let mut latest: Option<&FencedWrite> = None;
            for (first, last) in &holds {
                if let Some(earlier) = latest.filter(|earlier| earlier.sequence > first.sequence) {
                    let overlap = earlier.at.saturating_duration_since(first.at);
                    violations.push(format!(
                        "{path}: holds overlap by {overlap:?}: hold {} wrote {earlier:?} after hold {} began with {first:?}",
                        earlier.hold, first.hold
                    ));
                }
                if latest.is_none_or(|earlier| last.sequence > earlier.sequence) {
                    latest = Some(last);
                }
            }
        }
        violations
    }
}

/// Clients of the library working through the router: writers and readers in every group
/// and a session taking and releasing a lock. Any error the library lets through is kept.
pub struct ClientLoad {
    stop: Arc<AtomicBool>,
    operations: Arc<Mutex<(u64, Vec<String>)>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ClientLoad {
    /// Starts the clients; the session lives `session_ttl` without a keepalive.
    pub async fn start(router_addr: &str, session_ttl: Duration) -> ClientLoad {
        let client = connect(router_addr).await;
        let stop = Arc::new(AtomicBool::new(false));
        let operations = Arc::new(Mutex::new((0, Vec::new())));
        let mut tasks = Vec::new();
        for prefix in ["/a", "/b", "/c", "/d"] {
            let path = format!("{prefix}/drain/key");
            client.create(&path, Vec::new(), &CreateOptions::persistent().create_parents()).await.expect("create a key");
            let (client, stop, operations) = (client.clone(), stop.clone(), operations.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let value = n.to_string().into_bytes();
                    let result = match client.set(&path, value.clone(), None).await {
                        Ok(_) => client.get(&path).await.map(|node| (node.data == value).then_some(()).ok_or("read back another value".to_string())),
                        Err(error) => Err(error),
                    };
                    let mut operations = operations.lock().expect("operations");
                    operations.0 += 1;
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(problem)) => operations.1.push(format!("{path}: {problem}")),
                        Err(error) => operations.1.push(format!("{path}: {error}")),
                    }
                }
            }));
        }
        let (stop_flag, counts) = (stop.clone(), operations.clone());
        let session =
            client.session(SessionConfig { path_hint: Some("/b/drain".into()), ..SessionConfig::new(session_ttl) }).await.expect("a session");
        tasks.push(tokio::spawn(async move {
            while !stop_flag.load(Ordering::Relaxed) {
                let result = match session.lock_with("/b/drain/lock", &LockOptions::default()).await {
                    Ok(Some(guard)) => guard.unlock().await.map(|_| ()),
                    Ok(None) => Ok(()),
                    Err(error) => Err(error),
                };
                let mut counts = counts.lock().expect("operations");
                counts.0 += 1;
                if let Err(error) = result {
                    counts.1.push(format!("lock: {error}"));
                }
                if session.state().has_ended() {
                    counts.1.push("the session ended".into());
                    return;
                }
            }
        }));
        ClientLoad { stop, operations, tasks }
    }

    /// Stops the clients; answers the number of operations and the errors seen.
    pub async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("a client task");
        }
        let operations = self.operations.lock().expect("operations");
        (operations.0, operations.1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acknowledged(call: u64, counter: u64) -> Sequenced {
        Sequenced { invoked_ns: call, completed_ns: call + 1, call, counter }
    }

    fn kinds(names: &[&str], sequenced: &[Sequenced]) -> Vec<&'static str> {
        let names: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        sequence_reconciled(&names, sequenced).into_iter().map(|(kind, _)| kind).collect()
    }

    /// Children that match the acknowledged calls, plus one whose answer was lost, are clean.
    #[test]
    fn sequential_children_matching_their_calls_are_clean() {
        let sequenced = [acknowledged(1, 0), acknowledged(3, 2)];
        assert!(kinds(&["n-1-0000000000", "n-2-0000000001", "n-3-0000000002"], &sequenced).is_empty());
    }

    /// A call applied twice, a counter given twice, an acknowledged create missing and a
    /// name no call asked for are each found.
    #[test]
    fn sequential_children_applied_twice_repeated_lost_or_unasked_are_found() {
        let sequenced = [acknowledged(1, 0), acknowledged(2, 1)];
        assert_eq!(kinds(&["n-1-0000000000", "n-1-0000000003"], &sequenced), vec!["sequential-applied-twice", "sequential-lost"]);
        assert_eq!(kinds(&["n-1-0000000000", "n-2-0000000001", "n-4-0000000001"], &sequenced), vec!["sequential-counter-repeated"]);
        assert_eq!(kinds(&["n-1-0000000000", "n-2-0000000001", "x"], &sequenced), vec!["sequential-phantom"]);
    }
}
