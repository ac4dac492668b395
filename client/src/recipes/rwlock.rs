//! A distributed read-write lock (Curator `InterProcessReadWriteLock`): the server's shared
//! and exclusive lock modes on one path.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::lock::{LockGuard, LockMode, LockOptions};
use crate::session::Session;

/// A read-write lock on `path` for one session: any number of readers or one writer.
/// Requests are granted in FIFO order, so a waiting writer holds back readers that come after
/// it (no writer starvation); only the waiters that now hold are woken.
///
/// Holds end like [`Mutex`](super::Mutex) holds: unlock, drop, or the session's end (not
/// valid in jeopardy). A reader's fencing token orders it against writers.
pub struct RwLock<'s> {
    session: &'s Session,
    path: String,
}

impl<'s> RwLock<'s> {
    /// The read-write lock at `path`, taken by `session`.
    pub fn new(session: &'s Session, path: impl Into<String>) -> RwLock<'s> {
        RwLock { session, path: path.into() }
    }

    /// Waits for a shared (read) hold.
    pub async fn read(&self) -> Result<LockGuard> {
        self.acquire(LockMode::Shared).await
    }

    /// Waits for the exclusive (write) hold.
    pub async fn write(&self) -> Result<LockGuard> {
        self.acquire(LockMode::Exclusive).await
    }

    async fn acquire(&self, mode: LockMode) -> Result<LockGuard> {
        // No deadline: the lock is asked for again and again (as long as the session lives).
        let options = LockOptions { mode, wait: Duration::MAX, ..LockOptions::default() };
        self.session
            .lock_with(&self.path, &options)
            .await?
            .ok_or_else(|| Error::Protocol { message: format!("a wait without deadline for {} returned without the lock", self.path) })
    }
}
