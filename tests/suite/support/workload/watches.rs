//! The watch check: watchers of registers run for the whole workload through the client
//! library, and every acknowledged change of a register must be delivered to each of its
//! watchers once, in order, with nothing delivered that nobody wrote.
//!
//! Per watched register a *following* watcher keeps one `Watcher` (which resumes itself
//! across broken streams and, per group, across MOVED), and on [`RESUMED`] a *resuming*
//! watcher also drops its `Watcher` every 1–3 s and opens a new one from the revision after
//! its last event, as a user does after a restart. One *recursive* watcher of [`SUBTREE`]
//! spans every group (the root's, the other groups' prefixes below it, and the group `/a`
//! is split into and merged back from) and is judged for each register of [`REGISTERS`] as
//! if it watched it alone. With the etcd clients on
//! ([`Watches::start_etcd`]), an *etcd* watcher does what an etcd user's informer and
//! clientv3 do through a router's etcd API: list every key (one range over every group),
//! watch the prefix `/` from the list's revision + 1, watch again from its last event's
//! revision + 1 when the stream breaks (valid only if the stream's events come in one
//! revision order over every group: checked), and list again when the watch is cancelled;
//! it is judged for the registers that never move ([`UNMOVED`]).
//!
//! A watch can legitimately lose its place: a replica's event history starts over when it
//! restarts or installs a snapshot (`shard-node/namespace/src/watch/hub.rs`, `reset`), and a
//! watch resumed there from before that point ends COMPACTED (the kill fault restarts
//! nodes); so does a watch of `/a/r0` that never reached the group `/a` was split into before
//! it merged back (that group's events are gone with it), and a recursive watch re-created
//! with a place in a merged group before its hand-over. The watcher then does what
//! `Error::Compacted` tells a user to do: it watches again from now. The writes that may
//! fall in that gap (see [`RegisterWrites::excused`]) are not required; every other
//! acknowledged write still is, and the gap is counted. A watch that ends otherwise (MOVED
//! included: a `Watcher` resumes across it by itself) is a stall.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use warden_client::{Client, Error, WatchOptions, Watcher};
use warden_loadgen::linearizability::{KvInput, KvOutput};

use super::{Anomaly, HistoryClock, REGISTERS, SET_UP_CLIENT};
use crate::support::history::Record;

/// The registers watched: `/a/r0` lives in the subtree the split-merge fault moves (its
/// watchers cross MOVED), `/d/r0` in a group that never moves.
pub const WATCHED: [&str; 2] = ["/a/r0", "/d/r0"];
/// The register that also has a resuming watcher. A start revision is a revision of the
/// group serving the path when the watch is opened, and revisions are per group: after
/// `/a/r0` moved, the revision after its last event (a revision of the old group) means
/// nothing in the new one, so only a register that never moves can be resumed this way.
pub const RESUMED: &str = "/d/r0";
/// The subtree the recursive watcher watches: all of it, so one watch spans every group.
pub const SUBTREE: &str = "/";
/// The registers the etcd watcher is judged for: those that never change group. etcd's
/// events do not name their group, so a register that moves would mix two groups'
/// revisions in one log.
pub const UNMOVED: [&str; 4] = ["/b/r0", "/b/r1", "/c/r0", "/d/r0"];
/// How long the resuming watcher keeps one `Watcher`: a random time in this range.
const RESUME_AFTER_MS: std::ops::Range<u64> = 1_000..3_000;
/// How long, after the clients stop, a watcher may take to deliver a register's final value.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(30);
/// Pause before calling a watcher again after an error (it reconnects by itself).
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Errors a watcher logs at most (the last one is always in `last_error`).
const ERRORS_LOGGED_MAX: usize = 200;
/// A following watcher with no event for this long notes where it would resume.
const IDLE_NOTED_AFTER: Duration = Duration::from_secs(1);

/// An error a watcher's call answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchError {
    /// When (ns of the history's clock).
    pub at_ns: u64,
    pub error: String,
    /// The watcher's resume revisions after it (empty: no watcher was open).
    pub resume_revisions: BTreeMap<u64, u64>,
}

impl WatchLog {
    /// Notes that no event came for [`IDLE_NOTED_AFTER`] (as an error entry "idle"), when the
    /// resume revisions differ from the last noted.
    fn note_idle(&mut self, at_ns: u64, resume_revisions: &BTreeMap<u64, u64>) {
        if !self.errors.last().is_some_and(|last| last.error == "idle" && last.resume_revisions == *resume_revisions) {
            self.keep(WatchError { at_ns, error: "idle".into(), resume_revisions: resume_revisions.clone() });
        }
    }

    /// Notes `error`, answered at `at_ns` with the watcher then holding `resume_revisions`.
    fn note_error(&mut self, at_ns: u64, error: &Error, resume_revisions: BTreeMap<u64, u64>) {
        self.last_error = Some(error.to_string());
        self.keep(WatchError { at_ns, error: error.to_string(), resume_revisions });
    }

    /// Keeps `entry` unless [`ERRORS_LOGGED_MAX`] are kept already.
    fn keep(&mut self, entry: WatchError) {
        if self.errors.len() < ERRORS_LOGGED_MAX {
            self.errors.push(entry);
        }
    }
}

/// One event a watcher delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// The group that served it, and its revision there.
    pub group: u64,
    pub revision: u64,
    /// The register's value after it.
    pub value: Vec<u8>,
    /// When the watcher got it (ns of the history's clock).
    pub received_ns: u64,
}

/// A watch that lost its place (COMPACTED) and was opened again from now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gap {
    /// Events delivered before it.
    pub after: usize,
    /// When the new watch was opened (ns): it reports every write invoked after this.
    pub reopened_ns: u64,
    /// The error that ended the old watch.
    pub error: String,
}

/// What one watcher did.
#[derive(Clone, Debug, Default)]
pub struct WatchLog {
    /// `following /a/r0`, `resuming /d/r0`, `recursive / for /b/r0`.
    pub name: String,
    /// Its events, in delivery order.
    pub delivered: Vec<Delivered>,
    pub gaps: Vec<Gap>,
    /// Watchers it dropped to open a new one from the revision after its last event.
    pub resumes: usize,
    /// Its gaps are an etcd watcher's lists (one at its start, one after each break), not
    /// compactions: counted as resumes.
    pub relists: bool,
    /// The last error a call of the watcher answered, for a stall's report.
    pub last_error: Option<String>,
    /// The first [`ERRORS_LOGGED_MAX`] errors, each with when (ns) and the resume revisions
    /// the watcher held after it (group → next revision), for the history's files.
    pub errors: Vec<WatchError>,
    /// Why it did not keep up: it ended, or missed the final value's deadline.
    pub stalled: Option<String>,
    /// Events of its stream (any key) that came after one of a higher revision (the etcd
    /// watcher's: its stream has one revision order over every group).
    pub order_breaks: Vec<String>,
}

/// What the watch check found and counted.
#[derive(Debug, Default)]
pub struct WatchesChecked {
    pub anomalies: Vec<Anomaly>,
    /// Events delivered, over every watcher, and of them by the etcd watcher.
    pub events: usize,
    pub etcd_events: usize,
    /// Explicit resumes from a revision.
    pub resumes: usize,
    /// Watches that found their events compacted away and started again from now.
    pub compactions: usize,
    /// What each watcher did (for the history's files).
    pub logs: Vec<WatchLog>,
}

/// The running watchers.
pub struct Watches {
    clock: HistoryClock,
    watchers: Vec<Running>,
}

/// One register's log of a running watcher, and the watcher's task (on the first log of
/// each watcher only: the recursive watcher logs for several registers).
struct Running {
    register: &'static str,
    task: Option<JoinHandle<()>>,
    log: Arc<Mutex<WatchLog>>,
}

/// The logs one watcher keeps, by register.
type Logs = BTreeMap<&'static str, Arc<Mutex<WatchLog>>>;

impl Watches {
    /// Starts the watchers of each register of [`WATCHED`] from `from_revisions` (the
    /// register's: the revision after its creation, so every later write is covered), and
    /// the recursive watcher of [`SUBTREE`] for each register of [`REGISTERS`], from now
    /// (its watch is created before this answers: call it before the registers are written).
    pub async fn start(client: &Client, clock: HistoryClock, from_revisions: &BTreeMap<&'static str, u64>) -> Watches {
        let mut watchers = Vec::new();
        let mut spawn = |logs: Logs, task: JoinHandle<()>| {
            let mut task = Some(task);
            watchers.extend(logs.into_iter().map(|(register, log)| Running { register, task: task.take(), log }));
        };
        for register in WATCHED {
            let from_revision = from_revisions[register];
            let resuming = [false, true].into_iter().filter(|resuming| !resuming || register == RESUMED);
            for resuming in resuming {
                let name = format!("{} {register}", if resuming { "resuming" } else { "following" });
                let logs = Logs::from([(register, Arc::new(Mutex::new(WatchLog { name, ..WatchLog::default() })))]);
                let options = WatchOptions { start_revision: from_revision, ..WatchOptions::new(register) };
                spawn(logs.clone(), tokio::spawn(watch(client.clone(), options, None, resuming, clock, logs)));
            }
        }
        let options = WatchOptions { recursive: true, ..WatchOptions::new(SUBTREE) };
        let watcher = client.watch(options.clone()).await.unwrap_or_else(|error| panic!("a recursive watch of {SUBTREE}: {error}"));
        let logs: Logs = REGISTERS
            .into_iter()
            .map(|register| (register, Arc::new(Mutex::new(WatchLog { name: format!("recursive {SUBTREE} for {register}"), ..WatchLog::default() }))))
            .collect();
        spawn(logs.clone(), tokio::spawn(watch(client.clone(), options, Some(watcher), false, clock, logs)));
        Watches { clock, watchers }
    }

    /// Starts the etcd watcher (see the module's documentation) against the etcd API at
    /// `etcd_addr`, judged for each register of [`UNMOVED`].
    pub async fn start_etcd(&mut self, etcd_addr: &str) {
        // No request timeout: it would end the watch stream too.
        let options = etcd_client::ConnectOptions::new().with_connect_timeout(super::CALL_TIMEOUT);
        let client = etcd_client::Client::connect([etcd_addr], Some(options)).await;
        let client = client.unwrap_or_else(|error| panic!("connect to the etcd API at {etcd_addr}: {error}"));
        let logs: Logs = UNMOVED
            .into_iter()
            .map(|register| {
                let log = WatchLog { name: format!("etcd {SUBTREE} for {register}"), relists: true, ..WatchLog::default() };
                (register, Arc::new(Mutex::new(log)))
            })
            .collect();
        let mut task = Some(tokio::spawn(watch_etcd(client, self.clock, logs.clone())));
        self.watchers.extend(logs.into_iter().map(|(register, log)| Running { register, task: task.take(), log }));
    }

    /// Waits (at most [`CATCH_UP_WITHIN`]) until every watcher delivered its register's
    /// final value (`finals`, read after the clients stopped; the writes are `records`),
    /// stops them and checks what each delivered.
    pub async fn finish(self, finals: &BTreeMap<&str, Vec<u8>>, records: &[Record]) -> WatchesChecked {
        let deadline = tokio::time::Instant::now() + CATCH_UP_WITHIN;
        let writes: BTreeMap<&str, RegisterWrites> = self.watchers.iter().map(|w| (w.register, RegisterWrites::of(w.register, records))).collect();
        let caught_up = |register: &str, log: &WatchLog| log.stalled.is_some() || writes[register].caught_up(&finals[register], log);
        // Polled: the watchers deliver on their own, and the deadline bounds the wait.
        while tokio::time::Instant::now() < deadline && !self.watchers.iter().all(|w| caught_up(w.register, &w.log.lock().expect("watch log"))) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut checked = WatchesChecked::default();
        for Running { register, task, log } in self.watchers {
            // The watcher has no end of its own: it watches until stopped.
            if let Some(task) = task {
                task.abort();
            }
            let mut log = log.lock().expect("watch log").clone();
            if !caught_up(register, &log) {
                let last =
                    log.delivered.last().map_or("none".into(), |d| format!("{:?} at revision {} of group {}", value(&d.value), d.revision, d.group));
                let error = log.last_error.as_deref().unwrap_or("none");
                log.stalled = Some(format!(
                    "the final value {:?} was not delivered within {CATCH_UP_WITHIN:?} (last event: {last}; last error: {error})",
                    value(&finals[register])
                ));
            }
            checked.anomalies.extend(watch_anomalies(&log, &writes[register], self.clock.now()));
            checked.events += log.delivered.len();
            checked.resumes += log.resumes;
            if log.relists {
                checked.etcd_events += log.delivered.len();
                checked.resumes += log.gaps.len();
            } else {
                checked.compactions += log.gaps.len();
            }
            checked.logs.push(log);
        }
        checked
    }
}

/// Watches what `options` say until aborted, from `opened` if the watch is open already,
/// logging every event of a register of `logs` in its log (others are not looked at); with
/// `resuming` (one register, one group), opens a new watch from the revision after its last
/// event every [`RESUME_AFTER_MS`]. A watch whose events were compacted away is opened
/// again from now. Errors are noted in every log.
async fn watch(client: Client, options: WatchOptions, mut opened: Option<Watcher>, resuming: bool, clock: HistoryClock, logs: Logs) {
    let each = |note: &dyn Fn(&mut WatchLog)| logs.values().for_each(|log| note(&mut log.lock().expect("watch log")));
    let mut start_revision = options.start_revision;
    let mut compacted: Option<Error> = None;
    loop {
        let opening = match opened.take() {
            Some(watcher) => Ok(watcher),
            None => client.watch(WatchOptions { start_revision, ..options.clone() }).await,
        };
        let mut watcher = match opening {
            Ok(watcher) => watcher,
            Err(error) => {
                if matches!(error, Error::Compacted { .. }) {
                    start_revision = 0;
                    compacted = Some(error.clone());
                }
                each(&|log| log.note_error(clock.now(), &error, BTreeMap::new()));
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        if let Some(error) = compacted.take() {
            each(&|log| {
                let after = log.delivered.len();
                log.gaps.push(Gap { after, reopened_ns: clock.now(), error: error.to_string() });
            });
        }
        if start_revision == 0 && resuming {
            // Where the server started it (one group: `RESUMED` never moves), so a resume
            // before its first event misses nothing either.
            start_revision = watcher.resume_revisions().values().copied().max().unwrap_or(0);
        }
        let resume_at = resuming.then(|| tokio::time::Instant::now() + Duration::from_millis(rand::random_range(RESUME_AFTER_MS)));
        loop {
            let next = match resume_at {
                // `next` is cancel-safe: a timeout loses nothing, and the watcher is dropped.
                Some(at) => match tokio::time::timeout_at(at, watcher.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                // Idle seconds are noted with where the watcher would resume (a stall's
                // story in the history's files); `next` is cancel-safe.
                None => match tokio::time::timeout(IDLE_NOTED_AFTER, watcher.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        each(&|log| log.note_idle(clock.now(), watcher.resume_revisions()));
                        continue;
                    }
                },
            };
            match next {
                Ok(Some(event)) => {
                    // Only a single group's watch is resumed from one revision (`resuming`).
                    start_revision = event.revision + 1;
                    if let Some(log) = logs.get(event.node.path.as_str()) {
                        let delivered =
                            Delivered { group: event.group_id, revision: event.revision, value: event.node.data, received_ns: clock.now() };
                        log.lock().expect("watch log").delivered.push(delivered);
                    }
                }
                Ok(None) => {
                    each(&|log| {
                        let error = log.last_error.clone().unwrap_or_else(|| "none".into());
                        log.stalled = Some(format!("the watch ended (last error: {error})"));
                    });
                    return;
                }
                // The user watches again from now, and only the writes that may fall in the
                // gap are excused. (MOVED never ends a `Watcher`: it resumes in the new group;
                // one that did would end here, `None` next, a stall.)
                Err(error @ Error::Compacted { .. }) => {
                    each(&|log| log.note_error(clock.now(), &error, watcher.resume_revisions().clone()));
                    (start_revision, compacted) = (0, Some(error));
                    break;
                }
                Err(error) => {
                    // Transient (the watcher tries again on the next call) or final (the
                    // next call answers `None`).
                    each(&|log| log.note_error(clock.now(), &error, watcher.resume_revisions().clone()));
                    tokio::time::sleep(RETRY_AFTER).await;
                }
            }
        }
        if compacted.is_none() {
            each(&|log| log.resumes += 1);
        }
    }
}

/// Lists every key through etcd's API, watches the prefix [`SUBTREE`] from the list's
/// revision + 1 and logs each put of a register of `logs`, until aborted; watches again from
/// the revision after its last event when the stream breaks, and lists again when the
/// watch is cancelled (a gap in every log, up to the list's answer: writes invoked before
/// it may be in the list rather than the watch). An event of a lower revision than one
/// before it on the stream is an order break (noted in the first log). Errors are noted in
/// every log.
async fn watch_etcd(mut client: etcd_client::Client, clock: HistoryClock, logs: Logs) {
    use etcd_client::{EventType, GetOptions, WatchOptions};
    let each = |note: &dyn Fn(&mut WatchLog)| logs.values().for_each(|log| note(&mut log.lock().expect("watch log")));
    let note = |error: String| {
        each(&|log| {
            log.last_error = Some(error.clone());
            log.keep(WatchError { at_ns: clock.now(), error: error.clone(), resume_revisions: BTreeMap::new() });
        })
    };
    // Where an order break is noted (the stream's, not one register's).
    let first_log = logs.values().next().cloned();
    let mut why = "the watch's start".to_string();
    // The revision to watch from; none: list first.
    let mut next: Option<i64> = None;
    loop {
        let start = match next {
            Some(start) => start,
            None => {
                // 1. The list: one linearizable range over every group; its revision is a
                //    valid start for a watch of all of them.
                let revision = match client.get(SUBTREE, Some(GetOptions::new().with_prefix().with_count_only())).await {
                    Ok(listed) => listed.header().map_or(0, |header| header.revision()),
                    Err(error) => {
                        note(format!("list: {error}"));
                        tokio::time::sleep(RETRY_AFTER).await;
                        continue;
                    }
                };
                // A write invoked before the list answered may be in the list rather than the
                // watch; one invoked after lands above the list's revision in its group.
                let listed_ns = clock.now();
                each(&|log| {
                    let after = log.delivered.len();
                    log.gaps.push(Gap { after, reopened_ns: listed_ns, error: why.clone() });
                });
                revision + 1
            }
        };
        next = Some(start);
        // 2. The watch from there.
        let mut stream = match client.watch(SUBTREE, Some(WatchOptions::new().with_prefix().with_start_revision(start))).await {
            Ok(opened) => opened,
            Err(error) => {
                note(format!("watch: {error}"));
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        let mut highest = 0;
        let ended = loop {
            match stream.message().await {
                Ok(Some(answer)) if answer.canceled() => {
                    // Compacted, or ended by the router: list again.
                    next = None;
                    break format!("cancelled: {}", answer.cancel_reason());
                }
                Ok(Some(answer)) => {
                    for event in answer.events() {
                        let Some(kv) = event.kv() else { continue };
                        // One revision order over every group: a lower revision after a
                        // higher one would be skipped by a resume from the higher + 1.
                        if kv.mod_revision() < highest {
                            if let Some(log) = &first_log {
                                log.lock().expect("watch log").order_breaks.push(format!(
                                    "{:?} at revision {} after revision {highest}",
                                    kv.key_str().unwrap_or("?"),
                                    kv.mod_revision()
                                ));
                            }
                        }
                        highest = highest.max(kv.mod_revision());
                        next = Some(highest + 1);
                        let Some(log) = kv.key_str().ok().and_then(|key| logs.get(key)) else { continue };
                        if event.event_type() != EventType::Put {
                            continue;
                        }
                        let revision = u64::try_from(kv.mod_revision()).unwrap_or(0);
                        let delivered = Delivered { group: 0, revision, value: kv.value().to_vec(), received_ns: clock.now() };
                        log.lock().expect("watch log").delivered.push(delivered);
                    }
                }
                // 3. A broken stream: watch again from the revision after the last event, as
                //    clientv3 does.
                Ok(None) => break "the watch stream ended".to_string(),
                Err(error) => break format!("the watch stream failed: {error}"),
            }
        };
        if let (Some(_), Some(log)) = (next, &first_log) {
            log.lock().expect("watch log").resumes += 1;
        }
        why = ended;
        note(why.clone());
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// One write of a register whose outcome was acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcknowledgedWrite {
    pub value: Vec<u8>,
    pub invoked_ns: u64,
    pub completed_ns: u64,
}

/// The writes of one register a watch of it is judged by. Values are unique per write, so
/// events are matched to writes by value. (`warden_loadgen::watch_check` matches by
/// revision, which the register clients do not learn for every write, and knows one group.)
#[derive(Clone, Debug, Default)]
pub struct RegisterWrites {
    /// Sets answered written and compare-and-swaps answered swapped, after the register's
    /// creation.
    pub acknowledged: Vec<AcknowledgedWrite>,
    /// Every value that may be the register's (those, the writes of unknown outcome and the
    /// initial value), with when its write was invoked (ns).
    pub possible: BTreeMap<Vec<u8>, u64>,
}

impl RegisterWrites {
    /// The writes of `register` in the register history `records`.
    pub fn of(register: &str, records: &[Record]) -> RegisterWrites {
        let mut writes = RegisterWrites::default();
        for (client, invoked_ns, completed_ns, input, output) in records {
            let (key, value, acknowledged) = match (input, output) {
                (KvInput::Put { key, value }, Some(KvOutput::Written)) => (key, value, true),
                (KvInput::Cas { key, new, .. }, Some(KvOutput::Swapped(true))) => (key, new, true),
                (KvInput::Put { key, value }, None) | (KvInput::Cas { key, new: value, .. }, None) => (key, value, false),
                _ => continue,
            };
            if key.as_slice() != register.as_bytes() {
                continue;
            }
            writes.possible.insert(value.clone(), *invoked_ns);
            if let (true, Some(completed_ns)) = (acknowledged && *client != SET_UP_CLIENT, completed_ns) {
                writes.acknowledged.push(AcknowledgedWrite { value: value.clone(), invoked_ns: *invoked_ns, completed_ns: *completed_ns });
            }
        }
        writes
    }

    /// Whether a watcher whose log is `log` has nothing more to deliver of a register whose
    /// final value is `last`: it delivered it, or it is the initial value (written before any
    /// watch starts), or its write was invoked before the watcher's latest compaction gap
    /// reopened the watch from then on (the write may lie before the new watch's start).
    fn caught_up(&self, last: &[u8], log: &WatchLog) -> bool {
        let written_before_reopen = || {
            let (Some(gap), Some(&invoked_ns)) = (log.gaps.last(), self.possible.get(last)) else { return false };
            invoked_ns < gap.reopened_ns
        };
        last == super::INITIAL_VALUE || log.delivered.iter().any(|d| d.value == last) || written_before_reopen()
    }

    /// Whether `write` may have been lost in `gap` of a watcher whose events are
    /// `delivered`: its revision may lie between the last event before the gap and the new
    /// watch's start. It was invoked before the new watch was opened (a write
    /// invoked after has a later revision), and answered after the write of that last event
    /// was invoked (one answered before has an earlier revision).
    fn excused(&self, write: &AcknowledgedWrite, gap: &Gap, delivered: &[Delivered]) -> bool {
        let last_before = gap.after.checked_sub(1).map(|last| &delivered[last].value);
        let after_ns = last_before.and_then(|value| self.possible.get(value)).copied().unwrap_or(0);
        write.invoked_ns < gap.reopened_ns && write.completed_ns > after_ns
    }
}

/// What is wrong with what one watcher delivered, given its register's `writes` (`now_ns`
/// stamps a stall): an event whose revision is not above an earlier one of its group
/// (`watch-out-of-order`), a value delivered twice (`watch-repeated`), a value nobody wrote
/// (`watch-phantom`), an acknowledged write not delivered and not excused by a compaction
/// gap (`watch-missed`), a watcher that ended or fell behind (`watch-stalled`: its missed
/// writes are not listed besides).
pub fn watch_anomalies(log: &WatchLog, writes: &RegisterWrites, now_ns: u64) -> Vec<Anomaly> {
    let name = &log.name;
    let mut anomalies = Vec::new();
    let mut anomaly = |kind, detail: String, at_ns: u64| anomalies.push(Anomaly { kind, detail, at_ms: Some(at_ns / 1_000_000) });
    let mut highest: BTreeMap<u64, &Delivered> = BTreeMap::new();
    let mut seen: BTreeMap<&[u8], &Delivered> = BTreeMap::new();
    for event in &log.delivered {
        if let Some(first) = seen.insert(&event.value, event) {
            anomaly("watch-repeated", format!("{name}: {:?} delivered twice: {first:?}, then {event:?}", value(&event.value)), event.received_ns);
            continue;
        }
        if !writes.possible.contains_key(&event.value) {
            anomaly("watch-phantom", format!("{name}: {event:?} carries a value nobody wrote"), event.received_ns);
        }
        match highest.get(&event.group) {
            Some(earlier) if earlier.revision >= event.revision => {
                anomaly("watch-out-of-order", format!("{name}: {event:?} after {earlier:?} of the same group"), event.received_ns);
            }
            _ => {
                highest.insert(event.group, event);
            }
        }
    }
    for order_break in &log.order_breaks {
        anomaly("watch-out-of-order", format!("{name}: {order_break}"), now_ns);
    }
    if let Some(stalled) = &log.stalled {
        anomaly("watch-stalled", format!("{name}: {stalled}"), now_ns);
        return anomalies;
    }
    for write in &writes.acknowledged {
        if seen.contains_key(write.value.as_slice()) || log.gaps.iter().any(|gap| writes.excused(write, gap, &log.delivered)) {
            continue;
        }
        anomaly(
            "watch-missed",
            format!("{name}: the acknowledged write of {:?} was not delivered ({write:?})", value(&write.value)),
            write.completed_ns,
        );
    }
    anomalies
}

fn value(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(value: &str, invoked_ns: u64, completed_ns: Option<u64>) -> Record {
        let input = KvInput::Put { key: b"/d/r0".to_vec(), value: value.into() };
        (0, invoked_ns, completed_ns, input, completed_ns.map(|_| KvOutput::Written))
    }

    fn event(group: u64, revision: u64, value: &str) -> Delivered {
        Delivered { group, revision, value: value.into(), received_ns: revision * 1_000 }
    }

    fn kinds(log: &WatchLog, records: &[Record]) -> Vec<&'static str> {
        watch_anomalies(log, &RegisterWrites::of("/d/r0", records), 0).into_iter().map(|a| a.kind).collect()
    }

    /// Three acknowledged writes, one of unknown outcome, one of another register.
    fn records() -> Vec<Record> {
        let other = (1, 0, Some(1), KvInput::Put { key: b"/a/r0".to_vec(), value: b"x".to_vec() }, Some(KvOutput::Written));
        let cas = (
            2,
            30,
            Some(40),
            KvInput::Cas { key: b"/d/r0".to_vec(), expected: Some(b"b".to_vec()), new: b"c".to_vec() },
            Some(KvOutput::Swapped(true)),
        );
        vec![put("a", 10, Some(20)), put("b", 20, Some(30)), cas, put("unknown", 35, None), other]
    }

    fn log(delivered: Vec<Delivered>) -> WatchLog {
        WatchLog { name: "following /d/r0".into(), delivered, ..WatchLog::default() }
    }

    #[test]
    fn a_clean_delivery_shows_no_anomaly_and_a_move_to_another_group_is_in_order() {
        assert_eq!(kinds(&log(vec![event(4, 7, "a"), event(4, 8, "b"), event(9, 3, "c")]), &records()), Vec::<&str>::new());
        // A write of unknown outcome may appear.
        let with_unknown = vec![event(4, 7, "a"), event(4, 8, "b"), event(4, 9, "unknown"), event(4, 10, "c")];
        assert_eq!(kinds(&log(with_unknown), &records()), Vec::<&str>::new());
    }

    #[test]
    fn each_anomaly_kind_is_reported() {
        let records = records();
        assert_eq!(kinds(&log(vec![event(4, 7, "a"), event(4, 9, "c")]), &records), ["watch-missed"]);
        assert_eq!(kinds(&log(vec![event(4, 7, "a"), event(4, 8, "b"), event(4, 8, "b"), event(4, 9, "c")]), &records), ["watch-repeated"]);
        assert_eq!(kinds(&log(vec![event(4, 8, "b"), event(4, 7, "a"), event(4, 9, "c")]), &records), ["watch-out-of-order"]);
        let phantom = vec![event(4, 7, "a"), event(4, 8, "b"), event(4, 9, "x"), event(4, 10, "c")];
        assert_eq!(kinds(&log(phantom), &records), ["watch-phantom"]);
        let stalled = WatchLog { stalled: Some("the watch ended".into()), ..log(vec![event(4, 7, "a")]) };
        assert_eq!(kinds(&stalled, &records), ["watch-stalled"], "a stalled watcher's missed writes are not listed besides");
    }

    /// A watcher compacted away and reopened from now cannot deliver a final value written
    /// before it reopened, and is not waited for; one written after it reopened it must deliver.
    #[test]
    fn a_final_value_written_before_a_compaction_reopened_the_watch_is_not_waited_for() {
        let writes = RegisterWrites::of("/d/r0", &records());
        let delivered_a = log(vec![event(4, 7, "a")]);
        assert!(!writes.caught_up(b"c", &delivered_a), "`c` is still to come");
        assert!(writes.caught_up(b"a", &delivered_a), "the final value was delivered");
        // `c` was invoked at 30 ns.
        let reopened_after = WatchLog { gaps: vec![Gap { after: 1, reopened_ns: 31, error: "compacted".into() }], ..delivered_a.clone() };
        assert!(writes.caught_up(b"c", &reopened_after), "`c` may lie before the new watch's start");
        let reopened_before = WatchLog { gaps: vec![Gap { after: 1, reopened_ns: 29, error: "compacted".into() }], ..delivered_a };
        assert!(!writes.caught_up(b"c", &reopened_before), "a write invoked after the reopen must be delivered");
    }

    #[test]
    fn a_compaction_gap_excuses_only_the_writes_that_may_fall_in_it() {
        let records = records();
        // After `a` was delivered the watch was compacted and opened again at 25 ns: `b`
        // (invoked at 20) may have fallen in the gap, `c` (invoked at 30) may not.
        let gap = Gap { after: 1, reopened_ns: 25, error: "compacted".into() };
        let gapped = WatchLog { gaps: vec![gap.clone()], ..log(vec![event(4, 7, "a"), event(4, 9, "c")]) };
        assert_eq!(kinds(&gapped, &records), Vec::<&str>::new());
        let missed_after = WatchLog { gaps: vec![gap], ..log(vec![event(4, 7, "a"), event(4, 8, "b")]) };
        assert_eq!(kinds(&missed_after, &records), ["watch-missed"]);
        // Nor one answered before the last event's write was invoked.
        let late_gap = Gap { after: 1, reopened_ns: 45, error: "compacted".into() };
        let missed_before = WatchLog { gaps: vec![late_gap], ..log(vec![event(4, 8, "b"), event(4, 9, "c")]) };
        assert_eq!(kinds(&missed_before, &records), ["watch-missed"], "`a` was answered before `b`'s write began");
    }
}
