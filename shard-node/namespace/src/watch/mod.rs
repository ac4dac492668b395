//! Watches: the events a group's applied writes produce, a bounded history of them per
//! replica, and their delivery to the watch streams of clients.
//!
//! - [`event`]: what an event is, and which events a watch wants (one matching rule for both
//!   the live path and catch-up from history).
//! - [`hub`]: one per hosted replica of a group. The state machine publishes each applied
//!   revision's events into it (after the apply write, in revision order); it keeps them in a
//!   bounded history and pushes them to the live watches indexed by path.
//! - [`stream`]: one per client `Watch` call: the watches it carries and its bounded queue of
//!   outgoing responses. A watch that would overflow the queue is cancelled with a resume
//!   revision instead of growing memory.
//!
//! Architecture invariant: nothing here knows about Raft or RocksDB. The hub sees only
//! revisions and events, handed over by the state machine once the apply write is done, so
//! an event is never visible before the state it describes.
//! Lock order: a hub's lock, then a stream's lock (never the other way round).

pub mod event;
pub mod hub;
pub mod stream;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

pub use event::{Event, EventBatch, EventKind, PathBounds, WatchSpec};
pub use hub::WatchHub;
pub use stream::WatchStream;

/// What a node's watch hubs did, for its metrics.
#[derive(Debug, Default)]
pub struct WatchCounters {
    /// Events queued to watch streams.
    pub events_sent: std::sync::atomic::AtomicU64,
    /// Watches cancelled SLOW_WATCHER (their stream's queue was full).
    pub slow_cancels: std::sync::atomic::AtomicU64,
}

/// Limits of watches (DESIGN.md rule 8).
#[derive(Clone, Debug)]
pub struct WatchLimits {
    /// Revisions of events a replica keeps per group for watches that start in the past.
    pub history_revisions_max: usize,
    /// Bytes of events a replica keeps per group (paths, data and previous data).
    pub history_bytes_max: usize,
    /// Watches one stream carries at once.
    pub watches_per_stream_max: usize,
    /// Bytes of responses queued for one stream; a watch whose events do not fit is cancelled
    /// with `SLOW_WATCHER`.
    pub stream_queue_bytes_max: usize,
    /// How long a watch with `progress_notify` stays quiet before a progress response.
    pub progress_interval_ms: u64,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            history_revisions_max: 100_000,
            history_bytes_max: 16 << 20,
            watches_per_stream_max: 100_000,
            stream_queue_bytes_max: 16 << 20,
            progress_interval_ms: 10_000,
        }
    }
}

/// Hubs by (node, group).
type HubsByReplica = HashMap<(u64, u64), Arc<WatchHub>>;

/// The watches a node serves under each quota prefix that limits watches (watches
/// are not replicated, so their quota holds per node serving them).
#[derive(Debug, Default)]
pub struct WatchCounts {
    counts: std::sync::Mutex<HashMap<String, u64>>,
}

/// A watch's place in its node's [`WatchCounts`], given back when the last copy of its
/// stream entry is dropped (whichever way the watch ended).
#[derive(Debug)]
pub struct WatchCharge {
    counts: Arc<WatchCounts>,
    prefixes: Vec<String>,
}

impl Drop for WatchCharge {
    fn drop(&mut self) {
        let mut counts = self.counts.counts.lock().unwrap_or_else(|e| e.into_inner());
        for prefix in &self.prefixes {
            if let Some(count) = counts.get_mut(prefix) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(prefix);
                }
            }
        }
    }
}

/// A watch the quota `prefix` has no room for: its `limit` and the usage it would reach.
#[derive(Debug)]
pub struct WatchQuotaExceeded {
    /// The quota's prefix.
    pub prefix: String,
    /// Its watch limit.
    pub limit: u64,
}

/// The hubs of every replica hosted in this process, by (node, group): the state machines
/// register theirs, the `Watch` service looks them up. Carries the limits both use.
#[derive(Clone, Default)]
pub struct WatchHubs {
    /// What each node's hubs counted, by node id (kept across replicas: counters only grow).
    counters: Arc<RwLock<HashMap<u64, Arc<WatchCounters>>>>,
    hubs: Arc<RwLock<HubsByReplica>>,
    limits: Arc<WatchLimits>,
    counts: Arc<WatchCounts>,
}

impl WatchHubs {
    /// No hubs yet; watches will have `limits`.
    pub fn new(limits: WatchLimits) -> WatchHubs {
        WatchHubs { counters: Arc::default(), hubs: Arc::default(), limits: Arc::new(limits), counts: Arc::default() }
    }

    /// Counts one more watch under each of the quotas `covering` it (`(prefix, limit)`),
    /// or refuses it when one has no room. `None`: no quota covers it.
    pub fn charge_watch(&self, covering: Vec<(String, u64)>) -> Result<Option<Arc<WatchCharge>>, WatchQuotaExceeded> {
        if covering.is_empty() {
            return Ok(None);
        }
        let mut counts = self.counts.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((prefix, limit)) = covering.iter().find(|(prefix, limit)| counts.get(prefix).copied().unwrap_or(0) >= *limit) {
            return Err(WatchQuotaExceeded { prefix: prefix.clone(), limit: *limit });
        }
        let prefixes: Vec<String> = covering.into_iter().map(|(prefix, _)| prefix).collect();
        for prefix in &prefixes {
            *counts.entry(prefix.clone()).or_default() += 1;
        }
        Ok(Some(Arc::new(WatchCharge { counts: self.counts.clone(), prefixes })))
    }

    /// The limits of watches.
    pub fn limits(&self) -> &WatchLimits {
        &self.limits
    }

    /// The counters of `node`'s hubs (made on first use).
    pub fn counters(&self, node: u64) -> Arc<WatchCounters> {
        if let Some(counters) = self.counters.read().unwrap_or_else(|e| e.into_inner()).get(&node) {
            return counters.clone();
        }
        self.counters.write().unwrap_or_else(|e| e.into_inner()).entry(node).or_default().clone()
    }

    /// Live watches on `node`'s hubs.
    pub fn watches_on(&self, node: u64) -> usize {
        let hubs: Vec<Arc<WatchHub>> =
            self.hubs.read().unwrap_or_else(|e| e.into_inner()).iter().filter(|((n, _), _)| *n == node).map(|(_, hub)| hub.clone()).collect();
        hubs.iter().map(|hub| hub.stats().2).sum()
    }

    /// The hub of `group`'s replica on `node`, if hosted.
    pub fn get(&self, node: u64, group: u64) -> Option<Arc<WatchHub>> {
        self.hubs.read().unwrap_or_else(|e| e.into_inner()).get(&(node, group)).cloned()
    }

    /// Registers the hub of a replica (replacing a previous replica's).
    pub fn insert(&self, node: u64, group: u64, hub: Arc<WatchHub>) {
        self.hubs.write().unwrap_or_else(|e| e.into_inner()).insert((node, group), hub);
    }

    /// Forgets `hub` if it is still the one registered (a newer replica may have replaced it).
    pub fn remove(&self, node: u64, group: u64, hub: &Arc<WatchHub>) {
        let mut hubs = self.hubs.write().unwrap_or_else(|e| e.into_inner());
        if hubs.get(&(node, group)).is_some_and(|current| Arc::ptr_eq(current, hub)) {
            hubs.remove(&(node, group));
        }
    }
}
