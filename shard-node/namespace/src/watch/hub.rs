//! The watch hub of one replica of a group: its event history and its live watches.
//!
//! The state machine publishes each applied revision's events here once the apply write is
//! done; the hub appends them to a bounded history and pushes them to the live watches
//! indexed by watched path. A watch that starts in the past first catches up from the
//! history (driven by its stream, a budget at a time), then joins the index under the same
//! lock, so it sees every revision exactly once.
//!
//! A subtree that moves to another group (a split) produces no events here: its watches end
//! with MOVED at the move's revision instead ([`WatchHub::transferred`]), live ones at once
//! and catching-up ones once they have every event up to it, so a watch resumed at the new
//! group from the revision after misses nothing and repeats nothing. A subtree that moves in
//! has its earlier events in the group it came from: a watch starting here before the
//! move-in, or after it with a place in that group before the hand-over, starts only if its
//! creator received every event of that group up to the hand-over (its resume revisions say
//! so), else it ends COMPACTED rather than skip them.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use warden_proto::namespace::{MovedSubtree, MovedSubtrees};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use super::event::{EventBatch, WatchSpec};
use super::stream::{Phase, Pushed, WatchStream};
use super::WatchLimits;
use crate::error::error;
use crate::path;

/// A live watch in the index.
struct Watcher {
    stream: Arc<WatchStream>,
    watch_id: u64,
    spec: WatchSpec,
    /// Revisions before this are not reported (a watch may start in the future).
    from_revision: u64,
}

struct HubState {
    history: VecDeque<Arc<EventBatch>>,
    history_bytes: usize,
    /// Events up to this revision are gone from the history.
    compact_revision: u64,
    /// The last revision applied and published.
    revision: u64,
    /// Live watches by watched path.
    watchers: HashMap<Arc<str>, Vec<Watcher>>,
    /// Live recursive watches (when none, only an event's own path and parent are looked up).
    recursive: usize,
    /// The replica is gone: no watch starts or goes on here.
    closed: bool,
    /// The latest subtrees moved out or in, for watches still catching up from before one
    /// and watches whose creator has not seen a group's events up to a move-in.
    transfers: Transfers,
    /// The version of the paths the replica serves (`GroupDescriptor.version`) as of the
    /// published revision, set after the transfers that came with it.
    paths_version: u64,
}

/// Transfers a hub remembers (a transfer's history is bounded like every other).
const TRANSFERS_REMEMBERED: usize = 16;

/// A group's latest transfers, oldest first, at most [`TRANSFERS_REMEMBERED`]. The state
/// machine keeps them on disk (`MovedSubtrees`), so a replica that restarted or installed a
/// snapshot judges watches against the moves before its event history as before; its hub
/// keeps the same list (see [`WatchHub::restore_transfers`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    recent: VecDeque<Transfer>,
    /// The revision of the latest transfer forgotten: a watch from at or before it may have
    /// missed one, and ends COMPACTED.
    forgotten_through: u64,
}

impl Transfers {
    /// Remembers `transfer`, the latest, forgetting the oldest past the bound.
    pub fn push(&mut self, transfer: Transfer) {
        if self.recent.len() == TRANSFERS_REMEMBERED {
            if let Some(forgotten) = self.recent.pop_front() {
                self.forgotten_through = forgotten.revision;
            }
        }
        self.recent.push_back(transfer);
    }

    /// As stored.
    pub fn to_proto(&self) -> MovedSubtrees {
        let moves = self
            .recent
            .iter()
            .map(|t| {
                let (to_group, from_group, handed_at) = match t.direction {
                    Direction::Out { to_group } => (to_group, 0, 0),
                    Direction::In { from_group, handed_at } => (0, from_group, handed_at),
                };
                MovedSubtree { prefix: t.prefix.clone(), revision: t.revision, to_group, from_group, handed_at }
            })
            .collect();
        MovedSubtrees { moves, forgotten_through: self.forgotten_through }
    }

    /// From the stored record (one longer than the bound, written by another build, keeps its
    /// latest and forgets the rest).
    pub fn from_proto(stored: MovedSubtrees) -> Transfers {
        let mut transfers = Transfers { recent: VecDeque::new(), forgotten_through: stored.forgotten_through };
        for moved in stored.moves {
            let direction = match moved.to_group {
                0 => Direction::In { from_group: moved.from_group, handed_at: moved.handed_at },
                to_group => Direction::Out { to_group },
            };
            transfers.push(Transfer { prefix: moved.prefix, revision: moved.revision, direction });
        }
        transfers
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &Transfer> {
        self.recent.iter()
    }
}

/// A subtree that left the group or came into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The subtree's root.
    pub prefix: String,
    /// This group's revision of the hand-over (out), or of the descriptor that made the group
    /// serve the subtree (in): the subtree's events here are before it (out), after it (in).
    pub revision: u64,
    /// Which way, and with which group.
    pub direction: Direction,
}

/// Which way a subtree moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Handed to `to_group`.
    Out {
        /// The group serving it from now on.
        to_group: u64,
    },
    /// Taken from `from_group`, which handed it over at its revision `handed_at` or before
    /// (the descriptor's revision floor).
    In {
        /// The group that served it before (0: not known).
        from_group: u64,
        /// The revision of `from_group` by which it had handed the subtree over.
        handed_at: u64,
    },
}

impl Transfer {
    /// Whether a watch of `path` with `spec` watches into the subtree.
    fn concerns(&self, path: &str, spec: &WatchSpec) -> bool {
        warden_placement::is_at_or_below(path, &self.prefix) || (spec.is_recursive() && warden_placement::is_strictly_below(&self.prefix, path))
    }

    /// The cancellation of a watch of a subtree that moved out to `to_group`.
    fn moved_error(&self, to_group: u64) -> WardenError {
        WardenError {
            moved_to_group: to_group,
            ..error(Code::Moved, &self.prefix, format!("{} moved to group {to_group}: watch again from the resume revision", self.prefix))
        }
    }
}

/// How a catch-up step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// The watch reached the present and is live.
    Live,
    /// The budget ran out first: call again when the stream has room.
    More,
    /// The watch ended (fired, cancelled, or gone from its stream).
    Ended,
}

/// The watch hub of one replica of a group.
pub struct WatchHub {
    group: u64,
    limits: WatchLimits,
    state: Mutex<HubState>,
    /// The watch limits of the quotas on the group's subtree, by prefix (from its shares).
    watch_limits: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Where the events sent and the slow watchers cancelled are counted (its node's).
    counters: std::sync::OnceLock<Arc<super::WatchCounters>>,
}

impl WatchHub {
    /// An empty hub of `group`.
    pub fn new(group: u64, limits: WatchLimits) -> Arc<WatchHub> {
        Arc::new(WatchHub {
            group,
            limits,
            state: Mutex::new(HubState {
                history: VecDeque::new(),
                history_bytes: 0,
                compact_revision: 0,
                revision: 0,
                watchers: HashMap::new(),
                recursive: 0,
                closed: false,
                transfers: Transfers::default(),
                paths_version: 0,
            }),
            watch_limits: Mutex::default(),
            counters: std::sync::OnceLock::new(),
        })
    }

    /// Replaces the watch limits of the group's quotas (the state machine's, on every change).
    pub fn set_watch_limits(&self, limits: std::collections::BTreeMap<String, u64>) {
        *self.watch_limits.lock().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// The watch limits of the quotas at `path` or above it: `(prefix, limit)`.
    pub fn watch_limits_covering(&self, path: &str) -> Vec<(String, u64)> {
        let limits = self.watch_limits.lock().unwrap_or_else(|e| e.into_inner());
        if limits.is_empty() {
            return Vec::new();
        }
        let mut covering = Vec::new();
        let mut at = Some(path);
        while let Some(current) = at {
            if let Some(limit) = limits.get(current) {
                covering.push((current.to_string(), *limit));
            }
            at = path::parent(current);
        }
        covering
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// The last published revision.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// The version of the paths the replica serves as of the published revision: every
    /// transfer up to it is known here (see [`WatchHub::paths_published`]).
    pub fn paths_version(&self) -> u64 {
        self.lock().paths_version
    }

    /// The replica serves version `version` of its group's paths as of the published
    /// revision. Called after the [`WatchHub::transferred`] of every move up to it, so a watch
    /// created by a router that routed by this version (or an older one) meets every move it
    /// knows of.
    pub fn paths_published(&self, version: u64) {
        self.lock().paths_version = version;
    }

    /// Events up to this revision are no longer in the history.
    pub fn compact_revision(&self) -> u64 {
        self.lock().compact_revision
    }

    /// Counts this hub's events and cancels into `counters` (its node's), from now on.
    pub fn count_into(&self, counters: Arc<super::WatchCounters>) {
        let _ = self.counters.set(counters);
    }

    /// Revisions and bytes in the history, and live watches.
    pub fn stats(&self) -> (usize, usize, usize) {
        let state = self.lock();
        (state.history.len(), state.history_bytes, state.watchers.values().map(Vec::len).sum())
    }

    /// Publishes the events of applied revisions (in revision order) and the applied
    /// revision (which also moves on for writes that changed no node).
    pub fn publish(&self, batches: Vec<EventBatch>, revision: u64) {
        let mut state = self.lock();
        for batch in batches {
            assert!(batch.revision > state.revision, "group {}: event revision {} after {}", self.group, batch.revision, state.revision);
            let batch = Arc::new(batch);
            self.deliver(&mut state, &batch);
            state.revision = batch.revision;
            state.history_bytes += batch.size_bytes();
            state.history.push_back(batch);
        }
        assert!(revision >= state.revision, "group {}: revision went back", self.group);
        state.revision = revision;
        while state.history.len() > self.limits.history_revisions_max || state.history_bytes > self.limits.history_bytes_max {
            let Some(oldest) = state.history.pop_front() else { break };
            state.history_bytes -= oldest.size_bytes();
            state.compact_revision = oldest.revision;
        }
    }

    /// Pushes one revision's events to the live watches that want them.
    fn deliver(&self, state: &mut HubState, batch: &Arc<EventBatch>) {
        if state.watchers.is_empty() {
            return;
        }
        // The watched paths an event can concern: its own, its parent's (children watches)
        // and, with recursive watches, every ancestor's.
        let mut candidates: BTreeSet<&str> = BTreeSet::new();
        for event in &batch.events {
            candidates.insert(&event.path);
            let mut at = path::parent(&event.path);
            while let Some(ancestor) = at {
                candidates.insert(ancestor);
                at = if state.recursive > 0 { path::parent(ancestor) } else { None };
            }
        }
        let mut removed_recursive = 0;
        for candidate in candidates {
            let Some(watchers) = state.watchers.get_mut(candidate) else { continue };
            watchers.retain(|watcher| {
                if batch.revision < watcher.from_revision {
                    return true;
                }
                let selected = watcher.spec.select(candidate, batch);
                if selected.is_empty() {
                    return true;
                }
                let events = selected.len() as u64;
                let keep = match watcher.stream.push_events(watcher.watch_id, self.group, vec![(batch.clone(), selected)], None) {
                    Pushed::Queued => {
                        if let Some(counters) = self.counters.get() {
                            counters.events_sent.fetch_add(events, std::sync::atomic::Ordering::Relaxed);
                        }
                        true
                    }
                    Pushed::Fired | Pushed::Gone => false,
                    Pushed::Full => {
                        if let Some(counters) = self.counters.get() {
                            counters.slow_cancels.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        let error = error(Code::SlowWatcher, "", "the watch stream's queue is full: the client reads too slowly");
                        watcher.stream.cancel(watcher.watch_id, Some(error), batch.revision);
                        false
                    }
                };
                if !keep && watcher.spec.is_recursive() {
                    removed_recursive += 1;
                }
                keep
            });
            if watchers.is_empty() {
                state.watchers.remove(candidate);
            }
        }
        state.recursive -= removed_recursive;
    }

    /// Moves a catching-up watch of `stream` on through the history, queueing at most about
    /// `budget_bytes` of events; once it reaches the present it joins the index (under the
    /// same lock as publishing, so no revision is missed or repeated).
    pub fn catch_up(&self, stream: &Arc<WatchStream>, watch_id: u64, budget_bytes: usize) -> CatchUp {
        let mut state = self.lock();
        let Some(watch) = stream.watch(watch_id).filter(|w| w.group == self.group) else { return CatchUp::Ended };
        let Phase::CatchingUp { next_revision } = watch.phase else { return CatchUp::Live };
        if state.closed {
            stream.cancel(watch_id, Some(replica_gone()), next_revision);
            return CatchUp::Ended;
        }
        if next_revision <= state.compact_revision || next_revision <= state.transfers.forgotten_through {
            let compact_revision = state.compact_revision.max(state.transfers.forgotten_through);
            let error = WardenError {
                compact_revision,
                ..error(Code::Compacted, "", format!("revision {next_revision} is no longer in this replica's event history"))
            };
            stream.cancel(watch_id, Some(error), next_revision);
            return CatchUp::Ended;
        }
        let concerning = || state.transfers.iter().filter(|t| t.concerns(&watch.path, &watch.spec));
        // 1. A move out this watch has not passed yet: it catches up to the move, then ends
        //    MOVED.
        let pending_move = concerning().find_map(|t| match t.direction {
            Direction::Out { to_group } if t.revision >= next_revision => Some((t.revision, t.moved_error(to_group))),
            _ => None,
        });
        // 2. A move in: the subtree's earlier events are in the group it came from, which
        //    serves it no more (so no part of the watch is there). Unless the watch's creator
        //    received all of them, going on here would skip them: from before the move-in,
        //    a creator that never watched that group did not; from after it (this group's
        //    part ran past the move-in while the part there broke first), one whose place
        //    there is before the hand-over did not.
        let stop_at = pending_move.as_ref().map_or(u64::MAX, |(revision, _)| *revision);
        let unseen = concerning().find_map(|t| match t.direction {
            Direction::In { from_group, handed_at } => {
                let received = watch.resume_revisions.get(&from_group);
                let missed = if (next_revision..stop_at).contains(&t.revision) {
                    received.is_none_or(|next| *next <= handed_at)
                } else {
                    t.revision < next_revision && received.is_some_and(|next| *next <= handed_at)
                };
                missed.then_some((t, from_group))
            }
            Direction::Out { .. } => None,
        });
        if let Some((t, from)) = unseen {
            let message = format!(
                "{} moved here from group {from} at revision {}: this watch's events before it are in that group, and not all were received",
                t.prefix, t.revision
            );
            stream.cancel(watch_id, Some(WardenError { compact_revision: t.revision, ..error(Code::Compacted, &t.prefix, message) }), next_revision);
            return CatchUp::Ended;
        }
        // 3. The watched path left the group before the watch's start and did not come back
        //    (its creation read the path just before the hand-over): it ends MOVED at once.
        if pending_move.is_none() {
            let last = concerning().rfind(|t| warden_placement::is_at_or_below(&watch.path, &t.prefix));
            if let Some(t @ Transfer { direction: Direction::Out { to_group }, .. }) = last {
                stream.cancel(watch_id, Some(t.moved_error(*to_group)), next_revision.max(t.revision + 1));
                return CatchUp::Ended;
            }
        }
        let move_error = pending_move.map(|(revision, error)| (error, revision + 1));
        let first = state.history.partition_point(|batch| batch.revision < next_revision);
        let mut batches = Vec::new();
        let mut bytes = 0;
        let mut next = next_revision;
        let mut exhausted = true;
        for batch in state.history.range(first..).take_while(|batch| batch.revision <= stop_at) {
            if watch.spec.is_one_shot() && !batches.is_empty() {
                exhausted = false;
                break;
            }
            let selected = watch.spec.select(&watch.path, batch);
            let size_bytes: usize = selected.iter().map(|i| batch.events[*i as usize].size_bytes()).sum();
            // Always at least one revision, so a watch moves on whatever its events' size.
            if !batches.is_empty() && bytes + size_bytes > budget_bytes {
                exhausted = false;
                break;
            }
            next = batch.revision + 1;
            if !selected.is_empty() {
                bytes += size_bytes;
                batches.push((batch.clone(), selected));
            }
        }
        if exhausted {
            // Every revision up to the present was looked at (revisions without events are
            // not in the history); a start in the future stays where it is.
            next = next.max(state.revision + 1);
        }
        if let (true, Some((error, resume_revision))) = (exhausted, move_error) {
            // Every event up to the move is queued first (the queue keeps order).
            return match stream.push_events(watch_id, self.group, batches, Some(Phase::CatchingUp { next_revision: resume_revision })) {
                Pushed::Queued => {
                    stream.cancel(watch_id, Some(error), resume_revision);
                    CatchUp::Ended
                }
                Pushed::Fired | Pushed::Gone => CatchUp::Ended,
                // The queue is full and the watch stays where it was: try again later.
                Pushed::Full => CatchUp::More,
            };
        }
        let phase = if exhausted { Phase::Live } else { Phase::CatchingUp { next_revision: next } };
        match stream.push_events(watch_id, self.group, batches, Some(phase)) {
            Pushed::Queued if exhausted => {
                let watcher = Watcher { stream: stream.clone(), watch_id, spec: watch.spec.clone(), from_revision: next };
                state.recursive += usize::from(watch.spec.is_recursive());
                // Most paths have one watcher: a Vec's first push would reserve four.
                state.watchers.entry(watch.path.clone()).or_insert_with(|| Vec::with_capacity(1)).push(watcher);
                CatchUp::Live
            }
            Pushed::Queued => CatchUp::More,
            Pushed::Fired | Pushed::Gone => CatchUp::Ended,
            // The budget is taken from the free space, so this is a race with another group's
            // hub filling the queue: the watch stays where it was, to try again later.
            Pushed::Full => CatchUp::More,
        }
    }

    /// Takes a live watch out of the index (the client cancelled it or went away).
    pub fn remove(&self, path: &str, stream: &Arc<WatchStream>, watch_id: u64) {
        let mut state = self.lock();
        let Some(watchers) = state.watchers.get_mut(path) else { return };
        let before = watchers.len();
        let mut recursive = 0;
        watchers.retain(|w| {
            let matches = w.watch_id == watch_id && Arc::ptr_eq(&w.stream, stream);
            recursive += usize::from(matches && w.spec.is_recursive());
            !matches
        });
        debug_assert!(before - watchers.len() <= 1, "one watch id twice in the index");
        if watchers.is_empty() {
            state.watchers.remove(path);
        }
        state.recursive -= recursive;
    }

    /// Queues a progress response at the published revision for each of `watch_ids` that is
    /// live: every event up to that revision is queued before it. Periodic ones (not
    /// `requested` by the client) only when they fit the stream's queue.
    pub fn progress(&self, stream: &WatchStream, watch_ids: &[u64], requested: bool) {
        let state = self.lock();
        for watch_id in watch_ids {
            stream.push_progress(*watch_id, self.group, state.revision, requested);
        }
    }

    /// The replica's state was (re)loaded at `revision` (start, or a snapshot installed):
    /// the history starts over. Live watches that would miss the revisions the state jumped
    /// over are cancelled with COMPACTED.
    pub fn reset(&self, revision: u64) {
        let mut state = self.lock();
        if revision != state.revision {
            let resume_revision = state.revision + 1;
            let error = WardenError {
                compact_revision: revision,
                ..error(Code::Compacted, "", "this replica installed a snapshot: the events it skipped are not available here")
            };
            cancel_all(&mut state, &error, resume_revision);
        }
        state.history.clear();
        state.history_bytes = 0;
        state.compact_revision = revision;
        state.revision = revision;
    }

    /// A subtree moved out or in at `transfer.revision` (published already). Moving out to
    /// a group, every live watch into it ends with MOVED, to resume from the revision after
    /// — in that group for paths in the subtree, here for the rest (the subtree did not
    /// change between this group's move revision and the new group's first one). Either way
    /// the transfer is remembered for watches still catching up from before it.
    pub fn transferred(&self, transfer: Transfer) {
        let mut state = self.lock();
        if let Direction::Out { to_group } = transfer.direction {
            let error = transfer.moved_error(to_group);
            let revision = transfer.revision;
            let mut removed_recursive = 0;
            state.watchers.retain(|path, watchers| {
                watchers.retain(|watcher| {
                    if !transfer.concerns(path, &watcher.spec) {
                        return true;
                    }
                    removed_recursive += usize::from(watcher.spec.is_recursive());
                    watcher.stream.cancel(watcher.watch_id, Some(error.clone()), (revision + 1).max(watcher.from_revision));
                    false
                });
                !watchers.is_empty()
            });
            state.recursive -= removed_recursive;
        }
        state.transfers.push(transfer);
    }

    /// The replica's state was (re)loaded (after [`WatchHub::reset`]): its transfers are the
    /// stored ones, those before its event history included.
    pub fn restore_transfers(&self, transfers: Transfers) {
        self.lock().transfers = transfers;
    }

    /// The replica is gone: every watch ends with UNAVAILABLE (resume elsewhere).
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let resume_revision = state.revision + 1;
        cancel_all(&mut state, &replica_gone(), resume_revision);
    }
}

fn replica_gone() -> WardenError {
    error(Code::Unavailable, "", "the replica serving this watch stopped")
}

fn cancel_all(state: &mut HubState, error: &WardenError, resume_revision: u64) {
    for (_, watchers) in state.watchers.drain() {
        for watcher in watchers {
            watcher.stream.cancel(watcher.watch_id, Some(error.clone()), resume_revision.max(watcher.from_revision));
        }
    }
    state.recursive = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::event::{node_state, Event, EventKind};
    use crate::watch::stream::{Outgoing, StreamWatch};
    use warden_proto::v1::watch_create::Kind as WatchKind;

    fn batch(revision: u64, paths: &[&str]) -> EventBatch {
        let events =
            paths.iter().map(|p| Event { kind: EventKind::Created, path: p.to_string(), node: node_state(None, vec![1; 10]), prev: None }).collect();
        EventBatch { revision, events }
    }

    fn limits() -> WatchLimits {
        WatchLimits { history_revisions_max: 4, ..WatchLimits::default() }
    }

    fn add(stream: &Arc<WatchStream>, watch_id: u64, path: &str, kind: WatchKind, recursive: bool, start: u64) {
        add_watch(stream, watch_id, path, kind, recursive, start, std::collections::BTreeMap::new());
    }

    /// A persistent watch whose creator received every event of each listed group before
    /// its revision there.
    fn add_resuming(stream: &Arc<WatchStream>, watch_id: u64, path: &str, recursive: bool, start: u64, resume_revisions: &[(u64, u64)]) {
        add_watch(stream, watch_id, path, WatchKind::Persistent, recursive, start, resume_revisions.iter().copied().collect());
    }

    fn out(prefix: &str, to_group: u64, revision: u64) -> Transfer {
        Transfer { prefix: prefix.into(), revision, direction: Direction::Out { to_group } }
    }

    fn moved_in(prefix: &str, from_group: u64, handed_at: u64, revision: u64) -> Transfer {
        Transfer { prefix: prefix.into(), revision, direction: Direction::In { from_group, handed_at } }
    }

    /// The code of the error that ended each cancelled watch, by watch id.
    fn cancel_codes(stream: &WatchStream) -> Vec<(u64, Code)> {
        let mut out = Vec::new();
        while let Some(outgoing) = stream.try_next() {
            if let Outgoing::Canceled { watch_id, error: Some(error), .. } = outgoing {
                out.push((watch_id, Code::try_from(error.code).unwrap_or(Code::Unknown)));
            }
        }
        out
    }

    fn add_watch(
        stream: &Arc<WatchStream>,
        watch_id: u64,
        path: &str,
        kind: WatchKind,
        recursive: bool,
        start: u64,
        resume_revisions: std::collections::BTreeMap<u64, u64>,
    ) {
        let watch = StreamWatch {
            group: 1,
            path: Arc::from(path),
            spec: WatchSpec::new(kind, recursive, false, false, false, false),
            phase: Phase::CatchingUp { next_revision: start },
            progress_notify: false,
            active: false,
            charge: None,
            resume_revisions: Arc::new(resume_revisions),
        };
        stream.add(watch_id, watch, Outgoing::Created { watch_id, group: 1, revision: start, created: Box::default() });
    }

    /// Drains the queue: (watch id, revisions) per event response; (watch id, [0, resume
    /// revision]) per cancellation.
    fn drain(stream: &WatchStream) -> Vec<(u64, Vec<u64>)> {
        let mut out = Vec::new();
        while let Some(outgoing) = stream.try_next() {
            match outgoing {
                Outgoing::Events { watch_id, batches, .. } => out.push((watch_id, batches.iter().map(|(b, _)| b.revision).collect())),
                Outgoing::Canceled { watch_id, resume_revision, .. } => out.push((watch_id, vec![0, resume_revision])),
                Outgoing::Created { .. } | Outgoing::Progress { .. } => {}
            }
        }
        out
    }

    fn stream_limit() -> usize {
        WatchLimits::default().stream_queue_bytes_max
    }

    #[test]
    fn a_watch_from_the_past_catches_up_then_goes_live_without_gap_or_repeat() {
        let hub = WatchHub::new(1, limits());
        hub.publish(vec![batch(1, &["/a"]), batch(2, &["/b"]), batch(3, &["/a/x"])], 3);
        let stream = WatchStream::new(stream_limit());
        add(&stream, 1, "/a", WatchKind::Persistent, true, 1);
        assert_eq!(hub.catch_up(&stream, 1, 1), CatchUp::More, "a tiny budget moves one revision at a time");
        assert_eq!(hub.catch_up(&stream, 1, 1 << 20), CatchUp::Live);
        hub.publish(vec![batch(4, &["/a/y", "/a/z"])], 4);
        assert_eq!(drain(&stream), vec![(1, vec![1]), (1, vec![3]), (1, vec![4])]);
    }

    #[test]
    fn old_start_revisions_are_compacted_and_future_ones_wait() {
        let hub = WatchHub::new(1, limits());
        for revision in 1..=6 {
            hub.publish(vec![batch(revision, &["/a"])], revision);
        }
        assert_eq!(hub.compact_revision(), 2, "four revisions kept");
        let stream = WatchStream::new(stream_limit());
        add(&stream, 1, "/a", WatchKind::Persistent, false, 2);
        assert_eq!(hub.catch_up(&stream, 1, 1 << 20), CatchUp::Ended);
        assert_eq!(drain(&stream), vec![(1, vec![0, 2])], "cancelled with its start as resume revision");
        add(&stream, 2, "/a", WatchKind::Persistent, false, 9);
        assert_eq!(hub.catch_up(&stream, 2, 1 << 20), CatchUp::Live);
        hub.publish(vec![batch(7, &["/a"]), batch(8, &["/a"])], 8);
        assert!(drain(&stream).is_empty(), "revisions before the start are not reported");
        hub.publish(vec![batch(9, &["/a"])], 9);
        assert_eq!(drain(&stream), vec![(2, vec![9])]);
    }

    #[test]
    fn one_shot_watches_fire_once_and_children_watches_see_only_children() {
        let hub = WatchHub::new(1, limits());
        let stream = WatchStream::new(stream_limit());
        add(&stream, 1, "/p", WatchKind::Children, false, 1);
        add(&stream, 2, "/p", WatchKind::Exists, false, 1);
        assert_eq!(hub.catch_up(&stream, 1, 1 << 20), CatchUp::Live);
        assert_eq!(hub.catch_up(&stream, 2, 1 << 20), CatchUp::Live);
        hub.publish(vec![batch(1, &["/p/q/r"])], 1);
        hub.publish(vec![batch(2, &["/p/c", "/p/d"])], 2);
        hub.publish(vec![batch(3, &["/p/e"]), batch(4, &["/p"])], 4);
        assert_eq!(drain(&stream), vec![(1, vec![2]), (2, vec![4])]);
        assert_eq!(hub.stats().2, 0, "fired watches leave the index");
    }

    #[test]
    fn a_slow_stream_loses_the_watch_with_a_resume_revision() {
        let hub = WatchHub::new(1, limits());
        let stream = WatchStream::new(400);
        add(&stream, 1, "/a", WatchKind::Persistent, false, 1);
        assert_eq!(hub.catch_up(&stream, 1, 1 << 20), CatchUp::Live);
        for revision in 1..=5 {
            hub.publish(vec![batch(revision, &["/a"])], revision);
        }
        let delivered = drain(&stream);
        let (last, cancel) = delivered.split_at(delivered.len() - 1);
        let next = last.last().map_or(1, |(_, revs)| revs[0] + 1);
        assert_eq!(cancel, &[(1, vec![0, next])], "resume exactly after the last delivered revision");
        assert_eq!(hub.stats().2, 0);
    }

    /// A moved subtree ends the watches into it with MOVED at the move's revision + 1: live
    /// ones at once, catching-up ones once they have every event up to the move; watches
    /// beside it, and ones that start after the move, go on.
    #[test]
    fn a_moved_subtree_ends_its_watches_after_every_event_up_to_the_move() {
        let hub = WatchHub::new(1, limits());
        hub.publish(vec![batch(1, &["/t/a"]), batch(2, &["/t/b"]), batch(3, &["/u"])], 3);
        let stream = WatchStream::new(stream_limit());
        add(&stream, 1, "/t/a", WatchKind::Persistent, false, 4);
        add(&stream, 2, "/", WatchKind::Persistent, true, 4);
        add(&stream, 3, "/u", WatchKind::Persistent, false, 4);
        add(&stream, 4, "/t", WatchKind::Persistent, true, 1);
        for live in 1..=3 {
            assert_eq!(hub.catch_up(&stream, live, 1 << 20), CatchUp::Live);
        }
        hub.publish(Vec::new(), 5);
        hub.transferred(out("/t", 9, 5));
        let moved = |watch_id: u64| (watch_id, vec![0, 6]);
        let mut cancelled = drain(&stream);
        cancelled.sort();
        assert_eq!(cancelled, vec![moved(1), moved(2)], "live watches into the subtree, and above it recursively");
        assert_eq!(hub.stats().2, 1, "the watch beside it stays");
        // Catching up from before the move: its events up to the move, then MOVED, in as
        // many steps as its budget takes.
        assert_eq!(hub.catch_up(&stream, 4, 1), CatchUp::More);
        assert_eq!(hub.catch_up(&stream, 4, 1 << 20), CatchUp::Ended);
        assert_eq!(drain(&stream), vec![(4, vec![1]), (4, vec![2]), moved(4)]);
        // A recursive watch above it that starts after the move goes live.
        add(&stream, 5, "/", WatchKind::Persistent, true, 6);
        assert_eq!(hub.catch_up(&stream, 5, 1 << 20), CatchUp::Live);
        hub.publish(vec![batch(6, &["/u"])], 6);
        let mut delivered = drain(&stream);
        delivered.sort();
        assert_eq!(delivered, vec![(3, vec![6]), (5, vec![6])]);
    }

    /// A subtree that moved in at revision 10 from group 9 (handed over there at 7): a watch
    /// into it from before 10 starts only if its creator received group 9's events through
    /// 7; else it ends COMPACTED rather than skip them. One from after 10 needs nothing.
    #[test]
    fn a_watch_from_before_its_subtree_moved_in_starts_only_if_the_old_groups_events_were_received() {
        let hub = WatchHub::new(1, limits());
        hub.publish(vec![batch(3, &["/u"])], 9);
        hub.publish(Vec::new(), 10);
        hub.transferred(moved_in("/t", 9, 7, 10));
        hub.publish(vec![batch(11, &["/t/a"])], 11);
        let stream = WatchStream::new(stream_limit());
        add_resuming(&stream, 1, "/t/a", false, 4, &[]);
        add_resuming(&stream, 2, "/t/a", false, 4, &[(9, 7)]);
        add_resuming(&stream, 3, "/", true, 4, &[(1, 4), (9, 6)]);
        add_resuming(&stream, 4, "/t/a", false, 4, &[(9, 8)]);
        add_resuming(&stream, 5, "/", true, 4, &[(1, 4), (9, 8)]);
        add_resuming(&stream, 6, "/t/a", false, 11, &[]);
        add_resuming(&stream, 7, "/u", false, 3, &[]);
        for missed in 1..=3 {
            assert_eq!(hub.catch_up(&stream, missed, 1 << 20), CatchUp::Ended);
        }
        assert_eq!(cancel_codes(&stream), vec![(1, Code::Compacted), (2, Code::Compacted), (3, Code::Compacted)]);
        for seen in 4..=7 {
            assert_eq!(hub.catch_up(&stream, seen, 1 << 20), CatchUp::Live, "watch {seen}");
        }
        assert_eq!(drain(&stream), vec![(4, vec![11]), (5, vec![11]), (6, vec![11]), (7, vec![3])]);
    }

    /// A watch re-created after its subtree moved in at revision 10 from group 9 (handed over
    /// there at 7), from a revision here after the move-in (its part here ran past it), while
    /// its creator had group 9's events only up to 5 (its part there broke first): the events
    /// 5..=7 of group 9 are not here, and no part of the watch is in group 9 any more (the
    /// router spans the groups serving the subtree), so it ends COMPACTED rather than skip
    /// them. A creator that had them, one that never watched group 9, or a watch beside the
    /// subtree goes on.
    #[test]
    fn a_watch_from_after_its_subtree_moved_in_ends_compacted_if_the_old_groups_events_were_not_all_received() {
        let hub = WatchHub::new(1, limits());
        hub.publish(Vec::new(), 10);
        hub.transferred(moved_in("/t", 9, 7, 10));
        hub.publish(vec![batch(11, &["/t/a"]), batch(12, &["/u"])], 12);
        let stream = WatchStream::new(stream_limit());
        add_resuming(&stream, 1, "/", true, 12, &[(1, 12), (9, 5)]);
        add_resuming(&stream, 2, "/t/a", false, 12, &[(9, 7)]);
        add_resuming(&stream, 3, "/", true, 12, &[(1, 12), (9, 8)]);
        add_resuming(&stream, 4, "/", true, 12, &[(1, 12)]);
        add_resuming(&stream, 5, "/u", false, 12, &[(9, 5)]);
        for missed in 1..=2 {
            assert_eq!(hub.catch_up(&stream, missed, 1 << 20), CatchUp::Ended, "watch {missed}");
        }
        assert_eq!(cancel_codes(&stream), vec![(1, Code::Compacted), (2, Code::Compacted)]);
        for seen in 3..=5 {
            assert_eq!(hub.catch_up(&stream, seen, 1 << 20), CatchUp::Live, "watch {seen}");
        }
        hub.publish(vec![batch(13, &["/t/a", "/u"])], 13);
        assert_eq!(drain(&stream), vec![(3, vec![12]), (4, vec![12]), (5, vec![12]), (3, vec![13]), (4, vec![13]), (5, vec![13])]);
    }

    /// A watch whose path left the group before its start (created just as the hand-over
    /// applied) ends MOVED rather than wait here for events that never come; once the path
    /// is back, a watch of it goes live. A watch of the path from before a transfer the hub
    /// no longer remembers ends COMPACTED.
    #[test]
    fn a_watch_of_a_path_that_left_before_its_start_ends_moved() {
        let hub = WatchHub::new(1, limits());
        hub.publish(Vec::new(), 5);
        hub.transferred(out("/t", 9, 5));
        let stream = WatchStream::new(stream_limit());
        add_resuming(&stream, 1, "/t/a", false, 7, &[]);
        add_resuming(&stream, 2, "/u", true, 7, &[]);
        assert_eq!(hub.catch_up(&stream, 1, 1 << 20), CatchUp::Ended);
        assert_eq!(hub.catch_up(&stream, 2, 1 << 20), CatchUp::Live, "a path beside it is served");
        assert_eq!(drain(&stream), vec![(1, vec![0, 7])]);
        hub.publish(Vec::new(), 8);
        hub.transferred(moved_in("/t", 9, 7, 8));
        add_resuming(&stream, 3, "/t/a", false, 9, &[]);
        assert_eq!(hub.catch_up(&stream, 3, 1 << 20), CatchUp::Live, "back here");
        for n in 0..TRANSFERS_REMEMBERED as u64 {
            hub.publish(Vec::new(), 10 + n);
            hub.transferred(out(&format!("/x{n}"), 9, 10 + n));
        }
        add_resuming(&stream, 4, "/u", false, 8, &[]);
        assert_eq!(hub.catch_up(&stream, 4, 1 << 20), CatchUp::Ended);
        assert_eq!(cancel_codes(&stream), vec![(4, Code::Compacted)]);
    }

    #[test]
    fn reset_cancels_live_watches_that_would_miss_revisions() {
        let hub = WatchHub::new(1, limits());
        hub.reset(10);
        let stream = WatchStream::new(stream_limit());
        add(&stream, 1, "/", WatchKind::Persistent, true, 11);
        assert_eq!(hub.catch_up(&stream, 1, 1 << 20), CatchUp::Live);
        hub.publish(vec![batch(11, &["/x"])], 11);
        hub.reset(20);
        assert_eq!(drain(&stream), vec![(1, vec![11]), (1, vec![0, 12])]);
        hub.close();
        add(&stream, 2, "/", WatchKind::Persistent, true, 21);
        assert_eq!(hub.catch_up(&stream, 2, 1 << 20), CatchUp::Ended, "a closed hub starts nothing");
    }
}
