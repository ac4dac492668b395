//! Model-based property test of the namespace state machine.
//!
//! Random operation sequences (creates, sets, deletes, reads, paginated child listings,
//! multi-op transactions with compares, restarts, TTL scans, raw and mutated command bytes,
//! invalid paths) go to the state machine through `Harness` and to a small in-memory model
//! written here. After every step the outcomes (value or typed error code, path, op index)
//! must match, the group revision must have moved exactly as the model's (one per successful
//! mutating transaction, none for failures and read-only transactions), and the whole tree —
//! every node's data and stat, every child list — must equal the model's.
//!
//! Modelled semantics: a parent must exist unless `create_parents` (missing ancestors become
//! persistent nodes); `NODE_EXISTS`; `BAD_VERSION` for a wrong expected version (checked
//! before `NOT_EMPTY`); `NOT_EMPTY` for a non-recursive delete of a node with children; a
//! container goes when its last child goes, cascading upward but never past the root;
//! sequential names take a 10-digit per-parent counter that never goes back; missing nodes
//! compare as version / create_revision / mod_revision 0 and an empty value; `/` always
//! exists and cannot be deleted (`INVALID_ARGUMENT`); malformed or reserved paths are
//! `INVALID_PATH` (reads may look under `/warden`); TTL nodes expire through the leader's scan
//! when unchanged for `ttl_ms` and childless; bytes that do not decode as a command are an
//! `Err` of `apply_bytes`, and bytes that do decode are run through the model like any command.
//!
//! Puts (upserts: missing ancestors become containers, a put on a container makes it a node
//! created now), ranges by path bytes inside a subtree (containers and the root not listed,
//! counted up to a bound) and range deletes (a node with children becomes a container) are
//! modelled too, without sessions.
//!
//! `namespace_matches_model_small_limits` runs under tiny limits (4-byte values, 6-op
//! transactions, 2-name pages, 4-node recursive deletes, 10 s TTLs) so every bound is hit;
//! `namespace_matches_model_default_limits` under the defaults.

use std::collections::BTreeMap;
use std::fmt::Debug;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use prost::Message as _;
use warden_namespace::Limits;
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::{Command, CommandResult};
use warden_proto::v1::compare::{Op as CmpOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::txn_op_result::Result as OpResult;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{
    Compare, CreateRequest, CreateResponse, DeleteRangeRequest, DeleteRangeResponse, DeleteRequest, DeleteResponse, GetChildrenRequest,
    GetChildrenResponse, GetRequest, GetResponse, Node, NodeKind, PutRequest, PutResponse, RangeRequest, RangeResponse, ResponseHeader, SetRequest,
    SetResponse, Stat, TxnOp, TxnOpResult, TxnRequest, TxnResponse,
};
use warden_testkit::harness::{Harness, Outcome};

const SEQUENCE_MAX: u64 = 9_999_999_999;
const PATH_BYTES_MAX: usize = 1024;
const PATH_DEPTH_MAX: usize = 64;
/// Nodes a range query counts at most (`warden_namespace::ranges::RANGE_COUNT_NODES_MAX`).
const RANGE_COUNT_NODES_MAX: usize = 100_000;

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
struct ModelNode {
    data: Vec<u8>,
    /// create_revision, mod_revision, version, cversion, num_children, ctime/mtime,
    /// data_length, kind, ttl_ms (ephemeral_owner is always 0 here: no sessions).
    stat: Stat,
    /// Next sequential suffix for children.
    next_sequence: u64,
}

/// The typed error the model expects.
#[derive(Clone, Debug, PartialEq)]
struct Expected {
    code: Code,
    path: String,
    /// Index of the failing operation, for errors raised while running a transaction's ops.
    op_index: Option<u32>,
}

fn fail(code: Code, path: &str) -> Expected {
    Expected { code, path: path.to_string(), op_index: None }
}

type Want<T> = Result<T, Expected>;

/// Path rules of DESIGN.md "Data model", written independently of `namespace::path`.
fn path_ok(path: &str, allow_reserved: bool) -> bool {
    if path.is_empty() || path.len() > PATH_BYTES_MAX || !path.starts_with('/') || path.chars().any(char::is_control) {
        return false;
    }
    if path == "/" {
        return true;
    }
    if path.ends_with('/') {
        return false;
    }
    let segments: Vec<&str> = path[1..].split('/').collect();
    if segments.iter().any(|s| s.is_empty() || *s == "." || *s == "..") || segments.len() > PATH_DEPTH_MAX {
        return false;
    }
    allow_reserved || !(path == "/warden" || path.starts_with("/warden/"))
}

fn parent_of(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// Sorted child names of `path`.
fn children_of(nodes: &BTreeMap<String, ModelNode>, path: &str) -> Vec<String> {
    let mut names: Vec<String> = nodes.keys().filter(|k| k.as_str() != "/" && parent_of(k) == Some(path)).map(|k| name_of(k).to_string()).collect();
    names.sort();
    names
}

/// `[from, to)` of a range inside `scope`'s subtree (empty bounds: the subtree's own).
fn range_bounds(scope: &str, from: &[u8], to: &[u8]) -> Result<(Vec<u8>, Vec<u8>), Expected> {
    let end = if scope == "/" { "0".to_string() } else { format!("{scope}0") };
    let from = if from.is_empty() { scope.as_bytes().to_vec() } else { from.to_vec() };
    let to = if to.is_empty() { end.as_bytes().to_vec() } else { to.to_vec() };
    if from.as_slice() < scope.as_bytes() || to.as_slice() > end.as_bytes() {
        return Err(fail(Code::InvalidArgument, scope));
    }
    Ok((from, to))
}

/// The nodes a range lists: path bytes in `[from, to)`, at or below `scope`, neither the
/// root nor a container.
fn listed<'n>(
    nodes: &'n BTreeMap<String, ModelNode>,
    scope: &'n str,
    from: &'n [u8],
    to: &'n [u8],
) -> impl Iterator<Item = (&'n String, &'n ModelNode)> + 'n {
    nodes.iter().filter(move |(path, node)| {
        let bytes = path.as_bytes();
        let below = scope == "/" || path.as_str() == scope || path.starts_with(&format!("{scope}/"));
        bytes >= from && bytes < to && below && path.as_str() != "/" && node.stat.kind != NodeKind::Container as i32
    })
}

/// A range: the first `limit` nodes (0: `page_max`) and the count, refused past `count_max`.
fn range_of(nodes: &BTreeMap<String, ModelNode>, request: &RangeRequest, page_max: usize, count_max: usize) -> Want<RangeResponse> {
    let scope = request.path.as_str();
    let (from, to) = range_bounds(scope, &request.from, &request.to)?;
    let limit = match request.limit as usize {
        0 => page_max,
        n if n > page_max => return Err(fail(Code::TooLarge, scope)),
        n => n,
    };
    let all: Vec<(&String, &ModelNode)> = listed(nodes, scope, &from, &to).collect();
    if all.len() > count_max {
        return Err(fail(Code::TooLarge, scope));
    }
    let count = all.len() as u64;
    if request.count_only {
        return Ok(RangeResponse { header: None, nodes: Vec::new(), more: false, count });
    }
    let more = all.len() > limit;
    let nodes = all
        .into_iter()
        .take(limit)
        .map(|(path, node)| Node { path: path.clone(), data: if request.keys_only { Vec::new() } else { node.data.clone() }, stat: Some(node.stat) })
        .collect();
    Ok(RangeResponse { header: None, nodes, more, count })
}

fn header(revision: u64) -> Option<ResponseHeader> {
    Some(ResponseHeader { revision, ..ResponseHeader::default() })
}

#[derive(Clone, Debug)]
struct Model {
    limits: Limits,
    nodes: BTreeMap<String, ModelNode>,
    revision: u64,
}

/// One transaction's scratch state: committed only if every op succeeds.
struct Work<'a> {
    limits: &'a Limits,
    nodes: BTreeMap<String, ModelNode>,
    revision: u64,
    now: u64,
    changed: bool,
}

impl Model {
    fn new(limits: Limits) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), ModelNode { data: Vec::new(), stat: Stat::default(), next_sequence: 0 });
        Model { limits, nodes, revision: 0 }
    }

    /// Shape checks done before anything runs.
    fn check(&self, request: &TxnRequest) -> Result<(), Expected> {
        let ops = request.then.len() + request.r#else.len();
        if ops > self.limits.txn_ops_max {
            return Err(fail(Code::TooLarge, ""));
        }
        for compare in &request.compares {
            if !path_ok(&compare.path, true) {
                return Err(fail(Code::InvalidPath, &compare.path));
            }
            if CmpOp::try_from(compare.op).is_err() || Target::try_from(compare.target).is_err() {
                return Err(fail(Code::InvalidArgument, &compare.path));
            }
        }
        for op in request.then.iter().chain(&request.r#else) {
            match &op.op {
                None => return Err(fail(Code::InvalidArgument, "")),
                Some(Op::Txn(_)) => unreachable!("the model generates no nested transactions"),
                Some(Op::Create(c)) => {
                    if !path_ok(&c.path, false) {
                        return Err(fail(Code::InvalidPath, &c.path));
                    }
                    if c.data.len() > self.limits.value_bytes_max {
                        return Err(fail(Code::TooLarge, &c.path));
                    }
                    let bad = match NodeKind::try_from(c.kind) {
                        Err(_) => true,
                        Ok(NodeKind::Ttl) => c.ttl_ms == 0 || c.ttl_ms > self.limits.ttl_ms_max,
                        Ok(_) => c.ttl_ms != 0,
                    };
                    // An ephemeral node (one with an owning session) is always persistent; a valid
                    // ephemeral create never reaches the model (`unmodelled`).
                    let bad = bad || (c.session_id != 0 && c.kind != NodeKind::Persistent as i32);
                    if bad {
                        return Err(fail(Code::InvalidArgument, &c.path));
                    }
                }
                Some(Op::Set(s)) => {
                    if !path_ok(&s.path, false) {
                        return Err(fail(Code::InvalidPath, &s.path));
                    }
                    if s.data.len() > self.limits.value_bytes_max {
                        return Err(fail(Code::TooLarge, &s.path));
                    }
                }
                Some(Op::Delete(d)) => {
                    if !path_ok(&d.path, false) {
                        return Err(fail(Code::InvalidPath, &d.path));
                    }
                    if d.path == "/" {
                        return Err(fail(Code::InvalidArgument, "/"));
                    }
                }
                Some(Op::Get(g)) => {
                    if !path_ok(&g.path, true) {
                        return Err(fail(Code::InvalidPath, &g.path));
                    }
                }
                Some(Op::Put(p)) => {
                    if !path_ok(&p.path, false) {
                        return Err(fail(Code::InvalidPath, &p.path));
                    }
                    if p.data.len() > self.limits.value_bytes_max {
                        return Err(fail(Code::TooLarge, &p.path));
                    }
                }
                Some(Op::Range(r)) => {
                    if !path_ok(&r.path, true) {
                        return Err(fail(Code::InvalidPath, &r.path));
                    }
                }
                Some(Op::DeleteRange(d)) => {
                    if !path_ok(&d.path, false) {
                        return Err(fail(Code::InvalidPath, &d.path));
                    }
                }
            }
        }
        Ok(())
    }

    fn compare(&self, compare: &Compare) -> bool {
        let node = self.nodes.get(&compare.path);
        // A missing node compares as version 0, revisions 0 and an empty value.
        let stat = node.map(|n| n.stat).unwrap_or_default();
        let ordering = match Target::try_from(compare.target).unwrap_or(Target::Version) {
            Target::Exists => return node.is_some() == compare.exists,
            Target::Version => stat.version.cmp(&compare.number),
            Target::CreateRevision => stat.create_revision.cmp(&compare.number),
            Target::ModRevision => stat.mod_revision.cmp(&compare.number),
            Target::Value => node.map_or(&[][..], |n| n.data.as_slice()).cmp(compare.value.as_slice()),
            Target::Writes => node.map_or(0, |n| n.stat.version + 1).cmp(&compare.number),
            // No sessions here: nothing is owned.
            Target::Owner => 0.cmp(&compare.number),
        };
        match CmpOp::try_from(compare.op).unwrap_or(CmpOp::Equal) {
            CmpOp::Equal => ordering.is_eq(),
            CmpOp::NotEqual => ordering.is_ne(),
            CmpOp::Less => ordering.is_lt(),
            CmpOp::Greater => ordering.is_gt(),
        }
    }

    fn work(&self, now: u64) -> Work<'_> {
        Work { limits: &self.limits, nodes: self.nodes.clone(), revision: self.revision + 1, now, changed: false }
    }

    fn commit(&mut self, nodes: BTreeMap<String, ModelNode>) {
        self.nodes = nodes;
        self.revision += 1;
    }

    /// A transaction: all or nothing, one revision if it changed anything.
    fn txn(&mut self, request: &TxnRequest, now: u64) -> Want<TxnResponse> {
        self.check(request)?;
        let succeeded = request.compares.iter().all(|c| self.compare(c));
        let ops = if succeeded { &request.then } else { &request.r#else };
        let mut work = self.work(now);
        let mut results = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            let result = work.op(op).map_err(|e| Expected { op_index: Some(index as u32), ..e })?;
            results.push(TxnOpResult { result: Some(result) });
        }
        if work.changed {
            let nodes = work.nodes;
            self.commit(nodes);
        }
        Ok(TxnResponse { header: header(self.revision), succeeded, results })
    }

    /// One op as a single-op transaction.
    fn one(&mut self, op: Op, now: u64) -> Want<OpResult> {
        let response = self.txn(&TxnRequest { then: vec![TxnOp { op: Some(op) }], ..TxnRequest::default() }, now)?;
        Ok(response.results.into_iter().next().and_then(|r| r.result).expect("one result"))
    }

    /// A decoded replicated command.
    fn command(&mut self, command: &Command) -> Want<TxnResponse> {
        match &command.op {
            None => Err(fail(Code::InvalidArgument, "")),
            Some(CommandOp::Txn(request)) => self.txn(request, command.now_ms),
            Some(CommandOp::ExpireTtl(expire)) => {
                self.expire(&expire.path, expire.mod_revision, command.now_ms);
                Ok(TxnResponse { header: header(self.revision), succeeded: true, results: Vec::new() })
            }
            Some(_) => {
                unreachable!("session, lock, placement and paged-work commands are filtered out before the model (namespace_sessions.rs, namespace_locks.rs and namespace_split.rs cover them)")
            }
        }
    }

    /// Deletes a TTL node if unchanged since `mod_revision` and childless.
    fn expire(&mut self, path: &str, mod_revision: u64, now: u64) {
        let Some(node) = self.nodes.get(path) else { return };
        if node.stat.kind != NodeKind::Ttl as i32 || node.stat.mod_revision != mod_revision || node.stat.num_children > 0 {
            return;
        }
        let mut work = self.work(now);
        work.nodes.remove(path);
        work.detach(path);
        let nodes = work.nodes;
        self.commit(nodes);
    }

    /// What the leader proposes at `now` (then applied in order); returns how many.
    fn leader_scan(&mut self, now: u64) -> usize {
        let mut due = Vec::new();
        for (path, node) in &self.nodes {
            if due.len() >= self.limits.ttl_expiries_per_scan_max {
                break;
            }
            let stat = &node.stat;
            if stat.kind == NodeKind::Ttl as i32 && now.saturating_sub(stat.mtime_ms) >= stat.ttl_ms && stat.num_children == 0 {
                due.push((path.clone(), stat.mod_revision));
            }
        }
        for (path, mod_revision) in &due {
            self.expire(path, *mod_revision, now);
        }
        due.len()
    }

    // Queries.

    fn get(&self, path: &str) -> Want<GetResponse> {
        if !path_ok(path, true) {
            return Err(fail(Code::InvalidPath, path));
        }
        let node = self.nodes.get(path).ok_or_else(|| fail(Code::NoNode, path))?;
        Ok(GetResponse { header: None, data: node.data.clone(), stat: Some(node.stat) })
    }

    fn exists(&self, path: &str) -> Want<Option<Stat>> {
        if !path_ok(path, true) {
            return Err(fail(Code::InvalidPath, path));
        }
        Ok(self.nodes.get(path).map(|n| n.stat))
    }

    /// A range query: pages of the children page size, counted up to the query bound.
    fn range(&self, request: &RangeRequest) -> Want<RangeResponse> {
        if !path_ok(&request.path, true) {
            return Err(fail(Code::InvalidPath, &request.path));
        }
        range_of(&self.nodes, request, self.limits.children_page_max, RANGE_COUNT_NODES_MAX)
    }

    fn children(&self, request: &GetChildrenRequest) -> Want<GetChildrenResponse> {
        let path = request.path.as_str();
        if !path_ok(path, true) {
            return Err(fail(Code::InvalidPath, path));
        }
        let parent = self.nodes.get(path).ok_or_else(|| fail(Code::NoNode, path))?;
        let limit = match request.limit as usize {
            0 => self.limits.children_page_max,
            n if n > self.limits.children_page_max => return Err(fail(Code::TooLarge, path)),
            n => n,
        };
        let after: Vec<String> = children_of(&self.nodes, path).into_iter().filter(|n| n.as_bytes() > request.start_after.as_bytes()).collect();
        let more = after.len() > limit;
        let names: Vec<String> = after.into_iter().take(limit).collect();
        let stats = if request.with_stats { names.iter().map(|n| self.nodes[&join(path, n)].stat).collect() } else { Vec::new() };
        Ok(GetChildrenResponse { header: None, names, stats, more, stat: Some(parent.stat) })
    }
}

impl Work<'_> {
    fn op(&mut self, op: &TxnOp) -> Want<OpResult> {
        Ok(match op.op.as_ref().expect("checked") {
            Op::Create(c) => OpResult::Create(self.create(c)?),
            Op::Set(s) => OpResult::Set(self.set(s)?),
            Op::Delete(d) => OpResult::Delete(self.delete(d)?),
            Op::Get(g) => OpResult::Get(self.get(g)),
            Op::Put(p) => OpResult::Put(self.put(p)?),
            Op::Range(r) => OpResult::Range(range_of(&self.nodes, r, self.limits.children_page_max, self.limits.recursive_delete_nodes_max)?),
            Op::DeleteRange(d) => OpResult::DeleteRange(self.delete_range(d)?),
            Op::Txn(_) => unreachable!("the model generates no nested transactions"),
        })
    }

    /// Creates the node or replaces its data; missing ancestors become containers; a
    /// container becomes a persistent node created now.
    fn put(&mut self, request: &PutRequest) -> Want<PutResponse> {
        let path = request.path.as_str();
        let (revision, now) = (self.revision, self.now);
        match self.nodes.get_mut(path) {
            Some(node) if node.stat.kind != NodeKind::Container as i32 => {
                let previous = request.return_previous.then(|| Node { path: path.to_string(), data: node.data.clone(), stat: Some(node.stat) });
                if !request.keep_data {
                    node.data = request.data.clone();
                }
                node.stat.version += 1;
                node.stat.mod_revision = revision;
                node.stat.mtime_ms = now;
                node.stat.data_length = node.data.len() as u64;
                let stat = node.stat;
                self.changed = true;
                Ok(PutResponse { header: None, stat: Some(stat), previous })
            }
            _ if request.keep_data || request.keep_owner => Err(fail(Code::NoNode, path)),
            Some(container) => {
                container.stat = Stat {
                    create_revision: revision,
                    mod_revision: revision,
                    ctime_ms: now,
                    mtime_ms: now,
                    data_length: request.data.len() as u64,
                    num_children: container.stat.num_children,
                    cversion: container.stat.cversion,
                    kind: NodeKind::Persistent as i32,
                    ..Stat::default()
                };
                container.data = request.data.clone();
                let stat = container.stat;
                self.changed = true;
                Ok(PutResponse { header: None, stat: Some(stat), previous: None })
            }
            None => {
                let mut missing = Vec::new();
                let mut current = path;
                while let Some(up) = parent_of(current) {
                    if self.nodes.contains_key(up) {
                        break;
                    }
                    missing.push(up.to_string());
                    current = up;
                }
                for ancestor in missing.iter().rev() {
                    self.create(&CreateRequest { path: ancestor.clone(), kind: NodeKind::Container as i32, ..CreateRequest::default() })?;
                }
                let created = self.create(&CreateRequest { path: path.to_string(), data: request.data.clone(), ..CreateRequest::default() })?;
                Ok(PutResponse { header: None, stat: created.stat, previous: None })
            }
        }
    }

    /// Deletes the range's nodes in path order: one with children becomes a container.
    fn delete_range(&mut self, request: &DeleteRangeRequest) -> Want<DeleteRangeResponse> {
        let scope = request.path.as_str();
        let (from, to) = range_bounds(scope, &request.from, &request.to)?;
        let doomed: Vec<Node> = listed(&self.nodes, scope, &from, &to)
            .map(|(path, node)| Node { path: path.clone(), data: node.data.clone(), stat: Some(node.stat) })
            .collect();
        if doomed.len() > self.limits.recursive_delete_nodes_max {
            return Err(fail(Code::TooLarge, scope));
        }
        for node in &doomed {
            let current = self.nodes.get_mut(&node.path).expect("listed");
            if current.stat.num_children > 0 {
                current.stat.kind = NodeKind::Container as i32;
                current.stat.ttl_ms = 0;
                current.stat.version += 1;
                current.stat.mod_revision = self.revision;
                current.stat.mtime_ms = self.now;
                current.stat.data_length = 0;
                current.data = Vec::new();
            } else {
                self.nodes.remove(&node.path);
                self.detach(&node.path);
            }
            self.changed = true;
        }
        let deleted = doomed.len() as u64;
        let previous = if request.return_previous { doomed } else { Vec::new() };
        Ok(DeleteRangeResponse { header: None, deleted, previous })
    }

    fn create(&mut self, request: &CreateRequest) -> Want<CreateResponse> {
        let requested = request.path.as_str();
        let parent_path = parent_of(requested).ok_or_else(|| fail(Code::NodeExists, "/"))?.to_string();
        if !self.nodes.contains_key(&parent_path) {
            if !request.create_parents {
                return Err(fail(Code::NoNode, &parent_path));
            }
            // Missing ancestors become plain persistent nodes, top-down.
            let mut missing = vec![parent_path.clone()];
            let mut current = parent_path.clone();
            while let Some(up) = parent_of(&current) {
                if self.nodes.contains_key(up) {
                    break;
                }
                missing.push(up.to_string());
                current = up.to_string();
            }
            for ancestor in missing.iter().rev() {
                self.create(&CreateRequest { path: ancestor.clone(), ..CreateRequest::default() })?;
            }
        }
        let parent = self.nodes.get_mut(&parent_path).expect("parent");
        let path = if request.sequential {
            let sequence = parent.next_sequence;
            if sequence > SEQUENCE_MAX {
                return Err(fail(Code::SequenceExhausted, &parent_path));
            }
            parent.next_sequence += 1;
            format!("{requested}{sequence:010}")
        } else {
            requested.to_string()
        };
        if path.len() > PATH_BYTES_MAX {
            return Err(fail(Code::TooLarge, &path));
        }
        if self.nodes.contains_key(&path) {
            return Err(fail(Code::NodeExists, &path));
        }
        let parent = self.nodes.get_mut(&parent_path).expect("parent");
        parent.stat.num_children += 1;
        parent.stat.cversion += 1;
        let kind = NodeKind::try_from(request.kind).unwrap_or(NodeKind::Persistent);
        let stat = Stat {
            create_revision: self.revision,
            mod_revision: self.revision,
            ctime_ms: self.now,
            mtime_ms: self.now,
            data_length: request.data.len() as u64,
            kind: kind as i32,
            ttl_ms: request.ttl_ms,
            ..Stat::default()
        };
        self.nodes.insert(path.clone(), ModelNode { data: request.data.clone(), stat, next_sequence: 0 });
        self.changed = true;
        Ok(CreateResponse { header: None, path, stat: Some(stat) })
    }

    fn set(&mut self, request: &SetRequest) -> Want<SetResponse> {
        let node = self.nodes.get_mut(&request.path).ok_or_else(|| fail(Code::NoNode, &request.path))?;
        if request.expected_version.is_some_and(|v| v != node.stat.version) {
            return Err(fail(Code::BadVersion, &request.path));
        }
        node.stat.version += 1;
        node.stat.mod_revision = self.revision;
        node.stat.mtime_ms = self.now;
        node.stat.data_length = request.data.len() as u64;
        node.data = request.data.clone();
        self.changed = true;
        Ok(SetResponse { header: None, stat: Some(node.stat) })
    }

    fn delete(&mut self, request: &DeleteRequest) -> Want<DeleteResponse> {
        let path = request.path.as_str();
        let node = self.nodes.get(path).ok_or_else(|| fail(Code::NoNode, path))?;
        if request.expected_version.is_some_and(|v| v != node.stat.version) {
            return Err(fail(Code::BadVersion, path));
        }
        if node.stat.num_children > 0 && !request.recursive {
            return Err(fail(Code::NotEmpty, path));
        }
        let below = format!("{path}/");
        let doomed: Vec<String> = self.nodes.keys().filter(|k| k.as_str() == path || k.starts_with(&below)).cloned().collect();
        if doomed.len() > self.limits.recursive_delete_nodes_max {
            return Err(fail(Code::TooLarge, path));
        }
        for doomed_path in &doomed {
            self.nodes.remove(doomed_path);
        }
        let deleted = doomed.len() as u64 + self.detach(path);
        self.changed = true;
        Ok(DeleteResponse { header: None, deleted, ..DeleteResponse::default() })
    }

    /// `path` was removed: update its parent; an emptied container parent (never the root)
    /// goes too, upward. Returns the number of containers removed.
    fn detach(&mut self, path: &str) -> u64 {
        let Some(parent_path) = parent_of(path) else { return 0 };
        let parent = self.nodes.get_mut(parent_path).expect("parent of a removed node");
        parent.stat.num_children -= 1;
        parent.stat.cversion += 1;
        if parent.stat.num_children == 0 && parent.stat.kind == NodeKind::Container as i32 && parent_path != "/" {
            self.nodes.remove(parent_path);
            return 1 + self.detach(parent_path);
        }
        0
    }

    /// A get inside a transaction: a missing node reads as an empty response.
    fn get(&self, request: &GetRequest) -> GetResponse {
        match self.nodes.get(&request.path) {
            Some(node) => GetResponse { header: None, data: node.data.clone(), stat: Some(node.stat) },
            None => GetResponse::default(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operation strategies (paths are resolved against the model when the step runs)
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum PathSpec {
    /// `/x`, `/x/y` or `/x/y/z` over {a, b, c}.
    Rand(String),
    /// The i-th (mod count) node that exists in the model, root included.
    Existing(usize),
    /// The name the next sequential create of this path would get (to collide with it).
    NextSeq(String),
    /// A malformed path.
    Bad(usize),
    /// A path under the reserved `/warden`.
    Reserved(usize),
    /// A child named {a, b, c} of the i-th existing node (grows deeper trees, also under
    /// sequential nodes).
    ChildOf(usize, String),
}

const BAD_PATHS: usize = 16;

fn bad_path(i: usize) -> String {
    match i % BAD_PATHS {
        0 => String::new(),
        1 => "a".into(),
        2 => "a/b".into(),
        3 => "/a/".into(),
        4 => "//".into(),
        5 => "/a//b".into(),
        6 => "/./a".into(),
        7 => "/a/.".into(),
        8 => "/a/../b".into(),
        9 => "/..".into(),
        10 => "/a\0b".into(),
        11 => "/a\nb".into(),
        12 => "/a\u{85}".into(),
        13 => format!("/{}", "x".repeat(PATH_BYTES_MAX)),
        14 => "/a".repeat(PATH_DEPTH_MAX + 1),
        _ => "/b/c/".into(),
    }
}

fn reserved_path(i: usize) -> String {
    ["/warden", "/warden/a", "/warden/a/b"][i % 3].to_string()
}

impl PathSpec {
    fn resolve(&self, model: &Model) -> String {
        match self {
            PathSpec::Rand(path) => path.clone(),
            PathSpec::Existing(i) => model.nodes.keys().nth(i % model.nodes.len()).expect("nodes").clone(),
            PathSpec::NextSeq(base) => {
                let next = parent_of(base).and_then(|p| model.nodes.get(p)).map_or(0, |n| n.next_sequence);
                format!("{base}{next:010}")
            }
            PathSpec::Bad(i) => bad_path(*i),
            PathSpec::Reserved(i) => reserved_path(*i),
            PathSpec::ChildOf(i, name) => join(&PathSpec::Existing(*i).resolve(model), name),
        }
    }
}

fn rand_path() -> impl Strategy<Value = String> {
    vec(prop_oneof![Just("a"), Just("b"), Just("c")], 1..=3).prop_map(|segments| format!("/{}", segments.join("/")))
}

/// How often each kind of path is drawn (relative weights).
#[derive(Clone, Copy)]
struct Mix {
    random: u32,
    existing: u32,
    child: u32,
    next_seq: u32,
    /// Each of malformed and reserved.
    invalid: u32,
}

/// For single operations that address existing nodes (set, delete, reads).
const ADDRESS: Mix = Mix { random: 10, existing: 12, child: 2, next_seq: 1, invalid: 1 };
/// For creates.
const CREATE: Mix = Mix { random: 10, existing: 2, child: 8, next_seq: 1, invalid: 1 };
/// Inside transactions, where one bad path fails the whole transaction.
const TXN_ADDRESS: Mix = Mix { random: 40, existing: 50, child: 8, next_seq: 2, invalid: 1 };
const TXN_CREATE: Mix = Mix { random: 40, existing: 8, child: 40, next_seq: 4, invalid: 1 };

fn path_spec(mix: Mix) -> impl Strategy<Value = PathSpec> {
    let name = prop_oneof![Just("a"), Just("b"), Just("c")].prop_map(String::from);
    prop_oneof![
        mix.random => rand_path().prop_map(PathSpec::Rand),
        mix.existing => (0..64usize).prop_map(PathSpec::Existing),
        mix.child => (0..64usize, name).prop_map(|(i, name)| PathSpec::ChildOf(i, name)),
        mix.next_seq => rand_path().prop_map(PathSpec::NextSeq),
        mix.invalid => (0..BAD_PATHS).prop_map(PathSpec::Bad),
        mix.invalid => (0..3usize).prop_map(PathSpec::Reserved),
    ]
}

/// Small data; lengths 5 and 6 (weight `big` against 20) exceed the small-limits bound.
fn data(big: u32) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![Just(b'x'), Just(b'y'), Just(0u8), Just(0xffu8)];
    prop_oneof![20 => vec(byte.clone(), 0..=4), big => vec(byte, 5..=6)]
}

/// `(kind, ttl_ms)`: persistent, container, TTL, and (weight `bad` against 30) an invalid
/// combination.
fn kind(bad: u32) -> impl Strategy<Value = (i32, u64)> {
    prop_oneof![
        16 => Just((NodeKind::Persistent as i32, 0)),
        10 => Just((NodeKind::Container as i32, 0)),
        4 => prop_oneof![Just(1_500u64), Just(4_000)].prop_map(|ttl| (NodeKind::Ttl as i32, ttl)),
        bad => prop_oneof![
            Just((NodeKind::Ttl as i32, 0)),
            Just((NodeKind::Ttl as i32, 20_000)),
            Just((NodeKind::Persistent as i32, 5)),
            Just((NodeKind::Container as i32, 5)),
            Just((42, 0)),
        ],
    ]
}

#[derive(Clone, Debug)]
enum VersionSpec {
    None,
    /// The node's current version (0 if missing).
    Right,
    /// Current version + k.
    Wrong(u64),
    Literal(u64),
}

fn version_spec() -> impl Strategy<Value = VersionSpec> {
    prop_oneof![
        3 => Just(VersionSpec::None),
        3 => Just(VersionSpec::Right),
        1 => (1..=2u64).prop_map(VersionSpec::Wrong),
        1 => (0..=2u64).prop_map(VersionSpec::Literal),
    ]
}

impl VersionSpec {
    fn resolve(&self, model: &Model, path: &str) -> Option<u64> {
        let current = model.nodes.get(path).map_or(0, |n| n.stat.version);
        match self {
            VersionSpec::None => None,
            VersionSpec::Right => Some(current),
            VersionSpec::Wrong(k) => Some(current + k),
            VersionSpec::Literal(v) => Some(*v),
        }
    }
}

#[derive(Clone, Debug)]
struct CreateSpec {
    path: PathSpec,
    data: Vec<u8>,
    kind: (i32, u64),
    sequential: bool,
    create_parents: bool,
}

fn create_spec(mix: Mix, bad: u32) -> impl Strategy<Value = CreateSpec> {
    (path_spec(mix), data(bad), kind(bad), prop::bool::weighted(0.2), prop::bool::weighted(0.4))
        .prop_map(|(path, data, kind, sequential, create_parents)| CreateSpec { path, data, kind, sequential, create_parents })
}

#[derive(Clone, Debug)]
struct SetSpec {
    path: PathSpec,
    data: Vec<u8>,
    version: VersionSpec,
}

fn set_spec(mix: Mix, big: u32) -> impl Strategy<Value = SetSpec> {
    (path_spec(mix), data(big), version_spec()).prop_map(|(path, data, version)| SetSpec { path, data, version })
}

#[derive(Clone, Debug)]
struct DeleteSpec {
    path: PathSpec,
    version: VersionSpec,
    recursive: bool,
}

fn delete_spec(mix: Mix) -> impl Strategy<Value = DeleteSpec> {
    (path_spec(mix), version_spec(), prop::bool::weighted(0.4)).prop_map(|(path, version, recursive)| DeleteSpec { path, version, recursive })
}

#[derive(Clone, Debug)]
struct PutSpec {
    path: PathSpec,
    data: Vec<u8>,
    keep_data: bool,
    return_previous: bool,
}

fn put_spec(mix: Mix, big: u32) -> impl Strategy<Value = PutSpec> {
    (path_spec(mix), data(big), prop::bool::weighted(0.15), any::<bool>()).prop_map(|(path, data, keep_data, return_previous)| PutSpec {
        path,
        data,
        keep_data,
        return_previous,
    })
}

/// A range's bounds: empty (the subtree's own) or byte strings around and between the
/// random paths, some outside any subtree.
fn bound() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => Just(Vec::new()),
        4 => prop::sample::select(vec!["/", "/a", "/a/a", "/a/b", "/a/b/c", "/a0", "/a!", "/b", "/b/", "/b/c", "/c", "/c/c/c", "/c0", "0", "/a/c0"])
            .prop_map(|bound: &str| bound.as_bytes().to_vec()),
    ]
}

#[derive(Clone, Debug)]
struct RangeSpec {
    path: PathSpec,
    from: Vec<u8>,
    to: Vec<u8>,
    limit: u32,
    keys_only: bool,
    count_only: bool,
}

fn range_spec() -> impl Strategy<Value = RangeSpec> {
    let path = prop_oneof![2 => Just(PathSpec::Rand("/".into())), 3 => path_spec(TXN_ADDRESS)];
    let limit = prop_oneof![2 => Just(0u32), 4 => 1..=3u32, 1 => Just(10_001u32)];
    (path, bound(), bound(), limit, prop::bool::weighted(0.2), prop::bool::weighted(0.1))
        .prop_map(|(path, from, to, limit, keys_only, count_only)| RangeSpec { path, from, to, limit, keys_only, count_only })
}

#[derive(Clone, Debug)]
struct DeleteRangeSpec {
    path: PathSpec,
    from: Vec<u8>,
    to: Vec<u8>,
    return_previous: bool,
}

fn delete_range_spec() -> impl Strategy<Value = DeleteRangeSpec> {
    let path = prop_oneof![1 => Just(PathSpec::Rand("/".into())), 3 => path_spec(TXN_ADDRESS)];
    (path, bound(), bound(), any::<bool>()).prop_map(|(path, from, to, return_previous)| DeleteRangeSpec { path, from, to, return_previous })
}

#[derive(Clone, Debug)]
enum TxnOpSpec {
    Create(CreateSpec),
    Set(SetSpec),
    Delete(DeleteSpec),
    Get(PathSpec),
    Put(PutSpec),
    Range(RangeSpec),
    DeleteRange(DeleteRangeSpec),
    /// An operation without a body.
    Empty,
}

fn txn_op_spec() -> impl Strategy<Value = TxnOpSpec> {
    prop_oneof![
        40 => create_spec(TXN_CREATE, 0).prop_map(TxnOpSpec::Create),
        24 => set_spec(TXN_ADDRESS, 0).prop_map(TxnOpSpec::Set),
        20 => delete_spec(TXN_ADDRESS).prop_map(TxnOpSpec::Delete),
        16 => path_spec(TXN_ADDRESS).prop_map(TxnOpSpec::Get),
        24 => put_spec(TXN_CREATE, 0).prop_map(TxnOpSpec::Put),
        8 => range_spec().prop_map(TxnOpSpec::Range),
        6 => delete_range_spec().prop_map(TxnOpSpec::DeleteRange),
        // Now and then an invalid kind, oversized data or an empty operation.
        1 => create_spec(TXN_CREATE, 20).prop_map(TxnOpSpec::Create),
        1 => set_spec(TXN_ADDRESS, 20).prop_map(TxnOpSpec::Set),
        1 => Just(TxnOpSpec::Empty),
    ]
}

#[derive(Clone, Debug)]
enum NumberSpec {
    /// The compared field's current value.
    Actual,
    /// Current value - 1 / + 1.
    Below,
    Above,
    Literal(u64),
}

#[derive(Clone, Debug)]
struct CompareSpec {
    path: PathSpec,
    target: i32,
    op: i32,
    number: NumberSpec,
    /// `None`: the node's current data.
    value: Option<Vec<u8>>,
    exists: bool,
}

fn compare_spec() -> impl Strategy<Value = CompareSpec> {
    let target = prop_oneof![
        3 => Just(Target::Version as i32),
        3 => Just(Target::CreateRevision as i32),
        2 => Just(Target::ModRevision as i32),
        2 => Just(Target::Value as i32),
        2 => Just(Target::Exists as i32),
        2 => Just(Target::Writes as i32),
        1 => Just(Target::Owner as i32),
    ];
    let op = prop_oneof![
        6 => Just(CmpOp::Equal as i32),
        2 => Just(CmpOp::NotEqual as i32),
        1 => Just(CmpOp::Less as i32),
        1 => Just(CmpOp::Greater as i32),
    ];
    let number = prop_oneof![
        4 => Just(NumberSpec::Actual),
        1 => Just(NumberSpec::Below),
        1 => Just(NumberSpec::Above),
        3 => (0..=2u64).prop_map(NumberSpec::Literal),
    ];
    let value = prop_oneof![2 => Just(None), 1 => data(0).prop_map(Some)];
    (path_spec(TXN_ADDRESS), target, op, number, value, any::<bool>()).prop_map(|(path, target, op, number, value, exists)| CompareSpec {
        path,
        target,
        op,
        number,
        value,
        exists,
    })
}

#[derive(Clone, Debug)]
struct TxnSpec {
    compares: Vec<CompareSpec>,
    then: Vec<TxnOpSpec>,
    otherwise: Vec<TxnOpSpec>,
}

fn txn_spec() -> impl Strategy<Value = TxnSpec> {
    // Up to 6 operations in all (the small limit) and now and then more.
    let otherwise = prop_oneof![12 => vec(txn_op_spec(), 0..=2), 1 => vec(txn_op_spec(), 3..=4)];
    (vec(compare_spec(), 0..=3), vec(txn_op_spec(), 0..=4), otherwise).prop_map(|(compares, then, otherwise)| TxnSpec { compares, then, otherwise })
}

/// Builds part of a subtree and tears it down in one transaction: creates under `base`
/// (pending in the transaction, beside children already stored), maybe deletes one child,
/// then deletes `base` (or its parent) recursively, so the recursive delete pages through
/// stored and pending children at once.
fn subtree_txn() -> impl Strategy<Value = TxnSpec> {
    let name = || prop_oneof![Just("a"), Just("b"), Just("c")];
    let child_kind = prop_oneof![Just(NodeKind::Persistent as i32), Just(NodeKind::Container as i32)];
    (vec(name(), 1..=2), vec((name(), child_kind, any::<bool>()), 1..=3), prop::option::of(name()), any::<bool>(), prop::option::of(compare_spec()))
        .prop_map(|(base, children, drop_one, from_parent, compare)| {
            let base = format!("/{}", base.join("/"));
            let mut then: Vec<TxnOpSpec> = children
                .into_iter()
                .map(|(name, kind, sequential)| {
                    TxnOpSpec::Create(CreateSpec {
                        path: PathSpec::Rand(format!("{base}/{name}")),
                        data: Vec::new(),
                        kind: (kind, 0),
                        sequential,
                        create_parents: true,
                    })
                })
                .collect();
            if let Some(name) = drop_one {
                let path = PathSpec::Rand(format!("{base}/{name}"));
                then.push(TxnOpSpec::Delete(DeleteSpec { path, version: VersionSpec::None, recursive: false }));
            }
            let doomed = if from_parent { parent_of(&base).filter(|p| *p != "/").unwrap_or(&base).to_string() } else { base };
            then.push(TxnOpSpec::Delete(DeleteSpec { path: PathSpec::Rand(doomed), version: VersionSpec::None, recursive: true }));
            TxnSpec { compares: compare.into_iter().collect(), then, otherwise: Vec::new() }
        })
}

#[derive(Clone, Debug)]
enum RawSpec {
    /// Arbitrary bytes.
    Garbage(Vec<u8>),
    /// A valid transaction command cut short.
    Truncated(TxnSpec, usize),
    /// A valid transaction command with one byte XORed.
    Flipped(TxnSpec, usize, u8),
    /// A length-delimited field claiming more bytes than follow: never decodes.
    Overrun(Vec<u8>),
}

fn raw_spec() -> impl Strategy<Value = RawSpec> {
    prop_oneof![
        2 => vec(any::<u8>(), 0..24).prop_map(RawSpec::Garbage),
        1 => (txn_spec(), any::<usize>()).prop_map(|(t, at)| RawSpec::Truncated(t, at)),
        2 => (txn_spec(), any::<usize>(), 1..=255u8).prop_map(|(t, at, x)| RawSpec::Flipped(t, at, x)),
        1 => vec(any::<u8>(), 0..8).prop_map(RawSpec::Overrun),
    ]
}

#[derive(Clone, Debug)]
enum Step {
    Create(CreateSpec),
    Set(SetSpec),
    Delete(DeleteSpec),
    Get(PathSpec),
    Exists(PathSpec),
    Children { path: PathSpec, limit: u32, start_after: String, with_stats: bool },
    Txn(TxnSpec),
    Range(RangeSpec),
    Reopen,
    Raw(RawSpec),
    LeaderScan(u64),
}

fn step() -> impl Strategy<Value = Step> {
    let start_after = prop_oneof![
        4 => Just(String::new()),
        1 => prop_oneof![Just("a"), Just("b"), Just("bb"), Just("c"), Just("z"), Just("a0000000000"), Just("b0000000001")]
            .prop_map(String::from),
    ];
    let limit = prop_oneof![2 => Just(0u32), 6 => 1..=3u32, 1 => 4..=5u32, 1 => Just(10_001u32)];
    prop_oneof![
        20 => create_spec(CREATE, 1).prop_map(Step::Create),
        4 => set_spec(ADDRESS, 1).prop_map(Step::Set),
        4 => delete_spec(ADDRESS).prop_map(Step::Delete),
        2 => path_spec(ADDRESS).prop_map(Step::Get),
        1 => path_spec(ADDRESS).prop_map(Step::Exists),
        3 => (path_spec(ADDRESS), limit, start_after, any::<bool>())
            .prop_map(|(path, limit, start_after, with_stats)| Step::Children { path, limit, start_after, with_stats }),
        6 => txn_spec().prop_map(Step::Txn),
        2 => range_spec().prop_map(Step::Range),
        2 => subtree_txn().prop_map(Step::Txn),
        1 => Just(Step::Reopen),
        2 => raw_spec().prop_map(Step::Raw),
        // Multiples of 500 hit the exact expiry instant of the 1.5 s and 4 s TTLs.
        2 => prop_oneof![3 => (0..=12u64).prop_map(|k| k * 500), 1 => 0..=6_000u64].prop_map(Step::LeaderScan),
    ]
}

// ---------------------------------------------------------------------------------------------
// Running a sequence against both
// ---------------------------------------------------------------------------------------------

/// Outcome of the implementation vs the model: same value, or same code / path (/ op index).
fn same<T: PartialEq + Debug>(what: &str, got: Outcome<T>, want: Want<T>) -> Result<(), TestCaseError> {
    match (got, want) {
        (Ok(got), Ok(want)) => prop_assert_eq!(got, want, "{}", what),
        (Err(got), Err(want)) => {
            prop_assert_eq!(Code::try_from(got.code).ok(), Some(want.code), "{}: error {:?}", what, got);
            // An error quotes at most a bounded prefix of the path (DESIGN rule 8).
            let quoted = warden_proto::quote(&want.path, warden_proto::QUOTED_PATH_BYTES_MAX);
            prop_assert_eq!(&got.path, &quoted, "{}: error {:?}", what, got);
            if let Some(index) = want.op_index {
                prop_assert_eq!(got.op_index, index, "{}: error {:?}", what, got);
            }
        }
        (got, want) => prop_assert!(false, "{}: implementation {:?}, model {:?}", what, got, want),
    }
    Ok(())
}

struct Run {
    h: Harness,
    m: Model,
    now: u64,
    /// Every path the random strategy can produce, for existence checks.
    universe: Vec<String>,
}

impl Run {
    fn new(limits: Limits) -> Run {
        let h = Harness::new(limits.clone()).expect("harness");
        let now = h.now_ms;
        let mut universe = Vec::new();
        for a in ["a", "b", "c"] {
            universe.push(format!("/{a}"));
            for b in ["a", "b", "c"] {
                universe.push(format!("/{a}/{b}"));
                for c in ["a", "b", "c"] {
                    universe.push(format!("/{a}/{b}/{c}"));
                }
            }
        }
        Run { h, m: Model::new(limits), now, universe }
    }

    /// Applies `bytes` as a raw command: bytes that do not decode must be refused; bytes that
    /// decode to a modelled command must give the model's outcome.
    fn apply_raw(&mut self, bytes: &[u8]) -> Result<(), TestCaseError> {
        let decoded = Command::decode(bytes);
        if decoded.as_ref().is_ok_and(|command| command.op.as_ref().is_some_and(unmodelled)) {
            // The model has no sessions, locks, placement steps or paged work; random bytes that
            // decode to one are skipped.
            return Ok(());
        }
        let output = self.h.apply_bytes(bytes);
        match decoded {
            Err(_) => prop_assert!(output.is_err(), "undecodable {:?} applied: {:?}", bytes, output),
            Ok(command) => {
                // Bytes that happen to decode are a command like any other.
                let output = output.map_err(|e| TestCaseError::fail(format!("decodable {command:?} failed: {e}")))?;
                let result = CommandResult::decode(output.as_slice()).expect("command result");
                let got = match result.result {
                    Some(CommandOutcome::Txn(response)) => Ok(response),
                    Some(CommandOutcome::Error(error)) => Err(error),
                    Some(other) => return Err(TestCaseError::fail(format!("session result {other:?} from a non-session command"))),
                    None => return Err(TestCaseError::fail("empty command result")),
                };
                let want = self.m.command(&command);
                same(&format!("raw {command:?}"), got, want)?;
            }
        }
        Ok(())
    }

    fn create_request(&self, spec: &CreateSpec) -> CreateRequest {
        CreateRequest {
            path: spec.path.resolve(&self.m),
            data: spec.data.clone(),
            kind: spec.kind.0,
            ttl_ms: spec.kind.1,
            sequential: spec.sequential,
            create_parents: spec.create_parents,
            session_id: 0,
            routing: None,
        }
    }

    fn set_request(&self, spec: &SetSpec) -> SetRequest {
        let path = spec.path.resolve(&self.m);
        SetRequest { expected_version: spec.version.resolve(&self.m, &path), path, data: spec.data.clone(), routing: None }
    }

    fn delete_request(&self, spec: &DeleteSpec) -> DeleteRequest {
        let path = spec.path.resolve(&self.m);
        DeleteRequest { expected_version: spec.version.resolve(&self.m, &path), path, recursive: spec.recursive, routing: None }
    }

    fn txn_op(&self, spec: &TxnOpSpec) -> TxnOp {
        let op = match spec {
            TxnOpSpec::Create(c) => Some(Op::Create(self.create_request(c))),
            TxnOpSpec::Set(s) => Some(Op::Set(self.set_request(s))),
            TxnOpSpec::Delete(d) => Some(Op::Delete(self.delete_request(d))),
            TxnOpSpec::Get(p) => Some(Op::Get(GetRequest { path: p.resolve(&self.m), ..GetRequest::default() })),
            TxnOpSpec::Put(p) => Some(Op::Put(PutRequest {
                path: p.path.resolve(&self.m),
                data: p.data.clone(),
                keep_data: p.keep_data,
                return_previous: p.return_previous,
                ..PutRequest::default()
            })),
            TxnOpSpec::Range(r) => Some(Op::Range(self.range_request(r))),
            TxnOpSpec::DeleteRange(d) => Some(Op::DeleteRange(DeleteRangeRequest {
                path: d.path.resolve(&self.m),
                from: d.from.clone(),
                to: d.to.clone(),
                return_previous: d.return_previous,
                routing: None,
            })),
            TxnOpSpec::Empty => None,
        };
        TxnOp { op }
    }

    fn range_request(&self, spec: &RangeSpec) -> RangeRequest {
        RangeRequest {
            path: spec.path.resolve(&self.m),
            from: spec.from.clone(),
            to: spec.to.clone(),
            limit: spec.limit,
            keys_only: spec.keys_only,
            count_only: spec.count_only,
            ..RangeRequest::default()
        }
    }

    fn compare(&self, spec: &CompareSpec) -> Compare {
        let path = spec.path.resolve(&self.m);
        let node = self.m.nodes.get(&path);
        let stat = node.map(|n| n.stat).unwrap_or_default();
        let actual = match Target::try_from(spec.target).unwrap_or(Target::Version) {
            Target::CreateRevision => stat.create_revision,
            Target::ModRevision => stat.mod_revision,
            Target::Writes => node.map_or(0, |n| n.stat.version + 1),
            Target::Owner => 0,
            _ => stat.version,
        };
        let number = match spec.number {
            NumberSpec::Actual => actual,
            NumberSpec::Below => actual.saturating_sub(1),
            NumberSpec::Above => actual + 1,
            NumberSpec::Literal(n) => n,
        };
        let value = spec.value.clone().unwrap_or_else(|| node.map(|n| n.data.clone()).unwrap_or_default());
        Compare { path, target: spec.target, op: spec.op, number, value, exists: spec.exists, ..Compare::default() }
    }

    fn txn_request(&self, spec: &TxnSpec) -> TxnRequest {
        TxnRequest {
            compares: spec.compares.iter().map(|c| self.compare(c)).collect(),
            then: spec.then.iter().map(|o| self.txn_op(o)).collect(),
            r#else: spec.otherwise.iter().map(|o| self.txn_op(o)).collect(),
            raise_to: 0,
            routing: None,
        }
    }

    fn raw_bytes(&self, spec: &RawSpec) -> Vec<u8> {
        let command =
            |t: &TxnSpec| Command { now_ms: self.now, principal: String::new(), op: Some(CommandOp::Txn(self.txn_request(t))) }.encode_to_vec();
        match spec {
            RawSpec::Garbage(bytes) => bytes.clone(),
            RawSpec::Truncated(t, at) => {
                let mut bytes = command(t);
                bytes.truncate(at % (bytes.len() + 1));
                bytes
            }
            RawSpec::Flipped(t, at, x) => {
                let mut bytes = command(t);
                let len = bytes.len();
                bytes[at % len] ^= x;
                bytes
            }
            RawSpec::Overrun(rest) => {
                let mut bytes = vec![0x12, rest.len() as u8 + 1];
                bytes.extend_from_slice(rest);
                bytes
            }
        }
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        self.now += 1_000;
        self.h.now_ms = self.now;
        let revision_before = self.h.revision().expect("revision");
        let model_before = self.m.revision;
        prop_assert_eq!(revision_before, model_before);
        let now = self.now;
        match step {
            Step::Create(spec) => {
                let request = self.create_request(spec);
                let want = self.m.one(Op::Create(request.clone()), now).map(|r| match r {
                    OpResult::Create(r) => r,
                    other => panic!("model returned {other:?}"),
                });
                same(&format!("{request:?}"), self.h.create(request.clone()), want)?;
            }
            Step::Set(spec) => {
                let request = self.set_request(spec);
                let want = self.m.one(Op::Set(request.clone()), now).map(|r| match r {
                    OpResult::Set(r) => r,
                    other => panic!("model returned {other:?}"),
                });
                let got = self.h.set(&request.path, &request.data, request.expected_version);
                same(&format!("{request:?}"), got, want)?;
            }
            Step::Delete(spec) => {
                let request = self.delete_request(spec);
                let want = self.m.one(Op::Delete(request.clone()), now).map(|r| match r {
                    OpResult::Delete(r) => r,
                    other => panic!("model returned {other:?}"),
                });
                let got = self.h.delete(&request.path, request.expected_version, request.recursive);
                same(&format!("{request:?}"), got, want)?;
            }
            Step::Get(path) => {
                let path = path.resolve(&self.m);
                same(&format!("get {path:?}"), self.h.get(&path), self.m.get(&path))?;
            }
            Step::Exists(path) => {
                let path = path.resolve(&self.m);
                same(&format!("exists {path:?}"), self.h.exists(&path), self.m.exists(&path))?;
            }
            Step::Children { path, limit, start_after, with_stats } => {
                let path = path.resolve(&self.m);
                self.check_pages(&path, *limit, start_after, *with_stats)?;
            }
            Step::Txn(spec) => {
                let request = self.txn_request(spec);
                let want = self.m.txn(&request, now);
                same(&format!("{request:?}"), self.h.txn(request.clone()), want)?;
            }
            Step::Range(spec) => {
                let request = self.range_request(spec);
                same(&format!("{request:?}"), self.h.range(request.clone()), self.m.range(&request))?;
            }
            Step::Reopen => self.h.reopen().expect("reopen"),
            Step::Raw(spec) => {
                let bytes = self.raw_bytes(spec);
                self.apply_raw(&bytes)?;
            }
            Step::LeaderScan(ahead) => {
                let at = now + ahead;
                let got = self.h.leader_scan(at).expect("leader scan");
                prop_assert_eq!(got, self.m.leader_scan(at), "leader scan at {}", at);
            }
        }
        let revision_after = self.h.revision().expect("revision");
        prop_assert!(revision_after >= revision_before, "revision went backwards");
        prop_assert_eq!(revision_after - revision_before, self.m.revision - model_before, "revision delta of {:?}", step);
        self.check_all()
    }

    /// Pages through `path`'s children from `start_after`, each page against the model; the
    /// pages together must be the model's sorted children after `start_after`.
    fn check_pages(&self, path: &str, limit: u32, start_after: &str, with_stats: bool) -> Result<(), TestCaseError> {
        let mut request = GetChildrenRequest { path: path.into(), limit, start_after: start_after.into(), with_stats, ..Default::default() };
        let mut listed = Vec::new();
        for _ in 0..1_000 {
            let want = self.m.children(&request);
            let got = self.h.children(request.clone());
            let page = got.as_ref().ok().cloned();
            same(&format!("{request:?}"), got, want)?;
            let Some(page) = page else { return Ok(()) };
            listed.extend(page.names.iter().cloned());
            match page.names.last() {
                Some(last) if page.more => request.start_after = last.clone(),
                _ => {
                    let expected: Vec<String> = children_of(&self.m.nodes, path).into_iter().filter(|n| n.as_str() > start_after).collect();
                    prop_assert_eq!(listed, expected, "pages of {} after {:?}", path, start_after);
                    return Ok(());
                }
            }
        }
        Err(TestCaseError::fail(format!("paging {path} does not end")))
    }

    /// The whole tree equals the model's.
    fn check_all(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.h.revision().expect("revision"), self.m.revision);
        for (path, node) in &self.m.nodes {
            let want = GetResponse { header: None, data: node.data.clone(), stat: Some(node.stat) };
            same(&format!("state of {path}"), self.h.get(path), Ok(want))?;
            prop_assert_eq!(node.stat.num_children as usize, children_of(&self.m.nodes, path).len(), "model num_children of {}", path);
            self.check_pages(path, 0, "", false)?;
        }
        for path in &self.universe {
            same(&format!("exists {path}"), self.h.exists(path), self.m.exists(path))?;
        }
        let everything = RangeRequest { path: "/".into(), ..RangeRequest::default() };
        same("range of everything", self.h.range(everything.clone()), self.m.range(&everything))?;
        // What the metrics say the replica holds: every node but the root.
        prop_assert_eq!(self.h.held().nodes, self.m.nodes.len() as u64 - 1, "nodes counted for warden_namespace_held");
        Ok(())
    }
}

fn run(limits: Limits, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut run = Run::new(limits);
    run.check_all()?;
    for (index, step) in steps.iter().enumerate() {
        run.step(step).map_err(|e| TestCaseError::fail(format!("step {index} {step:?}: {e}")))?;
    }
    // Whatever happened, a restart keeps it all.
    run.h.reopen().expect("reopen");
    run.check_all()
}

/// Commands the model leaves to their own tests: all but transactions and TTL expiries
/// (sessions, locks, placement steps, paged purges and quota counts).
fn unmodelled(op: &CommandOp) -> bool {
    match op {
        // The model has no sessions: a transaction that could create an ephemeral node is skipped
        // (one that asks for an ephemeral container or TTL node is refused before any session is
        // looked at, and the model refuses it too).
        CommandOp::Txn(txn) => txn
            .then
            .iter()
            .chain(&txn.r#else)
            .any(|op| matches!(&op.op, Some(Op::Create(c)) if c.session_id != 0 && c.kind == NodeKind::Persistent as i32)),
        CommandOp::ExpireTtl(_) => false,
        _ => true,
    }
}

/// Small bounds, so paging, recursive-delete, transaction-size and value limits are hit.
fn small_limits() -> Limits {
    Limits {
        value_bytes_max: 4,
        txn_ops_max: 6,
        children_page_max: 2,
        recursive_delete_nodes_max: 4,
        ttl_ms_max: 10_000,
        ttl_expiries_per_scan_max: 2,
        ..Limits::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 4_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random sequences against the model under small limits.
    #[test]
    fn namespace_matches_model_small_limits(steps in vec(step(), 1..100)) {
        run(small_limits(), &steps)?;
    }

    /// The same with the default limits (10,000-name pages and recursive deletes, 1 MiB
    /// values): the bounds are rarely hit, everything else is checked the same way.
    #[test]
    fn namespace_matches_model_default_limits(steps in vec(step(), 1..100)) {
        run(Limits::default(), &steps)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Divergences the model found (now fixed), kept as plain regression tests
// ---------------------------------------------------------------------------------------------

/// `/` always exists, also for `Compare{EXISTS}` on a namespace that never wrote the root's
/// record (the compare once read only the stored record).
#[test]
fn root_exists_compare_on_fresh_namespace() {
    let mut h = Harness::new(Limits::default()).expect("harness");
    assert!(h.exists("/").expect("exists").is_some(), "Exists says / exists");
    let compare = Compare { path: "/".into(), target: Target::Exists as i32, exists: true, ..Compare::default() };
    let response = h.txn(TxnRequest { compares: vec![compare], ..TxnRequest::default() }).expect("txn");
    assert!(response.succeeded, "the compare `/ exists` must hold");
}

/// Found by the model in CI: TTL nodes `/a/a/a` and `/a/a/a/a`, both past their TTL. A scan
/// expires the child; the parent, due but not childless then, is due at the next scan — also
/// when that scan's wall clock reads earlier than the last one's (a clock stepped back). The
/// leader once remembered "look again at the last scan's time" and skipped every scan until
/// the clock passed it again.
#[test]
fn ttl_parent_expiry_after_its_ttl_child_is_scanned() {
    let ttl = |path: PathSpec, create_parents: bool| {
        Step::Create(CreateSpec { path, data: Vec::new(), kind: (NodeKind::Ttl as i32, 1_500), sequential: false, create_parents })
    };
    let steps = vec![
        ttl(PathSpec::Rand("/a/a/a".into()), true),
        ttl(PathSpec::ChildOf(27, "a".into()), false),
        Step::LeaderScan(3_000),
        Step::Create(CreateSpec { path: PathSpec::Rand("/a".into()), data: Vec::new(), kind: (0, 0), sequential: false, create_parents: false }),
        Step::LeaderScan(0),
    ];
    if let Err(error) = run(Limits::default(), &steps) {
        panic!("{error}");
    }
}

/// Found by the model in CI: bytes that decode as a transaction creating an ephemeral
/// container (a flipped byte can turn `create_parents` into `session_id`). Apply refuses an
/// ephemeral container or TTL node INVALID_ARGUMENT before it looks for the session; the
/// model once accepted it.
#[test]
fn an_ephemeral_container_in_raw_bytes_is_refused_as_apply_refuses_it() {
    let create = CreateRequest { path: "/a".into(), kind: NodeKind::Container as i32, session_id: 1, ..CreateRequest::default() };
    let txn = TxnRequest { then: vec![TxnOp { op: Some(Op::Create(create)) }], ..TxnRequest::default() };
    let mut run = Run::new(Limits::default());
    let command = Command { now_ms: run.now, principal: String::new(), op: Some(CommandOp::Txn(txn)) };
    let op = command.op.as_ref().expect("op");
    assert!(!unmodelled(op), "an ephemeral container is refused before sessions matter, so the model judges it");
    assert!(run.m.command(&command).is_err(), "the model refuses an ephemeral container");
    if let Err(error) = run.apply_raw(&command.encode_to_vec()) {
        panic!("{error}");
    }
    assert!(run.h.exists("/a").expect("exists").is_none(), "nothing was created");
}
