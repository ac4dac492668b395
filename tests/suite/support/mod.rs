//! Helpers shared by the integration tests: clusters with the namespace API, child processes
//! in process groups of their own, fleets of processes, histories and their checks, routed
//! clusters, watch streams, workloads, and etcd's concurrency recipes ported to Rust.

pub mod api;
pub mod child;
pub mod etcd_concurrency;
pub mod etcdctl;
pub mod fleet;
pub mod history;
pub mod moving;
pub mod processes;
pub mod proxy;
pub mod routed;
pub mod watch;
pub mod workload;
