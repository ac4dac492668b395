//! Table-driven semantics of every namespace operation and error, on one replica's state
//! machine (the `Harness` applies commands without raft).

mod support;

use support::{code, harness};
use warden_proto::v1::compare::{Op as CmpOp, Target};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::txn_op_result::Result as OpResult;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;

fn create(path: &str) -> CreateRequest {
    CreateRequest { path: path.into(), ..CreateRequest::default() }
}

#[test]
fn create_errors_and_stats() {
    let mut ns = harness();
    let made = ns.create_simple("/a", b"x").expect("create");
    assert_eq!(made.path, "/a");
    let stat = made.stat.expect("stat");
    assert_eq!((stat.version, stat.cversion, stat.num_children, stat.data_length), (0, 0, 0, 1));
    assert_eq!(stat.create_revision, stat.mod_revision);
    assert_eq!(stat.ctime_ms, ns.now_ms);
    let cases: Vec<(CreateRequest, Code)> = vec![
        (create("/a"), Code::NodeExists),
        (create("/missing/child"), Code::NoNode),
        (create("/"), Code::NodeExists),
        (create("relative"), Code::InvalidPath),
        (create("/a/"), Code::InvalidPath),
        (create("/a//b"), Code::InvalidPath),
        (create("/a/../b"), Code::InvalidPath),
        (create("/warden/x"), Code::InvalidPath),
        (CreateRequest { data: vec![0; (1 << 20) + 1], ..create("/big") }, Code::TooLarge),
        (CreateRequest { kind: NodeKind::Ttl as i32, ..create("/ttl-without-ttl") }, Code::InvalidArgument),
        (CreateRequest { ttl_ms: 5, ..create("/persistent-with-ttl") }, Code::InvalidArgument),
        (CreateRequest { kind: 42, ..create("/unknown-kind") }, Code::InvalidArgument),
    ];
    let revision = ns.revision().expect("revision");
    for (request, expected) in cases {
        let path = request.path.clone();
        assert_eq!(code(ns.create(request)), expected, "create {path}");
    }
    assert_eq!(ns.revision().expect("revision"), revision, "failed creates change nothing");
    assert_eq!(ns.all_children("/").expect("children"), vec!["a".to_string()]);
}

#[test]
fn create_parents_and_parent_stats() {
    let mut ns = harness();
    ns.create(CreateRequest { create_parents: true, ..create("/x/y/z") }).expect("create with parents");
    for path in ["/x", "/x/y", "/x/y/z"] {
        assert!(ns.exists(path).expect("exists").is_some(), "{path} created");
    }
    let parent = ns.exists("/x/y").expect("exists").expect("stat");
    assert_eq!((parent.num_children, parent.cversion), (1, 1));
    let revision = ns.revision().expect("revision");
    let z = ns.exists("/x/y/z").expect("exists").expect("stat");
    assert_eq!(z.create_revision, revision, "one transaction, one revision for all its nodes");
    assert_eq!(ns.exists("/x").expect("exists").expect("stat").create_revision, revision);
}

#[test]
fn set_with_and_without_expected_version() {
    let mut ns = harness();
    ns.create_simple("/n", b"0").expect("create");
    let set = ns.set("/n", b"1", None).expect("set").stat.expect("stat");
    assert_eq!(set.version, 1);
    assert_eq!(code(ns.set("/n", b"2", Some(0))), Code::BadVersion);
    assert_eq!(ns.get("/n").expect("get").data, b"1");
    let set = ns.set("/n", b"2", Some(1)).expect("cas").stat.expect("stat");
    assert_eq!(set.version, 2);
    assert!(set.mod_revision > set.create_revision);
    assert_eq!(code(ns.set("/none", b"x", None)), Code::NoNode);
    assert_eq!(code(ns.set("/n", &vec![0; (1 << 20) + 1], None)), Code::TooLarge);
}

#[test]
fn delete_not_empty_recursive_and_version() {
    let mut ns = harness();
    ns.create(CreateRequest { create_parents: true, ..create("/d/e/f") }).expect("create");
    assert_eq!(code(ns.delete("/d", None, false)), Code::NotEmpty);
    assert_eq!(code(ns.delete("/d/e/f", Some(3), false)), Code::BadVersion);
    assert_eq!(code(ns.delete("/nope", None, false)), Code::NoNode);
    assert_eq!(code(ns.delete("/", None, true)), Code::InvalidArgument);
    let deleted = ns.delete("/d", None, true).expect("recursive delete").deleted;
    assert_eq!(deleted, 3);
    assert!(ns.exists("/d/e").expect("exists").is_none());
    assert!(ns.all_children("/").expect("children").is_empty());
    assert_eq!(ns.exists("/").expect("exists").expect("root").num_children, 0);
}

#[test]
fn ephemeral_parents_refuse_children() {
    // Sessions (which create ephemerals) arrive with the next issue; the stat field and the
    // rule "ephemerals have no children" are already here.
    let mut ns = harness();
    ns.create_simple("/e", b"").expect("create");
    ns.rewrite_record("/e", |record| {
        if let Some(stat) = record.stat.as_mut() {
            stat.ephemeral_owner = 77;
        }
    })
    .expect("mark ephemeral");
    assert_eq!(ns.exists("/e").expect("exists").expect("stat").ephemeral_owner, 77);
    assert_eq!(code(ns.create(create("/e/child"))), Code::NoChildrenForEphemerals);
    assert!(ns.create(create("/persistent-parent-ok")).is_ok());
}

#[test]
fn containers_disappear_with_their_last_child() {
    let mut ns = harness();
    ns.create(CreateRequest { kind: NodeKind::Container as i32, ..create("/c") }).expect("container");
    ns.create(CreateRequest { kind: NodeKind::Container as i32, ..create("/c/inner") }).expect("nested container");
    ns.create_simple("/c/inner/leaf", b"").expect("leaf");
    ns.create_simple("/c/other", b"").expect("other");
    let response = ns.delete("/c/inner/leaf", None, false).expect("delete leaf");
    assert_eq!(response.deleted, 2, "the leaf and its emptied container");
    assert!(ns.exists("/c/inner").expect("exists").is_none());
    assert!(ns.exists("/c").expect("exists").is_some(), "/c still has /c/other");
    ns.delete("/c/other", None, false).expect("delete other");
    assert!(ns.exists("/c").expect("exists").is_none(), "the emptied container goes too");
    // A container that never had children stays.
    ns.create(CreateRequest { kind: NodeKind::Container as i32, ..create("/empty") }).expect("container");
    assert!(ns.exists("/empty").expect("exists").is_some());
}

#[test]
fn ttl_nodes_expire_only_unchanged_and_childless_by_leader_time() {
    let mut ns = harness();
    let start = ns.now_ms;
    ns.create(CreateRequest { kind: NodeKind::Ttl as i32, ttl_ms: 1000, ..create("/t") }).expect("ttl node");
    ns.create(CreateRequest { kind: NodeKind::Ttl as i32, ttl_ms: 1000, ..create("/busy") }).expect("ttl node");
    ns.create_simple("/busy/child", b"").expect("child");
    assert_eq!(ns.leader_scan(start + 999).expect("scan"), 0, "not yet");
    // A change restarts the clock.
    ns.now_ms = start + 500;
    ns.set("/t", b"touched", None).expect("set");
    assert_eq!(ns.leader_scan(start + 1200).expect("scan"), 0, "changed at +500: due at +1500");
    assert_eq!(ns.leader_scan(start + 1500).expect("scan"), 1, "only /t: /busy has a child");
    assert!(ns.exists("/t").expect("exists").is_none());
    assert!(ns.exists("/busy").expect("exists").is_some());
    // The expiry index survives a restart.
    ns.create(CreateRequest { kind: NodeKind::Ttl as i32, ttl_ms: 10, ..create("/t2") }).expect("ttl node");
    ns.reopen().expect("reopen");
    assert_eq!(ns.leader_scan(ns.now_ms + 10).expect("scan"), 1);
    assert!(ns.exists("/t2").expect("exists").is_none());
}

#[test]
fn sequential_names_and_counter_exhaustion() {
    let mut ns = harness();
    ns.create_simple("/q", b"").expect("parent");
    let first = ns.create(CreateRequest { sequential: true, ..create("/q/job-") }).expect("seq").path;
    let second = ns.create(CreateRequest { sequential: true, ..create("/q/job-") }).expect("seq").path;
    let other = ns.create(CreateRequest { sequential: true, ..create("/q/x") }).expect("seq").path;
    assert_eq!((first.as_str(), second.as_str(), other.as_str()), ("/q/job-0000000000", "/q/job-0000000001", "/q/x0000000002"));
    // Deleting does not reuse numbers.
    ns.delete(&second, None, false).expect("delete");
    assert_eq!(ns.create(CreateRequest { sequential: true, ..create("/q/job-") }).expect("seq").path, "/q/job-0000000003");
    // Past 9,999,999,999 the counter is exhausted: a typed error, no wrap-around (ZooKeeper
    // wraps to negative numbers). Reaching 10^10 through creates is too slow for a test, so
    // the counter is set the way a snapshot restore would write it.
    ns.create_simple("/full", b"").expect("parent");
    ns.rewrite_record("/full", |record| record.next_sequence = 9_999_999_999).expect("rewrite");
    assert_eq!(ns.create(CreateRequest { sequential: true, ..create("/full/n") }).expect("last").path, "/full/n9999999999");
    assert_eq!(code(ns.create(CreateRequest { sequential: true, ..create("/full/n") })), Code::SequenceExhausted);
}

#[test]
fn get_children_sorted_paginated_with_stats() {
    let mut ns = harness();
    ns.create_simple("/p", b"").expect("parent");
    for name in ["b", "a", "d", "c", "e"] {
        ns.create_simple(&format!("/p/{name}"), name.as_bytes()).expect("child");
    }
    let page = ns.children(GetChildrenRequest { path: "/p".into(), limit: 2, with_stats: true, ..GetChildrenRequest::default() }).expect("page");
    assert_eq!(page.names, vec!["a", "b"]);
    assert!(page.more);
    assert_eq!(page.stats.len(), 2);
    assert_eq!(page.stat.expect("parent stat").num_children, 5);
    let page =
        ns.children(GetChildrenRequest { path: "/p".into(), limit: 2, start_after: "b".into(), ..GetChildrenRequest::default() }).expect("page");
    assert_eq!(page.names, vec!["c", "d"]);
    let last =
        ns.children(GetChildrenRequest { path: "/p".into(), limit: 2, start_after: "d".into(), ..GetChildrenRequest::default() }).expect("page");
    assert_eq!((last.names, last.more), (vec!["e".to_string()], false));
    assert_eq!(code(ns.children(GetChildrenRequest { path: "/p".into(), limit: 10_001, ..GetChildrenRequest::default() })), Code::TooLarge);
    assert_eq!(code(ns.children(GetChildrenRequest { path: "/nope".into(), ..GetChildrenRequest::default() })), Code::NoNode);
    // Children of the root include /p only; grandchildren are not listed.
    assert_eq!(ns.all_children("/").expect("children"), vec!["p"]);
}

fn compare(path: &str, target: Target, op: CmpOp, number: u64) -> Compare {
    Compare { path: path.into(), target: target as i32, op: op as i32, number, ..Compare::default() }
}

fn op(op: Op) -> TxnOp {
    TxnOp { op: Some(op) }
}

#[test]
fn txn_is_atomic_with_one_revision() {
    let mut ns = harness();
    ns.create_simple("/k", b"1").expect("create");
    let before = ns.revision().expect("revision");
    // Create-if-absent idiom: create_revision == 0 means "does not exist".
    let txn = TxnRequest {
        compares: vec![compare("/lock", Target::CreateRevision, CmpOp::Equal, 0)],
        then: vec![
            op(Op::Create(create("/lock"))),
            op(Op::Set(SetRequest { path: "/k".into(), data: b"2".to_vec(), ..SetRequest::default() })),
            op(Op::Get(GetRequest { path: "/k".into(), ..GetRequest::default() })),
        ],
        r#else: vec![op(Op::Get(GetRequest { path: "/lock".into(), ..GetRequest::default() }))],
        raise_to: 0,
        routing: None,
    };
    let response = ns.txn(txn.clone()).expect("txn");
    assert!(response.succeeded);
    assert_eq!(ns.revision().expect("revision"), before + 1, "one revision per transaction");
    let lock = ns.exists("/lock").expect("exists").expect("stat");
    let k = ns.exists("/k").expect("exists").expect("stat");
    assert_eq!(lock.create_revision, k.mod_revision, "every change carries the same revision");
    match &response.results[2].result {
        Some(OpResult::Get(get)) => assert_eq!(get.data, b"2", "reads inside a txn see its earlier writes"),
        other => panic!("unexpected {other:?}"),
    }
    // Second time the compare fails: `else` runs, read-only, no new revision.
    let response = ns.txn(txn).expect("txn");
    assert!(!response.succeeded);
    assert_eq!(ns.revision().expect("revision"), before + 1);
    // A failing operation aborts everything before it.
    let failing = TxnRequest {
        then: vec![op(Op::Set(SetRequest { path: "/k".into(), data: b"3".to_vec(), ..SetRequest::default() })), op(Op::Create(create("/lock")))],
        ..TxnRequest::default()
    };
    let error = ns.txn(failing).expect_err("second op fails");
    assert_eq!((Code::try_from(error.code).ok(), error.op_index), (Some(Code::NodeExists), 1));
    assert_eq!(ns.get("/k").expect("get").data, b"2", "the first op was rolled back");
    assert_eq!(ns.revision().expect("revision"), before + 1);
    // Compares on value, version and existence.
    let value_cmp = Compare { path: "/k".into(), target: Target::Value as i32, op: CmpOp::Equal as i32, value: b"2".to_vec(), ..Compare::default() };
    let exists_cmp = Compare { path: "/nope".into(), target: Target::Exists as i32, exists: false, ..Compare::default() };
    let greater = compare("/k", Target::Version, CmpOp::Greater, 0);
    let response = ns.txn(TxnRequest { compares: vec![value_cmp, exists_cmp, greater], ..TxnRequest::default() }).expect("txn");
    assert!(response.succeeded);
    // Too many operations.
    let many = TxnRequest { then: (0..129).map(|i| op(Op::Create(create(&format!("/m{i}"))))).collect(), ..TxnRequest::default() };
    assert_eq!(code(ns.txn(many)), Code::TooLarge);
}

#[test]
fn garbage_commands_change_nothing_and_state_survives_restart() {
    let mut ns = harness();
    ns.create_simple("/keep", b"v").expect("create");
    let revision = ns.revision().expect("revision");
    for garbage in [&[0xffu8, 0xff, 0xff][..], &[0x12, 0x05, 0x01], b"not protobuf at all"] {
        assert!(ns.apply_bytes(garbage).is_err() || ns.revision().expect("revision") == revision);
    }
    assert_eq!(ns.revision().expect("revision"), revision);
    ns.reopen().expect("reopen");
    assert_eq!(ns.get("/keep").expect("get").data, b"v");
    assert_eq!(ns.revision().expect("revision"), revision);
}

fn put(path: &str, session_id: u64) -> TxnOp {
    op(Op::Put(PutRequest { path: path.into(), data: b"v".to_vec(), session_id, ..PutRequest::default() }))
}

fn succeeded(ns: &mut warden_testkit::harness::Harness, compares: Vec<Compare>) -> bool {
    ns.txn(TxnRequest { compares, ..TxnRequest::default() }).expect("txn").succeeded
}

#[test]
fn a_compare_with_containers_absent_sees_a_container_as_a_missing_node() {
    let mut ns = harness();
    ns.txn(TxnRequest { then: vec![put("/jobs/1", 0)], ..TxnRequest::default() }).expect("put");
    assert_eq!(ns.exists("/jobs").expect("exists").expect("container").kind, NodeKind::Container as i32);
    let absent = |compare: Compare| Compare { containers_absent: true, ..compare };
    assert!(!succeeded(&mut ns, vec![compare("/jobs", Target::Writes, CmpOp::Equal, 0)]), "natively the container exists");
    assert!(succeeded(&mut ns, vec![absent(compare("/jobs", Target::Writes, CmpOp::Equal, 0))]));
    assert!(succeeded(&mut ns, vec![absent(compare("/jobs", Target::CreateRevision, CmpOp::Equal, 0))]));
    assert!(succeeded(&mut ns, vec![absent(compare("/jobs", Target::ModRevision, CmpOp::Equal, 0))]));
    let exists = Compare { path: "/jobs".into(), target: Target::Exists as i32, exists: true, ..Compare::default() };
    assert!(!succeeded(&mut ns, vec![absent(exists)]));
    assert!(succeeded(&mut ns, vec![absent(compare("/jobs/1", Target::Writes, CmpOp::Equal, 1))]), "a key is no container");
    // A put on the container makes it a key.
    ns.txn(TxnRequest { then: vec![put("/jobs", 0)], ..TxnRequest::default() }).expect("put");
    assert!(succeeded(&mut ns, vec![absent(compare("/jobs", Target::Writes, CmpOp::Equal, 1))]));
}

fn range(path: &str, from: &str, to: &str) -> RangeRequest {
    RangeRequest { path: path.into(), from: from.as_bytes().to_vec(), to: to.as_bytes().to_vec(), ..RangeRequest::default() }
}

fn over(ranges: Vec<RangeRequest>, target: Target, op: CmpOp, number: u64) -> Compare {
    Compare { path: ranges[0].path.clone(), ranges, ..compare("", target, op, number) }
}

#[test]
fn a_compare_over_ranges_holds_when_every_node_listed_satisfies_it() {
    let mut ns = harness();
    ns.txn(TxnRequest { then: vec![put("/r/a", 0)], ..TxnRequest::default() }).expect("put");
    let first = ns.revision().expect("revision");
    ns.txn(TxnRequest { then: vec![put("/r/b", 0), put("/r/c/d", 0)], ..TxnRequest::default() }).expect("put");
    let second = ns.revision().expect("revision");
    let all = || vec![range("/r", "/r/", "/r0")];
    assert!(succeeded(&mut ns, vec![over(all(), Target::CreateRevision, CmpOp::Greater, 0)]));
    assert!(succeeded(&mut ns, vec![over(all(), Target::ModRevision, CmpOp::Less, second + 1)]));
    assert!(!succeeded(&mut ns, vec![over(all(), Target::ModRevision, CmpOp::Equal, first)]), "/r/b was written later");
    assert!(succeeded(&mut ns, vec![over(vec![range("/r", "/r/a", "/r/b")], Target::ModRevision, CmpOp::Equal, first)]));
    let container_only = || vec![range("/r/c", "/r/c", "/r/c\0")];
    assert!(succeeded(&mut ns, vec![over(container_only(), Target::Writes, CmpOp::Equal, 0)]), "a container is not listed");
    // Several ranges count as one: each node of each must satisfy the compare.
    let two = vec![range("/r", "/r/a", "/r/b"), range("/r", "/r/b", "/r/c")];
    assert!(!succeeded(&mut ns, vec![over(two, Target::ModRevision, CmpOp::Equal, first)]));
    // No node: one missing node is compared; a value compare of it fails.
    let empty = || vec![range("/r", "/r/x", "/r/y")];
    assert!(succeeded(&mut ns, vec![over(empty(), Target::Writes, CmpOp::Equal, 0)]));
    assert!(succeeded(&mut ns, vec![over(empty(), Target::CreateRevision, CmpOp::Equal, 0)]));
    let value = Compare { target: Target::Value as i32, value: Vec::new(), ..over(empty(), Target::Value, CmpOp::Equal, 0) };
    assert!(!succeeded(&mut ns, vec![value]));
    let value = Compare { value: b"v".to_vec(), ..over(all(), Target::Value, CmpOp::Equal, 0) };
    assert!(succeeded(&mut ns, vec![value]));
    // The compare's path is its first range's.
    let astray = Compare { path: "/elsewhere".into(), ..over(all(), Target::Writes, CmpOp::Greater, 0) };
    assert_eq!(code(ns.txn(TxnRequest { compares: vec![astray], ..TxnRequest::default() })), Code::InvalidArgument);
}

#[test]
fn nested_transactions_take_the_branches_their_compares_chose_before_any_operation() {
    let mut ns = harness();
    let absent = |path: &str| compare(path, Target::Writes, CmpOp::Equal, 0);
    // The nested compare sees /n/x missing although the outer put before it created it.
    let nested = TxnRequest { compares: vec![absent("/n/x")], then: vec![put("/n/y", 0)], r#else: vec![put("/n/z", 0)], raise_to: 0, routing: None };
    let outer = TxnRequest { compares: vec![absent("/n/x")], then: vec![put("/n/x", 0), op(Op::Txn(nested.clone()))], ..TxnRequest::default() };
    let before = ns.revision().expect("revision");
    let response = ns.txn(outer.clone()).expect("txn");
    assert!(response.succeeded);
    match &response.results[1].result {
        Some(OpResult::Txn(inner)) => assert!(inner.succeeded && inner.results.len() == 1, "{inner:?}"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(ns.exists("/n/y").expect("exists").is_some() && ns.exists("/n/z").expect("exists").is_none());
    assert_eq!(ns.revision().expect("revision"), before + 1, "one revision for the whole tree");
    // Now /n/x exists: the outer else runs, holding the nested transaction, which takes its else.
    let outer = TxnRequest { r#else: vec![op(Op::Txn(nested))], ..outer };
    let response = ns.txn(outer).expect("txn");
    assert!(!response.succeeded);
    match &response.results[0].result {
        Some(OpResult::Txn(inner)) => assert!(!inner.succeeded, "{inner:?}"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(ns.exists("/n/z").expect("exists").is_some());
    // A failing nested operation undoes the whole tree, and names the outer operation.
    let failing = TxnRequest { then: vec![op(Op::Create(create("/n/x")))], ..TxnRequest::default() };
    let outer = TxnRequest { then: vec![put("/n/w", 0), op(Op::Txn(failing))], ..TxnRequest::default() };
    let error = ns.txn(outer).expect_err("nested create fails");
    assert_eq!((Code::try_from(error.code).ok(), error.op_index), (Some(Code::NodeExists), 1));
    assert!(ns.exists("/n/w").expect("exists").is_none());
    // Nested operations count against the transaction's operations.
    let inner = TxnRequest { then: (0..100).map(|i| op(Op::Create(create(&format!("/m{i}"))))).collect(), ..TxnRequest::default() };
    let many = TxnRequest {
        then: (0..40).map(|i| op(Op::Create(create(&format!("/o{i}"))))).chain([op(Op::Txn(inner))]).collect(),
        ..TxnRequest::default()
    };
    assert_eq!(code(ns.txn(many)), Code::TooLarge);
}

#[test]
fn a_range_of_an_owner_lists_only_that_sessions_nodes() {
    let mut ns = harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    let other = ns.create_session(10_000).expect("session").session_id;
    let puts = vec![put("/e/a", session), put("/e/b", 0), put("/e/c", other), put("/f/d", session)];
    ns.txn(TxnRequest { then: puts, ..TxnRequest::default() }).expect("puts");
    let owned = |path: &str, from: &str, to: &str| {
        let answer = ns.range(RangeRequest { owner: session, ..range(path, from, to) }).expect("range");
        (answer.nodes.into_iter().map(|node| node.path).collect::<Vec<_>>(), answer.count)
    };
    assert_eq!(owned("/", "/", "0"), (vec!["/e/a".to_string(), "/f/d".to_string()], 2));
    assert_eq!(owned("/e", "/e/", "/e0"), (vec!["/e/a".to_string()], 1));
    assert_eq!(owned("/f", "/f/e", "/f0"), (Vec::new(), 0));
}

#[test]
fn the_leader_lists_the_home_sessions_page_by_page() {
    use warden_proto::namespace::leader_request::Request as Ask;
    use warden_proto::namespace::leader_response::Response as Answer;
    use warden_proto::namespace::RemoteSessionsPage;
    let mut ns = harness();
    ns.set_leading(true, 0);
    let ids: Vec<u64> = (0..3).map(|_| ns.create_session(10_000).expect("session").session_id).collect();
    let mut page = |after: u64, limit: u32| match ns.leader_call(Ask::HomeSessions(RemoteSessionsPage { after, limit }), 1_000).expect("listing") {
        Answer::SessionInfo(listed) => listed,
        other => panic!("unexpected {other:?}"),
    };
    let first = page(0, 2);
    assert_eq!(first.sessions.iter().map(|lease| lease.session_id).collect::<Vec<_>>(), ids[..2]);
    assert!(first.more && first.listed_through == ids[1] && first.sessions.iter().all(|lease| lease.alive));
    let rest = page(first.listed_through, 2);
    assert_eq!(rest.sessions.iter().map(|lease| lease.session_id).collect::<Vec<_>>(), ids[2..]);
    assert!(!rest.more);
}
