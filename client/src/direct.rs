//! Calls sent straight to the node leading the group that serves them, when the client is
//! given node addresses ([`ClientConfig::nodes`](crate::ClientConfig::nodes)): the routing
//! table is read from those nodes (then from every node it names), and a call one group
//! serves goes to that group's leader as last seen, with the group's id and epoch in its
//! routing — what a router would send, one hop and one process fewer (the Oxia and TiKV
//! clients work this way).
//!
//! The router stays the way for everything else, and for any call this module cannot place:
//! - what a router does beyond forwarding one call to one group: listings and recursive
//!   deletes that span groups, transactions whose paths the table places in different groups
//!   (the router refuses them typed), sessions created and closed (the router spreads them
//!   over the groups), keepalive streams and watches; a keepalive goes direct when its
//!   sessions share a home group (the client sends one per home group, see `crate::renewal`);
//! - a call whose group the table does not know, or whose node it cannot reach: the attempt
//!   after a failed connection, a WRONG_GROUP (the table is read again, at most once per
//!   [`TABLE_REFRESH_INTERVAL_MIN`], in the background: no call waits for it) or a table that
//!   cannot be read goes to a router.
//!
//! The retry rule is the same either way (`warden_proto::follow`): a NOT_LEADER naming the
//! leader is followed to it; a write whose connection failed after it was sent is never sent
//! again. A WRONG_GROUP proves the node applied nothing, so the call goes again, through a
//! router.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::Status;
use warden_proto::channel::{ChannelCache, ChannelSettings, NODE_PINGS};
use warden_proto::follow::Fault;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::GetRoutingTableRequest;
use warden_proto::routing::{GroupRoute, Suspects, Table, Target};
use warden_proto::tls::Expected;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::Routing;

/// Longest one node may take to send the routing table before the next is asked.
const TABLE_FETCH_MAX: Duration = Duration::from_secs(2);
/// Shortest time between two reads of the routing table: calls that find it stale or
/// unreadable meanwhile go through the routers, so a node that cannot answer is not asked
/// once per call.
pub const TABLE_REFRESH_INTERVAL_MIN: Duration = Duration::from_secs(1);

/// Where one attempt goes: a node of the group, with the group's routing.
#[derive(Clone)]
pub(crate) struct Hop {
    group: u64,
    node: u64,
    /// The group's replicas as the table says.
    replicas: Vec<u64>,
    /// The group's id and epoch, for the request.
    pub routing: Routing,
    /// A client of the node.
    pub client: WardenClient<Channel>,
}

/// The table as read last, and when it was asked for.
struct Held {
    table: Arc<Table>,
    /// When a read was last started (`None`: never).
    asked_at: Option<Instant>,
    /// A call found the table stale (WRONG_GROUP): read it again when the interval allows.
    stale: bool,
}

/// The client's view of the cluster for direct calls.
pub(crate) struct Direct {
    seeds: Vec<String>,
    held: RwLock<Held>,
    /// A read of the table is under way (one at a time, in the background).
    reading: AtomicBool,
    /// The node that last answered for each group (its leader, as far as the client knows);
    /// only groups of the table are kept.
    leaders: Mutex<HashMap<u64, u64>>,
    /// Nodes that lately left a call unanswered until its deadline.
    suspects: Suspects,
    channels: ChannelCache,
}

impl Direct {
    /// A view that reads the table from `seeds` (node addresses), opening connections within
    /// `connect_timeout`.
    pub(crate) fn new(seeds: Vec<String>, connect_timeout: Duration) -> Direct {
        let settings = ChannelSettings::new(Expected::AnyNode).with_connect_timeout(connect_timeout).with_keepalive(NODE_PINGS);
        Direct {
            seeds,
            held: RwLock::new(Held { table: Arc::new(Table::default()), asked_at: None, stale: true }),
            reading: AtomicBool::new(false),
            leaders: Mutex::new(HashMap::new()),
            suspects: Suspects::default(),
            channels: ChannelCache::new(None, settings),
        }
    }

    /// Where attempt `attempt` of a call for `target` goes; `None`: to a router (the table
    /// does not place it, or cannot be read now).
    pub(crate) fn hop(self: &Arc<Self>, target: Target<'_>, attempt: usize) -> Option<Hop> {
        let table = self.table();
        let group = resolve(&table, target)?;
        let replicas = &group.descriptor.replicas;
        if replicas.is_empty() {
            return None;
        }
        let known = self.leaders.lock().unwrap_or_else(|e| e.into_inner()).get(&group.id()).copied();
        let node = self.suspects.pick(replicas, known, attempt)?;
        let channel = self.channels.get(table.addr(node)?).ok()?;
        let client = WardenClient::new(channel).max_decoding_message_size(warden_proto::RESPONSE_BYTES_MAX);
        let routing = Routing { group_id: group.id(), conf_ver: group.descriptor.conf_ver, version: group.descriptor.version };
        Some(Hop { group: group.id(), node, replicas: replicas.clone(), routing, client })
    }

    /// `hop`'s node answered: it leads the group.
    pub(crate) fn answered(&self, hop: &Hop) {
        self.leaders.lock().unwrap_or_else(|e| e.into_inner()).insert(hop.group, hop.node);
        self.suspects.clear(hop.node);
    }

    /// `hop`'s node left the call unanswered until its deadline (silence, not a refusal):
    /// the next calls try the group's other replicas first.
    pub(crate) fn unanswered(&self, hop: &Hop) {
        self.suspects.suspect(hop.node);
        let mut leaders = self.leaders.lock().unwrap_or_else(|e| e.into_inner());
        if leaders.get(&hop.group) == Some(&hop.node) {
            leaders.remove(&hop.group);
        }
    }

    /// Learns from a failed attempt at `hop`; answers whether the next attempt may go direct
    /// too (a NOT_LEADER or UNAVAILABLE from the group: yes; anything else, or a leader the
    /// table does not know as a replica: a router's turn, and the table is read again).
    pub(crate) fn failed(&self, hop: &Hop, status: &Status) -> bool {
        let mut leaders = self.leaders.lock().unwrap_or_else(|e| e.into_inner());
        match Fault::of(status) {
            Fault::NotLeader { leader: Some(leader) } if leader != hop.node && hop.replicas.contains(&leader) => {
                leaders.insert(hop.group, leader);
                true
            }
            Fault::NotLeader { leader: Some(leader) } if leader != hop.node => {
                // The replicas moved since the table was read.
                leaders.remove(&hop.group);
                self.held.write().unwrap_or_else(|e| e.into_inner()).stale = true;
                false
            }
            Fault::NotLeader { .. } | Fault::Unavailable => {
                leaders.remove(&hop.group);
                true
            }
            Fault::Answer { code: Some(Code::WrongGroup) } => {
                self.held.write().unwrap_or_else(|e| e.into_inner()).stale = true;
                false
            }
            _ => {
                leaders.remove(&hop.group);
                false
            }
        }
    }

    /// The table held now; when it is stale (or was never read) and the interval allows,
    /// a read of it starts in the background (one at a time): no call waits for the table,
    /// and calls it cannot place meanwhile go through the routers.
    pub(crate) fn table(self: &Arc<Self>) -> Arc<Table> {
        let (table, due) = {
            let held = self.held.read().unwrap_or_else(|e| e.into_inner());
            let due = held.stale && held.asked_at.is_none_or(|at| at.elapsed() >= TABLE_REFRESH_INTERVAL_MIN);
            (held.table.clone(), due)
        };
        if due && self.reading.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.held.write().unwrap_or_else(|e| e.into_inner()).asked_at = Some(Instant::now());
            let direct = self.clone();
            let held = table.clone();
            tokio::spawn(async move {
                direct.refresh(&held).await;
                direct.reading.store(false, Ordering::Release);
            });
        }
        table
    }

    /// Reads the table and installs it unless the one held is newer.
    async fn refresh(&self, held: &Table) {
        match self.read_table(held).await {
            Ok(read) => {
                let read = Arc::new(Table::from_proto(read));
                let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
                if read.version >= held.table.version {
                    let mut leaders = self.leaders.lock().unwrap_or_else(|e| e.into_inner());
                    leaders.retain(|group, _| read.group(*group).is_some());
                    held.table = read;
                    held.stale = false;
                }
            }
            Err(error) => tracing::debug!(%error, "could not read the routing table; calls go through the routers"),
        }
    }

    /// The routing table from the first node that sends it (seeds first, then the nodes the
    /// table held names).
    async fn read_table(&self, held: &Table) -> Result<warden_proto::placement::RoutingTable, Status> {
        let mut last_error = Status::unavailable("no node address to read the routing table from");
        for addr in self.seeds.iter().cloned().chain(held.addrs()) {
            let channel = self.channels.get(&addr).map_err(|e| Status::invalid_argument(format!("address {addr}: {e}")))?;
            let mut request = tonic::Request::new(GetRoutingTableRequest {});
            request.set_timeout(TABLE_FETCH_MAX);
            match tokio::time::timeout(TABLE_FETCH_MAX, PlacementClient::new(channel).get_routing_table(request)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => last_error = status,
                Err(_) => last_error = Status::unavailable(format!("{addr} did not send the routing table in {TABLE_FETCH_MAX:?}")),
            }
        }
        Err(last_error)
    }
}

/// The group `target` names in `table`, if one group serves it all (a transaction across
/// groups is left to a router, which refuses it typed).
fn resolve<'t>(table: &'t Table, target: Target<'_>) -> Option<&'t GroupRoute> {
    table.resolve(target).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::placement::{GroupEntry, NodeEntry, RoutingTable};
    use warden_proto::v1::GroupDescriptor;

    fn table() -> Table {
        let entry = |id: u64, prefix: &str| GroupEntry {
            descriptor: Some(GroupDescriptor { group_id: id, prefix: prefix.into(), replicas: vec![1, 2], ..GroupDescriptor::default() }),
            ready: true,
            ..GroupEntry::default()
        };
        Table::from_proto(RoutingTable {
            version: 1,
            nodes: vec![NodeEntry { id: 1, addr: "a:1".into(), ..NodeEntry::default() }],
            groups: vec![entry(1, "/"), entry(2, "/a")],
            ..RoutingTable::default()
        })
    }

    /// A transaction goes direct only when one group serves every path it touches.
    #[test]
    fn a_transaction_across_groups_is_left_to_a_router() {
        let table = table();
        assert_eq!(resolve(&table, Target::Paths(&["/a/x", "/a/y"])).map(GroupRoute::id), Some(2));
        assert_eq!(resolve(&table, Target::Paths(&[])).map(GroupRoute::id), Some(1));
        assert!(resolve(&table, Target::Paths(&["/a/x", "/b"])).is_none(), "two groups: the router's refusal");
        assert_eq!(resolve(&table, Target::Path("/b/c")).map(GroupRoute::id), Some(1));
    }

    /// NOT_LEADER naming the leader is followed; WRONG_GROUP and lost connections hand the
    /// call to a router, and WRONG_GROUP marks the table stale.
    #[tokio::test]
    async fn failures_teach_the_leader_or_hand_over_to_a_router() {
        let direct = Arc::new(Direct::new(vec!["a:1".into()], Duration::from_secs(1)));
        direct.held.write().unwrap().table = Arc::new(table());
        direct.held.write().unwrap().stale = false;
        let hop = direct.hop(Target::Path("/a/x"), 0).expect("the table places /a/x");
        assert_eq!((hop.group, hop.node, hop.routing.group_id), (2, 1, 2));
        let not_leader = warden_proto::status(warden_proto::v1::WardenError {
            leader_id: 2,
            ..warden_proto::warden_error(Code::NotLeader, "/a/x", "not the leader")
        });
        assert!(direct.failed(&hop, &not_leader), "a NOT_LEADER keeps the call direct");
        assert_eq!(direct.leaders.lock().unwrap().get(&2), Some(&2), "the hinted leader is remembered");
        let moved = warden_proto::status(warden_proto::v1::WardenError {
            leader_id: 9,
            ..warden_proto::warden_error(Code::NotLeader, "/a/x", "not the leader")
        });
        assert!(!direct.failed(&hop, &moved), "a leader the table does not list goes to a router");
        assert!(direct.held.read().unwrap().stale, "and the table is read again");
        direct.held.write().unwrap().stale = false;
        let wrong = warden_proto::status(warden_proto::warden_error(Code::WrongGroup, "/a/x", "moved"));
        assert!(!direct.failed(&hop, &wrong), "a WRONG_GROUP goes to a router");
        assert!(direct.held.read().unwrap().stale, "and the table is read again");
        assert!(!direct.failed(&hop, &Status::unknown("connection reset")), "a lost connection goes to a router");
    }
}
