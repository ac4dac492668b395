//! Hot subtrees: how many writes each replica applied per top-level child
//! of its group's prefix, so an operator (`warden status --hot`) sees which subtree to split.
//!
//! Counted in memory on every replica as entries apply (not replicated, never read by apply:
//! determinism is untouched), cumulative since the replica loaded; rates come from two
//! readings. Bounded: the first [`CHILDREN_MAX`] children seen get a counter each, the rest
//! share one.

use std::collections::{BTreeMap, BTreeSet};

use warden_placement::is_strictly_below;
use warden_proto::namespace::ChildWrites;

/// Children of the prefix counted one by one.
pub const CHILDREN_MAX: usize = 256;

/// Writes per top-level child of a group's prefix.
#[derive(Debug, Default)]
pub struct WriteCounts {
    writes: BTreeMap<String, u64>,
    /// Writes to children beyond the bound, and to the prefix node itself.
    other: u64,
    /// Counted children this replica saw used as a lock: a split may not take them, and a
    /// lock's container node comes and goes with its waiters, so the node alone, read when
    /// asked, often does not show it.
    locks: BTreeSet<String>,
}

impl WriteCounts {
    /// Counts one applied write touching `paths` below `root`: once per child it touches.
    pub fn record<'p>(&mut self, root: &str, paths: impl IntoIterator<Item = &'p str>) {
        let children: BTreeSet<Option<&str>> = paths.into_iter().map(|path| child_of(root, path)).collect();
        for child in children {
            match child {
                Some(name) if self.writes.contains_key(name) || self.writes.len() < CHILDREN_MAX => {
                    *self.writes.entry(name.to_string()).or_insert(0) += 1;
                }
                _ => self.other += 1,
            }
        }
    }

    /// Notes that an applied lock operation used `lock_path` as a lock: if it is a counted
    /// child of `root` itself, that child is reported unmovable from then on.
    pub fn record_lock(&mut self, root: &str, lock_path: &str) {
        match child_of(root, lock_path) {
            Some(name) if warden_placement::parent(lock_path) == Some(root) && self.writes.contains_key(name) => {
                self.locks.insert(name.to_string());
            }
            _ => {}
        }
    }

    /// The counts as the API answers them (`unmovable`: the children seen used as locks).
    pub fn to_proto(&self) -> ChildWrites {
        ChildWrites {
            writes: self.writes.iter().map(|(name, writes)| (name.clone(), *writes)).collect(),
            other: self.other,
            unmovable: self.locks.iter().cloned().collect(),
        }
    }

    /// Forgets every count (the replica's state was replaced).
    pub fn clear(&mut self) {
        self.writes.clear();
        self.other = 0;
        self.locks.clear();
    }
}

/// The name of the top-level child of `root` that `path` is in (`None`: `root` itself, or a
/// path outside it).
fn child_of<'p>(root: &str, path: &'p str) -> Option<&'p str> {
    if !is_strictly_below(path, root) {
        return None;
    }
    let rest = path[root.len()..].trim_start_matches('/');
    rest.split('/').next().filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_count_once_per_top_level_child_within_a_bound() {
        let mut counts = WriteCounts::default();
        counts.record("/", ["/a/x", "/a/y", "/b"]);
        counts.record("/", ["/a"]);
        counts.record("/", ["/"]);
        let proto = counts.to_proto();
        assert_eq!(proto.writes, [("a".to_string(), 2), ("b".to_string(), 1)].into_iter().collect());
        assert_eq!(proto.other, 1, "the root itself");
        let mut team = WriteCounts::default();
        team.record("/team", ["/team/svc/lock", "/teams/x"]);
        assert_eq!(team.to_proto().writes, [("svc".to_string(), 1)].into_iter().collect(), "a sibling sharing the name's start is outside");
        let mut bounded = WriteCounts::default();
        for n in 0..CHILDREN_MAX + 10 {
            bounded.record("/", [format!("/c{n}").as_str()]);
        }
        bounded.record("/", ["/c0"]);
        let proto = bounded.to_proto();
        assert_eq!((proto.writes.len(), proto.other, proto.writes["c0"]), (CHILDREN_MAX, 10, 2));
    }

    #[test]
    fn a_top_level_child_used_as_a_lock_is_reported_unmovable() {
        let mut counts = WriteCounts::default();
        counts.record("/team", ["/team/lock/lock-0000000000", "/team/svc/lock/lock-0000000000"]);
        counts.record_lock("/team", "/team/lock");
        counts.record_lock("/team", "/team/svc/lock");
        counts.record_lock("/team", "/team/uncounted");
        assert_eq!(counts.to_proto().unmovable, ["lock"], "only a counted child that is itself the lock");
        counts.clear();
        assert!(counts.to_proto().unmovable.is_empty());
    }
}
