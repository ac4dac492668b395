//! Reads: linearizable reads batched behind one ReadIndex per group at a time, retried
//! when raft drops the request (it does so silently when no leader is known), and stale
//! reads from the applied state.

use std::time::Instant;

use raft::ReadState;

use super::msg::{ReadConsistency, Reply};
use super::replica::{InflightRead, ReadRequest, Replica};
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
            ReadConsistency::Linearizable if self.pending_reads() >= config.reads_per_group_max => {
                let _ = reply.send(Err(EngineError::busy(format!("group {}: too many reads waiting", self.group))));
            }
            ReadConsistency::Linearizable => self.queued_reads.push(ReadRequest { query, deadline, reply }),
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
                let _ = read.reply.send(self.sm.query(&read.query));
            }
        }
    }
}
