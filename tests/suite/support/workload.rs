//! The workload of the process tests: clients writing registers, creating keys and taking
//! fenced locks through a router, recording what they were told, and the checks run on it
//! afterwards (every acknowledged create read back, every fenced hold exclusive, the register
//! history linearizable). Used by `crash_cycles.rs` and `fleet_processes.rs`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use warden_client::{
    Client, ClientConfig, Compare, CompareOp, CreateOptions, Error, FenceGuard, LockGuard, LockOptions, Session, SessionConfig, Txn, TxnOp,
};
use warden_loadgen::linearizability::{KvInput, KvOutput};

use super::history::{check_records, Record};
use super::processes::STEP_TIMEOUT;
use warden_testkit::wait_until;

/// Shard groups besides the root group.
pub const PREFIXES: [&str; 3] = ["/b", "/c", "/d"];
/// Registers of the linearizability history, spread over the groups.
pub const REGISTERS: [&str; 6] = ["/a/r0", "/a/r1", "/b/r0", "/b/r1", "/c/r0", "/d/r0"];
/// Fenced lock paths (in two groups) and how many sessions contend for each.
pub const LOCKS: [&str; 2] = ["/b/locks/x", "/c/locks/y"];
pub const LOCKERS_PER_LOCK: usize = 2;
pub const REGISTER_CLIENTS: usize = 4;
/// Writes a holder makes to the fenced resource during one hold.
pub const WRITES_PER_HOLD: usize = 3;
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

/// The clients and what they recorded.
pub struct Workload {
    client: Client,
    start: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    records: Arc<Mutex<Vec<Record>>>,
    acknowledged: Arc<Mutex<Vec<String>>>,
    resource: Arc<FencedResource>,
    events: Mutex<Vec<String>>,
}

impl Workload {
    /// Creates the registers and starts the register clients, a creator and the lockers of
    /// [`LOCKS`] (each locker's session homed in the group of its lock).
    pub async fn start(router_addr: &str) -> Workload {
        Self::start_with_locks(router_addr, &LOCKS.map(|path| (path, path))).await
    }

    /// [`Self::start`] with the lockers of `locks`: `(lock path, path whose group homes the
    /// lockers' sessions)`.
    pub async fn start_with_locks(router_addr: &str, locks: &[(&'static str, &'static str)]) -> Workload {
        let client = connect(router_addr).await;
        let start = Instant::now();
        let records = Arc::new(Mutex::new(Vec::new()));
        for path in probes() {
            client.create(path, b"probe".to_vec(), &CreateOptions::persistent().create_parents()).await.expect("create a probe key");
        }
        for path in REGISTERS {
            let invoked = start.elapsed().as_nanos() as u64;
            client.create(path, b"init".to_vec(), &CreateOptions::persistent().create_parents()).await.expect("create a register");
            let input = KvInput::Put { key: path.as_bytes().to_vec(), value: b"init".to_vec() };
            records.lock().expect("records").push((usize::MAX, invoked, Some(start.elapsed().as_nanos() as u64), input, Some(KvOutput::Written)));
        }
        let mut workload = Workload {
            client: client.clone(),
            start,
            stop: Arc::new(AtomicBool::new(false)),
            tasks: Vec::new(),
            records,
            acknowledged: Arc::new(Mutex::new(Vec::new())),
            resource: Arc::new(FencedResource::default()),
            events: Mutex::new(Vec::new()),
        };
        for id in 0..REGISTER_CLIENTS {
            let (client, stop, records) = (client.clone(), workload.stop.clone(), workload.records.clone());
            workload.tasks.push(tokio::spawn(register_client(id, client, start, stop, records)));
        }
        let (stop, acknowledged) = (workload.stop.clone(), workload.acknowledged.clone());
        workload.tasks.push(tokio::spawn(creator(client.clone(), stop, acknowledged)));
        for (path, home) in locks {
            for _ in 0..LOCKERS_PER_LOCK {
                let (stop, resource) = (workload.stop.clone(), workload.resource.clone());
                workload.tasks.push(tokio::spawn(locker(client.clone(), path, home, stop, resource)));
            }
        }
        workload
    }

    /// Nanoseconds since the workload started (the clock of the history).
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
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

    /// Stops the clients and checks every property; panics with everything that failed.
    pub async fn finish_and_check(mut self, run: &str) {
        self.stop.store(true, Ordering::SeqCst);
        for task in std::mem::take(&mut self.tasks) {
            task.await.expect("a client task");
        }
        self.wait_writable().await;
        let mut failures = Vec::new();

        // Acknowledged creates are all there.
        let acknowledged = self.acknowledged.lock().expect("acknowledged").clone();
        assert!(acknowledged.len() >= 20, "{run}: too few creates were acknowledged ({})", acknowledged.len());
        let mut lost = Vec::new();
        for path in &acknowledged {
            match self.client.get(path).await {
                Ok(node) if node.data == path.as_bytes() => {}
                Ok(node) => lost.push(format!("{path} holds {:?}", String::from_utf8_lossy(&node.data))),
                Err(error) => lost.push(format!("{path}: {error}")),
            }
        }
        if !lost.is_empty() {
            failures.push(format!("{} of {} acknowledged creates are lost: {lost:?}", lost.len(), acknowledged.len()));
        }

        // Fenced holds were exclusive.
        let holds = self.resource.holds();
        assert!(holds >= 5, "{run}: too few lock holds ({holds}) for the check to mean anything");
        failures.extend(self.resource.violations());

        // The registers' history, closed by a read of each register now.
        for path in REGISTERS {
            let invoked = self.now();
            let node = self.client.get(path).await.unwrap_or_else(|error| panic!("{run}: final read of {path}: {error}"));
            let input = KvInput::Get { key: path.as_bytes().to_vec() };
            self.records.lock().expect("records").push((usize::MAX, invoked, Some(self.now()), input, Some(KvOutput::Value(Some(node.data)))));
        }
        let records = self.records.lock().expect("records").clone();
        let completed = records.iter().filter(|r| r.2.is_some()).count();
        assert!(completed > 100, "{run}: too few register operations completed ({completed})");
        if let Err(failure) = check_records(records) {
            failures.push(failure);
        }

        let events = self.events.lock().expect("events").join("\n");
        assert!(failures.is_empty(), "{run}: {holds} holds, {completed} register operations\n{}\nfaults:\n{events}", failures.join("\n"));
        eprintln!("{run}: {} creates read back, {holds} exclusive holds, {completed} register operations linearizable", acknowledged.len());
    }
}

/// A key in each group that `wait_writable` writes.
pub fn probes() -> [&'static str; 4] {
    ["/a/probe", "/b/probe", "/c/probe", "/d/probe"]
}

/// Sets, reads and compare-and-swaps the registers; records each operation whose outcome
/// could matter (a read that failed did nothing; a write that failed any way but a typed
/// refusal may have taken effect: unknown).
async fn register_client(id: usize, client: Client, start: Instant, stop: Arc<AtomicBool>, records: Arc<Mutex<Vec<Record>>>) {
    let now = || start.elapsed().as_nanos() as u64;
    let mut last_seen: BTreeMap<&str, Vec<u8>> = REGISTERS.iter().map(|path| (*path, b"init".to_vec())).collect();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
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
async fn creator(client: Client, stop: Arc<AtomicBool>, acknowledged: Arc<Mutex<Vec<String>>>) {
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let path = format!("{}/created/k{n}", probes()[n % probes().len()].trim_end_matches("/probe"));
        if client.create(&path, path.clone().into_bytes(), &CreateOptions::persistent().create_parents()).await.is_ok() {
            acknowledged.lock().expect("acknowledged").push(path);
        }
    }
}

/// Takes the lock on `path` again and again with its own session (homed in the group of
/// `home`), writing to the fenced resource a few times per hold while its guard is valid.
async fn locker(client: Client, path: &'static str, home: &'static str, stop: Arc<AtomicBool>, resource: Arc<FencedResource>) {
    let config = SessionConfig { ttl: SESSION_TTL, grace_period: SESSION_GRACE, path_hint: Some(home.into()) };
    let options = LockOptions { wait: Duration::from_secs(2), ..LockOptions::default() };
    let mut session: Option<Session> = None;
    while !stop.load(Ordering::Relaxed) {
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
        match current.lock_with(path, &options).await {
            Ok(Some(guard)) => {
                hold(path, &guard, &resource).await;
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

/// One hold: writes to the resource while the guard is valid.
async fn hold(path: &str, guard: &LockGuard, resource: &FencedResource) {
    let hold = resource.next_hold();
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
}

/// One write to the resource by a holder whose guard was valid at that moment.
#[derive(Clone, Debug)]
struct FencedWrite {
    path: String,
    hold: u64,
    token: u64,
    sequence: u64,
    at: Instant,
    /// The fence refused it: a lower token had been outrun by a higher one first.
    refused_by: Option<u64>,
}

impl FencedResource {
    pub fn next_hold(&self) -> u64 {
        let mut state = self.state.lock().expect("resource");
        state.holds += 1;
        state.holds
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

    /// Holds that wrote at least once.
    pub fn holds(&self) -> usize {
        let state = self.state.lock().expect("resource");
        let mut holds: Vec<u64> = state.writes.iter().map(|w| w.hold).collect();
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
