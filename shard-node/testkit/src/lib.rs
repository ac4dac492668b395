//! Warden's test kit: what tests and benchmarks share, and production code never needs.
//! Every crate takes it as a dev-dependency only.
//!
//! - [`wait_until`]: waits, with a deadline, for a condition that other threads, tasks or
//!   processes make true (a leader elected, a replica caught up, a process answering).
//! - [`free_port`], [`free_port_base`]: loopback ports for processes a test starts, which
//!   bind them later (and again after a restart).
//! - [`harness`]: the namespace state machine applied to without raft (it lives in the
//!   namespace crate, whose own unit tests use it, behind its `harness` feature, which only
//!   this crate turns on).
//!
//! The in-process `Cluster` is not here: `warden dev` and `warden bench` run it, so it is
//! production code of the node crate (`warden_shard_node::cluster`).

use std::time::Duration;

pub use warden_namespace::harness;

use tokio::time::Instant;

/// Pause between two checks of [`wait_until`].
pub const POLL: Duration = Duration::from_millis(50);

/// What a [`wait_until`] check answers: `true` or `Some(value)` once the awaited state is
/// there, `false` or `None` while it is not.
pub trait Awaited {
    /// What [`wait_until`] returns: `()` for a yes-or-no check, the value found otherwise.
    type Value;

    /// The value, once the awaited state is there.
    fn ready(self) -> Option<Self::Value>;
}

impl Awaited for bool {
    type Value = ();

    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Awaited for Option<T> {
    type Value = T;

    fn ready(self) -> Option<T> {
        self
    }
}

/// Runs `check` every [`POLL`] until it answers `true` (or `Some(value)`: the value is
/// returned); panics naming `what` was awaited if `timeout` passes first. `check` runs at
/// least once, even with a zero timeout.
pub async fn wait_until<R: Awaited>(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> R) -> R::Value {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await.ready() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Where [`free_port_base`] looks: below Linux's ephemeral range (`ip_local_port_range`,
/// 32768–60999 by default), so no outgoing connection of any process takes a port between
/// the check and the bind, or while a killed process is down before its restart on the
/// same address. (A port from binding port 0 is in that range: two failures in a full run.)
const PORT_BASES: std::ops::Range<u16> = 10_000..32_000;

/// A loopback port nobody listens on now, for a process the test starts later.
pub fn free_port() -> u16 {
    free_port_base(&[0])
}

/// A base port such that `base + offset` is free on loopback now for every one of
/// `offsets` (a cluster whose processes listen at fixed offsets from one base, as
/// `warden dev --base-port`). Panics if no base is found in 200 tries.
pub fn free_port_base(offsets: &[u16]) -> u16 {
    // Each call, in each test process, starts elsewhere: two clusters started at once
    // (tests run in parallel) would otherwise both find the first base free before either
    // binds it.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let span = offsets.iter().copied().max().unwrap_or(0);
    assert!(span <= 1_000, "offsets up to {span}: a base port is for a few processes' ports");
    let bases = u32::from(PORT_BASES.end - PORT_BASES.start - span);
    for attempt in 0..200u32 {
        let seed = std::process::id().wrapping_mul(7919).wrapping_add((attempt + call * 1000).wrapping_mul(104_729));
        let base = PORT_BASES.start + u16::try_from(seed % bases).unwrap_or(0);
        if offsets.iter().all(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).is_ok()) {
            return base;
        }
    }
    panic!("no free loopback port base for offsets {offsets:?} in {PORT_BASES:?}");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A check that becomes true is waited for; its value is returned.
    #[tokio::test]
    async fn waits_until_the_check_answers() {
        let tries = AtomicU32::new(0);
        wait_until("the third try", Duration::from_secs(5), async || tries.fetch_add(1, Ordering::SeqCst) >= 2).await;
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        let found = wait_until("a value", Duration::from_secs(5), async || Some(7)).await;
        assert_eq!(found, 7);
    }

    /// A check that never becomes true fails the test, naming what was awaited.
    #[tokio::test]
    #[should_panic(expected = "waiting until nothing happens")]
    async fn a_deadline_passed_names_what_was_awaited() {
        wait_until("nothing happens", Duration::from_millis(1), async || false).await;
    }

    /// Every port of a base is free and below the ephemeral range; a port a process now
    /// listens on is never handed out.
    #[test]
    fn ports_handed_out_are_free_and_below_the_ephemeral_range() {
        let offsets = [0, 1, 2, 199, 200];
        let base = free_port_base(&offsets);
        assert!(PORT_BASES.contains(&base) && base + 200 < 32_768, "base {base}");
        let held: Vec<_> = offsets.iter().map(|offset| std::net::TcpListener::bind(("127.0.0.1", base + offset)).expect("free")).collect();
        for _ in 0..50 {
            let port = free_port();
            assert!(PORT_BASES.contains(&port), "port {port}");
            assert!(!offsets.iter().any(|offset| base + offset == port), "port {port} is listened on");
        }
        drop(held);
    }
}
