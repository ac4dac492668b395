//! The cluster's apply limits as placement keeps them (upgrade safety).
//!
//! Architecture invariant: placement never reads these limits. It keeps the namespace's
//! record (`warden.v1.ApplyLimits`, encoded) as opaque bytes with a version that grows by
//! one with every change; the shard nodes validate a change before proposing it and each
//! group's leader proposes the record to its group through the group's log.

use serde::{Deserialize, Serialize};

/// Largest encoded limits record placement keeps (the record is a dozen numbers).
pub const APPLY_LIMITS_BYTES_MAX: usize = 4096;

/// The cluster's apply limits: version 0 means never set (groups apply the first release's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyLimitsRecord {
    /// Grows by one with every change.
    pub version: u64,
    /// The encoded `warden.v1.ApplyLimits` (its own `version` field is not read).
    pub encoded: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::bootstrap_command;
    use crate::{Command, Outcome, Placement, PlacementConfig, PlacementError};

    /// Bootstrap records the founding binary's limits at version 1; each change takes the
    /// next version; a record past the size limit is refused and changes nothing; a snapshot
    /// carries the record.
    #[test]
    fn limits_are_set_at_bootstrap_and_versioned_by_each_change() {
        let mut placement = Placement::new(PlacementConfig::default());
        let Command::Bootstrap { nodes, now_ms, .. } = bootstrap_command(&[(1, "z")]) else { unreachable!() };
        placement.apply(&Command::Bootstrap { nodes, now_ms, limits: vec![1, 2, 3], settings: None }).unwrap();
        assert_eq!(placement.apply_limits(), &ApplyLimitsRecord { version: 1, encoded: vec![1, 2, 3] });
        assert_eq!(placement.apply(&Command::SetApplyLimits { encoded: vec![4] }), Ok(Outcome::ApplyLimitsVersion(2)));
        let before = placement.clone();
        let too_long = vec![0; APPLY_LIMITS_BYTES_MAX + 1];
        assert_eq!(placement.apply(&Command::SetApplyLimits { encoded: too_long }), Err(PlacementError::LimitsTooLarge(APPLY_LIMITS_BYTES_MAX + 1)));
        assert_eq!(placement, before, "a refused change changes nothing");
        let restored = Placement::from_bytes(&placement.to_bytes(), PlacementConfig::default()).unwrap();
        assert_eq!(restored.apply_limits(), &ApplyLimitsRecord { version: 2, encoded: vec![4] });
    }

    /// A state without limits (bootstrapped by a binary before them) has version 0, and its
    /// first change is version 1.
    #[test]
    fn a_state_without_limits_starts_at_version_zero() {
        let mut placement = crate::testutil::bootstrapped(1, 1);
        assert_eq!(placement.apply_limits().version, 0);
        assert_eq!(placement.apply(&Command::SetApplyLimits { encoded: vec![9] }), Ok(Outcome::ApplyLimitsVersion(1)));
    }
}
