//! What namespace replicas hold, counted for the metrics: nodes, ephemeral nodes,
//! lock waiters (holders included) and holders, live sessions, locks in their lock-delay.
//!
//! Each replica keeps its own figures: counted from disk when it loads, then moved by every
//! applied command's node changes (and its session and lock-delay tables), and published
//! after each batch reaches the store. A node's metrics sum the replicas it leads, so the
//! cluster's sum counts each group once (a group whose leader changes may be counted by
//! neither or both for a scrape).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use warden_proto::namespace::NodeRecord;

use super::store::NodeChange;

/// One replica's figures, as last published.
#[derive(Debug, Default)]
pub struct ReplicaCounts {
    nodes: AtomicU64,
    ephemerals: AtomicU64,
    lock_waiters: AtomicU64,
    lock_holders: AtomicU64,
    sessions: AtomicU64,
    lock_delays: AtomicU64,
}

/// Figures summed over replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Nodes, but the root `/` (which always exists).
    pub nodes: u64,
    /// Of those, ephemeral nodes (lock waiters included).
    pub ephemerals: u64,
    /// Lock waiters, holders included.
    pub lock_waiters: u64,
    /// Of those, the waiters holding their lock.
    pub lock_holders: u64,
    /// Live sessions homed in the groups.
    pub sessions: u64,
    /// Locks in their lock-delay.
    pub lock_delays: u64,
}

impl Counts {
    /// Counts `record` in (it `appears`) or out (it goes).
    pub fn count_node(&mut self, record: &NodeRecord, appears: bool) {
        let step = |value: &mut u64| *value = if appears { value.saturating_add(1) } else { value.saturating_sub(1) };
        step(&mut self.nodes);
        if record.stat.as_ref().is_some_and(|stat| stat.ephemeral_owner != 0) {
            step(&mut self.ephemerals);
        }
        if record.lock_waiter.is_some() {
            step(&mut self.lock_waiters);
        }
    }

    /// Moves the node figures by a command's node changes. The root always exists (its first
    /// stored record is not a creation) and is not counted, as in a count from disk.
    pub fn apply_changes(&mut self, changes: &[NodeChange]) {
        for change in changes.iter().filter(|change| change.path != "/") {
            if let Some(before) = &change.before {
                self.count_node(before, false);
            }
            if let Some(after) = &change.after {
                self.count_node(after, true);
            }
        }
    }
}

impl ReplicaCounts {
    /// Publishes `counts` as this replica's.
    pub fn publish(&self, counts: &Counts) {
        self.nodes.store(counts.nodes, Ordering::Relaxed);
        self.ephemerals.store(counts.ephemerals, Ordering::Relaxed);
        self.lock_waiters.store(counts.lock_waiters, Ordering::Relaxed);
        self.lock_holders.store(counts.lock_holders, Ordering::Relaxed);
        self.sessions.store(counts.sessions, Ordering::Relaxed);
        self.lock_delays.store(counts.lock_delays, Ordering::Relaxed);
    }

    fn read(&self) -> Counts {
        Counts {
            nodes: self.nodes.load(Ordering::Relaxed),
            ephemerals: self.ephemerals.load(Ordering::Relaxed),
            lock_waiters: self.lock_waiters.load(Ordering::Relaxed),
            lock_holders: self.lock_holders.load(Ordering::Relaxed),
            sessions: self.sessions.load(Ordering::Relaxed),
            lock_delays: self.lock_delays.load(Ordering::Relaxed),
        }
    }
}

/// Replicas' figures by (node id, group id); an entry is dead once its replica is dropped.
type ReplicaTable = HashMap<(u64, u64), Weak<ReplicaCounts>>;

/// Every live replica's figures, by node and group (a replica's entry goes with it).
#[derive(Clone, Default)]
pub struct NamespaceCounts {
    replicas: Arc<Mutex<ReplicaTable>>,
}

impl NamespaceCounts {
    /// The figures of node `node_id`'s new replica of `group` (replacing an earlier one's).
    pub fn register(&self, node_id: u64, group: u64) -> Arc<ReplicaCounts> {
        let counts = Arc::new(ReplicaCounts::default());
        let mut replicas = self.replicas.lock().unwrap_or_else(PoisonError::into_inner);
        replicas.retain(|_, replica| replica.strong_count() > 0);
        replicas.insert((node_id, group), Arc::downgrade(&counts));
        counts
    }

    /// The sums over node `node_id`'s replicas of `groups`.
    pub fn sum(&self, node_id: u64, groups: &[u64]) -> Counts {
        let replicas = self.replicas.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sum = Counts::default();
        for counts in groups.iter().filter_map(|group| replicas.get(&(node_id, *group))).filter_map(Weak::upgrade).map(|c| c.read()) {
            sum.nodes += counts.nodes;
            sum.ephemerals += counts.ephemerals;
            sum.lock_waiters += counts.lock_waiters;
            sum.lock_holders += counts.lock_holders;
            sum.sessions += counts.sessions;
            sum.lock_delays += counts.lock_delays;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::namespace::LockWaiterRecord;
    use warden_proto::v1::Stat;

    #[test]
    fn node_changes_move_the_figures_and_sums_cover_the_groups_asked_for() {
        let plain = NodeRecord::default();
        let waiter = NodeRecord {
            stat: Some(Stat { ephemeral_owner: 9, ..Stat::default() }),
            lock_waiter: Some(LockWaiterRecord::default()),
            ..NodeRecord::default()
        };
        let mut counts = Counts::default();
        let created = |record: &NodeRecord| NodeChange { path: "/x".into(), before: None, after: Some(record.clone()) };
        counts.apply_changes(&[created(&plain), created(&waiter)]);
        assert_eq!((counts.nodes, counts.ephemerals, counts.lock_waiters), (2, 1, 1));
        counts.apply_changes(&[NodeChange { path: "/x".into(), before: Some(waiter.clone()), after: None }]);
        assert_eq!((counts.nodes, counts.ephemerals, counts.lock_waiters), (1, 0, 0));

        let all = NamespaceCounts::default();
        let (one, two) = (all.register(1, 10), all.register(1, 11));
        one.publish(&Counts { nodes: 3, sessions: 1, ..Counts::default() });
        two.publish(&Counts { nodes: 4, lock_delays: 2, ..Counts::default() });
        assert_eq!(all.sum(1, &[10, 11]), Counts { nodes: 7, sessions: 1, lock_delays: 2, ..Counts::default() });
        assert_eq!(all.sum(1, &[11]).nodes, 4);
        assert_eq!(all.sum(2, &[10, 11]), Counts::default(), "another node's replicas are its own");
        drop(two);
        assert_eq!(all.sum(1, &[10, 11]).nodes, 3, "a dropped replica counts no more");
    }
}
