//! The store writer: one thread per node that makes every group's raft writes durable with
//! as few fsyncs as possible (DESIGN.md rule 3, group commit).
//!
//! Host-loop workers hand it [`WriteTask`]s (each holds the writes of every group a worker
//! readied in one round). The writer takes everything pending, writes it as one RocksDB
//! `WriteBatch` followed by one WAL fsync, and then tells each worker which readies are durable, so
//! the worker can release the messages raft withheld until then.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use rocksdb::WriteBatch;

use crate::error::StorageError;
use crate::storage::{Db, WriteOp};

/// Tasks merged into one fsync at most (bounds the batch's memory).
const TASKS_PER_FSYNC_MAX: usize = 256;

/// One worker round's writes.
pub struct WriteTask {
    /// Everything to write, in order.
    pub ops: Vec<WriteOp>,
    /// Raft log entries among `ops` (for the entries-per-fsync metric).
    pub entries: u64,
    /// The readies this task makes durable: `(group, ready number)`.
    pub readies: Vec<(u64, u64)>,
    /// Where to say the task is durable.
    pub done: Sender<Persisted>,
}

/// The store writer's answer to one [`WriteTask`].
#[derive(Debug)]
pub struct Persisted {
    /// `(group, ready number)` now durable, as given in the task.
    pub readies: Vec<(u64, u64)>,
    /// `Err` when the write failed: the node can no longer promise durability and stops.
    pub result: Result<(), String>,
}

/// Counters of the store writer, readable while it runs.
#[derive(Debug)]
pub struct StoreMetrics {
    /// Synced RocksDB writes.
    pub fsyncs: AtomicU64,
    /// Raft entries made durable.
    pub entries: AtomicU64,
    /// Key and value bytes written by synced writes.
    pub bytes: AtomicU64,
    /// Worker tasks served.
    pub tasks: AtomicU64,
    /// Time of each synced write (write and WAL fsync), seconds.
    pub fsync_seconds: prometheus::Histogram,
    /// Raft entries each synced write made durable.
    pub entries_per_fsync: prometheus::Histogram,
    /// Bytes each synced write wrote.
    pub bytes_per_fsync: prometheus::Histogram,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        use warden_server_kit::metrics::{histogram_opts, BYTES_BUCKETS, COUNT_BUCKETS, LATENCY_BUCKETS};
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            // Valid names and buckets: construction cannot fail (checked by the node's metrics test).
            prometheus::Histogram::with_opts(histogram_opts(name, help, buckets)).unwrap_or_else(|e| unreachable!("{name}: {e}"))
        };
        StoreMetrics {
            fsyncs: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            tasks: AtomicU64::new(0),
            fsync_seconds: histogram(
                "warden_storage_fsync_seconds",
                "Time of each synced write of the node's store (write + WAL fsync).",
                &LATENCY_BUCKETS,
            ),
            entries_per_fsync: histogram("warden_storage_fsync_entries", "Raft entries each synced write made durable.", &COUNT_BUCKETS),
            bytes_per_fsync: histogram("warden_storage_fsync_bytes", "Bytes each synced write wrote.", &BYTES_BUCKETS),
        }
    }
}

/// A point-in-time copy of [`StoreMetrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreMetricsSnapshot {
    /// Synced RocksDB writes.
    pub fsyncs: u64,
    /// Raft entries made durable.
    pub entries: u64,
    /// Key and value bytes written by synced writes.
    pub bytes: u64,
    /// Worker tasks served.
    pub tasks: u64,
}

impl StoreMetrics {
    /// Reads every counter.
    pub fn snapshot(&self) -> StoreMetricsSnapshot {
        StoreMetricsSnapshot {
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            tasks: self.tasks.load(Ordering::Relaxed),
        }
    }
}

/// Handle to the running store writer.
pub struct StoreWriter {
    tasks: Sender<WriteTask>,
    stop: Arc<AtomicBool>,
    metrics: Arc<StoreMetrics>,
    thread: Option<JoinHandle<()>>,
}

/// Why a task was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is at its limit; the worker retries next round.
    Full,
    /// The writer has stopped.
    Stopped,
}

impl StoreWriter {
    /// Starts the writer thread with a queue of at most `queue_tasks_max` tasks. The thread
    /// holds `guard` for its whole life (a drop guard that must see it end, e.g. one that
    /// fails the node if the thread panics).
    pub fn start(db: Arc<Db>, queue_tasks_max: usize, node_id: u64, guard: impl Send + 'static) -> std::io::Result<StoreWriter> {
        let (tasks, receiver) = crossbeam_channel::bounded(queue_tasks_max);
        let stop = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(StoreMetrics::default());
        let thread = std::thread::Builder::new().name(format!("store-writer-{node_id}")).spawn({
            let (stop, metrics) = (stop.clone(), metrics.clone());
            move || {
                let _guard = guard;
                run(&db, &receiver, &stop, &metrics);
            }
        })?;
        Ok(StoreWriter { tasks, stop, metrics, thread: Some(thread) })
    }

    /// Queues a task without blocking.
    pub fn submit(&self, task: WriteTask) -> Result<(), (SubmitError, WriteTask)> {
        self.tasks.try_send(task).map_err(|error| match error {
            TrySendError::Full(task) => (SubmitError::Full, task),
            TrySendError::Disconnected(task) => (SubmitError::Stopped, task),
        })
    }

    /// A sender for workers (each keeps a clone).
    pub fn sender(&self) -> Sender<WriteTask> {
        self.tasks.clone()
    }

    /// The writer's counters.
    pub fn metrics(&self) -> Arc<StoreMetrics> {
        self.metrics.clone()
    }

    /// Stops the writer. Tasks not yet written are dropped unwritten, as a crash would.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let StoreWriter { tasks, thread, .. } = &mut self;
        drop(std::mem::replace(tasks, crossbeam_channel::bounded(0).0));
        if let Some(thread) = thread.take() {
            let _ = thread.join();
        }
    }
}

/// One group commit, ready to write.
pub struct GroupCommit {
    /// Every task's ops, in task order.
    pub batch: WriteBatch,
    /// Key and value bytes of those ops.
    pub bytes: u64,
    /// Raft log entries among them.
    pub entries: u64,
}

/// Builds the one `WriteBatch` of a group commit from `tasks` (step 2 of the writer's loop,
/// before the synced write). Public for the micro-benchmarks in the workspace's `benches/`.
pub fn build_batch(db: &Db, tasks: &[WriteTask]) -> Result<GroupCommit, StorageError> {
    let mut commit = GroupCommit { batch: WriteBatch::default(), bytes: 0, entries: 0 };
    for task in tasks {
        commit.bytes += task.ops.iter().map(|op| op.size_bytes() as u64).sum::<u64>();
        commit.entries += task.entries;
        db.add_to_batch(&mut commit.batch, &task.ops)?;
    }
    Ok(commit)
}

/// A synced write slower than this is logged: the disk is holding back every group's commits.
const SLOW_FSYNC: std::time::Duration = std::time::Duration::from_millis(100);

fn run(db: &Db, receiver: &Receiver<WriteTask>, stop: &AtomicBool, metrics: &StoreMetrics) {
    // Stops when every sender is gone (workers exited) or `stop` is set.
    while let Ok(first) = receiver.recv() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // 1. Take everything pending: this is the group commit.
        let mut batch_tasks = vec![first];
        while batch_tasks.len() < TASKS_PER_FSYNC_MAX {
            match receiver.try_recv() {
                Ok(task) => batch_tasks.push(task),
                Err(_) => break,
            }
        }
        // 2. One WriteBatch, one fsync.
        let built = build_batch(db, &batch_tasks);
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let written = built.map_err(|error| error.to_string()).and_then(|commit| {
            let started = std::time::Instant::now();
            // Write, then sync the WAL, rather than one `sync = true` write: a synced write
            // holds RocksDB's write queue for the whole fsync, and every worker's unsynced
            // write (applied state, commit-only hard state) queued behind it would wait for
            // that fsync too, stalling its host loop once per round. `SyncWAL` fsyncs outside
            // the queue. Nothing is acknowledged before it returns (the `Persisted` notices
            // go out below), so durability is unchanged; the entries are readable earlier,
            // which nobody relies on (peer storage serves them from its cache until durable).
            let result = db.write(commit.batch, false).and_then(|()| db.sync_wal()).map_err(|error| error.to_string());
            let elapsed = started.elapsed();
            metrics.fsync_seconds.observe(elapsed.as_secs_f64());
            if elapsed >= SLOW_FSYNC {
                static SLOW_FSYNCS: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new(1);
                if let Some(suppressed) = SLOW_FSYNCS.admit() {
                    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
                    let (bytes, entries) = (commit.bytes, commit.entries);
                    tracing::warn!(elapsed_ms, bytes, entries, suppressed, "slow fsync");
                }
            }
            result.map(|()| (commit.bytes, commit.entries))
        });
        match &written {
            Err(error) => tracing::error!(%error, "store write failed; the node stops"),
            Ok((bytes, entries)) => {
                metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
                metrics.entries.fetch_add(*entries, Ordering::Relaxed);
                metrics.bytes.fetch_add(*bytes, Ordering::Relaxed);
                metrics.entries_per_fsync.observe(*entries as f64);
                metrics.bytes_per_fsync.observe(*bytes as f64);
            }
        }
        metrics.tasks.fetch_add(batch_tasks.len() as u64, Ordering::Relaxed);
        let result = written.map(drop);
        // 3. Release the workers. Their answer channels have room for every task they may have
        //    in flight, so this never blocks; a closed channel means the worker is gone.
        for task in batch_tasks {
            let _ = task.done.try_send(Persisted { readies: task.readies, result: result.clone() });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::storage::Cf;

    fn put(key: &str) -> WriteOp {
        WriteOp::Put { cf: Cf::Sm, key: key.as_bytes().to_vec(), value: b"v".to_vec() }
    }

    #[test]
    fn every_task_is_answered_in_order_and_its_writes_are_on_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("db");
        let writer = StoreWriter::start(db.clone(), 64, 1, ()).expect("writer");
        let (done, answers) = crossbeam_channel::bounded(64);
        for i in 0..50u64 {
            let task = WriteTask { ops: vec![put(&format!("k{i}"))], entries: 2, readies: vec![(7, i)], done: done.clone() };
            assert!(writer.submit(task).is_ok());
        }
        let mut numbers = Vec::new();
        for _ in 0..50 {
            let persisted = answers.recv_timeout(Duration::from_secs(10)).expect("answer");
            assert_eq!(persisted.result, Ok(()));
            numbers.extend(persisted.readies.iter().map(|(_, number)| *number));
        }
        assert_eq!(numbers, (0..50).collect::<Vec<_>>(), "answers come in submission order");
        for i in 0..50 {
            assert_eq!(db.get(Cf::Sm, format!("k{i}").as_bytes()).expect("read"), Some(b"v".to_vec()));
        }
        let metrics = writer.metrics().snapshot();
        assert_eq!(metrics.tasks, 50);
        assert_eq!(metrics.entries, 100);
        assert!(metrics.fsyncs >= 1 && metrics.fsyncs <= 50, "fsyncs {}", metrics.fsyncs);
        writer.stop();
    }

    #[test]
    fn a_full_queue_refuses_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("db");
        let writer = StoreWriter::start(db, 1, 1, ()).expect("writer");
        let (done, _answers) = crossbeam_channel::bounded(1024);
        let mut refused = 0;
        for i in 0..1000u64 {
            let task = WriteTask { ops: vec![put(&format!("k{i}"))], entries: 1, readies: vec![], done: done.clone() };
            if let Err((error, _)) = writer.submit(task) {
                assert_eq!(error, SubmitError::Full);
                refused += 1;
            }
        }
        assert!(refused > 0, "a queue of one task must refuse some of 1000 immediate submissions");
        writer.stop();
    }
}
