//! What only Warden's servers (nodes, routers, the `warden` binary) need, kept out of
//! `warden-proto` so that the client library's dependency tree carries no HTTP server,
//! metrics exporter or certificate generator:
//!
//! - [`metrics`]: the Prometheus registry helpers and the `GET /metrics` endpoint (axum).
//! - [`authority`]: the small certificate authority of `warden dev --secure`, `warden admin
//!   certs` and the tests (rcgen).
//!
//! Certificates' identities are read by `warden_proto::tls` (both ends of a link need them).

pub mod authority;
pub mod metrics;
