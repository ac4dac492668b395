//! Warden's shard-node: the node that runs on the engine (`warden-engine`) and the namespace
//! (`warden-namespace`).
//!
//! - [`node`]: [`Node::start`], the engine with its listeners: the raft transport, gRPC
//!   health and reflection, the services wired in, TLS, `/metrics`.
//! - [`node_services`]: the public API, placement and heartbeats, wired for a node.
//! - [`service`]: the public API's gRPC services (`warden.v1.Warden`, batch streams, session
//!   checks).
//! - [`placement`]: the placement group hosted on the nodes, its service and scheduler.
//! - [`group_links`]: calls from one group to another (sessions homed elsewhere).
//! - [`metrics`]: the node's namespace and watch metrics, beside the engine's.
//! - [`cluster`]: an in-process cluster with fault injection, for `warden dev`, `warden
//!   bench` and tests.
//!
//! Architecture invariant: the layers are crates, so the compiler enforces them: proto →
//! engine → namespace → this crate → the `warden` binary; nothing below imports what is
//! above it.

pub mod cluster;
pub mod group_links;
pub mod metrics;
pub mod node;
pub mod node_services;
pub mod placement;
pub mod service;

pub use node::{Listeners, Node};
