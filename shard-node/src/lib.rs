//! Warden's shard-node: the multi-Raft engine.
//!
//! - [`storage`]: one RocksDB per node shared by all groups; `raft::Storage` with a tail cache.
//! - [`store_writer`]: group commit, one fsync for every group's pending writes.
//! - [`host`]: the host loop driving many `RawNode`s on a few threads.
//! - [`transport`]: one gRPC stream per peer node, batching messages of all groups.
//! - [`state_machine`]: what a group replicates: [`namespace`] (the coordination service's
//!   tree), and [`kv`], the engine's test state machine.
//! - [`group_links`]: calls from one group to another (sessions homed elsewhere).
//! - [`cluster`]: an in-process cluster with fault injection, for tests and benchmarks.
//! - [`log_limit`]: rate limits for operator log lines.

pub mod cluster;
pub mod config;
pub mod error;
pub mod group_links;
pub mod host;
pub mod kv;
pub mod log_limit;
pub mod metrics;
pub mod namespace;
pub mod node_services;
pub mod placement;
pub mod service;
pub mod state_machine;
pub mod storage;
pub mod store_writer;
pub mod transport;
pub mod watch;

pub use config::{FatalPolicy, NodeConfig};
pub use error::{EngineError, StorageError};
pub use host::conf_fence::ConfChangeFence;
pub use host::{GroupStatus, Node, NodeHandle, RaftMetricsSnapshot, ReadConsistency};
