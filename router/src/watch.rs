//! Watches through the router: the client's one stream fans out to one upstream `Watch`
//! stream per group (to a replica of it), created on the first watch of that group. Watch
//! ids stay the client's (the router picks one for `watch_id = 0`); an upstream stream
//! carries the watch under the same id, so responses pass through unchanged.
//!
//! A PERSISTENT recursive watch spans every group serving part of the subtree: one part per
//! group (the group serving the path, and each ready group whose prefix is below it, as the
//! table says when the watch is created), all under the client's watch id. Each response
//! says its group (`header.group_id`) since revisions are per group. The client sees one
//! `created` (once every part is created, with each group's start revision) and one
//! `canceled` (the first part to end ends the others, with each group's resume revision).
//!
//! If an upstream stream fails, each watch with a part on it is cancelled with UNAVAILABLE
//! and the revisions to resume from (per part: the last event seen + 1), so the client can
//! watch again without a gap.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_create::Kind;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

use crate::table::GroupRoute;
use crate::upstream::{warden_client, Upstreams};

/// The responses of one proxied `Watch` call.
pub type Responses = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// Responses queued for the client before upstream readers wait (bounded memory; the
/// shard-nodes' own queues cancel watches that fall too far behind).
const RESPONSES_QUEUED_MAX: usize = 1024;
/// Requests queued for one upstream stream.
const REQUESTS_QUEUED_MAX: usize = 256;
/// Responses held for one watch while its parts are being created (a part catching up
/// from far back can produce many); beyond it the watch is cancelled as a slow watcher.
const HELD_RESPONSES_MAX: usize = 1024;
/// Groups one watch may span (a recursive watch of a subtree holding more groups is
/// refused: watch smaller subtrees).
pub const WATCH_GROUPS_MAX: usize = 64;

/// One group's part of a watch: the next revision it needs, and its `created` once seen.
struct Part {
    next_revision: u64,
    created: Option<WatchCreated>,
}

/// A watch the proxy carries: its parts by group, which group serves its path, and the
/// responses held until every part is created.
#[derive(Default)]
struct Carried {
    owner: u64,
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
    fn canceled(&self, watch_id: u64, error: Option<WardenError>) -> WatchResponse {
        let resume_revision = self.parts.get(&self.owner).map_or(0, |p| p.next_revision);
        let canceled = WatchCanceled { error, resume_revision, resume_revisions: self.resume_revisions() };
        WatchResponse { watch_id, canceled: Some(canceled), ..WatchResponse::default() }
    }
}

/// What the client stream's tasks share: the live watches and the upstream streams.
#[derive(Default)]
struct Shared {
    watches: Mutex<HashMap<u64, Carried>>,
    streams: Mutex<HashMap<u64, mpsc::Sender<WatchRequest>>>,
}

impl Shared {
    fn watches(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Carried>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stream(&self, group: u64) -> Option<mpsc::Sender<WatchRequest>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).get(&group).filter(|s| !s.is_closed()).cloned()
    }

    /// Asks each group in `groups` to cancel watch `watch_id` (best effort: a closed stream
    /// has no watches left).
    async fn cancel_parts(&self, watch_id: u64, groups: impl IntoIterator<Item = u64>) {
        for group in groups {
            if let Some(sender) = self.stream(group) {
                let _ = sender.send(WatchRequest { request: Some(WatchRequestKind::Cancel(WatchCancel { watch_id })) }).await;
            }
        }
    }
}

/// Starts proxying one client `Watch` stream.
pub fn proxy(upstreams: Arc<Upstreams>, incoming: Streaming<WatchRequest>) -> Responses {
    let (responses, stream) = mpsc::channel(RESPONSES_QUEUED_MAX);
    tokio::spawn(run(upstreams, incoming, responses));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))
}

fn canceled(watch_id: u64, code: Code, message: String, resume_revision: u64) -> WatchResponse {
    let error = WardenError { code: code as i32, message, ..WardenError::default() };
    WatchResponse {
        watch_id,
        canceled: Some(WatchCanceled { error: Some(error), resume_revision, ..WatchCanceled::default() }),
        ..WatchResponse::default()
    }
}

/// The groups a watch of `create.path` spans: the serving group first, then (for a
/// PERSISTENT recursive watch) every ready group below the path.
async fn spanned_groups(upstreams: &Upstreams, create: &WatchCreate) -> Result<Vec<GroupRoute>, Status> {
    let mut table = upstreams.table();
    if table.route(&create.path).is_none() {
        table = upstreams.refresh().await?;
    }
    let owner = table.route(&create.path).cloned().ok_or_else(|| Status::unavailable(format!("no group serves {}", create.path)))?;
    let mut groups = vec![owner];
    if create.recursive && create.kind == Kind::Persistent as i32 {
        groups.extend(table.groups_below(&create.path).into_iter().cloned());
    }
    if groups.len() > WATCH_GROUPS_MAX {
        return Err(Status::resource_exhausted(format!("{} spans {} groups; at most {WATCH_GROUPS_MAX}", create.path, groups.len())));
    }
    Ok(groups)
}

/// The upstream create of one part: the group's own routing, and for a group below the
/// path, its prefix as the path and its own start revision (and no read).
fn part_create(create: &WatchCreate, route: &GroupRoute, owner: bool) -> WatchCreate {
    let routing = Some(Routing { group_id: route.id(), conf_ver: route.descriptor.conf_ver, version: route.descriptor.version });
    if owner {
        return WatchCreate { routing, group_start_revisions: HashMap::new(), ..create.clone() };
    }
    WatchCreate {
        path: route.descriptor.prefix.clone(),
        start_revision: create.group_start_revisions.get(&route.id()).copied().unwrap_or(0),
        read: false,
        routing,
        group_start_revisions: HashMap::new(),
        ..create.clone()
    }
}

async fn run(upstreams: Arc<Upstreams>, mut incoming: Streaming<WatchRequest>, responses: mpsc::Sender<Result<WatchResponse, Status>>) {
    let shared = Arc::new(Shared::default());
    let mut next_watch_id = 1u64;
    while let Ok(Some(request)) = incoming.message().await {
        match request.request {
            Some(WatchRequestKind::Create(mut create)) => {
                if create.watch_id == 0 {
                    let taken = shared.watches();
                    while taken.contains_key(&next_watch_id) {
                        next_watch_id += 1;
                    }
                    create.watch_id = next_watch_id;
                }
                if let Err(response) = start(&upstreams, &shared, &responses, create).await {
                    let _ = responses.send(Ok(response)).await;
                }
            }
            Some(WatchRequestKind::Cancel(cancel)) => {
                let groups: Option<Vec<u64>> = shared.watches().get(&cancel.watch_id).map(|c| c.parts.keys().copied().collect());
                match groups {
                    // The first part's `canceled` ends the watch for the client.
                    Some(groups) => shared.cancel_parts(cancel.watch_id, groups).await,
                    None => {
                        let message = format!("no watch {} on this stream", cancel.watch_id);
                        let _ = responses.send(Ok(canceled(cancel.watch_id, Code::InvalidArgument, message, 0))).await;
                    }
                }
            }
            Some(WatchRequestKind::Progress(progress)) => {
                let senders: Vec<_> = shared.streams.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
                for sender in senders {
                    let _ = sender.send(WatchRequest { request: Some(WatchRequestKind::Progress(progress)) }).await;
                }
            }
            None => {}
        }
    }
    // Dropping the upstream senders ends the upstream streams.
}

/// Registers a watch and sends each part's create upstream; on failure, the response that
/// cancels it (nothing stays registered).
async fn start(
    upstreams: &Upstreams,
    shared: &Arc<Shared>,
    responses: &mpsc::Sender<Result<WatchResponse, Status>>,
    create: WatchCreate,
) -> Result<(), WatchResponse> {
    let watch_id = create.watch_id;
    let groups = spanned_groups(upstreams, &create).await.map_err(|status| canceled(watch_id, Code::Unavailable, status.message().to_string(), 0))?;
    let mut senders = Vec::new();
    for route in &groups {
        let sender = match shared.stream(route.id()) {
            Some(sender) => sender,
            None => {
                let sender = open(upstreams, route, shared.clone(), responses.clone())
                    .await
                    .map_err(|status| canceled(watch_id, Code::Unavailable, status.message().to_string(), create.start_revision))?;
                shared.streams.lock().unwrap_or_else(|e| e.into_inner()).insert(route.id(), sender.clone());
                sender
            }
        };
        senders.push(sender);
    }
    let owner = groups[0].id();
    let parts = groups
        .iter()
        .map(|route| {
            let next_revision =
                if route.id() == owner { create.start_revision } else { create.group_start_revisions.get(&route.id()).copied().unwrap_or(0) };
            (route.id(), Part { next_revision, created: None })
        })
        .collect();
    shared.watches().insert(watch_id, Carried { owner, parts, ..Carried::default() });
    for (route, sender) in groups.iter().zip(senders) {
        let part = part_create(&create, route, route.id() == owner);
        let _ = sender.send(WatchRequest { request: Some(WatchRequestKind::Create(part)) }).await;
    }
    Ok(())
}

/// Opens the upstream stream of one group and a task passing its responses on.
async fn open(
    upstreams: &Upstreams,
    route: &GroupRoute,
    shared: Arc<Shared>,
    responses: mpsc::Sender<Result<WatchResponse, Status>>,
) -> Result<mpsc::Sender<WatchRequest>, Status> {
    let group = route.id();
    let table = upstreams.table();
    let mut last_error = Status::unavailable(format!("group {group} has no reachable replica"));
    for replica in &route.descriptor.replicas {
        let Some(addr) = table.addr(*replica) else { continue };
        let (sender, outgoing) = mpsc::channel(REQUESTS_QUEUED_MAX);
        let mut client = warden_client(upstreams.channel(addr)?);
        match client.watch(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await {
            Ok(response) => {
                tokio::spawn(pass_on(group, response.into_inner(), shared, responses));
                return Ok(sender);
            }
            Err(status) => last_error = status,
        }
    }
    Err(last_error)
}

/// What to do with one upstream response.
enum Step {
    /// Send these on, in order.
    Send(Vec<WatchResponse>),
    /// The watch ended: send this, and cancel the parts in the list upstream.
    End(Box<WatchResponse>, Vec<u64>),
    /// Nothing to send now.
    Hold,
}

/// Folds one upstream response of `group` into the watch's state. Until every part is
/// created, the parts' events are held (the client must see `created` first); then the
/// merged `created` goes out followed by what was held.
fn step(group: u64, response: WatchResponse, watches: &mut HashMap<u64, Carried>) -> Step {
    let watch_id = response.watch_id;
    let Some(watch) = watches.get_mut(&watch_id) else { return Step::Hold };
    let Some(part) = watch.parts.get_mut(&group) else { return Step::Hold };
    if let Some(ended) = response.canceled {
        let Some(watch) = watches.remove(&watch_id) else { return Step::Hold };
        let others = watch.parts.keys().copied().filter(|g| *g != group).collect();
        let header = response.header;
        return Step::End(Box::new(WatchResponse { header, ..watch.canceled(watch_id, ended.error) }), others);
    }
    if let Some(created) = &response.created {
        part.next_revision = created.start_revision;
        part.created = Some(created.clone());
        if watch.parts.values().any(|p| p.created.is_none()) {
            return Step::Hold;
        }
        // Every part is created: one `created` for the client (the serving group's, with
        // each group's start), then the events held meanwhile.
        let start_revisions = watch.parts.iter().map(|(g, p)| (*g, p.created.as_ref().map_or(0, |c| c.start_revision))).collect();
        let owner = watch.parts.get(&watch.owner).and_then(|p| p.created.clone()).unwrap_or_default();
        let mut out = vec![WatchResponse { created: Some(WatchCreated { start_revisions, ..owner }), ..response }];
        watch.announced = true;
        for (held_group, held) in std::mem::take(&mut watch.held) {
            watch.delivered(held_group, &held);
            out.push(held);
        }
        return Step::Send(out);
    }
    if !watch.announced {
        if watch.held.len() >= HELD_RESPONSES_MAX {
            // Nothing was delivered yet: the client starts again from the same revisions.
            let Some(watch) = watches.remove(&watch_id) else { return Step::Hold };
            let error = WardenError {
                code: Code::SlowWatcher as i32,
                message: "too many events before every group's watch was created".into(),
                ..WardenError::default()
            };
            return Step::End(Box::new(watch.canceled(watch_id, Some(error))), watch.parts.keys().copied().collect());
        }
        watch.held.push((group, response));
        return Step::Hold;
    }
    watch.delivered(group, &response);
    Step::Send(vec![response])
}

/// Passes one upstream's responses to the client, keeping each part's resume revision; when
/// the upstream ends, cancels every watch with a part on it, with where to resume.
async fn pass_on(group: u64, mut upstream: Streaming<WatchResponse>, shared: Arc<Shared>, responses: mpsc::Sender<Result<WatchResponse, Status>>) {
    loop {
        let response = match upstream.message().await {
            Ok(Some(response)) => response,
            Ok(None) | Err(_) => break,
        };
        let step = step(group, response, &mut shared.watches());
        let out = match step {
            Step::Send(out) => out,
            Step::End(response, others) => {
                shared.cancel_parts(response.watch_id, others).await;
                vec![*response]
            }
            Step::Hold => continue,
        };
        for response in out {
            if responses.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
    let ended: Vec<(u64, Carried)> = {
        let mut watches = shared.watches();
        let ids: Vec<u64> = watches.iter().filter(|(_, c)| c.parts.contains_key(&group)).map(|(id, _)| *id).collect();
        ids.into_iter().filter_map(|id| watches.remove(&id).map(|c| (id, c))).collect()
    };
    for (watch_id, carried) in ended {
        shared.cancel_parts(watch_id, carried.parts.keys().copied().filter(|g| *g != group)).await;
        let message = format!("the stream to group {group} ended; watch again from the resume revisions");
        let error = WardenError { code: Code::Unavailable as i32, message, ..WardenError::default() };
        if responses.send(Ok(carried.canceled(watch_id, Some(error)))).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_parts() -> HashMap<u64, Carried> {
        let parts = BTreeMap::from([(1, Part { next_revision: 0, created: None }), (2, Part { next_revision: 7, created: None })]);
        HashMap::from([(9, Carried { owner: 1, parts, ..Carried::default() })])
    }

    fn created(start_revision: u64) -> WatchResponse {
        WatchResponse { watch_id: 9, created: Some(WatchCreated { start_revision, ..WatchCreated::default() }), ..WatchResponse::default() }
    }

    fn events(revision: u64) -> WatchResponse {
        WatchResponse { watch_id: 9, events: vec![WatchEvent { revision, ..WatchEvent::default() }], ..WatchResponse::default() }
    }

    #[test]
    fn a_watch_spanning_groups_is_created_once_every_part_is_and_events_wait_for_it() {
        let mut watches = two_parts();
        assert!(matches!(step(2, created(7), &mut watches), Step::Hold), "one part is not the watch");
        assert!(matches!(step(2, events(7), &mut watches), Step::Hold), "events never come before created");
        match step(1, created(40), &mut watches) {
            Step::Send(out) => {
                assert_eq!(out.len(), 2, "created, then what was held");
                let created = out[0].created.clone().expect("created");
                assert_eq!(created.start_revision, 40, "the serving group's");
                assert_eq!(created.start_revisions, HashMap::from([(1, 40), (2, 7)]));
                assert_eq!(out[1].events[0].revision, 7);
            }
            _ => panic!("the last part's created is forwarded"),
        }
        assert!(matches!(step(2, events(8), &mut watches), Step::Send(_)));
        assert_eq!(watches[&9].parts[&2].next_revision, 9);
    }

    #[test]
    fn one_part_ending_ends_the_watch_with_every_groups_resume_revision() {
        let mut watches = two_parts();
        assert!(matches!(step(1, created(0), &mut watches), Step::Hold));
        assert!(matches!(step(2, created(7), &mut watches), Step::Send(_)));
        assert!(matches!(step(2, events(12), &mut watches), Step::Send(_)));
        let ended = WatchResponse { watch_id: 9, canceled: Some(WatchCanceled::default()), ..WatchResponse::default() };
        match step(1, ended, &mut watches) {
            Step::End(response, others) => {
                assert_eq!(others, vec![2], "the other part is cancelled upstream");
                assert_eq!(response.canceled.expect("canceled").resume_revisions, HashMap::from([(1, 0), (2, 13)]));
            }
            _ => panic!("a part's cancel ends the watch"),
        }
        let late = WatchResponse { watch_id: 9, canceled: Some(WatchCanceled::default()), ..WatchResponse::default() };
        assert!(matches!(step(2, late, &mut watches), Step::Hold), "the other part's cancel is not a second one");
        assert!(watches.is_empty());
    }
}
