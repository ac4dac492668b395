//! Read-only queries of the placement state: routing, descriptors, the groups a
//! scatter-gather operation spans, and which nodes the leader should mark down.

use crate::group::{GroupDescriptor, GroupInfo};
use crate::node::NodeInfo;
use crate::paths::parent;
use crate::state::Placement;

impl Placement {
    /// The ready group owning `path`: the one with the longest prefix that equals `path` or
    /// is an ancestor of it, by segments (`/ab` is not below `/a`). Once bootstrapped, every
    /// absolute path has one (`/` is always routed).
    pub fn route(&self, path: &str) -> Option<&GroupInfo> {
        warden_paths::longest_prefix(&self.routes, path).and_then(|(_, id)| self.groups.get(id))
    }

    /// What group `group_id` serves: its prefix minus the prefixes of the ready groups
    /// directly below it (those whose nearest owning ancestor is this group), sorted. For a
    /// group still being created it is the descriptor it will have once ready; a retired
    /// group serves nothing (its prefix is its one exclusion).
    pub fn descriptor(&self, group_id: u64) -> Option<GroupDescriptor> {
        let group = self.groups.get(&group_id)?;
        if group.retired {
            // It serves nothing: its one exclusion is its prefix.
            let excluded = vec![group.prefix.clone()];
            return Some(GroupDescriptor {
                id: group.id,
                prefix: group.prefix.clone(),
                excluded,
                replicas: group.replicas.clone(),
                epoch: group.epoch,
            });
        }
        let excluded = self
            .routes_below(&group.prefix)
            .filter(|(prefix, _)| self.nearest_owner_above(prefix, &group.prefix) == Some(group.prefix.as_str()))
            .map(|(prefix, _)| prefix.clone())
            .collect();
        Some(GroupDescriptor { id: group.id, prefix: group.prefix.clone(), excluded, replicas: group.replicas.clone(), epoch: group.epoch })
    }

    /// The ready groups whose prefix is a direct child of `parent_path` (a `GetChildren` of
    /// `parent_path` must merge their names), in prefix order.
    pub fn children_groups(&self, parent_path: &str) -> Vec<&GroupInfo> {
        self.routes_below(parent_path).filter(|(prefix, _)| parent(prefix) == Some(parent_path)).filter_map(|(_, id)| self.groups.get(id)).collect()
    }

    /// The ready groups whose prefix is strictly below `path` (a recursive watch or delete of
    /// `path` spans them), in prefix order.
    pub fn groups_below(&self, path: &str) -> Vec<&GroupInfo> {
        self.routes_below(path).filter_map(|(_, id)| self.groups.get(id)).collect()
    }

    /// Up nodes whose last heartbeat is at least the heartbeat timeout before `now_ms`, by
    /// id: what the placement leader proposes in `MarkDown`.
    pub fn nodes_to_mark_down(&self, now_ms: u64) -> Vec<u64> {
        self.nodes.values().filter(|node| self.is_stale(node, now_ms)).map(|node| node.id).collect()
    }

    /// Whether `node` is up but has not heartbeated within the timeout at `now_ms`.
    pub(crate) fn is_stale(&self, node: &NodeInfo, now_ms: u64) -> bool {
        node.up && node.last_heartbeat_ms.saturating_add(self.settings.heartbeat_timeout_ms) <= now_ms
    }

    /// Routes whose prefix is strictly below `path`, in prefix order.
    fn routes_below<'a>(&'a self, path: &str) -> impl Iterator<Item = (&'a String, &'a u64)> + 'a {
        warden_paths::below(&self.routes, path)
    }

    /// The longest proper ancestor of `prefix` that is routed or is `also` (a group being
    /// created, treated as if ready).
    fn nearest_owner_above<'a>(&'a self, prefix: &'a str, also: &'a str) -> Option<&'a str> {
        warden_paths::ancestors_and_self(prefix).skip(1).find(|ancestor| *ancestor == also || self.routes.contains_key(*ancestor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::group::{serves, Epoch};
    use crate::testutil::{bootstrapped, create_ready};

    /// Groups: 1 = `/`, 2 = `/a`, 3 = `/a/b`, 4 = `/c`.
    fn nested() -> Placement {
        let mut placement = bootstrapped(5, 5);
        assert_eq!(create_ready(&mut placement, "/a"), 2);
        assert_eq!(create_ready(&mut placement, "/a/b"), 3);
        assert_eq!(create_ready(&mut placement, "/c"), 4);
        placement
    }

    fn route_id(placement: &Placement, path: &str) -> Option<u64> {
        placement.route(path).map(|group| group.id)
    }

    #[test]
    fn nothing_routes_before_bootstrap() {
        let placement = Placement::new(crate::PlacementConfig::default());
        assert_eq!(route_id(&placement, "/"), None);
        assert_eq!(route_id(&placement, "/a"), None);
    }

    #[test]
    fn longest_prefix_by_segments() {
        let placement = nested();
        let cases = [
            ("/", 1),
            ("/x", 1),
            ("/ab", 1),
            ("/a", 2),
            ("/a/x/y", 2),
            ("/a/bc", 2),
            ("/a/b", 3),
            ("/a/b/c/d", 3),
            ("/c", 4),
            ("/cd", 1),
            ("/c/a/b", 4),
        ];
        for (path, expected) in cases {
            assert_eq!(route_id(&placement, path), Some(expected), "path {path}");
        }
        assert_eq!(route_id(&placement, "relative"), None);
    }

    #[test]
    fn creating_groups_are_not_routed() {
        let mut placement = nested();
        placement.apply(&Command::CreateGroup { prefix: "/x".into(), now_ms: 0 }).unwrap();
        assert_eq!(route_id(&placement, "/x/y"), Some(1));
        assert!(placement.groups_below("/").iter().all(|group| group.prefix != "/x"));
    }

    #[test]
    fn descriptors_of_nested_groups() {
        let placement = nested();
        let excluded = |id| placement.descriptor(id).unwrap().excluded;
        assert_eq!(excluded(1), vec!["/a".to_string(), "/c".to_string()]);
        assert_eq!(excluded(2), vec!["/a/b".to_string()]);
        assert_eq!(excluded(3), Vec::<String>::new());
        assert_eq!(excluded(4), Vec::<String>::new());
        assert_eq!(placement.descriptor(99), None);
        let root = placement.descriptor(1).unwrap();
        assert_eq!(root.prefix, "/");
        assert_eq!(root.replicas, placement.groups()[&1].replicas);
        // Root carved out twice (/a, /c), /a once (/a/b).
        assert_eq!(root.epoch, Epoch { conf_ver: 1, version: 3 });
        assert_eq!(placement.descriptor(2).unwrap().epoch, Epoch { conf_ver: 1, version: 2 });
        assert_eq!(placement.descriptor(3).unwrap().epoch, Epoch::INITIAL);
        assert_eq!(placement.descriptor(4).unwrap().epoch, Epoch::INITIAL);
    }

    #[test]
    fn exactly_one_descriptor_serves_each_path() {
        let placement = nested();
        let descriptors: Vec<_> = placement.groups().keys().map(|id| placement.descriptor(*id).unwrap()).collect();
        for path in ["/", "/x", "/ab", "/a", "/a/x", "/a/bc", "/a/b", "/a/b/c", "/c", "/cd", "/c/d"] {
            let owners: Vec<u64> = descriptors.iter().filter(|descriptor| serves(descriptor, path)).map(|descriptor| descriptor.id).collect();
            assert_eq!(owners, vec![route_id(&placement, path).unwrap()], "path {path}");
        }
    }

    #[test]
    fn descriptor_of_a_creating_group_is_its_future_one() {
        let mut placement = bootstrapped(5, 5);
        create_ready(&mut placement, "/a/b");
        let created = placement.apply(&Command::CreateGroup { prefix: "/a".into(), now_ms: 0 }).unwrap();
        let crate::Outcome::GroupCreated(group) = created else { panic!("{created:?}") };
        assert_eq!(placement.descriptor(group.id).unwrap().excluded, vec!["/a/b".to_string()]);
        assert_eq!(placement.descriptor(1).unwrap().excluded, vec!["/a/b".to_string()]);
    }

    #[test]
    fn children_and_groups_below() {
        let mut placement = nested();
        create_ready(&mut placement, "/c/d/e");
        create_ready(&mut placement, "/cd");
        let prefixes = |groups: Vec<&GroupInfo>| groups.into_iter().map(|group| group.prefix.clone()).collect::<Vec<_>>();
        assert_eq!(prefixes(placement.children_groups("/")), ["/a", "/c", "/cd"]);
        assert_eq!(prefixes(placement.children_groups("/a")), ["/a/b"]);
        assert_eq!(prefixes(placement.children_groups("/c")), Vec::<String>::new());
        assert_eq!(prefixes(placement.children_groups("/c/d")), ["/c/d/e"]);
        assert_eq!(prefixes(placement.groups_below("/")), ["/a", "/a/b", "/c", "/c/d/e", "/cd"]);
        assert_eq!(prefixes(placement.groups_below("/a")), ["/a/b"]);
        assert_eq!(prefixes(placement.groups_below("/c")), ["/c/d/e"]);
        assert_eq!(prefixes(placement.groups_below("/c/d/e")), Vec::<String>::new());
        assert_eq!(prefixes(placement.groups_below("/x")), Vec::<String>::new());
    }

    #[test]
    fn nodes_to_mark_down_uses_the_timeout() {
        let mut placement = bootstrapped(3, 3);
        placement.apply(&Command::Heartbeat { ids: vec![2], now_ms: 5_000 }).unwrap();
        assert_eq!(placement.nodes_to_mark_down(9_999), Vec::<u64>::new());
        assert_eq!(placement.nodes_to_mark_down(10_000), vec![1, 3]);
        assert_eq!(placement.nodes_to_mark_down(15_000), vec![1, 2, 3]);
        placement.apply(&Command::MarkDown { ids: vec![1], now_ms: 10_000 }).unwrap();
        assert_eq!(placement.nodes_to_mark_down(15_000), vec![2, 3]);
    }
}
