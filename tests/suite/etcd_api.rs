//! etcd's v3 API on a router, driven by etcd's own Rust client (`etcd-client`) and by
//! Debian's `etcdctl`, over an in-process cluster whose keys live in two groups (`/` and
//! `/registry/pods`): keys put without parents, prefixes read and deleted across groups in
//! key order, keys that are no Warden path, versions and revisions, transactions, and leases
//! that own keys.

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};

use warden_proto::placement::GetRoutingTableRequest;

use crate::support::routed::{
    at_placement_leader, cluster_of, cluster_with_groups, create_group, start_router_with_etcd, start_stale_router_with_etcd, TIMEOUT,
};

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

/// A value compare of a missing key fails whatever the compared value and operator, as in
/// etcd (a missing key has no value, not an empty one): python-etcd3's `replace(key, "", new)`
/// of a missing key fails and writes nothing. An existing empty value still compares equal to
/// the empty value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_value_compare_of_a_missing_key_fails() {
    let cluster = cluster_with_groups(&[]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let swap = |key: &str, op: CompareOp, value: &str| Txn::new().when([Compare::value(key, op, value)]).and_then([TxnOp::put(key, "swapped", None)]);
    for (op, value) in [(CompareOp::Equal, ""), (CompareOp::NotEqual, "x"), (CompareOp::Less, "x"), (CompareOp::Greater, "")] {
        let answer = etcd.txn(swap("/absent", op, value)).await.expect("txn");
        assert!(!answer.succeeded(), "value {op:?} {value:?} of a missing key succeeded");
    }
    assert!(etcd.get("/absent", None).await.expect("get").kvs().is_empty(), "a failed compare wrote the key");
    etcd.put("/empty", "", None).await.expect("put an empty value");
    assert!(etcd.txn(swap("/empty", CompareOp::Equal, "")).await.expect("txn").succeeded(), "an empty value equals the empty value");
    assert_eq!(etcd.get("/empty", None).await.expect("get").kvs()[0].value(), b"swapped");
}

/// A router that has not heard of a group made since it read its table still reads and
/// deletes every key of a range: the group it asks refuses a part planned on its old
/// descriptor, and the router plans the range again on the new table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_with_a_stale_table_reads_and_deletes_the_whole_range() {
    let cluster = cluster_with_groups(&[]).await;
    // Two stale routers, each reading its table with a first call: one reads, one deletes.
    let (_reading_router, reading_addr) = start_stale_router_with_etcd(&cluster);
    let (_deleting_router, deleting_addr) = start_stale_router_with_etcd(&cluster);
    let mut reading = etcd_client(reading_addr).await;
    let mut deleting = etcd_client(deleting_addr).await;
    reading.put("/registry/a/1", "a", None).await.expect("put through a stale router: it reads its table now");
    deleting.put("/registry/a/2", "a", None).await.expect("put through the other: it reads its table now");
    create_group(&cluster, "/registry/b").await;
    let (_router, fresh_addr) = start_router_with_etcd(&cluster);
    let mut fresh = etcd_client(fresh_addr).await;
    fresh.put("/registry/b/1", "b", None).await.expect("put into the new group");
    let got = reading.get("/registry/", Some(GetOptions::new().with_prefix())).await.expect("get through a stale router");
    assert_eq!(keys(&got), ["/registry/a/1", "/registry/a/2", "/registry/b/1"], "the new group's key is read too");
    let deleted = deleting.delete("/registry/", Some(DeleteOptions::new().with_prefix())).await.expect("delete through a stale router");
    assert_eq!(deleted.deleted(), 3);
    let rest = fresh.get("/registry/", Some(GetOptions::new().with_prefix())).await.expect("get");
    assert!(rest.kvs().is_empty(), "left behind: {:?}", keys(&rest));
}

/// One etcd event as (PUT or DELETE, key, value, previous value).
type Seen = (&'static str, String, String, Option<String>);

/// The next `count` events of `stream` (waiting at most [`TIMEOUT`] for each response).
async fn next_events(stream: &mut WatchStream, count: usize) -> Vec<Seen> {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let mut seen = Vec::new();
    while seen.len() < count {
        let response =
            tokio::time::timeout(TIMEOUT, stream.message()).await.expect("an event in time").expect("the watch goes on").expect("a response");
        assert!(!response.canceled(), "cancelled: {}", response.cancel_reason());
        for event in response.events() {
            let kind = if event.event_type() == EventType::Put { "PUT" } else { "DELETE" };
            let kv = event.kv().expect("an event's key");
            seen.push((kind, text(kv.key()), text(kv.value()), event.prev_kv().map(|kv| text(kv.value()))));
        }
    }
    assert_eq!(seen.len(), count, "no more events than asked: {seen:?}");
    seen
}

fn seen(kind: &'static str, key: &str, value: &str, previous: Option<&str>) -> Seen {
    (kind, key.to_string(), value.to_string(), previous.map(str::to_string))
}

/// A prefix watch sees every put and delete of its keys once, in order, with previous
/// values, from both groups serving the prefix and from the escaped keys' subtree; parents made for a key are no events, a
/// key emptied into a parent is deleted; a watch started at a revision gets exactly the
/// events from it on; a watch goes on when the replica it reads from dies; a cancelled
/// watch ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_watches_see_each_change_of_their_keys_once_in_order_and_resume_from_a_revision() {
    let cluster = cluster_with_groups(&["/app/g"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let mut stream = etcd.watch("/app/", Some(WatchOptions::new().with_prefix().with_prev_key())).await.expect("watch");
    let created = tokio::time::timeout(TIMEOUT, stream.message()).await.expect("created in time").expect("stream").expect("response");
    assert!(created.created() && !created.canceled());

    etcd.put("/app/x/deep", "1", None).await.expect("put under a missing parent");
    let second = etcd.put("/app/y", "1", None).await.expect("put");
    etcd.put("/app/y", "2", None).await.expect("put again");
    etcd.put("/app/g/k", "g", None).await.expect("put in the other group");
    etcd.put("/other", "z", None).await.expect("put outside the prefix");
    etcd.put("/app/z", "p", None).await.expect("put a parent");
    etcd.put("/app/z/c", "c", None).await.expect("put its child");
    assert_eq!(etcd.delete("/app/z", None).await.expect("delete the parent").deleted(), 1);
    etcd.delete("/app/y", None).await.expect("delete");
    etcd.put("/app/", "escaped", None).await.expect("put the prefix's own key (no path: escaped under /_etcd)");
    let from_root_group = vec![
        seen("PUT", "/app/x/deep", "1", None),
        seen("PUT", "/app/y", "1", None),
        seen("PUT", "/app/y", "2", Some("1")),
        seen("PUT", "/app/z", "p", None),
        seen("PUT", "/app/z/c", "c", None),
        seen("DELETE", "/app/z", "", Some("p")),
        seen("DELETE", "/app/y", "", Some("2")),
    ];
    let mut events = next_events(&mut stream, from_root_group.len() + 2).await;
    // The other group's event, and the escaped key's (watched in `/_etcd`), come in their
    // own responses, in any order relative to these.
    for (key, value) in [("/app/g/k", "g"), ("/app/", "escaped")] {
        let at = events.iter().position(|event| event.1 == key).unwrap_or_else(|| panic!("the put of {key}: {events:?}"));
        assert_eq!(events.remove(at), seen("PUT", key, value, None));
    }
    assert_eq!(events, from_root_group, "the root group's events once each, in order");

    // A watch of one key from the second put's revision: exactly that key's events from it.
    let revision = second.header().expect("header").revision();
    let mut resumed = etcd.watch("/app/y", Some(WatchOptions::new().with_start_revision(revision))).await.expect("watch from a revision");
    assert!(tokio::time::timeout(TIMEOUT, resumed.message()).await.expect("created").expect("stream").expect("response").created());
    let again = next_events(&mut resumed, 3).await;
    assert_eq!(again, [seen("PUT", "/app/y", "1", None), seen("PUT", "/app/y", "2", None), seen("DELETE", "/app/y", "", None)]);

    // The replica the watches read the root group from dies (the router reads a group from
    // the first of its replicas it reaches, in the descriptor's order): the watch goes on
    // from where it was, as an etcd watch does when a member dies: no cancel, nothing lost
    // or repeated.
    let table = at_placement_leader(&cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table");
    let root = table.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.prefix == "/").expect("the root group");
    cluster.kill(root.replicas[0]);
    etcd.put("/app/after", "1", None).await.expect("put after the kill");
    etcd.put("/app/after", "2", None).await.expect("put again");
    let after = next_events(&mut stream, 2).await;
    assert_eq!(after, [seen("PUT", "/app/after", "1", None), seen("PUT", "/app/after", "2", Some("1"))], "the watch went on");

    stream.cancel(created.watch_id()).await.expect("cancel");
    let ended = loop {
        let response = tokio::time::timeout(TIMEOUT, stream.message()).await.expect("an answer in time").expect("stream").expect("response");
        if response.canceled() {
            break response;
        }
    };
    assert_eq!(ended.watch_id(), created.watch_id());
}

/// The list-then-watch pattern (Kubernetes' informers, clientv3's recipes) across groups:
/// a range's revision is valid for every group it read, so a watch from the next revision
/// sees every later change of the range's keys, whichever group they live in, and none from
/// before the list (a group behind the range's revision was raised to it, so its next write
/// lands above it). Its events come in one revision order across the groups, so resuming
/// from the last one's revision + 1 misses nothing and repeats nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_ranges_revision_sees_every_later_change_in_every_group() {
    let cluster = cluster_with_groups(&["/teams/payments"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    // The root group runs far ahead of the payments group.
    for n in 0..50 {
        etcd.put("foo", n.to_string(), None).await.expect("put in the root group");
    }
    etcd.put("/teams/x", "1", None).await.expect("put");
    etcd.put("/teams/payments/old", "1", None).await.expect("put in the payments group");
    let listed = etcd.get("/teams/", Some(GetOptions::new().with_prefix())).await.expect("list");
    assert_eq!(keys(&listed), ["/teams/payments/old", "/teams/x"]);
    let revision = listed.header().expect("header").revision();

    let mut stream = etcd.watch("/teams/", Some(WatchOptions::new().with_prefix().with_start_revision(revision + 1))).await.expect("watch");
    let created = tokio::time::timeout(TIMEOUT, stream.message()).await.expect("created in time").expect("stream").expect("response");
    assert!(created.created() && !created.canceled());
    let put = etcd.put("/teams/payments/k", "p", None).await.expect("put in the payments group");
    assert!(put.header().expect("header").revision() > revision, "the payments group's next write lands above the list's revision");
    etcd.put("/teams/x", "2", None).await.expect("put in the root group");
    let mut events = next_events(&mut stream, 2).await;
    events.sort();
    assert_eq!(events, [seen("PUT", "/teams/payments/k", "p", None), seen("PUT", "/teams/x", "2", None)], "both changes, nothing from before");

    // The root group runs ahead again; the payments group writes after. The watch answers
    // in one revision order across both groups, each header a revision every event at or
    // below which was answered, so a client resuming from its last event's revision + 1
    // (as clientv3 does after a broken stream) misses nothing and gets nothing twice.
    for n in 0..20 {
        etcd.put("/teams/x", format!("ahead {n}"), None).await.expect("put in the root group");
    }
    etcd.put("/teams/payments/k", "after the root group ran ahead", None).await.expect("put in the payments group");
    let mut answered: Vec<(i64, i64)> = Vec::new();
    while answered.len() < 21 {
        let response = tokio::time::timeout(TIMEOUT, stream.message()).await.expect("events in time").expect("the watch goes on").expect("response");
        assert!(!response.canceled(), "cancelled: {}", response.cancel_reason());
        let header = response.header().map_or(0, |h| h.revision());
        answered.extend(response.events().iter().filter_map(|event| event.kv()).map(|kv| (kv.mod_revision(), header)));
    }
    assert!(answered.windows(2).all(|w| w[0].0 <= w[1].0), "events in revision order across groups: {answered:?}");
    assert!(answered.iter().all(|(revision, header)| revision <= header), "each header at or past its events: {answered:?}");
    let last = answered.last().map_or(0, |(revision, _)| *revision);
    drop(stream);
    etcd.put("/teams/payments/k", "resumed", None).await.expect("put in the payments group");
    etcd.put("/teams/x", "resumed", None).await.expect("put in the root group");
    let mut resumed = etcd.watch("/teams/", Some(WatchOptions::new().with_prefix().with_start_revision(last + 1))).await.expect("watch again");
    let created = tokio::time::timeout(TIMEOUT, resumed.message()).await.expect("created in time").expect("stream").expect("response");
    assert!(created.created() && !created.canceled());
    let mut events = next_events(&mut resumed, 2).await;
    events.sort();
    assert_eq!(events, [seen("PUT", "/teams/payments/k", "resumed", None), seen("PUT", "/teams/x", "resumed", None)], "exactly the later changes");
}

/// A watch from a revision the group no longer holds events for is cancelled as etcd
/// cancels a compacted one, with `compact_revision` the oldest revision it can watch from:
/// a client that watches again from there (as clientv3 users do) gets every later event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_etcd_watch_names_a_revision_it_can_watch_from_again() {
    use warden_namespace::watch::{WatchHubs, WatchLimits};
    /// Revisions each replica keeps events of.
    const KEPT: usize = 16;
    let limits = WatchLimits { history_revisions_max: KEPT, ..WatchLimits::default() };
    let namespace = warden_namespace::NamespaceFactory { hubs: WatchHubs::new(limits), ..warden_namespace::NamespaceFactory::default() };
    let cluster = cluster_of(warden_shard_node::placement::ShardNodeFactory { namespace, ..Default::default() }, &[]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let mut put_revisions = Vec::new();
    for n in 0..3 * KEPT {
        put_revisions.push(etcd.put("/h", n.to_string(), None).await.expect("put").header().expect("header").revision());
    }
    let (first, last) = (put_revisions[0], put_revisions[put_revisions.len() - 1]);

    let mut stream = etcd.watch("/h", Some(WatchOptions::new().with_start_revision(first))).await.expect("watch");
    let compacted = loop {
        let response = tokio::time::timeout(TIMEOUT, stream.message()).await.expect("an answer in time").expect("stream").expect("response");
        if response.canceled() {
            break response;
        }
        assert!(response.events().is_empty(), "no event of a compacted start: {response:?}");
    };
    let compact_revision = compacted.compact_revision();
    assert!(compact_revision > first && compact_revision <= last, "compacted at {compact_revision}: the start {first} is gone, {last} is kept");

    let mut again = etcd.watch("/h", Some(WatchOptions::new().with_start_revision(compact_revision))).await.expect("watch again");
    let mut revisions = Vec::new();
    while revisions.last() != Some(&last) {
        let response = tokio::time::timeout(TIMEOUT, again.message()).await.expect("an answer in time").expect("stream").expect("response");
        assert!(!response.canceled(), "watching from the compact revision is served: {response:?}");
        revisions.extend(response.events().iter().filter_map(|event| event.kv()).map(|kv| kv.mod_revision()));
    }
    let expected: Vec<i64> = put_revisions.into_iter().filter(|revision| *revision >= compact_revision).collect();
    assert_eq!(revisions, expected, "every put from the compact revision on, once each, in order");
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
    // The router picks the lease's home group; its keys there go at once, and a group holding
    // keys of a lease homed elsewhere learns of its end at its next check of the session
    // (every second; docs/etcd.md).
    warden_testkit::wait_until("the revoked lease's keys are gone from both groups", TIMEOUT, async || {
        etcd.get("/leader", None).await.expect("get").kvs().is_empty() && etcd.get("/services/web/1", None).await.expect("get").kvs().is_empty()
    })
    .await;
    let services = etcd.get("/services/", Some(GetOptions::new().with_prefix())).await.expect("get");
    assert_eq!(keys(&services), ["/services/web/2"], "a key without the lease stays");
    assert_eq!(etcd.lease_time_to_live(lease.id(), None).await.expect("time to live").ttl(), -1, "a revoked lease is gone");
    let status = etcd.lease_revoke(lease.id()).await.expect_err("revoking twice");
    assert!(status.to_string().contains("requested lease not found"), "{status}");

    // A revoke whose home group cannot reach the other group holding a key of the lease
    // within the call fails (as etcd's does when it cannot confirm in time), rather than
    // answer while that key is still there; the key goes at that group's next check.
    let table = at_placement_leader(&cluster, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await.expect("table");
    let group_of =
        |prefix: &str| table.groups.iter().filter_map(|g| g.descriptor.as_ref()).find(|d| d.prefix == prefix).map(|d| d.group_id).expect("a group");
    let lease = etcd.lease_grant(30, None).await.expect("grant");
    let home = warden_placement::home_group(u64::try_from(lease.id()).expect("a lease id"));
    let elsewhere = if home == group_of("/") { "/services/web/3" } else { "/leader" };
    etcd.put(elsewhere, "kept", Some(PutOptions::new().with_lease(lease.id()))).await.expect("put outside the lease's home group");
    cluster.faults().cut_group_link(home, if elsewhere == "/leader" { group_of("/") } else { group_of("/services") });
    // Within the node's own deadline (the client sent none).
    let status = etcd.lease_revoke(lease.id()).await.expect_err("a revoke that could not delete every key");
    assert!(matches!(&status, etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unavailable), "{status}");
    cluster.faults().heal();
    warden_testkit::wait_until("the key goes at its group's next check", TIMEOUT, async || {
        etcd.get(elsewhere, None).await.expect("get").kvs().is_empty()
    })
    .await;
    let status = etcd.lease_revoke(lease.id()).await.expect_err("revoking again");
    assert!(status.to_string().contains("requested lease not found"), "{status}");
}

/// Runs `etcdctl` against `addr` with `args` and `input` on its standard input, answering its
/// standard output and error.
fn etcdctl(addr: std::net::SocketAddr, args: &[&str], input: &str) -> (String, String) {
    use std::io::Write as _;
    let mut child = crate::support::etcdctl::etcdctl_command(addr, args)
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

/// A long-running `etcdctl` (a held lock, a campaign) whose output lines arrive on a channel.
struct Etcdctl {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Etcdctl {
    fn start(addr: std::net::SocketAddr, args: &[&str]) -> Etcdctl {
        use std::io::BufRead as _;
        let mut child = crate::support::etcdctl::etcdctl_command(addr, args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("etcdctl runs (make dev installs it)");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || std::io::BufReader::new(stdout).lines().map_while(Result::ok).try_for_each(|line| send.send(line)));
        Etcdctl { child, lines }
    }

    /// The next line it prints (within [`TIMEOUT`]).
    fn line(&self) -> String {
        self.lines.recv_timeout(TIMEOUT).expect("a line from etcdctl in time")
    }

    /// Ends it as Ctrl-C would: etcdctl then unlocks or resigns and revokes its lease.
    fn interrupt(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: signals a child process this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        assert!(self.child.wait().expect("etcdctl ends").success());
    }
}

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `etcdctl lock` and `etcdctl elect` (etcd's own lock and election recipes over KV, watch and
/// leases): a second locker waits while the first holds the lock and gets it when the first
/// lets go; a second candidate leads once the first resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_locks_and_elections_hand_over_when_their_holder_lets_go() {
    let cluster = cluster_with_groups(&["/locks"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let waiters = |prefix: &'static str| {
        let mut etcd = etcd.clone();
        async move { etcd.get(prefix, Some(GetOptions::new().with_prefix())).await.expect("get").kvs().len() }
    };

    let mut first = tokio::task::spawn_blocking(move || {
        let first = Etcdctl::start(etcd_addr, &["lock", "/locks/deploy"]);
        let key = first.line();
        (first, key)
    })
    .await
    .expect("first locker");
    assert!(first.1.starts_with("/locks/deploy/"), "etcdctl prints the lock's key: {}", first.1);
    let second = Etcdctl::start(etcd_addr, &["lock", "/locks/deploy", "echo", "second holds it"]);
    warden_testkit::wait_until("the second locker queues behind the first", TIMEOUT, async || waiters("/locks/deploy/").await == 2).await;
    assert!(second.lines.try_recv().is_err(), "the second must not hold the lock while the first does");
    tokio::task::spawn_blocking(move || {
        first.0.interrupt();
        assert_eq!(second.line(), "second holds it");
    })
    .await
    .expect("hand-over");

    let campaign = |name: &'static str| {
        tokio::task::spawn_blocking(move || {
            let candidate = Etcdctl::start(etcd_addr, &["elect", "/elect/web", name]);
            let (key, value) = (candidate.line(), candidate.line());
            (candidate, key, value)
        })
    };
    let (mut leader, _, value) = campaign("web-1").await.expect("campaign");
    assert_eq!(value, "web-1");
    let next = campaign("web-2");
    warden_testkit::wait_until("the second candidate waits", TIMEOUT, async || waiters("/elect/web/").await == 2).await;
    let leading = etcd
        .get(
            "/elect/web/",
            Some(GetOptions::new().with_prefix().with_sort(etcd_client::SortTarget::Create, etcd_client::SortOrder::Ascend).with_limit(1)),
        )
        .await
        .expect("leader");
    assert_eq!(leading.kvs()[0].value(), b"web-1", "the first candidate leads");
    tokio::task::spawn_blocking(move || leader.interrupt()).await.expect("resign");
    let (_second_leader, _, value) = next.await.expect("second campaign");
    assert_eq!(value, "web-2");
}

/// A compare of a key that is only a container (a parent made for a key below it) sees a
/// missing key, as etcd does: so a create-if-absent of it (python-etcd3's `lock(name)`)
/// succeeds while keys below it exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_compare_sees_a_parent_made_for_a_key_below_it_as_a_missing_key() {
    let cluster = cluster_with_groups(&[]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    etcd.put("/jobs/1", "held", None).await.expect("put below /jobs");
    let create_if_absent = Txn::new()
        .when([
            Compare::version("/jobs", CompareOp::Equal, 0),
            Compare::create_revision("/jobs", CompareOp::Equal, 0),
            Compare::mod_revision("/jobs", CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put("/jobs", "mine", None)]);
    assert!(etcd.txn(create_if_absent.clone()).await.expect("txn").succeeded(), "the container compares as a missing key");
    let value = Txn::new().when([Compare::value("/jobs/2", CompareOp::Equal, "")]).and_then([TxnOp::put("/jobs/2", "x", None)]);
    etcd.put("/jobs/2/3", "below", None).await.expect("put below /jobs/2");
    assert!(!etcd.txn(value).await.expect("txn").succeeded(), "a value compare of a container fails, as of any missing key");
    let got = etcd.get("/jobs", None).await.expect("get");
    assert_eq!((got.kvs()[0].value(), got.kvs()[0].version()), (b"mine".as_slice(), 1));
    assert!(!etcd.txn(create_if_absent).await.expect("txn").succeeded(), "now /jobs is a key");
}

/// `TimeToLive` with keys lists a lease's keys in every group (plain and escaped ones), and
/// `Leases` lists every live lease; a revoked lease leaves both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leases_list_their_keys_in_every_group_and_every_live_lease_is_listed() {
    let cluster = cluster_with_groups(&["/services"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    let lease = etcd.lease_grant(30, None).await.expect("grant").id();
    let other = etcd.lease_grant(30, None).await.expect("grant").id();
    let with = |lease: i64| Some(PutOptions::new().with_lease(lease));
    etcd.put("/services/web/1", "10.0.0.1", with(lease)).await.expect("put in /services");
    etcd.put("/leader", "web-1", with(lease)).await.expect("put in the root group");
    etcd.put("config", "escaped", with(lease)).await.expect("put a key that is no path");
    etcd.put("/services/web/2", "10.0.0.2", with(other)).await.expect("put with the other lease");
    etcd.put("/services/web/3", "10.0.0.3", None).await.expect("put without a lease");
    let keys_of = async |etcd: &mut Client, id: i64| {
        let answer = etcd.lease_time_to_live(id, Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys())).await.expect("time to live");
        answer.keys().iter().map(|key| String::from_utf8_lossy(key).into_owned()).collect::<Vec<_>>()
    };
    assert_eq!(keys_of(&mut etcd, lease).await, ["/leader", "/services/web/1", "config"], "in key order, from both groups");
    assert_eq!(keys_of(&mut etcd, other).await, ["/services/web/2"]);
    let leases = etcd.leases().await.expect("leases");
    let listed: Vec<i64> = leases.leases().iter().map(|status| status.id()).collect();
    assert!(listed.contains(&lease) && listed.contains(&other), "{listed:?}");
    etcd.lease_revoke(lease).await.expect("revoke");
    assert!(keys_of(&mut etcd, lease).await.is_empty(), "a revoked lease has no keys");
    warden_testkit::wait_until("the revoked lease is no longer listed", TIMEOUT, async || {
        !etcd.leases().await.expect("leases").leases().iter().any(|status| status.id() == lease)
    })
    .await;
    assert!(etcd.leases().await.expect("leases").leases().iter().any(|status| status.id() == other));
}

/// A compare over a key range applies to every key in it, and nested transactions run in
/// the transaction's group with their compares judged before any operation, as in etcd;
/// either refused, as any transaction, when its keys lie in more than one group; a compare
/// over a range spanning groups is refused whatever they hold (a count elsewhere before the
/// transaction would let two creators both see no key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_range_compares_and_nested_transactions_run_atomically_in_one_group() {
    let cluster = cluster_with_groups(&["/registry/pods"]).await;
    let (_router, etcd_addr) = start_router_with_etcd(&cluster);
    let mut etcd = etcd_client(etcd_addr).await;
    etcd.put("/registry/nodes/a", "1", None).await.expect("put");
    let b = etcd.put("/registry/nodes/b", "1", None).await.expect("put").header().expect("header").revision();
    let holds = async |etcd: &mut Client, compare: Compare| {
        etcd.txn(Txn::new().when([compare]).and_then([TxnOp::get("/registry/nodes/a", None)])).await.expect("txn").succeeded()
    };
    let nodes = || Compare::version("/registry/nodes/", CompareOp::Equal, 1).with_prefix();
    assert!(holds(&mut etcd, nodes()).await, "every node has version 1");
    assert!(holds(&mut etcd, Compare::mod_revision("/registry/nodes/", CompareOp::Less, b + 1).with_prefix()).await);
    assert!(!holds(&mut etcd, Compare::mod_revision("/registry/nodes/", CompareOp::Less, b).with_prefix()).await, "/registry/nodes/b is at b");
    etcd.put("/registry/nodes/b", "2", None).await.expect("put again");
    assert!(!holds(&mut etcd, nodes()).await, "/registry/nodes/b has version 2");
    assert!(holds(&mut etcd, Compare::version("/registry/nodes/a", CompareOp::Equal, 1).with_range("/registry/nodes/b")).await);
    let none = || Compare::version("/registry/nodes/none/", CompareOp::Equal, 0).with_prefix();
    assert!(holds(&mut etcd, none()).await, "a range without keys compares as a missing key");
    assert!(!holds(&mut etcd, Compare::value("/registry/nodes/none/", CompareOp::Equal, "").with_prefix()).await, "but its value compare fails");
    // `/registry/pods/` has its plain keys in its own group and its escaped ones (none here)
    // in the root group: refused, and nothing is written.
    let create_if_none = Txn::new().when([Compare::create_revision("/registry/pods/", CompareOp::Equal, 0).with_prefix()]).and_then([TxnOp::put(
        "/registry/pods/first",
        "1",
        None,
    )]);
    let refused = etcd.txn(create_if_none).await.expect_err("a compare over two groups' keys").to_string();
    assert!(refused.contains("cannot be atomic"), "{refused}");
    assert!(etcd.get("/registry/pods/first", None).await.expect("get").kvs().is_empty(), "nothing written");

    // Compares judged first: the nested one sees /registry/pods/c missing though the outer
    // transaction put it just before.
    etcd.put("/registry/pods/a", "1", None).await.expect("put");
    let nested = Txn::new()
        .when([Compare::version("/registry/pods/c", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("/registry/pods/d", "then", None)])
        .or_else([TxnOp::put("/registry/pods/e", "else", None)]);
    let outer = Txn::new()
        .when([Compare::version("/registry/pods/a", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("/registry/pods/c", "1", None), TxnOp::txn(nested.clone())]);
    let answer = etcd.txn(outer).await.expect("nested txn");
    assert!(answer.succeeded());
    match &answer.op_responses()[..] {
        [TxnOpResponse::Put(_), TxnOpResponse::Txn(inner)] => assert!(inner.succeeded()),
        other => panic!("the nested transaction answered {other:?}"),
    }
    let d = etcd.get("/registry/pods/d", None).await.expect("get");
    assert_eq!(d.kvs()[0].mod_revision(), etcd.get("/registry/pods/c", None).await.expect("get").kvs()[0].mod_revision(), "one revision");
    assert!(etcd.get("/registry/pods/e", None).await.expect("get").kvs().is_empty());
    let again = etcd.txn(Txn::new().and_then([TxnOp::txn(nested)])).await.expect("nested txn");
    match &again.op_responses()[..] {
        [TxnOpResponse::Txn(inner)] => assert!(!inner.succeeded(), "now /registry/pods/c exists"),
        other => panic!("the nested transaction answered {other:?}"),
    }
    assert_eq!(etcd.get("/registry/pods/e", None).await.expect("get").kvs()[0].value(), b"else");

    // Keys in two groups: refused as a flat transaction spanning them is.
    etcd.put("/registry/services/web", "1", None).await.expect("put in the root group");
    let flat = etcd.txn(Txn::new().and_then([TxnOp::put("/registry/pods/f", "1", None), TxnOp::put("/registry/x", "1", None)])).await;
    let nested = Txn::new().and_then([TxnOp::put("/registry/x", "1", None)]);
    let deep = etcd.txn(Txn::new().and_then([TxnOp::put("/registry/pods/f", "1", None), TxnOp::txn(nested)])).await;
    let (flat, deep) = (flat.expect_err("flat txn across groups"), deep.expect_err("nested txn across groups"));
    assert!(deep.to_string().contains("must be served by one group") && flat.to_string().contains("must be served by one group"), "{flat} / {deep}");
    let across = TxnOp::get("/registry/", Some(GetOptions::new().with_prefix()));
    let refused = etcd.txn(Txn::new().and_then([across])).await.expect_err("a read across groups holding keys");
    assert!(refused.to_string().contains("more than one Warden group"), "{refused}");
    assert!(
        etcd.get("/registry/pods/f", None).await.expect("get").kvs().is_empty() && etcd.get("/registry/x", None).await.expect("get").kvs().is_empty()
    );
}
