//! The namespace state machine: hierarchical nodes with data and stat, persistent /
//! sequential / container / TTL kinds, CAS and etcd-style transactions, one group revision
//! that grows with every applied write (DESIGN.md "Data model", rules 5, 8, 9).
//!
//! Data lives in RocksDB (`store`); in memory there is only the revision and an index of
//! TTL nodes for the leader's expiry scan, both rebuilt on start and after a snapshot.
//!
//! The crate's layers, each importing only those below it: the namespace's own modules
//! (this one, `store`, `txn`, `sessions`, …) → [`watch`] → [`path`] and [`error`], which
//! both use; under them all, the engine (`warden-engine`: the state-machine trait, the
//! store). Architecture invariant: this crate knows no gRPC service and no placement
//! group; the node crate serves it.

mod apply;
pub mod backup;
pub mod counts;
pub mod descriptor;
pub mod error;
#[cfg(any(test, feature = "harness"))]
pub mod harness;
pub mod hot;
pub mod limits;
pub mod locks;
pub mod path;
pub mod query;
pub mod quota;
pub mod ranges;
pub mod sessions;
pub mod split;
pub mod store;
pub mod txn;
mod upsert;
pub mod watch;

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message as _;
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::leader_request::Request as LeaderRequestKind;
use warden_proto::namespace::leader_response::Response as LeaderResponseKind;
use warden_proto::namespace::{Command, EndRemoteSessions, ExpireSessions, ExpireTtl, SessionIds};
use warden_proto::namespace::{LeaderRequest, LeaderResponse, SplitState};
use warden_proto::v1::{GroupDescriptor, KeepAliveResponse, NodeKind, SessionInfoResponse, SessionLease};

use crate::watch::event::node_state;
use crate::watch::{Event, EventBatch, WatchHub, WatchHubs};
use error::Failure;
pub use limits::Limits;
use limits::LimitsBoard;
pub use sessions::LeaderClock;
use sessions::LeaseTable;
use store::TxnView;
use txn::TtlChange;
use warden_engine::error::{EngineError, StorageError};
use warden_engine::state_machine::{Applied, SmReader, SmWrites, StateMachine, StateMachineFactory};

/// Highest revision floor a `SetDescriptor` may carry: far above any revision a group reaches,
/// far enough below `u64::MAX` that revisions never wrap.
pub const REVISION_FLOOR_MAX: u64 = 1 << 62;

/// How long the leader waits for a page of paged work (a purge, a quota count) it proposed
/// to apply before proposing it again (a proposal lost to a dropped message; a leader change
/// starts over at once).
const PAGE_REPROPOSE_AFTER_MS: u64 = 1_000;

/// The leader's pacing of one kind of paged work (leader-only, never replicated): one page
/// in flight, the next once the last one applied ([`PagePacing::applied`]), or the same
/// again after [`PAGE_REPROPOSE_AFTER_MS`] if it got lost. Each page is a bounded piece of
/// apply, and the group's other commands go between them.
#[derive(Default)]
struct PagePacing {
    /// When the page in flight was proposed (monotonic ms; `None`: none is).
    proposed_at_ms: Option<u64>,
}

impl PagePacing {
    /// Whether to propose a page now (and then it counts as in flight).
    fn take_turn(&mut self, now_ms: u64) -> bool {
        if self.proposed_at_ms.is_some_and(|at_ms| now_ms.saturating_sub(at_ms) < PAGE_REPROPOSE_AFTER_MS) {
            return false;
        }
        self.proposed_at_ms = Some(now_ms);
        true
    }

    /// The work moved on (a page applied, or leadership changed): the next page may go.
    fn applied(&mut self) {
        self.proposed_at_ms = None;
    }
}

/// Creates a [`NamespaceStateMachine`] per group.
#[derive(Default)]
pub struct NamespaceFactory {
    /// This binary's limits: the local ones apply as they are; the replicated ones only as
    /// what this binary records when it bootstraps a cluster (`limits.rs`).
    pub limits: Limits,
    /// Where each replica publishes the limits it applies.
    pub board: LimitsBoard,
    /// Where each replica's watch hub is registered (with the limits of watches).
    pub hubs: WatchHubs,
    /// Where each replica publishes what it holds, for the metrics.
    pub counts: counts::NamespaceCounts,
}

impl StateMachineFactory for NamespaceFactory {
    fn create(&self, node_id: u64, group: u64) -> Box<dyn StateMachine> {
        let hub = WatchHub::new(group, self.hubs.limits().clone());
        hub.count_into(self.hubs.counters(node_id));
        self.hubs.insert(node_id, group, hub.clone());
        Box::new(NamespaceStateMachine {
            node_id,
            group,
            hubs: self.hubs.clone(),
            hub,
            unpublished: Vec::new(),
            unpublished_moves: Vec::new(),
            transfers: watch::hub::Transfers::default(),
            // The replicated limits are the record's, once `reload` has read it.
            limits: self.limits.with_record(None),
            limits_version: 0,
            board: self.board.clone(),
            reader: None,
            revision: 0,
            ttl: BTreeMap::new(),
            ttl_recheck_at_ms: 0,
            sessions: BTreeMap::new(),
            remote_sessions: std::collections::BTreeSet::new(),
            leases: LeaseTable::default(),
            blocked_locks: BTreeMap::new(),
            delay_deadlines: locks::DelayDeadlines::default(),
            lock_holders: BTreeMap::new(),
            descriptor: None,
            split: SplitState::default(),
            purge_pacing: PagePacing::default(),
            count_pacing: PagePacing::default(),
            writes: hot::WriteCounts::default(),
            quotas: quota::GroupQuotas::default(),
            counts: counts::Counts::default(),
            published_counts: self.counts.register(node_id, group),
        })
    }
}

/// TTL node as the expiry scan needs it.
#[derive(Clone, Copy, Debug)]
struct TtlEntry {
    mod_revision: u64,
    mtime_ms: u64,
    ttl_ms: u64,
}

/// One group's namespace.
pub struct NamespaceStateMachine {
    node_id: u64,
    group: u64,
    hubs: WatchHubs,
    /// This replica's watch hub.
    hub: Arc<WatchHub>,
    /// Events of revisions applied but not yet in the store (published by `publish`).
    unpublished: Vec<EventBatch>,
    /// Subtrees handed over to another group or taken from one, not yet told to the hub
    /// (the watches of one handed over end with MOVED once the hand-over is in the store).
    unpublished_moves: Vec<watch::hub::Transfer>,
    /// The latest subtrees moved out or in, as stored (its hub holds the same once
    /// published).
    transfers: watch::hub::Transfers,
    /// The limits apply checks: the replicated ones from the group's record (replicated
    /// state, rebuilt from disk), the local ones from the factory.
    limits: Limits,
    /// The version of the group's limits record (0: none applied, the first release's).
    limits_version: u64,
    /// Where this replica publishes its limits.
    board: LimitsBoard,
    reader: Option<SmReader>,
    revision: u64,
    ttl: BTreeMap<String, TtlEntry>,
    /// No TTL node can expire before this time (wall ms), so the leader's per-tick scan is
    /// skipped until then. Changes only move expiries later; new nodes lower it. 0 while a
    /// node is due (waiting for its children to go, or beyond one scan's limit): scan every
    /// tick, even if the wall clock steps back.
    ttl_recheck_at_ms: u64,
    /// Every live session of this group and its granted TTL (replicated state, rebuilt
    /// from disk).
    sessions: BTreeMap<u64, u64>,
    /// Sessions homed in other groups that own ephemerals here (replicated state, rebuilt
    /// from disk); the leader has their home groups checked (`remote_session::checker`).
    remote_sessions: std::collections::BTreeSet<u64>,
    /// Lease deadlines: leader-only, not replicated.
    leases: LeaseTable,
    /// Locks in their lock-delay (replicated state, rebuilt from disk).
    blocked_locks: BTreeMap<String, locks::BlockedLock>,
    /// Leader-only: when each lock-delay ends by this leader's monotonic clock, fixed the
    /// first tick it leads with the lock blocked, from the delay's whole remainder then.
    /// Judged by the wall clock, a step of it (or a new leader whose clock runs ahead) would
    /// grant a lock its holder's crash blocked too soon; this way a leader change only
    /// lengthens a delay, as it does a session's lease.
    delay_deadlines: locks::DelayDeadlines,
    /// How many waiters hold each held lock (from the replicated state, rebuilt from disk;
    /// recounted for each lock a command touches), for the metrics.
    lock_holders: BTreeMap<String, u64>,
    /// What the group serves (replicated state, rebuilt from disk; `None`: every path).
    descriptor: Option<GroupDescriptor>,
    /// The subtree frozen for a split, and splits settled (replicated state, rebuilt from disk).
    split: SplitState,
    /// The leader's pacing of purge pages (moves on with every change of the split state:
    /// another change meanwhile may let a second page go, which only deletes the page after).
    purge_pacing: PagePacing,
    /// The leader's pacing of quota count pages (moves on with every applied share change).
    count_pacing: PagePacing,
    /// Writes applied per top-level child of the prefix (in memory only: hot subtrees).
    writes: hot::WriteCounts,
    /// The group's shares of subtree quotas and its usage (replicated state, rebuilt from disk).
    quotas: quota::GroupQuotas,
    /// Nodes, ephemerals and lock waiters held (counted from disk at load, then moved by each
    /// command's node changes), for the metrics.
    counts: counts::Counts,
    /// Where those, the sessions and the lock-delays are published after each batch.
    published_counts: Arc<counts::ReplicaCounts>,
}

impl NamespaceStateMachine {
    /// The next pages of the paged work the group has: the first subtree being purged, the
    /// first quota share still counting (each paced by its [`PagePacing`]).
    fn page_proposals(&mut self, clock: LeaderClock) -> Vec<Vec<u8>> {
        let mut ops = Vec::new();
        if let Some(prefix) = self.split.purging.first().filter(|_| self.purge_pacing.take_turn(clock.monotonic_ms)) {
            ops.push(CommandOp::PurgeSubtree(warden_proto::namespace::PurgeSubtree {
                prefix: prefix.clone(),
                records_max: split::PURGE_RECORDS_PER_PAGE,
            }));
        }
        if let Some(prefix) = self.quotas.counting().filter(|_| self.count_pacing.take_turn(clock.monotonic_ms)) {
            let records_max = quota::COUNT_RECORDS_PER_PAGE;
            ops.push(CommandOp::CountQuota(warden_proto::namespace::CountQuota { prefix: prefix.to_string(), records_max }));
        }
        ops.into_iter().map(|op| Command { now_ms: clock.wall_ms, principal: String::new(), op: Some(op) }.encode_to_vec()).collect()
    }

    /// Publishes what the group holds now (see `counts.rs`).
    fn publish_counts(&self) {
        let sessions = self.sessions.len() as u64;
        let lock_delays = self.blocked_locks.len() as u64;
        let lock_holders = self.lock_holders.values().sum();
        self.published_counts.publish(&counts::Counts { sessions, lock_delays, lock_holders, ..self.counts });
    }

    /// Applies `limits` (record `version`) from now on, and says so on the board.
    fn set_limits(&mut self, version: u64, limits: Limits) {
        self.board.set(self.node_id, self.group, version, limits.clone());
        self.limits = limits;
        self.limits_version = version;
    }

    fn reader(&self) -> Result<&SmReader, StorageError> {
        self.reader.as_ref().ok_or_else(|| StorageError::Corrupt(format!("group {}: namespace used before load", self.group)))
    }

    /// The children of the group's root among `names` that a split may not take
    /// ([`split::check_movable`]).
    fn unmovable_children<'n>(&self, reader: &SmReader, names: impl Iterator<Item = &'n String>) -> Result<Vec<String>, StorageError> {
        let root = descriptor::root(self.descriptor.as_ref());
        let view = TxnView::new(reader, None);
        let mut unmovable = Vec::new();
        for name in names {
            match split::check_movable(&view, root, &path::join(root, name)) {
                Ok(()) => {}
                Err(Failure::Refused(_)) => unmovable.push(name.clone()),
                Err(Failure::Storage(error)) => return Err(error),
            }
        }
        Ok(unmovable)
    }

    /// The watch events of a transaction's node changes (in path order).
    fn events_of(changes: Vec<store::NodeChange>) -> Vec<Event> {
        let state = |record: Option<warden_proto::namespace::NodeRecord>| record.map(|r| node_state(r.stat, r.data));
        changes.into_iter().flat_map(|change| Event::of_change(&change.path, state(change.before), state(change.after))).collect()
    }

    /// Refuses a command touching a path this group does not serve (WRONG_GROUP), or
    /// deleting a node with a subtree in another group.
    fn check_paths(&self, op: Option<&CommandOp>) -> Result<(), warden_proto::v1::WardenError> {
        use warden_proto::v1::txn_op::Op;
        let served = |path: &str| descriptor::check_served(self.descriptor.as_ref(), path);
        match op {
            Some(CommandOp::Txn(request)) => {
                for compare in txn::flat_compares(request) {
                    served(&compare.path)?;
                    for range in &compare.ranges {
                        served(&range.path)?;
                    }
                }
                for op in txn::flat_ops(request) {
                    match &op.op {
                        Some(Op::Create(create)) => {
                            served(&create.path)?;
                            if create.session_id != 0 {
                                descriptor::check_childless_kind(self.descriptor.as_ref(), &create.path, "an ephemeral node")?;
                            }
                        }
                        Some(Op::Set(set)) => served(&set.path)?,
                        Some(Op::Get(get)) => served(&get.path)?,
                        Some(Op::Put(put)) => {
                            served(&put.path)?;
                            if put.session_id != 0 && !put.keep_owner {
                                descriptor::check_childless_kind(self.descriptor.as_ref(), &put.path, "an ephemeral node")?;
                            }
                        }
                        Some(Op::Range(range)) => served(&range.path)?,
                        Some(Op::DeleteRange(delete)) => served(&delete.path)?,
                        Some(Op::Delete(delete)) => {
                            served(&delete.path)?;
                            descriptor::check_deletable(self.descriptor.as_ref(), &delete.path)?;
                        }
                        Some(Op::Txn(_)) | None => {}
                    }
                }
            }
            Some(CommandOp::AcquireLock(acquire)) => {
                served(&acquire.path)?;
                descriptor::check_childless_kind(self.descriptor.as_ref(), &acquire.path, "a lock")?;
            }
            Some(CommandOp::ReleaseLock(release)) => served(release.sequencer.as_ref().map_or("", |s| s.path.as_str()))?,
            _ => {}
        }
        Ok(())
    }

    /// Keeps the TTL index in step with the TTL nodes a command changed.
    fn apply_ttl_changes(&mut self, changes: Vec<TtlChange>) {
        for change in changes {
            match change {
                TtlChange::Upsert(path, stat) => {
                    self.ttl_recheck_at_ms = self.ttl_recheck_at_ms.min(stat.mtime_ms.saturating_add(stat.ttl_ms));
                    self.ttl.insert(path, TtlEntry { mod_revision: stat.mod_revision, mtime_ms: stat.mtime_ms, ttl_ms: stat.ttl_ms });
                }
                TtlChange::Remove(path) => {
                    self.ttl.remove(&path);
                }
            }
        }
    }
}

impl Drop for NamespaceStateMachine {
    fn drop(&mut self) {
        self.hubs.remove(self.node_id, self.group, &self.hub);
        self.board.remove(self.node_id, self.group);
        self.hub.close();
    }
}

impl StateMachine for NamespaceStateMachine {
    fn apply(&mut self, _index: u64, command: &[u8], writes: &mut SmWrites) -> Applied {
        let command = match Command::decode(command) {
            Ok(command) => command,
            // Every replica fails to decode the same bytes alike: the command's outcome.
            Err(e) => return Ok(Err(EngineError::Invalid(format!("namespace command: {e}")))),
        };
        // A storage failure is not the command's outcome: the engine stops this replica.
        Ok(Ok(self.apply_command(command, writes)?.encode_to_vec()))
    }

    fn query(&self, query: &[u8]) -> Result<Vec<u8>, EngineError> {
        let reader = self.reader().map_err(|e| EngineError::busy(e.to_string()))?;
        let query = warden_proto::namespace::Query::decode(query).map_err(|e| EngineError::Invalid(format!("namespace query: {e}")))?;
        if let Some(warden_proto::namespace::query::Query::ChildWrites(_)) = query.query {
            let mut writes = self.writes.to_proto();
            let found = self.unmovable_children(reader, writes.writes.keys()).map_err(|e| EngineError::busy(e.to_string()))?;
            let found: Vec<String> = found.into_iter().filter(|name| !writes.unmovable.contains(name)).collect();
            writes.unmovable.extend(found);
            let result = warden_proto::namespace::query_result::Result::ChildWrites(writes);
            return Ok(warden_proto::namespace::QueryResult { revision: self.revision, result: Some(result) }.encode_to_vec());
        }
        query::run(reader, &self.limits, self.revision, self.descriptor.as_ref(), &self.split, query).map(|result| result.encode_to_vec())
    }

    fn publish(&mut self) {
        self.publish_counts();
        self.hub.publish(std::mem::take(&mut self.unpublished), self.revision);
        for transfer in std::mem::take(&mut self.unpublished_moves) {
            self.hub.transferred(transfer);
        }
        self.hub.paths_published(self.descriptor.as_ref().map_or(0, |d| d.version));
    }

    fn reload(&mut self, reader: &SmReader, _applied_index: u64) -> Result<(), StorageError> {
        self.revision = store::read_revision(reader)?;
        self.descriptor = store::read_descriptor(reader)?;
        self.split = store::read_split(reader)?;
        let record = store::read_limits(reader)?;
        self.set_limits(record.as_ref().map_or(0, |r| r.version), self.limits.with_record(record.as_ref()));
        self.unpublished.clear();
        self.unpublished_moves.clear();
        self.writes.clear();
        self.transfers = watch::hub::Transfers::from_proto(store::read_moves(reader)?);
        self.hub.reset(self.revision);
        self.hub.restore_transfers(self.transfers.clone());
        self.hub.paths_published(self.descriptor.as_ref().map_or(0, |d| d.version));
        self.ttl.clear();
        let mut ttl = BTreeMap::new();
        let mut corrupt = None;
        let mut counts = counts::Counts::default();
        reader.scan_range(b"n", Some(b"o"), |key, value| {
            match store::decode_record(value) {
                Ok(record) => {
                    // The root always exists (stored or not): not counted, as in apply.
                    if key != b"n/" {
                        counts.count_node(&record, true);
                    }
                    let stat = record.stat.unwrap_or_default();
                    if stat.kind == NodeKind::Ttl as i32 {
                        let path = String::from_utf8_lossy(&key[1..]).into_owned();
                        ttl.insert(path, TtlEntry { mod_revision: stat.mod_revision, mtime_ms: stat.mtime_ms, ttl_ms: stat.ttl_ms });
                    }
                }
                Err(error) => corrupt = Some(error),
            }
            corrupt.is_none()
        })?;
        if let Some(error) = corrupt {
            return Err(error);
        }
        self.ttl = ttl;
        self.counts = counts;
        self.ttl_recheck_at_ms = 0;
        let (remote, own): (Vec<_>, Vec<_>) = store::read_sessions(reader)?.into_values().partition(|record| record.remote);
        self.sessions = own.into_iter().map(|record| (record.session_id, record.ttl_ms)).collect();
        self.remote_sessions = remote.into_iter().map(|record| record.session_id).collect();
        let metas = store::read_lock_metas(reader)?;
        // What a delay had left is not on disk: judged once, now, by the wall clock.
        let now_ms = warden_engine::wall_clock::now_ms();
        self.blocked_locks = metas
            .iter()
            .filter(|(_, meta)| meta.blocked_until_ms != 0)
            .map(|(path, meta)| (path.clone(), locks::BlockedLock::at(meta.blocked_until_ms, now_ms, self.limits.lock_delay_ms_max)))
            .collect();
        self.lock_holders.clear();
        let view = TxnView::new(reader, None);
        for path in metas.keys() {
            let holding = Self::lock_holders_at(&view, path, self.limits.lock_waiters_max)?.len() as u64;
            if holding != 0 {
                self.lock_holders.insert(path.clone(), holding);
            }
        }
        // A replica that (re)loads its state (a snapshot) re-grants every lease if it leads.
        self.leases.regrant(&self.sessions);
        self.quotas = quota::GroupQuotas::load(reader)?;
        self.hub.set_watch_limits(self.quotas.watch_limits());
        self.reader = Some(reader.clone());
        self.publish_counts();
        Ok(())
    }

    fn validate(&self, command: &[u8]) -> Result<(), EngineError> {
        let command = Command::decode(command).map_err(|e| EngineError::Invalid(format!("namespace command: {e}")))?;
        match command.op {
            Some(CommandOp::Txn(request)) => txn::check_request(&request, &self.limits).map_err(|e| EngineError::Invalid(e.message)),
            Some(CommandOp::ExpireSessions(ExpireSessions { session_ids }) | CommandOp::EndRemoteSessions(EndRemoteSessions { session_ids, .. }))
                if session_ids.len() > self.limits.sessions_per_expiry_max =>
            {
                Err(EngineError::Invalid(format!("more than {} sessions in one expiry", self.limits.sessions_per_expiry_max)))
            }
            Some(CommandOp::SetDescriptor(set)) if set.revision_floor > REVISION_FLOOR_MAX => {
                Err(EngineError::Invalid(format!("revision floor {} is above {REVISION_FLOOR_MAX}", set.revision_floor)))
            }
            Some(CommandOp::NoteRemoteHolders(note)) if note.session_ids.len() > sessions::SESSION_IDS_PER_CHECK_MAX => {
                Err(EngineError::Invalid(format!("more than {} sessions noted at once", sessions::SESSION_IDS_PER_CHECK_MAX)))
            }
            Some(CommandOp::AddRemoteSessions(add)) if add.session_ids.len() > self.limits.txn_ops_max => {
                Err(EngineError::Invalid(format!("more than {} sessions added at once", self.limits.txn_ops_max)))
            }
            Some(CommandOp::IngestSubtree(ingest)) if ingest.records.len() > split::INGEST_RECORDS_MAX => {
                Err(EngineError::Invalid(format!("more than {} records in one ingested page", split::INGEST_RECORDS_MAX)))
            }
            Some(CommandOp::IngestSubtree(ingest)) if ingest.sessions.len() > split::INGEST_RECORDS_MAX => {
                Err(EngineError::Invalid(format!("more than {} session owners in one ingested page", split::INGEST_RECORDS_MAX)))
            }
            Some(CommandOp::RestorePage(page)) if page.records.len() > backup::RESTORE_RECORDS_MAX => {
                Err(EngineError::Invalid(format!("more than {} records in one restored page", backup::RESTORE_RECORDS_MAX)))
            }
            Some(CommandOp::PurgeSubtree(purge)) if !(1..=split::PURGE_RECORDS_PER_PAGE_MAX).contains(&purge.records_max) => {
                Err(EngineError::Invalid(format!("a purge page deletes 1 to {} records", split::PURGE_RECORDS_PER_PAGE_MAX)))
            }
            Some(CommandOp::CountQuota(warden_proto::namespace::CountQuota { records_max, .. }))
            | Some(CommandOp::SetQuotaShare(warden_proto::namespace::SetQuotaShare { records_max, .. }))
                if records_max > quota::COUNT_RECORDS_PER_PAGE_MAX =>
            {
                Err(EngineError::Invalid(format!("a quota count page reads at most {} records", quota::COUNT_RECORDS_PER_PAGE_MAX)))
            }
            Some(CommandOp::RestorePage(page)) if page.revision_floor > REVISION_FLOOR_MAX => {
                Err(EngineError::Invalid(format!("revision floor {} is above {REVISION_FLOOR_MAX}", page.revision_floor)))
            }
            Some(
                CommandOp::ExpireTtl(_)
                | CommandOp::CreateSession(_)
                | CommandOp::CloseSession(_)
                | CommandOp::ExpireSessions(_)
                | CommandOp::AddRemoteSessions(_)
                | CommandOp::EndRemoteSessions(_)
                | CommandOp::NoteRemoteHolders(_)
                | CommandOp::AcquireLock(_)
                | CommandOp::ReleaseLock(_)
                | CommandOp::LockDelayEnded(_)
                | CommandOp::SetDescriptor(_)
                | CommandOp::FreezeSubtree(_)
                | CommandOp::IngestSubtree(_)
                | CommandOp::HandSubtree(_)
                | CommandOp::AbortSplit(_)
                | CommandOp::SetQuotaShare(_)
                | CommandOp::SetLimits(_)
                | CommandOp::RestorePage(_)
                | CommandOp::PurgeSubtree(_)
                | CommandOp::CountQuota(_),
            ) => Ok(()),
            None => Err(EngineError::Invalid("command without an operation".into())),
        }
    }

    /// The leader judges time for sessions (their leases), remote sessions (their home
    /// groups' verdicts, asked for by the leader's checker), TTL nodes and locks in their
    /// lock-delay: while the group holds any of them its leader keeps ticking. So does a
    /// subtree being purged, or a quota share counting: the leader proposes their pages.
    fn needs_ticks(&self) -> bool {
        !self.sessions.is_empty()
            || !self.remote_sessions.is_empty()
            || !self.ttl.is_empty()
            || !self.blocked_locks.is_empty()
            || !self.split.purging.is_empty()
            || self.quotas.counting().is_some()
    }

    fn on_leadership(&mut self, leading: bool, clock: LeaderClock) {
        self.leases.set_leading(leading, &self.sessions, clock.monotonic_ms);
        self.delay_deadlines.clear();
        self.purge_pacing.applied();
        self.count_pacing.applied();
    }

    fn finish_batch(&mut self, writes: &mut SmWrites) {
        self.quotas.flush(writes);
    }

    fn leader_clock(&mut self, clock: LeaderClock) {
        self.leases.observe(clock.monotonic_ms);
    }

    fn leader_call(&mut self, request: &[u8], clock: LeaderClock) -> Result<Vec<u8>, EngineError> {
        let request = LeaderRequest::decode(request).map_err(|e| EngineError::Invalid(format!("leader request: {e}")))?;
        let now_ms = clock.monotonic_ms;
        let lease = |leases: &mut LeaseTable, sessions: &BTreeMap<u64, u64>, id: u64, renew: bool| {
            let ttl_ms = sessions.get(&id).copied();
            let remaining = match ttl_ms {
                Some(ttl_ms) if renew => leases.renew(id, ttl_ms, now_ms),
                Some(_) => leases.remaining(id, now_ms),
                None => None,
            };
            SessionLease { session_id: id, alive: remaining.is_some(), granted_ttl_ms: ttl_ms.unwrap_or(0), remaining_ms: remaining.unwrap_or(0) }
        };
        // Another principal's session is neither renewed nor described.
        let asked: &[u64] = match &request.request {
            Some(LeaderRequestKind::KeepAlive(keep_alive)) => &keep_alive.session_ids,
            Some(LeaderRequestKind::SessionInfo(id)) => std::slice::from_ref(id),
            _ => &[],
        };
        if !request.principal.is_empty() {
            let reader = self.reader().map_err(|e| EngineError::busy(e.to_string()))?;
            let view = TxnView::new(reader, None);
            for id in asked {
                let Some(record) = view.session(*id).map_err(|e| EngineError::busy(e.to_string()))? else { continue };
                if let Err(refused) = sessions::check_use(&record, &request.principal, "") {
                    return Ok(LeaderResponse { response: Some(LeaderResponseKind::Error(refused)) }.encode_to_vec());
                }
            }
        }
        let response = match request.request {
            Some(LeaderRequestKind::KeepAlive(keep_alive)) => {
                let leases = keep_alive.session_ids.iter().map(|id| lease(&mut self.leases, &self.sessions, *id, true)).collect();
                LeaderResponseKind::KeepAlive(KeepAliveResponse { header: None, leases })
            }
            Some(LeaderRequestKind::SessionInfo(id)) => {
                let reader = self.reader().map_err(|e| EngineError::busy(e.to_string()))?;
                let record = TxnView::new(reader, None).session(id).map_err(|e| EngineError::busy(e.to_string()))?;
                let lease = lease(&mut self.leases, &self.sessions, id, false);
                LeaderResponseKind::SessionInfo(SessionInfoResponse {
                    header: None,
                    lease: Some(lease),
                    ephemerals: record.map_or(0, |r| r.ephemerals),
                    ..SessionInfoResponse::default()
                })
            }
            Some(LeaderRequestKind::HomeSessions(page)) => {
                let reader = self.reader().map_err(|e| EngineError::busy(e.to_string()))?;
                let view = TxnView::new(reader, None);
                let limit = match page.limit as usize {
                    0 => sessions::SESSIONS_LIST_PAGE_MAX,
                    n => n.min(sessions::SESSIONS_LIST_PAGE_MAX),
                };
                let after = (std::ops::Bound::Excluded(page.after), std::ops::Bound::Unbounded);
                let mut listed = SessionInfoResponse::default();
                let mut answered = Vec::new();
                // At most `limit` sessions looked at: with security on, those of other
                // principals are passed over, not described.
                let ids: Vec<u64> = self.sessions.range(after).map(|(&id, _)| id).take(limit + 1).collect();
                for (looked, id) in ids.into_iter().enumerate() {
                    if looked == limit {
                        listed.more = true;
                        break;
                    }
                    listed.listed_through = id;
                    if !request.principal.is_empty() {
                        let record = view.session(id).map_err(|e| EngineError::busy(e.to_string()))?;
                        if record.is_none_or(|record| sessions::check_use(&record, &request.principal, "").is_err()) {
                            continue;
                        }
                    }
                    answered.push(id);
                }
                listed.sessions = answered.into_iter().map(|id| lease(&mut self.leases, &self.sessions, id, false)).collect();
                LeaderResponseKind::SessionInfo(listed)
            }
            Some(LeaderRequestKind::RemoteSessions(page)) => {
                let limit = (page.limit as usize).clamp(1, sessions::REMOTE_SESSIONS_PAGE_MAX);
                let after = (std::ops::Bound::Excluded(page.after), std::ops::Bound::Unbounded);
                let session_ids = self.remote_sessions.range(after).take(limit).copied().collect();
                LeaderResponseKind::RemoteSessions(SessionIds { session_ids, ..SessionIds::default() })
            }
            None => LeaderResponseKind::Error(error::invalid("", "leader request without a kind")),
        };
        Ok(LeaderResponse { response: Some(response) }.encode_to_vec())
    }

    fn leader_proposals(&mut self, clock: LeaderClock) -> Vec<Vec<u8>> {
        let now_ms = clock.wall_ms;
        let mut due = self.page_proposals(clock);
        // Nothing in a moving subtree changes until it has moved (the group serving it then
        // ends these).
        let frozen = |path: &str| split::is_held(&self.split, path);
        for (path, until_ms) in self
            .delay_deadlines
            .due(&self.blocked_locks, clock.monotonic_ms)
            .filter(|(path, _)| !frozen(path))
            .take(self.limits.ttl_expiries_per_scan_max)
        {
            let op = CommandOp::LockDelayEnded(warden_proto::namespace::LockDelayEnded { path });
            // Stamped no earlier than the delay's end as the entry that started it put it:
            // applying it checks that stamp, so a delay started again meanwhile (a later end)
            // is not ended by it.
            due.push(Command { now_ms: now_ms.max(until_ms), principal: String::new(), op: Some(op) }.encode_to_vec());
        }
        let expired = self.leases.take_expired(clock.monotonic_ms, self.limits.sessions_per_expiry_max);
        if !expired.is_empty() {
            let op = CommandOp::ExpireSessions(warden_proto::namespace::ExpireSessions { session_ids: expired });
            due.push(Command { now_ms, principal: String::new(), op: Some(op) }.encode_to_vec());
        }
        if now_ms < self.ttl_recheck_at_ms {
            return due;
        }
        let mut recheck_at_ms = u64::MAX;
        for (path, entry) in &self.ttl {
            if due.len() >= self.limits.ttl_expiries_per_scan_max {
                // More may be due: look again next tick (0, not `now_ms`: a wall clock stepped
                // back must not postpone what is due already).
                recheck_at_ms = 0;
                break;
            }
            let expires_at = entry.mtime_ms.saturating_add(entry.ttl_ms);
            if frozen(path) {
                recheck_at_ms = 0;
                continue;
            }
            if expires_at > now_ms {
                recheck_at_ms = recheck_at_ms.min(expires_at);
                continue;
            }
            // A TTL node with children does not expire (as in ZooKeeper), nor a lock in its
            // lock-delay: skip it rather than proposing a no-op every scan (it is looked at
            // again every tick while due).
            let childless = !self.blocked_locks.contains_key(path)
                && self
                    .reader()
                    .ok()
                    .and_then(|reader| store::read_node(reader, path).ok().flatten())
                    .is_some_and(|node| node.stat.unwrap_or_default().num_children == 0);
            // Due: look again next tick, whatever the clock says then.
            recheck_at_ms = 0;
            if childless {
                let op = CommandOp::ExpireTtl(ExpireTtl { path: path.clone(), mod_revision: entry.mod_revision });
                due.push(Command { now_ms, principal: String::new(), op: Some(op) }.encode_to_vec());
            }
        }
        self.ttl_recheck_at_ms = recheck_at_ms;
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_engine::storage::Db;
    use warden_proto::namespace::command_result::Result as CommandOutcome;
    use warden_proto::namespace::{CommandResult, Query, QueryResult};
    use warden_proto::v1::txn_op::Op;
    use warden_proto::v1::{CreateRequest, DeleteRequest, GetChildrenRequest, TxnOp, TxnRequest};

    fn txn(op: Op) -> Vec<u8> {
        let request = TxnRequest { then: vec![TxnOp { op: Some(op) }], ..TxnRequest::default() };
        Command { now_ms: 1, principal: String::new(), op: Some(CommandOp::Txn(request)) }.encode_to_vec()
    }

    fn outcome(output: Applied) -> Option<CommandOutcome> {
        CommandResult::decode(output.expect("storage").expect("applied").as_slice()).expect("result").result
    }

    /// The leader keeps its clock (and its group awake: `host/hibernate.rs`) exactly while
    /// the group holds something time ends: a session, a TTL node. Rebuilt on reload.
    #[test]
    fn the_group_needs_ticks_while_it_holds_a_session_or_a_ttl_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("db");
        let mut sm = NamespaceFactory::default().create(1, 1);
        sm.reload(&SmReader::new(db.clone(), 1), 0).expect("load");
        assert!(!sm.needs_ticks(), "an empty namespace");
        let mut writes = SmWrites::new(1);
        outcome(sm.apply(1, &txn(Op::Create(CreateRequest { path: "/plain".into(), ..CreateRequest::default() })), &mut writes));
        assert!(!sm.needs_ticks(), "a plain node needs no clock");
        let open = Command {
            now_ms: 1,
            principal: String::new(),
            op: Some(CommandOp::CreateSession(warden_proto::namespace::CreateSession { ttl_ms: 10_000, owner: String::new(), scope: String::new() })),
        };
        let Some(CommandOutcome::CreateSession(session)) = outcome(sm.apply(2, &open.encode_to_vec(), &mut writes)) else {
            panic!("session not created")
        };
        assert!(sm.needs_ticks(), "a session's lease is judged by the leader's clock");
        let close = Command {
            now_ms: 1,
            principal: String::new(),
            op: Some(CommandOp::CloseSession(warden_proto::namespace::CloseSession { session_id: session.session_id })),
        };
        assert!(matches!(outcome(sm.apply(3, &close.encode_to_vec(), &mut writes)), Some(CommandOutcome::CloseSession(_))));
        assert!(!sm.needs_ticks(), "the session is gone");
        let ttl = CreateRequest { path: "/ttl".into(), kind: NodeKind::Ttl as i32, ttl_ms: 60_000, ..CreateRequest::default() };
        assert!(matches!(outcome(sm.apply(4, &txn(Op::Create(ttl)), &mut writes)), Some(CommandOutcome::Txn(_))));
        assert!(sm.needs_ticks(), "a TTL node expires by the leader's clock");
        db.write_ops(&writes.into_ops(), false).expect("write");
        let mut reloaded = NamespaceFactory::default().create(2, 1);
        reloaded.reload(&SmReader::new(db, 1), 4).expect("reload");
        assert!(reloaded.needs_ticks(), "rebuilt from disk");
    }

    /// Entries applied in one batch (group commit) see each other's writes before the batch
    /// reaches RocksDB: the second create finds the parent the first one made, and a delete in
    /// the same batch sees both the stored and the pending children.
    #[test]
    fn entries_in_one_batch_see_each_others_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("db");
        let mut sm = NamespaceFactory::default().create(1, 1);
        sm.reload(&SmReader::new(db.clone(), 1), 0).expect("load");
        let mut stored = SmWrites::new(1);
        let made = sm.apply(1, &txn(Op::Create(CreateRequest { path: "/p".into(), ..CreateRequest::default() })), &mut stored);
        assert!(matches!(outcome(made), Some(CommandOutcome::Txn(_))));
        db.write_ops(&stored.into_ops(), false).expect("write");
        outcome(sm.apply(2, &txn(Op::Create(CreateRequest { path: "/p/stored".into(), ..CreateRequest::default() })), &mut SmWrites::new(1)));
        // That write was dropped on purpose (never written): /p/stored is not on disk.
        let mut batch = SmWrites::new(1);
        sm.reload(&SmReader::new(db.clone(), 1), 1).expect("reload");
        for (index, path) in [(2, "/p/a"), (3, "/p/a/b"), (4, "/p/c")] {
            let created = sm.apply(index, &txn(Op::Create(CreateRequest { path: path.into(), ..CreateRequest::default() })), &mut batch);
            assert!(matches!(outcome(created), Some(CommandOutcome::Txn(_))), "{path} sees its pending parent");
        }
        let deleted = sm.apply(5, &txn(Op::Delete(DeleteRequest { path: "/p".into(), recursive: true, ..DeleteRequest::default() })), &mut batch);
        match outcome(deleted) {
            Some(CommandOutcome::Txn(response)) => match &response.results[0].result {
                Some(warden_proto::v1::txn_op_result::Result::Delete(delete)) => assert_eq!(delete.deleted, 4),
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("unexpected {other:?}"),
        }
        db.write_ops(&batch.into_ops(), false).expect("write");
        let query =
            Query { query: Some(warden_proto::namespace::query::Query::Children(GetChildrenRequest { path: "/".into(), ..Default::default() })) };
        let result = QueryResult::decode(sm.query(&query.encode_to_vec()).expect("query").as_slice()).expect("decode");
        match result.result {
            Some(warden_proto::namespace::query_result::Result::Children(children)) => assert!(children.names.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(result.revision, 5);
    }
}
