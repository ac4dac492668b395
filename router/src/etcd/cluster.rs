//! What etcd's tools ask of a member: `Maintenance.Status` and `Alarm` (for `etcdctl
//! endpoint status` and `endpoint health`) and `Cluster.MemberList` (`etcdctl member list`).
//! An etcd "member" is a router here: the one answering. Members are not added, removed or
//! defragmented through etcd's API (Warden's own admin commands place nodes), and there is
//! no single database to snapshot or hash: those calls are refused `Unimplemented`.

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};
use warden_proto::etcd::etcdserverpb as pb;
use warden_proto::v1 as w;
use warden_proto::v1::warden_server::Warden;

use super::{etcd_status, inner, EtcdService};

/// The etcd API version the router speaks (what `etcdctl endpoint status` prints).
pub const ETCD_API_VERSION: &str = "3.5.0";

/// A refusal of a call Warden's router does not serve, naming where the difference is written.
fn not_served(what: &str) -> Status {
    Status::unimplemented(format!("etcdserver: {what} is not served by Warden's etcd API (docs/etcd.md)"))
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for EtcdService {
    /// No alarm is ever raised: a group refuses writes past its quotas instead
    /// (RESOURCE_EXHAUSTED), per subtree.
    async fn alarm(&self, _request: Request<pb::AlarmRequest>) -> Result<Response<pb::AlarmResponse>, Status> {
        Ok(Response::new(pb::AlarmResponse { header: self.header(0), alarms: Vec::new() }))
    }

    /// The router as a member: the root group's revision, this router as leader (it
    /// answers every call itself).
    async fn status(&self, request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        let (metadata, extensions, _) = request.into_parts();
        let sync = Warden::sync(&self.router, inner(&metadata, &extensions, w::SyncRequest::default())).await.map_err(etcd_status)?.into_inner();
        let header = sync.header.unwrap_or_default();
        Ok(Response::new(pb::StatusResponse {
            header: self.header(header.revision),
            version: ETCD_API_VERSION.to_string(),
            leader: self.member_id,
            raft_index: header.revision,
            raft_term: header.raft_term,
            raft_applied_index: header.revision,
            ..pb::StatusResponse::default()
        }))
    }

    async fn defragment(&self, _request: Request<pb::DefragmentRequest>) -> Result<Response<pb::DefragmentResponse>, Status> {
        Err(not_served("defragment"))
    }

    async fn hash(&self, _request: Request<pb::HashRequest>) -> Result<Response<pb::HashResponse>, Status> {
        Err(not_served("hash"))
    }

    async fn hash_kv(&self, _request: Request<pb::HashKvRequest>) -> Result<Response<pb::HashKvResponse>, Status> {
        Err(not_served("hash"))
    }

    type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotResponse, Status>> + Send + 'static>>;

    async fn snapshot(&self, _request: Request<pb::SnapshotRequest>) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(not_served("snapshot (use `warden admin backup`)"))
    }

    async fn move_leader(&self, _request: Request<pb::MoveLeaderRequest>) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        Err(not_served("move-leader"))
    }

    async fn downgrade(&self, _request: Request<pb::DowngradeRequest>) -> Result<Response<pb::DowngradeResponse>, Status> {
        Err(not_served("downgrade"))
    }
}

#[tonic::async_trait]
impl pb::cluster_server::Cluster for EtcdService {
    async fn member_add(&self, _request: Request<pb::MemberAddRequest>) -> Result<Response<pb::MemberAddResponse>, Status> {
        Err(not_served("member add"))
    }

    async fn member_remove(&self, _request: Request<pb::MemberRemoveRequest>) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        Err(not_served("member remove"))
    }

    async fn member_update(&self, _request: Request<pb::MemberUpdateRequest>) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        Err(not_served("member update"))
    }

    /// This router, the member the client reached.
    async fn member_list(&self, _request: Request<pb::MemberListRequest>) -> Result<Response<pb::MemberListResponse>, Status> {
        let member = pb::Member {
            id: self.member_id,
            name: format!("warden-router-{:x}", self.member_id),
            peer_ur_ls: Vec::new(),
            client_ur_ls: vec![self.client_url.clone()],
            is_learner: false,
        };
        Ok(Response::new(pb::MemberListResponse { header: self.header(0), members: vec![member] }))
    }

    async fn member_promote(&self, _request: Request<pb::MemberPromoteRequest>) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        Err(not_served("member promote"))
    }
}
