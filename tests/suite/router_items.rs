//! The router as a client written from the .proto files alone finds it: the router's `GetChildren` paging, keepalives of sessions homed in several
//! groups, deadlines, bounded error quotes, and unknown session ids, each through a router
//! and (where a node answers on its own) through a node directly.

use crate::support::routed::{client, cluster_with_groups, create_group, start_router, start_stale_router, TIMEOUT};

use std::time::Duration;

use tonic::transport::Channel;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::Cluster;

/// The Warden error code of a refusal (`Unknown` when it carries none).
fn code_of(status: &tonic::Status) -> Code {
    warden_proto::error_of(status).and_then(|e| Code::try_from(e.code).ok()).unwrap_or(Code::Unknown)
}

/// A client of node `id` directly.
fn node_client(cluster: &Cluster, id: u64) -> WardenClient<Channel> {
    let addr = cluster.addr(id).expect("addr");
    WardenClient::new(Channel::from_shared(format!("http://{addr}")).expect("uri").timeout(TIMEOUT).connect_lazy())
}

/// Pages through the children of `path` from `start_after`, `limit` per call, until the
/// last page or `names_max` names.
async fn page_through(router: &mut WardenClient<Channel>, path: &str, start_after: &str, limit: u32, names_max: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut after = start_after.to_string();
    loop {
        let request = GetChildrenRequest {
            path: path.into(),
            start_after: after.clone(),
            limit,
            with_stats: limit != 0 && limit < 10,
            ..GetChildrenRequest::default()
        };
        let page = router.get_children(request).await.expect("get children").into_inner();
        if limit != 0 {
            assert!(page.names.len() <= limit as usize, "a page of limit {limit} has {} names", page.names.len());
        }
        if page.names.len() < 10 && limit != 0 && limit < 10 {
            assert_eq!(page.stats.len(), page.names.len(), "a stat per name");
        }
        names.extend(page.names.iter().cloned());
        match page.names.last() {
            Some(last) if page.more && names.len() < names_max => after = last.clone(),
            _ => return names,
        }
    }
}

/// `seen` is `expected`; on a mismatch, says where they part (the lists are long).
fn assert_names(seen: &[String], expected: &[String], what: &str) {
    if seen != expected {
        let at = seen.iter().zip(expected).position(|(a, b)| a != b).unwrap_or(seen.len().min(expected.len()));
        let around = |names: &[String]| names.iter().skip(at.saturating_sub(2)).take(5).cloned().collect::<Vec<_>>();
        panic!("{what}: {} names, expected {}; first difference at {at}: {:?} vs {:?}", seen.len(), expected.len(), around(seen), around(expected));
    }
}

/// Child-group names merged into a parent's listing come in name order on the right page:
/// with `limit = 0` (the node's own page size, 10,000, so the parent needs more children
/// than that) and with small limits, every name comes exactly once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_children_through_the_router_pages_every_name_once_in_order() {
    let groups = ["a", "c05000x", "zz"];
    let prefixes: Vec<String> = groups.iter().map(|g| format!("/p/{g}")).collect();
    let cluster = cluster_with_groups(&prefixes.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    router.create(CreateRequest { path: "/p".into(), ..CreateRequest::default() }).await.expect("create /p");
    let own: Vec<String> = (0..=10_000).map(|n| format!("c{n:05}")).collect();
    for chunk in own.chunks(128) {
        let then = chunk
            .iter()
            .map(|name| TxnOp { op: Some(txn_op::Op::Create(CreateRequest { path: format!("/p/{name}"), ..CreateRequest::default() })) })
            .collect();
        router.txn(TxnRequest { then, ..TxnRequest::default() }).await.expect("create children");
    }
    let mut all: Vec<String> = own.iter().cloned().chain(groups.iter().map(|g| g.to_string())).collect();
    all.sort();
    let after = |start: &str| -> Vec<String> { all.iter().filter(|n| n.as_str() > start).cloned().collect() };

    assert_names(&page_through(&mut router, "/p", "", 0, usize::MAX).await, &all, "limit 0: every name once, in order");
    assert_names(&page_through(&mut router, "/p", "", 4_096, usize::MAX).await, &all, "limit 4096");
    for limit in [1, 2, 3] {
        for start in ["", "c04997", "c09996"] {
            let expected: Vec<String> = after(start).into_iter().take(12).collect();
            let mut seen = page_through(&mut router, "/p", start, limit, 12).await;
            seen.truncate(12);
            assert_names(&seen, &expected, &format!("limit {limit} from {start:?}"));
        }
    }
}

/// One keepalive naming sessions of two home groups renews every one of them (through the
/// router, unary and streamed), answering in the request's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_of_sessions_of_several_home_groups_renews_them_all() {
    let cluster = cluster_with_groups(&["/k"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let session = |hint: &'static str| {
        let mut router = router.clone();
        async move {
            let request = CreateSessionRequest { ttl_ms: 10_000, path_hint: hint.into(), ..CreateSessionRequest::default() };
            router.create_session(request).await.expect("session").into_inner().session_id
        }
    };
    let (root_a, k_a, root_b) = (session("/x").await, session("/k").await, session("/y").await);
    assert_ne!(warden_placement::home_group(root_a), warden_placement::home_group(k_a), "two home groups");
    let ids = vec![k_a, root_a, k_a, root_b];
    let check = |response: KeepAliveResponse| {
        assert_eq!(response.leases.iter().map(|l| l.session_id).collect::<Vec<_>>(), ids, "answers in request order");
        assert!(response.leases.iter().all(|l| l.alive), "every session is alive: {:?}", response.leases);
    };
    check(router.keep_alive(KeepAliveRequest { session_ids: ids.clone(), ..KeepAliveRequest::default() }).await.expect("keepalive").into_inner());
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    requests.send(KeepAliveRequest { session_ids: ids.clone(), ..KeepAliveRequest::default() }).await.expect("send");
    let mut answers = router.keep_alive_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await.expect("stream").into_inner();
    check(answers.message().await.expect("answer").expect("an answer"));
}

/// A transaction across two groups through a router whose table predates the second group
/// is refused INVALID_ARGUMENT once the router has refreshed, not retried until the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_group_txn_with_a_stale_table_is_refused_once_the_table_is_fresh() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_stale_router(&cluster, 0);
    let mut router = client(router_process.addr);
    router.sync(SyncRequest::default()).await.expect("the router learns the table");
    create_group(&cluster, "/c").await;
    let create = |path: &str| TxnOp { op: Some(txn_op::Op::Create(CreateRequest { path: path.into(), ..CreateRequest::default() })) };
    let spanning = TxnRequest { then: vec![create("/a"), create("/c/x")], ..TxnRequest::default() };
    let refused = router.txn(spanning).await.expect_err("spans groups");
    assert_eq!((refused.code(), code_of(&refused)), (tonic::Code::InvalidArgument, Code::InvalidArgument), "{refused:?}");
    // Nothing was written in either group.
    for path in ["/a", "/c/x"] {
        let exists = router.exists(ExistsRequest { path: path.into(), ..ExistsRequest::default() }).await.expect("exists").into_inner();
        assert!(exists.stat.is_none(), "{path}");
    }
}

/// The caller's deadline reaches the node: a waiting `Lock` through the router with a
/// deadline shorter than the node's own timeout is answered (not acquired) before the
/// caller's deadline, instead of the node waiting past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_deadline_is_passed_upstream() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let request = CreateSessionRequest { ttl_ms: 30_000, ..CreateSessionRequest::default() };
        sessions.push(router.create_session(request).await.expect("session").into_inner().session_id);
    }
    let lock = |session_id: u64, wait: bool| LockRequest { path: "/l".into(), session_id, wait, ..LockRequest::default() };
    assert!(router.lock(lock(sessions[0], false)).await.expect("lock").into_inner().acquired);
    // The node waits at most 5 s on its own; the caller gives 4 s.
    let mut waiting = tonic::Request::new(lock(sessions[1], true));
    waiting.set_timeout(Duration::from_secs(4));
    let answer = router.lock(waiting).await.expect("answered within the caller's deadline").into_inner();
    assert!(!answer.acquired);
}

/// A refusal quotes a bounded prefix of its input: a `Create` of a 5,000-byte and of a
/// 100 KiB path is a typed INVALID_ARGUMENT (INVALID_PATH) through the router and from a
/// node directly, not a transport failure of oversized headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_a_huge_path_is_a_typed_invalid_argument() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    for (via, mut api) in [("router", client(router_process.addr)), ("node", node_client(&cluster, leader))] {
        for bytes in [5_000, 100 << 10] {
            let path = format!("/{}", "a".repeat(bytes - 1));
            let refused = api.create(CreateRequest { path: path.clone(), ..CreateRequest::default() }).await.expect_err("too long");
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{via}, {bytes} bytes: {refused:?}");
            let error = warden_proto::error_of(&refused).expect("a typed detail");
            assert_eq!(error.code, Code::InvalidPath as i32, "{via}, {bytes} bytes");
            assert!(error.path.len() < 1_024 && refused.message().len() < 2_048, "{via}: the error quotes a bounded prefix");
            assert!(error.path.contains(&format!("{bytes} bytes")), "{via}: and the input's length: {}", error.path);
        }
    }
}

/// A session id naming no group, or a group that does not have it, is SESSION_EXPIRED; a
/// malformed id (0) INVALID_ARGUMENT; never
/// UNAVAILABLE, which clients retry forever. Through the router and a node alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_session_id_is_session_expired() {
    let cluster = cluster_with_groups(&["/k"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    let mut node = node_client(&cluster, leader);
    let no_group = warden_placement::session_id(999, 1);
    let group_zero = 12_345;
    let not_in_its_group = warden_placement::session_id(2, 999_999);
    let ephemeral = |path: &str, session_id: u64| CreateRequest { path: path.into(), session_id, ..CreateRequest::default() };
    let lock = |path: &str, session_id: u64| LockRequest { path: path.into(), session_id, ..LockRequest::default() };
    let last_group = warden_placement::session_id(warden_placement::SHARD_GROUP_ID_MAX, 1);
    for session in [no_group, group_zero, not_in_its_group, last_group] {
        for path in ["/e", "/k/e"] {
            let refused = router.create(ephemeral(path, session)).await.expect_err("no such session");
            assert_eq!(code_of(&refused), Code::SessionExpired, "router create {path} with {session:#x}: {refused:?}");
            let refused = router.lock(lock(&format!("{path}-lock"), session)).await.expect_err("no such session");
            assert_eq!(code_of(&refused), Code::SessionExpired, "router lock {path} with {session:#x}: {refused:?}");
        }
        let refused = node.create(ephemeral("/e", session)).await.expect_err("no such session");
        assert_eq!(code_of(&refused), Code::SessionExpired, "node create with {session:#x}: {refused:?}");
        let refused = node.lock(lock("/e-lock", session)).await.expect_err("no such session");
        assert_eq!(code_of(&refused), Code::SessionExpired, "node lock with {session:#x}: {refused:?}");
        let refused = router.session_info(SessionInfoRequest { session_id: session, ..SessionInfoRequest::default() }).await;
        if let Err(refused) = refused {
            assert_eq!(code_of(&refused), Code::SessionExpired, "router session info of {session:#x}: {refused:?}");
        }
        let refused = router.close_session(CloseSessionRequest { session_id: session, ..CloseSessionRequest::default() }).await;
        if let Err(refused) = refused {
            assert_eq!(code_of(&refused), Code::SessionExpired, "router close of {session:#x}: {refused:?}");
        }
        let renewed =
            router.keep_alive(KeepAliveRequest { session_ids: vec![session], ..KeepAliveRequest::default() }).await.expect("keepalive").into_inner();
        assert_eq!(renewed.leases.iter().map(|l| (l.session_id, l.alive)).collect::<Vec<_>>(), vec![(session, false)], "{session:#x}");
    }
    for malformed in [0] {
        let refused =
            router.session_info(SessionInfoRequest { session_id: malformed, ..SessionInfoRequest::default() }).await.expect_err("malformed");
        assert_eq!(code_of(&refused), Code::InvalidArgument, "session info of {malformed:#x}: {refused:?}");
        let refused = router.lock(lock("/m-lock", malformed)).await.expect_err("malformed");
        assert_eq!(code_of(&refused), Code::InvalidArgument, "lock with {malformed:#x}: {refused:?}");
    }
}
