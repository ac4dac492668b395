//! `raft::Storage` for one group's replica over the node's shared RocksDB, with an
//! in-memory tail cache of recent entries so a leader replicates without reading RocksDB.
//!
//! The host loop owns each `PeerStorage` (through its `RawNode`) and mutates it when it takes
//! a `Ready`: the in-memory view changes at once (raft-rs requires that `Storage` returns the
//! entries before `advance_append_async`), while the matching [`WriteOp`]s go to the store
//! writer and become durable later. Entries not yet durable never leave the cache.

use std::collections::VecDeque;
use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState};

use super::db::{Cf, Db, WriteOp};
use super::keys::{self, StateKey};
use super::snapshot::{self, SnapshotData};
use crate::error::StorageError;

/// Index (and term) at which a bootstrapped group starts: its first real entry is index 6.
/// Starting above zero lets every replica created with the same peer list be "initialized"
/// without any entry, as in TiKV.
pub const INIT_INDEX: u64 = 5;

/// Limits of one replica's storage.
#[derive(Clone, Copy, Debug)]
pub struct StorageLimits {
    /// Durable entries beyond this many bytes are evicted from the tail cache.
    pub cache_bytes_max: usize,
    /// A snapshot larger than this is refused (raft retries later).
    pub snapshot_bytes_max: usize,
    /// Snapshots the node builds at once (each holds its group's data in memory); an ask
    /// beyond that is answered "temporarily unavailable" and raft asks again later.
    pub snapshot_builds_max: usize,
}

impl Default for StorageLimits {
    fn default() -> Self {
        StorageLimits { cache_bytes_max: 4 << 20, snapshot_bytes_max: 512 << 20, snapshot_builds_max: 2 }
    }
}

/// One replica's raft storage.
pub struct PeerStorage {
    db: Arc<Db>,
    group: u64,
    limits: StorageLimits,
    hard_state: HardState,
    conf_state: ConfState,
    /// The configuration fence as of the applied index (`StateKey::ConfFence`).
    conf_fence: u64,
    truncated_index: u64,
    truncated_term: u64,
    last_index: u64,
    /// Contiguous entries ending at `last_index` (when not empty).
    cache: VecDeque<Entry>,
    cache_bytes: usize,
    /// Every entry up to here is on disk; only these may be evicted from the cache.
    durable_index: u64,
    /// The snapshot raft asked for, built off the host loop.
    snapshot_builder: snapshot::Builder,
}

/// The apply position recorded atomically with state-machine writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyState {
    /// Index of the last applied entry.
    pub index: u64,
    /// Term of that entry.
    pub term: u64,
}

impl PeerStorage {
    /// Write ops that create a replica. With `voters`, the replica is initialized at
    /// [`INIT_INDEX`] with that configuration (every founding replica of a group gets the same
    /// list); without, it is empty and waits for a snapshot from a leader (a replica added
    /// by a configuration change).
    pub fn bootstrap_ops(group: u64, voters: &[u64]) -> Vec<WriteOp> {
        let mut ops = vec![put(Cf::RaftState, keys::state_key(group, StateKey::Replica).to_vec(), Vec::new())];
        if voters.is_empty() {
            return ops;
        }
        let conf_state = ConfState { voters: voters.to_vec(), ..ConfState::default() };
        let hard_state = HardState { term: INIT_INDEX, commit: INIT_INDEX, ..HardState::default() };
        ops.push(state_put(group, StateKey::HardState, encode(&hard_state)));
        ops.push(state_put(group, StateKey::ConfState, encode(&conf_state)));
        ops.push(state_put(group, StateKey::Apply, keys::encode_index_term(INIT_INDEX, INIT_INDEX).to_vec()));
        ops.push(state_put(group, StateKey::Truncated, keys::encode_index_term(INIT_INDEX, INIT_INDEX).to_vec()));
        ops
    }

    /// Write ops that remove the replica from the node, all but a tombstone: the term and
    /// vote of `last` (the replica's latest hard state), from which a replica of the group
    /// created here later starts (see [`StateKey::Tombstone`]).
    pub fn destroy_ops(group: u64, last: &HardState) -> Vec<WriteOp> {
        let mut ops: Vec<WriteOp> = [Cf::RaftLog, Cf::RaftState, Cf::Sm]
            .into_iter()
            .map(|cf| WriteOp::DeleteRange { cf, from: keys::group_prefix(group).to_vec(), to: keys::group_end(group) })
            .collect();
        let tombstone = HardState { term: last.term, vote: last.vote, ..HardState::default() };
        // After the range delete in the same batch, so it survives it.
        ops.push(state_put(group, StateKey::Tombstone, encode(&tombstone)));
        ops
    }

    /// Groups with a replica on this node, from the `Replica` markers.
    pub fn list_groups(db: &Db) -> Result<Vec<u64>, StorageError> {
        let mut groups = Vec::new();
        let iter = db.raw().iterator_cf(db.cf(Cf::RaftState)?, rocksdb::IteratorMode::Start);
        for item in iter {
            let (key, _) = item?;
            match keys::decode_state_key(&key) {
                Some((group, tag)) if tag == StateKey::Replica as u8 => groups.push(group),
                Some(_) => {}
                None => return Err(StorageError::Corrupt(format!("raft_state key {key:?}"))),
            }
        }
        Ok(groups)
    }

    /// Loads a replica's storage from disk (its `Replica` marker must exist).
    pub fn load(db: Arc<Db>, group: u64, limits: StorageLimits) -> Result<PeerStorage, StorageError> {
        let hard_state: HardState = read_message(&db, group, StateKey::HardState)?.unwrap_or_default();
        let conf_state: ConfState = read_message(&db, group, StateKey::ConfState)?.unwrap_or_default();
        let (truncated_index, truncated_term) = read_index_term(&db, group, StateKey::Truncated)?.unwrap_or((0, 0));
        let conf_fence = read_conf_fence(&db, group)?;
        let last_index = last_log_index(&db, group)?.unwrap_or(truncated_index).max(truncated_index);
        let (applied_index, _) = read_index_term(&db, group, StateKey::Apply)?.unwrap_or((0, 0));
        if applied_index > last_index {
            return Err(StorageError::Corrupt(format!("group {group}: applied {applied_index} beyond last log index {last_index}")));
        }
        // Entries are applied as soon as raft reports them committed, before the hard state
        // carrying that commit index is written; a crash in between leaves the stored commit
        // behind the applied index. Everything applied was committed, so raise it.
        let mut hard_state = hard_state;
        hard_state.commit = hard_state.commit.max(applied_index);
        // A replica of this group destroyed here earlier voted as this node: never go back to
        // an earlier term, and keep its vote in its last term.
        if let Some(tombstone) = read_message::<HardState>(&db, group, StateKey::Tombstone)? {
            if tombstone.term > hard_state.term {
                hard_state.term = tombstone.term;
                hard_state.vote = tombstone.vote;
            } else if tombstone.term == hard_state.term && hard_state.vote == raft::INVALID_ID {
                hard_state.vote = tombstone.vote;
            }
        }
        Ok(PeerStorage {
            db,
            group,
            limits,
            hard_state,
            conf_state,
            conf_fence,
            truncated_index,
            truncated_term,
            last_index,
            cache: VecDeque::new(),
            cache_bytes: 0,
            durable_index: last_index,
            snapshot_builder: snapshot::Builder::default(),
        })
    }

    /// The group this storage belongs to.
    pub fn group(&self) -> u64 {
        self.group
    }

    /// The apply state on disk.
    pub fn apply_state(&self) -> Result<ApplyState, StorageError> {
        let (index, term) = read_index_term(&self.db, self.group, StateKey::Apply)?.unwrap_or((0, 0));
        Ok(ApplyState { index, term })
    }

    /// The configuration fence as of the applied index (`host/conf_fence.rs`).
    pub fn conf_fence(&self) -> u64 {
        self.conf_fence
    }

    /// Raises the configuration fence to `term`, written with `ops` (the apply batch that
    /// writes the configuration it came with).
    pub fn raise_conf_fence(&mut self, term: u64, ops: &mut Vec<WriteOp>) {
        if term > self.conf_fence {
            self.conf_fence = term;
            ops.push(state_put(self.group, StateKey::ConfFence, term.to_be_bytes().to_vec()));
        }
    }

    /// Index of the last entry removed from the log.
    pub fn truncated_index(&self) -> u64 {
        self.truncated_index
    }

    /// The hard state as last handed to [`Self::set_hard_state`] (or loaded).
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Appends `entries` (from a `Ready`), replacing any conflicting suffix.
    ///
    /// # Panics
    /// If the entries leave a gap after the log or overwrite compacted entries: raft-rs never
    /// produces either, so seeing one means the host broke its contract.
    pub fn append(&mut self, entries: &[Entry], ops: &mut Vec<WriteOp>) {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return;
        };
        let (first_index, last_index) = (first.index, last.index);
        assert!(first_index > self.truncated_index, "append at {first_index} overwrites compacted log");
        assert!(first_index <= self.last_index + 1, "append at {first_index} leaves a gap after {}", self.last_index);
        assert_eq!(last_index - first_index + 1, entries.len() as u64, "entries are not contiguous");
        // 1. Drop the conflicting suffix from the cache and, past the new end, from disk.
        while self.cache.back().is_some_and(|entry| entry.index >= first_index) {
            if let Some(entry) = self.cache.pop_back() {
                self.cache_bytes -= entry_bytes(&entry);
            }
        }
        if self.cache.back().is_some_and(|entry| entry.index + 1 != first_index) {
            self.cache.clear();
            self.cache_bytes = 0;
        }
        if last_index < self.last_index {
            ops.push(WriteOp::DeleteRange {
                cf: Cf::RaftLog,
                from: keys::log_key(self.group, last_index + 1).to_vec(),
                to: keys::log_key(self.group, self.last_index + 1).to_vec(),
            });
        }
        // 2. Record the new entries in the cache and in the write.
        for entry in entries {
            ops.push(put(Cf::RaftLog, keys::log_key(self.group, entry.index).to_vec(), encode(entry)));
            self.cache_bytes += entry_bytes(entry);
            self.cache.push_back(entry.clone());
        }
        self.last_index = last_index;
        self.durable_index = self.durable_index.min(first_index - 1);
    }

    /// Records a new hard state.
    pub fn set_hard_state(&mut self, hard_state: &HardState, ops: &mut Vec<WriteOp>) {
        self.hard_state = hard_state.clone();
        ops.push(state_put(self.group, StateKey::HardState, encode(hard_state)));
    }

    /// Installs a snapshot received from the leader: the log is replaced by the snapshot's
    /// position, and the group's state-machine data by the snapshot's.
    pub fn apply_snapshot(&mut self, snap: &Snapshot, ops: &mut Vec<WriteOp>) -> Result<(), StorageError> {
        let meta = snap.get_metadata();
        let data = SnapshotData::decode(&snap.data)?;
        let (index, term) = (meta.index, meta.term);
        assert!(index >= self.truncated_index, "snapshot at {index} is older than the log start {}", self.truncated_index);
        ops.push(WriteOp::DeleteRange { cf: Cf::RaftLog, from: keys::group_prefix(self.group).to_vec(), to: keys::group_end(self.group) });
        ops.extend(snapshot::restore_ops(self.group, &data));
        let conf_state = meta.get_conf_state();
        ops.push(state_put(self.group, StateKey::ConfState, encode(conf_state)));
        // The fence of the snapshot's index, as its configuration (never below this
        // replica's: a snapshot is newer than what it applied, and the fence only grows).
        ops.push(state_put(self.group, StateKey::ConfFence, data.conf_fence.to_be_bytes().to_vec()));
        self.conf_fence = data.conf_fence;
        ops.push(state_put(self.group, StateKey::Apply, keys::encode_index_term(index, term).to_vec()));
        ops.push(state_put(self.group, StateKey::Truncated, keys::encode_index_term(index, term).to_vec()));
        self.hard_state.term = self.hard_state.term.max(term);
        self.hard_state.commit = index;
        ops.push(state_put(self.group, StateKey::HardState, encode(&self.hard_state)));
        self.conf_state = conf_state.clone();
        self.truncated_index = index;
        self.truncated_term = term;
        self.last_index = index;
        self.durable_index = index;
        self.cache.clear();
        self.cache_bytes = 0;
        Ok(())
    }

    /// Removes log entries up to and including `index` (which must be applied).
    pub fn compact(&mut self, index: u64, ops: &mut Vec<WriteOp>) -> Result<(), StorageError> {
        if index <= self.truncated_index {
            return Ok(());
        }
        assert!(index <= self.durable_index, "compacting {index} beyond durable {}", self.durable_index);
        let term = raft::Storage::term(self, index).map_err(|e| StorageError::Corrupt(format!("term of {index}: {e}")))?;
        ops.push(WriteOp::DeleteRange {
            cf: Cf::RaftLog,
            from: keys::log_key(self.group, self.truncated_index + 1).to_vec(),
            to: keys::log_key(self.group, index + 1).to_vec(),
        });
        ops.push(state_put(self.group, StateKey::Truncated, keys::encode_index_term(index, term).to_vec()));
        self.truncated_index = index;
        self.truncated_term = term;
        while self.cache.front().is_some_and(|entry| entry.index <= index) {
            if let Some(entry) = self.cache.pop_front() {
                self.cache_bytes -= entry_bytes(&entry);
            }
        }
        Ok(())
    }

    /// Records that every write handed out so far up to log index `index` is on disk, so
    /// cached entries up to there may be evicted.
    pub fn on_durable(&mut self, index: u64) {
        self.durable_index = self.durable_index.max(index.min(self.last_index));
        while self.cache_bytes > self.limits.cache_bytes_max && self.cache.front().is_some_and(|entry| entry.index <= self.durable_index) {
            if let Some(entry) = self.cache.pop_front() {
                self.cache_bytes -= entry_bytes(&entry);
            }
        }
    }

    /// Whether a snapshot asked for by raft is being built (see [`snapshot::Builder`]).
    pub fn building_snapshot(&self) -> bool {
        self.snapshot_builder.building()
    }

    /// Number of entries currently in the tail cache.
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    fn cache_first_index(&self) -> Option<u64> {
        self.cache.front().map(|entry| entry.index)
    }

    fn read_entries_from_disk(&self, low: u64, high: u64, max_size: Option<u64>) -> Result<Vec<Entry>, StorageError> {
        let mut entries = Vec::with_capacity((high - low).min(1024) as usize);
        let mut size = 0u64;
        let mut read_options = rocksdb::ReadOptions::default();
        read_options.set_iterate_upper_bound(keys::log_key(self.group, high).to_vec());
        let from = keys::log_key(self.group, low);
        let iter =
            self.db.raw().iterator_cf_opt(self.db.cf(Cf::RaftLog)?, read_options, rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward));
        for item in iter {
            let (key, value) = item?;
            let expected = low + entries.len() as u64;
            if keys::decode_log_key(&key) != Some((self.group, expected)) {
                return Err(StorageError::Corrupt(format!("group {} log: expected entry {expected}, found key {key:?}", self.group)));
            }
            let entry = Entry::parse_from_bytes(&value).map_err(|e| StorageError::Corrupt(format!("entry {expected}: {e}")))?;
            size += u64::from(entry.compute_size());
            if !entries.is_empty() && max_size.is_some_and(|max| size > max) {
                return Ok(entries);
            }
            entries.push(entry);
        }
        if entries.len() as u64 != high - low {
            return Err(StorageError::Corrupt(format!("group {} log: entries [{low}, {high}) missing", self.group)));
        }
        Ok(entries)
    }
}

impl raft::Storage for PeerStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(&self, low: u64, high: u64, max_size: impl Into<Option<u64>>, _context: GetEntriesContext) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        if low <= self.truncated_index {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        assert!(high <= self.last_index + 1, "entries [{low}, {high}) past last index {}", self.last_index);
        if low >= high {
            return Ok(Vec::new());
        }
        let mut entries = match self.cache_first_index() {
            Some(cache_first) if low >= cache_first => Vec::new(),
            Some(cache_first) => self.read_entries_from_disk(low, high.min(cache_first), max_size)?,
            None => self.read_entries_from_disk(low, high, max_size)?,
        };
        if let Some(cache_first) = self.cache_first_index() {
            let from = low.max(cache_first);
            let disk_complete = entries.len() as u64 == from - low;
            if from < high && disk_complete {
                let skip = (from - cache_first) as usize;
                let take = (high - from) as usize;
                entries.extend(self.cache.iter().skip(skip).take(take).cloned());
            }
        }
        raft::util::limit_size(&mut entries, max_size);
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.truncated_index {
            return Ok(self.truncated_term);
        }
        if idx < self.truncated_index {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if idx > self.last_index {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        if let Some(cache_first) = self.cache_first_index() {
            if idx >= cache_first {
                return Ok(self.cache[(idx - cache_first) as usize].term);
            }
        }
        Ok(self.read_entries_from_disk(idx, idx + 1, None)?[0].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.truncated_index + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last_index)
    }

    /// A snapshot built off the host loop (see [`snapshot::Builder`]): "temporarily
    /// unavailable" until it is built, and again if it is older than the log's start (the
    /// follower would need another one at once) or than `request_index`.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let index_min = request_index.max(self.truncated_index);
        let limits = &self.limits;
        self.snapshot_builder
            .take_or_start(&self.db, self.group, index_min, limits.snapshot_bytes_max, limits.snapshot_builds_max)
            .ok_or(raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable))
    }
}

fn entry_bytes(entry: &Entry) -> usize {
    entry.data.len() + entry.context.len() + 24
}

/// Encodes a raft-proto message.
pub fn encode(message: &impl protobuf::Message) -> Vec<u8> {
    // Writing a well-formed in-memory message into a Vec cannot fail.
    message.write_to_bytes().unwrap_or_default()
}

fn put(cf: Cf, key: Vec<u8>, value: Vec<u8>) -> WriteOp {
    WriteOp::Put { cf, key, value }
}

/// A put of a per-group record in the `raft_state` family.
pub fn state_put(group: u64, tag: StateKey, value: Vec<u8>) -> WriteOp {
    put(Cf::RaftState, keys::state_key(group, tag).to_vec(), value)
}

/// Reads and decodes a raft-proto record from `raft_state`.
pub fn read_message<M: protobuf::Message>(db: &Db, group: u64, tag: StateKey) -> Result<Option<M>, StorageError> {
    match db.get(Cf::RaftState, &keys::state_key(group, tag))? {
        None => Ok(None),
        Some(bytes) => M::parse_from_bytes(&bytes).map(Some).map_err(|e| StorageError::Corrupt(format!("group {group} {tag:?}: {e}"))),
    }
}

/// Reads a group's configuration fence (0 when absent).
pub fn read_conf_fence(db: &Db, group: u64) -> Result<u64, StorageError> {
    match db.get(Cf::RaftState, &keys::state_key(group, StateKey::ConfFence))? {
        None => Ok(0),
        Some(value) => <[u8; 8]>::try_from(value.as_slice())
            .map(u64::from_be_bytes)
            .map_err(|_| StorageError::Corrupt(format!("group {group}: conf fence of {} bytes", value.len()))),
    }
}

/// Reads an (index, term) record from `raft_state`.
pub fn read_index_term(db: &Db, group: u64, tag: StateKey) -> Result<Option<(u64, u64)>, StorageError> {
    match db.get(Cf::RaftState, &keys::state_key(group, tag))? {
        None => Ok(None),
        Some(bytes) => {
            keys::decode_index_term(&bytes).map(Some).ok_or_else(|| StorageError::Corrupt(format!("group {group} {tag:?}: {} bytes", bytes.len())))
        }
    }
}

fn last_log_index(db: &Db, group: u64) -> Result<Option<u64>, StorageError> {
    let end = keys::log_key(group, u64::MAX);
    let mut iter = db.raw().iterator_cf(db.cf(Cf::RaftLog)?, rocksdb::IteratorMode::From(&end, rocksdb::Direction::Reverse));
    match iter.next() {
        None => Ok(None),
        Some(item) => {
            let (key, _) = item?;
            match keys::decode_log_key(&key) {
                Some((found_group, index)) if found_group == group => Ok(Some(index)),
                Some(_) => Ok(None),
                None => Err(StorageError::Corrupt(format!("raft_log key {key:?}"))),
            }
        }
    }
}
