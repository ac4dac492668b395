//! Upgrade safety: the limits a group checks in apply come from its
//! replicated state, so replicas running binaries with different defaults (a rolling
//! upgrade half-way) still apply every entry alike; and an admin's change of the limits
//! reaches every group through its own log, a group created later included.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::api::{ApiClient, CallError};
use crate::support::fleet::{Fleet, Security};
use crate::support::routed::{at_placement_leader, create_group};
use ::warden_client::{CreateOptions, DeleteOptions};
use prost::Message as _;
use warden_engine::host::ReadConsistency;
use warden_engine::state_machine::{StateMachine, StateMachineFactory};
use warden_namespace::{Limits, NamespaceFactory};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::namespace::{Command, Query, QueryResult};
use warden_proto::placement::{GetLimitsRequest, SetLimitsRequest};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::node_services::ServingFactory;

const TIMEOUT: Duration = Duration::from_secs(20);

/// A cluster half-way through a rolling upgrade: node `upgraded` runs a binary whose
/// default value limit is 512 KiB, the others one with 1 MiB.
struct MixedVersions {
    old: NamespaceFactory,
    new: NamespaceFactory,
    upgraded: u64,
}

impl MixedVersions {
    fn new(upgraded: u64) -> MixedVersions {
        let old = NamespaceFactory::default();
        let new_limits = Limits { value_bytes_max: 512 << 10, ..Limits::default() };
        // One node's replicas share one hub registry and limits board, as in one process.
        let new = NamespaceFactory { limits: new_limits, hubs: old.hubs.clone(), board: old.board.clone(), counts: old.counts.clone() };
        MixedVersions { old, new, upgraded }
    }
}

impl StateMachineFactory for MixedVersions {
    fn create(&self, node_id: u64, group: u64) -> Box<dyn StateMachine> {
        if node_id == self.upgraded {
            self.new.create(node_id, group)
        } else {
            self.old.create(node_id, group)
        }
    }
}

impl ServingFactory for MixedVersions {
    fn watch_hubs(&self) -> Option<warden_namespace::watch::WatchHubs> {
        self.old.watch_hubs()
    }

    fn limits_board(&self) -> Option<warden_namespace::limits::LimitsBoard> {
        self.old.limits_board()
    }
}

/// `path` as the replica on `node` has it (its own applied state, no leader involved).
async fn replica_get(cluster: &Cluster, node: u64, path: &str) -> QueryOutcome {
    let handle = cluster.handle(node).expect("node runs");
    let query = Query { query: Some(QueryKind::Get(GetRequest { path: path.into(), ..GetRequest::default() })) };
    let bytes = handle.read(1, query.encode_to_vec(), ReadConsistency::Stale, TIMEOUT).await.expect("stale read");
    QueryResult::decode(bytes.as_slice()).expect("query result").result.expect("an answer")
}

/// Waits until every replica of group 1 applied what its leader committed.
async fn wait_caught_up(cluster: &Cluster) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let statuses = cluster.statuses(1).await;
        let commit = statuses.iter().map(|s| s.commit).max().unwrap_or(0);
        if statuses.len() == cluster.node_ids().len() && statuses.iter().all(|s| s.applied >= commit) {
            return;
        }
        assert!(Instant::now() < deadline, "replicas did not catch up: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn create(api: &ApiClient, path: &str, bytes: usize) -> Result<CreateResponse, CallError> {
    let request = CreateRequest { path: path.into(), data: vec![7; bytes], ..CreateRequest::default() };
    api.call(TIMEOUT, false, |mut c| {
        let request = request.clone();
        async move { c.create(request).await }
    })
    .await
}

/// The bug this fixes: with limits compiled into each binary, a 700 KiB value was applied by
/// the 1 MiB replicas and refused by the upgraded one, so the group's replicas disagreed
/// about whether the node exists. Now every replica applies the group's record (none here:
/// the first release's 1 MiB), whatever its binary's defaults; and a record applied through
/// the log binds them all alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_different_default_limits_apply_every_entry_alike() {
    let factory = MixedVersions::new(5);
    let config = ClusterConfig { serve_api: true, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(factory)).expect("cluster starts"));
    cluster.create_group(1, &cluster.node_ids()).await.expect("group");
    cluster.wait_leader(1, TIMEOUT).await.expect("leader");
    let api = ApiClient::new(&cluster);
    let created = create(&api, "/big", 700 << 10).await.expect("a 700 KiB value is within the group's limits");
    wait_caught_up(&cluster).await;
    for node in cluster.node_ids() {
        match replica_get(&cluster, node, "/big").await {
            QueryOutcome::Get(got) => {
                assert_eq!(got.data.len(), 700 << 10, "node {node}");
                assert_eq!(got.stat.map(|s| s.mod_revision), created.header.as_ref().map(|h| h.revision), "node {node}");
            }
            other => panic!("node {node}'s replica disagrees with its group: {other:?}"),
        }
    }
    // A record through the log: every replica, the upgraded one too, refuses past 100 KiB.
    let record = ApplyLimits { version: 1, value_bytes_max: Some(100 << 10), ..ApplyLimits::default() };
    let command = Command { now_ms: 0, principal: String::new(), op: Some(CommandOp::SetLimits(record)) };
    cluster.propose(1, command.encode_to_vec(), TIMEOUT).await.expect("limits applied");
    for path in ["/over-a", "/over-b"] {
        match create(&api, path, 200 << 10).await {
            Err(CallError::Refused(error)) => assert_eq!(error.code, Code::TooLarge as i32, "{error:?}"),
            other => panic!("a 200 KiB value past the group's 100 KiB limit: {other:?}"),
        }
    }
    create(&api, "/small", 50 << 10).await.expect("within the new limit");
    wait_caught_up(&cluster).await;
    for node in cluster.node_ids() {
        assert!(matches!(replica_get(&cluster, node, "/small").await, QueryOutcome::Get(_)), "node {node}");
        assert!(matches!(replica_get(&cluster, node, "/over-a").await, QueryOutcome::Error(_)), "node {node}");
    }
    // A restarted replica reads the record back from its data (and a proposal of an older
    // version changes nothing).
    cluster.restart(5).expect("restart");
    let stale = ApplyLimits { version: 1, value_bytes_max: Some(1 << 20), ..ApplyLimits::default() };
    let command = Command { now_ms: 0, principal: String::new(), op: Some(CommandOp::SetLimits(stale)) };
    cluster.propose(1, command.encode_to_vec(), TIMEOUT).await.expect("stale limits answered");
    match create(&api, "/over-c", 200 << 10).await {
        Err(CallError::Refused(error)) => assert_eq!(error.code, Code::TooLarge as i32, "{error:?}"),
        other => panic!("a stale record must not lift the limit: {other:?}"),
    }
    wait_caught_up(&cluster).await;
}

/// `warden admin limits set` through placement: the change reaches every group through its
/// own log within a few heartbeats (writes past the new limit refused everywhere, within it
/// accepted), a group created afterwards gets it too, and a bad change is refused and
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admins_change_of_the_limits_reaches_every_group() {
    let fleet = Fleet::start(&["/a", "/b"], Security::Off).await;
    let cluster = &fleet.cluster;
    let bootstrapped = at_placement_leader(cluster, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await.expect("limits");
    assert_eq!(bootstrapped.version, 1, "bootstrap records the founding binary's limits");
    assert_eq!(bootstrapped.value_bytes_max, Some(Limits::default().value_bytes_max as u64));
    let set = |changes: ApplyLimits| {
        at_placement_leader(cluster, move |mut c| async move { c.set_limits(SetLimitsRequest { changes: Some(changes) }).await })
    };
    let changed = set(ApplyLimits { value_bytes_max: Some(1000), ..ApplyLimits::default() }).await.expect("set limits");
    assert_eq!((changed.version, changed.value_bytes_max, changed.txn_ops_max), (2, Some(1000), bootstrapped.txn_ops_max));
    // An empty session TTL range, a zero: refused, nothing changes.
    let inverted = set(ApplyLimits { session_ttl_ms_min: Some(60_000), session_ttl_ms_max: Some(10_000), ..ApplyLimits::default() }).await;
    assert_eq!(inverted.map_err(|e| e.code), Err(Code::InvalidArgument as i32));
    let zero = set(ApplyLimits { txn_ops_max: Some(0), ..ApplyLimits::default() }).await;
    assert_eq!(zero.map_err(|e| e.code), Err(Code::InvalidArgument as i32));
    let after = at_placement_leader(cluster, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await.expect("limits");
    assert_eq!(after, changed);
    create_group(cluster, "/c").await;
    let client = fleet.reach.connect().await;
    for prefix in ["/", "/a", "/b", "/c"] {
        let path = format!("{}/x", prefix.trim_end_matches('/'));
        // Placement's record reaches each group's leader by heartbeat, then the group's log.
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match client.create(&path, vec![1; 2000], &CreateOptions::default()).await {
                Err(::warden_client::Error::TooLarge { .. }) => break,
                Ok(_) => {
                    client.delete(&path, &DeleteOptions::default()).await.expect("delete");
                }
                Err(error) => panic!("{path}: {error:?}"),
            }
            assert!(Instant::now() < deadline, "{path}: the group never applied the new limits");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client.create(&path, vec![1; 900], &CreateOptions::default()).await.expect("within the new limit");
    }
}

/// Admins changing different limits at the same moment: each change is merged into the
/// record the previous one committed, so none is lost (the placement leader runs one
/// read-merge-commit at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_of_different_limits_all_take_effect() {
    let fleet = Fleet::start(&[], Security::Off).await;
    let cluster = &fleet.cluster;
    let before = at_placement_leader(cluster, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await.expect("limits");
    let changes = [
        ApplyLimits { value_bytes_max: Some(1001), ..ApplyLimits::default() },
        ApplyLimits { txn_ops_max: Some(101), ..ApplyLimits::default() },
        ApplyLimits { recursive_delete_nodes_max: Some(1002), ..ApplyLimits::default() },
        ApplyLimits { ttl_ms_max: Some(100_003), ..ApplyLimits::default() },
        ApplyLimits { ephemerals_per_session_max: Some(104), ..ApplyLimits::default() },
        ApplyLimits { sessions_per_expiry_max: Some(105), ..ApplyLimits::default() },
        ApplyLimits { lock_waiters_max: Some(106), ..ApplyLimits::default() },
        ApplyLimits { lock_delay_ms_max: Some(10_007), ..ApplyLimits::default() },
    ];
    let calls = changes.iter().map(|changes| {
        let changes = *changes;
        at_placement_leader(cluster, move |mut c| async move { c.set_limits(SetLimitsRequest { changes: Some(changes) }).await })
    });
    for answer in futures::future::join_all(calls).await {
        answer.expect("a change");
    }
    let after = at_placement_leader(cluster, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await.expect("limits");
    assert_eq!(after.version, before.version + changes.len() as u64);
    let expected = ApplyLimits {
        version: after.version,
        value_bytes_max: Some(1001),
        txn_ops_max: Some(101),
        recursive_delete_nodes_max: Some(1002),
        ttl_ms_max: Some(100_003),
        ephemerals_per_session_max: Some(104),
        sessions_per_expiry_max: Some(105),
        lock_waiters_max: Some(106),
        lock_delay_ms_max: Some(10_007),
        ..before
    };
    assert_eq!(after, expected, "every change took effect");
}
