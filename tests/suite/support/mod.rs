//! Shared helpers of the integration tests. Each test binary uses a different subset.
#![allow(dead_code)]

pub mod api;
pub mod fleet;
pub mod history;
pub mod moving;
pub mod processes;
pub mod proxy;
pub mod routed;
pub mod watch;
pub mod workload;
