//! etcd-style transactions: if every compare holds, run the `then` operations, else the
//! `else` ones; atomically, at one revision, in one group.
//!
//! ```
//! use warden_client::{Compare, CompareOp, Txn, TxnOp};
//! // Move a token from /a to /b only if /a is still at version 3.
//! let txn = Txn::new()
//!     .when(Compare::version("/a", CompareOp::Equal, 3))
//!     .then(TxnOp::delete("/a", Default::default()))
//!     .then(TxnOp::create("/b", b"token".to_vec(), Default::default()))
//!     .or_else(TxnOp::get("/a"));
//! # let _ = txn;
//! ```

use crate::node::{CreateOptions, Created, DeleteOptions, Node, Stat};

/// How a compare relates the node's field to the given value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// field == value
    Equal,
    /// field != value
    NotEqual,
    /// field < value
    Less,
    /// field > value
    Greater,
}

/// What a compare looks at. A missing node has version 0, revisions 0 and an empty value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    /// The node's version.
    Version(CompareOp, u64),
    /// The node's create revision (`Equal 0`: the node does not exist).
    CreateRevision(CompareOp, u64),
    /// The node's last modification revision.
    ModRevision(CompareOp, u64),
    /// The node's data, compared bytewise.
    Value(CompareOp, Vec<u8>),
    /// Whether the node exists (`true`) or not (`false`).
    Exists(bool),
}

/// One condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    /// The node compared.
    pub path: String,
    /// What is compared.
    pub target: CompareTarget,
}

impl Compare {
    /// Compares the node's version.
    pub fn version(path: impl Into<String>, op: CompareOp, version: u64) -> Compare {
        Compare { path: path.into(), target: CompareTarget::Version(op, version) }
    }

    /// Compares the node's create revision.
    pub fn create_revision(path: impl Into<String>, op: CompareOp, revision: u64) -> Compare {
        Compare { path: path.into(), target: CompareTarget::CreateRevision(op, revision) }
    }

    /// Compares the node's last modification revision.
    pub fn mod_revision(path: impl Into<String>, op: CompareOp, revision: u64) -> Compare {
        Compare { path: path.into(), target: CompareTarget::ModRevision(op, revision) }
    }

    /// Compares the node's data.
    pub fn value(path: impl Into<String>, op: CompareOp, value: impl Into<Vec<u8>>) -> Compare {
        Compare { path: path.into(), target: CompareTarget::Value(op, value.into()) }
    }

    /// Holds when the node exists (`exists = true`) or when it does not (`false`).
    pub fn exists(path: impl Into<String>, exists: bool) -> Compare {
        Compare { path: path.into(), target: CompareTarget::Exists(exists) }
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    /// Creates a node.
    Create {
        /// The node (the parent, for sequential creates).
        path: String,
        /// Its data.
        data: Vec<u8>,
        /// How it is created.
        options: CreateOptions,
    },
    /// Replaces a node's data.
    Set {
        /// The node.
        path: String,
        /// Its new data.
        data: Vec<u8>,
        /// Only at this version.
        expected_version: Option<u64>,
    },
    /// Deletes a node.
    Delete {
        /// The node.
        path: String,
        /// Version check and recursion.
        options: DeleteOptions,
    },
    /// Reads a node (a missing node reads as nothing, not as an error).
    Get {
        /// The node.
        path: String,
    },
}

impl TxnOp {
    /// A create.
    pub fn create(path: impl Into<String>, data: impl Into<Vec<u8>>, options: CreateOptions) -> TxnOp {
        TxnOp::Create { path: path.into(), data: data.into(), options }
    }

    /// A set, at `expected_version` when given.
    pub fn set(path: impl Into<String>, data: impl Into<Vec<u8>>, expected_version: Option<u64>) -> TxnOp {
        TxnOp::Set { path: path.into(), data: data.into(), expected_version }
    }

    /// A delete.
    pub fn delete(path: impl Into<String>, options: DeleteOptions) -> TxnOp {
        TxnOp::Delete { path: path.into(), options }
    }

    /// A read.
    pub fn get(path: impl Into<String>) -> TxnOp {
        TxnOp::Get { path: path.into() }
    }

    /// The path the operation is about.
    pub fn path(&self) -> &str {
        match self {
            TxnOp::Create { path, .. } | TxnOp::Set { path, .. } | TxnOp::Delete { path, .. } | TxnOp::Get { path } => path,
        }
    }
}

/// A transaction being built. Every path must be served by one group (else
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument)); at most 128 operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    /// The conditions, all of which must hold for `then` to run.
    pub compares: Vec<Compare>,
    /// Run when every compare holds.
    pub then: Vec<TxnOp>,
    /// Run otherwise.
    pub otherwise: Vec<TxnOp>,
}

impl Txn {
    /// An empty transaction (no compares: `then` runs).
    pub fn new() -> Txn {
        Txn::default()
    }

    /// Adds a condition.
    pub fn when(mut self, compare: Compare) -> Txn {
        self.compares.push(compare);
        self
    }

    /// Adds an operation run when every condition holds.
    pub fn then(mut self, op: TxnOp) -> Txn {
        self.then.push(op);
        self
    }

    /// Adds an operation run when a condition fails.
    pub fn or_else(mut self, op: TxnOp) -> Txn {
        self.otherwise.push(op);
        self
    }
}

/// The result of one operation of the branch that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOpResult {
    /// A create's node.
    Created(Created),
    /// A set's new metadata.
    Set(Stat),
    /// A delete's count of deleted nodes.
    Deleted(u64),
    /// A read's node, `None` when it does not exist.
    Got(Option<Node>),
}

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether every compare held (so `then` ran, not `else`).
    pub succeeded: bool,
    /// The group's revision after the transaction (unchanged by read-only or failed ones).
    pub revision: u64,
    /// One result per operation of the branch that ran, in order.
    pub results: Vec<TxnOpResult>,
}
