//! How the namespace lives in its group's range of the `sm` column family, and a
//! transaction buffer that reads through pending writes.
//!
//! Keys: `n<path>` → `NodeRecord`; `c<parent>\0<name>` → empty (the sorted children index;
//! paths never contain NUL); `s<session id>` → `SessionRecord`; `e<session id><path>` → empty
//! (each session's ephemeral nodes, in path order); `l<path>` → `LockMeta` (a lock's
//! metadata, removed with its node); `mrevision` → the group revision and
//! `mnext_session` → the next session sequence (8 bytes, big-endian each); `mdescriptor` →
//! the group's descriptor (what it serves); `msplit` → `SplitState` (subtree moves);
//! `Q<prefix>` → `QuotaShare` (the group's share of a subtree quota, `quota.rs`).

use std::collections::BTreeMap;

use prost::Message as _;
use warden_proto::namespace::{LockMeta, NodeRecord, SessionRecord, SplitState};
use warden_proto::v1::GroupDescriptor;

use warden_engine::error::StorageError;
use warden_engine::state_machine::{SmRead, SmReader, SmWrites};

const NODE: u8 = b'n';
const CHILD: u8 = b'c';
const SESSION: u8 = b's';
const EPHEMERAL: u8 = b'e';
const LOCK: u8 = b'l';
const REVISION_KEY: &[u8] = b"mrevision";
const NEXT_SESSION_KEY: &[u8] = b"mnext_session";
const DESCRIPTOR_KEY: &[u8] = b"mdescriptor";
const SPLIT_KEY: &[u8] = b"msplit";
const LIMITS_KEY: &[u8] = b"mlimits";
const MOVES_KEY: &[u8] = b"mmoves";

/// Key of a node's record.
pub fn node_key(path: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + path.len());
    key.push(NODE);
    key.extend_from_slice(path.as_bytes());
    key
}

/// The node key a range bound `bytes` (a path, or any byte string between paths) names:
/// node keys sort as their paths do.
pub fn node_bound(bytes: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + bytes.len());
    key.push(NODE);
    key.extend_from_slice(bytes);
    key
}

/// The path of a node key.
pub fn node_path(key: &[u8]) -> Result<&str, StorageError> {
    match key.split_first() {
        Some((&NODE, path)) => std::str::from_utf8(path).map_err(|_| StorageError::Corrupt("node path is not UTF-8".into())),
        _ => Err(StorageError::Corrupt("not a node key".into())),
    }
}

fn children_prefix(parent: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(2 + parent.len());
    key.push(CHILD);
    key.extend_from_slice(parent.as_bytes());
    key.push(0);
    key
}

fn child_key(parent: &str, name: &str) -> Vec<u8> {
    let mut key = children_prefix(parent);
    key.extend_from_slice(name.as_bytes());
    key
}

/// Key of a session's record.
pub fn session_key(session: u64) -> Vec<u8> {
    let mut key = vec![SESSION];
    key.extend_from_slice(&session.to_be_bytes());
    key
}

/// Key of a lock's metadata.
pub fn lock_meta_key(path: &str) -> Vec<u8> {
    let mut key = vec![LOCK];
    key.extend_from_slice(path.as_bytes());
    key
}

/// Every lock's metadata on disk, by path.
pub fn read_lock_metas(reader: &SmReader) -> Result<BTreeMap<String, LockMeta>, StorageError> {
    let mut metas = BTreeMap::new();
    let mut corrupt = None;
    reader.scan_range(&[LOCK], Some(&[LOCK + 1]), |key, value| {
        match LockMeta::decode(value) {
            Ok(meta) => {
                metas.insert(String::from_utf8_lossy(&key[1..]).into_owned(), meta);
            }
            Err(error) => corrupt = Some(StorageError::Corrupt(format!("lock meta: {error}"))),
        }
        corrupt.is_none()
    })?;
    corrupt.map_or(Ok(metas), Err)
}

/// Prefix of a session's ephemeral-node index.
fn ephemeral_prefix(session: u64) -> Vec<u8> {
    let mut key = vec![EPHEMERAL];
    key.extend_from_slice(&session.to_be_bytes());
    key
}

/// The exclusive end of the keys starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff: no key sorts after the prefix's range but those longer 0xff strings, which
    // no layout here produces.
    vec![0xff; prefix.len() + 1]
}

fn decode_u64(bytes: Option<Vec<u8>>, what: &str) -> Result<u64, StorageError> {
    match bytes {
        None => Ok(0),
        Some(bytes) => {
            let bytes: [u8; 8] = bytes.as_slice().try_into().map_err(|_| StorageError::Corrupt(what.to_string()))?;
            Ok(u64::from_be_bytes(bytes))
        }
    }
}

/// The root's record before anything was written to it: the root always exists.
pub fn implicit_root() -> NodeRecord {
    NodeRecord { stat: Some(warden_proto::v1::Stat::default()), ..NodeRecord::default() }
}

/// Decodes a stored node record.
pub fn decode_record(bytes: &[u8]) -> Result<NodeRecord, StorageError> {
    NodeRecord::decode(bytes).map_err(|e| StorageError::Corrupt(format!("node record: {e}")))
}

/// Reads the stored revision.
pub fn read_revision(reader: &impl SmRead) -> Result<u64, StorageError> {
    decode_u64(reader.get(REVISION_KEY)?, "revision")
}

/// The group's descriptor on disk (`None`: never set; the group serves every path).
pub fn read_descriptor(reader: &impl SmRead) -> Result<Option<GroupDescriptor>, StorageError> {
    reader
        .get(DESCRIPTOR_KEY)?
        .map(|bytes| GroupDescriptor::decode(bytes.as_slice()).map_err(|e| StorageError::Corrupt(format!("descriptor: {e}"))))
        .transpose()
}

/// The group's apply limits record (`None`: none applied, the first release's limits).
pub fn read_limits(reader: &SmReader) -> Result<Option<warden_proto::v1::ApplyLimits>, StorageError> {
    reader
        .get(LIMITS_KEY)?
        .map(|bytes| warden_proto::v1::ApplyLimits::decode(bytes.as_slice()).map_err(|e| StorageError::Corrupt(format!("limits: {e}"))))
        .transpose()
}

/// The group's latest subtrees moved out or in, on disk (default: none ever).
pub fn read_moves(reader: &impl SmRead) -> Result<warden_proto::namespace::MovedSubtrees, StorageError> {
    reader
        .get(MOVES_KEY)?
        .map(|bytes| warden_proto::namespace::MovedSubtrees::decode(bytes.as_slice()).map_err(|e| StorageError::Corrupt(format!("moves: {e}"))))
        .transpose()
        .map(Option::unwrap_or_default)
}

/// The group's record of subtree moves on disk (default: none ever).
pub fn read_split(reader: &impl SmRead) -> Result<SplitState, StorageError> {
    decode_split(reader.get(SPLIT_KEY)?)
}

fn decode_split(bytes: Option<Vec<u8>>) -> Result<SplitState, StorageError> {
    bytes
        .map(|bytes| SplitState::decode(bytes.as_slice()).map_err(|e| StorageError::Corrupt(format!("split state: {e}"))))
        .transpose()
        .map(Option::unwrap_or_default)
}

/// Every ephemeral node's path (of every session, from the ephemeral index).
pub fn read_ephemeral_paths(reader: &impl SmRead) -> Result<std::collections::BTreeSet<String>, StorageError> {
    let mut paths = std::collections::BTreeSet::new();
    let mut corrupt = None;
    reader.scan_range(&[EPHEMERAL], Some(&[EPHEMERAL + 1]), |key, _| {
        match key.get(1 + 8..).map(std::str::from_utf8) {
            Some(Ok(path)) => {
                paths.insert(path.to_string());
            }
            _ => corrupt = Some(StorageError::Corrupt("ephemeral index key".into())),
        }
        corrupt.is_none()
    })?;
    corrupt.map_or(Ok(paths), Err)
}

/// The key of a node's entry in its parent's children index (`None` for the root).
pub fn child_key_of(path: &str) -> Option<Vec<u8>> {
    super::path::parent(path).map(|parent| child_key(parent, super::path::name(path)))
}

/// The key ranges `[from, to)` holding a subtree's own records — its nodes, the children
/// index of its nodes, its locks' metadata — in key order. The subtree's root entry in its
/// parent's children index is not among them (it belongs to the parent), nor are session
/// records and the ephemeral index (they belong to sessions).
pub fn subtree_ranges(prefix: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    [(CHILD, &b"\0"[..], &b"\x01"[..]), (LOCK, b"", b"\0"), (NODE, b"", b"\0")]
        .into_iter()
        .flat_map(|(family, own_from, own_to)| family_ranges(family, prefix, own_from, own_to))
        .collect()
}

/// What is left of `ranges` (in key order) after `after_key` (all of them when it is empty):
/// where a paged walk of them goes on.
pub fn ranges_after(ranges: Vec<(Vec<u8>, Vec<u8>)>, after_key: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    ranges
        .into_iter()
        .filter(|(_, to)| to.as_slice() > after_key)
        .map(|(from, to)| match after_key >= from.as_slice() {
            true => ([after_key, b"\0"].concat(), to),
            false => (from, to),
        })
        .collect()
}

/// The key ranges `[from, to)` of the node records at or below `prefix`, in key order.
pub fn subtree_node_ranges(prefix: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    family_ranges(NODE, prefix, b"", b"\0")
}

/// The keys of `family` at or below `prefix`: its own (`prefix` followed by `own_from` up to
/// `own_to`), then its descendants' — every key from `prefix/` up to `prefix0` ('0' follows
/// '/'). Below the root every path is a descendant: `/` up to `0`.
fn family_ranges(family: u8, prefix: &str, own_from: &[u8], own_to: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let key = |tail: &[u8]| {
        let mut key = vec![family];
        key.extend_from_slice(prefix.as_bytes());
        key.extend_from_slice(tail);
        key
    };
    if prefix == "/" {
        return vec![(vec![family, b'/'], vec![family, b'0'])];
    }
    vec![(key(own_from), key(own_to)), (key(b"/"), key(b"0"))]
}

/// What a key of a subtree's records is: a node's record, a children-index entry (of its
/// parent), or a lock's metadata; `None` for any other key.
pub enum SubtreeKey<'k> {
    /// `n<path>`.
    Node(&'k str),
    /// `c<parent>\0<name>`.
    Child(&'k str, &'k str),
    /// `l<path>`.
    Lock(&'k str),
}

/// Parses a key of [`subtree_ranges`].
pub fn parse_subtree_key(key: &[u8]) -> Option<SubtreeKey<'_>> {
    let (family, rest) = key.split_first()?;
    let rest = std::str::from_utf8(rest).ok()?;
    match *family {
        NODE => Some(SubtreeKey::Node(rest)),
        LOCK => Some(SubtreeKey::Lock(rest)),
        CHILD => rest.split_once('\0').map(|(parent, name)| SubtreeKey::Child(parent, name)),
        _ => None,
    }
}

/// Every session record on disk, by id.
pub fn read_sessions(reader: &SmReader) -> Result<BTreeMap<u64, SessionRecord>, StorageError> {
    let mut sessions = BTreeMap::new();
    let mut corrupt = None;
    reader.scan_range(&[SESSION], Some(&[SESSION + 1]), |_, value| {
        match SessionRecord::decode(value) {
            Ok(record) => {
                sessions.insert(record.session_id, record);
            }
            Err(error) => corrupt = Some(StorageError::Corrupt(format!("session record: {error}"))),
        }
        corrupt.is_none()
    })?;
    corrupt.map_or(Ok(sessions), Err)
}

/// Reads a node straight from disk (queries: apply has finished writing).
pub fn read_node(reader: &SmReader, path: &str) -> Result<Option<NodeRecord>, StorageError> {
    reader.get(&node_key(path))?.map(|bytes| decode_record(&bytes)).transpose()
}

/// Up to `limit` child names of `parent` after `start_after`, in order, straight from disk;
/// the flag says whether more follow.
pub fn read_children(reader: &SmReader, parent: &str, start_after: &str, limit: usize) -> Result<(Vec<String>, bool), StorageError> {
    let view = TxnView::new(reader, None);
    view.children(parent, start_after, limit)
}

/// The records as the batch will leave them: its pending writes over disk (a transaction's
/// view without its own buffered writes).
#[derive(Clone, Copy)]
pub struct BaseView<'a> {
    reader: &'a SmReader,
    batch: Option<&'a SmWrites>,
}

impl BaseView<'_> {
    /// Hands `visit` the next at most `records_max` records of `ranges` (in key order) after
    /// `after_key`, as [`BaseView::visit_range`] does: one page of a paged walk. Answers the
    /// last key visited when the budget ran out (records may follow it: the next page's
    /// `after_key`), `None` once none is left.
    pub fn visit_page<E: From<StorageError>>(
        &self,
        ranges: Vec<(Vec<u8>, Vec<u8>)>,
        after_key: &[u8],
        records_max: u32,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<Option<Vec<u8>>, E> {
        let mut visited = 0u32;
        let mut last = None;
        for (from, to) in ranges_after(ranges, after_key) {
            self.visit_range(&from, &to, |key, value| {
                visit(key, value)?;
                visited += 1;
                if visited >= records_max {
                    last = Some(key.to_vec());
                }
                Ok::<_, E>(last.is_none())
            })?;
            if last.is_some() {
                break;
            }
        }
        Ok(last)
    }

    /// Hands `visit` every record in `[from, to)` as the batch will leave it (disk under the
    /// batch's pending writes), in key order, until it answers false: a replica that applies
    /// a freeze and a hand-over in one batch still sees the subtree's last writes. Streams
    /// the disk and the pending writes side by side, so memory stays at one record whatever
    /// the range holds.
    pub fn visit_range<E: From<StorageError>>(&self, from: &[u8], to: &[u8], visit: impl FnMut(&[u8], &[u8]) -> Result<bool, E>) -> Result<(), E> {
        let pending = self.batch.into_iter().flat_map(|batch| batch.pending_range(from, to));
        visit_with_overlay(|scan| Ok(self.reader.scan_range(from, Some(to), scan)?), pending, visit)
    }
}

/// Hands `visit` the records `scan` walks in key order with `overlay`'s later writes over
/// them (in key order too; `None`: deleted), in key order, until it answers false: the two
/// are streamed side by side, so memory stays at one record whatever the range holds.
fn visit_with_overlay<'o, E: From<StorageError>>(
    scan: impl FnOnce(&mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), E>,
    overlay: impl Iterator<Item = (&'o [u8], Option<&'o [u8]>)>,
    mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, E>,
) -> Result<(), E> {
    let mut overlay = overlay.peekable();
    // `Ok(true)`: go on; anything else ends both the scan and the overlay.
    let mut going: Result<bool, E> = Ok(true);
    scan(&mut |key, value| {
        while let Some((earlier, written)) = overlay.next_if(|(overlay_key, _)| *overlay_key < key) {
            if let Some(written) = written {
                going = visit(earlier, written);
                if !matches!(going, Ok(true)) {
                    return false;
                }
            }
        }
        // A write of this very key wins over the scanned record (`None`: deleted).
        let value = match overlay.next_if(|(overlay_key, _)| *overlay_key == key) {
            Some((_, written)) => written,
            None => Some(value),
        };
        if let Some(value) = value {
            going = visit(key, value);
        }
        matches!(going, Ok(true))
    })?;
    if !going? {
        return Ok(());
    }
    for (key, written) in overlay {
        if let Some(written) = written {
            if !visit(key, written)? {
                break;
            }
        }
    }
    Ok(())
}

/// A transaction's view: its own buffered writes over the batch's pending writes over disk.
/// Nothing reaches the batch unless the transaction commits.
pub struct TxnView<'a> {
    reader: &'a SmReader,
    batch: Option<&'a SmWrites>,
    local: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl<'a> TxnView<'a> {
    /// A view over `reader`, seeing `batch`'s pending writes when given.
    pub fn new(reader: &'a SmReader, batch: Option<&'a SmWrites>) -> TxnView<'a> {
        TxnView { reader, batch, local: BTreeMap::new() }
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self.local.get(key) {
            Some(value) => Ok(value.clone()),
            None => self.base_get(key),
        }
    }

    /// The value before this transaction: the batch's pending writes over disk.
    fn base_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        if let Some(value) = self.batch.and_then(|batch| batch.pending(key)) {
            return Ok(value.map(<[u8]>::to_vec));
        }
        self.reader.get(key)
    }

    /// The node at `path`.
    pub fn node(&self, path: &str) -> Result<Option<NodeRecord>, StorageError> {
        self.get(&node_key(path))?.map(|bytes| decode_record(&bytes)).transpose()
    }

    /// Writes the node at `path`.
    pub fn put_node(&mut self, path: &str, record: &NodeRecord) {
        self.local.insert(node_key(path), Some(record.encode_to_vec()));
    }

    /// Removes the node at `path` (its index entry in the parent is separate).
    pub fn delete_node(&mut self, path: &str) {
        self.local.insert(node_key(path), None);
    }

    /// Adds `name` to `parent`'s children index.
    pub fn add_child(&mut self, parent: &str, name: &str) {
        self.local.insert(child_key(parent, name), Some(Vec::new()));
    }

    /// Whether `name` is in `parent`'s children index.
    pub fn has_child(&self, parent: &str, name: &str) -> Result<bool, StorageError> {
        Ok(self.get(&child_key(parent, name))?.is_some())
    }

    /// Removes `name` from `parent`'s children index.
    pub fn remove_child(&mut self, parent: &str, name: &str) {
        self.local.insert(child_key(parent, name), None);
    }

    /// The group revision.
    pub fn revision(&self) -> Result<u64, StorageError> {
        decode_u64(self.get(REVISION_KEY)?, "revision")
    }

    /// Takes the next session sequence number.
    pub fn take_session_sequence(&mut self) -> Result<u64, StorageError> {
        let next = decode_u64(self.get(NEXT_SESSION_KEY)?, "next session")?.max(1);
        self.local.insert(NEXT_SESSION_KEY.to_vec(), Some((next + 1).to_be_bytes().to_vec()));
        Ok(next)
    }

    /// A session's record.
    pub fn session(&self, session: u64) -> Result<Option<SessionRecord>, StorageError> {
        self.get(&session_key(session))?
            .map(|bytes| SessionRecord::decode(bytes.as_slice()).map_err(|e| StorageError::Corrupt(format!("session record: {e}"))))
            .transpose()
    }

    /// Writes a session's record.
    pub fn put_session(&mut self, record: &SessionRecord) {
        self.local.insert(session_key(record.session_id), Some(record.encode_to_vec()));
    }

    /// Removes a session's record.
    pub fn delete_session(&mut self, session: u64) {
        self.local.insert(session_key(session), None);
    }

    /// A lock's metadata.
    pub fn lock_meta(&self, path: &str) -> Result<Option<LockMeta>, StorageError> {
        self.get(&lock_meta_key(path))?
            .map(|bytes| LockMeta::decode(bytes.as_slice()).map_err(|e| StorageError::Corrupt(format!("lock meta: {e}"))))
            .transpose()
    }

    /// Writes a lock's metadata.
    pub fn put_lock_meta(&mut self, path: &str, meta: &LockMeta) {
        self.local.insert(lock_meta_key(path), Some(meta.encode_to_vec()));
    }

    /// Removes a lock's metadata (its node is gone).
    pub fn delete_lock_meta(&mut self, path: &str) {
        self.local.insert(lock_meta_key(path), None);
    }

    /// Records that `session` owns the ephemeral node `path`.
    pub fn add_ephemeral(&mut self, session: u64, path: &str) {
        let mut key = ephemeral_prefix(session);
        key.extend_from_slice(path.as_bytes());
        self.local.insert(key, Some(Vec::new()));
    }

    /// Forgets that `session` owns `path`.
    pub fn remove_ephemeral(&mut self, session: u64, path: &str) {
        let mut key = ephemeral_prefix(session);
        key.extend_from_slice(path.as_bytes());
        self.local.insert(key, None);
    }

    /// Hands `visit` the paths in `[from, to)` (compared as bytes) of `session`'s ephemeral
    /// nodes, in path order, until it answers false.
    pub fn visit_ephemerals<E: From<StorageError>>(
        &self,
        session: u64,
        (from, to): (&[u8], &[u8]),
        mut visit: impl FnMut(&str) -> Result<bool, E>,
    ) -> Result<(), E> {
        let prefix = ephemeral_prefix(session);
        let bound = |bytes: &[u8]| [prefix.as_slice(), bytes].concat();
        self.visit_range(&bound(from), &bound(to), |key, _| {
            let path = key.get(prefix.len()..).and_then(|path| std::str::from_utf8(path).ok());
            visit(path.ok_or_else(|| StorageError::Corrupt("ephemeral index key".into()))?)
        })
    }

    /// Up to `limit` ephemeral paths of `session`, in path order; the flag says whether more follow.
    pub fn ephemerals(&self, session: u64, limit: usize) -> Result<(Vec<String>, bool), StorageError> {
        self.scan_names(&ephemeral_prefix(session), "", limit)
    }

    /// The group's record of subtree moves.
    pub fn split(&self) -> Result<SplitState, StorageError> {
        decode_split(self.get(SPLIT_KEY)?)
    }

    /// Writes the group's apply limits record.
    pub fn put_limits(&mut self, record: &warden_proto::v1::ApplyLimits) {
        self.local.insert(LIMITS_KEY.to_vec(), Some(record.encode_to_vec()));
    }

    /// Writes the group's latest subtrees moved out or in.
    pub fn put_moves(&mut self, moves: &warden_proto::namespace::MovedSubtrees) {
        self.local.insert(MOVES_KEY.to_vec(), Some(moves.encode_to_vec()));
    }

    /// Writes the group's record of subtree moves.
    pub fn put_split(&mut self, state: &SplitState) {
        self.local.insert(SPLIT_KEY.to_vec(), Some(state.encode_to_vec()));
    }

    /// Whether `session` owns an ephemeral node at or below `prefix`.
    pub fn has_ephemeral_at_or_below(&self, session: u64, prefix: &str) -> Result<bool, StorageError> {
        let mut exact = ephemeral_prefix(session);
        exact.extend_from_slice(prefix.as_bytes());
        if self.get(&exact)?.is_some() {
            return Ok(true);
        }
        let below = format!("{prefix}/");
        let (names, _) = self.scan_names(&ephemeral_prefix(session), &below, 1)?;
        Ok(names.first().is_some_and(|name| name.starts_with(&below)))
    }

    /// A raw key's value (subtree records being moved).
    pub fn get_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.get(key)
    }

    /// Sets a raw key (subtree records being moved in).
    pub fn put_raw(&mut self, key: &[u8], value: &[u8]) {
        self.local.insert(key.to_vec(), Some(value.to_vec()));
    }

    /// Removes a raw key (subtree records moved out).
    pub fn delete_raw(&mut self, key: &[u8]) {
        self.local.insert(key.to_vec(), None);
    }

    /// What the transaction reads under its own writes, apart from the view (so a caller
    /// may visit it while writing to the view).
    pub fn base(&self) -> BaseView<'a> {
        BaseView { reader: self.reader, batch: self.batch }
    }

    /// Writes the group's descriptor.
    pub fn put_descriptor(&mut self, descriptor: &GroupDescriptor) {
        self.local.insert(DESCRIPTOR_KEY.to_vec(), Some(descriptor.encode_to_vec()));
    }

    /// Sets the group revision.
    pub fn set_revision(&mut self, revision: u64) {
        self.local.insert(REVISION_KEY.to_vec(), Some(revision.to_be_bytes().to_vec()));
    }

    /// Hands `visit` every record whose key is in `[from, to)` as this transaction sees it
    /// (its own writes over the batch's pending writes over disk), in key order, until it
    /// answers false. Streams: memory stays at one record whatever the range holds.
    pub fn visit_range<E: From<StorageError>>(&self, from: &[u8], to: &[u8], visit: impl FnMut(&[u8], &[u8]) -> Result<bool, E>) -> Result<(), E> {
        use std::ops::Bound;
        if from >= to {
            return Ok(());
        }
        let local = self.local.range::<[u8], _>((Bound::Included(from), Bound::Excluded(to))).map(|(key, value)| (key.as_slice(), value.as_deref()));
        visit_with_overlay(|scan| self.base().visit_range::<E>(from, to, |key, value| Ok(scan(key, value))), local, visit)
    }

    /// True when the transaction wrote nothing.
    pub fn is_unchanged(&self) -> bool {
        self.local.is_empty()
    }

    /// Up to `limit` child names after `start_after`, merging disk with pending and buffered
    /// writes; the flag says whether more follow.
    pub fn children(&self, parent: &str, start_after: &str, limit: usize) -> Result<(Vec<String>, bool), StorageError> {
        self.scan_names(&children_prefix(parent), start_after, limit)
    }

    /// The suffixes (as UTF-8 names) of up to `limit` keys under `prefix` after
    /// `prefix + start_after`, merging disk with pending and buffered writes.
    fn scan_names(&self, prefix: &[u8], start_after: &str, limit: usize) -> Result<(Vec<String>, bool), StorageError> {
        let prefix = prefix.to_vec();
        let end = prefix_end(&prefix);
        let mut from = prefix.clone();
        from.extend_from_slice(start_after.as_bytes());
        // Overlay changes for this parent, later layers winning.
        let mut overlay: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
        if let Some(batch) = self.batch {
            for (key, value) in batch.pending_range(&prefix, &end) {
                overlay.insert(key.to_vec(), value.is_some());
            }
        }
        for (key, value) in self.local.range(prefix.clone()..end.clone()) {
            overlay.insert(key.clone(), value.is_some());
        }
        // Overlay deletions can hide at most that many disk names: read enough to fill a page.
        let hidden = overlay.values().filter(|present| !**present).count();
        let wanted = limit.saturating_add(hidden).saturating_add(1);
        let mut names: BTreeMap<Vec<u8>, ()> = BTreeMap::new();
        self.reader.scan_range(&from, Some(&end), |key, _| {
            if key != from.as_slice() {
                names.insert(key.to_vec(), ());
            }
            names.len() < wanted
        })?;
        let disk_complete = names.len() < wanted;
        let disk_last = names.keys().next_back().cloned();
        for (key, present) in overlay {
            if key.as_slice() <= from.as_slice() {
                continue;
            }
            // Beyond the last disk name read, only keep overlay names if disk was exhausted;
            // otherwise they belong to a later page.
            if !disk_complete && disk_last.as_ref().is_some_and(|last| &key > last) {
                continue;
            }
            if present {
                names.insert(key, ());
            } else {
                names.remove(&key);
            }
        }
        let mut out = Vec::with_capacity(limit.min(names.len()));
        let mut more = !disk_complete;
        for key in names.into_keys() {
            if out.len() == limit {
                more = true;
                break;
            }
            let name = String::from_utf8(key[prefix.len()..].to_vec()).map_err(|_| StorageError::Corrupt("indexed name".into()))?;
            out.push(name);
        }
        // `more` from an incomplete disk scan is exact only if the page is full.
        if out.len() < limit {
            more = false;
        }
        Ok((out, more))
    }

    /// Every node the transaction wrote, in path order: its path and its record before the
    /// transaction and after it (`None`: absent).
    pub fn node_changes(&self) -> Result<Vec<NodeChange>, StorageError> {
        let decode = |bytes: Option<&Vec<u8>>| bytes.map(|b| decode_record(b)).transpose();
        let mut changes = Vec::new();
        for (key, after) in self.local.range(vec![NODE]..vec![NODE + 1]) {
            let path = String::from_utf8(key[1..].to_vec()).map_err(|_| StorageError::Corrupt("node path".into()))?;
            // The root's first stored record is not its creation.
            let before = decode(self.base_get(key)?.as_ref())?.or_else(|| (path == "/").then(implicit_root));
            changes.push(NodeChange { path, before, after: decode(after.as_ref())? });
        }
        Ok(changes)
    }

    /// Every session record the transaction wrote: before it and after it (`None`: absent).
    pub fn session_changes(&self) -> Result<Vec<RecordChange<SessionRecord>>, StorageError> {
        let decode = |bytes: Option<&Vec<u8>>| {
            bytes.map(|b| SessionRecord::decode(b.as_slice()).map_err(|e| StorageError::Corrupt(format!("session record: {e}")))).transpose()
        };
        let mut changes = Vec::new();
        for (key, after) in self.local.range(vec![SESSION]..vec![SESSION + 1]) {
            changes.push((decode(self.base_get(key)?.as_ref())?, decode(after.as_ref())?));
        }
        Ok(changes)
    }

    /// Ends the transaction, keeping its buffered writes (see [`Changes::commit_into`]).
    pub fn into_changes(self) -> Changes {
        Changes(self.local)
    }
}

/// A record before a transaction and after it (`None`: absent).
pub type RecordChange<T> = (Option<T>, Option<T>);

/// A node a transaction wrote.
pub struct NodeChange {
    /// Its path.
    pub path: String,
    /// Its record before the transaction.
    pub before: Option<NodeRecord>,
    /// Its record after the transaction.
    pub after: Option<NodeRecord>,
}

/// The writes of a finished transaction.
pub struct Changes(BTreeMap<Vec<u8>, Option<Vec<u8>>>);

impl Changes {
    /// Moves the writes into the batch (the transaction commits).
    pub fn commit_into(self, batch: &mut SmWrites) {
        for (key, value) in self.0 {
            match value {
                Some(value) => batch.put(&key, &value),
                None => batch.delete(&key),
            }
        }
    }
}
