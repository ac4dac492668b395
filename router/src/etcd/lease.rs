//! etcd's `Lease` service on Warden sessions: a lease is a session (its id is the session
//! id, which names the session's home group), a key put with a lease is the session's
//! ephemeral node, and revoking or expiring the lease deletes those keys. TTLs are in
//! seconds as etcd's; Warden clamps them to its session bounds and the answer says what was
//! granted.

use std::pin::Pin;

use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Extensions, Request, Response, Status, Streaming};
use warden_proto::etcd::etcdserverpb as pb;
use warden_proto::v1 as w;
use warden_proto::v1::warden_server::Warden;

use super::{etcd_status, inner, invalid, EtcdService};

/// Keepalive answers queued on one stream before the router waits for its client.
const KEEPALIVE_QUEUE_MAX: usize = 16;

/// Keys a `TimeToLive` answers at most (the first in key order): a group's page, and the
/// number of ephemerals a session may own in one group by default.
pub const LEASE_KEYS_MAX: i64 = 10_000;

/// Leases a `Leases` answer lists at most: etcd's answer has no "more" flag, so a listing
/// past it is refused rather than cut short. 100,000 leases are about 1.1 MB of answer,
/// within what etcd clients accept (4 MiB by default).
pub const LEASES_MAX: usize = 100_000;

/// A lease id as a session id.
pub(super) fn session_of(id: i64) -> Result<u64, Status> {
    u64::try_from(id).ok().filter(|id| *id != 0).ok_or_else(|| Status::not_found("etcdserver: requested lease not found"))
}

/// Whole seconds of `ms`, rounded up (a lease of 1,500 ms has 2 seconds to live, not 1).
fn seconds(ms: u64) -> i64 {
    i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// The time left to a session that is alive, etcd's `-1` for one that is not.
fn ttl_left(lease: Option<&w::SessionLease>) -> i64 {
    match lease {
        Some(lease) if lease.alive => seconds(lease.remaining_ms),
        _ => -1,
    }
}

#[tonic::async_trait]
impl pb::lease_server::Lease for EtcdService {
    async fn lease_grant(&self, request: Request<pb::LeaseGrantRequest>) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        if request.id != 0 {
            return Err(invalid("lease ids are chosen by Warden (a session id names its home group): grant with ID 0 (docs/etcd.md)"));
        }
        let ttl_s = u64::try_from(request.ttl).map_err(|_| invalid("the TTL must not be negative"))?;
        let create = w::CreateSessionRequest { ttl_ms: ttl_s.saturating_mul(1000), ..w::CreateSessionRequest::default() };
        let created = Warden::create_session(&self.router, inner(&metadata, &extensions, create)).await.map_err(etcd_status)?.into_inner();
        Ok(Response::new(pb::LeaseGrantResponse {
            header: self.header(created.header.map_or(0, |h| h.revision)),
            id: i64::try_from(created.session_id).map_err(|_| Status::internal("a session id past i64"))?,
            ttl: seconds(created.granted_ttl_ms),
            error: String::new(),
        }))
    }

    async fn lease_revoke(&self, request: Request<pb::LeaseRevokeRequest>) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let close = w::CloseSessionRequest { session_id: session_of(request.id)?, ..w::CloseSessionRequest::default() };
        let closed = Warden::close_session(&self.router, inner(&metadata, &extensions, close)).await.map_err(etcd_status)?.into_inner();
        // etcd answers a revoke once the lease's keys are deleted. A group its home group
        // could not tell within the call deletes them at its next check of the session: the
        // revoke then fails as etcd's does when it cannot confirm in time (the lease is
        // revoked, so it is no more; revoked again, it is not found).
        if !closed.not_ended_in.is_empty() {
            let message = format!(
                "etcdserver: request timed out: the lease is revoked, but its keys in groups {:?} are deleted only at those groups' next check of it",
                closed.not_ended_in
            );
            return Err(Status::unavailable(message));
        }
        Ok(Response::new(pb::LeaseRevokeResponse { header: self.header(closed.header.map_or(0, |h| h.revision)) }))
    }

    type LeaseKeepAliveStream = Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send + 'static>>;

    /// Each renewal is a unary keepalive to the lease's home group, so a leader change
    /// there never ends the client's stream. A lease that has ended answers TTL 0, as etcd's
    /// does.
    async fn lease_keep_alive(&self, request: Request<Streaming<pb::LeaseKeepAliveRequest>>) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let (metadata, extensions, mut incoming) = request.into_parts();
        let (answers, stream) = tokio::sync::mpsc::channel(KEEPALIVE_QUEUE_MAX);
        let service = self.clone();
        tokio::spawn(crate::principal::scoped(crate::principal::current(), async move {
            while let Ok(Some(request)) = incoming.message().await {
                let answer = match session_of(request.id) {
                    Ok(session_id) => {
                        let renew = w::KeepAliveRequest { session_ids: vec![session_id], routing: None };
                        Warden::keep_alive(&service.router, inner(&metadata, &extensions, renew)).await.map_err(etcd_status).map(|answer| {
                            let answer = answer.into_inner();
                            let lease = answer.leases.first().filter(|lease| lease.alive);
                            pb::LeaseKeepAliveResponse {
                                header: service.header(answer.header.map_or(0, |h| h.revision)),
                                id: request.id,
                                ttl: lease.map_or(0, |lease| seconds(lease.granted_ttl_ms)),
                            }
                        })
                    }
                    Err(_) => Ok(pb::LeaseKeepAliveResponse { header: service.header(0), id: request.id, ttl: 0 }),
                };
                let failed = answer.is_err();
                if answers.send(answer).await.is_err() || failed {
                    break;
                }
            }
        }));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))))
    }

    /// The lease's granted TTL and time left; with `keys`, the keys attached to it (its
    /// session's ephemerals that are etcd keys, in every group), at most [`LEASE_KEYS_MAX`].
    async fn lease_time_to_live(&self, request: Request<pb::LeaseTimeToLiveRequest>) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let (metadata, extensions, request) = request.into_parts();
        let info = w::SessionInfoRequest { session_id: session_of(request.id)?, ..w::SessionInfoRequest::default() };
        let answer = match Warden::session_info(&self.router, inner(&metadata, &extensions, info)).await.map_err(etcd_status) {
            Ok(answer) => answer.into_inner(),
            Err(status) if status.code() == tonic::Code::NotFound => w::SessionInfoResponse::default(),
            Err(status) => return Err(status),
        };
        let lease = answer.lease.as_ref().filter(|lease| lease.alive);
        let keys = match (lease, request.keys) {
            (Some(lease), true) => {
                let every_key =
                    pb::RangeRequest { key: vec![0], range_end: vec![0], keys_only: true, limit: LEASE_KEYS_MAX, ..pb::RangeRequest::default() };
                let owned = self.read_range(&metadata, &extensions, &every_key, lease.session_id).await?;
                owned.kvs.into_iter().map(|kv| kv.key).collect()
            }
            _ => Vec::new(),
        };
        Ok(Response::new(pb::LeaseTimeToLiveResponse {
            header: self.header(answer.header.map_or(0, |h| h.revision)),
            id: request.id,
            ttl: ttl_left(lease),
            granted_ttl: lease.map_or(0, |lease| seconds(lease.granted_ttl_ms)),
            keys,
        }))
    }

    /// Every lease: the live sessions homed in each group (every session, not only those
    /// granted through etcd's API: each is a lease to it), in id order, at most
    /// [`LEASES_MAX`]. With security on, a caller sees only its own sessions.
    async fn lease_leases(&self, request: Request<pb::LeaseLeasesRequest>) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let (metadata, extensions, _) = request.into_parts();
        let table = self.table().await?;
        let groups: Vec<u64> = table.route("/").into_iter().chain(table.groups_below("/")).map(|group| group.id()).collect();
        let listings = groups.into_iter().map(|group| self.home_sessions(&metadata, &extensions, group));
        let mut ids = Vec::new();
        let mut revision = 0;
        for listing in futures::future::join_all(listings).await {
            let (some, at) = listing?;
            ids.extend(some);
            revision = revision.max(at);
        }
        if ids.len() > LEASES_MAX {
            return Err(too_many_leases());
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(Response::new(pb::LeaseLeasesResponse {
            header: self.header(revision),
            leases: ids.into_iter().filter_map(|id| Some(pb::LeaseStatus { id: i64::try_from(id).ok()? })).collect(),
        }))
    }
}

/// etcd's refusal of a listing past [`LEASES_MAX`].
fn too_many_leases() -> Status {
    Status::out_of_range(format!("etcdserver: more than {LEASES_MAX} leases: too many to list in one answer (docs/etcd.md)"))
}

impl EtcdService {
    /// The live sessions homed in `group`, page by page, and the group's revision; refused
    /// past [`LEASES_MAX`].
    async fn home_sessions(&self, metadata: &MetadataMap, extensions: &Extensions, group: u64) -> Result<(Vec<u64>, u64), Status> {
        let mut ids = Vec::new();
        let mut after = 0;
        let mut revision = 0;
        loop {
            let list = w::SessionInfoRequest {
                session_id: 0,
                list_after: after,
                list_limit: 0,
                routing: Some(w::Routing { group_id: group, ..w::Routing::default() }),
            };
            let page = Warden::session_info(&self.router, inner(metadata, extensions, list)).await.map_err(etcd_status)?.into_inner();
            revision = revision.max(page.header.map_or(0, |h| h.revision));
            ids.extend(page.sessions.iter().filter(|lease| lease.alive).map(|lease| lease.session_id));
            if ids.len() > LEASES_MAX {
                return Err(too_many_leases());
            }
            // A page that moved no further would be asked again forever.
            if !page.more || page.listed_through <= after {
                return Ok((ids, revision));
            }
            after = page.listed_through;
        }
    }
}
