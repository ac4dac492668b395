//! Creating a group, a sequence run by the placement leader:
//!
//! 1. `CreateGroup` is committed: placement allocates the id and picks the replicas.
//! 2. Each picked node creates its replica (`CreateReplica`, all at once); the first one
//!    campaigns. A majority is enough: a node that could not be reached creates its replica
//!    when its heartbeat hears it lacks one ([`missing_replicas`]).
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

use std::collections::HashSet;
use std::time::Duration;

use prost::Message as _;
use tonic::{Response, Status};
use warden_placement::{AppliedSettings, Command, Epoch, Outcome, Placement, PLACEMENT_GROUP_ID};
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
/// How long one node may take to create its replica of a new group (and a created replica
/// to answer whether the group has a leader) before the creation goes on without it.
const CREATE_REPLICA_TIMEOUT: Duration = Duration::from_secs(2);

impl PlacementService {
    /// Steps 2 and 3: the replicas exist and the group has a leader. Every replica is
    /// created at once, each call bounded by [`CREATE_REPLICA_TIMEOUT`], and a majority of
    /// them is enough: a node that cannot be reached now (cut off, paused, down but not yet
    /// marked so) neither holds the creation up nor fails it. It creates its replica when its
    /// next heartbeat hears that it lacks one ([`missing_replicas`]).
    pub(in crate::placement) async fn start_group(&self, group: &warden_placement::GroupInfo, state: &Placement) -> Result<(), Status> {
        let creations = group.replicas.iter().enumerate().map(|(position, replica)| async move {
            let addr = state.node(*replica).map(|n| n.addr.clone()).ok_or_else(|| internal(format!("node {replica} has no address")))?;
            let request = CreateReplicaRequest { group_id: group.id, voters: group.replicas.clone(), campaign: position == 0 };
            let mut client = PlacementClient::new(self.channel(&addr)?);
            match tokio::time::timeout(CREATE_REPLICA_TIMEOUT, client.create_replica(request)).await {
                Ok(answer) => answer.map(|_| *replica),
                Err(_) => Err(Status::deadline_exceeded(format!("node {replica} did not create its replica of group {} in time", group.id))),
            }
        });
        let mut created = Vec::new();
        let mut failures = Vec::new();
        for outcome in futures::future::join_all(creations).await {
            match outcome {
                Ok(replica) => created.push(replica),
                Err(status) => failures.push(status),
            }
        }
        let majority = group.replicas.len() / 2 + 1;
        if created.len() < majority {
            let first = failures.into_iter().next().unwrap_or_else(|| internal(format!("group {} has no replicas", group.id)));
            return Err(first);
        }
        for status in &failures {
            tracing::warn!(group = group.id, %status, "a replica of a new group was not created; its node creates it when it next heartbeats");
        }
        // A created replica answers once the group has a leader (a follower asks the leader
        // for a read index); each try goes to the next created replica.
        let deadline = tokio::time::Instant::now() + GROUP_LEADER_WAIT;
        let mut attempt = 0;
        loop {
            let replica = created[attempt % created.len()];
            attempt += 1;
            let addr = state.node(replica).map(|n| n.addr.clone()).unwrap_or_default();
            let mut client = WardenClient::new(self.channel(&addr)?);
            let sync = SyncRequest { routing: Some(Routing { group_id: group.id, ..Routing::default() }) };
            match tokio::time::timeout(CREATE_REPLICA_TIMEOUT, client.sync(sync)).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(error)) if tokio::time::Instant::now() >= deadline => return Err(error),
                Err(_) if tokio::time::Instant::now() >= deadline => {
                    return Err(Status::deadline_exceeded(format!("group {} has no leader after {GROUP_LEADER_WAIT:?}", group.id)));
                }
                Ok(Err(_)) | Err(_) => tokio::time::sleep(GROUP_LEADER_POLL).await,
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

/// Replicas `node` should have and lacks (it hosts `hosted`, a complete list): one request,
/// never campaigning, per group whose founding replicas name the node — its replica set never
/// changed (`conf_ver` initial, no learner), so the founding voters are the voters — and which
/// is neither merging nor retired. These are the replicas a creation went on without (the node
/// was cut off, paused, or its call timed out). A group whose replica set changed is left
/// alone: its node lost a replica only by a move, which placement runs and finishes itself.
/// At most `count_max` requests.
pub(in crate::placement) fn missing_replicas(state: &Placement, node: u64, hosted: &[u64], count_max: usize) -> Vec<CreateReplicaRequest> {
    let hosted: HashSet<u64> = hosted.iter().copied().collect();
    state
        .groups()
        .values()
        .filter(|group| {
            group.id != PLACEMENT_GROUP_ID
                && group.epoch.conf_ver == Epoch::INITIAL.conf_ver
                && group.learners.is_empty()
                && group.merging.is_none()
                && !group.retired
                && group.replicas.contains(&node)
                && !hosted.contains(&group.id)
        })
        .take(count_max)
        .map(|group| CreateReplicaRequest { group_id: group.id, voters: group.replicas.clone(), campaign: false })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_placement::PlacementConfig;

    /// Three nodes, the root group on all three (replicas per group: 3), and a group for `/t`.
    fn three_nodes() -> (Placement, u64) {
        let mut state = Placement::new(PlacementConfig { replicas_per_group: 3, ..PlacementConfig::default() });
        let settings = Some(AppliedSettings::of(state.config()));
        let nodes = (1..=3).map(|id| (id, format!("127.0.0.1:{id}"), String::new())).collect();
        state.apply(&Command::Bootstrap { nodes, now_ms: 1, limits: Vec::new(), settings }).expect("bootstrap");
        let group = match state.apply(&Command::CreateGroup { prefix: "/t".into(), now_ms: 2 }).expect("create /t") {
            Outcome::GroupCreated(group) => group.id,
            other => panic!("unexpected outcome {other:?}"),
        };
        (state, group)
    }

    fn groups_of(requests: &[CreateReplicaRequest]) -> Vec<u64> {
        requests.iter().map(|request| request.group_id).collect()
    }

    #[test]
    fn a_node_lacking_a_founding_replica_is_told_to_create_it_with_the_founding_voters() {
        let (state, group) = three_nodes();
        let root = state.groups().keys().copied().find(|id| *id != group && *id != PLACEMENT_GROUP_ID).expect("the root group");
        let missing = missing_replicas(&state, 3, &[root], 16);
        assert_eq!(groups_of(&missing), vec![group], "node 3 hosts the root group and lacks /t's replica");
        assert_eq!(missing[0].voters, state.group(group).expect("group").replicas, "the founding voters");
        assert!(!missing[0].campaign, "a late replica never campaigns");
        assert!(missing_replicas(&state, 3, &[root, group], 16).is_empty(), "a node hosting both lacks nothing");
        assert_eq!(missing_replicas(&state, 3, &[], 1).len(), 1, "at most count_max requests");
        assert!(missing_replicas(&state, 4, &[], 16).is_empty(), "a node no group is placed on lacks nothing");
    }

    #[test]
    fn a_group_whose_replica_set_changed_is_left_to_its_move() {
        let (mut state, group) = three_nodes();
        state.apply(&Command::RegisterNode { id: 4, addr: "127.0.0.1:4".into(), zone: String::new(), now_ms: 3 }).expect("register node 4");
        state.apply(&Command::GroupReady { group_id: group }).expect("ready");
        state.apply(&Command::AddLearner { group_id: group, node: 4 }).expect("add a learner");
        assert!(missing_replicas(&state, 3, &[], 16).iter().all(|r| r.group_id != group), "a move is under way: left to it");
        state.apply(&Command::PromoteLearner { group_id: group, node: 4, replacing: Some(3) }).expect("promote");
        assert!(!state.group(group).expect("group").replicas.contains(&3));
        assert!(missing_replicas(&state, 4, &[], 16).iter().all(|r| r.group_id != group), "a replica added by a move is made by the move");
    }
}
