//! Subtree quotas inside one group (docs/design/security.md "Quotas").
//!
//! A quota limits what lives at or below a prefix: nodes, bytes of data, sessions (by their
//! scope, the path hint they were opened with), lock waiters. When the subtree spans several
//! groups, placement splits each limit into shares, one per group, whose sum never exceeds
//! the limit; each group keeps a [`QuotaShare`] record (`Q<prefix>`): its share, and its
//! usage, counted by apply from the records each command changes. So the usage is exact
//! (replicated state, the same on every replica), and a command that would take a group's
//! usage of a kind past its share is refused RESOURCE_EXHAUSTED before it changes anything.
//! A refusal below the limit makes the serving node ask placement for a bigger share
//! (`placement/quota.rs`), which it takes back from the other groups' unused shares.
//!
//! Only a client's writes are refused; what the system does (expiries, subtree moves) is
//! counted but never refused, so a group may be over its share (then only shrinking writes
//! pass). Watches are not replicated state: their limit is kept per node by the watch hubs.
//!
//! Architecture invariant: nothing here knows about placement or RPCs; a share arrives as a
//! replicated `SetQuotaShare` command and is judged from the group's own records alone.

use std::collections::BTreeMap;

use prost::Message as _;
use warden_proto::namespace::{CountQuota, NodeRecord, QuotaShare, SessionRecord, SetQuotaShare};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{QuotaCounts, QuotaExceeded, QuotaKind, QuotaLimits, WardenError};

use super::apply::{done, Effects};
use super::error::{error, invalid, Failure};
use super::path;
use super::store::{NodeChange, TxnView};
use super::txn::Txn;
use warden_engine::error::StorageError;
use warden_engine::state_machine::SmReader;
use warden_proto::namespace::command_result::Result as CommandOutcome;

/// First byte of a share record's key (`Q<prefix>`). It sorts before the node records
/// (`n`): a record rewritten every batch above them widens every flushed SST's key range past
/// the newest paths, so each SST could hold a new path a create checks (measured by
/// `namespace/apply_batch/create_under_quota` before the sm family had bloom filters: 27% more
/// apply time, against 5% with this byte).
pub const QUOTA: u8 = b'Q';
/// Shares one group keeps at most (a new one past it is refused).
pub const SHARES_MAX: usize = 1_000;
/// Records a share new to a group counts at most per entry when this binary proposes it
/// (`SetQuotaShare.records_max`, `CountQuota.records_max`: the proposer's budget travels in
/// the command, so replicas of other versions count the same page). A page is a few
/// milliseconds of reads, so the node's other groups keep being served between pages, and a
/// group of millions of records is counted in a few thousand entries instead of one entry
/// that reads it all on every replica at once.
pub const COUNT_RECORDS_PER_PAGE: u32 = 10_000;
/// The most records a count page may ask for (checked before it is proposed).
pub const COUNT_RECORDS_PER_PAGE_MAX: u32 = 100_000;

/// The kinds a group counts, in [`Counts`] order.
pub const COUNTED: [QuotaKind; 4] = [QuotaKind::QuotaNodes, QuotaKind::QuotaBytes, QuotaKind::QuotaSessions, QuotaKind::QuotaLockWaiters];

/// One number per counted kind, in [`COUNTED`] order.
pub type Counts = [u64; 4];

/// Changes of [`Counts`] a command makes.
type Deltas = [i64; 4];

/// `counts` as the wire has them.
pub fn counts_to_proto(counts: Counts) -> QuotaCounts {
    QuotaCounts { nodes: counts[0], bytes: counts[1], sessions: counts[2], lock_waiters: counts[3] }
}

/// The wire's counts.
pub fn counts_of(counts: Option<&QuotaCounts>) -> Counts {
    counts.map_or([0; 4], |c| [c.nodes, c.bytes, c.sessions, c.lock_waiters])
}

/// The limit of each counted kind (`None`: not limited).
pub fn limits_of(limits: Option<&QuotaLimits>) -> [Option<u64>; 4] {
    limits.map_or([None; 4], |l| [l.nodes, l.bytes, l.sessions, l.lock_waiters])
}

fn key(prefix: &str) -> Vec<u8> {
    let mut key = vec![QUOTA];
    key.extend_from_slice(prefix.as_bytes());
    key
}

/// What a node record counts for: one node, its data bytes, one waiter if it is a lock's.
fn node_counts(record: Option<&NodeRecord>) -> Deltas {
    match record {
        None => [0; 4],
        Some(record) => [1, record.data.len() as i64, 0, i64::from(record.lock_waiter.is_some())],
    }
}

/// Whether the usage of `share` counts the record at `key` now: always once counted; while
/// counting, only the records its count has passed (it reads the others later, as they are
/// then, so their changes meanwhile are in what it reads).
fn counts_key(share: &QuotaShare, key: &[u8]) -> bool {
    !share.counting || key <= share.counted_through_key.as_slice()
}

/// Where a session counts: its scope (`/` without one).
fn scope(record: &SessionRecord) -> &str {
    if record.scope.is_empty() {
        "/"
    } else {
        &record.scope
    }
}

/// A group's shares of the quotas on its subtree (replicated state, rebuilt from disk).
/// During a batch of applied commands the usage lives here; the records of the shares it
/// changed are written once, when the batch ends ([`GroupQuotas::flush`]).
#[derive(Clone, Debug, Default)]
pub struct GroupQuotas {
    shares: BTreeMap<String, QuotaShare>,
    /// Shares whose record on disk is behind.
    dirty: std::collections::BTreeSet<String>,
}

impl GroupQuotas {
    /// The shares on disk.
    pub fn load(reader: &SmReader) -> Result<GroupQuotas, StorageError> {
        let mut shares = BTreeMap::new();
        let mut corrupt = None;
        reader.scan_range(&[QUOTA], Some(&[QUOTA + 1]), |_, value| {
            match QuotaShare::decode(value) {
                Ok(share) => {
                    shares.insert(share.prefix.clone(), share);
                }
                Err(e) => corrupt = Some(StorageError::Corrupt(format!("quota share: {e}"))),
            }
            corrupt.is_none()
        })?;
        corrupt.map_or(Ok(GroupQuotas { shares, dirty: Default::default() }), Err)
    }

    /// Whether the group holds no share (then nothing is counted).
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// The watch limit of each quota that has one, by prefix (for the watch hubs).
    pub fn watch_limits(&self) -> BTreeMap<String, u64> {
        self.shares.iter().filter_map(|(prefix, share)| Some((prefix.clone(), share.limits.as_ref()?.watches?))).collect()
    }

    /// The shares whose prefix is `path` or one of its ancestors, nearest first.
    fn covering(&self, path: &str) -> Vec<&QuotaShare> {
        let mut covering = Vec::new();
        let mut at = Some(path);
        while let Some(current) = at {
            if let Some(share) = self.shares.get(current) {
                covering.push(share);
            }
            at = path::parent(current);
        }
        covering
    }

    /// What a transaction changes of each share's usage (only shares it changes), from the
    /// node records it changed (`changes`) and the session records in its `view`.
    fn deltas(&self, view: &TxnView<'_>, changes: &[NodeChange]) -> Result<BTreeMap<String, Deltas>, StorageError> {
        let mut deltas: BTreeMap<String, Deltas> = BTreeMap::new();
        let mut add = |prefix: &str, change: Deltas| {
            if change != [0; 4] {
                let entry = deltas.entry(prefix.to_string()).or_default();
                for (total, delta) in entry.iter_mut().zip(change) {
                    *total += delta;
                }
            }
        };
        for NodeChange { path, before, after } in changes {
            let (was, is) = (node_counts(before.as_ref()), node_counts(after.as_ref()));
            let change = [is[0] - was[0], is[1] - was[1], 0, is[3] - was[3]];
            if change == [0; 4] {
                continue;
            }
            let key = super::store::node_key(path);
            for share in self.covering(path).into_iter().filter(|share| counts_key(share, &key)) {
                add(&share.prefix, change);
            }
        }
        // Sessions homed here count (a remote record is another group's session).
        for (before, after) in view.session_changes()? {
            for (record, sign) in [(before, -1), (after, 1)] {
                let Some(record) = record.filter(|r| !r.remote) else { continue };
                let key = super::store::session_key(record.session_id);
                for share in self.covering(scope(&record)).into_iter().filter(|share| counts_key(share, &key)) {
                    add(&share.prefix, [0, 0, sign, 0]);
                }
            }
        }
        Ok(deltas)
    }

    /// What the transaction in `view` (which changed the nodes `changes`) makes of the shares
    /// it touches (to [`update`](Self::update) once it commits); with `refuse`, a client's
    /// command, refuses RESOURCE_EXHAUSTED instead when it would take a usage past its share
    /// (a share still counting refuses nothing: its usage is not known yet).
    pub fn charge(&self, view: &TxnView<'_>, changes: &[NodeChange], refuse: bool) -> Result<Vec<QuotaShare>, Failure> {
        if self.shares.is_empty() {
            return Ok(Vec::new());
        }
        let mut changed = Vec::new();
        for (prefix, deltas) in self.deltas(view, changes)? {
            let Some(share) = self.shares.get(&prefix) else { continue };
            let (allotment, limits) = (counts_of(share.allotment.as_ref()), limits_of(share.limits.as_ref()));
            let mut usage = counts_of(share.usage.as_ref());
            for (index, delta) in deltas.iter().enumerate() {
                let after = usage[index].saturating_add_signed(*delta);
                if refuse && *delta > 0 && !share.counting {
                    if let Some(limit) = limits[index].filter(|_| after > allotment[index]) {
                        return Err(exceeded(&prefix, index, limit, after, allotment[index]).into());
                    }
                }
                usage[index] = after;
            }
            changed.push(QuotaShare { usage: Some(counts_to_proto(usage)), ..share.clone() });
        }
        Ok(changed)
    }

    /// Applies placement's `SetQuotaShare` to the view (see its doc in namespace.proto);
    /// answers the record after it. A new share starts counting what the group holds: its
    /// first page here, the rest in the leader's `CountQuota` pages.
    pub fn set_share(&self, view: &mut TxnView<'_>, set: &SetQuotaShare) -> Result<QuotaShare, Failure> {
        path::validate(&set.prefix, true).map_err(|reason| super::error::invalid_path(&set.prefix, &reason))?;
        let current = self.shares.get(&set.prefix);
        if set.version == 0 || current.is_some_and(|c| c.version > set.version) {
            return Ok(current.cloned().unwrap_or_else(|| QuotaShare { prefix: set.prefix.clone(), ..QuotaShare::default() }));
        }
        if set.remove {
            if current.is_some() {
                view.delete_raw(&key(&set.prefix));
            }
            return Ok(QuotaShare { prefix: set.prefix.clone(), version: set.version, ..QuotaShare::default() });
        }
        if current.is_none() && self.shares.len() >= SHARES_MAX {
            return Err(invalid(&set.prefix, format!("a group keeps at most {SHARES_MAX} quota shares")).into());
        }
        let wanted = counts_of(set.allotment.as_ref());
        let allotment = match (set.shrink, current) {
            // Never above what it had; not below the usage unless capped. A share still
            // counting does not know its usage: it keeps what it had (unless capped).
            (true, Some(share)) => {
                let had = counts_of(share.allotment.as_ref());
                let floor = if share.counting { had } else { counts_of(share.usage.as_ref()) };
                std::array::from_fn(|i| had[i].min(if set.cap { wanted[i] } else { wanted[i].max(floor[i]) }))
            }
            (true, None) => [0; 4],
            (false, _) => wanted,
        };
        let share = match current {
            Some(current) => QuotaShare { version: set.version, limits: set.limits, allotment: Some(counts_to_proto(allotment)), ..current.clone() },
            None => {
                let new = QuotaShare {
                    prefix: set.prefix.clone(),
                    version: set.version,
                    limits: set.limits,
                    allotment: Some(counts_to_proto(allotment)),
                    usage: Some(counts_to_proto([0; 4])),
                    counting: true,
                    counted_through_key: Vec::new(),
                };
                count_page(view, new, set.records_max)?
            }
        };
        view.put_raw(&key(&set.prefix), &share.encode_to_vec());
        Ok(share)
    }

    /// Counts the next page of the share of `count.prefix` if it is counting (see
    /// `CountQuota` in namespace.proto); answers the record after it (`None`: nothing to do).
    pub fn count(&self, view: &mut TxnView<'_>, count: &CountQuota) -> Result<Option<QuotaShare>, Failure> {
        let Some(share) = self.shares.get(&count.prefix).filter(|share| share.counting) else { return Ok(None) };
        if count.records_max == 0 {
            return Err(invalid(&count.prefix, "a count page counts at least one record").into());
        }
        let share = count_page(view, share.clone(), count.records_max)?;
        view.put_raw(&key(&count.prefix), &share.encode_to_vec());
        Ok(Some(share))
    }

    /// The first share still counting, if any (its leader proposes its pages).
    pub fn counting(&self) -> Option<&str> {
        self.shares.values().find(|share| share.counting).map(|share| share.prefix.as_str())
    }

    /// Takes in what a committed command made of the shares (their records are written by
    /// the next [`flush`](Self::flush)); a removed share's record was deleted by the command.
    pub fn update(&mut self, shares: Vec<QuotaShare>, removed: Option<String>) {
        if let Some(prefix) = removed {
            self.dirty.remove(&prefix);
            self.shares.remove(&prefix);
        }
        for share in shares {
            self.dirty.insert(share.prefix.clone());
            self.shares.insert(share.prefix.clone(), share);
        }
    }

    /// Writes the records of the shares changed since the last flush (at the end of a batch).
    pub fn flush(&mut self, writes: &mut warden_engine::state_machine::SmWrites) {
        for prefix in std::mem::take(&mut self.dirty) {
            if let Some(share) = self.shares.get(&prefix) {
                writes.put(&key(&prefix), &share.encode_to_vec());
            }
        }
    }
}

/// The key ranges a share at `prefix` counts, in key order: the node records at or below
/// it, then the session records (those homed here with their scope there count).
fn counted_ranges(prefix: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut ranges = super::store::subtree_node_ranges(prefix);
    ranges.push((vec![b's'], vec![b't']));
    ranges
}

/// Counts into `share` the next at most `records_max` records after its cursor, as the batch
/// will leave them (streamed: memory stays at one record); the count is done once none is
/// left. A page of none changes nothing.
fn count_page(view: &TxnView<'_>, mut share: QuotaShare, records_max: u32) -> Result<QuotaShare, StorageError> {
    if records_max == 0 {
        return Ok(share);
    }
    let mut usage = counts_of(share.usage.as_ref());
    let base = view.base();
    // The root always exists, stored or not: one that is not is counted here, and its key
    // passed, so a later first write of it (no new node) changes nothing.
    if share.prefix == "/" && share.counted_through_key.is_empty() && view.get_raw(b"n/")?.is_none() {
        usage[0] += 1;
        share.counted_through_key = b"n/".to_vec();
    }
    let last = base.visit_page(counted_ranges(&share.prefix), &share.counted_through_key, records_max, |key, value| {
        if key.first() == Some(&b's') {
            let record = SessionRecord::decode(value).map_err(|e| StorageError::Corrupt(format!("session record: {e}")))?;
            if !record.remote && warden_placement::is_at_or_below(scope(&record), &share.prefix) {
                usage[2] += 1;
            }
        } else {
            let record = super::store::decode_record(value)?;
            for (total, count) in usage.iter_mut().zip(node_counts(Some(&record))) {
                *total += count as u64;
            }
        }
        Ok::<_, StorageError>(())
    })?;
    match last {
        Some(key) => share.counted_through_key = key,
        None => {
            share.counting = false;
            share.counted_through_key.clear();
        }
    }
    share.usage = Some(counts_to_proto(usage));
    Ok(share)
}

/// The refusal of a request that would take `usage` of kind `index` past the group's
/// `share` of `limit`.
fn exceeded(prefix: &str, index: usize, limit: u64, usage: u64, share: u64) -> WardenError {
    let kind = COUNTED[index];
    let what = warden_proto::quota_kind_name(kind);
    let message = if share < limit {
        format!("the {what} quota of {prefix} ({limit}) is used up: this group's share is {share}, the request needs {usage}")
    } else {
        format!("the {what} quota of {prefix} ({limit}) is used up: the request needs {usage}")
    };
    WardenError {
        quota: Some(Box::new(QuotaExceeded { prefix: prefix.to_string(), kind: kind as i32, limit, usage, share })),
        ..error(Code::ResourceExhausted, prefix, message)
    }
}

/// The refusal of a watch the node's count under `prefix` has no room for.
pub fn watches_exceeded(prefix: &str, limit: u64) -> WardenError {
    let message = format!("the watches quota of {prefix} ({limit}) is used up on this node");
    WardenError {
        quota: Some(Box::new(QuotaExceeded {
            prefix: prefix.to_string(),
            kind: QuotaKind::QuotaWatches as i32,
            limit,
            usage: limit + 1,
            share: limit,
        })),
        ..error(Code::ResourceExhausted, prefix, message)
    }
}

/// Applies a `SetQuotaShare`: the group's share of a subtree quota (or its removal).
pub(super) fn apply_share(
    quotas: &GroupQuotas,
    txn: &mut Txn<'_, '_>,
    set: &SetQuotaShare,
    effects: &mut Effects,
) -> Result<CommandOutcome, Failure> {
    let share = quotas.set_share(txn.view, set)?;
    if set.remove {
        effects.quota_removed = Some(set.prefix.clone());
    } else {
        effects.quota_shares.push(share.clone());
    }
    Ok(CommandOutcome::QuotaShare(share))
}

/// Applies a `CountQuota`: a page of a new share's first count.
pub(super) fn apply_count(quotas: &GroupQuotas, txn: &mut Txn<'_, '_>, count: &CountQuota, effects: &mut Effects) -> Result<CommandOutcome, Failure> {
    effects.quota_shares.extend(quotas.count(txn.view, count)?);
    Ok(done())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Harness;
    use crate::Limits;

    fn share(version: u64, nodes: Option<u64>, allotment: Counts, shrink: bool) -> SetQuotaShare {
        SetQuotaShare {
            prefix: "/t".into(),
            version,
            limits: Some(QuotaLimits { nodes, ..QuotaLimits::default() }),
            allotment: Some(counts_to_proto(allotment)),
            shrink,
            remove: false,
            cap: false,
            records_max: COUNT_RECORDS_PER_PAGE,
        }
    }

    /// The usage is counted when the share arrives, kept by every write (moves included),
    /// survives a restart, and a refused write changes nothing; a shrink keeps the usage, a
    /// stale version changes nothing.
    #[test]
    fn a_share_counts_exactly_refuses_past_itself_and_survives_a_restart() {
        let mut ns = Harness::new(Limits::default()).expect("harness");
        ns.create_simple("/t", b"ab").expect("create");
        ns.create_simple("/t/x", b"cde").expect("create");
        ns.create_simple("/other", b"not counted").expect("create");
        let record = ns.set_quota_share(share(5, Some(4), [4, 0, 0, 0], false)).expect("share");
        assert_eq!(counts_of(record.usage.as_ref()), [2, 5, 0, 0], "counted when it arrives");
        ns.create_simple("/t/y", b"").expect("3 of 4");
        ns.create_simple("/t/z", b"").expect("4 of 4");
        let refused = ns.create_simple("/t/x/past", b"").expect_err("5 of 4");
        let quota = refused.quota.expect("names the quota");
        assert_eq!((quota.prefix.as_str(), quota.limit, quota.usage, quota.share), ("/t", 4, 5, 4));
        assert!(ns.create_simple("/other/free", b"").is_ok(), "outside the subtree");
        ns.delete("/t/z", None, false).expect("delete");
        ns.reopen().expect("restart");
        let stale = ns.set_quota_share(share(4, Some(1), [1, 0, 0, 0], false)).expect("stale");
        assert_eq!((stale.version, counts_of(stale.usage.as_ref())), (5, [3, 5, 0, 0]), "kept across the restart, a stale share ignored");
        let shrunk = ns.set_quota_share(share(6, Some(4), [0, 0, 0, 0], true)).expect("shrink");
        assert_eq!(counts_of(shrunk.allotment.as_ref()), [3, 0, 0, 0], "a shrink keeps the usage");
        assert!(ns.create_simple("/t/w", b"").is_err(), "nothing left after the shrink");
        let capped = ns.set_quota_share(SetQuotaShare { cap: true, ..share(7, Some(1), [1, 0, 0, 0], true) }).expect("cap");
        assert_eq!(counts_of(capped.allotment.as_ref()), [1, 0, 0, 0], "a cap goes below the usage");
        ns.delete("/t/y", None, false).expect("a shrinking write passes over the share");
        assert!(ns.create_simple("/t/y", b"").is_err(), "growth waits until the usage is below the share");
    }

    /// What the group holds, counted from its records on disk: nodes (the root always
    /// exists), data bytes, sessions homed here, lock waiters.
    fn held_on_disk(ns: &Harness) -> Counts {
        let mut held = [0u64; 4];
        let mut root = false;
        let read = ns.reader().scan(|key, value| match key.first() {
            Some(b'n') => {
                root |= key == b"n/";
                let record = crate::store::decode_record(value).unwrap_or_default();
                for (total, count) in held.iter_mut().zip(node_counts(Some(&record))) {
                    *total += count as u64;
                }
            }
            Some(b's') => held[2] += u64::from(SessionRecord::decode(value).is_ok_and(|record| !record.remote)),
            _ => {}
        });
        assert!(read.is_ok(), "the group's records read");
        held[0] += u64::from(!root);
        held
    }

    /// A share new to a group of more records than a page counts them in pages the leader
    /// proposes, each within its budget (the share's own entry reads nothing); meanwhile it
    /// refuses nothing, and writes on either side of the count's cursor leave it exact.
    #[test]
    fn a_new_share_counts_a_large_group_a_bounded_page_per_entry_and_ends_exact() {
        let mut ns = Harness::new(Limits::default()).expect("harness");
        ns.set_leading(true, 0);
        let nodes = 12_000;
        ns.create_simple("/t", b"").expect("create");
        for i in 0..nodes {
            ns.create_simple(&format!("/t/n{i:05}"), b"ab").expect("create");
        }
        ns.create_session(60_000).expect("session");
        let share = SetQuotaShare {
            prefix: "/".into(),
            version: 1,
            limits: Some(QuotaLimits { nodes: Some(5), ..QuotaLimits::default() }),
            allotment: Some(counts_to_proto([5, 0, 0, 0])),
            ..SetQuotaShare::default()
        };
        ns.take_batch_costs();
        ns.set_quota_share(share).expect("share");
        let set = ns.take_batch_costs();
        assert!(set.iter().all(|cost| cost.records_scanned < 64), "the share's own entry reads no page of its own here: {set:?}");
        ns.create_simple("/t/before-any-page", b"").expect("not enforced before it is counted");
        assert_eq!(ns.leader_scan(1).expect("a count page"), 1);
        // The first page passed /t/n00001 and /t/n00002, not /t/n11000 nor /t/zzz.
        ns.delete("/t/n00001", None, false).expect("delete");
        ns.set("/t/n00002", b"longer data", None).expect("set");
        ns.set("/t/n11000", b"longer data", None).expect("set");
        ns.create_simple("/t/zzz", b"xyz").expect("not enforced while it counts");
        ns.create_session(60_000).expect("a session while it counts");
        while ns.leader_scan(1).expect("count pages") > 0 {}
        let pages = ns.take_batch_costs();
        let budget = u64::from(COUNT_RECORDS_PER_PAGE);
        assert!(pages.iter().filter(|cost| cost.records_scanned > 1_000).count() >= 2, "counted in pages: {pages:?}");
        assert!(pages.iter().all(|cost| cost.records_scanned <= budget + 64), "a page past its budget of {budget}: {pages:?}");
        let read = SetQuotaShare { prefix: "/".into(), ..SetQuotaShare::default() };
        let counted = counts_of(ns.set_quota_share(read).expect("the share").usage.as_ref());
        assert_eq!(counted, held_on_disk(&ns), "the count ends exact");
        let refused = ns.create_simple("/t/after", b"").expect_err("enforced once counted");
        assert_eq!(refused.code, Code::ResourceExhausted as i32, "{refused:?}");
    }

    #[test]
    fn a_share_covers_its_prefix_and_everything_below_only() {
        let mut quotas = GroupQuotas::default();
        for prefix in ["/", "/a", "/a/b"] {
            quotas.shares.insert(prefix.to_string(), QuotaShare { prefix: prefix.to_string(), ..QuotaShare::default() });
        }
        let covering = |path: &str| quotas.covering(path).into_iter().map(|s| s.prefix.clone()).collect::<Vec<_>>();
        assert_eq!(covering("/a/b/c"), ["/a/b", "/a", "/"]);
        assert_eq!(covering("/a"), ["/a", "/"]);
        assert_eq!(covering("/ab"), ["/"], "a sibling sharing the name's start is not below /a");
    }
}
