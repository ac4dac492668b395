//! The workspace's integration tests, in one test binary so the helpers in `support` and
//! the link against RocksDB are built once, not once per file. Each module is one area (its
//! own doc comment says what it proves); nextest runs every test in a process of its own and
//! selects by module path (`cargo nextest run --release --test suite locks::`).

mod support;

mod backup;
mod between_machines;
mod cli;
mod client;
mod client_dependencies;
mod crash_cycles;
mod deploy;
mod docs;
mod engine;
mod engine_faults;
mod etcd_api;
mod etcd_auth;
mod etcd_concurrency;
mod etcd_locks;
mod etcd_python;
mod etcdctl_vs_etcd;
mod fleet;
mod fleet_processes;
mod hibernation;
mod linearizability;
mod loadgen_smoke;
mod locks;
mod namespace_api;
mod operations;
mod placement;
mod processes;
mod python_client;
mod quota;
mod recipes;
mod router;
mod router_batch;
mod router_items;
mod security;
mod sessions;
mod sessions_across_groups;
mod split;
mod split_faults;
mod split_merge;
mod torture;
mod upgrade;
mod watch;
mod watch_items;
