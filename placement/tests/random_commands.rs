//! Random command sequences against the placement invariants: refusals change nothing, the
//! routing table only names ready groups with unique prefixes, `/` stays routed, every path
//! has exactly one serving group (the one `route` names), epochs grow whenever what a group
//! serves changes, `routing_version` grows by one exactly when routing state changes, and a
//! snapshot taken at any point restores to the same state and continues identically.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use warden_placement::{is_strictly_below, serves, Acl, AppliedSettings, Command, GroupInfo, NodeState, Placement, PlacementConfig, ROOT_GROUP_ID};

/// One step of a run; times are filled in from a clock that moves forward.
#[derive(Debug, Clone)]
enum Op {
    /// A command as generated (its `now_ms` is replaced by the clock).
    Apply(Command),
    /// What the placement leader would propose: `MarkDown` of `nodes_to_mark_down(now)`.
    MarkDownDue,
    /// A heartbeat from every registered node.
    HeartbeatAll,
    /// `GroupReady` of the n-th (modulo) group being created, if any.
    ReadyNth(usize),
}

const SEGMENTS: [&str; 3] = ["a", "b", "ab"];
const ZONES: [&str; 4] = ["a", "b", "c", ""];

/// Valid prefixes up to three segments from [`SEGMENTS`] (so `/a`, `/ab`, `/a/b`, …).
fn valid_prefixes() -> Vec<String> {
    let mut prefixes = vec![String::new()];
    let mut all = Vec::new();
    for _ in 0..3 {
        prefixes = prefixes.iter().flat_map(|prefix| SEGMENTS.iter().map(move |segment| format!("{prefix}/{segment}"))).collect();
        all.extend(prefixes.iter().cloned());
    }
    all
}

/// Paths to check ownership of: the root, every prefix, and a child of each.
fn probe_paths() -> Vec<String> {
    let mut paths = vec!["/".to_string(), "/x".to_string()];
    for prefix in valid_prefixes() {
        paths.push(format!("{prefix}/x"));
        paths.push(prefix);
    }
    paths
}

fn node_id() -> impl Strategy<Value = u64> {
    0u64..=8
}

fn op() -> impl Strategy<Value = Op> {
    let mut prefixes = valid_prefixes();
    prefixes.extend(["/", "a", "/a/", "/a//b", "/a/.."].map(String::from));
    let zone = prop::sample::select(ZONES.to_vec()).prop_map(String::from);
    let addr = prop::sample::select(vec!["h1:1", "h2:1", ""]).prop_map(String::from);
    let bootstrap_node = (node_id(), addr.clone(), zone.clone());
    prop_oneof![
        1 => prop::collection::vec(bootstrap_node, 0..7).prop_map(|nodes| Op::Apply(Command::Bootstrap { nodes, now_ms: 0, limits: Vec::new(), settings: Some(AppliedSettings::of(&config())) })),
        2 => (node_id(), addr, zone).prop_map(|(id, addr, zone)| Op::Apply(Command::RegisterNode { id, addr, zone, now_ms: 0 })),
        3 => prop::collection::vec(node_id(), 0..4).prop_map(|ids| Op::Apply(Command::Heartbeat { ids, now_ms: 0 })),
        1 => prop::collection::vec(node_id(), 0..4).prop_map(|ids| Op::Apply(Command::MarkDown { ids, now_ms: 0 })),
        2 => Just(Op::MarkDownDue),
        4 => Just(Op::HeartbeatAll),
        4 => any::<usize>().prop_map(Op::ReadyNth),
        4 => prop::sample::select(prefixes.clone()).prop_map(|prefix| Op::Apply(Command::CreateGroup { prefix, now_ms: 0 })),
        2 => prop::sample::select(prefixes.clone()).prop_map(|prefix| Op::Apply(Command::SplitGroup { prefix, now_ms: 0 })),
        2 => prop::sample::select(prefixes.clone()).prop_map(|prefix| Op::Apply(Command::MergeGroup { prefix })),
        1 => (prop::sample::select(prefixes), prop::sample::select(vec!["alice", "group:ops", "", "a b"]), 0u32..40, any::<bool>())
            .prop_map(|(prefix, who, permissions, revoke)| Op::Apply(Command::ChangeAcl { prefix, principal: who.into(), permissions, revoke })),
        1 => (prop::sample::select(vec!["ops", "", "group:x"]), any::<bool>())
            .prop_map(|(group, remove)| Op::Apply(Command::ChangeAclGroup { group: group.into(), principal: "alice".into(), remove })),
        1 => (0u64..16).prop_map(|group_id| Op::Apply(Command::MergeAborted { group_id })),
        1 => (0u64..16).prop_map(|group_id| Op::Apply(Command::RetireGroup { group_id })),
        4 => (0u64..16).prop_map(|group_id| Op::Apply(Command::GroupReady { group_id })),
        1 => (0u64..16).prop_map(|group_id| Op::Apply(Command::DropGroup { group_id })),
        2 => (node_id(), prop::sample::select(vec![NodeState::Serving, NodeState::Draining, NodeState::Decommissioning, NodeState::Tombstone]))
            .prop_map(|(id, state)| Op::Apply(Command::SetNodeState { id, state })),
        1 => any::<bool>().prop_map(|paused| Op::Apply(Command::SetSchedulerPaused { paused })),
        // Limits records up to past their size limit (the longest are refused).
        1 => prop::sample::select(vec![0usize, 12, 4096, 4097]).prop_map(|len| Op::Apply(Command::SetApplyLimits { encoded: vec![7; len] })),
        3 => (0u64..16, node_id()).prop_map(|(group_id, node)| Op::Apply(Command::AddLearner { group_id, node })),
        3 => (0u64..16, node_id(), prop::option::of(node_id())).prop_map(|(group_id, node, replacing)| Op::Apply(Command::PromoteLearner { group_id, node, replacing })),
        1 => (0u64..16, node_id()).prop_map(|(group_id, node)| Op::Apply(Command::RemoveLearner { group_id, node })),
        1 => (0u64..16).prop_map(|group_id| Op::Apply(Command::RemoveGroup { group_id })),
    ]
}

/// Steps with the time (ms) each one happens at.
fn run() -> impl Strategy<Value = Vec<(Op, u64)>> {
    let first = prop::collection::btree_map(1u64..=7, prop::sample::select(ZONES.to_vec()), 1..7).prop_map(|nodes| {
        let nodes = nodes.into_iter().map(|(id, zone)| (id, format!("n{id}:1"), zone.to_string())).collect();
        Op::Apply(Command::Bootstrap { nodes, now_ms: 0, limits: Vec::new(), settings: Some(AppliedSettings::of(&config())) })
    });
    (first, prop::collection::vec((op(), 0u64..2_000), 0..80)).prop_map(|(first, rest)| {
        let mut now = 0;
        let mut steps = vec![(first, 0)];
        for (op, step_ms) in rest {
            now += step_ms;
            steps.push((op, now));
        }
        steps
    })
}

/// The command `op` becomes at `now_ms` on `placement`.
fn command(placement: &Placement, op: &Op, now_ms: u64) -> Command {
    let mut command = match op {
        Op::Apply(command) => command.clone(),
        Op::MarkDownDue => Command::MarkDown { ids: placement.nodes_to_mark_down(now_ms), now_ms },
        Op::HeartbeatAll => Command::Heartbeat { ids: placement.nodes().keys().copied().collect(), now_ms },
        Op::ReadyNth(n) => {
            let creating: Vec<u64> = placement.groups().values().filter(|group| !group.ready).map(|group| group.id).collect();
            let group_id = if creating.is_empty() { 0 } else { creating[n % creating.len()] };
            Command::GroupReady { group_id }
        }
    };
    match &mut command {
        Command::Bootstrap { now_ms: time, .. }
        | Command::RegisterNode { now_ms: time, .. }
        | Command::Heartbeat { now_ms: time, .. }
        | Command::MarkDown { now_ms: time, .. }
        | Command::CreateGroup { now_ms: time, .. }
        | Command::SplitGroup { now_ms: time, .. } => *time = now_ms,
        Command::GroupReady { .. }
        | Command::DropGroup { .. }
        | Command::SetNodeState { .. }
        | Command::SetSchedulerPaused { .. }
        | Command::AddLearner { .. }
        | Command::PromoteLearner { .. }
        | Command::RemoveLearner { .. }
        | Command::RemoveGroup { .. }
        | Command::MergeGroup { .. }
        | Command::MergeAborted { .. }
        | Command::ChangeAcl { .. }
        | Command::ChangeAclGroup { .. }
        | Command::SetQuota { .. }
        | Command::BumpQuotaShare { .. }
        | Command::RaiseQuotaShare { .. }
        | Command::LowerQuotaShare { .. }
        | Command::SetApplyLimits { .. }
        | Command::SetEtcdAuth { .. }
        | Command::RetireGroup { .. } => {}
    }
    command
}

/// Everything but liveness timestamps: what `routing_version` versions.
type RoutingView = (BTreeMap<u64, (String, String, bool, NodeState)>, BTreeMap<u64, GroupInfo>, BTreeMap<String, u64>, u64, bool, Acl);

fn routing_view(placement: &Placement) -> RoutingView {
    let nodes = placement.nodes().iter().map(|(id, node)| (*id, (node.addr.clone(), node.zone.clone(), node.up, node.state))).collect();
    (nodes, placement.groups().clone(), placement.routes().clone(), placement.next_group_id(), placement.scheduler_paused(), placement.acl().clone())
}

fn config() -> PlacementConfig {
    PlacementConfig { replicas_per_group: 3, heartbeat_timeout_ms: 10_000, ..PlacementConfig::default() }
}

/// Checks every invariant of `after`, reached from `before` by `command` with `result`.
fn check_step(before: &Placement, after: &Placement, command: &Command, accepted: bool) -> Result<(), TestCaseError> {
    if !accepted {
        prop_assert_eq!(before, after, "refused {:?} changed the state", command);
        return Ok(());
    }
    prop_assert_eq!(after.check_invariants(), Ok(()));

    // Prefixes unique; routes only to ready groups, and every ready group routed.
    let prefixes: BTreeSet<&str> = after.groups().values().map(|group| group.prefix.as_str()).collect();
    prop_assert_eq!(prefixes.len(), after.groups().len());
    for (prefix, id) in after.routes() {
        let group = &after.groups()[id];
        prop_assert!(group.ready && &group.prefix == prefix);
    }

    if after.is_bootstrapped() {
        prop_assert_eq!(after.route("/").map(|group| group.id), Some(ROOT_GROUP_ID));
        // Exactly one ready group serves each path: the one `route` names.
        let descriptors: Vec<_> =
            after.groups().values().filter(|group| group.ready && !group.retired).filter_map(|group| after.descriptor(group.id)).collect();
        // A retired group (merged away, kept only as its sessions' home) is unrouted and
        // serves nothing: its one exclusion is its own prefix.
        for group in after.groups().values().filter(|group| group.retired) {
            prop_assert!(!after.routes().values().any(|id| *id == group.id), "retired group {} routed", group.id);
            prop_assert_eq!(after.descriptor(group.id).map(|d| d.excluded), Some(vec![group.prefix.clone()]));
        }
        // Descriptors list only the immediate carve-outs: ready prefixes, none below another.
        for descriptor in &descriptors {
            for excluded in &descriptor.excluded {
                prop_assert!(after.routes().contains_key(excluded));
                prop_assert!(is_strictly_below(excluded, &descriptor.prefix));
                prop_assert!(!descriptor.excluded.iter().any(|other| is_strictly_below(excluded, other)));
            }
        }
        for path in probe_paths() {
            let owners: Vec<u64> = descriptors.iter().filter(|d| serves(d, &path)).map(|d| d.id).collect();
            let routed = after.route(&path).map(|group| group.id);
            prop_assert_eq!(owners.clone(), routed.into_iter().collect::<Vec<_>>(), "path {}", path);
            prop_assert_eq!(owners.len(), 1, "path {}", path);
        }
    }

    // Epochs never go back, and grow whenever what a group serves changes.
    for (id, old) in before.groups() {
        let Some(new) = after.groups().get(id) else { continue };
        prop_assert!(new.epoch == old.epoch || new.epoch.is_newer_than(&old.epoch));
        let served = |placement: &Placement| placement.descriptor(*id).map(|d| (d.prefix, d.excluded));
        if served(before) != served(after) {
            prop_assert!(new.epoch.is_newer_than(&old.epoch), "group {} changed without an epoch bump", id);
        }
    }

    // Only MarkDown takes a node down (and a decommission ending), and only one silent for
    // the timeout at its time; a tombstone hosts nothing and stays one.
    for (id, old) in before.nodes() {
        let new = &after.nodes()[id];
        if old.state == NodeState::Tombstone {
            prop_assert_eq!(old, new);
        }
        if new.state == NodeState::Tombstone {
            prop_assert!(!after.groups().values().any(|group| group.has_member(*id)));
        }
        if old.up && !new.up && new.state != NodeState::Tombstone {
            let Command::MarkDown { now_ms, .. } = command else { return Err(TestCaseError::fail(format!("{command:?} took {id} down"))) };
            prop_assert!(old.last_heartbeat_ms + after.config().heartbeat_timeout_ms <= *now_ms);
        }
    }

    // routing_version grows by one exactly when something other than a timestamp changed.
    let changed = routing_view(before) != routing_view(after);
    prop_assert_eq!(after.routing_version(), before.routing_version() + u64::from(changed), "{:?}", command);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold_under_random_commands(steps in run(), restore_at in 0usize..80) {
        let mut placement = Placement::new(config());
        // The same run, restored from a snapshot before step `restore_at`.
        let mut replica = Placement::new(config());
        for (index, (op, now_ms)) in steps.iter().enumerate() {
            let command = command(&placement, op, *now_ms);
            let before = placement.clone();
            let result = placement.apply(&command);
            check_step(&before, &placement, &command, result.is_ok())?;

            let restored = Placement::from_bytes(&placement.to_bytes(), config());
            prop_assert_eq!(restored.as_ref(), Ok(&placement));

            if index == restore_at {
                replica = Placement::from_bytes(&replica.to_bytes(), config()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            let replica_result = replica.apply(&command);
            prop_assert_eq!(&replica_result, &result);
            prop_assert_eq!(&replica, &placement);
        }
    }
}
