//! A distributed mutex (etcd `concurrency.Mutex`, Curator `InterProcessMutex`, Chubby's
//! exclusive lock): a thin name for the server's exclusive lock, held by a [`Session`].

use crate::error::Result;
use crate::lock::LockGuard;
use crate::session::Session;

/// An exclusive lock on `path` for one session. Waiters are queued FIFO on the server and
/// only the next holder is woken (no herd).
///
/// A hold ends with [`LockGuard::unlock`], when the guard is dropped (in the background), or
/// when the session ends; while the session is in jeopardy the hold may already be gone and
/// [`LockGuard::is_valid`] is false. Send [`LockGuard::fencing_token`] with every write the
/// lock protects, and have the resource refuse stale tokens ([`FenceGuard`](crate::FenceGuard)).
pub struct Mutex<'s> {
    session: &'s Session,
    path: String,
}

impl<'s> Mutex<'s> {
    /// The mutex at `path`, taken by `session`.
    pub fn new(session: &'s Session, path: impl Into<String>) -> Mutex<'s> {
        Mutex { session, path: path.into() }
    }

    /// Waits until this session holds the mutex (as long as the session lives).
    pub async fn lock(&self) -> Result<LockGuard> {
        self.session.lock(&self.path).await
    }

    /// Takes the mutex if it is free now; `None` if someone holds it.
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.session.try_lock(&self.path).await
    }
}
