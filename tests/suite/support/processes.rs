//! Real `warden` processes on loopback: five `warden node`s bootstrapped with `warden admin`
//! (placement on nodes 1-3, the root group and a group per prefix) behind a `warden router`,
//! with the faults only real processes have: SIGKILL (no destructor, no flush), a restart on
//! the same data directory with the same flags, and SIGSTOP/SIGCONT (a paused process, as a
//! GC pause or a VM stall would leave it). With test hosts (`ClusterOptions::hosts`), each
//! node runs on a host of its own (`warden_torture`), and the network between them can be cut.
//!
//! Every wait here is on a condition with a deadline; nothing sleeps to synchronise.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::Channel;
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{GetRoutingTableRequest, ReplicaStatusRequest};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::{Routing, SyncRequest};
use warden_testkit::{free_port, wait_until};
use warden_torture::{Host, TestNet};

/// The `warden` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_warden");

/// How many node processes a cluster has.
pub const NODES: u64 = 5;

/// The nodes holding placement replicas.
pub const PLACEMENT_NODES: [u64; 3] = [1, 2, 3];

/// How long one step (start, catch-up, a write after a restart) may take on a loaded machine.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between two probes of a condition.
const POLL: Duration = Duration::from_millis(50);

/// A child process killed (SIGKILL) when dropped.
pub struct Process(Child);

impl Process {
    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.0.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }

    /// Whether the process has exited (and been reaped).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too; `wait` reaps it, so its ports are free after.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `warden ARGS`, its stderr appended to `log` (so a restarted process adds to the
/// same file).
pub fn spawn(args: &[&str], log: &Path) -> Process {
    spawn_on(None, args, log)
}

/// [`spawn`] on test host `host` (`None`: on this machine). `ip netns exec` enters the
/// host's namespace and then becomes `warden`, so signals reach `warden` itself.
fn spawn_on(host: Option<&Host>, args: &[&str], log: &Path) -> Process {
    spawn_with(host, args, &[], log)
}

/// [`spawn_on`] with environment variables `env` set for the process.
fn spawn_with(host: Option<&Host>, args: &[&str], env: &[(&str, &Path)], log: &Path) -> Process {
    let log = OpenOptions::new().create(true).append(true).open(log).expect("log file");
    let mut command = host.map_or_else(|| Command::new(BIN), |host| host.command(BIN));
    command.envs(env.iter().copied());
    Process(command.args(args).stdout(Stdio::null()).stderr(log).spawn().expect("spawn warden"))
}

/// Runs `warden admin ARGS` to completion; panics with its stderr if it failed.
pub fn admin(args: &[&str]) {
    let output = Command::new(BIN).arg("admin").args(args).output().expect("run warden admin");
    assert!(output.status.success(), "warden admin {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// A lazily connected channel to `addr` whose calls give up after `timeout` (a paused
/// process never answers).
pub fn channel(addr: &str, timeout: Duration) -> Channel {
    Channel::from_shared(format!("http://{addr}")).expect("uri").connect_timeout(timeout).timeout(timeout).connect_lazy()
}

/// How one node process is started (the same every time, so a restart finds its data).
struct NodeSpec {
    id: u64,
    /// The test host it runs on (`None`: this machine, on loopback).
    host: Option<Host>,
    listen: String,
    data_dir: PathBuf,
    log: PathBuf,
    /// The file of its test wall clock offset (`warden_engine::wall_clock`; none: no offset).
    clock: PathBuf,
    /// `--peers`: the nodes known when it was first started, itself included.
    peers: String,
}

impl NodeSpec {
    /// Node `id`, on `host` if given (the host's address, a fixed port: the host is its own).
    fn new(dir: &Path, id: u64, host: Option<Host>) -> NodeSpec {
        let listen = host.as_ref().map_or_else(|| format!("127.0.0.1:{}", free_port()), |host| format!("{}:{HOST_PORT}", host.addr));
        let (data_dir, log, clock) = (dir.join(format!("node-{id}")), dir.join(format!("node-{id}.log")), dir.join(format!("node-{id}.clock")));
        NodeSpec { id, host, listen, data_dir, log, clock, peers: String::new() }
    }
}

/// The port of a node on a test host (the host's address is its own).
const HOST_PORT: u16 = 7000;

/// How a [`ProcessCluster`] is made.
pub struct ClusterOptions {
    /// Node processes at the start (ids 1 to `nodes`).
    pub nodes: u64,
    /// Flags every `warden node` gets besides its identity (e.g. `--down-after-ms`).
    pub node_args: Vec<String>,
    /// Test hosts: node `i` runs on host `i - 1` (at least as many hosts as nodes). The
    /// router and the test's clients stay on this machine.
    pub hosts: Option<std::sync::Arc<TestNet>>,
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions { nodes: NODES, node_args: Vec::new(), hosts: None }
    }
}

/// Node processes (five unless told otherwise) and a router, bootstrapped, each node
/// restartable on its data.
pub struct ProcessCluster {
    seeds: String,
    node_args: Vec<String>,
    specs: Vec<NodeSpec>,
    nodes: Vec<Option<Process>>,
    _router: Process,
    router_addr: String,
    /// Last, so it goes after every process (see `Drop`).
    dir: Option<tempfile::TempDir>,
    /// The test hosts the nodes run on, kept until the processes are gone.
    _hosts: Option<std::sync::Arc<TestNet>>,
}

impl ProcessCluster {
    /// Starts the nodes, bootstraps placement on nodes 1-3 and the root group, creates a
    /// group for each of `prefixes`, starts a router and waits until it answers.
    pub async fn start(prefixes: &[&str]) -> ProcessCluster {
        ProcessCluster::start_with(ClusterOptions::default(), prefixes).await
    }

    /// [`ProcessCluster::start`] with `options`.
    pub async fn start_with(options: ClusterOptions, prefixes: &[&str]) -> ProcessCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = |id: u64| options.hosts.as_ref().map(|net| net.host(id as usize - 1).expect("a test host per node").clone());
        let mut specs: Vec<NodeSpec> = (1..=options.nodes).map(|id| NodeSpec::new(dir.path(), id, host(id))).collect();
        let peers = specs.iter().map(|s| format!("{}={}", s.id, s.listen)).collect::<Vec<_>>().join(",");
        for spec in &mut specs {
            spec.peers = peers.clone();
        }
        let seeds = specs.iter().map(|s| s.listen.clone()).collect::<Vec<_>>().join(",");
        let nodes = specs.iter().map(|spec| Some(spawn_node(spec, &options.node_args))).collect();
        let placement = PLACEMENT_NODES.map(|id| id.to_string()).join(",");
        admin(&["bootstrap", "--nodes", &peers, "--placement", &placement]);
        for prefix in prefixes {
            admin(&["create-group", prefix, "--seeds", &seeds]);
        }
        let router_addr = format!("127.0.0.1:{}", free_port());
        let router = spawn(&["router", "--listen", &router_addr, "--seeds", &seeds], &dir.path().join("router.log"));
        let cluster =
            ProcessCluster { seeds, node_args: options.node_args, specs, nodes, _router: router, router_addr, dir: Some(dir), _hosts: options.hosts };
        let router = cluster.router();
        wait_until("the router answers", STEP_TIMEOUT, || {
            let mut router = router.clone();
            async move { router.sync(SyncRequest::default()).await.ok() }
        })
        .await;
        cluster
    }

    /// The router's address (`host:port`).
    pub fn router_addr(&self) -> &str {
        &self.router_addr
    }

    /// A raw client of the router.
    pub fn router(&self) -> WardenClient<Channel> {
        WardenClient::new(channel(&self.router_addr, Duration::from_secs(10)))
    }

    /// Starts one more `warden router`, beside the cluster's own, that also serves etcd's v3
    /// API (`--etcd-listen`), both on fresh loopback ports, and waits until it answers (it
    /// binds its etcd port before it serves). Answers the process (killed when dropped),
    /// its Warden address (`host:port`) and its etcd address.
    pub async fn start_etcd_router(&self) -> (Process, String, std::net::SocketAddr) {
        let dir = self.dir.as_ref().expect("the cluster's directory").path();
        let base = warden_testkit::free_port_base(&[0, 1]);
        let (listen, etcd) = (format!("127.0.0.1:{base}"), std::net::SocketAddr::from(([127, 0, 0, 1], base + 1)));
        let etcd_listen = etcd.to_string();
        let args = ["router", "--listen", &listen, "--seeds", &self.seeds, "--etcd-listen", &etcd_listen];
        let process = spawn(&args, &dir.join("etcd-router.log"));
        let router = WardenClient::new(channel(&listen, Duration::from_secs(10)));
        wait_until("the etcd router answers", STEP_TIMEOUT, || {
            let mut router = router.clone();
            async move { router.sync(SyncRequest::default()).await.ok() }
        })
        .await;
        (process, listen, etcd)
    }

    /// Starts one more node (the next id) that knows every node so far; it registers with
    /// placement through its heartbeats, and the others learn its address from placement.
    /// Returns its id.
    pub fn add_node(&mut self) -> u64 {
        let dir = self.dir.as_ref().expect("the cluster's directory").path().to_path_buf();
        let id = self.specs.iter().map(|s| s.id).max().unwrap_or(0) + 1;
        assert!(self.specs.iter().all(|s| s.host.is_none()), "nodes added to a cluster on test hosts need hosts of their own");
        let mut spec = NodeSpec::new(&dir, id, None);
        let peers = self.specs.iter().chain(std::iter::once(&spec)).map(|s| format!("{}={}", s.id, s.listen)).collect::<Vec<_>>().join(",");
        spec.peers = peers;
        self.nodes.push(Some(spawn_node(&spec, &self.node_args)));
        self.specs.push(spec);
        id
    }

    /// The node ids (1 to 5 unless told otherwise, then any added).
    pub fn node_ids(&self) -> Vec<u64> {
        self.specs.iter().map(|s| s.id).collect()
    }

    /// Shard-node addresses, comma-separated (what `warden admin` and routers take).
    pub fn seeds(&self) -> &str {
        &self.seeds
    }

    fn spec(&self, id: u64) -> &NodeSpec {
        self.specs.iter().find(|s| s.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    fn index(&self, id: u64) -> usize {
        self.specs.iter().position(|s| s.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    fn process(&mut self, id: u64) -> &mut Option<Process> {
        let index = self.index(id);
        &mut self.nodes[index]
    }

    /// Whether node `id` was started and not killed since (it may be paused).
    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[self.index(id)].is_some()
    }

    /// SIGKILLs node `id` and reaps it: it gets no chance to flush or say goodbye.
    pub fn kill(&mut self, id: u64) {
        let process = self.process(id).take().unwrap_or_else(|| panic!("node {id} is not running"));
        process.signal(libc::SIGKILL);
        drop(process);
    }

    /// Stops node `id` as an operator does (SIGTERM): it hands its leaderships over, answers
    /// what is in flight and exits on its own. Waits until it has, and answers its log.
    pub async fn terminate(&mut self, id: u64) -> String {
        self.running(id).signal(libc::SIGTERM);
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !self.process(id).as_mut().is_some_and(Process::has_exited) {
            assert!(Instant::now() < deadline, "node {id} did not exit within {STEP_TIMEOUT:?} of SIGTERM");
            tokio::time::sleep(POLL).await;
        }
        drop(self.process(id).take());
        std::fs::read_to_string(&self.spec(id).log).unwrap_or_default()
    }

    /// Starts node `id` again with the same flags (same `--id`, `--listen`, `--data-dir`,
    /// `--peers`), once it is down.
    pub fn restart(&mut self, id: u64) {
        assert!(self.process(id).is_none(), "node {id} is still running");
        let process = spawn_node(self.spec(id), &self.node_args);
        *self.process(id) = Some(process);
    }

    /// Stops node `id` (SIGSTOP): it keeps its sockets and state but runs no code.
    pub fn pause(&self, id: u64) {
        self.running(id).signal(libc::SIGSTOP);
    }

    /// Lets a paused node `id` run again (SIGCONT).
    pub fn resume(&self, id: u64) {
        self.running(id).signal(libc::SIGCONT);
    }

    fn running(&self, id: u64) -> &Process {
        self.nodes[self.index(id)].as_ref().unwrap_or_else(|| panic!("node {id} is not running"))
    }

    /// A client of node `id` directly (not through the router); calls give up after
    /// `timeout`.
    pub fn node(&self, id: u64, timeout: Duration) -> WardenClient<Channel> {
        WardenClient::new(channel(&self.spec(id).listen, timeout))
    }

    /// The shard groups (ids) of the routing table, read from any placement node.
    pub async fn shard_groups(&self) -> Vec<u64> {
        wait_until("the routing table", STEP_TIMEOUT, || async {
            let table = self.routing_table().await?;
            Some(table.groups.iter().filter(|g| g.ready).filter_map(|g| g.descriptor.as_ref()).map(|d| d.group_id).collect())
        })
        .await
    }

    /// Waits until node `id`, after a restart or a pause, serves linearizable reads of every
    /// group in `groups` and (for a placement node) of the routing table: its replicas know
    /// the leader and have applied up to the leader's commit index.
    pub async fn wait_caught_up(&mut self, id: u64, groups: &[u64]) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        for &group in groups {
            loop {
                self.assert_running(id);
                let mut node = self.node(id, Duration::from_secs(2));
                let routing = Some(Routing { group_id: group, ..Routing::default() });
                if node.sync(SyncRequest { routing }).await.is_ok() {
                    break;
                }
                assert!(Instant::now() < deadline, "node {id} did not catch up on group {group} within {STEP_TIMEOUT:?}");
                tokio::time::sleep(POLL).await;
            }
        }
        if PLACEMENT_NODES.contains(&id) {
            loop {
                self.assert_running(id);
                let mut placement = PlacementClient::new(channel(&self.spec(id).listen, Duration::from_secs(2)));
                if placement.get_routing_table(GetRoutingTableRequest {}).await.is_ok() {
                    break;
                }
                assert!(Instant::now() < deadline, "node {id} did not catch up on the placement group within {STEP_TIMEOUT:?}");
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// Waits until every node serves linearizable reads of each group placement places on
    /// it (its voters in the routing table, read again at each try: replicas may still be
    /// moving), and every placement node reads the routing table; see [`Self::wait_caught_up`].
    pub async fn wait_all_caught_up(&mut self) {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let mut lagging = Vec::new();
            match self.routing_table().await {
                Some(table) => {
                    for id in self.node_ids() {
                        self.assert_running(id);
                        let placed = table.groups.iter().filter_map(|g| g.descriptor.as_ref()).filter(|d| d.replicas.contains(&id));
                        for group in placed.map(|d| d.group_id) {
                            let routing = Some(Routing { group_id: group, ..Routing::default() });
                            if let Err(error) = self.node(id, Duration::from_secs(2)).sync(SyncRequest { routing }).await {
                                lagging.push((id, group, error.message().to_string()));
                            }
                        }
                    }
                }
                None => lagging.push((0, 0, "no routing table".into())),
            }
            if lagging.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                // Each lagging replica's raft view, for the post-mortem.
                let mut report = Vec::new();
                for (id, group, error) in lagging {
                    let mut placement = PlacementClient::new(channel(&self.spec(id).listen, Duration::from_secs(2)));
                    let view = match placement.replica_status(ReplicaStatusRequest { group_id: group }).await {
                        Ok(status) => format!("{:?}", status.into_inner()),
                        Err(status) => format!("no status: {}", status.message()),
                    };
                    report.push(format!("node {id} group {group}: sync failed with {error:?}; replica {view}"));
                }
                panic!("(node, group) pairs not caught up within {STEP_TIMEOUT:?}:\n{}", report.join("\n"));
            }
            tokio::time::sleep(POLL).await;
        }
        for id in PLACEMENT_NODES {
            self.wait_caught_up(id, &[]).await;
        }
    }

    /// The routing table as the first placement node that answers has it.
    async fn routing_table(&self) -> Option<warden_proto::placement::RoutingTable> {
        for id in PLACEMENT_NODES.into_iter().filter(|id| self.is_up(*id)) {
            let mut placement = PlacementClient::new(channel(&self.spec(id).listen, Duration::from_secs(2)));
            if let Ok(table) = placement.get_routing_table(GetRoutingTableRequest {}).await {
                return Some(table.into_inner());
            }
        }
        None
    }

    /// Panics (with the log's tail) if node `id` exited on its own, unless it could not bind
    /// its port: after a kill, an outgoing connection of another process may briefly hold
    /// that port as its local end, so such a node is started again.
    fn assert_running(&mut self, id: u64) {
        let exited = self.process(id).as_mut().is_some_and(Process::has_exited);
        if exited {
            let log = std::fs::read_to_string(&self.spec(id).log).unwrap_or_default();
            let tail = log.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            let last = log.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or_default();
            assert!(last.contains("os error 98"), "node {id} exited on its own; its log ends:\n{tail}");
            eprintln!("node {id} could not bind its port yet; starting it again");
            *self.process(id) = None;
            self.restart(id);
        }
    }

    /// The leader of shard group `group` as the nodes other than `except` see it (`None`:
    /// none of them knows one now). Asks the nodes directly, so a paused node cannot hold
    /// the question up.
    pub async fn group_leader(&self, group: u64, except: Option<u64>) -> Option<u64> {
        for id in self.node_ids().into_iter().filter(|id| Some(*id) != except) {
            if !self.is_up(id) {
                continue;
            }
            let mut node = self.node(id, Duration::from_secs(1));
            let routing = Some(Routing { group_id: group, ..Routing::default() });
            if let Ok(response) = node.sync(SyncRequest { routing }).await {
                let leader = response.into_inner().header.map_or(0, |h| h.leader_id);
                if leader != 0 && Some(leader) != except {
                    return Some(leader);
                }
            }
        }
        None
    }

    /// The placement group's leader as the running placement nodes other than `except` see
    /// it (`None`: none of them knows one now), from each one's raft view of its replica.
    pub async fn placement_leader(&self, except: Option<u64>) -> Option<u64> {
        placement_leader_among(&self.placement_clients(Duration::from_secs(1)), except).await
    }

    /// Clients of the running placement nodes' placement API, by node id; calls give up
    /// after `timeout`.
    pub fn placement_clients(&self, timeout: Duration) -> Vec<(u64, PlacementClient<Channel>)> {
        PLACEMENT_NODES.into_iter().filter(|id| self.is_up(*id)).map(|id| (id, self.placement(id, timeout))).collect()
    }

    /// Steps node `id`'s wall clock to `offset_ms` from the system's, drifting by
    /// `drift_ppm` millionths from now on (`warden_engine::wall_clock`); the node reads it
    /// within a tenth of a second. `(0, 0)` puts the clock back.
    pub fn set_clock(&self, id: u64, offset_ms: i64, drift_ppm: i64) {
        let clock = &self.spec(id).clock;
        // Written whole, then renamed over: the node never reads half a file.
        let written = clock.with_extension("clock-new");
        std::fs::write(&written, format!("{offset_ms} {drift_ppm}\n")).unwrap_or_else(|e| panic!("write {}: {e}", written.display()));
        std::fs::rename(&written, clock).unwrap_or_else(|e| panic!("rename to {}: {e}", clock.display()));
    }

    /// Copies every process's log (`node-<id>.log`, `router.log`) into `to`: what a
    /// post-mortem of a history that found an anomaly starts from.
    pub fn copy_logs(&self, to: &Path) {
        let Some(dir) = self.dir.as_ref() else { return };
        let logs = std::fs::read_dir(dir.path()).expect("the cluster's directory");
        for entry in logs.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "log") {
                let copied = std::fs::copy(&path, to.join(entry.file_name()));
                copied.unwrap_or_else(|e| panic!("copy {} to {}: {e}", path.display(), to.display()));
            }
        }
    }

    /// A client of node `id`'s placement API; calls give up after `timeout`.
    pub fn placement(&self, id: u64, timeout: Duration) -> PlacementClient<Channel> {
        PlacementClient::new(channel(&self.spec(id).listen, timeout))
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        // Stop every process before the directory goes; keep the directory (logs, data) of a
        // failed test for a post-mortem.
        self.nodes.clear();
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                eprintln!("cluster logs and data kept in {}", dir.keep().display());
            }
        }
    }
}

/// The placement group's leader as the placement nodes behind `clients` other than
/// `except` see it (`None`: none of them knows one now), from each one's raft view of its
/// replica; each asked for at most a second.
pub async fn placement_leader_among(clients: &[(u64, PlacementClient<Channel>)], except: Option<u64>) -> Option<u64> {
    for (_, placement) in clients.iter().filter(|(id, _)| Some(*id) != except) {
        let request = ReplicaStatusRequest { group_id: warden_placement::PLACEMENT_GROUP_ID };
        let asked = tokio::time::timeout(Duration::from_secs(1), placement.clone().replica_status(request)).await;
        if let Ok(Ok(status)) = asked {
            let leader = status.into_inner().leader_id;
            if PLACEMENT_NODES.contains(&leader) && Some(leader) != except {
                return Some(leader);
            }
        }
    }
    None
}

fn spawn_node(spec: &NodeSpec, node_args: &[String]) -> Process {
    let id = spec.id.to_string();
    let data = spec.data_dir.to_str().expect("utf8 data dir");
    let mut args = vec!["node", "--id", &id, "--listen", &spec.listen, "--data-dir", data, "--peers", &spec.peers];
    args.extend(node_args.iter().map(String::as_str));
    let clock = [(warden_engine::wall_clock::TEST_OFFSET_FILE_ENV, spec.clock.as_path())];
    spawn_with(spec.host.as_ref(), &args, &clock, &spec.log)
}
