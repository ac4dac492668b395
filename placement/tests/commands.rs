//! Every command's accepted and refused cases, through the public API. A refused command
//! must leave the state exactly as it was.

use warden_placement::{
    AppliedSettings, Command, Epoch, GroupInfo, NodeError, NodeInfo, NodeState, Outcome, PathError, Placement, PlacementConfig, PlacementError,
    PrefixError, ROOT_GROUP_ID,
};

const TIMEOUT_MS: u64 = 10_000;

fn config(replicas_per_group: usize) -> PlacementConfig {
    PlacementConfig { replicas_per_group, heartbeat_timeout_ms: TIMEOUT_MS, ..PlacementConfig::default() }
}

fn node(id: u64, zone: &str) -> (u64, String, String) {
    (id, format!("n{id}:7000"), zone.to_string())
}

/// Bootstrapped at time 0 with nodes 1..=`nodes` (zones a, b, c in turn).
fn bootstrapped(nodes: u64, replicas: usize) -> Placement {
    let mut placement = Placement::new(config(replicas));
    let nodes = (1..=nodes).map(|id| node(id, ["a", "b", "c"][(id % 3) as usize])).collect();
    let settings = Some(AppliedSettings::of(placement.config()));
    placement.apply(&Command::Bootstrap { nodes, now_ms: 0, limits: Vec::new(), settings }).unwrap();
    placement
}

fn create(placement: &mut Placement, prefix: &str, now_ms: u64) -> GroupInfo {
    match placement.apply(&Command::CreateGroup { prefix: prefix.into(), now_ms }) {
        Ok(Outcome::GroupCreated(group)) => group,
        other => panic!("create {prefix}: {other:?}"),
    }
}

fn ready(placement: &mut Placement, group_id: u64) -> Vec<GroupInfo> {
    match placement.apply(&Command::GroupReady { group_id }) {
        Ok(Outcome::GroupReady { bumped, .. }) => bumped,
        other => panic!("ready {group_id}: {other:?}"),
    }
}

/// Applies `command`, expects `error`, and checks that nothing changed.
fn refused(placement: &mut Placement, command: Command, error: PlacementError) {
    let before = placement.clone();
    assert_eq!(placement.apply(&command), Err(error), "{command:?}");
    assert_eq!(placement, &before, "{command:?} changed the state");
}

fn ids(groups: &[GroupInfo]) -> Vec<u64> {
    groups.iter().map(|group| group.id).collect()
}

#[test]
fn bootstrap_creates_the_root_group() {
    let mut placement = Placement::new(config(3));
    let settings = Some(AppliedSettings::of(placement.config()));
    let outcome = placement.apply(&Command::Bootstrap {
        nodes: vec![node(3, "a"), node(1, "a"), node(2, "b"), node(4, "b")],
        now_ms: 7,
        limits: Vec::new(),
        settings,
    });
    let root = GroupInfo {
        id: ROOT_GROUP_ID,
        prefix: "/".into(),
        replicas: vec![1, 2, 3],
        learners: Vec::new(),
        epoch: Epoch::INITIAL,
        ready: true,
        split_from: None,
        merging: None,
        retired: false,
    };
    assert_eq!(outcome, Ok(Outcome::Bootstrapped(root.clone())));
    assert!(placement.is_bootstrapped());
    assert_eq!(placement.groups().values().cloned().collect::<Vec<_>>(), vec![root]);
    assert_eq!(placement.routes().iter().map(|(p, g)| (p.as_str(), *g)).collect::<Vec<_>>(), vec![("/", 1)]);
    assert_eq!(placement.nodes().len(), 4);
    assert!(placement.nodes().values().all(|node| node.up && node.last_heartbeat_ms == 7));
    assert_eq!(placement.nodes()[&2].addr, "n2:7000");
    assert_eq!(placement.nodes()[&2].zone, "b");
    assert_eq!(placement.routing_version(), 1);
    assert_eq!(placement.next_group_id(), 2);
    assert_eq!(placement.route("/any/path").map(|group| group.id), Some(1));
}

#[test]
fn bootstrap_with_fewer_nodes_than_replicas_uses_them_all() {
    let placement = bootstrapped(2, 5);
    assert_eq!(placement.groups()[&1].replicas.len(), 2);
}

#[test]
fn bootstrap_refusals() {
    let mut placement = Placement::new(config(5));
    refused(
        &mut placement,
        Command::Bootstrap { nodes: vec![], now_ms: 0, limits: Vec::new(), settings: None },
        PlacementError::NotEnoughNodes { wanted: 1, up: 0 },
    );
    refused(
        &mut placement,
        Command::Bootstrap { nodes: vec![node(1, "a"), node(2, "a"), node(1, "b")], now_ms: 0, limits: Vec::new(), settings: None },
        PlacementError::DuplicateNode(1),
    );
    refused(
        &mut placement,
        Command::Bootstrap { nodes: vec![node(1, "a"), node(0, "a")], now_ms: 0, limits: Vec::new(), settings: None },
        PlacementError::InvalidNode { id: 0, reason: NodeError::ZeroId },
    );
    refused(
        &mut placement,
        Command::Bootstrap { nodes: vec![(1, String::new(), "a".into())], now_ms: 0, limits: Vec::new(), settings: None },
        PlacementError::InvalidNode { id: 1, reason: NodeError::EmptyAddr },
    );
    let mut placement = bootstrapped(3, 3);
    refused(
        &mut placement,
        Command::Bootstrap { nodes: vec![node(9, "a")], now_ms: 0, limits: Vec::new(), settings: None },
        PlacementError::AlreadyBootstrapped,
    );
}

#[test]
fn every_other_command_needs_bootstrap() {
    let mut placement = Placement::new(config(5));
    let commands = [
        Command::RegisterNode { id: 1, addr: "n1:1".into(), zone: "a".into(), now_ms: 0 },
        Command::Heartbeat { ids: vec![], now_ms: 0 },
        Command::MarkDown { ids: vec![], now_ms: 0 },
        Command::CreateGroup { prefix: "/a".into(), now_ms: 0 },
        Command::GroupReady { group_id: 1 },
        Command::DropGroup { group_id: 1 },
    ];
    for command in commands {
        refused(&mut placement, command, PlacementError::NotBootstrapped);
    }
}

#[test]
fn register_node_adds_and_updates() {
    let mut placement = bootstrapped(3, 3);
    let version = placement.routing_version();
    let outcome = placement.apply(&Command::RegisterNode { id: 9, addr: "n9:1".into(), zone: "d".into(), now_ms: 50 });
    let nine = placement.nodes()[&9].clone();
    assert_eq!(outcome, Ok(Outcome::NodeRegistered(nine.clone())));
    assert_eq!((nine.addr.as_str(), nine.zone.as_str(), nine.last_heartbeat_ms, nine.up), ("n9:1", "d", 50, true));
    assert_eq!(placement.routing_version(), version + 1);

    // The same registration again only refreshes the timestamp: not a routing change.
    placement.apply(&Command::RegisterNode { id: 9, addr: "n9:1".into(), zone: "d".into(), now_ms: 60 }).unwrap();
    assert_eq!(placement.nodes()[&9].last_heartbeat_ms, 60);
    assert_eq!(placement.routing_version(), version + 1);

    // A new address or zone is.
    placement.apply(&Command::RegisterNode { id: 9, addr: "n9:2".into(), zone: "d".into(), now_ms: 70 }).unwrap();
    assert_eq!(placement.nodes()[&9].addr, "n9:2");
    assert_eq!(placement.routing_version(), version + 2);
    placement.apply(&Command::RegisterNode { id: 9, addr: "n9:2".into(), zone: "e".into(), now_ms: 70 }).unwrap();
    assert_eq!(placement.nodes()[&9].zone, "e");
    assert_eq!(placement.routing_version(), version + 3);

    // So is a down node registering again: it is up.
    placement.apply(&Command::MarkDown { ids: vec![9], now_ms: 70 + TIMEOUT_MS }).unwrap();
    assert!(!placement.nodes()[&9].up);
    let version = placement.routing_version();
    placement.apply(&Command::RegisterNode { id: 9, addr: "n9:2".into(), zone: "e".into(), now_ms: 90_000 }).unwrap();
    assert!(placement.nodes()[&9].up);
    assert_eq!(placement.routing_version(), version + 1);
}

#[test]
fn register_node_refusals() {
    let mut placement = bootstrapped(3, 3);
    let register = |id: u64, addr: &str, zone: &str| Command::RegisterNode { id, addr: addr.into(), zone: zone.into(), now_ms: 1 };
    refused(&mut placement, register(0, "n:1", "a"), PlacementError::InvalidNode { id: 0, reason: NodeError::ZeroId });
    refused(&mut placement, register(1, "", "a"), PlacementError::InvalidNode { id: 1, reason: NodeError::EmptyAddr });
    let long = "x".repeat(warden_placement::ADDR_BYTES_MAX + 1);
    refused(&mut placement, register(1, &long, "a"), PlacementError::InvalidNode { id: 1, reason: NodeError::AddrTooLong(long.len()) });
    let zone = "z".repeat(warden_placement::ZONE_BYTES_MAX + 1);
    refused(&mut placement, register(1, "n:1", &zone), PlacementError::InvalidNode { id: 1, reason: NodeError::ZoneTooLong(zone.len()) });
}

#[test]
fn heartbeats_refresh_and_revive() {
    let mut placement = bootstrapped(3, 3);
    let version = placement.routing_version();
    assert_eq!(placement.apply(&Command::Heartbeat { ids: vec![1, 2], now_ms: 500 }), Ok(Outcome::NodesUp(vec![])));
    assert_eq!(placement.nodes()[&1].last_heartbeat_ms, 500);
    assert_eq!(placement.nodes()[&3].last_heartbeat_ms, 0);
    assert_eq!(placement.routing_version(), version, "timestamps are not routing");

    placement.apply(&Command::MarkDown { ids: vec![2, 3], now_ms: 10_000 }).unwrap();
    assert!(!placement.nodes()[&3].up && placement.nodes()[&2].up);
    let version = placement.routing_version();
    assert_eq!(placement.apply(&Command::Heartbeat { ids: vec![3, 1, 3], now_ms: 11_000 }), Ok(Outcome::NodesUp(vec![3])));
    assert!(placement.nodes()[&3].up);
    assert_eq!(placement.nodes()[&3].last_heartbeat_ms, 11_000);
    assert_eq!(placement.routing_version(), version + 1, "a node back up is a routing change");
}

#[test]
fn heartbeat_with_an_unknown_node_is_refused_whole() {
    let mut placement = bootstrapped(3, 3);
    refused(&mut placement, Command::Heartbeat { ids: vec![1, 42, 2], now_ms: 500 }, PlacementError::UnknownNode(42));
    assert_eq!(placement.nodes()[&1].last_heartbeat_ms, 0);
}

#[test]
fn mark_down_rechecks_with_the_commands_time() {
    let mut placement = bootstrapped(4, 3);
    placement.apply(&Command::Heartbeat { ids: vec![4], now_ms: 8_000 }).unwrap();
    // The leader decides at 12 s: 1, 2, 3 are silent since 0.
    let decided = placement.nodes_to_mark_down(12_000);
    assert_eq!(decided, vec![1, 2, 3]);
    // Node 2's heartbeat is applied before the proposal.
    placement.apply(&Command::Heartbeat { ids: vec![2], now_ms: 11_500 }).unwrap();
    let version = placement.routing_version();
    let outcome = placement.apply(&Command::MarkDown { ids: decided, now_ms: 12_000 });
    assert_eq!(outcome, Ok(Outcome::NodesDown(vec![1, 3])));
    let up: Vec<bool> = placement.nodes().values().map(|node| node.up).collect();
    assert_eq!(up, [false, true, false, true]);
    assert_eq!(placement.routing_version(), version + 1);

    // Already down, or fresh (4 heartbeated at 8 s): nothing to do, no routing change.
    let before = placement.clone();
    assert_eq!(placement.apply(&Command::MarkDown { ids: vec![1, 4], now_ms: 17_999 }), Ok(Outcome::NodesDown(vec![])));
    assert_eq!(placement, before);
    // Exactly the timeout after the last heartbeat counts as silent.
    assert_eq!(placement.apply(&Command::MarkDown { ids: vec![4], now_ms: 18_000 }), Ok(Outcome::NodesDown(vec![4])));
}

#[test]
fn mark_down_with_an_unknown_node_is_refused_whole() {
    let mut placement = bootstrapped(3, 3);
    refused(&mut placement, Command::MarkDown { ids: vec![1, 42], now_ms: 60_000 }, PlacementError::UnknownNode(42));
    assert!(placement.nodes()[&1].up);
}

#[test]
fn create_group_allocates_and_picks_but_does_not_route() {
    let mut placement = bootstrapped(6, 3);
    let version = placement.routing_version();
    let group = create(&mut placement, "/teams/payments", 0);
    assert_eq!(group.id, 2);
    assert_eq!(group.prefix, "/teams/payments");
    assert_eq!(group.epoch, Epoch::INITIAL);
    assert!(!group.ready);
    assert_eq!(group.replicas.len(), 3);
    assert_eq!(placement.groups()[&2], group);
    assert_eq!(placement.next_group_id(), 3);
    assert_eq!(placement.routing_version(), version + 1);
    assert_eq!(placement.route("/teams/payments/x").map(|group| group.id), Some(1));
    assert!(!placement.routes().contains_key("/teams/payments"));
    assert_eq!(create(&mut placement, "/teams/search", 0).id, 3);
}

#[test]
fn create_group_refusals() {
    let mut placement = bootstrapped(4, 3);
    let command = |prefix: &str| Command::CreateGroup { prefix: prefix.into(), now_ms: 0 };
    let invalid = |prefix: &str, reason| PlacementError::InvalidPrefix { prefix: prefix.into(), reason };
    refused(&mut placement, command("/"), invalid("/", PrefixError::Root));
    refused(&mut placement, command("a"), invalid("a", PrefixError::Path(PathError::NotAbsolute)));
    refused(&mut placement, command("/a/"), invalid("/a/", PrefixError::Path(PathError::TrailingSlash)));
    refused(&mut placement, command("/a//b"), invalid("/a//b", PrefixError::Path(PathError::EmptySegment)));
    refused(&mut placement, command("/a/.."), invalid("/a/..", PrefixError::Path(PathError::Relative("..".into()))));
    let long = format!("/{}", "x".repeat(1024));
    refused(&mut placement, command(&long), invalid(&long, PrefixError::Path(PathError::TooLong(1025))));

    let creating = create(&mut placement, "/a", 0);
    refused(&mut placement, command("/a"), PlacementError::PrefixTaken { prefix: "/a".into(), group: creating.id });
    ready(&mut placement, creating.id);
    refused(&mut placement, command("/a"), PlacementError::PrefixTaken { prefix: "/a".into(), group: creating.id });

    placement.apply(&Command::MarkDown { ids: vec![1, 2], now_ms: TIMEOUT_MS }).unwrap();
    refused(&mut placement, command("/b"), PlacementError::NotEnoughNodes { wanted: 3, up: 2 });
}

#[test]
fn create_group_skips_nodes_silent_at_its_time() {
    let mut placement = bootstrapped(4, 3);
    placement.apply(&Command::Heartbeat { ids: vec![1, 2, 3], now_ms: 5_000 }).unwrap();
    // At 12 s node 4 is still up but silent since 0: it gets no replica.
    let group = create(&mut placement, "/a", 12_000);
    assert!(!group.replicas.contains(&4), "{group:?}");
    placement.apply(&Command::Heartbeat { ids: vec![1, 2], now_ms: 12_000 }).unwrap();
    refused(&mut placement, Command::CreateGroup { prefix: "/b".into(), now_ms: 15_000 }, PlacementError::NotEnoughNodes { wanted: 3, up: 2 });
}

#[test]
fn create_group_refuses_when_ids_are_exhausted() {
    let placement = bootstrapped(3, 3);
    let mut value: serde_json::Value = serde_json::from_slice(&placement.to_bytes()).unwrap();
    value["next_group_id"] = serde_json::json!(warden_placement::SHARD_GROUP_ID_MAX);
    let bytes = serde_json::to_vec(&value).unwrap();
    let mut placement = Placement::from_bytes(&bytes, config(3)).unwrap();
    assert_eq!(create(&mut placement, "/last", 0).id, warden_placement::SHARD_GROUP_ID_MAX);
    refused(&mut placement, Command::CreateGroup { prefix: "/b".into(), now_ms: 0 }, PlacementError::GroupIdsExhausted);
}

#[test]
fn group_ready_commits_the_route_and_bumps_the_previous_owner() {
    let mut placement = bootstrapped(5, 3);
    let a = create(&mut placement, "/a", 0);
    let version = placement.routing_version();
    let outcome = placement.apply(&Command::GroupReady { group_id: a.id }).unwrap();
    let Outcome::GroupReady { group, bumped } = outcome else { panic!("{outcome:?}") };
    assert!(group.ready);
    assert_eq!(group.epoch, Epoch::INITIAL);
    assert_eq!(ids(&bumped), vec![1]);
    assert_eq!(bumped[0].epoch, Epoch { conf_ver: 1, version: 2 });
    assert_eq!(placement.groups()[&1].epoch, Epoch { conf_ver: 1, version: 2 });
    assert_eq!(placement.routes().get("/a"), Some(&a.id));
    assert_eq!(placement.route("/a/x").map(|group| group.id), Some(a.id));
    assert_eq!(placement.routing_version(), version + 1);

    let b = create(&mut placement, "/a/b", 0);
    assert_eq!(ids(&ready(&mut placement, b.id)), vec![a.id], "the longest owner is bumped, not the root");
    assert_eq!(placement.groups()[&1].epoch.version, 2);
    assert_eq!(placement.groups()[&a.id].epoch.version, 2);
    let c = create(&mut placement, "/c", 0);
    assert_eq!(ids(&ready(&mut placement, c.id)), vec![1]);
    assert_eq!(placement.descriptor(1).unwrap().excluded, ["/a", "/c"]);
    assert_eq!(placement.descriptor(a.id).unwrap().excluded, ["/a/b"]);
}

#[test]
fn group_ready_between_a_ready_owner_and_a_creating_ancestor() {
    let mut placement = bootstrapped(5, 3);
    let a = create(&mut placement, "/a", 0);
    let b = create(&mut placement, "/a/b", 0);
    // /a/b becomes ready first: the root loses it, and so does /a's future descriptor.
    let bumped = ready(&mut placement, b.id);
    assert_eq!(ids(&bumped), vec![1, a.id]);
    assert_eq!(placement.descriptor(a.id).unwrap().excluded, ["/a/b"]);
    assert_eq!(placement.descriptor(a.id).unwrap().epoch.version, 2);
    assert_eq!(placement.descriptor(1).unwrap().excluded, ["/a/b"]);
    // Then /a: the root's carve-out /a/b becomes /a; /a's own descriptor does not change.
    let bumped = ready(&mut placement, a.id);
    assert_eq!(ids(&bumped), vec![1]);
    assert_eq!(placement.descriptor(1).unwrap().excluded, ["/a"]);
    assert_eq!(placement.groups()[&1].epoch.version, 3);
    assert_eq!(placement.groups()[&a.id].epoch.version, 2);
}

#[test]
fn group_ready_refusals() {
    let mut placement = bootstrapped(3, 3);
    refused(&mut placement, Command::GroupReady { group_id: 7 }, PlacementError::UnknownGroup(7));
    refused(&mut placement, Command::GroupReady { group_id: 1 }, PlacementError::GroupNotCreating(1));
    let a = create(&mut placement, "/a", 0);
    ready(&mut placement, a.id);
    refused(&mut placement, Command::GroupReady { group_id: a.id }, PlacementError::GroupNotCreating(a.id));
}

#[test]
fn drop_group_forgets_a_failed_creation() {
    let mut placement = bootstrapped(3, 3);
    let before = placement.clone();
    let a = create(&mut placement, "/a", 0);
    let version = placement.routing_version();
    let root_epoch = placement.groups()[&1].epoch;
    let dropped = placement.apply(&Command::DropGroup { group_id: a.id });
    let Ok(Outcome::GroupDropped { group, bumped }) = dropped else { panic!("{dropped:?}") };
    assert_eq!(group, a);
    // The root group would have given /a away at version + 1: the rollback's descriptor (it
    // serves /a again) comes after that one.
    let expected_epoch = Epoch { version: root_epoch.version + 2, ..root_epoch };
    assert_eq!(bumped.iter().map(|g| (g.id, g.epoch)).collect::<Vec<_>>(), vec![(1, expected_epoch)]);
    assert_eq!(placement.groups()[&1].epoch, expected_epoch);
    let unbumped = |p: &Placement| p.groups().values().map(|g| (g.id, g.prefix.clone(), g.ready)).collect::<Vec<_>>();
    assert_eq!(unbumped(&placement), unbumped(&before));
    assert_eq!(placement.routes(), before.routes());
    assert_eq!(placement.routing_version(), version + 1);
    // The prefix is free again; the id is not reused.
    assert_eq!(create(&mut placement, "/a", 0).id, a.id + 1);
}

#[test]
fn drop_group_refusals() {
    let mut placement = bootstrapped(3, 3);
    refused(&mut placement, Command::DropGroup { group_id: 7 }, PlacementError::UnknownGroup(7));
    refused(&mut placement, Command::DropGroup { group_id: 1 }, PlacementError::GroupNotCreating(1));
    let a = create(&mut placement, "/a", 0);
    ready(&mut placement, a.id);
    refused(&mut placement, Command::DropGroup { group_id: a.id }, PlacementError::GroupNotCreating(a.id));
}

#[test]
fn routing_version_counts_state_changes_only() {
    let mut placement = bootstrapped(3, 3);
    let steps: Vec<(Command, bool)> = vec![
        (Command::Heartbeat { ids: vec![1, 2, 3], now_ms: 5_000 }, false),
        (Command::RegisterNode { id: 4, addr: "n4:1".into(), zone: "a".into(), now_ms: 1_000 }, true),
        (Command::RegisterNode { id: 4, addr: "n4:1".into(), zone: "a".into(), now_ms: 2_000 }, false),
        (Command::MarkDown { ids: vec![4], now_ms: 2_000 }, false),
        (Command::MarkDown { ids: vec![4], now_ms: 12_000 }, true),
        (Command::Heartbeat { ids: vec![4], now_ms: 13_000 }, true),
        (Command::CreateGroup { prefix: "/a".into(), now_ms: 13_000 }, true),
        (Command::GroupReady { group_id: 2 }, true),
        (Command::CreateGroup { prefix: "/b".into(), now_ms: 13_000 }, true),
        (Command::DropGroup { group_id: 3 }, true),
        (Command::DropGroup { group_id: 3 }, false),
    ];
    for (command, changes) in steps {
        let before = placement.routing_version();
        let _ = placement.apply(&command);
        assert_eq!(placement.routing_version(), before + u64::from(changes), "{command:?}");
    }
}

#[test]
fn commands_outcomes_and_errors_encode() {
    let commands = [
        Command::Bootstrap { nodes: vec![node(1, "a")], now_ms: 1, limits: Vec::new(), settings: None },
        Command::RegisterNode { id: 1, addr: "a:1".into(), zone: String::new(), now_ms: 2 },
        Command::Heartbeat { ids: vec![1, 2], now_ms: 3 },
        Command::MarkDown { ids: vec![3], now_ms: 4 },
        Command::CreateGroup { prefix: "/a".into(), now_ms: 5 },
        Command::GroupReady { group_id: 2 },
        Command::DropGroup { group_id: 2 },
    ];
    for command in commands {
        let bytes = serde_json::to_vec(&command).unwrap();
        assert_eq!(serde_json::from_slice::<Command>(&bytes).unwrap(), command);
    }
    let mut placement = bootstrapped(3, 3);
    let outcome = placement.apply(&Command::CreateGroup { prefix: "/a".into(), now_ms: 0 });
    let bytes = serde_json::to_vec(&outcome).unwrap();
    assert_eq!(serde_json::from_slice::<Result<Outcome, PlacementError>>(&bytes).unwrap(), outcome);
    let error = PlacementError::InvalidPrefix { prefix: "/a/".into(), reason: PrefixError::Path(PathError::TrailingSlash) };
    let bytes = serde_json::to_vec(&error).unwrap();
    assert_eq!(serde_json::from_slice::<PlacementError>(&bytes).unwrap(), error);
    assert_eq!(error.to_string(), "invalid prefix \"/a/\": path must not end with '/'");
}

#[test]
fn replica_changes_record_the_learner_first_and_grow_conf_ver() {
    let mut placement = bootstrapped(7, 5);
    let root = placement.group(ROOT_GROUP_ID).unwrap().clone();
    let spare = (1..=7).find(|id| !root.replicas.contains(id)).unwrap();
    let voter = root.replicas[2];
    refused(&mut placement, Command::AddLearner { group_id: 1, node: voter }, PlacementError::ReplicaExists { group: 1, node: voter });
    refused(&mut placement, Command::AddLearner { group_id: 9, node: spare }, PlacementError::UnknownGroup(9));
    refused(&mut placement, Command::AddLearner { group_id: 1, node: 99 }, PlacementError::UnknownNode(99));
    refused(
        &mut placement,
        Command::PromoteLearner { group_id: 1, node: spare, replacing: None },
        PlacementError::NotALearner { group: 1, node: spare },
    );
    let Ok(Outcome::ReplicasChanged(group)) = placement.apply(&Command::AddLearner { group_id: 1, node: spare }) else { panic!() };
    assert_eq!(group.learners, vec![spare]);
    assert_eq!(group.epoch, Epoch { conf_ver: 2, version: 1 });
    let other = (1..=7).find(|id| !group.has_member(*id)).unwrap();
    refused(&mut placement, Command::AddLearner { group_id: 1, node: other }, PlacementError::ChangeInProgress { group: 1, learner: spare });
    refused(
        &mut placement,
        Command::PromoteLearner { group_id: 1, node: spare, replacing: Some(other) },
        PlacementError::NotAVoter { group: 1, node: other },
    );
    let Ok(Outcome::ReplicasChanged(group)) = placement.apply(&Command::PromoteLearner { group_id: 1, node: spare, replacing: Some(voter) }) else {
        panic!()
    };
    // The new voter takes the replaced one's place.
    let mut expected = root.replicas.clone();
    expected[2] = spare;
    assert_eq!((group.replicas, group.learners, group.epoch.conf_ver), (expected, vec![], 3));
    placement.apply(&Command::AddLearner { group_id: 1, node: voter }).unwrap();
    let Ok(Outcome::ReplicasChanged(group)) = placement.apply(&Command::RemoveLearner { group_id: 1, node: voter }) else { panic!() };
    assert!(!group.has_member(voter));
    assert_eq!(group.epoch.conf_ver, 5);
}

#[test]
fn node_states_move_as_allowed_and_a_tombstone_is_final() {
    let mut placement = bootstrapped(6, 5);
    let hosting = placement.group(ROOT_GROUP_ID).unwrap().replicas[0];
    let draining = placement.apply(&Command::SetNodeState { id: hosting, state: NodeState::Draining }).unwrap();
    assert!(matches!(draining, Outcome::NodeStateSet(NodeInfo { state: NodeState::Draining, .. })));
    // A drained node re-registering stays drained; it gets no new group.
    placement.apply(&Command::RegisterNode { id: hosting, addr: format!("n{hosting}:7000"), zone: "a".into(), now_ms: 1 }).unwrap();
    assert_eq!(placement.node(hosting).unwrap().state, NodeState::Draining);
    refused(&mut placement, Command::AddLearner { group_id: 1, node: hosting }, PlacementError::NodeNotServing(hosting));
    refused(
        &mut placement,
        Command::SetNodeState { id: hosting, state: NodeState::Tombstone },
        PlacementError::NodeStateChange { id: hosting, from: NodeState::Draining, to: NodeState::Tombstone },
    );
    placement.apply(&Command::SetNodeState { id: hosting, state: NodeState::Decommissioning }).unwrap();
    refused(
        &mut placement,
        Command::SetNodeState { id: hosting, state: NodeState::Tombstone },
        PlacementError::NodeNotEmpty { id: hosting, group: 1 },
    );
    let spare = (1..=6).find(|id| !placement.group(1).unwrap().has_member(*id)).unwrap();
    refused(
        &mut placement,
        Command::SetNodeState { id: spare, state: NodeState::Tombstone },
        PlacementError::NodeStateChange { id: spare, from: NodeState::Serving, to: NodeState::Tombstone },
    );
    placement.apply(&Command::SetNodeState { id: spare, state: NodeState::Decommissioning }).unwrap();
    placement.apply(&Command::SetNodeState { id: spare, state: NodeState::Tombstone }).unwrap();
    assert!(!placement.node(spare).unwrap().up);
    for command in
        [Command::RegisterNode { id: spare, addr: "x:1".into(), zone: String::new(), now_ms: 2 }, Command::Heartbeat { ids: vec![spare], now_ms: 2 }]
    {
        refused(&mut placement, command, PlacementError::NodeTombstoned(spare));
    }
    refused(
        &mut placement,
        Command::SetNodeState { id: spare, state: NodeState::Serving },
        PlacementError::NodeStateChange { id: spare, from: NodeState::Tombstone, to: NodeState::Serving },
    );
}

#[test]
fn remove_group_gives_the_prefix_back_to_the_parent_path() {
    let mut placement = bootstrapped(5, 5);
    let a = create(&mut placement, "/a", 0);
    ready(&mut placement, a.id);
    let ab = create(&mut placement, "/a/b", 0);
    ready(&mut placement, ab.id);
    refused(&mut placement, Command::RemoveGroup { group_id: ROOT_GROUP_ID }, PlacementError::RootGroup);
    let c = create(&mut placement, "/a/b/c", 0);
    refused(&mut placement, Command::RemoveGroup { group_id: c.id }, PlacementError::GroupNotReady(c.id));
    refused(&mut placement, Command::RemoveGroup { group_id: ab.id }, PlacementError::ChangeInProgress { group: c.id, learner: 0 });
    placement.apply(&Command::DropGroup { group_id: c.id }).unwrap();
    // Not while a replica move is adding a learner to it.
    let spare = 6;
    placement.apply(&Command::RegisterNode { id: spare, addr: "n6:1".into(), zone: String::new(), now_ms: 0 }).unwrap();
    placement.apply(&Command::AddLearner { group_id: ab.id, node: spare }).unwrap();
    refused(&mut placement, Command::RemoveGroup { group_id: ab.id }, PlacementError::ChangeInProgress { group: ab.id, learner: spare });
    placement.apply(&Command::RemoveLearner { group_id: ab.id, node: spare }).unwrap();
    let version_before = placement.group(a.id).unwrap().epoch.version;
    let Ok(Outcome::GroupRemoved { group, bumped }) = placement.apply(&Command::RemoveGroup { group_id: ab.id }) else { panic!() };
    assert_eq!(group.id, ab.id);
    assert_eq!(ids(&bumped), vec![a.id]);
    assert_eq!(placement.group(a.id).unwrap().epoch.version, version_before + 1);
    assert_eq!(placement.route("/a/b/x").map(|g| g.id), Some(a.id));
    assert_eq!(placement.descriptor(a.id).unwrap().excluded, Vec::<String>::new());
    assert!(placement.group(ab.id).is_none());
    // Ids are never reused.
    assert_eq!(create(&mut placement, "/a/b", 0).id, c.id + 1);
}

#[test]
fn split_group_records_its_source_until_ready_and_waits_for_other_creations() {
    let mut placement = bootstrapped(5, 3);
    let pending = create(&mut placement, "/pending", 0);
    refused(
        &mut placement,
        Command::SplitGroup { prefix: "/team".into(), now_ms: 0 },
        PlacementError::ChangeInProgress { group: pending.id, learner: 0 },
    );
    ready(&mut placement, pending.id);
    let split = match placement.apply(&Command::SplitGroup { prefix: "/team".into(), now_ms: 0 }) {
        Ok(Outcome::GroupCreated(group)) => group,
        other => panic!("split: {other:?}"),
    };
    assert_eq!(split.split_from, Some(ROOT_GROUP_ID), "the group serving the subtree now is the source");
    assert_eq!(placement.route("/team/x").map(|g| g.id), Some(ROOT_GROUP_ID), "not routed before it is ready");
    refused(
        &mut placement,
        Command::SplitGroup { prefix: "/other".into(), now_ms: 0 },
        PlacementError::ChangeInProgress { group: split.id, learner: 0 },
    );
    assert_eq!(ids(&ready(&mut placement, split.id)), vec![ROOT_GROUP_ID], "the source gives the subtree away");
    let ready_group = placement.group(split.id).expect("group");
    assert_eq!((ready_group.ready, ready_group.split_from), (true, None));
    assert_eq!(placement.route("/team/x").map(|g| g.id), Some(split.id));
    placement.check_invariants().expect("consistent");
}

#[test]
fn a_merge_records_its_operation_then_retires_the_group_until_it_is_removed() {
    let mut placement = bootstrapped(5, 3);
    let team = create(&mut placement, "/team", 0);
    ready(&mut placement, team.id);
    refused(&mut placement, Command::MergeGroup { prefix: "/".into() }, PlacementError::RootGroup);
    refused(&mut placement, Command::MergeGroup { prefix: "/none".into() }, PlacementError::NoGroupAt("/none".into()));
    refused(&mut placement, Command::RetireGroup { group_id: team.id }, PlacementError::NotMerging(team.id));
    let Ok(Outcome::MergeStarted(merging)) = placement.apply(&Command::MergeGroup { prefix: "/team".into() }) else { panic!("merge") };
    let operation = merging.merging.expect("merging");
    assert_eq!(operation.into, ROOT_GROUP_ID, "into the group serving the parent path");
    assert!(operation.operation > team.id, "operation ids come from the group ids");
    assert_eq!(placement.route("/team/x").map(|g| g.id), Some(team.id), "routed as before until it retires");
    let busy = PlacementError::ChangeInProgress { group: team.id, learner: 0 };
    refused(&mut placement, Command::CreateGroup { prefix: "/other".into(), now_ms: 0 }, busy.clone());
    refused(&mut placement, Command::SplitGroup { prefix: "/other".into(), now_ms: 0 }, busy.clone());
    refused(&mut placement, Command::AddLearner { group_id: ROOT_GROUP_ID, node: 4 }, busy);

    // Aborted, then merged for real: it retires (no route, serving nothing) and is removed.
    assert!(matches!(placement.apply(&Command::MergeAborted { group_id: team.id }), Ok(Outcome::MergeAborted(_))));
    placement.apply(&Command::MergeGroup { prefix: "/team".into() }).expect("merge again");
    let version = placement.group(team.id).expect("team").epoch.version;
    let Ok(Outcome::GroupRetired { group, bumped }) = placement.apply(&Command::RetireGroup { group_id: team.id }) else { panic!("retire") };
    assert_eq!(ids(&bumped), vec![ROOT_GROUP_ID], "the parent's group serves the prefix again");
    assert!(group.retired && group.merging.is_none());
    assert_eq!(placement.route("/team/x").map(|g| g.id), Some(ROOT_GROUP_ID));
    let retiring = placement.descriptor(team.id).expect("descriptor");
    assert_eq!((retiring.excluded, retiring.epoch.version), (vec!["/team".to_string()], version + 1), "it serves nothing");
    assert_eq!(placement.descriptor(ROOT_GROUP_ID).expect("root").excluded, Vec::<String>::new());
    refused(&mut placement, Command::MergeGroup { prefix: "/team".into() }, PlacementError::NotMerging(team.id));
    placement.check_invariants().expect("consistent");
    assert!(matches!(placement.apply(&Command::RemoveGroup { group_id: team.id }), Ok(Outcome::GroupRemoved { .. })));
    assert!(placement.group(team.id).is_none());
    placement.check_invariants().expect("consistent");
}

/// What apply reads besides the command is recorded at bootstrap, so two
/// replicas whose binaries default to different settings (a rolling upgrade) apply alike; a
/// `Bootstrap` or a state written before the settings were recorded means the first
/// release's, whatever the replica's defaults.
#[test]
fn replicas_with_other_defaults_apply_alike() {
    let nodes: Vec<_> = (1..=6).map(|id| node(id, ["a", "b", "c"][(id % 3) as usize])).collect();
    let proposer = config(3);
    let bootstrap = Command::Bootstrap { nodes: nodes.clone(), now_ms: 0, limits: Vec::new(), settings: Some(AppliedSettings::of(&proposer)) };
    let (mut old, mut new) = (Placement::new(config(3)), Placement::new(config(5)));
    for placement in [&mut old, &mut new] {
        placement.apply(&bootstrap).unwrap();
        create(placement, "/a", 1);
    }
    assert_eq!(old.to_bytes(), new.to_bytes(), "the same commands, the same replicated state");
    assert_eq!(new.groups().values().map(|group| group.replicas.len()).collect::<Vec<_>>(), vec![3, 3]);
    assert_eq!(new.settings().replicas_per_group, 3);

    // An entry from before: no settings field.
    let text = r#"{"Bootstrap":{"nodes":[[1,"n1:7000","a"],[2,"n2:7000","b"],[3,"n3:7000","c"],[4,"n4:7000","a"],[5,"n5:7000","b"],[6,"n6:7000","c"]],"now_ms":0}}"#;
    let before: Command = serde_json::from_str(text).unwrap();
    let mut three = Placement::new(config(3));
    three.apply(&before).unwrap();
    assert_eq!(three.settings(), &AppliedSettings::FIRST_RELEASE);
    assert_eq!(three.groups()[&ROOT_GROUP_ID].replicas.len(), AppliedSettings::FIRST_RELEASE.replicas_per_group);
    // A state from before: no settings recorded.
    let mut value: serde_json::Value = serde_json::from_slice(&new.to_bytes()).unwrap();
    value.as_object_mut().unwrap().remove("settings");
    let restored = Placement::from_bytes(&serde_json::to_vec(&value).unwrap(), config(3)).unwrap();
    assert_eq!(restored.settings(), &AppliedSettings::FIRST_RELEASE);
}

/// The maxima placement's apply checks (quotas, ACL grants, groups, members) are the ones
/// recorded at bootstrap, not this binary's; their first-release values are frozen.
#[test]
fn placement_maxima_are_the_recorded_ones() {
    assert_eq!(
        AppliedSettings::FIRST_RELEASE,
        AppliedSettings {
            replicas_per_group: 5,
            heartbeat_timeout_ms: 10_000,
            quotas_max: 1_000,
            acl_grants_max: 10_000,
            acl_groups_max: 1_000,
            acl_members_max: 10_000
        },
        "the first release's values are what old clusters applied: never edit them"
    );
    let settings = AppliedSettings { quotas_max: 2, acl_grants_max: 1, acl_groups_max: 1, acl_members_max: 1, ..AppliedSettings::of(&config(3)) };
    let mut placement = Placement::new(config(3));
    placement.apply(&Command::Bootstrap { nodes: vec![node(1, "a")], now_ms: 0, limits: Vec::new(), settings: Some(settings) }).unwrap();
    let quota = |prefix: &str| Command::SetQuota { prefix: prefix.into(), limits: Some(warden_placement::quota::Limits::default()) };
    placement.apply(&quota("/a")).unwrap();
    placement.apply(&quota("/b")).unwrap();
    refused(&mut placement, quota("/c"), PlacementError::Quota(warden_placement::quota::QuotaError::TooMany { limit: 2 }));
    let grant = |principal: &str| Command::ChangeAcl {
        prefix: "/a".into(),
        principal: principal.into(),
        permissions: warden_placement::acl::READ,
        revoke: false,
    };
    placement.apply(&grant("alice")).unwrap();
    assert!(matches!(placement.apply(&grant("bob")), Err(PlacementError::Acl(warden_placement::AclError::Full { limit: 1, .. }))));
    let join = |principal: &str| Command::ChangeAclGroup { group: "ops".into(), principal: principal.into(), remove: false };
    placement.apply(&join("alice")).unwrap();
    assert!(matches!(placement.apply(&join("bob")), Err(PlacementError::Acl(warden_placement::AclError::Full { limit: 1, .. }))));

    // A record from before a maximum was recorded means the first release's value.
    let mut value: serde_json::Value = serde_json::from_slice(&placement.to_bytes()).unwrap();
    value["settings"].as_object_mut().unwrap().remove("quotas_max");
    let restored = Placement::from_bytes(&serde_json::to_vec(&value).unwrap(), config(3)).unwrap();
    assert_eq!(restored.settings().quotas_max, AppliedSettings::FIRST_RELEASE.quotas_max);
    assert_eq!(restored.settings().acl_grants_max, 1);
}
