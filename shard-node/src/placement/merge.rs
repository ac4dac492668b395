//! Merging a group back into the group serving its parent path (docs/design/subtree-moves.md): the split in reverse, a numbered sequence the placement leader runs
//! under its lifecycle lock. T is the merging group, P the group serving T's parent path.
//!
//! 1. `MergeGroup` is committed: placement records in T the operation (an id from the group
//!    ids, so it is above every earlier split or merge) and P.
//! 2. T freezes its whole subtree, its root included (`FreezeSubtree` with `into_group`):
//!    writes answer UNAVAILABLE (retried), reads go on, no session is created in T.
//! 3. The subtree is copied: pages of T's export are ingested by P (`IngestSubtree`), which
//!    does not serve the prefix yet (it is excluded from P's descriptor), so no reader or
//!    writer at P sees them. An ephemeral of a session homed in P is P's own again.
//! 4. T hands the subtree over (`HandSubtree` with a retiring descriptor): it deletes its
//!    records and serves nothing from then on. This is the decision: from here the merge
//!    only finishes. Answers T's revision, which bounds every token T issued.
//! 5. P joins every quota on T's subtree it holds no share of (a record with no room that
//!    counts what P ingested), so its writes there count from the first; then P gets its
//!    descriptor serving the prefix, its revision raised above T's (DESIGN.md rule 5): the
//!    ingested subtree is P's own (its root rejoins its parent's children). A failed join
//!    fails the step: P must not serve a subtree it does not count.
//! 6. `RetireGroup` is committed: routers send the prefix to P. T stays, serving no path, as
//!    the home of the sessions it homes (their ids name it; every group holding one of their
//!    ephemerals, P included, asks T whether they live, DESIGN.md rule 7).
//! 7. Once T homes no session (its retiring descriptor, sent again, is refused NOT_EMPTY
//!    until then), `RemoveGroup` is committed, now or by the placement leader's periodic
//!    check; nodes destroy T's replicas once their heartbeats learn T is gone.
//!
//! Between 4 and 6 the prefix is answered WRONG_GROUP by T (and by P until 5) and routers
//! retry. If a step before 4 fails, T is told to abort (`AbortSplit`: the freeze ends), then
//! P (`AbortSplit` again: the pages it ingested are discarded), then `MergeAborted` is
//! committed; if T answers that it handed over already, the merge finishes instead. A merge
//! left half-way by a failed call or a placement leader that went away is settled the same
//! way by the next lifecycle change and the placement leader's periodic check.

use tonic::Status;
use warden_placement::{Command, GroupInfo, Merging, Outcome};
use warden_proto::namespace::{AbortSplit, FreezeSubtree, HandSubtree};
use warden_proto::placement::split_step_request::Step;
use warden_proto::placement::RemoveGroupResponse;
use warden_proto::v1::warden_error::Code;

use super::service::{busy, descriptor_proto, internal, placement_status, PlacementService};
use super::split::is_handed;
use crate::service::error_of;

/// How a merge that could not finish ended.
enum Settled {
    /// Rolled back: T serves its subtree again, P dropped what it had ingested.
    RolledBack,
    /// T had handed its subtree over: the merge finished after all.
    Finished,
}

impl PlacementService {
    /// The `MergeGroup` call: step 1, then the rest (see the module documentation).
    pub(super) async fn merge(&self, prefix: String) -> Result<RemoveGroupResponse, Status> {
        let state = self.state().await?;
        let group = state.groups().values().find(|g| g.prefix == prefix).cloned();
        let group = group.ok_or_else(|| placement_status(warden_placement::PlacementError::NoGroupAt(prefix.clone())))?;
        let parent = warden_placement::parent(&prefix).and_then(|parent| state.route(parent)).map_or(0, |parent| parent.id);
        // No replica move runs on either group meanwhile (their descriptors change here).
        if !self.running.claim(group.id) {
            return Err(busy(group.id));
        }
        if !self.running.claim(parent) {
            self.running.release(group.id);
            return Err(busy(parent));
        }
        let result = async {
            // 1.
            let merging = match self.propose(&Command::MergeGroup { prefix }).await? {
                Outcome::MergeStarted(merging) => merging,
                other => return Err(internal(format!("unexpected outcome {other:?}"))),
            };
            self.finish_or_settle_merge(&merging).await
        }
        .await;
        self.running.release(parent);
        self.running.release(group.id);
        result
    }

    /// Finishes `group`'s merge, or else settles it (rolls it back, unless T handed over
    /// already); the error of the attempt when the merge did not finish.
    pub(super) async fn finish_or_settle_merge(&self, group: &GroupInfo) -> Result<RemoveGroupResponse, Status> {
        let merging = merging_of(group)?;
        let error = match self.finish_merge(group, merging).await {
            Ok(done) => return Ok(done),
            Err(error) => error,
        };
        tracing::warn!(group = group.id, %error, "settling a merge that did not finish");
        match self.settle_failed_merge(group, merging).await {
            Ok((Settled::Finished, done)) => Ok(done),
            Ok((Settled::RolledBack, _)) => Err(error),
            Err(settling) => {
                tracing::warn!(group = group.id, %settling, "a merge could not be settled now; it stays frozen until it is");
                Err(error)
            }
        }
    }

    /// Steps 2–6. Safe to run again on a merge an earlier attempt left half-way: every step
    /// is idempotent.
    async fn finish_merge(&self, group: &GroupInfo, merging: Merging) -> Result<RemoveGroupResponse, Status> {
        let state = self.state().await?;
        let parent = state.group(merging.into).ok_or_else(|| internal(format!("merge target group {} is gone", merging.into)))?;
        // 2.
        self.fault_point(2).await?;
        let freeze = Step::Freeze(FreezeSubtree { prefix: group.prefix.clone(), target_group: merging.operation, into_group: parent.id });
        match self.split_step(&state, group, freeze).await {
            Ok(_) => {
                // 3.
                self.fault_point(3).await?;
                self.copy_subtree(&state, group, parent, &group.prefix, merging.operation).await?;
            }
            // Handed over already (by an earlier attempt): only 4's answer, 5 and 6 are left.
            Err(status) if is_handed(&status) => {}
            Err(status) => return Err(status),
        }
        self.complete_merge(group, merging).await
    }

    /// Steps 4–7: the hand-over (idempotent), P's descriptor, the route, T's removal.
    async fn complete_merge(&self, group: &GroupInfo, merging: Merging) -> Result<RemoveGroupResponse, Status> {
        let state = self.state().await?;
        let mut next = state.clone();
        next.apply(&Command::RetireGroup { group_id: group.id }).map_err(placement_status)?;
        let descriptor_of = |id: u64| next.descriptor(id).ok_or_else(|| internal(format!("group {id} has no descriptor")));
        // 4. (T's descriptor once retired: its next version, serving nothing.)
        self.fault_point(4).await?;
        let hand = Step::Hand(HandSubtree { target_group: merging.operation, descriptor: Some(descriptor_proto(&descriptor_of(group.id)?)) });
        let handed_at = self.split_step(&state, group, hand).await?;
        // 5.
        self.fault_point(5).await?;
        self.join_quotas(merging.into, &group.prefix).await?;
        self.set_descriptor_at(&state, &descriptor_of(merging.into)?, handed_at).await?;
        // 6.
        self.fault_point(6).await?;
        self.propose(&Command::RetireGroup { group_id: group.id }).await?;
        tracing::info!(group = group.id, parent = merging.into, prefix = %group.prefix, "group merged into its parent path's group");
        // 7.
        self.remove_retired(group.id).await?;
        Ok(RemoveGroupResponse { group_id: group.id, parent_group_id: merging.into })
    }

    /// Step 7: removes the retired group `group_id` if it homes no session (its retiring
    /// descriptor sent again is accepted); answers whether it is gone.
    pub(super) async fn remove_retired(&self, group_id: u64) -> Result<bool, Status> {
        let state = self.state().await?;
        let Some(descriptor) = state.group(group_id).filter(|group| group.retired).and_then(|_| state.descriptor(group_id)) else {
            return Ok(true);
        };
        match self.set_descriptor_at(&state, &descriptor, 0).await {
            Ok(_) => {}
            Err(status) if error_of(&status).is_some_and(|e| e.code == Code::NotEmpty as i32) => {
                tracing::info!(group = group_id, "a merged group is removed once the sessions it homes have ended");
                return Ok(false);
            }
            Err(status) => return Err(status),
        }
        self.propose(&Command::RemoveGroup { group_id }).await?;
        tracing::info!(group = group_id, "merged group removed");
        Ok(true)
    }

    /// Settles a merge that cannot finish now: T aborts it, P discards its pages, placement
    /// forgets it — unless T handed its subtree over already, in which case it is finished.
    /// Leaves it as it is (for a later attempt) when T or P cannot be reached.
    async fn settle_failed_merge(&self, group: &GroupInfo, merging: Merging) -> Result<(Settled, RemoveGroupResponse), Status> {
        let state = self.state().await?;
        let abort = || Step::Abort(AbortSplit { target_group: merging.operation });
        match self.split_step(&state, group, abort()).await {
            Ok(_) => {}
            Err(status) if is_handed(&status) => return self.complete_merge(group, merging).await.map(|done| (Settled::Finished, done)),
            Err(status) => return Err(status),
        }
        let parent = state.group(merging.into).ok_or_else(|| internal(format!("merge target group {} is gone", merging.into)))?;
        self.split_step(&state, parent, abort()).await?;
        self.propose(&Command::MergeAborted { group_id: group.id }).await?;
        tracing::info!(group = group.id, prefix = %group.prefix, "merge rolled back");
        Ok((Settled::RolledBack, RemoveGroupResponse::default()))
    }
}

/// The merge `group` records.
fn merging_of(group: &GroupInfo) -> Result<Merging, Status> {
    group.merging.ok_or_else(|| internal(format!("group {} is not merging", group.id)))
}
