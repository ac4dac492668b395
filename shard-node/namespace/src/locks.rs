//! Locks are nodes too (DESIGN.md "Data model"). A lock at `path` is a node (a container when
//! the lock made it) with lock metadata beside it (`LockMeta`: a lock-delay in force), whose
//! children `lock-%010d` are ephemeral-sequential waiters (data: mode byte, then the request
//! id), granted in FIFO order: the first waiter holds an exclusive lock; the leading run of
//! shared waiters holds a shared lock. A sequencer's token is its waiter's create_revision,
//! so for a lock path tokens only grow.
//!
//! A waiter is recognised by its stored record (`NodeRecord.lock_waiter`: its lock-delay and
//! attempt), which only the lock operations write; plain writes refuse to create a child of
//! a lock, or to change or delete a waiter, so waiters cannot be forged or altered.
//!
//! Whenever a lock's waiters change, apply notifies the waiters that hold it now (keys are
//! waiter paths): a waiting `Lock` call wakes only when it holds — no herd — or when its
//! waiter is gone (released, or its session ended).

use warden_proto::namespace::{LockMeta, LockWaiterRecord};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{LockMode, LockWaiter};

use std::collections::{BTreeMap, BTreeSet};

use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::AcquireLock;
use warden_proto::v1::{CreateRequest, LockResponse, NodeKind, Sequencer};

use super::apply::Effects;
use super::error::{error, invalid, invalid_path, session_expired, Failure};
use super::path;
use super::store::TxnView;
use super::txn::{Deleter, Txn};
use super::NamespaceStateMachine;
use warden_engine::error::StorageError;
use warden_engine::state_machine::{SmReader, SmWrites};

/// Name prefix of waiter nodes.
pub const WAITER_PREFIX: &str = "lock-";

/// One waiter of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The waiter node's path.
    pub path: String,
    pub mode: LockMode,
    pub session_id: u64,
    /// Its create_revision: the fencing token.
    pub token: u64,
    pub request_id: u64,
    /// What only a waiter's record has (lock-delay, attempt).
    pub record: LockWaiterRecord,
}

impl Waiter {
    /// As the public API shows it.
    pub fn to_proto(&self) -> LockWaiter {
        LockWaiter { waiter: self.path.clone(), mode: self.mode as i32, session_id: self.session_id, token: self.token }
    }
}

/// Data of a waiter node.
pub fn waiter_data(mode: LockMode, request_id: u64) -> Vec<u8> {
    let mut data = vec![mode as u8];
    data.extend_from_slice(&request_id.to_be_bytes());
    data
}

fn decode_waiter_data(data: &[u8]) -> Option<(LockMode, u64)> {
    let (&mode, rest) = data.split_first()?;
    let mode = LockMode::try_from(i32::from(mode)).ok()?;
    Some((mode, u64::from_be_bytes(rest.try_into().ok()?)))
}

/// The refusal of a plain write that would create, change or delete a lock waiter.
pub fn waiters_only_by_lock_operations(path: &str) -> Failure {
    let message = "lock waiters are created, changed and deleted only by Lock, Unlock and their session's end";
    error(Code::InvalidArgument, path, format!("{path}: {message}")).into()
}

/// The waiters of the lock at `path`, in grant order. A child that is not a waiter makes
/// the path unusable as a lock, and so do more than `waiters_max` waiters.
pub fn waiters(view: &TxnView<'_>, lock_path: &str, waiters_max: usize) -> Result<Vec<Waiter>, Failure> {
    let (names, more) = view.children(lock_path, "", waiters_max)?;
    if more {
        return Err(error(Code::TooLarge, lock_path, "the lock has too many waiters").into());
    }
    let mut waiters = Vec::with_capacity(names.len());
    for name in names {
        let waiter_path = path::join(lock_path, &name);
        let node =
            view.node(&waiter_path)?.ok_or_else(|| warden_engine::error::StorageError::Corrupt(format!("{waiter_path} indexed but missing")))?;
        let stat = node.stat.unwrap_or_default();
        let parsed = node.lock_waiter.and_then(|record| decode_waiter_data(&node.data).map(|(mode, request_id)| (mode, request_id, record)));
        let Some((mode, request_id, record)) = parsed else {
            return Err(error(Code::InvalidArgument, lock_path, format!("{lock_path} has a child {name} that is not a lock waiter")).into());
        };
        waiters.push(Waiter { path: waiter_path, mode, session_id: stat.ephemeral_owner, token: stat.create_revision, request_id, record });
    }
    Ok(waiters)
}

/// How many leading waiters hold the lock. During a lock-delay (`blocked_until_ms != 0`, until
/// the leader's `LockDelayEnded` applies: a query never judges time), only waiters that held
/// when it began keep holding; nobody is granted anew.
pub fn holders(waiters: &[Waiter], meta: Option<&LockMeta>) -> usize {
    let run = match waiters.first() {
        None => 0,
        Some(first) if first.mode == LockMode::Exclusive => 1,
        Some(_) => waiters.iter().take_while(|w| w.mode == LockMode::Shared).count(),
    };
    match meta {
        Some(meta) if meta.blocked_until_ms != 0 => waiters[..run].iter().take_while(|w| w.token <= meta.held_through_token).count(),
        _ => run,
    }
}

/// The notification key of a waiter (what a waiting `Lock` call awaits).
pub fn notify_key(waiter_path: &str) -> Vec<u8> {
    let mut key = b"lock-granted:".to_vec();
    key.extend_from_slice(waiter_path.as_bytes());
    key
}

/// Applies an `AcquireLock`: the answer, and the call's attempt on its waiter in `effects`.
pub(super) fn apply_acquire(txn: &mut Txn<'_, '_>, acquire: &AcquireLock, effects: &mut Effects) -> Result<CommandOutcome, Failure> {
    let (response, attempt) = txn.acquire_lock(acquire)?;
    effects.lock_attempt = attempt;
    Ok(CommandOutcome::Lock(response))
}

impl Txn<'_, '_> {
    /// If `waiter` holds its parent's lock and asked for a lock-delay, the lock is granted to
    /// nobody new until the delay has passed (Chubby's lock-delay); the other holders (sharing
    /// it) keep their holds.
    pub(super) fn start_lock_delay_if_holding(&mut self, waiter: &str) -> Result<(), Failure> {
        let Some(lock_path) = path::parent(waiter) else { return Ok(()) };
        let Some(mut meta) = self.view.lock_meta(lock_path)? else { return Ok(()) };
        let waiters = waiters(self.view, lock_path, self.limits.lock_waiters_max)?;
        let holding = &waiters[..holders(&waiters, Some(&meta))];
        let Some(expired) = holding.iter().find(|w| w.path == waiter) else { return Ok(()) };
        if expired.record.lock_delay_ms == 0 {
            return Ok(());
        }
        if meta.blocked_until_ms == 0 {
            // Holders are a leading run in token order: the last one's token bounds them all.
            meta.held_through_token = holding.last().map_or(0, |w| w.token);
        }
        meta.blocked_until_ms = meta.blocked_until_ms.max(self.now_ms.saturating_add(expired.record.lock_delay_ms));
        self.view.put_lock_meta(lock_path, &meta);
        self.lock_changes.push((lock_path.to_string(), meta.blocked_until_ms));
        Ok(())
    }

    /// Adds a waiter for `request.session_id` to the lock at `request.path` (creating the
    /// lock as a container node), or re-attaches to the one an earlier call of the same request
    /// made (its attempt goes up, so a release naming an earlier call leaves it). Returns the
    /// answer and the call's attempt on its waiter (0: none). A try-lock (`if_free`) that would
    /// not hold changes nothing.
    pub fn acquire_lock(&mut self, request: &AcquireLock) -> Result<(LockResponse, u64), Failure> {
        let lock_path = request.path.as_str();
        path::validate(lock_path, false).map_err(|e| invalid_path(lock_path, &e))?;
        if lock_path == self.root {
            return Err(invalid(lock_path, "the group's root cannot be a lock").into());
        }
        let mode = LockMode::try_from(request.mode).map_err(|_| invalid(lock_path, "unknown lock mode"))?;
        if request.lock_delay_ms > self.limits.lock_delay_ms_max {
            return Err(invalid(lock_path, format!("lock_delay_ms is at most {}", self.limits.lock_delay_ms_max)).into());
        }
        if self.view.session(request.session_id)?.is_none() {
            return Err(session_expired(request.session_id, lock_path).into());
        }
        self.check_owner(request.session_id, lock_path)?;
        let node = self.node(lock_path)?;
        let stat = node.as_ref().and_then(|node| node.stat).unwrap_or_default();
        if stat.ephemeral_owner != 0 {
            return Err(invalid(lock_path, "an ephemeral node cannot be a lock").into());
        }
        let meta = self.view.lock_meta(lock_path)?;
        let mut waiters = match meta {
            Some(_) => waiters(self.view, lock_path, self.limits.lock_waiters_max)?,
            // A node becomes a lock only while childless: a lock's children are its waiters.
            None if stat.num_children > 0 => {
                return Err(invalid(lock_path, format!("{lock_path} has children that are not lock waiters")).into());
            }
            None => Vec::new(),
        };
        let retried =
            waiters.iter().position(|w| request.request_id != 0 && w.session_id == request.session_id && w.request_id == request.request_id);
        let (index, attempt) = match retried {
            Some(index) if request.if_free && index >= holders(&waiters, meta.as_ref()) => {
                // A try-lock with the id of a waiting call that does not hold: it gives up.
                let waiter = waiters[index].path.clone();
                self.delete_waiter(&waiter)?;
                return Ok((LockResponse { header: None, acquired: false, sequencer: None }, 0));
            }
            Some(index) => {
                let waiter = &mut waiters[index];
                waiter.record.attempt += 1;
                waiter.record.lock_delay_ms = request.lock_delay_ms;
                let mut node = self.view.node(&waiter.path)?.ok_or_else(|| StorageError::Corrupt(format!("waiter {} vanished", waiter.path)))?;
                node.lock_waiter = Some(waiter.record);
                self.view.put_node(&waiter.path, &node);
                (index, waiter.record.attempt)
            }
            None => {
                let record = LockWaiterRecord { lock_delay_ms: request.lock_delay_ms, attempt: 1 };
                // The waiter it would be (its token is this revision): checked before anything
                // is written, so a refused try-lock changes nothing.
                waiters.push(Waiter {
                    path: String::new(),
                    mode,
                    session_id: request.session_id,
                    token: self.revision,
                    request_id: request.request_id,
                    record,
                });
                if request.if_free && holders(&waiters, meta.as_ref()) < waiters.len() {
                    return Ok((LockResponse { header: None, acquired: false, sequencer: None }, 0));
                }
                if node.is_none() {
                    let container =
                        CreateRequest { path: lock_path.into(), kind: NodeKind::Container as i32, create_parents: true, ..CreateRequest::default() };
                    self.create(&container)?;
                }
                if meta.is_none() {
                    self.view.put_lock_meta(lock_path, &LockMeta::default());
                }
                let waiter = CreateRequest {
                    path: path::join(lock_path, WAITER_PREFIX),
                    data: waiter_data(mode, request.request_id),
                    sequential: true,
                    session_id: request.session_id,
                    ..CreateRequest::default()
                };
                let created = self.create_node(&waiter, Some(record))?;
                let index = waiters.len() - 1;
                waiters[index].path = created.path;
                (index, 1)
            }
        };
        let holding = holders(&waiters, meta.as_ref());
        let waiter = &waiters[index];
        let sequencer = Sequencer { path: lock_path.into(), mode: waiter.mode as i32, token: waiter.token, group_id: 0, waiter: waiter.path.clone() };
        Ok((LockResponse { header: None, acquired: index < holding, sequencer: Some(sequencer) }, attempt))
    }

    /// Removes a sequencer's waiter (unlock, or giving up waiting); with a nonzero `attempt`,
    /// only if no later call re-attached to it. Releasing a waiter that is already gone is
    /// not an error; a sequencer naming another hold, or a node that is no waiter, is.
    pub fn release_lock(&mut self, sequencer: &Sequencer, attempt: u64) -> Result<(), Failure> {
        let waiter = sequencer.waiter.as_str();
        path::validate(waiter, false).map_err(|e| invalid_path(waiter, &e))?;
        if path::parent(waiter) != Some(sequencer.path.as_str()) {
            return Err(invalid(waiter, "the waiter is not a child of the lock").into());
        }
        let Some(node) = self.view.node(waiter)? else { return Ok(()) };
        let stat = node.stat.unwrap_or_default();
        if stat.create_revision != sequencer.token {
            return Err(invalid(waiter, "the sequencer's token does not match its waiter").into());
        }
        self.check_owner(stat.ephemeral_owner, &sequencer.path)?;
        let Some(record) = node.lock_waiter else { return Err(invalid(waiter, format!("{waiter} is not a lock waiter")).into()) };
        if attempt != 0 && record.attempt != attempt {
            // A later call took over this waiter: the release of an abandoned call leaves it.
            return Ok(());
        }
        self.delete_waiter(waiter)
    }

    /// Deletes a waiter (and the lock's container if it was the last one).
    fn delete_waiter(&mut self, waiter: &str) -> Result<(), Failure> {
        self.delete_subtree(waiter, Deleter::Locks)?;
        self.detach_from_parent(waiter)?;
        Ok(())
    }

    /// A lock's lock-delay has passed (judged by the leader): grant it again. A container lock
    /// that lost its last waiter during the delay goes now.
    pub fn end_lock_delay(&mut self, lock_path: &str) -> Result<(), Failure> {
        let Some(meta) = self.view.lock_meta(lock_path)? else { return Ok(()) };
        if meta.blocked_until_ms == 0 || meta.blocked_until_ms > self.now_ms {
            return Ok(());
        }
        self.view.put_lock_meta(lock_path, &LockMeta::default());
        self.lock_changes.push((lock_path.to_string(), 0));
        self.touched.insert(lock_path.to_string());
        let stat = self.node(lock_path)?.and_then(|node| node.stat).unwrap_or_default();
        if stat.kind == NodeKind::Container as i32 && stat.num_children == 0 && lock_path != self.root {
            self.delete_subtree(lock_path, Deleter::Locks)?;
            self.detach_from_parent(lock_path)?;
        }
        Ok(())
    }
}

impl NamespaceStateMachine {
    /// Wakes the waiters that hold each touched lock now (only those: no herd), and the
    /// calls waiting on waiters that are gone; counts each touched lock's holders again.
    pub(super) fn notify_lock_waiters(
        &mut self,
        reader: &SmReader,
        writes: &mut SmWrites,
        touched: &BTreeSet<String>,
        gone_waiters: &[String],
    ) -> Result<(), StorageError> {
        let mut keys: Vec<Vec<u8>> = gone_waiters.iter().map(|waiter| notify_key(waiter)).collect();
        {
            let view = TxnView::new(reader, Some(writes));
            for lock_path in touched {
                let holders = Self::lock_holders_at(&view, lock_path, self.limits.lock_waiters_max)?;
                keys.extend(holders.iter().map(|w| notify_key(&w.path)));
                match holders.len() as u64 {
                    0 => self.lock_holders.remove(lock_path),
                    holding => self.lock_holders.insert(lock_path.clone(), holding),
                };
            }
        }
        for key in keys {
            writes.notify(key);
        }
        Ok(())
    }

    /// The waiters holding the lock at `lock_path` (none when it is no lock, or one with
    /// foreign children, which serves nobody).
    pub(super) fn lock_holders_at(view: &TxnView<'_>, lock_path: &str, waiters_max: usize) -> Result<Vec<Waiter>, StorageError> {
        let Some(meta) = view.lock_meta(lock_path)? else { return Ok(Vec::new()) };
        let mut waiters = match waiters(view, lock_path, waiters_max) {
            Ok(waiters) => waiters,
            Err(Failure::Storage(error)) => return Err(error),
            Err(Failure::Refused(_)) => return Ok(Vec::new()),
        };
        waiters.truncate(holders(&waiters, Some(&meta)));
        Ok(waiters)
    }

    /// Keeps the index of locks in their lock-delay in step with a command's changes (made
    /// at `now_ms`, the time stamped into the command).
    pub(super) fn apply_lock_changes(&mut self, changes: Vec<(String, u64)>, now_ms: u64) {
        for (path, blocked_until_ms) in changes {
            if blocked_until_ms == 0 {
                self.blocked_locks.remove(&path);
            } else {
                let lock = BlockedLock::at(blocked_until_ms, now_ms, self.limits.lock_delay_ms_max);
                if self.leases.leading() {
                    // From the leader's clock when it applied the start: the whole remainder.
                    self.delay_deadlines.start(&path, lock, self.leases.now_ms());
                }
                self.blocked_locks.insert(path, lock);
            }
        }
    }
}

/// A lock in its lock-delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockedLock {
    /// The delay's end as the entry that started it stamped it (wall clock; replicated).
    pub until_ms: u64,
    /// How long the delay had left when this replica learnt of it (at most the largest
    /// lock-delay allowed): what a leader waits, by its monotonic clock, from its first
    /// tick with the lock blocked.
    pub remaining_ms: u64,
}

impl BlockedLock {
    /// A delay ending at `until_ms`, learnt of at `now_ms`; `max_ms` bounds what is left.
    pub fn at(until_ms: u64, now_ms: u64, max_ms: u64) -> BlockedLock {
        BlockedLock { until_ms, remaining_ms: until_ms.saturating_sub(now_ms).min(max_ms) }
    }
}

/// Leader-only: when each lock-delay ends by the leader's monotonic clock (see
/// `Namespace::delay_deadlines`): per lock, the delay it is for (its `until_ms`) and the
/// deadline in monotonic milliseconds.
#[derive(Debug, Default)]
pub(crate) struct DelayDeadlines(BTreeMap<String, (u64, u64)>);

impl DelayDeadlines {
    /// Forgets every deadline (leadership changed: the next leader's first tick sets them
    /// again, each from its delay's whole remainder).
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// The delay `lock` of `path` started, seen at monotonic `now_ms` (on the leader).
    pub fn start(&mut self, path: &str, lock: BlockedLock, now_ms: u64) {
        self.0.insert(path.to_string(), (lock.until_ms, now_ms.saturating_add(lock.remaining_ms)));
    }

    /// The locks of `blocked` whose delay has ended at monotonic `now_ms`, with the delay's
    /// stamped end; deadlines are set for delays seen for the first time and dropped for
    /// delays that ended or started again.
    pub fn due(&mut self, blocked: &BTreeMap<String, BlockedLock>, now_ms: u64) -> impl Iterator<Item = (String, u64)> + '_ {
        self.0.retain(|path, (until_ms, _)| blocked.get(path).is_some_and(|lock| lock.until_ms == *until_ms));
        for (path, lock) in blocked {
            self.0.entry(path.clone()).or_insert((lock.until_ms, now_ms.saturating_add(lock.remaining_ms)));
        }
        self.0.iter().filter(move |(_, (_, deadline))| *deadline <= now_ms).map(|(path, (until_ms, _))| (path.clone(), *until_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(mode: LockMode, token: u64) -> Waiter {
        Waiter { path: String::new(), mode, session_id: 1, token, request_id: 0, record: LockWaiterRecord::default() }
    }

    #[test]
    fn fifo_grant_rules() {
        use LockMode::{Exclusive as X, Shared as S};
        let cases: &[(&[LockMode], usize)] = &[(&[], 0), (&[X, X], 1), (&[S, S, X, S], 2), (&[X, S, S], 1), (&[S], 1)];
        for (modes, expected) in cases {
            let waiters: Vec<Waiter> = modes.iter().zip(1..).map(|(m, token)| waiter(*m, token)).collect();
            assert_eq!(holders(&waiters, None), *expected, "{modes:?}");
        }
        let blocked = LockMeta { blocked_until_ms: 100, held_through_token: 2 };
        assert_eq!(holders(&[waiter(X, 3)], Some(&blocked)), 0, "lock-delay in force: no new grant");
        let shared = [waiter(S, 2), waiter(S, 3)];
        assert_eq!(holders(&shared, Some(&blocked)), 1, "a surviving shared holder keeps its hold");
        assert_eq!(holders(&shared, Some(&LockMeta::default())), 2, "lock-delay over");
    }

    #[test]
    fn waiter_data_round_trips() {
        assert_eq!(decode_waiter_data(&waiter_data(LockMode::Shared, 7)), Some((LockMode::Shared, 7)));
        assert_eq!(decode_waiter_data(&[9, 0]), None);
    }
}
