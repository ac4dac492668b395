//! TLS and the two ports: a cluster whose every link is TLS serves clients holding
//! a certificate of its CA (through routers, and on the nodes' client ports); a process of
//! another CA cannot join, send raft messages or call the peer port; a client certificate
//! cannot reach the peer port; a router cannot make the calls only nodes make; a node cannot
//! speak for another; and the client port serves none of the internal calls.

use std::sync::Arc;
use std::time::Duration;

use crate::support::routed::{start_secure_router, TIMEOUT};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use warden_placement::acl;
use warden_proto::namespace::session_check_client::SessionCheckClient;
use warden_proto::namespace::{EndSessionsRequest, SetQuotaShare};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{
    ChangeAclRequest, CreateReplicaRequest, GetRoutingTableRequest, HeartbeatRequest, RequestQuotaRequest, SetQuotaRequest, SetQuotaShareRequest,
};
use warden_proto::tls::{lazy_channel, Expected, Identity, Tls};
use warden_proto::transport::raft_transport_client::RaftTransportClient;
use warden_proto::transport::RaftBatch;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{CreateRequest, GetRequest, Routing};
use warden_server_kit::authority::Authority;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;
use warden_testkit::wait_until;

/// A 5-node cluster with TLS on every node and client ports, the CA's directory, and a
/// router with a router certificate.
struct Secure {
    cluster: Arc<Cluster>,
    dir: tempfile::TempDir,
    router: crate::support::routed::Router,
    root_group: u64,
}

/// The router's identity in these tests.
const ROUTER: &str = "r1";

impl Secure {
    async fn start() -> Secure {
        let dir = tempfile::tempdir().expect("tempdir");
        let config =
            ClusterConfig { serve_api: true, tls_dir: Some(dir.path().to_path_buf()), client_base_port: Some(0), ..ClusterConfig::default() };
        let cluster = Arc::new(Cluster::start(config, Arc::new(ShardNodeFactory::default())).expect("cluster starts"));
        let root = cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap over TLS");
        let router = start_secure_router(&cluster, issue(dir.path(), &Identity::router(ROUTER)), None);
        Secure { cluster, dir, router, root_group: root.group_id }
    }

    /// TLS files of the cluster's CA for `identity`.
    fn tls(&self, identity: &Identity) -> Arc<Tls> {
        issue(self.dir.path(), identity)
    }

    /// A channel to `addr` with `tls` (`None`: plaintext), expecting `expected` there.
    fn channel(addr: std::net::SocketAddr, tls: Option<&Arc<Tls>>, expected: Expected) -> Channel {
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri").connect_timeout(Duration::from_secs(2)).timeout(TIMEOUT);
        lazy_channel(endpoint, tls, expected)
    }

    fn peer_port(&self, node: u64) -> std::net::SocketAddr {
        self.cluster.addr(node).expect("peer port")
    }

    fn client_port(&self, node: u64) -> std::net::SocketAddr {
        self.cluster.client_addr(node).expect("client port")
    }
}

impl Secure {
    /// Grants `permissions` at `prefix` to `principal`, as root, at the placement leader.
    async fn grant(&self, prefix: &str, principal: &str, permissions: u32) {
        let root = self.tls(&Identity::client("root"));
        let request = ChangeAclRequest { prefix: prefix.into(), principal: principal.into(), permissions, revoke: false };
        crate::support::fleet::at_placement(&self.cluster, &root, |mut placement| {
            let request = request.clone();
            async move { placement.change_acl(request).await.map(drop) }
        })
        .await;
    }

    /// Waits until `call`, made as `tls` through the router at `router`, is served: the
    /// grants it needs reached the router and the nodes (they learn the ACL with the routing
    /// table and the heartbeats).
    async fn served<T, F, Fut>(&self, router: std::net::SocketAddr, tls: &Arc<Tls>, call: F)
    where
        F: Fn(WardenClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = WardenClient::new(Secure::channel(router, Some(tls), Expected::Router));
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            match call(client.clone()).await {
                Ok(_) => return,
                // Waiting is for grants to reach the router and every node, never for a rate.
                Err(status) if status.code() == Code::ResourceExhausted => panic!("refused by a limit: {status:?}"),
                Err(status) => assert!(tokio::time::Instant::now() < deadline, "never served: {status:?}"),
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn issue(dir: &std::path::Path, identity: &Identity) -> Arc<Tls> {
    let authority = Authority::load(dir).expect("the cluster's CA");
    Tls::load(authority.issue_files(dir, identity).expect("issue")).expect("load")
}

/// TLS of a CA other than the cluster's, for `identity`.
fn stranger(dir: &std::path::Path, identity: &Identity) -> Arc<Tls> {
    let authority = Authority::create("another CA").expect("ca");
    Tls::load(authority.issue_files(dir, identity).expect("issue")).expect("load")
}

/// A raft batch from node `from_node` carrying one heartbeat of the placement group that
/// claims to come from node `message_from`.
fn raft_batch(from_node: u64, message_from: u64, to: u64) -> RaftBatch {
    let mut message = raft::eraftpb::Message::default();
    message.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
    (message.from, message.to, message.term) = (message_from, to, 1);
    let mut envelopes = Vec::new();
    warden_engine::transport::encode_message(warden_placement::PLACEMENT_GROUP_ID, &message, 1 << 20, &Default::default(), &mut envelopes);
    RaftBatch { from_node, envelopes }
}

async fn raft_stream(channel: Channel, batch: RaftBatch) -> Result<(), tonic::Status> {
    RaftTransportClient::new(channel).stream(futures::stream::iter([batch])).await.map(drop)
}

/// Whether `code` is a refusal of the connection (the handshake failed or the server closed
/// the connection: gRPC reports UNAVAILABLE, CANCELLED when the connection closed under the
/// call, or INTERNAL when the server answered a plaintext HTTP/2 preface with TLS), not an
/// answer of a service.
fn connection_refused(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::Cancelled | Code::Internal | Code::Unknown)
}

fn code(result: Result<impl std::fmt::Debug, tonic::Status>) -> Code {
    match result {
        Ok(answer) => panic!("expected a refusal, got {answer:?}"),
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_cluster_serves_clients_with_a_certificate_of_its_ca_only() {
    let secure = Secure::start().await;
    // `root` may do everything (ACLs are on with TLS; see the matrix test for grants).
    let alice = secure.tls(&Identity::client("root"));

    // Through the router, with the client library.
    let config = warden_client::ClientConfig {
        tls: Some(alice.clone()),
        request_timeout: TIMEOUT,
        ..warden_client::ClientConfig::new([secure.router.addr.to_string()])
    };
    let client = warden_client::Client::connect(config).await.expect("a client of the CA connects to the router");
    client.create("/hello", "world", &warden_client::CreateOptions::default()).await.expect("create over TLS");
    assert_eq!(client.get("/hello").await.expect("get").data, b"world");

    // On the client port of the root group's leader, with the raw API.
    let root_leader = secure.cluster.wait_leader(secure.root_group, TIMEOUT).await.expect("root leader");
    let mut direct = WardenClient::new(Secure::channel(secure.client_port(root_leader), Some(&alice), Expected::Node(root_leader)));
    let read = direct.get(GetRequest { path: "/hello".into(), ..GetRequest::default() }).await.expect("get on a node's client port");
    assert_eq!(read.into_inner().data, b"world");

    // Refused: no TLS, a certificate of another CA, a server that is not who was expected.
    let plain = WardenClient::new(Secure::channel(secure.router.addr, None, Expected::Router));
    let refused = code(plain.clone().get(GetRequest { path: "/hello".into(), ..GetRequest::default() }).await);
    assert!(connection_refused(refused), "{}: {refused:?}", "plaintext to a TLS router");
    let mallory = stranger(&secure.dir.path().join("other"), &Identity::client("mallory"));
    let mut foreign = WardenClient::new(Secure::channel(secure.router.addr, Some(&mallory), Expected::Router));
    let refused = code(foreign.get(GetRequest { path: "/hello".into(), ..GetRequest::default() }).await);
    assert!(connection_refused(refused), "{}: {refused:?}", "another CA's client");
    let mut misdirected = WardenClient::new(Secure::channel(secure.client_port(root_leader), Some(&alice), Expected::Router));
    let refused = misdirected.create(CreateRequest { path: "/never".into(), ..CreateRequest::default() }).await;
    let refused = code(refused);
    assert!(connection_refused(refused), "{}: {refused:?}", "a node is not the router the client expected");
    assert!(client.get("/never").await.is_err(), "nothing was created by the refused call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_ports_admit_the_clusters_nodes_and_routers_only_and_a_node_speaks_only_for_itself() {
    let secure = Secure::start().await;
    let node_1 = secure.peer_port(1);
    let table = |tls: Option<&Arc<Tls>>, expected| {
        let mut client = PlacementClient::new(Secure::channel(node_1, tls, expected));
        async move { client.get_routing_table(GetRoutingTableRequest {}).await }
    };
    let heartbeat = |node_id: u64, addr: &str| HeartbeatRequest { node_id, addr: addr.into(), ..HeartbeatRequest::default() };

    // Nobody outside the cluster: plaintext, another CA's "node", a client of the CA.
    let refused = code(table(None, Expected::AnyNode).await);
    assert!(connection_refused(refused), "{}: {refused:?}", "plaintext");
    let impostor = stranger(&secure.dir.path().join("other"), &Identity::node(6));
    let refused = code(table(Some(&impostor), Expected::AnyNode).await);
    assert!(connection_refused(refused), "{}: {refused:?}", "another CA's node");
    let mut joining = PlacementClient::new(Secure::channel(node_1, Some(&impostor), Expected::AnyNode));
    let refused = code(joining.heartbeat(heartbeat(6, "127.0.0.1:1")).await);
    assert!(connection_refused(refused), "{}: {refused:?}", "another CA's node cannot join");
    let foreign_raft = raft_stream(Secure::channel(node_1, Some(&impostor), Expected::AnyNode), raft_batch(6, 6, 1)).await;
    let refused = code(foreign_raft);
    assert!(connection_refused(refused), "{}: {refused:?}", "another CA's node cannot send raft messages");
    let alice = secure.tls(&Identity::client("alice"));
    let refused = code(table(Some(&alice), Expected::AnyNode).await);
    assert!(connection_refused(refused), "{}: {refused:?}", "a client certificate on the peer port");

    // A router: the routing table, but none of the calls only nodes make.
    let router = secure.tls(&Identity::router("r2"));
    table(Some(&router), Expected::AnyNode).await.expect("a router reads the routing table");
    let mut as_router = PlacementClient::new(Secure::channel(node_1, Some(&router), Expected::Node(1)));
    assert_eq!(code(as_router.heartbeat(heartbeat(1, "127.0.0.1:1")).await), Code::PermissionDenied, "a router's heartbeat");
    let replica = CreateReplicaRequest { group_id: 77, voters: vec![1, 2, 3], ..CreateReplicaRequest::default() };
    assert_eq!(code(as_router.create_replica(replica.clone()).await), Code::PermissionDenied, "a router creating a replica");
    let quota = RequestQuotaRequest { group_id: 1, prefix: "/".into(), kind: 0, need: 1_000_000 };
    assert_eq!(code(as_router.request_quota(quota.clone()).await), Code::PermissionDenied, "a router asking for a quota share");
    let share = SetQuotaShareRequest {
        group_id: 1,
        share: Some(SetQuotaShare { prefix: "/".into(), version: u64::MAX, remove: true, ..Default::default() }),
    };
    assert_eq!(code(as_router.set_quota_share(share.clone()).await), Code::PermissionDenied, "a router setting a group's quota share");
    let router_raft = raft_stream(Secure::channel(node_1, Some(&router), Expected::Node(1)), raft_batch(1, 1, 1)).await;
    assert_eq!(code(router_raft), Code::PermissionDenied, "a router sending raft messages");
    let mut router_sessions = SessionCheckClient::new(Secure::channel(node_1, Some(&router), Expected::Node(1)));
    let end = EndSessionsRequest { session_ids: vec![1 << 40], routing: Some(Routing { group_id: 1, ..Routing::default() }) };
    assert_eq!(code(router_sessions.end_sessions(end).await), Code::PermissionDenied, "a router ending a group's remote sessions");

    // Node 2 as node 1: its heartbeat (which would move node 1's address) and its raft
    // messages are refused; as itself it is heard.
    let node_2 = secure.cluster.tls(2).expect("node 2's TLS");
    let mut as_node_2 = PlacementClient::new(Secure::channel(node_1, Some(&node_2), Expected::Node(1)));
    assert_eq!(code(as_node_2.heartbeat(heartbeat(1, "127.0.0.1:1")).await), Code::PermissionDenied, "node 2 registering node 1");
    let claimed_batch = raft_stream(Secure::channel(node_1, Some(&node_2), Expected::Node(1)), raft_batch(1, 1, 1)).await;
    assert_eq!(code(claimed_batch), Code::PermissionDenied, "a batch from node 1 on node 2's connection");
    let claimed_message = raft_stream(Secure::channel(node_1, Some(&node_2), Expected::Node(1)), raft_batch(2, 1, 1)).await;
    assert_eq!(code(claimed_message), Code::PermissionDenied, "a message from node 1 in node 2's batch");
    raft_stream(Secure::channel(node_1, Some(&node_2), Expected::Node(1)), raft_batch(2, 2, 1)).await.expect("node 2 as itself");
    let routing = table(Some(&router), Expected::AnyNode).await.expect("table").into_inner();
    let registered = routing.nodes.iter().find(|node| node.id == 1).expect("node 1 registered");
    assert_eq!(registered.addr, node_1.to_string(), "node 1's address did not move");
    assert!(routing.nodes.iter().all(|node| node.id != 6), "the other CA's node did not join");

    // The client port serves none of the internal calls, whoever asks.
    let node_client_port = secure.client_port(1);
    let mut on_client_port = PlacementClient::new(Secure::channel(node_client_port, Some(&node_2), Expected::Node(1)));
    assert_eq!(code(on_client_port.create_replica(replica).await), Code::PermissionDenied, "CreateReplica on the client port");
    assert_eq!(code(on_client_port.heartbeat(heartbeat(2, "127.0.0.1:1")).await), Code::PermissionDenied, "Heartbeat on the client port");
    assert_eq!(code(on_client_port.request_quota(quota).await), Code::PermissionDenied, "RequestQuota on the client port");
    assert_eq!(code(on_client_port.set_quota_share(share).await), Code::PermissionDenied, "SetQuotaShare on the client port");
    let raft_on_client_port = raft_stream(Secure::channel(node_client_port, Some(&node_2), Expected::Node(1)), raft_batch(2, 2, 1)).await;
    assert_eq!(code(raft_on_client_port), Code::Unimplemented, "the raft transport is not on the client port");
    on_client_port.get_routing_table(GetRoutingTableRequest {}).await.expect("the routing table is");
}

/// Writes `identity`'s new certificate from `authority` over its files in `dir`, leaving
/// `ca.pem` as it is (key first: a process reloading in between refuses the mismatched pair
/// and keeps its previous one).
fn reissue(authority: &Authority, dir: &std::path::Path, identity: &Identity) {
    let files = Authority::files(dir, identity);
    let (certificate, key) = authority.issue(identity, &[]).expect("issue");
    std::fs::write(&files.key, key).expect("write key");
    std::fs::write(&files.cert, certificate).expect("write certificate");
}

/// A CA rotation while a client writes: the CA file becomes the old and the new CA, every
/// process gets a certificate of the new one, a node restarts (its peers reconnect with the
/// new certificates), then the old CA goes. No write fails, nothing restarts but that node,
/// and at the end a certificate of the old CA is refused and one of the new accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_ca_rotates_under_load_without_a_failed_request() {
    let secure = Secure::start().await;
    let dir = secure.dir.path();
    let old_ca = Authority::load(dir).expect("the cluster's CA");
    let old_client_files = old_ca.issue_files(&dir.join("old"), &Identity::client("root")).expect("issue");
    let config = |tls: Arc<Tls>| warden_client::ClientConfig {
        tls: Some(tls),
        request_timeout: TIMEOUT,
        ..warden_client::ClientConfig::new([secure.router.addr.to_string()])
    };
    let client = warden_client::Client::connect(config(secure.tls(&Identity::client("root")))).await.expect("connect");
    client.create("/rotation", "0", &warden_client::CreateOptions::default()).await.expect("create");
    let writes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (client, writes, stop) = (client.clone(), writes.clone(), stop.clone());
        async move {
            let mut failures = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n = writes.load(std::sync::atomic::Ordering::Relaxed);
                match client.set("/rotation", n.to_string(), None).await {
                    Ok(_) => drop(writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
                    Err(error) => failures.push(error.to_string()),
                }
            }
            failures
        }
    });
    let progressed = |from: u64| {
        let writes = writes.clone();
        move || {
            let writes = writes.clone();
            async move { writes.load(std::sync::atomic::Ordering::Relaxed) >= from + 20 }
        }
    };
    wait_until("writes go on", TIMEOUT, progressed(0)).await;

    // 1. Trust both CAs, 2. every process gets a certificate of the new one.
    let new_ca = Authority::create("the new CA").expect("ca");
    let both = format!("{}{}", old_ca.certificate_pem(), new_ca.certificate_pem());
    std::fs::write(dir.join("ca.pem"), &both).expect("bundle");
    // The old CA's client trusts both too: its refusal below is the servers'.
    std::fs::write(&old_client_files.ca, &both).expect("bundle");
    let old_client = Tls::load(old_client_files).expect("load");
    for id in secure.cluster.node_ids() {
        reissue(&new_ca, dir, &Identity::node(id));
    }
    reissue(&new_ca, dir, &Identity::router(ROUTER));
    // 3. A node restarts: its peers and the router reconnect to it with their new
    //    certificates, and it to them with its own.
    // Not a leader of the root group (whose writes it would fail with an unknown outcome, as
    // any leader's restart does: the client library rightly does not retry those).
    let root_leader = secure.cluster.wait_leader(secure.root_group, TIMEOUT).await.expect("root leader");
    let restarted = secure.cluster.node_ids().into_iter().find(|id| *id != root_leader).expect("a node");
    secure.cluster.restart(restarted).expect("restart");
    let new_client_dir = dir.join("new");
    let new_client = Tls::load(new_ca.issue_files(&new_client_dir, &Identity::client("root")).expect("issue")).expect("load");
    let reads = |tls: Arc<Tls>| async move {
        match warden_client::Client::connect(config(tls)).await {
            Ok(client) => client.get("/rotation").await.is_ok(),
            Err(_) => false,
        }
    };
    wait_until("a client of the new CA is accepted", TIMEOUT, || reads(new_client.clone())).await;
    let restarted_node = secure.cluster.handle(restarted).expect("restarted");
    wait_until("the restarted node hears its group again", TIMEOUT, || async { restarted_node.leader_info(secure.root_group).leader_id != 0 }).await;
    let now = writes.load(std::sync::atomic::Ordering::Relaxed);
    wait_until("writes go on after the new certificates", TIMEOUT, progressed(now)).await;

    // 4. The old CA goes.
    std::fs::write(dir.join("ca.pem"), new_ca.certificate_pem()).expect("new CA only");
    wait_until("a client of the old CA is refused", TIMEOUT, || async { !reads(old_client.clone()).await }).await;
    let now = writes.load(std::sync::atomic::Ordering::Relaxed);
    wait_until("writes go on after the old CA went", TIMEOUT, progressed(now)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let failures = writer.await.expect("writer");
    assert!(failures.is_empty(), "failed writes during the rotation: {failures:?}");
    assert!(reads(new_client).await, "the new CA's client still reads");
}

/// A router limiting each principal to 5 calls a second: a client calling in a tight loop is
/// refused RATE_LIMITED (typed, with the rate) once its burst is spent, and a refused create
/// creates nothing; another principal is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_limits_each_principal_to_its_rate() {
    let secure = Secure::start().await;
    let rate = std::num::NonZeroU32::new(5).expect("positive");
    let limited = start_secure_router(&secure.cluster, secure.tls(&Identity::router("limited")), Some(rate));
    // Root writes; bob may read `/` once his grant has reached the router and the nodes.
    let alice = secure.tls(&Identity::client("root"));
    let bob = secure.tls(&Identity::client("bob"));
    secure.grant("/", "bob", acl::READ).await;
    for router in [limited.addr, secure.router.addr] {
        secure.served(router, &bob, |mut c| async move { c.get(GetRequest { path: "/".into(), ..GetRequest::default() }).await }).await;
    }
    let mut as_alice = WardenClient::new(Secure::channel(limited.addr, Some(&alice), Expected::Router));
    // 30 calls in a row: they take far less than the 5 s their rate would need, so some are
    // refused; the first 5 (the burst) are not.
    let (mut created, mut refused) = (Vec::new(), 0);
    for i in 0..30 {
        let path = format!("/limited-{i}");
        match as_alice.create(CreateRequest { path: path.clone(), ..CreateRequest::default() }).await {
            Ok(_) => created.push(path),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                let error = warden_proto::error_of(&status).expect("a typed error");
                assert_eq!(error.code, warden_proto::v1::warden_error::Code::RateLimited as i32);
                assert_eq!(error.limit, 5, "the error names the rate");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "30 calls in a row went through at 5/s");
    assert!(created.len() >= 5, "the burst of 5 is served: {created:?}");
    // Bob has his own budget: never refused by the rate (nodes learn his grant by heartbeat,
    // so a node that took over a group meanwhile may not know it yet: `served` waits).
    secure.served(limited.addr, &bob, |mut c| async move { c.get(GetRequest { path: "/".into(), ..GetRequest::default() }).await }).await;
    // Exactly the creates that were answered exist.
    let mut unlimited = WardenClient::new(Secure::channel(secure.router.addr, Some(&bob), Expected::Router));
    let listed =
        unlimited.get_children(warden_proto::v1::GetChildrenRequest { path: "/".into(), ..Default::default() }).await.expect("list").into_inner();
    let mut existing: Vec<String> = listed.names.into_iter().filter(|name| name.starts_with("limited-")).map(|name| format!("/{name}")).collect();
    existing.sort();
    created.sort();
    assert_eq!(existing, created, "a refused create created nothing");
}

/// What one call of the matrix answered: served, or the gRPC code it was refused with.
fn outcome<T>(result: Result<tonic::Response<T>, tonic::Status>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(status) if status.code() == Code::PermissionDenied => "denied",
        Err(status) if status.code() == Code::Unauthenticated => "unauthenticated",
        Err(status) if connection_refused(status.code()) => "refused",
        Err(status) => panic!("unexpected answer {status:?}"),
    }
}

/// The public API × credentials matrix: every public call, made through the
/// router by another team's principal, a read-only principal, a team's full principal and
/// root, answers as the grants say; sessions are their opener's. A client of another CA, and
/// one without a certificate, are refused the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_public_call_answers_as_the_grants_say() {
    use futures::StreamExt as _;
    use warden_proto::v1::*;
    let secure = Secure::start().await;
    let router = secure.router.addr;
    let as_ = |name: &str| WardenClient::new(Secure::channel(router, Some(&secure.tls(&Identity::client(name))), Expected::Router));
    secure.grant("/team-a", "alice", acl::READ | acl::WRITE | acl::LOCK | acl::WATCH).await;
    secure.grant("/team-a", "carol", acl::READ).await;
    secure.grant("/team-b", "bob", acl::ADMIN).await;
    // Dave may lock in /team-a but owns none of alice's sessions: the owner checks decide.
    secure.grant("/team-a", "dave", acl::READ | acl::LOCK).await;
    secure.grant("/", "olga", acl::ADMIN).await;
    let mut root = as_("root");
    for path in ["/team-a", "/team-b", "/team-a/data", "/team-a/tmp-alice", "/team-a/tmp-root"] {
        root.create(CreateRequest { path: path.into(), ..CreateRequest::default() }).await.expect("root creates");
    }
    let alice_tls = secure.tls(&Identity::client("alice"));
    secure
        .served(router, &alice_tls, |mut c| async move { c.create(CreateRequest { path: "/team-a/ready".into(), ..Default::default() }).await })
        .await;
    for (name, path) in [("carol", "/team-a"), ("dave", "/team-a"), ("bob", "/team-b")] {
        let tls = secure.tls(&Identity::client(name));
        secure.served(router, &tls, |mut c| async move { c.get(GetRequest { path: path.into(), ..GetRequest::default() }).await }).await;
    }
    // Alice's session, holding /team-a/held: what the others' session calls name.
    let mut alice = as_("alice");
    let alice_session =
        alice.create_session(CreateSessionRequest { ttl_ms: 30_000, ..Default::default() }).await.expect("session").into_inner().session_id;
    let lock = LockRequest { path: "/team-a/held".into(), session_id: alice_session, ..LockRequest::default() };
    let alice_sequencer = alice.lock(lock).await.expect("lock").into_inner().sequencer.expect("held");

    // Rows: another team, read-only, lock but no session of alice's, full, admin (root also
    // bypasses session owners). Each uses its own session where it may open one.
    let expected: &[(&str, [&str; 17])] = &[
        (
            "bob",
            [
                "denied", "denied", "denied", "denied", "denied", "denied", "denied", "ok", "ok", "denied", "denied", "denied", "denied", "denied",
                "denied", "ok", "denied",
            ],
        ),
        (
            "carol",
            [
                "denied", "ok", "ok", "denied", "denied", "ok", "ok", "ok", "denied", "denied", "denied", "denied", "ok", "ok", "denied", "denied",
                "denied",
            ],
        ),
        ("dave", ["denied", "ok", "ok", "denied", "denied", "ok", "ok", "ok", "ok", "denied", "denied", "ok", "ok", "ok", "ok", "ok", "denied"]),
        ("alice", ["ok"; 17]),
        ("root", ["ok"; 17]),
    ];
    let calls = [
        "Create",
        "Get",
        "Exists",
        "Set",
        "Delete",
        "GetChildren",
        "Txn",
        "Sync",
        "CreateSession",
        "KeepAlive",
        "SessionInfo",
        "Lock",
        "LockInfo",
        "CheckSequencer",
        "Unlock",
        "CloseSession",
        "Watch",
    ];
    for (who, row) in expected {
        let mut c = as_(who);
        let mut got = Vec::new();
        got.push(outcome(c.create(CreateRequest { path: format!("/team-a/x-{who}"), ..Default::default() }).await));
        got.push(outcome(c.get(GetRequest { path: "/team-a/data".into(), ..Default::default() }).await));
        got.push(outcome(c.exists(ExistsRequest { path: "/team-a/data".into(), ..Default::default() }).await));
        got.push(outcome(c.set(SetRequest { path: "/team-a/data".into(), data: who.as_bytes().to_vec(), ..Default::default() }).await));
        got.push(outcome(c.delete(DeleteRequest { path: format!("/team-a/tmp-{who}"), ..Default::default() }).await));
        got.push(outcome(c.get_children(GetChildrenRequest { path: "/team-a".into(), ..Default::default() }).await));
        let txn = TxnRequest {
            compares: vec![Compare { path: "/team-a/data".into(), target: compare::Target::Exists as i32, exists: true, ..Default::default() }],
            then: vec![TxnOp { op: Some(txn_op::Op::Get(GetRequest { path: "/team-a/data".into(), ..Default::default() })) }],
            ..Default::default()
        };
        got.push(outcome(c.txn(txn).await));
        got.push(outcome(c.sync(SyncRequest::default()).await));
        let created = c.create_session(CreateSessionRequest { ttl_ms: 30_000, ..Default::default() }).await;
        let own_session = created.as_ref().ok().map(|r| r.get_ref().session_id);
        got.push(outcome(created));
        got.push(outcome(c.keep_alive(KeepAliveRequest { session_ids: vec![alice_session], ..Default::default() }).await));
        got.push(outcome(c.session_info(SessionInfoRequest { session_id: alice_session, ..Default::default() }).await));
        let session = own_session.unwrap_or(alice_session);
        let locked = c.lock(LockRequest { path: format!("/team-a/lock-{who}"), session_id: session, ..Default::default() }).await;
        let own_sequencer = locked.as_ref().ok().and_then(|r| r.get_ref().sequencer.clone());
        got.push(outcome(locked));
        got.push(outcome(c.lock_info(LockInfoRequest { path: "/team-a/held".into(), ..Default::default() }).await));
        got.push(outcome(c.check_sequencer(CheckSequencerRequest { sequencer: Some(alice_sequencer.clone()), ..Default::default() }).await));
        let sequencer = own_sequencer.unwrap_or_else(|| alice_sequencer.clone());
        got.push(outcome(c.unlock(UnlockRequest { sequencer: Some(sequencer), ..Default::default() }).await));
        got.push(outcome(c.close_session(CloseSessionRequest { session_id: session, ..Default::default() }).await));
        let create = WatchCreate { path: "/team-a".into(), ..Default::default() };
        let requests =
            futures::stream::iter([WatchRequest { request: Some(watch_request::Request::Create(create)) }]).chain(futures::stream::pending());
        let mut responses = c.watch(requests).await.expect("a watch stream opens").into_inner();
        let first = responses.message().await.expect("a first answer").expect("a response");
        let refused = first.canceled.as_ref().and_then(|c| c.error.as_ref()).map(|e| e.code);
        got.push(match refused {
            None if first.created.is_some() => "ok",
            Some(code) if code == warden_error::Code::PermissionDenied as i32 => "denied",
            other => panic!("unexpected watch answer {other:?}: {first:?}"),
        });
        let table: Vec<(&str, &str, &str)> = calls.iter().zip(row.iter()).zip(&got).map(|((call, want), got)| (*call, *want, *got)).collect();
        let wrong: Vec<_> = table.iter().filter(|(_, want, got)| want != got).collect();
        assert!(wrong.is_empty(), "{who}: (call, expected, got) {wrong:?}");
    }

    // Alice's session is alice's, before and after her lock moves with /team-a into a group
    // of its own (her session stays homed in the root group).
    let alice_sequencer = sessions_stay_their_owners(&mut alice, &mut as_("dave"), alice_session, alice_sequencer).await;
    let root_tls = secure.tls(&Identity::client("root"));
    crate::support::fleet::at_placement(&secure.cluster, &root_tls, |mut placement| async move {
        placement.split_group(warden_proto::placement::CreateGroupRequest { prefix: "/team-a".into() }).await.map(drop)
    })
    .await;
    sessions_stay_their_owners(&mut alice, &mut as_("dave"), alice_session, alice_sequencer).await;

    // A refused call changed nothing and told nothing: the data is the last writer's who may
    // write, and the refusal of a path that does not exist reads as one that does.
    let data = root.get(GetRequest { path: "/team-a/data".into(), ..Default::default() }).await.expect("get").into_inner().data;
    assert_eq!(data, b"root");
    let mut bob = as_("bob");
    let existing = bob.get(GetRequest { path: "/team-a/data".into(), ..Default::default() }).await.expect_err("denied");
    let missing = bob.get(GetRequest { path: "/team-a/nothing".into(), ..Default::default() }).await.expect_err("denied");
    assert_eq!((existing.code(), missing.code()), (Code::PermissionDenied, Code::PermissionDenied));
    assert_eq!(existing.message().replace("/team-a/data", "P"), missing.message().replace("/team-a/nothing", "P"));

    // Administration: bob administers /team-b only; carol nothing.
    // Grants and quotas alike.
    let grant =
        |prefix: &str| Admin::Grant(ChangeAclRequest { prefix: prefix.into(), principal: "dave".into(), permissions: acl::READ, revoke: false });
    // A quota is set (`Some(nodes)`) or removed (`None`).
    let quota = |prefix: &str, nodes: Option<u64>| {
        let limits = nodes.map(|nodes| QuotaLimits { nodes: Some(nodes), ..Default::default() });
        Admin::Quota(SetQuotaRequest { prefix: prefix.into(), remove: limits.is_none(), limits })
    };
    let on_nodes = |name: &str, request: Admin| {
        let tls = secure.tls(&Identity::client(name));
        let ports: Vec<_> = (1..=5).map(|node| (node, secure.client_port(node))).collect();
        async move {
            for (node, port) in ports {
                let mut placement = PlacementClient::new(Secure::channel(port, Some(&tls), Expected::Node(node)));
                let answer = match request.clone() {
                    Admin::Grant(request) => placement.change_acl(request).await.map(drop),
                    Admin::Quota(request) => placement.set_quota(request).await.map(drop),
                };
                match answer {
                    Ok(()) => return "ok",
                    Err(status) if status.code() == Code::PermissionDenied => return "denied",
                    Err(_) => continue,
                }
            }
            "unanswered"
        }
    };
    assert_eq!(on_nodes("bob", grant("/team-a")).await, "denied");
    assert_eq!(on_nodes("carol", grant("/team-a")).await, "denied");
    assert_eq!(on_nodes("bob", grant("/team-b/x")).await, "ok");
    assert_eq!(on_nodes("bob", quota("/team-a", Some(100))).await, "denied");
    // A quota is administered from strictly above it: bob, admin of /team-b, may divide the
    // quota an admin of / set on /team-b, but neither raise nor remove it.
    assert_eq!(on_nodes("olga", quota("/team-b", Some(100))).await, "ok", "an admin of / sets a tenant's quota");
    assert_eq!(on_nodes("bob", quota("/team-b", Some(1_000_000))).await, "denied", "the tenant raising it");
    assert_eq!(on_nodes("bob", quota("/team-b", None)).await, "denied", "the tenant removing it");
    assert_eq!(on_nodes("bob", quota("/team-b/sub", Some(10))).await, "ok", "the tenant dividing it below");
    assert_eq!(on_nodes("bob", quota("/team-b/sub", None)).await, "ok");

    // Session quotas count each session at its scope, and only who may lock there spends
    // them: dave (lock at /team-a) may not open a session hinted /team-b; bob's sessions count
    // at /team-b with a hint and without one (his lock grants meet there), and a hint must
    // lie in the subtree of the home group a caller names.
    let limits = QuotaLimits { nodes: Some(100), sessions: Some(2), ..Default::default() };
    let sessions_quota = Admin::Quota(SetQuotaRequest { prefix: "/team-b".into(), remove: false, limits: Some(limits) });
    assert_eq!(on_nodes("olga", sessions_quota).await, "ok");
    let hinted = |hint: &str| CreateSessionRequest { ttl_ms: 30_000, path_hint: hint.into(), ..Default::default() };
    assert_eq!(outcome(as_("dave").create_session(hinted("/team-b")).await), "denied", "dave spent /team-b's session quota");
    let team_a_group = root.get(GetRequest { path: "/team-a/data".into(), ..Default::default() }).await.expect("get").into_inner().header;
    let team_a_group = team_a_group.expect("a header").group_id;
    let mut elsewhere =
        tonic::Request::new(CreateSessionRequest { routing: Some(Routing { group_id: team_a_group, ..Default::default() }), ..hinted("/team-b") });
    elsewhere.set_timeout(Duration::from_secs(3));
    let refused = bob.create_session(elsewhere).await.expect_err("a session homed where its hint is not served");
    assert_eq!(warden_proto::error_of(&refused).map(|e| e.code), Some(warden_error::Code::WrongGroup as i32), "{refused:?}");
    bob.create_session(hinted("/team-b/x")).await.expect("bob's session hinted /team-b/x");
    bob.create_session(hinted("")).await.expect("bob's session without a hint");
    let refused = bob.create_session(hinted("")).await.expect_err("a third session counted at /team-b");
    let exceeded = warden_proto::error_of(&refused).and_then(|e| e.quota).unwrap_or_else(|| panic!("no quota refusal: {refused:?}"));
    assert_eq!((exceeded.prefix.as_str(), exceeded.kind), ("/team-b", QuotaKind::QuotaSessions as i32));

    // No certificate, or another CA's: the connection is refused.
    let mallory = stranger(&secure.dir.path().join("other"), &Identity::client("root"));
    let mut foreign = WardenClient::new(Secure::channel(router, Some(&mallory), Expected::Router));
    assert_eq!(outcome(foreign.get(GetRequest { path: "/team-a".into(), ..Default::default() }).await), "refused");
    let mut plain = WardenClient::new(Secure::channel(router, None, Expected::Router));
    assert_eq!(outcome(plain.get(GetRequest { path: "/team-a".into(), ..Default::default() }).await), "refused");
}

/// Dave, who may lock at /team-a/held but does not own alice's session, neither releases
/// alice's hold there (with her sequencer as LockInfo describes it) nor waits or holds with
/// her session; alice still holds, and she may release and take it again. Answers alice's
/// new sequencer.
async fn sessions_stay_their_owners(
    alice: &mut WardenClient<Channel>,
    dave: &mut WardenClient<Channel>,
    alice_session: u64,
    alice_sequencer: warden_proto::v1::Sequencer,
) -> warden_proto::v1::Sequencer {
    use warden_proto::v1::*;
    let lock = "/team-a/held";
    let info = dave.lock_info(LockInfoRequest { path: lock.into(), ..Default::default() }).await.expect("lock info").into_inner();
    let holder = info.holders.first().expect("alice holds");
    assert_eq!(holder.session_id, alice_session);
    let sequencer = Sequencer { path: lock.into(), mode: holder.mode, token: holder.token, group_id: 0, waiter: holder.waiter.clone() };
    let unlocked = dave.unlock(UnlockRequest { sequencer: Some(sequencer), ..Default::default() }).await;
    assert_eq!(outcome(unlocked), "denied", "dave released alice's hold");
    let with_alices = LockRequest { path: lock.into(), session_id: alice_session, ..Default::default() };
    assert_eq!(outcome(dave.lock(with_alices).await), "denied", "dave locked with alice's session");
    let check = || CheckSequencerRequest { sequencer: Some(alice_sequencer.clone()), ..Default::default() };
    assert!(alice.check_sequencer(check()).await.expect("check").into_inner().holds, "alice lost her hold");
    let dave_session =
        dave.create_session(CreateSessionRequest { ttl_ms: 30_000, ..Default::default() }).await.expect("dave's session").into_inner().session_id;
    let try_lock = LockRequest { path: lock.into(), session_id: dave_session, ..Default::default() };
    let tried = dave.lock(try_lock.clone()).await.expect("dave's try-lock").into_inner();
    assert!(!tried.acquired, "two holders of {lock}");
    // The owner may: alice releases her hold and takes it again.
    alice.unlock(UnlockRequest { sequencer: Some(alice_sequencer), ..Default::default() }).await.expect("alice unlocks");
    let again = LockRequest { path: lock.into(), session_id: alice_session, ..Default::default() };
    let relocked = alice.lock(again).await.expect("alice locks again").into_inner();
    assert!(relocked.acquired);
    dave.close_session(CloseSessionRequest { session_id: dave_session, ..Default::default() }).await.expect("dave closes his session");
    relocked.sequencer.expect("alice's new sequencer")
}

/// Bearer tokens: a client without a certificate of its own names its principal
/// with a token from the router's token file; the token's grants apply as a certificate's
/// would; a missing or unknown token is UNAUTHENTICATED; a line removed from the file revokes
/// its token without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_names_its_principal_until_its_line_is_removed() {
    use warden_proto::tls::tokens;
    let secure = Secure::start().await;
    let token = tokens::generate().expect("token");
    let tokens_file = secure.dir.path().join("tokens");
    std::fs::write(&tokens_file, format!("{}\n", tokens::line("tina", &token))).expect("tokens file");
    let router_files =
        Authority::load(secure.dir.path()).expect("ca").issue_files(&secure.dir.path().join("rt"), &Identity::router("rt")).expect("issue");
    let ca = router_files.ca.clone();
    let router_tls = Tls::load_with_tokens(router_files, Some(tokens::Tokens::load(&tokens_file).expect("load"))).expect("tls");
    let router = start_secure_router(&secure.cluster, router_tls, None);
    let mut root = WardenClient::new(Secure::channel(secure.router.addr, Some(&secure.tls(&Identity::client("root"))), Expected::Router));
    root.create(CreateRequest { path: "/tina".into(), ..CreateRequest::default() }).await.expect("root creates");
    secure.grant("/tina", "tina", acl::READ | acl::WRITE).await;

    // The client library, with the CA only and the token.
    let ca_only = Tls::load_ca_only(ca).expect("ca only");
    let config = |token: &str| warden_client::ClientConfig {
        tls: Some(ca_only.clone()),
        token: Some(token.to_string()),
        request_timeout: TIMEOUT,
        ..warden_client::ClientConfig::new([router.addr.to_string()])
    };
    let tina = warden_client::Client::connect(config(&token)).await.expect("a token client connects");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while let Err(error) = tina.create("/tina/note", "hi", &warden_client::CreateOptions::default()).await {
        assert!(tokio::time::Instant::now() < deadline, "tina's grant never reached the router and nodes: {error}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(tina.get("/tina/note").await.expect("get").data, b"hi");
    let outside = tina.create("/elsewhere", "x", &warden_client::CreateOptions::default()).await;
    assert!(matches!(outside, Err(warden_client::Error::PermissionDenied { .. })), "{outside:?}");

    // An unknown token, and none at all.
    let stranger = warden_client::Client::connect(config(&tokens::generate().expect("token"))).await.expect("connects");
    let refused = stranger.get("/tina/note").await;
    assert!(matches!(refused, Err(warden_client::Error::Unauthenticated { .. })), "{refused:?}");
    let mut anonymous = WardenClient::new(Secure::channel(router.addr, Some(&ca_only), Expected::Router));
    let refused = anonymous.get(GetRequest { path: "/tina/note".into(), ..GetRequest::default() }).await.expect_err("no token");
    assert_eq!(refused.code(), Code::Unauthenticated);

    // Revoked by removing its line: refused once the router reads the file again.
    std::fs::write(&tokens_file, "# nobody\n").expect("revoke");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match tina.get("/tina/note").await {
            Err(warden_client::Error::Unauthenticated { .. }) => break,
            answer => assert!(tokio::time::Instant::now() < deadline, "the revoked token still works: {answer:?}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// An administration call the matrix makes as different principals.
#[derive(Clone)]
enum Admin {
    Grant(ChangeAclRequest),
    Quota(SetQuotaRequest),
}
