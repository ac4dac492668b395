//! A node's heartbeats to the placement group: every `placement_heartbeat_ms` the node sends
//! `Heartbeat` (which also registers it) to the placement leader as best it knows it: the
//! leader its own placement replica sees, else the last NOT_LEADER hint, else each known
//! node in turn. Failures are expected (no placement yet, elections) and only logged. The
//! heartbeat names the groups the node leads (the placement leader balances leaders by them);
//! the answer lists every registered node, whose addresses the node learns (a node that joined
//! after this one started is reachable for raft messages once placement knows it). The
//! heartbeat also lists the groups the node hosts; the answer names those placement no longer
//! has (a removed group, a creation rolled back), and the node destroys its replicas of them:
//! such a group has no member left to tell a replica it was removed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::channel::{ChannelCache, ChannelSettings};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::HeartbeatRequest;
use warden_proto::tls::{Expected, Tls};

use warden_access::{acl_from_proto, AclCache};

use super::limits::ClusterLimits;
use crate::service::error_of;
use warden_engine::error::EngineError;
use warden_engine::host::NodeHandle;
use warden_engine::transport::PeerDirectory;

/// Groups listed in one heartbeat, at most (led and hosted each).
pub const GROUPS_PER_HEARTBEAT_MAX: usize = 100_000;

/// What a node hears from placement in its heartbeat answers.
#[derive(Clone)]
pub struct Heard {
    /// The ACL: each answer with a newer one updates it, so a grant or revoke reaches this
    /// node's checks within a heartbeat or two.
    pub acl: Arc<AclCache>,
    /// The cluster's apply limits, likewise (`limits.rs`).
    pub limits: Arc<ClusterLimits>,
    /// Set once placement has answered a heartbeat (the node is registered, knows its
    /// peers and the ACL): its health says SERVING from then on.
    pub answered: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Heard {
    fn default() -> Self {
        Heard { acl: Arc::default(), limits: Arc::default(), answered: Arc::new(tokio::sync::watch::Sender::new(false)) }
    }
}

/// Sends heartbeats until the runtime it runs on stops (with `tls`, to nodes proving their
/// identity, as the node `tls` names), keeping `heard` current.
pub async fn run(
    node: NodeHandle,
    directory: Arc<PeerDirectory>,
    addr: SocketAddr,
    zone: String,
    interval: Duration,
    tls: Option<Arc<Tls>>,
    heard: Heard,
) {
    let mut hint: Option<u64> = None;
    let mut turn = 0usize;
    // One connection per target, kept across heartbeats; a heartbeat is bounded by its interval.
    let settings = ChannelSettings::new(Expected::AnyNode).with_connect_timeout(interval).with_request_timeout(interval);
    let channels = ChannelCache::new(tls, settings);
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
        let Ok(channel) = channels.get(&target_addr.to_string()) else { continue };
        let mut client = PlacementClient::new(channel);
        let shard_groups = |groups: Vec<u64>| -> Vec<u64> {
            groups.into_iter().filter(|group| *group != PLACEMENT_GROUP_ID).take(GROUPS_PER_HEARTBEAT_MAX).collect()
        };
        let (led_groups, hosted_groups) = (shard_groups(node.led_groups()), shard_groups(node.hosted_groups()));
        let request = HeartbeatRequest {
            node_id: node.node_id(),
            addr: addr.to_string(),
            zone: zone.clone(),
            led_groups,
            hosted_groups,
            acl_version: heard.acl.version(),
            limits_version: heard.limits.version(),
        };
        match client.heartbeat(request).await {
            Ok(response) => {
                hint = target;
                let response = response.into_inner();
                if let Some(newer) = response.acl {
                    heard.acl.offer(acl_from_proto(newer));
                }
                if let Some(newer) = response.limits {
                    heard.limits.offer(newer);
                }
                heard.answered.send_replace(true);
                for group in response.removed_groups.into_iter().filter(|group| *group != PLACEMENT_GROUP_ID) {
                    if let Err(error) = node.destroy_group(group).await {
                        tracing::debug!(group, %error, "could not destroy the replica of a removed group");
                    }
                }
                // A replica a group creation went on without (this node was out of reach):
                // created as `CreateReplica` would have, idempotently.
                for missing in response.missing_replicas.into_iter().filter(|m| m.group_id != PLACEMENT_GROUP_ID) {
                    match node.create_group(missing.group_id, missing.voters).await {
                        Ok(()) => tracing::info!(group = missing.group_id, "created a replica placement has this node hold and it lacked"),
                        Err(EngineError::GroupExists(_)) => {}
                        Err(error) => tracing::debug!(group = missing.group_id, %error, "could not create a missing replica"),
                    }
                }
                for peer in response.nodes {
                    // This node's own address is what it listens on, whatever placement says.
                    if peer.id == node.node_id() || peer.id == 0 {
                        continue;
                    }
                    match peer.addr.parse::<SocketAddr>() {
                        Ok(peer_addr) if directory.get(peer.id) != Some(peer_addr) => directory.insert(peer.id, peer_addr),
                        Ok(_) => {}
                        Err(error) => tracing::debug!(peer = peer.id, addr = %peer.addr, %error, "placement lists an address that does not parse"),
                    }
                }
            }
            Err(status) => {
                hint = error_of(&status).map(|e| e.leader_id).filter(|id| *id != 0);
                tracing::debug!(node = node.node_id(), %status, "placement heartbeat");
            }
        }
    }
}
