//! Warden's multi-Raft engine: many raft groups hosted on one node, over one store.
//!
//! - [`storage`]: one RocksDB per node shared by all groups; `raft::Storage` with a tail cache.
//! - [`store_writer`]: group commit, one fsync for every group's pending writes.
//! - [`host`]: the host loop driving many `RawNode`s on a few threads ([`Engine`]).
//! - [`transport`]: one gRPC stream per peer node, batching messages of all groups; its
//!   server side is the engine's own wire (`RaftTransport`).
//! - [`state_machine`]: what a group replicates, the trait state machines plug in through;
//!   [`kv`] is the engine's own minimal state machine.
//! - [`leaders`]: who leads each hosted group, as the workers last saw it.
//! - [`metrics`]: the node's Prometheus registry and the engine's figures in it.
//! - [`log_limit`]: rate limits for operator log lines.
//! - [`wall_clock`]: the node's wall clock (the system's, plus an offset only tests set).
//!
//! Architecture invariant: the modules form layers; listed from the bottom, each imports only
//! modules listed before it: `error`, `log_limit`, `wall_clock`, `storage`, `config`, `state_machine`, `kv`,
//! `store_writer`, `transport`, `leaders`, `metrics`, `host`. The transport reaches the host loop only
//! through its [`transport::Inbox`] trait and the metrics through
//! [`transport::TransportEvents`]; the host loop wires them together at start.
//!
//! Architecture invariant: the engine knows nothing of what runs on it (the namespace,
//! watches, the public API, placement): they depend on this crate, never the other way,
//! and the compiler enforces it. The node crate (`warden-shard-node`) serves the engine's
//! transport and its own services on the node's listeners.

pub mod config;
pub mod error;
pub mod host;
pub mod kv;
pub mod leaders;
pub mod log_limit;
pub mod metrics;
pub mod state_machine;
pub mod storage;
pub mod store_writer;
pub mod transport;
pub mod wall_clock;

pub use config::{FatalPolicy, NodeConfig};
pub use error::{EngineError, StorageError};
pub use host::conf_fence::ConfChangeFence;
pub use host::{Engine, GroupStatus, NodeHandle, RaftMetricsSnapshot, ReadConsistency};
