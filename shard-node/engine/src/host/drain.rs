//! A graceful stop (SIGTERM: rolling restarts without an outage).
//!
//! A node killed while it leads groups costs each of them an election timeout without a
//! leader, and every write it was carrying an unknown outcome. A node told to stop instead:
//!
//! 1. says so: health reports NOT_SERVING (the node crate's `Drainer` does that, then runs
//!    [`drain`]), and the public API refuses each new call UNAVAILABLE (typed, so routers
//!    and clients send it elsewhere; nothing was done);
//! 2. hands the leadership of every group it leads (the placement group included) to the
//!    voter that has the most of the log among those heard from lately; again for any group
//!    it comes to lead meanwhile (a transfer that timed out, an election it won);
//! 3. waits until the proposals it was carrying are answered (applied, or dropped as a
//!    former leader's: retryable) and no call has arrived for a quiet period, so the
//!    routers have moved to the new leaders before its connections go;
//! 4. returns, for the caller to stop the node (the store is flushed by the node's stop).
//!
//! Each wait has a deadline ([`DrainLimits`]): a group whose voters are all gone keeps its
//! leader until the end, and the node stops anyway.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::NodeHandle;

/// How long a graceful stop may take.
#[derive(Clone, Copy, Debug)]
pub struct DrainLimits {
    /// The whole stop, at most.
    pub deadline: Duration,
    /// No call may have arrived for this long before the node stops (routers and clients
    /// have moved on).
    pub quiet: Duration,
    /// Between two looks at the node's groups.
    pub poll: Duration,
}

impl Default for DrainLimits {
    fn default() -> Self {
        DrainLimits { deadline: Duration::from_secs(15), quiet: Duration::from_millis(300), poll: Duration::from_millis(20) }
    }
}

/// What the public API tells a graceful stop: whether calls are still arriving, and the
/// proposals in flight. Shared by the node's services through its [`NodeHandle`].
#[derive(Debug)]
pub struct Activity {
    stopping: AtomicBool,
    proposals_in_flight: AtomicU64,
    /// When the last call arrived, in µs after `born` plus one (0: none yet). An atomic, not
    /// a lock: every public call sets it.
    last_arrival_us: AtomicU64,
    born: Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            stopping: AtomicBool::new(false),
            proposals_in_flight: AtomicU64::new(0),
            last_arrival_us: AtomicU64::new(0),
            born: Instant::now(),
        }
    }
}

/// A proposal in flight: counted until dropped.
pub struct InFlight<'a>(&'a Activity);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.proposals_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Activity {
    /// A call arrived; `Err` when the node is stopping (the call must be refused).
    pub fn arrive(&self) -> Result<(), Stopping> {
        let at_us = u64::try_from(self.born.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        self.last_arrival_us.store(at_us + 1, Ordering::Relaxed);
        if self.stopping.load(Ordering::SeqCst) {
            return Err(Stopping);
        }
        Ok(())
    }

    /// A proposal starts; it counts as in flight until the guard goes.
    pub fn propose(&self) -> InFlight<'_> {
        self.proposals_in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self)
    }

    /// Whether a graceful stop has begun.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    fn quiet_for(&self, quiet: Duration) -> bool {
        match self.last_arrival_us.load(Ordering::Relaxed) {
            0 => true,
            at_us => self.born.elapsed().saturating_sub(Duration::from_micros(at_us - 1)) >= quiet,
        }
    }
}

/// The refusal of a call that arrived while the node stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the node is stopping: its groups are led elsewhere")]
pub struct Stopping;

/// What a graceful stop did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// Leadership transfers asked for.
    pub transfers: usize,
    /// Groups still led at the deadline (no live voter to hand them to).
    pub still_led: Vec<u64>,
    /// Proposals still in flight at the deadline.
    pub proposals_in_flight: u64,
    /// How long it took.
    pub took: Duration,
}

/// Steps 2 and 3 of the module doc (step 1's refusals start here). Returns at the deadline
/// whatever is left.
pub async fn drain(node: &NodeHandle, limits: DrainLimits) -> DrainReport {
    let started = Instant::now();
    let deadline = started + limits.deadline;
    let activity = node.activity();
    activity.stopping.store(true, Ordering::SeqCst);
    let mut report = DrainReport::default();
    // A transfer asked for, by group: asked again only once it had time to finish.
    let mut asked: std::collections::HashMap<u64, Instant> = std::collections::HashMap::new();
    let retry_after = limits.poll.max(Duration::from_millis(500));
    loop {
        // 2. Hand over what this node leads.
        let led = node.led_groups();
        for &group in &led {
            if asked.get(&group).is_some_and(|at| at.elapsed() < retry_after) {
                continue;
            }
            let Ok(status) = node.status(group).await else { continue };
            let target = status
                .progress
                .iter()
                .filter(|peer| peer.id != node.node_id() && peer.recent_active && status.voters.contains(&peer.id))
                .max_by_key(|peer| peer.matched)
                .map(|peer| peer.id);
            if let Some(to) = target {
                if node.transfer_leader(group, to).await.is_ok() {
                    report.transfers += 1;
                }
            }
            asked.insert(group, Instant::now());
        }
        // 3. Then the answers in flight, and a quiet moment.
        let in_flight = activity.proposals_in_flight.load(Ordering::SeqCst);
        if led.is_empty() && in_flight == 0 && activity.quiet_for(limits.quiet) {
            break;
        }
        if Instant::now() >= deadline {
            report.still_led = led;
            report.proposals_in_flight = in_flight;
            break;
        }
        tokio::time::sleep(limits.poll).await;
    }
    report.took = started.elapsed();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls are taken until the stop begins and refused after; a proposal counts as in
    /// flight exactly while its guard lives; quiet means no arrival for the period.
    #[test]
    fn activity_counts_what_a_stop_waits_for() {
        let activity = Activity::default();
        assert!(activity.quiet_for(Duration::from_secs(3600)), "nothing ever arrived");
        assert_eq!(activity.arrive(), Ok(()));
        assert!(!activity.quiet_for(Duration::from_secs(3600)));
        let first = activity.propose();
        let second = activity.propose();
        assert_eq!(activity.proposals_in_flight.load(Ordering::SeqCst), 2);
        drop(first);
        assert_eq!(activity.proposals_in_flight.load(Ordering::SeqCst), 1);
        activity.stopping.store(true, Ordering::SeqCst);
        assert_eq!(activity.arrive(), Err(Stopping));
        assert!(activity.is_stopping());
        drop(second);
        assert_eq!(activity.proposals_in_flight.load(Ordering::SeqCst), 0);
    }
}
