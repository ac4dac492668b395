//! Node liveness as placement records it: the heartbeats of registered nodes, heard by the
//! placement leader and written to placement's log in one `Heartbeat` command per
//! [`HEARTBEATS_FLUSH_INTERVAL`] for all of them, instead of one command per heartbeat.
//!
//! Why: every command rewrites placement's whole state on the placement replicas and costs
//! them a raft round and an fsync, so a command per heartbeat made placement's cost grow with
//! nodes × state size (N heartbeats a second, each rewriting a state that also grows with N).
//! Batched, the log takes at most one liveness command per interval whatever the node count.
//!
//! What it changes: a node's `last_heartbeat_ms` is written up to one interval after its
//! heartbeat arrived, stamped with the leader's time of the write, so a node silent since
//! looks up to one interval fresher — its mark-down comes that much later. A placement leader
//! that loses leadership drops what it heard; the nodes heartbeat the new leader within their
//! interval. A node that is new, moved (address or zone), down or a tombstone still registers
//! through its own command, answered once applied.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use warden_placement::{Command, NodeState, Placement};

use super::{now_ms, PlacementService};

/// How often the placement leader writes the heartbeats it heard (one command for all).
pub const HEARTBEATS_FLUSH_INTERVAL: Duration = Duration::from_millis(250);

/// Registered nodes heard since the last write.
#[derive(Debug, Default)]
pub struct HeartbeatsHeard {
    nodes: Mutex<BTreeSet<u64>>,
}

impl HeartbeatsHeard {
    /// Records a heartbeat of `node`.
    pub fn record(&self, node: u64) {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner).insert(node);
    }

    /// The nodes heard since the last call.
    fn take(&self) -> BTreeSet<u64> {
        std::mem::take(&mut *self.nodes.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Whether a heartbeat from `node` at `addr` in `zone` only says it is alive: the node is
/// registered there, up and not a tombstone (else it registers again, by its own command).
pub fn only_alive(state: &Placement, node: u64, addr: &str, zone: &str) -> bool {
    state.node(node).is_some_and(|info| info.up && info.state != NodeState::Tombstone && info.addr == addr && info.zone == zone)
}

impl PlacementService {
    /// While this node leads the placement group, writes the heartbeats heard every
    /// `interval` ([`HEARTBEATS_FLUSH_INTERVAL`]). Runs until the runtime stops.
    pub async fn flush_heartbeats_periodically(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let heard = self.heartbeats_heard.take();
            if heard.is_empty() || self.ensure_leader().is_err() {
                continue;
            }
            if let Err(error) = self.flush_heartbeats(&heard).await {
                // Heard again at the next interval: a node's heartbeat is not lost to a
                // write that failed (an election, a slow quorum), which would bring its
                // mark-down a whole heartbeat interval closer.
                tracing::debug!(%error, nodes = heard.len(), "could not record the heartbeats heard; trying again");
                heard.into_iter().for_each(|node| self.heartbeats_heard.record(node));
            }
        }
    }

    /// Proposes one `Heartbeat` for the `heard` nodes that are still registered and no
    /// tombstone (apply refuses the whole command otherwise).
    async fn flush_heartbeats(&self, heard: &BTreeSet<u64>) -> Result<(), tonic::Status> {
        let state = self.state().await?;
        let ids: Vec<u64> = heard.iter().copied().filter(|id| state.node(*id).is_some_and(|node| node.state != NodeState::Tombstone)).collect();
        if ids.is_empty() {
            return Ok(());
        }
        self.propose(&Command::Heartbeat { ids, now_ms: now_ms() }).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_placement::{AppliedSettings, PlacementConfig};

    #[test]
    fn only_a_registered_live_node_at_its_address_is_just_alive() {
        let mut state = Placement::new(PlacementConfig { replicas_per_group: 1, ..PlacementConfig::default() });
        let settings = Some(AppliedSettings::of(state.config()));
        let nodes = vec![(1, "127.0.0.1:1".to_string(), "a".to_string())];
        state.apply(&Command::Bootstrap { nodes, now_ms: 1, limits: Vec::new(), settings }).expect("bootstrap registers node 1");
        assert!(only_alive(&state, 1, "127.0.0.1:1", "a"));
        assert!(!only_alive(&state, 1, "127.0.0.1:2", "a"), "a moved node registers again");
        assert!(!only_alive(&state, 1, "127.0.0.1:1", "b"), "so does one in another zone");
        assert!(!only_alive(&state, 2, "127.0.0.1:3", "a"), "and a new one");
        state.apply(&Command::MarkDown { ids: vec![1], now_ms: 1_000_000 }).expect("mark down");
        assert!(!only_alive(&state, 1, "127.0.0.1:1", "a"), "a node marked down registers to come back up");
    }

    #[test]
    fn heard_nodes_are_taken_once() {
        let heard = HeartbeatsHeard::default();
        heard.record(3);
        heard.record(1);
        heard.record(3);
        assert_eq!(heard.take().into_iter().collect::<Vec<_>>(), vec![1, 3]);
        assert!(heard.take().is_empty());
    }
}
