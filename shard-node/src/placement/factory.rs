//! The state machines of a shard-node's groups: the placement group gets the placement state
//! machine, every other group a namespace.

use warden_placement::{PlacementConfig, PLACEMENT_GROUP_ID};

use super::PlacementStateMachine;
use crate::namespace::NamespaceFactory;
use crate::state_machine::{StateMachine, StateMachineFactory};
use crate::watch::WatchHubs;

/// Creates the placement group's state machine and the namespace of every shard group.
#[derive(Default)]
pub struct ShardNodeFactory {
    /// Shard groups' namespaces (limits, watch hubs).
    pub namespace: NamespaceFactory,
    /// The placement group's configuration (replicas per group, heartbeat timeout).
    pub placement: PlacementConfig,
}

impl StateMachineFactory for ShardNodeFactory {
    fn create(&self, node_id: u64, group: u64) -> Box<dyn StateMachine> {
        if group == PLACEMENT_GROUP_ID {
            Box::new(PlacementStateMachine::new(self.placement.clone()))
        } else {
            self.namespace.create(node_id, group)
        }
    }

    fn watch_hubs(&self) -> Option<WatchHubs> {
        self.namespace.watch_hubs()
    }
}
