//! Moving a subtree to a new group (issue 16; ARCHITECTURE.md "Moving a subtree"): the
//! source group's side — freeze, export, hand-over, abort — and the target's — ingest.
//!
//! The source's log decides the outcome: a `HandSubtree` and an `AbortSplit` for the same
//! target exclude each other (`SplitState`), so a split that a crashed placement leader left
//! half-way finishes or rolls back, never both. While a subtree is frozen nothing in it
//! changes (writes are refused UNAVAILABLE, which routers and clients retry; what the leader
//! would propose on its own clock waits), so an export read at any time after the freeze is
//! the subtree at the freeze's revision R.

use prost::Message as _;
use warden_placement::{is_at_or_below, is_strictly_below};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::{
    AbortSplit, ExportSubtree, FreezeSubtree, HandSubtree, IngestSubtree, LockMeta, NodeRecord, SessionRecord, SplitState, SubtreePage, SubtreeRecord,
};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{GroupDescriptor, NodeKind, WardenError};

use super::descriptor;
use super::error::{error, invalid, Failure};
use super::path;
use super::sessions;
use super::store::{self, parse_subtree_key, SubtreeKey, TxnView};
use super::txn::{SessionChange, TtlChange, Txn};
use crate::error::StorageError;
use crate::state_machine::SmReader;

/// Largest export page (a page is one raft entry at the target, within its command limit;
/// a single record larger than this — a node of the largest value — still makes a page).
pub const EXPORT_PAGE_BYTES_MAX: u32 = 1 << 20;
/// Records one ingested page may carry.
pub const INGEST_RECORDS_MAX: usize = 100_000;

/// The subtree frozen now, if any.
pub fn frozen(state: &SplitState) -> Option<&str> {
    (state.frozen_for != 0).then_some(state.frozen_prefix.as_str())
}

fn moving(prefix: &str, state: &SplitState) -> WardenError {
    error(Code::Unavailable, prefix, format!("{prefix} is moving to group {}: retry", state.frozen_for))
}

/// Refuses (UNAVAILABLE, retried by routers and clients) a command that would change the
/// frozen subtree. Session and remote-session ends are not refused here: the ones touching
/// the subtree are deferred instead ([`deferred`]).
pub fn check_frozen(state: &SplitState, view: &TxnView<'_>, op: Option<&CommandOp>) -> Result<(), Failure> {
    use warden_proto::v1::txn_op::Op;
    let Some(prefix) = frozen(state) else { return Ok(()) };
    let inside = |path: &str| is_at_or_below(path, prefix);
    let refuse = |path: &str| -> Result<(), Failure> {
        if inside(path) {
            Err(moving(path, state).into())
        } else {
            Ok(())
        }
    };
    match op {
        Some(CommandOp::Txn(request)) => {
            for op in request.then.iter().chain(&request.r#else) {
                match &op.op {
                    Some(Op::Create(create)) => refuse(&create.path)?,
                    Some(Op::Set(set)) => refuse(&set.path)?,
                    // A recursive delete above the subtree would delete into it.
                    Some(Op::Delete(delete)) if inside(&delete.path) || is_strictly_below(prefix, &delete.path) => {
                        return Err(moving(&delete.path, state).into())
                    }
                    Some(Op::Delete(_) | Op::Get(_)) | None => {}
                }
            }
        }
        Some(CommandOp::AcquireLock(acquire)) => refuse(&acquire.path)?,
        Some(CommandOp::ReleaseLock(release)) => refuse(release.sequencer.as_ref().map_or("", |s| s.path.as_str()))?,
        Some(CommandOp::ExpireTtl(expire)) => refuse(&expire.path)?,
        Some(CommandOp::LockDelayEnded(ended)) => refuse(&ended.path)?,
        Some(CommandOp::CloseSession(close)) if view.has_ephemeral_at_or_below(close.session_id, prefix)? => return Err(moving(prefix, state).into()),
        _ => {}
    }
    Ok(())
}

/// The sessions of `ids` whose end may apply now: those owning an ephemeral node in the
/// frozen subtree wait (the leader proposes their end again later), so the subtree stays as
/// exported. A session's end is only ever delayed by this, never lost.
pub fn deferred(state: &SplitState, view: &TxnView<'_>, ids: &[u64]) -> Result<Vec<u64>, StorageError> {
    let Some(prefix) = frozen(state) else { return Ok(ids.to_vec()) };
    let mut now = Vec::with_capacity(ids.len());
    for id in ids {
        if !view.has_ephemeral_at_or_below(*id, prefix)? {
            now.push(*id);
        }
    }
    Ok(now)
}

/// A page of the export of the subtree frozen for `request.target_group`: its records in key
/// order after `request.after_key`, within `bytes_max` (but at least one record).
pub fn export(reader: &SmReader, state: &SplitState, request: &ExportSubtree) -> Result<SubtreePage, Failure> {
    if frozen(state) != Some(request.prefix.as_str()) || state.frozen_for != request.target_group {
        let message = format!("{} is not frozen for group {}", request.prefix, request.target_group);
        return Err(error(Code::InvalidArgument, &request.prefix, message).into());
    }
    let bytes_max = request.bytes_max.clamp(1, EXPORT_PAGE_BYTES_MAX) as usize;
    let mut records = Vec::new();
    let mut bytes = 0usize;
    let mut full = false;
    for (from, to) in store::subtree_ranges(&request.prefix) {
        if full || to.as_slice() <= request.after_key.as_slice() {
            continue;
        }
        let mut start = from.clone();
        if request.after_key.as_slice() >= from.as_slice() {
            start = request.after_key.clone();
            start.push(0);
        }
        reader.scan_range(&start, Some(&to), |key, value| {
            let size = key.len() + value.len();
            if !records.is_empty() && bytes + size > bytes_max {
                full = true;
                return false;
            }
            bytes += size;
            records.push(SubtreeRecord { key: key.to_vec(), value: value.to_vec() });
            true
        })?;
    }
    let next_after_key = if full { records.last().map(|r| r.key.clone()).unwrap_or_default() } else { Vec::new() };
    Ok(SubtreePage { records, next_after_key })
}

impl Txn<'_, '_> {
    /// Source: freezes `freeze.prefix` for `freeze.target_group` (see `namespace.proto`).
    /// Answers the new split state.
    pub fn freeze_subtree(&mut self, descriptor: Option<&GroupDescriptor>, freeze: &FreezeSubtree) -> Result<SplitState, Failure> {
        let mut state = self.view.split()?;
        let target = freeze.target_group;
        if target == 0 {
            return Err(invalid(&freeze.prefix, "a split names its target group").into());
        }
        if target <= state.settled_through {
            return Err(settled(&freeze.prefix, &state, target).into());
        }
        if state.frozen_for == target && state.frozen_prefix == freeze.prefix {
            return Ok(state);
        }
        if state.frozen_for != 0 {
            let message = format!("{} is moving to group {}: one split at a time", state.frozen_prefix, state.frozen_for);
            return Err(error(Code::Unavailable, &freeze.prefix, message).into());
        }
        path::validate(&freeze.prefix, false).map_err(|e| super::error::invalid_path(&freeze.prefix, &e))?;
        descriptor::check_served(descriptor, &freeze.prefix)?;
        if !is_strictly_below(&freeze.prefix, descriptor::root(descriptor)) {
            return Err(invalid(&freeze.prefix, "a split moves a subtree below the group's prefix").into());
        }
        state.frozen_prefix = freeze.prefix.clone();
        state.frozen_for = target;
        self.view.put_split(&state);
        Ok(state)
    }

    /// Source: the split to `abort.target_group` will not happen (see `namespace.proto`).
    pub fn abort_split(&mut self, abort: &AbortSplit) -> Result<SplitState, Failure> {
        let mut state = self.view.split()?;
        let target = abort.target_group;
        if target != 0 && state.handed_to == target {
            return Err(settled("", &state, target).into());
        }
        if state.frozen_for == target {
            state.frozen_for = 0;
            state.frozen_prefix.clear();
        }
        state.settled_through = state.settled_through.max(target);
        self.view.put_split(&state);
        Ok(state)
    }

    /// Source: the frozen subtree leaves the group, which serves `hand.descriptor` from now
    /// on (see `namespace.proto`). Answers the new split state and descriptor. Idempotent: a
    /// hand-over already done answers as it did.
    pub fn hand_subtree(
        &mut self,
        group: u64,
        current: Option<&GroupDescriptor>,
        hand: HandSubtree,
    ) -> Result<(SplitState, Option<GroupDescriptor>), Failure> {
        let mut state = self.view.split()?;
        let target = hand.target_group;
        if target != 0 && state.handed_to == target {
            return Ok((state, None));
        }
        let Some(prefix) = frozen(&state).filter(|_| state.frozen_for == target).map(str::to_string) else {
            return Err(settled("", &state, target).into());
        };
        let new = hand.descriptor.ok_or_else(|| invalid(&prefix, "a hand-over names the descriptor served after it"))?;
        if descriptor::serves(Some(&new), &prefix) {
            return Err(invalid(&prefix, "the descriptor after a hand-over must not serve the moved subtree").into());
        }
        self.remove_subtree(&prefix)?;
        let new = self.set_descriptor(group, current, Some(new))?;
        state.frozen_for = 0;
        state.frozen_prefix.clear();
        state.settled_through = state.settled_through.max(target);
        state.handed_to = target;
        self.view.put_split(&state);
        Ok((state, Some(new)))
    }

    /// Deletes every record of the subtree at `prefix` (moved, not deleted: no watch event
    /// comes of it), detaches its root from its parent, and lets go of its ephemerals'
    /// sessions here. Waiting lock calls on its waiters wake and find the path served
    /// elsewhere.
    fn remove_subtree(&mut self, prefix: &str) -> Result<(), Failure> {
        for (from, to) in store::subtree_ranges(prefix) {
            for (key, value) in self.view.base_range(&from, &to)? {
                match parse_subtree_key(&key) {
                    Some(SubtreeKey::Node(node_path)) => {
                        let record = store::decode_record(&value)?;
                        let stat = record.stat.unwrap_or_default();
                        if stat.ephemeral_owner != 0 {
                            // The session itself stays: it may own nodes elsewhere in the group.
                            self.detach_ephemeral(stat.ephemeral_owner, node_path)?;
                        }
                        if stat.kind == NodeKind::Ttl as i32 {
                            self.ttl_changes.push(TtlChange::Remove(node_path.to_string()));
                        }
                        if record.lock_waiter.is_some() {
                            self.gone_waiters.push(node_path.to_string());
                        }
                    }
                    Some(SubtreeKey::Lock(lock_path)) => self.lock_changes.push((lock_path.to_string(), 0)),
                    Some(SubtreeKey::Child(..)) | None => {}
                }
                self.view.delete_raw(&key);
            }
        }
        let Some(parent_path) = path::parent(prefix) else { return Ok(()) };
        self.view.remove_child(parent_path, path::name(prefix));
        if let Some(mut parent) = self.view.node(parent_path)? {
            let mut stat = parent.stat.unwrap_or_default();
            stat.num_children = stat.num_children.saturating_sub(1);
            parent.stat = Some(stat);
            self.view.put_node(parent_path, &parent);
        }
        Ok(())
    }

    /// Target: writes a page of the source's export (see `namespace.proto`). Refused once the
    /// group serves a descriptor: from then on it owns the subtree, and a late page would
    /// overwrite newer writes.
    pub fn ingest_subtree(&mut self, group: u64, current: Option<&GroupDescriptor>, ingest: &IngestSubtree) -> Result<(), Failure> {
        if current.is_some() {
            return Err(invalid(&ingest.prefix, "the group serves its descriptor already: the subtree was ingested").into());
        }
        path::validate(&ingest.prefix, false).map_err(|e| super::error::invalid_path(&ingest.prefix, &e))?;
        for record in &ingest.records {
            self.ingest_record(group, &ingest.prefix, record)?;
        }
        Ok(())
    }

    fn ingest_record(&mut self, group: u64, prefix: &str, record: &SubtreeRecord) -> Result<(), Failure> {
        let refuse = |why: &str| -> Failure { invalid(prefix, format!("an exported record {why}")).into() };
        let inside = |path: &str| is_at_or_below(path, prefix);
        match parse_subtree_key(&record.key) {
            Some(SubtreeKey::Node(node_path)) if inside(node_path) => {
                let node = NodeRecord::decode(record.value.as_slice()).map_err(|_| refuse("is not a node record"))?;
                let stat = node.stat.unwrap_or_default();
                let owner = stat.ephemeral_owner;
                if owner != 0 {
                    let home = sessions::home_group(owner);
                    if home == group || home == 0 {
                        return Err(refuse("names a session that cannot be homed elsewhere"));
                    }
                    self.attach_moved_ephemeral(owner, node_path)?;
                }
                if stat.kind == NodeKind::Ttl as i32 {
                    self.ttl_changes.push(TtlChange::Upsert(node_path.to_string(), stat));
                }
            }
            Some(SubtreeKey::Lock(lock_path)) if inside(lock_path) => {
                let meta = LockMeta::decode(record.value.as_slice()).map_err(|_| refuse("is not lock metadata"))?;
                self.lock_changes.push((lock_path.to_string(), meta.blocked_until_ms));
            }
            Some(SubtreeKey::Child(parent, name)) if inside(parent) && !name.is_empty() && record.value.is_empty() => {}
            _ => return Err(refuse("is outside the subtree")),
        }
        self.view.put_raw(&record.key, &record.value);
        Ok(())
    }

    /// A moved ephemeral node of `session` (homed in another group): the session is recorded
    /// here as remote, under its home group's authority (DESIGN.md rule 7). Counted once
    /// however often the page is ingested.
    fn attach_moved_ephemeral(&mut self, session: u64, path: &str) -> Result<(), Failure> {
        if self.view.node(path)?.is_some_and(|node| node.stat.is_some_and(|s| s.ephemeral_owner == session)) {
            return Ok(());
        }
        let mut record = match self.view.session(session)? {
            Some(record) => record,
            None => {
                self.session_changes.push(SessionChange::RemoteAdded(session));
                SessionRecord { session_id: session, ttl_ms: 0, ephemerals: 0, remote: true }
            }
        };
        record.ephemerals += 1;
        self.view.put_session(&record);
        self.view.add_ephemeral(session, path);
        Ok(())
    }
}

/// The refusal of a step for a split already settled: NODE_EXISTS if it was handed over
/// (the split must finish), INVALID_ARGUMENT if it was aborted (it must roll back).
fn settled(prefix: &str, state: &SplitState, target: u64) -> WardenError {
    if state.handed_to == target {
        error(Code::NodeExists, prefix, format!("the subtree was handed over to group {target} already"))
    } else {
        error(Code::InvalidArgument, prefix, format!("the split to group {target} was aborted or never began"))
    }
}
