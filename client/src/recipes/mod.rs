//! Coordination recipes built on sessions, ephemeral-sequential nodes, locks, watches and
//! compare-and-swap — the counterparts of etcd's `clientv3/concurrency`, Apache Curator's
//! recipes and Chubby's client library.
//!
//! | recipe | module | built on |
//! |---|---|---|
//! | [`Mutex`] | [`mutex`] | the server's exclusive lock (FIFO, no herd) |
//! | [`RwLock`] | [`rwlock`] | the server's shared / exclusive lock modes |
//! | [`Semaphore`] | [`semaphore`] | an internal lock + ephemeral lease nodes |
//! | [`Election`] | [`election`] | ephemeral-sequential candidates, each watching its predecessor |
//! | [`Membership`] | [`membership`] | ephemeral member nodes + a watch of the group |
//! | [`Barrier`], [`DoubleBarrier`] | [`barrier`] | a barrier node; ephemeral participants + a `ready` node |
//! | [`Counter`] | [`counter`] | compare-and-swap on a node's version |
//! | [`NodeCache`] | [`cache`] | a read at a revision + a watch from the next one |
//!
//! Every recipe that belongs to a [`Session`] holds ephemeral nodes or locks of it, so
//! what it grants (a lock hold, a permit, leadership, membership, a place in a barrier) ends
//! when the session ends; each says how to tell ([`SessionState`]: in jeopardy the grant may
//! already be gone, so `is_valid` turns false).
//!
//! None of the waiting recipes herds: a waiter watches at most one node whose change concerns
//! it (its predecessor, or a node only the one waiter at the head of a queue watches), so one
//! release wakes O(1) waiters, not all of them.

pub mod barrier;
pub mod cache;
pub mod counter;
pub mod election;
pub mod membership;
pub mod mutex;
pub mod rwlock;
pub mod semaphore;

pub use barrier::{Barrier, DoubleBarrier};
pub use cache::NodeCache;
pub use counter::Counter;
pub use election::{Election, Leader, LeaderObserver, Leadership};
pub use membership::{Member, MembersWatch, Membership};
pub use mutex::Mutex;
pub use rwlock::RwLock;
pub use semaphore::{Permit, Semaphore};

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use warden_paths::join;

use crate::children::{Child, ChildrenOptions};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::node::{CreateOptions, Created, DeleteOptions};
use crate::session::{Session, SessionId, SessionState};
use crate::watch::{EventKind, EventKinds, WatchOptions};

/// Distinguishes the nodes one process creates within one session (with the session id, it
/// names a node so that a create whose outcome is unknown can be found again).
static NONCE: AtomicU64 = AtomicU64::new(0);

/// What a recipe keeps of the session it belongs to: the client, the session's id (for
/// ephemeral nodes) and its state.
#[derive(Clone)]
pub(crate) struct Owner {
    client: Client,
    id: SessionId,
    states: watch::Receiver<SessionState>,
}

impl Owner {
    fn of(session: &Session) -> Owner {
        Owner { client: session.client().clone(), id: session.id(), states: session.states() }
    }

    /// Whether the session is known to be alive (not in jeopardy, not ended).
    fn is_live(&self) -> bool {
        self.states.borrow().is_live()
    }

    /// Runs `future` unless the session ends first ([`Error::SessionExpired`] then).
    async fn while_alive<T>(&self, future: impl Future<Output = Result<T>>) -> Result<T> {
        let mut states = self.states.clone();
        tokio::select! {
            output = future => output,
            _ = states.wait_for(|state| state.has_ended()) => Err(Error::SessionExpired),
        }
    }

    /// Creates an ephemeral-sequential node `dir/{prefix}{session}-{nonce}-{counter}`. If the
    /// outcome of the create is unknown, looks for it by its unique name before giving up.
    async fn create_sequential(&self, dir: &str, prefix: &str, data: Vec<u8>) -> Result<Created> {
        let name = format!("{prefix}{:016x}-{}-", self.id.0, NONCE.fetch_add(1, Ordering::Relaxed));
        let options = CreateOptions::ephemeral(self.id).sequential().create_parents();
        match self.client.create(&join(dir, &name), data, &options).await {
            Err(unknown @ Error::OutcomeUnknown { .. }) => {
                let found = children(&self.client, dir).await?.into_iter().find(|child| child.name.starts_with(&name));
                match found {
                    Some(Child { name, stat: Some(stat) }) => Ok(Created { path: join(dir, &name), stat }),
                    _ => Err(unknown),
                }
            }
            created => created,
        }
    }
}

/// The parent of `path` (`/` for top-level nodes).
fn parent_of(path: &str) -> &str {
    warden_paths::parent(path).unwrap_or("/")
}

/// The children of `dir` with their stats, in name order; none when `dir` does not exist.
async fn children(client: &Client, dir: &str) -> Result<Vec<Child>> {
    match client.children(dir, ChildrenOptions { with_stats: true, page_size: 0 }).all().await {
        Err(Error::NoNode { .. }) => Ok(Vec::new()),
        listed => listed,
    }
}

/// The children of `dir` named `prefix…` with their stats, oldest (lowest create revision)
/// first.
async fn queue(client: &Client, dir: &str, prefix: &str) -> Result<Vec<(String, u64)>> {
    let mut queue: Vec<(String, u64)> = children(client, dir)
        .await?
        .into_iter()
        .filter(|child| child.name.starts_with(prefix))
        .filter_map(|child| child.stat.map(|stat| (join(dir, &child.name), stat.create_revision)))
        .collect();
    queue.sort_by_key(|(_, revision)| *revision);
    Ok(queue)
}

/// Creates `path` as a persistent node (and its ancestors) unless it exists.
async fn ensure_node(client: &Client, path: &str) -> Result<()> {
    match client.create(path, Vec::new(), &CreateOptions::persistent().create_parents()).await {
        Ok(_) | Err(Error::NodeExists { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Deletes `path`; a node already gone is no error.
async fn delete_if_present(client: &Client, path: &str) -> Result<()> {
    match client.delete(path, &DeleteOptions::default()).await {
        Ok(_) | Err(Error::NoNode { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Deletes `path` in the background, best effort (what dropped guards do).
fn delete_in_background(client: &Client, path: &str) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let (client, path) = (client.clone(), path.to_string());
        runtime.spawn(async move {
            if let Err(error) = delete_if_present(&client, &path).await {
                tracing::debug!(%path, %error, "deleting the node of a dropped recipe guard");
            }
        });
    }
}

/// Watch options for the deletions of `path` (and, with `recursive`, of the nodes below).
fn deletions(path: &str, recursive: bool) -> WatchOptions {
    WatchOptions { recursive, kinds: EventKinds { created: false, changed: false, deleted: true }, ..WatchOptions::new(path) }
}

/// Waits until `path` exists (`exists = true`) or does not: watches it first, then checks,
/// so no change between the two is missed. Only this node is watched; each event received is
/// counted in `notifications`.
async fn await_existence(client: &Client, path: &str, exists: bool, notifications: &AtomicU64) -> Result<()> {
    let kinds = EventKinds { created: exists, changed: false, deleted: !exists };
    let mut watcher = client.watch(WatchOptions { kinds, ..WatchOptions::new(path) }).await?;
    if client.exists(path).await?.is_some() == exists {
        return Ok(());
    }
    let wanted = if exists { EventKind::Created } else { EventKind::Deleted };
    loop {
        let event = watcher.next().await?.ok_or_else(|| watch_ended(path))?;
        notifications.fetch_add(1, Ordering::Relaxed);
        if event.kind == wanted {
            return Ok(());
        }
    }
}

/// The error of a watch the server ended while a recipe relied on it.
fn watch_ended(path: &str) -> Error {
    Error::Unavailable { message: format!("the watch of {path} ended") }
}
