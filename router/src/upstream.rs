//! The router's view of the cluster: the routing table (refreshed from any node that hosts
//! a placement replica), a channel per node, a leader cache per group (moka), and [`call`],
//! which sends one request to the group serving it and retries what is safe to retry.
//!
//! [`call`]: Upstreams::call

use std::sync::{Arc, RwLock};
use std::time::Duration;
use warden_access::{acl_from_proto, AclCache};

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Response, Status};
use warden_proto::channel::{ChannelCache, ChannelSettings};
use warden_proto::follow::{CallKind, Fault, Follow};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::{GetRoutingTableRequest, WatchRoutingTableRequest};
use warden_proto::tls::Tls;
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::Routing;

use warden_placement::home_group;

use crate::batch::{Batcher, Upstream};
use warden_proto::routing::{GroupRoute, Suspects, Table, Target};

/// How long a leader stays cached without being confirmed.
const LEADER_TTL: Duration = Duration::from_secs(30);
/// Groups whose leaders are cached at most.
const LEADERS_CACHED_MAX: u64 = 100_000;
/// Longest one node may take to send the routing table before the next is asked.
const TABLE_FETCH_MAX: Duration = Duration::from_secs(2);

/// A `warden.v1.Warden` client on `channel` that accepts responses up to
/// [`RESPONSE_BYTES_MAX`].
pub fn warden_client(channel: Channel) -> WardenClient<Channel> {
    WardenClient::new(channel).max_decoding_message_size(RESPONSE_BYTES_MAX)
}

/// The typed refusal of a request no group serves (judged on a fresh table): INVALID_PATH
/// for a path that is not one, else UNAVAILABLE (no ready group serves it yet);
/// SESSION_EXPIRED for a session whose home group does not exist (INVALID_ARGUMENT for id 0,
/// which names no session).
fn unroutable(target: Target<'_>) -> Status {
    let (code, path, message) = match target {
        Target::Path(path) => match warden_placement::validate_path(path) {
            Err(error) => (Code::InvalidPath, path, error.to_string()),
            Ok(()) => (Code::Unavailable, path, format!("no ready group serves {path}")),
        },
        Target::Paths(paths) => {
            // An invalid path first: its refusal is typed INVALID_PATH.
            let path = paths.iter().find(|path| warden_placement::validate_path(path).is_err()).or(paths.first()).copied().unwrap_or("/");
            return unroutable(Target::Path(path));
        }
        Target::Group(group) => (Code::Unavailable, "", format!("group {group} is not in the routing table")),
        Target::Session(0) => (Code::InvalidArgument, "", "session id 0 names no session".to_string()),
        Target::Session(session) => {
            (Code::SessionExpired, "", format!("session {session:#x} does not exist: its home group {} does not exist", home_group(session)))
        }
    };
    warden_proto::status(warden_proto::warden_error(code, path, message))
}

/// The cluster as one router sees it.
pub struct Upstreams {
    seeds: Vec<String>,
    table: RwLock<Arc<Table>>,
    /// One refresh at a time; the others wait for it and use its result.
    refreshing: tokio::sync::Mutex<()>,
    /// Each node's channel and batch streams, by address, over this process's TLS (a
    /// router's or a node's; `None`: plaintext).
    channels: ChannelCache<Upstream>,
    /// Batch streams per node for forwarded unary calls (0: every call unary).
    batch_streams: usize,
    leaders: moka::sync::Cache<u64, u64>,
    /// Nodes that lately left a call unanswered until its deadline, or lost its connection.
    suspects: Suspects,
    /// The ACL, as the routing table last brought it.
    acl: AclCache,
    /// The router's metrics.
    pub metrics: crate::metrics::RouterMetrics,
}

pub use warden_proto::error_of;
use warden_proto::RESPONSE_BYTES_MAX;

impl Upstreams {
    /// A view that learns the cluster from `seeds` (node addresses, `host:port`); calls go
    /// unary.
    pub fn new(seeds: Vec<String>, tls: Option<Arc<Tls>>) -> Upstreams {
        Upstreams::batched(seeds, 0, tls)
    }

    /// As [`new`](Upstreams::new), with `batch_streams` streams per node carrying the unary
    /// calls of [`Upstream::forward`] (0: none, every call unary).
    pub fn batched(seeds: Vec<String>, batch_streams: usize, tls: Option<Arc<Tls>>) -> Upstreams {
        Upstreams {
            acl: AclCache::default(),
            seeds,
            table: RwLock::new(Arc::new(Table::default())),
            refreshing: tokio::sync::Mutex::new(()),
            channels: ChannelCache::new(tls, ChannelSettings::to_nodes()),
            batch_streams,
            leaders: moka::sync::Cache::builder().max_capacity(LEADERS_CACHED_MAX).time_to_live(LEADER_TTL).build(),
            suspects: Suspects::default(),
            metrics: crate::metrics::RouterMetrics::new(),
        }
    }

    /// The ACL as the last routing table brought it.
    pub fn acl(&self) -> &AclCache {
        &self.acl
    }

    /// The current table.
    pub fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A (lazily connected) channel to `addr`.
    pub fn channel(&self, addr: &str) -> Result<Channel, Status> {
        self.upstream(addr).map(|upstream| upstream.channel)
    }

    /// The node at `addr`: its (lazily connected) channel and batch streams.
    pub fn upstream(&self, addr: &str) -> Result<Upstream, Status> {
        self.channels
            .get_with(addr, |channel| {
                let batcher = (self.batch_streams > 0).then(|| Arc::new(Batcher::new(addr, &channel, self.batch_streams)));
                Upstream { channel, batcher }
            })
            .map_err(|e| Status::invalid_argument(format!("address {addr}: {e}")))
    }

    /// Fetches the routing table from the first node that answers (seeds first, then the
    /// nodes the last table knew). A table older than the one held is ignored.
    pub async fn refresh(&self) -> Result<Arc<Table>, Status> {
        let seen = self.table().version;
        let _one_at_a_time = self.refreshing.lock().await;
        let current = self.table();
        if current.version > seen {
            return Ok(current);
        }
        let mut last_error = Status::unavailable("no seed node to ask for the routing table");
        for addr in self.seeds.iter().cloned().chain(current.addrs()) {
            let mut client = PlacementClient::new(self.channel(&addr)?);
            // A node that does not answer (paused, partitioned) must not hold every refresh.
            let mut request = tonic::Request::new(GetRoutingTableRequest {});
            request.set_timeout(TABLE_FETCH_MAX);
            match tokio::time::timeout(TABLE_FETCH_MAX, client.get_routing_table(request)).await {
                Ok(Ok(response)) => return Ok(self.install(response.into_inner())),
                Ok(Err(status)) => last_error = status,
                Err(_) => last_error = Status::unavailable(format!("{addr} did not send the routing table in {TABLE_FETCH_MAX:?}")),
            }
        }
        Err(last_error)
    }

    /// Installs `table` unless the one held is newer; returns the one held after.
    fn install(&self, mut table: warden_proto::placement::RoutingTable) -> Arc<Table> {
        if let Some(acl) = table.acl.take() {
            self.acl.offer(acl_from_proto(acl));
        }
        let table = Arc::new(Table::from_proto(table));
        let mut held = self.table.write().unwrap_or_else(|e| e.into_inner());
        if table.version >= held.version {
            *held = table;
        }
        held.clone()
    }

    /// Watches placement through the first node that serves `WatchRoutingTable` (seeds
    /// first, then the nodes the table knows), installing every table it sends, until the
    /// stream ends. Fails when no node serves the watch.
    pub async fn watch_table(&self) -> Result<(), Status> {
        let current = self.table();
        let mut last_error = Status::unavailable("no node to watch the routing table at");
        for addr in self.seeds.iter().cloned().chain(current.addrs()) {
            let mut client = PlacementClient::new(self.channel(&addr)?);
            let request = WatchRoutingTableRequest { after_version: self.table().version };
            let mut tables = match client.watch_routing_table(request).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    last_error = status;
                    continue;
                }
            };
            loop {
                match tables.message().await {
                    Ok(Some(table)) => {
                        self.install(table);
                    }
                    Ok(None) => return Ok(()),
                    Err(status) => return Err(status),
                }
            }
        }
        Err(last_error)
    }

    /// The group `target` names in `table` (`None`: none there); a transaction whose paths
    /// span groups is refused INVALID_ARGUMENT. Judged on the table of each attempt, so a
    /// table found stale (WRONG_GROUP) is judged again once refreshed.
    fn resolve(&self, table: &Table, target: Target<'_>) -> Result<Option<GroupRoute>, Status> {
        table.resolve(target).map(|group| group.cloned()).map_err(|ids| {
            let message = format!("a transaction's paths must be served by one group; these span groups {ids:?}");
            warden_proto::status(warden_proto::warden_error(Code::InvalidArgument, "", message))
        })
    }

    /// [`refresh`](Upstreams::refresh), given up at `deadline`.
    async fn refresh_by(&self, deadline: Instant) -> Result<Arc<Table>, Status> {
        tokio::time::timeout_at(deadline, self.refresh())
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("the routing table could not be read before the deadline")))
    }

    /// Sends a request (made by `call` to the chosen node) to the group `target`
    /// names, with that group's id and epoch in its routing, until it is answered or
    /// `deadline` passes. Retried by the rule of `warden_proto::follow` (NOT_LEADER at the
    /// hinted leader, UNAVAILABLE, connections that never reached a node; OUTCOME_UNKNOWN and
    /// lost connections only when `idempotent`), and WRONG_GROUP after refreshing the table
    /// (the target judged again on the new table). Anything else is the answer. Each attempt
    /// ends at `deadline` (the request should carry it: [`warden_proto::follow::bounded`]);
    /// one still unanswered then is OUTCOME_UNKNOWN for a write, UNAVAILABLE for an
    /// idempotent call.
    pub async fn call<T, F, Fut>(&self, target: Target<'_>, idempotent: bool, deadline: Instant, mut call: F) -> Result<T, Status>
    where
        F: FnMut(Upstream, Routing) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let mut follow = Follow::new(CallKind::of(idempotent), deadline);
        loop {
            let attempt = follow.turn().attempt;
            let mut table = self.table();
            let mut group = self.resolve(&table, target)?;
            if group.is_none() {
                table = self.refresh_by(deadline).await?;
                group = self.resolve(&table, target)?;
            }
            let group = group.ok_or_else(|| unroutable(target))?;
            let replicas = &group.descriptor.replicas;
            if replicas.is_empty() {
                return Err(Status::unavailable(format!("group {} has no replicas", group.id())));
            }
            let leader = self.leaders.get(&group.id());
            let Some(node) = self.suspects.pick(replicas, leader, attempt) else {
                return Err(Status::unavailable(format!("group {} has no replicas", group.id())));
            };
            if attempt > 0 {
                self.metrics.retries.inc();
            }
            let addr = table.addr(node).unwrap_or_default().to_string();
            let client = self.upstream(&addr)?;
            let routing = Routing { group_id: group.id(), conf_ver: group.descriptor.conf_ver, version: group.descriptor.version };
            let status = match tokio::time::timeout_at(deadline, call(client, routing)).await {
                Ok(Ok(response)) => {
                    self.leaders.insert(group.id(), node);
                    self.suspects.clear(node);
                    return Ok(response.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => {
                    // Silence, not a refusal: the next calls try the group's other replicas
                    // first (a leader cut off from the router looks exactly like this).
                    self.suspects.suspect(node);
                    if leader == Some(node) {
                        self.leaders.invalidate(&group.id());
                    }
                    let (code, outcome) = if idempotent { (Code::Unavailable, "") } else { (Code::OutcomeUnknown, "; the outcome is unknown") };
                    let message = format!("no answer from group {} before the deadline{outcome}", group.id());
                    return Err(warden_proto::status(warden_proto::warden_error(code, "", message)));
                }
            };
            let fault = Fault::of(&status);
            if matches!(fault, Fault::Lost { .. }) || crate::batch::is_link_failure(&status) {
                // Unreachable or gone silent (its connection's pings went unanswered): the
                // next attempts try the group's other replicas first.
                self.suspects.suspect(node);
                self.leaders.invalidate(&group.id());
            }
            match fault {
                Fault::NotLeader { leader: Some(leader) } if leader != node => self.leaders.insert(group.id(), leader),
                Fault::NotLeader { .. } | Fault::Unavailable | Fault::Lost { .. } | Fault::Answer { code: None } => {
                    self.leaders.invalidate(&group.id())
                }
                Fault::Answer { code: Some(Code::WrongGroup) } => {
                    // A failed refresh is retried like the call, within the deadline.
                    if let Err(refresh) = self.refresh_by(deadline).await {
                        tracing::debug!(%refresh, "routing table refresh after WRONG_GROUP");
                    }
                    follow.retry_anyway(status).await?;
                    continue;
                }
                Fault::OutcomeUnknown | Fault::Answer { .. } => {}
            }
            follow.retry_after(status).await?;
        }
    }
}
