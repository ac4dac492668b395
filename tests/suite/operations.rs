//! Operating a cluster of real processes.
//!
//! - `restarting_every_node_in_turn_under_load_costs_clients_nothing`: a rolling
//!   restart of all five `warden node`s under load. Each node in turn is sent SIGTERM (it
//!   hands every leadership to an up-to-date peer, refuses new calls, answers what is in
//!   flight, exits), restarted on its data, and waited for until it has caught up; clients
//!   of the library working through the router see no error and their session never expires.
//! - `warden_status_exits_non_zero_without_a_quorum_plus_one`: `warden status`
//!   shows each replica's lag and exits 0 with all five nodes, and with one SIGKILLed (a
//!   group's leader, once a request has made the group elect another); with
//!   two gone every group has fewer than a quorum plus one live voters: exit 3, naming them;
//!   back to 0 once they are restarted.

use std::time::Duration;

use crate::support::processes::{ProcessCluster, BIN, PLACEMENT_NODES, STEP_TIMEOUT};
use crate::support::workload::{ClientLoad, PREFIXES};
use serde_json::Value;
use warden_proto::v1::GetRequest;
use warden_testkit::wait_until;

/// The load's session: short, so a keepalive gap during a leader move would end it.
const SESSION_TTL: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_every_node_in_turn_under_load_costs_clients_nothing() {
    let mut cluster = ProcessCluster::start(&PREFIXES).await;
    let groups = cluster.shard_groups().await;
    let load = ClientLoad::start(cluster.router_addr(), SESSION_TTL).await;
    let mut transfers = 0;
    for id in cluster.node_ids() {
        let log = cluster.terminate(id).await;
        let drained = log.lines().rev().find(|line| line.contains(" drained ")).unwrap_or_else(|| panic!("node {id} logged no drain:\n{log}"));
        assert!(drained.contains("still_led=[]") && drained.contains("in_flight=0"), "node {id} stopped while it led or carried a write: {drained}");
        let field = drained.split("transfers=").nth(1).and_then(|rest| rest.split(' ').next());
        transfers += field.and_then(|n| n.parse::<u64>().ok()).unwrap_or_else(|| panic!("no transfers in {drained}"));
        cluster.restart(id);
        cluster.wait_caught_up(id, &groups).await;
    }
    let (operations, errors) = load.finish().await;
    assert!(transfers > 0, "no node led anything when it was stopped");
    assert!(operations > 100, "too few operations ran during the restarts ({operations})");
    assert!(errors.is_empty(), "the client library let errors through during the rolling restart ({operations} operations): {errors:?}");
}

/// `warden status --json` against `cluster`: its exit code and its output.
fn status(cluster: &ProcessCluster) -> (Option<i32>, Value) {
    let (code, value) = try_status(cluster);
    (code, value.unwrap_or_else(|output| panic!("warden status printed no JSON: {output}")))
}

/// [`status`], answering what it printed when that is not JSON (it failed to read the
/// routing table: the placement group may be electing a leader).
fn try_status(cluster: &ProcessCluster) -> (Option<i32>, Result<Value, String>) {
    let args = ["--json", "--endpoints", cluster.router_addr(), "status", "--nodes", cluster.seeds()];
    let output = std::process::Command::new(BIN).args(args).output().expect("run warden status");
    let value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("{e}: {}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)));
    (output.status.code(), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warden_status_exits_non_zero_without_a_quorum_plus_one() {
    let mut cluster = ProcessCluster::start(&PREFIXES).await;
    let groups = cluster.shard_groups().await;
    let (code, all_up) = wait_until("warden status says healthy", STEP_TIMEOUT, || async {
        let (code, value) = status(&cluster);
        (code == Some(0)).then_some((code, value))
    })
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(all_up["healthy"], true, "{all_up}");
    for group in all_up["groups"].as_array().expect("groups").iter().filter(|g| g["ready"] == true && g["prefix"] != "") {
        let states = group["replica_states"].as_array().expect("replica states");
        assert_eq!(states.len(), 5, "{group}");
        assert_eq!(states.iter().filter(|r| r["role"] == "leader").count(), 1, "one leader: {group}");
        assert!(states.iter().all(|r| r["answered"] == true && r["lag"].is_u64()), "every replica answers with its lag: {group}");
    }
    // One voter gone, a group's leader: a quorum plus one is still there. A group whose leader it was elects
    // another once a request reaches a follower (a sleeping group learns of the death no
    // other way; `Status` wakes none): as a client's first call would, a read of each
    // group's prefix through the router does that.
    let group = *groups.last().expect("a shard group");
    let first = cluster.group_leader(group, None).await.expect("the group has a leader");
    cluster.kill(first);
    let mut router = cluster.router();
    for prefix in std::iter::once("/").chain(PREFIXES) {
        let _ = router.get(GetRequest { path: prefix.into(), ..GetRequest::default() }).await;
    }
    let one_down = wait_until("one node down is tolerated", STEP_TIMEOUT, || async {
        match try_status(&cluster) {
            (Some(0), Ok(value)) => Some(value),
            _ => None,
        }
    })
    .await;
    assert_eq!(one_down["healthy"], true, "{one_down}");
    // Two gone: every five-voter group has three live voters, fewer than four.
    // The second is not a placement node, so placement keeps a quorum to answer with.
    let second = cluster.node_ids().into_iter().rev().find(|id| *id != first && !PLACEMENT_NODES.contains(id)).expect("another node");
    cluster.kill(second);
    let (code, two_down) = status(&cluster);
    assert_eq!(code, Some(3), "{two_down}");
    let problems = two_down["problems"].as_array().expect("problems");
    assert!(problems.len() >= groups.len(), "every shard group is named: {problems:?}");
    assert!(problems.iter().all(|p| p.as_str().is_some_and(|p| p.contains("live voters of 5") || p.contains("no leader"))), "{problems:?}");
    for id in [first, second] {
        cluster.restart(id);
        cluster.wait_caught_up(id, &groups).await;
    }
    wait_until("warden status says healthy again", STEP_TIMEOUT, || async { (status(&cluster).0 == Some(0)).then_some(()) }).await;
}
