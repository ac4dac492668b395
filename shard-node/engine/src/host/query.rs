//! Reads: linearizable reads batched behind one ReadIndex per group at a time, retried
//! when raft drops the request (it does so silently when no leader is known), and stale
//! reads from the applied state. Leader-only requests (session keepalives) ride the same
//! rounds: a leader answers them only once a quorum confirmed it still leads.

use std::time::Instant;

use raft::ReadState;

use super::msg::{ReadConsistency, Reply};
use super::replica::{InflightRead, ReadKind, ReadRequest, Replica};
use crate::config::NodeConfig;
use crate::error::EngineError;

impl Replica {
    /// Takes a read: a stale one is answered now; a linearizable one waits for the next
    /// ReadIndex round.
    pub(crate) fn read(&mut self, config: &NodeConfig, query: Vec<u8>, consistency: ReadConsistency, deadline: Instant, reply: Reply<Vec<u8>>) {
        match consistency {
            ReadConsistency::Stale => {
                let _ = reply.send(self.sm.query(&query));
            }
            ReadConsistency::Linearizable => self.queue_read(config, ReadRequest { query, kind: ReadKind::Query, deadline, reply }),
        }
    }

    /// Queues a read for the next ReadIndex round, within the group's bound.
    pub(crate) fn queue_read(&mut self, config: &NodeConfig, read: ReadRequest) {
        if self.pending_reads() >= config.reads_per_group_max {
            let _ = read.reply.send(Err(EngineError::busy(format!("group {}: too many reads waiting", self.group))));
            return;
        }
        self.queued_reads.push(read);
    }

    /// Answers every waiting leader-only request `NotLeader` (this replica stopped leading),
    /// so its caller goes to the new leader at once instead of waiting for its deadline.
    pub(crate) fn fail_leader_calls(&mut self) {
        let not_leader = self.not_leader();
        let fail = |reads: &mut Vec<ReadRequest>| {
            let (calls, kept): (Vec<_>, Vec<_>) = std::mem::take(reads).into_iter().partition(|r| matches!(r.kind, ReadKind::LeaderCall(_)));
            *reads = kept;
            for call in calls {
                let _ = call.reply.send(Err(not_leader.clone()));
            }
        };
        fail(&mut self.queued_reads);
        if let Some(inflight) = &mut self.inflight_read {
            fail(&mut inflight.reads);
        }
        for (_, reads) in &mut self.confirmed_reads {
            fail(reads);
        }
    }

    fn pending_reads(&self) -> usize {
        let inflight = self.inflight_read.as_ref().map_or(0, |inflight| inflight.reads.len());
        let confirmed: usize = self.confirmed_reads.iter().map(|(_, reads)| reads.len()).sum();
        self.queued_reads.len() + inflight + confirmed
    }

    /// Asks raft for one read index covering every read queued since the last request.
    /// One request at a time per group: reads that arrive meanwhile share the next one.
    pub(crate) fn issue_read_index(&mut self, tick: u64, next_ctx: &mut u64) {
        if self.queued_reads.is_empty() || self.inflight_read.is_some() {
            return;
        }
        let ctx = *next_ctx;
        *next_ctx += 1;
        self.raw.read_index(ctx.to_be_bytes().to_vec());
        let reads = std::mem::take(&mut self.queued_reads);
        self.inflight_read = Some(InflightRead { ctx, issued_tick: tick, reads });
    }

    /// Asks again for a read index raft has not answered within an election timeout.
    pub(crate) fn retry_read_index(&mut self, tick: u64, retry_ticks: u64) {
        let Some(inflight) = &mut self.inflight_read else { return };
        if tick.saturating_sub(inflight.issued_tick) < retry_ticks {
            return;
        }
        inflight.issued_tick = tick;
        let ctx = inflight.ctx.to_be_bytes().to_vec();
        self.raw.read_index(ctx);
    }

    /// Records read indexes raft confirmed.
    pub(crate) fn on_read_states(&mut self, states: Vec<ReadState>) {
        for state in states {
            let ctx = state.request_ctx.as_slice().try_into().ok().map(u64::from_be_bytes);
            match &self.inflight_read {
                Some(inflight) if Some(inflight.ctx) == ctx => {
                    if let Some(inflight) = self.inflight_read.take() {
                        self.confirmed_reads.push_back((state.index, inflight.reads));
                    }
                }
                // A late answer to a request already answered (after a retry): nothing waits on it.
                _ => {}
            }
        }
    }

    /// Answers confirmed reads whose read index has been applied.
    pub(crate) fn serve_confirmed_reads(&mut self) {
        if self.installing_snapshot {
            return;
        }
        while self.confirmed_reads.front().is_some_and(|(index, _)| *index <= self.applied.index) {
            let Some((_, reads)) = self.confirmed_reads.pop_front() else { break };
            for read in reads {
                let answer = match read.kind {
                    ReadKind::Query => self.sm.query(&read.query),
                    ReadKind::LeaderCall(arrived) => self.answer_leader_call(&read.query, arrived),
                };
                let _ = read.reply.send(answer);
            }
        }
    }
}
