//! The state machines of a shard-node's groups: the placement group gets the placement state
//! machine, every other group a namespace.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use warden_placement::{PlacementConfig, PLACEMENT_GROUP_ID};

use super::PlacementStateMachine;
use warden_engine::state_machine::{StateMachine, StateMachineFactory};
use warden_namespace::NamespaceFactory;

/// Creates the placement group's state machine and the namespace of every shard group.
#[derive(Default)]
pub struct ShardNodeFactory {
    /// Shard groups' namespaces (limits, watch hubs).
    pub namespace: NamespaceFactory,
    /// The placement group's configuration (replicas per group, heartbeat timeout).
    pub placement: PlacementConfig,
    /// Each node's applied routing version (one factory may serve several in-process nodes).
    pub routing_versions: RoutingVersions,
}

/// The routing version each node's placement replica has applied, published after the
/// apply write, for `WatchRoutingTable`.
#[derive(Clone, Default)]
pub struct RoutingVersions {
    senders: Arc<Mutex<HashMap<u64, watch::Sender<u64>>>>,
}

impl RoutingVersions {
    /// Node `node_id`'s channel (made on first use).
    pub fn sender(&self, node_id: u64) -> watch::Sender<u64> {
        self.senders.lock().unwrap_or_else(|e| e.into_inner()).entry(node_id).or_insert_with(|| watch::channel(0).0).clone()
    }
}

impl StateMachineFactory for ShardNodeFactory {
    fn create(&self, node_id: u64, group: u64) -> Box<dyn StateMachine> {
        if group == PLACEMENT_GROUP_ID {
            Box::new(PlacementStateMachine::new(self.placement.clone()).publishing_to(self.routing_versions.sender(node_id)))
        } else {
            self.namespace.create(node_id, group)
        }
    }
}
