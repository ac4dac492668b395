//! One client `Watch` stream: the watches it carries and its bounded queue of responses.
//!
//! The hub pushes into the queue from the apply thread; the gRPC sender pops from it. The
//! queue is bounded in bytes: a watch whose events do not fit is cancelled (`SLOW_WATCHER`)
//! with the revision to resume from, so a client that stops reading costs at most the limit
//! (plus one response: an empty queue takes any one, so no event is too large to deliver).
//! Every response counts its encoded bytes (a creation answer may carry a 1 MiB read).
//! Creation answers, refusals and requested progress are always queued, but the driver reads
//! the client's next request only while the queue has room, so they overflow it by at most
//! one request's answers; periodic progress is queued only when it fits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use warden_proto::v1::{WardenError, WatchCreated};

use super::event::{EventBatch, WatchSpec};

/// Where a watch is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Reading the hub's history; the next revision to look at.
    CatchingUp {
        /// The next revision to look at.
        next_revision: u64,
    },
    /// In the hub's index: gets each revision as it is published.
    Live,
}

/// One watch of a stream.
#[derive(Clone, Debug)]
pub struct StreamWatch {
    /// The group whose hub serves it.
    pub group: u64,
    /// The watched path.
    pub path: Arc<str>,
    /// What it reports.
    pub spec: WatchSpec,
    /// Where it is.
    pub phase: Phase,
    /// Send progress responses when idle.
    pub progress_notify: bool,
    /// Events were queued since the last idle check.
    pub active: bool,
    /// Its place under the watch quotas covering it (given back when it ends).
    pub charge: Option<Arc<super::WatchCharge>>,
    /// Per group, the revision before which its creator received every event of this watch
    /// (`WatchCreate.group_start_revisions`): a subtree that moved in after its start is
    /// checked against it.
    pub resume_revisions: Arc<BTreeMap<u64, u64>>,
}

impl StreamWatch {
    /// Moves the watch to `phase`. A live watch gets each revision as it is published and
    /// never catches up again, so it lets go of its resume revisions (only catch-up reads
    /// them; a stream may carry thousands of watches).
    fn enter(&mut self, phase: Phase) {
        if phase == Phase::Live {
            self.resume_revisions = Arc::default();
        }
        self.phase = phase;
    }
}

/// A queued response, turned into a `WatchResponse` by the sender.
#[derive(Debug)]
pub enum Outgoing {
    /// The watch exists; its events follow.
    Created {
        /// The watch.
        watch_id: u64,
        /// Its group.
        group: u64,
        /// The revision of its read, or the one it starts after.
        revision: u64,
        /// The answer (boxed: it may carry a whole read, and every queued response is as
        /// large as the largest variant).
        created: Box<WatchCreated>,
    },
    /// Events of whole revisions: each batch with the indexes of the events the watch wants.
    Events {
        /// The watch.
        watch_id: u64,
        /// Its group.
        group: u64,
        /// Batches in revision order.
        batches: Vec<(Arc<EventBatch>, Vec<u32>)>,
        /// Include previous states.
        with_prev: bool,
    },
    /// Every event of the watch up to `revision` has been queued before this.
    Progress {
        /// The watch.
        watch_id: u64,
        /// Its group.
        group: u64,
        /// The revision.
        revision: u64,
    },
    /// The watch ended.
    Canceled {
        /// The watch.
        watch_id: u64,
        /// Its group (0 when the watch never existed).
        group: u64,
        /// Why the server ended it; `None` when the client asked.
        error: Option<WardenError>,
        /// Where to resume to get exactly the events not delivered.
        resume_revision: u64,
    },
}

/// Queue slots an idle stream keeps.
const QUEUE_CAPACITY_IDLE: usize = 16;

/// Bytes every response accounts for besides what it carries (its id, header, framing).
const CONTROL_BYTES: usize = 64;

impl Outgoing {
    /// The bytes it accounts for in the queue: what it carries, encoded, plus
    /// [`CONTROL_BYTES`].
    fn size_bytes(&self) -> usize {
        use prost::Message as _;
        CONTROL_BYTES
            + match self {
                Outgoing::Events { batches, .. } => {
                    batches.iter().flat_map(|(batch, selected)| selected.iter().map(|i| batch.events[*i as usize].size_bytes())).sum::<usize>()
                }
                Outgoing::Created { created, .. } => created.encoded_len(),
                Outgoing::Canceled { error, .. } => error.as_ref().map_or(0, |e| e.encoded_len()),
                Outgoing::Progress { .. } => 0,
            }
    }
}

/// What became of events pushed to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Queued; the watch goes on.
    Queued,
    /// Queued, and the one-shot watch ended with them.
    Fired,
    /// The queue is full: the caller cancels the watch.
    Full,
    /// The watch is no longer live on this stream.
    Gone,
}

struct StreamState {
    queue: VecDeque<Outgoing>,
    queued_bytes: usize,
    watches: HashMap<u64, StreamWatch>,
    /// The client went away: nothing more is queued.
    closed: bool,
}

/// The shared state of one `Watch` call.
pub struct WatchStream {
    state: Mutex<StreamState>,
    /// Wakes the sender: a response was queued or the stream closed.
    ready: Notify,
    /// Wakes the driver: queue space was freed, or the client went away.
    driver: Notify,
    queue_bytes_max: usize,
}

impl WatchStream {
    /// An empty stream whose queue holds at most `queue_bytes_max` bytes of events.
    pub fn new(queue_bytes_max: usize) -> Arc<WatchStream> {
        Arc::new(WatchStream {
            state: Mutex::new(StreamState { queue: VecDeque::new(), queued_bytes: 0, watches: HashMap::new(), closed: false }),
            ready: Notify::new(),
            driver: Notify::new(),
            queue_bytes_max,
        })
    }

    fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enqueue(&self, state: &mut StreamState, outgoing: Outgoing) {
        if state.closed {
            return;
        }
        state.queued_bytes += outgoing.size_bytes();
        state.queue.push_back(outgoing);
        self.ready.notify_one();
    }

    /// Adds a watch and queues its creation answer (the caller checked the id is free).
    pub fn add(&self, watch_id: u64, watch: StreamWatch, created: Outgoing) {
        let mut state = self.lock();
        debug_assert!(!state.watches.contains_key(&watch_id), "watch id {watch_id} reused while live");
        state.watches.insert(watch_id, watch);
        self.enqueue(&mut state, created);
    }

    /// Queues an answer about no watch (a refused creation).
    pub fn answer(&self, outgoing: Outgoing) {
        let mut state = self.lock();
        self.enqueue(&mut state, outgoing);
    }

    /// Whether `watch_id` is taken by a watch of the stream.
    pub fn contains(&self, watch_id: u64) -> bool {
        self.lock().watches.contains_key(&watch_id)
    }

    /// Number of watches on the stream.
    pub fn len(&self) -> usize {
        self.lock().watches.len()
    }

    /// The stream carries no watch.
    pub fn is_empty(&self) -> bool {
        self.lock().watches.is_empty()
    }

    /// A watch of the stream.
    pub fn watch(&self, watch_id: u64) -> Option<StreamWatch> {
        self.lock().watches.get(&watch_id).cloned()
    }

    /// Ids of watches still catching up.
    pub fn catching_up(&self) -> Vec<u64> {
        let state = self.lock();
        let mut ids: Vec<u64> = state.watches.iter().filter(|(_, w)| matches!(w.phase, Phase::CatchingUp { .. })).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids
    }

    /// Live watches with `progress_notify` that were idle since the last call (all live
    /// watches when `all`), by group; clears the activity marks.
    pub fn take_idle(&self, all: bool) -> HashMap<u64, Vec<u64>> {
        let mut state = self.lock();
        let mut idle: HashMap<u64, Vec<u64>> = HashMap::new();
        for (id, watch) in state.watches.iter_mut() {
            let wanted = watch.phase == Phase::Live && (all || (watch.progress_notify && !watch.active));
            watch.active = false;
            if wanted {
                idle.entry(watch.group).or_default().push(*id);
            }
        }
        idle
    }

    /// The queue is below its limit: the driver may take the client's next request (whose
    /// answers are queued whatever their size).
    pub fn has_room(&self) -> bool {
        self.lock().queued_bytes < self.queue_bytes_max
    }

    /// Bytes of events the queue can take before it is full.
    pub fn free_bytes(&self) -> usize {
        self.queue_bytes_max.saturating_sub(self.lock().queued_bytes)
    }

    /// Queues events for a watch (called by its hub, under the hub's lock). `next` moves a
    /// catching-up watch on (`Some(Phase)`); live watches pass `None` and must be live. A full
    /// queue leaves the watch where it was, so its hub can try again from the same place.
    pub fn push_events(&self, watch_id: u64, group: u64, batches: Vec<(Arc<EventBatch>, Vec<u32>)>, next: Option<Phase>) -> Pushed {
        let mut state = self.lock();
        let Some(watch) = state.watches.get(&watch_id).filter(|w| w.group == group) else { return Pushed::Gone };
        if next.is_none() && watch.phase != Phase::Live {
            return Pushed::Gone;
        }
        let (one_shot, with_prev) = (watch.spec.is_one_shot(), watch.spec.wants_prev());
        let outgoing = (!batches.is_empty()).then(|| Outgoing::Events { watch_id, group, batches, with_prev });
        // An empty queue takes any one response, so no event is too large to deliver.
        if outgoing.as_ref().is_some_and(|o| state.queued_bytes + o.size_bytes() > self.queue_bytes_max && !state.queue.is_empty()) {
            return Pushed::Full;
        }
        // Still there: the stream's lock was held throughout.
        let Some(watch) = state.watches.get_mut(&watch_id) else { return Pushed::Gone };
        if let Some(phase) = next {
            watch.enter(phase);
        }
        let Some(outgoing) = outgoing else { return Pushed::Queued };
        watch.active = true;
        let fired = one_shot;
        if fired {
            state.watches.remove(&watch_id);
        }
        self.enqueue(&mut state, outgoing);
        if fired {
            Pushed::Fired
        } else {
            Pushed::Queued
        }
    }

    /// Queues a progress response for a live watch (called under its hub's lock): always
    /// when the client `requested` it, else (periodic) only when it fits in the queue, so a
    /// client that stops reading does not collect one per interval.
    pub fn push_progress(&self, watch_id: u64, group: u64, revision: u64, requested: bool) {
        let mut state = self.lock();
        if state.watches.get(&watch_id).is_some_and(|w| w.group == group && w.phase == Phase::Live) {
            let outgoing = Outgoing::Progress { watch_id, group, revision };
            if requested || state.queued_bytes + outgoing.size_bytes() <= self.queue_bytes_max {
                self.enqueue(&mut state, outgoing);
            }
        }
    }

    /// Ends a watch and queues the cancellation; returns the watch if it was there.
    pub fn cancel(&self, watch_id: u64, error: Option<WardenError>, resume_revision: u64) -> Option<StreamWatch> {
        let mut state = self.lock();
        let watch = state.watches.remove(&watch_id)?;
        let group = watch.group;
        self.enqueue(&mut state, Outgoing::Canceled { watch_id, group, error, resume_revision });
        Some(watch)
    }

    /// The client went away: drops the queue and returns every watch, for removal from hubs.
    pub fn close(&self) -> Vec<(u64, StreamWatch)> {
        let mut state = self.lock();
        state.closed = true;
        state.queue.clear();
        state.queued_bytes = 0;
        self.ready.notify_one();
        self.driver.notify_one();
        state.watches.drain().collect()
    }

    /// Marks the receiving side gone and wakes the driver (it cleans up with [`close`]).
    ///
    /// [`close`]: WatchStream::close
    pub fn receiver_gone(&self) {
        self.lock().closed = true;
        self.driver.notify_one();
    }

    /// The receiving side is gone.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The next queued response, if any.
    pub fn try_next(&self) -> Option<Outgoing> {
        let mut state = self.lock();
        let outgoing = state.queue.pop_front()?;
        let was_full = state.queued_bytes >= self.queue_bytes_max;
        state.queued_bytes -= outgoing.size_bytes();
        // A burst (thousands of creations, a catch-up) must not leave its capacity behind
        // on an idle stream.
        if state.queue.is_empty() && state.queue.capacity() > QUEUE_CAPACITY_IDLE {
            state.queue.shrink_to(QUEUE_CAPACITY_IDLE);
        }
        // Room again for a catching-up watch, or for the client's next request.
        if state.queued_bytes <= self.queue_bytes_max / 2 || (was_full && state.queued_bytes < self.queue_bytes_max) {
            self.driver.notify_one();
        }
        Some(outgoing)
    }

    /// The next response to send, waiting for one; `None` once the stream closed.
    pub async fn next(&self) -> Option<Outgoing> {
        loop {
            if let Some(outgoing) = self.try_next() {
                return Some(outgoing);
            }
            if self.is_closed() {
                return None;
            }
            self.ready.notified().await;
        }
    }

    /// Waits until the driver has something to do (queue space, or the client went away).
    pub async fn driver_wake(&self) {
        self.driver.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::event::{node_state, Event, EventKind};
    use warden_proto::v1::watch_create::Kind as WatchKind;

    fn watch(kind: WatchKind) -> StreamWatch {
        StreamWatch {
            group: 1,
            path: Arc::from("/a"),
            spec: WatchSpec::new(kind, false, false, false, false, false),
            phase: Phase::Live,
            progress_notify: true,
            active: false,
            charge: None,
            resume_revisions: Arc::default(),
        }
    }

    fn batch(revision: u64, data_bytes: usize) -> Vec<(Arc<EventBatch>, Vec<u32>)> {
        let event = Event { kind: EventKind::Changed, path: "/a".into(), node: node_state(None, vec![0; data_bytes]), prev: None };
        vec![(Arc::new(EventBatch { revision, events: vec![event] }), vec![0])]
    }

    fn created(watch_id: u64) -> Outgoing {
        Outgoing::Created { watch_id, group: 1, revision: 0, created: Box::default() }
    }

    #[tokio::test]
    async fn a_full_queue_refuses_events_but_keeps_order() {
        let stream = WatchStream::new(1_000);
        stream.add(1, watch(WatchKind::Persistent), created(1));
        assert_eq!(stream.push_events(1, 1, batch(2, 500), None), Pushed::Queued);
        assert_eq!(stream.push_events(1, 1, batch(3, 500), None), Pushed::Full, "the limit is bytes, not messages");
        assert_eq!(stream.push_events(1, 2, batch(3, 1), None), Pushed::Gone, "another group's watch 1 is not this one");
        assert!(matches!(stream.next().await, Some(Outgoing::Created { .. })));
        assert!(matches!(stream.next().await, Some(Outgoing::Events { .. })));
        assert_eq!(stream.push_events(1, 1, batch(3, 500), None), Pushed::Queued, "room again once sent");
        assert!(matches!(stream.next().await, Some(Outgoing::Events { .. })));
        assert_eq!(stream.push_events(1, 1, batch(4, 5_000), None), Pushed::Queued, "an empty queue takes any one response");
        assert_eq!(stream.push_events(1, 1, batch(5, 1), None), Pushed::Full);
    }

    #[tokio::test]
    async fn a_catching_up_watch_stays_put_on_a_full_queue_and_forgets_its_resume_revisions_once_live() {
        let stream = WatchStream::new(1_000);
        let resume_revisions = Arc::new(std::collections::BTreeMap::from([(2, 9)]));
        let catching_up = StreamWatch { phase: Phase::CatchingUp { next_revision: 2 }, resume_revisions, ..watch(WatchKind::Persistent) };
        stream.add(1, catching_up, created(1));
        let at = |next_revision| Some(Phase::CatchingUp { next_revision });
        assert_eq!(stream.push_events(1, 1, batch(2, 500), at(3)), Pushed::Queued);
        assert_eq!(stream.push_events(1, 1, batch(3, 500), Some(Phase::Live)), Pushed::Full);
        let kept = stream.watch(1).expect("the watch is still there");
        assert_eq!(kept.phase, Phase::CatchingUp { next_revision: 3 }, "a refused push does not move the watch on");
        assert_eq!(kept.resume_revisions.get(&2), Some(&9), "nor does it drop what catch-up still reads");
        assert_eq!(stream.push_events(1, 1, batch(3, 1), None), Pushed::Gone, "a catching-up watch takes no live events");
        assert!(matches!(stream.next().await, Some(Outgoing::Created { .. })));
        assert!(matches!(stream.next().await, Some(Outgoing::Events { .. })));
        assert_eq!(stream.push_events(1, 1, batch(3, 500), Some(Phase::Live)), Pushed::Queued);
        let live = stream.watch(1).expect("the watch is still there");
        assert_eq!(live.phase, Phase::Live);
        assert!(live.resume_revisions.is_empty(), "a live watch never catches up again");
        assert_eq!(stream.push_events(1, 1, batch(4, 1), None), Pushed::Queued);
    }

    #[tokio::test]
    async fn one_shot_watches_end_with_their_first_events() {
        let stream = WatchStream::new(10_000);
        stream.add(7, watch(WatchKind::Data), created(7));
        assert_eq!(stream.push_events(7, 1, batch(2, 1), None), Pushed::Fired);
        assert_eq!(stream.push_events(7, 1, batch(3, 1), None), Pushed::Gone);
        assert!(stream.is_empty());
    }

    #[tokio::test]
    async fn idle_watches_get_progress_and_closing_drains_everything() {
        let stream = WatchStream::new(10_000);
        stream.add(1, watch(WatchKind::Persistent), created(1));
        stream.add(2, watch(WatchKind::Persistent), created(2));
        assert_eq!(stream.push_events(1, 1, batch(2, 1), None), Pushed::Queued);
        let idle = stream.take_idle(false);
        assert_eq!(idle.get(&1), Some(&vec![2]), "only the watch without events is idle");
        assert_eq!(stream.take_idle(false).get(&1).map(Vec::len), Some(2), "activity marks reset");
        let watches = stream.close();
        assert_eq!(watches.len(), 2);
        assert!(stream.next().await.is_none());
        stream.push_progress(1, 1, 5, true);
        assert!(stream.next().await.is_none(), "nothing is queued after close");
    }

    #[tokio::test]
    async fn every_response_counts_its_real_bytes_and_periodic_progress_needs_room() {
        use warden_proto::v1::watch_created::Read;
        let stream = WatchStream::new(100_000);
        let read = Read::Get(warden_proto::v1::GetResponse { data: vec![7; 300_000], ..Default::default() });
        let created =
            Outgoing::Created { watch_id: 1, group: 1, revision: 0, created: Box::new(WatchCreated { read: Some(read), ..WatchCreated::default() }) };
        stream.add(1, watch(WatchKind::Persistent), created);
        assert!(!stream.has_room(), "a creation answer carrying a 300 KB read fills a 100 KB queue");
        assert_eq!(stream.free_bytes(), 0);
        assert_eq!(stream.push_events(1, 1, batch(2, 10), None), Pushed::Full, "events wait behind it");
        stream.push_progress(1, 1, 2, false);
        stream.push_progress(1, 1, 2, true);
        assert!(matches!(stream.next().await, Some(Outgoing::Created { .. })));
        assert!(matches!(stream.next().await, Some(Outgoing::Progress { .. })), "the requested progress only");
        assert!(stream.try_next().is_none());
        assert!(stream.has_room());
        let error = warden_proto::warden_error(warden_proto::v1::warden_error::Code::InvalidArgument, "", "x".repeat(900));
        for _ in 0..200 {
            stream.answer(Outgoing::Canceled { watch_id: 9, group: 0, error: Some(error.clone()), resume_revision: 0 });
        }
        assert!(!stream.has_room(), "refusals count their messages");
    }
}
