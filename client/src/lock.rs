//! Locks held by a session: [`LockGuard`] and what describes a hold ([`Sequencer`]).
//!
//! A lock is a node whose children are its waiters (ephemeral-sequential nodes of the
//! waiting sessions), granted in order. `Lock` creates the session's waiter and, when asked,
//! waits server-side until it holds or the wait times out — a wait that times out, or whose
//! caller hangs up, removes its waiter. Each call carries a request id, so resending it
//! finds the same waiter instead of queueing a second one.
//!
//! The server caps one call's wait (at its request timeout, 5 s by default, and at most
//! 300 s), so a longer wait is a series of calls; each new call queues at the back.

use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::Client;
use crate::convert;
use crate::error::Result;
use crate::retry::is_transient;
use crate::session::{Session, SessionId, SessionState};

/// Longest wait of one `Lock` call (the server refuses longer ones).
pub(crate) const LOCK_WAIT_PER_CALL_MAX: Duration = Duration::from_secs(300);

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
    /// Chubby's lock-delay: if a holder's session expires (rather than unlocking), nobody else
    /// gets the lock for this long (at most 60 s; set by the lock's first waiter).
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
    loop {
        let wait = deadline.map_or(LOCK_WAIT_PER_CALL_MAX, |d| d.saturating_duration_since(Instant::now())).min(LOCK_WAIT_PER_CALL_MAX);
        let request = convert::lock_request(session.id(), path, options, wait, session.next_request_id());
        match client.lock(request.clone()).await {
            Ok(Some(sequencer)) => return Ok(Some(LockGuard { client: client.clone(), sequencer, session: session.states(), released: false })),
            Ok(None) if wait.is_zero() || deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
            Ok(None) => {}
            Err(error) => {
                if is_transient(&error) {
                    abandon(client.clone(), request);
                }
                return Err(error);
            }
        }
    }
}

/// After a `Lock` call whose outcome is unknown, makes sure its waiter does not stay behind:
/// the same request without waiting finds the waiter if it exists, and the server removes it
/// unless it holds, in which case it is unlocked. In the background, best effort.
fn abandon(client: Client, mut request: warden_proto::v1::LockRequest) {
    request.wait = false;
    request.timeout_ms = 0;
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
