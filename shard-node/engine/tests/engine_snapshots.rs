//! Snapshots larger than one gRPC message: a follower far behind a group
//! with tens of MiB of data catches up by a snapshot streamed in chunks on a flow of its own,
//! while the other groups of the same nodes keep their leaders.

use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_engine::kv::{self, KvFactory};
use warden_engine::ReadConsistency;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_testkit::wait_until;

const TIMEOUT: Duration = Duration::from_secs(30);
const NODES: [u64; 3] = [1, 2, 3];
/// Values as large as the kv state machine takes (1 MiB), so 66 of them make a group of more
/// than 64 MiB with few entries to write.
const VALUE_BYTES: usize = kv::VALUE_BYTES_MAX;
const VALUES: usize = 66;

fn value(i: usize) -> Vec<u8> {
    (0..VALUE_BYTES).map(|j| (j.wrapping_mul(31) ^ i.wrapping_mul(7919)) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_catches_up_from_a_64_mib_snapshot_while_other_groups_keep_their_leader() {
    // A short log (compacted past 16 applied entries) so that the follower needs a snapshot.
    let config = ClusterConfig { nodes: 3, log_compact_entries: 16, ..ClusterConfig::default() };
    let cluster = Arc::new(Cluster::start(config, Arc::new(KvFactory)).expect("cluster starts"));
    for group in [1, 2] {
        cluster.create_group(group, &NODES).await.expect("group created");
    }
    let leader = cluster.wait_leader(1, TIMEOUT).await.expect("group 1 leader");
    // The other group is led from the same node (the same worker thread, the default of one
    // per node), the node that builds and sends the snapshot: the hardest place to keep it.
    wait_until("group 2 led by group 1's leader", TIMEOUT, async || match cluster.leader(2).await {
        Some(current) if current == leader => true,
        Some(current) => {
            let _ = cluster.handle(current).expect("node").transfer_leader(2, leader).await;
            false
        }
        None => false,
    })
    .await;
    let lagging = NODES.into_iter().find(|node| *node != leader).expect("a follower");
    cluster.propose(1, kv::put(b"before", b"1"), TIMEOUT).await.expect("write");
    let lagging_last = cluster.handle(lagging).expect("node").status(1).await.expect("status").last_index;
    cluster.faults().isolate(lagging, &NODES);

    // Over 64 MiB into group 1, a few writes at a time.
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..4 {
        let cluster = cluster.clone();
        writers.spawn(async move {
            for i in (writer..VALUES).step_by(4) {
                let command = kv::put(format!("v{i:03}").as_bytes(), &value(i));
                cluster.propose(1, command, TIMEOUT).await.expect("large write on a majority");
            }
        });
    }
    while let Some(result) = writers.join_next().await {
        result.expect("writer");
    }
    let output = cluster.propose(1, kv::put(b"after", b"2"), TIMEOUT).await.expect("write");
    let last_index = kv::decode_result(&output).expect("result").applied_index;
    eprintln!("wrote {VALUES} MiB in {:?}", started.elapsed());
    let leader_status = cluster.handle(leader).expect("leader").status(1).await.expect("status");
    assert_eq!(leader_status.leader_id, leader, "group 1 kept its leader while the follower was away");
    assert!(
        leader_status.first_index > lagging_last + 1,
        "the leader compacted past the lagging follower (first {} vs its last {lagging_last}), so it needs a snapshot",
        leader_status.first_index
    );
    let other = cluster.handle(leader).expect("leader").status(2).await.expect("group 2 status");
    assert!(other.is_leader);

    cluster.faults().heal();
    let started = Instant::now();
    let follower = cluster.handle(lagging).expect("lagging node");
    wait_until("the lagging follower to apply up to the leader's index", Duration::from_secs(60), async || {
        follower.status(1).await.is_ok_and(|status| status.applied >= last_index)
    })
    .await;
    eprintln!("caught up in {:?}", started.elapsed());
    let status = follower.status(1).await.expect("status");
    assert!(status.first_index > lagging_last + 1, "the follower's log starts after a snapshot, not a replay");
    // The metrics count it on both sides, with its bytes (over 64 MiB).
    let counted = |node: u64, direction: &str| {
        let text = cluster.handle(node).expect("node").metrics().render();
        let value = |name: String| {
            text.lines().find_map(|line| line.strip_prefix(name.as_str())).and_then(|v| v.trim().parse::<f64>().ok()).unwrap_or_default()
        };
        let delivered = value(format!("warden_raft_snapshots_total{{direction=\"{direction}\",outcome=\"delivered\"}}"));
        (delivered, value(format!("warden_raft_snapshot_bytes_total{{direction=\"{direction}\"}}")))
    };
    let (sent, sent_bytes) = counted(leader, "sent");
    let (received, received_bytes) = counted(lagging, "received");
    assert!(sent >= 1.0 && received >= 1.0, "snapshots delivered: {sent} sent, {received} received");
    assert!(sent_bytes >= (64 << 20) as f64 && received_bytes >= (64 << 20) as f64, "{sent_bytes} bytes sent, {received_bytes} received");

    // Its data is the leader's.
    for i in 0..VALUES {
        let bytes = follower.read(1, kv::get(format!("v{i:03}").as_bytes()), ReadConsistency::Stale, TIMEOUT).await.expect("stale read");
        let got = kv::decode_value(&bytes).expect("value").value;
        assert!(got.as_deref() == Some(value(i).as_slice()), "value v{i:03} on the caught-up follower differs");
    }
    let bytes = follower.read(1, kv::get(b"after"), ReadConsistency::Stale, TIMEOUT).await.expect("stale read");
    assert_eq!(kv::decode_value(&bytes).expect("value").value.as_deref(), Some(&b"2"[..]));

    // The other group never held an election: same leader, same term, on every node.
    for node in NODES {
        let status = cluster.handle(node).expect("node").status(2).await.expect("group 2 status");
        assert_eq!((status.leader_id, status.term), (leader, other.term), "group 2 on node {node} saw an election during the transfer");
    }
}
