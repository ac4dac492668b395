//! Events and the rule that says which events a watch wants.

use std::sync::Arc;

use prost::bytes::Bytes;
use warden_proto::v1::watch_create::Kind as WatchKind;
use warden_proto::v1::{watch_event, NodeKind, Stat, WatchEvent};

/// What happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The node was created.
    Created,
    /// The node's data was set.
    Changed,
    /// The node was deleted.
    Deleted,
}

/// A node's stat and data at one point.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    /// The stat.
    pub stat: Stat,
    /// The data.
    pub data: Bytes,
}

/// One event: a change of one node at one revision.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The node's path.
    pub path: String,
    /// The node after the event; for `Deleted`, the node as it was.
    pub node: NodeState,
    /// The node before a `Changed` event (`None` otherwise: a `Deleted` event's previous
    /// state is `node`, a `Created` one has none).
    pub prev: Option<NodeState>,
}

/// Bytes an event accounts for in the history and in stream queues.
const EVENT_OVERHEAD_BYTES: usize = 96;

impl Event {
    /// Memory the event accounts for.
    pub fn size_bytes(&self) -> usize {
        EVENT_OVERHEAD_BYTES + self.path.len() + self.node.data.len() + self.prev.as_ref().map_or(0, |p| p.data.len())
    }

    /// The wire form, with the previous state when `with_prev`.
    pub fn to_proto(&self, revision: u64, with_prev: bool) -> WatchEvent {
        let (kind, data, prev) = match self.kind {
            EventKind::Created => (watch_event::Type::Created, self.node.data.clone(), None),
            EventKind::Changed => (watch_event::Type::Changed, self.node.data.clone(), self.prev.as_ref()),
            EventKind::Deleted => (watch_event::Type::Deleted, Bytes::new(), Some(&self.node)),
        };
        let prev = prev.filter(|_| with_prev);
        WatchEvent {
            r#type: kind as i32,
            path: self.path.clone(),
            revision,
            stat: Some(self.node.stat),
            data,
            prev_stat: prev.map(|p| p.stat),
            prev_data: prev.map(|p| p.data.clone()).unwrap_or_default(),
        }
    }

    /// The events of one node's change, from its state before and after a revision
    /// (`None`: absent). A node deleted and created again in one transaction gives two
    /// events; a node whose record changed without a data change (its children changed)
    /// gives none: child changes are the children's own events.
    pub fn of_change(path: &str, before: Option<NodeState>, after: Option<NodeState>) -> Vec<Event> {
        let event = |kind, node, prev| Event { kind, path: path.to_string(), node, prev };
        match (before, after) {
            (None, None) => Vec::new(),
            (None, Some(after)) => vec![event(EventKind::Created, after, None)],
            (Some(before), None) => vec![event(EventKind::Deleted, before, None)],
            (Some(before), Some(after)) if before.stat.create_revision != after.stat.create_revision => {
                vec![event(EventKind::Deleted, before, None), event(EventKind::Created, after, None)]
            }
            (Some(before), Some(after)) if before.stat.version != after.stat.version || before.data != after.data => {
                vec![event(EventKind::Changed, after, Some(before))]
            }
            (Some(_), Some(_)) => Vec::new(),
        }
    }
}

/// The events of one revision, in path order: delivered together, never split.
#[derive(Debug, PartialEq)]
pub struct EventBatch {
    /// The revision every event of the batch was written at.
    pub revision: u64,
    /// The events.
    pub events: Vec<Event>,
}

impl EventBatch {
    /// Memory the batch accounts for.
    pub fn size_bytes(&self) -> usize {
        self.events.iter().map(Event::size_bytes).sum()
    }
}

/// Where an event's node is relative to a watched path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    /// The watched node itself.
    Node,
    /// A child of the watched node.
    Child,
    /// Deeper below the watched node.
    Below,
}

impl Relation {
    /// Where `event_path` is relative to `watched`, if related.
    pub fn of(watched: &str, event_path: &str) -> Option<Relation> {
        if event_path == watched {
            return Some(Relation::Node);
        }
        let rest = if watched == "/" { event_path.strip_prefix('/') } else { event_path.strip_prefix(watched)?.strip_prefix('/') }?;
        if rest.is_empty() {
            return None;
        }
        Some(if rest.contains('/') { Relation::Below } else { Relation::Child })
    }
}

/// What a watch reports: its kind and filters, packed small (every watch keeps one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSpec {
    kind: WatchKind,
    flags: u8,
    /// Only events of paths in `[from, to)` (a recursive watch's bounds), when set.
    bounds: Option<Arc<PathBounds>>,
}

/// Byte strings from `from` (included) to `to` (excluded; empty: no end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathBounds {
    /// The first path in the bounds.
    pub from: Vec<u8>,
    /// The first path past them (empty: none).
    pub to: Vec<u8>,
}

impl PathBounds {
    /// Whether `path` lies within.
    fn contains(&self, path: &str) -> bool {
        let path = path.as_bytes();
        self.from.as_slice() <= path && (self.to.is_empty() || path < self.to.as_slice())
    }
}

const RECURSIVE: u8 = 1;
const NO_CREATE: u8 = 2;
const NO_DELETE: u8 = 4;
const NO_CHANGE: u8 = 8;
const PREV_DATA: u8 = 16;

impl WatchSpec {
    /// A spec of `kind`; `recursive` only means something for `Persistent`.
    pub fn new(kind: WatchKind, recursive: bool, no_create: bool, no_delete: bool, no_change: bool, prev_data: bool) -> WatchSpec {
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let flags = flag(recursive, RECURSIVE)
            | flag(no_create, NO_CREATE)
            | flag(no_delete, NO_DELETE)
            | flag(no_change, NO_CHANGE)
            | flag(prev_data, PREV_DATA);
        WatchSpec { kind, flags, bounds: None }
    }

    /// This spec reporting only the events of paths in `bounds` (none: every path).
    pub fn within(self, bounds: Option<PathBounds>) -> WatchSpec {
        WatchSpec { bounds: bounds.map(Arc::new), ..self }
    }

    /// The watch ends with its first event response.
    pub fn is_one_shot(&self) -> bool {
        self.kind != WatchKind::Persistent
    }

    /// Events below the watched node's children are wanted.
    pub fn is_recursive(&self) -> bool {
        self.kind == WatchKind::Persistent && self.flags & RECURSIVE != 0
    }

    /// Events carry the node's previous state.
    pub fn wants_prev(&self) -> bool {
        self.flags & PREV_DATA != 0
    }

    /// Whether an event of `kind` at `relation` to the watched path is reported (and, for a
    /// one-shot watch, fires it). ZooKeeper's rules for one-shot watches: a data watch fires
    /// on a change or deletion, an exists watch on anything, a children watch on a child's
    /// creation or deletion or the node's own deletion.
    pub fn wants(&self, relation: Relation, kind: EventKind) -> bool {
        let filtered = match kind {
            EventKind::Created => NO_CREATE,
            EventKind::Deleted => NO_DELETE,
            EventKind::Changed => NO_CHANGE,
        };
        if self.flags & filtered != 0 {
            return false;
        }
        match (self.kind, relation) {
            (WatchKind::Persistent, Relation::Node) | (WatchKind::Exists, Relation::Node) => true,
            (WatchKind::Persistent, Relation::Child | Relation::Below) => self.is_recursive(),
            (WatchKind::Data, Relation::Node) => kind != EventKind::Created,
            (WatchKind::Children, Relation::Child) => kind != EventKind::Changed,
            (WatchKind::Children, Relation::Node) => kind == EventKind::Deleted,
            (WatchKind::Data | WatchKind::Exists, _) | (WatchKind::Children, Relation::Below) => false,
        }
    }

    /// Indexes of the events of `batch` this watch of `path` wants, in order.
    pub fn select(&self, path: &str, batch: &EventBatch) -> Vec<u32> {
        batch
            .events
            .iter()
            .enumerate()
            .filter(|(_, event)| Relation::of(path, &event.path).is_some_and(|relation| self.wants(relation, event.kind)))
            .filter(|(_, event)| self.bounds.as_ref().is_none_or(|bounds| bounds.contains(&event.path)))
            .map(|(index, _)| index as u32)
            .collect()
    }
}

/// A node's state from its stored stat and data.
pub fn node_state(stat: Option<Stat>, data: Vec<u8>) -> NodeState {
    NodeState { stat: stat.unwrap_or(Stat { kind: NodeKind::Persistent as i32, ..Stat::default() }), data: Bytes::from(data) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(create_revision: u64, version: u64, data: &str) -> Option<NodeState> {
        Some(NodeState { stat: Stat { create_revision, version, ..Stat::default() }, data: Bytes::from(data.as_bytes().to_vec()) })
    }

    #[test]
    fn relations_follow_the_tree() {
        assert_eq!(Relation::of("/a", "/a"), Some(Relation::Node));
        assert_eq!(Relation::of("/a", "/a/b"), Some(Relation::Child));
        assert_eq!(Relation::of("/a", "/a/b/c"), Some(Relation::Below));
        assert_eq!(Relation::of("/a", "/ab"), None, "a sibling with the same prefix is not below");
        assert_eq!(Relation::of("/a", "/"), None);
        assert_eq!(Relation::of("/", "/x"), Some(Relation::Child));
        assert_eq!(Relation::of("/", "/x/y"), Some(Relation::Below));
        assert_eq!(Relation::of("/", "/"), Some(Relation::Node));
    }

    #[test]
    fn one_shot_kinds_fire_as_in_zookeeper() {
        let data = WatchSpec::new(WatchKind::Data, false, false, false, false, false);
        assert!(data.wants(Relation::Node, EventKind::Changed) && data.wants(Relation::Node, EventKind::Deleted));
        assert!(!data.wants(Relation::Node, EventKind::Created) && !data.wants(Relation::Child, EventKind::Created));
        let exists = WatchSpec::new(WatchKind::Exists, false, false, false, false, false);
        assert!(exists.wants(Relation::Node, EventKind::Created) && !exists.wants(Relation::Child, EventKind::Created));
        let children = WatchSpec::new(WatchKind::Children, false, false, false, false, false);
        assert!(children.wants(Relation::Child, EventKind::Created) && children.wants(Relation::Child, EventKind::Deleted));
        assert!(children.wants(Relation::Node, EventKind::Deleted));
        assert!(!children.wants(Relation::Child, EventKind::Changed) && !children.wants(Relation::Node, EventKind::Changed));
        assert!(!children.wants(Relation::Below, EventKind::Created));
        assert!(data.is_one_shot() && exists.is_one_shot() && children.is_one_shot());
    }

    #[test]
    fn persistent_watches_and_filters() {
        let flat = WatchSpec::new(WatchKind::Persistent, false, false, false, false, false);
        assert!(flat.wants(Relation::Node, EventKind::Created) && !flat.wants(Relation::Child, EventKind::Created));
        assert!(!flat.is_one_shot());
        let deep = WatchSpec::new(WatchKind::Persistent, true, false, true, false, true);
        assert!(deep.wants(Relation::Below, EventKind::Changed) && deep.wants(Relation::Child, EventKind::Created));
        assert!(!deep.wants(Relation::Below, EventKind::Deleted), "no_delete filters deletions");
        assert!(deep.wants_prev());
        let recursive_data = WatchSpec::new(WatchKind::Data, true, false, false, false, false);
        assert!(!recursive_data.is_recursive(), "only persistent watches recurse");
    }

    #[test]
    fn changes_become_events() {
        assert!(Event::of_change("/a", None, None).is_empty());
        let created = Event::of_change("/a", None, state(3, 0, "x"));
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].kind, EventKind::Created);
        let changed = Event::of_change("/a", state(3, 0, "x"), state(3, 1, "y"));
        assert_eq!((changed[0].kind, changed[0].prev.as_ref().map(|p| p.data.clone())), (EventKind::Changed, Some(Bytes::from_static(b"x"))));
        assert!(Event::of_change("/a", state(3, 1, "y"), state(3, 1, "y")).is_empty(), "a child change is not a data change");
        let replaced = Event::of_change("/a", state(3, 1, "y"), state(7, 0, "z"));
        assert_eq!(replaced.iter().map(|e| e.kind).collect::<Vec<_>>(), vec![EventKind::Deleted, EventKind::Created]);
        let deleted = Event::of_change("/a", state(3, 1, "y"), None);
        let wire = deleted[0].to_proto(9, true);
        assert_eq!((wire.revision, wire.data.len(), wire.prev_data.as_ref()), (9, 0, b"y".as_slice()));
        assert!(deleted[0].to_proto(9, false).prev_stat.is_none());
    }

    #[test]
    fn select_picks_only_wanted_events_in_order() {
        let event = |path: &str, kind| Event { kind, path: path.into(), node: node_state(None, Vec::new()), prev: None };
        let batch = EventBatch {
            revision: 5,
            events: vec![
                event("/a", EventKind::Changed),
                event("/a/b", EventKind::Created),
                event("/a/b/c", EventKind::Created),
                event("/z", EventKind::Created),
            ],
        };
        let recursive = WatchSpec::new(WatchKind::Persistent, true, false, false, false, false);
        assert_eq!(recursive.select("/a", &batch), vec![0, 1, 2]);
        let children = WatchSpec::new(WatchKind::Children, false, false, false, false, false);
        assert_eq!(children.select("/a", &batch), vec![1]);
        assert!(children.select("/q", &batch).is_empty());
        let bounded = recursive.within(Some(PathBounds { from: b"/a/b/".to_vec(), to: b"/a/b0".to_vec() }));
        assert_eq!(bounded.select("/a", &batch), vec![2], "only the paths within its bounds");
    }
}
