//! Store-writer batch building: the group commit's one RocksDB `WriteBatch` made from every
//! pending worker task (`store_writer::build_batch`), the step before the node's one fsync.
//!
//! Each task is one worker round: for each of its groups, the new raft log entries and hard
//! state that `PeerStorage::append` and `set_hard_state` produce (namespace commands of
//! 256-byte values). Two sizes: a light round (4 tasks) and a full group commit
//! (256 tasks, the most one fsync takes).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use raft::eraftpb::{Entry, HardState};
use warden_engine::storage::{Db, PeerStorage, StorageLimits, INIT_INDEX};
use warden_engine::store_writer::{build_batch, Persisted, WriteTask};

/// Groups each task carries.
const GROUPS_PER_TASK: u64 = 8;
/// Entries each group appends per round.
const ENTRIES_PER_GROUP: u64 = 2;
/// Bytes of each entry's command (a namespace command with a 256-byte value).
const COMMAND_BYTES: usize = 320;
/// The voters of every group (5 replicas).
const VOTERS: [u64; 5] = [1, 2, 3, 4, 5];

/// `tasks` worker rounds over distinct groups, built by the groups' real storages.
fn tasks(db: &Arc<Db>, tasks: u64, done: &crossbeam_channel::Sender<Persisted>) -> Vec<WriteTask> {
    (0..tasks)
        .map(|task| {
            let mut ops = Vec::new();
            let mut readies = Vec::new();
            for group in (task * GROUPS_PER_TASK + 1)..=((task + 1) * GROUPS_PER_TASK) {
                db.write_ops(&PeerStorage::bootstrap_ops(group, &VOTERS), false).expect("bootstrap a group");
                let mut storage = PeerStorage::load(db.clone(), group, StorageLimits::default()).expect("load a group");
                let entries: Vec<Entry> = (1..=ENTRIES_PER_GROUP)
                    .map(|n| Entry { term: 7, index: INIT_INDEX + n, data: vec![n as u8; COMMAND_BYTES].into(), ..Entry::default() })
                    .collect();
                storage.append(&entries, &mut ops);
                storage.set_hard_state(&HardState { term: 7, vote: 1, commit: INIT_INDEX + ENTRIES_PER_GROUP, ..HardState::default() }, &mut ops);
                readies.push((group, 1));
            }
            WriteTask { ops, entries: GROUPS_PER_TASK * ENTRIES_PER_GROUP, readies, done: done.clone() }
        })
        .collect()
}

fn batch_building(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = Db::open(dir.path()).expect("open RocksDB");
    let (done, _answers) = crossbeam_channel::bounded(1);
    let mut group = c.benchmark_group("store_writer/build_batch");
    for count in [4, 256] {
        let tasks = tasks(&db, count, &done);
        let entries = count * GROUPS_PER_TASK * ENTRIES_PER_GROUP;
        assert_eq!(build_batch(&db, &tasks).expect("build").entries, entries);
        group.throughput(Throughput::Elements(entries));
        group.bench_with_input(BenchmarkId::new("tasks", count), &tasks, |b, tasks| b.iter(|| build_batch(&db, tasks)));
    }
    group.finish();
}

criterion_group!(benches, batch_building);
criterion_main!(benches);
