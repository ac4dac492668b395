//! Subtree quotas: the limits an admin set per prefix, and how each limit is
//! shared out among the groups serving the subtree.
//!
//! Each group enforces its own share (its log counts its usage exactly); this record keeps,
//! per group, an upper bound of the share the group holds, and one invariant: **for every
//! limited kind, the shares of the live groups sum to at most the limit**. The placement
//! leader keeps it while moving room between groups:
//!
//! - to give a group more, [`Quotas::raise`] is committed first (refused if the sum would
//!   pass the limit), then the group is told (its share only grows after the record did);
//! - to take room back, [`Quotas::bump`] gives the share a new version first, the group
//!   shrinks to what it uses (a `SetQuotaShare` of that version), and [`Quotas::lower`]
//!   records what it kept (only for that version: a newer change wins).
//!
//! Each group applies a share only with a version at least its own, so a message delayed
//! from an older leader never grows a share again.
//!
//! Architecture invariant: like the rest of the crate, no I/O: apply checks and records.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::paths::validate_path;

/// Quotas kept at most by this binary's default: a cluster applies the value recorded at
/// its bootstrap (`AppliedSettings::quotas_max`).
pub const QUOTAS_MAX: usize = 1_000;
/// The kinds a group counts (nodes, bytes, sessions, lock waiters), in [`Counts`] order.
pub const COUNTED_KINDS: usize = 4;
/// One number per counted kind.
pub type Counts = [u64; COUNTED_KINDS];

/// What a quota limits (`None`: not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Nodes, bytes, sessions, lock waiters: counted by the groups.
    pub counted: [Option<u64>; COUNTED_KINDS],
    /// Watches, counted by each node serving them.
    pub watches: Option<u64>,
}

/// One group's share of a quota as recorded here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// At least what the group holds of each kind.
    pub allotment: Counts,
    /// Grows with every change; the group applies no older one.
    pub version: u64,
}

/// One quota.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quota {
    /// Its limits.
    pub limits: Limits,
    /// Each group's share, by group id.
    pub shares: BTreeMap<u64, Share>,
}

impl Quota {
    /// The shares of the groups `live` says still exist, summed.
    pub fn allotted(&self, live: impl Fn(u64) -> bool) -> Counts {
        let mut sum = [0u64; COUNTED_KINDS];
        for (_, share) in self.shares.iter().filter(|(group, _)| live(**group)) {
            for (total, part) in sum.iter_mut().zip(share.allotment) {
                *total = total.saturating_add(part);
            }
        }
        sum
    }
}

/// Why a quota change is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum QuotaError {
    /// The prefix is not a valid path.
    #[error("invalid quota prefix {0:?}")]
    InvalidPrefix(String),
    /// The cluster's most quotas (`limit`) exist already.
    #[error("at most {limit} quotas")]
    TooMany {
        /// The cluster's recorded `quotas_max`.
        limit: usize,
    },
    /// No quota on the prefix.
    #[error("no quota on {0}")]
    Unknown(String),
    /// Giving the share would take the shares past the limit.
    #[error("the shares of the quota on {prefix} would exceed its limit {limit} (kind {kind})")]
    OverAllotted {
        /// The quota.
        prefix: String,
        /// Index of the kind in [`Counts`].
        kind: usize,
        /// Its limit.
        limit: u64,
    },
    /// A newer change of the share was recorded meanwhile.
    #[error("the share of group {group} in the quota on {prefix} changed since version {version}")]
    Stale {
        /// The quota.
        prefix: String,
        /// The group.
        group: u64,
        /// The version the change was for.
        version: u64,
    },
}

/// Every quota, by prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    quotas: BTreeMap<String, Quota>,
    /// The last version given to a share, of any quota: versions only grow, so a message
    /// delayed from before a quota was removed and set again is still older than any since.
    version: u64,
}

impl Quotas {
    /// The quota on `prefix`.
    pub fn get(&self, prefix: &str) -> Option<&Quota> {
        self.quotas.get(prefix)
    }

    /// Every quota, by prefix.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Quota)> {
        self.quotas.iter()
    }

    /// Sets the limits of the quota on `prefix` (creating it with no shares), or removes it
    /// (`None`; removing one that is gone is no error). Shares stay as they are: the
    /// placement leader shares the room out again. Answers a new version (for the groups'
    /// records of a removed quota).
    pub fn set(&mut self, prefix: &str, limits: Option<Limits>, quotas_max: usize) -> Result<u64, QuotaError> {
        validate_path(prefix).map_err(|_| QuotaError::InvalidPrefix(prefix.to_string()))?;
        match limits {
            None => {
                self.quotas.remove(prefix);
            }
            Some(limits) => {
                if !self.quotas.contains_key(prefix) && self.quotas.len() >= quotas_max {
                    return Err(QuotaError::TooMany { limit: quotas_max });
                }
                self.quotas.entry(prefix.to_string()).or_default().limits = limits;
            }
        }
        self.version += 1;
        Ok(self.version)
    }

    fn quota_mut(&mut self, prefix: &str) -> Result<&mut Quota, QuotaError> {
        self.quotas.get_mut(prefix).ok_or_else(|| QuotaError::Unknown(prefix.to_string()))
    }

    /// A new version of `group`'s share, its allotment unchanged (before the group shrinks).
    pub fn bump(&mut self, prefix: &str, group: u64) -> Result<u64, QuotaError> {
        let version = self.version + 1;
        self.quota_mut(prefix)?.shares.entry(group).or_default().version = version;
        self.version = version;
        Ok(version)
    }

    /// Gives `group` the share `allotment` under a new version, unless the live groups'
    /// shares would then pass a limit of a kind it grows.
    pub fn raise(&mut self, prefix: &str, group: u64, allotment: Counts, live: impl Fn(u64) -> bool) -> Result<u64, QuotaError> {
        let quota = self.quotas.get(prefix).ok_or_else(|| QuotaError::Unknown(prefix.to_string()))?;
        let current = quota.shares.get(&group).copied().unwrap_or_default();
        let others = Quota { limits: quota.limits, shares: quota.shares.iter().filter(|(g, _)| **g != group).map(|(g, s)| (*g, *s)).collect() }
            .allotted(&live);
        for (kind, limit) in quota.limits.counted.iter().enumerate() {
            let Some(limit) = limit else { continue };
            if allotment[kind] > current.allotment[kind] && others[kind].saturating_add(allotment[kind]) > *limit {
                return Err(QuotaError::OverAllotted { prefix: prefix.to_string(), kind, limit: *limit });
            }
        }
        let version = self.version + 1;
        self.version = version;
        self.quota_mut(prefix)?.shares.insert(group, Share { allotment, version });
        Ok(version)
    }

    /// Records what `group` kept when it shrank for `version`: refused if the share changed
    /// since, or if it would grow.
    pub fn lower(&mut self, prefix: &str, group: u64, allotment: Counts, version: u64) -> Result<(), QuotaError> {
        let share = self.quota_mut(prefix)?.shares.entry(group).or_default();
        if share.version != version || allotment.iter().zip(share.allotment).any(|(new, old)| *new > old) {
            return Err(QuotaError::Stale { prefix: prefix.to_string(), group, version });
        }
        share.allotment = allotment;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(limit: u64) -> Limits {
        Limits { counted: [Some(limit), None, None, None], watches: None }
    }

    #[test]
    fn shares_never_sum_past_the_limit() {
        let mut quotas = Quotas::default();
        quotas.set("/team", Some(nodes(10)), QUOTAS_MAX).unwrap();
        let live = |_| true;
        assert_eq!(quotas.raise("/team", 2, [6, 0, 0, 0], live), Ok(2));
        assert_eq!(quotas.raise("/team", 3, [4, 100, 0, 0], live), Ok(3), "bytes are not limited");
        assert!(matches!(quotas.raise("/team", 3, [5, 0, 0, 0], live), Err(QuotaError::OverAllotted { kind: 0, limit: 10, .. })));
        assert_eq!(quotas.get("/team").unwrap().shares[&3].allotment, [4, 100, 0, 0], "a refused raise changes nothing");
        // Taking room back: a new version, then what the group kept.
        let version = quotas.bump("/team", 2).unwrap();
        assert_eq!(quotas.lower("/team", 2, [1, 0, 0, 0], version), Ok(()));
        assert_eq!(quotas.raise("/team", 3, [9, 0, 0, 0], live), Ok(5));
        // A share of a group that is gone no longer counts.
        assert_eq!(quotas.raise("/team", 3, [10, 0, 0, 0], |group| group != 2), Ok(6));
    }

    #[test]
    fn a_lowering_for_an_older_version_or_growing_is_refused() {
        let mut quotas = Quotas::default();
        quotas.set("/team", Some(nodes(10)), QUOTAS_MAX).unwrap();
        quotas.raise("/team", 2, [5, 0, 0, 0], |_| true).unwrap();
        let version = quotas.bump("/team", 2).unwrap();
        quotas.raise("/team", 2, [6, 0, 0, 0], |_| true).unwrap();
        assert!(matches!(quotas.lower("/team", 2, [1, 0, 0, 0], version), Err(QuotaError::Stale { .. })), "a newer raise wins");
        let version = quotas.bump("/team", 2).unwrap();
        assert!(matches!(quotas.lower("/team", 2, [7, 0, 0, 0], version), Err(QuotaError::Stale { .. })), "lowering never grows");
        assert_eq!(quotas.get("/team").unwrap().shares[&2].allotment, [6, 0, 0, 0]);
        assert!(matches!(quotas.set("nope", Some(nodes(1)), QUOTAS_MAX), Err(QuotaError::InvalidPrefix(_))));
        let before = quotas.set("/other", None, QUOTAS_MAX).unwrap();
        assert!(quotas.set("/team", None, QUOTAS_MAX).unwrap() > before, "versions only grow, across removals");
        assert!(quotas.get("/team").is_none());
    }
}
