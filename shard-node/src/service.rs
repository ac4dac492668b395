//! The public gRPC API (`warden.v1.Warden`) served by a shard-node for the groups it hosts.
//! Writes become namespace transactions proposed to the group's leader; reads go through
//! ReadIndex (linearizable) or the local applied state (stale). Every error is a gRPC status
//! with a `WardenError` detail (DESIGN.md rule 9).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message as _;
use tonic::{Code as GrpcCode, Request, Response, Status};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::namespace::{Command, CommandResult, Query, QueryResult};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::txn_op_result::Result as OpResult;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::warden_server::{Warden, WardenServer};
use warden_proto::v1::*;

use crate::error::EngineError;
use crate::namespace::{txn, Limits};
use crate::host::{NodeHandle, ReadConsistency};
use crate::transport::PeerDirectory;

/// Largest request accepted (DESIGN.md rule 8: 1.5 MiB).
pub const REQUEST_BYTES_MAX: usize = 3 << 19;
/// Group a request without routing goes to.
pub const DEFAULT_GROUP: u64 = 1;

/// The `warden.v1.Warden` service of one node.
pub struct WardenService {
    node: NodeHandle,
    directory: Arc<PeerDirectory>,
    timeout: Duration,
    limits: Limits,
}

impl WardenService {
    /// The service, wrapped for tonic with the request-size limit.
    pub fn server(node: NodeHandle, directory: Arc<PeerDirectory>, timeout: Duration) -> WardenServer<WardenService> {
        WardenServer::new(WardenService { node, directory, timeout, limits: Limits::default() })
            .max_decoding_message_size(REQUEST_BYTES_MAX)
            .max_encoding_message_size(REQUEST_BYTES_MAX * 8)
    }

    fn header(&self, group: u64, revision: u64) -> ResponseHeader {
        let leader = self.node.leader_info(group);
        ResponseHeader { group_id: group, revision, raft_term: leader.term, leader_id: leader.leader_id, node_id: self.node.node_id() }
    }

    /// Proposes a transaction and returns its response, with the header filled in.
    async fn write(&self, routing: Option<&Routing>, request: TxnRequest, timeout: Duration) -> Result<TxnResponse, Status> {
        let group = group_of(routing);
        // Bad input is refused here, typed, before it costs a proposal.
        txn::check_request(&request, &self.limits).map_err(status)?;
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let command = Command { now_ms, op: Some(CommandOp::Txn(request)) };
        let output = self.node.propose(group, command.encode_to_vec(), timeout).await.map_err(|e| self.engine_status(group, e))?;
        let result = CommandResult::decode(output.as_slice()).map_err(|e| internal(format!("command result: {e}")))?;
        match result.result {
            Some(CommandOutcome::Txn(mut response)) => {
                let revision = response.header.as_ref().map_or(0, |h| h.revision);
                response.header = Some(self.header(group, revision));
                Ok(response)
            }
            Some(CommandOutcome::Error(error)) => Err(status(error)),
            None => Err(internal("empty command result".into())),
        }
    }

    /// One operation as a transaction; returns its result and the header.
    async fn write_one(&self, routing: Option<&Routing>, op: Op, timeout: Duration) -> Result<(OpResult, ResponseHeader), Status> {
        let request = TxnRequest { then: vec![TxnOp { op: Some(op) }], ..TxnRequest::default() };
        let response = self.write(routing, request, timeout).await?;
        let header = response.header.unwrap_or_default();
        let result = response.results.into_iter().next().and_then(|r| r.result).ok_or_else(|| internal("no result".into()))?;
        Ok((result, header))
    }

    async fn read(&self, routing: Option<&Routing>, consistency: i32, query: QueryKind, timeout: Duration) -> Result<(QueryOutcome, ResponseHeader), Status> {
        let group = group_of(routing);
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
        let caller = request.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(parse_grpc_timeout);
        match caller {
            // Keep a tenth for the answer's way back.
            Some(caller) => self.timeout.min(caller.mul_f64(0.9)),
            None => self.timeout,
        }
    }

    fn engine_status(&self, group: u64, error: EngineError) -> Status {
        let detail = match &error {
            EngineError::NotLeader { leader_hint, .. } => {
                let leader_id = leader_hint.unwrap_or(0);
                let leader_addr = leader_hint.and_then(|id| self.directory.get(id)).map(|a| a.to_string()).unwrap_or_default();
                WardenError { leader_id, leader_addr, ..warden_error(Code::NotLeader, error.to_string()) }
            }
            EngineError::GroupNotFound(_) => warden_error(Code::WrongGroup, format!("group {group} is not hosted on this node")),
            EngineError::Unavailable { outcome_unknown: true, .. } => warden_error(Code::OutcomeUnknown, error.to_string()),
            EngineError::Unavailable { .. } | EngineError::Dropped(_) | EngineError::Stopped => warden_error(Code::Unavailable, error.to_string()),
            EngineError::TooLarge { limit_bytes, .. } => WardenError { limit: *limit_bytes as u64, ..warden_error(Code::TooLarge, error.to_string()) },
            EngineError::Invalid(_) | EngineError::GroupExists(_) => warden_error(Code::InvalidArgument, error.to_string()),
        };
        status(detail)
    }
}

/// Parses a `grpc-timeout` header value (`<digits><unit>`, unit one of H M S m u n).
fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

fn group_of(routing: Option<&Routing>) -> u64 {
    match routing.map_or(0, |r| r.group_id) {
        0 => DEFAULT_GROUP,
        group => group,
    }
}

fn warden_error(code: Code, message: String) -> WardenError {
    WardenError { code: code as i32, message, ..WardenError::default() }
}

fn error(code: Code, path: &str, message: &str) -> WardenError {
    WardenError { path: path.into(), ..warden_error(code, message.into()) }
}

fn internal(message: String) -> Status {
    status(warden_error(Code::Unknown, message))
}

/// The gRPC status for a Warden error, with the error as its structured detail.
pub fn status(error: WardenError) -> Status {
    let grpc = match Code::try_from(error.code).unwrap_or(Code::Unknown) {
        Code::NotLeader | Code::Unavailable => GrpcCode::Unavailable,
        Code::WrongGroup | Code::BadVersion | Code::NotEmpty | Code::NoChildrenForEphemerals | Code::SessionExpired => {
            GrpcCode::FailedPrecondition
        }
        Code::NoNode => GrpcCode::NotFound,
        Code::NodeExists => GrpcCode::AlreadyExists,
        Code::InvalidPath | Code::InvalidArgument => GrpcCode::InvalidArgument,
        Code::TooLarge | Code::SequenceExhausted => GrpcCode::ResourceExhausted,
        Code::Compacted => GrpcCode::OutOfRange,
        Code::OutcomeUnknown => GrpcCode::DeadlineExceeded,
        Code::Unknown => GrpcCode::Internal,
    };
    Status::with_details(grpc, error.message.clone(), error.encode_to_vec().into())
}

/// The `WardenError` carried by a status from this service, if any.
pub fn error_of(status: &Status) -> Option<WardenError> {
    WardenError::decode(status.details()).ok().filter(|e| e.code != Code::Unknown as i32 || !e.message.is_empty())
}

#[tonic::async_trait]
impl Warden for WardenService {
    async fn create(&self, request: Request<CreateRequest>) -> Result<Response<CreateResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Create(request), timeout).await? {
            (OpResult::Create(response), header) => Ok(Response::new(CreateResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Get(request), timeout).await? {
            (QueryOutcome::Get(response), header) => Ok(Response::new(GetResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn exists(&self, request: Request<ExistsRequest>) -> Result<Response<ExistsResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Exists(request), timeout).await? {
            (QueryOutcome::Exists(response), header) => Ok(Response::new(ExistsResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn set(&self, request: Request<SetRequest>) -> Result<Response<SetResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Set(request), timeout).await? {
            (OpResult::Set(response), header) => Ok(Response::new(SetResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn delete(&self, request: Request<DeleteRequest>) -> Result<Response<DeleteResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        match self.write_one(routing.as_ref(), Op::Delete(request), timeout).await? {
            (OpResult::Delete(response), header) => Ok(Response::new(DeleteResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn get_children(&self, request: Request<GetChildrenRequest>) -> Result<Response<GetChildrenResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        match self.read(routing.as_ref(), request.consistency, QueryKind::Children(request), timeout).await? {
            (QueryOutcome::Children(response), header) => Ok(Response::new(GetChildrenResponse { header: Some(header), ..response })),
            _ => Err(internal("mismatched result".into())),
        }
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let routing = request.routing;
        Ok(Response::new(self.write(routing.as_ref(), request, timeout).await?))
    }

    async fn sync(&self, request: Request<SyncRequest>) -> Result<Response<SyncResponse>, Status> {
        let timeout = self.timeout(&request);
        let routing = request.into_inner().routing;
        let consistency = Consistency::Linearizable as i32;
        let (_, header) = self.read(routing.as_ref(), consistency, QueryKind::Revision(true), timeout).await?;
        Ok(Response::new(SyncResponse { header: Some(header) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("3000m"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(parse_grpc_timeout("m"), None);
    }
}
