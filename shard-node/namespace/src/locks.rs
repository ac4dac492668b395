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

use super::error::{error, Failure};
use super::path;
use super::store::TxnView;

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
