//! The public namespace API over gRPC on a 5-replica group: CAS under concurrency, typed
//! errors as status details, stale reads that lag, health and reflection.

use std::time::Duration;

use crate::support::api::{namespace_cluster, ApiClient, CallError};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use warden_engine::host::drain::DrainLimits;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::ClusterConfig;
use warden_shard_node::service::error_of;

const TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cas_increments_count_exactly() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    api.call(TIMEOUT, false, |mut c| async move {
        c.create(CreateRequest { path: "/counter".into(), data: b"0".to_vec(), ..CreateRequest::default() }).await
    })
    .await
    .expect("create counter");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut successes = 0u64;
            for _ in 0..10 {
                let current = api
                    .call(TIMEOUT, true, |mut c| async move { c.get(GetRequest { path: "/counter".into(), ..GetRequest::default() }).await })
                    .await
                    .expect("get");
                let stat = current.stat.expect("stat");
                let value: u64 = String::from_utf8(current.data).expect("utf8").parse().expect("number");
                let next = (value + 1).to_string().into_bytes();
                let set = SetRequest { path: "/counter".into(), data: next, expected_version: Some(stat.version), routing: None };
                match api
                    .call(TIMEOUT, false, |mut c| {
                        let set = set.clone();
                        async move { c.set(set).await }
                    })
                    .await
                {
                    Ok(_) => successes += 1,
                    Err(error) => assert_eq!(error.code(), Some(Code::BadVersion), "only lost races may fail: {error:?}"),
                }
            }
            successes
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task");
    }
    let last = api
        .call(TIMEOUT, true, |mut c| async move { c.get(GetRequest { path: "/counter".into(), ..GetRequest::default() }).await })
        .await
        .expect("get");
    let value: u64 = String::from_utf8(last.data).expect("utf8").parse().expect("number");
    assert!(total > 0);
    assert_eq!(value, total, "every successful CAS incremented once, no lost update");
    assert_eq!(last.stat.expect("stat").version, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed_statuses_and_headers_are_filled() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    let created = api
        .call(TIMEOUT, false, |mut c| async move { c.create(CreateRequest { path: "/h".into(), ..CreateRequest::default() }).await })
        .await
        .expect("create");
    let header = created.header.expect("header");
    assert_eq!(header.group_id, 1);
    assert!(header.revision >= 1 && header.raft_term > 0 && header.leader_id > 0);
    // A missing node: NOT_FOUND with a NO_NODE detail.
    let leader = cluster.leader(1).await.expect("leader");
    let status = api.node(leader).get(GetRequest { path: "/missing".into(), ..GetRequest::default() }).await.expect_err("missing");
    assert_eq!(status.code(), tonic::Code::NotFound);
    let detail = error_of(&status).expect("detail");
    assert_eq!((Code::try_from(detail.code).ok(), detail.path.as_str()), (Some(Code::NoNode), "/missing"));
    // A write to a follower: NOT_LEADER naming the leader and its address.
    let follower = cluster.node_ids().into_iter().find(|id| *id != leader).expect("follower");
    let status = api.node(follower).create(CreateRequest { path: "/f".into(), ..CreateRequest::default() }).await.expect_err("follower");
    let detail = error_of(&status).expect("detail");
    assert_eq!(Code::try_from(detail.code).ok(), Some(Code::NotLeader));
    assert_eq!(detail.leader_id, leader);
    assert_eq!(detail.leader_addr, cluster.addr(leader).expect("addr").to_string());
    // Invalid input: INVALID_ARGUMENT with INVALID_PATH, and nothing changed.
    let status = api.node(leader).create(CreateRequest { path: "no-slash".into(), ..CreateRequest::default() }).await.expect_err("invalid");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(error_of(&status).map(|e| e.code), Some(Code::InvalidPath as i32));
    // An oversized request is refused before it reaches the group.
    let huge = CreateRequest { path: "/huge".into(), data: vec![0; 2 << 20], ..CreateRequest::default() };
    let status = api.node(leader).create(huge).await.expect_err("too large");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    let sync = api.call(TIMEOUT, true, |mut c| async move { c.sync(SyncRequest::default()).await }).await.expect("sync");
    assert_eq!(sync.header.expect("header").revision, header.revision, "failed requests changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_reads_can_lag_linearizable_reads_cannot() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    api.call(TIMEOUT, false, |mut c| async move {
        c.create(CreateRequest { path: "/v".into(), data: b"old".to_vec(), ..CreateRequest::default() }).await
    })
    .await
    .expect("create");
    let leader = cluster.leader(1).await.expect("leader");
    let lagging = cluster.node_ids().into_iter().find(|id| *id != leader).expect("follower");
    // Let the follower apply the create, then cut it off.
    let stale_get = GetRequest { path: "/v".into(), consistency: Consistency::Stale as i32, routing: None };
    for _ in 0..100 {
        if api.node(lagging).get(stale_get.clone()).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.faults().isolate(lagging, &cluster.node_ids());
    let set = api
        .call(TIMEOUT, false, |mut c| async move { c.set(SetRequest { path: "/v".into(), data: b"new".to_vec(), ..SetRequest::default() }).await })
        .await
        .expect("majority write");
    let written = set.header.expect("header").revision;
    let stale = api.node(lagging).get(stale_get.clone()).await.expect("stale read").into_inner();
    assert_eq!(stale.data, b"old", "the cut-off replica still has the old value");
    assert!(stale.header.expect("header").revision < written, "and says how far behind it is");
    // The caller's gRPC deadline (2 s) is honoured: the node answers, typed, before it.
    let mut request = tonic::Request::new(GetRequest { path: "/v".into(), ..GetRequest::default() });
    request.set_timeout(Duration::from_secs(2));
    let linearizable = api.node(lagging).get(request).await;
    match linearizable {
        Err(status) => {
            let code = error_of(&status).and_then(|e| Code::try_from(e.code).ok());
            assert!(matches!(code, Some(Code::Unavailable | Code::NotLeader)), "typed error, got {status:?}");
        }
        Ok(response) => panic!("a cut-off replica served a linearizable read: {:?}", response.into_inner().data),
    }
    cluster.faults().heal();
    let fresh = api.call(TIMEOUT, true, |mut c| async move { c.get(GetRequest { path: "/v".into(), ..GetRequest::default() }).await }).await;
    assert_eq!(fresh.map(|r| r.data).ok(), Some(b"new".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_serve_generic_clients() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let addr = cluster.addr(1).expect("addr");
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}")).expect("uri").connect().await.expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    // SERVING once the node knows the leader of every group it hosts.
    wait_health(&mut health, "warden.v1.Warden", ServingStatus::Serving).await;
    let unknown = health.check(tonic_health::pb::HealthCheckRequest { service: "no.such.Service".into() }).await;
    assert_eq!(unknown.expect_err("unknown service").code(), tonic::Code::NotFound);
    let _ = CallError::Unknown(String::new());
}

/// Waits (with a deadline) until the node's health says `want` for `service`.
async fn wait_health(health: &mut HealthClient<tonic::transport::Channel>, service: &str, want: ServingStatus) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let response = health.check(tonic_health::pb::HealthCheckRequest { service: service.into() }).await.expect("health check");
        if response.into_inner().status == want as i32 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{service} never became {want:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A graceful stop (`warden node` on SIGTERM): the leader hands its
/// leadership to a peer, says NOT_SERVING, refuses new calls UNAVAILABLE (typed: the caller
/// goes elsewhere, nothing was done), and the group goes on writing with its new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_leader_hands_over_and_refuses_new_calls() {
    let cluster = namespace_cluster(ClusterConfig::default()).await;
    let api = ApiClient::new(&cluster);
    api.call(TIMEOUT, false, |mut c| async move { c.create(CreateRequest { path: "/before".into(), ..CreateRequest::default() }).await })
        .await
        .expect("create");
    let leader = cluster.leader(1).await.expect("leader");
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", cluster.addr(leader).expect("addr"))).expect("uri").connect_lazy();
    let mut health = HealthClient::new(channel);
    wait_health(&mut health, "warden.v1.Warden", ServingStatus::Serving).await;
    let report = cluster.drainer(leader).expect("running").drain(DrainLimits::default()).await;
    assert!(report.transfers >= 1 && report.still_led.is_empty() && report.proposals_in_flight == 0, "{report:?}");
    let now = cluster.wait_leader(1, TIMEOUT).await.expect("a new leader");
    assert_ne!(now, leader, "the drained node still leads");
    for service in ["", "warden.v1.Warden"] {
        wait_health(&mut health, service, ServingStatus::NotServing).await;
    }
    let refused = api.node(leader).create(CreateRequest { path: "/refused".into(), ..CreateRequest::default() }).await.expect_err("refused");
    assert_eq!(error_of(&refused).map(|e| e.code), Some(Code::Unavailable as i32), "{refused:?}");
    api.call(TIMEOUT, false, |mut c| async move { c.create(CreateRequest { path: "/after".into(), ..CreateRequest::default() }).await })
        .await
        .expect("the group writes with its new leader");
    let refused_read = api.node(leader).get(GetRequest { path: "/after".into(), ..GetRequest::default() }).await;
    assert!(refused_read.is_err(), "a stopping node takes no new call");
}
