//! Every `.proto` of Warden and the tonic/prost code generated from it, and what both ends of
//! every link share: TLS ([`tls`]), channels to an address ([`channel`]), and the rule of
//! calling a group's leader and retrying ([`follow`]).
//!
//! Architecture invariant: only this crate runs code generation. Other crates use these
//! types at their edges and convert to their own domain types.
//! Architecture invariant: the client library builds on this crate, so it carries nothing
//! only servers need (no HTTP server, metrics exporter or certificate generator: those are
//! `warden-server-kit`'s; a test in the root package checks the client's dependency tree).

/// Node-to-node raft transport (batches of opaque raft-proto messages).
pub mod transport {
    tonic::include_proto!("warden.transport");
}

/// Commands of the engine's test key-value state machine.
pub mod kv {
    tonic::include_proto!("warden.kv");
}

/// The public API: the hierarchical namespace.
pub mod v1 {
    tonic::include_proto!("warden.v1");
}

/// The namespace state machine's internal records (commands, queries, stored nodes).
pub mod namespace {
    tonic::include_proto!("warden.namespace");
}

/// Cluster administration: the routing table, shard groups, node liveness.
pub mod placement {
    tonic::include_proto!("warden.placement");
}

/// Router → shard-node batching of unary calls over one long-lived stream.
pub mod batch {
    tonic::include_proto!("warden.batch");
}

/// etcd's v3 API (`proto/etcd`, vendored unchanged from etcd 3.5/3.6): the messages, servers
/// and clients the router's etcd front end speaks. The modules mirror etcd's proto packages,
/// which the generated code names each other by (`super::mvccpb::KeyValue`).
pub mod etcd {
    /// Keys and events (`mvccpb`): `KeyValue`, `Event`.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }

    /// Users, roles and permissions (`authpb`).
    pub mod authpb {
        tonic::include_proto!("authpb");
    }

    /// The main API (`etcdserverpb`): the `KV`, `Watch`, `Lease`, `Cluster`, `Maintenance` and
    /// `Auth` services and their messages.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }

    /// The lock service (`v3lockpb`).
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }

    /// The election service (`v3electionpb`).
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}

pub mod channel;
pub mod follow;
pub mod routing;
pub mod tls;

/// Sessions one keepalive request renews at most (a router splits a request by home group,
/// and each part is within this too).
pub const KEEPALIVE_SESSIONS_MAX: usize = 1024;

/// The `grpc-timeout` header of a request, if it carries one (`<digits><unit>`, unit one
/// of H M S m u n): the caller's deadline, which servers and routers shorten theirs to.
pub fn grpc_timeout<T>(request: &tonic::Request<T>) -> Option<std::time::Duration> {
    parse_grpc_timeout(request.metadata().get("grpc-timeout")?.to_str().ok()?)
}

/// Parses a `grpc-timeout` header value.
pub fn parse_grpc_timeout(value: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
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

/// The type URL of a Warden error packed as a `google.protobuf.Any` in the details of a
/// `google.rpc.Status`.
pub const WARDEN_ERROR_TYPE_URL: &str = "type.googleapis.com/warden.v1.WardenError";

/// The gRPC status for a Warden error, with the error as its structured detail (DESIGN.md
/// rule 9): `grpc-status-details-bin` holds a `google.rpc.Status` (the status's code and
/// message again, as gRPC's rich error model has it) whose one detail is the error packed
/// as `Any`, so every language's standard helpers read it (Python's
/// `grpc_status.rpc_status.from_call`, Go's `status.FromError`). Shard-nodes and routers
/// both answer this way.
pub fn status(error: v1::WardenError) -> tonic::Status {
    use prost::Message as _;
    use tonic::Code as GrpcCode;
    use v1::warden_error::Code;
    let grpc = match Code::try_from(error.code).unwrap_or(Code::Unknown) {
        Code::NotLeader | Code::Unavailable | Code::Moved => GrpcCode::Unavailable,
        Code::WrongGroup | Code::BadVersion | Code::NotEmpty | Code::NoChildrenForEphemerals | Code::SessionExpired => GrpcCode::FailedPrecondition,
        Code::NoNode => GrpcCode::NotFound,
        Code::NodeExists => GrpcCode::AlreadyExists,
        Code::InvalidPath | Code::InvalidArgument => GrpcCode::InvalidArgument,
        Code::TooLarge | Code::SequenceExhausted | Code::SlowWatcher | Code::RateLimited | Code::ResourceExhausted => GrpcCode::ResourceExhausted,
        Code::Compacted => GrpcCode::OutOfRange,
        Code::OutcomeUnknown => GrpcCode::DeadlineExceeded,
        Code::PermissionDenied => GrpcCode::PermissionDenied,
        Code::Unauthenticated => GrpcCode::Unauthenticated,
        Code::Unknown => GrpcCode::Internal,
    };
    // Bounded again here, for errors built field by field: the message and the detail travel
    // in response headers, which HTTP/2 peers cap (DESIGN.md rule 8). (With room for the
    // length a quote adds, so what the constructor quoted passes unchanged.)
    let path = quote(&error.path, QUOTED_PATH_BYTES_MAX + QUOTE_SUFFIX_BYTES_MAX);
    let message = quote(&error.message, QUOTED_MESSAGE_BYTES_MAX + QUOTE_SUFFIX_BYTES_MAX);
    let quota = error
        .quota
        .map(|quota| Box::new(v1::QuotaExceeded { prefix: quote(&quota.prefix, QUOTED_PATH_BYTES_MAX + QUOTE_SUFFIX_BYTES_MAX), ..*quota }));
    let error = v1::WardenError { path, message, quota, ..error };
    let detail = prost_types::Any { type_url: WARDEN_ERROR_TYPE_URL.to_string(), value: error.encode_to_vec() };
    let rich = tonic_types::pb::Status { code: grpc as i32, message: error.message.clone(), details: vec![detail] };
    tonic::Status::with_details(grpc, error.message, rich.encode_to_vec().into())
}

/// How users name what a quota limits (`warden admin quota set --nodes …`, error messages).
pub fn quota_kind_name(kind: v1::QuotaKind) -> &'static str {
    match kind {
        v1::QuotaKind::QuotaNodes => "nodes",
        v1::QuotaKind::QuotaBytes => "bytes",
        v1::QuotaKind::QuotaSessions => "sessions",
        v1::QuotaKind::QuotaLockWaiters => "lock waiters",
        v1::QuotaKind::QuotaWatches => "watches",
    }
}

/// Bytes of a path an error quotes at most (DESIGN.md rule 8).
pub const QUOTED_PATH_BYTES_MAX: usize = 256;
/// Bytes of an error message at most (it may quote input).
pub const QUOTED_MESSAGE_BYTES_MAX: usize = 1024;

/// Bytes [`quote`] adds after the prefix at most (the input's length).
const QUOTE_SUFFIX_BYTES_MAX: usize = 32;

/// `text` if it has at most `max` bytes, else a prefix of it (cut at a character boundary)
/// followed by the text's full length: what an error quotes of unbounded input, so a refusal
/// stays small whatever the input's size.
pub fn quote(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// The Warden error a status carries as its detail ([`status`]), if any.
pub fn error_of(status: &tonic::Status) -> Option<v1::WardenError> {
    use prost::Message as _;
    let rich = tonic_types::pb::Status::decode(status.details()).ok()?;
    let detail = rich.details.iter().find(|detail| detail.type_url == WARDEN_ERROR_TYPE_URL)?;
    v1::WardenError::decode(detail.value.as_slice()).ok()
}

/// A Warden error with `code`, `message` and the `path` it concerns (may be empty).
/// Both are bounded ([`quote`]): an error never repeats unbounded input whole.
pub fn warden_error(code: v1::warden_error::Code, path: &str, message: impl Into<String>) -> v1::WardenError {
    let message = quote(&message.into(), QUOTED_MESSAGE_BYTES_MAX);
    v1::WardenError { code: code as i32, path: quote(path, QUOTED_PATH_BYTES_MAX), message, ..v1::WardenError::default() }
}

/// Groups' start revisions one watch creation names at most
/// (`WatchCreate.group_start_revisions`): a client's map grows by one per group its watch
/// passed through, so this bounds what a node keeps per watch while it catches up.
pub const WATCH_GROUP_START_REVISIONS_MAX: usize = 1024;

/// Refuses a watch creation naming more than [`WATCH_GROUP_START_REVISIONS_MAX`] groups'
/// start revisions, TOO_LARGE (not retried): a router checks it before fanning the watch out
/// to its groups, a node again for clients that reach it directly.
pub fn check_group_start_revisions(create: &v1::WatchCreate) -> Result<(), v1::WardenError> {
    let named = create.group_start_revisions.len();
    if named > WATCH_GROUP_START_REVISIONS_MAX {
        let message = format!("the watch names {named} groups' start revisions; at most {WATCH_GROUP_START_REVISIONS_MAX}");
        let error = warden_error(v1::warden_error::Code::TooLarge, &create.path, message);
        return Err(v1::WardenError { limit: WATCH_GROUP_START_REVISIONS_MAX as u64, ..error });
    }
    Ok(())
}

/// Encoded `FileDescriptorSet` of every Warden proto, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("warden_descriptor");

/// Largest `warden.v1.Warden` response a router or client accepts (and a router sends).
pub const RESPONSE_BYTES_MAX: usize = 64 << 20;

/// Items one `warden.batch` message carries at most (requests and responses alike).
pub const BATCH_ITEMS_MAX: usize = 256;
/// Payload bytes past which a `warden.batch` message takes no further item (one item alone
/// may be larger: it is bounded by its own message's limit).
pub const BATCH_BYTES_MAX: usize = 4 << 20;
/// Items of one batch stream in flight at a node at most: a router sends no more until some
/// are answered, and a node stops reading the stream at this bound.
pub const BATCH_ITEMS_IN_FLIGHT_MAX: usize = 4096;

/// Whether a failed call provably never reached a server (the connection was refused or could
/// not be made): only then is a write safe to send again. The one judgement shared by the
/// router and the client library.
pub fn never_sent(status: &tonic::Status) -> bool {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(&format!(": {error}"));
        source = error.source();
    }
    status.code() == tonic::Code::Unavailable && (text.contains("tcp connect error") || text.contains("Connection refused"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("3000m"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(parse_grpc_timeout("m"), None);
    }

    #[test]
    fn errors_quote_a_bounded_prefix_of_their_input() {
        let path = format!("/{}", "é".repeat(50_000));
        let error = warden_error(v1::warden_error::Code::InvalidPath, &path, format!("invalid path {path:?}"));
        assert!(error.path.len() < QUOTED_PATH_BYTES_MAX + 32 && error.path.ends_with(&format!("({} bytes)", path.len())), "{}", error.path);
        assert!(error.message.len() < QUOTED_MESSAGE_BYTES_MAX + 32, "{}", error.message.len());
        assert_eq!(quote("/short", 256), "/short");
        assert_eq!(error_of(&status(error.clone())).map(|e| e.path), Some(error.path.clone()), "a quote is not quoted again");
        let status = status(v1::WardenError { message: "x".repeat(100_000), ..error });
        assert!(status.message().len() < QUOTED_MESSAGE_BYTES_MAX + 2 * QUOTE_SUFFIX_BYTES_MAX);
        assert!(status.details().len() < 2 * (QUOTED_MESSAGE_BYTES_MAX + QUOTED_PATH_BYTES_MAX));
    }

    #[test]
    fn an_error_travels_as_a_google_rpc_status_whose_one_detail_is_the_warden_error() {
        use prost::Message as _;
        let error = warden_error(v1::warden_error::Code::NoNode, "/a/b", "no node /a/b");
        let answer = status(error.clone());
        let rich = tonic_types::pb::Status::decode(answer.details()).expect("the detail is a google.rpc.Status");
        assert_eq!((rich.code, rich.message.as_str()), (tonic::Code::NotFound as i32, answer.message()), "the status's own code and message");
        assert_eq!(rich.details.len(), 1);
        assert_eq!(rich.details[0].type_url, "type.googleapis.com/warden.v1.WardenError");
        assert_eq!(v1::WardenError::decode(rich.details[0].value.as_slice()).ok().as_ref(), Some(&error));
        assert_eq!(error_of(&answer), Some(error.clone()));

        let raw = tonic::Status::with_details(tonic::Code::NotFound, "no node", error.encode_to_vec().into());
        assert_eq!(error_of(&raw), None, "bare error bytes are no google.rpc.Status");
        let other = tonic_types::pb::Status {
            code: tonic::Code::NotFound as i32,
            message: "no node".into(),
            details: vec![prost_types::Any { type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(), value: error.encode_to_vec() }],
        };
        let foreign = tonic::Status::with_details(tonic::Code::NotFound, "no node", other.encode_to_vec().into());
        assert_eq!(error_of(&foreign), None, "a detail of another type is not read as a Warden error");
        assert_eq!(error_of(&tonic::Status::not_found("no node")), None);
    }
}
