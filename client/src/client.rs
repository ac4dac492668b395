//! [`Client`]: calls to the routers, with failover between them and the retry rules of
//! [`crate::retry`], each call bounded by its deadline (sent along as `grpc-timeout`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};
use warden_proto::channel::{self, ChannelSettings, Keepalive};
use warden_proto::tls::{connect_channel, lazy_channel, Expected};
use warden_proto::v1 as pb;
use warden_proto::v1::warden_client::WardenClient;

use crate::children::{Children, ChildrenOptions, ChildrenPage};
use crate::config::{ClientConfig, SessionConfig};
use crate::convert;
use crate::direct::Direct;
use crate::error::{Error, Result};
use crate::lock::{LockInfo, Sequencer};
use crate::node::{Consistency, CreateOptions, Created, DeleteOptions, Node, Stat};
use crate::renewal::{self, Renewals};
use crate::retry::{judge, CallKind, Failure};
use crate::session::{Session, SessionId, SessionInfo, SessionLease};
use crate::txn::{Txn, TxnResult};
use crate::watch::{WatchOptions, Watcher};
use warden_proto::follow::{Fault, Follow};
use warden_proto::routing::{txn_paths, Routed, Target};
use warden_proto::v1::warden_error::Code;

/// Interval of HTTP/2 pings on a connection with open calls (a silently dead router is
/// noticed within the interval plus [`PING_TIMEOUT`]).
const PING_INTERVAL: Duration = Duration::from_secs(10);
/// Time a ping may go unanswered before the connection is closed.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Who an endpoint must prove to be with TLS: a router, or a node's client port.
const ROUTER_OR_NODE: Expected = Expected::NodeOrRouter;
/// A deadline further away than any call waits ("no deadline" without overflow).
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// A connection to a Warden cluster through its routers. Cheap to clone (clones share the
/// connections); every method may be called concurrently.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    consistency: Consistency,
}

struct Shared {
    endpoints: Endpoints,
    request_timeout: Duration,
    /// `Bearer TOKEN`, sent with every call (`None`: no token).
    authorization: Option<tonic::metadata::AsciiMetadataValue>,
    /// Calls sent straight to the nodes (`None`: every call through the routers).
    direct: Option<Arc<Direct>>,
    /// Session renewals waiting to go together.
    renewals: Renewals,
}

/// One channel per router and the one calls go to now.
struct Endpoints {
    channels: Vec<Channel>,
    current: AtomicUsize,
}

impl Endpoints {
    /// The router calls go to now (its index and a client of it).
    fn pick(&self) -> (usize, WardenClient<Channel>) {
        let index = self.current.load(Ordering::Relaxed) % self.channels.len();
        let client = WardenClient::new(self.channels[index].clone()).max_decoding_message_size(warden_proto::RESPONSE_BYTES_MAX);
        (index, client)
    }

    /// Moves on from the router at `index` (unless another call already has).
    fn failed(&self, index: usize) {
        let next = (index + 1) % self.channels.len();
        let _ = self.current.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Where a sequencer's lock lives: the group serving its path now (a split or merge may
/// have moved it from the group that issued it); without a path, the router finds the group
/// the sequencer names.
fn sequencer_target(sequencer: &Sequencer) -> Option<Target<'_>> {
    (!sequencer.path.is_empty()).then_some(Target::Path(&sequencer.path))
}

/// The instant `timeout` from now (saturating: an enormous timeout means no deadline).
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + FAR_FUTURE)
}

fn endpoint(address: &str, config: &ClientConfig) -> Result<Endpoint> {
    let settings = ChannelSettings::new(ROUTER_OR_NODE)
        .with_connect_timeout(config.connect_timeout)
        .with_keepalive(Keepalive { interval: PING_INTERVAL, timeout: PING_TIMEOUT });
    channel::endpoint(address, &settings).map_err(|e| Error::InvalidArgument { message: format!("endpoint {address:?}: {e}") })
}

impl Client {
    /// Connects to the routers of `config`: opens a connection to each (within the connect
    /// timeout, all at once) and starts at the first that accepted. Fails when none did;
    /// routers unreachable now are tried again whenever calls move on to them.
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        if config.endpoints.is_empty() {
            return Err(Error::InvalidArgument { message: "a client needs at least one endpoint".into() });
        }
        let endpoints = config.endpoints.iter().map(|address| endpoint(address, &config)).collect::<Result<Vec<_>>>()?;
        let tls = config.tls.as_ref();
        let expected = ROUTER_OR_NODE;
        let connecting =
            endpoints.iter().map(|endpoint| tokio::time::timeout(config.connect_timeout, connect_channel(endpoint.clone(), tls, expected)));
        let connected = futures::future::join_all(connecting).await;
        let mut first_reachable = None;
        let mut failures = Vec::new();
        let mut channels = Vec::with_capacity(endpoints.len());
        for (index, (endpoint, connected)) in endpoints.iter().zip(connected).enumerate() {
            match connected {
                Ok(Ok(channel)) => {
                    first_reachable.get_or_insert(index);
                    channels.push(channel);
                }
                Ok(Err(error)) => {
                    failures.push(format!("{}: {error}", config.endpoints[index]));
                    channels.push(lazy_channel(endpoint.clone(), tls, expected));
                }
                Err(_) => {
                    failures.push(format!("{}: no connection within {:?}", config.endpoints[index], config.connect_timeout));
                    channels.push(lazy_channel(endpoint.clone(), tls, expected));
                }
            }
        }
        let current = first_reachable.ok_or_else(|| Error::Transport { message: format!("no endpoint is reachable ({})", failures.join("; ")) })?;
        let endpoints = Endpoints { channels, current: AtomicUsize::new(current) };
        let authorization = match &config.token {
            Some(token) => Some(
                warden_proto::tls::tokens::bearer(token).ok_or_else(|| Error::InvalidArgument { message: "a token is printable ASCII".into() })?,
            ),
            None => None,
        };
        let direct = if config.nodes.is_empty() {
            None
        } else if config.tls.is_some() {
            let message = "direct calls to nodes need a cluster without TLS (a secure cluster's nodes admit only nodes and routers on the ports the routing table names)";
            return Err(Error::InvalidArgument { message: message.into() });
        } else {
            let direct = Arc::new(Direct::new(config.nodes.clone(), config.connect_timeout));
            // Starts reading the routing table now, so the first calls find it.
            direct.table();
            Some(direct)
        };
        let shared = Shared { endpoints, request_timeout: config.request_timeout, authorization, direct, renewals: Renewals::default() };
        Ok(Client { shared: Arc::new(shared), consistency: Consistency::default() })
    }

    /// The same client (same connections) whose reads use `consistency`.
    pub fn with_consistency(&self, consistency: Consistency) -> Client {
        Client { shared: self.shared.clone(), consistency }
    }

    /// Adds this client's bearer token (if it has one) to `request`.
    pub(crate) fn authorize<T>(&self, request: &mut Request<T>) {
        warden_proto::tls::tokens::authorize(request, self.shared.authorization.as_ref());
    }

    /// The deadline of one call.
    pub fn request_timeout(&self) -> Duration {
        self.shared.request_timeout
    }

    /// Runs `attempt` against the current router until it succeeds, fails for good, or the
    /// deadline `timeout` from now passes; between attempts it backs off and, when the router
    /// was unreachable, moves to the next one. `attempt` gets the call's deadline.
    pub(crate) async fn retrying<T, F, Fut>(&self, kind: CallKind, timeout: Duration, mut attempt: F) -> Result<T>
    where
        F: FnMut(WardenClient<Channel>, Instant) -> Fut,
        Fut: Future<Output = std::result::Result<T, Failure>>,
    {
        self.routed(kind, timeout, None, |client, _routing, deadline| attempt(client, deadline)).await
    }

    /// [`Client::retrying`] for a call that one group serves (`target`): with direct calls
    /// on ([`ClientConfig::nodes`]), an attempt goes to the node leading that group while
    /// the table places it (see `crate::direct`), else to the current router. `attempt` gets
    /// the routing its request must carry to a node (`None` to a router, which sets it).
    async fn routed<T, F, Fut>(&self, kind: CallKind, timeout: Duration, target: Option<Target<'_>>, mut attempt: F) -> Result<T>
    where
        F: FnMut(WardenClient<Channel>, Option<pb::Routing>, Instant) -> Fut,
        Fut: Future<Output = std::result::Result<T, Failure>>,
    {
        let deadline = deadline_after(timeout);
        let mut follow = Follow::new(kind, deadline);
        let mut direct = self.shared.direct.as_ref().zip(target);
        loop {
            let hop = match direct {
                Some((view, target)) => view.hop(target, follow.turn().attempt),
                None => None,
            };
            let (router, client, routing) = match &hop {
                Some(hop) => (None, hop.client.clone(), Some(hop.routing)),
                None => {
                    let (router, client) = self.shared.endpoints.pick();
                    (Some(router), client, None)
                }
            };
            let status = match tokio::time::timeout_at(deadline, attempt(client, routing, deadline)).await {
                Ok(Ok(answer)) => {
                    if let (Some((view, _)), Some(hop)) = (direct, &hop) {
                        view.answered(hop);
                    }
                    return Ok(answer);
                }
                Ok(Err(Failure::Final(error))) => return Err(error),
                Ok(Err(Failure::Status(status))) => status,
                Err(_) => {
                    if let (Some((view, _)), Some(hop)) = (direct, &hop) {
                        view.unanswered(hop);
                    }
                    return Err(match kind {
                        CallKind::Idempotent => Error::DeadlineExceeded,
                        CallKind::Write => Error::OutcomeUnknown { message: format!("no answer within {timeout:?}") },
                    });
                }
            };
            let verdict = judge(&status, kind);
            if let (Some((view, _)), Some(hop)) = (direct, &hop) {
                if !view.failed(hop, &status) {
                    direct = None;
                }
                if Fault::of(&status) == (Fault::Answer { code: Some(Code::WrongGroup) }) {
                    // The node applied nothing: the call goes again, through a router (which
                    // refreshes its own table).
                    if follow.retry_anyway(status).await.is_err() {
                        return Err(verdict.error);
                    }
                    continue;
                }
            } else if let Some(router) = router.filter(|_| verdict.next_endpoint) {
                self.shared.endpoints.failed(router);
            }
            if follow.retry_after(status).await.is_err() {
                return Err(verdict.error);
            }
        }
    }

    /// One unary call of `method` with `request` to the group serving `target` (`None`: the
    /// router decides), retried by [`Client::routed`]; each attempt carries the time left as
    /// its `grpc-timeout`.
    async fn unary<Req, Resp, F, Fut>(&self, kind: CallKind, timeout: Duration, target: Option<Target<'_>>, request: Req, method: F) -> Result<Resp>
    where
        Req: Clone + Routed,
        F: Fn(WardenClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<Response<Resp>, Status>>,
    {
        self.routed(kind, timeout, target, |client, routing, deadline| {
            let mut request = request.clone();
            if let Some(routing) = routing {
                request.set_routing(routing);
            }
            let mut request = Request::new(request);
            request.set_timeout(deadline.saturating_duration_since(Instant::now()));
            self.authorize(&mut request);
            let call = method(client, request);
            async move { call.await.map(Response::into_inner).map_err(Failure::Status) }
        })
        .await
    }

    /// Creates a node with `data`; returns its actual path and stat.
    pub async fn create(&self, path: &str, data: impl Into<Vec<u8>>, options: &CreateOptions) -> Result<Created> {
        let request = convert::create_request(path, data.into(), options);
        let response = self
            .unary(CallKind::Write, self.request_timeout(), Some(Target::Path(path)), request, |mut c, r| async move { c.create(r).await })
            .await?;
        convert::created(response)
    }

    /// A node's data and stat ([`Error::NoNode`] when it does not exist).
    pub async fn get(&self, path: &str) -> Result<Node> {
        let request = pb::GetRequest { path: path.into(), consistency: convert::consistency(self.consistency), routing: None };
        let target = Some(Target::Path(path));
        let response = self.unary(CallKind::Idempotent, self.request_timeout(), target, request, |mut c, r| async move { c.get(r).await }).await?;
        convert::node(path.to_string(), response.data, response.stat)
    }

    /// A node's stat, or `None` when it does not exist.
    pub async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        let request = pb::ExistsRequest { path: path.into(), consistency: convert::consistency(self.consistency), routing: None };
        let target = Some(Target::Path(path));
        let response = self.unary(CallKind::Idempotent, self.request_timeout(), target, request, |mut c, r| async move { c.exists(r).await }).await?;
        response.stat.map(convert::stat).transpose()
    }

    /// Replaces a node's data; with `expected_version`, only at that version (compare-and-swap:
    /// [`Error::BadVersion`] otherwise). Returns the new stat.
    pub async fn set(&self, path: &str, data: impl Into<Vec<u8>>, expected_version: Option<u64>) -> Result<Stat> {
        let request = pb::SetRequest { path: path.into(), data: data.into(), expected_version, routing: None };
        let response =
            self.unary(CallKind::Write, self.request_timeout(), Some(Target::Path(path)), request, |mut c, r| async move { c.set(r).await }).await?;
        convert::required_stat(response.stat)
    }

    /// Deletes a node (or its subtree); returns how many nodes went (emptied containers
    /// included).
    pub async fn delete(&self, path: &str, options: &DeleteOptions) -> Result<u64> {
        let request =
            pb::DeleteRequest { path: path.into(), expected_version: options.expected_version, recursive: options.recursive, routing: None };
        // A recursive delete may span groups: the router clears it group by group.
        let target = (!options.recursive).then_some(Target::Path(path));
        let response = self.unary(CallKind::Write, self.request_timeout(), target, request, |mut c, r| async move { c.delete(r).await }).await?;
        Ok(response.deleted)
    }

    /// The children of `path`, sorted by name, fetched a page at a time as the listing is read.
    pub fn children(&self, path: &str, options: ChildrenOptions) -> Children {
        Children::new(self.clone(), path.to_string(), options)
    }

    /// One page of children of `path` after `start_after`, and whether more follow.
    pub(crate) async fn children_page(&self, path: &str, options: &ChildrenOptions, start_after: &str) -> Result<(ChildrenPage, bool)> {
        let request = pb::GetChildrenRequest {
            path: path.into(),
            consistency: convert::consistency(self.consistency),
            with_stats: options.with_stats,
            limit: options.page_size,
            start_after: start_after.into(),
            routing: None,
        };
        // Through a router: it adds the children that are other groups' prefixes.
        let response =
            self.unary(CallKind::Idempotent, self.request_timeout(), None, request, |mut c, r| async move { c.get_children(r).await }).await?;
        convert::children_page(response, options.with_stats)
    }

    /// Runs a transaction (atomic, at one revision, in the one group serving its paths).
    pub async fn txn(&self, txn: &Txn) -> Result<TxnResult> {
        let request = convert::txn_request(txn);
        let paths: Vec<String> = txn_paths(&request).into_iter().map(String::from).collect();
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        let target = Some(Target::Paths(&paths));
        let response = self.unary(CallKind::Write, self.request_timeout(), target, request, |mut c, r| async move { c.txn(r).await }).await?;
        convert::txn_result(response, txn)
    }

    /// Waits until the replica answering has applied everything committed in group
    /// `group_id` (0: the group serving `/`) before the call; returns that group's revision.
    pub async fn sync(&self, group_id: u64) -> Result<u64> {
        let routing = (group_id != 0).then_some(pb::Routing { group_id, ..pb::Routing::default() });
        let request = pb::SyncRequest { routing };
        let response = self.unary(CallKind::Idempotent, self.request_timeout(), None, request, |mut c, r| async move { c.sync(r).await }).await?;
        convert::revision(response.header)
    }

    /// Opens a session and starts keeping it alive.
    pub async fn session(&self, config: SessionConfig) -> Result<Session> {
        Session::open(self, config).await
    }

    /// Creates a session; returns its id and granted TTL.
    pub(crate) async fn create_session(&self, config: &SessionConfig) -> Result<(SessionId, Duration)> {
        let request = pb::CreateSessionRequest {
            ttl_ms: u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
            path_hint: config.path_hint.clone().unwrap_or_default(),
            routing: None,
        };
        let response =
            self.unary(CallKind::Write, self.request_timeout(), None, request, |mut c, r| async move { c.create_session(r).await }).await?;
        convert::created_session(response)
    }

    /// Renews a session's lease within `timeout`. Renewals of one home group that fall due
    /// while a keepalive of that group is on the way go together in the next call
    /// (`crate::renewal`); the lease counts from when this was called.
    pub async fn keep_alive(&self, id: SessionId, timeout: Duration) -> Result<SessionLease> {
        let deadline = deadline_after(timeout);
        let enqueued = self.shared.renewals.enqueue(id.0, deadline)?;
        if let Some(group) = enqueued.start_sending {
            tokio::spawn(self.clone().send_renewals(group));
        }
        match tokio::time::timeout_at(deadline, enqueued.answer).await {
            Ok(Ok(answer)) => convert::lease_of(id, answer?),
            Ok(Err(_)) => Err(Error::Transport { message: "the keepalive sender of this client stopped".into() }),
            Err(_) => Err(Error::DeadlineExceeded),
        }
    }

    /// Sends the renewals waiting for `group`, one keepalive call at a time, until none waits
    /// (each call to the group's leader when calling nodes directly, else to a router).
    async fn send_renewals(self, group: u64) {
        // Should this task end early (a panic, the runtime stopping), its waiters hear so at
        // once and the next renewal starts a new sender.
        let mut sender = renewal::Sender::new(&self.shared.renewals, group);
        while let Some(batch) = sender.next_batch() {
            let ids = batch.session_ids();
            let timeout = batch.deadline().map_or(Duration::ZERO, |d| d.saturating_duration_since(Instant::now()));
            let target = ids.first().map(|id| Target::Session(*id));
            let request = pb::KeepAliveRequest { session_ids: ids, routing: None };
            let answer = self.unary(CallKind::Idempotent, timeout, target, request, |mut c, r| async move { c.keep_alive(r).await }).await;
            batch.answer(answer.map(|response| response.leases));
        }
    }

    /// Ends a session now, in every group (before it answers); returns how many ephemerals
    /// went with it in its home group.
    pub async fn close_session(&self, id: SessionId) -> Result<u64> {
        let request = pb::CloseSessionRequest { session_id: id.0, routing: None };
        let response = self.unary(CallKind::Write, self.request_timeout(), None, request, |mut c, r| async move { c.close_session(r).await }).await?;
        Ok(response.deleted)
    }

    /// A session's lease as its group's leader sees it (without renewing it).
    pub async fn session_info(&self, id: SessionId) -> Result<SessionInfo> {
        let request = pb::SessionInfoRequest { session_id: id.0, ..pb::SessionInfoRequest::default() };
        let response =
            self.unary(CallKind::Idempotent, self.request_timeout(), None, request, |mut c, r| async move { c.session_info(r).await }).await?;
        convert::session_info(response)
    }

    /// Asks for a lock; the server waits up to `request.timeout_ms` for it, so the call's
    /// deadline is that wait plus the request timeout. Returns the sequencer when acquired.
    /// Idempotent: the server returns the same waiter for the same session and request id.
    pub(crate) async fn lock(&self, request: pb::LockRequest) -> Result<Option<Sequencer>> {
        let timeout = Duration::from_millis(request.timeout_ms).saturating_add(self.request_timeout());
        let path = request.path.clone();
        let response =
            self.unary(CallKind::Idempotent, timeout, Some(Target::Path(&path)), request, |mut c, r| async move { c.lock(r).await }).await?;
        convert::lock_response(response)
    }

    /// Releases a lock hold (or gives up waiting for it). Idempotent: releasing a hold that is
    /// already gone succeeds.
    pub(crate) async fn unlock(&self, sequencer: &Sequencer) -> Result<()> {
        let request = pb::UnlockRequest { sequencer: Some(convert::sequencer_request(sequencer)), routing: None };
        self.unary(CallKind::Idempotent, self.request_timeout(), sequencer_target(sequencer), request, |mut c, r| async move { c.unlock(r).await })
            .await?;
        Ok(())
    }

    /// Whether a sequencer still holds its lock (confirmed with the lock group's leader).
    pub async fn check_sequencer(&self, sequencer: &Sequencer) -> Result<bool> {
        let request = pb::CheckSequencerRequest { sequencer: Some(convert::sequencer_request(sequencer)), routing: None };
        let response = self
            .unary(CallKind::Idempotent, self.request_timeout(), sequencer_target(sequencer), request, |mut c, r| async move {
                c.check_sequencer(r).await
            })
            .await?;
        Ok(response.holds)
    }

    /// The holders and waiters of a lock.
    pub async fn lock_info(&self, path: &str) -> Result<LockInfo> {
        let request = pb::LockInfoRequest { path: path.into(), routing: None };
        let target = Some(Target::Path(path));
        let response =
            self.unary(CallKind::Idempotent, self.request_timeout(), target, request, |mut c, r| async move { c.lock_info(r).await }).await?;
        convert::lock_info(response)
    }

    /// Starts a watch; returns once the server has registered it.
    pub async fn watch(&self, options: WatchOptions) -> Result<Watcher> {
        Watcher::open(self.clone(), options).await
    }
}
