//! Locks held by a session: [`LockGuard`] and what describes a hold ([`Sequencer`]).
//!
//! A lock is a node whose children are its waiters (ephemeral-sequential nodes of the
//! waiting sessions), granted in order. `Lock` creates the session's waiter and, when asked,
//! waits server-side until it holds or the wait times out. Each call carries a request id, so
//! resending it finds the same waiter instead of queueing a second one.
//!
//! The server caps one call's wait (at its request timeout, 5 s by default, and at most
//! 300 s), so a longer wait is a series of calls with one request id: each call asks the
//! server to keep the waiter queued when its wait ends, and the next one re-attaches to it, so
//! the waiter keeps its place in the FIFO queue for as long as the session lives and the
//! client keeps waiting. A wait that ends without the lock removes the waiter (a last try-lock
//! with the same id, which takes the lock if the waiter holds by then); so does dropping the
//! waiting future (in the background).

use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::Client;
use crate::convert;
use crate::error::Result;
use crate::retry::is_transient;
use crate::session::{Session, SessionId, SessionState};

/// Longest wait of one `Lock` call (the server refuses longer ones).
const LOCK_WAIT_PER_CALL_MAX: Duration = Duration::from_secs(300);

/// Who may hold a lock together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Any number of shared holders, and no exclusive one.
    Shared,
}

/// Chubby's sequencer: names one hold of a lock. Its `token` only grows for a lock path, so
/// a resource that remembers the highest token it has seen can refuse a late holder
/// ([`FenceGuard`](crate::FenceGuard)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sequencer {
    /// The lock.
    pub path: String,
    /// Exclusive or shared.
    pub mode: LockMode,
    /// The fencing token (the waiter node's create revision).
    pub token: u64,
    /// The group serving the lock.
    pub group_id: u64,
    /// The waiter node (a child of `path`) that is this hold.
    pub waiter: String,
}

/// How a lock is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockOptions {
    /// Exclusive or shared.
    pub mode: LockMode,
    /// Chubby's lock-delay: if this hold's session expires (rather than unlocking), nobody new
    /// gets the lock for this long (at most the cluster's `lock_delay_ms_max`, 60 s by
    /// default; holders sharing the lock keep their holds).
    pub lock_delay: Duration,
    /// How long to wait for the lock (zero: only if it is free now).
    pub wait: Duration,
}

/// A holder or waiter of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockWaiter {
    /// Its waiter node.
    pub waiter: String,
    /// Exclusive or shared.
    pub mode: LockMode,
    /// The session waiting or holding.
    pub session: SessionId,
    /// Its fencing token.
    pub token: u64,
}

/// The state of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// Who holds it.
    pub holders: Vec<LockWaiter>,
    /// Who waits, in grant order.
    pub waiters: Vec<LockWaiter>,
    /// When a lock-delay in force ends (leader wall clock), if one is.
    pub blocked_until: Option<SystemTime>,
}

/// A held lock. Released by [`LockGuard::unlock`], or on drop (in the background, best
/// effort); lost if its session ends.
pub struct LockGuard {
    client: Client,
    sequencer: Sequencer,
    session: watch::Receiver<SessionState>,
    released: bool,
}

impl LockGuard {
    /// The fencing token to send with every write the lock protects.
    pub fn fencing_token(&self) -> u64 {
        self.sequencer.token
    }

    /// The hold's sequencer (to pass to a resource that checks it with the server).
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    /// Whether the hold can be relied on: false once the session is in jeopardy or has ended
    /// (true again if it comes back [`Safe`](SessionState::Safe)).
    pub fn is_valid(&self) -> bool {
        !self.released && self.session.borrow().is_live()
    }

    /// Releases the lock (no lock-delay applies).
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.client.unlock(&self.sequencer).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released || self.session.borrow().has_ended() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (client, sequencer) = (self.client.clone(), self.sequencer.clone());
            runtime.spawn(async move {
                if let Err(error) = client.unlock(&sequencer).await {
                    tracing::debug!(path = %sequencer.path, %error, "unlocking a dropped lock guard");
                }
            });
        }
    }
}

/// Asks for the lock on `path` for `session` until acquired or `options.wait` has passed.
pub(crate) async fn acquire(session: &Session, path: &str, options: &LockOptions) -> Result<Option<LockGuard>> {
    let client = session.client();
    let deadline = Instant::now().checked_add(options.wait);
    // One request id for the whole wait: every call re-attaches to the same waiter.
    let request_id = session.next_request_id();
    let request = |wait: Duration| convert::lock_request(session.id(), path, options, wait, request_id);
    // From the first call on, a waiter may be queued: if this future is dropped before it
    // ends, the waiter is abandoned in the background.
    let mut queued = AbandonOnDrop { client: Some(client.clone()), request: request(Duration::ZERO) };
    loop {
        // Zero once the wait is over (or for a try-lock): a try-lock with the same request id
        // takes the lock if the waiter holds by now, and otherwise removes it.
        let wait = deadline.map_or(LOCK_WAIT_PER_CALL_MAX, |d| d.saturating_duration_since(Instant::now())).min(LOCK_WAIT_PER_CALL_MAX);
        match client.lock(request(wait)).await {
            Ok(Some(sequencer)) => {
                queued.disarm();
                return Ok(Some(LockGuard { client: client.clone(), sequencer, session: session.states(), released: false }));
            }
            Ok(None) if wait.is_zero() => {
                queued.disarm();
                return Ok(None);
            }
            // This call's wait ended with the waiter still queued: wait on in its place.
            Ok(None) => {}
            Err(error) => {
                if !is_transient(&error) {
                    // Refused (the session ended, bad input): no waiter is left behind.
                    queued.disarm();
                }
                return Err(error);
            }
        }
    }
}

/// Abandons the waiter of an unfinished `acquire` (see [`abandon`]) when dropped armed.
struct AbandonOnDrop {
    client: Option<Client>,
    request: warden_proto::v1::LockRequest,
}

impl AbandonOnDrop {
    fn disarm(&mut self) {
        self.client = None;
    }
}

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                abandon(client, self.request.clone());
            }
        }
    }
}

/// After a `Lock` call whose outcome is unknown or whose caller gave up, makes sure its waiter
/// does not stay behind: the same request without waiting finds the waiter if it exists, and
/// the server removes it unless it holds, in which case it is unlocked. In the background,
/// best effort.
fn abandon(client: Client, mut request: warden_proto::v1::LockRequest) {
    request.wait = false;
    request.timeout_ms = 0;
    request.keep_queued = false;
    tokio::spawn(async move {
        match client.lock(request).await {
            Ok(Some(sequencer)) => {
                if let Err(error) = client.unlock(&sequencer).await {
                    tracing::debug!(path = %sequencer.path, %error, "releasing an abandoned lock hold");
                }
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, "abandoning a lock request"),
        }
    });
}
