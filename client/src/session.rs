//! Sessions, in Chubby's model. A session is a lease the server keeps while the client renews
//! it; its ephemeral nodes and lock holds end with it.
//!
//! Each [`Session`] renews its lease from its own spawned task, every third of the TTL, so
//! application work never delays a keepalive. The client keeps a *local lease*: the instant a
//! successful keepalive was sent plus the time the server said it still gives the session —
//! an under-estimate of the server's own lease, since the server started counting later
//! (when the keepalive reached it). It also never outlives a *new* leader's deadline: a leader
//! answers a keepalive only once a quorum confirmed that no other leader was elected before the
//! keepalive arrived, and a new leader gives every session a full TTL from its election.
//! Its state ([`SessionState`]) follows:
//!
//! - [`Connected`](SessionState::Connected) while keepalives succeed;
//! - [`Jeopardy`](SessionState::Jeopardy) once the local lease lapses without a successful
//!   keepalive: the server may already have ended the session, so what it protects (a lock
//!   guard, an ephemeral node) must not be relied on; keepalives go on;
//! - [`Safe`](SessionState::Safe) when a keepalive succeeds during jeopardy: the session
//!   survived (for instance because a new leader granted every session a fresh TTL) and is
//!   connected again;
//! - [`Expired`](SessionState::Expired) when the server says the session has ended, or the
//!   grace period passes in jeopardy; [`Closed`](SessionState::Closed) once closed or dropped.
//!   Both are final.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

use crate::client::{deadline_after, Client};
use crate::config::SessionConfig;
use crate::error::{Error, Result};
use crate::lock::{self, LockGuard, LockOptions};
use crate::retry::Backoff;

/// A session's id (its home group is in the high 24 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Where a session stands, as far as the client can tell (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// Keepalives succeed; the local lease holds.
    Connected,
    /// The local lease lapsed without a successful keepalive; the session may have ended.
    Jeopardy,
    /// A keepalive succeeded during jeopardy: the session survived and is connected again.
    Safe,
    /// The session ended on the server (or the grace period passed). Final.
    Expired,
    /// The session was closed (or dropped) by this client. Final.
    Closed,
}

impl SessionState {
    /// Whether the session is known to be alive (connected or safe).
    pub fn is_live(self) -> bool {
        matches!(self, SessionState::Connected | SessionState::Safe)
    }

    /// Whether the session is over (expired or closed).
    pub fn has_ended(self) -> bool {
        matches!(self, SessionState::Expired | SessionState::Closed)
    }
}

/// A session's lease as the leader of its group sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLease {
    /// False: the session has ended; its ephemerals are gone.
    pub alive: bool,
    /// The TTL the session was granted.
    pub granted_ttl: Duration,
    /// Time the leader still gives the session without keepalives (at least).
    pub remaining: Duration,
}

/// A session's lease and what it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// The lease.
    pub lease: SessionLease,
    /// Ephemeral nodes the session owns (lock waiters included).
    pub ephemerals: u64,
}

/// An open session. Dropping it stops its keepalives and closes it (best effort).
pub struct Session {
    client: Client,
    id: SessionId,
    ttl: Duration,
    state: Arc<watch::Sender<SessionState>>,
    /// The local lease's end, as the keepalive task last moved it.
    lease_until: Arc<watch::Sender<Instant>>,
    keepalive: JoinHandle<()>,
    last_request_id: AtomicU64,
}

impl Session {
    /// Creates a session and starts its keepalive task.
    pub(crate) async fn open(client: &Client, config: SessionConfig) -> Result<Session> {
        let sent_at = Instant::now();
        let (id, ttl) = client.create_session(&config).await?;
        if ttl.is_zero() {
            return Err(Error::Protocol { message: format!("session {id} was granted no TTL") });
        }
        let deadline = sent_at.checked_add(ttl).ok_or_else(|| Error::Protocol { message: format!("session {id} was granted {ttl:?}") })?;
        let state = Arc::new(watch::Sender::new(SessionState::Connected));
        let lease_until = Arc::new(watch::Sender::new(deadline));
        let lease = Lease { deadline, grace_period: config.grace_period, state: state.clone(), until: lease_until.clone() };
        let keepalive = tokio::spawn(keep_alive(client.clone(), id, ttl, lease));
        Ok(Session { client: client.clone(), id, ttl, state, lease_until, keepalive, last_request_id: AtomicU64::new(0) })
    }

    /// The session's id (what ephemeral nodes are created with).
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The TTL the server granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The session's state now.
    pub fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    /// When the local lease lapses, as of the last acknowledged keepalive: until then the
    /// server certainly keeps the session, its ephemeral nodes and its locks (it started
    /// counting later, and a new leader gives every session a full TTL). Only moves forward.
    pub fn lease_until(&self) -> Instant {
        *self.lease_until.borrow()
    }

    /// A receiver of the session's state changes.
    pub fn states(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// The session's lease and ephemerals as the server sees them.
    pub async fn info(&self) -> Result<SessionInfo> {
        self.client.session_info(self.id).await
    }

    /// Acquires an exclusive lock on `path`, waiting as long as it takes (for as long as the
    /// session lives), in its place in the queue.
    pub async fn lock(&self, path: &str) -> Result<LockGuard> {
        let options = LockOptions { wait: Duration::MAX, ..LockOptions::default() };
        self.lock_with(path, &options)
            .await?
            .ok_or_else(|| Error::Protocol { message: format!("a wait without deadline for {path} returned without the lock") })
    }

    /// Acquires an exclusive lock on `path` if it is free now.
    pub async fn try_lock(&self, path: &str) -> Result<Option<LockGuard>> {
        self.lock_with(path, &LockOptions::default()).await
    }

    /// Acquires a lock on `path` as `options` say; `None` when it was not acquired within
    /// `options.wait`.
    pub async fn lock_with(&self, path: &str, options: &LockOptions) -> Result<Option<LockGuard>> {
        lock::acquire(self, path, options).await
    }

    /// Closes the session now: its ephemerals and locks go at once (no lock-delay).
    pub async fn close(self) -> Result<()> {
        self.keepalive.abort();
        match end(&self.state, SessionState::Closed) {
            Some(_) => self.client.close_session(self.id).await.map(|_| ()),
            None => Err(Error::SessionExpired),
        }
    }

    /// Stops the keepalives and lets the session go without closing it, as a process that
    /// died would: the server expires it once its lease lapses, deleting its ephemerals, and
    /// the locks it held enter their lock-delay (a close frees them at once). Its lock
    /// guards stop unlocking on drop. For tests of what a client's crash does (Curator's
    /// `KillSession` serves the same purpose).
    pub fn abandon(self) {
        self.keepalive.abort();
        // Ended here, so neither this drop nor a guard's sends anything to the server.
        let _ = end(&self.state, SessionState::Closed);
    }

    /// The client the session lives on.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// A request id not used before by this session (locks are deduplicated by session and
    /// request id).
    pub(crate) fn next_request_id(&self) -> u64 {
        self.last_request_id.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keepalive.abort();
        if end(&self.state, SessionState::Closed).is_some() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (client, id) = (self.client.clone(), self.id);
                runtime.spawn(async move {
                    if let Err(error) = client.close_session(id).await {
                        tracing::debug!(%id, %error, "closing a dropped session");
                    }
                });
            }
        }
    }
}

/// Moves the state to `last` unless it has already ended; returns the state it left.
fn end(state: &watch::Sender<SessionState>, last: SessionState) -> Option<SessionState> {
    let mut left = None;
    state.send_if_modified(|current| {
        if current.has_ended() {
            return false;
        }
        left = Some(*current);
        *current = last;
        true
    });
    left
}

/// The local lease and the state it drives.
struct Lease {
    /// When the local lease lapses.
    deadline: Instant,
    grace_period: Duration,
    state: Arc<watch::Sender<SessionState>>,
    /// `deadline`, for [`Session::lease_until`].
    until: Arc<watch::Sender<Instant>>,
}

impl Lease {
    /// The next instant the state changes by time alone (`None`: it has ended).
    fn next_change(&self) -> Option<Instant> {
        match *self.state.borrow() {
            SessionState::Connected | SessionState::Safe => Some(self.deadline),
            SessionState::Jeopardy => Some(self.deadline.checked_add(self.grace_period).unwrap_or(self.deadline)),
            SessionState::Expired | SessionState::Closed => None,
        }
    }

    /// Applies the passing of time: a lapsed lease is jeopardy; jeopardy past the grace
    /// period is expiry.
    fn lapse(&self) {
        let now = Instant::now();
        let grace_over = self.deadline.checked_add(self.grace_period).is_some_and(|end| now >= end);
        self.state.send_if_modified(|state| {
            let next = match *state {
                SessionState::Connected | SessionState::Safe if now >= self.deadline => SessionState::Jeopardy,
                SessionState::Jeopardy if grace_over => SessionState::Expired,
                _ => return false,
            };
            *state = next;
            true
        });
    }

    /// A keepalive sent at `sent_at` was answered: the server gives `remaining` from then on.
    fn renewed(&mut self, sent_at: Instant, remaining: Duration) {
        if let Some(deadline) = sent_at.checked_add(remaining) {
            self.deadline = self.deadline.max(deadline);
            self.until.send_replace(self.deadline);
        }
        let now = Instant::now();
        if self.deadline > now {
            self.state.send_if_modified(|state| {
                if *state != SessionState::Jeopardy {
                    return false;
                }
                *state = SessionState::Safe;
                true
            });
        }
    }

    /// Runs `future` while keeping the state current; `None` if the session ended first.
    async fn during<F: Future>(&self, future: F) -> Option<F::Output> {
        tokio::pin!(future);
        loop {
            let change = self.next_change()?;
            tokio::select! {
                output = &mut future => return Some(output),
                () = sleep_until(change) => self.lapse(),
            }
        }
    }
}

/// The keepalive task: renews every third of `ttl` (sooner after failures) until the
/// session ends; aborted when the session is closed or dropped. Each keepalive may take
/// until the local lease lapses (at least a third of `ttl`): a keepalive queued behind a busy
/// node's work still renews the lease when it gets there, where one given up after a third of
/// the TTL would be dropped unanswered and sent again at the back of the queue — and under
/// load the session would expire though its client never stopped renewing it.
async fn keep_alive(client: Client, id: SessionId, ttl: Duration, mut lease: Lease) {
    let interval = ttl / 3;
    let mut backoff = Backoff::new();
    let mut next_send = deadline_after(interval);
    loop {
        if lease.during(sleep_until(next_send)).await.is_none() {
            return;
        }
        let sent_at = Instant::now();
        let timeout = lease.deadline.saturating_duration_since(sent_at).max(interval);
        let Some(answer) = lease.during(client.keep_alive(id, timeout)).await else { return };
        match answer {
            Ok(renewed) if renewed.alive => {
                lease.renewed(sent_at, renewed.remaining);
                backoff = Backoff::new();
                next_send = sent_at + interval;
            }
            Ok(_) | Err(Error::SessionExpired) => {
                end(&lease.state, SessionState::Expired);
                return;
            }
            Err(error) => {
                tracing::debug!(%id, %error, "keepalive failed");
                next_send = Instant::now() + backoff.next_pause();
            }
        }
    }
}
