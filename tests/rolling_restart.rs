//! Issue 18 item 5 with real processes: a rolling restart of all five `warden node`s under
//! load. Each node in turn is sent SIGTERM (it hands every leadership to an up-to-date peer,
//! refuses new calls, answers what is in flight, exits), restarted on its data, and waited
//! for until it has caught up; clients of the library working through the router see no
//! error and their session never expires.

mod support;

use std::time::Duration;

use support::processes::ProcessCluster;
use support::workload::{ClientLoad, PREFIXES};

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
