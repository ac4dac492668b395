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
