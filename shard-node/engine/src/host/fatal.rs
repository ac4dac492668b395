//! A node that cannot go on stops as a whole, as its [`FatalPolicy`] says: one dead worker
//! (or store writer, or transport server) must not leave a process whose other parts look
//! alive while its groups answer `Stopped` forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::FatalPolicy;

/// Ends a node that cannot go on. Cloned into every engine thread and task that can fail,
/// and into the node's servers ([`Engine::fatal`](super::Engine::fatal)).
#[derive(Clone)]
pub struct Fatal {
    node_id: u64,
    policy: FatalPolicy,
    /// The node's stop flag: every worker leaves its loop once it is set.
    stop: Arc<AtomicBool>,
}

impl Fatal {
    pub(crate) fn new(node_id: u64, policy: FatalPolicy, stop: Arc<AtomicBool>) -> Fatal {
        Fatal { node_id, policy, stop }
    }

    /// The node cannot go on because of `cause`: abort the process, or stop every engine
    /// thread of the node.
    pub fn fail(&self, cause: &str) {
        if self.stop.load(Ordering::SeqCst) {
            // Already stopping, on purpose or for an earlier cause: parts going away is expected.
            tracing::debug!(node = self.node_id, cause, "while the node stops");
            return;
        }
        match self.policy {
            FatalPolicy::Abort => {
                tracing::error!(node = self.node_id, cause, "the node cannot go on: aborting the process so that a supervisor restarts it");
                std::process::abort();
            }
            FatalPolicy::StopNode => {
                tracing::error!(node = self.node_id, cause, "the node cannot go on: stopping all of its engine threads");
                self.stop.store(true, Ordering::SeqCst);
            }
        }
    }

    /// A guard for an engine thread named `thread` to hold for its whole life: if the thread
    /// panics, the guard is dropped while unwinding and fails the node.
    pub(crate) fn watch_thread(&self, thread: String) -> ThreadWatch {
        ThreadWatch { fatal: self.clone(), thread }
    }
}

/// Held by an engine thread for its whole life; fails the node if the thread panics.
pub(crate) struct ThreadWatch {
    fatal: Fatal,
    thread: String,
}

impl Drop for ThreadWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.fatal.fail(&format!("thread {} panicked", self.thread));
        }
    }
}
