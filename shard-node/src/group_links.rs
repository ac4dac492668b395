//! How a shard-node reaches other shard groups: the router's [`Upstreams`] (the routing
//! table from placement, a leader cache, and the router's retry rules), built on first use
//! from the addresses this node knows, plus the test fault hook that cuts calls between two
//! groups ([`NetFaults::cut_group_link`]). Used today by sessions across groups: a group
//! holding a remote session's ephemerals asks the session's home group about it.

use std::sync::{Arc, OnceLock};

use tokio::time::Instant;
use tonic::Status;
use warden_placement::home_group;
use warden_proto::namespace::session_check_client::SessionCheckClient;
use warden_proto::namespace::CheckSessionsRequest;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::RequestQuotaRequest;
use warden_proto::tls::Tls;
use warden_proto::v1::warden_error::Code;
use warden_router::upstream::{bounded, Target, Upstreams};

use warden_engine::transport::{NetFaults, PeerDirectory};

/// Calls from one node's groups to other groups.
pub struct GroupLinks {
    directory: Arc<PeerDirectory>,
    faults: Arc<NetFaults>,
    tls: Option<Arc<Tls>>,
    upstreams: OnceLock<Arc<Upstreams>>,
}

impl GroupLinks {
    /// Links that find the cluster through the nodes in `directory` (with `tls`, as the node
    /// it names).
    pub fn new(directory: Arc<PeerDirectory>, faults: Arc<NetFaults>, tls: Option<Arc<Tls>>) -> GroupLinks {
        GroupLinks { directory, faults, tls, upstreams: OnceLock::new() }
    }

    /// The cluster view, seeded with every node known when it is first needed (the routing
    /// table it then fetches names the rest).
    fn upstreams(&self) -> &Arc<Upstreams> {
        self.upstreams.get_or_init(|| {
            let seeds = self.directory.ids().into_iter().filter_map(|id| self.directory.get(id)).map(|addr| addr.to_string()).collect();
            Arc::new(Upstreams::new(seeds, self.tls.clone()))
        })
    }

    /// Asks `home` (linearizably) which of `session_ids`, all homed there, are alive, with
    /// their owners; on
    /// behalf of group `from`. None is alive when no group `home` exists. Fails UNAVAILABLE
    /// when `home` cannot be reached by `deadline`.
    pub async fn check_sessions(&self, from: u64, home: u64, session_ids: &[u64], deadline: Instant) -> Result<Vec<(u64, String)>, Status> {
        if self.faults.group_link_cut(from, home) {
            return Err(Status::unavailable(format!("group {from} is cut off from group {home}")));
        }
        let request = CheckSessionsRequest { session_ids: session_ids.to_vec(), routing: None };
        let Some(first) = session_ids.first() else { return Ok(Vec::new()) };
        debug_assert!(session_ids.iter().all(|id| home_group(*id) == home), "sessions of one home group");
        let response = self
            .upstreams()
            .call(Target::Session(*first), true, deadline, |upstream, routing| {
                let request = CheckSessionsRequest { routing: Some(routing), ..request.clone() };
                async move { SessionCheckClient::new(upstream.channel).check_sessions(bounded(request, deadline)).await }
            })
            .await;
        match response {
            Ok(response) => {
                let mut owners = response.owners.into_iter();
                Ok(response.alive.into_iter().map(|id| (id, owners.next().unwrap_or_default())).collect())
            }
            // The routing table (fresh) has no such group: it has no sessions.
            Err(status) if warden_proto::error_of(&status).is_some_and(|e| e.code == Code::SessionExpired as i32) => Ok(Vec::new()),
            Err(status) => Err(status),
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
            let channel = self.upstreams().channel(&addr.to_string())?;
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
