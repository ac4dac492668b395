//! What the transport needs of the node it carries messages for, as traits: the transport is
//! a layer below the host loop and names none of its types. The host's `NodeHandle`
//! implements [`Inbox`]; the node's metrics implement [`TransportEvents`].

use raft::eraftpb::Message;
use raft::SnapshotStatus;

use crate::error::EngineError;

/// Where received raft messages, and the outcomes of sends raft-rs must hear of, go.
pub trait Inbox: Send + Sync + 'static {
    /// This node's id.
    fn node_id(&self) -> u64;

    /// Hands a raft message from the network to its group; refused (`Busy`) when the group's
    /// worker cannot take it now, `Stopped` when the node is stopping.
    fn deliver(&self, group: u64, message: Message) -> Result<(), EngineError>;

    /// Tells `group` that a message to `to` was lost (best effort: raft-rs also finds out by
    /// itself, later).
    fn report_unreachable(&self, group: u64, to: u64);

    /// Tells `group` how sending a snapshot to `to` ended. `Err` hands the status back when
    /// the group's worker cannot take it right now; the transport tries again (raft-rs sends
    /// that follower nothing more until it hears). `Ok` also when the node is stopping.
    fn try_report_snapshot(&self, group: u64, to: u64, status: SnapshotStatus) -> Result<(), SnapshotStatus>;
}

/// What the transport counts, for the node's metrics.
pub trait TransportEvents: Send + Sync + 'static {
    /// A snapshot this node sent: delivered (its bytes) or not.
    fn snapshot_sent(&self, delivered_bytes: Option<usize>);

    /// A snapshot sent to this node: taken (its bytes) or refused.
    fn snapshot_received(&self, taken_bytes: Option<usize>);

    /// A raft message to `peer` was dropped (its queue was full or its stream broken).
    fn message_dropped(&self, peer: u64);
}
