//! The replica placement policy: which nodes host a new group's replicas.
//!
//! Only eligible (up, `Serving`) nodes are picked. Replicas are spread over zones round-robin, zones in
//! name order; within a zone the node hosting the fewest replicas (of all groups, ready or
//! being created) goes first, ties to the lowest id. Nodes with an empty zone form one zone
//! `""`. The result is a pure function of the state, so every replica picks the same nodes.

use std::collections::BTreeMap;

use crate::error::PlacementError;
use crate::node::NodeInfo;
use crate::state::Placement;

impl Placement {
    /// Picks `count` nodes for a new group's replicas among the up nodes, in pick order.
    /// Refuses with `NotEnoughNodes` if fewer than `count` nodes are up.
    pub fn pick_replicas(&self, count: usize) -> Result<Vec<u64>, PlacementError> {
        self.pick_replicas_among(count, |node| node.up && node.state.takes_replicas())
    }

    /// [`Placement::pick_replicas`] among the nodes `eligible` accepts.
    pub(crate) fn pick_replicas_among(&self, count: usize, eligible: impl Fn(&NodeInfo) -> bool) -> Result<Vec<u64>, PlacementError> {
        let mut load: BTreeMap<u64, usize> = BTreeMap::new();
        for replica in self.groups.values().flat_map(|group| group.members()) {
            *load.entry(replica).or_default() += 1;
        }
        // Zone name → its eligible nodes as (replicas hosted, id), best first.
        let mut zones: BTreeMap<&str, Vec<(usize, u64)>> = BTreeMap::new();
        let mut up = 0;
        for node in self.nodes.values().filter(|node| eligible(node)) {
            up += 1;
            let hosted = load.get(&node.id).copied().unwrap_or(0);
            zones.entry(node.zone.as_str()).or_default().push((hosted, node.id));
        }
        if up < count {
            return Err(PlacementError::NotEnoughNodes { wanted: count, up });
        }
        for candidates in zones.values_mut() {
            candidates.sort_unstable();
        }
        let mut picked = Vec::with_capacity(count);
        let mut round = 0;
        while picked.len() < count {
            for candidates in zones.values() {
                if picked.len() == count {
                    break;
                }
                if let Some((_, id)) = candidates.get(round) {
                    picked.push(*id);
                }
            }
            round += 1;
        }
        Ok(picked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::state::PlacementConfig;
    use crate::testutil::{bootstrap_command, create_ready};

    /// Nodes 1–3 in zone a, 4–6 in b, 7–9 in c.
    fn three_zones() -> Placement {
        let mut placement = Placement::new(PlacementConfig::default());
        let nodes = (1..=9).map(|id| (id, format!("n{id}:1"), ["a", "b", "c"][(id as usize - 1) / 3].to_string()));
        placement.apply(&Command::Bootstrap { nodes: nodes.collect(), now_ms: 0, limits: Vec::new(), settings: None }).unwrap();
        placement
    }

    fn zone_counts(placement: &Placement, replicas: &[u64]) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for id in replicas {
            *counts.entry(placement.nodes()[id].zone.clone()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn spreads_over_zones_round_robin() {
        let placement = three_zones();
        let root = &placement.groups()[&1].replicas;
        assert_eq!(root, &vec![1, 4, 7, 2, 5]);
        let counts = zone_counts(&placement, root);
        assert!(counts.values().all(|count| *count >= 1 && *count <= 2), "{counts:?}");
        assert_eq!(placement.pick_replicas(3).unwrap(), vec![3, 6, 8]);
    }

    #[test]
    fn prefers_least_loaded_within_a_zone() {
        let mut placement = three_zones();
        // Loads now: 1, 2, 4, 5, 7 host one replica each.
        assert_eq!(placement.pick_replicas(5).unwrap(), vec![3, 6, 8, 1, 4]);
        let a = create_ready(&mut placement, "/a");
        assert_eq!(placement.groups()[&a].replicas, vec![3, 6, 8, 1, 4]);
        // Loads: 1, 4 → 2; 2, 3, 5, 6, 7, 8 → 1; 9 → 0.
        assert_eq!(placement.pick_replicas(5).unwrap(), vec![2, 5, 9, 3, 6]);
    }

    #[test]
    fn skips_down_nodes_and_counts_up_ones() {
        let mut placement = three_zones();
        placement.apply(&Command::MarkDown { ids: vec![1, 2, 3, 4], now_ms: 60_000 }).unwrap();
        // Up: 5 (hosts one), 6 in b; 7 (hosts one), 8, 9 in c.
        assert_eq!(placement.pick_replicas(5).unwrap(), vec![6, 8, 5, 9, 7]);
        assert_eq!(placement.pick_replicas(6), Err(PlacementError::NotEnoughNodes { wanted: 6, up: 5 }));
        assert_eq!(placement.pick_replicas(0).unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn empty_zone_is_one_zone_and_sorts_first() {
        let mut placement = Placement::new(PlacementConfig::default());
        let command = bootstrap_command(&[(1, ""), (2, "z"), (3, ""), (4, "z"), (5, "")]);
        placement.apply(&command).unwrap();
        assert_eq!(placement.groups()[&1].replicas, vec![1, 2, 3, 4, 5]);
        assert_eq!(placement.pick_replicas(3).unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn fewer_zones_than_replicas_uses_every_node_of_a_small_zone() {
        let mut placement = Placement::new(PlacementConfig::default());
        placement.apply(&bootstrap_command(&[(1, "a"), (2, "b"), (3, "b"), (4, "b"), (5, "b"), (6, "b")])).unwrap();
        assert_eq!(placement.groups()[&1].replicas, vec![1, 2, 3, 4, 5]);
    }
}
