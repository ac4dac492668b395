//! Ranges of nodes by path bytes (docs/etcd.md): the reads and deletes etcd's flat key
//! space needs on top of the tree. A range is `[from, to)` over path bytes, inside the
//! subtree of its `path` (routing and permissions go by it). Containers are structure, not
//! data: ranges neither list nor delete them, and a deleted node that still has children
//! becomes one (it goes with its last child). So is a group's root that placement made for
//! the group and nothing wrote since (version 0, no data).

use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{DeleteRangeRequest, DeleteRangeResponse, GroupDescriptor, Node, NodeKind, RangeRequest, RangeResponse, Routing, WardenError};

use super::error::{error, invalid, invalid_path, too_large, Failure};
use super::store::{self, TxnView};
use super::txn::{Deleter, TtlChange, Txn};
use super::{descriptor, locks, path};

/// Nodes a range query counts at most (a query runs on its group's worker: the bound keeps
/// one query from holding it long). Inside a transaction the replicated
/// `recursive_delete_nodes_max` bounds it instead.
pub const RANGE_COUNT_NODES_MAX: usize = 100_000;

/// The path bytes `[from, to)` of a range inside the subtree of `scope`, checked: a range
/// reaches no further than its path's subtree.
fn path_bounds(scope: &str, from: &[u8], to: &[u8], allow_reserved: bool) -> Result<(Vec<u8>, Vec<u8>), Failure> {
    path::validate(scope, allow_reserved).map_err(|e| invalid_path(scope, &e))?;
    let end = path::subtree_end(scope);
    let from = if from.is_empty() { scope.as_bytes() } else { from };
    let to = if to.is_empty() { end.as_bytes() } else { to };
    if from < scope.as_bytes() || to > end.as_bytes() {
        return Err(invalid(scope, format!("a range must lie within [{scope}, {end}), the subtree of its path")).into());
    }
    Ok((from.to_vec(), to.to_vec()))
}

/// The node keys `[from, to)` of a range inside the subtree of `scope`, checked.
fn node_bounds(scope: &str, from: &[u8], to: &[u8], allow_reserved: bool) -> Result<(Vec<u8>, Vec<u8>), Failure> {
    let (from, to) = path_bounds(scope, from, to, allow_reserved)?;
    Ok((store::node_bound(&from), store::node_bound(&to)))
}

/// Whether the node at `path` is structure, not data, as ranges see it: a container, or
/// the group's root while nothing wrote it (version 0, no data, no owner).
pub(super) fn is_structure(descriptor: Option<&GroupDescriptor>, path: &str, record: &warden_proto::namespace::NodeRecord) -> bool {
    let stat = record.stat.unwrap_or_default();
    let unwritten_root = path == descriptor::root(descriptor) && stat.version == 0 && record.data.is_empty() && stat.ephemeral_owner == 0;
    stat.kind == NodeKind::Container as i32 || unwritten_root
}

/// Hands `visit` every node `request` lists (its `path`, `from`, `to`, `routing` and
/// `owner`), in path order, until it answers false.
pub(super) fn visit(
    view: &TxnView<'_>,
    descriptor: Option<&GroupDescriptor>,
    request: &RangeRequest,
    mut visit: impl FnMut(&str, warden_proto::namespace::NodeRecord) -> Result<bool, Failure>,
) -> Result<(), Failure> {
    let (from, to) = path_bounds(&request.path, &request.from, &request.to, true)?;
    check_epoch(descriptor, request.routing.as_ref(), &request.path)?;
    if request.owner == 0 {
        return visit_nodes(view, descriptor, &request.path, (&store::node_bound(&from), &store::node_bound(&to)), visit);
    }
    // The session's ephemerals, from its index: the range itself is not scanned.
    view.visit_ephemerals(request.owner, (&from, &to), |path| {
        if path == "/" || !path::is_at_or_below(path, &request.path) || !descriptor::serves(descriptor, path) {
            return Ok(true);
        }
        match view.node(path)? {
            Some(record) if !is_structure(descriptor, path, &record) => visit(path, record),
            _ => Ok(true),
        }
    })
}

/// Refuses a range planned on another version of the paths the group serves (WRONG_GROUP
/// with the descriptor): a group answers only the paths it serves, so a caller that did not
/// know of a split would silently miss the paths that moved. A request naming no version
/// (0) is not checked.
fn check_epoch(descriptor: Option<&GroupDescriptor>, routing: Option<&Routing>, scope: &str) -> Result<(), WardenError> {
    match (descriptor, routing) {
        (Some(served), Some(routing)) if routing.version != 0 && routing.version != served.version => Err(WardenError {
            descriptor: Some(Box::new(served.clone())),
            ..error(
                Code::WrongGroup,
                scope,
                format!(
                    "the range was planned on version {} of group {}'s paths; they are at version {}",
                    routing.version, served.group_id, served.version
                ),
            )
        }),
        _ => Ok(()),
    }
}

/// Hands `visit` every node of the range (`path`, record) in path order, as `view` sees
/// them: served by the group, at or below `scope`, not `/`, not a container nor an unwritten
/// group root; until it
/// answers false.
fn visit_nodes(
    view: &TxnView<'_>,
    descriptor: Option<&GroupDescriptor>,
    scope: &str,
    (from, to): (&[u8], &[u8]),
    mut visit: impl FnMut(&str, warden_proto::namespace::NodeRecord) -> Result<bool, Failure>,
) -> Result<(), Failure> {
    view.visit_range(from, to, |key, value| {
        let path = store::node_path(key)?;
        // `[scope, end(scope))` also holds paths beside the subtree (`/a!` for `/a`), and a
        // group may still hold records of a subtree that moved away (purged page by page).
        if path == "/" || !path::is_at_or_below(path, scope) || !descriptor::serves(descriptor, path) {
            return Ok(true);
        }
        let record = store::decode_record(value)?;
        if is_structure(descriptor, path, &record) {
            return Ok(true);
        }
        visit(path, record)
    })
}

/// Answers a range: the first `limit` nodes (0: `page_max`) and the count of all, refused
/// past `count_max` nodes.
pub fn scan(
    view: &TxnView<'_>,
    descriptor: Option<&GroupDescriptor>,
    request: &RangeRequest,
    page_max: usize,
    count_max: usize,
) -> Result<RangeResponse, Failure> {
    // The bounds and the epoch are refused before the page (`visit` checks them again).
    path_bounds(&request.path, &request.from, &request.to, true)?;
    check_epoch(descriptor, request.routing.as_ref(), &request.path)?;
    let limit = match request.limit as usize {
        0 => page_max,
        n if n > page_max => return Err(too_large(&request.path, "range page", n, page_max).into()),
        n => n,
    };
    let mut response = RangeResponse::default();
    visit(view, descriptor, request, |path, record| {
        response.count += 1;
        if response.count as usize > count_max {
            return Err(too_large(&request.path, "nodes counted by a range", response.count as usize, count_max).into());
        }
        if request.count_only {
            return Ok(true);
        }
        if response.nodes.len() < limit {
            let data = if request.keys_only { Vec::new() } else { record.data };
            response.nodes.push(Node { path: path.to_string(), data, stat: record.stat });
        } else {
            response.more = true;
        }
        Ok(true)
    })?;
    Ok(response)
}

impl Txn<'_, '_> {
    /// A range read inside a transaction: it sees the transaction's earlier writes.
    pub(super) fn range(&self, request: &RangeRequest) -> Result<RangeResponse, Failure> {
        scan(self.view, self.descriptor, request, self.limits.children_page_max, self.limits.recursive_delete_nodes_max)
    }

    /// Deletes the range's nodes in path order: a node with children becomes a container
    /// (so a parent listed before its children is emptied first and then goes with the
    /// last of them), any other goes with its emptied container parents.
    pub(super) fn delete_range(&mut self, request: &DeleteRangeRequest) -> Result<DeleteRangeResponse, Failure> {
        let (from, to) = node_bounds(&request.path, &request.from, &request.to, false)?;
        check_epoch(self.descriptor, request.routing.as_ref(), &request.path)?;
        let nodes_max = self.limits.recursive_delete_nodes_max;
        let mut doomed = Vec::new();
        visit_nodes(self.view, self.descriptor, &request.path, (&from, &to), |path, record| {
            if doomed.len() == nodes_max {
                return Err(too_large(&request.path, "nodes deleted by a range", nodes_max + 1, nodes_max).into());
            }
            doomed.push(Node { path: path.to_string(), data: record.data, stat: record.stat });
            Ok(true)
        })?;
        for node in &doomed {
            // Read again: deleting the nodes before it changed its children count.
            let record = self
                .node(&node.path)?
                .ok_or_else(|| Failure::Storage(warden_engine::error::StorageError::Corrupt(format!("{} vanished", node.path))))?;
            if record.lock_waiter.is_some() {
                return Err(locks::waiters_only_by_lock_operations(&node.path));
            }
            let stat = record.stat.unwrap_or_default();
            if stat.num_children > 0 || node.path == self.root {
                self.make_container(&node.path, record)?;
            } else {
                self.delete_subtree(&node.path, Deleter::Plain)?;
                self.detach_from_parent(&node.path)?;
            }
        }
        let deleted = doomed.len() as u64;
        let previous = if request.return_previous { doomed } else { Vec::new() };
        Ok(DeleteRangeResponse { header: None, deleted, previous })
    }

    /// Turns the node at `path` (which has children, or is the group's root) into a
    /// container: its data and owner go, and so does it once its last child does.
    fn make_container(&mut self, path: &str, mut record: warden_proto::namespace::NodeRecord) -> Result<(), Failure> {
        if self.view.lock_meta(path)?.is_some() {
            return Err(invalid(path, format!("{path} is a lock: its waiters go with Unlock and their sessions' ends")).into());
        }
        let mut stat = record.stat.unwrap_or_default();
        if stat.kind == NodeKind::Ttl as i32 {
            self.ttl_changes.push(TtlChange::Remove(path.to_string()));
        }
        stat.kind = NodeKind::Container as i32;
        stat.ttl_ms = 0;
        stat.version += 1;
        stat.mod_revision = self.revision;
        stat.mtime_ms = self.now_ms;
        stat.data_length = 0;
        record.data = Vec::new();
        record.stat = Some(stat);
        self.view.put_node(path, &record);
        Ok(())
    }
}
