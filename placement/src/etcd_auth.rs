//! The record behind the etcd API's `Auth` service (`warden-router`'s `etcd::auth`): etcd's
//! users (with their password hashes), roles and enabled flag, kept replicated here so every
//! router of the cluster reads the same one.
//!
//! Architecture invariant: placement never reads this record. It keeps it as opaque bytes
//! with a version that grows by one with every change; a change names the version it was
//! made from and is refused if another came first (routers read, change and write back).

use serde::{Deserialize, Serialize};

/// Largest encoded record placement keeps: it travels whole in every read, and in the
/// placement state's snapshots (encoded as JSON, a byte as up to four characters).
pub const ETCD_AUTH_BYTES_MAX: usize = 256 << 10;

/// The etcd auth record: version 0 means never set (auth disabled, no users, no roles).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdAuthRecord {
    /// Grows by one with every change.
    pub version: u64,
    /// The router's encoding of users, roles and the enabled flag.
    pub encoded: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use crate::{Command, Outcome, Placement, PlacementConfig, PlacementError};

    use super::*;

    /// A change made from the current version takes the next one; one made from an older
    /// version, or past the size limit, is refused and changes nothing; a snapshot carries
    /// the record.
    #[test]
    fn a_change_from_a_stale_version_is_refused_and_a_snapshot_keeps_the_record() {
        let mut placement = crate::testutil::bootstrapped(1, 1);
        let set = |expected_version, encoded: Vec<u8>| Command::SetEtcdAuth { expected_version, encoded };
        assert_eq!(placement.apply(&set(0, vec![1])), Ok(Outcome::EtcdAuthVersion(1)));
        let before = placement.clone();
        assert_eq!(placement.apply(&set(0, vec![2])), Err(PlacementError::EtcdAuthStale { expected: 0, current: 1 }));
        let too_long = vec![0; ETCD_AUTH_BYTES_MAX + 1];
        assert_eq!(placement.apply(&set(1, too_long)), Err(PlacementError::EtcdAuthTooLarge(ETCD_AUTH_BYTES_MAX + 1)));
        assert_eq!(placement, before, "a refused change changes nothing");
        assert_eq!(placement.apply(&set(1, vec![3])), Ok(Outcome::EtcdAuthVersion(2)));
        let restored = Placement::from_bytes(&placement.to_bytes(), PlacementConfig::default()).expect("restores");
        assert_eq!(restored.etcd_auth(), &EtcdAuthRecord { version: 2, encoded: vec![3] });
    }
}
