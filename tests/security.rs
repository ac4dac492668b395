//! Issue 17, TLS and the two ports: a cluster whose every link is TLS serves clients holding
//! a certificate of its CA (through routers, and on the nodes' client ports); a process of
//! another CA cannot join, send raft messages or call the peer port; a client certificate
//! cannot reach the peer port; a router cannot make the calls only nodes make; a node cannot
//! speak for another; and the client port serves none of the internal calls.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::routed::{start_secure_router, TIMEOUT};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{CreateReplicaRequest, GetRoutingTableRequest, HeartbeatRequest};
use warden_proto::tls::authority::Authority;
use warden_proto::tls::{lazy_channel, Expected, Identity, Tls};
use warden_proto::transport::raft_transport_client::RaftTransportClient;
use warden_proto::transport::RaftBatch;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{CreateRequest, GetRequest};
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;

/// A 5-node cluster with TLS on every node and client ports, the CA's directory, and a
/// router with a router certificate.
struct Secure {
    cluster: Arc<Cluster>,
    dir: tempfile::TempDir,
    router: support::routed::Router,
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
    warden_shard_node::transport::encode_message(warden_placement::PLACEMENT_GROUP_ID, &message, 1 << 20, &Default::default(), &mut envelopes);
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
    let alice = secure.tls(&Identity::client("alice"));

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
    let router_raft = raft_stream(Secure::channel(node_1, Some(&router), Expected::Node(1)), raft_batch(1, 1, 1)).await;
    assert_eq!(code(router_raft), Code::PermissionDenied, "a router sending raft messages");

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

/// Polls `probe` until it is true, for up to [`TIMEOUT`].
async fn eventually<F, Fut>(what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !probe().await {
        assert!(tokio::time::Instant::now() < deadline, "{what} within {TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
    let old_client_files = old_ca.issue_files(&dir.join("old"), &Identity::client("old")).expect("issue");
    let config = |tls: Arc<Tls>| warden_client::ClientConfig {
        tls: Some(tls),
        request_timeout: TIMEOUT,
        ..warden_client::ClientConfig::new([secure.router.addr.to_string()])
    };
    let client = warden_client::Client::connect(config(secure.tls(&Identity::client("alice")))).await.expect("connect");
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
    eventually("writes go on", progressed(0)).await;

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
    let new_client = Tls::load(new_ca.issue_files(&new_client_dir, &Identity::client("new")).expect("issue")).expect("load");
    let reads = |tls: Arc<Tls>| async move {
        match warden_client::Client::connect(config(tls)).await {
            Ok(client) => client.get("/rotation").await.is_ok(),
            Err(_) => false,
        }
    };
    eventually("a client of the new CA is accepted", || reads(new_client.clone())).await;
    let restarted_node = secure.cluster.handle(restarted).expect("restarted");
    eventually("the restarted node hears its group again", || async { restarted_node.leader_info(secure.root_group).leader_id != 0 }).await;
    let now = writes.load(std::sync::atomic::Ordering::Relaxed);
    eventually("writes go on after the new certificates", progressed(now)).await;

    // 4. The old CA goes.
    std::fs::write(dir.join("ca.pem"), new_ca.certificate_pem()).expect("new CA only");
    eventually("a client of the old CA is refused", || async { !reads(old_client.clone()).await }).await;
    let now = writes.load(std::sync::atomic::Ordering::Relaxed);
    eventually("writes go on after the old CA went", progressed(now)).await;
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
    let alice = secure.tls(&Identity::client("alice"));
    let bob = secure.tls(&Identity::client("bob"));
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
    // Bob has his own budget: served at once.
    let mut as_bob = WardenClient::new(Secure::channel(limited.addr, Some(&bob), Expected::Router));
    as_bob.get(GetRequest { path: "/".into(), ..GetRequest::default() }).await.expect("another principal is served");
    // Exactly the creates that were answered exist.
    let mut unlimited = WardenClient::new(Secure::channel(secure.router.addr, Some(&bob), Expected::Router));
    let listed =
        unlimited.get_children(warden_proto::v1::GetChildrenRequest { path: "/".into(), ..Default::default() }).await.expect("list").into_inner();
    let mut existing: Vec<String> = listed.names.into_iter().filter(|name| name.starts_with("limited-")).map(|name| format!("/{name}")).collect();
    existing.sort();
    created.sort();
    assert_eq!(existing, created, "a refused create created nothing");
}
