//! A routed fleet with security off or on, for the suites that run both ways (a
//! representative subset of the suites — locks, watches, the router, crashes — also runs
//! with security on). With security on every link is TLS, nodes have client ports, and the
//! tests' clients are the principal [`TESTER`], granted read, write, lock and watch at `/` by
//! `root` (so its sessions are its own and every call goes through the ACL checks on the
//! router and the nodes).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use warden_client::{Client, ClientConfig};
use warden_placement::acl;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{ChangeAclRequest, CreateGroupRequest};
use warden_proto::tls::{lazy_channel, Expected, Identity, Tls};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{CreateRequest, DeleteRequest};
use warden_server_kit::authority::Authority;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;

use super::routed::{create_group, start_router, start_secure_router, Router, TIMEOUT};

/// The principal the tests' clients are with security on.
pub const TESTER: &str = "tester";

/// Whether a fleet runs with security on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// Plaintext, everything allowed.
    Off,
    /// TLS, principals, grants.
    On,
}

/// How a test's clients reach a router: its address and, with security on, their TLS.
#[derive(Clone)]
pub struct Reach {
    /// The router's address.
    pub addr: SocketAddr,
    /// The clients' TLS ([`TESTER`]'s certificate; `None`: plaintext).
    pub tls: Option<Arc<Tls>>,
}

impl Reach {
    /// A client library configuration for this router.
    pub fn config(&self) -> ClientConfig {
        ClientConfig { tls: self.tls.clone(), request_timeout: TIMEOUT, ..ClientConfig::new([self.addr.to_string()]) }
    }

    /// A client library connection to this router.
    pub async fn connect(&self) -> Client {
        Client::connect(self.config()).await.expect("connect to the router")
    }

    /// A raw API client of this router (lazily connected).
    pub fn raw(&self) -> WardenClient<Channel> {
        let endpoint = Endpoint::from_shared(format!("http://{}", self.addr)).expect("uri").connect_timeout(Duration::from_secs(2)).timeout(TIMEOUT);
        WardenClient::new(lazy_channel(endpoint, self.tls.as_ref(), Expected::Router)).max_decoding_message_size(64 << 20)
    }
}

/// A 5-node cluster (placement on nodes 1-3, the root group, a group per prefix) and one
/// router, with `security`.
pub struct Fleet {
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// The router, running while the fleet lives (dropped with it).
    _router: Router,
    /// How the tests' clients reach the router.
    pub reach: Reach,
    /// The CA and certificates (security on).
    dir: Option<tempfile::TempDir>,
}

impl Fleet {
    /// Starts the fleet; with security on, also waits until [`TESTER`]'s grant is in force
    /// on the router and on every group's leader.
    pub async fn start(prefixes: &[&str], security: Security) -> Fleet {
        let dir = (security == Security::On).then(|| tempfile::tempdir().expect("tempdir"));
        let config = ClusterConfig {
            serve_api: true,
            tls_dir: dir.as_ref().map(|d| d.path().to_path_buf()),
            client_base_port: dir.as_ref().map(|_| 0),
            ..ClusterConfig::default()
        };
        let cluster = Arc::new(Cluster::start(config, Arc::new(ShardNodeFactory::default())).expect("cluster starts"));
        cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap");
        let Some(dir) = dir else {
            for prefix in prefixes {
                create_group(&cluster, prefix).await;
            }
            let router = start_router(&cluster, 0);
            let reach = Reach { addr: router.addr, tls: None };
            return Fleet { cluster, _router: router, reach, dir: None };
        };
        let issue = |identity: &Identity| {
            let authority = Authority::load(dir.path()).expect("the cluster's CA");
            Tls::load(authority.issue_files(dir.path(), identity).expect("issue")).expect("load")
        };
        let root = issue(&Identity::client(acl::ROOT_PRINCIPAL));
        for prefix in prefixes {
            at_placement(&cluster, &root, |mut c| {
                let request = CreateGroupRequest { prefix: prefix.to_string() };
                async move {
                    match c.create_group(request).await {
                        // An earlier attempt that timed out created it.
                        Err(status) if status.code() == tonic::Code::AlreadyExists => Ok(()),
                        answer => answer.map(drop),
                    }
                }
            })
            .await;
        }
        let grant = ChangeAclRequest {
            prefix: "/".into(),
            principal: TESTER.into(),
            permissions: acl::READ | acl::WRITE | acl::LOCK | acl::WATCH,
            revoke: false,
        };
        at_placement(&cluster, &root, |mut c| {
            let request = grant.clone();
            async move { c.change_acl(request).await.map(drop) }
        })
        .await;
        let router = start_secure_router(&cluster, issue(&Identity::router("fleet")), None);
        let reach = Reach { addr: router.addr, tls: Some(issue(&Identity::client(TESTER))) };
        // In force once the tester may write in every group (the router and each group's
        // leader learned the grant).
        let mut api = reach.raw();
        for prefix in std::iter::once("/").chain(prefixes.iter().copied()) {
            let probe = warden_paths::join(prefix, "fleet-probe");
            let deadline = Instant::now() + TIMEOUT;
            while let Err(status) = api.create(CreateRequest { path: probe.clone(), ..CreateRequest::default() }).await {
                assert!(Instant::now() < deadline, "the tester's grant is not in force at {prefix}: {status:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            api.delete(DeleteRequest { path: probe, ..DeleteRequest::default() }).await.expect("probe deleted");
        }
        Fleet { cluster, _router: router, reach, dir: Some(dir) }
    }

    /// With security on, the reach of a client that is `principal` (a certificate of the
    /// cluster's CA naming it).
    pub fn reach_as(&self, principal: &str) -> Option<Reach> {
        let dir = self.dir.as_ref()?;
        let authority = Authority::load(dir.path()).expect("the cluster's CA");
        let tls = Tls::load(authority.issue_files(&dir.path().join(principal), &Identity::client(principal)).expect("issue")).expect("load");
        Some(Reach { addr: self.reach.addr, tls: Some(tls) })
    }
}

/// Runs `call` as `tls` on the client port of each node in turn until one (the placement
/// leader) answers, within [`TIMEOUT`].
pub async fn at_placement<F, Fut>(cluster: &Cluster, tls: &Arc<Tls>, call: F)
where
    F: Fn(PlacementClient<Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        for node in cluster.node_ids() {
            let Some(addr) = cluster.client_addr(node) else { continue };
            let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri").connect_timeout(Duration::from_secs(2)).timeout(TIMEOUT);
            if call(PlacementClient::new(lazy_channel(endpoint, Some(tls), Expected::Node(node)))).await.is_ok() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "no placement leader answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
