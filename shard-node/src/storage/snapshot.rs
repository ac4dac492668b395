//! Snapshots of one group: built from a consistent RocksDB snapshot of the group's
//! state-machine range plus its apply position and configuration, restored as write ops.
//!
//! The engine snapshots the `sm` range generically, so a state machine needs no snapshot code
//! of its own beyond reloading its in-memory index after a restore.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use raft::eraftpb::{ConfState, Snapshot};

use super::db::{Cf, Db, SnapshotBuildPermit, WriteOp};
use super::keys::{self, StateKey};
use crate::error::StorageError;

const MAGIC: &[u8; 4] = b"WSN1";

/// The state-machine data carried in a raft snapshot: every `(user key, value)` of the group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotData {
    /// Key/value pairs in key order, keys without the group prefix.
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl SnapshotData {
    /// Encodes as `MAGIC | count u64 | (key_len u32 | key | value_len u32 | value)*`.
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self.pairs.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        let mut out = Vec::with_capacity(12 + size);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.pairs.len() as u64).to_be_bytes());
        for (key, value) in &self.pairs {
            out.extend_from_slice(&(key.len() as u32).to_be_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
        }
        out
    }

    /// Decodes bytes that came from the network; any malformation is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<SnapshotData, StorageError> {
        let mut pairs = Vec::new();
        Self::walk(bytes, |key, value| pairs.push((key.to_vec(), value.to_vec())))?;
        Ok(SnapshotData { pairs })
    }

    /// Checks that bytes from the network decode, without copying them (a snapshot can be
    /// hundreds of MiB): what [`Self::decode`] accepts, this accepts.
    pub fn validate(bytes: &[u8]) -> Result<(), StorageError> {
        Self::walk(bytes, |_, _| {})
    }

    /// Hands every `(key, value)` of encoded data to `each`, in order.
    fn walk<'a>(bytes: &'a [u8], mut each: impl FnMut(&'a [u8], &'a [u8])) -> Result<(), StorageError> {
        let corrupt = |what: &str| StorageError::Corrupt(format!("snapshot data: {what}"));
        let mut reader = Reader { bytes };
        if reader.take(4).ok_or_else(|| corrupt("short header"))? != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let count = reader.u64().ok_or_else(|| corrupt("short header"))?;
        // Each pair takes at least 8 bytes, so a count beyond that is a lie: refuse it before
        // reading on.
        if count > (reader.bytes.len() / 8) as u64 {
            return Err(corrupt("pair count exceeds data"));
        }
        for _ in 0..count {
            let key_len = reader.u32().ok_or_else(|| corrupt("truncated key length"))?;
            let key = reader.take(key_len as usize).ok_or_else(|| corrupt("truncated key"))?;
            let value_len = reader.u32().ok_or_else(|| corrupt("truncated value length"))?;
            let value = reader.take(value_len as usize).ok_or_else(|| corrupt("truncated value"))?;
            each(key, value);
        }
        if !reader.bytes.is_empty() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(())
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Builds a snapshot of `group` at its applied index from one consistent RocksDB snapshot.
/// `None` when the group is not initialized or its data exceeds `bytes_max`.
pub fn build(db: &Db, group: u64, bytes_max: usize) -> Result<Option<Snapshot>, StorageError> {
    let raw = db.raw();
    let view = raw.snapshot();
    let corrupt = |what: String| StorageError::Corrupt(format!("group {group} snapshot: {what}"));
    let apply = view.get_cf(db.cf(Cf::RaftState)?, keys::state_key(group, StateKey::Apply))?;
    let Some(apply) = apply else { return Ok(None) };
    let (index, term) = keys::decode_index_term(&apply).ok_or_else(|| corrupt("apply state".into()))?;
    let conf_bytes =
        view.get_cf(db.cf(Cf::RaftState)?, keys::state_key(group, StateKey::ConfState))?.ok_or_else(|| corrupt("no conf state".into()))?;
    let conf_state = <ConfState as protobuf::Message>::parse_from_bytes(&conf_bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut data = SnapshotData::default();
    let mut size = 0usize;
    let mut read_options = rocksdb::ReadOptions::default();
    read_options.set_snapshot(&view);
    read_options.set_iterate_upper_bound(keys::group_end(group));
    let prefix = keys::group_prefix(group);
    let iter = raw.iterator_cf_opt(db.cf(Cf::Sm)?, read_options, rocksdb::IteratorMode::From(&prefix, rocksdb::Direction::Forward));
    for item in iter {
        let (key, value) = item?;
        size += key.len() + value.len() + 8;
        if size > bytes_max {
            tracing::warn!(group, size, bytes_max, "snapshot exceeds its limit");
            return Ok(None);
        }
        data.pairs.push((key[keys::GROUP_PREFIX_LEN..].to_vec(), value.to_vec()));
    }
    let mut snap = Snapshot { data: data.encode().into(), ..Snapshot::default() };
    let meta = snap.mut_metadata();
    meta.index = index;
    meta.term = term;
    meta.set_conf_state(conf_state);
    Ok(Some(snap))
}

/// One group's snapshot, built off the host loop.
///
/// raft-rs asks for a snapshot on the worker thread (`Storage::snapshot`), and reading and
/// encoding a large group there would stall every group of that worker past its heartbeats.
/// So the first ask starts a build on a thread of its own and answers "temporarily
/// unavailable"; raft-rs asks again at the follower's next heartbeat response and gets the
/// built snapshot (TiKV's region worker does the same).
#[derive(Clone, Default)]
pub struct Builder {
    state: Arc<Mutex<BuildState>>,
}

#[derive(Default)]
enum BuildState {
    #[default]
    Idle,
    Running,
    /// Built and not yet taken. A snapshot that nobody takes stays until the next ask, which
    /// takes it or, if it has become too old, replaces it.
    Built(Snapshot),
}

impl Builder {
    fn state(&self) -> MutexGuard<'_, BuildState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A built snapshot of `group` at `index_min` or later, taken; otherwise `None`, after
    /// starting a build unless one runs or the node already builds `builds_max` snapshots.
    pub fn take_or_start(&self, db: &Arc<Db>, group: u64, index_min: u64, bytes_max: usize, builds_max: usize) -> Option<Snapshot> {
        let mut state = self.state();
        match std::mem::take(&mut *state) {
            BuildState::Built(snap) if snap.get_metadata().index >= index_min => return Some(snap),
            BuildState::Running => {
                *state = BuildState::Running;
                return None;
            }
            // Nothing built, or built before the log moved past it: build anew.
            BuildState::Idle | BuildState::Built(_) => {}
        }
        let permit = db.snapshot_build_permit(builds_max)?;
        let builder = self.clone();
        let spawned = std::thread::Builder::new().name(format!("snapshot-{group}")).spawn(move || builder.run(&permit, group, bytes_max));
        match spawned {
            // The build's own thread waits for this lock before recording its result.
            Ok(_) => *state = BuildState::Running,
            Err(error) => tracing::warn!(group, %error, "cannot start a snapshot build"),
        }
        None
    }

    /// Whether a build is running.
    pub fn building(&self) -> bool {
        matches!(*self.state(), BuildState::Running)
    }

    fn run(&self, permit: &SnapshotBuildPermit, group: u64, bytes_max: usize) {
        let started = Instant::now();
        let built = build(permit.db(), group, bytes_max);
        let mut state = self.state();
        *state = match built {
            Ok(Some(snap)) => {
                let meta = snap.get_metadata();
                tracing::info!(group, index = meta.index, bytes = snap.data.len(), elapsed = ?started.elapsed(), "snapshot built");
                BuildState::Built(snap)
            }
            Ok(None) => BuildState::Idle,
            Err(error) => {
                tracing::warn!(group, %error, "snapshot build failed");
                BuildState::Idle
            }
        };
    }
}

/// Write ops that replace the group's state-machine range by `data`.
pub fn restore_ops(group: u64, data: &SnapshotData) -> Vec<WriteOp> {
    let mut ops = Vec::with_capacity(data.pairs.len() + 1);
    ops.push(WriteOp::DeleteRange { cf: Cf::Sm, from: keys::group_prefix(group).to_vec(), to: keys::group_end(group) });
    for (key, value) in &data.pairs {
        ops.push(WriteOp::Put { cf: Cf::Sm, key: keys::sm_key(group, key), value: value.clone() });
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let data = SnapshotData { pairs: vec![(b"a".to_vec(), b"1".to_vec()), (vec![], vec![0; 300])] };
        assert_eq!(SnapshotData::decode(&data.encode()).ok(), Some(data));
    }

    #[test]
    fn rejects_lies_about_sizes() {
        let mut bytes = SnapshotData { pairs: vec![(b"k".to_vec(), b"v".to_vec())] }.encode();
        bytes[4..12].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(SnapshotData::decode(&bytes).is_err());
        assert!(SnapshotData::decode(b"WSN1").is_err());
        assert!(SnapshotData::decode(b"XXXX\0\0\0\0\0\0\0\0").is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = SnapshotData::decode(&bytes);
            let mut framed = b"WSN1".to_vec();
            framed.extend_from_slice(&bytes);
            let _ = SnapshotData::decode(&framed);
            prop_assert_eq!(SnapshotData::validate(&bytes).is_ok(), SnapshotData::decode(&bytes).is_ok());
            prop_assert_eq!(SnapshotData::validate(&framed).is_ok(), SnapshotData::decode(&framed).is_ok());
        }
    }
}
