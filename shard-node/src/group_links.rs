//! How a shard-node reaches other shard groups: the routing table (read from any node that
//! answers, again when it names no such group or a call finds it stale), a channel per node
//! ([`ChannelCache`]), and the leader-following retry rule of `warden_proto::follow`, plus the
//! test fault hook that cuts calls between two groups ([`NetFaults::cut_group_link`]). Used
//! today by sessions across groups: a group holding a remote session's ephemerals asks the
//! session's home group about it, and by quota shares, asked of the placement leader.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;
use warden_placement::home_group;
use warden_proto::channel::{ChannelCache, ChannelSettings};
use warden_proto::follow::{bounded, CallKind, Fault, Follow};
use warden_proto::namespace::session_check_client::SessionCheckClient;
use warden_proto::namespace::{CheckSessionsRequest, EndSessionsRequest};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{GetRoutingTableRequest, RequestQuotaRequest, RoutingTable};
use warden_proto::tls::Tls;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{GroupDescriptor, Routing};

use warden_engine::transport::{NetFaults, PeerDirectory};

/// Longest one node may take to send the routing table before the next is asked.
const TABLE_FETCH_MAX: Duration = Duration::from_secs(2);

/// A home group's answer about some of its sessions.
#[derive(Debug, Default)]
pub struct AliveSessions {
    /// The live ones (noted, when asked to note), with their owners.
    pub alive: Vec<(u64, String)>,
    /// Live ones it could not note: each already notes as many other groups as it may.
    pub holders_full: Vec<u64>,
}

impl AliveSessions {
    /// Whether the home group answered `session` alive (noted or not).
    pub fn is_live(&self, session: u64) -> bool {
        self.alive.iter().any(|(alive, _)| *alive == session) || self.holders_full.contains(&session)
    }
}

/// Calls from one node's groups to other groups.
pub struct GroupLinks {
    directory: Arc<PeerDirectory>,
    faults: Arc<NetFaults>,
    channels: ChannelCache,
    /// The routing table as last read (`None`: not yet).
    table: Mutex<Option<Arc<RoutingTable>>>,
}

impl GroupLinks {
    /// Links that find the cluster through the nodes in `directory` (with `tls`, as the node
    /// it names).
    pub fn new(directory: Arc<PeerDirectory>, faults: Arc<NetFaults>, tls: Option<Arc<Tls>>) -> GroupLinks {
        GroupLinks { directory, faults, channels: ChannelCache::new(tls, ChannelSettings::to_nodes()), table: Mutex::new(None) }
    }

    /// A (lazily connected) channel to the node at `addr`.
    fn channel(&self, addr: &str) -> Result<tonic::transport::Channel, Status> {
        self.channels.get(addr).map_err(|e| Status::invalid_argument(format!("address {addr}: {e}")))
    }

    /// Reads the routing table again from the first node that sends it (the nodes this node
    /// knows, then those the last table named), by `deadline`; a node that does not answer
    /// within [`TABLE_FETCH_MAX`] (paused, partitioned) is passed over.
    async fn refresh(&self, deadline: Instant) -> Result<Arc<RoutingTable>, Status> {
        let held = self.table.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let known = self.directory.ids().into_iter().filter_map(|id| self.directory.get(id)).map(|addr| addr.to_string());
        let named = held.iter().flat_map(|table| table.nodes.iter().map(|node| node.addr.clone()));
        let mut last = Status::unavailable("no node to read the routing table from");
        for addr in known.chain(named).collect::<Vec<_>>() {
            let mut placement = PlacementClient::new(self.channel(&addr)?);
            let call = placement.get_routing_table(bounded(GetRoutingTableRequest {}, deadline));
            match tokio::time::timeout_at(deadline.min(Instant::now() + TABLE_FETCH_MAX), call).await {
                Ok(Ok(response)) => {
                    let table = Arc::new(response.into_inner());
                    *self.table.lock().unwrap_or_else(PoisonError::into_inner) = Some(table.clone());
                    return Ok(table);
                }
                Ok(Err(status)) => last = status,
                Err(_) if Instant::now() >= deadline => {
                    return Err(Status::unavailable("the routing table could not be read before the deadline"));
                }
                Err(_) => last = Status::unavailable(format!("{addr} did not send the routing table in {TABLE_FETCH_MAX:?}")),
            }
        }
        Err(last)
    }

    /// Group `id` in the table held, or in a fresh one when the held one has none; `None`:
    /// no such group (its sessions do not exist).
    async fn group(&self, id: u64, deadline: Instant) -> Result<Option<(GroupDescriptor, Arc<RoutingTable>)>, Status> {
        let in_table = |table: Arc<RoutingTable>| {
            let group = table.groups.iter().filter_map(|entry| entry.descriptor.as_ref()).find(|group| group.group_id == id).cloned();
            group.map(|group| (group, table))
        };
        let held = self.table.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(found) = held.and_then(in_table) {
            return Ok(Some(found));
        }
        Ok(in_table(self.refresh(deadline).await?))
    }

    /// Asks `home` (linearizably) which of `session_ids`, all homed there, are alive, with
    /// their owners, on behalf of group `from`; `home` also notes `from` as holding the live
    /// ones (so closing one ends it in `from` at once): with `note_holder` (`from` is about to
    /// record them) each, else (`from` records them) those not noting it yet. None is alive
    /// when no group `home` exists. Fails UNAVAILABLE when `home` cannot be reached by
    /// `deadline`.
    pub async fn check_sessions(
        &self,
        from: u64,
        home: u64,
        session_ids: &[u64],
        note_holder: bool,
        deadline: Instant,
    ) -> Result<AliveSessions, Status> {
        if session_ids.is_empty() {
            return Ok(AliveSessions::default());
        }
        debug_assert!(session_ids.iter().all(|id| home_group(*id) == home), "sessions of one home group");
        let (holder_group, checker_group) = if note_holder { (from, 0) } else { (0, from) };
        let answer = self
            .call_session_check(from, home, deadline, |mut client, routing| {
                let request = CheckSessionsRequest { session_ids: session_ids.to_vec(), holder_group, checker_group, routing: Some(routing) };
                async move { client.check_sessions(bounded(request, deadline)).await }
            })
            .await?;
        // No such group, or it answered that the sessions are gone: none is alive.
        let Some(response) = answer else { return Ok(AliveSessions::default()) };
        let mut owners = response.owners.into_iter();
        let alive = response.alive.into_iter().map(|id| (id, owners.next().unwrap_or_default())).collect();
        Ok(AliveSessions { alive, holders_full: response.holders_full })
    }

    /// Tells group `holder` that `session_ids`, homed in group `from`, were closed: it ends
    /// its records of them. A group that no longer exists has none.
    pub async fn end_sessions(&self, from: u64, holder: u64, session_ids: &[u64], deadline: Instant) -> Result<(), Status> {
        self.call_session_check(from, holder, deadline, |mut client, routing| {
            let request = EndSessionsRequest { session_ids: session_ids.to_vec(), routing: Some(routing) };
            async move { client.end_sessions(bounded(request, deadline)).await }
        })
        .await
        .map(drop)
    }

    /// Makes `call` to the `SessionCheck` service of group `to`'s leader, on behalf of
    /// group `from`, by `deadline`: following NOT_LEADER hints, reading the routing table
    /// again when it is stale. `None`: no group `to` exists, or it answered SESSION_EXPIRED.
    async fn call_session_check<T, Call, Answer>(&self, from: u64, to: u64, deadline: Instant, call: Call) -> Result<Option<T>, Status>
    where
        Call: Fn(SessionCheckClient<tonic::transport::Channel>, Routing) -> Answer,
        Answer: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        if self.faults.group_link_cut(from, to) {
            return Err(Status::unavailable(format!("group {from} is cut off from group {to}")));
        }
        let mut follow = Follow::new(CallKind::Idempotent, deadline);
        loop {
            // The routing table (fresh) has no such group.
            let Some((group, table)) = self.group(to, deadline).await? else { return Ok(None) };
            let replicas = &group.replicas;
            let turn = follow.turn();
            let Some(fallback) = replicas.get(turn.attempt % replicas.len().max(1)) else {
                return Err(Status::unavailable(format!("group {} has no replicas", group.group_id)));
            };
            let node = turn.hint.filter(|id| replicas.contains(id)).unwrap_or(*fallback);
            let addr = table.nodes.iter().find(|entry| entry.id == node).map(|entry| entry.addr.clone()).unwrap_or_default();
            let routing = Routing { group_id: group.group_id, conf_ver: group.conf_ver, version: group.version };
            let status = match tokio::time::timeout_at(deadline, call(SessionCheckClient::new(self.channel(&addr)?), routing)).await {
                Ok(Ok(response)) => return Ok(Some(response.into_inner())),
                Ok(Err(status)) => status,
                Err(_) => {
                    let message = format!("no answer from group {} before the deadline", group.group_id);
                    return Err(warden_proto::status(warden_proto::warden_error(Code::Unavailable, "", message)));
                }
            };
            let retried = match Fault::of(&status) {
                // The group is gone (merged away): so are its sessions.
                Fault::Answer { code: Some(Code::SessionExpired) } => return Ok(None),
                Fault::Answer { code: Some(Code::WrongGroup) } => {
                    // The table is stale: read it again, and judge the group on the new one.
                    self.refresh(deadline).await?;
                    follow.retry_anyway(status).await
                }
                _ => follow.retry_after(status).await,
            };
            retried?;
        }
    }

    /// Asks the placement leader (first `leader`, this node's guess, then every node known,
    /// following NOT_LEADER hints) to grow a group's share of a quota (see
    /// `placement/quota.rs`). Answers whether it grew.
    pub async fn request_quota(&self, leader: Option<u64>, request: RequestQuotaRequest, deadline: Instant) -> Result<bool, Status> {
        let mut candidates: Vec<u64> = leader.into_iter().chain(self.directory.ids()).collect();
        let mut last = Status::unavailable("no node to ask for a quota share");
        let mut asked = 0;
        while let Some(id) = (!candidates.is_empty()).then(|| candidates.remove(0)) {
            // Every node at most twice (once more after a hint), so a leaderless moment ends.
            asked += 1;
            if asked > 2 * self.directory.ids().len().max(1) || Instant::now() >= deadline {
                break;
            }
            let Some(addr) = self.directory.get(id) else { continue };
            let channel = self.channel(&addr.to_string())?;
            match PlacementClient::new(channel).request_quota(bounded(request.clone(), deadline)).await {
                Ok(response) => return Ok(response.into_inner().granted),
                Err(status) => {
                    if let Some(hint) = warden_proto::error_of(&status).map(|e| e.leader_id).filter(|id| *id != 0) {
                        candidates.insert(0, hint);
                    }
                    last = status;
                }
            }
        }
        Err(last)
    }
}
