//! The namespace's nodes as the client shows them, and the options of creating, deleting and
//! reading them.

use std::time::{Duration, SystemTime};

use crate::session::SessionId;

/// What kind of node a node is (ephemerality is [`Stat::ephemeral_owner`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// An ordinary node.
    Persistent,
    /// Removed with its last child.
    Container,
    /// Removed once its TTL passes without a change while it has no children.
    Ttl,
}

/// A node's metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Revision of the node's creation (for a lock waiter: its fencing token).
    pub create_revision: u64,
    /// Revision of the node's last data change.
    pub mod_revision: u64,
    /// Number of data changes (what compare-and-swap compares).
    pub version: u64,
    /// Number of child changes.
    pub cversion: u64,
    /// The session owning an ephemeral node; `None` for other nodes.
    pub ephemeral_owner: Option<SessionId>,
    /// Number of children.
    pub num_children: u64,
    /// Leader time at creation (informational).
    pub ctime: SystemTime,
    /// Leader time at the last data change (informational).
    pub mtime: SystemTime,
    /// Bytes of data.
    pub data_length: u64,
    /// The node's kind.
    pub kind: NodeKind,
    /// For TTL nodes, their TTL.
    pub ttl: Option<Duration>,
}

/// A node read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Its path.
    pub path: String,
    /// Its data.
    pub data: Vec<u8>,
    /// Its metadata.
    pub stat: Stat,
}

/// A node just created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// Its actual path (with the counter appended for sequential creates).
    pub path: String,
    /// Its metadata (`create_revision` is the revision of the create).
    pub stat: Stat,
}

/// What a created node is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CreateMode {
    /// An ordinary node.
    #[default]
    Persistent,
    /// Deleted when the session ends (expires or closes); cannot have children.
    Ephemeral(SessionId),
    /// Removed with its last child.
    Container,
    /// Removed once this long passes without a change while it has no children.
    Ttl(Duration),
}

/// How a node is created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// Persistent, ephemeral, container or TTL.
    pub mode: CreateMode,
    /// Append a 10-digit per-parent counter to the name (the actual path is in [`Created`]).
    pub sequential: bool,
    /// Create missing ancestors as persistent nodes.
    pub create_parents: bool,
}

impl CreateOptions {
    /// A persistent node (the default).
    pub fn persistent() -> CreateOptions {
        CreateOptions::default()
    }

    /// An ephemeral node of `session`.
    pub fn ephemeral(session: SessionId) -> CreateOptions {
        CreateOptions { mode: CreateMode::Ephemeral(session), ..CreateOptions::default() }
    }

    /// A container node.
    pub fn container() -> CreateOptions {
        CreateOptions { mode: CreateMode::Container, ..CreateOptions::default() }
    }

    /// A TTL node.
    pub fn ttl(ttl: Duration) -> CreateOptions {
        CreateOptions { mode: CreateMode::Ttl(ttl), ..CreateOptions::default() }
    }

    /// The same, sequential.
    pub fn sequential(self) -> CreateOptions {
        CreateOptions { sequential: true, ..self }
    }

    /// The same, creating missing ancestors.
    pub fn create_parents(self) -> CreateOptions {
        CreateOptions { create_parents: true, ..self }
    }
}

/// How a node is deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Delete only at this version ([`Error::BadVersion`](crate::Error::BadVersion) otherwise).
    pub expected_version: Option<u64>,
    /// Delete the whole subtree (else a node with children is
    /// [`Error::NotEmpty`](crate::Error::NotEmpty)).
    pub recursive: bool,
}

/// How reads are answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Consistency {
    /// Confirmed with the group's leader before answering: sees every write acknowledged
    /// before the read started.
    #[default]
    Linearizable,
    /// From whichever replica answers, as of its applied state (possibly behind).
    Stale,
}
