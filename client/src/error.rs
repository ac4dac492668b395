//! The errors of every call: one variant per Warden error code a caller acts on, plus the
//! failures of the connection itself. A gRPC status becomes an [`Error`] here and nowhere else.

use tonic::{Code as GrpcCode, Status};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

/// The result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node does not exist (or, for a create, its parent does not).
    #[error("no node {path}")]
    NoNode {
        /// The missing node.
        path: String,
    },
    /// A create found the node already there.
    #[error("node {path} already exists")]
    NodeExists {
        /// The existing node.
        path: String,
    },
    /// The node's version was not the expected one (a failed compare-and-swap).
    #[error("version mismatch at {path}")]
    BadVersion {
        /// The node compared.
        path: String,
    },
    /// A delete of a node that still has children (delete recursively instead).
    #[error("{path} has children")]
    NotEmpty {
        /// The node with children.
        path: String,
    },
    /// A create below an ephemeral node.
    #[error("ephemeral node {path} cannot have children")]
    NoChildrenForEphemerals {
        /// The ephemeral parent.
        path: String,
    },
    /// The session has ended (expired or closed); its ephemerals and locks are gone.
    #[error("the session has expired")]
    SessionExpired,
    /// The path is malformed, too long or reserved.
    #[error("invalid path {path:?}: {message}")]
    InvalidPath {
        /// The refused path.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value, path, request or listing exceeded a limit.
    #[error("too large (limit {limit}): {message}")]
    TooLarge {
        /// The limit exceeded.
        limit: u64,
        /// What exceeded it.
        message: String,
    },
    /// This client's principal is over its request rate at the router: try again later (the
    /// client does not retry it: waiting is the caller's choice).
    #[error("rate limited ({requests_per_s} requests/s): {message}")]
    RateLimited {
        /// The rate allowed, in requests per second.
        requests_per_s: u64,
        /// The router's explanation.
        message: String,
    },
    /// Security is on and the caller's principal may not do this on `path` (no grant of the
    /// permission it needs there, or the session named is another principal's).
    #[error("permission denied on {path:?}: {message}")]
    PermissionDenied {
        /// The path refused (empty when the call has none).
        path: String,
        /// The server's explanation.
        message: String,
    },
    /// Security is on and the call carried no credential the server accepts.
    #[error("unauthenticated: {message}")]
    Unauthenticated {
        /// The server's explanation.
        message: String,
    },
    /// A quota of the subtree `prefix` would be exceeded (`warden admin quota`); nothing was
    /// changed. Delete something under `prefix`, or have an admin raise the quota.
    #[error("quota exceeded: {message}")]
    QuotaExceeded {
        /// The quota's prefix.
        prefix: String,
        /// What it limits: `nodes`, `bytes`, `sessions`, `lock waiters` or `watches`.
        kind: &'static str,
        /// The quota's limit.
        limit: u64,
        /// The server's explanation.
        message: String,
    },
    /// A watch asked for events older than the history kept: re-read, then watch from the
    /// read's revision + 1 (at least `revision + 1`).
    #[error("events up to revision {revision} are compacted")]
    Compacted {
        /// The last revision no longer available.
        revision: u64,
    },
    /// A sequential create found the parent's counter exhausted.
    #[error("the sequence of {path} is exhausted")]
    SequenceExhausted {
        /// The parent whose counter ran out.
        path: String,
    },
    /// A watch could not keep up with its events and was cancelled by the server.
    #[error("slow watcher: {message}")]
    SlowWatcher {
        /// The server's explanation.
        message: String,
    },
    /// A watch's subtree moved to another group (a split or merge): the [`crate::Watcher`]
    /// resumes there by itself; a caller sees this only from a raw stream.
    #[error("{path} moved to group {to_group}")]
    Moved {
        /// The root of the subtree that moved.
        path: String,
        /// The group serving it now.
        to_group: u64,
    },
    /// The request was malformed or not allowed (for example a transaction spanning groups).
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// The server's explanation.
        message: String,
    },
    /// The path is served by another group than the one asked (routers handle this; a
    /// caller sees it only if the routing table stays wrong until the deadline).
    #[error("wrong group: {message}")]
    WrongGroup {
        /// The server's explanation.
        message: String,
    },
    /// The replica asked is not the group's leader (routers follow the hint; a caller sees
    /// it only if no leader answered before the deadline). Nothing was applied.
    #[error("not the leader: {message}")]
    NotLeader {
        /// The server's explanation.
        message: String,
    },
    /// The group could not serve the request (no quorum, no leader yet). Nothing was applied.
    #[error("unavailable: {message}")]
    Unavailable {
        /// The server's explanation.
        message: String,
    },
    /// A write may or may not have been applied (its deadline passed, or its connection was
    /// lost after it was sent); it was not sent again. Read to find out.
    #[error("outcome unknown: {message}")]
    OutcomeUnknown {
        /// Why the outcome is unknown.
        message: String,
    },
    /// The server failed in a way it did not classify.
    #[error("server error: {message}")]
    Server {
        /// The server's explanation.
        message: String,
    },
    /// No router could be reached, or the connection failed (for reads, after retrying every
    /// router until the deadline).
    #[error("transport: {message}")]
    Transport {
        /// The failure, with its causes.
        message: String,
    },
    /// The call's deadline passed before an answer (reads; a write whose deadline passes is
    /// [`Error::OutcomeUnknown`]).
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The server answered something this client cannot interpret.
    #[error("protocol: {message}")]
    Protocol {
        /// What was wrong with the answer.
        message: String,
    },
}

impl Error {
    /// The error a status carries: its Warden detail when it has one, else what its gRPC code
    /// says about the connection.
    pub(crate) fn from_status(status: &Status) -> Error {
        match warden_proto::error_of(status) {
            Some(detail) => Error::from_detail(detail),
            None => Error::without_detail(status),
        }
    }

    /// The typed form of a Warden error.
    pub(crate) fn from_detail(error: WardenError) -> Error {
        let WardenError { code, message, path, compact_revision, limit, moved_to_group: error_moved_to, quota, .. } = error;
        match Code::try_from(code) {
            Ok(Code::NoNode) => Error::NoNode { path },
            Ok(Code::NodeExists) => Error::NodeExists { path },
            Ok(Code::BadVersion) => Error::BadVersion { path },
            Ok(Code::NotEmpty) => Error::NotEmpty { path },
            Ok(Code::NoChildrenForEphemerals) => Error::NoChildrenForEphemerals { path },
            Ok(Code::SessionExpired) => Error::SessionExpired,
            Ok(Code::InvalidPath) => Error::InvalidPath { path, message },
            Ok(Code::TooLarge) => Error::TooLarge { limit, message },
            Ok(Code::RateLimited) => Error::RateLimited { requests_per_s: limit, message },
            Ok(Code::PermissionDenied) => Error::PermissionDenied { path, message },
            Ok(Code::Unauthenticated) => Error::Unauthenticated { message },
            Ok(Code::ResourceExhausted) => {
                let quota = quota.map(|quota| *quota).unwrap_or_default();
                let kind = warden_proto::v1::QuotaKind::try_from(quota.kind).map_or("unknown", warden_proto::quota_kind_name);
                Error::QuotaExceeded { prefix: quota.prefix, kind, limit: quota.limit, message }
            }
            Ok(Code::Compacted) => Error::Compacted { revision: compact_revision },
            Ok(Code::SequenceExhausted) => Error::SequenceExhausted { path },
            Ok(Code::SlowWatcher) => Error::SlowWatcher { message },
            Ok(Code::Moved) => Error::Moved { path, to_group: error_moved_to },
            Ok(Code::InvalidArgument) => Error::InvalidArgument { message },
            Ok(Code::WrongGroup) => Error::WrongGroup { message },
            Ok(Code::NotLeader) => Error::NotLeader { message },
            Ok(Code::Unavailable) => Error::Unavailable { message },
            Ok(Code::OutcomeUnknown) => Error::OutcomeUnknown { message },
            Ok(Code::Unknown) => Error::Server { message },
            Err(_) => Error::Protocol { message: format!("unknown Warden error code {code}: {message}") },
        }
    }

    /// The error of a status without a Warden detail: a failed connection, or a refusal by
    /// the gRPC layer itself.
    fn without_detail(status: &Status) -> Error {
        let message = describe(status);
        match status.code() {
            GrpcCode::InvalidArgument => Error::InvalidArgument { message },
            GrpcCode::ResourceExhausted | GrpcCode::OutOfRange => Error::TooLarge { limit: 0, message },
            code if warden_proto::follow::is_connection_failure(code) => Error::Transport { message },
            _ => Error::Protocol { message },
        }
    }
}

/// A status's message followed by its chain of causes.
fn describe(status: &Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_become_typed_errors() {
        let detail = warden_proto::warden_error(Code::BadVersion, "/a", "expected 3");
        assert_eq!(Error::from_status(&warden_proto::status(detail)), Error::BadVersion { path: "/a".into() });
        let compacted = WardenError { code: Code::Compacted as i32, compact_revision: 41, ..WardenError::default() };
        assert_eq!(Error::from_status(&warden_proto::status(compacted)), Error::Compacted { revision: 41 });
        assert!(matches!(Error::from_status(&Status::unavailable("tcp connect error")), Error::Transport { .. }));
        assert!(matches!(Error::from_status(&Status::unimplemented("no such method")), Error::Protocol { .. }));
    }
}
