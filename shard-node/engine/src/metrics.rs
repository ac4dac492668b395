//! A node's Prometheus metrics: one registry per node, served at `GET /metrics`
//! on `--metrics-listen` (`warden_server_kit::metrics`, by the node crate). The engine's figures
//! are here; what runs on it registers its own in the same registry and refreshes them at
//! each scrape through a [`ScrapeSource`].
//!
//! Two kinds of values: those counted where they happen (proposals and their latency,
//! fsync latency and sizes: prometheus counters and histograms), and those the engine
//! already keeps as atomics or tables (messages sent, fsyncs, leaders, watches, RocksDB's
//! own figures), copied into the registry at each scrape ([`NodeMetrics::render`]).
//!
//! Architecture invariant: no label takes a value per path, session or group; per-group
//! figures are summed over the node's replicas (`warden_raft_groups{role=…}`), so a node
//! with 10,000 groups has the same series as one with ten. The one label per peer
//! (`warden_raft_messages_dropped_total{peer}`) is bounded by the cluster's nodes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use warden_server_kit::metrics::{histogram_opts, registered, LATENCY_BUCKETS};

use crate::leaders::LeaderTable;
use crate::storage::Db;
use crate::store_writer::StoreMetrics;
use crate::transport::{TransportEvents, TransportMetrics};

/// Figures kept outside the engine (by what runs on it), copied into the registry at each
/// scrape: registered by the node crate with [`NodeMetrics::on_scrape`].
pub trait ScrapeSource: Send + Sync {
    /// Brings the source's metrics up to date; `node_id` is this node, `led` the groups it
    /// leads (as last seen), in id order.
    fn refresh(&self, node_id: u64, led: &[u64]);
}

impl<T: ScrapeSource> ScrapeSource for Arc<T> {
    fn refresh(&self, node_id: u64, led: &[u64]) {
        T::refresh(self, node_id, led);
    }
}

/// Counters of a node's host loop, readable while it runs.
#[derive(Debug, Default)]
pub(crate) struct HostMetrics {
    /// Replicas asleep now (see `hibernate`).
    pub sleeping_replicas: AtomicU64,
    /// Times a replica of this node fell asleep.
    pub hibernations: AtomicU64,
    /// Replicas that stopped applying their group (see `failed`).
    pub failed_replicas: AtomicU64,
}

/// What the registry copies at each scrape.
pub(crate) struct Sources {
    pub node_id: u64,
    pub leaders: Arc<LeaderTable>,
    pub transport: Arc<TransportMetrics>,
    pub store: Arc<StoreMetrics>,
    pub db: Arc<Db>,
    pub data_dir: std::path::PathBuf,
    /// The host loop's counters (replicas asleep, replicas failed).
    pub host: Arc<HostMetrics>,
}

/// One node's metrics.
pub struct NodeMetrics {
    registry: Registry,
    /// `warden_raft_proposals_total{outcome="committed"}`: applied and answered (resolved
    /// once: no label lookup per proposal).
    committed: IntCounter,
    /// `…{outcome="failed"}`: refused, dropped by a leader change, or past its deadline.
    failed: IntCounter,
    /// Proposals waiting for their answer.
    pub proposals_pending: IntGauge,
    /// Time from a proposal to its answer (committed on a quorum and applied here).
    pub propose_seconds: Histogram,
    /// Time one replica's state machine took to apply the committed entries of one ready.
    pub apply_seconds: Histogram,
    /// Committed raft entries applied by this node's replicas.
    pub entries_applied: IntCounter,
    leader_changes: IntCounter,
    /// `warden_raft_snapshots_total{direction, outcome}`.
    snapshots: IntCounterVec,
    /// `warden_raft_snapshot_bytes_total{direction}`: bytes of the snapshots delivered.
    snapshot_bytes: IntCounterVec,
    /// `warden_raft_messages_dropped_total{peer}`: raft messages not sent because the peer's
    /// queue was full (raft-rs sends again what matters).
    messages_dropped: IntCounterVec,
    messages_sent: IntCounter,
    heartbeats_sent: IntCounter,
    groups: IntGaugeVec,
    fsyncs: IntCounter,
    entries: IntCounter,
    bytes_written: IntCounter,
    sst_bytes: IntGauge,
    pending_compaction_bytes: IntGauge,
    disk_available: IntGauge,
    disk_size: IntGauge,
    sources: Mutex<Option<Sources>>,
    /// What runs on the engine registered to be refreshed at each scrape.
    scraped: Mutex<Vec<Box<dyn ScrapeSource>>>,
}

/// Brings a counter kept elsewhere (an atomic that only grows) up to `total`.
fn sync_counter(counter: &IntCounter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

impl Default for NodeMetrics {
    fn default() -> Self {
        NodeMetrics::new()
    }
}

impl NodeMetrics {
    /// Every metric of a node, registered, zero.
    pub fn new() -> NodeMetrics {
        let r = Registry::new();
        let counter = |name: &str, help: &str| registered(&r, IntCounter::new(name, help));
        let gauge = |name: &str, help: &str| registered(&r, IntGauge::new(name, help));
        let proposals = registered(
            &r,
            IntCounterVec::new(
                Opts::new("warden_raft_proposals_total", "Proposals made on this node, by outcome (committed, failed)."),
                &["outcome"],
            ),
        );
        NodeMetrics {
            committed: proposals.with_label_values(&["committed"]),
            failed: proposals.with_label_values(&["failed"]),
            proposals_pending: gauge("warden_raft_proposals_pending", "Proposals waiting for their answer."),
            propose_seconds: registered(
                &r,
                Histogram::with_opts(histogram_opts(
                    "warden_raft_propose_seconds",
                    "Time from a proposal to its answer (committed on a quorum, applied here).",
                    &LATENCY_BUCKETS,
                )),
            ),
            apply_seconds: registered(
                &r,
                Histogram::with_opts(histogram_opts(
                    "warden_raft_apply_seconds",
                    "Time a replica's state machine took to apply the committed entries of one ready (before their write).",
                    &LATENCY_BUCKETS,
                )),
            ),
            entries_applied: counter(
                "warden_raft_entries_applied_total",
                "Committed raft entries applied by this node's replicas (each replica applies each entry of its group).",
            ),
            leader_changes: counter("warden_raft_leader_changes_seen_total", "Times a group hosted here got a new leader."),
            snapshots: registered(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "warden_raft_snapshots_total",
                        "Raft snapshots by direction (sent, received) and outcome (delivered, failed: refused, broken off, timed out or not started).",
                    ),
                    &["direction", "outcome"],
                ),
            ),
            snapshot_bytes: registered(
                &r,
                IntCounterVec::new(Opts::new("warden_raft_snapshot_bytes_total", "Bytes of the raft snapshots delivered, by direction."), &["direction"]),
            ),
            messages_dropped: registered(
                &r,
                IntCounterVec::new(
                    Opts::new("warden_raft_messages_dropped_total", "Raft messages dropped because the queue to the peer (a node id) was full."),
                    &["peer"],
                ),
            ),
            messages_sent: counter("warden_raft_messages_sent_total", "Raft messages handed to the transport."),
            heartbeats_sent: counter("warden_raft_heartbeats_sent_total", "Leader heartbeats among the raft messages sent."),
            groups: registered(
                &r,
                IntGaugeVec::new(
                    Opts::new("warden_raft_groups", "Groups hosted here, by role: hosted, led, leaderless (no leader known), asleep (hibernating), failed (stopped applying the group: its store failed; restart the node)."),
                    &["role"],
                ),
            ),
            fsyncs: counter("warden_storage_fsyncs_total", "Synced writes of the node's store (one serves many groups)."),
            entries: counter("warden_storage_entries_total", "Raft entries made durable."),
            bytes_written: counter("warden_storage_written_bytes_total", "Bytes written by synced writes."),
            sst_bytes: gauge("warden_storage_sst_bytes", "Size of the store's SST files (RocksDB's total-sst-files-size)."),
            pending_compaction_bytes: gauge("warden_storage_pending_compaction_bytes", "Bytes RocksDB estimates compaction has to rewrite."),
            disk_available: gauge("warden_storage_disk_available_bytes", "Bytes available to the node on its data directory's file system."),
            disk_size: gauge("warden_storage_disk_size_bytes", "Size of the node's data directory's file system."),
            sources: Mutex::new(None),
            scraped: Mutex::default(),
            registry: r,
        }
    }

    /// The registry (services register their own metrics in it).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Reads the engine's figures at each scrape from `sources`, and registers the store's
    /// histograms.
    pub(crate) fn attach(&self, sources: Sources) {
        for histogram in [&sources.store.fsync_seconds, &sources.store.entries_per_fsync, &sources.store.bytes_per_fsync] {
            if let Err(error) = self.registry.register(Box::new(histogram.clone())) {
                tracing::debug!(%error, "store histogram already registered");
            }
        }
        *self.sources.lock().unwrap_or_else(|e| e.into_inner()) = Some(sources);
    }

    /// Refreshes `source` at each scrape, after the engine's own figures.
    pub fn on_scrape(&self, source: Box<dyn ScrapeSource>) {
        self.scraped.lock().unwrap_or_else(|e| e.into_inner()).push(source);
    }

    /// A proposal was answered (`committed` or not) after `seconds`.
    pub fn proposed(&self, committed: bool, seconds: f64) {
        if committed {
            self.committed.inc();
            self.propose_seconds.observe(seconds);
        } else {
            self.failed.inc();
        }
    }

    /// Counts a snapshot sent or received (`direction`): delivered (its bytes) or not.
    fn snapshot(&self, direction: &str, bytes: Option<usize>) {
        let outcome = if bytes.is_some() { "delivered" } else { "failed" };
        self.snapshots.with_label_values(&[direction, outcome]).inc();
        if let Some(bytes) = bytes {
            self.snapshot_bytes.with_label_values(&[direction]).inc_by(bytes as u64);
        }
    }

    /// Copies the figures kept elsewhere into the registry.
    fn refresh(&self) {
        if let Some(s) = self.sources.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            sync_counter(&self.leader_changes, s.leaders.changes_seen());
            sync_counter(&self.messages_sent, s.transport.messages_sent.load(Ordering::Relaxed));
            sync_counter(&self.heartbeats_sent, s.transport.heartbeats_sent.load(Ordering::Relaxed));
            let hosted = s.leaders.groups();
            let leaderless = hosted.iter().filter(|group| s.leaders.get(**group).leader_id == 0).count();
            let gauge = |role: &str, value: usize| self.groups.with_label_values(&[role]).set(value as i64);
            gauge("hosted", hosted.len());
            gauge("led", s.leaders.led_by(s.node_id).len());
            gauge("leaderless", leaderless);
            gauge("asleep", s.host.sleeping_replicas.load(Ordering::Relaxed) as usize);
            gauge("failed", s.host.failed_replicas.load(Ordering::Relaxed) as usize);
            sync_counter(&self.fsyncs, s.store.fsyncs.load(Ordering::Relaxed));
            sync_counter(&self.entries, s.store.entries.load(Ordering::Relaxed));
            sync_counter(&self.bytes_written, s.store.bytes.load(Ordering::Relaxed));
            self.sst_bytes.set(s.db.property_sum("rocksdb.total-sst-files-size") as i64);
            self.pending_compaction_bytes.set(s.db.property_sum("rocksdb.estimate-pending-compaction-bytes") as i64);
            match rustix::fs::statvfs(&s.data_dir) {
                Ok(fs) => {
                    let bytes = |blocks: u64| i64::try_from(blocks.saturating_mul(fs.f_frsize)).unwrap_or(i64::MAX);
                    self.disk_available.set(bytes(fs.f_bavail));
                    self.disk_size.set(bytes(fs.f_blocks));
                }
                Err(error) => tracing::debug!(%error, "statvfs of the data directory"),
            }
            let led = s.leaders.led_by(s.node_id);
            for source in self.scraped.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                source.refresh(s.node_id, &led);
            }
        }
    }

    /// The node's metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        self.refresh();
        warden_server_kit::metrics::render(&self.registry)
    }
}

/// The transport counts snapshots and dropped messages here.
impl TransportEvents for NodeMetrics {
    fn snapshot_sent(&self, delivered_bytes: Option<usize>) {
        self.snapshot("sent", delivered_bytes);
    }

    fn snapshot_received(&self, taken_bytes: Option<usize>) {
        self.snapshot("received", taken_bytes);
    }

    fn message_dropped(&self, peer: u64) {
        self.messages_dropped.with_label_values(&[&peer.to_string()]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric is made and registered (no clash of names), and renders.
    #[test]
    fn every_metric_registers_and_renders() {
        let metrics = NodeMetrics::new();
        metrics.proposed(true, 0.003);
        metrics.proposed(false, 0.0);
        let text = metrics.render();
        assert!(text.contains("warden_raft_proposals_total{outcome=\"committed\"} 1"), "{text}");
        assert!(text.contains("warden_raft_proposals_total{outcome=\"failed\"} 1"), "{text}");
        assert!(text.contains("warden_raft_propose_seconds_count 1"), "{text}");
        metrics.snapshot_sent(Some(1000));
        metrics.snapshot_sent(None);
        metrics.snapshot_received(Some(10));
        metrics.message_dropped(3);
        let text = metrics.render();
        for line in [
            "warden_raft_snapshots_total{direction=\"sent\",outcome=\"delivered\"} 1",
            "warden_raft_snapshots_total{direction=\"sent\",outcome=\"failed\"} 1",
            "warden_raft_snapshots_total{direction=\"received\",outcome=\"delivered\"} 1",
            "warden_raft_snapshot_bytes_total{direction=\"sent\"} 1000",
            "warden_raft_snapshot_bytes_total{direction=\"received\"} 10",
            "warden_raft_messages_dropped_total{peer=\"3\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        let store = StoreMetrics::default();
        store.fsync_seconds.observe(0.001);
        assert_eq!(store.fsync_seconds.get_sample_count(), 1);
    }
}
