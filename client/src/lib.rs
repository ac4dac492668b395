//! Warden's Rust client library.
//!
//! - [`Client`]: connects to the routers (failing over between them), with a typed method per
//!   call of the public API and the retry rules of docs/concepts.md ("Client library"): reads and keepalives are
//!   retried until their deadline; a write is sent again only when the failure proves it was
//!   not applied, else the caller gets [`Error::OutcomeUnknown`].
//! - [`Session`]: a lease kept alive from its own task, with Chubby's states
//!   ([`SessionState`]: connected, jeopardy, safe, expired); ephemeral nodes
//!   ([`CreateOptions::ephemeral`]) and locks ([`LockGuard`], with fencing tokens) belong to one.
//! - [`Watcher`]: a watch of a node or subtree that resumes across broken streams and routers
//!   without losing or repeating an event.
//! - [`Txn`]: etcd-style transactions; [`Children`]: paginated listings.
//! - [`FenceGuard`]: what a *resource* keeps to refuse writes carrying stale fencing tokens.
//! - [`recipes`]: mutex, read-write lock, semaphore, leader election, group membership,
//!   barriers, counter and node cache.
//!
//! ```no_run
//! # async fn example() -> warden_client::Result<()> {
//! use std::time::Duration;
//! use warden_client::{Client, ClientConfig, CreateOptions, SessionConfig};
//!
//! let client = Client::connect(ClientConfig::new(["127.0.0.1:7100"])).await?;
//! client.create("/config/flag", b"on".to_vec(), &CreateOptions::persistent().create_parents()).await?;
//! let session = client.session(SessionConfig::new(Duration::from_secs(10))).await?;
//! let guard = session.lock("/locks/etl").await?;
//! // ... write to the resource with guard.fencing_token() ...
//! guard.unlock().await?;
//! session.close().await?;
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod children;
mod client;
mod config;
mod convert;
mod direct;
mod error;
mod fence;
mod lock;
mod node;
pub mod recipes;
mod renewal;
mod retry;
mod session;
mod txn;
mod watch;

pub use children::{Child, Children, ChildrenOptions, ChildrenPage};
pub use client::Client;
pub use config::{ClientConfig, SessionConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_GRACE_PERIOD, DEFAULT_REQUEST_TIMEOUT};
pub use error::{Error, Result};
pub use fence::{FenceGuard, StaleToken};
pub use lock::{LockGuard, LockInfo, LockMode, LockOptions, LockWaiter, Sequencer};
pub use node::{Consistency, CreateMode, CreateOptions, Created, DeleteOptions, Node, NodeKind, Stat};
pub use session::{Session, SessionId, SessionInfo, SessionLease, SessionState};
pub use txn::{Compare, CompareOp, CompareTarget, Txn, TxnOp, TxnOpResult, TxnResult};
/// TLS to the routers ([`ClientConfig::tls`]).
pub use warden_proto::tls::{Tls, TlsFiles};
pub use watch::{EventKind, EventKinds, WatchEvent, WatchOptions, Watcher};
