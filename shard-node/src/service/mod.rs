//! The public gRPC API (`warden.v1.Warden`) served by a shard-node for the groups it hosts.
//! Writes become namespace transactions proposed to the group's leader; reads go through
//! ReadIndex (linearizable) or the local applied state (stale). Every error is a gRPC status
//! with a `WardenError` detail (DESIGN.md rule 9). Watches are served in [`watch`].

mod batch;
mod remote_sessions;
mod watch;

pub use remote_sessions::RemoteSessionMetrics;
use remote_sessions::WhenEnded;

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use tonic::{Request, Response, Status};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::leader_request::Request as LeaderRequestKind;
use warden_proto::namespace::leader_response::Response as LeaderResponseKind;
use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::namespace::{
    AcquireLock, Command, CommandResult, LeaderRequest, LeaderResponse, LockQuery, Query, QueryResult, ReleaseLock, WaiterState,
};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::txn_op_result::Result as OpResult;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::warden_server::{Warden, WardenServer};
use warden_proto::v1::*;

use tonic::metadata::MetadataMap;
use warden_access::{authorize_call, Access, AclCache};
use warden_proto::tls::{Caller, PeerInfo};

use crate::group_links::GroupLinks;
use warden_engine::error::EngineError;
use warden_engine::host::{NodeHandle, ReadConsistency};
use warden_engine::transport::PeerDirectory;
use warden_namespace::limits::LimitsBoard;
use warden_namespace::watch::WatchHubs;
use warden_namespace::{path, sessions, txn, Limits};

/// Largest request accepted (DESIGN.md rule 8: 1.5 MiB).
pub const REQUEST_BYTES_MAX: usize = 3 << 19;
/// Largest response sent (a listing of many large nodes may be this big).
const RESPONSE_BYTES_MAX: usize = REQUEST_BYTES_MAX * 8;
/// Group a request without routing goes to.
pub const DEFAULT_GROUP: u64 = 1;
pub use warden_proto::KEEPALIVE_SESSIONS_MAX;
/// Longest a `Lock` call waits.
pub const LOCK_WAIT_MS_MAX: u64 = 300_000;
/// Proposals of one command refused by a quota share that placement then grew (other
/// writers may take the new room first).
const QUOTA_RETRIES_MAX: u32 = 8;
/// Keepalive responses queued on one stream before the stream waits for its client.
const KEEPALIVE_STREAM_QUEUE_MAX: usize = 16;

/// The `warden.v1.Warden` service of one node.
pub struct WardenService {
    node: NodeHandle,
    directory: Arc<PeerDirectory>,
    timeout: Duration,
    /// The limits each of this node's replicas applies (its early checks use the same).
    board: LimitsBoard,
    /// The shortest session TTL granted, whatever the group's limits say: 1.5 × the
    /// election timeout (DESIGN.md rule 6: a TTL must outlast an election).
    session_ttl_ms_floor: u64,
    /// Where watches find the hubs of this node's replicas (`None`: no watches served).
    hubs: Option<WatchHubs>,
    /// Calls to other groups (sessions homed elsewhere).
    links: Arc<GroupLinks>,
    /// What the remote-session checks of this node found.
    remote_metrics: Arc<RemoteSessionMetrics>,
    /// Who may do what where, as this node last heard from placement (security on).
    acl: Arc<AclCache>,
}

impl Clone for WardenService {
    fn clone(&self) -> Self {
        WardenService {
            node: self.node.clone(),
            directory: self.directory.clone(),
            timeout: self.timeout,
            board: self.board.clone(),
            session_ttl_ms_floor: self.session_ttl_ms_floor,
            hubs: self.hubs.clone(),
            links: self.links.clone(),
            remote_metrics: self.remote_metrics.clone(),
            acl: self.acl.clone(),
        }
    }
}

impl WardenService {
    /// The service of `node`, whose replicas publish their limits on `board`. Sessions are
    /// granted at least 1.5 × `election_timeout` (DESIGN.md rule 6: a TTL must outlast an
    /// election).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        node: NodeHandle,
        directory: Arc<PeerDirectory>,
        timeout: Duration,
        election_timeout: Duration,
        board: LimitsBoard,
        hubs: Option<WatchHubs>,
        links: Arc<GroupLinks>,
        acl: Arc<AclCache>,
    ) -> WardenService {
        let session_ttl_ms_floor = election_timeout.as_millis() as u64 * 3 / 2;
        WardenService { node, directory, timeout, board, session_ttl_ms_floor, hubs, links, remote_metrics: Arc::default(), acl }
    }

    /// The limits `group` applies on this node (the first release's when it has no replica
    /// here: the proposal fails anyway).
    fn limits(&self, group: u64) -> Arc<Limits> {
        self.board.get(self.node.node_id(), group).map_or_else(|| Arc::new(Limits::FIRST_RELEASE), |(_, limits)| limits)
    }

    /// The public API over this service, wrapped for tonic with the request-size limit.
    pub fn server(self) -> WardenServer<WardenService> {
        WardenServer::new(self).max_decoding_message_size(REQUEST_BYTES_MAX).max_encoding_message_size(RESPONSE_BYTES_MAX)
    }

    /// What this node's remote-session checks found.
    pub fn remote_metrics(&self) -> Arc<RemoteSessionMetrics> {
        self.remote_metrics.clone()
    }

    /// Whom `request` is for, refused (UNAUTHENTICATED, PERMISSION_DENIED) unless it may make
    /// this call (`warden-access`; security off: everything is allowed).
    fn admit<R: Access>(&self, request: &Request<R>) -> Result<Caller, Status> {
        self.admit_of(request.extensions().get::<PeerInfo>(), request.metadata(), request.get_ref())
    }

    /// As [`admit`](Self::admit), for a message that came over the connection `peer` in a
    /// call with `metadata` (a stream's).
    pub(super) fn admit_of<R: Access>(&self, peer: Option<&PeerInfo>, metadata: &MetadataMap, message: &R) -> Result<Caller, Status> {
        // A stopping node takes no new call: its groups are led elsewhere (`host/drain.rs`).
        if let Err(stopping) = self.node.activity().arrive() {
            return Err(status(warden_proto::warden_error(Code::Unavailable, "", stopping.to_string())));
        }
        let caller = warden_proto::tls::caller_of(peer, metadata)?;
        authorize_call(&self.acl, &caller, message)?;
        Ok(caller)
    }

    fn header(&self, group: u64, revision: u64) -> ResponseHeader {
        let leader = self.node.leader_info(group);
        ResponseHeader { group_id: group, revision, raft_term: leader.term, leader_id: leader.leader_id, node_id: self.node.node_id() }
    }

    /// Proposes a command to `group`; returns its outcome and the header (at the revision
    /// the command left).
    async fn propose(&self, group: u64, op: CommandOp, principal: &str, timeout: Duration) -> Result<(CommandOutcome, ResponseHeader), Status> {
        self.propose_command(group, op, principal, timeout).await.map(|(outcome, header, _)| (outcome, header))
    }

    /// As [`propose`](Self::propose), with what the command reported beside its outcome
    /// (`CommandResult.lock_attempt`, `remote_holders`; its `result` taken out).
    async fn propose_command(
        &self,
        group: u64,
        op: CommandOp,
        principal: &str,
        timeout: Duration,
    ) -> Result<(CommandOutcome, ResponseHeader, CommandResult), Status> {
        let now_ms = warden_engine::wall_clock::now_ms();
        let command = Command { now_ms, principal: principal.to_string(), op: Some(op) }.encode_to_vec();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut attempts = 0;
        // A graceful stop waits for this answer before the node goes.
        let _in_flight = self.node.activity().propose();
        let mut result = loop {
            let output = self.node.propose(group, command.clone(), timeout).await.map_err(|e| self.engine_status(group, e))?;
            let result = CommandResult::decode(output.as_slice()).map_err(|e| internal(format!("command result: {e}")))?;
            // Refused by the group's share of a quota with room elsewhere: ask placement for
            // more, then try again (a refused command changed nothing).
            attempts += 1;
            match &result.result {
                Some(CommandOutcome::Error(error)) if attempts < QUOTA_RETRIES_MAX && self.more_quota(group, error, deadline).await => continue,
                _ => break result,
            }
        };
        let revision = |header: &Option<ResponseHeader>| header.as_ref().map_or(0, |h| h.revision);
        match result.result.take() {
            Some(CommandOutcome::Error(error)) => Err(status(error)),
            Some(outcome) => {
                let at = match &outcome {
                    CommandOutcome::Txn(r) => revision(&r.header),
                    CommandOutcome::CreateSession(r) => revision(&r.header),
                    CommandOutcome::CloseSession(r) => revision(&r.header),
                    CommandOutcome::Lock(r) => revision(&r.header),
                    CommandOutcome::Error(_) | CommandOutcome::QuotaShare(_) | CommandOutcome::Limits(_) | CommandOutcome::Sessions(_) => 0,
                };
                Ok((outcome, self.header(group, at), result))
            }
            None => Err(internal("empty command result".into())),
        }
    }

    /// Whether placement grew `group`'s share of the quota `error` (a refusal) names, so the
    /// command is worth proposing again. Only a share below its quota's limit can grow.
    async fn more_quota(&self, group: u64, error: &WardenError, deadline: tokio::time::Instant) -> bool {
        let Some(quota) = error.quota.as_ref().filter(|q| error.code == Code::ResourceExhausted as i32 && q.share < q.limit) else {
            return false;
        };
        let request = warden_proto::placement::RequestQuotaRequest {
            group_id: group,
            prefix: quota.prefix.clone(),
            kind: quota.kind,
            need: quota.usage.saturating_sub(quota.share),
        };
        let leader = Some(self.node.leader_info(warden_placement::PLACEMENT_GROUP_ID).leader_id).filter(|id| *id != 0);
        match self.links.request_quota(leader, request, deadline).await {
            Ok(granted) => granted,
            Err(status) => {
                tracing::debug!(group, prefix = %quota.prefix, %status, "could not ask placement for a bigger quota share");
                false
            }
        }
    }

    /// Proposes a transaction and returns its response, with the header filled in.
    async fn write(&self, routing: Option<&Routing>, request: TxnRequest, principal: &str, timeout: Duration) -> Result<TxnResponse, Status> {
        // Bad input is refused here, typed, before it costs a proposal.
        let group = group_of(routing);
        txn::check_request(&request, &self.limits(group)).map_err(status)?;
        // Ephemerals of sessions homed elsewhere need their sessions recorded here first.
        let owners = request.then.iter().chain(&request.r#else).filter_map(|op| match &op.op {
            Some(Op::Create(create)) => Some(create.session_id),
            Some(Op::Put(put)) if !put.keep_owner => Some(put.session_id),
            _ => None,
        });
        self.ensure_remote_sessions(group, owners, !principal.is_empty(), WhenEnded::LeaveToApply, timeout).await?;
        match self.propose(group, CommandOp::Txn(request), principal, timeout).await? {
            (CommandOutcome::Txn(response), header) => Ok(TxnResponse { header: Some(header), ..response }),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// Asks the group's leader a leader-only question.
    async fn leader_call(
        &self,
        group: u64,
        request: LeaderRequestKind,
        principal: &str,
        timeout: Duration,
    ) -> Result<(LeaderResponseKind, ResponseHeader), Status> {
        let request = LeaderRequest { principal: principal.to_string(), request: Some(request) }.encode_to_vec();
        let output = self.node.leader_call(group, request, timeout).await.map_err(|e| self.engine_status(group, e))?;
        let response = LeaderResponse::decode(output.as_slice()).map_err(|e| internal(format!("leader response: {e}")))?;
        match response.response {
            Some(LeaderResponseKind::Error(error)) => Err(status(error)),
            Some(response) => Ok((response, self.header(group, 0))),
            None => Err(internal("empty leader response".into())),
        }
    }

    /// The group a session request goes to: the routed one, else the sessions' home group.
    fn session_group(routing: Option<&Routing>, sessions: &[u64]) -> Result<u64, Status> {
        if let Some(group) = routing.map(|r| r.group_id).filter(|g| *g != 0) {
            return Ok(group);
        }
        let mut homes = sessions.iter().map(|id| sessions::home_group(*id));
        let first = homes.next().unwrap_or(DEFAULT_GROUP);
        if homes.any(|home| home != first) {
            return Err(status(error(Code::InvalidArgument, "", "sessions of different home groups in one request")));
        }
        Ok(first)
    }

    /// Proposes an `AcquireLock`; returns the answer, the call's attempt on its waiter, and
    /// the header.
    async fn acquire(
        &self,
        group: u64,
        acquire: AcquireLock,
        principal: &str,
        timeout: Duration,
    ) -> Result<(LockResponse, u64, ResponseHeader), Status> {
        match self.propose_command(group, CommandOp::AcquireLock(acquire), principal, timeout).await? {
            (CommandOutcome::Lock(response), header, result) => Ok((response, result.lock_attempt, header)),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// Removes `sequencer`'s waiter: whatever its attempt (`attempt` 0, Unlock), or only if
    /// `attempt` is still its call's (an abandoned `Lock` call).
    async fn release(&self, group: u64, sequencer: Sequencer, attempt: u64, principal: &str, timeout: Duration) -> Result<ResponseHeader, Status> {
        let op = CommandOp::ReleaseLock(ReleaseLock { sequencer: Some(sequencer), attempt });
        match self.propose(group, op, principal, timeout).await? {
            (CommandOutcome::Txn(_), header) => Ok(header),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// The session owning `sequencer`'s waiter, from this node's applied state (`None`: no
    /// such node here; the release then decides).
    async fn waiter_session(&self, group: u64, sequencer: &Sequencer, timeout: Duration) -> Result<Option<u64>, Status> {
        if path::parent(&sequencer.waiter) != Some(sequencer.path.as_str()) {
            // No waiter of the lock: the release refuses it.
            return Ok(None);
        }
        let get = GetRequest { path: sequencer.waiter.clone(), consistency: Consistency::Stale as i32, ..GetRequest::default() };
        match self.read_group(group, Consistency::Stale as i32, QueryKind::Get(get), timeout).await? {
            (QueryOutcome::Get(response), _) => Ok(response.stat.map(|stat| stat.ephemeral_owner).filter(|session| *session != 0)),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// Whether `sequencer` holds, confirmed with the leader.
    async fn holds(&self, group: u64, sequencer: Sequencer, timeout: Duration) -> Result<(bool, ResponseHeader), Status> {
        let query = QueryKind::CheckSequencer(LockQuery { path: sequencer.path.clone(), sequencer: Some(sequencer), ..LockQuery::default() });
        match self.read_group(group, Consistency::Linearizable as i32, query, timeout).await? {
            (QueryOutcome::CheckSequencer(response), header) => Ok((response.holds, header)),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// Where the waiter of `sequencer` stands, from this node's applied state (a waiting
    /// `Lock` call looks after each notification of its waiter).
    async fn waiter_state(
        &self,
        group: u64,
        sequencer: &Sequencer,
        session_id: u64,
        timeout: Duration,
    ) -> Result<(WaiterState, ResponseHeader), Status> {
        let query = QueryKind::Waiter(LockQuery { path: sequencer.path.clone(), sequencer: Some(sequencer.clone()), session_id });
        match self.read_group(group, Consistency::Stale as i32, query, timeout).await? {
            (QueryOutcome::Waiter(state), header) => Ok((state, header)),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// Where a new session of `owner` counts for session quotas: its `hint`; without one, where
    /// the owner's `lock` grants meet ([`warden_placement::acl::Acl::lock_scope`]; empty for
    /// `/`). A hint, or a scope below `/`, must be served by the home `group`, whose quota
    /// shares are the ones that count it: a session homed elsewhere would count under no
    /// share of its scope's quota (refused WRONG_GROUP, with the group's descriptor, before
    /// anything is proposed).
    async fn session_scope(&self, group: u64, hint: &str, owner: &str, timeout: Duration) -> Result<String, Status> {
        let scope = match (hint, owner) {
            ("", "") => return Ok(String::new()),
            ("", owner) => self.acl.get().lock_scope(owner),
            (hint, _) => hint.to_string(),
        };
        // A session without a hint that counts at `/` may be homed anywhere: every group
        // holds a share of a quota at `/`. A hint, `/` included, names the home group.
        if hint.is_empty() && scope == "/" {
            return Ok(String::new());
        }
        let exists = ExistsRequest { path: scope.clone(), consistency: Consistency::Stale as i32, ..ExistsRequest::default() };
        match self.read_group(group, Consistency::Stale as i32, QueryKind::Exists(exists), timeout).await? {
            (QueryOutcome::Exists(_), _) => Ok(scope),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn keep_alive_once(&self, request: KeepAliveRequest, principal: &str, timeout: Duration) -> Result<KeepAliveResponse, Status> {
        if request.session_ids.len() > KEEPALIVE_SESSIONS_MAX {
            return Err(status(error(Code::TooLarge, "", "too many sessions in one keepalive")));
        }
        let group = Self::session_group(request.routing.as_ref(), &request.session_ids)?;
        match self.leader_call(group, LeaderRequestKind::KeepAlive(request), principal, timeout).await? {
            (LeaderResponseKind::KeepAlive(response), header) => Ok(KeepAliveResponse { header: Some(header), ..response }),
            _ => Err(internal("mismatched result".into())),
        }
    }

    /// One operation as a transaction; returns its result and the header.
    async fn write_one(&self, routing: Option<&Routing>, op: Op, principal: &str, timeout: Duration) -> Result<(OpResult, ResponseHeader), Status> {
        let request = TxnRequest { then: vec![TxnOp { op: Some(op) }], ..TxnRequest::default() };
        let response = self.write(routing, request, principal, timeout).await?;
        let header = response.header.unwrap_or_default();
        let result = response.results.into_iter().next().and_then(|r| r.result).ok_or_else(|| internal("no result".into()))?;
        Ok((result, header))
    }

    async fn read(
        &self,
        routing: Option<&Routing>,
        consistency: i32,
        query: QueryKind,
        timeout: Duration,
    ) -> Result<(QueryOutcome, ResponseHeader), Status> {
        self.read_group(group_of(routing), consistency, query, timeout).await
    }

    async fn read_group(&self, group: u64, consistency: i32, query: QueryKind, timeout: Duration) -> Result<(QueryOutcome, ResponseHeader), Status> {
        let consistency = match Consistency::try_from(consistency) {
            Ok(Consistency::Linearizable) => ReadConsistency::Linearizable,
            Ok(Consistency::Stale) => ReadConsistency::Stale,
            Err(_) => return Err(status(error(Code::InvalidArgument, "", "unknown consistency"))),
        };
        let query = Query { query: Some(query) };
        let bytes = self.node.read(group, query.encode_to_vec(), consistency, timeout).await.map_err(|e| self.engine_status(group, e))?;
        let result = QueryResult::decode(bytes.as_slice()).map_err(|e| internal(format!("query result: {e}")))?;
        let header = self.header(group, result.revision);
        match result.result {
            Some(QueryOutcome::Error(error)) => Err(status(error)),
            Some(outcome) => Ok((outcome, header)),
            None => Err(internal("empty query result".into())),
        }
    }

    /// The request's deadline: the service's own, shortened to answer (typed) within the
    /// caller's gRPC deadline when it sent one.
    fn timeout<T>(&self, request: &Request<T>) -> Duration {
        let caller = warden_proto::grpc_timeout(request);
        match caller {
            // Keep a tenth for the answer's way back.
            Some(caller) => self.timeout.min(caller.mul_f64(0.9)),
            None => self.timeout,
        }
    }

    fn engine_status(&self, group: u64, error: EngineError) -> Status {
        engine_status(&self.directory, group, error)
    }
}

/// The gRPC status of an engine error about `group` (NOT_LEADER carries the leader's address
/// from `directory`).
pub(crate) fn engine_status(directory: &PeerDirectory, group: u64, error: EngineError) -> Status {
    let detail = match &error {
        EngineError::NotLeader { leader_hint, .. } => {
            let leader_id = leader_hint.unwrap_or(0);
            let leader_addr = leader_hint.and_then(|id| directory.get(id)).map(|a| a.to_string()).unwrap_or_default();
            WardenError { leader_id, leader_addr, ..warden_error(Code::NotLeader, error.to_string()) }
        }
        EngineError::GroupNotFound(_) => not_hosted(group),
        EngineError::Unavailable { outcome_unknown: true, .. } => warden_error(Code::OutcomeUnknown, error.to_string()),
        EngineError::Unavailable { .. }
        | EngineError::Dropped(_)
        | EngineError::ConfChangeRefused { .. }
        | EngineError::Stopped
        | EngineError::ReplicaFailed { .. } => warden_error(Code::Unavailable, error.to_string()),
        EngineError::TooLarge { limit_bytes, .. } => WardenError { limit: *limit_bytes as u64, ..warden_error(Code::TooLarge, error.to_string()) },
        // Final for its sender (a deposed placement leader): not UNAVAILABLE, which is retried.
        EngineError::Invalid(_) | EngineError::GroupExists(_) | EngineError::ConfChangeFenced { .. } => {
            warden_error(Code::InvalidArgument, error.to_string())
        }
    };
    status(detail)
}

/// The refusal of a call about `group` at a node that hosts no replica of it: WRONG_GROUP
/// naming no path and no descriptor (a namespace's WRONG_GROUP names both).
pub(crate) fn not_hosted(group: u64) -> WardenError {
    warden_error(Code::WrongGroup, format!("group {group} is not hosted on this node"))
}

/// Whether `status` is [`not_hosted`]'s refusal: the node asked has no replica of the group
/// (a creation went on without it, or it was moved away), and asking it changed nothing.
pub(crate) fn is_not_hosted(status: &Status) -> bool {
    warden_proto::error_of(status).is_some_and(|error| error.code == Code::WrongGroup as i32 && error.path.is_empty() && error.descriptor.is_none())
}

/// Removes a waiting `Lock` call's waiter if the call goes away (the client hung up) before
/// it was answered. The release names the call's attempt, so if a retry of the call has
/// re-attached to the waiter in the meantime (and may have been told it holds), the waiter
/// stays.
struct ReleaseOnDrop {
    service: Option<WardenService>,
    group: u64,
    sequencer: Sequencer,
    attempt: u64,
}

impl ReleaseOnDrop {
    fn disarm(mut self) {
        self.service = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(service) = self.service.take() {
            let (group, sequencer, attempt) = (self.group, self.sequencer.clone(), self.attempt);
            tokio::spawn(async move {
                // The node cleans up after its own call: no owner check.
                if let Err(error) = service.release(group, sequencer, attempt, "", service.timeout).await {
                    tracing::warn!(%error, "could not remove the waiter of an abandoned Lock call");
                }
            });
        }
    }
}

/// A Lock's failure after its waiter was written (it may still be queued, or even hold): a
/// refusal the retry rule reads as "nothing done" (NOT_LEADER, UNAVAILABLE, a replica no
/// longer here) is answered OUTCOME_UNKNOWN instead, so a Lock without a request id is not
/// sent again to queue a second waiter behind its first. A retry with the request id finds
/// the same waiter, as OUTCOME_UNKNOWN allows for idempotent calls.
fn after_queued(path: &str, failure: Status) -> Status {
    let nothing_done = match warden_proto::error_of(&failure) {
        Some(error) => [Code::NotLeader, Code::Unavailable, Code::WrongGroup].into_iter().any(|code| error.code == code as i32),
        None => true,
    };
    if !nothing_done {
        return failure;
    }
    let message = format!("the lock's waiter was queued, then the wait failed ({}): it may still be queued or hold", failure.message());
    status(error(Code::OutcomeUnknown, path, &message))
}

/// The group a sequencer is checked or released in: the one the caller routed to (a router
/// routes by the lock's path, which a split may have moved since the sequencer was issued),
/// else the group that issued it.
fn sequencer_group(sequencer: &Sequencer, routing: Option<&Routing>) -> u64 {
    match routing.map_or(0, |r| r.group_id) {
        0 if sequencer.group_id != 0 => sequencer.group_id,
        _ => group_of(routing),
    }
}

fn group_of(routing: Option<&Routing>) -> u64 {
    match routing.map_or(0, |r| r.group_id) {
        0 => DEFAULT_GROUP,
        group => group,
    }
}

fn warden_error(code: Code, message: String) -> WardenError {
    warden_proto::warden_error(code, "", message)
}

fn error(code: Code, path: &str, message: &str) -> WardenError {
    warden_proto::warden_error(code, path, message)
}

fn internal(message: String) -> Status {
    status(warden_error(Code::Unknown, message))
}

pub use warden_proto::{error_of, status};

#[tonic::async_trait]
impl Warden for WardenService {
    async fn create(&self, request: Request<CreateRequest>) -> Result<Response<CreateResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Create(request), &principal, timeout).await? {
            (OpResult::Create(response), header) => Ok(Response::new(CreateResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Get(request), timeout).await? {
            (QueryOutcome::Get(response), header) => Ok(Response::new(GetResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn exists(&self, request: Request<ExistsRequest>) -> Result<Response<ExistsResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Exists(request), timeout).await? {
            (QueryOutcome::Exists(response), header) => Ok(Response::new(ExistsResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn set(&self, request: Request<SetRequest>) -> Result<Response<SetResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Set(request), &principal, timeout).await? {
            (OpResult::Set(response), header) => Ok(Response::new(SetResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<DeleteResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Delete(request), &principal, timeout).await? {
            (OpResult::Delete(response), header) => Ok(Response::new(DeleteResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Put(request), &principal, timeout).await? {
            (OpResult::Put(response), header) => Ok(Response::new(PutResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn range(&self, request: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Range(request), timeout).await? {
            (QueryOutcome::Range(response), header) => Ok(Response::new(RangeResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn delete_range(&self, request: Request<DeleteRangeRequest>) -> Result<Response<DeleteRangeResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::DeleteRange(request), &principal, timeout).await? {
            (OpResult::DeleteRange(response), header) => Ok(Response::new(DeleteRangeResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn get_children(&self, request: Request<GetChildrenRequest>) -> Result<Response<GetChildrenResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Children(request), timeout).await? {
            (QueryOutcome::Children(response), header) => Ok(Response::new(GetChildrenResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let routing = request.routing;
        Ok(Response::new(self.write(routing.as_ref(), request, &principal, timeout).await?))
    }

    async fn create_session(&self, request: Request<CreateSessionRequest>) -> Result<Response<CreateSessionResponse>, Status> {
        let timeout = self.timeout(&request);
        let owner = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let group = group_of(request.routing.as_ref());
        let limits = self.limits(group);
        let granted = request.ttl_ms.max(self.session_ttl_ms_floor).clamp(limits.session_ttl_ms_min, limits.session_ttl_ms_max);
        if !request.path_hint.is_empty() {
            path::validate(&request.path_hint, true).map_err(|reason| status(warden_namespace::error::invalid_path(&request.path_hint, &reason)))?;
        }
        let scope = self.session_scope(group, &request.path_hint, &owner, timeout).await?;
        let op = CommandOp::CreateSession(warden_proto::namespace::CreateSession { ttl_ms: granted, owner: owner.clone(), scope });
        match self.propose(group, op, &owner, timeout).await? {
            (CommandOutcome::CreateSession(response), header) => Ok(Response::new(CreateSessionResponse {
                header: Some(header),
                ttl_adjusted: response.ttl_adjusted || granted != request.ttl_ms,
                ..response
            })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn keep_alive(&self, request: Request<KeepAliveRequest>) -> Result<Response<KeepAliveResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        Ok(Response::new(self.keep_alive_once(request.into_inner(), &principal, timeout).await?))
    }

    type KeepAliveStreamStream = tokio_stream::wrappers::ReceiverStream<Result<KeepAliveResponse, Status>>;

    async fn keep_alive_stream(&self, request: Request<tonic::Streaming<KeepAliveRequest>>) -> Result<Response<Self::KeepAliveStreamStream>, Status> {
        let principal = self.admit_of(request.extensions().get::<PeerInfo>(), request.metadata(), &KeepAliveRequest::default())?.principal_or_empty();
        let mut incoming = request.into_inner();
        let (responses, stream) = tokio::sync::mpsc::channel(KEEPALIVE_STREAM_QUEUE_MAX);
        let service = self.clone();
        tokio::spawn(async move {
            // One request at a time: a client renews on its own schedule, and a slow client
            // holds at most the queue's worth of answers.
            while let Ok(Some(request)) = incoming.message().await {
                let answer = service.keep_alive_once(request, &principal, service.timeout).await;
                let failed = answer.is_err();
                if responses.send(answer).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(stream)))
    }

    async fn close_session(&self, request: Request<CloseSessionRequest>) -> Result<Response<CloseSessionResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let group = Self::session_group(request.routing.as_ref(), &[request.session_id])?;
        let op = CommandOp::CloseSession(warden_proto::namespace::CloseSession { session_id: request.session_id });
        match self.propose_command(group, op, &principal, timeout).await? {
            (CommandOutcome::CloseSession(response), header, result) => {
                // The groups that recorded the session end it before the close is answered,
                // so no call made after the close can use it there; those out of reach are
                // named.
                let not_ended_in = self.end_at_holders(group, request.session_id, &result.remote_holders, timeout).await;
                Ok(Response::new(CloseSessionResponse { header: Some(header), not_ended_in, ..response }))
            }
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn session_info(&self, request: Request<SessionInfoRequest>) -> Result<Response<SessionInfoResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let group = Self::session_group(request.routing.as_ref(), &[request.session_id])?;
        let kind = match request.session_id {
            0 => {
                LeaderRequestKind::HomeSessions(warden_proto::namespace::RemoteSessionsPage { after: request.list_after, limit: request.list_limit })
            }
            id => LeaderRequestKind::SessionInfo(id),
        };
        match self.leader_call(group, kind, &principal, timeout).await? {
            (LeaderResponseKind::SessionInfo(response), header) => Ok(Response::new(SessionInfoResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let rpc_timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        if request.session_id == 0 {
            return Err(status(error(Code::InvalidArgument, &request.path, "a lock needs a session")));
        }
        if request.timeout_ms > LOCK_WAIT_MS_MAX {
            return Err(status(error(Code::InvalidArgument, &request.path, "timeout_ms is at most 300000")));
        }
        let group = group_of(request.routing.as_ref());
        self.ensure_remote_sessions(group, [request.session_id], !principal.is_empty(), WhenEnded::Refuse, rpc_timeout).await?;
        let acquire = AcquireLock {
            path: request.path.clone(),
            session_id: request.session_id,
            mode: request.mode,
            lock_delay_ms: request.lock_delay_ms,
            request_id: request.request_id,
            // A try-lock that would not hold changes nothing: one proposal, no revision.
            if_free: !request.wait,
        };
        let (response, attempt, header) = self.acquire(group, acquire, &principal, rpc_timeout).await?;
        let sequencer = response.sequencer.map(|sequencer| Sequencer { group_id: group, ..sequencer });
        let answer = |acquired: bool, sequencer: Option<Sequencer>, header: ResponseHeader| {
            Ok(Response::new(LockResponse { header: Some(header), acquired, sequencer }))
        };
        if response.acquired {
            return answer(true, sequencer, header);
        }
        let Some(sequencer) = sequencer.filter(|_| request.wait) else { return answer(false, None, header) };
        // Wait: register for the waiter's notification, then look; the notification wakes only
        // this waiter, once it holds or once it is gone (released, or its session ended).
        let wait = match request.timeout_ms {
            0 => rpc_timeout,
            ms => Duration::from_millis(ms).min(rpc_timeout),
        };
        let deadline = std::time::Instant::now() + wait;
        let guard = ReleaseOnDrop { service: Some(self.clone()), group, sequencer: sequencer.clone(), attempt };
        let key = warden_namespace::locks::notify_key(&sequencer.waiter);
        let mut header = header;
        loop {
            let remaining = deadline.saturating_duration_since(std::time::Instant::now());
            if remaining.is_zero() {
                break;
            }
            let notified =
                self.node.register_await(group, key.clone(), remaining).map_err(|e| after_queued(&request.path, self.engine_status(group, e)))?;
            let (state, at) =
                self.waiter_state(group, &sequencer, request.session_id, remaining).await.map_err(|s| after_queued(&request.path, s))?;
            header = at;
            if state.holds {
                guard.disarm();
                return answer(true, Some(sequencer), header);
            }
            if !state.queued {
                guard.disarm();
                if !state.session_alive {
                    let message = format!("session {:#x} ended while waiting for the lock", request.session_id);
                    return Err(status(error(Code::SessionExpired, &request.path, &message)));
                }
                // Removed by an Unlock of its sequencer: the wait is over, without the lock.
                return answer(false, None, header);
            }
            if tokio::time::timeout(remaining, notified).await.is_err() {
                break;
            }
        }
        guard.disarm();
        if request.keep_queued {
            // The caller comes back with the same request id to go on waiting in its place.
            return answer(false, Some(sequencer), header);
        }
        // The wait is over: the waiter goes (the guard would do it too, but an answer should
        // come after the cleanup).
        let header = self.release(group, sequencer, attempt, &principal, self.timeout).await.map_err(|s| after_queued(&request.path, s))?;
        answer(false, None, header)
    }

    async fn unlock(&self, request: Request<UnlockRequest>) -> Result<Response<UnlockResponse>, Status> {
        let timeout = self.timeout(&request);
        let principal = self.admit(&request)?.principal_or_empty();
        let request = request.into_inner();
        let sequencer = request.sequencer.ok_or_else(|| status(error(Code::InvalidArgument, "", "unlock needs a sequencer")))?;
        let group = sequencer_group(&sequencer, request.routing.as_ref());
        if !principal.is_empty() {
            // The waiter's session must be known here with its owner, as for Lock, or apply
            // cannot tell whether the caller may release it.
            let session = self.waiter_session(group, &sequencer, timeout).await?;
            self.ensure_remote_sessions_named(group, session, timeout).await?;
        }
        let header = self.release(group, sequencer, 0, &principal, timeout).await?;
        Ok(Response::new(UnlockResponse { header: Some(header) }))
    }

    async fn check_sequencer(&self, request: Request<CheckSequencerRequest>) -> Result<Response<CheckSequencerResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let sequencer = request.sequencer.ok_or_else(|| status(error(Code::InvalidArgument, "", "no sequencer")))?;
        let group = sequencer_group(&sequencer, request.routing.as_ref());
        let (holds, header) = self.holds(group, sequencer, timeout).await?;
        Ok(Response::new(CheckSequencerResponse { header: Some(header), holds }))
    }

    async fn lock_info(&self, request: Request<LockInfoRequest>) -> Result<Response<LockInfoResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let request = request.into_inner();
        let query = QueryKind::LockInfo(LockQuery { path: request.path.clone(), ..LockQuery::default() });
        match self.read(request.routing.as_ref(), Consistency::Linearizable as i32, query, timeout).await? {
            (QueryOutcome::LockInfo(response), header) => Ok(Response::new(LockInfoResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    type WatchStream = watch::Responses;

    async fn watch(&self, request: Request<tonic::Streaming<WatchRequest>>) -> Result<Response<Self::WatchStream>, Status> {
        let hubs = self.hubs.clone().ok_or_else(|| status(error(Code::Unavailable, "", "this node serves no watches")))?;
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let metadata = request.metadata().clone();
        Ok(Response::new(watch::serve(self.clone(), hubs, peer, metadata, request.into_inner())))
    }

    async fn sync(&self, request: Request<SyncRequest>) -> Result<Response<SyncResponse>, Status> {
        let timeout = self.timeout(&request);
        self.admit(&request)?;
        let routing = request.into_inner().routing;
        let consistency = Consistency::Linearizable as i32;
        let (_, header) = self.read(routing.as_ref(), consistency, QueryKind::Revision(true), timeout).await?;
        Ok(Response::new(SyncResponse { header: Some(header) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the refusal of a node without the group's replica reads as "not hosted": a
    /// namespace's WRONG_GROUP (a path another group serves) is an answer about the path.
    #[test]
    fn only_a_missing_replica_reads_as_not_hosted() {
        assert!(is_not_hosted(&status(not_hosted(7))));
        let elsewhere = warden_proto::warden_error(Code::WrongGroup, "/a/b", "group 3 serves /a, not this path");
        assert!(!is_not_hosted(&status(elsewhere)));
        assert!(!is_not_hosted(&status(warden_error(Code::Unavailable, "no leader yet".into()))));
        assert!(!is_not_hosted(&Status::unavailable("connection refused")));
    }

    /// A Lock whose waiter was written is never answered as "nothing done" (a retry without
    /// a request id would queue a second waiter of the session behind the first).
    #[test]
    fn a_lock_failing_after_its_waiter_was_queued_answers_an_unknown_outcome() {
        let code_of = |failure: Status| warden_proto::error_of(&failure).map(|error| error.code);
        for nothing_done in [
            status(warden_error(Code::NotLeader, "not the leader".into())),
            status(warden_error(Code::Unavailable, "stopped".into())),
            status(not_hosted(7)),
            Status::unavailable("connection reset"),
        ] {
            let failure = after_queued("/l", nothing_done);
            assert_eq!(code_of(failure.clone()), Some(Code::OutcomeUnknown as i32), "{failure:?}");
            assert!(!warden_proto::follow::Fault::of(&failure).retried(warden_proto::follow::CallKind::Write), "never resent without a request id");
        }
        let expired = status(error(Code::SessionExpired, "/l", "ended"));
        assert_eq!(code_of(after_queued("/l", expired)), Some(Code::SessionExpired as i32), "an answer stays the answer");
    }
}
