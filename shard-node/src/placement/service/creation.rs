//! Creating a group, a sequence run by the placement leader:
//!
//! 1. `CreateGroup` is committed: placement allocates the id and picks the replicas.
//! 2. Each picked node creates its replica (`CreateReplica`); the first one campaigns.
//! 3. The group answers a linearizable `Sync`: it has a leader.
//! 4. The new group gets its descriptor (creating its prefix node), then each group giving
//!    paths away gets its new one (`SetDescriptor`, refused if it holds nodes there) — both
//!    as placement will compute them once the group is ready — and last the new group's
//!    revision is raised above the givers' (fencing tokens never go backwards).
//! 5. `GroupReady` is committed: the route exists from now on.
//!
//! The leader runs one such sequence at a time. If 2–5 fail, the group is rolled back:
//! `DropGroup` forgets it and gives the groups it carved paths out of a newer descriptor
//! (replicas already made stay idle on their nodes; nothing routes to them). A creation left
//! half-way (the call failed before its rollback, or the leader went away) is resumed, or
//! else rolled back, before the next creation and periodically by the placement leader.
//! Between 4 and 5 a request for the prefix may be answered WRONG_GROUP by the old owner
//! while the route is not yet committed: routers retry.
//!
//! Bootstrapping a cluster creates its root group by steps 2–4 of the same sequence.

use std::time::Duration;

use prost::Message as _;
use tonic::{Response, Status};
use warden_placement::{AppliedSettings, Command, Outcome, Placement};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{CreateGroupResponse, CreateReplicaRequest, GroupEntry};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{Routing, SyncRequest};

use super::wire::{descriptor_proto, internal, now_ms, placement_status};
use super::PlacementService;

/// How long a new group may take to elect its first leader.
const GROUP_LEADER_WAIT: Duration = Duration::from_secs(10);
/// Pause between checks for that leader.
const GROUP_LEADER_POLL: Duration = Duration::from_millis(50);

impl PlacementService {
    /// Steps 2 and 3: the replicas exist and the group has a leader.
    pub(in crate::placement) async fn start_group(&self, group: &warden_placement::GroupInfo, state: &Placement) -> Result<(), Status> {
        for (position, replica) in group.replicas.iter().enumerate() {
            let addr = state.node(*replica).map(|n| n.addr.clone()).ok_or_else(|| internal(format!("node {replica} has no address")))?;
            let request = CreateReplicaRequest { group_id: group.id, voters: group.replicas.clone(), campaign: position == 0 };
            let mut client = PlacementClient::new(self.channel(&addr)?);
            client.create_replica(request).await?;
        }
        let first = state.node(group.replicas[0]).map(|n| n.addr.clone()).unwrap_or_default();
        let mut client = WardenClient::new(self.channel(&first)?);
        let deadline = tokio::time::Instant::now() + GROUP_LEADER_WAIT;
        loop {
            let sync = SyncRequest { routing: Some(Routing { group_id: group.id, ..Routing::default() }) };
            match client.sync(sync).await {
                Ok(_) => return Ok(()),
                Err(error) if tokio::time::Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(GROUP_LEADER_POLL).await,
            }
        }
    }

    /// Steps 2–5 for a group placement has committed as creating. Safe to run again on a
    /// group an earlier attempt left half-way: every step is idempotent.
    async fn finish_creation(&self, group: &warden_placement::GroupInfo) -> Result<(), Status> {
        let state = self.state().await?;
        self.start_group(group, &state).await?;
        self.hand_over(group, &state).await?;
        self.propose(&Command::GroupReady { group_id: group.id }).await?;
        Ok(())
    }

    /// Forgets a creation that failed, and gives the groups it would have carved paths out
    /// of their descriptor again (a newer version, which replaces any the failed hand-over
    /// delivered), so they serve those paths again. Best effort: failures are logged, and
    /// a group still excluding the prefix answers WRONG_GROUP (never serves it twice).
    pub(in crate::placement) async fn roll_back(&self, group_id: u64) {
        let bumped = match self.propose(&Command::DropGroup { group_id }).await {
            Ok(Outcome::GroupDropped { bumped, .. }) => bumped,
            Ok(other) => return tracing::warn!(group = group_id, ?other, "unexpected outcome of dropping a group"),
            Err(error) => return tracing::warn!(group = group_id, %error, "could not drop a group whose creation failed"),
        };
        let state = match self.state().await {
            Ok(state) => state,
            Err(error) => return tracing::warn!(group = group_id, %error, "could not read placement to roll a creation back"),
        };
        for giver in bumped {
            let Some(descriptor) = state.descriptor(giver.id) else { continue };
            if let Err(error) = self.set_descriptor_at(&state, &descriptor, 0).await {
                tracing::warn!(group = giver.id, %error, "could not give a group its paths back after a failed creation");
            }
        }
    }

    /// Finishes, or else rolls back, every group placement records as being created. The
    /// caller holds `lifecycle`, so none of them is being created by this node right now.
    pub(in crate::placement) async fn settle_creations(&self) -> Result<(), Status> {
        let state = self.state().await?;
        for group in state.groups().values().filter(|g| g.merging.is_some()) {
            tracing::info!(group = group.id, prefix = %group.prefix, "resuming a merge left half-way");
            // Rolled back or not settled yet (then placement refuses other changes): logged.
            if let Err(error) = self.finish_or_settle_merge(group).await {
                tracing::warn!(group = group.id, %error, "a merge left half-way did not finish");
            }
        }
        for group in state.groups().values().filter(|g| g.retired) {
            if let Err(error) = self.remove_retired(group.id).await {
                tracing::debug!(group = group.id, %error, "could not remove a merged group now");
            }
        }
        for group in state.groups().values().filter(|g| !g.ready) {
            tracing::info!(group = group.id, prefix = %group.prefix, "resuming a group creation left half-way");
            if group.split_from.is_some() {
                self.finish_or_settle_split(group).await?;
                continue;
            }
            if let Err(error) = self.finish_creation(group).await {
                tracing::warn!(group = group.id, %error, "rolling back a group creation that cannot be finished");
                self.roll_back(group.id).await;
            }
        }
        Ok(())
    }

    /// While this node leads the placement group, settles creations left half-way (by a
    /// call that failed mid-way or a leader that went away) every `interval`, so no prefix
    /// stays unserved. Runs until the runtime stops.
    pub async fn settle_creations_periodically(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            // A creation in progress here settles what it finds itself.
            let Ok(_lifecycle) = self.lifecycle.try_lock() else { continue };
            if self.ensure_leader().is_err() {
                continue;
            }
            if let Err(error) = self.settle_creations().await {
                tracing::debug!(%error, "could not settle group creations");
            }
        }
    }

    /// Step 4: the descriptors placement will have once `group` is ready, new group first,
    /// then each group giving paths away; last the new group's revision is raised above every
    /// revision those groups reached when they stopped serving the paths, so a fencing token
    /// of a moved path never goes backwards (DESIGN.md rule 5). Safe to run again: a group
    /// accepts the descriptor it already has.
    async fn hand_over(&self, group: &warden_placement::GroupInfo, state: &Placement) -> Result<(), Status> {
        let mut next = state.clone();
        let bumped = match next.apply(&Command::GroupReady { group_id: group.id }).map_err(placement_status)? {
            Outcome::GroupReady { bumped, .. } => bumped,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        let descriptor_of = |id: u64| next.descriptor(id).ok_or_else(|| internal(format!("group {id} has no descriptor")));
        let new = descriptor_of(group.id)?;
        self.set_descriptor_at(state, &new, 0).await?;
        let mut floor = 0;
        for giver in &bumped {
            floor = floor.max(self.set_descriptor_at(state, &descriptor_of(giver.id)?, 0).await?);
        }
        self.set_descriptor_at(state, &new, floor).await?;
        Ok(())
    }

    /// Creates a group serving `prefix` (steps 1–5), rolled back if it cannot finish; the
    /// caller holds `lifecycle` and leads placement.
    pub(super) async fn run_creation(&self, prefix: String) -> Result<Response<CreateGroupResponse>, Status> {
        // A creation an earlier call (or an earlier leader) left half-way is finished or
        // rolled back first, so its prefix is not lost and it cannot race with this one.
        self.settle_creations().await?;
        let group = match self.propose(&Command::CreateGroup { prefix, now_ms: now_ms() }).await? {
            Outcome::GroupCreated(group) => group,
            other => return Err(internal(format!("unexpected outcome {other:?}"))),
        };
        if let Err(error) = self.finish_creation(&group).await {
            self.roll_back(group.id).await;
            return Err(error);
        }
        self.created(group.id).await
    }

    /// Bootstraps placement with the nodes of this node's directory and starts the root
    /// group (steps 2–4; the root group is ready from its first command).
    pub(super) async fn bootstrap_root(&self) -> Result<GroupEntry, Status> {
        let nodes =
            self.directory.ids().into_iter().filter_map(|id| self.directory.get(id).map(|addr| (id, addr.to_string(), String::new()))).collect();
        let limits =
            if self.bootstrap_limits == warden_proto::v1::ApplyLimits::default() { Vec::new() } else { self.bootstrap_limits.encode_to_vec() };
        let root =
            match self.propose(&Command::Bootstrap { nodes, now_ms: now_ms(), limits, settings: Some(AppliedSettings::of(&self.config)) }).await? {
                Outcome::Bootstrapped(root) => root,
                other => return Err(internal(format!("unexpected outcome {other:?}"))),
            };
        let state = self.state().await?;
        self.start_group(&root, &state).await?;
        let descriptor = state.descriptor(root.id).ok_or_else(|| internal("the root group has no descriptor"))?;
        self.set_descriptor_at(&state, &descriptor, 0).await?;
        Ok(GroupEntry { descriptor: Some(descriptor_proto(&descriptor)), ready: true, learners: Vec::new(), merging_into: 0, retired: false })
    }

    /// The answer to a group creation or split: the group as placement has it now.
    pub(super) async fn created(&self, group_id: u64) -> Result<Response<CreateGroupResponse>, Status> {
        let state = self.state().await?;
        let entry = state.descriptor(group_id).map(|d| GroupEntry {
            descriptor: Some(descriptor_proto(&d)),
            ready: state.group(group_id).is_some_and(|g| g.ready),
            learners: Vec::new(),
            merging_into: 0,
            retired: false,
        });
        Ok(Response::new(CreateGroupResponse { group: entry, routing_version: state.routing_version() }))
    }
}
