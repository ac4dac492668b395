//! Writes: proposing commands and configuration changes, and applying committed entries.

use std::time::Instant;

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, ConfState, Entry, EntryType};
use raft_proto::ConfChangeI;
use tokio::sync::oneshot;

use super::failed::ApplyFailure;
use super::replica::{Proposal, Replica, Waiter};
use crate::config::NodeConfig;
use crate::error::{EngineError, StorageError};
use crate::state_machine::{ApplyOutput, SmWrites};
use crate::storage::keys::{self, StateKey};
use crate::storage::peer_storage::{encode, state_put};

/// A proposer's reply channel with the answer it gets once the apply write is done.
pub(crate) type ApplyReply = (oneshot::Sender<ApplyOutput>, ApplyOutput);

/// What is being proposed.
pub(crate) enum Proposed {
    Command(Vec<u8>),
    ConfChange(ConfChangeV2),
}

/// Context of an entry whose data is an envelope of several commands ([`CommandBatch`]).
/// Entries written before batching, and single-command entries, have an empty context, so
/// the two formats never mix up whatever the commands' bytes look like.
const BATCH_ENTRY_CONTEXT: &[u8] = b"B1";

/// Bytes of the length that precedes each command in a batch entry.
const BATCH_LENGTH_BYTES: usize = 4;

/// A proposer of a command not yet in an entry: its deadline and reply channel.
pub(crate) type BatchWaiter = (Instant, oneshot::Sender<ApplyOutput>);

/// The commands a leader took during one worker round, proposed together as one raft entry
/// at the round's end (TiKV batches a region's writes the same way): raft's bookkeeping, the
/// log entry and the per-entry apply cost are paid once per batch, not once per command.
#[derive(Default)]
pub(crate) struct CommandBatch {
    commands: Vec<Vec<u8>>,
    waiters: Vec<BatchWaiter>,
    bytes: usize,
}

impl CommandBatch {
    /// Commands in the batch.
    pub(crate) fn len(&self) -> usize {
        self.commands.len()
    }

    /// True when the batch holds no command.
    pub(crate) fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// The proposers of the batch's commands, in order.
    pub(crate) fn into_waiters(self) -> Vec<BatchWaiter> {
        self.waiters
    }

    /// The entry's context and data: a lone command is written as before batching existed.
    fn into_entry(mut self) -> (Vec<u8>, Vec<u8>, Vec<BatchWaiter>) {
        if self.commands.len() == 1 {
            let command = self.commands.pop().unwrap_or_default();
            return (Vec::new(), command, self.waiters);
        }
        let mut data = Vec::with_capacity(self.bytes + BATCH_LENGTH_BYTES * self.commands.len());
        for command in &self.commands {
            // A command fits in u32: it is at most `command_bytes_max`, checked on arrival.
            data.extend_from_slice(&(command.len() as u32).to_le_bytes());
            data.extend_from_slice(command);
        }
        (BATCH_ENTRY_CONTEXT.to_vec(), data, self.waiters)
    }
}

/// The commands of a normal, non-empty entry, in order.
fn entry_commands(entry: &Entry) -> Result<Vec<&[u8]>, StorageError> {
    if entry.context != BATCH_ENTRY_CONTEXT {
        return Ok(vec![&entry.data[..]]);
    }
    let corrupt = || StorageError::Corrupt(format!("batch entry {} is truncated", entry.index));
    let mut commands = Vec::new();
    let mut rest = &entry.data[..];
    while !rest.is_empty() {
        let (length, tail) = rest.split_first_chunk::<BATCH_LENGTH_BYTES>().ok_or_else(corrupt)?;
        let length = u32::from_le_bytes(*length) as usize;
        if tail.len() < length {
            return Err(corrupt());
        }
        let (command, tail) = tail.split_at(length);
        commands.push(command);
        rest = tail;
    }
    Ok(commands)
}

impl Replica {
    /// Takes a command or proposes a configuration change; the reply comes when its entry
    /// applies. Commands are checked now and proposed at the end of the round, together with
    /// the round's other commands (`propose_batch`); a full batch is proposed at once.
    pub(crate) fn propose(&mut self, config: &NodeConfig, proposed: Proposed, deadline: Instant, reply: oneshot::Sender<ApplyOutput>) {
        if let Err(error) = self.check_proposal(config, &proposed) {
            let _ = reply.send(Err(error));
            return;
        }
        let change = match proposed {
            Proposed::Command(command) => {
                // A command that would overflow the batch's bytes goes in the next one, so a
                // command larger than the bound goes alone (within `command_bytes_max`).
                if !self.batch.is_empty() && self.batch.bytes + command.len() > config.proposal_batch_bytes_max {
                    self.propose_batch();
                }
                self.batch.bytes += command.len();
                self.batch.commands.push(command);
                self.batch.waiters.push((deadline, reply));
                if self.batch.len() >= config.proposal_batch_commands_max || self.batch.bytes >= config.proposal_batch_bytes_max {
                    self.propose_batch();
                }
                return;
            }
            Proposed::ConfChange(change) => change,
        };
        let last_before = self.raw.raft.raft_log.last_index();
        // A configuration change that only leaves a joint configuration (no changes).
        let leaves = change.changes.is_empty();
        let result = self.raw.propose_conf_change(Vec::new(), change);
        let index = match self.appended(result, last_before) {
            Ok(index) => index,
            Err(error) => return drop(reply.send(Err(error))),
        };
        if !self.appended_conf_change(index) {
            // raft-rs took the proposal but appended an empty normal entry in place of the
            // change: the configuration will not change.
            let reason = self.conf_change_refusal(leaves);
            let _ = reply.send(Err(EngineError::ConfChangeRefused { group: self.group, reason }));
            return;
        }
        self.insert_proposal(index, vec![Waiter { position: 0, deadline, reply }]);
    }

    /// Proposes the commands taken this round as one entry (nothing when there are none).
    pub(crate) fn propose_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let (context, data, waiters) = std::mem::take(&mut self.batch).into_entry();
        // The commands were taken while this replica led, but a message stepped later in the
        // same round may have made it a follower. It must not propose then: raft-rs would
        // forward the entry to the new leader, which could apply commands whose callers are
        // told they were never proposed (and who may send them again). None of them is in
        // any log yet, so "not leader" is the true answer and a retry is safe.
        if !self.is_leader() {
            let error = self.not_leader();
            for (_, reply) in waiters {
                let _ = reply.send(Err(error.clone()));
            }
            return;
        }
        let last_before = self.raw.raft.raft_log.last_index();
        let result = self.raw.propose(context, data);
        match self.appended(result, last_before) {
            Ok(index) => {
                let waiters = waiters.into_iter().enumerate().map(|(position, (deadline, reply))| Waiter { position, deadline, reply }).collect();
                self.insert_proposal(index, waiters);
            }
            Err(error) => {
                for (_, reply) in waiters {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }

    /// The index of the one entry raft-rs appended for a proposal it accepted.
    fn appended(&self, result: raft::Result<()>, last_before: u64) -> Result<u64, EngineError> {
        result.map_err(|error| EngineError::Dropped(format!("group {}: {error}", self.group)))?;
        let index = self.raw.raft.raft_log.last_index();
        // raft-rs appends exactly one entry per accepted proposal.
        assert_eq!(index, last_before + 1, "proposal did not append one entry");
        Ok(index)
    }

    fn insert_proposal(&mut self, index: u64, waiters: Vec<Waiter>) {
        self.proposed_commands += waiters.len();
        self.proposals.insert(index, Proposal { term: self.raw.raft.term, waiters });
    }

    /// Removes the proposal of the entry at `index`, if this replica proposed it.
    pub(crate) fn take_proposal(&mut self, index: u64) -> Option<Proposal> {
        let proposal = self.proposals.remove(&index)?;
        self.proposed_commands -= proposal.waiters.len();
        Some(proposal)
    }

    /// Why raft-rs refused a configuration change (`leaves`: it had no changes, i.e. it
    /// asked to leave a joint configuration). Its `step_leader` refuses a change while an
    /// earlier one is unapplied, a change other than leaving while the configuration is
    /// joint, and leaving when it is not. A refused change alters none of that state, so it
    /// can be read after the fact; whether raft-rs refused is read from the entry it appended
    /// (see [`Self::appended_conf_change`]), not decided here.
    fn conf_change_refusal(&self, leaves: bool) -> String {
        let joint = !self.raw.raft.prs().conf().to_conf_state().voters_outgoing.is_empty();
        let reason = if self.raw.raft.has_pending_conf() {
            "an earlier configuration change has not applied yet"
        } else if joint && !leaves {
            "the configuration is joint and must be left first"
        } else if !joint && leaves {
            "an empty change leaves a joint configuration, and the configuration is not joint"
        } else {
            "raft-rs appended an empty entry in its place"
        };
        reason.to_string()
    }

    /// True when the entry raft-rs appended at `index` is the configuration change proposed.
    fn appended_conf_change(&self, index: u64) -> bool {
        let entries = self.raw.raft.raft_log.entries(index, None, raft::GetEntriesContext::empty(false));
        entries
            .ok()
            .and_then(|entries| entries.into_iter().next())
            .is_some_and(|entry| matches!(entry.get_entry_type(), EntryType::EntryConfChange | EntryType::EntryConfChangeV2))
    }

    /// Proposes what the state machine asks for because of time (leader only); nobody waits
    /// for the outcome.
    pub(crate) fn propose_leader_commands(&mut self, config: &NodeConfig, clock: crate::state_machine::LeaderClock) {
        // Only a leader that has applied an entry of its own term judges time: before that it
        // may not know every session or node a previous leader created.
        if !self.is_leader() || self.applied.term != self.raw.raft.term {
            return;
        }
        self.notice_leadership();
        for command in self.sm.leader_proposals(clock) {
            let (reply, _ignored) = oneshot::channel();
            // Batched with the round's client commands: the state machine treats them alike.
            self.propose(config, Proposed::Command(command), Instant::now() + config.election_timeout(), reply);
        }
    }

    fn check_proposal(&self, config: &NodeConfig, proposed: &Proposed) -> Result<(), EngineError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let waiting = self.proposed_commands + self.batch.len();
        if waiting >= config.proposals_per_group_max {
            return Err(EngineError::busy(format!("group {}: {waiting} proposals waiting", self.group)));
        }
        if let Proposed::Command(command) = proposed {
            if command.is_empty() {
                // An empty normal entry is raft's own no-op; it never reaches the state machine.
                return Err(EngineError::Invalid("empty command".into()));
            }
            if command.len() > config.command_bytes_max {
                return Err(EngineError::TooLarge { size_bytes: command.len(), limit_bytes: config.command_bytes_max });
            }
            self.sm.validate(command)?;
        }
        Ok(())
    }

    /// Applies committed entries in order, writes their effects atomically with the new
    /// applied index (DESIGN.md rule 4), and returns the proposers' replies, to be sent now
    /// that the write is done. When an entry cannot be applied (`failed.rs`) nothing of the
    /// batch is written and the applied index goes back to what the store holds, from which
    /// a restart applies again; the batch's proposers learn that the outcome is unknown
    /// (their entries are committed, but this replica cannot say what they did).
    pub(crate) fn apply_committed(&mut self, entries: Vec<Entry>) -> Result<Vec<ApplyReply>, ApplyFailure> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        assert!(!self.installing_snapshot, "group {}: committed entries while installing a snapshot", self.group);
        if self.is_leader() {
            // Leases that start at this apply count from now (see `StateMachine::leader_clock`).
            self.sm.leader_clock(crate::state_machine::LeaderClock::now());
        }
        let stored = self.applied;
        let mut writes = SmWrites::new(self.group);
        let mut replies = Vec::new();
        let written = self.apply_entries(entries, &mut writes, &mut replies).and_then(|()| self.write_applied(writes));
        match written {
            Ok(notifications) => {
                // Observers learn of the entries only now that their effects are in the store.
                self.sm.publish();
                self.wake(notifications);
                Ok(replies)
            }
            Err(failure) => {
                self.applied = stored;
                let reason = format!("group {}: {failure} before the answer", self.group);
                for (reply, _) in replies {
                    let _ = reply.send(Err(EngineError::Unavailable { reason: reason.clone(), outcome_unknown: true }));
                }
                Err(failure)
            }
        }
    }

    /// Writes a batch's effects with its applied index; returns its notification keys.
    fn write_applied(&mut self, mut writes: SmWrites) -> Result<Vec<Vec<u8>>, ApplyFailure> {
        self.sm.finish_batch(&mut writes);
        writes.ops_mut().push(state_put(self.group, StateKey::Apply, keys::encode_index_term(self.applied.index, self.applied.term).to_vec()));
        // Not synced: every applied entry is already durable in the log, so a crash that loses
        // this write re-applies from the log (the write carries its applied index).
        let (ops, notifications) = writes.into_parts();
        let index = self.applied.index;
        self.db.write_ops(&ops, false).map_err(|error| ApplyFailure { index, error })?;
        Ok(notifications)
    }

    /// Applies `entries` into `writes`, advancing the applied index in memory, and collects
    /// the replies of the commands this replica proposed.
    fn apply_entries(&mut self, entries: Vec<Entry>, writes: &mut SmWrites, replies: &mut Vec<ApplyReply>) -> Result<(), ApplyFailure> {
        for entry in entries {
            if entry.index <= self.applied.index {
                continue;
            }
            assert_eq!(entry.index, self.applied.index + 1, "group {}: apply gap", self.group);
            let failed = |error: StorageError| ApplyFailure { index: entry.index, error };
            // One output per command of the entry, in order; a batch entry's commands are
            // applied one by one into the same writes, so the entry applies whole or not at all.
            let mut outputs: Vec<ApplyOutput> = match entry.get_entry_type() {
                // Raft's own no-op, appended by each new leader.
                EntryType::EntryNormal if entry.data.is_empty() => vec![Ok(Vec::new())],
                // Every command of a batch sees the entry's index: none of the state machines
                // derives a unique value from it (revisions and ids are their own counters).
                EntryType::EntryNormal => entry_commands(&entry)
                    .map_err(failed)?
                    .into_iter()
                    .map(|command| self.sm.apply(entry.index, command, writes))
                    .collect::<Result<Vec<ApplyOutput>, StorageError>>()
                    .map_err(failed)?,
                // The empty EntryConfChangeV2 that leaves a joint configuration must be applied
                // too: the entry type is checked before any emptiness.
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => vec![self.apply_conf_change(&entry, writes).map_err(failed)?],
            };
            self.applied.index = entry.index;
            self.applied.term = entry.term;
            if let Some(proposal) = self.take_proposal(entry.index) {
                for waiter in proposal.waiters {
                    let result = if proposal.term != entry.term {
                        Err(EngineError::Dropped(format!("group {}: entry {} went to term {}", self.group, entry.index, entry.term)))
                    } else {
                        // Only the entry this replica proposed carries its index and term, so
                        // every position is there; each proposer takes its own output.
                        outputs.get_mut(waiter.position).map_or_else(
                            || {
                                let reason = format!("group {}: entry {} has no command {}", self.group, entry.index, waiter.position);
                                Err(EngineError::Unavailable { reason, outcome_unknown: true })
                            },
                            |output| std::mem::replace(output, Ok(Vec::new())),
                        )
                    };
                    replies.push((waiter.reply, result));
                }
            }
        }
        Ok(())
    }

    fn apply_conf_change(&mut self, entry: &Entry, writes: &mut SmWrites) -> Result<ApplyOutput, StorageError> {
        let corrupt = |e: protobuf::ProtobufError| StorageError::Corrupt(format!("conf change at {}: {e}", entry.index));
        let change: ConfChangeV2 = match entry.get_entry_type() {
            EntryType::EntryConfChange => ConfChange::parse_from_bytes(&entry.data).map_err(corrupt)?.into_v2(),
            _ => ConfChangeV2::parse_from_bytes(&entry.data).map_err(corrupt)?,
        };
        // The change that leaves a joint configuration (raft-rs proposes it itself, with no
        // context) always applies: its joint change passed the fence.
        let fence = if change.changes.is_empty() {
            None
        } else {
            match self.check_fence(&change) {
                Ok(fence) => fence,
                // Not applied as a configuration change, on every replica alike: raft-rs only
                // compares indexes to know whether a change is pending, so the group goes on
                // as if the entry were a no-op (the joint configuration it would have entered
                // is never entered, nor auto-left).
                Err(reason) => return Ok(Err(EngineError::ConfChangeFenced { group: self.group, reason })),
            }
        };
        let conf_state: ConfState = match self.raw.apply_conf_change(&change) {
            Ok(conf_state) => conf_state,
            // Every replica rejects the same committed change the same way.
            Err(error) => return Ok(Err(EngineError::Invalid(format!("conf change rejected: {error}")))),
        };
        writes.ops_mut().push(state_put(self.group, StateKey::ConfState, encode(&conf_state)));
        if let Some(term) = fence {
            self.raw.mut_store().raise_conf_fence(term, writes.ops_mut());
        }
        let me = self.raw.raft.id;
        let members = [&conf_state.voters, &conf_state.learners, &conf_state.voters_outgoing, &conf_state.learners_next];
        if !members.iter().any(|ids| ids.contains(&me)) {
            self.removed = true;
        }
        Ok(Ok(encode(&conf_state)))
    }

    /// Checks a change against the group's fence (`conf_fence.rs`), reading only replicated
    /// state (the fence and the configuration as of the entries applied), so every replica
    /// decides alike. Answers the term to raise the fence to (`None`: a change without a
    /// fence, as an earlier release wrote) or why the change is refused.
    fn check_fence(&self, change: &ConfChangeV2) -> Result<Option<u64>, String> {
        let fence = match super::conf_fence::ConfChangeFence::decode(&change.context) {
            Ok(Some(fence)) => fence,
            Ok(None) => return Ok(None),
            Err(error) => return Err(format!("unreadable fence: {error}")),
        };
        let applied = self.raw.store().conf_fence();
        if fence.term < applied {
            return Err(format!("placement term {} is below the group's fence {applied}", fence.term));
        }
        if !fence.expect_voters.is_empty() {
            let mut expected = fence.expect_voters;
            expected.sort_unstable();
            expected.dedup();
            let mut voters = self.raw.raft.prs().conf().to_conf_state().voters;
            voters.sort_unstable();
            if expected != voters {
                return Err(format!("the sender expects voters {expected:?}, the group has {voters:?}"));
            }
        }
        Ok(Some(fence.term))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch_of(commands: &[&[u8]]) -> CommandBatch {
        let mut batch = CommandBatch::default();
        for command in commands {
            let (reply, _) = oneshot::channel();
            batch.bytes += command.len();
            batch.commands.push(command.to_vec());
            batch.waiters.push((Instant::now(), reply));
        }
        batch
    }

    fn entry(context: Vec<u8>, data: Vec<u8>) -> Entry {
        Entry { index: 7, context: context.into(), data: data.into(), ..Entry::default() }
    }

    #[test]
    fn a_batch_entry_splits_into_its_commands_in_order() {
        let commands: [&[u8]; 3] = [b"first", BATCH_ENTRY_CONTEXT, &[0xff; 300]];
        let (context, data, waiters) = batch_of(&commands).into_entry();
        assert_eq!(context, BATCH_ENTRY_CONTEXT);
        assert_eq!(waiters.len(), 3);
        assert_eq!(entry_commands(&entry(context, data)).expect("decodes"), commands);
    }

    #[test]
    fn a_lone_command_is_written_as_before_batching() {
        let (context, data, _) = batch_of(&[b"alone"]).into_entry();
        assert!(context.is_empty());
        assert_eq!(data, b"alone");
    }

    #[test]
    fn an_entry_without_the_batch_context_is_one_command_whatever_its_bytes() {
        // Entries written before batching have an empty context: even data that would parse
        // as an envelope is one command.
        let (_, envelope, _) = batch_of(&[b"a", b"b"]).into_entry();
        assert_eq!(entry_commands(&entry(Vec::new(), envelope.clone())).expect("one command"), [&envelope[..]]);
    }

    /// A leader takes a command, then a message of a newer term makes it a follower before
    /// the round's end (a paused leader resuming: found by `tests/suite/crash_cycles.rs`). Proposing
    /// the batch then must answer "not leader" and append nothing, not forward the entry.
    #[test]
    fn a_batch_taken_by_a_leader_that_lost_leadership_in_the_round_is_refused_not_forwarded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = crate::storage::Db::open(dir.path()).expect("db");
        let config = NodeConfig::new(1, dir.path().to_path_buf());
        db.write_ops(&crate::storage::PeerStorage::bootstrap_ops(9, &[1]), true).expect("bootstrap");
        let mut replica = Replica::load(&config, db, 9, &crate::kv::KvFactory).expect("replica");
        replica.raw.campaign().expect("campaign");
        assert!(replica.is_leader(), "a single voter leads once it campaigns");
        let (reply, mut answer) = oneshot::channel();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        replica.propose(&config, Proposed::Command(crate::kv::put(b"k", b"v")), deadline, reply);
        assert!(answer.try_recv().is_err(), "the command waits in the round's batch");
        // A leader of a newer term (node 2) is heard before the round's end.
        let term = replica.raw.raft.term;
        replica.raw.raft.become_follower(term + 1, 2);
        let last_before = replica.raw.raft.raft_log.last_index();
        replica.propose_batch();
        assert_eq!(replica.raw.raft.raft_log.last_index(), last_before, "nothing appended");
        assert!(replica.raw.raft.msgs.is_empty(), "nothing forwarded to the new leader: {:?}", replica.raw.raft.msgs);
        assert!(matches!(answer.try_recv(), Ok(Err(EngineError::NotLeader { group: 9, leader_hint: _ }))), "the caller hears not-leader");
        assert!(replica.proposals.is_empty());
    }

    #[test]
    fn a_truncated_batch_entry_is_corrupt() {
        let (context, data, _) = batch_of(&[b"first", b"second"]).into_entry();
        for cut in [1, 3, 6] {
            let truncated = entry(context.clone(), data[..data.len() - cut].to_vec());
            assert!(matches!(entry_commands(&truncated), Err(StorageError::Corrupt(_))), "cut {cut}");
        }
    }
}
