//! The interface between the engine and what a group replicates.
//!
//! Architecture invariant: `apply` is deterministic. It sees only the command bytes and the
//! entry index, never a clock, randomness or I/O; all its durable effects go into the
//! [`SmWrites`] it is handed, which the engine writes atomically with the applied index
//! (DESIGN.md rule 4).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{EngineError, StorageError};
use crate::storage::{keys, Cf, Db, WriteOp};

/// The result an applied command returns to its proposer (encoded by the state machine).
/// An `Err` here is the command's own outcome (malformed, refused): every replica computes
/// the same one from the same log, so the entry counts as applied.
pub type ApplyOutput = Result<Vec<u8>, EngineError>;

/// What [`StateMachine::apply`] returns: the command's output, or `Err` when this replica
/// could not apply it at all (its store failed a read). That is no outcome of the command,
/// other replicas need not share it, and skipping the entry would leave this replica's
/// state diverged from theirs: the engine stops applying the group on this replica before
/// the entry (see `host/failed.rs`).
pub type Applied = Result<ApplyOutput, StorageError>;

/// The leader's view of time, passed to every leader-only call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaderClock {
    /// Wall-clock milliseconds since the Unix epoch (stamped into entries; TTL nodes).
    pub wall_ms: u64,
    /// Monotonic milliseconds since the process started (session leases: never jumps).
    pub monotonic_ms: u64,
}

impl LeaderClock {
    /// The clock now.
    pub fn now() -> LeaderClock {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let start = START.get_or_init(std::time::Instant::now);
        LeaderClock { wall_ms: crate::wall_clock::now_ms(), monotonic_ms: start.elapsed().as_millis() as u64 }
    }
}

/// A replicated state machine of one group.
pub trait StateMachine: Send {
    /// Applies the committed command of entry `index`. Several commands may share one entry
    /// (the engine batches proposals): they are applied in order, each with the entry's
    /// index, so nothing unique may be derived from `index` alone. A storage failure is
    /// returned as the outer `Err` ([`Applied`]), never turned into the command's output;
    /// the state machine is not used again after one (its memory may be half-changed).
    fn apply(&mut self, index: u64, command: &[u8], writes: &mut SmWrites) -> Applied;

    /// Answers a read-only query from the applied state.
    fn query(&self, query: &[u8]) -> Result<Vec<u8>, EngineError>;

    /// Every command of a batch of committed entries is applied: state the machine kept in
    /// memory during the batch goes into its writes now (once per batch, not per command).
    /// Called before the batch is written, on the applying thread.
    fn finish_batch(&mut self, _writes: &mut SmWrites) {}

    /// The writes of the entries applied since the last call have reached the store: make
    /// their effects visible to observers (watch events). Called on the applying thread.
    fn publish(&mut self) {}

    /// Rebuilds in-memory state from the group's data on disk, applied up to `applied_index`
    /// (at start and after a snapshot is installed).
    fn reload(&mut self, reader: &SmReader, applied_index: u64) -> Result<(), StorageError>;

    /// Checks a command before it is proposed, so malformed input never reaches the log.
    fn validate(&self, command: &[u8]) -> Result<(), EngineError>;

    /// Commands the leader should propose because of time (expiries), judged against the
    /// leader's clock (DESIGN.md rule 6: only the leader judges time). Called on the leader
    /// only, once per tick.
    fn leader_proposals(&mut self, _clock: LeaderClock) -> Vec<Vec<u8>> {
        Vec::new()
    }

    /// True while the leader must keep its clock running for this state machine: while
    /// [`Self::leader_proposals`] may ever propose something because of time (leases, TTLs,
    /// delays). A group whose state machine needs ticks never hibernates (see
    /// `host/hibernate.rs`). The default is the conservative answer; a state machine that
    /// never looks at the clock says `false`.
    fn needs_ticks(&self) -> bool {
        true
    }

    /// This replica became leader (`true`) or stopped leading. Leader-only state (lease
    /// deadlines) starts over here; it is never replicated.
    fn on_leadership(&mut self, _leading: bool, _clock: LeaderClock) {}

    /// The leader's clock as it is about to apply committed entries (called on the leader
    /// only). Leader-only time that starts at an apply (a new session's lease) counts from
    /// here, never from an older reading: a leader whose group hibernated has not ticked
    /// (`host/hibernate.rs`), so the clock last handed to [`Self::leader_proposals`] may be
    /// older than a whole TTL, and a lease counted from it would be due at once.
    fn leader_clock(&mut self, _clock: LeaderClock) {}

    /// A request only the leader answers from its own memory (session keepalives). Called
    /// only on a leader that has applied every entry committed before its term, after a
    /// ReadIndex round confirmed that no other leader was elected before `clock`, the moment
    /// the request arrived: a lease renewed from `clock` on is one no later leader can end
    /// sooner, since a new leader grants every session a full TTL from its election.
    fn leader_call(&mut self, _request: &[u8], _clock: LeaderClock) -> Result<Vec<u8>, EngineError> {
        Err(EngineError::Invalid("this state machine answers no leader calls".into()))
    }
}

/// Creates the state machine of each group a node hosts.
pub trait StateMachineFactory: Send + Sync {
    /// A fresh, empty state machine for `group`'s replica on node `node_id`.
    fn create(&self, node_id: u64, group: u64) -> Box<dyn StateMachine>;
}

/// Writes of one group's state machine, confined to the group's range of the `sm` family.
/// Also an overlay for reads: entries applied in the same batch see each other's writes
/// before the batch reaches RocksDB.
pub struct SmWrites {
    group: u64,
    ops: Vec<WriteOp>,
    pending: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    notifications: Vec<Vec<u8>>,
}

impl SmWrites {
    /// Empty writes for `group`.
    pub fn new(group: u64) -> SmWrites {
        SmWrites { group, ops: Vec::new(), pending: BTreeMap::new(), notifications: Vec::new() }
    }

    /// Sets `key` to `value`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.ops.push(WriteOp::Put { cf: Cf::Sm, key: keys::sm_key(self.group, key), value: value.to_vec() });
        self.pending.insert(key.to_vec(), Some(value.to_vec()));
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: &[u8]) {
        self.ops.push(WriteOp::Delete { cf: Cf::Sm, key: keys::sm_key(self.group, key) });
        self.pending.insert(key.to_vec(), None);
    }

    /// The value `key` will have once these writes land: `Some(None)` if deleted, `None` if
    /// these writes do not touch it.
    pub fn pending(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.pending.get(key).map(|value| value.as_deref())
    }

    /// Pending writes to keys in `[from, to)`, in key order.
    pub fn pending_range<'a>(&'a self, from: &[u8], to: &[u8]) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        self.pending
            .range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Excluded(to)))
            .map(|(key, value)| (key.as_slice(), value.as_deref()))
    }

    /// Wakes whoever awaits `key` on this replica once these writes are applied (see
    /// `NodeHandle::await_key`). Keys mean what the state machine says they mean.
    pub fn notify(&mut self, key: Vec<u8>) {
        self.notifications.push(key);
    }

    /// The recorded ops.
    pub fn into_ops(self) -> Vec<WriteOp> {
        self.ops
    }

    /// The recorded ops and notifications.
    pub fn into_parts(self) -> (Vec<WriteOp>, Vec<Vec<u8>>) {
        (self.ops, self.notifications)
    }

    /// Mutable access for the engine to append its own records to the same batch.
    pub fn ops_mut(&mut self) -> &mut Vec<WriteOp> {
        &mut self.ops
    }
}

/// Reads of one group's range of the `sm` family, live ([`SmReader`]) or from one point in
/// time ([`SmImage`]).
pub trait SmRead {
    /// `(key, value)` pairs with `from <= key < to` (no upper bound when `to` is `None`) in
    /// key order, until `visit` returns false.
    fn scan_range(&self, from: &[u8], to: Option<&[u8]>, visit: impl FnMut(&[u8], &[u8]) -> bool) -> Result<(), StorageError>;

    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
}

/// Read access to one group's range of the `sm` family.
#[derive(Clone)]
pub struct SmReader {
    db: Arc<Db>,
    group: u64,
}

impl SmReader {
    /// A reader of `group`'s data.
    pub fn new(db: Arc<Db>, group: u64) -> SmReader {
        SmReader { db, group }
    }

    /// Every `(key, value)` of the group in key order.
    pub fn scan(&self, mut visit: impl FnMut(&[u8], &[u8])) -> Result<(), StorageError> {
        self.scan_range(&[], None, |key, value| {
            visit(key, value);
            true
        })
    }

    /// Hands `read` an image of the group's data as it is now (one RocksDB snapshot): what is
    /// applied meanwhile is not in it. For reads of a whole group (backups) off the workers.
    pub fn with_image<R>(&self, read: impl FnOnce(&SmImage<'_>) -> R) -> R {
        let snapshot = self.db.raw().snapshot();
        read(&SmImage { reader: self, snapshot })
    }

    fn scan_at(
        &self,
        snapshot: Option<&rocksdb::Snapshot<'_>>,
        from: &[u8],
        to: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), StorageError> {
        let mut read_options = rocksdb::ReadOptions::default();
        read_options.set_iterate_upper_bound(match to {
            Some(to) => keys::sm_key(self.group, to),
            None => keys::group_end(self.group),
        });
        if let Some(snapshot) = snapshot {
            read_options.set_snapshot(snapshot);
        }
        let start = keys::sm_key(self.group, from);
        let iter = self.db.raw().iterator_cf_opt(self.db.cf(Cf::Sm)?, read_options, rocksdb::IteratorMode::From(&start, rocksdb::Direction::Forward));
        for item in iter {
            let (key, value) = item?;
            #[cfg(any(test, feature = "test-hooks"))]
            self.db.records_scanned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if !visit(&key[keys::GROUP_PREFIX_LEN..], &value) {
                break;
            }
        }
        Ok(())
    }
}

impl SmReader {
    /// `(key, value)` pairs with `from <= key < to` (no upper bound when `to` is `None`) in
    /// key order, until `visit` returns false.
    pub fn scan_range(&self, from: &[u8], to: Option<&[u8]>, visit: impl FnMut(&[u8], &[u8]) -> bool) -> Result<(), StorageError> {
        self.scan_at(None, from, to, visit)
    }

    /// The value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        #[cfg(any(test, feature = "test-hooks"))]
        self.db.read_faults.check(self.group, key)?;
        self.db.get(Cf::Sm, &keys::sm_key(self.group, key))
    }
}

impl SmRead for SmReader {
    fn scan_range(&self, from: &[u8], to: Option<&[u8]>, visit: impl FnMut(&[u8], &[u8]) -> bool) -> Result<(), StorageError> {
        SmReader::scan_range(self, from, to, visit)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        SmReader::get(self, key)
    }
}

/// One group's data at one point in time (see [`SmReader::with_image`]).
pub struct SmImage<'a> {
    reader: &'a SmReader,
    snapshot: rocksdb::Snapshot<'a>,
}

impl SmImage<'_> {
    /// The raft log index the image's data was applied up to (0: the group is not
    /// initialized here).
    pub fn applied_index(&self) -> Result<u64, StorageError> {
        let db = &self.reader.db;
        let apply = self.snapshot.get_cf(db.cf(Cf::RaftState)?, keys::state_key(self.reader.group, keys::StateKey::Apply))?;
        match apply {
            None => Ok(0),
            Some(bytes) => keys::decode_index_term(&bytes).map(|(index, _)| index).ok_or_else(|| StorageError::Corrupt("apply state".into())),
        }
    }
}

impl SmRead for SmImage<'_> {
    fn scan_range(&self, from: &[u8], to: Option<&[u8]>, visit: impl FnMut(&[u8], &[u8]) -> bool) -> Result<(), StorageError> {
        self.reader.scan_at(Some(&self.snapshot), from, to, visit)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.snapshot.get_cf(self.reader.db.cf(Cf::Sm)?, keys::sm_key(self.reader.group, key))?)
    }
}
