//! Warden's fault harness across machines, in the manner of Jepsen and etcd's robustness
//! tests: real node and router processes, each on a test host of its own (a network
//! namespace with its own address on a bridge), and faults between them made by the kernel's
//! own network stack.
//!
//! - [`hosts`]: the test hosts and their network; made and removed by the harness, and what a
//!   run that died left behind is swept by the next.
//! - [`links`]: partitions — one-way cuts, both-way partitions between sets of hosts, a host
//!   isolated from everything, healing.
//! - [`impair`]: impaired links — delay, jitter (and so reordering) and loss, one way, on new
//!   and established connections alike.
//!
//! Architecture invariant: no dependency on Warden's own crates. The harness drives processes
//! and networks; what runs on the hosts is whatever binary a test starts there, so a fault
//! found here is never an artefact of the harness sharing code with what it tests.

pub mod hosts;
pub mod impair;
pub mod links;

pub use hosts::{sweep_stale, Host, NetError, TestNet};
pub use impair::{DelayCounts, Impairment};
pub use links::End;
