//! Typed errors of the engine. Callers (gRPC services, tests, benchmarks) match on these;
//! none of them is a bare string to be parsed.

/// A failure of the node's RocksDB or of data read back from it.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// RocksDB itself failed.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// A column family the node needs is missing (the directory is not a Warden store).
    #[error("column family {0} is missing")]
    MissingColumnFamily(&'static str),
    /// Bytes read from disk do not decode; the store is damaged.
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl From<StorageError> for raft::Error {
    fn from(error: StorageError) -> Self {
        raft::Error::Store(raft::StorageError::Other(Box::new(error)))
    }
}

/// Why a request to a group failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// This replica is not the leader; `leader_hint` names the node it believes leads.
    #[error("group {group}: not leader (hint: {leader_hint:?})")]
    NotLeader { group: u64, leader_hint: Option<u64> },
    /// The node hosts no replica of the group.
    #[error("group {0} is not hosted on this node")]
    GroupNotFound(u64),
    /// The request could not be served before its deadline or the node cannot take it now.
    /// `outcome_unknown` is true when a write may still be applied later.
    #[error("unavailable: {reason} (outcome unknown: {outcome_unknown})")]
    Unavailable { reason: String, outcome_unknown: bool },
    /// A write was definitely not applied (its log slot went to another entry); safe to retry.
    #[error("proposal dropped: {0}")]
    Dropped(String),
    /// The request is larger than the limit.
    #[error("request of {size_bytes} bytes exceeds the limit of {limit_bytes}")]
    TooLarge { size_bytes: usize, limit_bytes: usize },
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// raft-rs refused a configuration change (it appends an empty entry in its place), so
    /// the configuration did not change. Proposing it again may succeed once an earlier
    /// change has applied or a joint configuration has been left.
    #[error("group {group}: configuration change refused: {reason}")]
    ConfChangeRefused { group: u64, reason: String },
    /// The group's fence refused a configuration change (`host/conf_fence.rs`): its sender
    /// led placement at an older term than a change the group applied, or expected other
    /// voters. Final for that sender: proposing it again is refused again.
    #[error("group {group}: configuration change fenced off: {reason}")]
    ConfChangeFenced { group: u64, reason: String },
    /// The group already exists on this node.
    #[error("group {0} already exists on this node")]
    GroupExists(u64),
    /// The node is stopping or stopped and did not take the request (it never reached a
    /// worker, so nothing was proposed). A request taken before the stop is answered
    /// `Unavailable { outcome_unknown: true }` instead.
    #[error("node stopped")]
    Stopped,
    /// This node's replica of the group stopped applying it: its store failed while it
    /// applied a committed entry (`host/failed.rs`). The request did nothing here; another
    /// replica may serve it. A restart of the node applies the entry again.
    #[error("group {group}: this replica stopped applying the group: {reason}")]
    ReplicaFailed { group: u64, reason: String },
}

impl EngineError {
    /// An `Unavailable` error whose request never reached the log.
    pub fn busy(reason: impl Into<String>) -> Self {
        EngineError::Unavailable { reason: reason.into(), outcome_unknown: false }
    }

    /// True when retrying the same request elsewhere or later may succeed and cannot apply
    /// it twice (it was definitely not applied).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            EngineError::NotLeader { .. }
                | EngineError::Dropped(_)
                | EngineError::Unavailable { outcome_unknown: false, .. }
                | EngineError::ReplicaFailed { .. }
        )
    }
}
