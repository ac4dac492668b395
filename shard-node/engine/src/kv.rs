//! A small key-value state machine (put / compare-and-swap / delete / get) that lets the
//! engine be tested and benchmarked without the namespace.
//!
//! It lives in the engine, not the test kit, because production code runs it: `warden bench
//! engine` measures the bare engine on it, and the engine's own unit tests (a replica's
//! proposals and reads) need a state machine below the namespace.

use std::collections::BTreeMap;

use prost::Message as _;
use warden_proto::kv::{kv_command, KvCommand, KvQuery, KvResult, KvValue};

use crate::error::{EngineError, StorageError};
use crate::state_machine::{Applied, ApplyOutput, SmReader, SmWrites, StateMachine, StateMachineFactory};

/// Largest key accepted.
pub const KEY_BYTES_MAX: usize = 4096;
/// Largest value accepted.
pub const VALUE_BYTES_MAX: usize = 1 << 20;

/// The key-value state machine of one group. Data lives in RocksDB; an in-memory copy
/// serves reads and is rebuilt from disk on start and after a snapshot.
#[derive(Default)]
pub struct KvStateMachine {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    applied_index: u64,
}

/// Creates a [`KvStateMachine`] per group.
pub struct KvFactory;

impl StateMachineFactory for KvFactory {
    fn create(&self, _node_id: u64, _group: u64) -> Box<dyn StateMachine> {
        Box::new(KvStateMachine::default())
    }
}

impl KvStateMachine {
    fn decode(command: &[u8]) -> Result<kv_command::Op, EngineError> {
        let command = KvCommand::decode(command).map_err(|e| EngineError::Invalid(format!("kv command: {e}")))?;
        let op = command.op.ok_or_else(|| EngineError::Invalid("kv command without op".into()))?;
        let (key, value) = match &op {
            kv_command::Op::Put(put) => (&put.key, Some(&put.value)),
            kv_command::Op::Cas(cas) => (&cas.key, Some(&cas.value)),
            kv_command::Op::Delete(delete) => (&delete.key, None),
        };
        if key.len() > KEY_BYTES_MAX {
            return Err(EngineError::TooLarge { size_bytes: key.len(), limit_bytes: KEY_BYTES_MAX });
        }
        if let Some(value) = value.filter(|value| value.len() > VALUE_BYTES_MAX) {
            return Err(EngineError::TooLarge { size_bytes: value.len(), limit_bytes: VALUE_BYTES_MAX });
        }
        Ok(op)
    }

    /// Applies one command; a malformed one is refused alike on every replica.
    fn apply_op(&mut self, index: u64, command: &[u8], writes: &mut SmWrites) -> ApplyOutput {
        let op = Self::decode(command)?;
        let (succeeded, previous) = match op {
            kv_command::Op::Put(put) => {
                writes.put(&put.key, &put.value);
                (true, self.data.insert(put.key, put.value))
            }
            kv_command::Op::Cas(cas) => {
                let current = self.data.get(&cas.key);
                if current == cas.expected.as_ref() {
                    writes.put(&cas.key, &cas.value);
                    (true, self.data.insert(cas.key, cas.value))
                } else {
                    (false, current.cloned())
                }
            }
            kv_command::Op::Delete(delete) => {
                writes.delete(&delete.key);
                (true, self.data.remove(&delete.key))
            }
        };
        Ok(KvResult { succeeded, previous, applied_index: index }.encode_to_vec())
    }
}

impl StateMachine for KvStateMachine {
    /// Apply reads nothing from the store (the data is in memory), so it never fails.
    fn apply(&mut self, index: u64, command: &[u8], writes: &mut SmWrites) -> Applied {
        self.applied_index = index;
        Ok(self.apply_op(index, command, writes))
    }

    /// The test store never looks at a clock.
    fn needs_ticks(&self) -> bool {
        false
    }

    fn query(&self, query: &[u8]) -> Result<Vec<u8>, EngineError> {
        let query = KvQuery::decode(query).map_err(|e| EngineError::Invalid(format!("kv query: {e}")))?;
        Ok(KvValue { value: self.data.get(&query.key).cloned(), applied_index: self.applied_index }.encode_to_vec())
    }

    fn reload(&mut self, reader: &SmReader, applied_index: u64) -> Result<(), StorageError> {
        self.data.clear();
        reader.scan(|key, value| {
            self.data.insert(key.to_vec(), value.to_vec());
        })?;
        self.applied_index = applied_index;
        Ok(())
    }

    fn validate(&self, command: &[u8]) -> Result<(), EngineError> {
        Self::decode(command).map(|_| ())
    }
}

/// Encodes a put command.
pub fn put(key: &[u8], value: &[u8]) -> Vec<u8> {
    KvCommand { op: Some(kv_command::Op::Put(warden_proto::kv::Put { key: key.to_vec(), value: value.to_vec() })) }.encode_to_vec()
}

/// Encodes a compare-and-swap command.
pub fn cas(key: &[u8], expected: Option<&[u8]>, value: &[u8]) -> Vec<u8> {
    KvCommand {
        op: Some(kv_command::Op::Cas(warden_proto::kv::CompareAndSwap {
            key: key.to_vec(),
            expected: expected.map(<[u8]>::to_vec),
            value: value.to_vec(),
        })),
    }
    .encode_to_vec()
}

/// Encodes a get query.
pub fn get(key: &[u8]) -> Vec<u8> {
    KvQuery { key: key.to_vec() }.encode_to_vec()
}

/// Decodes the reply of an applied command.
pub fn decode_result(bytes: &[u8]) -> Result<KvResult, EngineError> {
    KvResult::decode(bytes).map_err(|e| EngineError::Invalid(format!("kv result: {e}")))
}

/// Decodes the reply of a query.
pub fn decode_value(bytes: &[u8]) -> Result<KvValue, EngineError> {
    KvValue::decode(bytes).map_err(|e| EngineError::Invalid(format!("kv value: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_succeeds_only_on_the_expected_value() {
        let mut sm = KvStateMachine::default();
        let mut writes = SmWrites::new(1);
        let first = decode_result(&sm.apply(6, &cas(b"k", None, b"1"), &mut writes).expect("storage").unwrap_or_default()).ok();
        assert_eq!(first.map(|r| r.succeeded), Some(true));
        let stale = decode_result(&sm.apply(7, &cas(b"k", None, b"2"), &mut writes).expect("storage").unwrap_or_default()).ok();
        assert_eq!(stale.as_ref().map(|r| r.succeeded), Some(false));
        assert_eq!(stale.and_then(|r| r.previous), Some(b"1".to_vec()));
        let next = decode_result(&sm.apply(8, &cas(b"k", Some(b"1"), b"2"), &mut writes).expect("storage").unwrap_or_default()).ok();
        assert_eq!(next.map(|r| r.succeeded), Some(true));
        assert_eq!(writes.into_ops().len(), 2, "a failed CAS writes nothing");
    }

    #[test]
    fn garbage_is_rejected_without_a_change() {
        let mut sm = KvStateMachine::default();
        let mut writes = SmWrites::new(1);
        assert!(matches!(sm.apply(6, &[0xff, 0xff, 0xff], &mut writes), Ok(Err(EngineError::Invalid(_)))));
        assert!(sm.validate(&[0x0a]).is_err());
        assert!(matches!(sm.validate(&put(b"k", &vec![0; VALUE_BYTES_MAX + 1])), Err(EngineError::TooLarge { .. })));
        assert!(writes.into_ops().is_empty());
        assert!(sm.data.is_empty());
    }
}
