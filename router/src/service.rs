//! `warden.v1.Warden` as the router serves it: each call goes to the group serving its path
//! (or, for sessions and sequencers, the group their id names), with that group's id and
//! epoch in its routing; see [`Upstreams::call`] for retries. `GetChildren` of a parent some
//! of whose children are other groups' prefixes adds those children; a recursive `Delete`
//! of a subtree with other groups below fans out ([`crate::fan_out`]). Streams are proxied:
//! keepalives as unary calls to each session's home group, watches over one upstream stream
//! per group (see [`crate::watch`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::warden_server::{Warden, WardenServer};
use warden_proto::v1::*;

use warden_placement::home_group;

use crate::batch::Batchable;
use crate::upstream::Upstreams;
use warden_access::{authorize_call, Access};
use warden_proto::batch::Method;
use warden_proto::routing::Target;
use warden_proto::routing::{txn_paths, Routed};

/// Largest request the router accepts (as a shard-node does: 1.5 MiB).
pub const REQUEST_BYTES_MAX: usize = 3 << 19;
/// Keepalive answers queued on one stream before the router waits for its client.
const KEEPALIVE_STREAM_QUEUE_MAX: usize = 16;

/// The router's public API.
#[derive(Clone)]
pub struct RouterService {
    upstreams: Arc<Upstreams>,
    timeout: Duration,
    /// Random hash keys of this router (sessions without a hint spread by hash).
    session_spread: RandomState,
    /// Sessions spread so far (the hashed counter).
    sessions_spread: Arc<AtomicU64>,
}

impl RouterService {
    /// The service over `upstreams`, answering within `timeout` unless the caller's
    /// deadline is shorter.
    pub fn server(upstreams: Arc<Upstreams>, timeout: Duration) -> WardenServer<RouterService> {
        WardenServer::new(RouterService::new(upstreams, timeout))
            .max_decoding_message_size(REQUEST_BYTES_MAX)
            .max_encoding_message_size(warden_proto::RESPONSE_BYTES_MAX)
    }

    /// The upstreams it forwards through.
    pub(crate) fn upstreams(&self) -> &Arc<Upstreams> {
        &self.upstreams
    }

    /// The service itself (the etcd API calls it directly).
    pub fn new(upstreams: Arc<Upstreams>, timeout: Duration) -> RouterService {
        RouterService { upstreams, timeout, session_spread: RandomState::new(), sessions_spread: Arc::new(AtomicU64::new(0)) }
    }

    /// A home group for a session created without a hint: the ready group a counter hashes
    /// to, so sessions spread evenly over the groups (and differently per router).
    async fn spread_session(&self) -> Result<u64, Status> {
        let key = self.session_spread.hash_one(self.sessions_spread.fetch_add(1, Ordering::Relaxed));
        if let Some(group) = self.upstreams.table().spread(key) {
            return Ok(group.id());
        }
        let table = self.upstreams.refresh().await?;
        table.spread(key).map(|g| g.id()).ok_or_else(|| refusal(Code::Unavailable, "", "no shard group is ready to home a session"))
    }

    /// Refuses, before anything is forwarded, a call its caller may not make (the node
    /// serving the path judges again: it is the authority, this only fails fast). The etcd
    /// API also judges every part of an operation spanning groups here before any part runs.
    pub(crate) fn admit<R: Access>(&self, request: &Request<R>) -> Result<(), Status> {
        self.admit_caller(request).map(|_| ())
    }

    /// As [`admit`](Self::admit), answering who the caller is.
    fn admit_caller<R: Access>(&self, request: &Request<R>) -> Result<warden_proto::tls::Caller, Status> {
        let caller = warden_proto::tls::caller(request)?;
        authorize_call(self.upstreams.acl(), &caller, request.get_ref())?;
        Ok(caller)
    }

    fn deadline<T>(&self, request: &Request<T>) -> Instant {
        Instant::now() + warden_proto::grpc_timeout(request).map_or(self.timeout, |caller| self.timeout.min(caller.mul_f64(0.9)))
    }
}

/// The answer says the session does not exist.
fn is_session_expired(status: &Status) -> bool {
    warden_proto::error_of(status).is_some_and(|e| e.code == Code::SessionExpired as i32)
}

/// The lease of a session that has ended.
fn ended(session_id: u64) -> SessionLease {
    SessionLease { session_id, alive: false, ..SessionLease::default() }
}

/// Leases of sessions that have ended.
fn not_alive(session_ids: &[u64]) -> Vec<SessionLease> {
    session_ids.iter().copied().map(ended).collect()
}

/// A typed refusal by the router itself.
fn refusal(code: Code, path: &str, message: impl Into<String>) -> Status {
    warden_proto::status(warden_proto::warden_error(code, path, message))
}

/// Where a sequencer's lock lives: the group serving its path now. The group the sequencer
/// names is where it was issued, which a split or merge may have moved the lock away from.
fn sequencer_target(sequencer: &Sequencer) -> Target<'_> {
    if sequencer.path.is_empty() {
        Target::Group(sequencer.group_id)
    } else {
        Target::Path(&sequencer.path)
    }
}

/// Sends `request` with its routing set by the router and the time left until the deadline
/// as its `grpc-timeout`.
macro_rules! forward {
    ($self:ident, $target:expr, $idempotent:expr, $deadline:expr, $request:ident, $method:ident) => {{
        let deadline: Instant = $deadline;
        let started = std::time::Instant::now();
        let result = $self
            .upstreams
            .call($target, $idempotent, deadline, |upstream, routing| {
                let request = with_routing($request.clone(), routing);
                upstream.forward(request, deadline, |mut client, request| async move { client.$method(request).await })
            })
            .await;
        $self.upstreams.metrics.forwarded(stringify!($method), started, &result);
        result.map(Response::new)
    }};
}

macro_rules! batchable {
    ($($t:ty => $method:ident),*) => {
        $(impl Batchable for $t {
            const METHOD: Method = Method::$method;
        })*
    };
}

batchable!(
    CreateRequest => Create,
    GetRequest => Get,
    ExistsRequest => Exists,
    SetRequest => Set,
    DeleteRequest => Delete,
    GetChildrenRequest => GetChildren,
    TxnRequest => Txn,
    SyncRequest => Sync,
    CreateSessionRequest => CreateSession,
    KeepAliveRequest => KeepAlive,
    CloseSessionRequest => CloseSession,
    SessionInfoRequest => SessionInfo,
    LockRequest => Lock,
    UnlockRequest => Unlock,
    CheckSequencerRequest => CheckSequencer,
    LockInfoRequest => LockInfo,
    PutRequest => Put,
    RangeRequest => Range,
    DeleteRangeRequest => DeleteRange
);

fn with_routing<R: Routed>(mut request: R, routing: Routing) -> R {
    request.set_routing(routing);
    request
}

impl RouterService {
    /// Renews the sessions of `request`, whatever their home groups: one call per home
    /// group (a group renews only its own sessions), the leases answered in the request's
    /// order. A session whose home group does not exist is not alive.
    async fn keep_alive_split(&self, request: KeepAliveRequest, deadline: Instant) -> Result<KeepAliveResponse, Status> {
        if request.session_ids.len() > warden_proto::KEEPALIVE_SESSIONS_MAX {
            let message = format!("a keepalive renews at most {} sessions", warden_proto::KEEPALIVE_SESSIONS_MAX);
            let error = WardenError { limit: warden_proto::KEEPALIVE_SESSIONS_MAX as u64, ..warden_proto::warden_error(Code::TooLarge, "", message) };
            return Err(warden_proto::status(error));
        }
        let mut homes: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for id in &request.session_ids {
            homes.entry(home_group(*id)).or_default().push(*id);
        }
        if homes.len() <= 1 {
            let target = request.session_ids.first().map_or(Target::Path("/"), |id| Target::Session(*id));
            return match forward!(self, target, true, deadline, request, keep_alive) {
                Err(status) if is_session_expired(&status) => Ok(KeepAliveResponse { header: None, leases: not_alive(&request.session_ids) }),
                answer => answer.map(Response::into_inner),
            };
        }
        let calls = homes.into_values().map(|session_ids| async move {
            let part = KeepAliveRequest { session_ids, routing: None };
            match forward!(self, Target::Session(part.session_ids[0]), true, deadline, part, keep_alive) {
                Err(status) if is_session_expired(&status) => Ok(KeepAliveResponse { header: None, leases: not_alive(&part.session_ids) }),
                answer => answer.map(Response::into_inner),
            }
        });
        let mut header = None;
        let mut leases: HashMap<u64, SessionLease> = HashMap::new();
        for answer in futures::future::join_all(calls).await {
            let answer = answer?;
            header = header.or(answer.header);
            leases.extend(answer.leases.into_iter().map(|lease| (lease.session_id, lease)));
        }
        let leases = request.session_ids.iter().map(|id| leases.get(id).cloned().unwrap_or_else(|| ended(*id))).collect();
        Ok(KeepAliveResponse { header, leases })
    }
}

#[tonic::async_trait]
impl Warden for RouterService {
    async fn create(&self, request: Request<CreateRequest>) -> Result<Response<CreateResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), false, deadline, request, create)
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), true, deadline, request, get)
    }

    async fn exists(&self, request: Request<ExistsRequest>) -> Result<Response<ExistsResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), true, deadline, request, exists)
    }

    async fn set(&self, request: Request<SetRequest>) -> Result<Response<SetResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), false, deadline, request, set)
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<DeleteResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        if request.recursive {
            // A subtree other groups serve parts of is cleared group by group.
            let table = self.upstreams.table();
            let below: Vec<(u64, String)> = table.groups_below(&request.path).iter().map(|g| (g.id(), g.descriptor.prefix.clone())).collect();
            if let (Some(owner), false) = (table.route(&request.path), below.is_empty()) {
                return crate::fan_out::delete_across_groups(&self.upstreams, &request, owner.id(), below, deadline).await.map(Response::new);
            }
        }
        forward!(self, Target::Path(&request.path), false, deadline, request, delete)
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), false, deadline, request, put)
    }

    /// One group's part of a range: the group serving `path` answers the paths it serves
    /// (a range over several groups is the etcd service's to split).
    async fn range(&self, request: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), true, deadline, request, range)
    }

    async fn delete_range(&self, request: Request<DeleteRangeRequest>) -> Result<Response<DeleteRangeResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), false, deadline, request, delete_range)
    }

    async fn get_children(&self, request: Request<GetChildrenRequest>) -> Result<Response<GetChildrenResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let mut response = forward!(self, Target::Path(&request.path), true, deadline, request, get_children)?.into_inner();
        // Children that are other groups' prefixes are not listed by the parent's group. The
        // group's page covers the names after `start_after` up to its last name when it says
        // `more` (the next page starts there), else every name after `start_after`: another
        // group's prefix joins this page only within that range, so none is listed twice
        // and none is skipped.
        let page_end = if response.more { response.names.last().cloned() } else { None };
        let table = self.upstreams.table();
        let extra: Vec<(String, u64, String)> = table
            .child_groups(&request.path)
            .into_iter()
            .map(|group| (warden_paths::name(&group.descriptor.prefix).to_string(), group.id(), group.descriptor.prefix.clone()))
            .filter(|(name, _, _)| {
                name.as_str() > request.start_after.as_str()
                    && page_end.as_ref().is_none_or(|end| name <= end)
                    && response.names.binary_search(name).is_err()
            })
            .collect();
        if extra.is_empty() {
            return Ok(Response::new(response));
        }
        // Merged by name; each name keeps its stat, or the group (and prefix) to ask for it.
        let mut merged: Vec<(String, Result<Stat, (u64, String)>)> =
            response.names.drain(..).zip(response.stats.drain(..).map(Ok).chain(std::iter::repeat_with(|| Ok(Stat::default())))).collect();
        merged.extend(extra.into_iter().map(|(name, group, prefix)| (name, Err((group, prefix)))));
        merged.sort_by(|a, b| a.0.cmp(&b.0));
        if request.limit != 0 && merged.len() > request.limit as usize {
            merged.truncate(request.limit as usize);
            response.more = true;
        }
        for (name, stat) in merged {
            response.names.push(name);
            if request.with_stats {
                let stat = match stat {
                    Ok(stat) => stat,
                    Err((group, prefix)) => {
                        let exists = ExistsRequest { path: prefix, ..ExistsRequest::default() };
                        forward!(self, Target::Group(group), true, deadline, exists, exists)?.into_inner().stat.unwrap_or_default()
                    }
                };
                response.stats.push(stat);
            }
        }
        Ok(Response::new(response))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let paths = txn_paths(&request);
        forward!(self, Target::Paths(&paths), false, deadline, request, txn)
    }

    async fn sync(&self, request: Request<SyncRequest>) -> Result<Response<SyncResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let target = request.routing.as_ref().map(|r| r.group_id).filter(|g| *g != 0).map_or(Target::Path("/"), Target::Group);
        forward!(self, target, true, deadline, request, sync)
    }

    async fn create_session(&self, request: Request<CreateSessionRequest>) -> Result<Response<CreateSessionResponse>, Status> {
        let deadline = self.deadline(&request);
        let caller = self.admit_caller(&request)?;
        let request = request.into_inner();
        // The home group: the one named, else the one serving the session's scope (its hint;
        // without one, where the caller's lock grants meet, as the node judges it), else one
        // by hash (a scope of `/`: any group counts it there).
        let named = request.routing.as_ref().map(|r| r.group_id).filter(|g| *g != 0);
        let hint = request.path_hint.clone();
        let scope = match caller.principal() {
            Some(principal) if hint.is_empty() => self.upstreams.acl().get().lock_scope(principal),
            _ => String::new(),
        };
        let target = match named {
            Some(group) => Target::Group(group),
            // (An invalid hint is refused INVALID_PATH by the call.)
            None if !hint.is_empty() => Target::Path(&hint),
            None if !scope.is_empty() && scope != "/" => Target::Path(&scope),
            None => Target::Group(self.spread_session().await?),
        };
        forward!(self, target, false, deadline, request, create_session)
    }

    async fn keep_alive(&self, request: Request<KeepAliveRequest>) -> Result<Response<KeepAliveResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        self.keep_alive_split(request.into_inner(), deadline).await.map(Response::new)
    }

    type KeepAliveStreamStream = tokio_stream::wrappers::ReceiverStream<Result<KeepAliveResponse, Status>>;

    async fn keep_alive_stream(&self, request: Request<Streaming<KeepAliveRequest>>) -> Result<Response<Self::KeepAliveStreamStream>, Status> {
        let mut incoming = request.into_inner();
        let (responses, stream) = tokio::sync::mpsc::channel(KEEPALIVE_STREAM_QUEUE_MAX);
        let service = self.clone();
        tokio::spawn(crate::principal::scoped(crate::principal::current(), async move {
            // Each renewal goes to its sessions' home group as a unary call, so a leader
            // change in one group never ends the client's stream.
            while let Ok(Some(request)) = incoming.message().await {
                let answer = service.keep_alive_split(request, Instant::now() + service.timeout).await;
                let failed = answer.is_err();
                if responses.send(answer).await.is_err() || failed {
                    break;
                }
            }
        }));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(stream)))
    }

    async fn close_session(&self, request: Request<CloseSessionRequest>) -> Result<Response<CloseSessionResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Session(request.session_id), false, deadline, request, close_session)
    }

    async fn session_info(&self, request: Request<SessionInfoRequest>) -> Result<Response<SessionInfoResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        // A listing (no session) goes to the group its routing names.
        let target = match (request.session_id, request.routing.as_ref().map_or(0, |r| r.group_id)) {
            (0, group) if group != 0 => Target::Group(group),
            (id, _) => Target::Session(id),
        };
        forward!(self, target, true, deadline, request, session_info)
    }

    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        // With a request id, a retried Lock finds the same waiter: safe to resend.
        let idempotent = request.request_id != 0;
        forward!(self, Target::Path(&request.path), idempotent, deadline, request, lock)
    }

    async fn unlock(&self, request: Request<UnlockRequest>) -> Result<Response<UnlockResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let sequencer = request.sequencer.clone().unwrap_or_default();
        // Unlock is idempotent (a waiter already gone is fine).
        forward!(self, sequencer_target(&sequencer), true, deadline, request, unlock)
    }

    async fn check_sequencer(&self, request: Request<CheckSequencerRequest>) -> Result<Response<CheckSequencerResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let sequencer = request.sequencer.clone().unwrap_or_default();
        forward!(self, sequencer_target(&sequencer), true, deadline, request, check_sequencer)
    }

    async fn lock_info(&self, request: Request<LockInfoRequest>) -> Result<Response<LockInfoResponse>, Status> {
        let deadline = self.deadline(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        forward!(self, Target::Path(&request.path), true, deadline, request, lock_info)
    }

    type WatchStream = crate::watch::Responses;

    async fn watch(&self, request: Request<Streaming<WatchRequest>>) -> Result<Response<Self::WatchStream>, Status> {
        Ok(Response::new(crate::watch::proxy(self.upstreams.clone(), Box::pin(request.into_inner()))))
    }
}
