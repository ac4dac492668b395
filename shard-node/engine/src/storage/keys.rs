//! Key layout of the node's one RocksDB. Every key starts with the group id (8 bytes,
//! big-endian) so one group's data is one contiguous range in each column family and a
//! group can be destroyed with one range delete per family.

/// Length of the group-id prefix every key starts with.
pub const GROUP_PREFIX_LEN: usize = 8;

/// Tags of the per-group records in the `raft_state` column family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum StateKey {
    /// Marks that this node hosts a replica of the group (value: empty).
    Replica = 1,
    /// raft-proto `HardState` (term, vote, commit).
    HardState = 2,
    /// Applied index and the term of that entry (16 bytes).
    Apply = 3,
    /// raft-proto `ConfState` as of the applied index.
    ConfState = 4,
    /// Index and term of the last entry removed from the log (16 bytes).
    Truncated = 5,
    /// raft-proto `HardState` (term and vote) of this node's last replica of the group that
    /// was destroyed. Written after the range delete that erases the replica, so it outlives
    /// it: a replica created here again starts from that term and vote, and so never votes
    /// twice in one term (raft peer id = node id is reused across incarnations).
    Tombstone = 6,
    /// The group's configuration fence (8 bytes, big-endian): the highest placement term of
    /// the configuration changes applied (`host/conf_fence.rs`). Written in the batch that
    /// writes the `ConfState` it came with; absent means 0 (no fenced change applied yet).
    ConfFence = 7,
}

/// `group` as the 8-byte prefix of every key of that group.
pub fn group_prefix(group: u64) -> [u8; GROUP_PREFIX_LEN] {
    group.to_be_bytes()
}

/// Largest valid group id. `u64::MAX` is reserved so every group's range has an end key;
/// 0 is reserved as "no group".
pub const GROUP_ID_MAX: u64 = u64::MAX - 1;

/// First key after every key of `group` (the exclusive end of its range).
///
/// # Panics
/// If `group` exceeds [`GROUP_ID_MAX`]; ids are checked when a group is created.
pub fn group_end(group: u64) -> Vec<u8> {
    assert!(group <= GROUP_ID_MAX, "group id {group} is reserved");
    (group + 1).to_be_bytes().to_vec()
}

/// Key of log entry `index` of `group` in the `raft_log` family.
pub fn log_key(group: u64, index: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&group.to_be_bytes());
    key[8..].copy_from_slice(&index.to_be_bytes());
    key
}

/// Decodes a `raft_log` key into (group, index); `None` if it is not 16 bytes.
pub fn decode_log_key(key: &[u8]) -> Option<(u64, u64)> {
    let group = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let index = u64::from_be_bytes(key.get(8..16)?.try_into().ok()?);
    (key.len() == 16).then_some((group, index))
}

/// Key of a per-group record in the `raft_state` family.
pub fn state_key(group: u64, tag: StateKey) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[..8].copy_from_slice(&group.to_be_bytes());
    key[8] = tag as u8;
    key
}

/// Decodes a `raft_state` key into (group, tag byte).
pub fn decode_state_key(key: &[u8]) -> Option<(u64, u8)> {
    if key.len() != 9 {
        return None;
    }
    let group = u64::from_be_bytes(key[..8].try_into().ok()?);
    Some((group, key[8]))
}

/// Key of a state-machine key `user_key` of `group` in the `sm` family.
pub fn sm_key(group: u64, user_key: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(GROUP_PREFIX_LEN + user_key.len());
    key.extend_from_slice(&group.to_be_bytes());
    key.extend_from_slice(user_key);
    key
}

/// Encodes an (index, term) pair as 16 bytes.
pub fn encode_index_term(index: u64, term: u64) -> [u8; 16] {
    let mut value = [0u8; 16];
    value[..8].copy_from_slice(&index.to_be_bytes());
    value[8..].copy_from_slice(&term.to_be_bytes());
    value
}

/// Decodes an (index, term) pair; `None` if the value is not 16 bytes.
pub fn decode_index_term(value: &[u8]) -> Option<(u64, u64)> {
    if value.len() != 16 {
        return None;
    }
    let index = u64::from_be_bytes(value[..8].try_into().ok()?);
    let term = u64::from_be_bytes(value[8..].try_into().ok()?);
    Some((index, term))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_by_group_then_index() {
        assert!(log_key(1, u64::MAX) < log_key(2, 0));
        assert!(log_key(1, 255) < log_key(1, 256));
        assert_eq!(decode_log_key(&log_key(7, 42)), Some((7, 42)));
        assert_eq!(decode_log_key(&[0u8; 15]), None);
    }

    #[test]
    fn group_end_bounds_every_key_of_the_group() {
        for group in [0, 1, GROUP_ID_MAX - 1, GROUP_ID_MAX] {
            let end = group_end(group);
            assert!(log_key(group, u64::MAX).as_slice() < end.as_slice());
            assert!(sm_key(group, &[0xff; 64]).as_slice() < end.as_slice());
            assert!(state_key(group, StateKey::Truncated).as_slice() < end.as_slice());
            assert!(group_prefix(group).as_slice() < end.as_slice());
        }
        assert!(group_end(3).as_slice() <= log_key(4, 0).as_slice());
    }

    #[test]
    fn index_term_round_trips_and_rejects_bad_lengths() {
        assert_eq!(decode_index_term(&encode_index_term(5, 9)), Some((5, 9)));
        assert_eq!(decode_index_term(&[1, 2, 3]), None);
        assert_eq!(decode_state_key(&state_key(9, StateKey::Apply)), Some((9, 3)));
        assert_eq!(decode_state_key(&[0; 8]), None);
    }
}
