//! `warden status`: the cluster as placement's routing table describes it (nodes, shard
//! groups, routes), with each group's leader and revision asked of the routers and each
//! replica's state asked of its node (applied index, lag behind the leader's commit). Exits
//! [`EXIT_UNHEALTHY`] when a group has no leader or fewer than a quorum plus one live voters
//! (one voter down is tolerated, two would lose the quorum), or a replica stopped applying
//! its group (its store failed: its node must be restarted). The per-item formatting here
//! is shared with `warden admin groups` / `warden admin routes`.

use std::time::Duration;

use serde_json::{json, Value};
use warden_proto::placement::{GroupEntry, NodeEntry, NodeState, RoutingTable};
use warden_proto::v1 as pb;
use warden_proto::v1::warden_client::WardenClient;

use super::output::{rfc3339, Output};
use super::{ExitWith, GlobalArgs, EXIT_UNHEALTHY};

/// How long the routing table is asked for before giving up.
const TABLE_PATIENCE: Duration = Duration::from_secs(5);
/// How long a group's leader is asked for before it is reported unknown.
const LEADER_PATIENCE: Duration = Duration::from_secs(2);

/// Flags of `warden status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// Shard-node addresses to read the routing table from (any node with a placement replica).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")]
    nodes: Vec<String>,
    /// List the hottest subtrees instead: writes per second per top-level child of each
    /// group's prefix, read twice from one replica of each group `--hot-window-ms` apart
    /// (this wakes hibernating groups). `warden admin split` moves a hot one to its own group.
    #[arg(long)]
    hot: bool,
    /// How long `--hot` measures.
    #[arg(long, default_value_t = 1000)]
    hot_window_ms: u64,
    /// How many subtrees `--hot` lists.
    #[arg(long, default_value_t = 10)]
    hot_top: usize,
}

/// What a router says about one group: its leader and revision.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupHealth {
    /// The leader's node id (`None`: unknown).
    pub leader: Option<u64>,
    /// The group's revision.
    pub revision: Option<u64>,
}

/// Replicas asked at once for their state.
const REPLICA_ASKS_IN_FLIGHT_MAX: usize = 64;

/// One replica as its node reports it.
#[derive(Clone, Debug)]
struct ReplicaHealth {
    node: u64,
    /// `None`: the node did not answer for it (down, partitioned, or the replica is gone).
    applied: Option<u64>,
    /// Entries its applied index is behind the leader's commit index (`None`: unknown).
    lag: Option<u64>,
    /// Whether it leads.
    leads: bool,
    learner: bool,
    hibernating: bool,
    /// Why it stopped applying its group (`None`: it applies, or it did not answer).
    failure: Option<String>,
}

/// Asks each replica of every ready group (voters and learners) for its state, through its
/// node; a group's lag is measured against the commit index its leader reports.
async fn replica_health(table: &RoutingTable) -> Vec<Vec<ReplicaHealth>> {
    use futures::StreamExt as _;
    let asks: Vec<(usize, u64, u64, bool, String)> = table
        .groups
        .iter()
        .enumerate()
        .flat_map(|(index, group)| {
            let descriptor = group.descriptor.clone().unwrap_or_default();
            let voters = descriptor.replicas.iter().map(|id| (*id, false));
            let learners = group.learners.iter().map(|id| (*id, true));
            voters
                .chain(learners)
                .map(|(node, learner)| {
                    let addr = table.nodes.iter().find(|n| n.id == node).map(|n| n.addr.clone()).unwrap_or_default();
                    (index, descriptor.group_id, node, learner, addr)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let answers: Vec<_> = futures::stream::iter(asks)
        .map(|(index, group_id, node, learner, addr)| async move {
            let answer = async {
                let channel = crate::tls_args::node_channel(&addr).ok()?;
                let mut client = warden_proto::placement::placement_client::PlacementClient::new(channel);
                let request = warden_proto::placement::ReplicaStatusRequest { group_id };
                tokio::time::timeout(LEADER_PATIENCE, client.replica_status(request)).await.ok()?.ok().map(tonic::Response::into_inner)
            }
            .await;
            (index, node, learner, answer)
        })
        .buffer_unordered(REPLICA_ASKS_IN_FLIGHT_MAX)
        .collect()
        .await;
    let mut groups: Vec<Vec<(u64, bool, Option<warden_proto::placement::ReplicaStatusResponse>)>> = vec![Vec::new(); table.groups.len()];
    for (index, node, learner, answer) in answers {
        groups[index].push((node, learner, answer));
    }
    groups
        .into_iter()
        .map(|mut replicas| {
            replicas.sort_by_key(|(node, learner, _)| (*learner, *node));
            let commit = replicas.iter().filter_map(|(_, _, a)| a.as_ref()).find(|a| a.leader_id == a.node_id && a.node_id != 0).map(|a| a.commit);
            replicas
                .into_iter()
                .map(|(node, learner, answer)| ReplicaHealth {
                    node,
                    applied: answer.as_ref().map(|a| a.applied),
                    lag: commit.zip(answer.as_ref()).map(|(commit, a)| commit.saturating_sub(a.applied)),
                    leads: answer.as_ref().is_some_and(|a| a.leader_id == a.node_id && a.node_id != 0),
                    learner,
                    hibernating: answer.as_ref().is_some_and(|a| a.hibernating),
                    failure: answer.as_ref().map(|a| a.failure.clone()).filter(|failure| !failure.is_empty()),
                })
                .collect()
        })
        .collect()
}

/// Why a group is unhealthy, if it is: no leader, or fewer than a quorum plus one voters
/// answering on up nodes (all of them when the group has fewer voters than that). When no
/// replica of any group answered (`replicas_reachable` false: with security on a node's
/// replica status is served on its peer port, which admits nodes and routers only), a voter
/// counts as live when placement says its node is up.
fn group_problem(
    group: &GroupEntry,
    health: &GroupHealth,
    replicas: &[ReplicaHealth],
    nodes: &[NodeEntry],
    replicas_reachable: bool,
) -> Option<String> {
    let descriptor = group.descriptor.as_ref()?;
    if !group.ready || group.retired {
        return None;
    }
    let id = descriptor.group_id;
    if health.leader.is_none() && !replicas.iter().any(|r| r.leads) {
        return Some(format!("group {id} ({}) has no leader", descriptor.prefix));
    }
    let voters = descriptor.replicas.len();
    let needed = (voters / 2 + 2).min(voters);
    let dead = dead_replicas(group, nodes);
    let live = replicas
        .iter()
        .filter(|r| !r.learner && r.failure.is_none() && (r.applied.is_some() || !replicas_reachable) && !dead.contains(&r.node))
        .count();
    (live < needed).then(|| format!("group {id} ({}) has {live} live voters of {voters}, fewer than a quorum plus one ({needed})", descriptor.prefix))
}

/// The replicas of a group that stopped applying it: each needs its node restarted, even
/// while the others are a quorum.
fn failed_replicas(group: &GroupEntry, replicas: &[ReplicaHealth]) -> Vec<String> {
    let (id, prefix) = group.descriptor.as_ref().map_or((0, ""), |d| (d.group_id, d.prefix.as_str()));
    replicas
        .iter()
        .filter_map(|r| {
            r.failure.as_ref().map(|failure| format!("group {id} ({prefix}): the replica on node {} stopped applying: {failure}", r.node))
        })
        .collect()
}

/// A group's replicas as JSON.
fn replicas_json(replicas: &[ReplicaHealth]) -> Value {
    replicas
        .iter()
        .map(|r| {
            let role = match (r.learner, r.leads) {
                (true, _) => "learner",
                (false, true) => "leader",
                (false, false) => "follower",
            };
            json!({
                "node": r.node,
                "role": role,
                "answered": r.applied.is_some(),
                "applied": r.applied,
                "lag": r.lag,
                "hibernating": r.hibernating,
                "failure": r.failure,
            })
        })
        .collect()
}

/// A group's replicas in a line: `lag 1:0 2:0 3:12 4:? 5+learner:900 6:failed` (`?`: no
/// answer; `failed`: stopped applying, see the problems).
fn replicas_text(replicas: &[ReplicaHealth]) -> String {
    let each = replicas.iter().map(|r| {
        let learner = if r.learner { "+learner" } else { "" };
        let lag = match (r.applied, r.lag) {
            _ if r.failure.is_some() => "failed".to_string(),
            (None, _) => "?".to_string(),
            (Some(_), Some(lag)) => lag.to_string(),
            (Some(applied), None) => format!("applied {applied}"),
        };
        format!("{}{learner}:{lag}", r.node)
    });
    format!("lag {}", each.collect::<Vec<_>>().join(" "))
}

/// Prints the overview: one JSON object, or sections of text.
pub async fn run(args: StatusArgs, global: &GlobalArgs, out: Output) -> anyhow::Result<()> {
    let table = crate::admin::routing_table(&args.nodes, TABLE_PATIENCE).await?;
    if args.hot {
        return hot(&table, &args, out).await;
    }
    let (health, replicas) = tokio::join!(group_health(&global.endpoints, &table.groups), replica_health(&table));
    let reachable = replicas.iter().flatten().any(|r| r.applied.is_some());
    let problems: Vec<String> = table
        .groups
        .iter()
        .zip(&health)
        .zip(&replicas)
        .flat_map(|((g, h), r)| group_problem(g, h, r, &table.nodes, reachable).into_iter().chain(failed_replicas(g, r)))
        .collect();
    let routes = routes(&table);
    // Replica moves in flight (repairs, drains, balancing): the learner each is adding.
    let moves: Vec<(u64, u64)> =
        table.groups.iter().flat_map(|g| g.learners.iter().map(move |learner| (g.descriptor.as_ref().map_or(0, |d| d.group_id), *learner))).collect();
    let value = json!({
        "routing_version": table.version,
        "nodes": table.nodes.iter().map(node_json).collect::<Vec<_>>(),
        "groups": table.groups.iter().zip(&health).zip(&replicas).map(|((g, h), r)| {
            let mut group = group_json(g, Some(*h), &table.nodes);
            group["replica_states"] = replicas_json(r);
            group
        }).collect::<Vec<_>>(),
        "routes": routes.iter().copied().map(route_json).collect::<Vec<_>>(),
        "moves": moves.iter().map(|(group, learner)| json!({ "group": group, "learner": learner })).collect::<Vec<_>>(),
        "scheduler_paused": table.scheduler_paused,
        "healthy": problems.is_empty(),
        "problems": problems,
    });
    out.emit(value, || {
        let mut lines = vec![format!("routing version {}", table.version), String::new(), format!("nodes ({}):", table.nodes.len())];
        lines.extend(table.nodes.iter().map(|n| format!("  {}", node_text(n))));
        lines.push(String::new());
        lines.push(format!("groups ({}):", table.groups.len()));
        lines.extend(
            table
                .groups
                .iter()
                .zip(&health)
                .zip(&replicas)
                .map(|((g, h), r)| format!("  {}  {}", group_text(g, Some(*h), &table.nodes), replicas_text(r))),
        );
        lines.push(String::new());
        lines.push(format!("routes ({}):", routes.len()));
        lines.extend(routes.iter().map(|g| format!("  {}", route_text(g))));
        lines.push(String::new());
        let paused = if table.scheduler_paused { " (balancing paused)" } else { "" };
        lines.push(format!("replica moves running ({}){paused}:", moves.len()));
        lines.extend(moves.iter().map(|(group, learner)| format!("  group {group}: adding a replica on node {learner}")));
        lines.push(String::new());
        match problems.is_empty() {
            true => lines.push("healthy: every group has a leader and a quorum plus one live voters".into()),
            false => lines.extend(std::iter::once("UNHEALTHY:".to_string()).chain(problems.iter().map(|p| format!("  {p}")))),
        }
        lines.join("\n")
    })?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ExitWith(EXIT_UNHEALTHY).into())
    }
}

/// A subtree and how many writes per second it took.
struct Hot {
    path: String,
    group: u64,
    writes_per_s: f64,
}

/// `warden status --hot`: reads each ready group's write counts twice from one of its
/// replicas on an up node, and lists the children of group prefixes that took the most writes
/// per second in between.
async fn hot(table: &RoutingTable, args: &StatusArgs, out: Output) -> anyhow::Result<()> {
    let groups: Vec<(u64, String, String)> = routes(table)
        .into_iter()
        .filter_map(|group| {
            let descriptor = group.descriptor.as_ref()?;
            let node = descriptor.replicas.iter().find_map(|id| table.nodes.iter().find(|n| n.id == *id && n.up))?;
            Some((descriptor.group_id, descriptor.prefix.clone(), node.addr.clone()))
        })
        .collect();
    let read = |(group_id, _, addr): &(u64, String, String)| {
        let (group_id, addr) = (*group_id, addr.clone());
        async move {
            let channel = crate::tls_args::node_channel(&addr).ok()?;
            let mut client = warden_proto::placement::placement_client::PlacementClient::new(channel);
            let request = warden_proto::placement::GroupWritesRequest { group_id };
            let answer = tokio::time::timeout(LEADER_PATIENCE, client.group_writes(request)).await.ok()?.ok()?;
            answer.into_inner().writes
        }
    };
    let before = futures::future::join_all(groups.iter().map(read)).await;
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(args.hot_window_ms)).await;
    let after = futures::future::join_all(groups.iter().map(read)).await;
    let seconds = started.elapsed().as_secs_f64().max(0.001);
    let mut hot: Vec<Hot> = Vec::new();
    for ((group, prefix, _), (before, after)) in groups.iter().zip(before.into_iter().zip(after)) {
        let (Some(before), Some(after)) = (before, after) else { continue };
        for (child, writes) in &after.writes {
            let delta = writes.saturating_sub(before.writes.get(child).copied().unwrap_or(0));
            if delta > 0 {
                let path = warden_paths::join(prefix, child);
                hot.push(Hot { path, group: *group, writes_per_s: delta as f64 / seconds });
            }
        }
    }
    hot.sort_by(|a, b| b.writes_per_s.total_cmp(&a.writes_per_s));
    hot.truncate(args.hot_top);
    let value = json!({
        "window_ms": args.hot_window_ms,
        "hot": hot.iter().map(|h| json!({ "path": h.path, "group": h.group, "writes_per_s": h.writes_per_s })).collect::<Vec<_>>(),
    });
    Ok(out.emit(value, || {
        let mut lines = vec![format!("hottest subtrees over {} ms ({}):", args.hot_window_ms, hot.len())];
        lines.extend(hot.iter().map(|h| format!("  {:<30} {:>10.1} writes/s  group {}", h.path, h.writes_per_s, h.group)));
        lines.join("\n")
    })?)
}

/// Asks the routers at `endpoints` for each group's leader (unknown when no router answers).
pub(crate) async fn group_health(endpoints: &[String], groups: &[GroupEntry]) -> Vec<GroupHealth> {
    let Some(channel) = endpoints.first().and_then(|addr| crate::tls_args::node_channel(addr).ok()) else {
        return vec![GroupHealth::default(); groups.len()];
    };
    let asks = groups.iter().map(|group| {
        let mut client = WardenClient::new(channel.clone());
        let group_id = group.descriptor.as_ref().map_or(0, |d| d.group_id);
        async move {
            let routing = Some(pb::Routing { group_id, ..pb::Routing::default() });
            match tokio::time::timeout(LEADER_PATIENCE, client.sync(pb::SyncRequest { routing })).await {
                Ok(Ok(response)) => {
                    let header = response.into_inner().header.unwrap_or_default();
                    GroupHealth { leader: (header.leader_id != 0).then_some(header.leader_id), revision: Some(header.revision) }
                }
                _ => GroupHealth::default(),
            }
        }
    });
    futures::future::join_all(asks).await
}

/// The routed groups in prefix order.
pub fn routes(table: &RoutingTable) -> Vec<&GroupEntry> {
    let mut routed: Vec<&GroupEntry> = table.groups.iter().filter(|g| g.ready && g.descriptor.is_some()).collect();
    routed.sort_by(|a, b| prefix(a).cmp(prefix(b)));
    routed
}

fn prefix(group: &GroupEntry) -> &str {
    group.descriptor.as_ref().map_or("", |d| d.prefix.as_str())
}

/// A node of the table as JSON.
pub fn node_json(node: &NodeEntry) -> Value {
    json!({
        "id": node.id,
        "addr": node.addr,
        "zone": node.zone,
        "up": node.up,
        "state": node_state_name(node),
        "last_heartbeat_ms": node.last_heartbeat_ms,
    })
}

/// A node's operator state in lower case (`serving`, `draining`, `decommissioning`, `tombstone`).
fn node_state_name(node: &NodeEntry) -> &'static str {
    match NodeState::try_from(node.state) {
        Ok(NodeState::Serving) => "serving",
        Ok(NodeState::Draining) => "draining",
        Ok(NodeState::Decommissioning) => "decommissioning",
        Ok(NodeState::Tombstone) => "tombstone",
        Err(_) => "unknown",
    }
}

/// A node of the table as one line.
pub fn node_text(node: &NodeEntry) -> String {
    let zone = if node.zone.is_empty() { "-" } else { &node.zone };
    let heartbeat = match node.last_heartbeat_ms {
        0 => "never".to_string(),
        ms => rfc3339(std::time::UNIX_EPOCH + Duration::from_millis(ms)),
    };
    let up = if node.up { "up" } else { "DOWN" };
    format!("node {:<3} {:<21} zone {:<6} {up:<4} {:<15} last heartbeat {heartbeat}", node.id, node.addr, zone, node_state_name(node))
}

/// The voters of `group` on nodes the table reports down (or does not know).
fn dead_replicas(group: &GroupEntry, nodes: &[NodeEntry]) -> Vec<u64> {
    let voters = group.descriptor.as_ref().map_or(&[][..], |d| d.replicas.as_slice());
    voters.iter().copied().filter(|id| !nodes.iter().any(|n| n.id == *id && n.up)).collect()
}

/// A group of the table as JSON (with its leader and revision when asked for and known):
/// its voters (`replicas`), those on down nodes (`dead`) and the `learners` a move or repair
/// is adding.
pub fn group_json(group: &GroupEntry, health: Option<GroupHealth>, nodes: &[NodeEntry]) -> Value {
    let descriptor = group.descriptor.clone().unwrap_or_default();
    let mut value = json!({
        "id": descriptor.group_id,
        "prefix": descriptor.prefix,
        "excluded": descriptor.excluded,
        "replicas": descriptor.replicas,
        "dead": dead_replicas(group, nodes),
        "learners": group.learners,
        "conf_ver": descriptor.conf_ver,
        "version": descriptor.version,
        "ready": group.ready,
        "retired": group.retired,
        "merging_into": group.merging_into,
    });
    if let (Some(health), Value::Object(object)) = (health, &mut value) {
        object.insert("leader".into(), json!(health.leader));
        object.insert("revision".into(), json!(health.revision));
    }
    value
}

/// A group of the table as one line (with its leader and revision when asked for): voters on
/// down nodes are marked `!dead`, learners being added `+learner`.
pub fn group_text(group: &GroupEntry, health: Option<GroupHealth>, nodes: &[NodeEntry]) -> String {
    let descriptor = group.descriptor.clone().unwrap_or_default();
    let dead = dead_replicas(group, nodes);
    let voters = descriptor.replicas.iter().map(|id| if dead.contains(id) { format!("{id}!dead") } else { id.to_string() });
    let learners = group.learners.iter().map(|id| format!("{id}+learner"));
    let replicas = voters.chain(learners).collect::<Vec<_>>().join(",");
    let leader = health.map_or(String::new(), |h| {
        let revision = h.revision.map_or(String::new(), |r| format!(" revision {r}"));
        format!(" leader {}{revision}", h.leader.map_or("?".to_string(), |id| id.to_string()))
    });
    let ready = match (group.ready, group.retired, group.merging_into) {
        (_, true, _) => " (merged away: home of its sessions until they end)".to_string(),
        (true, false, 0) => String::new(),
        (true, false, into) => format!(" (merging into group {into})"),
        (false, false, _) => " (not ready)".to_string(),
    };
    format!("group {:<3} {:<20} replicas [{replicas}]{leader}{ready}", descriptor.group_id, display_prefix(&descriptor.prefix))
}

/// A route (a ready group's prefix) as JSON.
pub fn route_json(group: &GroupEntry) -> Value {
    let descriptor = group.descriptor.clone().unwrap_or_default();
    json!({ "prefix": descriptor.prefix, "group": descriptor.group_id, "excluded": descriptor.excluded })
}

/// A route as one line.
pub fn route_text(group: &GroupEntry) -> String {
    let descriptor = group.descriptor.clone().unwrap_or_default();
    let excluded = match descriptor.excluded.is_empty() {
        true => String::new(),
        false => format!(" (except {})", descriptor.excluded.join(", ")),
    };
    format!("{:<20} -> group {}{excluded}", display_prefix(&descriptor.prefix), descriptor.group_id)
}

/// The placement group has no prefix: shown as `-`.
fn display_prefix(prefix: &str) -> &str {
    if prefix.is_empty() {
        "-"
    } else {
        prefix
    }
}
