//! Placement's view as metrics: groups and nodes by state and the repairs
//! running, reported by the placement leader (0 on the other nodes, so a sum over the
//! cluster counts each once).

use std::time::Duration;

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};
use warden_placement::{NodeState, Placement, PLACEMENT_GROUP_ID};

use super::service::PlacementService;

/// How often the placement leader refreshes the gauges.
pub const GAUGES_INTERVAL: Duration = Duration::from_secs(5);

/// The gauges, registered in a node's registry.
pub struct PlacementGauges {
    groups: IntGaugeVec,
    nodes: IntGaugeVec,
    repairs: IntGauge,
}

impl PlacementGauges {
    /// Makes the gauges and registers them in `registry`.
    pub fn register(registry: &Registry) -> Result<PlacementGauges, prometheus::Error> {
        let groups = IntGaugeVec::new(
            Opts::new("warden_placement_groups", "Shard groups by state (ready, creating, merging, retired), on the placement leader."),
            &["state"],
        )?;
        let nodes = IntGaugeVec::new(
            Opts::new("warden_placement_nodes", "Nodes by state (up, down, draining, decommissioning, tombstone), on the placement leader."),
            &["state"],
        )?;
        let repairs = IntGauge::new(
            "warden_placement_replica_moves_running",
            "Replica moves (repairs, drains, balancing) in flight, on the placement leader.",
        )?;
        registry.register(Box::new(groups.clone()))?;
        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(repairs.clone()))?;
        Ok(PlacementGauges { groups, nodes, repairs })
    }

    /// Sets the gauges from `state` (`None`: this node does not lead placement: zeros).
    fn set(&self, state: Option<&Placement>) {
        let groups = state.map(|s| s.groups().values().collect::<Vec<_>>()).unwrap_or_default();
        let count = |keep: &dyn Fn(&warden_placement::GroupInfo) -> bool| groups.iter().filter(|g| keep(g)).count() as i64;
        self.groups.with_label_values(&["ready"]).set(count(&|g| g.ready && !g.retired && g.merging.is_none()));
        self.groups.with_label_values(&["creating"]).set(count(&|g| !g.ready));
        self.groups.with_label_values(&["merging"]).set(count(&|g| g.merging.is_some()));
        self.groups.with_label_values(&["retired"]).set(count(&|g| g.retired));
        self.repairs.set(groups.iter().filter(|g| !g.learners.is_empty()).count() as i64);
        let nodes = state.map(|s| s.nodes().values().collect::<Vec<_>>()).unwrap_or_default();
        let count = |keep: &dyn Fn(&warden_placement::NodeInfo) -> bool| nodes.iter().filter(|n| keep(n)).count() as i64;
        self.nodes.with_label_values(&["up"]).set(count(&|n| n.up && n.state != NodeState::Tombstone));
        self.nodes.with_label_values(&["down"]).set(count(&|n| !n.up && n.state != NodeState::Tombstone));
        self.nodes.with_label_values(&["draining"]).set(count(&|n| n.state == NodeState::Draining));
        self.nodes.with_label_values(&["decommissioning"]).set(count(&|n| n.state == NodeState::Decommissioning));
        self.nodes.with_label_values(&["tombstone"]).set(count(&|n| n.state == NodeState::Tombstone));
    }
}

impl PlacementService {
    /// Every [`GAUGES_INTERVAL`], sets `gauges` from the placement state while this node
    /// leads the placement group (zeros otherwise).
    pub async fn report_gauges_periodically(self, gauges: PlacementGauges) {
        let mut ticker = tokio::time::interval(GAUGES_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let leads = self.node.leader_info(PLACEMENT_GROUP_ID).leader_id == self.node.node_id();
            let state = if leads { self.state().await.ok() } else { None };
            gauges.set(state.as_ref());
        }
    }
}
