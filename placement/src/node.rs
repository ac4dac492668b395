//! Nodes: the machines that host shard-group replicas, as placement knows them.

use serde::{Deserialize, Serialize};

/// Longest node address accepted, in bytes.
pub const ADDR_BYTES_MAX: usize = 256;
/// Longest zone label accepted, in bytes.
pub const ZONE_BYTES_MAX: usize = 64;

/// A registered node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node id, which is also its raft peer id in every group it hosts (never 0).
    pub id: u64,
    /// Where routers and peers reach it (`host:port`).
    pub addr: String,
    /// Failure-domain label (rack, zone, region); replicas of a group are spread over zones.
    /// Empty means "no zone": all such nodes count as one zone.
    pub zone: String,
    /// Leader time (from the command) of the last heartbeat or registration.
    pub last_heartbeat_ms: u64,
    /// Whether the node is live: set by registration and heartbeats, cleared by `MarkDown`.
    pub up: bool,
    /// What the operator wants of it (independent of liveness): serving, being drained for
    /// maintenance, being decommissioned, or gone for good.
    #[serde(default)]
    pub state: NodeState,
}

/// A node's administrative state (PD's store states: up, offline, tombstone), set by
/// `warden admin drain|undrain|decommission`. Liveness (`NodeInfo::up`) is separate: a draining
/// node may be down, a serving one may be up or down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeState {
    /// Hosts replicas and leaders, and gets new ones.
    #[default]
    Serving,
    /// Maintenance: its leaders, then its replicas, are moved to other nodes while it keeps
    /// serving; it gets nothing new. `undrain` makes it `Serving` again (empty: balancing
    /// fills it).
    Draining,
    /// Drained like `Draining`, then made a `Tombstone` once it hosts nothing.
    Decommissioning,
    /// Removed for good: it hosts nothing, may not register or heartbeat again, and its id is
    /// never reused (the record stays so that it cannot be).
    Tombstone,
}

impl NodeState {
    /// Whether a node in this state may be given new replicas or leaders.
    pub fn takes_replicas(self) -> bool {
        self == NodeState::Serving
    }

    /// Whether the scheduler moves everything off a node in this state.
    pub fn is_emptying(self) -> bool {
        matches!(self, NodeState::Draining | NodeState::Decommissioning)
    }
}

/// Why a node's registration is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum NodeError {
    /// Id 0 is raft's "no peer".
    #[error("node id 0 is reserved")]
    ZeroId,
    /// No address.
    #[error("node address is empty")]
    EmptyAddr,
    /// Address longer than [`ADDR_BYTES_MAX`].
    #[error("node address is {0} bytes, limit {ADDR_BYTES_MAX}")]
    AddrTooLong(usize),
    /// Zone longer than [`ZONE_BYTES_MAX`].
    #[error("zone is {0} bytes, limit {ZONE_BYTES_MAX}")]
    ZoneTooLong(usize),
}

/// Checks the fields a node registers with.
pub(crate) fn validate_node(id: u64, addr: &str, zone: &str) -> Result<(), NodeError> {
    if id == 0 {
        return Err(NodeError::ZeroId);
    }
    if addr.is_empty() {
        return Err(NodeError::EmptyAddr);
    }
    if addr.len() > ADDR_BYTES_MAX {
        return Err(NodeError::AddrTooLong(addr.len()));
    }
    if zone.len() > ZONE_BYTES_MAX {
        return Err(NodeError::ZoneTooLong(zone.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_cases() {
        assert_eq!(validate_node(1, "h:1", ""), Ok(()));
        assert_eq!(validate_node(1, "h:1", "z"), Ok(()));
        assert_eq!(validate_node(0, "h:1", "z"), Err(NodeError::ZeroId));
        assert_eq!(validate_node(1, "", "z"), Err(NodeError::EmptyAddr));
        let addr = "a".repeat(ADDR_BYTES_MAX + 1);
        assert_eq!(validate_node(1, &addr, "z"), Err(NodeError::AddrTooLong(ADDR_BYTES_MAX + 1)));
        let zone = "z".repeat(ZONE_BYTES_MAX + 1);
        assert_eq!(validate_node(1, "h:1", &zone), Err(NodeError::ZoneTooLong(ZONE_BYTES_MAX + 1)));
    }
}
