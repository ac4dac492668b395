//! Removing a group: its prefix goes back to the group serving its parent path.

use tonic::Status;
use warden_placement::{Command, Outcome, Placement};
use warden_proto::placement::RemoveGroupResponse;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use super::wire::{busy, internal, placement_status, retiring_descriptor};
use super::PlacementService;
use crate::service::status;

impl PlacementService {
    /// Removes the group whose prefix is `prefix`; the caller holds `lifecycle` and leads
    /// placement. Refused while a replica move runs on the group.
    pub(super) async fn run_removal(&self, prefix: String) -> Result<RemoveGroupResponse, Status> {
        self.settle_creations().await?;
        let state = self.state().await?;
        let Some(group) = state.groups().values().find(|g| g.prefix == prefix).cloned() else {
            return Err(status(WardenError {
                code: Code::NoNode as i32,
                path: prefix.clone(),
                message: format!("no group has the prefix {prefix}"),
                ..WardenError::default()
            }));
        };
        if !self.running.claim(group.id) {
            return Err(busy(group.id));
        }
        let removed = self.remove_claimed(&state, &group).await;
        self.running.release(group.id);
        removed
    }

    /// Removes `group` (claimed by the caller, so no replica move runs on it), a sequence
    /// that can be run again from the start if any step fails (each step is idempotent):
    ///
    /// 1. Placement as it will be once the group is removed gives the descriptors (and
    ///    refuses here the root group, a group not ready, a move in flight).
    /// 2. The group retires: it serves nothing from then on (refused NOT_EMPTY while its
    ///    prefix node has children or sessions are homed in it). Its revision then bounds
    ///    every fencing token it issued.
    /// 3. The group serving the parent path takes the prefix back, its revision first raised
    ///    above the retired group's (tokens never go backwards, DESIGN.md rule 5).
    /// 4. `RemoveGroup` is committed: the route is gone.
    /// 5. The nodes destroy their replicas when their heartbeats learn placement no longer
    ///    has the group.
    ///
    /// Between 2 and 4 requests for the prefix are answered WRONG_GROUP (routers retry).
    async fn remove_claimed(&self, state: &Placement, group: &warden_placement::GroupInfo) -> Result<RemoveGroupResponse, Status> {
        // 1.
        let mut next = state.clone();
        let gainers = match next.apply(&Command::RemoveGroup { group_id: group.id }).map_err(placement_status)? {
            Outcome::GroupRemoved { bumped, .. } => bumped,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        // 2.
        let retired_at = self.set_descriptor_at(state, &retiring_descriptor(state, group.id)?, 0).await?;
        // 3.
        for gainer in &gainers {
            let descriptor = next.descriptor(gainer.id).ok_or_else(|| internal(format!("group {} has no descriptor", gainer.id)))?;
            self.set_descriptor_at(state, &descriptor, retired_at).await?;
        }
        // 4.
        self.propose(&Command::RemoveGroup { group_id: group.id }).await?;
        tracing::info!(group = group.id, prefix = %group.prefix, "group removed");
        let parent_group_id = next.route(&group.prefix).map_or(0, |parent| parent.id);
        Ok(RemoveGroupResponse { group_id: group.id, parent_group_id })
    }
}
