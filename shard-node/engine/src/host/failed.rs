//! A replica that could not apply a committed entry of its group stops applying it.
//!
//! Why: an entry that applied on the other replicas but not here (a block that fails its
//! checksum, an I/O error) cannot be skipped. Marking it applied would leave this replica's
//! state diverged from theirs for good, and a replica that later led, served reads or sent
//! snapshots would spread the divergence: an acknowledged write gone. The failure is not
//! the command's (a command every replica refuses alike is an output and applies:
//! `StateMachine::apply`), and it may be this node's alone, so it is fatal for this
//! replica, not for the group, nor for the node's other groups.
//!
//! What a failed replica does: nothing, as a replica on a dead node. Its `RawNode` and
//! state machine are dropped where the apply failed, so it neither ticks nor steps: it
//! does not vote, campaign, ack appends, lead, serve reads or send snapshots, and nothing of
//! the failed batch reaches its store (the apply write is all or nothing). Raft's safety
//! does not depend on any one replica taking part, so the group goes on with the others as
//! long as they are a quorum; a replica that kept acking appends on a store that just failed
//! would count towards commits it may not hold. What it keeps: its status as it was (its
//! applied index is the one in the store, before the entry) and the reason, for `warden
//! status` and the metrics; every request for the group is answered `ReplicaFailed`
//! (retryable elsewhere). A restart of the node loads the replica from its store and applies
//! the entry again from the last applied index it persisted, so a transient failure heals.

use std::fmt;

use super::msg::{GroupStatus, WorkerMsg};
use super::replica::Replica;
use crate::error::{EngineError, StorageError};

/// Why a replica could not apply its committed entries.
#[derive(Debug)]
pub(crate) struct ApplyFailure {
    /// The entry that could not be applied (or the last of a batch whose write failed).
    pub index: u64,
    pub error: StorageError,
}

impl fmt::Display for ApplyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not apply entry {}: {}", self.index, self.error)
    }
}

/// What is left of a replica that stopped applying its group.
pub(crate) struct FailedReplica {
    /// The replica's last status, with the reason it failed.
    status: GroupStatus,
}

impl FailedReplica {
    /// Stops `replica`, which could not apply its entries (`failure`): its waiting requests
    /// fail, and its raft state and state machine go.
    pub(crate) fn stop(mut replica: Replica, failure: &ApplyFailure) -> FailedReplica {
        let reason = failure.to_string();
        let (group, node) = (replica.group, replica.raw.raft.id);
        tracing::error!(
            group,
            node,
            applied = replica.applied.index,
            %reason,
            "this replica stopped applying its group; the node's other groups go on. Restart the node to apply the entry again"
        );
        replica.fail_all(&EngineError::ReplicaFailed { group, reason: reason.clone() });
        let status = GroupStatus { is_leader: false, leader_id: 0, asleep: false, progress: Vec::new(), failure: Some(reason), ..replica.status() };
        FailedReplica { status }
    }

    fn error(&self) -> EngineError {
        EngineError::ReplicaFailed { group: self.status.group, reason: self.status.failure.clone().unwrap_or_default() }
    }

    /// Answers a message for the failed replica's group: its status, an error for every
    /// request, nothing for raft's messages and notices (a dead replica hears nothing).
    pub(crate) fn answer(&self, message: WorkerMsg) {
        match message {
            WorkerMsg::Raft { .. } | WorkerMsg::Unreachable { .. } | WorkerMsg::SnapshotStatus { .. } => {}
            WorkerMsg::Status { reply, .. } => drop(reply.send(Ok(self.status.clone()))),
            WorkerMsg::Propose { reply, .. }
            | WorkerMsg::ConfChange { reply, .. }
            | WorkerMsg::Read { reply, .. }
            | WorkerMsg::LeaderCall { reply, .. } => drop(reply.send(Err(self.error()))),
            WorkerMsg::TransferLeader { reply, .. } | WorkerMsg::Campaign { reply, .. } | WorkerMsg::Await { reply, .. } => {
                drop(reply.send(Err(self.error())))
            }
            // Its records are still in the store: a new replica must not be written over them.
            WorkerMsg::CreateGroup { group, reply, .. } => drop(reply.send(Err(EngineError::GroupExists(group)))),
            // Its writes may still be with the store writer: destroyed once loaded again.
            WorkerMsg::DestroyGroup { reply, .. } => drop(reply.send(Err(self.error()))),
        }
    }
}
