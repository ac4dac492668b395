//! Watches of a node or a subtree from a revision on (etcd's watch; ZooKeeper's persistent
//! and persistent-recursive watches), over the bidirectional `Watch` call.
//!
//! A [`Watcher`] owns one stream carrying one watch. Revisions are per shard group (a
//! recursive watch through a router may span several groups; each response names its
//! group), so it remembers, per group, the revision after the last event it received; when
//! the stream breaks (the router died, the connection failed, or the router's own upstream
//! failed) it opens a new one — on another router if that one is unreachable — and watches
//! again from those revisions, so no event is lost or repeated. A restart that finds the
//! events compacted away ends the watch with [`Error::Compacted`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Status, Streaming};
use warden_proto::v1 as pb;
use warden_proto::v1::warden_client::WardenClient;

use crate::client::Client;
use crate::convert;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::retry::{is_transient, Backoff, CallKind, Failure};

/// Requests queued on a watch stream (only its creation is ever sent).
const REQUESTS_QUEUED_MAX: usize = 1;

/// Which kinds of events a watch reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventKinds {
    /// Creations.
    pub created: bool,
    /// Data changes.
    pub changed: bool,
    /// Deletions.
    pub deleted: bool,
}

impl EventKinds {
    /// Every kind.
    pub const ALL: EventKinds = EventKinds { created: true, changed: true, deleted: true };
}

impl Default for EventKinds {
    fn default() -> EventKinds {
        EventKinds::ALL
    }
}

/// What a watch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// The node watched.
    pub path: String,
    /// Also every node below it (through a router, in every group serving part of the
    /// subtree; each event names its group).
    pub recursive: bool,
    /// First revision to report (inclusive); 0: changes after the watch is registered.
    pub start_revision: u64,
    /// Kinds of events reported.
    pub kinds: EventKinds,
    /// Include each node's previous stat and data ([`WatchEvent::prev`]).
    pub prev_data: bool,
}

impl WatchOptions {
    /// Every change of `path` itself from now on.
    pub fn new(path: impl Into<String>) -> WatchOptions {
        WatchOptions { path: path.into(), recursive: false, start_revision: 0, kinds: EventKinds::ALL, prev_data: false }
    }
}

/// What happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// It was created.
    Created,
    /// Its data changed.
    Changed,
    /// It was deleted.
    Deleted,
}

/// One change of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// What happened.
    pub kind: EventKind,
    /// The shard group serving the node (revisions are per group).
    pub group_id: u64,
    /// The revision of the write in its group (shared by every event of one transaction).
    pub revision: u64,
    /// The node after the event (for a deletion: its last stat, and no data).
    pub node: Node,
    /// The node before the event, when asked for ([`WatchOptions::prev_data`]) and the node
    /// existed.
    pub prev: Option<Node>,
}

/// Where a watch (re)started: the group serving its path and each group's first revision.
struct Started {
    owner: u64,
    start_revision: u64,
    start_revisions: HashMap<u64, u64>,
}

/// One open watch stream.
struct WatchStream {
    /// Kept open: the server ends the call when the client's side of it ends.
    _requests: mpsc::Sender<pb::WatchRequest>,
    responses: Streaming<pb::WatchResponse>,
}

/// A running watch: its events one at a time, in revision order, resumed across broken
/// streams. Dropping it cancels the watch.
pub struct Watcher {
    client: Client,
    options: WatchOptions,
    /// The group serving the watched path (0 until the server first answered).
    owner: u64,
    /// Per group: the first revision not yet received.
    next_revisions: BTreeMap<u64, u64>,
    stream: Option<WatchStream>,
    /// Events of the last response not yet returned.
    buffered: VecDeque<WatchEvent>,
    /// The watch is over (cancelled by the server, or failed for good).
    ended: bool,
    /// Pause before the next reconnection.
    backoff: Backoff,
    /// Since when streams have failed without delivering anything.
    broken_since: Option<Instant>,
}

impl Watcher {
    /// Registers the watch; returns once the server confirmed it.
    pub(crate) async fn open(client: Client, options: WatchOptions) -> Result<Watcher> {
        let timeout = client.request_timeout();
        let mut watcher = Watcher {
            client,
            options,
            owner: 0,
            next_revisions: BTreeMap::new(),
            stream: None,
            buffered: VecDeque::new(),
            ended: false,
            backoff: Backoff::new(),
            broken_since: None,
        };
        watcher.connect(timeout).await?;
        Ok(watcher)
    }

    /// The next event; `None` once the server ended the watch without an error. Waits as long
    /// as no event comes. A broken stream is reopened from the revision after the last
    /// event; if that fails for a whole request timeout the error is returned (and the
    /// next call tries again) unless it is final (such as [`Error::Compacted`]).
    ///
    /// Cancel-safe: dropping the future (say, in a `select!` or a timeout) loses no event;
    /// the next call carries on where this one stopped.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>> {
        loop {
            if let Some(event) = self.buffered.pop_front() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            let Some(stream) = self.stream.as_mut() else {
                self.reconnect().await?;
                continue;
            };
            match stream.responses.message().await {
                Ok(Some(response)) => self.absorb(response)?,
                Ok(None) | Err(_) => self.stream = None,
            }
        }
    }

    /// Per group, the revision the watch would resume from: every event of the group before
    /// it has been received.
    pub fn resume_revisions(&self) -> &BTreeMap<u64, u64> {
        &self.next_revisions
    }

    /// Raises group `group`'s resume revision to `revision` (never lowers it).
    fn advance(&mut self, group: u64, revision: u64) {
        let next = self.next_revisions.entry(group).or_insert(0);
        *next = (*next).max(revision);
    }

    /// Opens a stream and registers the watch from the resume revisions, within `timeout`.
    async fn connect(&mut self, timeout: Duration) -> Result<()> {
        let start_revision = self.next_revisions.get(&self.owner).copied().unwrap_or(self.options.start_revision);
        // Every group's, the owner's included: the path may be served by another group now,
        // and a group the watched subtree moved into checks that none of its events in the
        // group it came from were missed.
        let groups = self.next_revisions.iter().map(|(group, revision)| (*group, *revision)).collect();
        let create = convert::watch_create(&self.options, start_revision, groups);
        let (stream, started) = self
            .client
            .retrying(CallKind::Idempotent, timeout, |client, _deadline| {
                let mut request = tonic::Request::new(create.clone());
                self.client.authorize(&mut request);
                open_stream(client, request)
            })
            .await?;
        if started.owner != 0 {
            self.owner = started.owner;
        }
        self.advance(self.owner, started.start_revision);
        for (group, revision) in started.start_revisions {
            self.advance(group, revision);
        }
        self.stream = Some(stream);
        Ok(())
    }

    /// Reopens a broken stream, after a backoff pause; streams that keep failing without
    /// delivering anything get one request timeout in all.
    async fn reconnect(&mut self) -> Result<()> {
        tokio::time::sleep(self.backoff.next_pause()).await;
        let since = *self.broken_since.get_or_insert_with(Instant::now);
        let left = self.client.request_timeout().saturating_sub(since.elapsed());
        let connected = self.connect(left).await;
        if let Err(error) = &connected {
            self.broken_since = None;
            self.ended = !is_transient(error);
        }
        connected
    }

    /// Takes one response of the stream.
    fn absorb(&mut self, response: pb::WatchResponse) -> Result<()> {
        if let Some(canceled) = response.canceled {
            self.stream = None;
            let Some(error) = canceled.error else {
                self.ended = true;
                return Ok(());
            };
            return match Error::from_detail(error) {
                // The server says where to watch again from to miss nothing.
                resumable @ (Error::SlowWatcher { .. } | Error::Unavailable { .. } | Error::NotLeader { .. } | Error::Moved { .. }) => {
                    self.advance(self.owner, canceled.resume_revision);
                    for (group, revision) in canceled.resume_revisions {
                        self.advance(group, revision);
                    }
                    // Nothing in a moved subtree changed between the move's revision in the
                    // old group and the new group's first one, so the new group resumes from
                    // it too, and owns the watched path if that moved. A group watched
                    // already (a merge's parent under a recursive watch) keeps its own place:
                    // it had no event in the subtree before it took it.
                    if let Error::Moved { path, to_group } = resumable {
                        if !self.next_revisions.contains_key(&to_group) {
                            self.advance(to_group, canceled.resume_revision);
                        }
                        if warden_paths::is_at_or_below(&self.options.path, &path) {
                            self.owner = to_group;
                        }
                    }
                    Ok(())
                }
                error => {
                    self.ended = true;
                    Err(error)
                }
            };
        }
        self.broken_since = None;
        self.backoff = Backoff::new();
        let group = response.header.as_ref().map(|h| h.group_id).filter(|g| *g != 0).unwrap_or(self.owner);
        if response.progress {
            if let Some(header) = &response.header {
                self.advance(group, header.revision.saturating_add(1));
            }
        }
        let events = response.events.into_iter().map(|event| convert::watch_event(event, group)).collect::<Result<Vec<_>>>();
        let events = match events {
            Ok(events) => events,
            Err(error) => {
                self.stream = None;
                self.ended = true;
                return Err(error);
            }
        };
        // Only revisions not received yet (a server never repeats one; this makes sure).
        let first_new = self.next_revisions.get(&group).copied().unwrap_or(0);
        for event in events.into_iter().filter(|event| event.revision >= first_new) {
            self.advance(group, event.revision.saturating_add(1));
            self.buffered.push_back(event);
        }
        Ok(())
    }
}

/// Opens a `Watch` stream with one create request and waits for the server's answer to it;
/// returns the stream and where the watch starts.
async fn open_stream(
    mut client: WardenClient<Channel>,
    create: tonic::Request<pb::WatchCreate>,
) -> std::result::Result<(WatchStream, Started), Failure> {
    // The create's metadata (the bearer token) goes with the stream.
    let (metadata, extensions, create) = create.into_parts();
    let (requests, outgoing) = mpsc::channel(REQUESTS_QUEUED_MAX);
    let request = pb::WatchRequest { request: Some(pb::watch_request::Request::Create(create)) };
    requests.try_send(request).map_err(|e| Failure::Final(Error::Protocol { message: format!("queueing a watch creation: {e}") }))?;
    let stream = tonic::Request::from_parts(metadata, extensions, tokio_stream::wrappers::ReceiverStream::new(outgoing));
    let mut responses = client.watch(stream).await?.into_inner();
    let protocol = |message: &str| Failure::Final(Error::Protocol { message: message.into() });
    match responses.message().await? {
        Some(pb::WatchResponse { created: Some(created), header, .. }) if created.start_revision != 0 => {
            let owner = header.map_or(0, |h| h.group_id);
            let started = Started { owner, start_revision: created.start_revision, start_revisions: created.start_revisions };
            Ok((WatchStream { _requests: requests, responses }, started))
        }
        Some(pb::WatchResponse { created: Some(_), .. }) => Err(protocol("a watch was created without a start revision")),
        // A refusal, judged like any other (UNAVAILABLE is retried, COMPACTED is final).
        Some(pb::WatchResponse { canceled: Some(pb::WatchCanceled { error: Some(error), .. }), .. }) => {
            Err(Failure::Status(warden_proto::status(error)))
        }
        Some(_) => Err(protocol("the first response of a watch neither created nor refused it")),
        None => Err(Failure::Status(Status::unavailable("the watch stream ended before the watch was created"))),
    }
}
