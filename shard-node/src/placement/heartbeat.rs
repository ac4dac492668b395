//! A node's heartbeats to the placement group: every `placement_heartbeat_ms` the node sends
//! `Heartbeat` (which also registers it) to the placement leader as best it knows it: the
//! leader its own placement replica sees, else the last NOT_LEADER hint, else each known
//! node in turn. Failures are expected (no placement yet, elections) and only logged.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::HeartbeatRequest;

use crate::host::NodeHandle;
use crate::service::error_of;
use crate::transport::PeerDirectory;

/// Sends heartbeats until the runtime it runs on stops.
pub async fn run(node: NodeHandle, directory: Arc<PeerDirectory>, addr: SocketAddr, zone: String, interval: Duration) {
    let mut hint: Option<u64> = None;
    let mut turn = 0usize;
    let mut channels: std::collections::HashMap<SocketAddr, tonic::transport::Channel> = std::collections::HashMap::new();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let local = Some(node.leader_info(PLACEMENT_GROUP_ID).leader_id).filter(|id| *id != 0);
        let target = local.or(hint).or_else(|| {
            let ids = directory.ids();
            turn = turn.wrapping_add(1);
            ids.get(turn % ids.len().max(1)).copied()
        });
        let Some(target_addr) = target.and_then(|id| directory.get(id)) else { continue };
        // One connection per target, kept across heartbeats.
        let channel = match channels.get(&target_addr) {
            Some(channel) => channel.clone(),
            None => {
                let Ok(endpoint) = tonic::transport::Channel::from_shared(format!("http://{target_addr}")) else { continue };
                let channel = endpoint.connect_timeout(interval).timeout(interval).connect_lazy();
                channels.insert(target_addr, channel.clone());
                channel
            }
        };
        let mut client = PlacementClient::new(channel);
        let request = HeartbeatRequest { node_id: node.node_id(), addr: addr.to_string(), zone: zone.clone() };
        match client.heartbeat(request).await {
            Ok(_) => hint = target,
            Err(status) => {
                hint = error_of(&status).map(|e| e.leader_id).filter(|id| *id != 0);
                tracing::debug!(node = node.node_id(), %status, "placement heartbeat");
            }
        }
    }
}
