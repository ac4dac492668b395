//! Issue 12, "Placement, router and watches" and "Found by a client written from the .proto
//! files alone": the router's `GetChildren` paging, keepalives of sessions homed in several
//! groups, deadlines, bounded error quotes, and unknown session ids, each through a router
//! and (where a node answers on its own) through a node directly.

mod support;

use support::routed::{client, cluster_with_groups, create_group, start_router, start_stale_router, TIMEOUT};

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
async fn item_9_get_children_through_the_router_pages_every_name_once_in_order() {
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

/// A refusal quotes a bounded prefix of its input: a `Create` of a 5,000-byte and of a
/// 100 KiB path is a typed INVALID_ARGUMENT (INVALID_PATH) through the router and from a
/// node directly, not a transport failure of oversized headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_18_a_refusal_of_a_huge_path_is_a_typed_invalid_argument() {
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
