//! `warden bench router`: writes through a router to an in-process 5-node cluster with a
//! placement group (fsync on, 5 replicas per group): aggregate writes/s for 1, 4 and 16 shard
//! groups at the same total client count, and the latency the router adds (one client, the
//! same writes straight to the group's leader and then through the router). Server CPU per
//! write counts the cluster's and the router's threads ([`super::SERVER_THREADS`]), not the
//! clients'; the added-latency line has it for each of its two runs (`direct_…`, `router_…`;
//! its `server_cpu_us_per_op` and `server_cpu_cores` are the run through the router's) and
//! their difference, the CPU the router adds per write (with one client, much of each run's
//! CPU is the idle cluster's ticks and heartbeats, so per write it is high). With `--tls`,
//! every link is mutual TLS (a throwaway CA), to compare with the same run in plaintext.

use std::time::Duration;

use serde_json::json;
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::GetRoutingTableRequest;
use warden_proto::tls::Expected;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::*;

/// Flags of `warden bench router`.
#[derive(clap::Args)]
pub struct RouterArgs {
    /// Shard-group counts to run (groups `/g0`, `/g1`, …; the root group stays idle).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    groups: Vec<usize>,
    #[command(flatten)]
    load: super::ClosedLoop,
    #[command(flatten)]
    data_dir: super::DataDir,
    /// TLS on every link (a throwaway CA): client → router, router → node, node ↔ node, and
    /// the direct run as a router would call the node.
    #[arg(long)]
    tls: bool,
}

/// Runs every group count, then the added-latency pair, one JSON line each.
pub async fn run(args: RouterArgs) -> anyhow::Result<()> {
    let root = args.data_dir.root();
    let dir = super::fresh_dir(&root, "router")?;
    let groups_max = args.groups.iter().copied().max().unwrap_or(1).max(1);
    let prefixes: Vec<String> = (0..groups_max).map(|group| format!("/g{group}")).collect();
    let routed = super::RoutedCluster::start(dir, &prefixes, args.tls).await?;
    let cluster = routed.cluster.clone();
    let through_router = WardenClient::new(routed.channel(routed.router_addr, Expected::Router).await?);
    let value = vec![b'v'; 256];
    // Client c of a run over n groups writes its own key in group c mod n.
    let key = |client: usize, groups: usize| format!("/g{}/k{client}", client % groups.max(1));
    let keys: std::collections::BTreeSet<String> = args.groups.iter().flat_map(|g| (0..args.load.clients).map(move |c| key(c, *g))).collect();
    for path in keys {
        through_router.clone().create(CreateRequest { path, data: value.clone(), ..CreateRequest::default() }).await?;
    }
    let warmup = Duration::from_secs(1);
    let measure = Duration::from_secs(args.load.seconds);
    for &groups in &args.groups {
        let groups = groups.max(1);
        let cpu = super::ServerCpu::window(warmup, measure);
        let report = warden_loadgen::closed_loop(args.load.clients, warmup, measure, {
            let (router, value) = (through_router.clone(), value.clone());
            move |client, _| {
                let path = key(client, groups);
                let (mut router, value) = (router.clone(), value.clone());
                async move { router.set(SetRequest { path, data: value, ..SetRequest::default() }).await.map(drop) }
            }
        })
        .await;
        let mut line = json!({"bench": "router", "tls": args.tls, "groups": groups, "clients": args.load.clients, "writes_per_sec": report.ops_per_sec,
                              "p50_ms": report.p50_ms, "p99_ms": report.p99_ms, "errors": report.errors});
        cpu.finish(report.ops).await?.insert(&mut line);
        println!("{line}");
    }
    // Added latency: one client, the same key, straight to the leader of its group, then
    // through the router.
    let table = {
        let leader = cluster.wait_leader(PLACEMENT_GROUP_ID, Duration::from_secs(30)).await?;
        let addr = cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address"))?;
        PlacementClient::new(routed.channel(addr, Expected::AnyNode).await?).get_routing_table(GetRoutingTableRequest {}).await?.into_inner()
    };
    let group = table
        .groups
        .iter()
        .filter_map(|g| g.descriptor.as_ref())
        .find(|d| d.prefix == "/g0")
        .map(|d| d.group_id)
        .ok_or_else(|| anyhow::anyhow!("no /g0"))?;
    let leader = cluster.wait_leader(group, Duration::from_secs(30)).await?;
    let direct = WardenClient::new(routed.channel(cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address"))?, Expected::Node(leader)).await?);
    let mut runs = Vec::new();
    for (name, client) in [("direct", direct), ("router", through_router)] {
        let cpu = super::ServerCpu::window(warmup, measure);
        let report = warden_loadgen::closed_loop(1, warmup, measure, {
            let value = value.clone();
            move |_, _| {
                let (mut client, value) = (client.clone(), value.clone());
                let routing = (name == "direct").then_some(Routing { group_id: group, ..Routing::default() });
                async move { client.set(SetRequest { path: "/g0/k0".into(), data: value, routing, ..SetRequest::default() }).await.map(drop) }
            }
        })
        .await;
        let cpu = cpu.finish(report.ops).await?;
        runs.push((report, cpu));
    }
    let [(direct, direct_cpu), (via_router, router_cpu)] = [&runs[0], &runs[1]];
    println!(
        "{}",
        json!({"bench": "router", "tls": args.tls, "run": "added_latency", "clients": 1,
               "direct_p50_ms": direct.p50_ms, "direct_p99_ms": direct.p99_ms,
               "router_p50_ms": via_router.p50_ms, "router_p99_ms": via_router.p99_ms,
               "router_added_p50_ms": via_router.p50_ms - direct.p50_ms, "router_added_p99_ms": via_router.p99_ms - direct.p99_ms,
               "direct_server_cpu_us_per_op": direct_cpu.us_per_op, "router_server_cpu_us_per_op": router_cpu.us_per_op,
               "server_cpu_us_per_op": router_cpu.us_per_op, "server_cpu_cores": router_cpu.cores,
               "router_added_cpu_us_per_op": router_cpu.us_per_op.zip(direct_cpu.us_per_op).map(|(router, direct)| router - direct)})
    );
    drop(cluster);
    routed.finish()
}
