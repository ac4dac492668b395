//! Snapshots of one group: built from a consistent RocksDB snapshot of the group's
//! state-machine range plus its apply position and configuration, restored as write ops.
//!
//! The engine snapshots the `sm` range generically, so a state machine needs no snapshot code
//! of its own beyond reloading its in-memory index after a restore.
//!
//! The group's configuration fence (`host/conf_fence.rs`) is replicated state as well, kept
//! beside the configuration in `raft_state`, so a snapshot carries it: a replica installing
//! one must refuse the same changes as the others. Two formats, versioned by their magic:
//! `WSN1` (pairs only, fence 0: what earlier releases write and read) and `WSN2` (the fence,
//! then the pairs). A group never fenced is written as `WSN1`, so replicas of an earlier
//! release keep installing its snapshots during a rolling upgrade; a fenced group's is
//! `WSN2`, which an earlier release refuses (a typed error, raft sends it again later) rather
//! than install without the fence.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use raft::eraftpb::{ConfState, Snapshot};

use super::db::{Cf, Db, SnapshotBuildPermit, WriteOp};
use super::keys::{self, StateKey};
use crate::error::StorageError;

/// Pairs only (the fence is 0).
const MAGIC_V1: &[u8; 4] = b"WSN1";
/// The configuration fence (u64), then the pairs.
const MAGIC_V2: &[u8; 4] = b"WSN2";

/// The state carried in a raft snapshot: every `(user key, value)` of the group, and its
/// configuration fence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotData {
    /// Key/value pairs in key order, keys without the group prefix.
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The group's configuration fence as of the snapshot's index (`host/conf_fence.rs`).
    pub conf_fence: u64,
}

impl SnapshotData {
    /// Encodes as `WSN1 | count u64 | (key_len u32 | key | value_len u32 | value)*` when the
    /// fence is 0, else as `WSN2 | fence u64 | count u64 | …` (see the module's comment).
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self.pairs.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        let mut out = Vec::with_capacity(20 + size);
        if self.conf_fence == 0 {
            out.extend_from_slice(MAGIC_V1);
        } else {
            out.extend_from_slice(MAGIC_V2);
            out.extend_from_slice(&self.conf_fence.to_be_bytes());
        }
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
        let conf_fence = Self::walk(bytes, |key, value| pairs.push((key.to_vec(), value.to_vec())))?;
        Ok(SnapshotData { pairs, conf_fence })
    }

    /// Checks that bytes from the network decode, without copying them (a snapshot can be
    /// hundreds of MiB): what [`Self::decode`] accepts, this accepts.
    pub fn validate(bytes: &[u8]) -> Result<(), StorageError> {
        Self::walk(bytes, |_, _| {}).map(drop)
    }

    /// Hands every `(key, value)` of encoded data to `each`, in order; answers the fence.
    fn walk<'a>(bytes: &'a [u8], mut each: impl FnMut(&'a [u8], &'a [u8])) -> Result<u64, StorageError> {
        let corrupt = |what: &str| StorageError::Corrupt(format!("snapshot data: {what}"));
        let mut reader = Reader { bytes };
        let conf_fence = match reader.take(4).ok_or_else(|| corrupt("short header"))? {
            magic if magic == MAGIC_V1 => 0,
            magic if magic == MAGIC_V2 => reader.u64().ok_or_else(|| corrupt("short header"))?,
            _ => return Err(corrupt("bad magic")),
        };
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
        Ok(conf_fence)
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
    // Written in the apply batch of the configuration it came with, so the view holds the
    // fence of the same applied index.
    let conf_fence = match view.get_cf(db.cf(Cf::RaftState)?, keys::state_key(group, StateKey::ConfFence))? {
        None => 0,
        Some(value) => <[u8; 8]>::try_from(value.as_slice()).map(u64::from_be_bytes).map_err(|_| corrupt("conf fence".into()))?,
    };
    let mut data = SnapshotData { conf_fence, ..SnapshotData::default() };
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
        let spawned = std::thread::Builder::new().name(format!("snapshot-{group}")).spawn(move || builder.run(permit, group, bytes_max));
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

    fn run(&self, permit: SnapshotBuildPermit, group: u64, bytes_max: usize) {
        let started = Instant::now();
        let built = build(permit.db(), group, bytes_max);
        // The permit goes back before the build is seen to end, so whoever sees it end (raft
        // asking again, another group) can start the next build at once instead of finding
        // every permit still taken.
        drop(permit);
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
        let data = SnapshotData { pairs: vec![(b"a".to_vec(), b"1".to_vec()), (vec![], vec![0; 300])], conf_fence: 0 };
        assert_eq!(SnapshotData::decode(&data.encode()).ok(), Some(data.clone()));
        let fenced = SnapshotData { conf_fence: 9, ..data };
        assert_eq!(&fenced.encode()[..4], b"WSN2");
        assert_eq!(SnapshotData::decode(&fenced.encode()).ok(), Some(fenced));
    }

    /// Replicas of mixed releases exchange snapshots during a rolling upgrade: an unfenced
    /// group's snapshot is byte for byte what an earlier release wrote, and that still reads.
    #[test]
    fn an_unfenced_snapshot_is_the_first_format() {
        let earlier_release: &[u8] = b"WSN1\0\0\0\0\0\0\0\x01\0\0\0\x01k\0\0\0\x01v";
        let data = SnapshotData { pairs: vec![(b"k".to_vec(), b"v".to_vec())], conf_fence: 0 };
        assert_eq!(data.encode(), earlier_release);
        assert_eq!(SnapshotData::decode(earlier_release).ok(), Some(data));
    }

    #[test]
    fn rejects_lies_about_sizes() {
        let mut bytes = SnapshotData { pairs: vec![(b"k".to_vec(), b"v".to_vec())], conf_fence: 0 }.encode();
        bytes[4..12].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(SnapshotData::decode(&bytes).is_err());
        let mut fenced = SnapshotData { pairs: vec![(b"k".to_vec(), b"v".to_vec())], conf_fence: 3 }.encode();
        fenced[12..20].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(SnapshotData::decode(&fenced).is_err());
        assert!(SnapshotData::decode(b"WSN1").is_err());
        assert!(SnapshotData::decode(b"WSN2\0\0\0").is_err());
        assert!(SnapshotData::decode(b"XXXX\0\0\0\0\0\0\0\0").is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = SnapshotData::decode(&bytes);
            for magic in [b"WSN1", b"WSN2"] {
                let mut framed = magic.to_vec();
                framed.extend_from_slice(&bytes);
                let _ = SnapshotData::decode(&framed);
                prop_assert_eq!(SnapshotData::validate(&framed).is_ok(), SnapshotData::decode(&framed).is_ok());
            }
            prop_assert_eq!(SnapshotData::validate(&bytes).is_ok(), SnapshotData::decode(&bytes).is_ok());
        }
    }
}
