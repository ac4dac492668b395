//! `warden dev`: a complete local cluster on loopback for trying Warden out: five
//! shard-nodes, the placement group on three of them, a root shard group and a few example
//! groups, and one router in front. Data is kept across restarts (`--fresh` wipes it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;
use warden_engine::{EngineError, FatalPolicy};
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::channel::{self, ChannelSettings};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::CreateGroupRequest;
use warden_proto::tls::{Expected, Identity, Tls, TlsFiles};
use warden_server_kit::authority::{write_atomically, Authority};
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::placement::ShardNodeFactory;

/// Flags of `warden dev`.
#[derive(clap::Args)]
pub struct DevArgs {
    /// Data directory, kept across restarts.
    #[arg(long, default_value = "warden-data")]
    data_dir: PathBuf,
    /// Wipe the data directory first.
    #[arg(long)]
    fresh: bool,
    /// Port of node 1; node i listens on base + i - 1.
    #[arg(long, default_value_t = 7101)]
    base_port: u16,
    /// Where the router listens (clients connect here).
    #[arg(long, default_value = "127.0.0.1:7100")]
    router: std::net::SocketAddr,
    /// Where the router serves etcd's v3 API (etcdctl and etcd client libraries connect
    /// here; docs/etcd.md).
    #[arg(long, default_value = "127.0.0.1:2379")]
    etcd_listen: std::net::SocketAddr,
    /// Long-lived streams per node that carry the router's forwarded calls in batches (0: one
    /// unary gRPC call per request).
    #[arg(long, default_value_t = 1)]
    batch_streams: usize,
    /// Security on: TLS on every link with a throwaway CA and certificates for the nodes, the
    /// router and a client `root` under `<data-dir>/tls` (kept across restarts), a bearer
    /// token for `root` the router also accepts, ACLs enforced (`root` administers
    /// everything: `warden admin acl grant`), and client ports on the nodes (node i on
    /// base + 100 + i - 1). Prints the CLI's flags.
    #[arg(long)]
    secure: bool,
}

/// The metrics ports: the router's at base + 199, node i's at base + 200 + i - 1 (so two
/// dev clusters with other base ports never share one).
const METRICS_PORT_OFFSET: u16 = 200;

/// The certificates of a secure `warden dev`.
struct DevTls {
    dir: PathBuf,
    /// The router's; also what `warden dev` itself uses to reach the nodes.
    router: Arc<Tls>,
    /// The client `root`'s files, for the CLI.
    client: TlsFiles,
    /// A bearer token naming `root` (the router accepts it instead of a certificate).
    root_token: String,
}

impl DevTls {
    /// The CA and certificates under `data_dir/tls`; the router's names `hosts` (where it
    /// listens) beside loopback's.
    fn make(data_dir: &std::path::Path, hosts: &[String]) -> anyhow::Result<DevTls> {
        let dir = data_dir.join("tls");
        let authority = Authority::load_or_create(&dir, "warden dev CA")?;
        // The token of `root`, made once: the router's token file holds its hash.
        let token_file = dir.join("root.token");
        let tokens_file = dir.join("tokens");
        if !token_file.exists() {
            let token = warden_proto::tls::tokens::generate()?;
            // Secrets, each written in one step: the token last, so a crash between leaves
            // no token and the next start makes both again.
            write_atomically(&tokens_file, &format!("{}\n", warden_proto::tls::tokens::line("root", &token)), 0o600)?;
            write_atomically(&token_file, &token, 0o600)?;
        }
        let root_token = std::fs::read_to_string(&token_file)?.trim().to_string();
        let tokens = warden_proto::tls::Tokens::load(&tokens_file)?;
        let router = Tls::load_with_tokens(authority.issue_files_for(&dir, &Identity::router("dev"), hosts)?, Some(tokens))?;
        let client = authority.issue_files(&dir, &Identity::client("root"))?;
        Ok(DevTls { dir, router, client, root_token })
    }
}

const NODES: u64 = 5;
/// Nodes holding a replica of the placement group.
const PLACEMENT_VOTERS: [u64; 3] = [1, 2, 3];
/// Shard groups made for a fresh cluster, beside the root group.
const EXAMPLE_PREFIXES: [&str; 3] = ["/teams/payments", "/teams/search", "/config"];

/// Starts the cluster and the router, and waits for Ctrl-C.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if args.fresh && args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir)?;
    }
    std::fs::create_dir_all(&args.data_dir)?;
    // The addresses clients are told to connect to: a client that checks the name it asked
    // for (any standard TLS client) finds them in the router's certificate. (An unspecified
    // address is no name; loopback's are always in.)
    let hosts: Vec<String> = [args.router.ip(), args.etcd_listen.ip()].iter().filter(|ip| !ip.is_unspecified()).map(|ip| ip.to_string()).collect();
    let tls = args.secure.then(|| DevTls::make(&args.data_dir, &hosts)).transpose()?;
    let client_base_port = match args.secure {
        true => Some(args.base_port.checked_add(100).ok_or_else(|| anyhow::anyhow!("--base-port too high for client ports"))?),
        false => None,
    };
    let config = ClusterConfig {
        nodes: NODES,
        tick_ms: 100,
        base_port: Some(args.base_port),
        serve_api: true,
        fatal: FatalPolicy::Abort,
        tls_dir: tls.as_ref().map(|tls| tls.dir.clone()),
        client_base_port,
        metrics_base_port: Some(
            args.base_port.checked_add(METRICS_PORT_OFFSET).ok_or_else(|| anyhow::anyhow!("--base-port too high for metrics ports"))?,
        ),
        ..ClusterConfig::default()
    };
    let router_tls = tls.as_ref().map(|tls| tls.router.clone());
    let cluster = Arc::new(Cluster::start_at(config, Arc::new(ShardNodeFactory::default()), &args.data_dir)?);
    let first = cluster.handle(1).ok_or_else(|| anyhow::anyhow!("node 1 did not start"))?;
    match first.status(PLACEMENT_GROUP_ID).await {
        // Started before: every group is back from disk.
        Ok(_) => {
            cluster.wait_leader(PLACEMENT_GROUP_ID, Duration::from_secs(30)).await?;
        }
        Err(EngineError::GroupNotFound(_)) => {
            let root = cluster.bootstrap_placement(&PLACEMENT_VOTERS).await?;
            // The parent of two example groups, in the root group, so it lists them.
            let leader = cluster.wait_leader(root.group_id, Duration::from_secs(30)).await?;
            let addr = cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address for node {leader}"))?;
            // The setup is the system's own: made with a node's certificate (a router's speaks
            // only for the principals it forwards for).
            let setup_tls = cluster.tls(leader);
            let mut api = warden_proto::v1::warden_client::WardenClient::new(node_channel(addr, setup_tls.as_ref()).await?);
            api.create(warden_proto::v1::CreateRequest { path: "/teams".into(), ..Default::default() }).await?;
            for prefix in EXAMPLE_PREFIXES {
                create_group(&cluster, prefix, setup_tls.as_ref()).await?;
            }
        }
        Err(error) => return Err(error.into()),
    }
    let listener = tokio::net::TcpListener::bind(args.router).await?;
    let seeds = cluster.node_ids().into_iter().filter_map(|id| cluster.addr(id)).map(|a| a.to_string()).collect();
    // A busy etcd port (a local etcd) costs only the etcd API, not the cluster.
    let etcd_listener = match std::net::TcpListener::bind(args.etcd_listen) {
        Ok(listener) => Some(Arc::new(listener)),
        Err(error) => {
            eprintln!("etcd v3 API not served: {} is taken ({error}); pass --etcd-listen ADDR", args.etcd_listen);
            None
        }
    };
    let router_metrics = std::net::SocketAddr::from(([127, 0, 0, 1], args.base_port + METRICS_PORT_OFFSET - 1));
    let router = tokio::spawn(warden_router::serve(
        listener,
        warden_router::RouterConfig {
            batch_streams: args.batch_streams,
            tls: router_tls,
            metrics_listen: Some(Arc::new(std::net::TcpListener::bind(router_metrics)?)),
            etcd_listen: etcd_listener.clone(),
            ..warden_router::RouterConfig::new(seeds)
        },
    ));
    for id in cluster.node_ids() {
        let clients = cluster.client_addr(id).map(|addr| format!(", clients: {addr}")).unwrap_or_default();
        let metrics = cluster.metrics_addr(id).map(|addr| format!(", metrics: http://{addr}/metrics")).unwrap_or_default();
        println!("node {id}: 127.0.0.1:{}{clients}{metrics}", u64::from(args.base_port) + id - 1);
    }
    println!("router metrics: http://{router_metrics}/metrics");
    let router_addr = args.router;
    println!("placement group on nodes 1-3; shard groups for / and {}", EXAMPLE_PREFIXES.join(", "));
    println!("router (the whole warden.v1.Warden API, forwarded by path): {router_addr}. Try:");
    // The CLI's default endpoint is the default router address.
    let mut endpoints = if router_addr.to_string() == "127.0.0.1:7100" { String::new() } else { format!(" --endpoints {router_addr}") };
    if let Some(tls) = &tls {
        let files = &tls.client;
        println!("  (security on: the CLI needs the client root's certificate; or export WARDEN_CA, WARDEN_CERT, WARDEN_KEY)");
        println!("  (or, through the router, root's bearer token: --ca {} --token {})", files.ca.display(), tls.root_token);
        endpoints.push_str(&format!(" --ca {} --cert {} --key {}", files.ca.display(), files.cert.display(), files.key.display()));
    }
    println!("  warden{endpoints} create /teams/payments/hello world");
    println!("  warden{endpoints} ls -l /teams");
    println!("  warden{endpoints} lock /teams/payments/lock -- sh -c 'echo holding with token $WARDEN_FENCING_TOKEN; sleep 5'");
    let nodes = match (client_base_port, args.base_port) {
        (Some(client_port), _) => format!(" --nodes 127.0.0.1:{client_port}{endpoints}"),
        (None, 7101) => String::new(),
        (None, base_port) => format!(" --nodes 127.0.0.1:{base_port}"),
    };
    println!("cluster status: warden status{nodes}");
    match (&etcd_listener, &tls) {
        (None, _) => {}
        (Some(_), None) => println!("etcd v3 API: etcdctl --endpoints {} put /teams/payments/hello world", args.etcd_listen),
        (Some(_), Some(_)) => println!("etcd v3 API: {} (TLS, with the client certificate above)", args.etcd_listen),
    }
    println!("data in {}; Ctrl-C stops", args.data_dir.display());
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    router.abort();
    drop(cluster);
    Ok(())
}

/// A channel to the node at `addr` (its peer port), with `tls` when it is on.
async fn node_channel(addr: std::net::SocketAddr, tls: Option<&Arc<Tls>>) -> anyhow::Result<Channel> {
    Ok(channel::connect(&addr.to_string(), tls, &ChannelSettings::new(Expected::AnyNode)).await?)
}

/// Has the placement leader create a shard group for `prefix`.
async fn create_group(cluster: &Cluster, prefix: &str, tls: Option<&Arc<Tls>>) -> anyhow::Result<()> {
    let leader = cluster.wait_leader(PLACEMENT_GROUP_ID, Duration::from_secs(30)).await?;
    let addr = cluster.addr(leader).ok_or_else(|| anyhow::anyhow!("no address for node {leader}"))?;
    let mut client = PlacementClient::new(node_channel(addr, tls).await?);
    client.create_group(CreateGroupRequest { prefix: prefix.into() }).await?;
    Ok(())
}
