//! Validators for recorded watch histories.
//!
//! A robustness test records what each watcher received while the cluster is put under
//! faults — leader kills, network partitions, watchers disconnecting and resuming — together
//! with the writes clients attempted and the ones the server acknowledged. The functions here
//! decide, after the fact and without I/O, whether those histories obey the watch guarantees,
//! in the spirit of etcd's robustness-test watch validators:
//!
//! - **ordered** ([`check_ordered`]): revisions never go backwards;
//! - **unique** ([`check_unique`]): no event is delivered twice;
//! - **atomic** ([`check_atomic`]): a revision is never split over two responses;
//! - **reliable** ([`check_reliable`], [`check_contiguous`]): acknowledged writes are
//!   delivered, and no revision is skipped;
//! - **resumable** ([`check_resumed`]): a watcher that reconnects from the revision after the
//!   last one it saw gets exactly the rest of the stream;
//!
//! plus [`check_no_phantoms`] (nothing is delivered that nobody wrote) and
//! [`check_same_sequence`] (a follower serves the same stream as the leader).
//!
//! Every check returns the first [`Violation`] it finds, naming the rule and the offending
//! revision, path and expected/found values.

use std::collections::{HashMap, HashSet};

/// What happened to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The node did not exist before this revision.
    Created,
    /// The node existed and its data was replaced.
    Changed,
    /// The node was removed.
    Deleted,
}

/// One event as a watcher received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Revision of the write that produced the event.
    pub revision: u64,
    /// Path of the node the event is about.
    pub path: String,
    /// What happened to the node.
    pub kind: EventKind,
    /// The node's data after the write (for deletions, whatever the server sends).
    pub data: Vec<u8>,
}

/// What one watch delivered, in delivery order: each inner Vec is one response (one message
/// on the stream). A server must never split one revision over two responses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The responses, in the order the watcher received them.
    pub responses: Vec<Vec<Event>>,
}

impl Delivery {
    /// Revision of the first event delivered, if any.
    pub fn first_revision(&self) -> Option<u64> {
        flatten(self).next().map(|event| event.revision)
    }

    /// Revision of the last event delivered, if any.
    pub fn last_revision(&self) -> Option<u64> {
        self.responses.iter().rev().find_map(|response| response.last()).map(|event| event.revision)
    }
}

/// A write the test made and the server acknowledged: it must appear, with exactly this revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckedWrite {
    /// Revision the server acknowledged the write at.
    pub revision: u64,
    /// Path written.
    pub path: String,
    /// Kind of event the write must produce.
    pub kind: EventKind,
    /// Data written (not compared for deletions).
    pub data: Vec<u8>,
}

/// A violation found, with enough context to debug (which rule, which revision/path, what was
/// expected and found).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Name of the rule broken: `ordered`, `unique`, `atomic`, `reliable`, `contiguous`,
    /// `no_phantoms`, `same_sequence` or `resumed`.
    pub rule: &'static str,
    /// What was expected and what was found, with revisions, paths and positions.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "watch rule `{}` violated: {}", self.rule, self.detail)
    }
}

impl std::error::Error for Violation {}

fn violation(rule: &'static str, detail: String) -> Result<(), Violation> {
    Err(Violation { rule, detail })
}

fn describe(revision: u64, path: &str, kind: &EventKind, data: &[u8]) -> String {
    format!("{kind:?} {path} at revision {revision} with data {:?}", String::from_utf8_lossy(data))
}

fn describe_event(event: &Event) -> String {
    describe(event.revision, &event.path, &event.kind, &event.data)
}

/// All events of a delivery in delivery order, ignoring response boundaries.
pub fn flatten(delivery: &Delivery) -> impl Iterator<Item = &Event> {
    delivery.responses.iter().flatten()
}

/// Rule `ordered`: across the flattened event sequence, each event's revision is greater than
/// or equal to the previous one's. Equal revisions are thus only ever adjacent: the events of
/// one revision are contiguous.
pub fn check_ordered(delivery: &Delivery) -> Result<(), Violation> {
    let mut previous: Option<&Event> = None;
    for (position, event) in flatten(delivery).enumerate() {
        if let Some(before) = previous.filter(|before| event.revision < before.revision) {
            let detail = format!("position {position}: {} after {}", describe_event(event), describe_event(before));
            return violation("ordered", detail);
        }
        previous = Some(event);
    }
    Ok(())
}

/// Rule `unique`: no (revision, path) pair appears twice in the delivery.
pub fn check_unique(delivery: &Delivery) -> Result<(), Violation> {
    let mut seen: HashMap<(u64, &str), usize> = HashMap::new();
    for (position, event) in flatten(delivery).enumerate() {
        if let Some(first) = seen.insert((event.revision, &event.path), position) {
            let detail = format!("{} delivered at positions {first} and {position}", describe_event(event));
            return violation("unique", detail);
        }
    }
    Ok(())
}

/// Rule `atomic`: every event of a revision is in the same response; no revision appears in
/// two different responses.
pub fn check_atomic(delivery: &Delivery) -> Result<(), Violation> {
    let mut response_of: HashMap<u64, usize> = HashMap::new();
    for (index, response) in delivery.responses.iter().enumerate() {
        for event in response {
            let first = *response_of.entry(event.revision).or_insert(index);
            if first != index {
                let detail = format!("revision {} split over responses {first} and {index}", event.revision);
                return violation("atomic", detail);
            }
        }
    }
    Ok(())
}

/// Rule `reliable`: every acknowledged write with `from_revision <= revision <= to_revision`
/// and `in_scope(path)` is delivered as an event with the same revision, path and kind, and
/// the same data unless it is a deletion. Delivered events nobody acknowledged are not
/// questioned here (see [`check_contiguous`] and [`check_no_phantoms`]).
pub fn check_reliable(
    delivery: &Delivery,
    acked: &[AckedWrite],
    from_revision: u64,
    to_revision: u64,
    in_scope: impl Fn(&str) -> bool,
) -> Result<(), Violation> {
    let mut delivered: HashMap<(u64, &str), Vec<&Event>> = HashMap::new();
    for event in flatten(delivery) {
        delivered.entry((event.revision, &event.path)).or_default().push(event);
    }
    let expected = acked.iter().filter(|write| (from_revision..=to_revision).contains(&write.revision) && in_scope(&write.path));
    for write in expected {
        let candidates = delivered.get(&(write.revision, write.path.as_str())).map_or(&[][..], Vec::as_slice);
        if !candidates.iter().any(|event| matches_write(event, write)) {
            let found: Vec<String> = candidates.iter().map(|event| describe_event(event)).collect();
            let acked = describe(write.revision, &write.path, &write.kind, &write.data);
            return violation("reliable", format!("acknowledged {acked} not delivered (found {found:?})"));
        }
    }
    Ok(())
}

fn matches_write(event: &Event, write: &AckedWrite) -> bool {
    event.kind == write.kind && (write.kind == EventKind::Deleted || event.data == write.data)
}

/// Rule `contiguous`: every revision in `from_revision..=to_revision` has at least one event
/// in the delivery, and no event lies outside that range. For a recursive watch on a
/// namespace where every revision changes at least one node, a missing revision is a gap.
pub fn check_contiguous(delivery: &Delivery, from_revision: u64, to_revision: u64) -> Result<(), Violation> {
    let range = from_revision..=to_revision;
    if let Some(outside) = flatten(delivery).find(|event| !range.contains(&event.revision)) {
        let detail = format!("{} outside {from_revision}..={to_revision}", describe_event(outside));
        return violation("contiguous", detail);
    }
    let revisions: HashSet<u64> = flatten(delivery).map(|event| event.revision).collect();
    match range.clone().find(|revision| !revisions.contains(revision)) {
        Some(missing) => violation("contiguous", format!("revision {missing} missing from {from_revision}..={to_revision}")),
        None => Ok(()),
    }
}

/// Rule `no_phantoms`: the (path, data) of every `Created` or `Changed` event is in
/// `attempted`, the set of writes some client attempted (including writes whose outcome is
/// unknown). `Deleted` events are exempt.
pub fn check_no_phantoms(delivery: &Delivery, attempted: &HashSet<(String, Vec<u8>)>) -> Result<(), Violation> {
    let phantom = flatten(delivery)
        .filter(|event| event.kind != EventKind::Deleted)
        .find(|event| !attempted.contains(&(event.path.clone(), event.data.clone())));
    match phantom {
        Some(event) => violation("no_phantoms", format!("{} was never attempted by any client", describe_event(event))),
        None => Ok(()),
    }
}

/// Events of `delivery` with `from_revision <= revision <= to_revision`, in delivery order.
fn in_range(delivery: &Delivery, from_revision: u64, to_revision: u64) -> Vec<&Event> {
    flatten(delivery).filter(|event| (from_revision..=to_revision).contains(&event.revision)).collect()
}

/// Fails with `rule` at the first position where `found` differs from `expected`, including
/// one sequence ending before the other.
fn compare_sequences(rule: &'static str, expected: &[&Event], found: &[&Event]) -> Result<(), Violation> {
    let show = |event: Option<&&Event>| event.map_or("end of sequence".to_string(), |event| describe_event(event));
    let differs = (0..expected.len().max(found.len())).find(|&i| expected.get(i) != found.get(i));
    match differs {
        Some(position) => {
            let (expected, found) = (show(expected.get(position)), show(found.get(position)));
            violation(rule, format!("position {position}: expected {expected}, found {found}"))
        }
        None => Ok(()),
    }
}

/// Rule `same_sequence`: restricted to events with `from_revision <= revision <= to_revision`,
/// `a` and `b` hold exactly the same flattened event sequence (response boundaries are not
/// compared). Used to compare a watch served by a follower with one served by the leader; the
/// violation names the first position where they differ, `a` being the expected side.
pub fn check_same_sequence(a: &Delivery, b: &Delivery, from_revision: u64, to_revision: u64) -> Result<(), Violation> {
    compare_sequences("same_sequence", &in_range(a, from_revision, to_revision), &in_range(b, from_revision, to_revision))
}

/// Rule `resumed`: resuming a watch yields exactly the rest of the stream, with no gap and no
/// duplicate.
///
/// `first` is what a watcher saw before disconnecting; `resumed` is what it saw after
/// reconnecting with start revision (last revision of `first`) + 1, or the start of `full`
/// when `first` is empty; `full` is an uninterrupted reference watch over the same scope,
/// covering at least up to the bound below. With bound = last revision of `resumed` (or of
/// `first` if `resumed` is empty), the events of `first` followed by those of `resumed`, with
/// revision ≤ bound, must equal the events of `full` with revision from the first revision of
/// `first` (no lower limit if `first` is empty) up to bound. Nothing delivered passes.
pub fn check_resumed(first: &Delivery, resumed: &Delivery, full: &Delivery) -> Result<(), Violation> {
    let Some(bound) = resumed.last_revision().or(first.last_revision()) else {
        return Ok(());
    };
    let start = first.first_revision().unwrap_or(0);
    let seen: Vec<&Event> = flatten(first).chain(flatten(resumed)).filter(|event| event.revision <= bound).collect();
    compare_sequences("resumed", &in_range(full, start, bound), &seen)
}

/// [`check_ordered`], then [`check_unique`], then [`check_atomic`]: the rules every single
/// delivery must obey on its own. Returns the first violation.
pub fn check_all(delivery: &Delivery) -> Result<(), Violation> {
    check_ordered(delivery)?;
    check_unique(delivery)?;
    check_atomic(delivery)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(revision: u64, path: &str, kind: EventKind) -> Event {
        Event { revision, path: path.to_string(), kind, data: format!("{path}@{revision}").into_bytes() }
    }

    /// A `Changed` event on `/a` at `revision`.
    fn at(revision: u64) -> Event {
        event(revision, "/a", EventKind::Changed)
    }

    /// One response per event, one `/a` event per revision.
    fn stream(revisions: &[u64]) -> Delivery {
        Delivery { responses: revisions.iter().map(|&revision| vec![at(revision)]).collect() }
    }

    fn acked(event: &Event) -> AckedWrite {
        let Event { revision, path, kind, data } = event.clone();
        AckedWrite { revision, path, kind, data }
    }

    fn rule(result: Result<(), Violation>) -> &'static str {
        result.expect_err("expected a violation").rule
    }

    #[test]
    fn flatten_and_revision_bounds() {
        let delivery = Delivery { responses: vec![vec![], vec![at(2), at(3)], vec![at(5)], vec![]] };
        let revisions: Vec<u64> = flatten(&delivery).map(|event| event.revision).collect();
        assert_eq!(revisions, [2, 3, 5]);
        assert_eq!((delivery.first_revision(), delivery.last_revision()), (Some(2), Some(5)));
        assert_eq!(Delivery { responses: vec![vec![]] }.last_revision(), None);
    }

    #[test]
    fn ordered() {
        let same_revision = Delivery { responses: vec![vec![at(1)], vec![at(2), event(2, "/b", EventKind::Created)], vec![at(3)]] };
        assert_eq!(check_ordered(&same_revision), Ok(()));
        let backwards = check_ordered(&stream(&[1, 3, 2])).expect_err("3 then 2");
        assert_eq!(backwards.rule, "ordered");
        assert!(backwards.detail.contains("position 2"), "{backwards}");
        assert_eq!(rule(check_ordered(&stream(&[2, 3, 2]))), "ordered", "revision 2 is not contiguous");
    }

    #[test]
    fn unique() {
        assert_eq!(check_unique(&Delivery { responses: vec![vec![at(1), event(1, "/b", EventKind::Deleted)]] }), Ok(()));
        assert_eq!(rule(check_unique(&stream(&[1, 2, 2]))), "unique");
    }

    #[test]
    fn atomic() {
        let together = Delivery { responses: vec![vec![at(1)], vec![at(2), event(2, "/b", EventKind::Created)]] };
        assert_eq!(check_atomic(&together), Ok(()));
        let split = Delivery { responses: vec![vec![at(1), at(2)], vec![event(2, "/b", EventKind::Created)]] };
        let found = check_atomic(&split).expect_err("revision 2 split");
        assert_eq!((found.rule, found.detail.as_str()), ("atomic", "revision 2 split over responses 0 and 1"));
    }

    #[test]
    fn reliable() {
        let delivery = Delivery { responses: vec![vec![at(2)], vec![event(3, "/a", EventKind::Deleted)]] };
        let deleted_other_data = AckedWrite { data: b"ignored".to_vec(), ..acked(&event(3, "/a", EventKind::Deleted)) };
        let out_of_range = acked(&at(9));
        let out_of_scope = acked(&event(2, "/other/x", EventKind::Created));
        let writes = [acked(&at(2)), deleted_other_data, out_of_range, out_of_scope];
        assert_eq!(check_reliable(&delivery, &writes, 1, 5, |path| path.starts_with("/a")), Ok(()));

        let missing = check_reliable(&delivery, &[acked(&at(4))], 1, 5, |_| true).expect_err("revision 4 missing");
        assert_eq!(missing.rule, "reliable");
        assert!(missing.detail.contains("/a at revision 4"), "{missing}");
        let wrong_data = AckedWrite { data: b"other".to_vec(), ..acked(&at(2)) };
        assert_eq!(rule(check_reliable(&delivery, &[wrong_data], 1, 5, |_| true)), "reliable");
        let wrong_kind = acked(&event(2, "/a", EventKind::Created));
        assert_eq!(rule(check_reliable(&delivery, &[wrong_kind], 1, 5, |_| true)), "reliable");
    }

    #[test]
    fn contiguous() {
        assert_eq!(check_contiguous(&stream(&[3, 4, 4, 5]), 3, 5), Ok(()));
        let gap = check_contiguous(&stream(&[3, 5]), 3, 5).expect_err("revision 4 missing");
        assert_eq!((gap.rule, gap.detail.as_str()), ("contiguous", "revision 4 missing from 3..=5"));
        assert_eq!(rule(check_contiguous(&stream(&[3, 4]), 3, 5)), "contiguous", "revision 5 missing");
        assert_eq!(rule(check_contiguous(&stream(&[2, 3, 4, 5]), 3, 5)), "contiguous", "revision 2 outside");
    }

    #[test]
    fn no_phantoms() {
        let attempted: HashSet<(String, Vec<u8>)> = [at(1), at(2)].into_iter().map(|event| (event.path, event.data)).collect();
        let delivery = Delivery { responses: vec![vec![at(1)], vec![event(7, "/gone", EventKind::Deleted)]] };
        assert_eq!(check_no_phantoms(&delivery, &attempted), Ok(()));
        let phantom = Event { data: b"never written".to_vec(), ..at(2) };
        let delivery = Delivery { responses: vec![vec![at(1)], vec![phantom]] };
        assert_eq!(rule(check_no_phantoms(&delivery, &attempted)), "no_phantoms");
    }

    #[test]
    fn same_sequence() {
        let leader = stream(&[1, 2, 3, 4]);
        let follower = Delivery { responses: vec![vec![at(2), at(3)], vec![at(4)]] };
        assert_eq!(check_same_sequence(&leader, &follower, 2, 4), Ok(()));
        let diverged = Delivery { responses: vec![vec![at(2), Event { data: b"stale".to_vec(), ..at(3) }, at(4)]] };
        let found = check_same_sequence(&leader, &diverged, 2, 4).expect_err("differs at revision 3");
        assert_eq!(found.rule, "same_sequence");
        assert!(found.detail.starts_with("position 1:"), "{found}");
        let shorter = check_same_sequence(&leader, &stream(&[2, 3]), 2, 4).expect_err("revision 4 missing");
        assert!(shorter.detail.ends_with("found end of sequence"), "{shorter}");
    }

    #[test]
    fn resumed() {
        let full = stream(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(check_resumed(&stream(&[2, 3]), &stream(&[4, 5]), &full), Ok(()));
        assert_eq!(check_resumed(&stream(&[]), &stream(&[1, 2]), &full), Ok(()));
        assert_eq!(check_resumed(&stream(&[1, 2]), &stream(&[]), &full), Ok(()));
        let repeated = check_resumed(&stream(&[2, 3]), &stream(&[3, 4]), &full).expect_err("revision 3 twice");
        assert_eq!(repeated.rule, "resumed");
        assert!(repeated.detail.starts_with("position 2:"), "{repeated}");
        assert_eq!(rule(check_resumed(&stream(&[2, 3]), &stream(&[5, 6]), &full)), "resumed", "revision 4 skipped");
        assert_eq!(rule(check_resumed(&stream(&[]), &stream(&[2, 3]), &full)), "resumed", "revision 1 skipped");
    }

    #[test]
    fn all() {
        assert_eq!(check_all(&stream(&[1, 2, 3])), Ok(()));
        assert_eq!(rule(check_all(&stream(&[2, 1]))), "ordered");
        assert_eq!(rule(check_all(&stream(&[1, 1]))), "unique");
        let split = Delivery { responses: vec![vec![at(1)], vec![event(1, "/b", EventKind::Created)]] };
        assert_eq!(rule(check_all(&split)), "atomic");
        let shown = check_all(&stream(&[2, 1])).expect_err("backwards").to_string();
        assert!(shown.starts_with("watch rule `ordered` violated: position 1"), "{shown}");
    }
}
