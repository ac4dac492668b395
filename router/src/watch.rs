//! Watches through the router: the client's one stream fans out to one upstream `Watch`
//! stream per group (to a replica of it), created on the first watch of that group. Watch
//! ids stay the client's (the router picks one for `watch_id = 0`), so responses pass
//! through unchanged. If an upstream stream fails, each of its watches is cancelled with
//! UNAVAILABLE and the revision to resume from (the last event seen + 1), so the client
//! can watch again without a gap. A recursive watch covers its own group only: subtrees
//! served by other groups need their own watches (their revisions are other groups').

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

use crate::upstream::{warden_client, Upstreams};

/// The responses of one proxied `Watch` call.
pub type Responses = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

/// Responses queued for the client before upstream readers wait (bounded memory; the
/// shard-nodes' own queues cancel watches that fall too far behind).
const RESPONSES_QUEUED_MAX: usize = 1024;
/// Requests queued for one upstream stream.
const REQUESTS_QUEUED_MAX: usize = 256;

/// A watch the proxy carries: its group and the next revision it needs.
#[derive(Clone, Copy)]
struct Carried {
    group: u64,
    next_revision: u64,
}

type Watches = Arc<Mutex<HashMap<u64, Carried>>>;

/// Starts proxying one client `Watch` stream.
pub fn proxy(upstreams: Arc<Upstreams>, incoming: Streaming<WatchRequest>) -> Responses {
    let (responses, stream) = mpsc::channel(RESPONSES_QUEUED_MAX);
    tokio::spawn(run(upstreams, incoming, responses));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))
}

fn canceled(watch_id: u64, code: Code, message: String, resume_revision: u64) -> WatchResponse {
    let error = WardenError { code: code as i32, message, ..WardenError::default() };
    WatchResponse { watch_id, canceled: Some(WatchCanceled { error: Some(error), resume_revision }), ..WatchResponse::default() }
}

async fn run(upstreams: Arc<Upstreams>, mut incoming: Streaming<WatchRequest>, responses: mpsc::Sender<Result<WatchResponse, Status>>) {
    let watches: Watches = Arc::default();
    let mut streams: HashMap<u64, mpsc::Sender<WatchRequest>> = HashMap::new();
    let mut next_watch_id = 1u64;
    while let Ok(Some(request)) = incoming.message().await {
        match request.request {
            Some(WatchRequestKind::Create(mut create)) => {
                if create.watch_id == 0 {
                    let taken = watches.lock().unwrap_or_else(|e| e.into_inner());
                    while taken.contains_key(&next_watch_id) {
                        next_watch_id += 1;
                    }
                    create.watch_id = next_watch_id;
                }
                let mut table = upstreams.table();
                if table.route(&create.path).is_none() {
                    table = match upstreams.refresh().await {
                        Ok(table) => table,
                        Err(status) => {
                            let _ = responses.send(Ok(canceled(create.watch_id, Code::Unavailable, status.message().to_string(), 0))).await;
                            continue;
                        }
                    };
                }
                let Some(route) = table.route(&create.path).cloned() else {
                    let _ = responses.send(Ok(canceled(create.watch_id, Code::Unavailable, format!("no group serves {}", create.path), 0))).await;
                    continue;
                };
                let group = route.id();
                create.routing = Some(Routing { group_id: group, conf_ver: route.descriptor.conf_ver, version: route.descriptor.version });
                if streams.get(&group).is_none_or(mpsc::Sender::is_closed) {
                    match open(&upstreams, &route, watches.clone(), responses.clone()).await {
                        Ok(sender) => {
                            streams.insert(group, sender);
                        }
                        Err(status) => {
                            let _ = responses.send(Ok(canceled(create.watch_id, Code::Unavailable, status.message().to_string(), create.start_revision))).await;
                            continue;
                        }
                    }
                }
                watches.lock().unwrap_or_else(|e| e.into_inner()).insert(create.watch_id, Carried { group, next_revision: create.start_revision });
                if let Some(sender) = streams.get(&group) {
                    let _ = sender.send(WatchRequest { request: Some(WatchRequestKind::Create(create)) }).await;
                }
            }
            Some(WatchRequestKind::Cancel(cancel)) => {
                let carried = watches.lock().unwrap_or_else(|e| e.into_inner()).remove(&cancel.watch_id);
                match carried.and_then(|c| streams.get(&c.group)) {
                    Some(sender) => {
                        let _ = sender.send(WatchRequest { request: Some(WatchRequestKind::Cancel(cancel)) }).await;
                    }
                    None => {
                        let message = format!("no watch {} on this stream", cancel.watch_id);
                        let _ = responses.send(Ok(canceled(cancel.watch_id, Code::InvalidArgument, message, 0))).await;
                    }
                }
            }
            Some(WatchRequestKind::Progress(progress)) => {
                for sender in streams.values() {
                    let _ = sender.send(WatchRequest { request: Some(WatchRequestKind::Progress(progress)) }).await;
                }
            }
            None => {}
        }
    }
    // Dropping the upstream senders ends the upstream streams.
}

/// Opens the upstream stream of one group and a task passing its responses on.
async fn open(
    upstreams: &Upstreams,
    route: &crate::table::GroupRoute,
    watches: Watches,
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
                tokio::spawn(pass_on(group, response.into_inner(), watches, responses));
                return Ok(sender);
            }
            Err(status) => last_error = status,
        }
    }
    Err(last_error)
}

/// Passes one upstream's responses to the client, keeping each watch's resume revision; when
/// the upstream ends, cancels its watches with where to resume.
async fn pass_on(group: u64, mut upstream: Streaming<WatchResponse>, watches: Watches, responses: mpsc::Sender<Result<WatchResponse, Status>>) {
    loop {
        let response = match upstream.message().await {
            Ok(Some(response)) => response,
            Ok(None) | Err(_) => break,
        };
        {
            let mut carried = watches.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(watch) = carried.get_mut(&response.watch_id) {
                if let Some(created) = &response.created {
                    watch.next_revision = created.start_revision;
                }
                if let Some(last) = response.events.last() {
                    watch.next_revision = last.revision + 1;
                }
                if response.canceled.is_some() {
                    carried.remove(&response.watch_id);
                }
            }
        }
        if responses.send(Ok(response)).await.is_err() {
            return;
        }
    }
    let ended: Vec<(u64, Carried)> = {
        let mut carried = watches.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<u64> = carried.iter().filter(|(_, c)| c.group == group).map(|(id, _)| *id).collect();
        ids.into_iter().filter_map(|id| carried.remove(&id).map(|c| (id, c))).collect()
    };
    for (watch_id, carried) in ended {
        let message = format!("the stream to group {group} ended; watch again from resume_revision");
        if responses.send(Ok(canceled(watch_id, Code::Unavailable, message, carried.next_revision))).await.is_err() {
            return;
        }
    }
}
