//! Keepalives of many sessions in one call. A client's sessions renew their leases on their
//! own timers; a renewal that falls due while a keepalive of its home group is on the way
//! waits for that call to end and goes with every other one waiting in the next call (at most
//! [`KEEPALIVE_SESSIONS_MAX`] sessions each). A lone renewal leaves at once; under load the
//! calls get fewer, not later — a thousand sessions of one process cost a router or a node a
//! few calls per renewal interval, not a thousand (etcd's client likewise carries every lease
//! of a process on one stream).
//!
//! One call per home group at a time: the sessions of a group whose leader is slow or away
//! wait for that group only, and each call goes to the one group that can answer it (direct
//! to its leader when the client calls nodes directly).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;
use tokio::time::Instant;
use warden_proto::routing::home_group;
use warden_proto::v1 as pb;
use warden_proto::KEEPALIVE_SESSIONS_MAX;

use crate::error::{Error, Result};

/// Renewals waiting in one client at most (over all groups); beyond it a renewal is refused
/// (`TooLarge`), since a client with this many sessions renewing at once is stuck, not busy.
pub(crate) const RENEWALS_WAITING_MAX: usize = 1 << 16;

/// One session's renewal, waiting for its call.
struct Waiter {
    session_id: u64,
    /// When its caller stops waiting: the call carrying it lasts as long as its latest waiter.
    deadline: Instant,
    reply: oneshot::Sender<Result<Vec<pb::SessionLease>>>,
}

/// The renewals of one home group.
#[derive(Default)]
struct Queue {
    /// A call of this group is on the way (its sender takes the next batch when it ends).
    sending: bool,
    waiting: VecDeque<Waiter>,
}

/// The renewals of one client, by home group.
#[derive(Default)]
pub(crate) struct Renewals {
    groups: Mutex<HashMap<u64, Queue>>,
}

/// A batch taken from a queue: the sessions of one call.
pub(crate) struct Batch {
    waiters: Vec<Waiter>,
}

impl Batch {
    /// The sessions to renew, in order, without repeats (a session asked twice is renewed once).
    pub(crate) fn session_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = Vec::with_capacity(self.waiters.len());
        for waiter in &self.waiters {
            if !ids.contains(&waiter.session_id) {
                ids.push(waiter.session_id);
            }
        }
        ids
    }

    /// The time the call may take: until its latest waiter stops waiting.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.waiters.iter().map(|w| w.deadline).max()
    }

    /// Hands each waiter the call's answer (the leases), or its error.
    pub(crate) fn answer(self, answer: Result<Vec<pb::SessionLease>>) {
        for waiter in self.waiters {
            // A waiter that stopped waiting dropped its receiver: nothing to tell it.
            let _ = waiter.reply.send(answer.clone());
        }
    }
}

/// What [`Renewals::enqueue`] asks of its caller.
pub(crate) struct Enqueued {
    /// Resolves with the leases of the call that carried the renewal.
    pub answer: oneshot::Receiver<Result<Vec<pb::SessionLease>>>,
    /// The caller must start sending this group's batches (no call was on the way).
    pub start_sending: Option<u64>,
}

impl Renewals {
    /// Queues the renewal of `session_id` until `deadline`.
    pub(crate) fn enqueue(&self, session_id: u64, deadline: Instant) -> Result<Enqueued> {
        let group = home_group(session_id);
        let (reply, answer) = oneshot::channel();
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let waiting: usize = groups.values().map(|q| q.waiting.len()).sum();
        if waiting >= RENEWALS_WAITING_MAX {
            let message = "keepalives waiting in this client".to_string();
            return Err(Error::TooLarge { limit: RENEWALS_WAITING_MAX as u64, message });
        }
        let queue = groups.entry(group).or_default();
        queue.waiting.push_back(Waiter { session_id, deadline, reply });
        let start_sending = (!queue.sending).then(|| {
            queue.sending = true;
            group
        });
        Ok(Enqueued { answer, start_sending })
    }

    /// The next batch of `group` for its sender, or `None` when none waits (the sender stops,
    /// and the next renewal starts a new one). Renewals whose callers stopped waiting are
    /// dropped here, unsent.
    fn next_batch(&self, group: u64) -> Option<Batch> {
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let Entry::Occupied(mut entry) = groups.entry(group) else { return None };
        let queue = entry.get_mut();
        let mut waiters = Vec::new();
        let mut sessions = 0;
        while let Some(waiter) = queue.waiting.pop_front() {
            if waiter.reply.is_closed() {
                continue;
            }
            if sessions == KEEPALIVE_SESSIONS_MAX {
                queue.waiting.push_front(waiter);
                break;
            }
            if !waiters.iter().any(|w: &Waiter| w.session_id == waiter.session_id) {
                sessions += 1;
            }
            waiters.push(waiter);
        }
        if waiters.is_empty() {
            entry.remove();
            return None;
        }
        Some(Batch { waiters })
    }
}

/// The sender of one group's batches (the task [`Enqueued::start_sending`] asked for). Dropped
/// before its group's queue ran dry (its task panicked or was stopped), it drops the group's
/// waiting renewals, whose callers then hear an error at once, and the next renewal of the
/// group starts a new sender.
pub(crate) struct Sender<'r> {
    renewals: &'r Renewals,
    group: u64,
    /// The queue ran dry: the next renewal starts a new sender.
    done: bool,
}

impl<'r> Sender<'r> {
    /// The sender of `group`'s batches.
    pub(crate) fn new(renewals: &'r Renewals, group: u64) -> Sender<'r> {
        Sender { renewals, group, done: false }
    }

    /// The next batch to send; `None`: none waits, and this sender is done.
    pub(crate) fn next_batch(&mut self) -> Option<Batch> {
        let batch = self.renewals.next_batch(self.group);
        self.done = batch.is_none();
        batch
    }
}

impl Drop for Sender<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.renewals.groups.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use warden_proto::routing::SESSION_SEQUENCE_BITS;

    fn session(group: u64, sequence: u64) -> u64 {
        (group << SESSION_SEQUENCE_BITS) | sequence
    }

    /// The first renewal of a group starts a sender; those that come while it sends wait and
    /// go together, once each; another group's renewal does not wait for this group's call.
    #[tokio::test]
    async fn renewals_arriving_during_a_call_go_together_in_the_next() {
        let renewals = Renewals::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let first = renewals.enqueue(session(3, 1), deadline).unwrap();
        assert_eq!(first.start_sending, Some(3), "no call on the way: the caller sends");
        let batch = renewals.next_batch(3).expect("the first renewal waits");
        assert_eq!(batch.session_ids(), vec![session(3, 1)]);
        let second = renewals.enqueue(session(3, 2), deadline).unwrap();
        let third = renewals.enqueue(session(3, 3), deadline + Duration::from_secs(1)).unwrap();
        let repeat = renewals.enqueue(session(3, 2), deadline).unwrap();
        assert_eq!((second.start_sending, third.start_sending, repeat.start_sending), (None, None, None), "a call is on the way");
        let other = renewals.enqueue(session(4, 1), deadline).unwrap();
        assert_eq!(other.start_sending, Some(4), "another group's renewal has its own sender");
        let lease = |id| pb::SessionLease { session_id: id, alive: true, remaining_ms: 5000, ..pb::SessionLease::default() };
        batch.answer(Ok(vec![lease(session(3, 1))]));
        assert_eq!(first.answer.await.unwrap().unwrap()[0].session_id, session(3, 1));

        let batch = renewals.next_batch(3).expect("three renewals wait");
        assert_eq!(batch.session_ids(), vec![session(3, 2), session(3, 3)], "in order, a repeated session once");
        assert_eq!(batch.deadline(), Some(deadline + Duration::from_secs(1)), "the call lasts as long as its latest waiter");
        batch.answer(Err(Error::DeadlineExceeded));
        for waiter in [second, third, repeat] {
            assert_eq!(waiter.answer.await.unwrap(), Err(Error::DeadlineExceeded), "every waiter hears the call's fate");
        }
        assert!(renewals.next_batch(3).is_none(), "none waits: the sender stops");
        let again = renewals.enqueue(session(3, 1), deadline).unwrap();
        assert_eq!(again.start_sending, Some(3), "the next renewal starts a new sender");

        let mut sender = Sender::new(&renewals, 3);
        let in_flight = sender.next_batch().expect("one renewal waits");
        let behind = renewals.enqueue(session(3, 2), deadline).unwrap();
        drop(in_flight);
        drop(sender);
        assert!(again.answer.await.is_err(), "a sender gone mid-call: its batch hears so");
        assert!(behind.answer.await.is_err(), "and so do the renewals behind it");
        let fresh = renewals.enqueue(session(3, 1), deadline).unwrap();
        assert_eq!(fresh.start_sending, Some(3), "the next renewal starts a new sender");
    }

    /// A renewal whose caller stopped waiting is not sent; a batch holds at most the
    /// sessions one keepalive request may carry; the client's queue is bounded.
    #[tokio::test]
    async fn abandoned_renewals_are_dropped_and_batches_and_queues_are_bounded() {
        let renewals = Renewals::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        let gone = renewals.enqueue(session(2, 0), deadline).unwrap();
        drop(gone.answer);
        let mut kept = Vec::new();
        for sequence in 1..=KEEPALIVE_SESSIONS_MAX as u64 + 1 {
            kept.push(renewals.enqueue(session(2, sequence), deadline).unwrap());
        }
        let batch = renewals.next_batch(2).expect("renewals wait");
        let ids = batch.session_ids();
        assert_eq!(ids.len(), KEEPALIVE_SESSIONS_MAX, "one request's worth");
        assert_eq!(ids[0], session(2, 1), "the abandoned renewal is not sent");
        let rest = renewals.next_batch(2).expect("one renewal is left for the next call");
        assert_eq!(rest.session_ids(), vec![session(2, KEEPALIVE_SESSIONS_MAX as u64 + 1)]);

        let full = Renewals::default();
        let mut held = Vec::new();
        for sequence in 0..RENEWALS_WAITING_MAX as u64 {
            held.push(full.enqueue(session(1 + sequence % 7, sequence), deadline).unwrap());
        }
        match full.enqueue(session(9, 1), deadline) {
            Err(Error::TooLarge { limit, .. }) => assert_eq!(limit, RENEWALS_WAITING_MAX as u64),
            Err(other) => panic!("expected TooLarge, got {other}"),
            Ok(_) => panic!("a full queue took another renewal"),
        }
    }
}
