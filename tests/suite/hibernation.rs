//! Hibernation of idle groups on the in-process cluster fixture: idle
//! groups stop heartbeating, wake on a request with the same linearizable answers, elect a
//! new leader once a request reaches a group whose sleeping leader died, and an active group
//! never sleeps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use warden_engine::config::HIBERNATE_AFTER_TICKS_ON;
use warden_engine::kv::{self, KvFactory};
use warden_engine::{EngineError, ReadConsistency};
use warden_namespace::{Limits, NamespaceFactory};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::leader_request::Request as LeaderRequestKind;
use warden_proto::namespace::leader_response::Response as LeaderResponseKind;
use warden_proto::namespace::{Command, CommandResult, CreateSession, LeaderRequest, LeaderResponse};
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_testkit::wait_until;

const TIMEOUT: Duration = Duration::from_secs(15);
const ALL: [u64; 5] = [1, 2, 3, 4, 5];

fn cluster() -> Arc<Cluster> {
    let config = ClusterConfig { hibernate_after_ticks: HIBERNATE_AFTER_TICKS_ON, ..ClusterConfig::default() };
    Arc::new(Cluster::start(config, Arc::new(KvFactory)).expect("cluster starts"))
}

async fn create_groups(cluster: &Cluster, groups: &[u64]) {
    for &group in groups {
        cluster.create_group(group, &ALL).await.expect("group created");
    }
    for &group in groups {
        cluster.wait_leader(group, Duration::from_secs(30)).await.expect("group elects a leader");
    }
}

async fn put(cluster: &Cluster, group: u64, key: &str, value: &str) -> Result<u64, EngineError> {
    let output = cluster.propose(group, kv::put(key.as_bytes(), value.as_bytes()), TIMEOUT).await?;
    Ok(kv::decode_result(&output)?.applied_index)
}

async fn get(cluster: &Cluster, group: u64, key: &str) -> Option<Vec<u8>> {
    let bytes = cluster.read(group, kv::get(key.as_bytes()), TIMEOUT).await.expect("linearizable read");
    kv::decode_value(&bytes).expect("value decodes").value
}

/// True when every running replica of `group` sleeps.
async fn asleep_everywhere(cluster: &Cluster, group: u64) -> bool {
    let statuses = cluster.statuses(group).await;
    !statuses.is_empty() && statuses.len() == cluster.running().len() && statuses.iter().all(|s| s.asleep)
}

fn heartbeats_sent(cluster: &Cluster) -> u64 {
    cluster.running().into_iter().filter_map(|id| cluster.raft_metrics(id)).map(|m| m.heartbeats_sent).sum()
}

/// Waits until the cluster's heartbeat counter has not moved for `quiet` (at least ten
/// heartbeat intervals), or fails after `timeout`.
async fn wait_heartbeats_stop(cluster: &Cluster, quiet: Duration, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let (mut last, mut since) = (heartbeats_sent(cluster), Instant::now());
    while since.elapsed() < quiet {
        assert!(Instant::now() < deadline, "heartbeats never stopped for {quiet:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = heartbeats_sent(cluster);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_groups_sleep_and_stop_heartbeating() {
    let cluster = cluster();
    let groups: Vec<u64> = (1..=8).collect();
    create_groups(&cluster, &groups).await;
    for &group in &groups {
        put(&cluster, group, "k", "v").await.expect("write");
    }
    for &group in &groups {
        wait_until(&format!("group {group} sleeps on every replica"), Duration::from_secs(30), async || asleep_everywhere(&cluster, group).await)
            .await;
    }
    let sleeping: u64 = ALL.iter().filter_map(|id| cluster.raft_metrics(*id)).map(|m| m.sleeping_replicas).sum();
    assert_eq!(sleeping, 8 * 5, "the metric counts every sleeping replica");
    // 2 s is twenty heartbeat intervals of the fixture (50 ms ticks, a heartbeat every 2).
    wait_heartbeats_stop(&cluster, Duration::from_secs(2), Duration::from_secs(30)).await;
    for &group in &groups {
        assert!(asleep_everywhere(&cluster, group).await, "group {group}: asking for status wakes nobody");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_reads_wake_a_sleeping_group_with_the_same_answers() {
    let cluster = cluster();
    create_groups(&cluster, &[1]).await;
    let first = put(&cluster, 1, "k", "one").await.expect("write");
    wait_until("group 1 sleeps", Duration::from_secs(30), async || asleep_everywhere(&cluster, 1).await).await;
    let leader = cluster.leader(1).await.expect("a sleeping group keeps its leader");

    // A linearizable read on a follower wakes it; it asks the leader for the read index.
    let follower = ALL.into_iter().find(|id| *id != leader).expect("a follower");
    let handle = cluster.handle(follower).expect("running");
    let bytes = handle.read(1, kv::get(b"k"), ReadConsistency::Linearizable, TIMEOUT).await.expect("follower read");
    assert_eq!(kv::decode_value(&bytes).expect("value").value.as_deref(), Some(&b"one"[..]));

    wait_until("group 1 sleeps again", Duration::from_secs(30), async || asleep_everywhere(&cluster, 1).await).await;
    let second = put(&cluster, 1, "k", "two").await.expect("write wakes the group");
    assert!(second > first, "the log went on: {second} after {first}");
    assert_eq!(get(&cluster, 1, "k").await.as_deref(), Some(&b"two"[..]), "read back after the wake");
    // Every replica applies it (they all woke for the append).
    for id in ALL {
        let handle = cluster.handle(id).expect("running");
        wait_until(&format!("node {id} applies {second}"), TIMEOUT, async || handle.status(1).await.is_ok_and(|s| s.applied >= second)).await;
        let bytes = handle.read(1, kv::get(b"k"), ReadConsistency::Stale, TIMEOUT).await.expect("stale read");
        assert_eq!(kv::decode_value(&bytes).expect("value").value.as_deref(), Some(&b"two"[..]), "node {id}");
    }
    wait_until("group 1 sleeps after the write", Duration::from_secs(30), async || asleep_everywhere(&cluster, 1).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_while_its_group_sleeps_is_replaced_once_a_request_comes() {
    let cluster = cluster();
    create_groups(&cluster, &[1]).await;
    put(&cluster, 1, "k", "before").await.expect("write");
    wait_until("group 1 sleeps", Duration::from_secs(30), async || asleep_everywhere(&cluster, 1).await).await;
    let old = cluster.leader(1).await.expect("leader");
    cluster.kill(old);
    // Nobody notices while nothing asks: the followers sleep on.
    assert!(asleep_everywhere(&cluster, 1).await, "the followers do not tick, so they do not notice");
    let started = Instant::now();
    let index = put(&cluster, 1, "k", "after").await.expect("the request wakes the group and a new leader takes it");
    let failover = started.elapsed();
    let new = cluster.leader(1).await.expect("a new leader");
    assert_ne!(new, old);
    assert!(index > 0);
    assert_eq!(get(&cluster, 1, "k").await.as_deref(), Some(&b"after"[..]));
    // The fixture's election timeout is 0.5-1 s (50 ms ticks × 10-20): a generous bound.
    assert!(failover < Duration::from_secs(10), "failover took {failover:?}");
    println!("failover after the first request: {failover:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_group_never_sleeps() {
    let cluster = cluster();
    create_groups(&cluster, &[1, 2]).await;
    put(&cluster, 2, "k", "v").await.expect("write");
    let writer = tokio::spawn({
        let cluster = cluster.clone();
        async move {
            let mut written = 0u64;
            let started = Instant::now();
            // Three hibernation periods of the fixture (20 ticks of 50 ms).
            while started.elapsed() < Duration::from_secs(3) {
                put(&cluster, 1, "counter", &written.to_string()).await.expect("write");
                written += 1;
            }
            written
        }
    });
    let mut idle_slept = false;
    while !writer.is_finished() {
        let statuses = cluster.statuses(1).await;
        assert!(statuses.iter().all(|s| !s.asleep), "the active group slept: {statuses:?}");
        idle_slept |= asleep_everywhere(&cluster, 2).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let written = writer.await.expect("writer");
    assert!(written > 10, "the writer kept writing: {written}");
    wait_until("the idle group sleeps", Duration::from_secs(30), async || idle_slept || asleep_everywhere(&cluster, 2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_while_its_groups_sleep_causes_no_election() {
    let cluster = cluster();
    let groups: Vec<u64> = (1..=6).collect();
    create_groups(&cluster, &groups).await;
    for &group in &groups {
        put(&cluster, group, "k", "v").await.expect("write");
    }
    for &group in &groups {
        wait_until(&format!("group {group} sleeps"), Duration::from_secs(30), async || asleep_everywhere(&cluster, group).await).await;
    }
    // Node 5 restarts; the groups it does not lead keep their leader and term.
    let mut kept = Vec::new();
    for &group in &groups {
        let leader = cluster.statuses(group).await.into_iter().find(|s| s.is_leader).expect("leader");
        if leader.node_id != 5 {
            kept.push((group, leader.node_id, leader.term));
        }
    }
    assert!(!kept.is_empty(), "node 5 leads every group");
    cluster.restart(5).expect("node 5 restarts");
    let restarted = cluster.handle(5).expect("running");
    for &(group, leader, term) in &kept {
        // Its replica hears the leader (woken by its start-up notice) instead of campaigning.
        wait_until(&format!("node 5 follows the leader of group {group}"), Duration::from_secs(30), async || {
            restarted.status(group).await.is_ok_and(|s| s.leader_id == leader)
        })
        .await;
        for status in cluster.statuses(group).await {
            assert_eq!(status.term, term, "group {group}: node {} moved to a new term: an election", status.node_id);
        }
    }
}

/// A session opened by the request that wakes a group asleep for longer than a TTL gets a
/// full TTL from its creation. The sleeping leader did not tick, so the clock its lease table
/// counts from stood still: the session was born expired, its expiry proposed at the next
/// tick and its lock holds freed while the client counted a whole TTL from its request (a
/// stale holder acted in `tests/suite/crash_cycles.rs` with hibernation on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_on_waking_a_long_sleep_gets_a_full_ttl() {
    let config = ClusterConfig { hibernate_after_ticks: HIBERNATE_AFTER_TICKS_ON, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(NamespaceFactory::default())).expect("cluster starts"));
    create_groups(&cluster, &[1]).await;
    wait_until("group 1 sleeps", Duration::from_secs(30), async || asleep_everywhere(&cluster, 1).await).await;
    // Time must pass here (the property is about a sleep longer than the TTL); nothing is
    // synchronised by it.
    let ttl_ms = Limits::default().session_ttl_ms_min;
    tokio::time::sleep(Duration::from_millis(ttl_ms + 500)).await;

    let command = Command {
        now_ms: 0,
        principal: String::new(),
        op: Some(CommandOp::CreateSession(CreateSession { ttl_ms, owner: String::new(), scope: String::new() })),
    }
    .encode_to_vec();
    // Everything between here and the leader's answer below may have used up part of the lease.
    let asked = Instant::now();
    let output = cluster.propose(1, command, TIMEOUT).await.expect("the session is created");
    let result = CommandResult::decode(output.as_slice()).expect("a command result");
    let Some(CommandOutcome::CreateSession(created)) = result.result else { panic!("not a session: {result:?}") };

    let leader = cluster.leader(1).await.expect("group 1 has a leader");
    let handle = cluster.handle(leader).expect("the leader runs");
    let request = LeaderRequest { principal: String::new(), request: Some(LeaderRequestKind::SessionInfo(created.session_id)) }.encode_to_vec();
    let answer = handle.leader_call(1, request, TIMEOUT).await.expect("session info from the leader");
    let response = LeaderResponse::decode(answer.as_slice()).expect("a leader response");
    let Some(LeaderResponseKind::SessionInfo(info)) = response.response else { panic!("not session info: {response:?}") };
    let lease = info.lease.expect("a lease");
    let elapsed_ms = asked.elapsed().as_millis() as u64;
    // The old code counted from when the group fell asleep: the lease had already run out.
    // A full TTL means all of it is left but what this test's own calls took; a lease cut
    // short by any more than that (half the TTL, say) fails here.
    assert!(lease.alive, "a session just opened is alive: {lease:?}");
    assert!(
        lease.remaining_ms + elapsed_ms >= ttl_ms,
        "a session just opened has its full TTL of {ttl_ms} ms less the {elapsed_ms} ms since it was asked for: {lease:?}"
    );
}
