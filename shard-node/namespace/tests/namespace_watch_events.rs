//! The events a namespace replica publishes to its watch hub, observed through a recursive
//! persistent watch of `/` (catching up from the hub's history, or live).
//!
//! Checked: one revision's events form one batch in path order, at the revision the write
//! answered with; only node creations, data changes and deletions are events (a parent's
//! child count is not); every way a node disappears (recursive delete, emptied container,
//! session close or expiry, TTL expiry, unlock) is a deletion event; a node replaced within a
//! transaction is two events; previous states ride along only when asked; refused and
//! read-only requests publish nothing; replaying the event stream from revision 1 rebuilds
//! the namespace exactly (property test); and a restarted replica's history starts at its
//! stored revision, so older watches are told COMPACTED instead of silently missing events.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use support::{code, harness, leading_harness};
use warden_namespace::watch::hub::CatchUp;
use warden_namespace::watch::stream::{Outgoing, Phase, StreamWatch};
use warden_namespace::watch::{Event, EventKind, WatchHub, WatchSpec, WatchStream};
use warden_proto::namespace::AcquireLock;
use warden_proto::v1::compare::{Op as CmpOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_create::Kind;
use warden_proto::v1::*;
use warden_testkit::harness::Harness;

use EventKind::{Changed, Created, Deleted};

const WATCH_ID: u64 = 7;

/// One revision's events as a watch received them (only the events it selected).
type Batch = (u64, Vec<Event>);

fn hub(ns: &Harness) -> Arc<WatchHub> {
    ns.watch_hub().expect("the replica registers its watch hub")
}

/// A stream with one recursive watch of `/` (with previous states) from `start`, moved through
/// the history as far as it goes in one unbounded step.
fn open_watch(hub: &WatchHub, start: u64) -> (Arc<WatchStream>, CatchUp) {
    let stream = WatchStream::new(16 << 20);
    let watch = StreamWatch {
        charge: None,
        group: hub.group(),
        path: Arc::from("/"),
        spec: WatchSpec::new(Kind::Persistent, true, false, false, false, true),
        phase: Phase::CatchingUp { next_revision: start },
        progress_notify: false,
        active: false,
        resume_revisions: Arc::default(),
    };
    let created = Outgoing::Created { watch_id: WATCH_ID, group: hub.group(), revision: start - 1, created: Default::default() };
    stream.add(WATCH_ID, watch, created);
    let outcome = hub.catch_up(&stream, WATCH_ID, usize::MAX);
    (stream, outcome)
}

/// Every response queued on `stream` so far.
fn drain(stream: &WatchStream) -> Vec<Outgoing> {
    std::iter::from_fn(|| stream.try_next()).collect()
}

/// The event batches of `responses`, which must be nothing but the creation answer and events.
fn event_batches(responses: Vec<Outgoing>) -> Vec<Batch> {
    let mut batches = Vec::new();
    for response in responses {
        match response {
            Outgoing::Created { .. } => {}
            Outgoing::Events { batches: queued, with_prev, .. } => {
                assert!(with_prev, "the watch asked for previous states");
                for (batch, selected) in queued {
                    batches.push((batch.revision, selected.iter().map(|i| batch.events[*i as usize].clone()).collect()));
                }
            }
            other => panic!("a watch of everything got {other:?}"),
        }
    }
    batches
}

/// The batches published from revision `start` on, read back from the hub's history.
fn batches_since(hub: &WatchHub, start: u64) -> Vec<Batch> {
    let (stream, outcome) = open_watch(hub, start);
    assert_eq!(outcome, CatchUp::Live, "the history reaches back to revision {start}");
    event_batches(drain(&stream))
}

/// (revision, kind, path) of every event, in delivery order.
fn summary(batches: &[Batch]) -> Vec<(u64, EventKind, &str)> {
    batches.iter().flat_map(|(revision, events)| events.iter().map(move |e| (*revision, e.kind, e.path.as_str()))).collect()
}

fn op(op: Op) -> TxnOp {
    TxnOp { op: Some(op) }
}

fn create_op(path: &str, data: &[u8]) -> TxnOp {
    op(Op::Create(CreateRequest { path: path.into(), data: data.to_vec(), ..CreateRequest::default() }))
}

fn set_op(path: &str, data: &[u8]) -> TxnOp {
    op(Op::Set(SetRequest { path: path.into(), data: data.to_vec(), ..SetRequest::default() }))
}

fn delete_op(path: &str, recursive: bool) -> TxnOp {
    op(Op::Delete(DeleteRequest { path: path.into(), recursive, ..DeleteRequest::default() }))
}

fn revision_of(header: Option<ResponseHeader>) -> u64 {
    header.expect("a write answers with a header").revision
}

/// A multi-key write (a config reload) must reach watchers as one atomic step at the revision
/// the writer saw, sorted by path, without noise for parents whose child count moved.
#[test]
fn a_transaction_produces_one_revision_of_events_in_path_order() {
    let mut ns = harness();
    ns.create_simple("/z", b"old").expect("/z");
    ns.create_simple("/p", b"").expect("/p");
    let from = ns.revision().expect("revision") + 1;
    let ops = vec![set_op("/z", b"new"), create_op("/a", b"1"), create_op("/p/q", b"3"), create_op("/a/b", b"2")];
    let response = ns.txn(TxnRequest { then: ops, ..TxnRequest::default() }).expect("txn");
    let revision = revision_of(response.header);
    let batches = batches_since(&hub(&ns), from);
    assert_eq!(batches.len(), 1, "one transaction, one batch");
    assert_eq!(
        summary(&batches),
        vec![(revision, Created, "/a"), (revision, Created, "/a/b"), (revision, Created, "/p/q"), (revision, Changed, "/z")]
    );
    assert_eq!(hub(&ns).revision(), revision);
}

/// The root always exists, so no event may say it was created: a fresh cluster's first write
/// must not tell `/` watchers (an exists watch of `/`, a mirror) that the root appeared.
#[test]
fn the_first_write_to_a_fresh_namespace_reports_only_its_own_node() {
    let mut ns = harness();
    ns.create_simple("/first", b"").expect("/first");
    assert_eq!(summary(&batches_since(&hub(&ns), 1)), vec![(1, Created, "/first")]);
}

/// Tearing down a service's subtree, or its registry container emptying, must tell watchers
/// of every node that went (membership lists rely on deletions, not on polling).
#[test]
fn recursive_delete_and_container_removal_are_deletion_events() {
    let mut ns = harness();
    for path in ["/t", "/t/u", "/t/u/v", "/t/w"] {
        ns.create_simple(path, path.as_bytes()).expect("subtree node");
    }
    ns.create(CreateRequest { path: "/c".into(), kind: NodeKind::Container as i32, ..CreateRequest::default() }).expect("container");
    ns.create_simple("/c/only", b"member").expect("container child");
    let from = ns.revision().expect("revision") + 1;
    assert_eq!(ns.delete("/t", None, true).expect("recursive delete").deleted, 4);
    let subtree_gone = ns.revision().expect("revision");
    assert_eq!(ns.delete("/c/only", None, false).expect("delete").deleted, 2, "the emptied container goes too");
    let container_gone = ns.revision().expect("revision");
    let batches = batches_since(&hub(&ns), from);
    assert_eq!(
        summary(&batches),
        vec![
            (subtree_gone, Deleted, "/t"),
            (subtree_gone, Deleted, "/t/u"),
            (subtree_gone, Deleted, "/t/u/v"),
            (subtree_gone, Deleted, "/t/w"),
            (container_gone, Deleted, "/c"),
            (container_gone, Deleted, "/c/only"),
        ]
    );
    let wire = batches[0].1[2].to_proto(subtree_gone, true);
    assert_eq!((wire.data.len(), &wire.prev_data[..]), (0, b"/t/u/v".as_slice()), "a deletion carries the node as it was");
}

/// Replacing a node in one transaction is a new incarnation (new create_revision): a watcher
/// caching by create_revision (an election candidate's node) must see it go and come back.
#[test]
fn delete_and_recreate_in_one_transaction_is_two_events() {
    let mut ns = harness();
    let old = ns.create_simple("/x", b"old").expect("/x").stat.expect("stat");
    let from = ns.revision().expect("revision") + 1;
    let response = ns.txn(TxnRequest { then: vec![delete_op("/x", false), create_op("/x", b"new")], ..TxnRequest::default() }).expect("txn");
    let revision = revision_of(response.header);
    let batches = batches_since(&hub(&ns), from);
    assert_eq!(summary(&batches), vec![(revision, Deleted, "/x"), (revision, Created, "/x")]);
    let (gone, born) = (&batches[0].1[0], &batches[0].1[1]);
    assert_eq!((gone.node.stat.create_revision, &gone.node.data[..]), (old.create_revision, b"old".as_slice()));
    assert_eq!((born.node.stat.create_revision, &born.node.data[..]), (revision, b"new".as_slice()));
}

/// A config watcher asking for previous data gets the exact old value and stat (to diff a
/// reload); one not asking gets neither.
#[test]
fn set_carries_previous_data_and_stat() {
    let mut ns = harness();
    ns.create_simple("/cfg", b"v1").expect("/cfg");
    let before = ns.get("/cfg").expect("get");
    let from = ns.revision().expect("revision") + 1;
    let after = ns.set("/cfg", b"v2", Some(0)).expect("set").stat.expect("stat");
    let revision = ns.revision().expect("revision");
    let batches = batches_since(&hub(&ns), from);
    assert_eq!(summary(&batches), vec![(revision, Changed, "/cfg")]);
    let event = &batches[0].1[0];
    let with_prev = event.to_proto(revision, true);
    assert_eq!((with_prev.revision, with_prev.path.as_str(), &with_prev.data[..]), (revision, "/cfg", b"v2".as_slice()));
    assert_eq!(with_prev.stat, Some(after));
    assert_eq!((with_prev.prev_stat, &with_prev.prev_data[..]), (before.stat, &before.data[..]));
    let without = event.to_proto(revision, false);
    assert_eq!((without.prev_stat, without.prev_data.len(), without.stat), (None, 0, Some(after)));
}

/// A member leaving (session closed) or dying (session expired) must show up as deletions of
/// its ephemerals: that is how group membership and leader election notice departures.
#[test]
fn session_close_and_expiry_delete_ephemerals_as_events() {
    let mut ns = leading_harness();
    let closed = ns.create_session(10_000).expect("session").session_id;
    let lapsed = ns.create_session(3_000).expect("session").session_id;
    let alive = ns.create_session(600_000).expect("session").session_id;
    for (path, session_id) in [("/m/c2", closed), ("/m/c1", closed), ("/m/lapsed", lapsed), ("/m/alive", alive)] {
        ns.create(CreateRequest { path: path.into(), session_id, create_parents: true, ..CreateRequest::default() }).expect("ephemeral");
    }
    let from = ns.revision().expect("revision") + 1;
    let close_revision = revision_of(ns.close_session(closed).expect("close").header);
    // The lapsed session stops renewing; the leader (leading since 0) expires it at 3 s.
    ns.now_ms = 3_000;
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1, "one expiry entry");
    let expiry_revision = ns.revision().expect("revision");
    let batches = batches_since(&hub(&ns), from);
    assert_eq!(
        summary(&batches),
        vec![(close_revision, Deleted, "/m/c1"), (close_revision, Deleted, "/m/c2"), (expiry_revision, Deleted, "/m/lapsed")]
    );
    let owners: Vec<u64> = batches.iter().flat_map(|(_, events)| events.iter().map(|e| e.node.stat.ephemeral_owner)).collect();
    assert_eq!(owners, vec![closed, closed, lapsed], "deletions show the owner the node had");
}

/// A TTL node that lapses must be reported like any deletion, or its watchers keep stale state.
#[test]
fn ttl_expiry_is_a_deletion_event() {
    let mut ns = harness();
    let start = ns.now_ms;
    ns.create(CreateRequest { path: "/lease".into(), kind: NodeKind::Ttl as i32, ttl_ms: 1_000, ..CreateRequest::default() }).expect("ttl node");
    let from = ns.revision().expect("revision") + 1;
    assert_eq!(ns.leader_scan(start + 999).expect("scan"), 0, "not due yet");
    assert!(batches_since(&hub(&ns), from).is_empty());
    ns.now_ms = start + 1_000;
    assert_eq!(ns.leader_scan(start + 1_000).expect("scan"), 1);
    let revision = ns.revision().expect("revision");
    assert_eq!(summary(&batches_since(&hub(&ns), from)), vec![(revision, Deleted, "/lease")]);
}

/// Lock waiters are ephemeral nodes: a client watching a lock (to learn who holds it, or to
/// wait its turn) sees waiters come and go, and the lock container go with the last one.
#[test]
fn lock_waiters_appear_and_disappear() {
    let mut ns = leading_harness();
    let first = ns.create_session(10_000).expect("session").session_id;
    let second = ns.create_session(10_000).expect("session").session_id;
    ns.create_simple("/locks", b"").expect("the locks' parent");
    let acquire = |session_id| AcquireLock { path: "/locks/job".into(), session_id, mode: LockMode::Exclusive as i32, ..AcquireLock::default() };
    let from = ns.revision().expect("revision") + 1;
    let held = ns.lock(acquire(first)).expect("lock");
    let queued = ns.lock(acquire(second)).expect("lock");
    let (held_seq, queued_seq) = (held.sequencer.clone().expect("sequencer"), queued.sequencer.clone().expect("sequencer"));
    assert_eq!((held_seq.waiter.as_str(), queued_seq.waiter.as_str()), ("/locks/job/lock-0000000000", "/locks/job/lock-0000000001"));
    ns.unlock(held_seq).expect("unlock");
    let released = ns.revision().expect("revision");
    ns.unlock(queued_seq).expect("unlock");
    let emptied = ns.revision().expect("revision");
    let (r1, r2) = (revision_of(held.header), revision_of(queued.header));
    let batches = batches_since(&hub(&ns), from);
    assert_eq!(
        summary(&batches),
        vec![
            (r1, Created, "/locks/job"),
            (r1, Created, "/locks/job/lock-0000000000"),
            (r2, Created, "/locks/job/lock-0000000001"),
            (released, Deleted, "/locks/job/lock-0000000000"),
            (emptied, Deleted, "/locks/job"),
            (emptied, Deleted, "/locks/job/lock-0000000001"),
        ],
        "the grant to the second waiter is not a node change"
    );
    let owners: Vec<u64> =
        batches.iter().flat_map(|(_, events)| events.iter()).filter(|e| e.path != "/locks/job").map(|e| e.node.stat.ephemeral_owner).collect();
    assert_eq!(owners, vec![first, second, first, second], "waiters are owned by their sessions");
}

/// Refused writes and reads must be invisible to watchers: no phantom events, and the
/// published revision (what progress notifications report) does not move.
#[test]
fn failed_and_read_only_operations_produce_no_events() {
    let mut ns = harness();
    ns.create_simple("/n", b"v").expect("/n");
    let hub = hub(&ns);
    let (revision, history) = (hub.revision(), batches_since(&hub, 1));
    assert_eq!(code(ns.create_simple("/n", b"again")), Code::NodeExists);
    assert_eq!(code(ns.set("/n", b"w", Some(7))), Code::BadVersion);
    let compare = Compare { path: "/n".into(), target: Target::Version as i32, op: CmpOp::Equal as i32, number: 99, ..Compare::default() };
    let failed = ns.txn(TxnRequest { compares: vec![compare], then: vec![set_op("/n", b"w")], ..TxnRequest::default() }).expect("txn");
    assert!(!failed.succeeded && failed.results.is_empty());
    let get = op(Op::Get(GetRequest { path: "/n".into(), ..GetRequest::default() }));
    assert!(ns.txn(TxnRequest { then: vec![get], ..TxnRequest::default() }).expect("read-only txn").succeeded);
    assert_eq!(ns.get("/n").expect("get").data, b"v");
    assert_eq!((hub.revision(), ns.revision().expect("revision")), (revision, revision));
    assert_eq!(batches_since(&hub, 1), history);
    assert!(batches_since(&hub, revision + 1).is_empty());
}

/// One operation of a generated transaction.
#[derive(Clone, Debug)]
enum OpSpec {
    Create { path: &'static str, data: Vec<u8>, parents: bool, container: bool },
    Set { path: &'static str, data: Vec<u8> },
    Delete { path: &'static str, recursive: bool },
}

impl OpSpec {
    fn to_op(&self) -> TxnOp {
        match self {
            OpSpec::Create { path, data, parents, container } => op(Op::Create(CreateRequest {
                path: path.to_string(),
                data: data.clone(),
                create_parents: *parents,
                kind: if *container { NodeKind::Container as i32 } else { NodeKind::Persistent as i32 },
                ..CreateRequest::default()
            })),
            OpSpec::Set { path, data } => set_op(path, data),
            OpSpec::Delete { path, recursive } => delete_op(path, *recursive),
        }
    }
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    let path = prop_oneof![Just("/a"), Just("/b"), Just("/a/c"), Just("/a/d"), Just("/b/e"), Just("/a/c/f")];
    let data = vec(prop_oneof![Just(b'x'), Just(b'y')], 0..=2);
    prop_oneof![
        4 => (path.clone(), data.clone(), any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(path, data, parents, container)| OpSpec::Create { path, data, parents, container }),
        2 => (path.clone(), data).prop_map(|(path, data)| OpSpec::Set { path, data }),
        2 => (path, any::<bool>()).prop_map(|(path, recursive)| OpSpec::Delete { path, recursive }),
    ]
}

/// What a watcher can know of a node from events: data, create_revision, mod_revision and
/// version (not the child counts, which change without events of their own).
type Known = (Vec<u8>, u64, u64, u64);

/// Nodes by path, root excluded.
type Model = BTreeMap<String, Known>;

fn known(data: &[u8], stat: &Stat) -> Known {
    (data.to_vec(), stat.create_revision, stat.mod_revision, stat.version)
}

/// Every node of the namespace but the root, as the harness reads it.
fn contents(ns: &Harness) -> Model {
    let mut nodes = BTreeMap::new();
    let mut pending = vec!["/".to_string()];
    while let Some(parent) = pending.pop() {
        for name in ns.all_children(&parent).expect("children") {
            let path = if parent == "/" { format!("/{name}") } else { format!("{parent}/{name}") };
            let node = ns.get(&path).expect("get a listed child");
            nodes.insert(path.clone(), known(&node.data, &node.stat.unwrap_or_default()));
            pending.push(path);
        }
    }
    nodes
}

/// Applies `batches` to `model` as a mirroring client would, checking each event makes sense.
fn replay(model: &mut Model, batches: &[Batch]) -> Result<(), TestCaseError> {
    for (revision, events) in batches {
        for event in events {
            prop_assert_ne!(event.path.as_str(), "/", "the root always exists: no event at {} concerns it", revision);
            prop_assert_eq!(model.contains_key(&event.path), event.kind != Created, "{:?} of {} at {}", event.kind, event.path, revision);
            if event.kind == Deleted {
                model.remove(&event.path);
            } else {
                model.insert(event.path.clone(), known(&event.node.data, &event.node.stat));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// A client that mirrors the namespace from nothing but the event stream from revision 1
    /// (a config cache, a membership view) matches it after every write: each write that took
    /// a revision and changed a node has exactly one batch, at that revision; live delivery
    /// and history replay agree.
    #[test]
    fn events_replayed_onto_a_model_rebuild_the_namespace(steps in vec(vec(op_spec(), 1..=3), 1..=60)) {
        let mut ns = harness();
        let hub = hub(&ns);
        let (live, outcome) = open_watch(&hub, 1);
        prop_assert_eq!(outcome, CatchUp::Live);
        let mut model = Model::new();
        let mut received = Vec::new();
        for ops in &steps {
            let before = ns.revision().expect("revision");
            // Refusals are expected (missing parents, versions, non-empty deletes): they must
            // simply leave no trace.
            let outcome = ns.txn(TxnRequest { then: ops.iter().map(OpSpec::to_op).collect(), ..TxnRequest::default() });
            let after = ns.revision().expect("revision");
            // Every op here writes: a transaction takes a revision exactly when it succeeds.
            let answered = outcome.map(|response| revision_of(response.header)).ok();
            prop_assert_eq!(answered, (after != before).then_some(before + 1));
            prop_assert_eq!(answered.unwrap_or(before), after);
            // Events are each node's net change: a transaction whose creates and deletes cancel
            // out takes a revision (the parent's cversion moved) but publishes no batch.
            let batches = event_batches(drain(&live));
            let revisions: Vec<u64> = batches.iter().map(|(revision, _)| *revision).collect();
            prop_assert!(revisions.iter().all(|r| Some(*r) == answered) && revisions.len() <= 1, "batches {:?} for {:?}", revisions, ops);
            replay(&mut model, &batches)?;
            prop_assert_eq!(&model, &contents(&ns), "after {:?}", ops);
            received.extend(batches);
        }
        prop_assert_eq!(batches_since(&hub, 1), received, "the history holds what was pushed live");
        prop_assert_eq!(hub.revision(), ns.revision().expect("revision"));
    }
}

/// After a restart the replica holds no events from before it: a watcher resuming from an
/// older revision must be told COMPACTED (and re-read), never silently miss changes; one
/// resuming from the present gets the next write.
#[test]
fn reopen_starts_the_history_at_the_stored_revision() {
    let mut ns = harness();
    ns.create_simple("/a", b"1").expect("/a");
    ns.create_simple("/b", b"2").expect("/b");
    ns.set("/a", b"3", None).expect("set");
    let stored = ns.revision().expect("revision");
    let old_hub = hub(&ns);
    ns.reopen().expect("reopen");
    let new_hub = hub(&ns);
    assert!(!Arc::ptr_eq(&old_hub, &new_hub), "a rebuilt replica has a new hub");
    assert_eq!((new_hub.compact_revision(), new_hub.revision()), (stored, stored));
    for start in [1, stored] {
        let (stream, outcome) = open_watch(&new_hub, start);
        assert_eq!(outcome, CatchUp::Ended, "revision {start} is before the history");
        let responses = drain(&stream);
        let Some(Outgoing::Canceled { error: Some(error), resume_revision, .. }) = responses.last() else {
            panic!("expected a cancellation, got {responses:?}")
        };
        assert_eq!((Code::try_from(error.code).ok(), error.compact_revision, *resume_revision), (Some(Code::Compacted), stored, start));
        assert_eq!(responses.len(), 2, "the creation answer, then the cancellation: {responses:?}");
    }
    let (stream, outcome) = open_watch(&new_hub, stored + 1);
    assert_eq!(outcome, CatchUp::Live);
    ns.create_simple("/c", b"4").expect("/c");
    let batches = event_batches(drain(&stream));
    assert_eq!(summary(&batches), vec![(stored + 1, Created, "/c")], "pushed live by the new hub");
    let (_, outcome) = open_watch(&old_hub, stored + 1);
    assert_eq!(outcome, CatchUp::Ended, "the replaced replica's hub serves nothing");
}

/// A transaction with `raise_to` reads (and writes) its group as of that revision: raised
/// from below, it takes exactly that revision even when it changes no node, publishes no
/// event for the raise, and the group's next write lands above it; a group already at or
/// past it runs the transaction as without.
#[test]
fn a_transaction_raising_the_revision_reads_there_and_the_next_write_lands_above_it() {
    let mut ns = leading_harness();
    let write = |ns: &mut Harness, path: &str| {
        revision_of(ns.txn(TxnRequest { then: vec![create_op(path, b"")], ..TxnRequest::default() }).expect("create").header)
    };
    let read = write(&mut ns, "/a");
    let range = || op(Op::Range(RangeRequest { path: "/".into(), ..RangeRequest::default() }));
    let raised = ns.txn(TxnRequest { then: vec![range()], raise_to: read + 10, ..TxnRequest::default() }).expect("raise");
    assert_eq!(revision_of(raised.header), read + 10, "raised to exactly the revision asked");
    let again = ns.txn(TxnRequest { then: vec![range()], raise_to: read + 5, ..TxnRequest::default() }).expect("raise");
    assert_eq!(revision_of(again.header), read + 10, "never lowered: a read-only transaction at or past it writes nothing");
    let next = write(&mut ns, "/b");
    assert_eq!(next, read + 11, "the next write takes the revision after the raise");
    let hub = hub(&ns);
    assert_eq!(summary(&batches_since(&hub, read + 1)), [(read + 11, Created, "/b")], "the raise itself is no event");
    let nested = TxnRequest { then: vec![op(Op::Txn(TxnRequest { raise_to: 1, ..TxnRequest::default() }))], ..TxnRequest::default() };
    assert_eq!(code(ns.txn(nested)), Code::InvalidArgument, "only the top level raises");
    let too_high = TxnRequest { raise_to: warden_namespace::REVISION_FLOOR_MAX + 1, ..TxnRequest::default() };
    assert_eq!(code(ns.txn(too_high)), Code::InvalidArgument);
}
