//! The node's side of backups and restores (docs/design/backup-restore.md):
//! `BackupGroup` streams a consistent image of one group hosted here, `RestorePage` has the
//! group's leader apply a page of one. What is in a page, and what a restore checks, is the
//! namespace's business (`namespace/backup.rs`); the file and the order of calls are the
//! CLI's (`warden admin backup|restore`).

use prost::Message as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::namespace::query::Query as NamespaceQuery;
use warden_proto::namespace::{Query, QueryResult};
use warden_proto::placement::{BackupGroupRequest, BackupPage};

use super::service::{internal, invalid_argument, PlacementService};
use crate::service::{engine_status, status};
use warden_engine::host::ReadConsistency;
use warden_engine::state_machine::SmReader;
use warden_namespace::backup;
use warden_namespace::error::Failure;
use warden_namespace::store;

/// Pages queued between a backup's reading thread and its stream: a slow reader of the
/// stream holds the reading back, so a backup's memory is this many pages.
const PAGES_QUEUED_MAX: usize = 2;

/// Longest a backup waits for its reader to take a page: a reader that stops reading but
/// keeps its connection open does not hold the store's snapshot (and a backup's place) for
/// ever.
const PAGE_SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Backups one node reads at once (each holds a RocksDB snapshot, so the store keeps what it
/// would have compacted away, and a thread).
pub const BACKUPS_MAX: usize = 2;

/// A stream of a backup's pages.
pub type BackupStream = ReceiverStream<Result<BackupPage, Status>>;

impl PlacementService {
    /// Starts streaming the backup of `request.group_id`, hosted here:
    ///
    /// 1. A linearizable read of the group's revision: once it answers, this replica has
    ///    applied every write acknowledged before the call.
    /// 2. A thread of its own takes an image of the group's data (one RocksDB snapshot) —
    ///    at that revision or later, or the call is refused UNAVAILABLE to be retried — and
    ///    sends its pages into a bounded queue the stream drains. Writes go on meanwhile.
    pub(super) async fn backup_stream(&self, request: BackupGroupRequest) -> Result<BackupStream, Status> {
        let BackupGroupRequest { group_id, page_bytes_max } = request;
        if group_id == PLACEMENT_GROUP_ID {
            return Err(invalid_argument("placement's state is backed up through its API (routes, quotas, limits, ACL)"));
        }
        let store = self.store.clone().ok_or_else(|| Status::unimplemented("this node reads no backups"))?;
        let floor = self.linearizable_revision(group_id).await?;
        let permit = self
            .backups
            .clone()
            .try_acquire_owned()
            .map_err(|_| Status::resource_exhausted(format!("{BACKUPS_MAX} backups are being read from this node already: retry later")))?;
        let (pages, stream) = tokio::sync::mpsc::channel(PAGES_QUEUED_MAX);
        let reader = SmReader::new(store, group_id);
        let runtime = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new().name(format!("backup-{group_id}")).spawn(move || {
            let _permit = permit;
            // False once the reader is gone or stopped reading.
            let send = |page: Result<BackupPage, Status>| runtime.block_on(pages.send_timeout(page, PAGE_SEND_TIMEOUT)).is_ok();
            if let Err(refusal) = reader.with_image(|image| send_image(image, group_id, floor, page_bytes_max, |page| send(Ok(page)))) {
                // The stream's reader may be gone already: nobody left to tell.
                send(Err(refusal));
            }
        });
        spawned.map_err(|e| internal(format!("cannot start a backup thread: {e}")))?;
        Ok(ReceiverStream::new(stream))
    }

    /// The group's revision as a linearizable read on this replica answers it.
    async fn linearizable_revision(&self, group_id: u64) -> Result<u64, Status> {
        let query = Query { query: Some(NamespaceQuery::Revision(true)) };
        let bytes = self
            .node
            .read(group_id, query.encode_to_vec(), ReadConsistency::Linearizable, self.timeout)
            .await
            .map_err(|e| engine_status(&self.directory, group_id, e))?;
        Ok(QueryResult::decode(bytes.as_slice()).map_err(internal)?.revision)
    }
}

/// Hands the backup of `image` (at `floor` or later) to `send` page by page.
fn send_image(
    image: &warden_engine::state_machine::SmImage<'_>,
    group_id: u64,
    floor: u64,
    page_bytes_max: u32,
    send: impl FnMut(BackupPage) -> bool,
) -> Result<(), Status> {
    let applied_index = image.applied_index().map_err(internal)?;
    let revision = store::read_revision(image).map_err(internal)?;
    if applied_index == 0 || revision < floor {
        // Not reached on a replica whose read answered (its writes precede the answer):
        // refused, not waited for, should a store ever lag its apply.
        return Err(Status::unavailable(format!("group {group_id}'s store is behind revision {floor} here: retry")));
    }
    match backup::read_image(image, group_id, applied_index, page_bytes_max, send) {
        Ok(_) => Ok(()),
        Err(Failure::Refused(error)) => Err(status(error)),
        Err(Failure::Storage(error)) => Err(internal(error)),
    }
}
