//! Who leads each group this node hosts, as its replicas last saw it: written by the host
//! loop's workers, read by services (response headers, leader hints) and by the metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// What this node knows of each hosted group's leadership, updated by the workers when a
/// replica's soft state changes; read by services for response headers and leader hints
/// without a round trip to the worker. Every hosted group has an entry, from its replica's
/// creation (or load at start) until the replica is destroyed or stops applying its group
/// (`failed`).
#[derive(Debug, Default)]
pub struct LeaderTable {
    groups: std::sync::RwLock<HashMap<u64, LeaderInfo>>,
    /// Times a hosted group's known leader became another node (etcd's "leader changes
    /// seen"), for `warden_raft_leader_changes_seen_total`.
    changes_seen: AtomicU64,
}

/// A group's leadership as one replica sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaderInfo {
    /// Current term.
    pub term: u64,
    /// Leader's node id (0: unknown).
    pub leader_id: u64,
    /// The replica's state machine needs the leader's clock (`StateMachine::needs_ticks`):
    /// a group that does not can hibernate, and holds nothing a timer must look after.
    pub needs_ticks: bool,
}

impl LeaderTable {
    /// Records `group`'s leadership.
    pub fn set(&self, group: u64, info: LeaderInfo) {
        let before = self.groups.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(group, info);
        if info.leader_id != 0 && before.is_none_or(|before| before.leader_id != info.leader_id) {
            self.changes_seen.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Times a hosted group's known leader became another node.
    pub fn changes_seen(&self) -> u64 {
        self.changes_seen.load(Ordering::Relaxed)
    }

    /// Forgets `group` (its replica left this node).
    pub fn remove(&self, group: u64) {
        self.groups.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&group);
    }

    /// `group`'s leadership as last seen.
    pub fn get(&self, group: u64) -> LeaderInfo {
        self.groups.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&group).copied().unwrap_or_default()
    }

    /// Every hosted group, in id order.
    pub fn groups(&self) -> Vec<u64> {
        let mut groups: Vec<u64> = self.groups.read().unwrap_or_else(std::sync::PoisonError::into_inner).keys().copied().collect();
        groups.sort_unstable();
        groups
    }

    /// The groups whose leader is `node`, as last seen, in id order.
    pub fn led_by(&self, node: u64) -> Vec<u64> {
        let groups = self.groups.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut led: Vec<u64> = groups.iter().filter(|(_, info)| info.leader_id == node).map(|(group, _)| *group).collect();
        led.sort_unstable();
        led
    }
}
