//! Subtree quotas: set by an admin through placement, counted exactly by each
//! group serving the subtree, shared among those groups so the limit holds for the whole
//! subtree, refused RESOURCE_EXHAUSTED naming the quota, and a refused write changes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::fleet::{Fleet, Security};
use crate::support::routed::{at_placement_leader, TIMEOUT};
use crate::support::watch::{persistent, WatchConn};
use tokio::time::Instant;
use tonic::transport::Channel;
use warden_proto::placement::{CreateGroupRequest, ListQuotasRequest, QuotaState, RemoveGroupRequest, SetQuotaRequest};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::Cluster;

/// Sets (or with `limits` `None`, removes) the quota on `prefix` at the placement leader.
async fn set_quota(cluster: &Cluster, prefix: &str, limits: Option<QuotaLimits>) -> QuotaState {
    let request = SetQuotaRequest { prefix: prefix.into(), remove: limits.is_none(), limits };
    at_placement_leader(cluster, |mut c| {
        let request = request.clone();
        async move { c.set_quota(request).await }
    })
    .await
    .unwrap_or_else(|error| panic!("setting the quota on {prefix}: {error:?}"))
}

/// The quota on `prefix` as `ListQuotas` shows it (usage read through each group's log).
async fn quota_state(cluster: &Cluster, prefix: &str) -> QuotaState {
    let list = at_placement_leader(cluster, |mut c| async move { c.list_quotas(ListQuotasRequest {}).await }).await.expect("list quotas");
    list.quotas.into_iter().find(|quota| quota.prefix == prefix).expect("the quota is listed")
}

fn create(path: &str, data: &[u8]) -> CreateRequest {
    CreateRequest { path: path.into(), data: data.to_vec(), ..CreateRequest::default() }
}

/// The quota a refusal names; panics unless `status` is RESOURCE_EXHAUSTED.
fn exceeded(status: &tonic::Status) -> QuotaExceeded {
    let error = warden_proto::error_of(status).unwrap_or_else(|| panic!("no Warden error in {status:?}"));
    assert_eq!(error.code, Code::ResourceExhausted as i32, "{status:?}");
    *error.quota.unwrap_or_else(|| panic!("the refusal names no quota: {status:?}"))
}

/// Creates nodes at the paths `path_of(i)` names, i = 0, 1, …, until one is refused for a
/// quota (at most `attempts_max` creates); answers how many were created and the quota
/// the refusal named. Panics if none was refused.
async fn fill_until_refused(api: &mut WardenClient<Channel>, attempts_max: u64, path_of: impl Fn(u64) -> String) -> (u64, QuotaExceeded) {
    for i in 0..attempts_max {
        if let Err(status) = api.create(create(&path_of(i), b"")).await {
            return (i, exceeded(&status));
        }
    }
    panic!("the quota never refused in {attempts_max} creates");
}

/// Waits until the quota on `prefix`, listed by two groups after a split, counts the
/// `nodes` the subtree holds. The new group counts the `moved` nodes as it ingests them; the
/// old one stops counting each as its leader purges it, a page at a time after the
/// hand-over. Until then both count them (the listed usage over-reports, never under, and
/// a write may be refused just below the limit; the new group's share starts empty, so no
/// more fits than the limit).
async fn await_moved_nodes_counted_once(cluster: &Cluster, prefix: &str, nodes: u64, moved: u64) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let state = quota_state(cluster, prefix).await;
        assert_eq!(state.shares.len(), 2, "the new group holds a share: {state:?}");
        let listed = state.usage.expect("usage").nodes;
        assert!((nodes..=nodes + moved).contains(&listed), "the moved nodes count in the new group, and at most also in the old one: {state:?}");
        if listed == nodes {
            return;
        }
        assert!(Instant::now() < deadline, "the old group never stopped counting the moved nodes: {state:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Nodes at or below `path` (a walk of the tree through the router).
async fn count_nodes(api: &mut WardenClient<Channel>, path: &str) -> u64 {
    let mut count = 1;
    let mut pending = vec![path.to_string()];
    while let Some(parent) = pending.pop() {
        let children = api.get_children(GetChildrenRequest { path: parent.clone(), ..GetChildrenRequest::default() }).await.expect("children");
        for name in children.into_inner().names {
            count += 1;
            pending.push(format!("{parent}/{name}"));
        }
    }
    count
}

/// The test: writers in three groups race to fill one quota; exactly the limit of
/// nodes exists at the end, every refusal names the quota, a refused transaction changes
/// nothing, and room freed in one group can be used from another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_over_several_groups_holds_exactly_under_concurrent_writers() {
    let fleet = Fleet::start(&["/team/a", "/team/b"], Security::Off).await;
    let mut api = fleet.reach.raw();
    // (/team/a and /team/b are the roots of their groups: they exist already.)
    for path in ["/team", "/team/c"] {
        api.create(create(path, b"")).await.expect("create");
    }
    api.create(create("/team/c/kept", b"before")).await.expect("create");
    const LIMIT: u64 = 60;
    let set = set_quota(&fleet.cluster, "/team", Some(QuotaLimits { nodes: Some(LIMIT), ..QuotaLimits::default() })).await;
    let groups: Vec<u64> = set.shares.iter().map(|share| share.group_id).collect();
    assert_eq!(groups.len(), 3, "the root group (/team, /team/c) and the groups of /team/a and /team/b share it: {set:?}");
    let initial = set.usage.expect("usage").nodes;
    assert!(initial >= 3, "counted when set: at least /team, /team/c and /team/c/kept: {set:?}");
    let listed_initially = count_nodes(&mut api, "/team").await;

    // Six writers, two per group, each creating until the quota refuses it twice in a row
    // (a refusal is final only once placement found no room left anywhere).
    let mut writers = Vec::new();
    for (writer, parent) in ["/team/a", "/team/a", "/team/b", "/team/b", "/team/c", "/team/c"].into_iter().enumerate() {
        let mut api = fleet.reach.raw();
        writers.push(tokio::spawn(async move {
            let (mut created, mut refusals, mut next) = (0u64, 0, 0);
            let deadline = Instant::now() + TIMEOUT * 4;
            while refusals < 2 {
                assert!(Instant::now() < deadline, "writer {writer} never reached the limit");
                next += 1;
                match api.create(create(&format!("{parent}/w{writer}-{next}"), b"x")).await {
                    Ok(_) => {
                        created += 1;
                        refusals = 0;
                    }
                    Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                        let quota = exceeded(&status);
                        assert_eq!((quota.prefix.as_str(), quota.kind, quota.limit), ("/team", QuotaKind::QuotaNodes as i32, LIMIT));
                        refusals += 1;
                    }
                    // A leader change or a busy moment: the write was not refused by the quota.
                    Err(status) if status.code() == tonic::Code::Unavailable => tokio::time::sleep(Duration::from_millis(20)).await,
                    Err(status) => panic!("writer {writer}: {status:?}"),
                }
            }
            created
        }));
    }
    let mut created = 0;
    for writer in writers {
        created += writer.await.expect("writer");
    }
    assert_eq!(created, LIMIT - initial, "the writers created exactly the room the quota had");
    assert_eq!(count_nodes(&mut api, "/team").await, listed_initially + created, "what the writers were told is what exists");
    let state = quota_state(&fleet.cluster, "/team").await;
    assert_eq!(state.usage.expect("usage").nodes, LIMIT, "the groups' counts add up to what exists: {state:?}");
    let shares: u64 = state.shares.iter().map(|share| share.allotment.expect("allotment").nodes).sum();
    assert!(shares <= LIMIT, "the shares never sum past the limit: {state:?}");

    // A refused transaction changes nothing, not even its other operations.
    let before = api.get(GetRequest { path: "/team/c/kept".into(), ..GetRequest::default() }).await.expect("get").into_inner();
    let txn = TxnRequest {
        then: vec![
            TxnOp { op: Some(Op::Set(SetRequest { path: "/team/c/kept".into(), data: b"after".to_vec(), ..SetRequest::default() })) },
            TxnOp { op: Some(Op::Create(create("/team/c/one-too-many", b""))) },
        ],
        ..TxnRequest::default()
    };
    let refused = api.txn(txn).await.expect_err("past the quota");
    assert_eq!(exceeded(&refused).prefix, "/team");
    let after = api.get(GetRequest { path: "/team/c/kept".into(), ..GetRequest::default() }).await.expect("get").into_inner();
    assert_eq!((after.data, after.stat), (before.data, before.stat), "the set in the refused transaction was not applied");
    let absent = api.exists(ExistsRequest { path: "/team/c/one-too-many".into(), ..ExistsRequest::default() }).await.expect("exists");
    assert!(absent.into_inner().stat.is_none(), "the create in the refused transaction was not applied");

    // Room freed in one group is usable from another (placement takes the share back).
    let children = api.get_children(GetChildrenRequest { path: "/team/a".into(), ..GetChildrenRequest::default() }).await.expect("children");
    let victim = format!("/team/a/{}", children.into_inner().names.first().expect("a child of /team/a"));
    api.delete(DeleteRequest { path: victim, ..DeleteRequest::default() }).await.expect("delete");
    api.create(create("/team/b/after-delete", b"")).await.expect("the freed room is used from another group");
    let refused = api.create(create("/team/c/again", b"")).await.expect_err("full again");
    assert_eq!(exceeded(&refused).limit, LIMIT);
    assert_eq!(count_nodes(&mut api, "/team").await, listed_initially + created);
    assert_eq!(quota_state(&fleet.cluster, "/team").await.usage.expect("usage").nodes, LIMIT);

    // A limit lowered below the usage: nothing is deleted, the shares fit the new limit, and
    // growth is refused until the usage falls.
    let lowered = set_quota(&fleet.cluster, "/team", Some(QuotaLimits { nodes: Some(LIMIT - 10), ..QuotaLimits::default() })).await;
    let shares: u64 = lowered.shares.iter().map(|share| share.allotment.expect("allotment").nodes).sum();
    assert!(shares <= LIMIT - 10, "the shares fit the lowered limit: {lowered:?}");
    assert_eq!(lowered.usage.expect("usage").nodes, LIMIT, "nothing was deleted");
    let refused = api.create(create("/team/b/over", b"")).await.expect_err("over the lowered limit");
    assert_eq!(exceeded(&refused).limit, LIMIT - 10);

    // Removing the quota lifts it everywhere.
    set_quota(&fleet.cluster, "/team", None).await;
    api.create(create("/team/a/free", b"")).await.expect("no quota any more");
    api.create(create("/team/c/free", b"")).await.expect("no quota any more");
}

/// Bytes, sessions (by path hint), lock waiters and watches (per node) are limited too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bytes_sessions_lock_waiters_and_watches_have_quotas() {
    let fleet = Fleet::start(&[], Security::Off).await;
    let mut api = fleet.reach.raw();
    api.create(create("/q", b"")).await.expect("create");
    api.create(create("/b", b"")).await.expect("create");
    let limits = QuotaLimits { sessions: Some(2), lock_waiters: Some(1), watches: Some(2), ..QuotaLimits::default() };
    set_quota(&fleet.cluster, "/q", Some(limits)).await;
    set_quota(&fleet.cluster, "/b", Some(QuotaLimits { bytes: Some(10), ..QuotaLimits::default() })).await;

    // Bytes: 6 + 4 fit, one more byte does not, and shrinking a value makes room.
    api.create(create("/b/six", b"123456")).await.expect("6 bytes");
    api.create(create("/b/four", b"1234")).await.expect("10 bytes");
    let refused = api.create(create("/b/one", b"1")).await.expect_err("11 bytes");
    assert_eq!(exceeded(&refused).kind, QuotaKind::QuotaBytes as i32);
    let refused = api.set(SetRequest { path: "/b/four".into(), data: b"12345".to_vec(), ..SetRequest::default() }).await.expect_err("grows");
    assert_eq!(exceeded(&refused).kind, QuotaKind::QuotaBytes as i32);
    api.set(SetRequest { path: "/b/six".into(), data: b"12345".to_vec(), ..SetRequest::default() }).await.expect("shrinks");
    api.create(create("/b/one", b"1")).await.expect("the byte freed");
    assert_eq!(quota_state(&fleet.cluster, "/b").await.usage.expect("usage").bytes, 10);

    // Sessions count where their path hint is.
    let open = |hint: &str| CreateSessionRequest { ttl_ms: 10_000, path_hint: hint.into(), ..CreateSessionRequest::default() };
    let first = api.create_session(open("/q/s1")).await.expect("session 1").into_inner().session_id;
    let second = api.create_session(open("/q")).await.expect("session 2").into_inner().session_id;
    let refused = api.create_session(open("/q/s3")).await.expect_err("a third session under /q");
    assert_eq!(exceeded(&refused).kind, QuotaKind::QuotaSessions as i32);
    api.create_session(open("/elsewhere")).await.expect("a session elsewhere is not counted");

    // Lock waiters: one holder fits, a second waiter does not.
    let lock = |session_id: u64| LockRequest { path: "/q/lock".into(), session_id, wait: true, timeout_ms: 1_000, ..LockRequest::default() };
    assert!(api.lock(lock(first)).await.expect("the first waiter").into_inner().acquired);
    let refused = api.lock(lock(second)).await.expect_err("a second waiter");
    assert_eq!(exceeded(&refused).kind, QuotaKind::QuotaLockWaiters as i32);
    api.close_session(CloseSessionRequest { session_id: second, ..CloseSessionRequest::default() }).await.expect("close");
    api.create_session(open("/q/s3")).await.expect("a closed session made room");

    // Watches, per node serving them: two fit, a third is refused until one is cancelled.
    let mut watches = WatchConn::over(fleet.reach.raw()).await.expect("watch stream");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let created = watches.create(persistent("/q", true, 0)).await.expect("created");
        assert!(created.created.is_some(), "{created:?}");
        ids.push(created.watch_id);
    }
    let refused = watches.create(persistent("/q/lock", false, 0)).await.expect("answered");
    let error = refused.canceled.and_then(|canceled| canceled.error).expect("refused");
    assert_eq!((error.code, error.quota.map(|q| q.kind)), (Code::ResourceExhausted as i32, Some(QuotaKind::QuotaWatches as i32)));
    let outside = watches.create(persistent("/elsewhere", false, 0)).await.expect("answered");
    assert!(outside.created.is_some(), "a watch outside /q is not counted: {outside:?}");
    watches.send(watch_request::Request::Cancel(WatchCancel { watch_id: ids[0] })).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let again = watches.create(persistent("/q", false, 0)).await.expect("answered");
        if again.created.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the cancelled watch never made room: {again:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed: BTreeMap<&str, u64> = {
        let state = quota_state(&fleet.cluster, "/q").await;
        let usage = state.usage.expect("usage");
        BTreeMap::from([("sessions", usage.sessions), ("lock_waiters", usage.lock_waiters)])
    };
    assert_eq!(listed, BTreeMap::from([("sessions", 2), ("lock_waiters", 1)]));
}

/// A group split out of a quota's subtree counts under it from its first write: the limit
/// still holds for the whole subtree, and room moves between the old group and the new;
/// merged back, the subtree counts under the quotas on it in the group that takes it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subtree_split_out_or_merged_back_counts_under_its_quotas_at_once() {
    let fleet = Fleet::start(&[], Security::Off).await;
    let mut api = fleet.reach.raw();
    for path in ["/s", "/s/x"] {
        api.create(create(path, b"")).await.expect("create");
    }
    const LIMIT: u64 = 12;
    set_quota(&fleet.cluster, "/s", Some(QuotaLimits { nodes: Some(LIMIT), ..QuotaLimits::default() })).await;
    for i in 0..5 {
        api.create(create(&format!("/s/x/n{i}"), b"")).await.expect("create");
    }
    at_placement_leader(&fleet.cluster, |mut c| async move { c.split_group(CreateGroupRequest { prefix: "/s/x".into() }).await })
        .await
        .expect("split /s/x");
    await_moved_nodes_counted_once(&fleet.cluster, "/s", 7, 6).await;
    // Fill the subtree from both groups: exactly the limit fits.
    let (created, quota) = fill_until_refused(&mut api, 100, |i| if i % 2 == 0 { format!("/s/x/m{i}") } else { format!("/s/m{i}") }).await;
    assert_eq!(quota.limit, LIMIT);
    assert_eq!(created, LIMIT - 7);
    assert_eq!(quota_state(&fleet.cluster, "/s").await.usage.expect("usage").nodes, LIMIT);

    // Merged back, the subtree still counts under a quota on the merged prefix itself: the
    // group taking it over joins that quota before it serves the prefix.
    set_quota(&fleet.cluster, "/s", Some(QuotaLimits { nodes: Some(100), ..QuotaLimits::default() })).await;
    let moved = quota_state(&fleet.cluster, "/s").await.usage.expect("usage").nodes;
    let below = count_nodes(&mut api, "/s/x").await;
    const ROOM: u64 = 3;
    set_quota(&fleet.cluster, "/s/x", Some(QuotaLimits { nodes: Some(below + ROOM), ..QuotaLimits::default() })).await;
    at_placement_leader(&fleet.cluster, |mut c| async move { c.merge_group(RemoveGroupRequest { prefix: "/s/x".into() }).await })
        .await
        .expect("merge /s/x");
    let state = quota_state(&fleet.cluster, "/s/x").await;
    assert_eq!(state.usage.expect("usage").nodes, below, "the merged nodes count in the group that took them: {state:?}");
    let (created, quota) = fill_until_refused(&mut api, 100, |i| format!("/s/x/merged{i}")).await;
    assert_eq!((quota.prefix.as_str(), quota.limit), ("/s/x", below + ROOM), "the merged prefix's own quota refuses");
    assert_eq!(created, ROOM, "exactly the room the merged prefix's quota had");
    assert_eq!(quota_state(&fleet.cluster, "/s").await.usage.expect("usage").nodes, moved + ROOM);
}

/// A split whose quota join failed after placement listed the new group's share (the group
/// did not take it: a replica missing or cut off) is finished by a later attempt with the new
/// group holding its record, so the subtree's limit still holds across both groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_whose_quota_join_failed_once_still_counts_the_new_group_under_the_quota() {
    let fleet = Fleet::start(&[], Security::Off).await;
    let mut api = fleet.reach.raw();
    for path in ["/j", "/j/x"] {
        api.create(create(path, b"")).await.expect("create");
    }
    const LIMIT: u64 = 8;
    set_quota(&fleet.cluster, "/j", Some(QuotaLimits { nodes: Some(LIMIT), ..QuotaLimits::default() })).await;
    fleet.cluster.faults().fail_quota_share_sets(1);
    // The failed step is settled at once: the source handed the subtree over, so the split
    // is finished by a second attempt.
    at_placement_leader(&fleet.cluster, |mut c| async move { c.split_group(CreateGroupRequest { prefix: "/j/x".into() }).await })
        .await
        .expect("split /j/x, finished by its second attempt");
    assert_eq!(fleet.cluster.faults().quota_share_failures_left(), 0, "the new group's first share change failed");
    await_moved_nodes_counted_once(&fleet.cluster, "/j", 2, 1).await;
    let (created, quota) = fill_until_refused(&mut api, 4 * LIMIT, |i| if i % 2 == 0 { format!("/j/x/m{i}") } else { format!("/j/m{i}") }).await;
    assert_eq!(quota.limit, LIMIT);
    assert_eq!(created, LIMIT - 2, "exactly the limit fits in the subtree");
    assert_eq!(count_nodes(&mut api, "/j").await, LIMIT);
}
