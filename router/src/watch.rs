//! Watches through the router: the client's one stream fans out to one upstream `Watch`
//! stream per group (to a replica of it), created on the first watch of that group. Watch
//! ids are the client's (the router picks one for `watch_id = 0`); upstream, each watch
//! goes under an id the router assigns and never reuses on the client's stream, and
//! responses are passed on under the client's id. So an answer about an old watch (a late
//! `canceled`, events in flight) never touches a new watch that reused its id: a watch the
//! client cancels is answered `canceled` at once, and what comes later for it is dropped.
//!
//! A PERSISTENT recursive watch spans every group serving part of the subtree: one part per
//! group (the group serving the path, and each ready group whose prefix is below it, as the
//! table says when the watch is created). Each response says its group (`header.group_id`)
//! since revisions are per group. The client sees one `created` (once every part is
//! created, with each group's start revision) and one `canceled` (the first part to end
//! ends the others, with each group's resume revision).
//!
//! If an upstream stream fails, each watch with a part on it is cancelled with UNAVAILABLE
//! and the revisions to resume from (per part: the last event seen + 1), so the client can
//! watch again without a gap.
//!
//! One task per client stream does all of this (so responses reach the client in the order
//! it decided them); one task per upstream stream only reads it. Memory is bounded per
//! stream: responses queued for the client in bytes (beyond it the upstream streams wait,
//! the nodes' own byte-bounded queues fill, and the nodes cancel the watches that fell
//! behind with SLOW_WATCHER), responses held for watches not created yet in bytes, watches
//! per stream, and requests queued per upstream.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::Message as _;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tonic::{Status, Streaming};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_create::Kind;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

use crate::upstream::{warden_client, Upstreams};
use warden_proto::routing::GroupRoute;

/// The responses of one proxied `Watch` call.
pub type Responses = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// Responses queued for the client, at most.
const RESPONSES_QUEUED_MAX: usize = 1024;
/// Bytes of responses (encoded) queued for the client, at most; one larger response is
/// taken alone. Beyond it the proxy stops reading its upstream streams.
pub const RESPONSES_QUEUED_BYTES_MAX: usize = 4 << 20;
/// Upstream responses waiting for the proxy task (all groups of one client stream; each
/// upstream's task holds one more): few, since a response may be large.
const UPSTREAM_RESPONSES_QUEUED_MAX: usize = 1;
/// Requests queued for one upstream stream.
const REQUESTS_QUEUED_MAX: usize = 256;
/// Requests waiting for room in full upstream queues (all groups of one client stream);
/// beyond it a creation is refused UNAVAILABLE.
const REQUESTS_WAITING_MAX: usize = 1024;
/// Bytes of responses held (all watches of a stream) while watches' parts are being
/// created (a part catching up from far back can produce many); beyond it the watch whose
/// response does not fit is cancelled as a slow watcher.
const HELD_BYTES_MAX: usize = 4 << 20;
/// Watches one client stream carries at once (as a node's default).
pub const WATCHES_PER_STREAM_MAX: usize = 100_000;
/// Longest a watch moved with its subtree waits for the new group's route before it ends
/// (the client re-creates it, and the router spans the groups its table knows).
const MOVED_ROUTE_WAIT: Duration = Duration::from_secs(10);
/// Pause between routing-table reads while waiting for a moved subtree's route.
const MOVED_ROUTE_POLL: Duration = Duration::from_millis(50);
/// Groups one watch may span (a recursive watch of a subtree holding more groups is
/// refused: watch smaller subtrees).
pub const WATCH_GROUPS_MAX: usize = 64;

/// One group's part of a watch: the upstream stream it is on, the next revision it needs,
/// and its `created` once seen.
#[derive(Default)]
struct Part {
    stream: u64,
    /// The version of the group's descriptor the part was created with (its route then).
    routing_version: u64,
    next_revision: u64,
    created: Option<WatchCreated>,
    /// The header of the group's `created` (the client takes the serving group's as the
    /// watch's owner).
    created_header: Option<ResponseHeader>,
}

/// A watch the proxy carries: the client's id for it, its parts by group, which group
/// serves its path, and the responses held until every part is created.
#[derive(Default)]
struct Carried {
    client_id: u64,
    owner: u64,
    /// Ends with its first events (the node ends it then, without a `canceled`).
    one_shot: bool,
    parts: BTreeMap<u64, Part>,
    /// The client got `created`.
    announced: bool,
    /// Responses of parts (with their group) that came before the last part's `created`.
    held: Vec<(u64, WatchResponse)>,
}

impl Carried {
    /// `response` of `group`'s part went to the client: its part resumes after it.
    fn delivered(&mut self, group: u64, response: &WatchResponse) {
        if let (Some(part), Some(last)) = (self.parts.get_mut(&group), response.events.last()) {
            part.next_revision = last.revision + 1;
        }
    }

    /// Where to resume each part.
    fn resume_revisions(&self) -> HashMap<u64, u64> {
        self.parts.iter().map(|(group, part)| (*group, part.next_revision)).collect()
    }

    /// The `canceled` response that ends this watch for the client.
    fn canceled(&self, error: Option<WardenError>) -> WatchResponse {
        let resume_revision = self.parts.get(&self.owner).map_or(0, |p| p.next_revision);
        let canceled = WatchCanceled { error, resume_revision, resume_revisions: self.resume_revisions() };
        WatchResponse { watch_id: self.client_id, canceled: Some(canceled), ..WatchResponse::default() }
    }

    fn held_bytes(&self) -> usize {
        self.held.iter().map(|(_, response)| response.encoded_len()).sum()
    }
}

/// The watches of one client stream.
#[derive(Default)]
struct Watches {
    /// By upstream id.
    carried: HashMap<u64, Carried>,
    /// The upstream id of each of the client's live watches, by the client's id.
    ids: HashMap<u64, u64>,
    /// Bytes of responses held, all watches.
    held_bytes: usize,
}

impl Watches {
    /// Forgets a watch; returns it.
    fn remove(&mut self, upstream_id: u64) -> Option<Carried> {
        let carried = self.carried.remove(&upstream_id)?;
        if self.ids.get(&carried.client_id) == Some(&upstream_id) {
            self.ids.remove(&carried.client_id);
        }
        self.held_bytes -= carried.held_bytes();
        Some(carried)
    }

    /// Ends watch `upstream_id` with `group`'s part's `canceled` response, after `before`
    /// (the responses held until every part was created, delivered now).
    fn end(&mut self, upstream_id: u64, group: u64, response: WatchResponse, before: Vec<WatchResponse>) -> Step {
        let Some(ended) = response.canceled else { return Step::Hold };
        let Some(mut watch) = self.remove(upstream_id) else { return Step::Hold };
        let others = watch.parts.keys().copied().filter(|g| *g != group).map(|g| (g, upstream_id)).collect();
        let routing_version = watch.parts.get(&group).map_or(0, |part| part.routing_version);
        let moved_to = ended.error.as_ref().filter(|e| e.code == Code::Moved as i32).map(|e| e.moved_to_group);
        if let (Some(_), true) = (moved_to, watch.announced) {
            // The node sent every event of the part before the move's revision ahead of the
            // cancellation, and the client has them: the part resumes after the move, not
            // at its last event.
            if let Some(part) = watch.parts.get_mut(&group) {
                part.next_revision = part.next_revision.max(ended.resume_revision);
            }
        }
        let mut end = WatchResponse { header: response.header, ..watch.canceled(ended.error) };
        // A moved subtree resumes at its new group from the move (MOVED, warden.proto).
        if let (Some(group), Some(canceled)) = (moved_to.filter(|g| *g != 0), end.canceled.as_mut()) {
            canceled.resume_revisions.entry(group).or_insert(ended.resume_revision);
        }
        Step::End { before, end: Box::new(end), others, routing_version }
    }

    /// Folds one upstream response of `group`'s stream `stream` into the watch's state.
    /// Until every part is created, the parts' events are held (the client must see
    /// `created` first); then the merged `created` goes out followed by what was held.
    /// Responses about watches no longer carried (cancelled, ended) are dropped.
    fn step(&mut self, group: u64, stream: u64, mut response: WatchResponse) -> Step {
        let upstream_id = response.watch_id;
        let Some(watch) = self.carried.get_mut(&upstream_id) else { return Step::Hold };
        if watch.parts.get(&group).is_none_or(|part| part.stream != stream) {
            return Step::Hold;
        }
        response.watch_id = watch.client_id;
        if let Some(ended) = &response.canceled {
            let moved = ended.error.as_ref().is_some_and(|e| e.code == Code::Moved as i32);
            if moved && !watch.announced && watch.parts.get(&group).is_some_and(|part| part.created.is_some()) {
                // The part's events up to the move are held ahead of this: it goes to the
                // client after them, once every other part is created. Ended now, the
                // held events would be dropped while the part resumes after the move.
                self.held_bytes += response.encoded_len();
                watch.held.push((group, response));
                return Step::Hold;
            }
            return self.end(upstream_id, group, response, Vec::new());
        }
        if let Some(created) = &response.created {
            let Some(part) = watch.parts.get_mut(&group) else { return Step::Hold };
            part.next_revision = created.start_revision;
            part.created = Some(created.clone());
            part.created_header = response.header;
            if watch.parts.values().any(|p| p.created.is_none()) {
                return Step::Hold;
            }
            // Every part is created: one `created` for the client (the serving group's, with
            // its header whichever group answered last, and each group's start), then the
            // events held meanwhile.
            let start_revisions = watch.parts.iter().map(|(g, p)| (*g, p.created.as_ref().map_or(0, |c| c.start_revision))).collect();
            let (owner, header) =
                watch.parts.get(&watch.owner).map(|p| (p.created.clone().unwrap_or_default(), p.created_header)).unwrap_or_default();
            let mut out = vec![WatchResponse { created: Some(WatchCreated { start_revisions, ..owner }), header, ..response }];
            watch.announced = true;
            self.held_bytes -= watch.held_bytes();
            let fired = watch.one_shot && watch.held.iter().any(|(_, held)| !held.events.is_empty());
            let mut moved = None;
            for (held_group, held) in std::mem::take(&mut watch.held) {
                if held.canceled.is_some() {
                    // A part that ended MOVED, after its events (held before it).
                    moved = Some((held_group, held));
                    break;
                }
                watch.delivered(held_group, &held);
                out.push(held);
            }
            if let Some((moved_group, canceled)) = moved {
                return self.end(upstream_id, moved_group, canceled, out);
            }
            if fired {
                self.remove(upstream_id);
            }
            return Step::Send(out);
        }
        if !watch.announced {
            let bytes = response.encoded_len();
            if self.held_bytes + bytes > HELD_BYTES_MAX {
                // Nothing was delivered yet: the client starts again from the same revisions.
                let Some(watch) = self.remove(upstream_id) else { return Step::Hold };
                let error = WardenError {
                    code: Code::SlowWatcher as i32,
                    message: "too many events before every group's watch was created".into(),
                    ..WardenError::default()
                };
                let parts = watch.parts.keys().map(|g| (*g, upstream_id)).collect();
                return Step::End { before: Vec::new(), end: Box::new(watch.canceled(Some(error))), others: parts, routing_version: 0 };
            }
            self.held_bytes += bytes;
            watch.held.push((group, response));
            return Step::Hold;
        }
        watch.delivered(group, &response);
        if watch.one_shot && !response.events.is_empty() {
            // The node ended it with these events.
            self.remove(upstream_id);
        }
        Step::Send(vec![response])
    }
}

/// What to do with one upstream response.
enum Step {
    /// Send these on, in order.
    Send(Vec<WatchResponse>),
    /// The watch ended: send `before`, then `end`.
    End {
        /// Responses held until every part was created, now delivered.
        before: Vec<WatchResponse>,
        /// The `canceled` response.
        end: Box<WatchResponse>,
        /// The parts to cancel upstream: (group, upstream id).
        others: Vec<(u64, u64)>,
        /// The ended part's routing version (see [`Proxy::await_routed`]).
        routing_version: u64,
    },
    /// Nothing to send now.
    Hold,
}

/// The client's side: responses queued in order, bounded in count and in bytes.
struct Outbox {
    sender: mpsc::Sender<(WatchResponse, OwnedSemaphorePermit)>,
    bytes: Arc<Semaphore>,
}

impl Outbox {
    /// Queues `response` once its bytes fit; false when the client went away.
    async fn send(&self, response: WatchResponse) -> bool {
        // (One response larger than the whole budget waits for an empty queue.)
        let bytes = response.encoded_len().clamp(1, RESPONSES_QUEUED_BYTES_MAX) as u32;
        let Ok(permit) = self.bytes.clone().acquire_many_owned(bytes).await else { return false };
        self.sender.send((response, permit)).await.is_ok()
    }
}

/// An upstream response: (group, stream, the response or `None` when the stream ended).
type FromUpstream = (u64, u64, Option<WatchResponse>);

/// The requests of one client `Watch` stream: a gRPC call's, or those the etcd front end
/// translates from an etcd watch stream.
pub type Requests = Pin<Box<dyn Stream<Item = Result<WatchRequest, Status>> + Send>>;

/// Starts proxying one client `Watch` stream.
pub fn proxy(upstreams: Arc<Upstreams>, incoming: Requests) -> Responses {
    let (sender, stream) = mpsc::channel(RESPONSES_QUEUED_MAX);
    let out = Outbox { sender, bytes: Arc::new(Semaphore::new(RESPONSES_QUEUED_BYTES_MAX)) };
    let (from_upstream, upstream_responses) = mpsc::channel(UPSTREAM_RESPONSES_QUEUED_MAX);
    let proxy = Proxy {
        upstreams,
        watches: Watches::default(),
        streams: HashMap::new(),
        next_stream: 1,
        next_upstream_id: 1,
        next_client_id: 1,
        from_upstream,
        waiting: Arc::new(AtomicUsize::new(0)),
        out,
    };
    // The upstream streams it opens are for the client's principal.
    tokio::spawn(crate::principal::scoped(crate::principal::current(), proxy.run(incoming, upstream_responses)));
    // A response's bytes are freed as the client's stream takes it.
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream).map(|(response, _bytes)| Ok(response)))
}

fn canceled(watch_id: u64, code: Code, message: String, resume_revision: u64) -> WatchResponse {
    let error = warden_proto::warden_error(code, "", message);
    WatchResponse {
        watch_id,
        canceled: Some(WatchCanceled { error: Some(error), resume_revision, ..WatchCanceled::default() }),
        ..WatchResponse::default()
    }
}

/// The groups a watch of `create.path` spans: the serving group first, then (for a
/// PERSISTENT recursive watch) every ready group below the path. Refused UNAVAILABLE while
/// no group serves the path (retried), TOO_LARGE past [`WATCH_GROUPS_MAX`] (not retried:
/// watch smaller subtrees) or when it names too many groups' start revisions
/// ([`warden_proto::check_group_start_revisions`]: refused here, before any group sees it).
async fn spanned_groups(upstreams: &Upstreams, create: &WatchCreate) -> Result<Vec<GroupRoute>, WardenError> {
    warden_proto::check_group_start_revisions(create)?;
    let path = warden_proto::quote(&create.path, warden_proto::QUOTED_PATH_BYTES_MAX);
    let unavailable = |message: String| warden_proto::warden_error(Code::Unavailable, "", message);
    let mut table = upstreams.table();
    if table.route(&create.path).is_none() {
        table = upstreams.refresh().await.map_err(|status| unavailable(status.message().to_string()))?;
    }
    let owner = table.route(&create.path).cloned().ok_or_else(|| unavailable(format!("no group serves {path}")))?;
    let mut groups = vec![owner];
    if create.recursive && create.kind == Kind::Persistent as i32 {
        groups.extend(table.groups_below(&create.path).into_iter().cloned());
    }
    check_span(&path, groups.len())?;
    Ok(groups)
}

/// Refuses a watch of `path` spanning `groups` groups past [`WATCH_GROUPS_MAX`].
fn check_span(path: &str, groups: usize) -> Result<(), WardenError> {
    if groups > WATCH_GROUPS_MAX {
        let message = format!("{path} spans {groups} groups; a watch spans at most {WATCH_GROUPS_MAX}: watch smaller subtrees");
        return Err(WardenError { limit: WATCH_GROUPS_MAX as u64, ..warden_proto::warden_error(Code::TooLarge, "", message) });
    }
    Ok(())
}

/// The upstream create of one part: the group's own routing, and for a group below the
/// path, its prefix as the path (and no read). Each part starts from the client's resume
/// revision for its group ([`part_start`]) and carries every group's, which a node checks a
/// subtree that moved into its group against.
fn part_create(create: &WatchCreate, upstream_id: u64, route: &GroupRoute, owner: bool) -> WatchCreate {
    let routing = Some(Routing { group_id: route.id(), conf_ver: route.descriptor.conf_ver, version: route.descriptor.version });
    let start_revision = part_start(create, route.id(), owner);
    if owner {
        return WatchCreate { watch_id: upstream_id, start_revision, routing, ..create.clone() };
    }
    WatchCreate { watch_id: upstream_id, path: route.descriptor.prefix.clone(), start_revision, read: false, routing, ..create.clone() }
}

/// Where `group`'s part starts: its entry in `group_start_revisions`; for the group serving
/// the path without one, `start_revision` (a new watch's, or the client's resume revision
/// in the group it last knew serving the path, which a node judges as above); for another
/// group without one, now.
fn part_start(create: &WatchCreate, group: u64, owner: bool) -> u64 {
    match create.group_start_revisions.get(&group) {
        Some(revision) => *revision,
        None if owner => create.start_revision,
        None => 0,
    }
}

/// The task of one client stream.
struct Proxy {
    upstreams: Arc<Upstreams>,
    watches: Watches,
    /// Each group's upstream stream: its number and where its requests go.
    streams: HashMap<u64, (u64, mpsc::Sender<WatchRequest>)>,
    next_stream: u64,
    /// Upstream watch ids are never reused on one client stream.
    next_upstream_id: u64,
    /// Next id to try for a watch the client created with `watch_id = 0`.
    next_client_id: u64,
    from_upstream: mpsc::Sender<FromUpstream>,
    /// Requests waiting for room in full upstream queues.
    waiting: Arc<AtomicUsize>,
    out: Outbox,
}

impl Proxy {
    async fn run(mut self, mut incoming: Requests, mut upstream_responses: mpsc::Receiver<FromUpstream>) {
        let mut requests_open = true;
        loop {
            let alive = tokio::select! {
                message = incoming.next(), if requests_open => match message {
                    Some(Ok(request)) => self.handle(request).await,
                    // The client closed its side: keep sending until it hangs up.
                    None => {
                        requests_open = false;
                        true
                    }
                    Some(Err(_)) => false,
                },
                Some((group, stream, response)) = upstream_responses.recv() => match response {
                    Some(response) => self.upstream_response(group, stream, response).await,
                    None => self.upstream_ended(group, stream).await,
                },
                () = self.out.sender.closed() => false,
            };
            if !alive {
                // Dropping the upstream senders ends the upstream streams.
                return;
            }
        }
    }

    /// Sends `request` to `group`'s upstream stream without waiting on it (an upstream that
    /// takes no requests waits for its responses to be read, which this task does): when its
    /// queue is full, a task sends it once there is room, unless `optional` and too many
    /// already wait. False when it was not sent (no stream, or dropped).
    fn send_upstream(&self, group: u64, request: WatchRequest, optional: bool) -> bool {
        let Some((_, sender)) = self.streams.get(&group).filter(|(_, s)| !s.is_closed()) else { return false };
        match sender.try_send(request) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Closed(_)) => false,
            Err(mpsc::error::TrySendError::Full(request)) => {
                if optional && self.waiting.load(Ordering::Relaxed) >= REQUESTS_WAITING_MAX {
                    return false;
                }
                let (sender, waiting) = (sender.clone(), self.waiting.clone());
                waiting.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = sender.send(request).await;
                    waiting.fetch_sub(1, Ordering::Relaxed);
                });
                true
            }
        }
    }

    /// Asks each part (group, upstream id) to cancel (a closed stream has no watches left).
    fn cancel_parts(&self, parts: impl IntoIterator<Item = (u64, u64)>) {
        for (group, watch_id) in parts {
            self.send_upstream(group, WatchRequest { request: Some(WatchRequestKind::Cancel(WatchCancel { watch_id })) }, false);
        }
    }

    /// One client request; false when the client went away.
    async fn handle(&mut self, request: WatchRequest) -> bool {
        match request.request {
            Some(WatchRequestKind::Create(mut create)) => {
                if create.watch_id == 0 {
                    while self.watches.ids.contains_key(&self.next_client_id) {
                        self.next_client_id += 1;
                    }
                    create.watch_id = self.next_client_id;
                }
                match self.start(create).await {
                    Ok(()) => true,
                    Err(response) => self.out.send(response).await,
                }
            }
            Some(WatchRequestKind::Cancel(cancel)) => match self.watches.ids.get(&cancel.watch_id).copied() {
                // Ended for the client now; whatever comes later for it is dropped.
                Some(upstream_id) => {
                    let Some(watch) = self.watches.remove(upstream_id) else { return true };
                    self.cancel_parts(watch.parts.keys().map(|g| (*g, upstream_id)));
                    self.out.send(watch.canceled(None)).await
                }
                None => {
                    let message = format!("no watch {} on this stream", cancel.watch_id);
                    self.out.send(canceled(cancel.watch_id, Code::InvalidArgument, message, 0)).await
                }
            },
            Some(WatchRequestKind::Progress(progress)) => {
                let groups: Vec<u64> = self.streams.keys().copied().collect();
                for group in groups {
                    self.send_upstream(group, WatchRequest { request: Some(WatchRequestKind::Progress(progress)) }, true);
                }
                true
            }
            None => true,
        }
    }

    /// Registers a watch and sends each part's create upstream; on failure, the response that
    /// refuses it (nothing stays registered).
    async fn start(&mut self, create: WatchCreate) -> Result<(), WatchResponse> {
        let watch_id = create.watch_id;
        if self.watches.ids.contains_key(&watch_id) {
            return Err(canceled(watch_id, Code::InvalidArgument, "the watch id is in use on this stream".into(), 0));
        }
        if self.watches.ids.len() >= WATCHES_PER_STREAM_MAX {
            let message = format!("a stream carries at most {WATCHES_PER_STREAM_MAX} watches");
            return Err(WatchResponse {
                watch_id,
                canceled: Some(WatchCanceled {
                    error: Some(WardenError { limit: WATCHES_PER_STREAM_MAX as u64, ..warden_proto::warden_error(Code::TooLarge, "", message) }),
                    ..WatchCanceled::default()
                }),
                ..WatchResponse::default()
            });
        }
        let groups = spanned_groups(&self.upstreams, &create).await.map_err(|error| WatchResponse {
            watch_id,
            canceled: Some(WatchCanceled { error: Some(error), ..WatchCanceled::default() }),
            ..WatchResponse::default()
        })?;
        let mut streams = Vec::new();
        for route in &groups {
            let stream = match self.streams.get(&route.id()).filter(|(_, s)| !s.is_closed()) {
                Some((stream, _)) => *stream,
                None => {
                    let stream = self.next_stream;
                    self.next_stream += 1;
                    let sender = open(&self.upstreams, route, stream, self.from_upstream.clone())
                        .await
                        .map_err(|status| canceled(watch_id, Code::Unavailable, status.message().to_string(), create.start_revision))?;
                    self.streams.insert(route.id(), (stream, sender));
                    stream
                }
            };
            streams.push(stream);
        }
        let upstream_id = self.next_upstream_id;
        self.next_upstream_id += 1;
        let owner = groups[0].id();
        let parts = groups
            .iter()
            .zip(&streams)
            .map(|(route, stream)| {
                let next_revision = part_start(&create, route.id(), route.id() == owner);
                let part = Part { stream: *stream, routing_version: route.descriptor.version, next_revision, created: None, created_header: None };
                (route.id(), part)
            })
            .collect();
        let one_shot = create.kind != Kind::Persistent as i32;
        self.watches.carried.insert(upstream_id, Carried { client_id: watch_id, owner, one_shot, parts, ..Carried::default() });
        self.watches.ids.insert(watch_id, upstream_id);
        for (n, route) in groups.iter().enumerate() {
            let part = part_create(&create, upstream_id, route, route.id() == owner);
            if !self.send_upstream(route.id(), WatchRequest { request: Some(WatchRequestKind::Create(part)) }, true) {
                let Some(watch) = self.watches.remove(upstream_id) else { break };
                self.cancel_parts(watch.parts.keys().take(n).map(|g| (*g, upstream_id)));
                let message = format!("group {} takes no more requests now; read the stream's responses, then watch again", route.id());
                return Err(canceled(watch_id, Code::Unavailable, message, create.start_revision));
            }
        }
        Ok(())
    }

    /// One upstream response; false when the client went away.
    async fn upstream_response(&mut self, group: u64, stream: u64, mut response: WatchResponse) -> bool {
        let wrong_group = response.canceled.as_mut().and_then(|c| c.error.as_mut()).filter(|e| e.code == Code::WrongGroup as i32);
        if let Some(error) = wrong_group {
            // Routed by a stale table (a subtree moved, or is moving): the table is read again
            // and the client watches again (UNAVAILABLE is retried), as unary calls are.
            error.code = Code::Unavailable as i32;
            let upstreams = self.upstreams.clone();
            tokio::spawn(async move {
                if let Err(refresh) = upstreams.refresh().await {
                    tracing::debug!(%refresh, "routing table refresh after a watch's WRONG_GROUP");
                }
            });
        }
        let out = match self.watches.step(group, stream, response) {
            Step::Send(out) => out,
            Step::End { before, end, others, routing_version } => {
                self.cancel_parts(others);
                for response in before {
                    if !self.out.send(response).await {
                        return false;
                    }
                }
                let moved = end.canceled.as_ref().and_then(|c| c.error.as_ref()).filter(|e| e.code == Code::Moved as i32);
                if let Some(path) = moved.map(|e| e.path.clone()) {
                    self.await_routed(&path, group, routing_version).await;
                }
                vec![*end]
            }
            Step::Hold => return true,
        };
        for response in out {
            if !self.out.send(response).await {
                return false;
            }
        }
        true
    }

    /// Waits (at most [`MOVED_ROUTE_WAIT`]) until the routing table no longer routes the
    /// moved subtree at `path` as when the part that ended was created (to `left_group` at
    /// descriptor version `left_version`): it is routed to its new group (a split's new one,
    /// a merge's parent) a moment after the old one let it go, and a watch re-created before
    /// this router knows would not span it (or would span the old group). The route it
    /// waits for may be another than the MOVED named: the subtree may have moved on (or back)
    /// meanwhile, and a node ends a watch that would skip a group's events COMPACTED.
    async fn await_routed(&self, path: &str, left_group: u64, left_version: u64) {
        let deadline = tokio::time::Instant::now() + MOVED_ROUTE_WAIT;
        loop {
            let table = self.upstreams.table();
            let routed = table.route(path).is_some_and(|r| r.id() != left_group || r.descriptor.version > left_version);
            if routed || tokio::time::Instant::now() >= deadline {
                return;
            }
            if let Err(refresh) = self.upstreams.refresh().await {
                tracing::debug!(%refresh, "routing table refresh for a moved subtree");
            }
            tokio::time::sleep(MOVED_ROUTE_POLL).await;
        }
    }

    /// `group`'s upstream stream `stream` ended: every watch with a part on it ends, with
    /// where to resume. False when the client went away.
    async fn upstream_ended(&mut self, group: u64, stream: u64) -> bool {
        if self.streams.get(&group).is_some_and(|(current, _)| *current == stream) {
            self.streams.remove(&group);
        }
        let ended: Vec<u64> =
            self.watches.carried.iter().filter(|(_, c)| c.parts.get(&group).is_some_and(|p| p.stream == stream)).map(|(id, _)| *id).collect();
        for upstream_id in ended {
            let Some(carried) = self.watches.remove(upstream_id) else { continue };
            self.cancel_parts(carried.parts.keys().copied().filter(|g| *g != group).map(|g| (g, upstream_id)));
            let message = format!("the stream to group {group} ended; watch again from the resume revisions");
            let error = warden_proto::warden_error(Code::Unavailable, "", message);
            if !self.out.send(carried.canceled(Some(error))).await {
                return false;
            }
        }
        true
    }
}

/// Opens the upstream stream `stream` of one group and a task passing its responses on.
async fn open(
    upstreams: &Upstreams,
    route: &GroupRoute,
    stream: u64,
    from_upstream: mpsc::Sender<FromUpstream>,
) -> Result<mpsc::Sender<WatchRequest>, Status> {
    let group = route.id();
    let table = upstreams.table();
    let mut last_error = Status::unavailable(format!("group {group} has no reachable replica"));
    for replica in &route.descriptor.replicas {
        let Some(addr) = table.addr(*replica) else { continue };
        let (sender, outgoing) = mpsc::channel(REQUESTS_QUEUED_MAX);
        let mut client = warden_client(upstreams.channel(addr)?);
        let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
        crate::principal::name_in(&mut request);
        match client.watch(request).await {
            Ok(response) => {
                tokio::spawn(pass_on(group, stream, response.into_inner(), from_upstream));
                return Ok(sender);
            }
            Err(status) => last_error = status,
        }
    }
    Err(last_error)
}

/// Hands one upstream stream's responses to the client stream's task (waiting while it is
/// busy: the upstream's own flow control then holds the node back), then its end.
async fn pass_on(group: u64, stream: u64, mut upstream: Streaming<WatchResponse>, from_upstream: mpsc::Sender<FromUpstream>) {
    while let Ok(Some(response)) = upstream.message().await {
        if from_upstream.send((group, stream, Some(response))).await.is_err() {
            return;
        }
    }
    let _ = from_upstream.send((group, stream, None)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Watch 9 of the client, upstream id 90, with parts in groups 1 (serving its path) and 2.
    fn two_parts() -> Watches {
        let parts = BTreeMap::from([
            (1, Part { stream: 1, next_revision: 0, ..Part::default() }),
            (2, Part { stream: 2, next_revision: 7, ..Part::default() }),
        ]);
        let carried = Carried { client_id: 9, owner: 1, parts, ..Carried::default() };
        Watches { carried: HashMap::from([(90, carried)]), ids: HashMap::from([(9, 90)]), held_bytes: 0 }
    }

    fn created(start_revision: u64) -> WatchResponse {
        WatchResponse { watch_id: 90, created: Some(WatchCreated { start_revision, ..WatchCreated::default() }), ..WatchResponse::default() }
    }

    fn events(revision: u64) -> WatchResponse {
        WatchResponse { watch_id: 90, events: vec![WatchEvent { revision, ..WatchEvent::default() }], ..WatchResponse::default() }
    }

    #[test]
    fn a_watch_spanning_more_groups_than_the_bound_is_refused_too_large() {
        assert!(check_span("/t", WATCH_GROUPS_MAX).is_ok());
        let refused = check_span("/t", WATCH_GROUPS_MAX + 1).expect_err("past the bound");
        assert_eq!((refused.code, refused.limit), (Code::TooLarge as i32, WATCH_GROUPS_MAX as u64), "not retried: {refused:?}");
    }

    /// Each part starts from the client's own resume revision for its group, the serving
    /// group's without one from `start_revision` (the group the client last knew serving the
    /// path), another group's without one from now; every part carries every group's.
    #[test]
    fn a_part_starts_from_the_clients_resume_revision_for_its_group() {
        let resumed =
            WatchCreate { path: "/t".into(), start_revision: 30, group_start_revisions: HashMap::from([(1, 12), (5, 30)]), ..WatchCreate::default() };
        let route = |id: u64, prefix: &str| GroupRoute {
            descriptor: GroupDescriptor { group_id: id, prefix: prefix.into(), version: 3, ..GroupDescriptor::default() },
        };
        let serving_known = part_create(&resumed, 7, &route(1, "/"), true);
        assert_eq!((serving_known.start_revision, serving_known.watch_id), (12, 7), "not the other group's 30");
        assert_eq!(serving_known.group_start_revisions, resumed.group_start_revisions, "the node checks moves in against them");
        assert_eq!(part_create(&resumed, 7, &route(6, "/"), true).start_revision, 30);
        let below = part_create(&resumed, 7, &route(6, "/t/u"), false);
        assert_eq!((below.start_revision, below.path.as_str()), (0, "/t/u"));
        assert_eq!(part_create(&resumed, 7, &route(5, "/t/v"), false).start_revision, 30);
    }

    #[test]
    fn a_watch_spanning_groups_is_created_once_every_part_is_and_events_wait_for_it() {
        let mut watches = two_parts();
        assert!(matches!(watches.step(2, 2, created(7)), Step::Hold), "one part is not the watch");
        assert!(matches!(watches.step(2, 2, events(7)), Step::Hold), "events never come before created");
        assert!(watches.held_bytes > 0);
        match watches.step(1, 1, created(40)) {
            Step::Send(out) => {
                assert_eq!(out.len(), 2, "created, then what was held");
                let created = out[0].created.clone().expect("created");
                assert_eq!(out[0].watch_id, 9, "under the client's id");
                assert_eq!(created.start_revision, 40, "the serving group's");
                assert_eq!(created.start_revisions, HashMap::from([(1, 40), (2, 7)]));
                assert_eq!(out[1].events[0].revision, 7);
            }
            _ => panic!("the last part's created is forwarded"),
        }
        assert_eq!(watches.held_bytes, 0);
        assert!(matches!(watches.step(2, 2, events(8)), Step::Send(_)));
        assert_eq!(watches.carried[&90].parts[&2].next_revision, 9);
        assert!(matches!(watches.step(2, 3, events(9)), Step::Hold), "another stream of group 2 is not this part");
    }

    #[test]
    fn the_created_of_a_spanning_watch_names_the_serving_group_whichever_part_answers_last() {
        let mut watches = two_parts();
        let created_by = |group_id: u64, start_revision: u64| WatchResponse {
            header: Some(ResponseHeader { group_id, revision: start_revision, ..ResponseHeader::default() }),
            ..created(start_revision)
        };
        assert!(matches!(watches.step(1, 1, created_by(1, 40)), Step::Hold));
        match watches.step(2, 2, created_by(2, 7)) {
            // The client takes the header's group as the watch's owner, whose start revision
            // is `start_revision`: another group's would resume the owner from its revision.
            Step::Send(out) => assert_eq!(out[0].header.as_ref().map(|h| (h.group_id, h.revision)), Some((1, 40))),
            _ => panic!("the last part's created is forwarded"),
        }
    }

    #[test]
    fn one_part_ending_ends_the_watch_with_every_groups_resume_revision() {
        let mut watches = two_parts();
        assert!(matches!(watches.step(1, 1, created(0)), Step::Hold));
        assert!(matches!(watches.step(2, 2, created(7)), Step::Send(_)));
        assert!(matches!(watches.step(2, 2, events(12)), Step::Send(_)));
        let ended = WatchResponse { watch_id: 90, canceled: Some(WatchCanceled::default()), ..WatchResponse::default() };
        match watches.step(1, 1, ended) {
            Step::End { before, end, others, .. } => {
                assert!(before.is_empty());
                assert_eq!(others, vec![(2, 90)], "the other part is cancelled upstream");
                assert_eq!(end.watch_id, 9);
                assert_eq!(end.canceled.expect("canceled").resume_revisions, HashMap::from([(1, 0), (2, 13)]));
            }
            _ => panic!("a part's cancel ends the watch"),
        }
        let late = WatchResponse { watch_id: 90, canceled: Some(WatchCanceled::default()), ..WatchResponse::default() };
        assert!(matches!(watches.step(2, 2, late), Step::Hold), "the other part's cancel is not a second one");
        assert!(watches.carried.is_empty() && watches.ids.is_empty());
    }

    /// A part that catches up to a move and ends MOVED before the other parts are created:
    /// its events reach the client (after `created`) ahead of the cancel, whose resume
    /// revisions say so; it never resumes past events the client did not get.
    #[test]
    fn a_part_ending_moved_before_the_watch_is_created_ends_it_after_its_events() {
        let mut watches = two_parts();
        assert!(matches!(watches.step(2, 2, created(7)), Step::Hold));
        assert!(matches!(watches.step(2, 2, events(8)), Step::Hold));
        let moved = WardenError { moved_to_group: 3, ..warden_proto::warden_error(Code::Moved, "/t", "moved") };
        let canceled = WatchCanceled { error: Some(moved), resume_revision: 11, ..WatchCanceled::default() };
        let ended = WatchResponse { watch_id: 90, canceled: Some(canceled), ..WatchResponse::default() };
        assert!(matches!(watches.step(2, 2, ended), Step::Hold), "the held events go first, once the watch is created");
        match watches.step(1, 1, created(40)) {
            Step::End { before, end, others, .. } => {
                let revisions: Vec<Vec<u64>> = before.iter().map(|r| r.events.iter().map(|e| e.revision).collect()).collect();
                assert!(before[0].created.is_some(), "created first");
                assert_eq!(revisions[1..], [vec![8]], "then the moved part's events");
                assert_eq!(others, vec![(1, 90)], "the part still running is cancelled upstream");
                let canceled = end.canceled.expect("canceled");
                assert_eq!(canceled.resume_revisions, HashMap::from([(1, 40), (2, 11), (3, 11)]));
            }
            _ => panic!("the watch ends once created"),
        }
        assert_eq!(watches.held_bytes, 0);
        assert!(watches.carried.is_empty() && watches.ids.is_empty());
    }

    #[test]
    fn a_fired_one_shot_watch_leaves_no_record() {
        let parts = BTreeMap::from([(1, Part { stream: 1, next_revision: 0, ..Part::default() })]);
        let carried = Carried { client_id: 9, owner: 1, one_shot: true, parts, ..Carried::default() };
        let mut watches = Watches { carried: HashMap::from([(90, carried)]), ids: HashMap::from([(9, 90)]), held_bytes: 0 };
        assert!(matches!(watches.step(1, 1, created(5)), Step::Send(_)));
        assert!(matches!(watches.step(1, 1, events(5)), Step::Send(_)));
        assert!(watches.carried.is_empty() && watches.ids.is_empty(), "the node ended it with its events");
    }

    #[test]
    fn held_responses_are_bounded_in_bytes() {
        let mut watches = two_parts();
        assert!(matches!(watches.step(2, 2, created(7)), Step::Hold));
        let big = |revision| WatchResponse {
            watch_id: 90,
            events: vec![WatchEvent { revision, data: vec![0; 1 << 20].into(), ..WatchEvent::default() }],
            ..WatchResponse::default()
        };
        for revision in 7..10 {
            assert!(matches!(watches.step(2, 2, big(revision)), Step::Hold));
        }
        match watches.step(2, 2, big(10)) {
            Step::End { end, others, .. } => {
                let error = end.canceled.and_then(|c| c.error).expect("an error");
                assert_eq!(error.code, Code::SlowWatcher as i32);
                assert_eq!(others.len(), 2, "both parts are cancelled upstream");
            }
            _ => panic!("held bytes are bounded"),
        }
        assert_eq!(watches.held_bytes, 0);
    }
}
