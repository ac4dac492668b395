//! etcd's `Watch` service on the router's own watches ([`crate::watch::proxy`]): one etcd
//! watch stream is one native watch stream, and each etcd watch one or a few native
//! PERSISTENT watches, its parts.
//!
//! - A single key watches its path. A range watches, recursively (so across every group
//!   serving part of them), the deepest subtrees holding its keys' paths
//!   ([`plan::watch_scopes`]: a prefix like `/registry/pods/` is `/registry/pods` and
//!   `/_etcd`, since its own key is escaped), and passes on only events of keys inside it.
//! - Events of paths that are no etcd key (containers made for a put's missing parents,
//!   lock waiters, paths under `/warden`) are dropped; a node emptied into a container by a
//!   range delete is etcd's DELETE of its key.
//! - Watch ids: the client's, or for a create asking 0 the lowest unused from 0, as etcd
//!   picks them. Native ids are this stream's own and never reused, so what comes late for
//!   a part of an ended watch is dropped, even when its etcd id is in use again.
//! - An etcd watch is created when all its parts are (events of a part created earlier are
//!   held until then, as etcd's clients drop events of a watch not answered created), and
//!   ends when its first part ends
//!   (the others are cancelled) — except where etcd would go on: a part the router ended
//!   because its replica went away, fell behind or its subtree moved (UNAVAILABLE,
//!   NOT_LEADER, SLOW_WATCHER, MOVED) is created again from the revisions it gives, so
//!   the client sees every event once and no cancel, as when an etcd member dies. A part
//!   that keeps failing without any answer in between ends the watch after
//!   [`RESUMES_WITHOUT_PROGRESS_MAX`] attempts (about the router's request timeout).
//! - Revisions are per group: a watch of keys in one group is exact (start revision,
//!   resume, ordering); a watch spanning groups starts every group at `start_revision`, and
//!   its events pass in one revision order across the groups, each header the watermark
//!   (a revision valid to resume from in every group: [`super::watch_order`], which says
//!   when a group behind is raised; this task makes the raises). A start right after a
//!   linearizable range's revision is exact in every group too: the range raised each group
//!   it read below its revision to it.
//! - A start revision the replica no longer holds events for is answered as etcd answers
//!   a compacted one: the watch is cancelled with `compact_revision` set to the oldest
//!   revision it can watch from (the native error's newest revision gone, plus one), from
//!   which the client reads again and watches on.
//!
//! Two tasks per stream: one turns etcd requests into native ones, one turns native
//! responses into etcd ones; they share the watches. Neither waits on the other, so a
//! client that stops reading never blocks its own cancels.

use std::collections::{BTreeSet, HashMap};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use warden_proto::etcd::etcdserverpb as pb;
use warden_proto::etcd::etcdserverpb::watch_create_request::FilterType;
use warden_proto::etcd::etcdserverpb::watch_request::RequestUnion;
use warden_proto::etcd::mvccpb::{event::EventType, Event, KeyValue};
use warden_proto::v1 as w;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_event::Type as NativeType;
use warden_proto::v1::watch_request::Request as NativeRequest;

use super::keys::{self, RangeSpec};
use super::kv::key_value;
use super::watch_order::{Merge, Raised, WAITING_EVENTS_MAX};
use super::{etcd_revision, plan, EtcdService};

/// Native requests queued for the router's watch proxy.
const REQUESTS_QUEUED_MAX: usize = 64;
/// etcd responses queued for the client (each at most one native response's events).
const RESPONSES_QUEUED_MAX: usize = 64;
/// Native watches one etcd watch is made of, at most: a range beyond it watches the whole
/// tree in one part (ranges have one or two subtrees: their plain and their escaped keys).
const PARTS_MAX: usize = 4;
/// Attempts to create a part again in a row with no answer from it in between (created,
/// an event, a progress notice) before the etcd watch is ended instead: with the pauses
/// below, about 6 s, past the router's request timeout.
const RESUMES_WITHOUT_PROGRESS_MAX: u32 = 8;
/// The pause before a part is created again, doubled after each attempt without progress
/// up to [`RESUME_PAUSE_MAX`]: a replica that just went away has its successor elected or
/// found within a few hundred milliseconds.
const RESUME_PAUSE_MIN: Duration = Duration::from_millis(50);
/// The longest pause between two attempts.
const RESUME_PAUSE_MAX: Duration = Duration::from_secs(1);
/// Events of released revisions one etcd response carries at most (one revision's are never
/// split): a client's receive limit is a few MiB.
const RESPONSE_EVENTS_MAX: usize = 1_000;
/// Progress requests after a raise before raising again, while the raised group's parts
/// have not reported it (a follower serving a part applies the raise a moment later, a
/// part created again starts anew), and the pause before each.
const RAISE_CHECKS_MAX: u32 = 20;
const RAISE_CHECK_PAUSE: Duration = Duration::from_millis(25);
/// The pause before raising again after a raise failed (the group is out of reach; its
/// parts end and are created again meanwhile).
const RAISE_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What one etcd watch passes on.
#[derive(Clone, Debug)]
struct Filter {
    /// The watched keys: one key, or an interval of them.
    keys: RangeSpec,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
}

impl Filter {
    fn wants(&self, key: &[u8]) -> bool {
        match &self.keys {
            RangeSpec::Single(single) => single == key,
            RangeSpec::Interval(interval) => interval.contains(key),
        }
    }
}

/// One live etcd watch.
struct EtcdWatch {
    filter: Filter,
    /// Its parts' native ids.
    native_ids: Vec<u64>,
    /// Each part's create (by native id), to create it again from where it ended.
    creates: HashMap<u64, w::WatchCreate>,
    /// Parts not answered `created` yet (the client is told once, when none is left: events
    /// that come before wait in `merge`).
    uncreated: usize,
    /// Parts created again in a row with no answer from any part in between.
    resumes_without_progress: u32,
    /// Its events in one revision order across groups ([`watch_order`]).
    merge: Merge,
    /// Progress notifications go to the client: asked for at creation (`progress_notify`),
    /// or once after each progress request of the client.
    progress_notify: bool,
    progress_asked: bool,
}

/// The live watches of one stream.
#[derive(Default)]
struct Watches {
    by_etcd_id: HashMap<i64, EtcdWatch>,
    /// The etcd watch of each live part.
    etcd_id_of: HashMap<u64, i64>,
    /// The last native id handed out (ids start at 1: native 0 asks the proxy to pick).
    last_native_id: u64,
}

impl Watches {
    /// Registers watch `etcd_id` with `filter` and parts `creates` (their ids set here).
    fn add(&mut self, etcd_id: i64, filter: Filter, creates: &mut [w::WatchCreate]) {
        let progress_notify = creates.iter().any(|create| create.progress_notify);
        let mut native_ids = Vec::with_capacity(creates.len());
        let mut kept = HashMap::with_capacity(creates.len());
        for create in creates.iter_mut() {
            create.watch_id = self.next_native_id();
            native_ids.push(create.watch_id);
            kept.insert(create.watch_id, create.clone());
            self.etcd_id_of.insert(create.watch_id, etcd_id);
        }
        let watch = EtcdWatch {
            filter,
            uncreated: native_ids.len(),
            native_ids,
            creates: kept,
            resumes_without_progress: 0,
            merge: Merge::default(),
            progress_notify,
            progress_asked: false,
        };
        self.by_etcd_id.insert(etcd_id, watch);
    }

    /// A native id never used on this stream.
    fn next_native_id(&mut self) -> u64 {
        self.last_native_id += 1;
        self.last_native_id
    }

    /// Part `native_id` of watch `etcd_id` ended as `canceled` says; when it may go on (see
    /// [`resumable`]) it is registered again under a new native id, and its create and the
    /// pause to make before sending it are answered. `None`: the watch ends.
    fn resume(&mut self, etcd_id: i64, native_id: u64, canceled: &w::WatchCanceled) -> Option<(w::WatchCreate, Duration)> {
        let moved_to_group = resumable(canceled)?;
        let watch = self.by_etcd_id.get_mut(&etcd_id)?;
        if watch.resumes_without_progress >= RESUMES_WITHOUT_PROGRESS_MAX {
            return None;
        }
        let ended = watch.creates.remove(&native_id)?;
        let pause = RESUME_PAUSE_MIN.saturating_mul(1 << watch.resumes_without_progress.min(16)).min(RESUME_PAUSE_MAX);
        watch.resumes_without_progress += 1;
        // Every event before the resume revisions was delivered (or passed over by the
        // filter); a part that never started resumes where it was asked to start.
        let mut group_start_revisions = canceled.resume_revisions.clone();
        if let Some(group) = moved_to_group {
            // Nothing in a moved subtree changed between the move's revision in the old
            // group and the new group's first: the new group resumes from it too.
            group_start_revisions.entry(group).or_insert(canceled.resume_revision);
        }
        let start_revision = if canceled.resume_revision > 0 { canceled.resume_revision } else { ended.start_revision };
        let create = w::WatchCreate { watch_id: self.next_native_id(), start_revision, group_start_revisions, ..ended };
        let watch = self.by_etcd_id.get_mut(&etcd_id)?;
        watch.merge.resumed(native_id, create.watch_id, &create.group_start_revisions);
        watch.native_ids.retain(|id| *id != native_id);
        watch.native_ids.push(create.watch_id);
        watch.creates.insert(create.watch_id, create.clone());
        self.etcd_id_of.remove(&native_id);
        self.etcd_id_of.insert(create.watch_id, etcd_id);
        Some((create, pause))
    }

    /// Ends watch `etcd_id`: what comes later for its parts is dropped.
    fn remove(&mut self, etcd_id: i64) -> Option<EtcdWatch> {
        let watch = self.by_etcd_id.remove(&etcd_id)?;
        for native_id in &watch.native_ids {
            self.etcd_id_of.remove(native_id);
        }
        Some(watch)
    }
}

type Shared = Arc<Mutex<Watches>>;

/// The lowest etcd id ≥ 0 not in `taken`, as etcd picks ids asked as 0.
fn lowest_free(taken: &BTreeSet<i64>) -> i64 {
    let mut id = 0;
    for used in taken {
        if *used != id {
            break;
        }
        id += 1;
    }
    id
}

/// Whether a part ended as `canceled` says may be created again from its resume revisions
/// (the router ended it: its replica went away or fell behind, or its subtree moved), and
/// for MOVED the group the subtree moved to. `None`: it may not (the client cancelled it,
/// a compacted start, a refusal), and the etcd watch ends.
fn resumable(canceled: &w::WatchCanceled) -> Option<Option<u64>> {
    let error = canceled.error.as_ref()?;
    match Code::try_from(error.code).ok()? {
        Code::Unavailable | Code::NotLeader | Code::SlowWatcher => Some(None),
        Code::Moved => Some(Some(error.moved_to_group).filter(|group| *group != 0)),
        _ => None,
    }
}

/// An etcd response that ends watch `watch_id` with `reason`.
fn cancel(watch_id: i64, header: Option<pb::ResponseHeader>, reason: impl Into<String>) -> pb::WatchResponse {
    pb::WatchResponse { watch_id, canceled: true, cancel_reason: reason.into(), header, ..pb::WatchResponse::default() }
}

/// A native progress request (every part of the stream answers one).
fn progress_request() -> w::WatchRequest {
    w::WatchRequest { request: Some(NativeRequest::Progress(w::WatchProgressRequest {})) }
}

/// A native cancel of part `native_id`.
fn native_cancel(native_id: u64) -> w::WatchRequest {
    w::WatchRequest { request: Some(NativeRequest::Cancel(w::WatchCancel { watch_id: native_id })) }
}

/// The native creates (ids unset) of etcd create `create`, and its filter.
fn native_creates(create: &pb::WatchCreateRequest, table: &warden_proto::routing::Table) -> Result<(Vec<w::WatchCreate>, Filter), String> {
    if create.key.is_empty() {
        return Err("etcdserver: key is not provided".into());
    }
    let start_revision = u64::try_from(create.start_revision).map_err(|_| "etcdserver: start revision must not be negative".to_string())?;
    let keys = keys::etcd_range(&create.key, &create.range_end);
    let (scopes, recursive) = match &keys {
        RangeSpec::Single(key) => (vec![keys::key_to_path(key).map_err(|error| format!("etcdserver: {error}"))?], false),
        RangeSpec::Interval(interval) => match plan::watch_scopes(interval) {
            scopes if scopes.is_empty() => return Err("etcdserver: the watched range holds no key".into()),
            scopes if scopes.len() > PARTS_MAX => (vec!["/".to_string()], true),
            scopes => (scopes, true),
        },
    };
    let no_put = create.filters.contains(&(FilterType::Noput as i32));
    let no_delete = create.filters.contains(&(FilterType::Nodelete as i32));
    // The part under `/_etcd` watches only the escapes of the range's keys: no more events
    // come than are passed on, and its permission is judged over those keys alone (a role
    // granted a prefix watches the prefix's escaped keys too).
    let escaped_bounds = match &keys {
        RangeSpec::Interval(interval) => keys::path_intervals(interval)
            .into_iter()
            .find(|part| part.from.starts_with(format!("{}/", keys::ESCAPED_PREFIX).as_bytes()))
            .map(|part| (part.from, part.to.unwrap_or_default())),
        RangeSpec::Single(_) => None,
    };
    let part = |path: String| {
        let (from, to) = match &escaped_bounds {
            Some(bounds) if path == keys::ESCAPED_PREFIX => bounds.clone(),
            _ => (Vec::new(), Vec::new()),
        };
        // Every group below the watched path starts where the client asked: revisions are
        // the group's own, so this is exact only for the group the range lies in.
        let group_start_revisions = if recursive && start_revision > 0 {
            table.groups_below(&path).into_iter().map(|group| (group.id(), start_revision)).collect()
        } else {
            HashMap::new()
        };
        w::WatchCreate {
            path,
            kind: w::watch_create::Kind::Persistent as i32,
            recursive,
            start_revision,
            // A node emptied into a container is a change natively and a delete here:
            // creates and changes come through and are filtered here.
            no_delete,
            // Always: a delete's key-value comes from the node before it.
            prev_data: true,
            progress_notify: create.progress_notify,
            group_start_revisions,
            from,
            to,
            ..w::WatchCreate::default()
        }
    };
    Ok((scopes.into_iter().map(part).collect(), Filter { keys, no_put, no_delete, prev_kv: create.prev_kv }))
}

/// etcd's event for native event `event`, if `filter` passes it on.
fn etcd_event(filter: &Filter, event: w::WatchEvent) -> Option<Event> {
    let key = keys::path_to_key(&event.path)?;
    if !filter.wants(&key) {
        return None;
    }
    let container = |stat: Option<&w::Stat>| stat.is_some_and(|stat| stat.kind == w::NodeKind::Container as i32);
    let was_key = event.prev_stat.is_some() && !container(event.prev_stat.as_ref());
    let is_key = !container(event.stat.as_ref());
    let previous = || was_key.then(|| key_value(key.clone(), w::Node { path: String::new(), data: event.prev_data.to_vec(), stat: event.prev_stat }));
    let kind = NativeType::try_from(event.r#type).ok()?;
    let put = match kind {
        NativeType::Created | NativeType::Changed if is_key => true,
        // A node emptied into a container (its key deleted), or a container removed or
        // made: no key was there before or is there after.
        NativeType::Changed if was_key => false,
        NativeType::Deleted if was_key => false,
        _ => return None,
    };
    if (put && filter.no_put) || (!put && filter.no_delete) {
        return None;
    }
    let prev_kv = if filter.prev_kv && kind != NativeType::Created { previous() } else { None };
    if put {
        let kv = key_value(key.clone(), w::Node { path: String::new(), data: event.data.to_vec(), stat: event.stat });
        return Some(Event { r#type: EventType::Put as i32, kv: Some(kv), prev_kv });
    }
    let kv = KeyValue { key, mod_revision: etcd_revision(event.revision), ..KeyValue::default() };
    Some(Event { r#type: EventType::Delete as i32, kv: Some(kv), prev_kv })
}

/// What a native response makes the stream do.
#[derive(Debug, Default)]
struct Outcome {
    /// The etcd responses for the client, in order.
    answers: Vec<pb::WatchResponse>,
    /// Native ids of parts to cancel (those of a watch whose other part the server ended).
    to_cancel: Vec<u64>,
    /// A part to create again, after the pause.
    to_resume: Option<(w::WatchCreate, Duration)>,
    /// Groups to raise, so the watch's events may pass in revision order.
    to_raise: Vec<Raise>,
}

/// A group to raise for watch `etcd_id`: to `target`, through a read of `path` (the part's
/// path; a group below it is read at its own prefix).
#[derive(Debug)]
struct Raise {
    etcd_id: i64,
    path: String,
    group: u64,
    target: u64,
}

/// What native response `response` makes the stream do; `header` is the etcd header of
/// its revision.
fn etcd_response(header: Option<pb::ResponseHeader>, watches: &Shared, response: w::WatchResponse) -> Outcome {
    let Ok(mut watches) = watches.lock() else { return Outcome::default() };
    let Some(&watch_id) = watches.etcd_id_of.get(&response.watch_id) else { return Outcome::default() };
    if let Some(canceled) = response.canceled {
        if let Some(resume) = watches.resume(watch_id, response.watch_id, &canceled) {
            return Outcome { to_resume: Some(resume), ..Outcome::default() };
        }
        let others: Vec<u64> = watches.remove(watch_id).map(|watch| watch.native_ids).unwrap_or_default();
        let others = others.into_iter().filter(|id| *id != response.watch_id).collect();
        let answer = match canceled.error {
            None => pb::WatchResponse { header, watch_id, canceled: true, ..pb::WatchResponse::default() },
            // etcd's clients read again and watch on from `compact_revision`, the oldest
            // revision etcd still serves; Warden's error names the newest it no longer does.
            Some(error) if error.code == Code::Compacted as i32 => pb::WatchResponse {
                compact_revision: etcd_revision(error.compact_revision.saturating_add(1)),
                ..cancel(watch_id, header, "etcdserver: mvcc: required revision has been compacted")
            },
            // etcd's words, which clients match.
            Some(error) if error.code == Code::PermissionDenied as i32 => cancel(watch_id, header, "etcdserver: permission denied"),
            Some(error) => cancel(watch_id, header, format!("etcdserver: {}", error.message)),
        };
        return Outcome { answers: vec![answer], to_cancel: others, ..Outcome::default() };
    }
    let Some(watch) = watches.by_etcd_id.get_mut(&watch_id) else { return Outcome::default() };
    watch.resumes_without_progress = 0;
    let native_id = response.watch_id;
    let group = response.header.as_ref().map_or(0, |h| h.group_id);
    let mut answers = Vec::new();
    if let Some(created) = &response.created {
        let starts: Vec<(u64, u64)> = if created.start_revisions.is_empty() {
            vec![(group, created.start_revision)]
        } else {
            created.start_revisions.iter().map(|(g, start)| (*g, *start)).collect()
        };
        watch.merge.started(native_id, starts);
        // A part created again after it ended: the client was told long ago.
        if watch.uncreated > 0 {
            watch.uncreated -= 1;
            if watch.uncreated > 0 {
                return Outcome::default();
            }
            answers.push(pb::WatchResponse { header: watch_header(watch, header), watch_id, created: true, ..pb::WatchResponse::default() });
        }
    } else if response.progress {
        if let Some(revision) = response.header.as_ref().map(|h| h.revision) {
            watch.merge.progressed(native_id, group, revision);
        }
    } else {
        let filter = watch.filter.clone();
        let events = response.events.into_iter().map(|event| (event.revision, etcd_event(&filter, event))).collect();
        if watch.merge.arrived(native_id, group, events).is_err() {
            let uncreated = watch.uncreated > 0;
            let to_cancel = watches.remove(watch_id).map(|watch| watch.native_ids).unwrap_or_default();
            let reason = format!(
                "etcdserver: {WAITING_EVENTS_MAX} events waited for the watch's other groups (to start, or to pass their revision): watch again from the revision after the last event"
            );
            let mut answers: Vec<pb::WatchResponse> =
                uncreated.then(|| pb::WatchResponse { header, watch_id, created: true, ..pb::WatchResponse::default() }).into_iter().collect();
            answers.push(cancel(watch_id, header, reason));
            return Outcome { answers, to_cancel, ..Outcome::default() };
        }
    }
    // Before the watch is created there is nothing to pass on or to say progress on.
    if watch.uncreated > 0 {
        return Outcome::default();
    }
    let released = watch.merge.release();
    let header = watch_header(watch, header);
    let mut batch: Vec<Event> = Vec::new();
    for (_, events) in released {
        if !batch.is_empty() && batch.len() + events.len() > RESPONSE_EVENTS_MAX {
            answers.push(pb::WatchResponse { header, watch_id, events: std::mem::take(&mut batch), ..pb::WatchResponse::default() });
        }
        batch.extend(events);
    }
    if !batch.is_empty() {
        answers.push(pb::WatchResponse { header, watch_id, events: batch, ..pb::WatchResponse::default() });
    }
    if response.progress && (watch.progress_notify || std::mem::take(&mut watch.progress_asked)) {
        answers.push(pb::WatchResponse { header, watch_id, ..pb::WatchResponse::default() });
    }
    let to_raise = watch
        .merge
        .raises_due()
        .into_iter()
        .filter_map(|(part, group, target)| {
            watch.creates.get(&part).map(|create| Raise { etcd_id: watch_id, path: create.path.clone(), group, target })
        })
        .collect();
    Outcome { answers, to_raise, ..Outcome::default() }
}

/// The header of what watch `watch` answers: `native`'s (its group's revision) for a watch
/// of one group, the watermark for one spanning groups (a revision valid to resume from in
/// every group: see [`watch_order`]).
fn watch_header(watch: &EtcdWatch, native: Option<pb::ResponseHeader>) -> Option<pb::ResponseHeader> {
    if !watch.merge.spans_groups() {
        return native;
    }
    native.map(|header| pb::ResponseHeader { revision: etcd_revision(watch.merge.watermark()), ..header })
}

impl EtcdService {
    /// Reads the client's etcd requests and sends the native ones; refusals and cancels go
    /// straight to the client. Ends when the client closes its side or the proxy stops
    /// taking requests.
    async fn translate_requests(
        self,
        mut incoming: Streaming<pb::WatchRequest>,
        native: mpsc::Sender<w::WatchRequest>,
        watches: Shared,
        answers: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    ) {
        while let Ok(Some(request)) = incoming.message().await {
            let (requests, answer) = match request.request_union {
                Some(RequestUnion::CreateRequest(create)) => {
                    let table = match self.table().await {
                        Ok(table) => table,
                        Err(status) => {
                            let _ = answers.send(Err(status)).await;
                            return;
                        }
                    };
                    match self.create(&watches, &create, &table) {
                        Ok(creates) => {
                            (creates.into_iter().map(|create| w::WatchRequest { request: Some(NativeRequest::Create(create)) }).collect(), Vec::new())
                        }
                        Err((id, reason)) => {
                            // etcd answers a refused create as created and cancelled at once.
                            let created = pb::WatchResponse { watch_id: id, created: true, header: self.header(0), ..pb::WatchResponse::default() };
                            (Vec::new(), vec![created, cancel(id, self.header(0), reason)])
                        }
                    }
                }
                Some(RequestUnion::CancelRequest(cancel)) => {
                    let Ok(removed) = watches.lock().map(|mut watches| watches.remove(cancel.watch_id)) else { return };
                    // etcd answers a cancel of a watch it does not know with nothing.
                    match removed {
                        Some(watch) => {
                            let canceled = pb::WatchResponse {
                                watch_id: cancel.watch_id,
                                canceled: true,
                                header: self.header(0),
                                ..pb::WatchResponse::default()
                            };
                            (watch.native_ids.into_iter().map(native_cancel).collect(), vec![canceled])
                        }
                        None => (Vec::new(), Vec::new()),
                    }
                }
                Some(RequestUnion::ProgressRequest(_)) => {
                    let Ok(mut watches) = watches.lock() else { return };
                    for watch in watches.by_etcd_id.values_mut() {
                        watch.progress_asked = true;
                    }
                    (vec![progress_request()], Vec::new())
                }
                None => continue,
            };
            for request in requests {
                if native.send(request).await.is_err() {
                    return;
                }
            }
            for answer in answer {
                if answers.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Raises `raise.group` to `raise.target` (a read-only transaction with `raise_to`, of the
    /// part's path or, for a group below it, the group's prefix), then asks for progress until
    /// the group's parts report it (at most [`RAISE_CHECKS_MAX`] times, then it raises
    /// again): the events the watch holds below the target may pass then. Ends once they
    /// did, when a raise to a higher target took over, or with the watch or its stream.
    async fn raise(
        self,
        raise: Raise,
        metadata: tonic::metadata::MetadataMap,
        extensions: tonic::Extensions,
        watches: Shared,
        native: mpsc::Sender<w::WatchRequest>,
    ) {
        let state = || match watches.lock() {
            Ok(mut watches) => {
                watches.by_etcd_id.get_mut(&raise.etcd_id).map_or(Raised::Superseded, |watch| watch.merge.raised(raise.group, raise.target))
            }
            Err(_) => Raised::Superseded,
        };
        loop {
            let table = self.router.upstreams().table();
            let path = match table.route(&raise.path) {
                Some(route) if route.id() == raise.group => raise.path.clone(),
                _ => table.group(raise.group).map_or(raise.path.clone(), |route| route.descriptor.prefix.clone()),
            };
            // One node read (present or not): the cheapest operation that routes to the group.
            let read = w::GetRequest { path, ..w::GetRequest::default() };
            let txn =
                w::TxnRequest { then: vec![w::TxnOp { op: Some(w::txn_op::Op::Get(read)) }], raise_to: raise.target, ..w::TxnRequest::default() };
            if let Err(status) = warden_proto::v1::warden_server::Warden::txn(&self.router, super::inner(&metadata, &extensions, txn)).await {
                tracing::debug!(group = raise.group, target = raise.target, %status, "raising a group an etcd watch spans");
                tokio::time::sleep(RAISE_RETRY_PAUSE).await;
                if state() != Raised::Waiting {
                    return;
                }
                continue;
            }
            for _ in 0..RAISE_CHECKS_MAX {
                if native.send(progress_request()).await.is_err() {
                    return;
                }
                tokio::time::sleep(RAISE_CHECK_PAUSE).await;
                if state() != Raised::Waiting {
                    return;
                }
            }
        }
    }

    /// Registers etcd create `create`: its native creates, or its id and why it is refused.
    fn create(
        &self,
        watches: &Shared,
        create: &pb::WatchCreateRequest,
        table: &warden_proto::routing::Table,
    ) -> Result<Vec<w::WatchCreate>, (i64, String)> {
        let mut watches = watches.lock().map_err(|_| (create.watch_id, "etcdserver: the watch stream failed".to_string()))?;
        let taken: BTreeSet<i64> = watches.by_etcd_id.keys().copied().collect();
        let id = if create.watch_id == 0 { lowest_free(&taken) } else { create.watch_id };
        if id < 0 {
            return Err((id, "etcdserver: watch id must not be negative".into()));
        }
        if taken.contains(&id) {
            return Err((id, "etcdserver: duplicate watch ID".into()));
        }
        let (mut creates, filter) = native_creates(create, table).map_err(|reason| (id, reason))?;
        watches.add(id, filter, &mut creates);
        Ok(creates)
    }
}

#[tonic::async_trait]
impl pb::watch_server::Watch for EtcdService {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send + 'static>>;

    async fn watch(&self, request: Request<Streaming<pb::WatchRequest>>) -> Result<Response<Self::WatchStream>, Status> {
        // Raises are made as the watching client (its identity, over its connection).
        let (metadata, extensions) = (request.metadata().clone(), request.extensions().clone());
        let incoming = request.into_inner();
        let watches: Shared = Arc::default();
        let (native, native_requests) = mpsc::channel(REQUESTS_QUEUED_MAX);
        let (answers, answered) = mpsc::channel(RESPONSES_QUEUED_MAX);
        let requests = tokio_stream::wrappers::ReceiverStream::new(native_requests).map(Ok);
        let mut responses = crate::watch::proxy(self.router.upstreams().clone(), Box::pin(requests));
        let principal = crate::principal::current();
        tokio::spawn(crate::principal::scoped(
            principal.clone(),
            self.clone().translate_requests(incoming, native.clone(), watches.clone(), answers.clone()),
        ));
        let service = self.clone();
        tokio::spawn(crate::principal::scoped(principal, async move {
            loop {
                // A client that hung up ends the proxy (dropping its responses) even while
                // no response comes.
                let response = tokio::select! {
                    response = responses.next() => response,
                    () = answers.closed() => None,
                };
                let Some(response) = response else { return };
                let answers_now = match response {
                    Ok(response) => {
                        let header = service.header(response.header.as_ref().map_or(0, |h| h.revision));
                        let Outcome { answers: answers_now, to_cancel, to_resume, to_raise } = etcd_response(header, &watches, response);
                        for raise in to_raise {
                            let raising = service.clone().raise(raise, metadata.clone(), extensions.clone(), watches.clone(), native.clone());
                            // As the watching client, as this task is.
                            tokio::spawn(crate::principal::scoped(crate::principal::current(), raising));
                        }
                        let mut requests: Vec<w::WatchRequest> = to_cancel.into_iter().map(native_cancel).collect();
                        let mut pause = Duration::ZERO;
                        if let Some((create, resume_pause)) = to_resume {
                            requests.push(w::WatchRequest { request: Some(NativeRequest::Create(create)) });
                            pause = resume_pause;
                        }
                        if !requests.is_empty() {
                            // Not awaited here: the proxy may be waiting for this task to
                            // read its next response before it takes another request.
                            let native = native.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(pause).await;
                                for request in requests {
                                    if native.send(request).await.is_err() {
                                        return;
                                    }
                                }
                            });
                        }
                        answers_now.into_iter().map(Ok).collect()
                    }
                    Err(status) => vec![Err(status)],
                };
                for answer in answers_now {
                    if answers.send(answer).await.is_err() {
                        return;
                    }
                }
            }
        }));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(answered))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::keys::KeyInterval;
    use prost::bytes::Bytes;

    fn stat(kind: w::NodeKind, version: u64) -> Option<w::Stat> {
        Some(w::Stat { create_revision: 3, mod_revision: 7, version, kind: kind as i32, ..w::Stat::default() })
    }

    fn filter(keys: RangeSpec) -> Filter {
        Filter { keys, no_put: false, no_delete: false, prev_kv: true }
    }

    fn native(kind: NativeType, path: &str, stat: Option<w::Stat>, prev_stat: Option<w::Stat>) -> w::WatchEvent {
        w::WatchEvent {
            r#type: kind as i32,
            path: path.into(),
            revision: 7,
            stat,
            data: Bytes::from_static(b"new"),
            prev_stat,
            prev_data: Bytes::from_static(b"old"),
        }
    }

    fn ended(code: Code, resume_revision: u64, moved_to_group: u64) -> w::WatchCanceled {
        let error = w::WardenError { moved_to_group, ..warden_proto::warden_error(code, "/a", "ended") };
        w::WatchCanceled { error: Some(error), resume_revision, resume_revisions: [(7, 12)].into() }
    }

    #[test]
    fn a_part_the_router_ended_is_created_again_from_its_resume_revisions() {
        let mut watches = Watches::default();
        let mut creates = vec![w::WatchCreate { path: "/a".into(), recursive: true, start_revision: 5, ..w::WatchCreate::default() }];
        watches.add(3, filter(RangeSpec::Single(b"/a".to_vec())), &mut creates);
        let first = creates[0].watch_id;

        let (again, pause) = watches.resume(3, first, &ended(Code::Unavailable, 9, 0)).expect("a replica gone: resumed");
        assert_ne!(again.watch_id, first);
        assert_eq!((again.path.as_str(), again.recursive, again.start_revision, pause), ("/a", true, 9, RESUME_PAUSE_MIN));
        assert_eq!(again.group_start_revisions, [(7, 12)].into());
        assert_eq!(watches.etcd_id_of.get(&first), None, "what comes late for the ended part is dropped");
        assert_eq!(watches.etcd_id_of.get(&again.watch_id), Some(&3));
        assert_eq!(watches.by_etcd_id[&3].native_ids, [again.watch_id]);

        let (moved, pause) = watches.resume(3, again.watch_id, &ended(Code::Moved, 11, 4)).expect("a moved subtree: resumed");
        assert_eq!((moved.start_revision, pause), (11, RESUME_PAUSE_MIN * 2));
        assert_eq!(moved.group_start_revisions, [(7, 12), (4, 11)].into(), "the new group resumes from the move's revision");
        let (unstarted, _) = watches.resume(3, moved.watch_id, &ended(Code::NotLeader, 0, 0)).expect("resumed");
        assert_eq!(unstarted.start_revision, 11, "a part that never started again resumes where its last create asked");
    }

    #[test]
    fn a_part_that_keeps_failing_or_was_refused_ends_its_watch() {
        let mut watches = Watches::default();
        let mut creates = vec![w::WatchCreate { path: "/a".into(), ..w::WatchCreate::default() }];
        watches.add(0, filter(RangeSpec::Single(b"/a".to_vec())), &mut creates);
        let mut part = creates[0].watch_id;
        for _ in 0..RESUMES_WITHOUT_PROGRESS_MAX {
            part = watches.resume(0, part, &ended(Code::SlowWatcher, 9, 0)).expect("resumed").0.watch_id;
        }
        assert!(watches.resume(0, part, &ended(Code::SlowWatcher, 9, 0)).is_none(), "no answer in between: the watch ends");
        watches.by_etcd_id.get_mut(&0).expect("the watch").resumes_without_progress = 0;
        assert!(watches.resume(0, part, &ended(Code::Compacted, 9, 0)).is_none(), "a compacted start is the client's to handle");
        assert!(watches.resume(0, part, &ended(Code::PermissionDenied, 9, 0)).is_none(), "a refusal ends it");
        assert!(watches.resume(0, part, &w::WatchCanceled::default()).is_none(), "cancelled by the client");
        assert!(watches.resume(0, part, &ended(Code::Unavailable, 9, 0)).is_some(), "after an answer, it resumes again");
    }

    #[test]
    fn events_of_a_part_created_first_wait_until_the_whole_watch_is_created() {
        let watches: Shared = Arc::default();
        let mut creates = vec![w::WatchCreate { path: "/a".into(), ..w::WatchCreate::default() }, w::WatchCreate::default()];
        let all = filter(RangeSpec::Interval(KeyInterval { from: b"/a/".to_vec(), to: Some(b"/a0".to_vec()) }));
        watches.lock().expect("watches").add(5, all, &mut creates);
        let (first, second) = (creates[0].watch_id, creates[1].watch_id);
        let created = |watch_id| w::WatchResponse { watch_id, created: Some(w::WatchCreated::default()), ..w::WatchResponse::default() };
        let put = w::WatchResponse {
            watch_id: first,
            events: vec![native(NativeType::Created, "/a/x", stat(w::NodeKind::Persistent, 0), None)],
            ..w::WatchResponse::default()
        };

        assert!(etcd_response(None, &watches, created(first)).answers.is_empty(), "one part of two created: not yet");
        assert!(etcd_response(None, &watches, put.clone()).answers.is_empty(), "an event before the watch is created is held");
        let progress = w::WatchResponse { watch_id: first, progress: true, ..w::WatchResponse::default() };
        assert!(etcd_response(None, &watches, progress).answers.is_empty(), "no progress before creation");
        let answers = etcd_response(None, &watches, created(second)).answers;
        assert_eq!(answers.len(), 2, "created, then the held event: {answers:?}");
        assert!(answers[0].created && answers[0].events.is_empty() && answers[0].watch_id == 5);
        assert_eq!(answers[1].events.len(), 1);
        assert_eq!(answers[1].events[0].kv.as_ref().map(|kv| kv.key.as_slice()), Some(b"/a/x".as_slice()));
        let mut later = put.clone();
        later.events[0].revision = 8;
        assert!(etcd_response(None, &watches, put).answers.is_empty(), "a repeat of revision 7 is dropped");
        let after = etcd_response(None, &watches, later).answers;
        assert_eq!((after.len(), after[0].created), (1, false), "once created, events pass at once");
        assert!(etcd_response(None, &watches, created(first)).answers.is_empty(), "a part created again says nothing");
    }

    #[test]
    fn a_watch_whose_parts_take_too_long_to_start_ends_once_it_holds_its_bound() {
        let watches: Shared = Arc::default();
        let mut creates = vec![w::WatchCreate::default(), w::WatchCreate::default()];
        watches.lock().expect("watches").add(0, filter(RangeSpec::Single(b"/a".to_vec())), &mut creates);
        let first = creates[0].watch_id;
        let puts = |revisions: std::ops::RangeInclusive<u64>| w::WatchResponse {
            watch_id: first,
            events: revisions
                .map(|revision| w::WatchEvent {
                    revision,
                    ..native(NativeType::Changed, "/a", stat(w::NodeKind::Persistent, 1), stat(w::NodeKind::Persistent, 0))
                })
                .collect(),
            ..w::WatchResponse::default()
        };
        let bound = WAITING_EVENTS_MAX as u64;
        assert!(etcd_response(None, &watches, puts(1..=bound)).answers.is_empty());
        let ended = etcd_response(None, &watches, puts(bound + 1..=bound + 1));
        assert_eq!(ended.answers.len(), 2);
        assert!(ended.answers[0].created && ended.answers[1].canceled, "{:?}", ended.answers);
        assert_eq!(ended.to_cancel.len(), 2, "both parts are cancelled");
        assert!(watches.lock().expect("watches").by_etcd_id.is_empty());
    }

    /// A watch spanning two groups: the busy group's event waits for the other group's
    /// progress (its group is raised to it first), then passes with the watermark as header.
    #[test]
    fn a_watch_spanning_groups_passes_events_in_revision_order_with_the_watermark_as_header() {
        let watches: Shared = Arc::default();
        let mut creates = vec![w::WatchCreate { path: "/t".into(), recursive: true, ..w::WatchCreate::default() }];
        let all = filter(RangeSpec::Interval(KeyInterval { from: b"/t/".to_vec(), to: Some(b"/t0".to_vec()) }));
        watches.lock().expect("watches").add(4, all, &mut creates);
        let part = creates[0].watch_id;
        let header = |group_id: u64, revision: u64| Some(w::ResponseHeader { group_id, revision, ..w::ResponseHeader::default() });
        let etcd_header = |revision: i64| Some(pb::ResponseHeader { revision, ..pb::ResponseHeader::default() });
        let created = w::WatchResponse {
            watch_id: part,
            header: header(1, 900),
            created: Some(w::WatchCreated { start_revision: 901, start_revisions: [(1, 901), (2, 301)].into(), ..w::WatchCreated::default() }),
            ..w::WatchResponse::default()
        };
        let answers = etcd_response(etcd_header(900), &watches, created).answers;
        assert_eq!(answers[0].header.as_ref().map(|h| h.revision), Some(300), "valid to resume from in both groups");
        let put = |group: u64, revision: u64, path: &str| w::WatchResponse {
            watch_id: part,
            header: header(group, revision),
            events: vec![w::WatchEvent {
                revision,
                stat: Some(w::Stat { create_revision: revision, mod_revision: revision, kind: w::NodeKind::Persistent as i32, ..w::Stat::default() }),
                ..native(NativeType::Created, path, None, None)
            }],
            ..w::WatchResponse::default()
        };
        let waiting = etcd_response(etcd_header(905), &watches, put(1, 905, "/t/a"));
        assert!(waiting.answers.is_empty(), "group 2 may still write below 905");
        let raises: Vec<(u64, u64)> = waiting.to_raise.iter().map(|r| (r.group, r.target)).collect();
        assert_eq!(raises, vec![(2, 905)]);
        let below = etcd_response(etcd_header(400), &watches, put(2, 400, "/t/b")).answers;
        let revisions = |answers: &[pb::WatchResponse]| -> Vec<(i64, i64)> {
            answers
                .iter()
                .flat_map(|a| a.events.iter().map(|e| (e.kv.as_ref().map_or(0, |kv| kv.mod_revision), a.header.as_ref().map_or(0, |h| h.revision))))
                .collect()
        };
        assert_eq!(revisions(&below), vec![(400, 400)], "group 2's lower event passes first");
        let progress = w::WatchResponse { watch_id: part, header: header(2, 910), progress: true, ..w::WatchResponse::default() };
        let passed = etcd_response(etcd_header(910), &watches, progress).answers;
        assert_eq!(revisions(&passed), vec![(905, 905)], "then group 1's, once group 2 is past it; no progress notice was asked for");
    }

    #[test]
    fn a_compacted_watch_names_the_oldest_revision_it_can_watch_from_not_its_start() {
        let watches: Shared = Arc::default();
        let mut creates = vec![w::WatchCreate { path: "/a".into(), start_revision: 3, ..w::WatchCreate::default() }];
        watches.lock().expect("watches").add(2, filter(RangeSpec::Single(b"/a".to_vec())), &mut creates);
        let error = w::WardenError { compact_revision: 40, ..warden_proto::warden_error(Code::Compacted, "", "gone") };
        let canceled = w::WatchCanceled { error: Some(error), resume_revision: 3, ..w::WatchCanceled::default() };
        let response = w::WatchResponse { watch_id: creates[0].watch_id, canceled: Some(canceled), ..w::WatchResponse::default() };
        let answers = etcd_response(None, &watches, response).answers;
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert!(answers[0].canceled && answers[0].cancel_reason.contains("compacted"), "{answers:?}");
        assert_eq!(answers[0].compact_revision, 41, "revisions up to 40 are gone: 41 is the oldest to watch from");
    }

    #[test]
    fn ids_asked_as_zero_are_the_lowest_free_from_zero() {
        assert_eq!(lowest_free(&BTreeSet::new()), 0);
        assert_eq!(lowest_free(&[0, 1, 3].into_iter().collect()), 2);
        assert_eq!(lowest_free(&[1, 2].into_iter().collect()), 0);
    }

    #[test]
    fn writes_of_keys_are_puts_and_containers_are_not_keys() {
        let all = filter(RangeSpec::Interval(KeyInterval { from: b"/a/".to_vec(), to: Some(b"/a0".to_vec()) }));
        let created = etcd_event(&all, native(NativeType::Created, "/a/x", stat(w::NodeKind::Persistent, 0), None)).expect("a put");
        assert_eq!(created.r#type, EventType::Put as i32);
        assert_eq!(
            created.kv.as_ref().map(|kv| (kv.key.as_slice(), kv.version, kv.value.as_slice())),
            Some((b"/a/x".as_slice(), 1, b"new".as_slice()))
        );
        assert_eq!(created.prev_kv, None, "a created key had no value before");
        assert_eq!(etcd_event(&all, native(NativeType::Created, "/a/y", stat(w::NodeKind::Container, 0), None)), None, "a container is no key");
        assert_eq!(etcd_event(&all, native(NativeType::Deleted, "/a/y", stat(w::NodeKind::Container, 0), stat(w::NodeKind::Container, 0))), None);
        assert_eq!(etcd_event(&all, native(NativeType::Created, "/b/x", stat(w::NodeKind::Persistent, 0), None)), None, "outside the range");
        let changed =
            etcd_event(&all, native(NativeType::Changed, "/a/x", stat(w::NodeKind::Persistent, 1), stat(w::NodeKind::Persistent, 0))).expect("a put");
        assert_eq!(changed.prev_kv.map(|kv| kv.value), Some(b"old".to_vec()));
    }

    #[test]
    fn a_node_emptied_into_a_container_is_a_delete_of_its_key() {
        let one = filter(RangeSpec::Single(b"/a".to_vec()));
        let emptied = native(NativeType::Changed, "/a", stat(w::NodeKind::Container, 2), stat(w::NodeKind::Persistent, 1));
        let event = etcd_event(&one, emptied.clone()).expect("a delete");
        assert_eq!(event.r#type, EventType::Delete as i32);
        assert_eq!(event.kv.map(|kv| (kv.key, kv.mod_revision, kv.version)), Some((b"/a".to_vec(), 7, 0)));
        assert_eq!(event.prev_kv.map(|kv| kv.value), Some(b"old".to_vec()));
        let no_delete = Filter { no_delete: true, ..one.clone() };
        assert_eq!(etcd_event(&no_delete, emptied), None, "NODELETE drops it");
        let no_put = Filter { no_put: true, ..one };
        assert_eq!(etcd_event(&no_put, native(NativeType::Created, "/a", stat(w::NodeKind::Persistent, 0), None)), None, "NOPUT drops a put");
    }
}
