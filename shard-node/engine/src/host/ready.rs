//! Handling raft-rs `Ready`s asynchronously (raft-rs "async ready": `advance_append_async`
//! and `on_persist_ready`), so that the store writer can make many groups' writes durable
//! with one fsync while the host loop keeps stepping messages.

use raft::eraftpb::{Message, MessageType};
use raft::{SnapshotStatus, Storage as _};

use super::replica::{Replica, Unpersisted};
use crate::error::{EngineError, StorageError};
use crate::state_machine::SmReader;
use crate::storage::WriteOp;
use crate::transport::RaftSender;

/// The writes of one worker round, for every group it readied.
#[derive(Default)]
pub(crate) struct RoundWrites {
    pub ops: Vec<WriteOp>,
    pub entries: u64,
    pub readies: Vec<(u64, u64)>,
    /// Seconds each replica's apply took this round (observed by the worker).
    pub apply_seconds: Vec<f64>,
    /// Committed entries applied this round (counted by the worker).
    pub entries_applied: u64,
}

impl Replica {
    /// Handles this replica's ready, if it has one. The numbered steps follow the raft-rs
    /// host contract (DESIGN.md rule 2).
    pub(crate) fn handle_ready(&mut self, sender: &dyn RaftSender, round: &mut RoundWrites) -> Result<(), StorageError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        // 1. Messages raft allows before the write (a leader's appends and heartbeats) go now:
        //    the leader's fsync and its followers' run in parallel (raft thesis 10.2.1).
        self.send(sender, ready.take_messages());
        let mut ops = Vec::new();
        // 2. A snapshot replaces the log and the group's state-machine data. raft-rs gives no
        //    committed entries with it; the state machine reloads once the write is durable.
        let mut snapshot_index = None;
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            let index = snapshot.get_metadata().index;
            self.raw.mut_store().apply_snapshot(&snapshot, &mut ops)?;
            self.installing_snapshot = true;
            snapshot_index = Some(index);
            self.fail_proposals_covered_by_snapshot(index);
        }
        // 3. Apply committed entries. raft-rs hands out only entries this replica has already
        //    persisted, so applying before this ready's own write is safe.
        let committed = ready.take_committed_entries();
        let applying = (!committed.is_empty()).then(std::time::Instant::now);
        let applied = committed.len() as u64;
        let replies = match self.apply_committed(committed) {
            Ok(replies) => replies,
            Err(failure) => {
                // The rest of the ready is dropped with the replica, as a crash would drop it
                // (see `failed`): what earlier readies handed the store writer stays whole.
                self.failed = Some(failure);
                return Ok(());
            }
        };
        round.entries_applied += applied;
        if let Some(started) = applying {
            round.apply_seconds.push(started.elapsed().as_secs_f64());
        }
        self.maybe_compact(&mut ops)?;
        // 4. New entries and hard state: raft reads them from the storage's cache at once
        //    (required before `advance_append_async`); the store writer makes them durable.
        let entries = ready.take_entries();
        round.entries += entries.len() as u64;
        if let Some(first) = entries.first() {
            // Entries from `first` on replace what earlier, still unpersisted readies wrote
            // there: once those become durable, only the part before `first` is.
            for unpersisted in &mut self.unpersisted {
                unpersisted.last_index = unpersisted.last_index.min(first.index - 1);
            }
        }
        self.raw.mut_store().append(&entries, &mut ops);
        if let Some(hard_state) = ready.hs() {
            self.raw.mut_store().set_hard_state(hard_state, &mut ops);
        }
        // 5. Read indexes confirmed by a quorum.
        self.on_read_states(ready.take_read_states());
        // 6. Messages that promise durability (votes, append acks) wait for the write.
        let persisted_messages = ready.take_persisted_messages();
        let number = ready.number();
        let must_sync = ready.must_sync();
        self.raw.advance_append_async(ready);
        if must_sync || !self.unpersisted.is_empty() {
            // Even a ready without writes waits behind earlier ones: its messages may speak
            // for entries still in flight.
            let last_index = self.raw.store().last_index().unwrap_or_default();
            self.unpersisted.push_back(Unpersisted { number, messages: persisted_messages, last_index, snapshot_index });
            round.ops.append(&mut ops);
            round.readies.push((self.group, number));
        } else {
            // Nothing raft needs durable (at most a new commit index, which a restart can
            // relearn, or a compaction): write without an fsync and go on.
            if !ops.is_empty() {
                self.db.write_ops(&ops, false)?;
            }
            self.raw.on_persist_ready(number);
            self.send(sender, persisted_messages);
        }
        // 7. Tell raft how far apply got (drives flow control and auto-leave of joint configs).
        self.raw.advance_apply_to(self.applied.index);
        // 8. Leader-only state follows role changes (a new leader re-grants every lease).
        self.notice_leadership();
        // 9. Answer proposers and reads now that the apply write is done.
        for (reply, output) in replies {
            let _ = reply.send(output);
        }
        self.serve_confirmed_reads();
        Ok(())
    }

    /// The store writer made every ready up to `number` durable.
    pub(crate) fn on_persisted(&mut self, number: u64, sender: &dyn RaftSender) -> Result<(), StorageError> {
        let mut durable = Vec::new();
        while self.unpersisted.front().is_some_and(|u| u.number <= number) {
            durable.extend(self.unpersisted.pop_front());
        }
        self.raw.on_persist_ready(number);
        for unpersisted in durable {
            self.raw.mut_store().on_durable(unpersisted.last_index);
            self.send(sender, unpersisted.messages);
            if let Some(index) = unpersisted.snapshot_index {
                self.finish_snapshot(index)?;
            }
        }
        Ok(())
    }

    /// Drops applied log entries once there are more than `log_compact_entries`, keeping
    /// the newer half for followers that are only slightly behind.
    fn maybe_compact(&mut self, ops: &mut Vec<crate::storage::WriteOp>) -> Result<(), StorageError> {
        let truncated = self.raw.store().truncated_index();
        if self.installing_snapshot || self.applied.index.saturating_sub(truncated) <= self.log_compact_entries {
            return Ok(());
        }
        let compact_to = self.applied.index - self.log_compact_entries / 2;
        self.raw.mut_store().compact(compact_to, ops)
    }

    fn finish_snapshot(&mut self, index: u64) -> Result<(), StorageError> {
        let apply_state = self.raw.store().apply_state()?;
        assert_eq!(apply_state.index, index, "group {}: snapshot apply state", self.group);
        self.sm.reload(&SmReader::new(self.db.clone(), self.group), index)?;
        self.applied = apply_state;
        // The state jumped without applying entries, so no notification was made: wake every
        // waiting caller to look again.
        let keys: Vec<Vec<u8>> = self.awaiting.keys().cloned().collect();
        self.wake(keys);
        self.installing_snapshot = false;
        tracing::info!(node = self.raw.raft.id, group = self.group, index, "snapshot installed");
        self.raw.advance_apply_to(index);
        self.serve_confirmed_reads();
        Ok(())
    }

    fn fail_proposals_covered_by_snapshot(&mut self, index: u64) {
        let covered: Vec<u64> = self.proposals.range(..=index).map(|(i, _)| *i).collect();
        for i in covered {
            if let Some(proposal) = self.take_proposal(i) {
                for waiter in proposal.waiters {
                    let _ = waiter.reply.send(Err(EngineError::Unavailable {
                        reason: format!("group {}: entry {i} arrived inside a snapshot", self.group),
                        outcome_unknown: true,
                    }));
                }
            }
        }
    }

    /// Hands messages to the transport; one that cannot be queued is reported to raft, which
    /// then probes the peer instead of streaming to it.
    pub(crate) fn send(&mut self, sender: &dyn RaftSender, messages: Vec<Message>) {
        for message in messages {
            let (to, is_snapshot) = (message.to, message.get_msg_type() == MessageType::MsgSnapshot);
            if sender.send(self.group, message).is_err() {
                self.report_unreachable(to, is_snapshot);
            }
        }
    }

    /// Tells raft that a message to `to` was lost.
    pub(crate) fn report_unreachable(&mut self, to: u64, snapshot: bool) {
        self.raw.report_unreachable(to);
        if snapshot {
            self.raw.report_snapshot(to, SnapshotStatus::Failure);
        }
    }
}
