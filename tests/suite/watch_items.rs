//! Watch memory is bounded as documented, through a router and at a node.
//! A client that stops reading learns it fell behind (SLOW_WATCHER) instead of a router
//! buffering for it; a watch id reused right after its cancel is the new watch; a watch of
//! a path its group does not serve is refused WRONG_GROUP.

use crate::support::routed::{cluster_with_groups, start_router, TIMEOUT};
use crate::support::watch::{persistent, WatchConn};

use std::time::Duration;

use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

/// A client that reads nothing while 40 MiB of events are written, more than the node's
/// 16 MiB queue, the router's and the transport's buffers together, gets SLOW_WATCHER
/// through the router (a router buffering by message count hid it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_through_the_router_is_cancelled_not_buffered() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = crate::support::routed::client(router_process.addr);
    router.create(CreateRequest { path: "/w".into(), ..CreateRequest::default() }).await.expect("create /w");
    let mut slow = WatchConn::open(router_process.addr).await.expect("stream");
    slow.create(persistent("/w", true, 0)).await.expect("created").created.expect("not canceled");
    let (txns, per_txn) = (40, 16);
    for n in 0..txns {
        let then = (0..per_txn)
            .map(|i| {
                let create = CreateRequest { path: format!("/w/{n}-{i}"), data: vec![n as u8; 64 << 10], ..CreateRequest::default() };
                TxnOp { op: Some(txn_op::Op::Create(create)) }
            })
            .collect();
        router.txn(TxnRequest { then, ..TxnRequest::default() }).await.expect("write");
    }
    let mut events = 0;
    loop {
        let response = slow.next(TIMEOUT).await.expect("stream").expect("a response");
        if let Some(canceled) = response.canceled {
            let error = canceled.error.expect("a reason");
            assert_eq!(error.code, Code::SlowWatcher as i32, "{error:?}");
            break;
        }
        events += response.events.len();
        assert!(events < txns * per_txn, "every event was buffered for a client that read nothing");
    }
}

/// A watch id cancelled and at once reused on the same stream through the router: the old
/// watch's `canceled` comes first and does not end the new watch, whose `created` and
/// events follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cancel_of_an_old_watch_does_not_end_a_new_watch_with_its_id() {
    let cluster = cluster_with_groups(&["/g"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = crate::support::routed::client(router_process.addr);
    let mut watch = WatchConn::open(router_process.addr).await.expect("stream");
    watch.create(WatchCreate { watch_id: 5, ..persistent("/g", true, 0) }).await.expect("created").created.expect("not canceled");
    watch.send(WatchRequestKind::Cancel(WatchCancel { watch_id: 5 })).await;
    watch.send(WatchRequestKind::Create(WatchCreate { watch_id: 5, ..persistent("/n", false, 0) })).await;
    let canceled = watch.next(TIMEOUT).await.expect("stream").expect("the old watch's cancel");
    assert_eq!((canceled.watch_id, canceled.canceled.as_ref().map(|c| c.error.is_none())), (5, Some(true)), "{canceled:?}");
    let created = watch.next(TIMEOUT).await.expect("stream").expect("the new watch's created");
    assert!(created.watch_id == 5 && created.created.is_some(), "{created:?}");
    router.create(CreateRequest { path: "/n".into(), ..CreateRequest::default() }).await.expect("create /n");
    let event = watch.next(TIMEOUT).await.expect("stream").expect("the new watch's event");
    assert_eq!((event.watch_id, event.events.first().map(|e| e.path.as_str())), (5, Some("/n")), "{event:?}");
    assert!(watch.next(Duration::from_millis(200)).await.expect("stream").is_none(), "nothing else");
}

/// A watch sent to a group for a path that group does not serve is refused WRONG_GROUP,
/// not accepted to never fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_a_path_the_group_does_not_serve_is_wrong_group() {
    let cluster = cluster_with_groups(&["/k"]).await;
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("root leader");
    let mut watch = WatchConn::open(cluster.addr(leader).expect("addr")).await.expect("stream");
    let routing = Some(Routing { group_id: 1, ..Routing::default() });
    for create in [WatchCreate { routing, ..persistent("/k/x", false, 0) }, WatchCreate { routing, start_revision: 1, ..persistent("/k", true, 0) }] {
        let answer = watch.create(create.clone()).await.expect("an answer");
        let error = answer.canceled.and_then(|c| c.error).unwrap_or_default();
        assert_eq!(error.code, Code::WrongGroup as i32, "{create:?}: {error:?}");
    }
}
