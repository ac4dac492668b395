//! Router to node: the router forwards unary calls over one long-lived batch
//! stream per node. Many concurrent calls of different methods over one stream are each
//! answered with their own result, and a `Lock` waiting at the node holds back none of them;
//! a node killed while writes are in flight on its stream applies none of them twice (a
//! write is answered, or retried only when it was never sent, or reported as of unknown
//! outcome); a node refuses an oversize or unknown item typed, and answers the others.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::routed::{client, cluster_with_groups, start_router, TIMEOUT};

use prost::Message as _;
use tonic::transport::Channel;
use warden_proto::batch::batch_forward_client::BatchForwardClient;
use warden_proto::batch::item_result::Result as ItemOutcome;
use warden_proto::batch::{BatchRequest, Item, Method};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;

/// The Warden error code of a refusal (`Unknown` when it carries none).
fn code_of(status: &tonic::Status) -> Code {
    warden_proto::error_of(status).and_then(|e| Code::try_from(e.code).ok()).unwrap_or(Code::Unknown)
}

async fn session(router: &mut WardenClient<Channel>) -> u64 {
    let request = CreateSessionRequest { ttl_ms: 60_000, ..CreateSessionRequest::default() };
    router.create_session(request).await.expect("session").into_inner().session_id
}

/// Every child of `path`, page by page.
async fn children(router: &mut WardenClient<Channel>, path: &str) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        let start_after = names.last().cloned().unwrap_or_default();
        let request = GetChildrenRequest { path: path.into(), start_after, limit: 1000, ..GetChildrenRequest::default() };
        let page = router.get_children(request).await.expect("children").into_inner();
        names.extend(page.names);
        if !page.more {
            return names;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_calls_over_one_stream_are_each_answered_and_a_waiting_lock_holds_back_none() {
    let cluster = cluster_with_groups(&[]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let (holder, waiter) = (session(&mut router).await, session(&mut router).await);
    let lock = |session_id| LockRequest { path: "/l".into(), session_id, wait: true, timeout_ms: 120_000, ..LockRequest::default() };
    let held = router.lock(lock(holder)).await.expect("lock").into_inner();
    assert!(held.acquired);
    // A second Lock waits at the node, on the same stream as everything below.
    let waiting = {
        let mut router = router.clone();
        tokio::spawn(async move { router.lock(lock(waiter)).await })
    };
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let info = router.lock_info(LockInfoRequest { path: "/l".into(), ..LockInfoRequest::default() }).await.expect("lock info").into_inner();
        if !info.waiters.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the second Lock never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Many calls at once, of different methods, each checked against its own answer.
    let calls = (0..200u32).map(|i| {
        let mut router = router.clone();
        tokio::spawn(async move {
            let path = format!("/m/{i}");
            let data = i.to_string().into_bytes();
            let create = CreateRequest { path: path.clone(), data: data.clone(), create_parents: true, ..CreateRequest::default() };
            assert_eq!(router.create(create).await.expect("create").into_inner().path, path);
            let got = router.get(GetRequest { path: path.clone(), ..GetRequest::default() }).await.expect("get").into_inner();
            assert_eq!(got.data, data, "{path} answered with another call's data");
            let set = SetRequest { path: path.clone(), data: format!("{i}'").into_bytes(), ..SetRequest::default() };
            assert_eq!(router.set(set).await.expect("set").into_inner().stat.map(|s| s.version), Some(1));
            let exists = router.exists(ExistsRequest { path: format!("/m/{i}-no"), ..ExistsRequest::default() }).await.expect("exists");
            assert!(exists.into_inner().stat.is_none());
            let missing = router.get(GetRequest { path: format!("/m/{i}-no"), ..GetRequest::default() }).await.expect_err("no node");
            assert_eq!(code_of(&missing), Code::NoNode);
            assert_eq!(missing.code(), tonic::Code::NotFound);
        })
    });
    for call in futures::future::join_all(calls).await {
        call.expect("call task");
    }
    assert_eq!(children(&mut router, "/m").await.len(), 200);
    // The waiting Lock was never answered while those were (its wait is minutes long).
    assert!(!waiting.is_finished(), "the waiting Lock ended early");

    let unlock = UnlockRequest { sequencer: held.sequencer, ..UnlockRequest::default() };
    router.unlock(unlock).await.expect("unlock");
    let acquired = tokio::time::timeout(TIMEOUT, waiting).await.expect("the waiter is answered").expect("task").expect("lock");
    assert!(acquired.into_inner().acquired, "the waiter holds once the holder unlocked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_with_writes_in_flight_on_its_stream_applies_none_twice() {
    let cluster = cluster_with_groups(&["/q"]).await;
    let router_process = start_router(&cluster, 0);
    let mut router = client(router_process.addr);
    let create = CreateRequest { path: "/q/s".into(), ..CreateRequest::default() };
    router.create(create).await.expect("parent");

    // Writers create sequential nodes without pause; each records what it was told.
    let stop = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(AtomicUsize::new(0));
    let created: Arc<Mutex<Vec<String>>> = Arc::default();
    let unknown = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..32)
        .map(|_| {
            let (mut router, stop, acknowledged, created, unknown) =
                (router.clone(), stop.clone(), acknowledged.clone(), created.clone(), unknown.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let create = CreateRequest { path: "/q/s/n-".into(), sequential: true, ..CreateRequest::default() };
                    match router.create(create).await {
                        Ok(response) => {
                            created.lock().expect("lock").push(response.into_inner().path);
                            acknowledged.fetch_add(1, Ordering::Relaxed);
                        }
                        // Applied or not: the router could not tell.
                        Err(status) if matches!(code_of(&status), Code::OutcomeUnknown | Code::Unknown) => {
                            unknown.fetch_add(1, Ordering::Relaxed);
                        }
                        // Not applied (the router retried until its deadline).
                        Err(status) => assert_eq!(code_of(&status), Code::Unavailable, "{status:?}"),
                    }
                }
            })
        })
        .collect();
    let wait_for = |count: usize| {
        let acknowledged = acknowledged.clone();
        async move {
            let deadline = tokio::time::Instant::now() + TIMEOUT * 3;
            while acknowledged.load(Ordering::Relaxed) < count {
                assert!(tokio::time::Instant::now() < deadline, "writes stalled at {}", acknowledged.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_for(200).await;
    // The leader of /q's group dies with writes in flight on the router's stream to it.
    let leader = cluster.wait_leader(2, TIMEOUT).await.expect("leader of /q");
    cluster.kill(leader);
    let killed_at = acknowledged.load(Ordering::Relaxed);
    wait_for(killed_at + 200).await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.expect("writer");
    }

    let created = created.lock().expect("lock").clone();
    let names: HashSet<String> = children(&mut router, "/q/s").await.into_iter().map(|name| format!("/q/s/{name}")).collect();
    let distinct: HashSet<&String> = created.iter().collect();
    assert_eq!(distinct.len(), created.len(), "two writes were told the same sequential node");
    assert!(created.iter().all(|path| names.contains(path)), "an acknowledged create is missing");
    // Every node there is an acknowledged create or one of unknown outcome: none twice.
    let unknown = unknown.load(Ordering::Relaxed);
    assert!(names.len() <= created.len() + unknown, "{} nodes for {} acknowledged and {unknown} unknown creates", names.len(), created.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_an_oversize_or_unknown_item_typed_and_answers_the_rest() {
    let cluster = cluster_with_groups(&[]).await;
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let addr = cluster.addr(leader).expect("addr");
    let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy();
    let mut node = BatchForwardClient::new(channel).max_encoding_message_size(16 << 20);

    let create = CreateRequest { path: "/big".into(), data: vec![7; 2 << 20], ..CreateRequest::default() };
    let small = CreateRequest { path: "/small".into(), data: b"x".to_vec(), ..CreateRequest::default() };
    let item = |id, method: Method, request: Vec<u8>| Item {
        id,
        method: method as i32,
        request: request.into(),
        timeout_us: 5_000_000,
        principal: String::new(),
    };
    let items = vec![
        item(1, Method::Create, create.encode_to_vec()),
        item(2, Method::Unspecified, Vec::new()),
        item(3, Method::Create, small.encode_to_vec()),
    ];
    let (requests, outgoing) = tokio::sync::mpsc::channel(1);
    let mut responses = node.forward(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await.expect("stream").into_inner();
    requests.send(BatchRequest { items, cancels: Vec::new() }).await.expect("send");
    let mut results = Vec::new();
    while results.len() < 3 {
        let batch = tokio::time::timeout(TIMEOUT, responses.message()).await.expect("answered in time").expect("stream").expect("open");
        results.extend(batch.results);
    }
    results.sort_by_key(|r| r.id);
    let error = |index: usize| match &results[index].result {
        Some(ItemOutcome::Error(error)) => error.clone(),
        other => panic!("item {} answered {other:?}", index + 1),
    };
    let refused = error(0);
    let refusal = tonic::Status::with_details(tonic::Code::from_i32(refused.code), refused.message, refused.details);
    let too_large = warden_proto::error_of(&refusal).expect("a typed refusal");
    assert_eq!(too_large.code, Code::TooLarge as i32);
    assert_eq!(too_large.limit, 3 << 19);
    assert_eq!(error(1).code, tonic::Code::Unimplemented as i32);
    match &results[2].result {
        Some(ItemOutcome::Ok(bytes)) => assert_eq!(CreateResponse::decode(bytes.clone()).expect("response").path, "/small"),
        other => panic!("the small create answered {other:?}"),
    }
}
