//! One revision order for the events of an etcd watch whose parts span several groups.
//!
//! Revisions are per group: group A may be at revision 900 while group B is at 300. etcd's
//! clients take a watch's events to come in revision order, and resume a broken watch from
//! the revision after the last event they got (clientv3, jetcd, Kubernetes' reflector), or
//! after a progress notification's revision. Passed on as they come, A's event at 900 then
//! B's at 301 would make such a resume (from 901) skip B's events 301–900 silently.
//!
//! So an event passes only once no event at or below its revision can still come from any
//! (part, group) pair of the watch: each pair's *through* revision (every event of the pair
//! up to it has come, from its events and from progress notifications), and the watch's
//! *watermark* is the lowest of them. Events at or below the watermark pass, in revision
//! order, and the watermark is the header revision of everything the watch answers: a
//! valid point to resume from in every group. A group that takes no writes would hold the
//! watermark down for good, so a pair behind the highest waiting event has its group
//! *raised* to that revision (a read-only transaction with `raise_to`: its next write takes
//! a higher revision), then is asked for progress; the router does that
//! ([`Merge::raises_due`] says which).
//!
//! A watch of one group (one part, or several in one group: their events come over one
//! upstream stream in the group's order) needs none of this: its events pass at once, with
//! their group's header, exactly as etcd's.

use std::collections::BTreeMap;

use warden_proto::etcd::mvccpb::Event;

/// Events one watch holds at most while a group it spans is behind; past it the watch ends
/// (the client watches again from the revision after its last event, which is valid).
pub const WAITING_EVENTS_MAX: usize = 10_000;

/// Where a raise of a group stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Raised {
    /// Every part spanning the group reported its target: done.
    Reached,
    /// Not yet: ask for progress again (or raise again).
    Waiting,
    /// A raise to a higher target took over, or the group is no longer spanned: done.
    Superseded,
}

/// The order of one watch's events (see the module documentation).
#[derive(Debug, Default)]
pub struct Merge {
    /// Per (part's native id, group): every event of the part in that group up to this
    /// revision has come.
    through: BTreeMap<(u64, u64), u64>,
    /// Events come but not passed on, by revision (of several groups in arrival order).
    waiting: BTreeMap<u64, Vec<Event>>,
    /// Events in `waiting` (kept, not counted on every arrival).
    waiting_events: usize,
    /// Groups being raised, each to its target.
    raising: BTreeMap<u64, u64>,
}

/// Events came past [`WAITING_EVENTS_MAX`].
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow;

impl Merge {
    /// Whether the watch's parts span more than one group: only then are its events ordered
    /// here and its headers the watermark. (Parts in one group share one upstream stream,
    /// where the group's node queues every live watch's events in revision order.)
    pub fn spans_groups(&self) -> bool {
        let mut groups = self.through.keys().map(|(_, group)| *group);
        groups.next().is_some_and(|first| groups.any(|group| group != first))
    }

    /// The watermark: every event at or below it has come from every pair (0 before any
    /// pair is known).
    pub fn watermark(&self) -> u64 {
        self.through.values().copied().min().unwrap_or(0)
    }

    /// Part `native_id` was created: in each group of `start_revisions`, from that revision.
    /// A group it no longer spans (a merged group) is forgotten; a group it spanned keeps
    /// what it had.
    pub fn started(&mut self, native_id: u64, start_revisions: impl IntoIterator<Item = (u64, u64)>) {
        let starts: BTreeMap<u64, u64> = start_revisions.into_iter().collect();
        self.through.retain(|(part, group), _| *part != native_id || starts.contains_key(group));
        for (group, start) in starts {
            let through = self.through.entry((native_id, group)).or_insert(0);
            *through = (*through).max(start.saturating_sub(1));
        }
    }

    /// Part `ended` is created again as `again`, from `resume_revisions` per group: until it
    /// answers, its groups hold the watermark where the resume revisions say.
    pub fn resumed(&mut self, ended: u64, again: u64, resume_revisions: &std::collections::HashMap<u64, u64>) {
        let kept: Vec<((u64, u64), u64)> = self.through.iter().filter(|((part, _), _)| *part == ended).map(|(k, v)| (*k, *v)).collect();
        for ((_, group), through) in kept {
            self.through.remove(&(ended, group));
            // Never below what came: an event at or below it again would be a repeat.
            let resumed = resume_revisions.get(&group).map_or(through, |next| next.saturating_sub(1).max(through));
            self.through.insert((again, group), resumed);
        }
        for (group, next) in resume_revisions {
            self.through.entry((again, *group)).or_insert(next.saturating_sub(1));
        }
    }

    /// Events of part `native_id` in `group`, each with its revision (`None`: filtered out,
    /// but it moves the part on). Events at or below the pair's through revision are
    /// repeats and dropped.
    pub fn arrived(&mut self, native_id: u64, group: u64, events: Vec<(u64, Option<Event>)>) -> Result<(), Overflow> {
        let through = self.through.entry((native_id, group)).or_insert(0);
        // One revision's events (a transaction's) come together, so a repeat is any at or
        // below what had come before these.
        let before = *through;
        for (revision, event) in events {
            if revision <= before {
                continue;
            }
            *through = (*through).max(revision);
            if let Some(event) = event {
                self.waiting.entry(revision).or_default().push(event);
                self.waiting_events += 1;
            }
        }
        if self.waiting_events > WAITING_EVENTS_MAX {
            return Err(Overflow);
        }
        Ok(())
    }

    /// Part `native_id` in `group` has no event up to `revision` left to come (a progress
    /// notification).
    pub fn progressed(&mut self, native_id: u64, group: u64, revision: u64) {
        if let Some(through) = self.through.get_mut(&(native_id, group)) {
            *through = (*through).max(revision);
        }
    }

    /// The events now at or below the watermark (all of them in a watch of one group), by
    /// revision, in order.
    pub fn release(&mut self) -> Vec<(u64, Vec<Event>)> {
        let watermark = if self.spans_groups() { self.watermark() } else { u64::MAX - 1 };
        let later = self.waiting.split_off(&watermark.saturating_add(1));
        let released: Vec<(u64, Vec<Event>)> = std::mem::replace(&mut self.waiting, later).into_iter().collect();
        self.waiting_events -= released.iter().map(|(_, events)| events.len()).sum::<usize>();
        let caught_up: Vec<u64> = self.raising.iter().filter(|(group, target)| self.group_through(**group) >= **target).map(|(g, _)| *g).collect();
        for group in caught_up {
            self.raising.remove(&group);
        }
        released
    }

    /// The groups to raise now, each with a part spanning it and the target: those with a
    /// pair behind the highest event waiting (held by the watermark) and not being raised
    /// to it already. They are noted as being raised. (A filtered event past it waits for
    /// nothing: raising a group to it would only spend the group's revisions.)
    pub fn raises_due(&mut self) -> Vec<(u64, u64, u64)> {
        if !self.spans_groups() {
            return Vec::new();
        }
        let Some(target) = self.waiting.keys().next_back().copied() else { return Vec::new() };
        let mut behind: BTreeMap<u64, u64> = BTreeMap::new();
        for ((part, group), through) in &self.through {
            if *through < target && self.raising.get(group).is_none_or(|raising| *raising < target) {
                behind.entry(*group).or_insert(*part);
            }
        }
        for group in behind.keys() {
            self.raising.insert(*group, target);
        }
        behind.into_iter().map(|(group, part)| (part, group, target)).collect()
    }

    /// Where the raise of `group` to `target` stands (see [`Raised`]).
    pub fn raised(&mut self, group: u64, target: u64) -> Raised {
        if self.raising.get(&group) != Some(&target) {
            return Raised::Superseded;
        }
        if self.group_through(group) >= target {
            self.raising.remove(&group);
            return Raised::Reached;
        }
        Raised::Waiting
    }

    /// The lowest through revision of `group`'s pairs (a group no part spans: past all).
    fn group_through(&self, group: u64) -> u64 {
        self.through.iter().filter(|((_, g), _)| *g == group).map(|(_, through)| *through).min().unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::etcd::mvccpb::KeyValue;

    fn event(key: &str, revision: u64) -> (u64, Option<Event>) {
        let kv = KeyValue { key: key.as_bytes().to_vec(), mod_revision: i64::try_from(revision).unwrap_or(0), ..KeyValue::default() };
        (revision, Some(Event { kv: Some(kv), ..Event::default() }))
    }

    fn revisions(released: &[(u64, Vec<Event>)]) -> Vec<u64> {
        released.iter().map(|(revision, _)| *revision).collect()
    }

    /// Group 1 runs far ahead of group 2: its events wait until group 2 is known to have
    /// nothing below them, then pass in revision order, group 2's lower ones first.
    #[test]
    fn a_busy_groups_events_wait_for_the_groups_behind_and_pass_in_revision_order() {
        let mut merge = Merge::default();
        merge.started(7, [(1, 901), (2, 301)]);
        assert!(merge.spans_groups());
        assert_eq!(merge.watermark(), 300);
        merge.arrived(7, 1, vec![event("/a", 901), event("/a", 902)]).expect("room");
        assert!(merge.release().is_empty(), "group 2 may still have events from 301");
        assert_eq!(merge.raises_due(), vec![(7, 2, 902)], "group 2 is raised to the highest event waiting");
        assert!(merge.raises_due().is_empty(), "once");
        merge.arrived(7, 2, vec![event("/b", 301), event("/b", 650)]).expect("room");
        assert_eq!(revisions(&merge.release()), vec![301, 650], "group 2's events up to its through revision");
        merge.progressed(7, 2, 950);
        assert_eq!(merge.watermark(), 902);
        assert_eq!(revisions(&merge.release()), vec![901, 902]);
        assert_eq!(merge.raised(2, 902), Raised::Superseded, "reached already: the release noted it");
        merge.arrived(7, 1, vec![event("/a", 903)]).expect("room");
        assert_eq!(revisions(&merge.release()), vec![903], "group 2 is past it already");
        merge.arrived(7, 1, vec![event("/a", 960), (990, None)]).expect("room");
        assert_eq!(merge.raises_due(), vec![(7, 2, 960)], "raised again for an event past it, not for a filtered one");
    }

    /// A part created again keeps its groups' places until it answers; a repeated event is
    /// dropped; a filtered event moves its pair on without waiting.
    #[test]
    fn a_resumed_part_holds_the_watermark_and_repeats_are_dropped() {
        let mut merge = Merge::default();
        merge.started(1, [(1, 10), (2, 10)]);
        merge.arrived(1, 1, vec![event("/a", 20), event("/a/b", 20)]).expect("room");
        merge.arrived(1, 2, vec![(15, None)]).expect("room");
        assert_eq!(revisions(&merge.release()), Vec::<u64>::new(), "group 2 is through 15 only");
        merge.resumed(1, 2, &[(1, 21), (2, 16), (3, 16)].into());
        assert_eq!(merge.watermark(), 15, "the new part's groups hold it where they resume");
        merge.started(2, [(1, 21), (2, 16), (3, 16)]);
        merge.arrived(2, 1, vec![event("/a", 20)]).expect("room");
        merge.progressed(2, 2, 30);
        merge.progressed(2, 3, 30);
        merge.progressed(2, 1, 30);
        let released = merge.release();
        assert_eq!(revisions(&released), vec![20], "the repeat of 20 was dropped");
        assert_eq!(released[0].1.len(), 2, "both events of revision 20, once");
        merge.started(2, [(1, 31), (2, 31)]);
        assert_eq!(merge.through.len(), 2, "group 3 left the part (merged away)");
    }

    /// Two parts in one group (an etcd prefix's plain and escaped keys): their events pass at
    /// once, as the group's node orders them.
    #[test]
    fn parts_in_one_group_pass_their_events_at_once() {
        let mut merge = Merge::default();
        merge.started(1, [(4, 10)]);
        merge.started(2, [(4, 10)]);
        assert!(!merge.spans_groups());
        merge.arrived(1, 4, vec![event("/a", 12)]).expect("room");
        assert_eq!(revisions(&merge.release()), vec![12]);
        assert!(merge.raises_due().is_empty());
    }

    #[test]
    fn events_waiting_are_bounded() {
        let mut merge = Merge::default();
        merge.started(1, [(1, 1), (2, 1)]);
        let events: Vec<(u64, Option<Event>)> = (1..=WAITING_EVENTS_MAX as u64).map(|r| event("/a", r)).collect();
        assert_eq!(merge.arrived(1, 1, events), Ok(()));
        assert_eq!(merge.arrived(1, 1, vec![event("/a", WAITING_EVENTS_MAX as u64 + 1)]), Err(Overflow));
    }

    /// A raise waits until every part spanning the group reports its target; one to a
    /// higher target takes over.
    #[test]
    fn a_raise_waits_for_the_groups_parts_and_a_higher_one_takes_over() {
        let mut merge = Merge::default();
        merge.started(1, [(1, 1), (2, 1)]);
        merge.started(2, [(2, 1)]);
        merge.arrived(1, 1, vec![event("/a", 50)]).expect("room");
        assert_eq!(merge.raises_due(), vec![(1, 2, 50)], "one raise per group, through one of its parts");
        merge.progressed(1, 2, 60);
        assert_eq!(merge.raised(2, 50), Raised::Waiting, "the other part in group 2 has not reported it");
        merge.arrived(1, 1, vec![event("/a", 70)]).expect("room");
        assert_eq!(merge.raises_due(), vec![(1, 2, 70)]);
        assert_eq!(merge.raised(2, 50), Raised::Superseded);
        merge.progressed(2, 2, 70);
        merge.progressed(1, 2, 70);
        assert_eq!(merge.raised(2, 70), Raised::Reached);
        assert_eq!(revisions(&merge.release()), vec![50, 70]);
    }
}
