//! The one place the client's types meet the generated protobuf types: requests are built
//! here, and responses are checked and converted here. Nothing from the network is trusted:
//! a missing field, an unknown enum value or a mismatched result is [`Error::Protocol`].

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use warden_proto::v1 as pb;

use crate::children::{Child, ChildrenPage};
use crate::error::{Error, Result};
use crate::lock::{LockInfo, LockMode, LockOptions, LockWaiter, Sequencer};
use crate::node::{Consistency, CreateMode, CreateOptions, Created, Node, NodeKind, Stat};
use crate::session::{SessionId, SessionInfo, SessionLease};
use crate::txn::{Compare, CompareOp, CompareTarget, Txn, TxnOp, TxnOpResult, TxnResult};
use crate::watch::{EventKind, WatchEvent, WatchOptions};

fn protocol(message: impl Into<String>) -> Error {
    Error::Protocol { message: message.into() }
}

/// A duration in whole milliseconds (saturating).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A wall-clock time given in milliseconds since the Unix epoch.
fn wall_time(ms: u64) -> Result<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_millis(ms)).ok_or_else(|| protocol(format!("time {ms} ms is out of range")))
}

pub(crate) fn consistency(consistency: Consistency) -> i32 {
    match consistency {
        Consistency::Linearizable => pb::Consistency::Linearizable as i32,
        Consistency::Stale => pb::Consistency::Stale as i32,
    }
}

pub(crate) fn stat(stat: pb::Stat) -> Result<Stat> {
    let kind = match pb::NodeKind::try_from(stat.kind) {
        Ok(pb::NodeKind::Persistent) => NodeKind::Persistent,
        Ok(pb::NodeKind::Container) => NodeKind::Container,
        Ok(pb::NodeKind::Ttl) => NodeKind::Ttl,
        Err(_) => return Err(protocol(format!("unknown node kind {}", stat.kind))),
    };
    Ok(Stat {
        create_revision: stat.create_revision,
        mod_revision: stat.mod_revision,
        version: stat.version,
        cversion: stat.cversion,
        ephemeral_owner: (stat.ephemeral_owner != 0).then_some(SessionId(stat.ephemeral_owner)),
        num_children: stat.num_children,
        ctime: wall_time(stat.ctime_ms)?,
        mtime: wall_time(stat.mtime_ms)?,
        data_length: stat.data_length,
        kind,
        ttl: (stat.ttl_ms != 0).then_some(Duration::from_millis(stat.ttl_ms)),
    })
}

pub(crate) fn required_stat(stat: Option<pb::Stat>) -> Result<Stat> {
    self::stat(stat.ok_or_else(|| protocol("a response lacks its stat"))?)
}

pub(crate) fn node(path: String, data: Vec<u8>, stat: Option<pb::Stat>) -> Result<Node> {
    Ok(Node { path, data, stat: required_stat(stat)? })
}

pub(crate) fn revision(header: Option<pb::ResponseHeader>) -> Result<u64> {
    header.map(|h| h.revision).ok_or_else(|| protocol("a response lacks its header"))
}

pub(crate) fn create_request(path: &str, data: Vec<u8>, options: &CreateOptions) -> pb::CreateRequest {
    let (kind, session_id, ttl_ms) = match &options.mode {
        CreateMode::Persistent => (pb::NodeKind::Persistent, 0, 0),
        CreateMode::Ephemeral(session) => (pb::NodeKind::Persistent, session.0, 0),
        CreateMode::Container => (pb::NodeKind::Container, 0, 0),
        CreateMode::Ttl(ttl) => (pb::NodeKind::Ttl, 0, millis(*ttl)),
    };
    pb::CreateRequest {
        path: path.into(),
        data,
        kind: kind as i32,
        sequential: options.sequential,
        create_parents: options.create_parents,
        ttl_ms,
        session_id,
        routing: None,
    }
}

pub(crate) fn created(response: pb::CreateResponse) -> Result<Created> {
    Ok(Created { path: response.path, stat: required_stat(response.stat)? })
}

pub(crate) fn children_page(response: pb::GetChildrenResponse, with_stats: bool) -> Result<(ChildrenPage, bool)> {
    let (names, stats) = (response.names, response.stats);
    let children = if with_stats {
        if stats.len() != names.len() {
            return Err(protocol(format!("{} names but {} stats", names.len(), stats.len())));
        }
        names.into_iter().zip(stats).map(|(name, stat)| Ok(Child { name, stat: Some(self::stat(stat)?) })).collect::<Result<Vec<_>>>()?
    } else {
        names.into_iter().map(|name| Child { name, stat: None }).collect()
    };
    let page = ChildrenPage { children, parent: required_stat(response.stat)?, revision: revision(response.header)? };
    Ok((page, response.more))
}

fn compare_op(op: CompareOp) -> pb::compare::Op {
    match op {
        CompareOp::Equal => pb::compare::Op::Equal,
        CompareOp::NotEqual => pb::compare::Op::NotEqual,
        CompareOp::Less => pb::compare::Op::Less,
        CompareOp::Greater => pb::compare::Op::Greater,
    }
}

fn compare(compare: &Compare) -> pb::Compare {
    use pb::compare::Target;
    let mut out = pb::Compare { path: compare.path.clone(), ..pb::Compare::default() };
    let (target, op) = match &compare.target {
        CompareTarget::Version(op, n) => {
            out.number = *n;
            (Target::Version, *op)
        }
        CompareTarget::CreateRevision(op, n) => {
            out.number = *n;
            (Target::CreateRevision, *op)
        }
        CompareTarget::ModRevision(op, n) => {
            out.number = *n;
            (Target::ModRevision, *op)
        }
        CompareTarget::Value(op, value) => {
            out.value = value.clone();
            (Target::Value, *op)
        }
        CompareTarget::Exists(exists) => {
            out.exists = *exists;
            (Target::Exists, CompareOp::Equal)
        }
    };
    out.target = target as i32;
    out.op = compare_op(op) as i32;
    out
}

fn txn_op(op: &TxnOp) -> pb::TxnOp {
    use pb::txn_op::Op;
    let op = match op {
        TxnOp::Create { path, data, options } => Op::Create(create_request(path, data.clone(), options)),
        TxnOp::Set { path, data, expected_version } => {
            Op::Set(pb::SetRequest { path: path.clone(), data: data.clone(), expected_version: *expected_version, routing: None })
        }
        TxnOp::Delete { path, options } => Op::Delete(pb::DeleteRequest {
            path: path.clone(),
            expected_version: options.expected_version,
            recursive: options.recursive,
            routing: None,
        }),
        TxnOp::Get { path } => Op::Get(pb::GetRequest { path: path.clone(), ..pb::GetRequest::default() }),
    };
    pb::TxnOp { op: Some(op) }
}

pub(crate) fn txn_request(txn: &Txn) -> pb::TxnRequest {
    pb::TxnRequest {
        compares: txn.compares.iter().map(compare).collect(),
        then: txn.then.iter().map(txn_op).collect(),
        r#else: txn.otherwise.iter().map(txn_op).collect(),
        raise_to: 0,
        routing: None,
    }
}

/// The results of the branch of `txn` that ran, paired with its operations.
pub(crate) fn txn_result(response: pb::TxnResponse, txn: &Txn) -> Result<TxnResult> {
    use pb::txn_op_result::Result as OpResult;
    let ran = if response.succeeded { &txn.then } else { &txn.otherwise };
    if response.results.len() != ran.len() {
        return Err(protocol(format!("{} results for {} operations", response.results.len(), ran.len())));
    }
    let results = ran
        .iter()
        .zip(response.results)
        .map(|(op, result)| match (op, result.result) {
            (TxnOp::Create { .. }, Some(OpResult::Create(created))) => Ok(TxnOpResult::Created(self::created(created)?)),
            (TxnOp::Set { .. }, Some(OpResult::Set(set))) => Ok(TxnOpResult::Set(required_stat(set.stat)?)),
            (TxnOp::Delete { .. }, Some(OpResult::Delete(deleted))) => Ok(TxnOpResult::Deleted(deleted.deleted)),
            (TxnOp::Get { path }, Some(OpResult::Get(got))) => {
                let node = got.stat.map(|stat| node(path.clone(), got.data, Some(stat))).transpose()?;
                Ok(TxnOpResult::Got(node))
            }
            (op, result) => Err(protocol(format!("result {result:?} does not answer {op:?}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TxnResult { succeeded: response.succeeded, revision: revision(response.header)?, results })
}

pub(crate) fn created_session(response: pb::CreateSessionResponse) -> Result<(SessionId, Duration)> {
    if response.session_id == 0 {
        return Err(protocol("a session was created without an id"));
    }
    Ok((SessionId(response.session_id), Duration::from_millis(response.granted_ttl_ms)))
}

fn lease(lease: pb::SessionLease) -> SessionLease {
    SessionLease {
        alive: lease.alive,
        granted_ttl: Duration::from_millis(lease.granted_ttl_ms),
        remaining: Duration::from_millis(lease.remaining_ms),
    }
}

/// The lease of session `id` among a keepalive's answers.
pub(crate) fn lease_of(id: SessionId, leases: Vec<pb::SessionLease>) -> Result<SessionLease> {
    leases.into_iter().find(|l| l.session_id == id.0).map(lease).ok_or_else(|| protocol(format!("a keepalive answer lacks session {id}")))
}

pub(crate) fn session_info(response: pb::SessionInfoResponse) -> Result<SessionInfo> {
    let lease = response.lease.map(lease).ok_or_else(|| protocol("session info without a lease"))?;
    Ok(SessionInfo { lease, ephemerals: response.ephemerals })
}

fn lock_mode_request(mode: LockMode) -> i32 {
    match mode {
        LockMode::Exclusive => pb::LockMode::Exclusive as i32,
        LockMode::Shared => pb::LockMode::Shared as i32,
    }
}

fn lock_mode(mode: i32) -> Result<LockMode> {
    match pb::LockMode::try_from(mode) {
        Ok(pb::LockMode::Exclusive) => Ok(LockMode::Exclusive),
        Ok(pb::LockMode::Shared) => Ok(LockMode::Shared),
        Err(_) => Err(protocol(format!("unknown lock mode {mode}"))),
    }
}

/// A `Lock` call waiting up to `wait` (not at all when zero), leaving its waiter queued when
/// the wait ends.
pub(crate) fn lock_request(session: SessionId, path: &str, options: &LockOptions, wait: Duration, request_id: u64) -> pb::LockRequest {
    pb::LockRequest {
        path: path.into(),
        session_id: session.0,
        mode: lock_mode_request(options.mode),
        wait: !wait.is_zero(),
        timeout_ms: millis(wait),
        lock_delay_ms: millis(options.lock_delay),
        request_id,
        // A longer wait is a series of calls re-attaching to one waiter (see `lock::acquire`).
        keep_queued: !wait.is_zero(),
        routing: None,
    }
}

pub(crate) fn lock_response(response: pb::LockResponse) -> Result<Option<Sequencer>> {
    if !response.acquired {
        return Ok(None);
    }
    let sequencer = response.sequencer.ok_or_else(|| protocol("a lock was acquired without a sequencer"))?;
    Ok(Some(Sequencer {
        path: sequencer.path,
        mode: lock_mode(sequencer.mode)?,
        token: sequencer.token,
        group_id: sequencer.group_id,
        waiter: sequencer.waiter,
    }))
}

pub(crate) fn sequencer_request(sequencer: &Sequencer) -> pb::Sequencer {
    pb::Sequencer {
        path: sequencer.path.clone(),
        mode: lock_mode_request(sequencer.mode),
        token: sequencer.token,
        group_id: sequencer.group_id,
        waiter: sequencer.waiter.clone(),
    }
}

fn lock_waiter(waiter: pb::LockWaiter) -> Result<LockWaiter> {
    Ok(LockWaiter { mode: lock_mode(waiter.mode)?, waiter: waiter.waiter, session: SessionId(waiter.session_id), token: waiter.token })
}

pub(crate) fn lock_info(response: pb::LockInfoResponse) -> Result<LockInfo> {
    Ok(LockInfo {
        holders: response.holders.into_iter().map(lock_waiter).collect::<Result<_>>()?,
        waiters: response.waiters.into_iter().map(lock_waiter).collect::<Result<_>>()?,
        blocked_until: (response.blocked_until_ms != 0).then(|| wall_time(response.blocked_until_ms)).transpose()?,
    })
}

/// The creation of a persistent watch of `options` from `start_revision` (in the group serving
/// its path) and `group_start_revisions` (per group, that serving the path included).
pub(crate) fn watch_create(options: &WatchOptions, start_revision: u64, group_start_revisions: HashMap<u64, u64>) -> pb::WatchCreate {
    pb::WatchCreate {
        path: options.path.clone(),
        kind: pb::watch_create::Kind::Persistent as i32,
        recursive: options.recursive,
        start_revision,
        no_create: !options.kinds.created,
        no_delete: !options.kinds.deleted,
        no_change: !options.kinds.changed,
        prev_data: options.prev_data,
        group_start_revisions,
        ..pb::WatchCreate::default()
    }
}

/// An event of a response from group `group_id`.
pub(crate) fn watch_event(event: pb::WatchEvent, group_id: u64) -> Result<WatchEvent> {
    let kind = match pb::watch_event::Type::try_from(event.r#type) {
        Ok(pb::watch_event::Type::Created) => EventKind::Created,
        Ok(pb::watch_event::Type::Changed) => EventKind::Changed,
        Ok(pb::watch_event::Type::Deleted) => EventKind::Deleted,
        Err(_) => return Err(protocol(format!("unknown event type {}", event.r#type))),
    };
    let prev = event.prev_stat.map(|stat| node(event.path.clone(), event.prev_data.to_vec(), Some(stat))).transpose()?;
    Ok(WatchEvent { kind, group_id, revision: event.revision, node: node(event.path, event.data.to_vec(), event.stat)?, prev })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_answers_are_protocol_errors() {
        assert!(matches!(required_stat(None), Err(Error::Protocol { .. })));
        assert!(matches!(stat(pb::Stat { kind: 99, ..pb::Stat::default() }), Err(Error::Protocol { .. })));
        let unpaired = pb::GetChildrenResponse { names: vec!["a".into()], stat: Some(pb::Stat::default()), ..Default::default() };
        assert!(matches!(children_page(unpaired, true), Err(Error::Protocol { .. })));
        let txn = Txn::new().then(TxnOp::get("/a"));
        let short = pb::TxnResponse { succeeded: true, ..pb::TxnResponse::default() };
        assert!(matches!(txn_result(short, &txn), Err(Error::Protocol { .. })));
        let mismatched = pb::TxnResponse {
            succeeded: true,
            header: Some(pb::ResponseHeader::default()),
            results: vec![pb::TxnOpResult { result: Some(pb::txn_op_result::Result::Delete(pb::DeleteResponse::default())) }],
        };
        assert!(matches!(txn_result(mismatched, &txn), Err(Error::Protocol { .. })));
        assert!(matches!(lock_response(pb::LockResponse { acquired: true, ..Default::default() }), Err(Error::Protocol { .. })));
    }

    #[test]
    fn requests_carry_every_option() {
        let create = create_request("/e", vec![1], &CreateOptions::ephemeral(SessionId(7)).sequential().create_parents());
        assert_eq!((create.session_id, create.sequential, create.create_parents), (7, true, true));
        let ttl = create_request("/t", vec![], &CreateOptions::ttl(Duration::from_secs(2)));
        assert_eq!((ttl.kind, ttl.ttl_ms), (pb::NodeKind::Ttl as i32, 2000));
        let txn = Txn::new().when(Compare::exists("/a", false)).then(TxnOp::get("/a")).or_else(TxnOp::get("/b"));
        let request = txn_request(&txn);
        assert_eq!((request.compares.len(), request.then.len(), request.r#else.len()), (1, 1, 1));
        assert_eq!(request.compares[0].target, pb::compare::Target::Exists as i32);
    }
}
