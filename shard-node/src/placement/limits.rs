//! The cluster's apply limits on their way from placement to every group (upgrade
//! safety; `namespace/limits.rs` has what they are and why they are replicated).
//!
//! 1. Placement records them: at bootstrap (the bootstrapping binary's defaults) and on
//!    `SetLimits` (an admin's change, checked here before it is proposed, then committed
//!    with the next version).
//! 2. Each node hears the record in its heartbeat answers when placement's is newer than
//!    the one it has ([`ClusterLimits`]).
//! 3. [`spread_periodically`]: for every group the node leads whose applied record is older,
//!    it proposes the record to the group (`SetLimits`); every replica applies it at the same
//!    index. A stale proposal (an older version reaching a group after a newer one) changes
//!    nothing, so steps may repeat and race freely.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tonic::Status;
use warden_placement::{Command, Outcome, Placement, PLACEMENT_GROUP_ID};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::Command as NamespaceCommand;
use warden_proto::v1::ApplyLimits;

use super::service::{internal, PlacementService};
use warden_engine::host::NodeHandle;
use warden_namespace::limits::{merged, LimitsBoard};
use warden_namespace::Limits;

/// Groups one node brings up to date per round, at most (a change reaches 10,000 led groups
/// in a few rounds without stalling the node's other proposals).
pub const PROPOSALS_PER_ROUND_MAX: usize = 64;

/// The cluster's limits record as this node last heard it from placement.
#[derive(Default)]
pub struct ClusterLimits {
    record: Mutex<Option<ApplyLimits>>,
}

impl ClusterLimits {
    /// The version heard (0: none).
    pub fn version(&self) -> u64 {
        self.get().map_or(0, |record| record.version)
    }

    /// The record heard.
    pub fn get(&self) -> Option<ApplyLimits> {
        *self.record.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `record` if it is newer than the one heard.
    pub fn offer(&self, record: ApplyLimits) {
        let mut heard = self.record.lock().unwrap_or_else(|e| e.into_inner());
        if heard.as_ref().is_none_or(|old| old.version < record.version) {
            *heard = Some(record);
        }
    }
}

/// Step 3: every `interval`, proposes the heard record to each group this node leads whose
/// replica here applies an older one (at most [`PROPOSALS_PER_ROUND_MAX`] a round; a
/// failure is tried again next round).
pub async fn spread_periodically(node: NodeHandle, board: LimitsBoard, heard: Arc<ClusterLimits>, interval: Duration, timeout: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(record) = heard.get() else { continue };
        let behind = node
            .led_groups()
            .into_iter()
            .filter(|group| *group != PLACEMENT_GROUP_ID)
            .filter(|group| board.get(node.node_id(), *group).is_some_and(|(version, _)| version < record.version))
            .take(PROPOSALS_PER_ROUND_MAX);
        for group in behind.collect::<Vec<_>>() {
            let command =
                NamespaceCommand { now_ms: warden_engine::wall_clock::now_ms(), principal: String::new(), op: Some(CommandOp::SetLimits(record)) };
            if let Err(error) = node.propose(group, command.encode_to_vec(), timeout).await {
                tracing::debug!(group, version = record.version, %error, "could not bring the group's limits up to placement's");
            }
        }
    }
}

/// The cluster's limits record in `state` (version 0 and no field: never set).
pub fn cluster_limits(state: &Placement) -> Result<ApplyLimits, Status> {
    let record = state.apply_limits();
    let limits = ApplyLimits::decode(record.encoded.as_slice()).map_err(internal)?;
    Ok(ApplyLimits { version: record.version, ..limits })
}

/// What a bootstrap records: `defaults`' replicated limits, the shortest session TTL raised
/// to `session_ttl_ms_floor` (1.5 × the election timeout, DESIGN.md rule 6).
pub fn bootstrap_record(defaults: &Limits, session_ttl_ms_floor: u64) -> ApplyLimits {
    let mut limits = defaults.clone();
    limits.session_ttl_ms_min = limits.session_ttl_ms_min.max(session_ttl_ms_floor);
    limits.session_ttl_ms_max = limits.session_ttl_ms_max.max(limits.session_ttl_ms_min);
    limits.to_record(0)
}

impl PlacementService {
    /// Steps 1 of an admin's change: `changes` over the current record, checked as a group
    /// would check them, then committed. Answers the record with its new version.
    pub(super) async fn change_limits(&self, changes: &ApplyLimits) -> Result<ApplyLimits, Status> {
        self.ensure_leader()?;
        // Read, merge, commit: two admins' changes of different limits at once must not
        // both merge into the same record, the second committed losing the first's.
        let _one_change = self.limits_changes.lock().await;
        let current = cluster_limits(&self.state().await?)?;
        let next = ApplyLimits { version: 0, ..merged(&current, changes) };
        Limits::FIRST_RELEASE.with_record(Some(&next)).check().map_err(super::service::invalid_argument)?;
        match self.propose(&Command::SetApplyLimits { encoded: next.encode_to_vec() }).await? {
            Outcome::ApplyLimitsVersion(version) => Ok(ApplyLimits { version, ..next }),
            other => Err(internal(format!("unexpected outcome {other:?}"))),
        }
    }
}
