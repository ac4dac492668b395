//! Handing a group's leadership to another replica, only to one able to take it.
//!
//! While a raft leader transfers its leadership it takes no proposals, until the target has
//! caught up and won the election or an election timeout has passed. A target that is cut
//! off or paused never catches up, so a transfer to it stops the group's writes for that
//! whole timeout — and a balancer that asks again every round keeps the group unwritable for
//! as long as the target stays silent. So the leader hands over only to a replica it heard
//! from within the last election timeout and whose log lags its own by at most
//! [`TRANSFER_LAG_ENTRIES_MAX`] entries; otherwise the transfer is refused as unavailable,
//! and nothing changes.

use std::time::{Duration, Instant};

use raft::StateRole;

use super::replica::Replica;
use crate::config::NodeConfig;
use crate::error::EngineError;

/// Log entries a target may lag the leader by and still be handed leadership (raft's
/// transfer first sends it what it lacks; TiKV's `leader_transfer_max_log_lag` is the same).
pub const TRANSFER_LAG_ENTRIES_MAX: u64 = 128;

/// Peers a replica remembers hearing from (a group has a handful of replicas; bounded all
/// the same, so a flood of messages naming other senders cannot grow it).
const HEARD_PEERS_MAX: usize = 16;

/// When each peer of a replica was last heard from (any raft message).
#[derive(Debug, Default)]
pub(crate) struct Heard {
    at: Vec<(u64, Instant)>,
}

impl Heard {
    /// `peer` was heard from at `now`.
    pub(crate) fn note(&mut self, peer: u64, now: Instant) {
        if let Some(entry) = self.at.iter_mut().find(|(id, _)| *id == peer) {
            entry.1 = now;
        } else if self.at.len() < HEARD_PEERS_MAX {
            self.at.push((peer, now));
        }
    }

    /// How long ago `peer` was last heard from (`None`: never, since this replica started).
    fn silent_for(&self, peer: u64, now: Instant) -> Option<Duration> {
        self.at.iter().find(|(id, _)| *id == peer).map(|(_, at)| now.saturating_duration_since(*at))
    }
}

impl Replica {
    /// Asks raft to hand leadership to `to`, if this replica leads and `to` can take it (see
    /// the module documentation); a follower passes the request on to its leader, as raft does.
    pub(crate) fn transfer_leader(&mut self, config: &NodeConfig, to: u64, now: Instant) -> Result<(), EngineError> {
        let raft = &self.raw.raft;
        if raft.state == StateRole::Leader && to != raft.id {
            let refuse = |why: String| EngineError::Unavailable {
                reason: format!("group {}: node {to} is not handed leadership: {why}", self.group),
                outcome_unknown: false,
            };
            let election_timeout = Duration::from_millis(config.tick_ms.saturating_mul(config.election_tick as u64));
            match self.heard.silent_for(to, now) {
                Some(silent) if silent <= election_timeout => {}
                Some(silent) => return Err(refuse(format!("not heard from for {silent:?}"))),
                None => return Err(refuse("never heard from".into())),
            }
            let matched = raft.prs().get(to).map(|progress| progress.matched).ok_or_else(|| refuse("not a replica of the group".into()))?;
            let lag = raft.raft_log.last_index().saturating_sub(matched);
            if lag > TRANSFER_LAG_ENTRIES_MAX {
                return Err(refuse(format!("its log lags by {lag} entries")));
            }
        }
        self.raw.transfer_leader(to);
        Ok(())
    }
}
