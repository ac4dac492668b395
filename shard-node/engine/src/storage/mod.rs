//! Storage: the node's one RocksDB (column families, key layout), one group's
//! `raft::Storage` with its tail cache, and group snapshots.

pub mod db;
pub mod keys;
pub mod peer_storage;
pub mod snapshot;

pub use db::{Cf, Db, WriteOp};
pub use peer_storage::{ApplyState, PeerStorage, StorageLimits, INIT_INDEX};
