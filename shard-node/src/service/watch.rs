//! The `Watch` call: one driver task per client stream. It takes the client's requests in
//! order (create, cancel, progress), moves watches that start in the past through their
//! hub's history as the stream's queue has room, and sends progress responses to idle
//! watches. Events themselves reach the queue from the hubs, on the applying thread.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Status, Streaming};
use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::tls::PeerInfo;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_create::Kind as WatchKind;
use warden_proto::v1::watch_created::Read;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

use super::{error_of, group_of, WardenService};
use warden_namespace::error::{error, invalid};
use warden_namespace::path;
use warden_namespace::watch::hub::{CatchUp, WatchHub};
use warden_namespace::watch::stream::{Outgoing, Phase, StreamWatch};
use warden_namespace::watch::{PathBounds, WatchHubs, WatchSpec};

/// The responses of one `Watch` call.
pub type Responses = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// Starts serving one `Watch` call.
/// `peer` is the connection the call came over and `metadata` the call's (a router names the
/// principal there, a client its token): each watch created on the stream is checked
/// against the ACL for that caller (`warden-access`).
pub(super) fn serve(
    service: WardenService,
    hubs: WatchHubs,
    peer: Option<PeerInfo>,
    metadata: MetadataMap,
    incoming: Streaming<WatchRequest>,
) -> Responses {
    let stream = warden_namespace::watch::WatchStream::new(hubs.limits().stream_queue_bytes_max);
    let node_id = service.node.node_id();
    let driver = Driver { node_id, service: service.clone(), hubs, peer, metadata, stream: stream.clone(), next_watch_id: 1 };
    tokio::spawn(driver.run(incoming));
    let sender = Sender { stream, service };
    Box::pin(futures::stream::unfold(sender, |sender| async move {
        let outgoing = sender.stream.next().await?;
        let response = sender.response(outgoing);
        Some((Ok(response), sender))
    }))
}

/// The sending half; when tonic drops it (the client went away) the driver cleans up.
struct Sender {
    stream: Arc<warden_namespace::watch::WatchStream>,
    service: WardenService,
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stream.receiver_gone();
    }
}

impl Sender {
    fn response(&self, outgoing: Outgoing) -> WatchResponse {
        let header = |group, revision| Some(self.service.header(group, revision));
        match outgoing {
            Outgoing::Created { watch_id, group, revision, created } => {
                WatchResponse { watch_id, header: header(group, revision), created: Some(*created), ..WatchResponse::default() }
            }
            Outgoing::Events { watch_id, group, batches, with_prev } => {
                let revision = batches.last().map_or(0, |(batch, _)| batch.revision);
                let events = batches
                    .iter()
                    .flat_map(|(batch, selected)| selected.iter().map(move |i| batch.events[*i as usize].to_proto(batch.revision, with_prev)))
                    .collect();
                WatchResponse { watch_id, header: header(group, revision), events, ..WatchResponse::default() }
            }
            Outgoing::Progress { watch_id, group, revision } => {
                WatchResponse { watch_id, header: header(group, revision), progress: true, ..WatchResponse::default() }
            }
            Outgoing::Canceled { watch_id, group, error, resume_revision } => WatchResponse {
                watch_id,
                header: header(group, 0),
                canceled: Some(WatchCanceled { error, resume_revision, ..WatchCanceled::default() }),
                ..WatchResponse::default()
            },
        }
    }
}

struct Driver {
    node_id: u64,
    service: WardenService,
    hubs: WatchHubs,
    /// The connection the stream came over (whom its watches are for).
    peer: Option<PeerInfo>,
    /// The stream call's metadata (a router names the principal there, a client its token).
    metadata: MetadataMap,
    stream: Arc<warden_namespace::watch::WatchStream>,
    /// Next id to try for a watch created with `watch_id = 0`.
    next_watch_id: u64,
}

impl Driver {
    async fn run(mut self, mut incoming: Streaming<WatchRequest>) {
        let interval = Duration::from_millis(self.hubs.limits().progress_interval_ms.max(1));
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut requests_open = true;
        loop {
            // 1. Catch-up first: it only moves while the queue has room, and the room is
            //    what woke us most of the time.
            self.catch_up();
            // 2. A client that went away ends the driver (after cleaning up below).
            if self.stream.is_closed() {
                break;
            }
            tokio::select! {
                // The next request only while the queue has room: its answers are queued
                // whatever their size, so a client that stops reading stops being read.
                message = incoming.message(), if requests_open && self.stream.has_room() => match message {
                    Ok(Some(request)) => self.handle(request).await,
                    // The client closed its side: keep sending until it hangs up.
                    Ok(None) => requests_open = false,
                    Err(_) => break,
                },
                () = self.stream.driver_wake() => {}
                _ = progress.tick() => self.progress(false),
            }
        }
        // 3. Take every live watch out of its hub's index.
        for (watch_id, watch) in self.stream.close() {
            if let (Phase::Live, Some(hub)) = (watch.phase, self.hubs.get(self.node_id, watch.group)) {
                hub.remove(&watch.path, &self.stream, watch_id);
            }
        }
    }

    /// One catch-up step for each watch behind, within the queue's free room.
    fn catch_up(&self) {
        for watch_id in self.stream.catching_up() {
            let budget_bytes = self.stream.free_bytes();
            if budget_bytes == 0 {
                return;
            }
            let Some(watch) = self.stream.watch(watch_id) else { continue };
            match self.hubs.get(self.node_id, watch.group) {
                Some(hub) => {
                    let step = hub.catch_up(&self.stream, watch_id, budget_bytes);
                    debug_assert!(step != CatchUp::Live || self.stream.watch(watch_id).is_none_or(|w| w.phase == Phase::Live));
                }
                None => {
                    let next = match watch.phase {
                        Phase::CatchingUp { next_revision } => next_revision,
                        Phase::Live => 0,
                    };
                    let error = error(Code::Unavailable, "", format!("group {} is no longer hosted on this node", watch.group));
                    self.stream.cancel(watch_id, Some(error), next);
                }
            }
        }
    }

    /// Progress responses for idle watches with `progress_notify` (every live watch when
    /// `all`, on the client's request).
    fn progress(&self, all: bool) {
        for (group, watch_ids) in self.stream.take_idle(all) {
            if let Some(hub) = self.hubs.get(self.node_id, group) {
                hub.progress(&self.stream, &watch_ids, all);
            }
        }
    }

    async fn handle(&mut self, request: WatchRequest) {
        match request.request {
            Some(WatchRequestKind::Create(create)) => self.create(create).await,
            Some(WatchRequestKind::Cancel(cancel)) => match self.stream.cancel(cancel.watch_id, None, 0) {
                Some(watch) => {
                    if let (Phase::Live, Some(hub)) = (watch.phase, self.hubs.get(self.node_id, watch.group)) {
                        hub.remove(&watch.path, &self.stream, cancel.watch_id);
                    }
                }
                None => self.refuse(cancel.watch_id, 0, error(Code::InvalidArgument, "", format!("no watch {} on this stream", cancel.watch_id))),
            },
            Some(WatchRequestKind::Progress(_)) => self.progress(true),
            None => self.refuse(0, 0, error(Code::InvalidArgument, "", "watch request without a kind")),
        }
    }

    fn refuse(&self, watch_id: u64, group: u64, error: WardenError) {
        self.stream.answer(Outgoing::Canceled { watch_id, group, error: Some(error), resume_revision: 0 });
    }

    fn pick_watch_id(&mut self) -> u64 {
        while self.stream.contains(self.next_watch_id) {
            self.next_watch_id += 1;
        }
        self.next_watch_id
    }

    async fn create(&mut self, create: WatchCreate) {
        let watch_id = if create.watch_id == 0 { self.pick_watch_id() } else { create.watch_id };
        let group = group_of(create.routing.as_ref());
        if let Err(refused) = self.service.admit_of(self.peer.as_ref(), &self.metadata, &create) {
            let refused = error_of(&refused).unwrap_or_else(|| error(Code::Unknown, "", refused.message()));
            return self.refuse(watch_id, group, refused);
        }
        match self.register(watch_id, group, create).await {
            Ok((watch, created)) => self.stream.add(watch_id, watch, created),
            Err(error) => self.refuse(watch_id, group, error),
        }
    }

    /// Checks a creation and, with `read`, reads at the revision the watch starts after.
    async fn register(&self, watch_id: u64, group: u64, create: WatchCreate) -> Result<(StreamWatch, Outgoing), WardenError> {
        let limits = self.hubs.limits();
        let invalid = |message: &str| invalid(&create.path, message);
        if self.stream.contains(watch_id) {
            return Err(invalid("the watch id is in use on this stream"));
        }
        if self.stream.len() >= limits.watches_per_stream_max {
            let message = format!("a stream carries at most {} watches", limits.watches_per_stream_max);
            return Err(WardenError { limit: limits.watches_per_stream_max as u64, ..error(Code::TooLarge, "", message) });
        }
        path::validate(&create.path, true).map_err(|reason| warden_namespace::error::invalid_path(&create.path, &reason))?;
        let kind = WatchKind::try_from(create.kind).map_err(|_| invalid("unknown watch kind"))?;
        if create.recursive && kind != WatchKind::Persistent {
            return Err(invalid("only persistent watches are recursive"));
        }
        let bounded = !create.from.is_empty() || !create.to.is_empty();
        if bounded && !create.recursive {
            return Err(invalid("only recursive watches have bounds"));
        }
        let end = warden_placement::subtree_end(&create.path);
        if (!create.from.is_empty() && create.from.as_slice() < create.path.as_bytes()) || create.to.as_slice() > end.as_bytes() {
            return Err(invalid("a watch's bounds lie within its path's subtree"));
        }
        if create.read && create.start_revision != 0 {
            return Err(invalid("a watch with a read starts at the read: start_revision must be 0"));
        }
        warden_proto::check_group_start_revisions(&create)?;
        let hub = self.hubs.get(self.node_id, group).ok_or_else(|| super::not_hosted(group))?;
        let timeout = self.service.timeout;
        self.await_paths(&hub, group, &create, timeout).await?;
        let (revision, read) = if create.read {
            let query = match kind {
                WatchKind::Data => QueryKind::Get(GetRequest { path: create.path.clone(), consistency: create.consistency, routing: None }),
                WatchKind::Children => QueryKind::Children(GetChildrenRequest {
                    path: create.path.clone(),
                    consistency: create.consistency,
                    ..GetChildrenRequest::default()
                }),
                WatchKind::Exists | WatchKind::Persistent => {
                    QueryKind::Exists(ExistsRequest { path: create.path.clone(), consistency: create.consistency, routing: None })
                }
            };
            let (outcome, header) = self.read(group, create.consistency, query, timeout).await?;
            let read = match outcome {
                QueryOutcome::Get(response) => Read::Get(GetResponse { header: Some(header), ..response }),
                QueryOutcome::Exists(response) => Read::Exists(ExistsResponse { header: Some(header), ..response }),
                QueryOutcome::Children(response) => Read::Children(GetChildrenResponse { header: Some(header), ..response }),
                _ => return Err(error(Code::Unknown, "", "mismatched read result")),
            };
            (header.revision, Some(read))
        } else {
            // A read of the path checks that the group serves it (WRONG_GROUP, not a watch
            // that never fires); linearizable when the watch starts after "now", so nothing
            // committed before the call is missed, else this replica's state.
            let linearizable = create.start_revision == 0 && create.consistency == Consistency::Linearizable as i32;
            let consistency = if linearizable { Consistency::Linearizable } else { Consistency::Stale } as i32;
            let query = QueryKind::Exists(ExistsRequest { path: create.path.clone(), consistency, routing: None });
            let (_, header) = self.read(group, consistency, query, timeout).await?;
            let revision = match create.start_revision {
                0 if linearizable => header.revision,
                0 => hub.revision(),
                start => start - 1,
            };
            (revision, None)
        };
        let bounds = bounded.then(|| PathBounds { from: create.from.clone(), to: create.to.clone() });
        let spec = WatchSpec::new(kind, create.recursive, create.no_create, create.no_delete, create.no_change, create.prev_data).within(bounds);
        let start_revision = revision + 1;
        let charge = self
            .hubs
            .charge_watch(hub.watch_limits_covering(&create.path))
            .map_err(|full| warden_namespace::quota::watches_exceeded(&full.prefix, full.limit))?;
        let watch = StreamWatch {
            group,
            path: Arc::from(create.path.as_str()),
            spec,
            phase: Phase::CatchingUp { next_revision: start_revision },
            progress_notify: create.progress_notify,
            active: false,
            charge,
            resume_revisions: Arc::new(create.group_start_revisions.iter().map(|(group, revision)| (*group, *revision)).collect()),
        };
        let created =
            Outgoing::Created { watch_id, group, revision, created: Box::new(WatchCreated { start_revision, read, ..WatchCreated::default() }) };
        Ok((watch, created))
    }

    /// Makes sure this replica knows every subtree move its router's table reflects before
    /// the watch starts. A router spans the groups its table names: one that knows a subtree
    /// moved in here spans no part in the group it came from, and only a replica that applied
    /// the move-in knows to end a watch that would skip that group's events (COMPACTED,
    /// [`WatchHub::catch_up`]). A replica that has applied an older version of the group's
    /// paths than the router routed by (`routing.version`; 0: not checked), cut off or a
    /// moment late, first applies everything its group committed, through a linearizable
    /// read (unreachable: the watch is refused UNAVAILABLE, to be created again). That is
    /// enough: placement routes a moved subtree to its new group only once that group has
    /// committed the descriptor serving it. Its version may still be behind the table after
    /// a creation rolled back (placement bumps the givers' versions before it gives their
    /// paths back): paths no other group ever served, so no event was missed, and the watch
    /// goes on rather than wait for a descriptor a failed rollback may never send.
    async fn await_paths(&self, hub: &WatchHub, group: u64, create: &WatchCreate, timeout: Duration) -> Result<(), WardenError> {
        let wanted = create.routing.as_ref().map_or(0, |r| r.version);
        if wanted <= hub.paths_version() {
            return Ok(());
        }
        let query = QueryKind::Exists(ExistsRequest { path: create.path.clone(), consistency: Consistency::Linearizable as i32, routing: None });
        self.read(group, Consistency::Linearizable as i32, query, timeout).await.map(|_| ())
    }

    async fn read(&self, group: u64, consistency: i32, query: QueryKind, timeout: Duration) -> Result<(QueryOutcome, ResponseHeader), WardenError> {
        self.service
            .read_group(group, consistency, query, timeout)
            .await
            .map_err(|status| error_of(&status).unwrap_or_else(|| error(Code::Unavailable, "", status.message())))
    }
}
