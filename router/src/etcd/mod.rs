//! The etcd v3 API a router serves beside Warden's own (`warden_proto::etcd`): etcd clients
//! read and write Warden's namespace through it (docs/etcd.md has every difference from
//! etcd). Each etcd call becomes calls of the router's own Warden service, so routing,
//! retries, permissions and metrics are the same as for native calls.
//!
//! - [`keys`]: how etcd's flat byte-string keys and their ranges map to Warden paths.
//! - [`plan`]: which group answers which part of a key range.
//! - [`kv`]: `KV` (Range, Put, DeleteRange, Txn, Compact).
//! - [`lease`]: `Lease` on Warden sessions.
//! - [`lock`]: `v3lockpb.Lock` on Warden's locks (the fencing token as the revision).
//! - [`election`]: `v3electionpb.Election` on ephemeral sequential candidate nodes.
//! - [`watch`]: `Watch` on the router's own watches.
//! - [`auth`]: `Auth` on Warden's principals, ACL groups and grants; tokens checked on
//!   every etcd call.
//! - [`cluster`]: what `etcdctl endpoint status` and `member list` ask (`Maintenance`,
//!   `Cluster`).
//!
//! Revisions are per group: within one group every etcd guarantee holds; a response built
//! from several groups carries the highest of their revisions, and a linearizable range
//! across groups first raises every group it read below that revision to it
//! ([`kv`], `align`), so its revision is a valid watch start for each.

pub mod auth;
pub mod cluster;
pub mod election;
pub mod keys;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod plan;
pub mod watch;
mod watch_order;

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use tonic::metadata::MetadataMap;
use tonic::{Extensions, Request, Status};
use warden_proto::etcd::etcdserverpb::ResponseHeader;
use warden_proto::v1::warden_error::Code;

use warden_proto::tls::{Admit, Tls};

use crate::service::REQUEST_BYTES_MAX;
use crate::{RouterService, Upstreams};

/// The etcd services of one router.
#[derive(Clone)]
pub struct EtcdService {
    router: RouterService,
    /// Names this router in etcd's headers (`member_id`) and member list.
    member_id: u64,
    /// Where etcd clients reach this router (the member list's client URL).
    client_url: String,
}

impl EtcdService {
    /// The etcd services over the router's own service `router`; `client_url` is where
    /// clients reach them (`http://host:port`).
    pub fn new(router: RouterService, client_url: String) -> EtcdService {
        let member_id = member_id_of(&client_url);
        EtcdService { router, member_id, client_url }
    }

    /// An etcd response header at `revision`.
    fn header(&self, revision: u64) -> Option<ResponseHeader> {
        Some(ResponseHeader { cluster_id: CLUSTER_ID, member_id: self.member_id, revision: etcd_revision(revision), raft_term: 0 })
    }
}

/// Serves etcd's services on `listener` (with `tls` when given, admitting clients as the
/// router's own port does) until the future is dropped or the listener fails.
pub async fn serve(listener: Arc<std::net::TcpListener>, upstreams: Arc<Upstreams>, timeout: std::time::Duration, tls: Option<Arc<Tls>>) {
    use warden_proto::etcd::etcdserverpb::{auth_server, cluster_server, kv_server, lease_server, maintenance_server, watch_server};
    use warden_proto::etcd::{v3electionpb::election_server, v3lockpb::lock_server};
    let listener = listener.try_clone().and_then(|l| l.set_nonblocking(true).map(|()| l)).and_then(tokio::net::TcpListener::from_std);
    let listener = match listener {
        Ok(listener) => listener,
        Err(error) => return tracing::error!(%error, "the etcd API cannot listen"),
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client_url = listener.local_addr().map(|addr| format!("{scheme}://{addr}")).unwrap_or_default();
    let auth = auth::EtcdAuth::new(upstreams.clone(), timeout, tls.is_some(), member_id_of(&client_url));
    let service = EtcdService::new(RouterService::new(upstreams, timeout), client_url);
    let incoming = warden_proto::tls::incoming(listener, tls, Admit::Clients);
    let served = tonic::transport::Server::builder()
        .add_service(auth.guard(kv_server::KvServer::new(service.clone()).max_decoding_message_size(REQUEST_BYTES_MAX)))
        .add_service(auth.guard(lease_server::LeaseServer::new(service.clone())))
        .add_service(auth.guard(watch_server::WatchServer::new(service.clone()).max_decoding_message_size(REQUEST_BYTES_MAX)))
        .add_service(auth.guard(maintenance_server::MaintenanceServer::new(service.clone())))
        .add_service(auth.guard(lock_server::LockServer::new(service.clone())))
        .add_service(auth.guard(election_server::ElectionServer::new(service.clone()).max_decoding_message_size(REQUEST_BYTES_MAX)))
        .add_service(auth.guard(auth_server::AuthServer::new(auth.clone())))
        .add_service(auth.guard(cluster_server::ClusterServer::new(service)))
        .serve_with_incoming(incoming)
        .await;
    if let Err(error) = served {
        tracing::error!(%error, "the etcd API stopped");
    }
}

/// Every Warden cluster answers etcd clients with this cluster id (etcd clients only
/// compare it between members of one cluster, and every router of a cluster is one).
pub const CLUSTER_ID: u64 = 0x7761_7264_656e;

/// A member id for the router reached at `client_url`: stable for an address, so one
/// router answers with one id across calls and restarts.
fn member_id_of(client_url: &str) -> u64 {
    // FNV-1a: a fixed function (the std hasher's keys are random per process).
    client_url.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// A Warden revision as etcd's signed one (revisions stay far below `i64::MAX`).
fn etcd_revision(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

/// A request for the router's own service, carrying the etcd call's metadata and
/// connection (its deadline and the caller's identity).
fn inner<T>(metadata: &tonic::metadata::MetadataMap, extensions: &tonic::Extensions, message: T) -> Request<T> {
    Request::from_parts(metadata.clone(), extensions.clone(), message)
}

/// An etcd call that waits (Lock, Campaign) as its native calls see it: its metadata and
/// connection (the caller's identity), and its deadline. Its native calls are made over
/// time, so each carries the time left, not the whole timeout the client sent.
#[derive(Clone)]
struct Call {
    metadata: MetadataMap,
    extensions: Extensions,
    /// From the client's `grpc-timeout` (`None`: it waits as long as the client does).
    deadline: Option<tokio::time::Instant>,
}

impl Call {
    /// The call `request` is, and its message.
    fn of<T>(request: Request<T>) -> (Call, T) {
        let deadline = warden_proto::grpc_timeout(&request).map(|timeout| tokio::time::Instant::now() + timeout);
        let (metadata, extensions, message) = request.into_parts();
        (Call { metadata, extensions, deadline }, message)
    }

    /// A native request of this call with the time it has left; refused once none is left.
    fn request<T>(&self, message: T) -> Result<Request<T>, Status> {
        let mut request = inner(&self.metadata, &self.extensions, message);
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Status::deadline_exceeded("etcdserver: request timed out"));
            }
            request.set_timeout(left);
        }
        Ok(request)
    }

    /// The same caller without the deadline: for the clean-up after the call ended, which
    /// the router's own request timeout bounds.
    fn detached(&self) -> Call {
        let mut metadata = self.metadata.clone();
        metadata.remove("grpc-timeout");
        Call { metadata, extensions: self.extensions.clone(), deadline: None }
    }
}

/// Clean-up a waiting call owes if it ends unfinished: tonic drops the handler of a call
/// whose client hung up or whose deadline passed, and a lock waiter or candidate it made
/// must not stay queued. Spawned on drop unless disarmed, for the call's principal.
struct Cleanup {
    task: Option<BoxFuture<'static, ()>>,
}

impl Cleanup {
    /// Runs `task` if dropped armed.
    fn new(task: impl Future<Output = ()> + Send + 'static) -> Cleanup {
        Cleanup { task: Some(Box::pin(crate::principal::scoped(crate::principal::current(), task))) }
    }

    /// The call finished: nothing to clean up.
    fn disarm(mut self) {
        self.task = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let (Some(task), Ok(runtime)) = (self.task.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(task);
        }
    }
}

/// The etcd error for a Warden refusal, with the messages etcd clients match on
/// (`rpctypes` in etcd's client library); other statuses pass as they are.
fn etcd_status(status: Status) -> Status {
    let Some(error) = warden_proto::error_of(&status) else { return status };
    match Code::try_from(error.code).unwrap_or(Code::Unknown) {
        Code::SessionExpired => Status::not_found("etcdserver: requested lease not found"),
        // Only a put that keeps a missing key's value or lease meets no node.
        Code::NoNode => invalid("key not found"),
        Code::TooLarge => Status::invalid_argument(format!("etcdserver: request is too large ({})", error.message)),
        Code::PermissionDenied => Status::permission_denied("etcdserver: permission denied"),
        Code::Unauthenticated => Status::unauthenticated("etcdserver: invalid auth token"),
        Code::NotLeader | Code::Unavailable | Code::OutcomeUnknown => Status::unavailable(format!("etcdserver: {}", error.message)),
        _ => status,
    }
}

/// An etcd `InvalidArgument` refusal with `message`.
fn invalid(message: impl Into<String>) -> Status {
    Status::invalid_argument(format!("etcdserver: {}", message.into()))
}
