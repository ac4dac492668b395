//! etcd's v3 API on a router, driven by etcd's own Rust client (`etcd-client`) and by
//! Debian's `etcdctl`, over an in-process cluster whose keys live in two groups (`/` and
//! `/registry/pods`): keys put without parents, prefixes read and deleted across groups in
//! key order, keys that are no Warden path, versions and revisions, transactions, and leases
//! that own keys.

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::support::routed::{cluster_with_groups, start_router_with_etcd, TIMEOUT};

async fn etcd_client(addr: std::net::SocketAddr) -> Client {
    Client::connect([format!("http://{addr}")], None).await.expect("etcd client connects")
}

/// The keys of a get, as strings.
fn keys(response: &etcd_client::GetResponse) -> Vec<String> {
    response.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_clients_read_and_write_keys_across_groups_as_in_etcd() {
    let cluster = cluster_with_groups(&["/registry/pods"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;

    // Keys need no parents; keys that are no Warden path are keys all the same.
    let keys_put = ["/registry/pods/default/web", "/registry/pods/kube-system/dns", "/registry/services/web", "config", "/a//b", "/registry/"];
    for key in keys_put {
        etcd.put(key, format!("v:{key}"), None).await.unwrap_or_else(|e| panic!("put {key}: {e}"));
    }
    let got = etcd.get("/registry/pods/default/web", None).await.expect("get");
    assert_eq!(got.kvs().len(), 1);
    let kv = &got.kvs()[0];
    assert_eq!((kv.value(), kv.version(), kv.lease()), (b"v:/registry/pods/default/web".as_slice(), 1, 0));
    assert_eq!(kv.create_revision(), kv.mod_revision(), "a new key is created and modified at once");
    assert!(etcd.get("/registry/pods/default", None).await.expect("get").kvs().is_empty(), "a parent made for a key is no key");

    // A prefix spans both groups, in key order; `/registry/` itself is a key of its own.
    let registry = etcd.get("/registry/", Some(GetOptions::new().with_prefix())).await.expect("get prefix");
    assert_eq!(keys(&registry), ["/registry/", "/registry/pods/default/web", "/registry/pods/kube-system/dns", "/registry/services/web"]);
    assert_eq!(registry.count(), 4);
    let everything = etcd.get("", Some(GetOptions::new().with_all_keys())).await.expect("get all");
    assert_eq!(everything.count(), keys_put.len() as i64);
    let mut sorted: Vec<String> = keys_put.iter().map(|k| k.to_string()).collect();
    sorted.sort();
    assert_eq!(keys(&everything), sorted, "every key, whatever its path, in byte order");
    let page = etcd.get("/registry/", Some(GetOptions::new().with_prefix().with_limit(2))).await.expect("page");
    assert_eq!((keys(&page).len(), page.more(), page.count()), (2, true, 4));
    let counted = etcd.get("/registry/pods/", Some(GetOptions::new().with_prefix().with_count_only())).await.expect("count");
    assert_eq!((counted.count(), counted.kvs().len()), (2, 0));
    let newest =
        etcd.get("/registry/", Some(GetOptions::new().with_prefix().with_sort(etcd_client::SortTarget::Mod, etcd_client::SortOrder::Descend)));
    assert_eq!(keys(&newest.await.expect("sorted"))[0], "/registry/", "sorted by modification, newest first");

    let refused = etcd.put("absent", "", Some(PutOptions::new().with_ignore_value())).await.expect_err("nothing to keep");
    assert!(refused.to_string().contains("etcdserver: key not found"), "{refused}");
    // Versions count writes; a put can answer the key as it was.
    let put = etcd.put("config", "v2", Some(PutOptions::new().with_prev_key())).await.expect("put again");
    assert_eq!(put.prev_key().map(|kv| kv.value()), Some(b"v:config".as_slice()));
    assert_eq!(etcd.get("config", None).await.expect("get").kvs()[0].version(), 2);

    // A transaction: create-if-absent, as etcd's recipes write it.
    let create_if_absent = |key: &str, value: &str| {
        Txn::new().when([Compare::version(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(key, value, None)]).or_else([TxnOp::get(key, None)])
    };
    let first = etcd.txn(create_if_absent("/registry/pods/default/job", "mine")).await.expect("txn");
    assert!(first.succeeded());
    let second = etcd.txn(create_if_absent("/registry/pods/default/job", "theirs")).await.expect("txn");
    assert!(!second.succeeded());
    match &second.op_responses()[..] {
        [TxnOpResponse::Get(get)] => assert_eq!(get.kvs()[0].value(), b"mine"),
        other => panic!("the else branch answered {other:?}"),
    }

    // A prefix delete spans both groups and answers what it deleted.
    let deleted = etcd.delete("/registry/", Some(DeleteOptions::new().with_prefix().with_prev_key())).await.expect("delete prefix");
    assert_eq!(deleted.deleted(), 5);
    let gone: Vec<String> = deleted.prev_kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect();
    assert_eq!(
        gone,
        ["/registry/", "/registry/pods/default/job", "/registry/pods/default/web", "/registry/pods/kube-system/dns", "/registry/services/web"]
    );
    let rest = etcd.get("", Some(GetOptions::new().with_all_keys())).await.expect("get all");
    assert_eq!(keys(&rest), ["/a//b", "config"]);
}

/// A lease is a session homed in one group; its keys may live in any group (here in both,
/// so at least one is outside the lease's home group).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_lease_owns_its_keys_in_every_group_until_revoked() {
    let cluster = cluster_with_groups(&["/services"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let lease = etcd.lease_grant(30, None).await.expect("grant");
    assert_eq!(lease.ttl(), 30);
    etcd.put("/services/web/1", "10.0.0.1", Some(PutOptions::new().with_lease(lease.id()))).await.expect("put with the lease");
    etcd.put("/services/web/2", "10.0.0.2", None).await.expect("put without");
    etcd.put("/leader", "web-1", Some(PutOptions::new().with_lease(lease.id()))).await.expect("put with the lease in the root group");
    let got = etcd.get("/services/web/1", None).await.expect("get");
    assert_eq!(got.kvs()[0].lease(), lease.id());
    let (mut keeper, mut answers) = etcd.lease_keep_alive(lease.id()).await.expect("keepalive stream");
    keeper.keep_alive().await.expect("renew");
    let renewed = answers.message().await.expect("answer").expect("an answer");
    assert_eq!((renewed.id(), renewed.ttl()), (lease.id(), 30));
    let left = etcd.lease_time_to_live(lease.id(), None).await.expect("time to live");
    assert!(left.ttl() > 0 && left.ttl() <= 30, "{} s left", left.ttl());
    etcd.lease_revoke(lease.id()).await.expect("revoke");
    let services = etcd.get("/services/", Some(GetOptions::new().with_prefix())).await.expect("get");
    assert_eq!(keys(&services), ["/services/web/2"], "the revoked lease's key went with it");
    // A group holding keys of a lease homed elsewhere learns of its end at its next check of
    // the session (every second; docs/etcd.md).
    warden_testkit::wait_until("the revoked lease's key in the other group is gone", TIMEOUT, async || {
        etcd.get("/leader", None).await.expect("get").kvs().is_empty()
    })
    .await;
    assert_eq!(etcd.lease_time_to_live(lease.id(), None).await.expect("time to live").ttl(), -1, "a revoked lease is gone");
    let status = etcd.lease_revoke(lease.id()).await.expect_err("revoking twice");
    assert!(status.to_string().contains("requested lease not found"), "{status}");
}

/// Runs `etcdctl` against `addr` with `args` and `input` on its standard input, answering its
/// standard output and error.
fn etcdctl(addr: std::net::SocketAddr, args: &[&str], input: &str) -> (String, String) {
    use std::io::Write as _;
    let mut child = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        // Without a scheme: etcdctl 3.4's `endpoint status` sends `http://host:port` as the
        // HTTP/2 authority, which the router's HTTP/2 server refuses (docs/etcd.md).
        .arg(format!("--endpoints={addr}"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("etcdctl runs (make dev installs it)");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("etcdctl's input");
    let output = child.wait_with_output().expect("etcdctl ends");
    assert!(output.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_puts_gets_deletes_and_reports_endpoint_status() {
    let cluster = cluster_with_groups(&["/registry/pods"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let ctl_with = |args: &'static [&'static str], input: &'static str| async move {
        tokio::task::spawn_blocking(move || etcdctl(etcd_addr, args, input)).await.expect("etcdctl")
    };
    let ctl = |args: &'static [&'static str]| async move { ctl_with(args, "").await.0 };
    assert_eq!(ctl(&["put", "/registry/pods/a", "1"]).await, "OK\n");
    assert_eq!(ctl(&["put", "/registry/services/b", "2"]).await, "OK\n");
    assert_eq!(ctl(&["put", "greeting", "hello"]).await, "OK\n");
    assert_eq!(ctl(&["get", "--prefix", "/registry/"]).await, "/registry/pods/a\n1\n/registry/services/b\n2\n");
    assert_eq!(ctl(&["get", "greeting", "--print-value-only"]).await, "hello\n");
    assert_eq!(ctl(&["get", "--prefix", "/registry/", "--keys-only"]).await, "/registry/pods/a\n\n/registry/services/b\n\n");
    // etcdctl's transaction syntax on its input: compares, success, failure, each ending
    // with a blank line.
    let txn = "value(\"greeting\") = \"hello\"\n\nput result matched\n\nput result missed\n\n";
    assert_eq!(ctl_with(&["txn"], txn).await.0, "SUCCESS\n\nOK\n");
    assert_eq!(ctl(&["get", "result", "--print-value-only"]).await, "matched\n");
    assert_eq!(ctl(&["del", "--prefix", "/registry/"]).await, "2\n");
    assert_eq!(ctl(&["get", "--prefix", "/registry/"]).await, "");
    // etcdctl prints its health verdict on standard error.
    let (_, health) = ctl_with(&["endpoint", "health"], "").await;
    assert!(health.contains(&format!("{etcd_addr} is healthy")), "{health}");
    let status = ctl(&["endpoint", "status", "--write-out=simple"]).await;
    assert!(status.contains(&etcd_addr.to_string()) && status.contains("3.5.0"), "{status}");
    let members = ctl(&["member", "list"]).await;
    assert!(members.contains(&format!("http://{etcd_addr}")), "{members}");
}
