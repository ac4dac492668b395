//! Network fault injection for tests: partitions (symmetric and one-way), message drop rate
//! and delay. Every node's transport consults the same `NetFaults` before sending; calls
//! between groups (`GroupLinks`) consult its cut group links; a placement leader running a
//! split stops before a held step until it is released (`placement/split.rs`), so a test can
//! crash a participant at that exact step; likewise a replica move (`placement/scheduler.rs`),
//! so a test can depose the placement leader running it between two steps.

use std::collections::HashSet;
use std::sync::RwLock;
use std::time::Duration;

/// Faults between nodes, shared by every node of an in-process cluster.
#[derive(Debug, Default)]
pub struct NetFaults {
    state: RwLock<FaultState>,
}

#[derive(Debug, Default, Clone)]
struct FaultState {
    /// Directed links `(from, to)` that lose everything.
    blocked: HashSet<(u64, u64)>,
    /// Probability that any one message is lost.
    drop_rate: f64,
    /// Added to every batch before it is sent.
    delay: Duration,
    /// Directed group links `(from group, to group)` whose calls fail as unreachable.
    cut_group_links: HashSet<(u64, u64)>,
    /// A split stops before this step of its sequence (numbered as in `placement/split.rs`).
    split_hold: Option<u8>,
    /// The held step a split reached (and waits at).
    split_reached: Option<u8>,
    /// Splits fail at this step of their sequence (as a call to a participant that failed).
    split_fail: Option<u8>,
    /// Changes of a group's quota share placement makes that fail at the group (as a call
    /// to a replica that failed), until this many have.
    quota_share_failures: u32,
    /// `(node, group, step)`: a replica move of `group` run by `node` stops before `step`.
    move_hold: Option<(u64, u64, u8)>,
    /// The held step a move reached (and waits at).
    move_reached: Option<u8>,
    /// `(node, group)` of the move that reached the held step.
    move_waited: Option<(u64, u64)>,
    /// The held move ended (finished or failed) after it was released.
    held_move_ended: bool,
}

/// What the transport does with one message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Send it.
    Deliver,
    /// Lose it.
    Drop,
}

impl NetFaults {
    /// No faults.
    pub fn new() -> NetFaults {
        NetFaults::default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, FaultState> {
        self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, FaultState> {
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Loses every message from `from` to `to` (one way).
    pub fn block(&self, from: u64, to: u64) {
        self.write().blocked.insert((from, to));
    }

    /// Cuts every link between `side_a` and `side_b`, both ways.
    pub fn partition(&self, side_a: &[u64], side_b: &[u64]) {
        let mut state = self.write();
        for &a in side_a {
            for &b in side_b {
                state.blocked.insert((a, b));
                state.blocked.insert((b, a));
            }
        }
    }

    /// Cuts `node` from every node in `others`, both ways.
    pub fn isolate(&self, node: u64, others: &[u64]) {
        self.partition(&[node], others);
    }

    /// Loses each message with probability `rate` (0.0 to 1.0).
    pub fn set_drop_rate(&self, rate: f64) {
        self.write().drop_rate = rate.clamp(0.0, 1.0);
    }

    /// Delays every batch by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.write().delay = delay;
    }

    /// Fails every call group `from` makes to group `to` (one way) as if `to` were
    /// unreachable: the partition between groups of DESIGN.md rule 7.
    pub fn cut_group_link(&self, from: u64, to: u64) {
        self.write().cut_group_links.insert((from, to));
    }

    /// Whether calls from group `from` to group `to` are cut.
    pub fn group_link_cut(&self, from: u64, to: u64) -> bool {
        self.read().cut_group_links.contains(&(from, to))
    }

    /// Splits stop before step `step` of their sequence until [`Self::release_split`].
    pub fn hold_split_at(&self, step: u8) {
        let mut state = self.write();
        state.split_hold = Some(step);
        state.split_reached = None;
    }

    /// Splits fail when they reach step `step` (until [`Self::heal`]).
    pub fn fail_split_at(&self, step: u8) {
        self.write().split_fail = Some(step);
    }

    /// Whether a split reaching step `step` must fail there.
    pub fn split_fails(&self, step: u8) -> bool {
        self.read().split_fail == Some(step)
    }

    /// The next `count` quota share changes placement makes at a group fail there, after
    /// placement recorded them (until [`Self::heal`]).
    pub fn fail_quota_share_sets(&self, count: u32) {
        self.write().quota_share_failures = count;
    }

    /// Called by placement before it has a group change its quota share: true when this one
    /// must fail (and counts it).
    pub fn quota_share_set_fails(&self) -> bool {
        let mut state = self.write();
        let fails = state.quota_share_failures > 0;
        state.quota_share_failures = state.quota_share_failures.saturating_sub(1);
        fails
    }

    /// How many of the quota share changes [`Self::fail_quota_share_sets`] asked to fail
    /// have not failed yet.
    pub fn quota_share_failures_left(&self) -> u32 {
        self.read().quota_share_failures
    }

    /// Lets held splits go on.
    pub fn release_split(&self) {
        self.write().split_hold = None;
    }

    /// The held step a split reached, if any.
    pub fn split_reached(&self) -> Option<u8> {
        self.read().split_reached
    }

    /// Called by a split before step `step`: true while it must wait there (and records that
    /// it got there).
    pub fn split_held(&self, step: u8) -> bool {
        let mut state = self.write();
        let held = state.split_hold == Some(step);
        if held {
            state.split_reached = Some(step);
        }
        held
    }

    /// Replica moves of `group` run by the placement leader `node` stop before step `step`
    /// (numbered as in `placement/scheduler.rs`) until [`Self::release_moves`].
    pub fn hold_move_at(&self, node: u64, group: u64, step: u8) {
        let mut state = self.write();
        state.move_hold = Some((node, group, step));
        state.move_reached = None;
        state.move_waited = None;
        state.held_move_ended = false;
    }

    /// Lets held moves go on.
    pub fn release_moves(&self) {
        self.write().move_hold = None;
    }

    /// The held step a move reached, if any.
    pub fn move_reached(&self) -> Option<u8> {
        self.read().move_reached
    }

    /// Whether the move that reached the held step has ended since.
    pub fn held_move_ended(&self) -> bool {
        self.read().held_move_ended
    }

    /// Called by `node`'s move of `group` before step `step`: true while it must wait there
    /// (and records that it got there).
    pub fn move_held(&self, node: u64, group: u64, step: u8) -> bool {
        let mut state = self.write();
        let held = state.move_hold == Some((node, group, step));
        if held {
            state.move_reached = Some(step);
            state.move_waited = Some((node, group));
        }
        held
    }

    /// Called by `node` when its move of `group` ends (finished or failed).
    pub fn move_ended(&self, node: u64, group: u64) {
        let mut state = self.write();
        if state.move_waited == Some((node, group)) {
            state.held_move_ended = true;
        }
    }

    /// Removes every fault.
    pub fn heal(&self) {
        *self.write() = FaultState::default();
    }

    /// The delay to apply before sending a batch.
    pub fn delay(&self) -> Duration {
        self.read().delay
    }

    /// Decides the fate of one message from `from` to `to`.
    pub fn verdict(&self, from: u64, to: u64) -> Verdict {
        let state = self.read();
        if state.blocked.contains(&(from, to)) {
            return Verdict::Drop;
        }
        if state.drop_rate > 0.0 && rand::random::<f64>() < state.drop_rate {
            return Verdict::Drop;
        }
        Verdict::Deliver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_way_blocks_only_one_direction_and_heal_clears() {
        let faults = NetFaults::new();
        faults.block(1, 2);
        assert_eq!(faults.verdict(1, 2), Verdict::Drop);
        assert_eq!(faults.verdict(2, 1), Verdict::Deliver);
        faults.partition(&[3], &[4, 5]);
        assert_eq!(faults.verdict(5, 3), Verdict::Drop);
        assert_eq!(faults.verdict(4, 5), Verdict::Deliver);
        faults.heal();
        assert_eq!(faults.verdict(1, 2), Verdict::Deliver);
        faults.set_drop_rate(1.0);
        assert_eq!(faults.verdict(1, 2), Verdict::Drop);
    }
}
