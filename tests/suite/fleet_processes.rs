//! The placement leader's scheduler with real processes: six `warden node`s (a seventh joins in one test) and a
//! `warden router`, the placement leader's scheduler repairing, draining and balancing while
//! clients work through the router.
//!
//! - `a_node_killed_for_good_is_repaired_under_load_and_its_return_disturbs_nothing`: SIGKILL
//!   of a node for good under the crash workload (registers, creates, fenced locks); within
//!   `down_after` + 60 s every group has five live voters again, nothing acknowledged is lost,
//!   every hold stayed exclusive, the history is linearizable and the routing table's epochs
//!   only grew. Then the node is restarted on its data: it destroys its stale replicas
//!   without causing an election, and balancing fills it again.
//! - `a_drained_node_empties_under_load_and_decommission_makes_it_a_tombstone`: the client
//!   library sees no error while a node is drained; the node ends up hosting and leading
//!   nothing, and decommissioning makes it a tombstone.
//! - `a_seventh_node_gets_its_share_of_replicas_and_leaders`: a node that joins is filled to
//!   within one replica and one leadership of every other node.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::processes::{admin, ClusterOptions, ProcessCluster, PLACEMENT_NODES, STEP_TIMEOUT};
use crate::support::workload::{ClientLoad, Workload, PREFIXES};
use warden_proto::placement::{GetRoutingTableRequest, GroupEntry, NodeState, ReplicaStatusRequest, ReplicaStatusResponse, RoutingTable};
use warden_testkit::wait_until;

/// Nodes at the start.
const NODES: u64 = 6;
/// How long a node may be silent before its replicas are replaced (the default is 60 s).
const DOWN_AFTER_MS: u64 = 5_000;
/// What the issue allows a repair: `down_after` and 60 s more.
const REPAIR_WAIT: Duration = Duration::from_millis(DOWN_AFTER_MS + 60_000);
/// How long a drain, a decommission or a rebalance may take on a loaded machine.
const MOVES_WAIT: Duration = Duration::from_secs(120);
/// Voters per group.
const REPLICAS: usize = 5;

fn options() -> ClusterOptions {
    ClusterOptions { nodes: NODES, node_args: vec!["--down-after-ms".into(), DOWN_AFTER_MS.to_string()], hosts: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_for_good_is_repaired_under_load_and_its_return_disturbs_nothing() {
    let mut cluster = ProcessCluster::start_with(options(), &PREFIXES).await;
    let epochs = EpochWatch::start(&cluster);
    let workload = Workload::start(cluster.router_addr()).await;
    let before = table(&cluster).await;
    // A node outside placement (the placement group is not moved) hosting the most groups.
    let victim = (PLACEMENT_NODES.len() as u64 + 1..=NODES).max_by_key(|id| hosted(&before, *id).len()).expect("a node outside placement");
    let stale = hosted(&before, victim);
    assert!(!stale.is_empty(), "node {victim} hosts replicas: {before:?}");

    cluster.kill(victim);
    let killed_at = Instant::now();
    workload.log(format!("at {} ns: SIGKILL node {victim} for good (it hosts groups {stale:?})", workload.now()));
    let repaired = wait_until(&format!("every group has {REPLICAS} live voters, none on node {victim}"), REPAIR_WAIT, || async {
        let table = table(&cluster).await;
        table.groups.iter().all(|g| voters(g).len() == REPLICAS && !voters(g).contains(&victim) && g.learners.is_empty()).then_some(table)
    })
    .await;
    workload.log(format!("at {} ns: repaired {:?} after the kill", workload.now(), killed_at.elapsed()));
    assert_leaders_apply_the_table(&cluster, &repaired).await;
    workload.wait_writable().await;

    // The node comes back on its data. Balancing is paused so that the only thing that could
    // change a group's term now is the returning node.
    admin(&["scheduler", "pause", "--seeds", cluster.seeds()]);
    let terms = stable_terms(&cluster, &repaired).await;
    cluster.restart(victim);
    workload.log(format!("at {} ns: node {victim} restarted", workload.now()));
    wait_until(&format!("node {victim} destroys its replicas of {stale:?}"), STEP_TIMEOUT, || async {
        let mut hosting = Vec::new();
        for group in &stale {
            let mut node = cluster.placement(victim, Duration::from_secs(2));
            match node.replica_status(ReplicaStatusRequest { group_id: *group }).await {
                Ok(_) => hosting.push(*group),
                // Not answering yet (starting): not known to be gone.
                Err(status) if status.code() == tonic::Code::Unavailable => hosting.push(*group),
                Err(_) => {}
            }
        }
        hosting.is_empty().then_some(())
    })
    .await;
    wait_until(&format!("node {victim} is up in the table"), STEP_TIMEOUT, || async {
        table(&cluster).await.nodes.iter().any(|n| n.id == victim && n.up).then_some(())
    })
    .await;
    assert_eq!(terms_of(&cluster, &repaired).await, Some(terms), "the returning node caused an election");

    // Balancing fills the returned, empty node.
    admin(&["scheduler", "resume", "--seeds", cluster.seeds()]);
    let balanced = wait_balanced(&cluster, &format!("node {victim} is filled")).await;
    assert!(!hosted(&balanced, victim).is_empty(), "node {victim} hosts replicas again");
    workload.finish_and_check(&format!("node {victim} killed for good")).await;
    epochs.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_empties_under_load_and_decommission_makes_it_a_tombstone() {
    let cluster = ProcessCluster::start_with(options(), &PREFIXES).await;
    let before = table(&cluster).await;
    let drained = (PLACEMENT_NODES.len() as u64 + 1..=NODES).max_by_key(|id| hosted(&before, *id).len()).expect("a node outside placement");
    let hosted_before = hosted(&before, drained);
    let load = ClientLoad::start(cluster.router_addr(), Duration::from_secs(10)).await;

    admin(&["drain", &drained.to_string(), "--seeds", cluster.seeds()]);
    let empty = wait_until(&format!("node {drained} hosts nothing"), MOVES_WAIT, || async {
        let table = table(&cluster).await;
        let settled = table.groups.iter().all(|g| voters(g).len() == REPLICAS && g.learners.is_empty());
        (settled && hosted(&table, drained).is_empty()).then_some(table)
    })
    .await;
    assert_leaders_apply_the_table(&cluster, &empty).await;
    let state = node_state(&empty, drained);
    assert_eq!(state, Some(NodeState::Draining), "a drained node stays draining (and may be undrained)");

    admin(&["decommission", &drained.to_string(), "--seeds", cluster.seeds()]);
    wait_until(&format!("node {drained} is a tombstone"), MOVES_WAIT, || async {
        (node_state(&table(&cluster).await, drained) == Some(NodeState::Tombstone)).then_some(())
    })
    .await;
    // The node destroyed every replica it had: it answers for none of them.
    wait_until(&format!("node {drained} destroys its replicas of {hosted_before:?}"), STEP_TIMEOUT, || async {
        let mut hosting = Vec::new();
        for group in &hosted_before {
            let mut node = cluster.placement(drained, Duration::from_secs(2));
            if node.replica_status(ReplicaStatusRequest { group_id: *group }).await.is_ok() {
                hosting.push(*group);
            }
        }
        hosting.is_empty().then_some(())
    })
    .await;
    let (operations, errors) = load.finish().await;
    assert!(operations > 50, "too few operations ran during the drain ({operations})");
    assert!(errors.is_empty(), "the client library let errors through during the drain ({operations} operations): {errors:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seventh_node_gets_its_share_of_replicas_and_leaders() {
    let mut cluster = ProcessCluster::start_with(options(), &["/b", "/c", "/d", "/e", "/f"]).await;
    wait_balanced(&cluster, "six nodes balance").await;
    let joined = cluster.add_node();
    wait_until(&format!("node {joined} registers"), STEP_TIMEOUT, || async {
        table(&cluster).await.nodes.iter().any(|n| n.id == joined && n.up).then_some(())
    })
    .await;
    let balanced = wait_balanced(&cluster, &format!("node {joined} gets its share")).await;
    let replicas = hosted(&balanced, joined).len();
    let total: usize = balanced.groups.iter().map(|g| voters(g).len()).sum();
    assert!(replicas + 1 >= total / balanced.nodes.len(), "node {joined} hosts {replicas} of {total} replicas");
    assert_leaders_apply_the_table(&cluster, &balanced).await;
}

/// The routing table, from any placement node that answers.
async fn table(cluster: &ProcessCluster) -> RoutingTable {
    wait_until("the routing table", STEP_TIMEOUT, || async {
        for id in PLACEMENT_NODES {
            if let Ok(table) = cluster.placement(id, Duration::from_secs(2)).get_routing_table(GetRoutingTableRequest {}).await {
                return Some(table.into_inner());
            }
        }
        None
    })
    .await
}

fn voters(group: &GroupEntry) -> Vec<u64> {
    group.descriptor.as_ref().map(|d| d.replicas.clone()).unwrap_or_default()
}

fn group_id(group: &GroupEntry) -> u64 {
    group.descriptor.as_ref().map_or(0, |d| d.group_id)
}

/// The groups with a voter or a learner on `node`.
fn hosted(table: &RoutingTable, node: u64) -> Vec<u64> {
    table.groups.iter().filter(|g| voters(g).contains(&node) || g.learners.contains(&node)).map(group_id).collect()
}

fn node_state(table: &RoutingTable, node: u64) -> Option<NodeState> {
    table.nodes.iter().find(|n| n.id == node).and_then(|n| NodeState::try_from(n.state).ok())
}

/// The raft status of `group`'s leader, asked of its voters (`None`: no leader known now).
async fn leader_status(cluster: &ProcessCluster, group: &GroupEntry) -> Option<ReplicaStatusResponse> {
    let request = || ReplicaStatusRequest { group_id: group_id(group) };
    for voter in voters(group) {
        if !cluster.is_up(voter) {
            continue;
        }
        let Ok(status) = cluster.placement(voter, Duration::from_secs(2)).replica_status(request()).await else { continue };
        let leader = status.into_inner().leader_id;
        if leader == 0 || !cluster.is_up(leader) {
            continue;
        }
        if let Ok(status) = cluster.placement(leader, Duration::from_secs(2)).replica_status(request()).await {
            let status = status.into_inner();
            if status.leader_id == status.node_id {
                return Some(status);
            }
        }
    }
    None
}

/// Every group's leader has applied the voters the table names, and no learner.
async fn assert_leaders_apply_the_table(cluster: &ProcessCluster, table: &RoutingTable) {
    for group in &table.groups {
        let mut expected = voters(group);
        expected.sort_unstable();
        wait_until(&format!("group {}'s leader applies voters {expected:?}", group_id(group)), STEP_TIMEOUT, || async {
            let mut status = leader_status(cluster, group).await?;
            status.voters.sort_unstable();
            (status.voters == expected && status.learners.is_empty()).then_some(())
        })
        .await;
    }
}

/// Each group's (leader, term), or `None` if some group has no leader now.
async fn terms_of(cluster: &ProcessCluster, table: &RoutingTable) -> Option<BTreeMap<u64, (u64, u64)>> {
    let mut terms = BTreeMap::new();
    for group in &table.groups {
        let status = leader_status(cluster, group).await?;
        terms.insert(group_id(group), (status.leader_id, status.term));
    }
    Some(terms)
}

/// Each group's (leader, term) once two reads a scheduling round or two apart agree (a
/// leader transfer started before balancing was paused has finished by then).
async fn stable_terms(cluster: &ProcessCluster, table: &RoutingTable) -> BTreeMap<u64, (u64, u64)> {
    wait_until("every group keeps its leader and term", STEP_TIMEOUT, || async {
        let first = terms_of(cluster, table).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        (terms_of(cluster, table).await? == first).then_some(first)
    })
    .await
}

/// Waits until no move is in flight, every group has its voters, the serving nodes that are
/// up host numbers of replicas within one of each other, and lead numbers of groups within
/// one of each other; returns that table.
async fn wait_balanced(cluster: &ProcessCluster, what: &str) -> RoutingTable {
    wait_until(&format!("{what}: replicas and leaders balanced within one"), MOVES_WAIT, || async {
        let table = table(cluster).await;
        let settled = table.groups.iter().all(|g| voters(g).len() == REPLICAS && g.learners.is_empty());
        let serving: Vec<u64> = table.nodes.iter().filter(|n| n.up && n.state == NodeState::Serving as i32).map(|n| n.id).collect();
        let replicas: Vec<usize> = serving.iter().map(|id| hosted(&table, *id).len()).collect();
        let terms = terms_of(cluster, &table).await?;
        let leads: Vec<usize> = serving.iter().map(|id| terms.values().filter(|(leader, _)| leader == id).count()).collect();
        let within_one = |counts: &[usize]| counts.iter().max().zip(counts.iter().min()).is_some_and(|(max, min)| max - min <= 1);
        (settled && within_one(&replicas) && within_one(&leads)).then_some(table)
    })
    .await
}

/// Polls the routing table and records any epoch that went backwards: the table's version,
/// or a group's (conf_ver, version).
struct EpochWatch {
    stop: Arc<AtomicBool>,
    violations: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<usize>,
}

impl EpochWatch {
    fn start(cluster: &ProcessCluster) -> EpochWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let clients: Vec<_> = PLACEMENT_NODES.iter().map(|id| cluster.placement(*id, Duration::from_secs(2))).collect();
        let (stop_flag, found) = (stop.clone(), violations.clone());
        let task = tokio::spawn(async move {
            let mut seen: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            let (mut version, mut reads) = (0, 0);
            while !stop_flag.load(Ordering::Relaxed) {
                for mut client in clients.clone() {
                    let Ok(table) = client.get_routing_table(GetRoutingTableRequest {}).await else { continue };
                    let table = table.into_inner();
                    reads += 1;
                    let mut found = found.lock().expect("violations");
                    if table.version < version {
                        found.push(format!("routing version {} after {version}", table.version));
                    }
                    version = version.max(table.version);
                    for descriptor in table.groups.iter().filter_map(|g| g.descriptor.as_ref()) {
                        let epoch = (descriptor.conf_ver, descriptor.version);
                        let last = seen.entry(descriptor.group_id).or_insert(epoch);
                        if epoch < *last {
                            found.push(format!("group {}: epoch {epoch:?} after {last:?}", descriptor.group_id));
                        }
                        *last = (*last).max(epoch);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            reads
        });
        EpochWatch { stop, violations, task }
    }

    fn check(self) {
        self.stop.store(true, Ordering::SeqCst);
        let violations = self.violations.lock().expect("violations").clone();
        assert!(violations.is_empty(), "epochs went backwards: {violations:?}");
        self.task.abort();
    }
}
