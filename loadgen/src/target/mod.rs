//! The systems a workload runs against, behind one interface: Warden (through its routers),
//! etcd (`etcd-client`) and ZooKeeper (`zookeeper-client`). A workload is written once against
//! [`Connection`]; each target says what each operation means on its system, so "the same
//! workload" is the same sequence of calls everywhere. Differences are documented on each
//! method and in the target's module.
//!
//! Architecture invariant: nothing here knows about scheduling, histograms or reports; a
//! target only performs one operation when asked and says how it went.

pub mod etcd;
pub mod warden;
pub mod zookeeper;

use std::future::Future;
use std::time::Duration;

/// Which system to drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// Warden, through its routers.
    Warden,
    /// etcd v3, through its gRPC API.
    Etcd,
    /// ZooKeeper, through its native protocol.
    Zookeeper,
}

impl TargetKind {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            TargetKind::Warden => "warden",
            TargetKind::Etcd => "etcd",
            TargetKind::Zookeeper => "zookeeper",
        }
    }

    /// The endpoint of a local default installation.
    pub fn default_endpoint(self) -> &'static str {
        match self {
            TargetKind::Warden => "127.0.0.1:7100",
            TargetKind::Etcd => "127.0.0.1:2379",
            TargetKind::Zookeeper => "127.0.0.1:2181",
        }
    }
}

/// How a read is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadConsistency {
    /// Linearizable: Warden's ReadIndex read, etcd's default range, ZooKeeper's `sync` then
    /// `getData` (ZooKeeper reads are otherwise served from the connected server's state).
    Linearizable,
    /// Possibly stale: Warden's stale read, etcd's serializable range, ZooKeeper's plain
    /// `getData`.
    Stale,
}

/// Why one operation failed, grouped by `kind` in the report.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct OpError {
    /// A short, stable name for the kind of failure (`timeout`, `unavailable`,
    /// `compare_failed`, `not_found`, `exists`, `session_expired`, `unsupported`, `other`, or
    /// a target's own code name); reports count errors by it.
    pub kind: &'static str,
    /// What the system said.
    pub message: String,
}

impl OpError {
    /// An error of `kind` with `message`.
    pub fn new(kind: &'static str, message: impl Into<String>) -> OpError {
        OpError { kind, message: message.into() }
    }

    /// The target cannot perform this operation at all (the workload is skipped).
    pub fn unsupported(message: impl Into<String>) -> OpError {
        OpError::new(UNSUPPORTED, message)
    }
}

/// `operation`, failed with kind `timeout` when it has not finished within `timeout`: the
/// deadline of the targets whose client library has no per-request deadline of its own
/// (dropping the pending call abandons it).
pub(crate) async fn within<T>(timeout: Duration, operation: impl Future<Output = Result<T, OpError>>) -> Result<T, OpError> {
    match tokio::time::timeout(timeout, operation).await {
        Ok(result) => result,
        Err(_) => Err(OpError::new("timeout", format!("no answer within {timeout:?}"))),
    }
}

/// The [`OpError::kind`] of an operation a target does not have.
pub const UNSUPPORTED: &str = "unsupported";

/// One change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// The key (path) changed.
    pub key: String,
    /// Its value after the change (empty for a deletion).
    pub value: Vec<u8>,
}

/// Events of one watch, in order; the watch ends when the sender is dropped. Bounded:
/// [`WATCH_EVENTS_BUFFERED_MAX`].
pub type WatchEvents = tokio::sync::mpsc::Receiver<Result<WatchEvent, OpError>>;

/// Events a watch buffers before the target's reader waits for the workload to take them.
pub const WATCH_EVENTS_BUFFERED_MAX: usize = 4096;

/// Where and how a target connects: what every connection of a run shares.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// `host:port` of the system's servers (Warden: routers).
    pub endpoints: Vec<String>,
    /// Warden: node addresses for direct calls (empty: through the routers only).
    pub nodes: Vec<String>,
    /// Connections shared by the clients: client `i` uses connection `i % conns`.
    pub conns: usize,
    /// Lease of the sessions opened by [`Connection::open_session`].
    pub session_ttl: Duration,
    /// Deadline of one operation.
    pub request_timeout: Duration,
}

/// A system under load: makes one [`Connection`] per client.
pub trait Target: Send + Sync + 'static {
    /// A client's handle.
    type Connection: Connection;

    /// The handle of client `index` (sharing the target's connection `index % conns` where
    /// the system allows; ZooKeeper sessions are per connection, so session workloads get
    /// one connection per client).
    fn connect(&self, index: usize, needs_own_session: bool) -> impl Future<Output = Result<Self::Connection, OpError>> + Send;
}

/// One client's handle on a system. Owned by one task: calls never overlap.
pub trait Connection: Send + 'static {
    /// Makes `key` exist with `value`, creating missing parents (setup of the key space, not
    /// measured).
    fn upsert(&mut self, key: &str, value: &[u8]) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Overwrites an existing `key` with `value` (Warden `Set`, etcd `Put`, ZooKeeper
    /// `setData` with any version).
    fn put(&mut self, key: &str, value: &[u8]) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Reads `key` (its value must exist).
    fn get(&mut self, key: &str, consistency: ReadConsistency) -> impl Future<Output = Result<(), OpError>> + Send;

    /// The token a [`Connection::compare_and_set`] of `key` compares: Warden's node version,
    /// etcd's `mod_revision`, ZooKeeper's data version.
    fn cas_token(&mut self, key: &str) -> impl Future<Output = Result<u64, OpError>> + Send;

    /// One transaction: if `key`'s token is still `token`, set `value`. `Ok(Some(new token))`
    /// when it was set, `Ok(None)` when the compare failed (Warden `Txn`, etcd `Txn`,
    /// ZooKeeper `multi(check, setData)`).
    fn compare_and_set(&mut self, key: &str, token: u64, value: &[u8]) -> impl Future<Output = Result<Option<u64>, OpError>> + Send;

    /// Creates `key` (its parent exists, it does not).
    fn create(&mut self, key: &str, value: &[u8]) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Deletes `key` (it exists).
    fn delete(&mut self, key: &str) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Opens this client's session with the options' TTL and keeps it alive in the
    /// background (Warden session, etcd lease + `LeaseKeepAlive`, ZooKeeper session).
    fn open_session(&mut self) -> impl Future<Output = Result<(), OpError>> + Send;

    /// One explicit keep-alive round trip of the open session (Warden `KeepAlive`, etcd one
    /// `LeaseKeepAlive` request and its response). ZooKeeper has no such call (the client
    /// library pings on its own): [`UNSUPPORTED`].
    fn keep_alive(&mut self) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Acquires the exclusive lock `path` with the open session, waiting in its queue
    /// (Warden `Lock`, etcd's `Lock` service with the session's lease, ZooKeeper Curator's
    /// recipe: an ephemeral-sequential node and a watch on its predecessor).
    fn lock(&mut self, path: &str) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Releases the lock `path` held by [`Connection::lock`].
    fn unlock(&mut self, path: &str) -> impl Future<Output = Result<(), OpError>> + Send;

    /// Watches every key below `prefix` (recursive) from now on.
    fn watch(&mut self, prefix: &str) -> impl Future<Output = Result<WatchEvents, OpError>> + Send;

    /// Campaigns in the election `path` with the open session, as `candidate`; returns when
    /// this client leads (Warden's election recipe, etcd's `Election.Campaign`, ZooKeeper's
    /// ephemeral-sequential candidates with predecessor watches).
    fn campaign(&mut self, path: &str, candidate: &str) -> impl Future<Output = Result<(), OpError>> + Send;
}
