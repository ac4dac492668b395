//! Building the typed errors of the namespace (`WardenError`, DESIGN.md rule 9).

use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use super::path::PathError;
use warden_engine::error::StorageError;

/// Why a namespace operation did not complete: a user-facing refusal (nothing changed) or a
/// storage failure (the node stops).
pub enum Failure {
    /// The request was refused.
    Refused(WardenError),
    /// Storage failed.
    Storage(StorageError),
}

impl From<StorageError> for Failure {
    fn from(error: StorageError) -> Self {
        Failure::Storage(error)
    }
}

impl From<WardenError> for Failure {
    fn from(error: WardenError) -> Self {
        Failure::Refused(error)
    }
}

/// An error with `code` about `path`.
pub fn error(code: Code, path: &str, message: impl Into<String>) -> WardenError {
    warden_proto::warden_error(code, path, message)
}

/// `NoNode` for `path`.
pub fn no_node(path: &str) -> WardenError {
    error(Code::NoNode, path, format!("{path} does not exist"))
}

/// `InvalidPath` for `path`.
pub fn invalid_path(path: &str, reason: &PathError) -> WardenError {
    error(Code::InvalidPath, path, format!("invalid path {path:?}: {reason}"))
}

/// `TooLarge` with the exceeded `limit`.
pub fn too_large(path: &str, what: &str, size: usize, limit: usize) -> WardenError {
    WardenError { limit: limit as u64, ..error(Code::TooLarge, path, format!("{what} of {size} exceeds the limit of {limit}")) }
}

/// `InvalidArgument`.
pub fn invalid(path: &str, message: impl Into<String>) -> WardenError {
    error(Code::InvalidArgument, path, message)
}

/// `SessionExpired`: the session does not exist (expired, closed, or never created).
pub fn session_expired(session: u64, path: &str) -> WardenError {
    error(Code::SessionExpired, path, format!("session {session:#x} has expired or does not exist"))
}
