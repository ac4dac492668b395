//! A cache of one node (Chubby's client cache; Curator `NodeCache`).
//!
//! A background task reads the node and the group's revision in one read-only transaction,
//! then watches the node from the next revision, applying every event in order. So the
//! cached value is always one the node really had, never older than the last event the
//! watch delivered: it lags the server by the watch's delivery delay, and a reader that needs
//! the latest value must read the server ([`Client::get`]). The watch resumes across broken
//! streams without losing events; if it fails for good (the events it needs were compacted,
//! or the routers stayed unreachable for a request timeout), the cache is cleared — `get`
//! reads the server until the task has read and watched again.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::retry::Backoff;
use crate::txn::{Txn, TxnOp, TxnOpResult};
use crate::watch::{EventKind, WatchOptions};

/// What the cache knows of its node.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cached {
    /// Nothing (not read yet, or cleared after the watch failed).
    Unknown,
    /// The node as of the last event (`None`: it does not exist).
    Known(Option<Node>),
}

/// A locally served, watch-maintained copy of one node. Dropping it stops its watch.
pub struct NodeCache {
    client: Client,
    path: String,
    state: watch::Receiver<Cached>,
    task: JoinHandle<()>,
}

impl NodeCache {
    /// Starts caching `path` (the first read and watch happen in the background).
    pub fn new(client: &Client, path: impl Into<String>) -> NodeCache {
        let path = path.into();
        let (sender, state) = watch::channel(Cached::Unknown);
        let task = tokio::spawn(maintain(client.clone(), path.clone(), Arc::new(sender)));
        NodeCache { client: client.clone(), path, state, task }
    }

    /// The node (`None`: it does not exist) from the cache; from the server when the cache
    /// knows nothing yet (a miss is not stored: only the watch task fills the cache).
    pub async fn get(&self) -> Result<Option<Node>> {
        if let Cached::Known(node) = &*self.state.borrow() {
            return Ok(node.clone());
        }
        match self.client.get(&self.path).await {
            Ok(node) => Ok(Some(node)),
            Err(Error::NoNode { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The cached node without asking the server: `None` when the cache knows nothing,
    /// `Some(None)` when it knows the node does not exist.
    pub fn cached(&self) -> Option<Option<Node>> {
        match &*self.state.borrow() {
            Cached::Known(node) => Some(node.clone()),
            Cached::Unknown => None,
        }
    }

    /// Waits until the cache knows the node (after its first read and watch).
    pub async fn ready(&self) -> Result<()> {
        let mut state = self.state.clone();
        let known = async move { state.wait_for(|cached| *cached != Cached::Unknown).await.map(|_| ()) };
        match tokio::time::timeout(self.client.request_timeout(), known).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Error::Unavailable { message: format!("the cache of {} stopped", self.path) }),
            Err(_) => Err(Error::DeadlineExceeded),
        }
    }
}

impl Drop for NodeCache {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The cache's task: read and watch, again after every failure (clearing the cache first).
async fn maintain(client: Client, path: String, state: Arc<watch::Sender<Cached>>) {
    let mut backoff = Backoff::new();
    loop {
        let error = follow(&client, &path, &state, &mut backoff).await;
        state.send_replace(Cached::Unknown);
        tracing::debug!(%path, %error, "node cache cleared");
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

/// Reads the node with the group's revision, then applies the watch's events from the next
/// revision until the watch fails; returns why.
async fn follow(client: &Client, path: &str, state: &watch::Sender<Cached>, backoff: &mut Backoff) -> Error {
    let read = match client.txn(&Txn::new().then(TxnOp::get(path))).await {
        Ok(read) => read,
        Err(error) => return error,
    };
    let node = match read.results.into_iter().next() {
        Some(TxnOpResult::Got(node)) => node,
        other => return Error::Protocol { message: format!("a read of {path} returned {other:?}") },
    };
    let options = WatchOptions { start_revision: read.revision.saturating_add(1), ..WatchOptions::new(path) };
    let mut watcher = match client.watch(options).await {
        Ok(watcher) => watcher,
        Err(error) => return error,
    };
    state.send_replace(Cached::Known(node));
    *backoff = Backoff::new();
    loop {
        match watcher.next().await {
            Ok(Some(event)) => {
                let node = (event.kind != EventKind::Deleted).then_some(event.node);
                state.send_replace(Cached::Known(node));
            }
            Ok(None) => return Error::Unavailable { message: format!("the watch of {path} ended") },
            Err(error) => return error,
        }
    }
}
