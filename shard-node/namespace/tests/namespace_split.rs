//! Moving a subtree between two groups' state machines, step by step as the
//! placement leader drives it: freeze at the source, export pages, ingest at the target,
//! hand-over (or abort) at the source, descriptor at the target. What must survive exactly:
//! data and stat, sequential counters, locks with their holders, waiters and tokens, TTL
//! nodes, ephemerals of sessions homed anywhere (as remote records at the target). And back:
//! a merge gives the new group's whole subtree to the group of its parent path.

mod support;

use support::code;
use warden_namespace::sessions::session_id;
use warden_namespace::Limits;
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::{AbortSplit, AcquireLock, ExportSubtree, FreezeSubtree, HandSubtree, IngestSubtree, SubtreePage, SubtreeRecord};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_testkit::harness::{Harness, Outcome};

const SOURCE: u64 = 1;
const TARGET: u64 = 7;

fn descriptor(group_id: u64, prefix: &str, excluded: &[&str], version: u64) -> GroupDescriptor {
    GroupDescriptor {
        group_id,
        prefix: prefix.into(),
        excluded: excluded.iter().map(|e| e.to_string()).collect(),
        replicas: vec![1],
        conf_ver: 1,
        version,
    }
}

fn leading(group: u64) -> Harness {
    let mut ns = Harness::for_group(Limits::default(), group).expect("harness");
    ns.set_leading(true, 0);
    ns
}

fn freeze(ns: &mut Harness, prefix: &str, target: u64) -> Outcome<u64> {
    ns.placement_step(CommandOp::FreezeSubtree(FreezeSubtree { prefix: prefix.into(), target_group: target, into_group: 0 }))
}

/// A merge's freeze: operation `operation` gives the whole subtree to `into`.
fn freeze_for_merge(ns: &mut Harness, prefix: &str, operation: u64, into: u64) -> Outcome<u64> {
    ns.placement_step(CommandOp::FreezeSubtree(FreezeSubtree { prefix: prefix.into(), target_group: operation, into_group: into }))
}

fn hand(ns: &mut Harness, target: u64, served: GroupDescriptor) -> Outcome<u64> {
    ns.placement_step(CommandOp::HandSubtree(HandSubtree { target_group: target, descriptor: Some(served) }))
}

/// Lets the leader propose (and the harness apply) what it would on its own until it has
/// nothing more: the pages of the subtrees the group purges after a hand-over or an abort.
fn purge(ns: &mut Harness) {
    while ns.leader_scan(1).expect("leader proposals") > 0 {}
}

fn abort(ns: &mut Harness, target: u64) -> Outcome<u64> {
    ns.placement_step(CommandOp::AbortSplit(AbortSplit { target_group: target }))
}

fn ingest(ns: &mut Harness, prefix: &str, page: SubtreePage) -> Outcome<u64> {
    ingest_for(ns, prefix, TARGET, page)
}

/// Ingests `page` as the placement leader does: its records with the owners of their sessions,
/// from the group they leave (the split's pages from SOURCE, a merge's from TARGET).
fn ingest_for(ns: &mut Harness, prefix: &str, operation: u64, page: SubtreePage) -> Outcome<u64> {
    let source_group = if operation == TARGET { SOURCE } else { TARGET };
    let ingest = IngestSubtree { prefix: prefix.into(), source_group, records: page.records, operation, sessions: page.sessions };
    ns.placement_step(CommandOp::IngestSubtree(ingest))
}

/// Every page of the export, `bytes_max` each.
fn export_all(ns: &Harness, prefix: &str, target: u64, bytes_max: u32) -> Vec<SubtreePage> {
    let mut pages = Vec::new();
    let mut after_key = Vec::new();
    loop {
        let page = ns
            .export_page(ExportSubtree { prefix: prefix.into(), target_group: target, after_key: after_key.clone(), bytes_max })
            .expect("export page");
        let done = page.next_after_key.is_empty();
        after_key = page.next_after_key.clone();
        pages.push(page);
        if done {
            return pages;
        }
    }
}

fn create(ns: &mut Harness, path: &str, data: &[u8], session_id: u64) -> CreateResponse {
    ns.create(CreateRequest { path: path.into(), data: data.to_vec(), session_id, ..CreateRequest::default() }).expect(path)
}

fn acquire(path: &str, session_id: u64, request_id: u64) -> AcquireLock {
    AcquireLock { path: path.into(), session_id, mode: LockMode::Exclusive as i32, request_id, ..AcquireLock::default() }
}

/// The subtree every test moves: plain nodes, a sequential counter, a TTL node, ephemerals
/// of a session homed in the source and of one homed in a third group, and a lock held by
/// one and waited for by the other.
struct Team {
    own_session: u64,
    remote_session: u64,
    holder: Sequencer,
    waiter: Sequencer,
}

fn populate(ns: &mut Harness) -> Team {
    ns.set_descriptor(descriptor(SOURCE, "/", &[], 1), 0).expect("source descriptor");
    let own_session = ns.create_session(10_000).expect("session").session_id;
    let remote_session = session_id(3, 1);
    ns.add_remote_sessions(&[remote_session]).expect("remote session");
    create(ns, "/team", b"", 0);
    create(ns, "/team/a", b"root of the move", 0);
    create(ns, "/team/a/x", b"x data", 0);
    ns.set("/team/a/x", b"x data v2", None).expect("set");
    create(ns, "/team/a/x/deep", b"deep", 0);
    ns.create(CreateRequest { path: "/team/a/seq-".into(), sequential: true, ..CreateRequest::default() }).expect("sequential");
    ns.create(CreateRequest { path: "/team/a/ttl".into(), kind: NodeKind::Ttl as i32, ttl_ms: 60_000, ..CreateRequest::default() }).expect("ttl");
    create(ns, "/team/a/own-e", b"", own_session);
    create(ns, "/team/a/remote-e", b"", remote_session);
    create(ns, "/team/a-sibling", b"stays", own_session);
    create(ns, "/other", b"stays", 0);
    let holder = ns.lock(acquire("/team/a/lock", own_session, 1)).expect("lock").sequencer.expect("holder");
    let waiter = ns.lock(acquire("/team/a/lock", remote_session, 2)).expect("lock").sequencer.expect("waiter");
    Team { own_session, remote_session, holder, waiter }
}

/// Every node of the subtree with its data and stat, by path.
fn snapshot(ns: &Harness, root: &str) -> Vec<(String, Vec<u8>, Stat)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_string()];
    while let Some(path) = stack.pop() {
        let node = ns.get(&path).expect("get");
        out.push((path.clone(), node.data, node.stat.expect("stat")));
        for name in ns.all_children(&path).expect("children") {
            stack.push(format!("{path}/{name}"));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn a_split_moves_data_stat_locks_and_ephemerals_exactly() {
    let mut source = leading(SOURCE);
    let team = populate(&mut source);
    let before = snapshot(&source, "/team/a");
    assert!(before.len() >= 9, "{before:?}");
    let frozen_at = freeze(&mut source, "/team/a", TARGET).expect("freeze");

    // Frozen: writes into the subtree are retryable refusals that change nothing; reads and
    // writes elsewhere go on.
    let revision = source.revision().expect("revision");
    assert_eq!(code(source.set("/team/a/x", b"no", None)), Code::Unavailable);
    assert_eq!(code(source.create_simple("/team/a/new", b"")), Code::Unavailable);
    assert_eq!(code(source.delete("/team", None, true)), Code::Unavailable, "a recursive delete above it");
    assert_eq!(code(source.lock(acquire("/team/a/lock", team.own_session, 3))), Code::Unavailable);
    assert_eq!(code(source.unlock(team.holder.clone())), Code::Unavailable);
    assert_eq!(code(source.close_session(team.own_session)), Code::Unavailable, "it owns a node in the subtree");
    assert_eq!(source.revision().expect("revision"), revision, "refusals change nothing");
    assert_eq!(source.get("/team/a/x").expect("read").data, b"x data v2");
    source.set("/other", b"changed", None).expect("a write elsewhere");
    source.set("/team/a-sibling", b"changed", None).expect("a sibling sharing the name's start is not frozen");
    assert_eq!(freeze(&mut source, "/team/a", TARGET).expect("again"), source.revision().expect("revision"), "idempotent");
    assert_eq!(code(freeze(&mut source, "/other", TARGET + 1)), Code::Unavailable, "one split at a time");

    // The copy, in small pages, ingested twice (a retried page changes nothing).
    let mut target = leading(TARGET);
    let pages = export_all(&source, "/team/a", TARGET, 64);
    assert!(pages.len() > 5, "small pages: {}", pages.len());
    for page in pages.iter().chain(&pages) {
        ingest(&mut target, "/team/a", page.clone()).expect("ingest");
    }
    let outside = SubtreeRecord { key: b"n/other".to_vec(), value: Vec::new() };
    assert_eq!(
        code(ingest(&mut target, "/team/a", SubtreePage { records: vec![outside], ..SubtreePage::default() })),
        Code::InvalidArgument,
        "a record outside the subtree"
    );

    let handed_at = hand(&mut source, TARGET, descriptor(SOURCE, "/", &["/team/a"], 2)).expect("hand over");
    assert!(handed_at > frozen_at);
    assert_eq!(code(abort(&mut source, TARGET)), Code::NodeExists, "handed over: it can only finish");
    assert_eq!(hand(&mut source, TARGET, descriptor(SOURCE, "/", &["/team/a"], 2)).expect("again"), handed_at, "idempotent");
    assert_eq!(code(source.get("/team/a/x")), Code::WrongGroup);
    assert_eq!(source.all_children("/team").expect("children"), vec!["a-sibling".to_string()], "the moved root left its parent");
    assert_eq!(source.get("/team/a-sibling").expect("sibling").data, b"changed");
    assert_eq!(source.sessions_known(&[team.own_session]).expect("known"), vec![team.own_session], "the session lives on at home");
    assert_eq!(code(source.close_session(team.own_session)), Code::Unavailable, "its moved node is still being purged");
    purge(&mut source);
    source.close_session(team.own_session).expect("no node of it is here any more");

    target.set_descriptor(descriptor(TARGET, "/team/a", &[], 1), handed_at).expect("target descriptor");
    assert_eq!(snapshot(&target, "/team/a"), before, "every node with its data and stat");
    let info = target.lock_info("/team/a/lock").expect("lock info");
    assert_eq!(info.holders.iter().map(|h| h.token).collect::<Vec<_>>(), vec![team.holder.token], "the same holder");
    assert_eq!(info.waiters.iter().map(|w| w.token).collect::<Vec<_>>(), vec![team.waiter.token], "the same waiter");
    assert!(target.check_sequencer(&team.holder).expect("check"), "a pre-move sequencer still holds");
    let next = target.create(CreateRequest { path: "/team/a/seq-".into(), sequential: true, ..CreateRequest::default() }).expect("seq");
    assert_eq!(next.path, "/team/a/seq-0000000001", "the counter goes on");
    assert!(next.stat.expect("stat").create_revision > handed_at, "revisions (tokens) start above the source's");
    let mut remote = target.remote_sessions().expect("remote");
    remote.sort_unstable();
    assert_eq!(remote, vec![team.own_session, team.remote_session], "both owners are remote sessions here");
    assert_eq!(code(ingest(&mut target, "/team/a", pages[0].clone())), Code::InvalidArgument, "no page after the descriptor");

    // The home group's verdict still ends the moved ephemerals, and the waiter's session
    // going makes nobody else hold.
    target.end_remote_sessions(&[team.own_session], false).expect("ended at home");
    assert!(target.exists("/team/a/own-e").expect("exists").is_none());
    let info = target.lock_info("/team/a/lock").expect("lock info");
    assert_eq!(info.holders.iter().map(|h| h.token).collect::<Vec<_>>(), vec![team.waiter.token], "the waiter holds now");
}

/// A subtree whose move would break a lock, a session's node or a sequential counter is
/// refused at the freeze, and the refusal changes nothing: the lock keeps its holder and
/// waiter, the group stays writable, and a split of the subtree above goes ahead.
#[test]
fn a_freeze_is_refused_at_a_lock_its_waiters_an_ephemeral_or_a_name_a_sequential_create_may_take() {
    let mut source = leading(SOURCE);
    let team = populate(&mut source);
    let revision = source.revision().expect("revision");
    let refused = [
        ("/team/a/lock", "a held lock"),
        (team.holder.waiter.as_str(), "the holder's waiter"),
        (team.waiter.waiter.as_str(), "a queued waiter"),
        ("/team/a/lock/lock-0000009999", "a name in the lock's queue"),
        ("/team/a/own-e", "an ephemeral node"),
        ("/team/a/own-e/below", "below an ephemeral node"),
        ("/team/a/seq-0000000005", "a name the sequential counter of /team/a will give"),
    ];
    for (prefix, what) in refused {
        assert_eq!(code(freeze(&mut source, prefix, TARGET)), Code::InvalidArgument, "{what}: {prefix}");
    }
    assert_eq!(source.revision().expect("revision"), revision, "refusals change nothing");
    assert!(source.check_sequencer(&team.holder).expect("check"), "the holder still holds");
    let info = source.lock_info("/team/a/lock").expect("lock info");
    assert_eq!(info.waiters.iter().map(|w| w.token).collect::<Vec<_>>(), vec![team.waiter.token], "the waiter still waits");
    source.set("/team/a/x", b"not frozen", None).expect("the subtree stays writable");
    freeze(&mut source, "/team/a/seq-0000000000", TARGET).expect("a sequential node that exists moves");
    abort(&mut source, TARGET).expect("abort");
    freeze(&mut source, "/team/a", TARGET + 1).expect("the subtree above the lock moves");
}

/// A freeze an older binary applied at a waiter (today's rules refuse it) still stops the
/// waiter's release: what a release deletes is the waiter, not its lock.
#[test]
fn a_release_is_refused_while_its_waiter_is_frozen() {
    let mut source = leading(SOURCE);
    let team = populate(&mut source);
    source
        .rewrite_split_state(|state| {
            state.frozen_prefix = team.holder.waiter.clone();
            state.frozen_for = TARGET;
        })
        .expect("an older binary's freeze");
    assert_eq!(code(source.unlock(team.holder.clone())), Code::Unavailable);
    assert!(source.check_sequencer(&team.holder).expect("check"), "the holder still holds");
}

/// A node above a subtree that is moving, or has moved, to another group becomes neither a
/// lock nor an ephemeral node: the subtree's root is its child, and a lock's children are
/// its waiters only (a merge would bring that child back).
#[test]
fn a_node_above_a_moving_or_moved_subtree_becomes_neither_a_lock_nor_an_ephemeral() {
    let mut source = leading(SOURCE);
    source.set_descriptor(descriptor(SOURCE, "/", &[], 1), 0).expect("source descriptor");
    let session = source.create_session(10_000).expect("session").session_id;
    create(&mut source, "/moved", b"", 0);
    create(&mut source, "/moved/sub", b"", 0);
    freeze(&mut source, "/moved/sub", TARGET).expect("freeze");
    hand(&mut source, TARGET, descriptor(SOURCE, "/", &["/moved/sub"], 2)).expect("hand over");
    assert_eq!(code(source.lock(acquire("/moved", session, 1))), Code::InvalidArgument, "a moved subtree's parent");
    freeze(&mut source, "/moving/sub", TARGET + 1).expect("freeze where no node is yet");
    assert_eq!(code(source.lock(acquire("/moving", session, 2))), Code::Unavailable, "a moving subtree's parent");
    let ephemeral = CreateRequest { path: "/moving".into(), session_id: session, ..CreateRequest::default() };
    assert_eq!(code(source.create(ephemeral)), Code::Unavailable, "an ephemeral above a moving subtree");
}

#[test]
fn an_aborted_split_unfreezes_and_refuses_its_late_steps() {
    let mut source = leading(SOURCE);
    let team = populate(&mut source);
    freeze(&mut source, "/team/a", TARGET).expect("freeze");
    abort(&mut source, TARGET).expect("abort");
    source.set("/team/a/x", b"writable again", None).expect("unfrozen");
    assert_eq!(code(hand(&mut source, TARGET, descriptor(SOURCE, "/", &["/team/a"], 2))), Code::InvalidArgument, "a late hand-over");
    assert_eq!(code(freeze(&mut source, "/team/a", TARGET)), Code::InvalidArgument, "a late freeze");
    abort(&mut source, TARGET).expect("abort is idempotent");
    assert!(source.check_sequencer(&team.holder).expect("check"));
    // A later split (a new target id) goes ahead.
    freeze(&mut source, "/team/a", TARGET + 1).expect("a new split");
}

#[test]
fn a_replica_applying_freeze_and_hand_over_in_one_batch_moves_the_last_writes_too() {
    let mut lagging = leading(SOURCE);
    populate(&mut lagging);
    let command = |op: CommandOp| warden_proto::namespace::Command { now_ms: 1, principal: String::new(), op: Some(op) };
    use prost::Message as _;
    let write = CreateRequest { path: "/team/a/last".into(), ..CreateRequest::default() };
    let batch = [
        command(CommandOp::Txn(TxnRequest { then: vec![TxnOp { op: Some(txn_op::Op::Create(write)) }], ..TxnRequest::default() })),
        command(CommandOp::FreezeSubtree(FreezeSubtree { prefix: "/team/a".into(), target_group: TARGET, into_group: 0 })),
        command(CommandOp::HandSubtree(HandSubtree { target_group: TARGET, descriptor: Some(descriptor(SOURCE, "/", &["/team/a"], 2)) })),
    ]
    .map(|c| c.encode_to_vec());
    lagging.apply_batch(&batch).expect("applied");
    purge(&mut lagging);
    let reader = lagging.reader();
    for path in ["/team/a/last", "/team/a", "/team/a/x"] {
        assert!(warden_namespace::store::read_node(&reader, path).expect("read").is_none(), "{path} left");
    }
    assert!(warden_namespace::store::read_node(&reader, "/team/a-sibling").expect("read").is_some());
}

/// Splits `/team/a` off `source` into a new group and answers it, with the hand-over's revision.
fn split_off(source: &mut Harness) -> (Harness, u64) {
    freeze(source, "/team/a", TARGET).expect("freeze");
    let mut target = leading(TARGET);
    for page in export_all(source, "/team/a", TARGET, 1 << 20) {
        ingest(&mut target, "/team/a", page).expect("ingest");
    }
    let handed_at = hand(source, TARGET, descriptor(SOURCE, "/", &["/team/a"], 2)).expect("hand over");
    purge(source);
    target.set_descriptor(descriptor(TARGET, "/team/a", &[], 1), handed_at).expect("target descriptor");
    (target, handed_at)
}

/// The merge operation's id (above the split's, as placement allocates them).
const MERGE: u64 = TARGET + 2;

#[test]
fn a_merge_gives_the_whole_subtree_back_to_the_parents_group_exactly() {
    let mut parent = leading(SOURCE);
    let team = populate(&mut parent);
    let (mut merging, _) = split_off(&mut parent);
    merging.set("/team/a/x", b"written in the split-off group", None).expect("write");
    let before = snapshot(&merging, "/team/a");

    // The whole subtree freezes, its root included; no session starts in a merging group.
    assert_eq!(code(freeze_for_merge(&mut merging, "/team/a/x", MERGE, SOURCE)), Code::InvalidArgument, "a merge moves the whole subtree");
    let frozen_at = freeze_for_merge(&mut merging, "/team/a", MERGE, SOURCE).expect("freeze");
    assert_eq!(code(merging.set("/team/a", b"no", None)), Code::Unavailable);
    assert_eq!(code(merging.create_session(10_000)), Code::Unavailable);

    // The parent's group takes the pages while it does not serve the prefix: invisible there.
    let pages = export_all(&merging, "/team/a", MERGE, 64);
    assert_eq!(code(ingest_for(&mut parent, "/team/a", TARGET, pages[0].clone())), Code::InvalidArgument, "a settled operation's page");
    for page in pages.iter().chain(&pages) {
        ingest_for(&mut parent, "/team/a", MERGE, page.clone()).expect("ingest");
    }
    assert_eq!(code(parent.get("/team/a/x")), Code::WrongGroup, "not served before its descriptor");

    let retiring = descriptor(TARGET, "/team/a", &["/team/a"], 2);
    let handed_at = hand(&mut merging, MERGE, retiring).expect("hand over");
    assert!(handed_at > frozen_at);
    assert_eq!(code(abort(&mut merging, MERGE)), Code::NodeExists, "handed over: it can only finish");
    assert_eq!(code(merging.get("/team/a/x")), Code::WrongGroup, "the merged group serves nothing");
    assert_eq!(code(merging.create_session(10_000)), Code::WrongGroup, "and homes no new session");
    parent.set_descriptor(descriptor(SOURCE, "/", &[], 3), handed_at).expect("the parent serves the prefix again");

    assert_eq!(snapshot(&parent, "/team/a"), before, "every node with its data and stat");
    assert_eq!(parent.all_children("/team").expect("children"), vec!["a".to_string(), "a-sibling".to_string()], "the root rejoins its parent");
    assert_eq!(parent.get("/team").expect("parent").stat.expect("stat").num_children, 2);
    let info = parent.lock_info("/team/a/lock").expect("lock info");
    assert_eq!(info.holders.iter().map(|h| h.token).collect::<Vec<_>>(), vec![team.holder.token], "the same holder");
    assert!(parent.check_sequencer(&team.holder).expect("check"), "a sequencer of the first group still holds");
    let fresh = parent.create_simple("/team/a/fresh", b"").expect("writable");
    assert!(fresh.stat.expect("stat").create_revision > handed_at, "revisions (tokens) go on above the merged group's");
    assert_eq!(code(ingest_for(&mut parent, "/team/a", MERGE, pages[0].clone())), Code::InvalidArgument, "no page once served");
    assert_eq!(parent.remote_sessions().expect("remote"), vec![team.remote_session], "a session homed here is its own again");
    parent.close_session(team.own_session).expect("close at home");
    assert!(parent.exists("/team/a/own-e").expect("exists").is_none(), "its ephemeral in the merged subtree goes with it");
}

#[test]
fn an_aborted_merge_leaves_nothing_in_the_parents_group() {
    let mut parent = leading(SOURCE);
    populate(&mut parent);
    let (mut merging, _) = split_off(&mut parent);
    freeze_for_merge(&mut merging, "/team/a", MERGE, SOURCE).expect("freeze");
    for page in export_all(&merging, "/team/a", MERGE, 64) {
        ingest_for(&mut parent, "/team/a", MERGE, page).expect("ingest");
    }
    abort(&mut merging, MERGE).expect("abort at the merging group");
    merging.set("/team/a/x", b"writable again", None).expect("unfrozen");
    abort(&mut parent, MERGE).expect("abort at the parent's group: its pages go");
    let again = |parent: &mut Harness| ingest_for(parent, "/team/a", MERGE + 1, SubtreePage::default());
    assert_eq!(code(again(&mut parent)), Code::Unavailable, "a merge of the same subtree waits while its pages are purged");
    purge(&mut parent);
    let reader = parent.reader();
    for path in ["/team/a", "/team/a/x", "/team/a/lock"] {
        assert!(warden_namespace::store::read_node(&reader, path).expect("read").is_none(), "{path} was left behind");
    }
    assert_eq!(code(ingest_for(&mut parent, "/team/a", MERGE, SubtreePage::default())), Code::InvalidArgument, "a late page of the aborted merge");
    assert_eq!(parent.all_children("/team").expect("children"), vec!["a-sibling".to_string()], "the parent is as it was");
    again(&mut parent).expect("a later merge goes ahead once they are gone");
}

#[test]
fn what_the_parents_group_would_change_in_an_ingested_subtree_waits_until_it_serves_it() {
    let mut parent = leading(SOURCE);
    let team = populate(&mut parent);
    let (mut merging, _) = split_off(&mut parent);
    freeze_for_merge(&mut merging, "/team/a", MERGE, SOURCE).expect("freeze");
    for page in export_all(&merging, "/team/a", MERGE, 1 << 20) {
        ingest_for(&mut parent, "/team/a", MERGE, page).expect("ingest");
    }
    let present = |ns: &Harness, path: &str| warden_namespace::store::read_node(&ns.reader(), path).expect("read").is_some();

    // Not served yet: the TTL node's expiry, its sessions' ends (here and at their homes) wait,
    // so no event of the subtree comes before the revision watchers resume from.
    let revision = parent.revision().expect("revision");
    parent.leader_scan(10_000_000).expect("scan: the TTL node and the session are long due");
    parent.end_remote_sessions(&[team.remote_session], false).expect("ended at its home");
    assert_eq!(code(parent.close_session(team.own_session)), Code::Unavailable, "it owns a node that is moving here");
    for path in ["/team/a/ttl", "/team/a/own-e", "/team/a/remote-e"] {
        assert!(present(&parent, path), "{path} changed before the group served it");
    }
    assert_eq!(parent.revision().expect("revision"), revision, "nothing in the subtree took a revision");

    let handed_at = hand(&mut merging, MERGE, descriptor(TARGET, "/team/a", &["/team/a"], 2)).expect("hand over");
    parent.set_descriptor(descriptor(SOURCE, "/", &[], 3), handed_at).expect("serves it");
    parent.leader_scan(20_000_000).expect("scan once served");
    parent.end_remote_sessions(&[team.remote_session], false).expect("ended at its home");
    for path in ["/team/a/ttl", "/team/a/own-e", "/team/a/remote-e"] {
        assert!(parent.exists(path).expect("exists").is_none(), "{path} ends once served");
    }
    assert!(parent.revision().expect("revision") > handed_at + 1, "its ends took revisions above the hand-over's");
}

/// A replica restarted after a merge's move-in still ends COMPACTED a watch into the subtree
/// whose creator did not receive the merged group's last write (its place there is at that
/// write): the move is kept on disk with the group's state, not only in the hub's memory, so
/// the restarted replica's fresh hub knows it too.
#[test]
fn a_replica_restarted_after_a_move_in_still_refuses_a_watch_that_would_skip_the_old_groups_writes() {
    use std::sync::Arc;
    use warden_namespace::watch::hub::CatchUp;
    use warden_namespace::watch::stream::{Outgoing, Phase, StreamWatch};
    use warden_namespace::watch::{WatchSpec, WatchStream};

    let mut parent = leading(SOURCE);
    populate(&mut parent);
    let (mut merging, _) = split_off(&mut parent);
    let last = merging.set("/team/a/x", b"in the split-off group", None).expect("write").stat.expect("stat").mod_revision;
    freeze_for_merge(&mut merging, "/team/a", MERGE, SOURCE).expect("freeze");
    for page in export_all(&merging, "/team/a", MERGE, 1 << 20) {
        ingest_for(&mut parent, "/team/a", MERGE, page).expect("ingest");
    }
    let handed_at = hand(&mut merging, MERGE, descriptor(TARGET, "/team/a", &["/team/a"], 2)).expect("hand over");
    parent.set_descriptor(descriptor(SOURCE, "/", &[], 3), handed_at).expect("the parent serves the prefix again");
    let after = parent.set("/team/a/x", b"after the merge", None).expect("write").stat.expect("stat").mod_revision;
    parent.reopen().expect("restart");

    // From the parent's next revision (its part ran past the merge), with a place in the
    // merged group at its last write.
    let watch = |group_places: &[(u64, u64)]| {
        let stream = WatchStream::new(16 << 20);
        let hub = parent.watch_hub().expect("hub");
        let watch = StreamWatch {
            charge: None,
            group: SOURCE,
            path: Arc::from("/"),
            spec: WatchSpec::new(watch_create::Kind::Persistent, true, false, false, false, false),
            phase: Phase::CatchingUp { next_revision: after + 1 },
            progress_notify: false,
            active: false,
            resume_revisions: Arc::new(group_places.iter().copied().collect()),
        };
        stream.add(1, watch, Outgoing::Created { watch_id: 1, group: SOURCE, revision: after, created: Default::default() });
        let outcome = hub.catch_up(&stream, 1, usize::MAX);
        let ended = std::iter::from_fn(|| stream.try_next()).find_map(|outgoing| match outgoing {
            Outgoing::Canceled { error, .. } => error.map(|e| e.code),
            _ => None,
        });
        (outcome, ended)
    };
    assert_eq!(
        watch(&[(SOURCE, after + 1), (TARGET, last)]),
        (CatchUp::Ended, Some(Code::Compacted as i32)),
        "the merged group's last write would be skipped"
    );
    assert_eq!(watch(&[(SOURCE, after + 1), (TARGET, handed_at + 1)]), (CatchUp::Live, None), "a creator that received all of it goes on");
}
