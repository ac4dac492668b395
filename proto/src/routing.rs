//! Routing as its callers see it: a copy of placement's routing table (ready groups by
//! prefix, node addresses; rebuilt whole from `GetRoutingTable`, never edited in place), the
//! paths a transaction touches, and the `routing` field every request carries. The router
//! and the client library's direct calls route by these.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use warden_paths::RouteTable;
/// A session id names its home group, where its calls are routed.
pub use warden_paths::{home_group, SESSION_SEQUENCE_BITS};

use crate::placement::RoutingTable;
use crate::v1::txn_op::Op;
use crate::v1::*;

/// What a request goes to.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// The group serving this path.
    Path(&'a str),
    /// The one group serving all these paths (a transaction's). No paths: the root's group.
    Paths(&'a [&'a str]),
    /// This group (sequencers, explicit routing).
    Group(u64),
    /// The home group of this session (its id names it).
    Session(u64),
}

/// How long a node stays suspect after it fell silent: a few election timeouts, time for
/// its groups to elect leaders elsewhere if it is cut off.
pub const SUSPECT_FOR: Duration = Duration::from_secs(5);
/// Suspect nodes remembered at most (more are not recorded: calls then try them in turn).
const SUSPECTS_MAX: usize = 4096;

/// Nodes that lately fell silent: left a call unanswered until its deadline, lost their
/// connection, or broke a stream (their pings went unanswered) — a partition, a paused or
/// dead machine, not a refusal. Without this, every call's first attempt would go to a
/// cut-off leader again and wait out its whole deadline, and a group would stay unwritable
/// through its callers long after the others elected a new leader.
#[derive(Debug, Default)]
pub struct Suspects {
    /// Read on every call (one read lock per pick, per answer); written only when a node
    /// falls silent or answers again.
    until: RwLock<HashMap<u64, Instant>>,
}

impl Suspects {
    /// `node` fell silent: suspect it for [`SUSPECT_FOR`].
    pub fn suspect(&self, node: u64) {
        let now = Instant::now();
        let mut until = self.until.write().unwrap_or_else(|e| e.into_inner());
        if until.len() >= SUSPECTS_MAX {
            until.retain(|_, end| *end > now);
        }
        if until.len() < SUSPECTS_MAX {
            until.insert(node, now + SUSPECT_FOR);
        }
    }

    /// `node` answered: it is reachable. (The common case, no suspect at all, takes only a
    /// read lock.)
    pub fn clear(&self, node: u64) {
        if self.until.read().unwrap_or_else(|e| e.into_inner()).contains_key(&node) {
            self.until.write().unwrap_or_else(|e| e.into_inner()).remove(&node);
        }
    }

    /// The replica attempt `attempt` of a call to a group goes to: `leader` (the one last
    /// seen leading) unless it is suspect, else the replicas in turn from `attempt`, passing
    /// over suspects while any replica is not one. A suspect leader still gets one attempt
    /// in every `replicas.len() + 1`, once the others had theirs: when every follower
    /// names it, it is likely reachable again (a healed cut) and, if it is, nothing else
    /// can serve the call. `None` for a group without replicas.
    pub fn pick(&self, replicas: &[u64], leader: Option<u64>, attempt: usize) -> Option<u64> {
        let now = Instant::now();
        let until = self.until.read().unwrap_or_else(|e| e.into_inner());
        let suspect = |node: &u64| until.get(node).is_some_and(|end| *end > now);
        let count = replicas.len();
        if let Some(leader) = leader.filter(|l| replicas.contains(l)) {
            if !suspect(&leader) || attempt % (count + 1) == count {
                return Some(leader);
            }
        }
        let mut in_turn = (0..count).map(|offset| replicas[(attempt + offset) % count]);
        in_turn.clone().find(|node| !suspect(node)).or_else(|| in_turn.next())
    }
}

/// A routed group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRoute {
    /// What it serves, and its epoch.
    pub descriptor: GroupDescriptor,
}

impl GroupRoute {
    /// The group id.
    pub fn id(&self) -> u64 {
        self.descriptor.group_id
    }
}

/// A routing table.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Placement's routing version.
    pub version: u64,
    /// Ready groups by prefix.
    routes: RouteTable<GroupRoute>,
    /// Every group (ready or not) by id: lookups by id (sessions, sequencers).
    groups: HashMap<u64, GroupRoute>,
    /// Node addresses (`host:port`).
    addrs: HashMap<u64, String>,
}

impl Table {
    /// The table of a `GetRoutingTable` answer.
    pub fn from_proto(table: RoutingTable) -> Table {
        let mut routes = RouteTable::new();
        let mut groups = HashMap::new();
        for entry in table.groups {
            let Some(descriptor) = entry.descriptor else { continue };
            let route = GroupRoute { descriptor };
            if entry.ready {
                routes.insert(route.descriptor.prefix.clone(), route.clone());
            }
            groups.insert(route.id(), route);
        }
        let addrs = table.nodes.into_iter().map(|n| (n.id, n.addr)).collect();
        Table { version: table.version, routes, groups, addrs }
    }

    /// The ready group with the longest prefix at or above `path`.
    pub fn route(&self, path: &str) -> Option<&GroupRoute> {
        self.routes.route(path)
    }

    /// The one ready group serving every path of `paths` (the root's group for none):
    /// `Ok(None)` when a path has no ready group, `Err` with the group ids (in the order
    /// first met) when the paths span groups — a transaction's, which one group must serve.
    pub fn route_all(&self, paths: &[&str]) -> Result<Option<&GroupRoute>, Vec<u64>> {
        let Some((first, rest)) = paths.split_first() else { return Ok(self.route("/")) };
        let Some(group) = self.route(first) else { return Ok(None) };
        let mut ids = vec![group.id()];
        for path in rest {
            let Some(other) = self.route(path) else { return Ok(None) };
            if !ids.contains(&other.id()) {
                ids.push(other.id());
            }
        }
        if ids.len() > 1 {
            return Err(ids);
        }
        Ok(Some(group))
    }

    /// The group `target` names (`Ok(None)`: none in this table); `Err` with the group ids
    /// when a transaction's paths span groups (see [`Table::route_all`]).
    pub fn resolve(&self, target: Target<'_>) -> Result<Option<&GroupRoute>, Vec<u64>> {
        match target {
            Target::Path(path) => Ok(self.route(path)),
            Target::Paths(paths) => self.route_all(paths),
            Target::Group(group) => Ok(self.group(group)),
            Target::Session(session) => Ok(self.group(home_group(session))),
        }
    }

    /// A group by id.
    pub fn group(&self, id: u64) -> Option<&GroupRoute> {
        self.groups.get(&id)
    }

    /// The ready group that `key` hashes to (sessions without a path hint are spread over
    /// the groups this way); `None` before any group is ready.
    pub fn spread(&self, key: u64) -> Option<&GroupRoute> {
        let count = self.routes.len() as u64;
        if count == 0 {
            return None;
        }
        self.routes.values().nth((key % count) as usize)
    }

    /// Ready groups whose prefix is strictly below `path` (a recursive watch or delete of
    /// `path` spans them), in prefix order.
    pub fn groups_below(&self, path: &str) -> Vec<&GroupRoute> {
        self.routes.below(path).map(|(_, route)| route).collect()
    }

    /// Ready groups whose prefix is a direct child of `parent` (their prefix nodes are
    /// children of `parent` that the parent's own group does not list).
    pub fn child_groups(&self, parent: &str) -> Vec<&GroupRoute> {
        self.routes.children(parent).map(|(_, route)| route).collect()
    }

    /// Where node `id` listens.
    pub fn addr(&self, id: u64) -> Option<&str> {
        self.addrs.get(&id).map(String::as_str)
    }

    /// Every node address, in id order.
    pub fn addrs(&self) -> Vec<String> {
        let mut ids: Vec<&u64> = self.addrs.keys().collect();
        ids.sort_unstable();
        ids.into_iter().filter_map(|id| self.addrs.get(id).cloned()).collect()
    }
}

/// A request whose `routing` field its sender sets: the group it is for and that group's epoch.
pub trait Routed {
    /// Sets the request's routing.
    fn set_routing(&mut self, routing: Routing);
}

macro_rules! routed {
    ($($t:ty),*) => {
        $(impl Routed for $t {
            fn set_routing(&mut self, routing: Routing) {
                self.routing = Some(routing);
            }
        })*
    };
}

routed!(
    CreateRequest,
    GetRequest,
    ExistsRequest,
    SetRequest,
    DeleteRequest,
    GetChildrenRequest,
    TxnRequest,
    SyncRequest,
    CreateSessionRequest,
    KeepAliveRequest,
    CloseSessionRequest,
    SessionInfoRequest,
    LockRequest,
    UnlockRequest,
    CheckSequencerRequest,
    LockInfoRequest,
    PutRequest,
    RangeRequest,
    DeleteRangeRequest
);

/// Every path a transaction touches, those of its nested transactions and compared ranges
/// too (it goes to the one group serving them all).
pub fn txn_paths(request: &TxnRequest) -> Vec<&str> {
    let mut paths = Vec::new();
    add_txn_paths(request, &mut paths);
    paths
}

fn add_txn_paths<'r>(request: &'r TxnRequest, paths: &mut Vec<&'r str>) {
    for compare in &request.compares {
        paths.push(&compare.path);
        paths.extend(compare.ranges.iter().map(|range| range.path.as_str()));
    }
    for op in request.then.iter().chain(&request.r#else).filter_map(|op| op.op.as_ref()) {
        match op {
            Op::Create(create) => paths.push(&create.path),
            Op::Set(set) => paths.push(&set.path),
            Op::Delete(delete) => paths.push(&delete.path),
            Op::Get(get) => paths.push(&get.path),
            Op::Put(put) => paths.push(&put.path),
            Op::Range(range) => paths.push(&range.path),
            Op::DeleteRange(delete) => paths.push(&delete.path),
            Op::Txn(nested) => add_txn_paths(nested, paths),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{GroupEntry, NodeEntry};

    /// A suspect leader is passed over for the replicas in turn, suspects last; an answer
    /// clears the suspicion.
    #[test]
    fn a_silent_node_is_passed_over_until_it_answers() {
        let suspects = Suspects::default();
        let replicas = [1, 2, 3];
        assert_eq!(suspects.pick(&replicas, Some(2), 0), Some(2), "the known leader first");
        assert_eq!(suspects.pick(&replicas, Some(9), 1), Some(2), "a leader that is no replica is ignored");
        suspects.suspect(2);
        assert_eq!(suspects.pick(&replicas, Some(2), 0), Some(1), "a suspect leader is passed over");
        assert_eq!(suspects.pick(&replicas, None, 1), Some(3), "and so is a suspect in turn");
        let picks: Vec<_> = (0..8).map(|attempt| suspects.pick(&replicas, Some(2), attempt)).collect();
        let to_leader = picks.iter().filter(|pick| **pick == Some(2)).count();
        assert_eq!(picks[3], Some(2), "a suspect leader the followers name is tried once each of them was: {picks:?}");
        assert_eq!(to_leader, 2, "once in every round of the replicas, no more: {picks:?}");
        suspects.suspect(1);
        suspects.suspect(3);
        assert_eq!(suspects.pick(&replicas, Some(2), 1), Some(2), "all suspect: the replicas in turn");
        suspects.clear(2);
        assert_eq!(suspects.pick(&replicas, None, 0), Some(2), "an answer clears a node");
        assert_eq!(suspects.pick(&[], Some(2), 0), None, "no replicas, no node");
    }

    fn entry(id: u64, prefix: &str, ready: bool) -> GroupEntry {
        GroupEntry {
            descriptor: Some(GroupDescriptor { group_id: id, prefix: prefix.into(), replicas: vec![1], ..GroupDescriptor::default() }),
            ready,
            learners: Vec::new(),
            merging_into: 0,
            retired: false,
        }
    }

    #[test]
    fn longest_ready_prefix_wins_by_segments() {
        let table = Table::from_proto(RoutingTable {
            version: 3,
            nodes: vec![NodeEntry { id: 1, addr: "a:1".into(), ..NodeEntry::default() }],
            groups: vec![entry(1, "/", true), entry(2, "/a", true), entry(3, "/a/b", false), entry(4, "/c/d", true)],
            scheduler_paused: false,
            acl: None,
        });
        assert_eq!(table.route("/a/b/c").map(GroupRoute::id), Some(2), "a group not ready is not routed");
        assert_eq!(table.route("/ab").map(GroupRoute::id), Some(1));
        assert_eq!(table.route("/").map(GroupRoute::id), Some(1));
        assert_eq!(table.group(3).map(GroupRoute::id), Some(3));
        assert_eq!(table.child_groups("/").iter().map(|g| g.id()).collect::<Vec<_>>(), vec![2]);
        assert_eq!(table.child_groups("/c").iter().map(|g| g.id()).collect::<Vec<_>>(), vec![4]);
        assert_eq!(table.addr(1), Some("a:1"));
        assert_eq!(table.groups_below("/").iter().map(|g| g.id()).collect::<Vec<_>>(), vec![2, 4], "not / itself, not a group not ready");
        assert_eq!(table.groups_below("/c").iter().map(|g| g.id()).collect::<Vec<_>>(), vec![4]);
        assert!(table.groups_below("/a").is_empty());
        let spread: std::collections::BTreeSet<u64> = (0..6).filter_map(|key| table.spread(key)).map(GroupRoute::id).collect();
        assert_eq!(spread, [1, 2, 4].into(), "keys spread over every ready group and only those");
        assert!(Table::default().spread(7).is_none());
        assert_eq!(table.route_all(&["/a/x", "/a/y"]).map(|g| g.map(GroupRoute::id)), Ok(Some(2)));
        assert_eq!(table.route_all(&[]).map(|g| g.map(GroupRoute::id)), Ok(Some(1)), "no paths: the root's group");
        assert_eq!(table.route_all(&["/a/x", "/b", "/a"]).map(|g| g.map(GroupRoute::id)), Err(vec![2, 1]), "spanning groups");
    }
}
