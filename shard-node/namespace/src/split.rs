//! Moving a subtree between groups (docs/design/subtree-moves.md): a split
//! gives a subtree to a new group, a merge gives a group's whole subtree to the group of its
//! parent path. The source group's side — freeze, export, hand-over, abort — and the
//! target's — ingest, settle (on the descriptor serving the prefix), discard (on abort).
//!
//! The source's log decides the outcome: a `HandSubtree` and an `AbortSplit` for the same
//! target exclude each other (`SplitState`), so a split that a crashed placement leader left
//! half-way finishes or rolls back, never both. While a subtree is frozen nothing in it
//! changes (writes are refused UNAVAILABLE, which routers and clients retry; what the leader
//! would propose on its own clock waits), so an export read at any time after the freeze is
//! the subtree at the freeze's revision R.

use std::collections::BTreeMap;

use prost::Message as _;
use warden_placement::{is_at_or_below, is_strictly_below};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::{
    AbortSplit, ExportSubtree, FreezeSubtree, HandSubtree, IngestSubtree, LockMeta, NodeRecord, PurgeSubtree, SessionOwner, SessionRecord,
    SplitState, SubtreePage, SubtreeRecord,
};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{GroupDescriptor, NodeKind, WardenError};

use super::apply::{done, Effects};
use super::descriptor;
use super::error::{error, invalid, Failure};
use super::path;
use super::sessions;
use super::store::{self, parse_subtree_key, SubtreeKey, TxnView};
use super::txn::{SessionChange, TtlChange, Txn};
use super::watch::hub::{Direction, Transfer};
use super::NamespaceStateMachine;
use warden_engine::error::StorageError;
use warden_engine::state_machine::SmReader;
use warden_proto::namespace::command_result::Result as CommandOutcome;

/// Largest export page (a page is one raft entry at the target, within its command limit;
/// a single record larger than this — a node of the largest value — still makes a page).
pub const EXPORT_PAGE_BYTES_MAX: u32 = 1 << 20;
/// Records one ingested page may carry.
pub const INGEST_RECORDS_MAX: usize = 100_000;
/// Records a purge page deletes at most when this binary's leader proposes it
/// (`PurgeSubtree.records_max`: the proposer's budget travels in the command, so replicas of
/// other versions delete the same page). A page of this size is a few milliseconds of apply,
/// so the other groups of the node keep being served between pages, and its writes stay a
/// small part of a batch; a million-record subtree goes in a thousand entries.
pub const PURGE_RECORDS_PER_PAGE: u32 = 1_000;
/// The most records a `PurgeSubtree` may ask for (checked before it is proposed): the
/// ingest page's bound, so a purge entry is no larger a piece of work than an ingested one.
pub const PURGE_RECORDS_PER_PAGE_MAX: u32 = INGEST_RECORDS_MAX as u32;

/// The subtree frozen now, if any.
pub fn frozen(state: &SplitState) -> Option<&str> {
    (state.frozen_for != 0).then_some(state.frozen_prefix.as_str())
}

/// The group the frozen subtree goes to: the merge's parent group, or the split's new group.
fn destination(state: &SplitState) -> u64 {
    match state.frozen_into {
        0 => state.frozen_for,
        into => into,
    }
}

/// The subtrees nothing may change in now, each with the group it is moving to (0: here):
/// the one frozen here (moving out), and the one whose pages this group is ingesting (moving
/// in, not served yet: what the leader would do on its own clock there — TTL and lock-delay
/// ends, ends of sessions owning nodes there — waits until it is served, so its events come
/// after the revision watchers resume from). The hand-over, or the descriptor serving it,
/// or the abort ends each. Also the subtrees whose records are being purged: they are gone
/// from the group's point of view, and a session's end or a timer deleting their nodes
/// meanwhile would make events and counts of paths the group no longer serves (the purge
/// detaches them, then what waited goes on).
fn held(state: &SplitState) -> impl Iterator<Item = (&str, u64)> {
    let outgoing = frozen(state).map(|prefix| (prefix, destination(state)));
    let incoming = (state.incoming_operation != 0).then_some((state.incoming_prefix.as_str(), 0));
    let restoring = (state.restoring != 0).then_some((state.restoring_prefix.as_str(), RESTORING));
    let purging = state.purging.iter().map(|prefix| (prefix.as_str(), PURGING));
    outgoing.into_iter().chain(incoming).chain(restoring).chain(purging)
}

/// The destination [`held`] gives a subtree a restore is writing (`backup.rs`).
const RESTORING: u64 = u64::MAX;
/// The destination [`held`] gives a subtree whose records are being purged.
const PURGING: u64 = u64::MAX - 1;

/// Whether `path` is in a subtree whose records are being purged (not the group's any more).
pub fn is_purging(state: &SplitState, path: &str) -> bool {
    state.purging.iter().any(|prefix| is_at_or_below(path, prefix))
}

/// Refuses (UNAVAILABLE, retried) taking a subtree at `prefix` in or out while a purge of a
/// subtree overlapping it is pending: an export would carry records that are leaving, and
/// ingested ones would be deleted by the purge.
fn check_no_purge_overlapping(state: &SplitState, prefix: &str) -> Result<(), Failure> {
    match state.purging.iter().find(|purging| is_at_or_below(prefix, purging) || is_at_or_below(purging, prefix)) {
        Some(purging) => Err(moving(prefix, purging, PURGING).into()),
        None => Ok(()),
    }
}

/// Whether `path` is in a subtree nothing may change in now (see [`held`]).
pub fn is_held(state: &SplitState, path: &str) -> bool {
    held(state).any(|(prefix, _)| is_at_or_below(path, prefix))
}

fn moving(path: &str, prefix: &str, to: u64) -> WardenError {
    let message = match to {
        0 => format!("{prefix} is moving here: retry"),
        RESTORING => format!("{prefix} is being restored from a backup: retry once the restore is done"),
        PURGING => format!("{prefix} moved away and its records are still being deleted here: retry"),
        to => format!("{prefix} is moving to group {to}: retry"),
    };
    error(Code::Unavailable, path, message)
}

/// Refuses (UNAVAILABLE, retried by routers and clients) a command that would change a
/// subtree that is moving ([`held`]). Session and remote-session ends are not refused here:
/// the ones touching it are deferred instead ([`deferred`]).
pub fn check_frozen(state: &SplitState, view: &TxnView<'_>, op: Option<&CommandOp>) -> Result<(), Failure> {
    for (prefix, to) in held(state) {
        check_held(prefix, to, view, op)?;
    }
    // A group merging away gets no new session.
    match op {
        Some(CommandOp::CreateSession(_)) if state.frozen_into != 0 => Err(moving("", &state.frozen_prefix, destination(state)).into()),
        _ => Ok(()),
    }
}

/// [`check_frozen`] for the one subtree at `prefix`, moving to group `to`.
fn check_held(prefix: &str, to: u64, view: &TxnView<'_>, op: Option<&CommandOp>) -> Result<(), Failure> {
    use warden_proto::v1::txn_op::Op;
    let inside = |path: &str| is_at_or_below(path, prefix);
    // A node above the subtree made a lock or an ephemeral could not have its root as a
    // child (`descriptor::check_childless_kind` once it has moved).
    let above = |path: &str| is_strictly_below(prefix, path);
    let refuse = |path: &str| -> Result<(), Failure> {
        if inside(path) {
            Err(moving(path, prefix, to).into())
        } else {
            Ok(())
        }
    };
    match op {
        Some(CommandOp::Txn(request)) => {
            for op in super::txn::flat_ops(request) {
                match &op.op {
                    Some(Op::Create(create)) if create.session_id != 0 && above(&create.path) => return Err(moving(&create.path, prefix, to).into()),
                    Some(Op::Create(create)) => refuse(&create.path)?,
                    Some(Op::Put(put)) if put.session_id != 0 && above(&put.path) => return Err(moving(&put.path, prefix, to).into()),
                    Some(Op::Put(put)) => refuse(&put.path)?,
                    Some(Op::Set(set)) => refuse(&set.path)?,
                    // A range deletes anywhere below its path.
                    Some(Op::DeleteRange(delete)) if inside(&delete.path) || is_strictly_below(prefix, &delete.path) => {
                        return Err(moving(&delete.path, prefix, to).into())
                    }
                    // A recursive delete above the subtree would delete into it.
                    Some(Op::Delete(delete)) if inside(&delete.path) || is_strictly_below(prefix, &delete.path) => {
                        return Err(moving(&delete.path, prefix, to).into())
                    }
                    Some(Op::Delete(_) | Op::DeleteRange(_) | Op::Get(_) | Op::Range(_) | Op::Txn(_)) | None => {}
                }
            }
        }
        Some(CommandOp::AcquireLock(acquire)) if above(&acquire.path) => return Err(moving(&acquire.path, prefix, to).into()),
        Some(CommandOp::AcquireLock(acquire)) => refuse(&acquire.path)?,
        // The waiter is what a release deletes (and its lock with it when that was the last).
        Some(CommandOp::ReleaseLock(release)) => refuse(release.sequencer.as_ref().map_or("", |s| s.waiter.as_str()))?,
        Some(CommandOp::ExpireTtl(expire)) => refuse(&expire.path)?,
        Some(CommandOp::LockDelayEnded(ended)) => refuse(&ended.path)?,
        Some(CommandOp::CloseSession(close)) if view.has_ephemeral_at_or_below(close.session_id, prefix)? => {
            return Err(moving(prefix, prefix, to).into())
        }
        _ => {}
    }
    Ok(())
}

/// The sessions of `ids` whose end may apply now: those owning an ephemeral node in a
/// moving subtree ([`held`]) wait (the leader proposes their end again later), so the
/// subtree stays as exported and its events come once it is served. A session's end is
/// only ever delayed by this, never lost.
pub fn deferred(state: &SplitState, view: &TxnView<'_>, ids: &[u64]) -> Result<Vec<u64>, StorageError> {
    let mut now = Vec::with_capacity(ids.len());
    for id in ids {
        let mut owns_moving = false;
        for (prefix, _) in held(state) {
            owns_moving |= view.has_ephemeral_at_or_below(*id, prefix)?;
        }
        if !owns_moving {
            now.push(*id);
        }
    }
    Ok(now)
}

/// Refuses (INVALID_ARGUMENT, nothing changed) moving the subtree at `prefix` out of the
/// group whose root is `root` when the move would break a lock, a session's node or a
/// sequential counter: the node at the prefix would become the other group's root, and
/// its parent's records stay here. Refused:
/// - the node at the prefix is ephemeral (a lock waiter included): its session's end would
///   delete a group's root, and a waiter moved away leaves its lock's queue here, which
///   then grants the next waiter while it still holds;
/// - it is a lock: a group's root cannot be a lock, so its holder and waiters would be
///   refused from then on;
/// - a node above it in this group is a lock or ephemeral: the prefix is inside a lock's
///   queue (a waiter, or a name a waiter may take) or below a node that has no children;
/// - no node is at the prefix and its name is one a sequential create under its parent may
///   still produce (the counter stays here with the parent, and would name a node that this
///   group no longer serves).
///
/// Checked in the apply of the freeze, so nothing can slip in between check and freeze,
/// and by the placement leader before a split begins (an export probe), for a clear error.
pub fn check_movable(view: &TxnView<'_>, root: &str, prefix: &str) -> Result<(), Failure> {
    let refuse = |why: String| -> Failure { error(Code::InvalidArgument, prefix, format!("{prefix} cannot move to another group: {why}")).into() };
    let node = view.node(prefix)?;
    if let Some(stat) = node.as_ref().and_then(|node| node.stat) {
        if stat.ephemeral_owner != 0 {
            let what = if node.as_ref().is_some_and(|node| node.lock_waiter.is_some()) { "a lock waiter" } else { "an ephemeral node" };
            return Err(refuse(format!("it is {what}")));
        }
    }
    if view.lock_meta(prefix)?.is_some() {
        return Err(refuse("it is a lock (a group's root cannot be one): move the subtree above it".into()));
    }
    let mut above = prefix;
    while let Some(parent) = path::parent(above).filter(|parent| is_at_or_below(parent, root)) {
        if view.lock_meta(parent)?.is_some() {
            return Err(refuse(format!("it is inside the queue of the lock {parent}")));
        }
        if view.node(parent)?.and_then(|node| node.stat).is_some_and(|stat| stat.ephemeral_owner != 0) {
            return Err(refuse(format!("it is below the ephemeral node {parent}")));
        }
        above = parent;
    }
    if node.is_none() {
        if let Some(sequence) = sequence_suffix(path::name(prefix)) {
            let parent = path::parent(prefix).map(|parent| view.node(parent)).transpose()?.flatten();
            if sequence >= parent.map_or(0, |parent| parent.next_sequence) {
                return Err(refuse("a sequential create under its parent may still take that name".into()));
            }
        }
    }
    Ok(())
}

/// The sequence number a sequential create would have given `name` (`NAME%010d`), if any.
fn sequence_suffix(name: &str) -> Option<u64> {
    let digits = name.len().checked_sub(10).and_then(|start| name.get(start..))?;
    if digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}

/// A page of the export of the subtree frozen for `request.target_group`: its records in key
/// order after `request.after_key`, within `bytes_max` (but at least one record). Without a
/// target group, a probe: an empty page if the subtree may move ([`check_movable`]), else
/// the refusal.
pub fn export(reader: &SmReader, descriptor: Option<&GroupDescriptor>, state: &SplitState, request: &ExportSubtree) -> Result<SubtreePage, Failure> {
    if request.target_group == 0 {
        path::validate(&request.prefix, false).map_err(|e| super::error::invalid_path(&request.prefix, &e))?;
        descriptor::check_served(descriptor, &request.prefix)?;
        check_movable(&TxnView::new(reader, None), descriptor::root(descriptor), &request.prefix)?;
        return Ok(SubtreePage::default());
    }
    if frozen(state) != Some(request.prefix.as_str()) || state.frozen_for != request.target_group {
        let message = format!("{} is not frozen for group {}", request.prefix, request.target_group);
        return Err(error(Code::InvalidArgument, &request.prefix, message).into());
    }
    let bytes_max = request.bytes_max.clamp(1, EXPORT_PAGE_BYTES_MAX) as usize;
    let view = TxnView::new(reader, None);
    let mut records = Vec::new();
    let mut sessions: Vec<SessionOwner> = Vec::new();
    let mut bytes = 0usize;
    let mut full = false;
    let mut failed = None;
    for (start, to) in store::ranges_after(store::subtree_ranges(&request.prefix), &request.after_key) {
        if full {
            break;
        }
        reader.scan_range(&start, Some(&to), |key, value| {
            // The owner of a session first seen here travels with the page (and counts in it).
            let owner = match moved_owner(&view, key, value, &sessions) {
                Ok(owner) => owner,
                Err(error) => {
                    failed = Some(error);
                    return false;
                }
            };
            let size = key.len() + value.len() + owner.as_ref().map_or(0, |o| o.owner.len() + 16);
            if !records.is_empty() && bytes + size > bytes_max {
                full = true;
                return false;
            }
            bytes += size;
            records.push(SubtreeRecord { key: key.to_vec(), value: value.to_vec() });
            sessions.extend(owner);
            true
        })?;
        if let Some(error) = failed.take() {
            return Err(error.into());
        }
    }
    let next_after_key = if full { records.last().map(|r| r.key.clone()).unwrap_or_default() } else { Vec::new() };
    Ok(SubtreePage { records, next_after_key, sessions })
}

/// The owner of the session of the exported record `key`/`value` when it is an ephemeral
/// node of a session not in `listed` yet and this group knows the owner (a session whose
/// owner is unknown here is left out: the target learns it from the home group).
fn moved_owner(view: &TxnView<'_>, key: &[u8], value: &[u8], listed: &[SessionOwner]) -> Result<Option<SessionOwner>, StorageError> {
    let Some(SubtreeKey::Node(_)) = parse_subtree_key(key) else { return Ok(None) };
    let session = store::decode_record(value)?.stat.unwrap_or_default().ephemeral_owner;
    if session == 0 || listed.iter().any(|listed| listed.session_id == session) {
        return Ok(None);
    }
    Ok(view.session(session)?.and_then(|record| match sessions::owner(&record) {
        sessions::Owner::Principal(owner) => Some(SessionOwner { session_id: session, owner: owner.to_string() }),
        sessions::Owner::Anyone => Some(SessionOwner { session_id: session, owner: String::new() }),
        sessions::Owner::Unknown => None,
    }))
}

impl Txn<'_, '_> {
    /// Source: freezes `freeze.prefix` for `freeze.target_group` (see `namespace.proto`): a
    /// subtree below the group's root for a split, the root itself for a merge (the caller
    /// refuses a merge while the group homes sessions). Answers the new split state.
    pub fn freeze_subtree(&mut self, descriptor: Option<&GroupDescriptor>, freeze: &FreezeSubtree) -> Result<SplitState, Failure> {
        let mut state = self.view.split()?;
        let target = freeze.target_group;
        if target == 0 {
            return Err(invalid(&freeze.prefix, "a split names its target group").into());
        }
        if target <= state.settled_through {
            return Err(settled(&freeze.prefix, &state, target).into());
        }
        if state.frozen_for == target && state.frozen_prefix == freeze.prefix && state.frozen_into == freeze.into_group {
            return Ok(state);
        }
        if state.frozen_for != 0 {
            let message = format!("{} is moving to group {}: one split at a time", state.frozen_prefix, state.frozen_for);
            return Err(error(Code::Unavailable, &freeze.prefix, message).into());
        }
        path::validate(&freeze.prefix, false).map_err(|e| super::error::invalid_path(&freeze.prefix, &e))?;
        descriptor::check_served(descriptor, &freeze.prefix)?;
        check_no_purge_overlapping(&state, &freeze.prefix)?;
        let root = descriptor::root(descriptor);
        match freeze.into_group {
            0 if !is_strictly_below(&freeze.prefix, root) => {
                return Err(invalid(&freeze.prefix, "a split moves a subtree below the group's prefix").into());
            }
            into if into != 0 && (freeze.prefix != root || root == "/") => {
                return Err(invalid(&freeze.prefix, "a merge moves the whole subtree of a group below the root").into());
            }
            _ => {}
        }
        check_movable(self.view, root, &freeze.prefix)?;
        state.frozen_prefix = freeze.prefix.clone();
        state.frozen_for = target;
        state.frozen_into = freeze.into_group;
        self.view.put_split(&state);
        Ok(state)
    }

    /// The operation `abort.target_group` will not happen (see `namespace.proto`): as its
    /// source the group ends the freeze; as its target it discards the pages it ingested.
    pub fn abort_split(&mut self, abort: &AbortSplit) -> Result<SplitState, Failure> {
        let mut state = self.view.split()?;
        let target = abort.target_group;
        if target != 0 && state.handed_to == target {
            return Err(settled("", &state, target).into());
        }
        if state.frozen_for == target {
            state.frozen_for = 0;
            state.frozen_into = 0;
            state.frozen_prefix.clear();
        }
        // An older operation still being ingested is settled by this abort too: its pages go.
        if target != 0 && state.incoming_operation != 0 && state.incoming_operation <= target {
            self.discard_incoming(&mut state);
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
        // The records go in pages after this entry (`purge_subtree`, proposed by the leader):
        // deleting a subtree of any size here would take the memory and the time of every
        // replica at once. From here the subtree is not the group's: its root leaves its
        // parent, the descriptor stops serving it, and it is held until purged.
        self.link_to_parent(&prefix, false)?;
        state.frozen_for = 0;
        state.frozen_into = 0;
        state.frozen_prefix.clear();
        state.settled_through = state.settled_through.max(target);
        state.handed_to = target;
        state.purging.push(prefix);
        self.view.put_split(&state);
        let new = self.set_descriptor(group, current, Some(new))?;
        Ok((state, Some(new)))
    }

    /// Deletes the next page of the first subtree being purged (see `PurgeSubtree` in
    /// `namespace.proto`): at most `purge.records_max` records, each with what its going
    /// does, moved rather than deleted (no watch event comes of it). Answers the new split
    /// state; a page of a purge done, or of another subtree, changes nothing.
    pub fn purge_subtree(&mut self, purge: &PurgeSubtree) -> Result<SplitState, Failure> {
        let mut state = self.view.split()?;
        if state.purging.first() != Some(&purge.prefix) {
            return Ok(state);
        }
        if purge.records_max == 0 {
            return Err(invalid(&purge.prefix, "a purge page deletes at least one record").into());
        }
        match self.delete_records(&purge.prefix, &state.purged_through_key, purge.records_max)? {
            Some(last) => state.purged_through_key = last,
            None => {
                state.purging.remove(0);
                state.purged_through_key.clear();
            }
        }
        self.view.put_split(&state);
        Ok(state)
    }

    /// Deletes up to `records_max` records of the subtree at `prefix` after `after_key`, in
    /// key order, and lets go of its ephemerals' sessions here; waiting lock calls on its
    /// waiters wake and find the path served elsewhere. Answers the last key deleted when
    /// the budget ran out (records may follow it), `None` once none is left.
    fn delete_records(&mut self, prefix: &str, after_key: &[u8], records_max: u32) -> Result<Option<Vec<u8>>, Failure> {
        self.view.base().visit_page(store::subtree_ranges(prefix), after_key, records_max, |key, value| {
            match parse_subtree_key(key) {
                Some(SubtreeKey::Node(node_path)) => {
                    let record = store::decode_record(value)?;
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
                Some(SubtreeKey::Lock(lock_path)) => {
                    self.lock_changes.push((lock_path.to_string(), 0));
                    // Its holders are counted again (none: it is gone).
                    self.touched.insert(lock_path.to_string());
                }
                Some(SubtreeKey::Child(..)) | None => {}
            }
            self.view.delete_raw(key);
            Ok::<_, Failure>(())
        })
    }

    /// Adds (`link`) or removes the subtree root at `prefix` in its parent's children index
    /// and count, when the parent is a node of this group and the entry is not as wanted
    /// already (a merge's target links the root it ingested once it serves it).
    fn link_to_parent(&mut self, prefix: &str, link: bool) -> Result<(), Failure> {
        let Some(parent_path) = path::parent(prefix) else { return Ok(()) };
        let name = path::name(prefix);
        let Some(mut parent) = self.view.node(parent_path)? else { return Ok(()) };
        if self.view.has_child(parent_path, name)? == link {
            return Ok(());
        }
        let mut stat = parent.stat.unwrap_or_default();
        if link {
            self.view.add_child(parent_path, name);
            stat.num_children = stat.num_children.saturating_add(1);
        } else {
            self.view.remove_child(parent_path, name);
            stat.num_children = stat.num_children.saturating_sub(1);
        }
        parent.stat = Some(stat);
        self.view.put_node(parent_path, &parent);
        Ok(())
    }

    /// Target: the pages of the operation being ingested are thrown away (it was aborted),
    /// in pages after this entry (never served here, its root is in no parent's index), and
    /// the operation is settled.
    fn discard_incoming(&mut self, state: &mut SplitState) {
        state.incoming_source = 0;
        let prefix = std::mem::take(&mut state.incoming_prefix);
        if !prefix.is_empty() {
            state.purging.push(prefix);
        }
        state.settled_through = state.settled_through.max(state.incoming_operation);
        state.incoming_operation = 0;
    }

    /// Target: `served` (just set) serves the prefix of the operation being ingested, so the
    /// ingested subtree is the group's own from now on: its root joins its parent, later
    /// pages are refused. Answers, when that happened, the new split state and the subtree
    /// that moved in: its prefix and the group it came from.
    pub fn settle_incoming(&mut self, served: &GroupDescriptor) -> Result<Option<(SplitState, String, u64)>, Failure> {
        let mut state = self.view.split()?;
        if state.incoming_operation == 0 || !descriptor::serves(Some(served), &state.incoming_prefix) {
            return Ok(None);
        }
        let prefix = std::mem::take(&mut state.incoming_prefix);
        let source = std::mem::take(&mut state.incoming_source);
        if self.view.node(&prefix)?.is_some() {
            self.link_to_parent(&prefix, true)?;
        }
        state.settled_through = state.settled_through.max(state.incoming_operation);
        state.incoming_operation = 0;
        self.view.put_split(&state);
        Ok(Some((state, prefix, source)))
    }

    /// Target: writes a page of the source's export (see `namespace.proto`). Refused once the
    /// group serves the prefix (from then on it owns the subtree, and a late page would
    /// overwrite newer writes) or settled the operation. Answers the new split state.
    pub fn ingest_subtree(&mut self, group: u64, current: Option<&GroupDescriptor>, ingest: &IngestSubtree) -> Result<SplitState, Failure> {
        let prefix = ingest.prefix.as_str();
        path::validate(prefix, false).map_err(|e| super::error::invalid_path(prefix, &e))?;
        if current.is_some_and(|d| descriptor::serves(Some(d), prefix)) {
            return Err(invalid(prefix, "the group serves the prefix already: the subtree was ingested").into());
        }
        let mut state = self.view.split()?;
        let operation = ingest.operation;
        if operation == 0 || operation <= state.settled_through || operation < state.incoming_operation {
            return Err(invalid(prefix, format!("the operation {operation} is settled here, or was never begun")).into());
        }
        check_no_purge_overlapping(&state, prefix)?;
        if state.incoming_operation != operation && state.incoming_operation != 0 {
            // What an operation never settled here left (its source was never asked to
            // abort it here) is not part of this one, and it goes in pages: refused until
            // an abort of this operation (the roll-back of this refusal) settles the older
            // one too and its pages are purged.
            let message = format!("the pages of operation {} are still here: retry once it is aborted", state.incoming_operation);
            return Err(error(Code::Unavailable, prefix, message).into());
        }
        if state.incoming_operation != operation {
            state.incoming_operation = operation;
            state.incoming_prefix = prefix.to_string();
            state.incoming_source = ingest.source_group;
            self.view.put_split(&state);
        } else if state.incoming_prefix != prefix {
            return Err(invalid(prefix, format!("the operation {operation} moves {}", state.incoming_prefix)).into());
        }
        let mut owners = std::collections::BTreeMap::new();
        for listed in &ingest.sessions {
            if owners.insert(listed.session_id, listed.owner.as_str()).is_some() {
                return Err(invalid(prefix, format!("the page names the owner of session {:#x} twice", listed.session_id)).into());
            }
        }
        for record in &ingest.records {
            self.ingest_record(group, prefix, record, &owners)?;
        }
        Ok(state)
    }

    /// Writes one record of a page; `owners` are the owners the page names.
    fn ingest_record(&mut self, group: u64, prefix: &str, record: &SubtreeRecord, owners: &BTreeMap<u64, &str>) -> Result<(), Failure> {
        let refuse = |why: &str| -> Failure { invalid(prefix, format!("an exported record {why}")).into() };
        let inside = |path: &str| is_at_or_below(path, prefix);
        match parse_subtree_key(&record.key) {
            Some(SubtreeKey::Node(node_path)) if inside(node_path) => {
                let node = NodeRecord::decode(record.value.as_slice()).map_err(|_| refuse("is not a node record"))?;
                let stat = node.stat.unwrap_or_default();
                let owner = stat.ephemeral_owner;
                if owner != 0 {
                    let home = sessions::home_group(owner);
                    if home == 0 {
                        return Err(refuse("names a session without a home group"));
                    }
                    // A session homed here (a merge into its home) must still be alive: its
                    // ephemeral in the source outlived it only because the freeze deferred
                    // its end there. The operation rolls back and the source ends it.
                    if home == group && self.view.session(owner)?.is_none_or(|record| record.remote) {
                        let message = format!("the ephemeral {node_path} belongs to session {owner}, which has ended here: retry once it is gone");
                        return Err(error(Code::Unavailable, node_path, message).into());
                    }
                    self.attach_moved_ephemeral(owner, owners.get(&owner).copied(), node_path)?;
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

    /// A moved ephemeral node of `session`, opened by `owner` as the page says (`None`: the
    /// page does not say): a session homed elsewhere is recorded here as remote, under its
    /// home group's authority (DESIGN.md rule 7), with that owner — unknown if the page does
    /// not say, to be learned from the home group before the session is used here, never
    /// "anyone"; a session homed here owns it as any other. Counted once however often the
    /// page is ingested.
    fn attach_moved_ephemeral(&mut self, session: u64, owner: Option<&str>, path: &str) -> Result<(), Failure> {
        let mut record = match self.view.session(session)? {
            Some(record) => record,
            None => {
                self.session_changes.push(SessionChange::RemoteAdded(session));
                SessionRecord { session_id: session, remote: true, ..SessionRecord::default() }
            }
        };
        if let Some(owner) = owner.filter(|_| sessions::owner(&record) == sessions::Owner::Unknown) {
            record.owner = owner.to_string();
            record.owner_known = true;
        }
        // A page ingested again counts nothing twice.
        if self.view.node(path)?.is_none_or(|node| node.stat.is_none_or(|s| s.ephemeral_owner != session)) {
            record.ephemerals += 1;
            self.view.add_ephemeral(session, path);
        }
        self.view.put_session(&record);
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

/// Applies a `FreezeSubtree`: the subtree stops taking writes until it has moved.
pub(super) fn apply_freeze(
    sm: &NamespaceStateMachine,
    txn: &mut Txn<'_, '_>,
    freeze: &FreezeSubtree,
    effects: &mut Effects,
) -> Result<CommandOutcome, Failure> {
    effects.split = Some(txn.freeze_subtree(sm.descriptor.as_ref(), freeze)?);
    Ok(done())
}

/// Applies an `AbortSplit`: a move that will not finish gives its subtree back.
pub(super) fn apply_abort(txn: &mut Txn<'_, '_>, abort: &AbortSplit, effects: &mut Effects) -> Result<CommandOutcome, Failure> {
    effects.split = Some(txn.abort_split(abort)?);
    Ok(done())
}

/// Applies a `HandSubtree`: the frozen subtree now belongs to its target, whose watches take
/// over (a merge's: the parent group). A hand-over done again (idempotent) moves nothing.
pub(super) fn apply_hand(
    sm: &NamespaceStateMachine,
    txn: &mut Txn<'_, '_>,
    hand: HandSubtree,
    effects: &mut Effects,
) -> Result<CommandOutcome, Failure> {
    let prefix = sm.split.frozen_prefix.clone();
    let target = match sm.split.frozen_into {
        0 => hand.target_group,
        into => into,
    };
    let (state, descriptor) = txn.hand_subtree(sm.group, sm.descriptor.as_ref(), hand)?;
    if descriptor.is_some() {
        effects.moved.push(Transfer { prefix, revision: txn.revision, direction: Direction::Out { to_group: target } });
    }
    effects.split = Some(state);
    effects.descriptor = descriptor;
    Ok(done())
}

/// Applies an `IngestSubtree`: a page of a subtree moving in.
pub(super) fn apply_ingest(
    sm: &NamespaceStateMachine,
    txn: &mut Txn<'_, '_>,
    ingest: &IngestSubtree,
    effects: &mut Effects,
) -> Result<CommandOutcome, Failure> {
    effects.split = Some(txn.ingest_subtree(sm.group, sm.descriptor.as_ref(), ingest)?);
    Ok(done())
}

/// Applies a `PurgeSubtree`: a page of a moved subtree's records deleted.
pub(super) fn apply_purge(txn: &mut Txn<'_, '_>, purge: &PurgeSubtree, effects: &mut Effects) -> Result<CommandOutcome, Failure> {
    effects.split = Some(txn.purge_subtree(purge)?);
    Ok(done())
}

#[cfg(test)]
mod tests {
    use warden_proto::namespace::{AcquireLock, SetQuotaShare};
    use warden_proto::v1::{CreateRequest, LockMode, QuotaLimits};

    use super::*;
    use crate::harness::{BatchCost, Harness};
    use crate::quota::{counts_of, counts_to_proto};
    use crate::Limits;

    const TARGET: u64 = 7;
    /// Plain nodes in the moved subtree: with their children index entries, several pages.
    const NODES: usize = 2_500;

    fn served(version: u64, excluded: &[&str]) -> GroupDescriptor {
        GroupDescriptor {
            group_id: 1,
            prefix: "/".into(),
            excluded: excluded.iter().map(|e| e.to_string()).collect(),
            replicas: vec![1],
            conf_ver: 1,
            version,
        }
    }

    fn create(ns: &mut Harness, path: &str, session_id: u64, kind: NodeKind) {
        let ttl_ms = if kind == NodeKind::Ttl { 60_000 } else { 0 };
        let request = CreateRequest { path: path.into(), data: b"data".to_vec(), session_id, kind: kind as i32, ttl_ms, ..CreateRequest::default() };
        assert!(ns.create(request).is_ok(), "create {path}");
    }

    /// Whether any record of the group's range is a record of the subtree at `prefix`, or an
    /// ephemeral index entry of a node in it.
    fn holds_any_of(ns: &Harness, prefix: &str) -> bool {
        let mut found = false;
        let scanned = ns.reader().scan(|key, _| {
            let path = match parse_subtree_key(key) {
                Some(SubtreeKey::Node(path) | SubtreeKey::Lock(path) | SubtreeKey::Child(path, _)) => path,
                None if key.first() == Some(&b'e') => std::str::from_utf8(&key[9..]).unwrap_or(""),
                None => return,
            };
            found |= is_at_or_below(path, prefix);
        });
        assert!(scanned.is_ok(), "the group's records read");
        found
    }

    /// A hand-over of a subtree of thousands of records deletes nothing in its own entry:
    /// the leader's purge pages do, each within the page budget it carries, and once they
    /// ran nothing of the subtree is left, its ephemerals left their session, its waiters'
    /// calls were woken, and the quota's usage and the held counts are those of what stays.
    #[test]
    fn a_hand_over_deletes_the_moved_subtree_a_bounded_page_per_entry_and_leaves_nothing_of_it() {
        let mut ns = Harness::new(Limits::default()).expect("harness");
        ns.set_leading(true, 0);
        assert!(ns.set_descriptor(served(1, &[]), 0).is_ok());
        let limits = QuotaLimits { nodes: Some(1_000_000), ..QuotaLimits::default() };
        let share = |version| SetQuotaShare {
            prefix: "/".into(),
            version,
            limits: Some(limits),
            allotment: Some(counts_to_proto([1_000_000, 0, 0, 0])),
            // Counted in its own entry (the group is small yet).
            records_max: crate::quota::COUNT_RECORDS_PER_PAGE,
            ..SetQuotaShare::default()
        };
        assert!(ns.set_quota_share(share(1)).is_ok(), "a quota counting the whole group");
        let session = ns.create_session(60_000).expect("session").session_id;
        let other = ns.create_session(60_000).expect("session").session_id;
        for path in ["/team", "/team/a", "/team/a/deep", "/other"] {
            create(&mut ns, path, 0, NodeKind::Persistent);
        }
        for i in 0..NODES {
            create(&mut ns, &format!("/team/a/deep/n{i:05}"), 0, NodeKind::Persistent);
        }
        for i in 0..20 {
            create(&mut ns, &format!("/team/a/ttl{i:02}"), 0, NodeKind::Ttl);
            create(&mut ns, &format!("/team/a/e{i:02}"), session, NodeKind::Persistent);
        }
        create(&mut ns, "/team/a-stays", session, NodeKind::Persistent);
        let lock = |session_id, request_id| AcquireLock {
            path: "/team/a/lock".into(),
            session_id,
            mode: LockMode::Exclusive as i32,
            request_id,
            ..AcquireLock::default()
        };
        for (session_id, request_id) in [(session, 1), (other, 2), (other, 3)] {
            assert!(ns.lock(lock(session_id, request_id)).is_ok(), "waiter {request_id}");
        }
        let freeze = FreezeSubtree { prefix: "/team/a".into(), target_group: TARGET, into_group: 0 };
        assert!(ns.placement_step(CommandOp::FreezeSubtree(freeze)).is_ok());

        ns.take_batch_costs();
        let hand = HandSubtree { target_group: TARGET, descriptor: Some(served(2, &["/team/a"])) };
        assert!(ns.placement_step(CommandOp::HandSubtree(hand)).is_ok(), "hand over");
        let handed = ns.take_batch_costs();
        assert!(handed.iter().all(|cost| cost.write_ops < 16 && cost.records_scanned < 16), "the hand-over entry itself: {handed:?}");
        while ns.leader_scan(1).expect("leader proposals") > 0 {}
        let pages = ns.take_batch_costs();
        let budget = PURGE_RECORDS_PER_PAGE as usize;
        assert!(pages.len() >= 4, "{} records go in pages: {pages:?}", 2 * NODES);
        let over: Vec<&BatchCost> = pages.iter().filter(|cost| cost.write_ops > budget + 16 || cost.records_scanned > budget as u64 + 16).collect();
        assert!(over.is_empty(), "entries past the page budget of {budget}: {over:?}");

        assert!(!holds_any_of(&ns, "/team/a"), "a record of the moved subtree was left");
        assert!(pages.iter().map(|cost| cost.notified).sum::<usize>() >= 3, "the waiting calls of the moved waiters wake");
        let closed = ns.close_session(session).expect("its moved nodes are no longer its own here");
        assert_eq!(closed.deleted, 1, "only the ephemeral that stayed");
        let usage = counts_of(ns.set_quota_share(share(0)).expect("the share").usage.as_ref());
        let mut nodes = 0;
        assert!(ns
            .reader()
            .scan_range(b"n", Some(b"o"), |_, _| {
                nodes += 1;
                true
            })
            .is_ok());
        assert_eq!(usage[0], nodes, "the quota counts what stays: the root, /team, /other");
        let held = ns.held();
        assert!(ns.reopen().is_ok());
        assert_eq!(ns.held(), held, "the counts kept by apply are those counted from disk");
    }
}
