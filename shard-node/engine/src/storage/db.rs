//! The node's one RocksDB, shared by every group it hosts, and the write operations the
//! host loop hands to the store writer.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, Options, WriteBatch, DB};

use crate::error::StorageError;

/// Column family of raft log entries: `group | index` → encoded `eraftpb.Entry`.
pub const CF_RAFT_LOG: &str = "raft_log";
/// Column family of per-group raft records (hard state, apply state, conf state, truncation).
pub const CF_RAFT_STATE: &str = "raft_state";
/// Column family of state-machine data: `group | user key` → value.
pub const CF_SM: &str = "sm";

/// Size of one memtable of each column family.
const MEMTABLE_BYTES: usize = 8 << 20;

/// Which column family a [`WriteOp`] targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cf {
    /// [`CF_RAFT_LOG`].
    RaftLog,
    /// [`CF_RAFT_STATE`].
    RaftState,
    /// [`CF_SM`].
    Sm,
}

impl Cf {
    /// Every column family.
    pub const ALL: [Cf; 3] = [Cf::RaftLog, Cf::RaftState, Cf::Sm];

    fn name(self) -> &'static str {
        match self {
            Cf::RaftLog => CF_RAFT_LOG,
            Cf::RaftState => CF_RAFT_STATE,
            Cf::Sm => CF_SM,
        }
    }
}

/// One write, recorded by the host loop and executed by the store writer inside the single
/// `WriteBatch` it builds for everything pending on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOp {
    /// Set `key` to `value`.
    Put { cf: Cf, key: Vec<u8>, value: Vec<u8> },
    /// Remove `key`.
    Delete { cf: Cf, key: Vec<u8> },
    /// Remove every key in `[from, to)`.
    DeleteRange { cf: Cf, from: Vec<u8>, to: Vec<u8> },
}

impl WriteOp {
    /// Bytes of keys and values this op writes (for the bytes-per-fsync metric).
    pub fn size_bytes(&self) -> usize {
        match self {
            WriteOp::Put { key, value, .. } => key.len() + value.len(),
            WriteOp::Delete { key, .. } => key.len(),
            WriteOp::DeleteRange { from, to, .. } => from.len() + to.len(),
        }
    }
}

/// The node's RocksDB with its column families.
pub struct Db {
    inner: DB,
    /// Snapshots being built from this store right now (see [`Db::snapshot_build_permit`]).
    snapshot_builds: AtomicUsize,
    /// State-machine reads made to fail on this store (tests only: feature `test-hooks`).
    #[cfg(any(test, feature = "test-hooks"))]
    pub read_faults: ReadFaults,
    /// State-machine records read by scans of this store (tests only: feature `test-hooks`;
    /// what an applied entry reads is measured by it).
    #[cfg(any(test, feature = "test-hooks"))]
    pub records_scanned: std::sync::atomic::AtomicU64,
}

/// State-machine reads that fail on one store, standing for a damaged block or a failing
/// disk on one node (tests only, feature `test-hooks`: a production build has no such check
/// on its reads).
#[cfg(any(test, feature = "test-hooks"))]
#[derive(Default)]
pub struct ReadFaults {
    keys: std::sync::Mutex<std::collections::HashSet<(u64, Vec<u8>)>>,
}

#[cfg(any(test, feature = "test-hooks"))]
impl ReadFaults {
    /// Reads of `key` of `group`'s state machine fail from now on.
    pub fn fail(&self, group: u64, key: &[u8]) {
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert((group, key.to_vec()));
    }

    /// The failure a read of `key` of `group` meets, if it is made to fail.
    pub(crate) fn check(&self, group: u64, key: &[u8]) -> Result<(), StorageError> {
        if self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&(group, key.to_vec())) {
            return Err(StorageError::Corrupt(format!("injected read fault: block checksum mismatch at key {key:?} of group {group}")));
        }
        Ok(())
    }
}

/// Leave to build one snapshot from the store; the build counts as running until it drops.
pub struct SnapshotBuildPermit {
    db: Arc<Db>,
}

impl SnapshotBuildPermit {
    /// The store the snapshot is read from.
    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }
}

impl Drop for SnapshotBuildPermit {
    fn drop(&mut self) {
        self.db.snapshot_builds.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Db {
    /// The sum over column families of a RocksDB integer property (`rocksdb.total-sst-files-size`,
    /// `rocksdb.estimate-pending-compaction-bytes` …); 0 where RocksDB has none.
    pub fn property_sum(&self, property: &str) -> u64 {
        Cf::ALL
            .iter()
            .filter_map(|cf| self.inner.cf_handle(cf.name()))
            .filter_map(|cf| self.inner.property_int_value_cf(&cf, property).ok().flatten())
            .sum()
    }

    /// Opens (creating if missing) the database at `path`.
    pub fn open(path: &Path) -> Result<Arc<Db>, StorageError> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        // Two cores: one flush and one compaction thread at most.
        options.set_max_background_jobs(2);
        let families = [CF_RAFT_LOG, CF_RAFT_STATE, CF_SM].map(|name| {
            let mut cf_options = Options::default();
            cf_options.set_compression_type(rocksdb::DBCompressionType::Lz4);
            // Small memtables: every insert walks the skiplist, and a skiplist that stays
            // within the CPU caches costs a fraction of a large one (profiled: with the 64 MiB
            // default, skiplist search was the largest single cost of the write path).
            cf_options.set_write_buffer_size(MEMTABLE_BYTES);
            if name == CF_SM {
                // Many of apply's point lookups are of keys that do not exist (a create checks
                // its path is free): a whole-key bloom filter (10 bits a key, about 1% false
                // positives) lets RocksDB skip each SST that lacks the key instead of searching
                // its index (profiled with `namespace/apply_batch/create_under_quota`). Range
                // scans do not use it.
                let mut table = rocksdb::BlockBasedOptions::default();
                table.set_bloom_filter(10.0, false);
                cf_options.set_block_based_table_factory(&table);
            }
            ColumnFamilyDescriptor::new(name, cf_options)
        });
        let inner = DB::open_cf_descriptors(&options, path, families)?;
        Ok(Arc::new(Db {
            inner,
            snapshot_builds: AtomicUsize::new(0),
            #[cfg(any(test, feature = "test-hooks"))]
            read_faults: ReadFaults::default(),
            #[cfg(any(test, feature = "test-hooks"))]
            records_scanned: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Leave to build a snapshot, if fewer than `builds_max` are being built from this store:
    /// each holds a whole group's data in memory, so the node bounds how many exist at once.
    pub fn snapshot_build_permit(self: &Arc<Self>, builds_max: usize) -> Option<SnapshotBuildPermit> {
        self.snapshot_builds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| (running < builds_max).then_some(running + 1))
            .ok()
            .map(|_| SnapshotBuildPermit { db: self.clone() })
    }

    /// Snapshots being built from this store right now.
    pub fn snapshot_builds(&self) -> usize {
        self.snapshot_builds.load(Ordering::Acquire)
    }

    /// The raw RocksDB handle.
    pub fn raw(&self) -> &DB {
        &self.inner
    }

    /// Handle of column family `cf`.
    pub fn cf(&self, cf: Cf) -> Result<&ColumnFamily, StorageError> {
        self.inner.cf_handle(cf.name()).ok_or(StorageError::MissingColumnFamily(cf.name()))
    }

    /// Reads `key` from `cf`.
    pub fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.inner.get_cf(self.cf(cf)?, key)?)
    }

    /// Adds `ops` to `batch`.
    pub fn add_to_batch(&self, batch: &mut WriteBatch, ops: &[WriteOp]) -> Result<(), StorageError> {
        for op in ops {
            match op {
                WriteOp::Put { cf, key, value } => batch.put_cf(self.cf(*cf)?, key, value),
                WriteOp::Delete { cf, key } => batch.delete_cf(self.cf(*cf)?, key),
                WriteOp::DeleteRange { cf, from, to } => batch.delete_range_cf(self.cf(*cf)?, from, to),
            }
        }
        Ok(())
    }

    /// Writes `batch`; `sync` makes it (and everything written before it) durable first.
    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), StorageError> {
        let mut write_options = rocksdb::WriteOptions::default();
        write_options.set_sync(sync);
        Ok(self.inner.write_opt(batch, &write_options)?)
    }

    /// Makes every write so far durable (RocksDB `SyncWAL`): fsyncs the WAL without holding
    /// RocksDB's write queue, so unsynced writes from other threads go on while it runs.
    pub fn sync_wal(&self) -> Result<(), StorageError> {
        Ok(self.inner.flush_wal(true)?)
    }

    /// Writes `ops` as one batch.
    pub fn write_ops(&self, ops: &[WriteOp], sync: bool) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        self.add_to_batch(&mut batch, ops)?;
        self.write(batch, sync)
    }
}
