//! Conformance suite for `PeerStorage`, the `raft::Storage` of one group's replica, in the
//! spirit of openraft's storage test suite: each test states one behaviour raft-rs (or the
//! host loop driving it) relies on.
//!
//! The storage records `WriteOp`s instead of writing; here the tests play the store writer and
//! write them with `Db::write_ops`, so every behaviour can be checked both in memory (before the
//! write), on disk (raw keys) and after a restart (`PeerStorage::load`).
//!
//! Layout: helpers; bootstrap; append and conflicts; `entries` limits and the tail cache;
//! compaction; snapshots (install and build); groups sharing one DB; a model-based proptest.

use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, Storage};
use tempfile::TempDir;
use warden_engine::state_machine::{SmReader, SmWrites};
use warden_engine::storage::keys::{self, StateKey};
use warden_engine::storage::peer_storage::state_put;
use warden_engine::storage::snapshot::SnapshotData;
use warden_engine::storage::{Cf, Db, PeerStorage, StorageLimits, WriteOp, INIT_INDEX};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const GROUP: u64 = 1;

fn open_db() -> (TempDir, Arc<Db>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(dir.path()).expect("open db");
    (dir, db)
}

/// Plays the store writer: makes `ops` durable.
fn write(db: &Db, ops: &[WriteOp]) {
    db.write_ops(ops, true).expect("write ops");
}

fn load(db: &Arc<Db>, group: u64, limits: StorageLimits) -> PeerStorage {
    PeerStorage::load(db.clone(), group, limits).expect("load")
}

/// Writes the bootstrap ops of `group` and loads its storage.
fn create(db: &Arc<Db>, group: u64, voters: &[u64], limits: StorageLimits) -> PeerStorage {
    write(db, &PeerStorage::bootstrap_ops(group, voters));
    load(db, group, limits)
}

fn limits(cache_bytes_max: usize) -> StorageLimits {
    StorageLimits { cache_bytes_max, ..StorageLimits::default() }
}

/// An entry whose data names its index, term and `tag`, so a replaced entry never compares
/// equal to its replacement even at the same term.
fn entry(index: u64, term: u64, tag: &str) -> Entry {
    Entry { index, term, data: format!("{tag}:{index}:{term}").into_bytes().into(), ..Entry::default() }
}

/// Entries `first..=last` at `term`.
fn run(first: u64, last: u64, term: u64, tag: &str) -> Vec<Entry> {
    (first..=last).map(|i| entry(i, term, tag)).collect()
}

/// An entry carrying `len` bytes of data.
fn sized_entry(index: u64, term: u64, len: usize) -> Entry {
    Entry { index, term, data: vec![(index % 251) as u8; len].into(), ..Entry::default() }
}

fn append(s: &mut PeerStorage, entries: &[Entry]) -> Vec<WriteOp> {
    let mut ops = Vec::new();
    s.append(entries, &mut ops);
    ops
}

fn ctx() -> GetEntriesContext {
    GetEntriesContext::empty(false)
}

fn get(s: &PeerStorage, low: u64, high: u64) -> Vec<Entry> {
    s.entries(low, high, None, ctx()).unwrap_or_else(|e| panic!("entries [{low}, {high}): {e}"))
}

fn is_compacted<T: std::fmt::Debug>(r: raft::Result<T>) -> bool {
    matches!(r, Err(raft::Error::Store(raft::StorageError::Compacted)))
}

fn is_unavailable<T: std::fmt::Debug>(r: raft::Result<T>) -> bool {
    matches!(r, Err(raft::Error::Store(raft::StorageError::Unavailable)))
}

fn is_snapshot_unavailable<T: std::fmt::Debug>(r: raft::Result<T>) -> bool {
    matches!(r, Err(raft::Error::Store(raft::StorageError::SnapshotTemporarilyUnavailable)))
}

/// Asks for a snapshot as raft-rs does: the first ask starts a build off the calling thread
/// and is answered "temporarily unavailable", a later one gets the result.
fn snapshot(s: &PeerStorage, request: u64, to: u64) -> raft::Result<Snapshot> {
    let wait_for_build = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while s.building_snapshot() {
            assert!(std::time::Instant::now() < deadline, "snapshot build never ended");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    let first = raft::Storage::snapshot(s, request, to);
    if first.is_ok() {
        return first;
    }
    // The first ask may have started a build that has already ended by now (its thread can
    // finish before this one looks), so the second ask comes after waiting either way.
    wait_for_build();
    let second = raft::Storage::snapshot(s, request, to);
    wait_for_build();
    second
}

/// Asserts the whole visible log: bounds, the term kept at the truncation point, every term,
/// every single-entry read and the full range read, plus the errors just outside.
fn assert_log(s: &PeerStorage, truncated: (u64, u64), expected: &[Entry]) {
    let (t_index, t_term) = truncated;
    let last = t_index + expected.len() as u64;
    assert_eq!(s.first_index().unwrap(), t_index + 1, "first_index");
    assert_eq!(s.last_index().unwrap(), last, "last_index");
    assert_eq!(s.truncated_index(), t_index, "truncated_index");
    assert_eq!(s.term(t_index).unwrap(), t_term, "term of the truncation point");
    if t_index > 0 {
        assert!(is_compacted(s.term(t_index - 1)), "term below the truncation point");
        assert!(is_compacted(s.entries(t_index, last + 1, None, ctx())), "entries from the truncation point");
    }
    assert!(is_unavailable(s.term(last + 1)), "term past last_index");
    for (offset, e) in expected.iter().enumerate() {
        let index = t_index + 1 + offset as u64;
        assert_eq!(e.index, index, "test bug: expected log is not contiguous");
        assert_eq!(s.term(index).unwrap(), e.term, "term({index})");
        assert_eq!(get(s, index, index + 1), vec![e.clone()], "entries [{index}, {})", index + 1);
    }
    assert_eq!(get(s, t_index + 1, last + 1), expected, "entries over the whole log");
    assert!(get(s, last + 1, last + 1).is_empty(), "empty range at the end");
}

/// Indexes of `group`'s entries present in the `raft_log` column family.
fn disk_log_indexes(db: &Db, group: u64) -> Vec<u64> {
    let mut read_options = rocksdb::ReadOptions::default();
    read_options.set_iterate_upper_bound(keys::group_end(group));
    let prefix = keys::group_prefix(group);
    let iter = db.raw().iterator_cf_opt(db.cf(Cf::RaftLog).unwrap(), read_options, rocksdb::IteratorMode::From(&prefix, rocksdb::Direction::Forward));
    iter.map(|item| {
        let (key, _) = item.unwrap();
        let (g, index) = keys::decode_log_key(&key).expect("log key");
        assert_eq!(g, group);
        index
    })
    .collect()
}

/// Number of keys of `group` (by prefix) in column family `cf`.
fn keys_with_prefix(db: &Db, cf: Cf, group: u64) -> usize {
    let prefix = keys::group_prefix(group);
    db.raw()
        .iterator_cf(db.cf(cf).unwrap(), rocksdb::IteratorMode::From(&prefix, rocksdb::Direction::Forward))
        .map(|item| item.unwrap().0)
        .take_while(|key| key.starts_with(&prefix))
        .count()
}

fn sm_pairs(db: &Arc<Db>, group: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs = Vec::new();
    SmReader::new(db.clone(), group).scan(|k, v| pairs.push((k.to_vec(), v.to_vec()))).expect("scan");
    pairs
}

fn pairs(items: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    items.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
}

/// Writes state-machine data of `group` and its apply state, as the apply path does.
fn write_applied(db: &Db, group: u64, index: u64, term: u64, data: &[(Vec<u8>, Vec<u8>)]) {
    let mut writes = SmWrites::new(group);
    for (k, v) in data {
        writes.put(k, v);
    }
    writes.ops_mut().push(state_put(group, StateKey::Apply, keys::encode_index_term(index, term).to_vec()));
    write(db, &writes.into_ops());
}

fn conf(voters: &[u64]) -> ConfState {
    ConfState { voters: voters.to_vec(), ..ConfState::default() }
}

fn make_snapshot(index: u64, term: u64, voters: &[u64], data: &[(Vec<u8>, Vec<u8>)]) -> Snapshot {
    let mut snap = Snapshot { data: SnapshotData { pairs: data.to_vec(), conf_fence: 0 }.encode().into(), ..Snapshot::default() };
    let meta = snap.mut_metadata();
    meta.index = index;
    meta.term = term;
    meta.set_conf_state(conf(voters));
    snap
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState { term, vote, commit, ..HardState::default() }
}

// ---------------------------------------------------------------------------------------------
// Bootstrap
// ---------------------------------------------------------------------------------------------

#[test]
fn bootstrapped_replica_initial_state_has_voters_and_init_hard_state() {
    let (_dir, db) = open_db();
    let s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let state = s.initial_state().unwrap();
    assert!(state.initialized());
    assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
    assert!(state.conf_state.learners.is_empty());
    assert_eq!(state.hard_state.term, INIT_INDEX);
    assert_eq!(state.hard_state.commit, INIT_INDEX);
    assert_eq!(state.hard_state.vote, 0);
    assert_eq!(s.apply_state().unwrap().index, INIT_INDEX);
    assert_eq!(s.apply_state().unwrap().term, INIT_INDEX);
}

#[test]
fn bootstrapped_replica_log_is_empty_at_init_index() {
    let (_dir, db) = open_db();
    let s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    assert_eq!(s.first_index().unwrap(), INIT_INDEX + 1);
    assert_eq!(s.last_index().unwrap(), INIT_INDEX);
    assert_eq!(s.term(INIT_INDEX).unwrap(), INIT_INDEX);
    assert!(is_compacted(s.term(INIT_INDEX - 1)));
    assert!(is_compacted(s.term(0)));
    assert!(is_unavailable(s.term(INIT_INDEX + 1)));
    assert!(is_compacted(s.entries(INIT_INDEX, INIT_INDEX + 1, None, ctx())));
    assert!(get(&s, INIT_INDEX + 1, INIT_INDEX + 1).is_empty());
    assert!(disk_log_indexes(&db, GROUP).is_empty());
}

#[test]
fn uninitialized_replica_is_empty() {
    let (_dir, db) = open_db();
    let s = create(&db, GROUP, &[], StorageLimits::default());
    let state = s.initial_state().unwrap();
    assert!(!state.initialized());
    assert_eq!(state.conf_state, ConfState::default());
    assert_eq!(state.hard_state, HardState::default());
    assert_eq!(s.first_index().unwrap(), 1);
    assert_eq!(s.last_index().unwrap(), 0);
    assert_eq!(s.term(0).unwrap(), 0);
    assert!(is_unavailable(s.term(1)));
    assert!(get(&s, 1, 1).is_empty());
    // Nothing to send a new member until it is initialized.
    assert!(is_snapshot_unavailable(snapshot(&s, 0, 2)));
    assert_eq!(PeerStorage::list_groups(&db).unwrap(), vec![GROUP]);
}

#[test]
fn hard_state_is_kept_in_memory_and_survives_reload() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let hs = hard_state(9, 2, INIT_INDEX);
    let mut ops = Vec::new();
    s.set_hard_state(&hs, &mut ops);
    assert_eq!(s.initial_state().unwrap().hard_state, hs);
    assert_eq!(s.hard_state(), &hs);
    // Not yet written: a restart still sees the bootstrap hard state.
    assert_eq!(load(&db, GROUP, StorageLimits::default()).hard_state().term, INIT_INDEX);
    write(&db, &ops);
    let s = load(&db, GROUP, StorageLimits::default());
    assert_eq!(s.initial_state().unwrap().hard_state, hs);
    assert_eq!(s.initial_state().unwrap().conf_state.voters, vec![1, 2, 3]);
}

// ---------------------------------------------------------------------------------------------
// Append and conflicts
// ---------------------------------------------------------------------------------------------

#[test]
fn append_reads_back_before_the_write() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let log = run(6, 12, 6, "a");
    let ops = append(&mut s, &log);
    // One put per entry, all in the raft_log family of this group.
    let puts: Vec<u64> = ops
        .iter()
        .filter_map(|op| match op {
            WriteOp::Put { cf: Cf::RaftLog, key, .. } => keys::decode_log_key(key),
            _ => None,
        })
        .map(|(g, i)| {
            assert_eq!(g, GROUP);
            i
        })
        .collect();
    assert_eq!(puts, (6..=12).collect::<Vec<_>>());
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
    // Nothing is on disk until the store writer writes the ops.
    assert!(disk_log_indexes(&db, GROUP).is_empty());
    assert_eq!(load(&db, GROUP, StorageLimits::default()).last_index().unwrap(), INIT_INDEX);
}

#[test]
fn append_reads_back_after_the_write_and_after_reload() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let mut log = run(6, 9, 6, "a");
    let ops = append(&mut s, &log);
    write(&db, &ops);
    s.on_durable(9);
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
    // A second batch extends the first.
    let more = run(10, 14, 7, "b");
    write(&db, &append(&mut s, &more));
    s.on_durable(14);
    log.extend(more);
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
    assert_eq!(disk_log_indexes(&db, GROUP), (6..=14).collect::<Vec<_>>());
    let reloaded = load(&db, GROUP, StorageLimits::default());
    assert_eq!(reloaded.cache_len(), 0, "a reload starts with an empty cache");
    assert_log(&reloaded, (INIT_INDEX, INIT_INDEX), &log);
}

#[test]
fn conflicting_append_replaces_the_suffix_in_memory() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let ops = append(&mut s, &run(6, 12, 6, "old"));
    write(&db, &ops);
    s.on_durable(12);
    // A new leader overwrites from 9 with a shorter log.
    let _ = append(&mut s, &run(9, 10, 7, "new"));
    let mut expected = run(6, 8, 6, "old");
    expected.extend(run(9, 10, 7, "new"));
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    assert!(is_unavailable(s.term(11)));
}

#[test]
fn conflicting_append_replaces_the_suffix_on_disk() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    write(&db, &append(&mut s, &run(6, 12, 6, "old")));
    s.on_durable(12);
    write(&db, &append(&mut s, &run(9, 10, 7, "new")));
    s.on_durable(10);
    let mut expected = run(6, 8, 6, "old");
    expected.extend(run(9, 10, 7, "new"));
    // No stale entry past the new last index may survive: a restart would resurrect it.
    assert_eq!(disk_log_indexes(&db, GROUP), (6..=10).collect::<Vec<_>>());
    assert_log(&load(&db, GROUP, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &expected);
}

#[test]
fn conflicting_append_before_the_first_write_lands_correctly() {
    // Both readies are in flight when the store writer writes them, in order, in one batch.
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let mut ops = append(&mut s, &run(6, 15, 6, "old"));
    ops.extend(append(&mut s, &run(8, 9, 8, "new")));
    let mut expected = run(6, 7, 6, "old");
    expected.extend(run(8, 9, 8, "new"));
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    write(&db, &ops);
    s.on_durable(9);
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    assert_eq!(disk_log_indexes(&db, GROUP), (6..=9).collect::<Vec<_>>());
    assert_log(&load(&db, GROUP, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &expected);
}

#[test]
fn conflicting_append_longer_than_the_old_log() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    write(&db, &append(&mut s, &run(6, 10, 6, "old")));
    s.on_durable(10);
    write(&db, &append(&mut s, &run(7, 14, 7, "new")));
    s.on_durable(14);
    let mut expected = run(6, 6, 6, "old");
    expected.extend(run(7, 14, 7, "new"));
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    assert_log(&load(&db, GROUP, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &expected);
}

#[test]
fn conflicting_append_into_entries_evicted_from_the_cache() {
    let (_dir, db) = open_db();
    // A zero-byte cache evicts every durable entry.
    let mut s = create(&db, GROUP, &[1, 2, 3], limits(0));
    write(&db, &append(&mut s, &run(6, 20, 6, "old")));
    s.on_durable(20);
    assert_eq!(s.cache_len(), 0);
    // Overwrite from 10 (on disk only), not yet written.
    let ops = append(&mut s, &run(10, 12, 7, "new"));
    let mut expected = run(6, 9, 6, "old");
    expected.extend(run(10, 12, 7, "new"));
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    write(&db, &ops);
    s.on_durable(12);
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    assert_eq!(disk_log_indexes(&db, GROUP), (6..=12).collect::<Vec<_>>());
    assert_log(&load(&db, GROUP, limits(0)), (INIT_INDEX, INIT_INDEX), &expected);
}

#[test]
fn conflicting_append_at_first_index_replaces_the_whole_log() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    write(&db, &append(&mut s, &run(6, 9, 6, "old")));
    s.on_durable(9);
    write(&db, &append(&mut s, &run(6, 7, 7, "new")));
    s.on_durable(7);
    let expected = run(6, 7, 7, "new");
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &expected);
    assert_eq!(disk_log_indexes(&db, GROUP), vec![6, 7]);
    assert_log(&load(&db, GROUP, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &expected);
}

#[test]
#[should_panic(expected = "gap")]
fn append_leaving_a_gap_is_refused() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let _ = append(&mut s, &run(7, 8, 6, "gap"));
}

#[test]
#[should_panic(expected = "compacted")]
fn append_over_the_truncation_point_is_refused() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let _ = append(&mut s, &run(INIT_INDEX, INIT_INDEX + 1, 6, "old"));
}

// ---------------------------------------------------------------------------------------------
// `entries` limits and the tail cache
// ---------------------------------------------------------------------------------------------

/// What `entries(low, high, max_size)` must return: the prefix of `[low, high)` whose total
/// encoded size stays within `max_size`, but never less than one entry.
fn expected_limited(log: &[Entry], low: u64, high: u64, max_size: Option<u64>) -> Vec<Entry> {
    let first = log[0].index;
    let range = &log[(low - first) as usize..(high - first) as usize];
    let mut out = Vec::new();
    let mut size = 0u64;
    for e in range {
        size += u64::from(e.compute_size());
        if !out.is_empty() && max_size.is_some_and(|max| size > max) {
            break;
        }
        out.push(e.clone());
    }
    out
}

/// Every `[low, high)` window with a handful of size limits, against `expected_limited`.
fn assert_all_windows(s: &PeerStorage, log: &[Entry]) {
    let first = log[0].index;
    let last = log[log.len() - 1].index;
    let one = u64::from(log[0].compute_size());
    let mut limits = vec![None, Some(0), Some(1), Some(one), Some(one * 2), Some(one * 3 - 1), Some(one * 5 + 3), Some(u64::MAX)];
    limits.extend([20, 40, 64, 100, 150, 200, 333, 400, 700].map(Some));
    for low in first..=last + 1 {
        for high in low..=last + 1 {
            for &max in &limits {
                let got = s.entries(low, high, max, ctx()).unwrap_or_else(|e| panic!("[{low}, {high}) max {max:?}: {e}"));
                assert_eq!(got, expected_limited(log, low, high, max), "[{low}, {high}) max {max:?}");
                if low < high {
                    assert!(!got.is_empty(), "[{low}, {high}) max {max:?} must return at least one entry");
                }
            }
        }
    }
}

#[test]
fn entries_max_size_returns_at_least_one_entry_and_respects_the_limit() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let log: Vec<Entry> = (6..=15).map(|i| sized_entry(i, 6, 40)).collect();
    let one = u64::from(log[0].compute_size());
    write(&db, &append(&mut s, &log));
    s.on_durable(15);
    // From the cache.
    assert_eq!(s.cache_len(), log.len());
    assert_eq!(s.entries(6, 16, 0, ctx()).unwrap(), log[..1].to_vec());
    assert_eq!(s.entries(6, 16, one * 3, ctx()).unwrap(), log[..3].to_vec());
    assert_eq!(s.entries(6, 16, one * 3 - 1, ctx()).unwrap(), log[..2].to_vec());
    assert_all_windows(&s, &log);
    // From disk.
    let reloaded = load(&db, GROUP, StorageLimits::default());
    assert_eq!(reloaded.cache_len(), 0);
    assert_eq!(reloaded.entries(6, 16, 0, ctx()).unwrap(), log[..1].to_vec());
    assert_eq!(reloaded.entries(6, 16, one * 3, ctx()).unwrap(), log[..3].to_vec());
    assert_eq!(reloaded.entries(6, 16, one * 3 - 1, ctx()).unwrap(), log[..2].to_vec());
    assert_all_windows(&reloaded, &log);
}

#[test]
fn entries_spanning_disk_and_cache_are_contiguous() {
    let (_dir, db) = open_db();
    // Each entry accounts for at least 100 bytes, so at most 4 stay cached.
    let mut s = create(&db, GROUP, &[1, 2, 3], limits(450));
    let log: Vec<Entry> = (6..=30).map(|i| sized_entry(i, 6 + i / 10, 100)).collect();
    for chunk in log.chunks(5) {
        write(&db, &append(&mut s, chunk));
        s.on_durable(chunk[chunk.len() - 1].index);
    }
    let cached = s.cache_len();
    assert!((1..=4).contains(&cached), "cache holds {cached} entries of >= 100 bytes under a 450-byte limit");
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
    assert_all_windows(&s, &log);
}

#[test]
fn entries_of_mixed_sizes_stay_contiguous_wherever_the_cache_starts() {
    // A size limit may stop the disk part of a read early; the cached part must then not be
    // glued on after the gap, even when a small cached entry would still fit the limit.
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], limits(350));
    let sizes = [5, 300, 5, 60, 5, 5, 150, 20];
    let log: Vec<Entry> = (6..=25).map(|i| sized_entry(i, 6, sizes[(i % 8) as usize])).collect();
    for e in &log {
        write(&db, &append(&mut s, std::slice::from_ref(e)));
        s.on_durable(e.index);
        // The border between disk and cache moves with every entry.
        let upto = (e.index - 5) as usize;
        assert_all_windows(&s, &log[..upto]);
    }
    assert!(s.cache_len() < log.len(), "the test needs entries on disk");
    assert_all_windows(&load(&db, GROUP, limits(350)), &log);
}

#[test]
fn entries_not_yet_durable_are_never_evicted() {
    let (_dir, db) = open_db();
    // Over the limit from the first byte: only durability decides what stays.
    let mut s = create(&db, GROUP, &[1, 2, 3], limits(0));
    let ops = append(&mut s, &run(6, 15, 6, "a"));
    assert_eq!(s.cache_len(), 10, "append never evicts");
    write(&db, &ops);
    s.on_durable(10);
    assert_eq!(s.cache_len(), 5, "only entries up to the durable index leave the cache");

    // Entries 16..=20 exist only in the cache (their ops are not written).
    let pending = append(&mut s, &run(16, 20, 6, "a"));
    s.on_durable(15);
    assert_eq!(s.cache_len(), 5);
    let mut log = run(6, 20, 6, "a");
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
    write(&db, &pending);

    // A durable notice beyond the log does not cover entries appended later.
    s.on_durable(100);
    assert_eq!(s.cache_len(), 0);
    let pending = append(&mut s, &run(21, 23, 7, "b"));
    s.on_durable(20);
    assert_eq!(s.cache_len(), 3, "entries appended after a durable notice stay cached");
    log.extend(run(21, 23, 7, "b"));
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);

    // A conflicting append lowers the durable point: a stale notice does not evict the new
    // entries that replaced the durable ones.
    let conflict = append(&mut s, &run(19, 21, 8, "c"));
    s.on_durable(18);
    assert_eq!(s.cache_len(), 3);
    log.truncate((19 - 6) as usize);
    log.extend(run(19, 21, 8, "c"));
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);

    // Once written and acknowledged, everything may go, and reads come from disk.
    write(&db, &pending);
    write(&db, &conflict);
    s.on_durable(21);
    assert_eq!(s.cache_len(), 0);
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
    assert_log(&load(&db, GROUP, limits(0)), (INIT_INDEX, INIT_INDEX), &log);
}

// ---------------------------------------------------------------------------------------------
// Compaction
// ---------------------------------------------------------------------------------------------

#[test]
fn compact_moves_first_index_and_keeps_the_truncated_term() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let mut log = run(6, 10, 6, "a");
    log.extend(run(11, 20, 7, "a"));
    write(&db, &append(&mut s, &log));
    s.on_durable(20);

    let mut ops = Vec::new();
    s.compact(12, &mut ops).unwrap();
    assert!(!ops.is_empty());
    // In memory at once.
    assert_log(&s, (12, 7), &log[(12 - 5) as usize..]);
    assert!(is_compacted(s.term(11)));
    assert!(is_compacted(s.entries(6, 21, None, ctx())));
    assert!(is_compacted(s.entries(12, 13, None, ctx())));
    // On disk once written, and after a restart.
    write(&db, &ops);
    assert_eq!(disk_log_indexes(&db, GROUP), (13..=20).collect::<Vec<_>>());
    let reloaded = load(&db, GROUP, StorageLimits::default());
    assert_log(&reloaded, (12, 7), &log[(12 - 5) as usize..]);

    // Compacting at or below the truncation point is a no-op.
    let mut ops = Vec::new();
    s.compact(12, &mut ops).unwrap();
    s.compact(INIT_INDEX, &mut ops).unwrap();
    assert!(ops.is_empty());
    assert_eq!(s.first_index().unwrap(), 13);
}

#[test]
fn compact_whole_log_then_append_and_reload() {
    let (_dir, db) = open_db();
    // A small cache, so compaction meets both evicted and cached entries.
    let mut s = create(&db, GROUP, &[1, 2, 3], limits(64));
    let log = run(6, 15, 6, "a");
    write(&db, &append(&mut s, &log));
    s.on_durable(15);
    let mut ops = Vec::new();
    s.compact(15, &mut ops).unwrap();
    write(&db, &ops);
    assert_log(&s, (15, 6), &[]);
    assert_eq!(s.cache_len(), 0);
    assert!(disk_log_indexes(&db, GROUP).is_empty());
    let reloaded = load(&db, GROUP, limits(64));
    assert_log(&reloaded, (15, 6), &[]);

    let more = run(16, 18, 7, "b");
    write(&db, &append(&mut s, &more));
    s.on_durable(18);
    assert_log(&s, (15, 6), &more);
    assert_log(&load(&db, GROUP, limits(64)), (15, 6), &more);
}

#[test]
#[should_panic(expected = "durable")]
fn compact_refuses_entries_not_yet_durable() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let _ = append(&mut s, &run(6, 10, 6, "a"));
    let mut ops = Vec::new();
    let _ = s.compact(8, &mut ops);
}

// ---------------------------------------------------------------------------------------------
// Snapshots: installing one from the leader
// ---------------------------------------------------------------------------------------------

#[test]
fn apply_snapshot_replaces_log_conf_state_and_state_machine() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    write(&db, &append(&mut s, &run(6, 12, 6, "a")));
    s.on_durable(12);
    write_applied(&db, GROUP, 8, 6, &pairs(&[("a", "1"), ("b", "2"), ("z", "old")]));
    // A neighbour group's data must not be touched.
    let _other = create(&db, 2, &[1, 2, 3], StorageLimits::default());
    write_applied(&db, 2, INIT_INDEX, INIT_INDEX, &pairs(&[("a", "other")]));

    let snap_data = pairs(&[("x", "10"), ("z", "new")]);
    let snap = make_snapshot(30, 9, &[4, 5, 6], &snap_data);
    let mut ops = Vec::new();
    s.apply_snapshot(&snap, &mut ops).unwrap();

    let check = |s: &PeerStorage| {
        assert_log(s, (30, 9), &[]);
        assert_eq!(s.first_index().unwrap() - 1, 30);
        let state = s.initial_state().unwrap();
        assert_eq!(state.conf_state, conf(&[4, 5, 6]));
        assert_eq!(state.hard_state.commit, 30);
        assert_eq!(state.hard_state.term, 9);
    };
    check(&s);
    write(&db, &ops);
    assert!(disk_log_indexes(&db, GROUP).is_empty(), "the old log is gone from disk");
    assert_eq!(sm_pairs(&db, GROUP), snap_data, "state machine replaced, not merged");
    assert_eq!(sm_pairs(&db, 2), pairs(&[("a", "other")]));
    assert_eq!(s.apply_state().unwrap().index, 30);
    assert_eq!(s.apply_state().unwrap().term, 9);
    let reloaded = load(&db, GROUP, StorageLimits::default());
    check(&reloaded);

    // The log continues after the snapshot.
    let more = run(31, 33, 9, "b");
    write(&db, &append(&mut s, &more));
    s.on_durable(33);
    assert_log(&s, (30, 9), &more);
    assert_log(&load(&db, GROUP, StorageLimits::default()), (30, 9), &more);
    // And a snapshot built now is the installed one.
    let built = snapshot(&s, 30, 2).unwrap();
    assert_eq!((built.get_metadata().index, built.get_metadata().term), (30, 9));
    assert_eq!(built.get_metadata().get_conf_state(), &conf(&[4, 5, 6]));
    assert_eq!(SnapshotData::decode(&built.data).unwrap().pairs, snap_data);
}

#[test]
fn apply_snapshot_behind_the_log_drops_the_whole_log() {
    // raft-rs installs a snapshot whose term does not match the local entry at its index:
    // nothing of the old log may survive, including entries past the snapshot.
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    write(&db, &append(&mut s, &run(6, 20, 6, "a")));
    s.on_durable(20);
    let mut ops = Vec::new();
    s.apply_snapshot(&make_snapshot(10, 8, &[1, 2, 3], &[]), &mut ops).unwrap();
    assert_log(&s, (10, 8), &[]);
    write(&db, &ops);
    assert!(disk_log_indexes(&db, GROUP).is_empty());
    assert_log(&load(&db, GROUP, StorageLimits::default()), (10, 8), &[]);
}

#[test]
fn apply_snapshot_initializes_an_empty_replica() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[], StorageLimits::default());
    let data = pairs(&[("k", "v")]);
    let mut ops = Vec::new();
    s.apply_snapshot(&make_snapshot(17, 4, &[1, 2, 3, 4], &data), &mut ops).unwrap();
    write(&db, &ops);
    for s in [&s, &load(&db, GROUP, StorageLimits::default())] {
        let state = s.initial_state().unwrap();
        assert!(state.initialized());
        assert_eq!(state.conf_state.voters, vec![1, 2, 3, 4]);
        assert_log(s, (17, 4), &[]);
    }
    assert_eq!(sm_pairs(&db, GROUP), data);
}

#[test]
fn malformed_snapshot_is_an_error_and_records_no_ops() {
    let (_dir, db) = open_db();
    let mut s = create(&db, GROUP, &[1, 2, 3], StorageLimits::default());
    let log = run(6, 8, 6, "a");
    write(&db, &append(&mut s, &log));
    s.on_durable(8);
    let good = make_snapshot(20, 7, &[7, 8, 9], &pairs(&[("k", "v")]));
    let mut truncated = good.clone();
    truncated.data = good.data[..good.data.len() - 1].to_vec().into();
    let mut garbage = good.clone();
    garbage.data = b"definitely not a snapshot".to_vec().into();
    let mut empty = good.clone();
    empty.data = Vec::new().into();
    for bad in [truncated, garbage, empty] {
        let mut ops = Vec::new();
        assert!(s.apply_snapshot(&bad, &mut ops).is_err());
        assert!(ops.is_empty(), "a refused snapshot records no ops: {ops:?}");
        assert_log(&s, (INIT_INDEX, INIT_INDEX), &log);
        assert_eq!(s.initial_state().unwrap().conf_state.voters, vec![1, 2, 3]);
        assert_eq!(s.hard_state().commit, INIT_INDEX);
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshots: building one for a follower (`Storage::snapshot`)
// ---------------------------------------------------------------------------------------------

#[test]
fn snapshot_is_built_at_the_applied_index_with_only_this_groups_data() {
    let (_dir, db) = open_db();
    // Group 5 between neighbours whose key ranges touch its own on both sides.
    let group = 5;
    let mut s = create(&db, group, &[1, 2, 3], StorageLimits::default());
    write(&db, &append(&mut s, &run(6, 12, 6, "a")));
    s.on_durable(12);
    let data = pairs(&[("alpha", "1"), ("beta", "2"), ("gamma", "3")]);
    write_applied(&db, group, 10, 6, &data);
    for neighbour in [4, 6] {
        let _ = create(&db, neighbour, &[4, 5], StorageLimits::default());
        write_applied(&db, neighbour, 7, 6, &pairs(&[("", "empty key"), ("alpha", "other"), ("zzz", "other")]));
    }

    for request in [0, INIT_INDEX, 10] {
        let snap = snapshot(&s, request, 2).unwrap();
        let meta = snap.get_metadata();
        assert_eq!((meta.index, meta.term), (10, 6), "request {request}");
        assert_eq!(meta.get_conf_state(), &conf(&[1, 2, 3]));
        assert_eq!(SnapshotData::decode(&snap.data).unwrap().pairs, data);
    }
    assert!(is_snapshot_unavailable(snapshot(&s, 11, 2)));

    // Round trip: the built snapshot initializes a fresh replica of the same data.
    let snap = snapshot(&s, 10, 3).unwrap();
    let mut fresh = create(&db, 7, &[], StorageLimits::default());
    let mut ops = Vec::new();
    fresh.apply_snapshot(&snap, &mut ops).unwrap();
    write(&db, &ops);
    assert_eq!(sm_pairs(&db, 7), data);
    assert_eq!(fresh.initial_state().unwrap().conf_state, conf(&[1, 2, 3]));
    assert_log(&fresh, (10, 6), &[]);
}

#[test]
fn snapshot_over_the_size_limit_is_temporarily_unavailable() {
    let (_dir, db) = open_db();
    let small = StorageLimits { snapshot_bytes_max: 64, ..StorageLimits::default() };
    let s = create(&db, GROUP, &[1, 2, 3], small);
    write_applied(&db, GROUP, INIT_INDEX, INIT_INDEX, &[(b"big".to_vec(), vec![7; 200])]);
    assert!(is_snapshot_unavailable(snapshot(&s, 0, 2)));
    let roomy = load(&db, GROUP, StorageLimits::default());
    assert_eq!(snapshot(&roomy, 0, 2).unwrap().get_metadata().index, INIT_INDEX);
}

// ---------------------------------------------------------------------------------------------
// Groups sharing one DB
// ---------------------------------------------------------------------------------------------

#[test]
fn groups_do_not_see_each_others_entries() {
    let (_dir, db) = open_db();
    let mut a = create(&db, 1, &[1, 2, 3], StorageLimits::default());
    let mut b = create(&db, 2, &[1, 2, 3], StorageLimits::default());
    let c = create(&db, 3, &[1, 2, 3], StorageLimits::default());
    let log_a = run(6, 20, 6, "a");
    let log_b = run(6, 9, 8, "b");
    let mut ops = append(&mut a, &log_a);
    ops.extend(append(&mut b, &log_b));
    write(&db, &ops);
    a.on_durable(20);
    b.on_durable(9);
    assert_log(&a, (INIT_INDEX, INIT_INDEX), &log_a);
    assert_log(&b, (INIT_INDEX, INIT_INDEX), &log_b);
    // After a restart the last index of each group comes from its own keys only: group 3
    // (no entries) sits right after group 2's keys, group 1 right before them.
    for (group, log) in [(1, &log_a[..]), (2, &log_b[..]), (3, &[][..])] {
        assert_log(&load(&db, group, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), log);
    }
    assert_log(&c, (INIT_INDEX, INIT_INDEX), &[]);
    // A conflict in one group leaves the other alone.
    write(&db, &append(&mut b, &run(7, 7, 9, "b2")));
    assert_log(&load(&db, 1, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &log_a);
    let mut expected_b = run(6, 6, 8, "b");
    expected_b.extend(run(7, 7, 9, "b2"));
    assert_log(&load(&db, 2, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &expected_b);
}

#[test]
fn destroy_removes_one_group_entirely() {
    let (_dir, db) = open_db();
    let mut groups = Vec::new();
    for group in [1, 2, 3] {
        let mut s = create(&db, group, &[1, 2, 3], StorageLimits::default());
        write(&db, &append(&mut s, &run(6, 10, 6, &format!("g{group}"))));
        s.on_durable(10);
        write_applied(&db, group, 8, 6, &pairs(&[("k", &format!("v{group}"))]));
        groups.push(s);
    }
    let _uninitialized = create(&db, 4, &[], StorageLimits::default());
    assert_eq!(PeerStorage::list_groups(&db).unwrap(), vec![1, 2, 3, 4]);

    let last = HardState { term: 9, vote: 3, commit: 10, ..HardState::default() };
    write(&db, &PeerStorage::destroy_ops(2, &last));
    assert_eq!(PeerStorage::list_groups(&db).unwrap(), vec![1, 3, 4]);
    for cf in [Cf::RaftLog, Cf::Sm] {
        assert_eq!(keys_with_prefix(&db, cf, 2), 0, "{cf:?} keys of the destroyed group");
    }
    assert_eq!(keys_with_prefix(&db, Cf::RaftState, 2), 1, "only the tombstone is left");
    for group in [1, 3] {
        let s = load(&db, group, StorageLimits::default());
        assert_log(&s, (INIT_INDEX, INIT_INDEX), &run(6, 10, 6, &format!("g{group}")));
        assert_eq!(s.initial_state().unwrap().conf_state.voters, vec![1, 2, 3]);
        assert_eq!(sm_pairs(&db, group), pairs(&[("k", &format!("v{group}"))]));
        assert_eq!(snapshot(&s, 8, 9).unwrap().get_metadata().index, 8);
    }
    // The group can be created again from scratch, from the tombstone's term and vote
    // (never its commit: the new replica has no log).
    let s = create(&db, 2, &[], StorageLimits::default());
    assert_eq!(s.last_index().unwrap(), 0);
    let hard_state = s.initial_state().unwrap().hard_state;
    assert_eq!((hard_state.term, hard_state.vote, hard_state.commit), (9, 3, 0));
    assert_eq!(PeerStorage::list_groups(&db).unwrap(), vec![1, 2, 3, 4]);
}

#[test]
fn tombstone_never_lowers_a_stored_hard_state() {
    // A replica created with founding voters starts at term INIT_INDEX: a tombstone of an
    // earlier term leaves it alone, one of a later term raises term and vote, and one of the
    // same term supplies only a missing vote.
    let (_dir, db) = open_db();
    for (tombstone, expected) in
        [((INIT_INDEX - 1, 2), (INIT_INDEX, 0)), ((INIT_INDEX + 3, 2), (INIT_INDEX + 3, 2)), ((INIT_INDEX, 2), (INIT_INDEX, 2))]
    {
        let last = HardState { term: tombstone.0, vote: tombstone.1, ..HardState::default() };
        write(&db, &PeerStorage::destroy_ops(7, &last));
        let hard_state = create(&db, 7, &[1, 2, 3], StorageLimits::default()).initial_state().unwrap().hard_state;
        assert_eq!((hard_state.term, hard_state.vote), expected, "tombstone {tombstone:?}");
        assert_eq!(hard_state.commit, INIT_INDEX);
    }
}

#[test]
fn highest_group_id_owns_every_key_with_its_prefix() {
    // The last valid id's range ends at the reserved id's prefix: user keys of all-0xff bytes
    // still belong to it, and its neighbour below is unaffected by its destruction.
    let (_dir, db) = open_db();
    let top = keys::GROUP_ID_MAX;
    let below = top - 1;
    let data = vec![(b"plain".to_vec(), b"1".to_vec()), (vec![0xff; 12], b"2".to_vec())];
    for group in [below, top] {
        let mut s = create(&db, group, &[1, 2, 3], StorageLimits::default());
        write(&db, &append(&mut s, &run(6, 8, 6, "a")));
        write_applied(&db, group, INIT_INDEX, INIT_INDEX, &data);
    }
    let s = load(&db, top, StorageLimits::default());
    assert_log(&s, (INIT_INDEX, INIT_INDEX), &run(6, 8, 6, "a"));
    assert_eq!(sm_pairs(&db, top), data, "SmReader::scan sees every key of the group");
    let snap = snapshot(&s, 0, 2).unwrap();
    assert_eq!(SnapshotData::decode(&snap.data).unwrap().pairs, data, "the snapshot holds every key");
    write(&db, &PeerStorage::destroy_ops(top, &HardState::default()));
    for cf in [Cf::RaftLog, Cf::Sm] {
        assert_eq!(keys_with_prefix(&db, cf, top), 0, "{cf:?} keys of the destroyed group");
    }
    assert_eq!(keys_with_prefix(&db, Cf::RaftState, top), 1, "only the tombstone is left");
    assert_eq!(PeerStorage::list_groups(&db).unwrap(), vec![below]);
    assert_eq!(sm_pairs(&db, below), data);
    assert_log(&load(&db, below, StorageLimits::default()), (INIT_INDEX, INIT_INDEX), &run(6, 8, 6, "a"));
}

#[test]
#[should_panic(expected = "reserved")]
fn reserved_group_id_has_no_key_range() {
    // `u64::MAX` has no successor prefix to end its range, so it is not a valid group.
    let _ = PeerStorage::destroy_ops(u64::MAX, &HardState::default());
}

// ---------------------------------------------------------------------------------------------
// Model-based proptest
// ---------------------------------------------------------------------------------------------

mod model {
    use super::*;
    use proptest::prelude::*;

    /// The group under test sits between two neighbours whose logs must never change.
    const G: u64 = 2;
    const NEIGHBOURS: [u64; 2] = [1, 3];

    #[derive(Clone, Debug)]
    enum Op {
        /// Append `count` entries at a position in `(truncated, last + 1]` picked by `at`
        /// (biased towards `last + 1`); `bump` (and any overwrite) raises the term.
        Append {
            at: u16,
            count: u8,
            bump: bool,
        },
        /// Compact to a point picked by `to` in `[truncated - 1, durable]`.
        Compact {
            to: u16,
        },
        SetHardState {
            vote: u8,
        },
        /// The store writer writes every pending op.
        Flush,
        /// The store writer reports the last flush durable.
        Durable,
        /// Clean restart: flush, then load.
        Reload,
        /// Crash: pending ops are lost, then load.
        Crash,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (any::<u16>(), 1u8..6, any::<bool>()).prop_map(|(at, count, bump)| Op::Append { at, count, bump }),
            2 => any::<u16>().prop_map(|to| Op::Compact { to }),
            1 => any::<u8>().prop_map(|vote| Op::SetHardState { vote }),
            4 => Just(Op::Flush),
            3 => Just(Op::Durable),
            1 => Just(Op::Reload),
            1 => Just(Op::Crash),
        ]
    }

    /// The logical state of the log: what raft must see.
    #[derive(Clone, Debug)]
    struct Model {
        truncated: (u64, u64),
        entries: Vec<Entry>,
        hard_state: HardState,
    }

    impl Model {
        fn last(&self) -> u64 {
            self.truncated.0 + self.entries.len() as u64
        }

        fn term(&self, index: u64) -> u64 {
            if index == self.truncated.0 {
                self.truncated.1
            } else {
                self.entries[(index - self.truncated.0 - 1) as usize].term
            }
        }
    }

    struct Harness {
        _dir: TempDir,
        db: Arc<Db>,
        limits: StorageLimits,
        s: PeerStorage,
        /// Logical state in memory and as of the last flush (what a crash returns to).
        mem: Model,
        disk: Model,
        pending: Vec<WriteOp>,
        /// Last index covered by the last flush (lowered by later conflicting appends, as the
        /// host loop does), not yet reported durable.
        flushed: Option<u64>,
        /// The storage's durable point: compaction may not go past it.
        durable: u64,
        next_tag: u64,
    }

    impl Harness {
        fn new(initialized: bool, cache_bytes_max: usize) -> Harness {
            let (dir, db) = open_db();
            let limits = limits(cache_bytes_max);
            for n in NEIGHBOURS {
                let mut s = create(&db, n, &[1, 2, 3], limits);
                write(&db, &append(&mut s, &run(6, 9, 6, &format!("n{n}"))));
            }
            let voters: &[u64] = if initialized { &[1, 2, 3] } else { &[] };
            let s = create(&db, G, voters, limits);
            let start = if initialized { INIT_INDEX } else { 0 };
            let hard_state = if initialized { hard_state(INIT_INDEX, 0, INIT_INDEX) } else { HardState::default() };
            let mem = Model { truncated: (start, start), entries: Vec::new(), hard_state };
            Harness { _dir: dir, db, limits, s, disk: mem.clone(), mem, pending: Vec::new(), flushed: None, durable: start, next_tag: 0 }
        }

        fn apply(&mut self, op: &Op) {
            match *op {
                Op::Append { at, count, bump } => {
                    let lo = self.mem.truncated.0 + 1;
                    let hi = self.mem.last() + 1;
                    // Half the time append at the end; otherwise anywhere in [lo, hi].
                    let first = if at % 2 == 0 { hi } else { lo + u64::from(at / 2) % (hi - lo + 1) };
                    let base = self.mem.term(first - 1).max(self.mem.entries.iter().map(|e| e.term).max().unwrap_or(1));
                    let term = if bump || first < hi { base + 1 } else { base };
                    self.next_tag += 1;
                    let entries = run(first, first + u64::from(count) - 1, term, &format!("t{}", self.next_tag));
                    self.s.append(&entries, &mut self.pending);
                    let keep = (first - self.mem.truncated.0 - 1) as usize;
                    self.mem.entries.truncate(keep);
                    self.mem.entries.extend(entries);
                    self.flushed = self.flushed.map(|f| f.min(first - 1));
                    self.durable = self.durable.min(first - 1);
                }
                Op::Compact { to } => {
                    let lo = self.mem.truncated.0.saturating_sub(1);
                    let index = lo + u64::from(to) % (self.durable - lo + 1);
                    let mut ops = Vec::new();
                    self.s.compact(index, &mut ops).expect("compact");
                    if index > self.mem.truncated.0 {
                        let term = self.mem.term(index);
                        let drop = (index - self.mem.truncated.0) as usize;
                        self.mem.entries.drain(..drop);
                        self.mem.truncated = (index, term);
                        assert!(!ops.is_empty());
                    } else {
                        assert!(ops.is_empty(), "compact({index}) at or below {} records ops", self.mem.truncated.0);
                    }
                    self.pending.extend(ops);
                }
                Op::SetHardState { vote } => {
                    let hs = hard_state(self.mem.hard_state.term + 1, u64::from(vote % 4), self.mem.hard_state.commit);
                    self.s.set_hard_state(&hs, &mut self.pending);
                    self.mem.hard_state = hs;
                }
                Op::Flush => self.flush(),
                Op::Durable => {
                    if let Some(f) = self.flushed.take() {
                        self.s.on_durable(f);
                        self.durable = self.durable.max(f.min(self.mem.last()));
                    }
                }
                Op::Reload => {
                    self.flush();
                    self.restart();
                }
                Op::Crash => {
                    self.pending.clear();
                    self.mem = self.disk.clone();
                    self.restart();
                }
            }
        }

        fn flush(&mut self) {
            self.db.write_ops(&self.pending, false).expect("write");
            self.pending.clear();
            self.disk = self.mem.clone();
            self.flushed = Some(self.mem.last());
            self.check_disk();
        }

        fn restart(&mut self) {
            self.s = load(&self.db, G, self.limits);
            self.flushed = None;
            self.durable = self.mem.last();
        }

        /// The storage answers exactly as the model says.
        fn check(&self) {
            assert_log(&self.s, self.mem.truncated, &self.mem.entries);
            assert_eq!(self.s.initial_state().unwrap().hard_state, self.mem.hard_state);
            let (first, last) = (self.mem.truncated.0 + 1, self.mem.last());
            // Suffix reads from a spread of starting points (crossing the disk/cache border).
            let stride = ((last + 1 - first) / 8).max(1) as usize;
            for low in (first..=last).step_by(stride).chain((first..=last).last()) {
                assert_eq!(get(&self.s, low, last + 1), self.mem.entries[(low - first) as usize..].to_vec());
                assert_eq!(self.s.entries(low, last + 1, 0, ctx()).unwrap().len(), 1, "max_size 0 from {low}");
            }
        }

        /// Right after a flush, disk holds exactly the model's entries: nothing stale past
        /// the last index or below the truncation point.
        fn check_disk(&self) {
            let expected: Vec<u64> = self.mem.entries.iter().map(|e| e.index).collect();
            assert_eq!(disk_log_indexes(&self.db, G), expected, "entries on disk after a flush");
        }

        fn check_neighbours(&self) {
            for n in NEIGHBOURS {
                assert_log(&load(&self.db, n, self.limits), (INIT_INDEX, INIT_INDEX), &run(6, 9, 6, &format!("n{n}")));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 128,
            // This suite is one file: report the minimal case, do not write a regressions file.
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn storage_matches_the_in_memory_model(
            initialized in any::<bool>(),
            cache_bytes_max in prop_oneof![Just(0usize), 0usize..400, Just(4 << 20)],
            ops in proptest::collection::vec(op(), 1..50),
        ) {
            let mut h = Harness::new(initialized, cache_bytes_max);
            h.check();
            for op in &ops {
                h.apply(op);
                h.check();
            }
            h.apply(&Op::Reload);
            h.check();
            h.check_neighbours();
        }
    }
}
