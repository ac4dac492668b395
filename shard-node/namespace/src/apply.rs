//! Applying one namespace command: the steps every command goes through, in order, and the
//! one table of what each kind of command is ([`Properties::of`]). The work particular to a
//! kind lives with its feature: node writes in `txn.rs`, sessions in `sessions.rs`, locks in
//! `locks.rs`, the group's descriptor in `descriptor.rs`, subtree moves in `split.rs`,
//! restores in `backup.rs`, quota shares in `quota.rs`, replicated limits in `limits.rs`.

use std::collections::BTreeSet;

use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::{Command, CommandResult, EndRemoteSessions, ExpireSessions, ExpireTtl, QuotaShare, SplitState};
use warden_proto::v1::{CloseSessionResponse, CreateSessionResponse, GroupDescriptor, LockResponse, TxnResponse, WardenError};

use super::error::{self, Failure};
use super::store::TxnView;
use super::txn::Txn;
use super::{backup, descriptor, limits, locks, quota, sessions, split, Limits, NamespaceStateMachine};
use crate::watch::{Event, EventBatch};
use warden_engine::error::StorageError;
use warden_engine::state_machine::SmWrites;

/// What the apply steps need to know of a command, by kind: one row per command in
/// [`Properties::of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Properties {
    /// Its changes are records moving in or out of the group (a subtree move, a restore, a
    /// purge), not changes of nodes: they raise no watch events.
    pub moves_records: bool,
    /// It takes a new revision when it changes anything. Those that do not change no node
    /// (a quota share, a limits record, a count page), or write what the group serves no
    /// more (a purge page), or records whose revision comes with the target's descriptor (an
    /// ingested page).
    pub takes_revision: bool,
    /// A client's write: refused past its quotas. The system's own writes are only counted.
    pub client_write: bool,
    /// It changes the group's quota shares (the watch limits follow them).
    pub sets_quota: bool,
    /// It moves paged quota counting on (the leader may propose the next page).
    pub paces_quota_count: bool,
    /// The path it uses as a lock (a split may not take a hot lock's subtree).
    pub lock_path: Option<String>,
    /// The revision the group's next one must exceed (placement's floor on a new
    /// descriptor, a backup's on a restore; DESIGN.md rule 5).
    pub revision_floor: u64,
}

impl Properties {
    /// The properties of `op`: the one table every apply step reads.
    pub fn of(op: &CommandOp) -> Properties {
        // Most commands: a write of the system's that takes a revision.
        let system = Properties {
            moves_records: false,
            takes_revision: true,
            client_write: false,
            sets_quota: false,
            paces_quota_count: false,
            lock_path: None,
            revision_floor: 0,
        };
        let client = Properties { client_write: true, ..system.clone() };
        let moving = Properties { moves_records: true, ..system.clone() };
        match op {
            // The floor makes the revision it takes `raise_to` exactly, from below it.
            CommandOp::Txn(request) => Properties { revision_floor: request.raise_to.saturating_sub(1), ..client },
            CommandOp::CreateSession(_) => client,
            CommandOp::AcquireLock(acquire) => Properties { lock_path: Some(acquire.path.clone()), ..client },
            CommandOp::ReleaseLock(release) => Properties { lock_path: release.sequencer.as_ref().map(|s| s.path.clone()), ..system },
            CommandOp::ExpireTtl(_)
            | CommandOp::CloseSession(_)
            | CommandOp::ExpireSessions(_)
            | CommandOp::AddRemoteSessions(_)
            | CommandOp::EndRemoteSessions(_)
            | CommandOp::NoteRemoteHolders(_)
            | CommandOp::LockDelayEnded(_)
            | CommandOp::FreezeSubtree(_) => system,
            CommandOp::SetDescriptor(set) => Properties { revision_floor: set.revision_floor, ..system },
            CommandOp::HandSubtree(_) | CommandOp::AbortSplit(_) => moving,
            CommandOp::IngestSubtree(_) => Properties { takes_revision: false, ..moving },
            CommandOp::PurgeSubtree(_) => Properties { takes_revision: false, ..moving },
            CommandOp::RestorePage(page) => Properties { revision_floor: page.revision_floor, ..moving },
            CommandOp::SetQuotaShare(_) => Properties { takes_revision: false, sets_quota: true, paces_quota_count: true, ..system },
            CommandOp::CountQuota(_) => Properties { takes_revision: false, paces_quota_count: true, ..system },
            CommandOp::SetLimits(_) => Properties { takes_revision: false, ..system },
        }
    }
}

/// What a command changes of the state machine's memory once its writes commit (its store
/// writes go through the transaction's view).
#[derive(Default)]
pub(super) struct Effects {
    /// The descriptor the group serves from now on.
    pub descriptor: Option<GroupDescriptor>,
    /// The group's split state from now on.
    pub split: Option<SplitState>,
    /// The replicated limits from now on: `(record version, limits)`.
    pub limits: Option<(u64, Limits)>,
    /// Subtrees handed to another group (their watches end MOVED), or taken from one.
    pub moved: Vec<crate::watch::hub::Transfer>,
    /// Quota shares changed or counted.
    pub quota_shares: Vec<QuotaShare>,
    /// The quota share removed, by prefix.
    pub quota_removed: Option<String>,
    /// The lock call's attempt on its waiter (0: none), for the service's wait.
    pub lock_attempt: u64,
    /// A closed session's remote holders, for the service to end it there.
    pub remote_holders: Vec<u64>,
}

/// The answer of a command that changes nodes but has nothing to say but its revision.
pub(super) fn done() -> CommandOutcome {
    CommandOutcome::Txn(TxnResponse { header: None, succeeded: true, results: Vec::new() })
}

/// A refusal as the command's result (every replica refuses alike; nothing is written).
fn refused(error: WardenError) -> CommandResult {
    CommandResult { result: Some(CommandOutcome::Error(error)), ..CommandResult::default() }
}

impl NamespaceStateMachine {
    /// Applies one command: its writes go into `writes` (committed with the entry's index
    /// by the engine), its effects on memory take hold at once. A refusal is the command's
    /// result; only a storage failure is an error (the engine stops the replica).
    pub(super) fn apply_command(&mut self, mut command: Command, writes: &mut SmWrites) -> Result<CommandResult, StorageError> {
        // 1. Paths this group does not serve are refused before anything is read: a router
        //    with a stale table learns the descriptor (WRONG_GROUP).
        if let Err(error) = self.check_paths(command.op.as_ref()) {
            return Ok(refused(error));
        }
        let reader = self.reader()?.clone();
        let root = descriptor::root(self.descriptor.as_ref()).to_string();
        let mut view = TxnView::new(&reader, Some(writes));
        // 2. A subtree frozen for a move refuses what would change it; ends of sessions owning
        //    nodes in it wait until it has moved.
        match split::check_frozen(&self.split, &view, command.op.as_ref()) {
            Ok(()) => {}
            Err(Failure::Refused(error)) => return Ok(refused(error)),
            Err(Failure::Storage(error)) => return Err(error),
        }
        if let Some(CommandOp::ExpireSessions(ExpireSessions { session_ids }) | CommandOp::EndRemoteSessions(EndRemoteSessions { session_ids, .. })) =
            command.op.as_mut()
        {
            *session_ids = split::deferred(&self.split, &view, session_ids)?;
        }
        // 3. What the command is (one table).
        let Some(op) = command.op else { return Ok(refused(error::invalid("", "command without an operation"))) };
        let properties = Properties::of(&op);
        // 4. The revision its changes carry: above the floor a new descriptor or a restore
        //    brings, so tokens of paths that move here never go backwards (DESIGN.md rule 5).
        let revision = self.revision.max(properties.revision_floor) + 1;
        // 5. The command's own work, by kind, into the view and the effects.
        let mut effects = Effects::default();
        let mut txn = Txn {
            root: &root,
            descriptor: self.descriptor.as_ref(),
            view: &mut view,
            limits: &self.limits,
            now_ms: command.now_ms,
            revision,
            ttl_changes: Vec::new(),
            session_changes: Vec::new(),
            touched: BTreeSet::new(),
            lock_changes: Vec::new(),
            gone_waiters: Vec::new(),
            principal: &command.principal,
        };
        let outcome = match op {
            CommandOp::Txn(request) => {
                let answer = txn.run(&request);
                // A raise of a group below it commits even when nothing else changed: the
                // revision is then the transaction's only write.
                if answer.is_ok() && request.raise_to > self.revision {
                    txn.view.set_revision(txn.revision);
                }
                answer.map(CommandOutcome::Txn)
            }
            CommandOp::ExpireTtl(ExpireTtl { path, mod_revision }) => txn.expire_ttl(&path, mod_revision).map(|_| done()),
            CommandOp::CreateSession(create) => sessions::apply_create(self, &mut txn, &create),
            CommandOp::CloseSession(close) => sessions::apply_close(&mut txn, close.session_id, &mut effects),
            CommandOp::ExpireSessions(expire) => sessions::apply_expire(&mut txn, &expire.session_ids),
            CommandOp::AddRemoteSessions(add) => txn.add_remote_sessions(self.group, &add.session_ids, &add.owners).map(|()| done()),
            CommandOp::EndRemoteSessions(end) => sessions::apply_end_remote(&mut txn, &end.session_ids, end.closed),
            CommandOp::NoteRemoteHolders(note) => txn.note_remote_holders(self.group, note.group_id, &note.session_ids).map(CommandOutcome::Sessions),
            CommandOp::AcquireLock(acquire) => locks::apply_acquire(&mut txn, &acquire, &mut effects),
            CommandOp::ReleaseLock(release) => txn.release_lock(&release.sequencer.unwrap_or_default(), release.attempt).map(|()| done()),
            CommandOp::LockDelayEnded(ended) => txn.end_lock_delay(&ended.path).map(|()| done()),
            CommandOp::SetDescriptor(set) => descriptor::apply_set(self, &mut txn, set, &mut effects),
            CommandOp::FreezeSubtree(freeze) => split::apply_freeze(self, &mut txn, &freeze, &mut effects),
            CommandOp::AbortSplit(abort) => split::apply_abort(&mut txn, &abort, &mut effects),
            CommandOp::HandSubtree(hand) => split::apply_hand(self, &mut txn, hand, &mut effects),
            CommandOp::IngestSubtree(ingest) => split::apply_ingest(self, &mut txn, &ingest, &mut effects),
            CommandOp::PurgeSubtree(purge) => split::apply_purge(&mut txn, &purge, &mut effects),
            CommandOp::RestorePage(page) => backup::apply_restore(self, &mut txn, &page, &mut effects),
            CommandOp::SetQuotaShare(set) => quota::apply_share(&self.quotas, &mut txn, &set, &mut effects),
            CommandOp::CountQuota(count) => quota::apply_count(&self.quotas, &mut txn, &count, &mut effects),
            CommandOp::SetLimits(record) => limits::apply_record(&mut txn, self.limits_version, record, &mut effects),
        };
        let ttl_changes = std::mem::take(&mut txn.ttl_changes);
        let session_changes = std::mem::take(&mut txn.session_changes);
        let touched = std::mem::take(&mut txn.touched);
        let lock_changes = std::mem::take(&mut txn.lock_changes);
        let gone_waiters = std::mem::take(&mut txn.gone_waiters);
        let response = match outcome {
            Ok(response) => response,
            Err(Failure::Refused(error)) => return Ok(refused(error)),
            Err(Failure::Storage(error)) => return Err(error),
        };
        // 6. Quotas: every node the command changed, before and after (read once, for quotas,
        //    events and the counts of what the group holds), is charged; a client's write past
        //    a quota is refused (the view is dropped: nothing written).
        let node_changes = if view.is_unchanged() { Vec::new() } else { view.node_changes()? };
        match self.quotas.charge(&view, &node_changes, properties.client_write) {
            Ok(charged) => effects.quota_shares.extend(charged),
            Err(Failure::Refused(error)) => return Ok(refused(error)),
            Err(Failure::Storage(error)) => return Err(error),
        }
        // 7. Only a command that changed something commits: its revision, its events, its
        //    writes, then what it changed of memory.
        if !view.is_unchanged() {
            if properties.takes_revision {
                self.revision = revision;
            }
            self.counts.apply_changes(&node_changes);
            let events: Vec<Event> = if properties.moves_records { Vec::new() } else { Self::events_of(node_changes) };
            self.writes.record(&root, events.iter().map(|event| event.path.as_str()));
            if let Some(lock_path) = &properties.lock_path {
                self.writes.record_lock(&root, lock_path);
            }
            if !events.is_empty() {
                self.unpublished.push(EventBatch { revision: self.revision, events });
            }
            // A move is remembered on disk with the latest before it, for the watches a
            // replica starts after a restart (`watch::hub::Transfers`).
            let transfers = (!effects.moved.is_empty()).then(|| {
                let mut transfers = self.transfers.clone();
                effects.moved.iter().for_each(|moved| transfers.push(moved.clone()));
                view.put_moves(&transfers.to_proto());
                transfers
            });
            view.set_revision(self.revision);
            view.into_changes().commit_into(writes);
            if let Some(transfers) = transfers {
                self.transfers = transfers;
            }
            if effects.descriptor.is_some() {
                self.descriptor = effects.descriptor;
            }
            if let Some(state) = effects.split {
                self.split = state;
                self.purge_pacing.applied();
            }
            if let Some((version, limits)) = effects.limits {
                self.set_limits(version, limits);
            }
            self.unpublished_moves.extend(effects.moved);
            self.quotas.update(effects.quota_shares, effects.quota_removed);
            if properties.paces_quota_count {
                self.count_pacing.applied();
            }
            if properties.sets_quota {
                self.hub.set_watch_limits(self.quotas.watch_limits());
            }
            self.apply_ttl_changes(ttl_changes);
            self.apply_lock_changes(lock_changes, command.now_ms);
            self.notify_lock_waiters(&reader, writes, &touched, &gone_waiters)?;
            self.apply_session_changes(session_changes);
        }
        // 8. The answer carries the group's revision.
        let header = Some(warden_proto::v1::ResponseHeader { revision: self.revision, ..Default::default() });
        let response = match response {
            CommandOutcome::Txn(txn) => CommandOutcome::Txn(TxnResponse { header, ..txn }),
            CommandOutcome::CreateSession(created) => CommandOutcome::CreateSession(CreateSessionResponse { header, ..created }),
            CommandOutcome::CloseSession(closed) => CommandOutcome::CloseSession(CloseSessionResponse { header, ..closed }),
            CommandOutcome::Lock(lock) => CommandOutcome::Lock(LockResponse { header, ..lock }),
            other @ (CommandOutcome::Error(_) | CommandOutcome::QuotaShare(_) | CommandOutcome::Limits(_) | CommandOutcome::Sessions(_)) => other,
        };
        Ok(CommandResult { result: Some(response), lock_attempt: effects.lock_attempt, remote_holders: effects.remote_holders })
    }
}
