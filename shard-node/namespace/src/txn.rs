//! Executing one write transaction against a [`TxnView`]: compares, then the `then` or
//! `else` operations, all-or-nothing, at one new revision. Deterministic: the only time is
//! the leader's `now_ms` carried in the command.

use warden_proto::namespace::{LockWaiterRecord, NodeRecord};
use warden_proto::v1::compare::{Op as CompareOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::txn_op_result::Result as OpResult;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{
    Compare, CreateRequest, CreateResponse, DeleteRequest, DeleteResponse, GetRequest, GetResponse, NodeKind, SetRequest, SetResponse, Stat, TxnOp,
    TxnOpResult, TxnRequest, TxnResponse, WardenError,
};

use super::error::{error, invalid, invalid_path, no_node, too_large};
use super::error::{session_expired, Failure};
use super::locks;
use super::path;
use super::sessions;
use super::store::TxnView;
use super::Limits;
use warden_engine::error::StorageError;

/// Largest sequential suffix (`%010d`): creating past it fails with `SequenceExhausted`.
pub const SEQUENCE_MAX: u64 = 9_999_999_999;

/// A change of a TTL node the state machine's expiry index must learn once the transaction
/// commits.
pub enum TtlChange {
    /// A TTL node now exists (or changed) with this stat.
    Upsert(String, Stat),
    /// The node is gone.
    Remove(String),
}

/// A change of the set of sessions, for the in-memory index and the leader's lease table.
pub enum SessionChange {
    /// A session was created with this TTL.
    Added(u64, u64),
    /// A session homed in another group was recorded here.
    RemoteAdded(u64),
    /// A session ended.
    Removed(u64),
}

/// Who deletes nodes: a plain write may not delete a lock waiter or a lock in its lock-delay
/// (only the lock operations and a session's end change a lock's state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Deleter {
    /// A client's write or a TTL expiry.
    Plain,
    /// A lock operation or a session's end.
    Locks,
}

/// The branch a transaction takes, and those its nested transactions on it take (in the
/// order of their operations).
struct Branch {
    succeeded: bool,
    nested: Vec<Branch>,
}

/// Whether the node `node` (`None`: missing) satisfies `compare`.
fn holds(compare: &Compare, op: CompareOp, target: Target, node: Option<&NodeRecord>) -> bool {
    let stat = node.and_then(|n| n.stat).unwrap_or_default();
    let ordering = match target {
        Target::Exists => return node.is_some() == compare.exists,
        // A missing node compares as version 0, revision 0 and empty value, as in etcd,
        // so `create_revision == 0` means "does not exist".
        Target::Version => stat.version.cmp(&compare.number),
        Target::CreateRevision => stat.create_revision.cmp(&compare.number),
        Target::ModRevision => stat.mod_revision.cmp(&compare.number),
        Target::Value => node.map_or(&[][..], |n| n.data.as_slice()).cmp(compare.value.as_slice()),
        Target::Writes => node.map_or(0, |_| stat.version + 1).cmp(&compare.number),
        Target::Owner => stat.ephemeral_owner.cmp(&compare.number),
    };
    match op {
        CompareOp::Equal => ordering.is_eq(),
        CompareOp::NotEqual => ordering.is_ne(),
        CompareOp::Less => ordering.is_lt(),
        CompareOp::Greater => ordering.is_gt(),
    }
}

/// One transaction in progress.
pub struct Txn<'v, 'a> {
    pub view: &'v mut TxnView<'a>,
    /// The group's root (its prefix): always exists, cannot be deleted or be a lock.
    pub root: &'v str,
    /// What the group serves (ranges skip records of subtrees it no longer serves).
    pub descriptor: Option<&'v warden_proto::v1::GroupDescriptor>,
    pub limits: &'v Limits,
    pub now_ms: u64,
    /// The revision every change of this transaction carries.
    pub revision: u64,
    pub ttl_changes: Vec<TtlChange>,
    pub session_changes: Vec<SessionChange>,
    /// Parents whose children changed (locks among them get their holders notified).
    pub touched: std::collections::BTreeSet<String>,
    /// Locks whose lock-delay changed: `(path, blocked until; 0 = none or gone)`.
    pub lock_changes: Vec<(String, u64)>,
    /// Lock waiters deleted (their waiting calls are woken to learn why).
    pub gone_waiters: Vec<String>,
    /// The principal the command is for (`Command.principal`): a session it uses must be
    /// its own. Empty: not checked.
    pub principal: &'v str,
}

/// Checks the shape of a request before anything runs (also used before proposing).
pub fn check_request(request: &TxnRequest, limits: &Limits) -> Result<(), WardenError> {
    let ops = ops_in(request);
    if ops > limits.txn_ops_max {
        return Err(too_large("", "transaction operations", ops, limits.txn_ops_max));
    }
    if request.raise_to > crate::REVISION_FLOOR_MAX {
        return Err(invalid("", format!("raise_to is at most {}", crate::REVISION_FLOOR_MAX)));
    }
    check_txn(request, limits)
}

/// Every operation of a transaction and of its nested transactions, both branches, except
/// the nested transactions themselves.
pub fn flat_ops(request: &TxnRequest) -> Vec<&TxnOp> {
    let mut ops = Vec::new();
    for op in request.then.iter().chain(&request.r#else) {
        match &op.op {
            Some(Op::Txn(nested)) => ops.extend(flat_ops(nested)),
            _ => ops.push(op),
        }
    }
    ops
}

/// Every compare of a transaction and of its nested transactions.
pub fn flat_compares(request: &TxnRequest) -> Vec<&Compare> {
    let nested = request.then.iter().chain(&request.r#else).filter_map(|op| match &op.op {
        Some(Op::Txn(nested)) => Some(nested),
        _ => None,
    });
    request.compares.iter().chain(nested.flat_map(flat_compares)).collect()
}

/// The operations of a transaction, those of its nested transactions counted too (a
/// nested transaction is one operation itself).
fn ops_in(request: &TxnRequest) -> usize {
    let nested = |op: &TxnOp| match &op.op {
        Some(Op::Txn(nested)) => ops_in(nested),
        _ => 0,
    };
    request.then.iter().chain(&request.r#else).map(|op| 1 + nested(op)).sum()
}

/// Checks a transaction's compares and operations (nested ones included).
fn check_txn(request: &TxnRequest, limits: &Limits) -> Result<(), WardenError> {
    for compare in &request.compares {
        check_compare(compare)?;
    }
    // `op_index` of a validation error counts the `then` operations first, then `else`
    // (in a nested transaction, it is the index of the nested transaction's operation).
    for (index, op) in request.then.iter().chain(&request.r#else).enumerate() {
        check_op(op, limits).map_err(|error| WardenError { op_index: index as u32, ..error })?;
    }
    Ok(())
}

fn check_compare(compare: &Compare) -> Result<(), WardenError> {
    path::validate(&compare.path, true).map_err(|e| invalid_path(&compare.path, &e))?;
    CompareOp::try_from(compare.op).map_err(|_| invalid(&compare.path, "unknown compare op"))?;
    Target::try_from(compare.target).map_err(|_| invalid(&compare.path, "unknown compare target"))?;
    for range in &compare.ranges {
        path::validate(&range.path, true).map_err(|e| invalid_path(&range.path, &e))?;
    }
    match compare.ranges.first() {
        Some(first) if first.path != compare.path => Err(invalid(&compare.path, "a compare over ranges has its first range's path")),
        _ => Ok(()),
    }
}

fn check_op(op: &TxnOp, limits: &Limits) -> Result<(), WardenError> {
    match &op.op {
        None => return Err(invalid("", "transaction operation without a body")),
        Some(Op::Txn(nested)) if nested.raise_to != 0 => return Err(invalid("", "only a transaction's top level raises its revision")),
        Some(Op::Txn(nested)) => check_txn(nested, limits)?,
        Some(Op::Create(create)) => {
            path::validate(&create.path, false).map_err(|e| invalid_path(&create.path, &e))?;
            if create.data.len() > limits.value_bytes_max {
                return Err(too_large(&create.path, "data", create.data.len(), limits.value_bytes_max));
            }
            let kind = NodeKind::try_from(create.kind).map_err(|_| invalid(&create.path, "unknown node kind"))?;
            match kind {
                NodeKind::Ttl if create.ttl_ms == 0 || create.ttl_ms > limits.ttl_ms_max => {
                    return Err(invalid(&create.path, format!("ttl_ms must be in 1..={}", limits.ttl_ms_max)));
                }
                NodeKind::Persistent | NodeKind::Container if create.ttl_ms != 0 => {
                    return Err(invalid(&create.path, "ttl_ms is only for TTL nodes"));
                }
                _ => {}
            }
            if create.session_id != 0 && kind != NodeKind::Persistent {
                return Err(invalid(&create.path, "ephemeral nodes are neither containers nor TTL nodes"));
            }
        }
        Some(Op::Set(set)) => {
            path::validate(&set.path, false).map_err(|e| invalid_path(&set.path, &e))?;
            if set.data.len() > limits.value_bytes_max {
                return Err(too_large(&set.path, "data", set.data.len(), limits.value_bytes_max));
            }
        }
        Some(Op::Delete(delete)) => {
            path::validate(&delete.path, false).map_err(|e| invalid_path(&delete.path, &e))?;
            if delete.path == "/" {
                return Err(invalid("/", "the root cannot be deleted"));
            }
        }
        Some(Op::Get(get)) => path::validate(&get.path, true).map_err(|e| invalid_path(&get.path, &e))?,
        Some(Op::Put(put)) => {
            path::validate(&put.path, false).map_err(|e| invalid_path(&put.path, &e))?;
            if put.data.len() > limits.value_bytes_max {
                return Err(too_large(&put.path, "data", put.data.len(), limits.value_bytes_max));
            }
        }
        // Their bounds are checked where they run (`ranges.rs`).
        Some(Op::Range(range)) => path::validate(&range.path, true).map_err(|e| invalid_path(&range.path, &e))?,
        Some(Op::DeleteRange(delete)) => path::validate(&delete.path, false).map_err(|e| invalid_path(&delete.path, &e))?,
    }
    Ok(())
}

impl Txn<'_, '_> {
    /// Runs the transaction. On `Err`, the view must be discarded.
    pub fn run(&mut self, request: &TxnRequest) -> Result<TxnResponse, Failure> {
        check_request(request, self.limits)?;
        // Every compare, those of nested transactions too, sees the state before any
        // operation runs (etcd's order).
        let branch = self.branch(request)?;
        self.execute(request, branch)
    }

    /// Which branch `request` and each nested transaction on it take.
    fn branch(&self, request: &TxnRequest) -> Result<Branch, Failure> {
        let mut succeeded = true;
        for compare in &request.compares {
            if !self.compare(compare)? {
                succeeded = false;
                break;
            }
        }
        let ops = if succeeded { &request.then } else { &request.r#else };
        let nested = ops
            .iter()
            .filter_map(|op| match &op.op {
                Some(Op::Txn(nested)) => Some(self.branch(nested)),
                _ => None,
            })
            .collect::<Result<_, _>>()?;
        Ok(Branch { succeeded, nested })
    }

    /// Runs the operations of the branch `branch` of `request`.
    fn execute(&mut self, request: &TxnRequest, branch: Branch) -> Result<TxnResponse, Failure> {
        let ops = if branch.succeeded { &request.then } else { &request.r#else };
        let mut nested = branch.nested.into_iter();
        let mut results = Vec::with_capacity(ops.len());
        for (index, op) in ops.iter().enumerate() {
            let result = match &op.op {
                Some(Op::Txn(inner)) => match nested.next() {
                    Some(branch) => self.execute(inner, branch).map(OpResult::Txn),
                    None => Err(Failure::Storage(StorageError::Corrupt("a nested transaction without its branch".into()))),
                },
                _ => self.op(op),
            };
            let result = result.map_err(|failure| match failure {
                Failure::Refused(error) => Failure::Refused(WardenError { op_index: index as u32, ..error }),
                storage => storage,
            })?;
            results.push(TxnOpResult { result: Some(result) });
        }
        Ok(TxnResponse { header: None, succeeded: branch.succeeded, results })
    }

    fn compare(&self, compare: &Compare) -> Result<bool, Failure> {
        let op = CompareOp::try_from(compare.op).map_err(|_| invalid(&compare.path, "unknown compare op"))?;
        let target = Target::try_from(compare.target).map_err(|_| invalid(&compare.path, "unknown compare target"))?;
        if compare.ranges.is_empty() {
            let node = self.node(&compare.path)?;
            let node = node.filter(|node| !(compare.containers_absent && super::ranges::is_structure(self.descriptor, &compare.path, node)));
            return Ok(holds(compare, op, target, node.as_ref()));
        }
        // etcd's compare over a key range: every node listed must satisfy it.
        let nodes_max = self.limits.recursive_delete_nodes_max;
        let (mut listed, mut all_hold) = (0usize, true);
        for range in &compare.ranges {
            super::ranges::visit(self.view, self.descriptor, range, |_, record| {
                listed += 1;
                if listed > nodes_max {
                    return Err(too_large(&compare.path, "nodes of a compare over ranges", listed, nodes_max).into());
                }
                all_hold = holds(compare, op, target, Some(&record));
                Ok(all_hold)
            })?;
            if !all_hold {
                return Ok(false);
            }
        }
        // No node: one missing node is compared, whose value (none) no value compare matches.
        Ok(listed > 0 || (target != Target::Value && holds(compare, op, target, None)))
    }

    fn op(&mut self, op: &TxnOp) -> Result<OpResult, Failure> {
        Ok(match &op.op {
            Some(Op::Txn(_)) => return Err(invalid("", "a nested transaction runs only inside a transaction").into()),
            Some(Op::Create(create)) => OpResult::Create(self.create(create)?),
            Some(Op::Set(set)) => OpResult::Set(self.set(set)?),
            Some(Op::Delete(delete)) => OpResult::Delete(self.delete(delete)?),
            Some(Op::Get(get)) => OpResult::Get(self.get(get)?),
            Some(Op::Put(put)) => OpResult::Put(self.put(put)?),
            Some(Op::Range(range)) => OpResult::Range(self.range(range)?),
            Some(Op::DeleteRange(delete)) => OpResult::DeleteRange(self.delete_range(delete)?),
            None => return Err(invalid("", "transaction operation without a body").into()),
        })
    }

    /// The node at `path`; the root exists even before anything was written to it.
    pub(super) fn node(&self, path: &str) -> Result<Option<NodeRecord>, StorageError> {
        match self.view.node(path)? {
            None if path == "/" => Ok(Some(super::store::implicit_root())),
            node => Ok(node),
        }
    }

    /// A plain create: a lock's children are its waiters, which only the lock operations
    /// create.
    pub(super) fn create(&mut self, request: &CreateRequest) -> Result<CreateResponse, Failure> {
        self.create_node(request, None)
    }

    /// Creates a node; `lock_waiter` makes it a waiter of its parent lock (lock operations only).
    pub(super) fn create_node(&mut self, request: &CreateRequest, lock_waiter: Option<LockWaiterRecord>) -> Result<CreateResponse, Failure> {
        let requested = request.path.as_str();
        let parent_path = path::parent(requested).ok_or_else(|| error(Code::NodeExists, "/", "the root always exists"))?;
        let mut parent = match self.node(parent_path)? {
            Some(parent) => parent,
            None if request.create_parents => self.create_ancestors(parent_path, NodeKind::Persistent)?,
            None => return Err(no_node(parent_path).into()),
        };
        let mut parent_stat = parent.stat.unwrap_or_default();
        if parent_stat.ephemeral_owner != 0 {
            return Err(error(Code::NoChildrenForEphemerals, parent_path, "ephemeral nodes cannot have children").into());
        }
        if lock_waiter.is_none() && self.view.lock_meta(parent_path)?.is_some() {
            return Err(locks::waiters_only_by_lock_operations(requested));
        }
        let path = if request.sequential {
            let sequence = parent.next_sequence;
            if sequence > SEQUENCE_MAX {
                return Err(error(Code::SequenceExhausted, parent_path, "the sequential counter of this parent is exhausted").into());
            }
            parent.next_sequence += 1;
            format!("{requested}{sequence:010}")
        } else {
            requested.to_string()
        };
        if path.len() > path::PATH_BYTES_MAX {
            return Err(too_large(&path, "path", path.len(), path::PATH_BYTES_MAX).into());
        }
        if self.view.node(&path)?.is_some() {
            return Err(error(Code::NodeExists, &path, format!("{path} already exists")).into());
        }
        let kind = NodeKind::try_from(request.kind).unwrap_or(NodeKind::Persistent);
        if request.session_id != 0 {
            self.attach_ephemeral(request.session_id, &path)?;
        }
        let stat = Stat {
            ephemeral_owner: request.session_id,
            create_revision: self.revision,
            mod_revision: self.revision,
            ctime_ms: self.now_ms,
            mtime_ms: self.now_ms,
            data_length: request.data.len() as u64,
            kind: kind as i32,
            ttl_ms: request.ttl_ms,
            ..Stat::default()
        };
        self.view.put_node(&path, &NodeRecord { data: request.data.clone(), stat: Some(stat), next_sequence: 0, lock_waiter });
        self.view.add_child(parent_path, path::name(&path));
        self.touched.insert(parent_path.to_string());
        parent_stat.num_children += 1;
        parent_stat.cversion += 1;
        parent.stat = Some(parent_stat);
        self.view.put_node(parent_path, &parent);
        if kind == NodeKind::Ttl {
            self.ttl_changes.push(TtlChange::Upsert(path.clone(), stat));
        }
        Ok(CreateResponse { header: None, path, stat: Some(stat) })
    }

    /// Creates every missing ancestor of (and including) `path` as a node of `kind`
    /// (persistent, or container).
    pub(super) fn create_ancestors(&mut self, path: &str, kind: NodeKind) -> Result<NodeRecord, Failure> {
        let mut missing = vec![path.to_string()];
        let mut current = path;
        while let Some(parent) = path::parent(current) {
            if self.node(parent)?.is_some() {
                break;
            }
            missing.push(parent.to_string());
            current = parent;
        }
        for ancestor in missing.iter().rev() {
            let request = CreateRequest { path: ancestor.clone(), kind: kind as i32, ..CreateRequest::default() };
            self.create(&request)?;
        }
        self.node(path)?.ok_or_else(|| Failure::Storage(StorageError::Corrupt(format!("{path} vanished after creation"))))
    }

    fn set(&mut self, request: &SetRequest) -> Result<SetResponse, Failure> {
        let mut node = self.node(&request.path)?.ok_or_else(|| no_node(&request.path))?;
        if node.lock_waiter.is_some() {
            return Err(locks::waiters_only_by_lock_operations(&request.path));
        }
        let mut stat = node.stat.unwrap_or_default();
        if let Some(expected) = request.expected_version {
            if expected != stat.version {
                return Err(error(Code::BadVersion, &request.path, format!("version is {}, not {expected}", stat.version)).into());
            }
        }
        stat.version += 1;
        stat.mod_revision = self.revision;
        stat.mtime_ms = self.now_ms;
        stat.data_length = request.data.len() as u64;
        node.data = request.data.clone();
        node.stat = Some(stat);
        self.view.put_node(&request.path, &node);
        if stat.kind == NodeKind::Ttl as i32 {
            self.ttl_changes.push(TtlChange::Upsert(request.path.clone(), stat));
        }
        Ok(SetResponse { header: None, stat: Some(stat) })
    }

    fn delete(&mut self, request: &DeleteRequest) -> Result<DeleteResponse, Failure> {
        if request.path == self.root {
            return Err(invalid(&request.path, "the group's root cannot be deleted").into());
        }
        let node = self.view.node(&request.path)?.ok_or_else(|| no_node(&request.path))?;
        let stat = node.stat.unwrap_or_default();
        if let Some(expected) = request.expected_version {
            if expected != stat.version {
                return Err(error(Code::BadVersion, &request.path, format!("version is {}, not {expected}", stat.version)).into());
            }
        }
        if stat.num_children > 0 && !request.recursive {
            return Err(error(Code::NotEmpty, &request.path, format!("{} has {} children", request.path, stat.num_children)).into());
        }
        let mut deleted = self.delete_subtree(&request.path, Deleter::Plain)?;
        deleted += self.detach_from_parent(&request.path)?;
        Ok(DeleteResponse { header: None, deleted, ..DeleteResponse::default() })
    }

    /// Deletes `path` and everything under it; returns how many nodes went. A plain delete
    /// that would remove a lock waiter or a lock in its lock-delay (even below `path`) is
    /// refused as a whole.
    pub(super) fn delete_subtree(&mut self, path: &str, deleter: Deleter) -> Result<u64, Failure> {
        let mut doomed = vec![path.to_string()];
        let mut next = 0;
        while next < doomed.len() {
            let parent = doomed[next].clone();
            next += 1;
            let mut start_after = String::new();
            loop {
                let room = self.limits.recursive_delete_nodes_max.saturating_sub(doomed.len());
                let (names, more) = self.view.children(&parent, &start_after, room.clamp(1, 1024))?;
                for name in &names {
                    doomed.push(path::join(&parent, name));
                }
                if doomed.len() > self.limits.recursive_delete_nodes_max {
                    return Err(too_large(path, "recursive delete (nodes)", doomed.len(), self.limits.recursive_delete_nodes_max).into());
                }
                match names.last() {
                    Some(last) if more => start_after = last.clone(),
                    _ => break,
                }
            }
        }
        for doomed_path in &doomed {
            let node = self.view.node(doomed_path)?;
            if node.as_ref().is_some_and(|node| node.lock_waiter.is_some()) {
                if deleter == Deleter::Plain {
                    return Err(locks::waiters_only_by_lock_operations(doomed_path));
                }
                self.gone_waiters.push(doomed_path.clone());
            }
            if deleter == Deleter::Plain && self.in_lock_delay(doomed_path)? {
                return Err(invalid(doomed_path, format!("{doomed_path} is a lock in its lock-delay: it can be deleted once that ends")).into());
            }
            let owner = node.and_then(|node| node.stat).map_or(0, |stat| stat.ephemeral_owner);
            if owner != 0 {
                self.detach_ephemeral(owner, doomed_path)?;
            }
            self.forget_lock(doomed_path)?;
            self.view.delete_node(doomed_path);
            self.ttl_changes.push(TtlChange::Remove(doomed_path.clone()));
            if let Some(parent) = path::parent(doomed_path) {
                if doomed_path != path {
                    self.view.remove_child(parent, path::name(doomed_path));
                }
            }
        }
        Ok(doomed.len() as u64)
    }

    /// Removes `path` from its parent's children; an emptied container parent goes too
    /// (and so on upward). Returns how many containers were removed.
    pub(super) fn detach_from_parent(&mut self, path: &str) -> Result<u64, Failure> {
        let Some(parent_path) = path::parent(path) else { return Ok(0) };
        self.view.remove_child(parent_path, path::name(path));
        self.touched.insert(parent_path.to_string());
        let mut parent = self.node(parent_path)?.ok_or_else(|| StorageError::Corrupt(format!("parent of {path} missing")))?;
        let mut stat = parent.stat.unwrap_or_default();
        stat.num_children = stat.num_children.saturating_sub(1);
        stat.cversion += 1;
        // A lock in its lock-delay stays (with its metadata) until the delay ends, even empty.
        if stat.num_children == 0 && stat.kind == NodeKind::Container as i32 && parent_path != self.root && !self.in_lock_delay(parent_path)? {
            self.forget_lock(parent_path)?;
            self.view.delete_node(parent_path);
            return Ok(1 + self.detach_from_parent(parent_path)?);
        }
        parent.stat = Some(stat);
        self.view.put_node(parent_path, &parent);
        Ok(0)
    }

    /// Whether `path` is a lock in its lock-delay.
    pub(super) fn in_lock_delay(&self, path: &str) -> Result<bool, StorageError> {
        Ok(self.view.lock_meta(path)?.is_some_and(|meta| meta.blocked_until_ms != 0))
    }

    /// Removes the lock metadata of a node that is being deleted (if it is a lock).
    fn forget_lock(&mut self, path: &str) -> Result<(), Failure> {
        if self.view.lock_meta(path)?.is_some() {
            self.view.delete_lock_meta(path);
            self.lock_changes.push((path.to_string(), 0));
        }
        Ok(())
    }

    fn get(&self, request: &GetRequest) -> Result<GetResponse, Failure> {
        Ok(match self.node(&request.path)? {
            Some(node) => GetResponse { header: None, data: node.data, stat: node.stat },
            None => GetResponse::default(),
        })
    }

    /// Refuses the use of `session` by a principal that does not own it
    /// ([`sessions::check_use`]); a session that does not exist is left to the caller.
    pub(super) fn check_owner(&self, session: u64, path: &str) -> Result<(), Failure> {
        match self.view.session(session)? {
            Some(record) => Ok(sessions::check_use(&record, self.principal, path)?),
            None => Ok(()),
        }
    }

    /// Records that `session` owns the new ephemeral node `path`.
    pub(super) fn attach_ephemeral(&mut self, session: u64, path: &str) -> Result<(), Failure> {
        self.check_owner(session, path)?;
        let mut record = self.view.session(session)?.ok_or_else(|| session_expired(session, path))?;
        if record.ephemerals >= self.limits.ephemerals_per_session_max as u64 {
            return Err(
                too_large(path, "ephemeral nodes of one session", record.ephemerals as usize + 1, self.limits.ephemerals_per_session_max).into()
            );
        }
        record.ephemerals += 1;
        self.view.put_session(&record);
        self.view.add_ephemeral(session, path);
        Ok(())
    }

    /// `session` no longer owns `path` here: its index entry goes and its count drops.
    pub(super) fn detach_ephemeral(&mut self, session: u64, path: &str) -> Result<(), Failure> {
        self.view.remove_ephemeral(session, path);
        if let Some(mut record) = self.view.session(session)? {
            record.ephemerals = record.ephemerals.saturating_sub(1);
            self.view.put_session(&record);
        }
        Ok(())
    }

    /// Deletes a TTL node the leader found expired, if it is unchanged and childless.
    pub fn expire_ttl(&mut self, path: &str, mod_revision: u64) -> Result<u64, Failure> {
        let Some(node) = self.view.node(path)? else { return Ok(0) };
        let stat = node.stat.unwrap_or_default();
        if stat.kind != NodeKind::Ttl as i32 || stat.mod_revision != mod_revision || stat.num_children > 0 || self.in_lock_delay(path)? {
            return Ok(0);
        }
        let deleted = self.delete_subtree(path, Deleter::Plain)?;
        Ok(deleted + self.detach_from_parent(path)?)
    }
}
