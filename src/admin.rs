//! `warden admin`: cluster administration against the placement API of any node.

use std::time::Duration;

use tokio::time::Instant;

use crate::tls_args::CommandChannel;
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::follow::{CallKind, Follow};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::*;
use warden_proto::tls::Identity;
use warden_server_kit::authority::Authority;

use warden_proto::v1::{ApplyLimits, QuotaLimits};

use crate::cli::status::{group_json, group_text, node_json, node_text, route_json, route_text, routes};
use crate::cli::Output;

/// Default `--seeds`: the placement replicas of `warden dev`.
const DEV_SEEDS: &str = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

/// `warden admin` subcommands.
#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Once per cluster: create the placement group on `--placement` nodes, register every
    /// node and start the root shard group.
    Bootstrap {
        /// Every node, `id=host:port`, comma-separated.
        #[arg(long, value_delimiter = ',', value_parser = parse_node)]
        nodes: Vec<(u64, String)>,
        /// Nodes holding the placement group's replicas (3 or 5).
        #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
        placement: Vec<u64>,
    },
    /// Create a shard group for a path prefix.
    CreateGroup {
        /// The prefix (an absolute path).
        prefix: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// List the shard groups of the routing table (id, prefix, replicas, readiness).
    Groups {
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// List the routes: which group serves each prefix.
    Routes {
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Move every leader, then every replica, off a node (for maintenance); it keeps serving
    /// meanwhile. The scheduler does the moves; `warden status` shows them.
    Drain {
        /// The node's id.
        node: u64,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Make a draining (or decommissioning) node serving again; balancing may fill it.
    Undrain {
        /// The node's id.
        node: u64,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Drain a node, then remove it from placement for good: once it hosts nothing it becomes
    /// a tombstone, and its id is never used again.
    Decommission {
        /// The node's id.
        node: u64,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Remove the group serving exactly PREFIX, whose subtree must be empty (no children
    /// under the prefix node, no sessions homed in the group): the prefix (without its node)
    /// returns to the group serving the parent path and the group's replicas are destroyed.
    /// Safe to run again if it was interrupted.
    DropGroup {
        /// The group's prefix.
        prefix: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Make a CA (in DIR, kept: `ca.pem`, `ca.key`) if DIR has none, and certificates signed
    /// by it for nodes, routers and clients (`ROLE-NAME.pem` and `.key` in DIR), each naming
    /// its holder (`warden://node/ID`, …). For a small deployment; give each machine its own
    /// files and the CA's certificate, and keep `ca.key` off the machines.
    Certs {
        /// Directory of the CA and the certificates.
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Node ids to issue certificates for.
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<u64>,
        /// Router names to issue certificates for.
        #[arg(long, value_delimiter = ',')]
        routers: Vec<String>,
        /// Client (principal) names to issue certificates for.
        #[arg(long, value_delimiter = ',')]
        clients: Vec<String>,
        /// DNS names and IP addresses the nodes and routers are reached at, for clients that
        /// check the name they connect to (every certificate also names localhost,
        /// 127.0.0.1 and ::1).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
    },
    /// Give the existing subtree at PREFIX, with its data, locks and ephemerals, to a new
    /// shard group while clients use it: writes to the subtree pause while it moves
    /// (routers retry them); nothing else pauses. Safe to run again if it was interrupted.
    Split {
        /// The subtree's root (an absolute path below the prefix of the group serving it).
        prefix: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Give the whole subtree of the group serving exactly PREFIX, with its data, locks and
    /// ephemerals, back to the group serving the parent path while clients use it, and
    /// remove the group: the reverse of `split`. Refused while sessions are homed in the
    /// group (they must close or expire first). Safe to run again if it was interrupted.
    Merge {
        /// The merging group's prefix.
        prefix: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Make a bearer token for PRINCIPAL: prints the token (give it to the client, as
    /// --token or WARDEN_TOKEN) and the line to append to the servers' --tokens file (it holds
    /// only the token's SHA-256).
    Token {
        /// The principal the token names.
        principal: String,
    },
    /// Who may do what where, with security on (`warden admin acl --help`).
    Acl {
        /// What to do.
        #[command(subcommand)]
        action: AclAction,
    },
    /// Subtree quotas: how many nodes, bytes, sessions, lock waiters and watches a prefix
    /// may hold (`warden admin quota --help`).
    Quota {
        /// What to do.
        #[command(subcommand)]
        action: QuotaAction,
    },
    /// The limits every group checks when it applies a command (value size, transaction
    /// operations, session TTLs …): replicated, so a rolling upgrade that changes a default
    /// cannot make replicas disagree (`warden admin limits --help`).
    Limits {
        /// What to do.
        #[command(subcommand)]
        action: LimitsAction,
    },
    /// Write a consistent backup of every shard group (each at one revision, read while
    /// writes go on) and of placement's state (routes, quotas, limits, ACL) to FILE. Sessions
    /// and their ephemeral nodes are not in it (docs/design/backup-restore.md).
    Backup {
        /// The backup file (written as FILE.partial, renamed once complete).
        #[arg(long)]
        out: std::path::PathBuf,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Restore a backup into a fresh cluster: its limits, quotas and ACL, a group for every
    /// prefix the backup has, and every group's nodes with their data and stat. Refused by a
    /// group that holds nodes already (but what a run of the same file restored: run it
    /// again to finish an interrupted restore).
    Restore {
        /// The backup file.
        #[arg(long)]
        from: std::path::PathBuf,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Pause or resume the balance schedulers (repair, drain and decommission keep running).
    Scheduler {
        /// `pause` or `resume`.
        action: SchedulerAction,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
}

/// What `warden admin acl` does. A grant holds at its prefix and everything below it; the
/// permissions are `read`, `write`, `lock` (sessions, ephemerals, locks), `watch`, `admin`
/// (all of them, and changing grants there) or `all`, comma-separated. `root` may do
/// everything; a grant may name a group of principals as `group:NAME`.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum AclAction {
    /// Grant PERMISSIONS at PREFIX to PRINCIPAL (needs `admin` at PREFIX).
    Grant {
        /// Where (and below).
        prefix: String,
        /// Whom: a principal, or `group:NAME`.
        principal: String,
        /// Comma-separated: read, write, lock, watch, admin, all.
        permissions: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Take PERMISSIONS at PREFIX away from PRINCIPAL (needs `admin` at PREFIX).
    Revoke {
        /// Where the grant is.
        prefix: String,
        /// Whom it is for.
        principal: String,
        /// Comma-separated: read, write, lock, watch, admin, all.
        permissions: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Put PRINCIPAL in the group GROUP (needs `admin` at `/`).
    Join {
        /// The group's name (grants name it `group:NAME`).
        group: String,
        /// The member.
        principal: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Take PRINCIPAL out of the group GROUP (needs `admin` at `/`).
    Leave {
        /// The group's name.
        group: String,
        /// The member.
        principal: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// List the grants at or below what the caller administers (and the groups, for an
    /// admin of `/`).
    List {
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
}

/// What `warden admin quota` does. A quota holds for its prefix and everything below it,
/// across every group serving that subtree; a write past it is refused RESOURCE_EXHAUSTED,
/// naming the quota. Sessions count where their path hint is (without one: under `/`);
/// watches count per node serving them.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum QuotaAction {
    /// Set the limits of the quota on PREFIX (needs `admin` at PREFIX); a limit not given is
    /// not limited. Setting it again replaces every limit.
    Set {
        /// The subtree.
        prefix: String,
        /// Nodes at or below PREFIX (PREFIX's own included).
        #[arg(long)]
        nodes: Option<u64>,
        /// Bytes of node data at or below PREFIX.
        #[arg(long)]
        bytes: Option<u64>,
        /// Sessions opened with a path hint at or below PREFIX.
        #[arg(long)]
        sessions: Option<u64>,
        /// Waiters (holders included) of the locks at or below PREFIX.
        #[arg(long)]
        lock_waiters: Option<u64>,
        /// Watches of paths at or below PREFIX, on each node serving them.
        #[arg(long)]
        watches: Option<u64>,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Remove the quota on PREFIX (needs `admin` at PREFIX).
    Remove {
        /// The subtree.
        prefix: String,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// List the quotas the caller administers: limits, usage summed over the groups, and
    /// each group's share and usage.
    List {
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
}

async fn quota(action: QuotaAction, out: Output) -> anyhow::Result<()> {
    let (seeds, request) = match action {
        QuotaAction::Set { prefix, nodes, bytes, sessions, lock_waiters, watches, seeds } => {
            let limits = QuotaLimits { nodes, bytes, sessions, lock_waiters, watches };
            (seeds, Some(SetQuotaRequest { prefix, limits: Some(limits), remove: false }))
        }
        QuotaAction::Remove { prefix, seeds } => (seeds, Some(SetQuotaRequest { prefix, limits: None, remove: true })),
        QuotaAction::List { seeds } => (seeds, None),
    };
    let quotas = match request {
        Some(request) => vec![
            at_any(&seeds, |mut c| {
                let request = request.clone();
                async move { c.set_quota(request).await }
            })
            .await?,
        ],
        None => at_any(&seeds, |mut c| async move { c.list_quotas(ListQuotasRequest {}).await }).await?.quotas,
    };
    for quota in quotas.iter().filter(|quota| quota.limits.is_some()) {
        let limits = quota.limits.unwrap_or_default();
        let usage = quota.usage.unwrap_or_default();
        let kinds = [
            ("nodes", limits.nodes, Some(usage.nodes)),
            ("bytes", limits.bytes, Some(usage.bytes)),
            ("sessions", limits.sessions, Some(usage.sessions)),
            ("lock_waiters", limits.lock_waiters, Some(usage.lock_waiters)),
            ("watches", limits.watches, None),
        ];
        let mut json = serde_json::json!({ "prefix": quota.prefix });
        let mut text = quota.prefix.clone();
        for (name, limit, used) in kinds {
            json[name] = serde_json::json!({ "limit": limit, "usage": used });
            if let Some(limit) = limit {
                match used {
                    Some(used) => text.push_str(&format!("\t{name} {used}/{limit}")),
                    None => text.push_str(&format!("\t{name} -/{limit} per node")),
                }
            }
        }
        json["groups"] = quota
            .shares
            .iter()
            .map(|share| {
                let (allotment, usage) = (share.allotment.unwrap_or_default(), share.usage.unwrap_or_default());
                serde_json::json!({
                    "group": share.group_id,
                    "share": [allotment.nodes, allotment.bytes, allotment.sessions, allotment.lock_waiters],
                    "usage": [usage.nodes, usage.bytes, usage.sessions, usage.lock_waiters],
                    "counting": share.counting,
                })
            })
            .collect();
        // A group still counting what it held: the usage is partial, and its share refuses nothing yet.
        let counting = quota.shares.iter().filter(|share| share.counting).count();
        if counting > 0 {
            text.push_str(&format!("\t(counting in {counting} groups: not enforced there yet)"));
        }
        out.emit(json, || text.clone())?;
    }
    if quotas.iter().all(|quota| quota.limits.is_none()) && !quotas.is_empty() {
        println!("quota removed");
    }
    Ok(())
}

/// What `warden admin limits` does (needs `admin` on `/`). Placement records the limits;
/// each group's leader proposes them to its group within a heartbeat or two.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum LimitsAction {
    /// Show the cluster's limits (a limit not shown is the first release's).
    Show {
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
    /// Change some limits (the others keep their value).
    Set {
        /// The limits to change.
        #[command(flatten)]
        changes: LimitChanges,
        /// Node addresses to ask (any node with a placement replica answers).
        #[arg(long, value_delimiter = ',', default_value = DEV_SEEDS)]
        seeds: Vec<String>,
    },
}

/// The limits `warden admin limits set` changes (each one not given keeps its value).
#[derive(Clone, Debug, clap::Args)]
pub struct LimitChanges {
    /// Largest node data, bytes.
    #[arg(long)]
    pub value_bytes_max: Option<u64>,
    /// Operations in one transaction.
    #[arg(long)]
    pub txn_ops_max: Option<u64>,
    /// Nodes one recursive delete may remove.
    #[arg(long)]
    pub recursive_delete_nodes_max: Option<u64>,
    /// Longest TTL of a TTL node, ms.
    #[arg(long)]
    pub ttl_ms_max: Option<u64>,
    /// Shortest session TTL granted, ms.
    #[arg(long)]
    pub session_ttl_ms_min: Option<u64>,
    /// Longest session TTL granted, ms.
    #[arg(long)]
    pub session_ttl_ms_max: Option<u64>,
    /// Ephemeral nodes one session may own.
    #[arg(long)]
    pub ephemerals_per_session_max: Option<u64>,
    /// Sessions one expiry entry ends at most.
    #[arg(long)]
    pub sessions_per_expiry_max: Option<u64>,
    /// Waiters one lock may have.
    #[arg(long)]
    pub lock_waiters_max: Option<u64>,
    /// Longest lock-delay, ms.
    #[arg(long)]
    pub lock_delay_ms_max: Option<u64>,
}

async fn limits(action: LimitsAction, out: Output) -> anyhow::Result<()> {
    let limits = match action {
        LimitsAction::Show { seeds } => at_any(&seeds, |mut c| async move { c.get_limits(GetLimitsRequest {}).await }).await?,
        LimitsAction::Set { changes, seeds } => {
            let changes = ApplyLimits {
                version: 0,
                value_bytes_max: changes.value_bytes_max,
                txn_ops_max: changes.txn_ops_max,
                recursive_delete_nodes_max: changes.recursive_delete_nodes_max,
                ttl_ms_max: changes.ttl_ms_max,
                session_ttl_ms_min: changes.session_ttl_ms_min,
                session_ttl_ms_max: changes.session_ttl_ms_max,
                ephemerals_per_session_max: changes.ephemerals_per_session_max,
                sessions_per_expiry_max: changes.sessions_per_expiry_max,
                lock_waiters_max: changes.lock_waiters_max,
                lock_delay_ms_max: changes.lock_delay_ms_max,
            };
            at_any(&seeds, |mut c| async move { c.set_limits(SetLimitsRequest { changes: Some(changes) }).await }).await?
        }
    };
    let named = [
        ("value_bytes_max", limits.value_bytes_max),
        ("txn_ops_max", limits.txn_ops_max),
        ("recursive_delete_nodes_max", limits.recursive_delete_nodes_max),
        ("ttl_ms_max", limits.ttl_ms_max),
        ("session_ttl_ms_min", limits.session_ttl_ms_min),
        ("session_ttl_ms_max", limits.session_ttl_ms_max),
        ("ephemerals_per_session_max", limits.ephemerals_per_session_max),
        ("sessions_per_expiry_max", limits.sessions_per_expiry_max),
        ("lock_waiters_max", limits.lock_waiters_max),
        ("lock_delay_ms_max", limits.lock_delay_ms_max),
    ];
    let mut json = serde_json::json!({ "version": limits.version });
    let mut text = format!("version {}", limits.version);
    for (name, value) in named {
        if let Some(value) = value {
            json[name] = serde_json::json!(value);
            text.push_str(&format!("\n{name} {value}"));
        }
    }
    out.emit(json, || text)?;
    Ok(())
}

/// The permission bits of a comma-separated list of their names.
fn parse_permissions(words: &str) -> anyhow::Result<u32> {
    words.split(',').map(str::trim).try_fold(0, |bits, word| match warden_placement::acl::permission_named(word) {
        Some(bit) => Ok(bits | bit),
        None => anyhow::bail!("unknown permission {word:?}: read, write, lock, watch, admin or all"),
    })
}

/// Runs `warden admin acl`.
async fn acl(action: AclAction, out: Output) -> anyhow::Result<()> {
    let (seeds, change, membership) = match action {
        AclAction::Grant { prefix, principal, permissions, seeds } => {
            (seeds, Some(ChangeAclRequest { prefix, principal, permissions: parse_permissions(&permissions)?, revoke: false }), None)
        }
        AclAction::Revoke { prefix, principal, permissions, seeds } => {
            (seeds, Some(ChangeAclRequest { prefix, principal, permissions: parse_permissions(&permissions)?, revoke: true }), None)
        }
        AclAction::Join { group, principal, seeds } => (seeds, None, Some(ChangeAclGroupRequest { group, principal, remove: false })),
        AclAction::Leave { group, principal, seeds } => (seeds, None, Some(ChangeAclGroupRequest { group, principal, remove: true })),
        AclAction::List { seeds } => (seeds, None, None),
    };
    let changed = match (change, membership) {
        (Some(request), _) => Some(
            at_any(&seeds, |mut c| {
                let request = request.clone();
                async move { c.change_acl(request).await }
            })
            .await?,
        ),
        (None, Some(request)) => Some(
            at_any(&seeds, |mut c| {
                let request = request.clone();
                async move { c.change_acl_group(request).await }
            })
            .await?,
        ),
        (None, None) => None,
    };
    if let Some(answer) = changed {
        println!("acl version {}", answer.version);
        return Ok(());
    }
    let list = at_any(&seeds, |mut c| async move { c.list_acl(ListAclRequest {}).await }).await?;
    for grant in &list.grants {
        let words = warden_placement::acl::permission_words(grant.permissions);
        let json = serde_json::json!({ "prefix": grant.prefix, "principal": grant.principal, "permissions": words });
        out.emit(json, || format!("{}\t{}\t{}", grant.prefix, grant.principal, words))?;
    }
    for group in &list.groups {
        let json = serde_json::json!({ "group": group.name, "members": group.members });
        out.emit(json, || format!("group:{}\t{}", group.name, group.members.join(",")))?;
    }
    Ok(())
}

/// What `warden admin scheduler` does.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SchedulerAction {
    /// Stop starting balance moves and leader transfers.
    Pause,
    /// Start them again.
    Resume,
}

/// How long the listings ask for the routing table before giving up.
const LISTING_PATIENCE: Duration = Duration::from_secs(5);

fn parse_node(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text.split_once('=').ok_or_else(|| format!("{text}: expected id=host:port"))?;
    Ok((id.parse().map_err(|e| format!("{text}: node id: {e}"))?, addr.to_string()))
}

fn client(addr: &str) -> anyhow::Result<PlacementClient<CommandChannel>> {
    Ok(PlacementClient::new(crate::tls_args::node_channel(addr)?))
}

/// Calls `call` on each of `addrs` in turn until one succeeds (the placement leader), for
/// up to 30 s.
async fn at_any<T, F, Fut>(addrs: &[String], call: F) -> anyhow::Result<T>
where
    F: Fn(PlacementClient<CommandChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    at_any_within(addrs, Duration::from_secs(30), call).await
}

/// The routing table, from any of `addrs`, trying for up to `patience`.
pub(crate) async fn routing_table(addrs: &[String], patience: Duration) -> anyhow::Result<RoutingTable> {
    at_any_within(addrs, patience, |mut c| async move { c.get_routing_table(GetRoutingTableRequest {}).await }).await
}

/// [`at_any`] for up to `patience`.
pub(crate) async fn at_any_within<T, F, Fut>(addrs: &[String], patience: Duration, call: F) -> anyhow::Result<T>
where
    F: Fn(PlacementClient<CommandChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    at_any_answer(addrs, patience, call).await?.map_err(|(addr, status)| anyhow::anyhow!("{addr}: {}", status.message()))
}

/// [`at_any_within`], answering a final refusal as the refusing node's address and status,
/// for a caller that acts on its code.
pub(crate) async fn at_any_answer<T, F, Fut>(addrs: &[String], patience: Duration, call: F) -> anyhow::Result<Result<T, (String, tonic::Status)>>
where
    F: Fn(PlacementClient<CommandChannel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    anyhow::ensure!(!addrs.is_empty(), "no node addresses given");
    // Retried by the rule of `warden_proto::follow`, as an idempotent call: another node (or
    // the same one later) may answer differently when this one is not the placement leader,
    // is unreachable or busy, or did not learn the outcome; anything else (an invalid
    // request, a refused state change) is final. The nodes are asked in turn (addresses name
    // no node ids, so a NOT_LEADER's hint cannot be followed).
    let mut follow = Follow::new(CallKind::Idempotent, Instant::now() + patience);
    loop {
        let addr = &addrs[follow.turn().attempt % addrs.len()];
        match call(client(addr)?).await {
            Ok(response) => return Ok(Ok(response.into_inner())),
            Err(status) => {
                tracing::debug!(%addr, %status, "placement call failed");
                if let Err(status) = follow.retry_after(status).await {
                    return Ok(Err((addr.clone(), status)));
                }
            }
        }
    }
}

/// Runs an admin command (the listings print JSON lines with `--json`).
pub async fn run(command: AdminCommand, out: Output, tls: &crate::tls_args::TlsArgs) -> anyhow::Result<()> {
    crate::tls_args::use_for_commands(tls)?;
    let merge = matches!(command, AdminCommand::Merge { .. });
    match command {
        AdminCommand::Bootstrap { nodes, placement } => {
            let root = bootstrap(&nodes, &placement).await?;
            println!("bootstrapped: placement on {placement:?}, root group on {root:?}");
        }
        AdminCommand::CreateGroup { prefix, seeds } => {
            let descriptor = create_group(&seeds, &prefix).await?;
            println!("group {} serves {} on nodes {:?}", descriptor.group_id, descriptor.prefix, descriptor.replicas);
        }
        AdminCommand::Groups { seeds } => {
            let table = routing_table(&seeds, LISTING_PATIENCE).await?;
            for group in &table.groups {
                out.emit(group_json(group, None, &table.nodes), || group_text(group, None, &table.nodes))?;
            }
        }
        AdminCommand::Routes { seeds } => {
            let table = routing_table(&seeds, LISTING_PATIENCE).await?;
            for group in routes(&table) {
                out.emit(route_json(group), || route_text(group))?;
            }
        }
        AdminCommand::Drain { node, seeds } => set_node_state(&seeds, node, NodeState::Draining, out).await?,
        AdminCommand::Undrain { node, seeds } => set_node_state(&seeds, node, NodeState::Serving, out).await?,
        AdminCommand::Decommission { node, seeds } => set_node_state(&seeds, node, NodeState::Decommissioning, out).await?,
        AdminCommand::DropGroup { prefix, seeds } | AdminCommand::Merge { prefix, seeds } => {
            let answer = at_any(&seeds, |mut c| {
                let request = RemoveGroupRequest { prefix: prefix.clone() };
                async move {
                    match merge {
                        true => c.merge_group(request).await,
                        false => c.remove_group(request).await,
                    }
                }
            })
            .await?;
            let how = if merge { " with its data" } else { "" };
            println!("group {} removed; {prefix} is served by group {}{how} now", answer.group_id, answer.parent_group_id);
        }
        AdminCommand::Certs { dir, nodes, routers, clients, hosts } => {
            let authority = Authority::load_or_create(&dir, "warden cluster CA")?;
            let identities = nodes
                .iter()
                .map(|id| Identity::node(*id))
                .chain(routers.iter().map(|name| Identity::router(name)))
                .chain(clients.iter().map(|name| Identity::client(name)));
            println!("CA: {}", dir.join("ca.pem").display());
            for identity in identities {
                let files = authority.issue_files_for(&dir, &identity, &hosts)?;
                println!("{identity}: --ca {} --cert {} --key {}", files.ca.display(), files.cert.display(), files.key.display());
            }
        }
        AdminCommand::Split { prefix, seeds } => {
            let answer = at_any(&seeds, |mut c| {
                let prefix = prefix.clone();
                async move { c.split_group(CreateGroupRequest { prefix }).await }
            })
            .await?;
            let descriptor = answer.group.and_then(|g| g.descriptor).unwrap_or_default();
            println!("group {} serves {} on nodes {:?} (split with its data)", descriptor.group_id, descriptor.prefix, descriptor.replicas);
        }
        AdminCommand::Acl { action } => acl(action, out).await?,
        AdminCommand::Quota { action } => quota(action, out).await?,
        AdminCommand::Limits { action } => limits(action, out).await?,
        AdminCommand::Token { principal } => {
            warden_placement::acl::validate_name(&principal)?;
            let token = warden_proto::tls::tokens::generate()?;
            println!("token: {token}");
            println!("tokens file line: {}", warden_proto::tls::tokens::line(&principal, &token));
        }
        AdminCommand::Backup { out: file, seeds } => {
            let summary = crate::backup::backup(&seeds, &file).await?;
            out.emit(summary.json(), || summary.text(&format!("backed up into {}:", file.display())))?;
        }
        AdminCommand::Restore { from, seeds } => {
            let summary = crate::backup::restore(&seeds, &from).await?;
            out.emit(summary.json(), || summary.text("restored"))?;
        }
        AdminCommand::Scheduler { action, seeds } => {
            let paused = matches!(action, SchedulerAction::Pause);
            at_any(&seeds, |mut c| async move { c.set_scheduler_paused(SetSchedulerPausedRequest { paused }).await }).await?;
            println!("balance schedulers {}", if paused { "paused" } else { "resumed" });
        }
    }
    Ok(())
}

/// Has the placement leader (asked through any of `seeds`) set node `node_id`'s state, and
/// prints the node as placement now describes it.
async fn set_node_state(seeds: &[String], node_id: u64, state: NodeState, out: Output) -> anyhow::Result<()> {
    let request = SetNodeStateRequest { node_id, state: state as i32 };
    let answer = at_any(seeds, |mut c| async move { c.set_node_state(request).await }).await?;
    let node = answer.node.unwrap_or_default();
    out.emit(node_json(&node), || node_text(&node))?;
    Ok(())
}

/// Once per cluster: creates the placement group's replicas on the `placement` nodes (ids
/// among `nodes`, `(id, host:port)`), then has it register every node and start the root
/// shard group. Returns the root group's replicas.
pub(crate) async fn bootstrap(nodes: &[(u64, String)], placement: &[u64]) -> anyhow::Result<Vec<u64>> {
    let addr_of = |id: u64| nodes.iter().find(|(n, _)| *n == id).map(|(_, a)| a.clone());
    let voters: Vec<String> =
        placement.iter().map(|id| addr_of(*id).ok_or_else(|| anyhow::anyhow!("node {id} is not in --nodes"))).collect::<Result<_, _>>()?;
    for (position, addr) in voters.iter().enumerate() {
        let request = CreateReplicaRequest { group_id: PLACEMENT_GROUP_ID, voters: placement.to_vec(), campaign: position == 0 };
        at_any(std::slice::from_ref(addr), |mut c| {
            let request = request.clone();
            async move { c.create_replica(request).await }
        })
        .await?;
    }
    let answer = at_any(&voters, |mut c| async move { c.bootstrap(BootstrapRequest {}).await }).await?;
    Ok(answer.root.and_then(|r| r.descriptor).map(|d| d.replicas).unwrap_or_default())
}

/// Has the placement leader (asked through any of `seeds`) create a shard group for `prefix`;
/// returns the new group's descriptor.
pub(crate) async fn create_group(seeds: &[String], prefix: &str) -> anyhow::Result<warden_proto::v1::GroupDescriptor> {
    let answer = at_any(seeds, |mut c| {
        let prefix = prefix.to_string();
        async move { c.create_group(CreateGroupRequest { prefix }).await }
    })
    .await?;
    Ok(answer.group.and_then(|g| g.descriptor).unwrap_or_default())
}
