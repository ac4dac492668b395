//! Splitting a live subtree into a new group (docs/design/subtree-moves.md), a numbered sequence the placement leader runs under its lifecycle lock:
//!
//! 1. `SplitGroup` is committed: placement allocates the target group T and its replicas,
//!    recording the source S (the group serving the prefix now).
//! 2. T's replicas exist and T has a leader (as for any new group).
//! 3. S freezes the subtree (`FreezeSubtree`): its writes answer UNAVAILABLE (retried by
//!    routers and clients inside their deadline), reads go on. Nothing in it changes after.
//! 4. The subtree is copied: pages of S's export (read at S's leader) are proposed to T
//!    (`IngestSubtree`), which records the owners of moved ephemerals as remote sessions.
//! 5. S hands the subtree over (`HandSubtree`): it deletes its records and serves its new
//!    descriptor (excluding the prefix). This is the decision: from here the split only
//!    finishes. Answers S's revision, which bounds every token issued in the subtree.
//! 6. T joins every quota on its subtree (a record with no room counting what it ingested;
//!    a failed join fails the step), then gets its descriptor, its revision raised above
//!    S's (DESIGN.md rule 5).
//! 7. `GroupReady` is committed: routers send the prefix to T.
//!
//! Between 5 and 7 the prefix is answered WRONG_GROUP by S and routers retry. If any step
//! before 5 fails, S is told to abort (`AbortSplit`: the freeze ends, and any late step of
//! this split is refused), then placement drops T (`DropGroup`) and S gets its descriptor
//! again; if S answers that it handed the subtree over already, the split finishes instead.
//! A split left half-way by a failed call or a placement leader that went away is settled
//! the same way by the next creation or the placement leader's periodic check. S's log
//! orders the hand-over and the abort, so exactly one of them happens.

use tonic::Status;
use warden_placement::{Command, GroupInfo, Outcome, Placement};
use warden_proto::namespace::{AbortSplit, ExportSubtree, FreezeSubtree, HandSubtree, IngestSubtree};
use warden_proto::placement::split_step_request::Step;
use warden_proto::placement::{ExportSubtreeRequest, SplitStepRequest};
use warden_proto::v1::warden_error::Code;

use super::service::{busy, descriptor_proto, internal, placement_status, PlacementService};
use crate::service::error_of;
use warden_namespace::split::EXPORT_PAGE_BYTES_MAX;

/// How often a split held by fault injection looks whether it may go on.
pub(super) const FAULT_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// How a split that could not finish ended.
enum Settled {
    /// Rolled back: S serves the subtree again, T is dropped.
    RolledBack,
    /// S had handed the subtree over: the split finished after all.
    Finished,
}

impl PlacementService {
    /// Steps 2–7 for `group`, committed as a split (step 1). Safe to run again on a split an
    /// earlier attempt left half-way: every step is idempotent.
    pub(super) async fn finish_split(&self, group: &GroupInfo) -> Result<(), Status> {
        let source = group.split_from.ok_or_else(|| internal(format!("group {} is not a split", group.id)))?;
        let state = self.state().await?;
        let source_group = state.group(source).ok_or_else(|| internal(format!("split source group {source} is gone")))?;
        // 2.
        self.start_group(group, &state).await?;
        // 3.
        self.fault_point(3).await?;
        let freeze = Step::Freeze(FreezeSubtree { prefix: group.prefix.clone(), target_group: group.id, into_group: 0 });
        match self.split_step(&state, source_group, freeze).await {
            Ok(_) => {
                // 4.
                self.fault_point(4).await?;
                self.copy_subtree(&state, source_group, group, &group.prefix, group.id).await?;
            }
            // Handed over already (by an earlier attempt): only 5's answer, 6 and 7 are left.
            Err(status) if is_handed(&status) => {}
            Err(status) => return Err(status),
        }
        self.complete_split(group).await
    }

    /// Steps 5–7: the hand-over (idempotent), T's descriptor, the route.
    async fn complete_split(&self, group: &GroupInfo) -> Result<(), Status> {
        let state = self.state().await?;
        let source = group.split_from.and_then(|id| state.group(id)).ok_or_else(|| internal(format!("group {} has no split source", group.id)))?;
        let mut next = state.clone();
        next.apply(&Command::GroupReady { group_id: group.id }).map_err(placement_status)?;
        let descriptor_of = |id: u64| next.descriptor(id).ok_or_else(|| internal(format!("group {id} has no descriptor")));
        // 5.
        self.fault_point(5).await?;
        let hand = Step::Hand(HandSubtree { target_group: group.id, descriptor: Some(descriptor_proto(&descriptor_of(source.id)?)) });
        let handed_at = self.split_step(&state, source, hand).await?;
        // 6. The new group counts under the quotas on its subtree before it serves: a failed
        // join fails the step (the split is finished by the next attempt), since a group
        // serving without its share would write past the quotas uncounted.
        self.fault_point(6).await?;
        self.join_quotas(group.id, &group.prefix).await?;
        self.set_descriptor_at(&state, &descriptor_of(group.id)?, handed_at).await?;
        // 7.
        self.fault_point(7).await?;
        self.propose(&Command::GroupReady { group_id: group.id }).await?;
        tracing::info!(group = group.id, source = source.id, prefix = %group.prefix, "subtree split into its own group");
        Ok(())
    }

    /// Fault injection (tests): waits while splits (and merges) are held before `step`, so a
    /// test can crash a participant exactly there; fails the step when set to fail there.
    pub(super) async fn fault_point(&self, step: u8) -> Result<(), Status> {
        while self.faults.split_held(step) {
            tokio::time::sleep(FAULT_POLL).await;
        }
        match self.faults.split_fails(step) {
            true => Err(internal(format!("step {step} of the split failed (fault injection)"))),
            false => Ok(()),
        }
    }

    /// Step 4 (and a merge's copy): every page of the export of `prefix` frozen at `source`
    /// for `operation`, in order, ingested by `target`.
    pub(super) async fn copy_subtree(
        &self,
        state: &Placement,
        source: &GroupInfo,
        target: &GroupInfo,
        prefix: &str,
        operation: u64,
    ) -> Result<(), Status> {
        let mut after_key = Vec::new();
        loop {
            let export =
                ExportSubtree { prefix: prefix.to_string(), target_group: operation, after_key: after_key.clone(), bytes_max: EXPORT_PAGE_BYTES_MAX };
            let request = ExportSubtreeRequest { group_id: source.id, export: Some(export) };
            let page = self
                .at_group_leader(state, source, |mut client| {
                    let request = request.clone();
                    async move { client.export_subtree(request).await }
                })
                .await?
                .page
                .unwrap_or_default();
            if !page.records.is_empty() {
                let ingest = Step::Ingest(IngestSubtree {
                    prefix: prefix.to_string(),
                    source_group: source.id,
                    records: page.records,
                    operation,
                    sessions: page.sessions,
                });
                self.split_step(state, target, ingest).await?;
            }
            if page.next_after_key.is_empty() {
                return Ok(());
            }
            after_key = page.next_after_key;
        }
    }

    /// Proposes one split (or merge) step at `group`'s leader; answers the group's revision
    /// after it.
    pub(super) async fn split_step(&self, state: &Placement, group: &GroupInfo, step: Step) -> Result<u64, Status> {
        let request = SplitStepRequest { group_id: group.id, step: Some(step) };
        let answer = self
            .at_group_leader(state, group, |mut client| {
                let request = request.clone();
                async move { client.split_step(request).await }
            })
            .await?;
        Ok(answer.revision)
    }

    /// Settles a split that cannot finish now: S aborts it and T is dropped — unless S
    /// handed the subtree over already, in which case it is finished. Leaves it as it is
    /// (for a later attempt) when S cannot be reached.
    async fn settle_failed_split(&self, group: &GroupInfo) -> Result<Settled, Status> {
        let state = self.state().await?;
        let source = group.split_from.and_then(|id| state.group(id)).ok_or_else(|| internal(format!("group {} has no split source", group.id)))?;
        match self.split_step(&state, source, Step::Abort(AbortSplit { target_group: group.id })).await {
            Ok(_) => {
                self.roll_back(group.id).await;
                Ok(Settled::RolledBack)
            }
            Err(status) if is_handed(&status) => self.complete_split(group).await.map(|()| Settled::Finished),
            Err(status) => Err(status),
        }
    }

    /// Finishes `group`'s split, or else settles it ([`Self::settle_failed_split`]); the
    /// error of the attempt when the split did not finish.
    pub(super) async fn finish_or_settle_split(&self, group: &GroupInfo) -> Result<(), Status> {
        let Err(error) = self.finish_split(group).await else { return Ok(()) };
        tracing::warn!(group = group.id, %error, "settling a split that did not finish");
        match self.settle_failed_split(group).await {
            Ok(Settled::Finished) => Ok(()),
            Ok(Settled::RolledBack) => Err(error),
            Err(settling) => {
                tracing::warn!(group = group.id, %settling, "a split could not be settled now; it stays frozen until it is");
                Err(error)
            }
        }
    }

    /// The `SplitGroup` call: step 1, then the rest (see the module documentation). A prefix
    /// the source may not give away (`namespace::split::check_movable`) is refused before
    /// anything is created; the source's freeze checks it again, authoritatively.
    pub(super) async fn split(&self, prefix: String) -> Result<GroupInfo, Status> {
        let state = self.state().await?;
        let source = state.route(&prefix).cloned().ok_or_else(|| internal(format!("no group serves {prefix}")))?;
        let probe = ExportSubtree { prefix: prefix.clone(), target_group: 0, after_key: Vec::new(), bytes_max: 0 };
        let request = ExportSubtreeRequest { group_id: source.id, export: Some(probe) };
        self.at_group_leader(&state, &source, |mut client| {
            let request = request.clone();
            async move { client.export_subtree(request).await }
        })
        .await?;
        // No replica move runs on the source meanwhile (its descriptor changes only here).
        if !self.running.claim(source.id) {
            return Err(busy(source.id));
        }
        let result = async {
            let group = match self.propose(&Command::SplitGroup { prefix, now_ms: super::service::now_ms() }).await? {
                Outcome::GroupCreated(group) => group,
                other => return Err(internal(format!("unexpected outcome {other:?}"))),
            };
            self.finish_or_settle_split(&group).await.map(|()| group)
        }
        .await;
        self.running.release(source.id);
        result
    }
}

/// Whether a refused split step says the subtree was handed over already.
pub(super) fn is_handed(status: &Status) -> bool {
    error_of(status).is_some_and(|e| e.code == Code::NodeExists as i32)
}
