//! Warden's test kit: what tests and benchmarks share, and production code never needs.
//! Every crate takes it as a dev-dependency only.
//!
//! - [`wait_until`]: waits, with a deadline, for a condition that other threads, tasks or
//!   processes make true (a leader elected, a replica caught up, a process answering).
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
}
