//! The node's own metrics, beside the engine's in the node's registry
//! (`warden_engine::metrics`): what the namespace replicas this node leads hold and what
//! its watches do, refreshed at each scrape through the engine's
//! [`ScrapeSource`](warden_engine::metrics::ScrapeSource).
//!
//! Architecture invariant: no label takes a value per path, session or group (see the
//! engine's metrics); what the groups hold is summed over the groups this node leads.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};
use warden_engine::metrics::ScrapeSource;
use warden_namespace::counts::NamespaceCounts;
use warden_namespace::watch::WatchHubs;
use warden_server_kit::metrics::registered;

/// Brings a counter kept elsewhere (an atomic that only grows) up to `total`.
fn sync_counter(counter: &IntCounter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

/// The namespace and watch metrics of one node.
pub struct NamespaceMetrics {
    watches: IntGauge,
    /// `warden_namespace_held{kind}`: what the groups this node leads hold.
    held: IntGaugeVec,
    watch_events: IntCounter,
    slow_watchers: IntCounter,
    hubs: Mutex<Option<WatchHubs>>,
    namespace: Mutex<Option<NamespaceCounts>>,
}

impl NamespaceMetrics {
    /// Every namespace and watch metric of a node, registered in `r`, zero.
    pub fn register(r: &Registry) -> NamespaceMetrics {
        NamespaceMetrics {
            watches: registered(r, IntGauge::new("warden_namespace_watches", "Live watches served by this node.")),
            held: registered(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "warden_namespace_held",
                        "What the groups this node leads hold, by kind: nodes, ephemerals, lock_holders, lock_waiters (not holding), sessions, lock_delays (locks in their lock-delay). Summed over nodes: each group counted once.",
                    ),
                    &["kind"],
                ),
            ),
            watch_events: registered(r, IntCounter::new("warden_watch_events_sent_total", "Watch events queued to watch streams.")),
            slow_watchers: registered(
                r,
                IntCounter::new("warden_watch_slow_cancels_total", "Watches cancelled SLOW_WATCHER (their client read too slowly)."),
            ),
            hubs: Mutex::new(None),
            namespace: Mutex::new(None),
        }
    }

    /// Reads the watches of the node's hubs at each scrape.
    pub fn attach_watches(&self, hubs: WatchHubs) {
        *self.hubs.lock().unwrap_or_else(|e| e.into_inner()) = Some(hubs);
    }

    /// Reads what the node's namespace replicas hold at each scrape.
    pub fn attach_namespace(&self, counts: NamespaceCounts) {
        *self.namespace.lock().unwrap_or_else(|e| e.into_inner()) = Some(counts);
    }
}

impl ScrapeSource for NamespaceMetrics {
    fn refresh(&self, node_id: u64, led: &[u64]) {
        if let Some(counts) = self.namespace.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let held = counts.sum(node_id, led);
            let kinds = [
                ("nodes", held.nodes),
                ("ephemerals", held.ephemerals),
                ("lock_holders", held.lock_holders),
                ("lock_waiters", held.lock_waiters.saturating_sub(held.lock_holders)),
                ("sessions", held.sessions),
                ("lock_delays", held.lock_delays),
            ];
            for (kind, value) in kinds {
                self.held.with_label_values(&[kind]).set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        if let Some(hubs) = self.hubs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            self.watches.set(hubs.watches_on(node_id) as i64);
            let counters = hubs.counters(node_id);
            sync_counter(&self.watch_events, counters.events_sent.load(Ordering::Relaxed));
            sync_counter(&self.slow_watchers, counters.slow_cancels.load(Ordering::Relaxed));
        }
    }
}
