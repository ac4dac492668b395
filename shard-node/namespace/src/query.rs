//! Reads of the namespace, answered from the applied state on disk.

use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::namespace::{Query, QueryResult, SessionIds, WaiterState};
use warden_proto::v1::{CheckSequencerResponse, ExistsResponse, GetChildrenResponse, GetResponse, GroupDescriptor, LockInfoResponse};

use super::error::{invalid, invalid_path, no_node, too_large, Failure};
use super::{descriptor, locks, path, ranges, sessions, store, Limits};
use warden_engine::error::{EngineError, StorageError};
use warden_engine::state_machine::SmReader;

/// Runs an encoded [`Query`] at `revision`, for a group serving `descriptor`.
pub fn run(
    reader: &SmReader,
    limits: &Limits,
    revision: u64,
    descriptor: Option<&GroupDescriptor>,
    split: &warden_proto::namespace::SplitState,
    query: Query,
) -> Result<QueryResult, EngineError> {
    let path = match &query.query {
        Some(QueryKind::Get(get)) => Some(get.path.as_str()),
        Some(QueryKind::Exists(exists)) => Some(exists.path.as_str()),
        Some(QueryKind::Children(children)) => Some(children.path.as_str()),
        Some(QueryKind::Range(range)) => Some(range.path.as_str()),
        Some(QueryKind::LockInfo(lock) | QueryKind::CheckSequencer(lock) | QueryKind::Waiter(lock)) => Some(lock.path.as_str()),
        Some(QueryKind::Revision(_) | QueryKind::Sessions(_) | QueryKind::ExportSubtree(_) | QueryKind::ChildWrites(_)) | None => None,
    };
    if let Some(Err(error)) = path.map(|path| descriptor::check_served(descriptor, path)) {
        return Ok(QueryResult { revision, result: Some(QueryOutcome::Error(error)) });
    }
    let outcome = match answer(reader, limits, descriptor, split, query) {
        Ok(outcome) => outcome,
        Err(Failure::Refused(error)) => QueryOutcome::Error(error),
        Err(Failure::Storage(error)) => return Err(EngineError::busy(error.to_string())),
    };
    Ok(QueryResult { revision, result: Some(outcome) })
}

fn node(reader: &SmReader, path: &str) -> Result<Option<warden_proto::namespace::NodeRecord>, Failure> {
    path::validate(path, true).map_err(|e| invalid_path(path, &e))?;
    Ok(match store::read_node(reader, path)? {
        None if path == "/" => Some(store::implicit_root()),
        found => found,
    })
}

/// The waiters and metadata of the lock at `path` (none if it is not a lock).
fn lock_state(
    reader: &SmReader,
    lock_path: &str,
    waiters_max: usize,
) -> Result<(Vec<locks::Waiter>, Option<warden_proto::namespace::LockMeta>), Failure> {
    path::validate(lock_path, false).map_err(|e| invalid_path(lock_path, &e))?;
    let view = store::TxnView::new(reader, None);
    let Some(meta) = view.lock_meta(lock_path)? else { return Ok((Vec::new(), None)) };
    Ok((locks::waiters(&view, lock_path, waiters_max)?, Some(meta)))
}

fn answer(
    reader: &SmReader,
    limits: &Limits,
    descriptor: Option<&GroupDescriptor>,
    split: &warden_proto::namespace::SplitState,
    query: Query,
) -> Result<QueryOutcome, Failure> {
    Ok(match query.query {
        Some(QueryKind::ExportSubtree(export)) => QueryOutcome::SubtreePage(super::split::export(reader, descriptor, split, &export)?),
        // Counted in the state machine's memory, not stored: it answers these itself.
        Some(QueryKind::ChildWrites(_)) => return Err(invalid("", "child writes are not stored").into()),
        Some(QueryKind::Get(get)) => {
            let record = node(reader, &get.path)?.ok_or_else(|| no_node(&get.path))?;
            QueryOutcome::Get(GetResponse { header: None, data: record.data, stat: record.stat })
        }
        Some(QueryKind::Exists(exists)) => {
            let stat = node(reader, &exists.path)?.and_then(|record| record.stat);
            QueryOutcome::Exists(ExistsResponse { header: None, stat })
        }
        Some(QueryKind::Children(request)) => {
            let parent = node(reader, &request.path)?.ok_or_else(|| no_node(&request.path))?;
            let limit = match request.limit as usize {
                0 => limits.children_page_max,
                n if n > limits.children_page_max => {
                    return Err(too_large(&request.path, "children page", n, limits.children_page_max).into());
                }
                n => n,
            };
            let (names, more) = store::read_children(reader, &request.path, &request.start_after, limit)?;
            let mut stats = Vec::new();
            if request.with_stats {
                for name in &names {
                    let child = path::join(&request.path, name);
                    let record =
                        store::read_node(reader, &child)?.ok_or_else(|| StorageError::Corrupt(format!("child {child} indexed but missing")))?;
                    stats.push(record.stat.unwrap_or_default());
                }
            }
            QueryOutcome::Children(GetChildrenResponse { header: None, names, stats, more, stat: parent.stat })
        }
        Some(QueryKind::Revision(_)) => QueryOutcome::Exists(ExistsResponse::default()),
        Some(QueryKind::Range(request)) => {
            let view = store::TxnView::new(reader, None);
            QueryOutcome::Range(ranges::scan(&view, descriptor, &request, limits.children_page_max, ranges::RANGE_COUNT_NODES_MAX)?)
        }
        Some(QueryKind::LockInfo(query)) => {
            let (waiters, meta) = lock_state(reader, &query.path, limits.lock_waiters_max)?;
            let holding = locks::holders(&waiters, meta.as_ref());
            QueryOutcome::LockInfo(LockInfoResponse {
                header: None,
                holders: waiters[..holding].iter().map(locks::Waiter::to_proto).collect(),
                waiters: waiters[holding..].iter().map(locks::Waiter::to_proto).collect(),
                blocked_until_ms: meta.map_or(0, |m| m.blocked_until_ms),
            })
        }
        Some(QueryKind::CheckSequencer(query)) => {
            let sequencer = query.sequencer.unwrap_or_default();
            let (waiters, meta) = lock_state(reader, &sequencer.path, limits.lock_waiters_max)?;
            let holding = locks::holders(&waiters, meta.as_ref());
            let holds = waiters[..holding].iter().any(|w| w.path == sequencer.waiter && w.token == sequencer.token);
            QueryOutcome::CheckSequencer(CheckSequencerResponse { header: None, holds })
        }
        Some(QueryKind::Waiter(query)) => {
            let sequencer = query.sequencer.unwrap_or_default();
            let (waiters, meta) = lock_state(reader, &sequencer.path, limits.lock_waiters_max)?;
            let holding = locks::holders(&waiters, meta.as_ref());
            let position = waiters.iter().position(|w| w.path == sequencer.waiter && w.token == sequencer.token);
            let session_alive = store::TxnView::new(reader, None).session(query.session_id)?.is_some();
            QueryOutcome::Waiter(WaiterState { queued: position.is_some(), holds: position.is_some_and(|i| i < holding), session_alive })
        }
        Some(QueryKind::Sessions(SessionIds { session_ids, checker_group, .. })) => {
            if session_ids.len() > sessions::SESSION_IDS_PER_CHECK_MAX {
                return Err(too_large("", "sessions asked about at once", session_ids.len(), sessions::SESSION_IDS_PER_CHECK_MAX).into());
            }
            let view = store::TxnView::new(reader, None);
            let mut present = Vec::new();
            let mut owners = Vec::new();
            let mut owners_unknown = Vec::new();
            let mut unnoted = Vec::new();
            for id in session_ids {
                if let Some(record) = view.session(id)? {
                    present.push(id);
                    if checker_group != 0 && !record.remote && !record.remote_holders.contains(&checker_group) {
                        unnoted.push(id);
                    }
                    if sessions::owner(&record) == sessions::Owner::Unknown {
                        owners_unknown.push(id);
                    }
                    owners.push(record.owner);
                }
            }
            QueryOutcome::Sessions(SessionIds { session_ids: present, owners, owners_unknown, unnoted, ..SessionIds::default() })
        }
        None => return Err(invalid("", "query without a kind").into()),
    })
}
