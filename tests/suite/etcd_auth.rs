//! etcd's `Auth` service on a secure cluster (TLS on every link and on the router's etcd
//! port), driven by Debian's `etcdctl` as etcd's documentation sets auth up: a root user and
//! role, a role with a key prefix, a user holding it; once auth is enabled, the user's
//! password names its principal, whose writes inside its prefix are served and outside it
//! are denied, a wrong password is refused, and root turns auth off again. etcd's Rust
//! client (`etcd-client`), over a channel with Warden's TLS connector, logs in the same way.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{ConnectOptions, PermissionType};
use tonic::transport::Endpoint;
use warden_proto::tls::{connect_channel, Expected, Identity, Tls, TlsFiles};
use warden_server_kit::authority::Authority;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;

use crate::support::routed::{start_secure_router_with_etcd, TIMEOUT};

/// `etcdctl` over TLS as the client certificate `files` names, at the router's etcd port.
struct Etcdctl {
    addr: std::net::SocketAddr,
    files: TlsFiles,
}

impl Etcdctl {
    /// Runs `etcdctl args` (off the async threads) and answers its output, whatever it is.
    async fn run(&self, args: &[&str]) -> Output {
        let mut command = std::process::Command::new("etcdctl");
        command
            .env("ETCDCTL_API", "3")
            // The router's certificate names `localhost` (and its Warden identity).
            .arg(format!("--endpoints=localhost:{}", self.addr.port()))
            .arg(format!("--cacert={}", self.files.ca.display()))
            .arg(format!("--cert={}", self.files.cert.display()))
            .arg(format!("--key={}", self.files.key.display()))
            .arg("--command-timeout=10s")
            .args(args);
        tokio::task::spawn_blocking(move || command.output().expect("etcdctl runs (make dev installs it)")).await.expect("etcdctl")
    }

    /// Runs `etcdctl args`, which must succeed; answers its standard output.
    async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(output.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs `etcdctl args`, which must fail; answers its standard error.
    async fn refused(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        assert!(!output.status.success(), "etcdctl {args:?} succeeded: {}", String::from_utf8_lossy(&output.stdout));
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// Runs `etcdctl args` until it succeeds: grants reach the router and every node with
    /// the routing table and the heartbeats, a moment after placement commits them.
    async fn eventually(&self, args: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let output = self.run(args).await;
            if output.status.success() {
                return String::from_utf8_lossy(&output.stdout).into_owned();
            }
            assert!(tokio::time::Instant::now() < deadline, "etcdctl {args:?} never succeeded: {}", String::from_utf8_lossy(&output.stderr));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// etcd's Rust client logged in as `user` with `password` over TLS to the router's etcd port
/// at `addr`, presenting the client certificate of `tls`: the channel is Warden's own TLS
/// connector (which checks that the server is a router), handed to the client as a raw
/// channel. Answers the client, or why its login failed.
async fn etcd_client_as(addr: std::net::SocketAddr, tls: &Arc<Tls>, user: &str, password: &str) -> Result<etcd_client::Client, etcd_client::Error> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("uri").connect_timeout(TIMEOUT).timeout(TIMEOUT);
    let channel = connect_channel(endpoint, Some(tls), Expected::Router).await.expect("a TLS connection to the router's etcd port");
    etcd_client::Client::from_channel(etcd_client::Channel::Tonic(channel), Some(ConnectOptions::new().with_user(user, password))).await
}

/// etcd's auth as an operator sets it up with `etcdctl`, and as programs then use it through
/// etcd's Rust client: a user's password names its principal; it reads, writes, compares and
/// deletes inside its role's prefix (its escaped keys too) and is denied outside it; a wrong password is refused at login; the
/// root user lists users and reads roles (with the permission as granted); root turns auth
/// off and the certificate's principal is judged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_users_read_write_and_delete_all_of_their_roles_prefixes_and_nothing_else_once_auth_is_enabled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ClusterConfig { serve_api: true, tls_dir: Some(dir.path().to_path_buf()), client_base_port: Some(0), ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(ShardNodeFactory::default())).expect("cluster starts"));
    cluster.bootstrap_placement(&[1, 2, 3]).await.expect("bootstrap over TLS");
    let authority = Authority::load(dir.path()).expect("the cluster's CA");
    let router_tls = Tls::load(authority.issue_files(&dir.path().join("r1"), &Identity::router("r1")).expect("issue")).expect("load");
    let (_router, etcd_addr) = start_secure_router_with_etcd(&cluster, router_tls);
    // etcdctl's certificate names Warden's administrator: it sets etcd's auth up.
    let etcdctl = Etcdctl { addr: etcd_addr, files: authority.issue_files(&dir.path().join("ops"), &Identity::client("root")).expect("issue") };

    for args in [
        &["user", "add", "root:rootpw"][..],
        &["role", "add", "root"],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "alice:alicepw"],
        &["role", "add", "team"],
        &["role", "grant-permission", "team", "--prefix=true", "readwrite", "/alice/"],
        &["user", "grant-role", "alice", "team"],
        &["user", "add", "carol:carolpw"],
        &["role", "add", "everything"],
        &["role", "grant-permission", "everything", "--prefix=true", "readwrite", "/"],
        &["user", "grant-role", "carol", "everything"],
    ] {
        etcdctl.ok(args).await;
    }
    assert!(etcdctl.ok(&["role", "get", "team"]).await.contains("[/alice/, /alice0)"), "the permission as etcd lists it");
    let refused = etcdctl.refused(&["role", "grant-permission", "team", "readwrite", "/a", "/b"]).await;
    assert!(refused.contains("Warden grants by path prefix"), "an interval that is no prefix: {refused}");
    assert!(etcdctl.ok(&["auth", "enable"]).await.contains("Authentication Enabled"));

    let alice_user = ["--user", "alice:alicepw"];
    etcdctl.eventually(&[&alice_user[..], &["put", "/alice/x", "1"]].concat()).await;
    assert_eq!(etcdctl.ok(&[&alice_user[..], &["get", "/alice/x", "--print-value-only"]].concat()).await.trim(), "1");
    let denied = etcdctl.refused(&[&alice_user[..], &["put", "/bob/x", "1"]].concat()).await;
    assert!(denied.contains("etcdserver: permission denied"), "outside her prefix: {denied}");
    // `--prefix /` is Warden's whole namespace: also the keys etcd's `--prefix /` leaves out.
    etcdctl.eventually(&["--user", "carol:carolpw", "put", "foo", "1"]).await;
    let wrong = etcdctl.refused(&["--user", "alice:wrong", "put", "/alice/x", "2"]).await;
    assert!(wrong.contains("authentication failed, invalid user ID or password"), "a wrong password: {wrong}");

    // A program's own certificate (no administrator): the password decides who it is.
    let app = Tls::load(authority.issue_files(&dir.path().join("app"), &Identity::client("app")).expect("issue")).expect("load");
    let mut alice = etcd_client_as(etcd_addr, &app, "alice", "alicepw").await.expect("alice logs in");
    alice.put("/alice/rust", "2", None).await.expect("alice puts inside her prefix");
    let got = alice.get("/alice/rust", None).await.expect("alice gets inside her prefix");
    assert_eq!(got.kvs().iter().map(|kv| kv.value()).collect::<Vec<_>>(), [b"2"], "alice reads what she put");
    let got = alice.get("/alice/x", None).await.expect("alice gets etcdctl's key");
    assert_eq!(got.kvs().iter().map(|kv| kv.value()).collect::<Vec<_>>(), [b"1"], "alice reads what etcdctl put as her");
    let denied = alice.put("/bob/rust", "2", None).await.expect_err("a put outside her prefix").to_string();
    assert!(denied.contains("etcdserver: permission denied"), "alice's put outside her prefix: {denied}");
    let denied = alice.get("/bob/x", None).await.expect_err("a get outside her prefix").to_string();
    assert!(denied.contains("etcdserver: permission denied"), "alice's get outside her prefix: {denied}");
    let wrong = etcd_client_as(etcd_addr, &app, "alice", "wrong").await.err().expect("a wrong password is refused at login").to_string();
    assert!(wrong.contains("authentication failed, invalid user ID or password"), "a wrong password: {wrong}");
    let mut root = etcd_client_as(etcd_addr, &app, "root", "rootpw").await.expect("root logs in");
    let mut users = root.user_list().await.expect("root lists users").users().to_vec();
    users.sort();
    assert_eq!(users, ["alice", "carol", "root"], "the users etcdctl added");
    let team = root.role_get("team").await.expect("root reads a role");
    let granted: Vec<_> = team.permissions().iter().map(|p| (p.key().to_vec(), p.range_end().to_vec(), p.get_type())).collect();
    assert_eq!(granted, [(b"/alice/".to_vec(), b"/alice0".to_vec(), PermissionType::Readwrite as i32)], "the permission as granted");
    // Her prefix's keys that are no path (`/alice/` itself, `/alice//x`) are escaped under
    // `/_etcd`, out of the grant's subtree: the grant covers them too, and nothing else there.
    alice.put("/alice/", "own", None).await.expect("alice puts her prefix's own key");
    alice.put("/alice//x", "doubled", None).await.expect("alice puts a key with an empty segment");
    let denied = alice.put("foo", "1", None).await.expect_err("a key escaped outside any of her prefixes").to_string();
    assert!(denied.contains("etcdserver: permission denied"), "alice's put of foo: {denied}");
    let listed = etcdctl.ok(&[&alice_user[..], &["get", "--prefix", "/alice/", "--keys-only"]].concat()).await;
    let listed: Vec<&str> = listed.split_whitespace().collect();
    assert_eq!(listed, ["/alice/", "/alice//x", "/alice/rust", "/alice/x"], "the whole prefix, plain and escaped keys, in key order");
    let compared = alice
        .txn(etcd_client::Txn::new().when([etcd_client::Compare::version("/alice/", etcd_client::CompareOp::Greater, 0).with_range("/alice0")]))
        .await
        .expect("a transaction comparing over her prefix");
    assert!(compared.succeeded(), "every key of her prefix exists");
    // A watch of her prefix spans its plain and its escaped keys.
    let mut events = alice.watch("/alice/", Some(etcd_client::WatchOptions::new().with_prefix())).await.expect("alice watches her prefix");
    let created = tokio::time::timeout(TIMEOUT, events.message()).await.expect("created in time").expect("the watch answers");
    assert!(created.as_ref().is_some_and(|m| m.created() && !m.canceled()), "her prefix's watch is created: {created:?}");
    alice.put("/alice//y", "escaped", None).await.expect("an escaped key");
    alice.put("/alice/z", "plain", None).await.expect("a plain key");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let message = tokio::time::timeout(TIMEOUT, events.message()).await.expect("events in time").expect("the watch goes on");
        let Some(message) = message else { panic!("the watch ended after {seen:?}") };
        assert!(!message.canceled(), "her prefix's watch: {}", message.cancel_reason());
        seen.extend(message.events().iter().filter_map(|event| event.kv()).map(|kv| String::from_utf8_lossy(kv.key()).into_owned()));
    }
    assert_eq!(seen, ["/alice//y", "/alice/z"], "both puts, in order");
    let refused = match alice.watch("/", Some(etcd_client::WatchOptions::new().with_prefix())).await {
        Ok(mut every_key) => match tokio::time::timeout(TIMEOUT, every_key.message()).await.expect("an answer in time") {
            Ok(Some(message)) => message.cancel_reason().to_string(),
            Ok(None) => "ended".to_string(),
            Err(error) => error.to_string(),
        },
        Err(error) => error.to_string(),
    };
    assert!(refused.contains("permission denied"), "a watch of every key is refused: {refused}");
    // A delete that reaches a part she may not delete is judged whole before any part runs.
    let denied = etcdctl.refused(&[&alice_user[..], &["del", "/alice/", "/alicf"]].concat()).await;
    assert!(denied.contains("etcdserver: permission denied"), "a delete reaching past her prefix: {denied}");
    assert_eq!(etcdctl.ok(&[&alice_user[..], &["get", "/alice/x", "--print-value-only"]].concat()).await.trim(), "1", "nothing was deleted");
    let deleted = etcdctl.ok(&[&alice_user[..], &["del", "--prefix", "/alice/"]].concat()).await;
    assert_eq!(deleted.trim(), "6", "her whole prefix, plain and escaped keys");
    assert_eq!(etcdctl.ok(&[&alice_user[..], &["get", "--prefix", "/alice/", "--keys-only"]].concat()).await.trim(), "");
    let refused = alice.user_list().await.expect_err("a user without the root role lists users").to_string();
    assert!(refused.contains("permission denied"), "alice lists users: {refused}");

    assert!(etcdctl.ok(&["--user", "root:rootpw", "auth", "disable"]).await.contains("Authentication Disabled"));
    // The certificate's principal again: Warden's administrator writes anywhere.
    etcdctl.ok(&["put", "/bob/x", "1"]).await;
}
