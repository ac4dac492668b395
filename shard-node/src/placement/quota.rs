//! The placement leader's side of subtree quotas (`warden_placement::quota` has
//! the record and its invariant, `namespace/quota.rs` the groups' counting).
//!
//! - **Share out** ([`PlacementService::share_out`], on `SetQuota`): every group serving the
//!   subtree shrinks its share to its usage, then each gets its usage plus an even part of
//!   the room left.
//! - **Grant** ([`PlacementService::grant`], on a group's `RequestQuota` when a write was
//!   refused below the limit): if the free room is too small, the other groups shrink the
//!   kind to their usage first; the requester then gets at least what it needs (an even
//!   part of the free room when that is more), or nothing when the limit is reached.
//! - **Join** ([`PlacementService::join_quotas`]): a group starting to serve part of a
//!   quota's subtree (a split) gets a record, with no room, before it serves.
//!
//! Each share change is a numbered sequence (the order keeps the sum within the limit):
//! growing: 1. `RaiseQuotaShare` committed (refused past the limit), 2. the group applies it.
//! Shrinking: 1. `BumpQuotaShare` committed (a new version), 2. the group shrinks, 3.
//! `LowerQuotaShare` records what it kept (refused if a newer change came first).

use tonic::Status;
use warden_placement::quota::{Counts, Limits, COUNTED_KINDS};
use warden_placement::{Command, Outcome, Placement};
use warden_proto::namespace::{QuotaShare, SetQuotaShare};
use warden_proto::placement::{QuotaGroupShare, QuotaState, SetQuotaShareRequest};
use warden_proto::v1::QuotaLimits;

use super::service::{internal, PlacementService};
use warden_namespace::quota::{counts_of, counts_to_proto};

/// The wire form of `limits`.
pub fn limits_to_proto(limits: &Limits) -> QuotaLimits {
    let [nodes, bytes, sessions, lock_waiters] = limits.counted;
    QuotaLimits { nodes, bytes, sessions, lock_waiters, watches: limits.watches }
}

/// The limits the wire names.
pub fn limits_from_proto(limits: Option<&QuotaLimits>) -> Limits {
    Limits { counted: warden_namespace::quota::limits_of(limits), watches: limits.and_then(|l| l.watches) }
}

/// The groups serving some of the subtree at `prefix`: the group routing `prefix` itself
/// and every ready group whose prefix is below it.
pub fn spanning_groups(state: &Placement, prefix: &str) -> Vec<u64> {
    let mut groups: Vec<u64> = state.route(prefix).map(|g| g.id).into_iter().collect();
    for (route, group) in state.routes() {
        if warden_placement::is_strictly_below(route, prefix) && !groups.contains(group) {
            groups.push(*group);
        }
    }
    groups
}

/// The quota on `prefix` as the groups' `records` show it.
fn quota_state(prefix: &str, limits: &Limits, records: &[(u64, QuotaShare)]) -> QuotaState {
    let mut usage = [0u64; COUNTED_KINDS];
    for (_, record) in records {
        for (total, used) in usage.iter_mut().zip(counts_of(record.usage.as_ref())) {
            *total += used;
        }
    }
    QuotaState {
        prefix: prefix.to_string(),
        limits: Some(limits_to_proto(limits)),
        shares: records
            .iter()
            .map(|(group, record)| QuotaGroupShare { group_id: *group, allotment: record.allotment, usage: record.usage, counting: record.counting })
            .collect(),
        usage: Some(counts_to_proto(usage)),
    }
}

/// The command giving a group the share `allotment` of the quota on `prefix` at `version`.
fn share_command(prefix: &str, version: u64, limits: &Limits, allotment: Counts) -> SetQuotaShare {
    SetQuotaShare {
        prefix: prefix.to_string(),
        version,
        limits: Some(limits_to_proto(limits)),
        allotment: Some(counts_to_proto(allotment)),
        // A group new to the quota counts what it holds in pages of this many records (the
        // rest its leader proposes): small groups are counted at once.
        records_max: warden_namespace::quota::COUNT_RECORDS_PER_PAGE,
        ..SetQuotaShare::default()
    }
}

fn version_of(outcome: Outcome) -> Result<u64, Status> {
    match outcome {
        Outcome::QuotaShareVersion(version) => Ok(version),
        other => Err(internal(format!("unexpected outcome {other:?}"))),
    }
}

impl PlacementService {
    /// Has the leader of `group` apply `share` (proposed to its log); answers its record after.
    async fn set_share_at(&self, state: &Placement, group: u64, share: SetQuotaShare) -> Result<QuotaShare, Status> {
        let info = state.group(group).ok_or_else(|| internal(format!("group {group} is gone")))?;
        if share.version != 0 && self.faults.quota_share_set_fails() {
            return Err(internal(format!("group {group} did not take its share of the quota on {} (fault injection)", share.prefix)));
        }
        let request = SetQuotaShareRequest { group_id: group, share: Some(share) };
        self.at_group_leader(state, info, |mut client| {
            let request = request.clone();
            async move { client.set_quota_share(request).await }
        })
        .await
    }

    /// Shrinks `group`'s share of the `kinds` to its usage (steps 1–3 of a shrink); `had` is
    /// the share recorded for it. Answers the group's record after.
    async fn shrink_share(
        &self,
        state: &Placement,
        prefix: &str,
        limits: &Limits,
        group: u64,
        had: Counts,
        kinds: &[usize],
    ) -> Result<QuotaShare, Status> {
        // Kinds not asked for keep what they have.
        let mut keep = had;
        for kind in kinds {
            keep[*kind] = 0;
        }
        self.shrink_share_to(state, prefix, limits, group, keep, false).await
    }

    /// Steps 1–3 of a shrink: `group` keeps at most `keep` of each kind, and (unless `cap`)
    /// at least its usage. Answers the group's record after.
    async fn shrink_share_to(
        &self,
        state: &Placement,
        prefix: &str,
        limits: &Limits,
        group: u64,
        keep: Counts,
        cap: bool,
    ) -> Result<QuotaShare, Status> {
        // 1.
        let version = version_of(self.propose(&Command::BumpQuotaShare { prefix: prefix.to_string(), group_id: group }).await?)?;
        // 2.
        let share = SetQuotaShare { shrink: true, cap, ..share_command(prefix, version, limits, keep) };
        let record = self.set_share_at(state, group, share).await?;
        // 3. A newer change recorded meanwhile wins (the record stays an upper bound).
        if record.version == version {
            let lower =
                Command::LowerQuotaShare { prefix: prefix.to_string(), group_id: group, allotment: counts_of(record.allotment.as_ref()), version };
            if let Err(status) = self.propose(&lower).await {
                tracing::debug!(prefix, group, %status, "a quota share shrank but was changed again since");
            }
        }
        Ok(record)
    }

    /// Gives `group` the share `allotment` (steps 1–2 of a raise); answers its record after.
    async fn raise_share(&self, state: &Placement, prefix: &str, limits: &Limits, group: u64, allotment: Counts) -> Result<QuotaShare, Status> {
        let raise = Command::RaiseQuotaShare { prefix: prefix.to_string(), group_id: group, allotment };
        let version = version_of(self.propose(&raise).await?)?;
        self.set_share_at(state, group, share_command(prefix, version, limits, allotment)).await
    }

    /// Shares the quota on `prefix` out again (see the module doc); with the quota removed,
    /// every group serving the subtree forgets its share. Answers the quota's state.
    pub(super) async fn share_out(&self, prefix: &str, removed_at: u64) -> Result<QuotaState, Status> {
        let _one_at_a_time = self.quota_changes.lock().await;
        let state = self.state().await?;
        let Some(quota) = state.quotas().get(prefix).cloned() else {
            for group in spanning_groups(&state, prefix) {
                let remove = SetQuotaShare { prefix: prefix.to_string(), version: removed_at, remove: true, ..SetQuotaShare::default() };
                self.set_share_at(&state, group, remove).await?;
            }
            return Ok(QuotaState { prefix: prefix.to_string(), ..QuotaState::default() });
        };
        let spanning = spanning_groups(&state, prefix);
        // Groups that hold a share but serve none of the subtree now (merged away) give it
        // back too.
        let mut groups = spanning.clone();
        groups.extend(quota.shares.keys().filter(|g| state.group(**g).is_some() && !spanning.contains(g)));
        let mut records = Vec::with_capacity(groups.len());
        for group in &groups {
            let had = quota.shares.get(group).map_or([0; COUNTED_KINDS], |share| share.allotment);
            records.push((*group, self.shrink_share(&state, prefix, &quota.limits, *group, had, &[0, 1, 2, 3]).await?));
        }
        let count = spanning.len() as u64;
        // A limit lowered below what the groups use: each keeps at most an even part of it
        // (it then refuses all growth until its usage falls below).
        let used: Counts = std::array::from_fn(|kind| records.iter().map(|(_, r)| counts_of(r.allotment.as_ref())[kind]).sum());
        let over: Vec<usize> = (0..COUNTED_KINDS).filter(|kind| quota.limits.counted[*kind].is_some_and(|limit| used[*kind] > limit)).collect();
        if !over.is_empty() {
            for (position, (group, record)) in records.iter_mut().enumerate() {
                let mut keep = counts_of(record.allotment.as_ref());
                for kind in &over {
                    let limit = quota.limits.counted[*kind].unwrap_or(0);
                    let even = if position < spanning.len() { limit / count + u64::from((position as u64) < limit % count) } else { 0 };
                    keep[*kind] = keep[*kind].min(even);
                }
                *record = self.shrink_share_to(&state, prefix, &quota.limits, *group, keep, true).await?;
            }
        }
        let state = self.state().await?;
        let Some(quota) = state.quotas().get(prefix).cloned() else {
            return Err(internal(format!("the quota on {prefix} was removed meanwhile")));
        };
        let allotted = quota.allotted(|group| state.group(group).is_some());
        for (position, (group, record)) in records.iter_mut().enumerate().take(spanning.len()) {
            let mut allotment = counts_of(record.allotment.as_ref());
            for (kind, limit) in quota.limits.counted.iter().enumerate() {
                let Some(limit) = limit else { continue };
                let free = limit.saturating_sub(allotted[kind]);
                allotment[kind] += free / count + u64::from((position as u64) < free % count);
            }
            *record = self.raise_share(&state, prefix, &quota.limits, *group, allotment).await?;
        }
        Ok(quota_state(prefix, &quota.limits, &records))
    }

    /// `group`'s share of the quota on `prefix` ran out for `kind` (the request needed `need`
    /// more): grows it if the quota has room, taking back the other groups' unused shares
    /// first when needed. `false`: the limit is reached.
    pub(super) async fn grant(&self, group: u64, prefix: &str, kind: usize, need: u64) -> Result<bool, Status> {
        let _one_at_a_time = self.quota_changes.lock().await;
        let mut state = self.state().await?;
        let Some(mut quota) = state.quotas().get(prefix).cloned() else { return Ok(false) };
        let Some(limit) = quota.limits.counted.get(kind).copied().flatten() else { return Ok(false) };
        let mut allotted = quota.allotted(|g| state.group(g).is_some());
        if limit.saturating_sub(allotted[kind]) < need {
            for (other, share) in quota.shares.iter().filter(|(g, s)| **g != group && s.allotment[kind] > 0 && state.group(**g).is_some()) {
                if let Err(status) = self.shrink_share(&state, prefix, &quota.limits, *other, share.allotment, &[kind]).await {
                    tracing::debug!(prefix, group = other, %status, "could not take back a quota share");
                }
            }
            state = self.state().await?;
            let Some(now) = state.quotas().get(prefix).cloned() else { return Ok(false) };
            quota = now;
            allotted = quota.allotted(|g| state.group(g).is_some());
        }
        let free = limit.saturating_sub(allotted[kind]);
        if free < need {
            return Ok(false);
        }
        let spanning = spanning_groups(&state, prefix).len().max(1) as u64;
        let mut allotment = quota.shares.get(&group).map_or([0; COUNTED_KINDS], |share| share.allotment);
        allotment[kind] += need.max(free / spanning).min(free);
        self.raise_share(&state, prefix, &quota.limits, group, allotment).await?;
        Ok(true)
    }

    /// Gives `group`, about to serve `prefix`, a record (with no room) of every quota on its
    /// subtree, so it counts and refuses from its first write.
    ///
    /// A share placement lists is not proof that the group holds its record: a join whose
    /// step 2 failed (a replica that did not answer) listed it at step 1. So a listed share
    /// is kept only when the group answers its record; otherwise the group is given one
    /// again, as if it had none.
    pub(super) async fn join_quotas(&self, group: u64, prefix: &str) -> Result<(), Status> {
        let _one_at_a_time = self.quota_changes.lock().await;
        let state = self.state().await?;
        for (quota_prefix, quota) in state.quotas().iter() {
            let covers = warden_placement::is_at_or_below(prefix, quota_prefix) || warden_placement::is_strictly_below(quota_prefix, prefix);
            if !covers {
                continue;
            }
            if quota.shares.contains_key(&group) {
                let read = SetQuotaShare { prefix: quota_prefix.clone(), version: 0, ..SetQuotaShare::default() };
                // Version 0: the group has no record of this quota.
                if self.set_share_at(&state, group, read).await?.version != 0 {
                    continue;
                }
            }
            self.shrink_share(&state, quota_prefix, &quota.limits, group, [0; COUNTED_KINDS], &[0, 1, 2, 3]).await?;
        }
        Ok(())
    }

    /// The quotas and what each group serving them holds and uses (read through the groups'
    /// logs), for quotas `shown` admits.
    pub(super) async fn quota_states(&self, shown: impl Fn(&str) -> bool) -> Result<Vec<QuotaState>, Status> {
        let state = self.state().await?;
        let mut states = Vec::new();
        for (prefix, quota) in state.quotas().iter().filter(|(prefix, _)| shown(prefix)) {
            let mut records = Vec::new();
            for group in spanning_groups(&state, prefix) {
                let read = SetQuotaShare { prefix: prefix.clone(), version: 0, ..SetQuotaShare::default() };
                records.push((group, self.set_share_at(&state, group, read).await?));
            }
            states.push(quota_state(prefix, &quota.limits, &records));
        }
        Ok(states)
    }

    /// One pass of the scheduler: groups that serve part of a quota's subtree without a
    /// share (a split whose join failed) get one.
    pub(super) async fn reconcile_quotas(&self, state: &Placement) {
        for (prefix, quota) in state.quotas().iter() {
            for group in spanning_groups(state, prefix) {
                if quota.shares.contains_key(&group) {
                    continue;
                }
                let Some(info) = state.group(group) else { continue };
                if let Err(status) = self.join_quotas(group, &info.prefix).await {
                    tracing::debug!(prefix, group, %status, "could not give a group its quota share");
                }
            }
        }
    }
}
