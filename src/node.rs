//! `warden node`: one shard-node process for a real deployment. Every node of a cluster is
//! started with the same peer list (`id=host:port`, its own entry included); then, once per
//! cluster, `warden admin bootstrap` creates the placement group and the root shard group.
//! Flags, or a JSON config file with the same names (`--config node.json`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use warden_engine::config::HIBERNATE_AFTER_TICKS_DEFAULT;
use warden_engine::host::drain::DrainLimits;
use warden_engine::transport::{NetFaults, PeerDirectory};
use warden_engine::{FatalPolicy, NodeConfig};
use warden_placement::{AutoSplit, PlacementConfig};
use warden_shard_node::node_services::ApiServices;
use warden_shard_node::placement::ShardNodeFactory;
use warden_shard_node::Listeners;
use warden_shard_node::Node;

/// Flags of `warden node`.
#[derive(clap::Args, serde::Deserialize)]
pub struct NodeArgs {
    /// A JSON file with these settings (`id`, `listen`, `client_listen`, `data_dir`, `peers`, `zone`,
    /// `hibernate_after_ticks`, `down_after_ms`); flags given as well are ignored.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// This node's id (positive, unique in the cluster).
    #[arg(long, default_value_t = 0)]
    #[serde(default)]
    id: u64,
    /// Where to listen: the peer port (raft transport, placement's internal calls, session
    /// checks, the public API forwarded by routers). With TLS, only nodes and routers may
    /// connect.
    #[arg(long, default_value = "127.0.0.1:7101")]
    listen: std::net::SocketAddr,
    /// Where to listen for clients and the CLI (the public API and placement's
    /// administration; none of the internal calls). None: no client port.
    #[arg(long)]
    #[serde(default)]
    client_listen: Option<std::net::SocketAddr>,
    /// Where to serve Prometheus metrics (`GET /metrics`). None: not served.
    #[arg(long)]
    #[serde(default)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Data directory (created if missing).
    #[arg(long, default_value = "warden-node")]
    data_dir: PathBuf,
    /// Every node of the cluster, `id=host:port`, comma-separated (this one included).
    #[arg(long, value_delimiter = ',', value_parser = parse_peer)]
    #[serde(default)]
    peers: Vec<(u64, std::net::SocketAddr)>,
    /// Failure-domain label: placement spreads a group's replicas over zones.
    #[arg(long, default_value = "")]
    #[serde(default)]
    zone: String,
    /// Ticks (100 ms) a group's leader waits without a request before the group hibernates:
    /// stops ticking and heartbeating on every replica until a request comes. 0: never; the
    /// default is 20 (`HIBERNATE_AFTER_TICKS_DEFAULT`).
    #[arg(long, default_value_t = HIBERNATE_AFTER_TICKS_DEFAULT)]
    #[serde(default = "hibernate_after_ticks_default")]
    hibernate_after_ticks: u64,
    /// Milliseconds a node may go without a heartbeat before the placement leader replaces
    /// its replicas on other nodes (read only while this node leads placement: give every
    /// node the same value).
    #[arg(long, default_value_t = down_after_ms_default())]
    #[serde(default = "down_after_ms_default")]
    down_after_ms: u64,
    /// Propose the split of a top-level child of a group's prefix that takes at least this
    /// many writes per second for three 10 s windows in a row (logged; 0: off). Read while
    /// this node leads placement: give every node the same value.
    #[arg(long, default_value_t = 0)]
    #[serde(default)]
    auto_split: u64,
    /// Perform the splits `--auto-split` proposes (`warden admin split` otherwise).
    #[arg(long)]
    #[serde(default)]
    auto_split_perform: bool,
}

fn hibernate_after_ticks_default() -> u64 {
    HIBERNATE_AFTER_TICKS_DEFAULT
}

fn down_after_ms_default() -> u64 {
    PlacementConfig::default().down_after_ms
}

fn parse_peer(text: &str) -> Result<(u64, std::net::SocketAddr), String> {
    let (id, addr) = text.split_once('=').ok_or_else(|| format!("{text}: expected id=host:port"))?;
    let id: u64 = id.parse().map_err(|e| format!("{text}: node id: {e}"))?;
    let addr = addr.parse().map_err(|e| format!("{text}: address: {e}"))?;
    Ok((id, addr))
}

/// Runs the node until Ctrl-C or SIGTERM, with TLS when `tls` sets it up.
pub async fn run(args: NodeArgs, tls: &crate::tls_args::TlsArgs) -> anyhow::Result<()> {
    let args = match &args.config {
        Some(path) => serde_json::from_slice::<NodeArgs>(&std::fs::read(path)?).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        None => args,
    };
    anyhow::ensure!(args.id > 0, "--id must be a positive node id");
    let peers: BTreeMap<u64, std::net::SocketAddr> = args.peers.iter().copied().collect();
    anyhow::ensure!(peers.contains_key(&args.id), "--peers must include this node ({})", args.id);
    let directory = Arc::new(PeerDirectory::new());
    for (id, addr) in &peers {
        directory.insert(*id, *addr);
    }
    std::fs::create_dir_all(&args.data_dir)?;
    // Tests only: a torture run steps or drifts this node's wall clock.
    warden_engine::wall_clock::follow_test_offset();
    let mut config = NodeConfig::new(args.id, args.data_dir.clone());
    config.zone = args.zone.clone();
    config.hibernate_after_ticks = args.hibernate_after_ticks;
    config.metrics_listen = args.metrics_listen;
    // A node that cannot go on ends the process, for its supervisor to restart.
    config.fatal = FatalPolicy::Abort;
    config.tls = tls.load()?;
    if let Some(tls) = &config.tls {
        let identity = tls.identity().ok_or_else(|| anyhow::anyhow!("a node needs a certificate of its own (--cert, --key)"))?;
        anyhow::ensure!(identity.node_id() == Some(args.id), "the certificate names {identity}, not node {}", args.id);
    }
    let listeners =
        Listeners { peer: std::net::TcpListener::bind(args.listen)?, client: args.client_listen.map(std::net::TcpListener::bind).transpose()? };
    // Peers reach this node at its advertised address (its `--peers` entry).
    // One factory for the state machines and the services: the placement API follows the
    // routing version the placement replica publishes through it.
    let auto_split = (args.auto_split > 0).then(|| AutoSplit::new(args.auto_split, args.auto_split_perform));
    let placement = PlacementConfig { down_after_ms: args.down_after_ms, auto_split, ..PlacementConfig::default() };
    let factory = Arc::new(ShardNodeFactory { placement, ..ShardNodeFactory::default() });
    let services = ApiServices::new(factory.clone());
    let secure = if config.tls.is_some() { "TLS" } else { "plaintext" };
    let node = Node::start(config, listeners, directory.clone(), Arc::new(NetFaults::new()), factory, Some(&services))?;
    directory.insert(args.id, peers[&args.id]);
    let clients = args.client_listen.map(|addr| format!(", clients on {addr}")).unwrap_or_default();
    let clients = match node.metrics_addr() {
        Some(addr) => format!("{clients}, metrics on http://{addr}/metrics"),
        None => clients,
    };
    println!("node {} listening on {}{clients} ({secure}; data in {})", args.id, args.listen, args.data_dir.display());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        stop = tokio::signal::ctrl_c() => stop?,
        _ = terminate.recv() => {}
    }
    // A graceful stop: leaderships handed over, what is in flight answered (a second signal
    // cuts it short).
    tracing::info!(node = args.id, "stopping: handing over its leaderships");
    tokio::select! {
        report = node.drainer().drain(DrainLimits::default()) => {
            let (took_ms, transfers, still_led) = (report.took.as_millis() as u64, report.transfers, report.still_led);
            tracing::info!(node = args.id, took_ms, transfers, ?still_led, in_flight = report.proposals_in_flight, "drained");
        }
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    drop(node);
    Ok(())
}
