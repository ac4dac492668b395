//! Fencing (Kleppmann; Chubby's sequencers): a lock alone cannot stop a holder that paused
//! (GC, network) past its lease from writing after someone else took the lock. So every write
//! to the protected resource carries the writer's fencing token — the `token` of its Warden
//! `Sequencer`, which for a lock path only grows — and the resource refuses any token lower
//! than the highest it has seen.
//!
//! ```
//! use warden_client::FenceGuard;
//! let fence = FenceGuard::new();
//! assert!(fence.admit(7).is_ok());   // holder with token 7 writes
//! assert!(fence.admit(9).is_ok());   // the lock passed on: token 9 writes
//! assert!(fence.admit(7).is_err());  // the old holder woke up late: refused
//! ```
//!
//! Keep one guard per protected resource, inside the resource (database row, file server,
//! storage service), and check it atomically with the write it protects. Equal tokens are
//! admitted: one holder may write many times.
//!
//! # Contract
//!
//! What Warden promises, and so what a guard relies on:
//!
//! - A token is the `create_revision` of the holder's waiter node: the revision of the shard
//!   group serving the lock path when the waiter was queued.
//! - For one lock path, a later holder's token is always higher than every token issued for
//!   that path before: across leader changes, restarts, and moves of the path to another
//!   shard group (a new group's revision is raised above the revision of the group that
//!   served the path before it serves anything: DESIGN.md rule 5). Tokens never repeat, and
//!   no two holders of an exclusive lock ever have the same token.
//! - Tokens of different lock paths are not comparable: guard a resource with one lock path.
//! - A shared lock has several holders at once, each with its own token; a guard admits the
//!   writes of the highest of them only, so guard with exclusive holds (or a lock per writer).
//! - The guard itself must be durable with the resource (persist `highest` with the data) if
//!   the resource can restart: a guard that forgets its mark admits a stale holder once.

use std::sync::Mutex;

/// A write carried a token lower than one already admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fencing token {token} is stale: {highest} was already admitted")]
pub struct StaleToken {
    /// The refused token.
    pub token: u64,
    /// The highest token admitted so far.
    pub highest: u64,
}

/// The highest fencing token a resource has admitted.
#[derive(Debug, Default)]
pub struct FenceGuard {
    highest: Mutex<u64>,
}

impl FenceGuard {
    /// A guard that has admitted nothing.
    pub fn new() -> FenceGuard {
        FenceGuard::default()
    }

    /// Admits a write carrying `token` if no higher token was admitted before; raises the
    /// mark. Call it in the same critical section as the write itself.
    pub fn admit(&self, token: u64) -> Result<(), StaleToken> {
        self.admit_then(token, || ())
    }

    /// Runs `write` only if `token` is admitted, under the guard's lock, so no higher token
    /// can be admitted between the check and the write.
    pub fn admit_then<T>(&self, token: u64, write: impl FnOnce() -> T) -> Result<T, StaleToken> {
        let mut highest = self.highest.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if token < *highest {
            return Err(StaleToken { token, highest: *highest });
        }
        *highest = token;
        Ok(write())
    }

    /// The highest token admitted so far (0: none).
    pub fn highest(&self) -> u64 {
        *self.highest.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_lower_tokens() {
        let fence = FenceGuard::new();
        assert_eq!(fence.admit(5), Ok(()));
        assert_eq!(fence.admit(5), Ok(()), "the same holder writes again");
        assert_eq!(fence.admit(4), Err(StaleToken { token: 4, highest: 5 }));
        assert_eq!(fence.admit_then(6, || "written"), Ok("written"));
        assert_eq!(fence.admit_then(5, || "written"), Err(StaleToken { token: 5, highest: 6 }));
        assert_eq!(fence.highest(), 6);
    }
}
