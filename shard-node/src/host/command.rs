//! Writes: proposing commands and configuration changes, and applying committed entries.

use std::time::Instant;

use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, ConfState, Entry, EntryType};
use raft_proto::ConfChangeI;
use tokio::sync::oneshot;

use super::replica::{Proposal, Replica};
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

impl Replica {
    /// Proposes a command or configuration change; the reply comes when its entry applies.
    pub(crate) fn propose(&mut self, config: &NodeConfig, proposed: Proposed, deadline: Instant, reply: oneshot::Sender<ApplyOutput>) {
        if let Err(error) = self.check_proposal(config, &proposed) {
            let _ = reply.send(Err(error));
            return;
        }
        let last_before = self.raw.raft.raft_log.last_index();
        // A configuration change that only leaves a joint configuration (no changes).
        let conf_change_leaves = match &proposed {
            Proposed::ConfChange(change) => Some(change.changes.is_empty()),
            Proposed::Command(_) => None,
        };
        let result = match proposed {
            Proposed::Command(command) => self.raw.propose(Vec::new(), command),
            Proposed::ConfChange(change) => self.raw.propose_conf_change(Vec::new(), change),
        };
        let index = self.raw.raft.raft_log.last_index();
        match result {
            Err(error) => {
                let _ = reply.send(Err(EngineError::Dropped(format!("group {}: {error}", self.group))));
            }
            Ok(()) => {
                // raft-rs appends exactly one entry per accepted proposal.
                assert_eq!(index, last_before + 1, "proposal did not append one entry");
                if let Some(leaves) = conf_change_leaves.filter(|_| !self.appended_conf_change(index)) {
                    // raft-rs took the proposal but appended an empty normal entry in place of
                    // the change: the configuration will not change.
                    let reason = self.conf_change_refusal(leaves);
                    let _ = reply.send(Err(EngineError::ConfChangeRefused { group: self.group, reason }));
                    return;
                }
                self.proposals.insert(index, Proposal { term: self.raw.raft.term, deadline, reply });
            }
        }
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
            self.propose(config, Proposed::Command(command), Instant::now() + config.election_timeout(), reply);
        }
    }

    fn check_proposal(&self, config: &NodeConfig, proposed: &Proposed) -> Result<(), EngineError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        if self.proposals.len() >= config.proposals_per_group_max {
            return Err(EngineError::busy(format!("group {}: {} proposals waiting", self.group, self.proposals.len())));
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
    /// that the write is done.
    pub(crate) fn apply_committed(&mut self, entries: Vec<Entry>) -> Result<Vec<ApplyReply>, StorageError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        assert!(!self.installing_snapshot, "group {}: committed entries while installing a snapshot", self.group);
        let mut writes = SmWrites::new(self.group);
        let mut replies = Vec::new();
        for entry in entries {
            if entry.index <= self.applied.index {
                continue;
            }
            assert_eq!(entry.index, self.applied.index + 1, "group {}: apply gap", self.group);
            let output = match entry.get_entry_type() {
                // Raft's own no-op, appended by each new leader.
                EntryType::EntryNormal if entry.data.is_empty() => Ok(Vec::new()),
                EntryType::EntryNormal => self.sm.apply(entry.index, &entry.data, &mut writes),
                // The empty EntryConfChangeV2 that leaves a joint configuration must be applied
                // too: the entry type is checked before any emptiness.
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => self.apply_conf_change(&entry, &mut writes)?,
            };
            self.applied.index = entry.index;
            self.applied.term = entry.term;
            if let Some(proposal) = self.proposals.remove(&entry.index) {
                let result = if proposal.term == entry.term {
                    output
                } else {
                    Err(EngineError::Dropped(format!("group {}: entry {} went to term {}", self.group, entry.index, entry.term)))
                };
                replies.push((proposal.reply, result));
            }
        }
        writes.ops_mut().push(state_put(self.group, StateKey::Apply, keys::encode_index_term(self.applied.index, self.applied.term).to_vec()));
        // Not synced: every applied entry is already durable in the log, so a crash that loses
        // this write re-applies from the log (the write carries its applied index).
        let (ops, notifications) = writes.into_parts();
        self.db.write_ops(&ops, false)?;
        // Observers learn of the entries only now that their effects are in the store.
        self.sm.publish();
        self.wake(notifications);
        Ok(replies)
    }

    fn apply_conf_change(&mut self, entry: &Entry, writes: &mut SmWrites) -> Result<ApplyOutput, StorageError> {
        let corrupt = |e: protobuf::ProtobufError| StorageError::Corrupt(format!("conf change at {}: {e}", entry.index));
        let change: ConfChangeV2 = match entry.get_entry_type() {
            EntryType::EntryConfChange => ConfChange::parse_from_bytes(&entry.data).map_err(corrupt)?.into_v2(),
            _ => ConfChangeV2::parse_from_bytes(&entry.data).map_err(corrupt)?,
        };
        let conf_state: ConfState = match self.raw.apply_conf_change(&change) {
            Ok(conf_state) => conf_state,
            // Every replica rejects the same committed change the same way.
            Err(error) => return Ok(Err(EngineError::Invalid(format!("conf change rejected: {error}")))),
        };
        writes.ops_mut().push(state_put(self.group, StateKey::ConfState, encode(&conf_state)));
        let me = self.raw.raft.id;
        let members = [&conf_state.voters, &conf_state.learners, &conf_state.voters_outgoing, &conf_state.learners_next];
        if !members.iter().any(|ids| ids.contains(&me)) {
            self.removed = true;
        }
        Ok(Ok(encode(&conf_state)))
    }
}
