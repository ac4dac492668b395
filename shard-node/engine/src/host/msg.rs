//! Every message a host-loop worker receives, defined in one place.

use std::time::Instant;

use raft::eraftpb::{ConfChangeV2, Message};
use tokio::sync::oneshot;

use crate::error::EngineError;
use crate::state_machine::ApplyOutput;

/// Reply channel of a request answered by a worker.
pub type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// How fresh a read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadConsistency {
    /// Linearizable: served after a ReadIndex round confirms the leader's commit index.
    Linearizable,
    /// From this replica's applied state, however far behind it is.
    Stale,
}

/// A message for a worker.
pub enum WorkerMsg {
    /// A raft message from a peer node.
    Raft { group: u64, message: Box<Message> },
    /// Propose a command; answered with the state machine's output once applied.
    Propose { group: u64, command: Vec<u8>, deadline: Instant, reply: oneshot::Sender<ApplyOutput> },
    /// Answer a query from the state machine.
    Read { group: u64, query: Vec<u8>, consistency: ReadConsistency, deadline: Instant, reply: Reply<Vec<u8>> },
    /// Propose a configuration change; answered with the encoded new `ConfState` once applied.
    ConfChange { group: u64, change: ConfChangeV2, deadline: Instant, reply: oneshot::Sender<ApplyOutput> },
    /// Ask the leader to hand leadership to `to`.
    TransferLeader { group: u64, to: u64, reply: Reply<()> },
    /// Start campaigning now (used to speed up bootstrap).
    Campaign { group: u64, reply: Reply<()> },
    /// Create a replica; `voters` empty creates an uninitialized replica that waits for a
    /// snapshot.
    CreateGroup { group: u64, voters: Vec<u64>, reply: Reply<()> },
    /// Destroy the replica: placement no longer has its group (removed, or its creation
    /// rolled back), so no member is left to tell it it was removed.
    DestroyGroup { group: u64, reply: Reply<()> },
    /// The transport could not deliver a message of `group` to `to` (snapshots report
    /// their outcome with `SnapshotStatus`).
    Unreachable { group: u64, to: u64 },
    /// How sending a snapshot of `group` to `to` ended (raft-rs sends that follower nothing
    /// more until it hears).
    SnapshotStatus { group: u64, to: u64, status: raft::SnapshotStatus },
    /// Report the group's raft status.
    Status { group: u64, reply: Reply<GroupStatus> },
    /// Wake `reply` when apply notifies `key` (see `SmWrites::notify`), or fail it at
    /// `deadline`.
    Await { group: u64, key: Vec<u8>, deadline: Instant, reply: Reply<()> },
    /// A request the leader answers from its own memory (see `StateMachine::leader_call`),
    /// once a ReadIndex round confirmed it still leads, or fails at `deadline`.
    LeaderCall { group: u64, request: Vec<u8>, deadline: Instant, reply: Reply<Vec<u8>> },
}

impl WorkerMsg {
    /// The group the message is for.
    pub fn group(&self) -> u64 {
        match self {
            WorkerMsg::Raft { group, .. }
            | WorkerMsg::Propose { group, .. }
            | WorkerMsg::Read { group, .. }
            | WorkerMsg::ConfChange { group, .. }
            | WorkerMsg::TransferLeader { group, .. }
            | WorkerMsg::Campaign { group, .. }
            | WorkerMsg::CreateGroup { group, .. }
            | WorkerMsg::DestroyGroup { group, .. }
            | WorkerMsg::Unreachable { group, .. }
            | WorkerMsg::SnapshotStatus { group, .. }
            | WorkerMsg::Status { group, .. }
            | WorkerMsg::Await { group, .. }
            | WorkerMsg::LeaderCall { group, .. } => *group,
        }
    }
}

/// A replica's view of its group.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GroupStatus {
    /// The group.
    pub group: u64,
    /// This node.
    pub node_id: u64,
    /// Current term.
    pub term: u64,
    /// The node this replica voted for in `term` (0: none).
    pub vote: u64,
    /// Leader this replica knows of (0: none).
    pub leader_id: u64,
    /// True when this replica leads.
    pub is_leader: bool,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// First index still in the log.
    pub first_index: u64,
    /// Last index in the log.
    pub last_index: u64,
    /// Voters (incoming configuration).
    pub voters: Vec<u64>,
    /// Learners.
    pub learners: Vec<u64>,
    /// The highest placement term of the configuration changes applied (`conf_fence.rs`).
    pub conf_fence: u64,
    /// True while this replica hibernates (neither ticks nor heartbeats; `host/hibernate.rs`).
    pub asleep: bool,
    /// The leader's view of each replica (empty on a follower).
    pub progress: Vec<PeerProgress>,
    /// Why this replica stopped applying its group (`host/failed.rs`); `None` while it
    /// applies. A failed replica's other fields are as they were when it stopped.
    pub failure: Option<String>,
}

/// What a leader knows of one replica of its group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PeerProgress {
    /// The replica's node.
    pub id: u64,
    /// The highest log index known to match the leader's.
    pub matched: u64,
    /// Heard from within the last election timeout (check-quorum's judgement).
    pub recent_active: bool,
}
