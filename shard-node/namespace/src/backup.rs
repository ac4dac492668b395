//! Backups of a group's namespace and their restore (docs/design/backup-restore.md).
//!
//! A backup of a group is its persistent namespace read from one image of its data (one
//! RocksDB snapshot, [`warden_engine::state_machine::SmImage`]): node records and the children
//! index. Sessions are not in it, nor their ephemeral nodes (lock waiters included) nor lock
//! metadata: a restored cluster starts without sessions, so their nodes would be gone the
//! moment it ran; the parents of the nodes left out read as if they had been deleted (their
//! children count and index lose them, nothing else of their stat changes). A subtree the
//! group is ingesting (a split in progress, not served here) is not its own yet, nor is one
//! it is purging (handed over, its records still being deleted): both left out.
//!
//! A restore writes the pages back, through the log, into a group of a fresh cluster that
//! serves the same prefix ([`Txn::restore_page`]).

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use warden_placement::is_at_or_below;
use warden_proto::namespace::{NodeRecord, RestorePage, SubtreeRecord};
use warden_proto::placement::{BackupGroupHead, BackupPage};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{GroupDescriptor, NodeKind};

use super::apply::{done, Effects};
use super::descriptor;
use super::error::{error, invalid, Failure};
use super::path;
use super::store::{self, parse_subtree_key, SubtreeKey};
use super::txn::{TtlChange, Txn};
use super::NamespaceStateMachine;
use warden_engine::error::StorageError;
use warden_engine::state_machine::SmRead;
use warden_proto::namespace::command_result::Result as CommandOutcome;

/// Largest backup page (a page is one raft entry when restored, within its command limit).
pub const PAGE_BYTES_MAX: u32 = super::split::EXPORT_PAGE_BYTES_MAX;
/// Records one restored page may carry.
pub const RESTORE_RECORDS_MAX: usize = super::split::INGEST_RECORDS_MAX;

/// The key ranges a backup reads, in key order: the children index, then the node records.
const BACKUP_RANGES: [(&[u8], &[u8]); 2] = [(b"c", b"d"), (b"n", b"o")];

/// Reads the backup of group `group_id` from `image` (applied up to `applied_index`) and hands
/// it to `send` page by page, the first with the head, the last marked so; stops early when
/// `send` answers false (the reader went away). Pages hold at most `page_bytes_max` bytes of
/// records (but at least one record). Refused while a restore writes the group.
pub fn read_image(
    image: &impl SmRead,
    group_id: u64,
    applied_index: u64,
    page_bytes_max: u32,
    mut send: impl FnMut(BackupPage) -> bool,
) -> Result<BackupGroupHead, Failure> {
    let split = store::read_split(image)?;
    if split.restoring != 0 {
        return Err(error(Code::Unavailable, &split.restoring_prefix, "a restore is writing this group: back it up once it is done").into());
    }
    // Subtrees not the group's: one it is ingesting, those it is purging.
    let ingesting = (split.incoming_operation != 0).then_some(split.incoming_prefix.as_str());
    let not_its_own: Vec<&str> = ingesting.into_iter().chain(split.purging.iter().map(String::as_str)).collect();
    let outside = |path: &str| not_its_own.iter().any(|prefix| is_at_or_below(path, prefix));
    let mut ephemerals = store::read_ephemeral_paths(image)?;
    ephemerals.retain(|path| !outside(path));
    // Children each parent loses with the ephemerals left out.
    let mut dropped_children: BTreeMap<&str, u64> = BTreeMap::new();
    for path in &ephemerals {
        if let Some(parent) = path::parent(path) {
            *dropped_children.entry(parent).or_default() += 1;
        }
    }
    let head = BackupGroupHead {
        group_id,
        descriptor: store::read_descriptor(image)?,
        revision: store::read_revision(image)?,
        applied_index,
        ephemerals_dropped: ephemerals.len() as u64,
    };
    let page_bytes_max = page_bytes_max.clamp(1, PAGE_BYTES_MAX) as usize;
    let mut page = BackupPage { head: Some(head.clone()), records: Vec::new(), last: false };
    let mut page_bytes = 0usize;
    let mut stopped = false;
    let mut failure = None;
    for (from, to) in BACKUP_RANGES {
        image.scan_range(from, Some(to), |key, value| {
            let record = match kept_record(key, value, &ephemerals, &dropped_children, outside) {
                Ok(Some(record)) => record,
                Ok(None) => return true,
                Err(corrupt) => {
                    failure = Some(corrupt);
                    return false;
                }
            };
            let size = record.key.len() + record.value.len();
            if !page.records.is_empty() && page_bytes + size > page_bytes_max {
                let full = std::mem::take(&mut page);
                page_bytes = 0;
                if !send(full) {
                    stopped = true;
                    return false;
                }
            }
            page_bytes += size;
            page.records.push(record);
            true
        })?;
        if let Some(corrupt) = failure.take() {
            return Err(corrupt.into());
        }
        if stopped {
            return Ok(head);
        }
    }
    page.last = true;
    send(page);
    Ok(head)
}

/// What a backup keeps of the record at `key`: `None` for what it leaves out (see the
/// module's doc), a parent's record with the children it lost uncounted.
fn kept_record(
    key: &[u8],
    value: &[u8],
    ephemerals: &BTreeSet<String>,
    dropped_children: &BTreeMap<&str, u64>,
    outside: impl Fn(&str) -> bool,
) -> Result<Option<SubtreeRecord>, StorageError> {
    let record = |value: Vec<u8>| Some(SubtreeRecord { key: key.to_vec(), value });
    match parse_subtree_key(key) {
        Some(SubtreeKey::Child(parent, name)) => {
            let child = path::join(parent, name);
            Ok((!ephemerals.contains(&child) && !outside(&child)).then(|| record(value.to_vec())).flatten())
        }
        Some(SubtreeKey::Node(node_path)) if ephemerals.contains(node_path) || outside(node_path) => Ok(None),
        Some(SubtreeKey::Node(node_path)) => {
            let mut node = store::decode_record(value)?;
            let stat = node.stat.get_or_insert_with(Default::default);
            // The ephemeral index lists every ephemeral node: one it misses is corruption.
            if stat.ephemeral_owner != 0 || node.lock_waiter.is_some() {
                return Err(StorageError::Corrupt(format!("{node_path} is ephemeral but not in the ephemeral index")));
            }
            match dropped_children.get(node_path) {
                Some(dropped) => {
                    stat.num_children = stat.num_children.saturating_sub(*dropped);
                    Ok(record(node.encode_to_vec()))
                }
                None => Ok(record(value.to_vec())),
            }
        }
        Some(SubtreeKey::Lock(_)) | None => Ok(None),
    }
}

impl Txn<'_, '_> {
    /// Writes a page of a backup (see `RestorePage` in `namespace.proto`) into the group
    /// serving `current`.
    pub fn restore_page(&mut self, current: Option<&GroupDescriptor>, page: &RestorePage) -> Result<warden_proto::namespace::SplitState, Failure> {
        let root = descriptor::root(current).to_string();
        if page.restore_id == 0 {
            return Err(invalid(&root, "a restore names its run (a non-zero id)").into());
        }
        let mut state = self.view.split()?;
        if state.restored == page.restore_id {
            return Ok(state);
        }
        if state.frozen_for != 0 || state.incoming_operation != 0 || !state.purging.is_empty() {
            return Err(error(Code::Unavailable, &root, "a subtree is moving in or out of this group: restore once it is done").into());
        }
        match (page.first, state.restoring) {
            (_, running) if running == page.restore_id => {}
            (true, 0) => {
                if self.holds_nodes(&root)? {
                    return Err(error(Code::NotEmpty, &root, "the group holds nodes: a backup is restored into a fresh cluster").into());
                }
            }
            // An unfinished restore (its client gone) is discarded by a new one: its records
            // are purged a page at a time after this entry, as a moved subtree's are (deleting
            // them here would take every replica's memory and time at once). A page that
            // starts the discard carries no records (the client's probe): records written now
            // would be purged with the rest.
            (true, _) if page.records.is_empty() => {
                state.restoring = 0;
                state.restoring_prefix.clear();
                state.purging.push(root);
                self.view.put_split(&state);
                return Ok(state);
            }
            (true, unfinished) => {
                let message = format!("restore {unfinished} is unfinished here: a new one starts with an empty first page, which discards it");
                return Err(invalid(&root, message).into());
            }
            (false, _) => {
                let message = format!("restore {} is not running here (its first page never applied, or it ended)", page.restore_id);
                return Err(invalid(&root, message).into());
            }
        }
        for record in &page.records {
            self.restore_record(current, record)?;
        }
        if page.last {
            state.restoring = 0;
            state.restoring_prefix.clear();
            state.restored = page.restore_id;
        } else {
            state.restoring = page.restore_id;
            state.restoring_prefix = root;
        }
        self.view.put_split(&state);
        Ok(state)
    }

    /// Whether the group has any node at or below `root` but its prefix node as placement
    /// created it (no data, never changed, no children). Reads at most the first two node
    /// records: the prefix node sorts first, and any other node answers.
    fn holds_nodes(&self, root: &str) -> Result<bool, Failure> {
        let mut holds = false;
        let base = self.view.base();
        for (from, to) in store::subtree_node_ranges(root) {
            base.visit_range(&from, &to, |key, value| {
                holds = match parse_subtree_key(key) {
                    Some(SubtreeKey::Node(node_path)) if node_path == root => {
                        let node = store::decode_record(value)?;
                        let stat = node.stat.unwrap_or_default();
                        !(node.data.is_empty() && stat.version == 0 && stat.num_children == 0)
                    }
                    _ => true,
                };
                Ok::<_, StorageError>(!holds)
            })?;
            if holds {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn restore_record(&mut self, current: Option<&GroupDescriptor>, record: &SubtreeRecord) -> Result<(), Failure> {
        let root = descriptor::root(current);
        let refuse = |why: &str| -> Failure { invalid(root, format!("a restored record {why}")).into() };
        let served = |path: &str| descriptor::serves(current, path);
        match parse_subtree_key(&record.key) {
            Some(SubtreeKey::Node(node_path)) if served(node_path) => {
                path::validate(node_path, true).map_err(|e| super::error::invalid_path(node_path, &e))?;
                let node = NodeRecord::decode(record.value.as_slice()).map_err(|_| refuse("is not a node record"))?;
                let stat = node.stat.unwrap_or_default();
                if stat.ephemeral_owner != 0 || node.lock_waiter.is_some() {
                    return Err(refuse("is ephemeral (a backup holds no session's nodes)"));
                }
                if stat.kind == NodeKind::Ttl as i32 {
                    self.ttl_changes.push(TtlChange::Upsert(node_path.to_string(), stat));
                }
            }
            Some(SubtreeKey::Child(parent, name)) if served(parent) && !name.is_empty() && !name.contains('/') && record.value.is_empty() => {}
            _ => return Err(refuse("is not a node or child entry this group serves")),
        }
        self.view.put_raw(&record.key, &record.value);
        Ok(())
    }
}

/// Applies a `RestorePage`: a page of a backup written into the group.
pub(super) fn apply_restore(
    sm: &NamespaceStateMachine,
    txn: &mut Txn<'_, '_>,
    page: &RestorePage,
    effects: &mut Effects,
) -> Result<CommandOutcome, Failure> {
    effects.split = Some(txn.restore_page(sm.descriptor.as_ref(), page)?);
    Ok(done())
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use warden_proto::namespace::command::Op as CommandOp;
    use warden_proto::v1::{CreateRequest, Stat};

    use super::*;
    use crate::harness::Harness;
    use crate::Limits;

    /// The pages of `source`'s backup, read in pages of at most `page_bytes_max`.
    fn pages_of(source: &Harness, page_bytes_max: u32) -> Vec<BackupPage> {
        let mut pages = Vec::new();
        let head = source.reader().with_image(|image| {
            read_image(image, 1, 0, page_bytes_max, |page| {
                pages.push(page);
                true
            })
        });
        assert!(head.is_ok(), "the image reads");
        pages
    }

    fn restore(page: &BackupPage, restore_id: u64, first: bool, revision_floor: u64) -> CommandOp {
        CommandOp::RestorePage(RestorePage { restore_id, first, last: page.last, records: page.records.clone(), revision_floor })
    }

    /// A namespace with a few nodes, one changed twice, and a session's ephemeral node.
    fn source() -> Harness {
        let mut source = Harness::new(Limits::default()).expect("harness");
        for path in ["/x", "/x/a", "/x/b", "/y"] {
            source.create_simple(path, path.as_bytes()).expect("create");
        }
        source.set("/x/a", b"changed", None).expect("set");
        source.set("/x/a", b"changed again", None).expect("set");
        let session = source.create_session(60_000).expect("session").session_id;
        source.create(CreateRequest { path: "/x/e".into(), session_id: session, ..CreateRequest::default() }).expect("ephemeral");
        source
    }

    #[test]
    fn an_image_leaves_ephemerals_out_and_restores_every_node_with_its_data_and_stat() {
        let source = source();
        let pages = pages_of(&source, 64);
        assert!(pages.len() > 2, "small pages: {}", pages.len());
        assert!(pages[0].head.as_ref().is_some_and(|head| head.ephemerals_dropped == 1 && head.revision == source.revision().unwrap_or(0)));
        assert!(pages[1..].iter().all(|page| page.head.is_none()), "the head is on the first page only");
        assert!(pages.iter().rev().skip(1).all(|page| !page.last) && pages.last().is_some_and(|page| page.last));
        let keys: Vec<_> = pages.iter().flat_map(|page| &page.records).map(|record| record.key.clone()).collect();
        assert!(!keys.iter().any(|key| key.ends_with(b"/x/e") || key.ends_with(b"\0e")), "the ephemeral is not in the image");
        assert!(keys.iter().all(|key| key[0] == b'n' || key[0] == b'c'), "only nodes and children");

        let mut target = Harness::new(Limits::default()).expect("harness");
        let floor = source.revision().expect("revision");
        for (i, page) in pages.iter().enumerate() {
            target.placement_step(restore(page, 7, i == 0, floor)).expect("a page applies");
            if !page.last {
                let refused = target.create_simple("/z", b"").expect_err("no client write while restoring");
                assert_eq!(refused.code, Code::Unavailable as i32, "{refused:?}");
            }
        }
        for path in ["/x/a", "/x/b", "/y"] {
            assert_eq!(target.get(path), source.get(path), "{path}");
        }
        let (restored, original) = (target.get("/x").expect("/x"), source.get("/x").expect("/x"));
        let original_stat = original.stat.unwrap_or_default();
        assert_eq!(restored.stat, Some(Stat { num_children: original_stat.num_children - 1, ..original_stat }));
        assert_eq!(target.all_children("/x"), Ok(vec!["a".to_string(), "b".to_string()]));
        assert!(target.get("/x/e").is_err(), "no ephemeral");
        // The last page again changes nothing; the group takes writes, after the backup's revision.
        let revision = target.revision().expect("revision");
        target.placement_step(restore(&pages[pages.len() - 1], 7, false, floor)).expect("idempotent");
        assert_eq!(target.revision(), Ok(revision));
        assert!(revision > floor, "revisions go on from the backup's");
        target.create_simple("/z", b"").expect("writes after the restore");
        // Another restore into a group holding nodes is refused, and changes nothing.
        let refused = target.placement_step(restore(&pages[0], 8, true, floor)).expect_err("not fresh");
        assert_eq!(refused.code, Code::NotEmpty as i32);
        assert_eq!(target.revision(), Ok(revision + 1));
    }

    /// Whether a group is fresh is told by its first two node records, whatever it holds.
    #[test]
    fn a_restore_into_a_group_holding_many_nodes_is_refused_after_reading_two() {
        let mut target = Harness::new(Limits::default()).expect("harness");
        let creates: Vec<Vec<u8>> = (0..3_000).map(|i| create_command(&format!("/n{i:05}"))).collect();
        target.apply_batch(&creates).expect("created");
        let page = BackupPage { head: None, records: Vec::new(), last: true };
        target.take_batch_costs();
        let refused = target.placement_step(restore(&page, 9, true, 0)).expect_err("not fresh");
        assert_eq!(refused.code, Code::NotEmpty as i32, "{refused:?}");
        let costs = target.take_batch_costs();
        assert!(costs.iter().all(|cost| cost.records_scanned <= 2), "records read to find one node: {costs:?}");
    }

    /// A new restore finding another run unfinished has its records deleted a page per
    /// entry, by the leader, before anything else changes the group; then takes its pages.
    #[test]
    fn an_unfinished_restore_is_discarded_a_page_at_a_time_before_a_new_one_writes() {
        let mut source = Harness::new(Limits::default()).expect("harness");
        let creates: Vec<Vec<u8>> = (0..2_500).map(|i| create_command(&format!("/n{i:05}"))).collect();
        source.apply_batch(&creates).expect("created");
        let pages = pages_of(&source, 16 << 10);
        assert!(pages.len() > 4, "small pages: {}", pages.len());
        let mut target = Harness::new(Limits::default()).expect("harness");
        // Run 7 writes half its pages, then its client is gone.
        for (i, page) in pages.iter().take(pages.len() / 2).enumerate() {
            target.placement_step(restore(page, 7, i == 0, 0)).expect("a page applies");
        }
        // A page of another run that holds records neither discards nor writes anything.
        let refused = target.placement_step(restore(&pages[0], 8, true, 0)).expect_err("records while run 7 is unfinished");
        assert_eq!(refused.code, Code::InvalidArgument as i32, "{refused:?}");
        assert!(target.get("/n00000").is_ok(), "run 7's records are still there");
        // Run 8's empty first page starts the discard; the entry itself deletes nothing.
        let empty = BackupPage { head: None, records: Vec::new(), last: true };
        target.take_batch_costs();
        target.placement_step(restore(&empty, 8, true, 0)).expect("the discard starts");
        assert!(target.get("/n00000").is_ok(), "nothing is deleted in the entry that starts the discard");
        assert!(target.take_batch_costs().iter().all(|cost| cost.write_ops < 10), "the entry writes only the split state");
        let waiting = target.placement_step(restore(&empty, 8, true, 0)).expect_err("the discard is not done");
        assert_eq!(waiting.code, Code::Unavailable as i32, "{waiting:?}");
        let write = target.create_simple("/z", b"").expect_err("no client write while discarding");
        assert_eq!(write.code, Code::Unavailable as i32, "{write:?}");
        // The leader deletes the records in pages of a bounded size.
        let mut rounds = 0;
        while target.leader_scan(1).expect("leader proposals") > 0 {
            rounds += 1;
            let costs = target.take_batch_costs();
            let per_page = u64::from(crate::split::PURGE_RECORDS_PER_PAGE) + 1;
            assert!(costs.iter().all(|cost| cost.records_scanned <= per_page), "a page reads at most its budget: {costs:?}");
            assert!(rounds < 1_000, "the discard ends");
        }
        assert!(rounds > 1, "run 7's records go in more than one page: {rounds}");
        assert!(target.get("/n00000").is_err() && target.get("/n01200").is_err(), "run 7's records are gone");
        // Run 8 is taken now; then run 9 restores the whole backup.
        target.placement_step(restore(&empty, 8, true, 0)).expect("the empty restore ends");
        for (i, page) in pages.iter().enumerate() {
            target.placement_step(restore(page, 9, i == 0, 0)).expect("a page applies");
        }
        for path in ["/n00000", "/n01249", "/n02499"] {
            assert_eq!(target.get(path), source.get(path), "{path}");
        }
        target.create_simple("/z", b"").expect("writes after the restore");
    }

    /// A create of the persistent node `path`, as command bytes.
    fn create_command(path: &str) -> Vec<u8> {
        let create = CreateRequest { path: path.into(), ..CreateRequest::default() };
        let request = warden_proto::v1::TxnRequest {
            then: vec![warden_proto::v1::TxnOp { op: Some(warden_proto::v1::txn_op::Op::Create(create)) }],
            ..Default::default()
        };
        warden_proto::namespace::Command { now_ms: 1, principal: String::new(), op: Some(CommandOp::Txn(request)) }.encode_to_vec()
    }

    #[test]
    fn a_restore_refuses_what_a_backup_never_holds_and_pages_of_no_running_restore() {
        let pages = pages_of(&source(), PAGE_BYTES_MAX);
        assert_eq!(pages.len(), 1);
        let mut target = Harness::new(Limits::default()).expect("harness");
        let page = &pages[0];
        let refused = target.placement_step(restore(page, 7, false, 0)).expect_err("no first page");
        assert_eq!(refused.code, Code::InvalidArgument as i32);
        let mut ephemeral = NodeRecord::decode(page.records.iter().find(|r| r.key == b"n/y").map_or(&[][..], |r| &r.value)).expect("/y");
        ephemeral.stat.get_or_insert_with(Default::default).ephemeral_owner = 5;
        let mut bad = page.clone();
        bad.records.push(SubtreeRecord { key: b"n/y/e".to_vec(), value: ephemeral.encode_to_vec() });
        for records in [bad.records, vec![SubtreeRecord { key: b"s\0\0\0\0\0\0\0\x01".to_vec(), value: Vec::new() }]] {
            let bad = BackupPage { records, ..page.clone() };
            let refused = target.placement_step(restore(&bad, 7, true, 0)).expect_err("refused");
            assert_eq!(refused.code, Code::InvalidArgument as i32, "{refused:?}");
        }
        assert_eq!(target.revision(), Ok(0), "a refused page changes nothing");
        assert!(target.get("/y").is_err());
        assert!(target.create_simple("/fresh", b"").is_ok(), "no restore holds the group");
    }
}
