//! The limits of the namespace (DESIGN.md rule 8), and where the ones apply checks come
//! from (upgrade safety).
//!
//! A limit checked while applying a command decides what the command does, so every replica
//! of a group must use the same value at the same log index, whatever binary it runs. Those
//! limits are therefore replicated state: placement keeps the cluster's record (set at
//! bootstrap from the bootstrapping binary's defaults, changed by `warden admin limits set`),
//! each group's leader proposes it to its group (`SetLimits`, only a higher version changes
//! anything), and the group writes it beside its data (`mlimits`), so a restart, a snapshot
//! and a new replica all see the same. A group that has applied no record, and a field the
//! record lacks (a limit added by a later release), mean [`Limits::FIRST_RELEASE`]: frozen.
//!
//! Architecture invariant: apply never reads a limit from the binary's defaults
//! ([`Limits::default`]); only the local limits (a page of children, the leader's expiry
//! pacing) may differ between replicas, because no replicated state depends on them.
//! Protocol constants that never change (the path limits, the `%010d` sequence suffix,
//! quota shares per group) stay constants: changing one is a format change, not a default.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use warden_proto::v1::ApplyLimits;

use super::apply::Effects;
use super::error::{invalid, Failure};
use super::txn::Txn;
use warden_proto::namespace::command_result::Result as CommandOutcome;

/// Limits of the namespace. The replicated ones (in the record) are marked so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest node data (replicated).
    pub value_bytes_max: usize,
    /// Operations in one transaction, `then` + `else` (replicated).
    pub txn_ops_max: usize,
    /// Children returned per `GetChildren` page (local).
    pub children_page_max: usize,
    /// Nodes one recursive delete may remove (replicated).
    pub recursive_delete_nodes_max: usize,
    /// Longest TTL (replicated).
    pub ttl_ms_max: u64,
    /// TTL expiries the leader proposes per scan (local).
    pub ttl_expiries_per_scan_max: usize,
    /// Shortest session TTL granted (replicated; DESIGN: at least 1.5 × the election timeout).
    pub session_ttl_ms_min: u64,
    /// Longest session TTL granted (replicated).
    pub session_ttl_ms_max: u64,
    /// Ephemeral nodes one session may own (replicated).
    pub ephemerals_per_session_max: usize,
    /// Sessions one expiry entry ends at most, so expiring many never stalls the group
    /// (replicated).
    pub sessions_per_expiry_max: usize,
    /// Waiters one lock may have (replicated).
    pub lock_waiters_max: usize,
    /// Longest lock-delay, Chubby's bound (replicated).
    pub lock_delay_ms_max: u64,
}

/// The largest value an admin may set for each replicated limit (a limit bounds the work of
/// one entry, so it has a ceiling of its own).
const CEILINGS: Limits = Limits {
    value_bytes_max: 16 << 20,
    txn_ops_max: 10_000,
    children_page_max: usize::MAX,
    recursive_delete_nodes_max: 1_000_000,
    ttl_ms_max: 10 * 365 * 24 * 3600 * 1000,
    ttl_expiries_per_scan_max: usize::MAX,
    session_ttl_ms_min: 24 * 3600 * 1000,
    session_ttl_ms_max: 24 * 3600 * 1000,
    ephemerals_per_session_max: 1_000_000,
    sessions_per_expiry_max: 4096,
    lock_waiters_max: 100_000,
    lock_delay_ms_max: 3600 * 1000,
};

impl Limits {
    /// The first release's limits: what a group applies before it has applied a
    /// `SetLimits`, and what a field a record lacks means. Frozen: a group's history may have
    /// been applied with them, so changing one would let replicas disagree.
    pub const FIRST_RELEASE: Limits = Limits {
        value_bytes_max: 1 << 20,
        txn_ops_max: 128,
        children_page_max: 10_000,
        recursive_delete_nodes_max: 10_000,
        ttl_ms_max: 30 * 24 * 3600 * 1000,
        ttl_expiries_per_scan_max: 128,
        session_ttl_ms_min: 3_000,
        session_ttl_ms_max: 600_000,
        ephemerals_per_session_max: 10_000,
        sessions_per_expiry_max: 64,
        lock_waiters_max: 10_000,
        lock_delay_ms_max: 60_000,
    };

    /// These (local) limits with the replicated ones `record` names; a missing record or
    /// field means [`Limits::FIRST_RELEASE`]'s.
    pub fn with_record(&self, record: Option<&ApplyLimits>) -> Limits {
        let first = &Limits::FIRST_RELEASE;
        let none = ApplyLimits::default();
        let record = record.unwrap_or(&none);
        let size = |field: Option<u64>, first: usize| field.map_or(first, |value| usize::try_from(value).unwrap_or(usize::MAX));
        Limits {
            value_bytes_max: size(record.value_bytes_max, first.value_bytes_max),
            txn_ops_max: size(record.txn_ops_max, first.txn_ops_max),
            recursive_delete_nodes_max: size(record.recursive_delete_nodes_max, first.recursive_delete_nodes_max),
            ttl_ms_max: record.ttl_ms_max.unwrap_or(first.ttl_ms_max),
            session_ttl_ms_min: record.session_ttl_ms_min.unwrap_or(first.session_ttl_ms_min),
            session_ttl_ms_max: record.session_ttl_ms_max.unwrap_or(first.session_ttl_ms_max),
            ephemerals_per_session_max: size(record.ephemerals_per_session_max, first.ephemerals_per_session_max),
            sessions_per_expiry_max: size(record.sessions_per_expiry_max, first.sessions_per_expiry_max),
            lock_waiters_max: size(record.lock_waiters_max, first.lock_waiters_max),
            lock_delay_ms_max: record.lock_delay_ms_max.unwrap_or(first.lock_delay_ms_max),
            ..self.clone()
        }
    }

    /// The record of these limits' replicated ones, at `version`.
    pub fn to_record(&self, version: u64) -> ApplyLimits {
        ApplyLimits {
            version,
            value_bytes_max: Some(self.value_bytes_max as u64),
            txn_ops_max: Some(self.txn_ops_max as u64),
            recursive_delete_nodes_max: Some(self.recursive_delete_nodes_max as u64),
            ttl_ms_max: Some(self.ttl_ms_max),
            session_ttl_ms_min: Some(self.session_ttl_ms_min),
            session_ttl_ms_max: Some(self.session_ttl_ms_max),
            ephemerals_per_session_max: Some(self.ephemerals_per_session_max as u64),
            sessions_per_expiry_max: Some(self.sessions_per_expiry_max as u64),
            lock_waiters_max: Some(self.lock_waiters_max as u64),
            lock_delay_ms_max: Some(self.lock_delay_ms_max),
        }
    }

    /// Why these limits cannot be applied, if they cannot: every replicated limit is at
    /// least 1 and at most its ceiling, and the session TTLs make a range.
    pub fn check(&self) -> Result<(), String> {
        let c = &CEILINGS;
        let sizes = [
            ("value_bytes_max", self.value_bytes_max, c.value_bytes_max),
            ("txn_ops_max", self.txn_ops_max, c.txn_ops_max),
            ("recursive_delete_nodes_max", self.recursive_delete_nodes_max, c.recursive_delete_nodes_max),
            ("ephemerals_per_session_max", self.ephemerals_per_session_max, c.ephemerals_per_session_max),
            ("sessions_per_expiry_max", self.sessions_per_expiry_max, c.sessions_per_expiry_max),
            ("lock_waiters_max", self.lock_waiters_max, c.lock_waiters_max),
        ];
        let times = [
            ("ttl_ms_max", self.ttl_ms_max, c.ttl_ms_max),
            ("session_ttl_ms_min", self.session_ttl_ms_min, c.session_ttl_ms_min),
            ("session_ttl_ms_max", self.session_ttl_ms_max, c.session_ttl_ms_max),
            ("lock_delay_ms_max", self.lock_delay_ms_max, c.lock_delay_ms_max),
        ];
        let all = sizes.into_iter().map(|(name, value, ceiling)| (name, value as u64, ceiling as u64)).chain(times);
        for (name, value, ceiling) in all {
            if value == 0 || value > ceiling {
                return Err(format!("{name} must be in 1..={ceiling}, not {value}"));
            }
        }
        if self.session_ttl_ms_min > self.session_ttl_ms_max {
            return Err(format!("session_ttl_ms_min {} is above session_ttl_ms_max {}", self.session_ttl_ms_min, self.session_ttl_ms_max));
        }
        Ok(())
    }
}

impl Default for Limits {
    /// This binary's defaults: the local limits, and the replicated ones placement records
    /// when this binary bootstraps a cluster (never read by apply).
    fn default() -> Self {
        Limits::FIRST_RELEASE
    }
}

/// `record` with the fields `changes` names replaced (`changes.version` is not read).
pub fn merged(record: &ApplyLimits, changes: &ApplyLimits) -> ApplyLimits {
    let pick = |change: Option<u64>, old: Option<u64>| change.or(old);
    ApplyLimits {
        version: record.version,
        value_bytes_max: pick(changes.value_bytes_max, record.value_bytes_max),
        txn_ops_max: pick(changes.txn_ops_max, record.txn_ops_max),
        recursive_delete_nodes_max: pick(changes.recursive_delete_nodes_max, record.recursive_delete_nodes_max),
        ttl_ms_max: pick(changes.ttl_ms_max, record.ttl_ms_max),
        session_ttl_ms_min: pick(changes.session_ttl_ms_min, record.session_ttl_ms_min),
        session_ttl_ms_max: pick(changes.session_ttl_ms_max, record.session_ttl_ms_max),
        ephemerals_per_session_max: pick(changes.ephemerals_per_session_max, record.ephemerals_per_session_max),
        sessions_per_expiry_max: pick(changes.sessions_per_expiry_max, record.sessions_per_expiry_max),
        lock_waiters_max: pick(changes.lock_waiters_max, record.lock_waiters_max),
        lock_delay_ms_max: pick(changes.lock_delay_ms_max, record.lock_delay_ms_max),
    }
}

/// A replica: `(node, group)`.
type Replica = (u64, u64);
/// The version of the limits record a replica applies, and the limits.
type Applied = (u64, Arc<Limits>);

/// The limits each group applies now, by `(node, group)`: published by the groups' state
/// machines (on load and on each `SetLimits`), read by the node's early checks of a request
/// (so a request is refused before it costs a proposal by the same limits apply will use)
/// and by the task that brings each led group's limits up to placement's.
#[derive(Clone, Default)]
pub struct LimitsBoard {
    groups: Arc<RwLock<HashMap<Replica, Applied>>>,
}

impl LimitsBoard {
    /// The version and limits `group` applies on `node` (`None`: no replica there).
    pub fn get(&self, node: u64, group: u64) -> Option<Applied> {
        self.groups.read().unwrap_or_else(|e| e.into_inner()).get(&(node, group)).cloned()
    }

    /// Records what the replica of `group` on `node` applies now.
    pub fn set(&self, node: u64, group: u64, version: u64, limits: Limits) {
        self.groups.write().unwrap_or_else(|e| e.into_inner()).insert((node, group), (version, Arc::new(limits)));
    }

    /// Forgets a replica that is gone.
    pub fn remove(&self, node: u64, group: u64) {
        self.groups.write().unwrap_or_else(|e| e.into_inner()).remove(&(node, group));
    }
}

/// Applies a `SetLimits`: only a newer record changes the limits (a stale proposal answers
/// the current one); a record whose limits fail their checks is refused.
pub(super) fn apply_record(txn: &mut Txn<'_, '_>, version: u64, record: ApplyLimits, effects: &mut Effects) -> Result<CommandOutcome, Failure> {
    if record.version <= version {
        return Ok(CommandOutcome::Limits(txn.limits.to_record(version)));
    }
    let limits = txn.limits.with_record(Some(&record));
    limits.check().map_err(|reason| Failure::Refused(invalid("", reason)))?;
    txn.view.put_limits(&record);
    effects.limits = Some((record.version, limits));
    Ok(CommandOutcome::Limits(record))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first release's values are frozen: this test fails if anyone edits them.
    #[test]
    fn the_first_release_limits_never_change() {
        let record = Limits::FIRST_RELEASE.to_record(0);
        let values = [
            record.value_bytes_max,
            record.txn_ops_max,
            record.recursive_delete_nodes_max,
            record.ttl_ms_max,
            record.session_ttl_ms_min,
            record.session_ttl_ms_max,
            record.ephemerals_per_session_max,
            record.sessions_per_expiry_max,
            record.lock_waiters_max,
            record.lock_delay_ms_max,
        ];
        let frozen = [1 << 20, 128, 10_000, 2_592_000_000, 3_000, 600_000, 10_000, 64, 10_000, 60_000];
        assert_eq!(values, frozen.map(Some));
    }

    /// A record round-trips; a missing field or record means the first release's value,
    /// whatever the local defaults say; local limits stay local.
    #[test]
    fn a_record_names_the_replicated_limits_and_nothing_else() {
        let local = Limits { value_bytes_max: 5, children_page_max: 7, ..Limits::FIRST_RELEASE };
        assert_eq!(local.with_record(None), Limits { children_page_max: 7, ..Limits::FIRST_RELEASE });
        let set = Limits { value_bytes_max: 99, lock_delay_ms_max: 5, ..Limits::FIRST_RELEASE };
        assert_eq!(local.with_record(Some(&set.to_record(3))), Limits { children_page_max: 7, ..set.clone() });
        let partial = ApplyLimits { version: 4, txn_ops_max: Some(9), ..ApplyLimits::default() };
        assert_eq!(local.with_record(Some(&partial)), Limits { txn_ops_max: 9, children_page_max: 7, ..Limits::FIRST_RELEASE });
        let changed = merged(&set.to_record(3), &partial);
        assert_eq!((changed.version, changed.txn_ops_max, changed.value_bytes_max), (3, Some(9), Some(99)));
    }

    /// Zero, past a ceiling, or an empty session TTL range: refused, naming the limit.
    #[test]
    fn limits_outside_their_bounds_are_refused() {
        assert_eq!(Limits::FIRST_RELEASE.check(), Ok(()));
        let zero = Limits { txn_ops_max: 0, ..Limits::FIRST_RELEASE };
        assert!(zero.check().is_err_and(|e| e.contains("txn_ops_max")));
        let huge = Limits { value_bytes_max: CEILINGS.value_bytes_max + 1, ..Limits::FIRST_RELEASE };
        assert!(huge.check().is_err_and(|e| e.contains("value_bytes_max")));
        let inverted = Limits { session_ttl_ms_min: 10_000, session_ttl_ms_max: 5_000, ..Limits::FIRST_RELEASE };
        assert!(inverted.check().is_err_and(|e| e.contains("session_ttl_ms_min")));
    }

    /// Through the log: a newer record binds (and is what apply checks), an older or equal
    /// one changes nothing, a bad one is refused and changes nothing, the revision does not
    /// move, and a restart reads the record back.
    #[test]
    fn a_group_applies_only_newer_limits_records_and_keeps_them() {
        use warden_proto::v1::warden_error::Code;
        let mut ns = crate::harness::Harness::new(Limits::default()).expect("harness");
        let first = ns.create_simple("/a", &[0; 2000]).expect("2000 bytes are within the first release's limit");
        let revision = first.header.map(|h| h.revision);
        let record = ApplyLimits { version: 1, value_bytes_max: Some(1000), ..ApplyLimits::default() };
        assert_eq!(ns.set_limits(record), Ok(record));
        assert_eq!(ns.create_simple("/b", &[0; 2000]).map_err(|e| e.code), Err(Code::TooLarge as i32));
        let stale = ApplyLimits { version: 1, value_bytes_max: Some(5000), ..ApplyLimits::default() };
        assert_eq!(ns.set_limits(stale).map(|r| r.value_bytes_max), Ok(Some(1000)), "an equal version changes nothing");
        let bad = ApplyLimits { version: 2, txn_ops_max: Some(0), ..record };
        assert_eq!(ns.set_limits(bad).map_err(|e| e.code), Err(Code::InvalidArgument as i32));
        ns.reopen().expect("reopen");
        assert_eq!(ns.create_simple("/c", &[0; 2000]).map_err(|e| e.code), Err(Code::TooLarge as i32), "the record outlives a restart");
        let small = ns.create_simple("/d", &[0; 900]).expect("within the limit");
        assert_eq!(small.header.map(|h| h.revision), revision.map(|r| r + 1), "a limits record takes no revision");
    }
}
