//! The router's side of `warden.batch.BatchForward`: per node, a fixed number of long-lived
//! streams that carry the unary calls the router forwards as tagged items, so HTTP/2
//! framing, headers and task wake-ups are paid per batch (TiKV's BatchCommands).
//!
//! Per stream, concurrent calls enqueue into a bounded queue (a full queue makes the caller
//! wait, within its deadline: backpressure reaches the clients instead of refusing calls
//! that would succeed a moment later). One driver task takes whatever is queued (up to
//! [`BATCH_ITEMS_MAX`] items, about [`BATCH_BYTES_MAX`] bytes) into one message and matches
//! the results that come back to their callers by id, with at most
//! [`BATCH_ITEMS_IN_FLIGHT_MAX`] items in flight (the node's bound, so the node always reads).
//!
//! What a broken stream means for its calls, which decides whether they may be retried
//! ([`Upstreams::call`](crate::Upstreams::call)):
//! - an item still queued or gathered here was never sent: it fails typed UNAVAILABLE, which
//!   says the request was not applied (a write may go again);
//! - an item handed to the stream and not answered has an unknown outcome: it fails typed
//!   OUTCOME_UNKNOWN (a write is not sent again; an idempotent call is).
//!
//! A stream that breaks is opened again for the next call, over the node's channel (whose
//! reconnects it shares). A node that does not serve the stream (UNIMPLEMENTED: an older
//! version) gets unary calls from then on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::bytes::Bytes;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Response, Status};
use warden_proto::batch::batch_forward_client::BatchForwardClient;
use warden_proto::batch::item_result::Result as ItemOutcome;
use warden_proto::batch::{BatchRequest, Item, ItemResult, Method};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::{BATCH_BYTES_MAX, BATCH_ITEMS_IN_FLIGHT_MAX, BATCH_ITEMS_MAX, RESPONSE_BYTES_MAX};

use crate::service::REQUEST_BYTES_MAX;
use crate::upstream::warden_client;
use warden_proto::follow::bounded;

/// Calls queued on one stream before callers wait.
const QUEUED_MAX: usize = 4096;
/// Cancels of abandoned calls queued on one stream (more are dropped: the node ends those
/// calls at their deadline anyway).
const CANCELS_QUEUED_MAX: usize = 1024;
/// Batch messages handed to the stream and not yet written: few, so calls keep gathering
/// into the next message while the connection is busy.
const SENDS_QUEUED_MAX: usize = 2;
/// Longest a node may take to accept a stream.
const OPEN_MAX: Duration = Duration::from_secs(2);
/// Largest batch message sent: a full batch plus one item of the largest size.
const BATCH_REQUEST_BYTES_MAX: usize = BATCH_BYTES_MAX + REQUEST_BYTES_MAX + (64 << 10);
/// Largest batch message accepted: a full batch plus one response of the largest size.
const BATCH_RESPONSE_BYTES_MAX: usize = BATCH_BYTES_MAX + RESPONSE_BYTES_MAX + (64 << 10);

/// A request type of `warden.v1.Warden` and the method it is the request of.
pub trait Batchable: Message + Sized {
    /// The method this message is the request of.
    const METHOD: Method;
}

/// One node as a call's attempt reaches it: its channel, and its batch streams if batching
/// is on.
#[derive(Clone)]
pub struct Upstream {
    /// The node's channel (for streaming calls, and unary calls when not batched).
    pub channel: Channel,
    pub(crate) batcher: Option<Arc<Batcher>>,
}

impl Upstream {
    /// Sends `request` (its method is its type's) to this node, over a batch stream when
    /// there is one and the node serves it, else as the unary call `unary` makes; either way
    /// carrying the time left until `deadline`.
    pub async fn forward<Req, Resp, F, Fut>(self, request: Req, deadline: Instant, unary: F) -> Result<Response<Resp>, Status>
    where
        Req: Batchable,
        Resp: Message + Default,
        F: FnOnce(WardenClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        // Whom the call is for (crate::principal), named to the node either way.
        let principal = crate::principal::current();
        if let Some(batcher) = &self.batcher {
            let principal = principal.as_deref().unwrap_or_default().to_string();
            match batcher.call(Req::METHOD, request.encode_to_vec().into(), deadline, principal).await {
                Answer::Ok(bytes) => {
                    return Resp::decode(bytes).map(Response::new).map_err(|e| Status::internal(format!("failed to decode Protobuf message: {e}")))
                }
                Answer::Failed(status) => return Err(status),
                Answer::Unsupported => {}
            }
        }
        let mut request = bounded(request, deadline);
        crate::principal::name_in(&mut request);
        unary(warden_client(self.channel), request).await
    }
}

/// How a batched call ended.
enum Answer {
    Ok(Bytes),
    Failed(Status),
    /// The node does not serve batch streams: send the call unary.
    Unsupported,
}

/// A call waiting for its turn on a stream.
struct Queued {
    id: u64,
    method: Method,
    request: Bytes,
    deadline: Instant,
    /// Whom it is for (empty: security off).
    principal: String,
    answer: oneshot::Sender<Answer>,
}

/// The batch streams to one node.
pub struct Batcher {
    addr: String,
    streams: Vec<Stream>,
    /// Spreads calls over the streams.
    next_stream: AtomicUsize,
    /// Ids of calls, unique per node.
    next_id: AtomicU64,
    /// The node answered UNIMPLEMENTED: calls go unary.
    unsupported: Arc<AtomicBool>,
}

/// One stream's queues (its driver task owns the other ends).
struct Stream {
    queue: mpsc::Sender<Queued>,
    cancels: mpsc::Sender<u64>,
}

impl Batcher {
    /// `streams` (at least one) batch streams to the node at `addr`, over `channel`; each is
    /// opened when its first call comes. Their drivers end when the batcher is dropped.
    pub fn new(addr: &str, channel: &Channel, streams: usize) -> Batcher {
        let unsupported = Arc::new(AtomicBool::new(false));
        let streams = (0..streams.max(1))
            .map(|_| {
                let (queue, queued) = mpsc::channel(QUEUED_MAX);
                let (cancels, cancelled) = mpsc::channel(CANCELS_QUEUED_MAX);
                let driver = Driver { addr: addr.to_string(), channel: channel.clone(), queued, cancelled, unsupported: unsupported.clone() };
                tokio::spawn(driver.run());
                Stream { queue, cancels }
            })
            .collect();
        Batcher { addr: addr.to_string(), streams, next_stream: AtomicUsize::new(0), next_id: AtomicU64::new(1), unsupported }
    }

    /// Sends one call and waits for its answer. Dropped before the answer (the caller's
    /// deadline, or its client went away), it cancels the call at the node.
    async fn call(&self, method: Method, request: Bytes, deadline: Instant, principal: String) -> Answer {
        if self.unsupported.load(Ordering::Relaxed) {
            return Answer::Unsupported;
        }
        let stream = &self.streams[self.next_stream.fetch_add(1, Ordering::Relaxed) % self.streams.len()];
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        if stream.queue.send(Queued { id, method, request, deadline, principal, answer }).await.is_err() {
            return Answer::Failed(not_sent(&self.addr, &Status::unavailable("the router is shutting down")));
        }
        let mut cancel = CancelOnDrop { cancels: Some(&stream.cancels), id };
        let answer = answered.await;
        cancel.cancels = None;
        answer.unwrap_or_else(|_| Answer::Failed(outcome_unknown(&self.addr, &Status::unavailable("the batch stream's driver went away"))))
    }
}

/// Tells the stream's driver a call was abandoned (unless disarmed).
struct CancelOnDrop<'a> {
    cancels: Option<&'a mpsc::Sender<u64>>,
    id: u64,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(cancels) = self.cancels {
            // Best effort: a cancel that does not fit is the node's to end at the deadline.
            let _ = cancels.try_send(self.id);
        }
    }
}

/// Metadata on the statuses this module makes when a batch stream could not open or broke:
/// the link to the node failed, not the node's answer (see [`is_link_failure`]).
const LINK_FAILED: &str = "warden-link-failed";

/// Whether `status` says the link to the node failed (its batch stream could not open or
/// broke) rather than being the node's answer: the router then passes over that node for a
/// while, as it does for a connection that failed.
pub fn is_link_failure(status: &Status) -> bool {
    status.metadata().contains_key(LINK_FAILED)
}

/// `error` as a status marked as a link failure.
fn link_failure(error: warden_proto::v1::WardenError) -> Status {
    let mut status = warden_proto::status(error);
    status.metadata_mut().insert(LINK_FAILED, tonic::metadata::MetadataValue::from_static("1"));
    status
}

/// The typed refusal of a call that never left the router: not applied, safe to send again.
fn not_sent(addr: &str, cause: &Status) -> Status {
    let message = format!("the batch stream to {addr} failed before the request was sent: {}", cause.message());
    link_failure(warden_proto::warden_error(Code::Unavailable, "", message))
}

/// The typed answer of a call sent on a stream that broke before its answer came.
fn outcome_unknown(addr: &str, cause: &Status) -> Status {
    let message = format!("the batch stream to {addr} failed after the request was sent; the outcome is unknown: {}", cause.message());
    link_failure(warden_proto::warden_error(Code::OutcomeUnknown, "", message))
}

/// The answer an item's result carries.
fn answer_of(result: ItemResult) -> Answer {
    match result.result {
        Some(ItemOutcome::Ok(bytes)) => Answer::Ok(bytes),
        Some(ItemOutcome::Error(error)) => Answer::Failed(Status::with_details(tonic::Code::from_i32(error.code), error.message, error.details)),
        None => Answer::Failed(Status::internal("an empty batch item result")),
    }
}

/// The task that owns one stream: opens it for the first call, sends what is queued,
/// answers what comes back, and reopens it after it breaks.
struct Driver {
    addr: String,
    channel: Channel,
    queued: mpsc::Receiver<Queued>,
    cancelled: mpsc::Receiver<u64>,
    unsupported: Arc<AtomicBool>,
}

impl Driver {
    async fn run(mut self) {
        // Nothing is held open for nobody: a stream opens when a call comes.
        while let Some(first) = self.queued.recv().await {
            if self.unsupported.load(Ordering::Relaxed) {
                let _ = first.answer.send(Answer::Unsupported);
                continue;
            }
            let (requests, outgoing) = mpsc::channel(SENDS_QUEUED_MAX);
            let mut client = BatchForwardClient::new(self.channel.clone())
                .max_decoding_message_size(BATCH_RESPONSE_BYTES_MAX)
                .max_encoding_message_size(BATCH_REQUEST_BYTES_MAX);
            // Opened with nothing on it, so a failure to open says no call was sent.
            let opened = match tokio::time::timeout(OPEN_MAX, client.forward(tokio_stream::wrappers::ReceiverStream::new(outgoing))).await {
                Ok(opened) => opened,
                Err(_) => Err(Status::unavailable(format!("the node did not accept the stream in {OPEN_MAX:?}"))),
            };
            match opened {
                Ok(responses) => self.serve(first, requests, responses.into_inner()).await,
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    tracing::info!(addr = %self.addr, "node serves no batch stream: calls to it go unary");
                    self.unsupported.store(true, Ordering::Relaxed);
                    let _ = first.answer.send(Answer::Unsupported);
                }
                Err(status) => {
                    // Everything queued now fails with the cause: the next call tries again.
                    let failed = not_sent(&self.addr, &status);
                    let _ = first.answer.send(Answer::Failed(failed.clone()));
                    while let Ok(queued) = self.queued.try_recv() {
                        let _ = queued.answer.send(Answer::Failed(failed.clone()));
                    }
                }
            }
        }
    }

    /// Runs one open stream until it breaks (or the batcher is dropped); then answers its
    /// unanswered calls as the module doc says.
    async fn serve(
        &mut self,
        first: Queued,
        requests: mpsc::Sender<BatchRequest>,
        mut responses: tonic::Streaming<warden_proto::batch::BatchResponse>,
    ) {
        let mut in_flight: HashMap<u64, oneshot::Sender<Answer>> = HashMap::new();
        let mut gathered: Vec<Queued> = vec![first];
        let mut gathered_bytes = 0;
        let mut cancels: Vec<u64> = Vec::new();
        let mut open = true;
        let cause = loop {
            let room =
                gathered.len() < BATCH_ITEMS_MAX && gathered_bytes < BATCH_BYTES_MAX && in_flight.len() + gathered.len() < BATCH_ITEMS_IN_FLIGHT_MAX;
            tokio::select! {
                // Answers first (they free room), then cancels, then sending; new calls join
                // the next message while the stream is busy with the last.
                biased;
                message = responses.message() => match message {
                    Ok(Some(batch)) => {
                        for result in batch.results {
                            if let Some(answer) = in_flight.remove(&result.id) {
                                let _ = answer.send(answer_of(result));
                            }
                        }
                    }
                    Ok(None) => break Status::unavailable("the node ended the batch stream"),
                    Err(status) => break status,
                },
                Some(id) = self.cancelled.recv() => {
                    // A call still gathered is skipped when sent (its answer is closed).
                    if in_flight.remove(&id).is_some() {
                        cancels.push(id);
                    }
                }
                permit = requests.reserve(), if !gathered.is_empty() || !cancels.is_empty() => {
                    let Ok(permit) = permit else { break Status::unavailable("the batch stream closed") };
                    let now = Instant::now();
                    let mut items = Vec::with_capacity(gathered.len());
                    for queued in gathered.drain(..) {
                        if queued.answer.is_closed() {
                            continue;
                        }
                        let left = queued.deadline.saturating_duration_since(now);
                        if left.is_zero() {
                            let _ = queued.answer.send(Answer::Failed(not_sent(&self.addr, &Status::deadline_exceeded("the deadline passed in the queue"))));
                            continue;
                        }
                        let timeout_us = u64::try_from(left.as_micros()).unwrap_or(u64::MAX).max(1);
                        items.push(Item { id: queued.id, method: queued.method as i32, request: queued.request, timeout_us, principal: queued.principal });
                        in_flight.insert(queued.id, queued.answer);
                    }
                    gathered_bytes = 0;
                    permit.send(BatchRequest { items, cancels: std::mem::take(&mut cancels) });
                }
                queued = self.queued.recv(), if open && room => match queued {
                    Some(queued) => {
                        gathered_bytes += queued.request.len();
                        gathered.push(queued);
                        // Take whatever else is queued now, within the bounds.
                        while gathered.len() < BATCH_ITEMS_MAX
                            && gathered_bytes < BATCH_BYTES_MAX
                            && in_flight.len() + gathered.len() < BATCH_ITEMS_IN_FLIGHT_MAX
                        {
                            let Ok(queued) = self.queued.try_recv() else { break };
                            gathered_bytes += queued.request.len();
                            gathered.push(queued);
                        }
                    }
                    // The batcher is gone: finish what is in flight, then end.
                    None => open = false,
                },
            }
            if !open && gathered.is_empty() && in_flight.is_empty() {
                return;
            }
        };
        tracing::debug!(addr = %self.addr, %cause, "batch stream broke");
        for (_, answer) in in_flight.drain() {
            let _ = answer.send(Answer::Failed(outcome_unknown(&self.addr, &cause)));
        }
        for queued in gathered.drain(..) {
            let _ = queued.answer.send(Answer::Failed(not_sent(&self.addr, &cause)));
        }
        // Calls still queued go on the next stream.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::batch::batch_forward_server::{BatchForward, BatchForwardServer};
    use warden_proto::batch::BatchResponse;
    use warden_proto::v1::CreateRequest;

    /// A node that takes items and answers none, telling `received` each item's id.
    struct Silent {
        received: mpsc::Sender<u64>,
    }

    #[tonic::async_trait]
    impl BatchForward for Silent {
        type ForwardStream = tokio_stream::wrappers::ReceiverStream<Result<BatchResponse, Status>>;

        async fn forward(&self, request: tonic::Request<tonic::Streaming<BatchRequest>>) -> Result<Response<Self::ForwardStream>, Status> {
            let (responses, stream) = mpsc::channel(1);
            let (mut incoming, received) = (request.into_inner(), self.received.clone());
            tokio::spawn(async move {
                let _never_answered = responses;
                while let Ok(Some(batch)) = incoming.message().await {
                    for item in batch.items {
                        let _ = received.send(item.id).await;
                    }
                }
            });
            Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(stream)))
        }
    }

    /// Serves `router` on a runtime of its own: dropping the runtime drops its connections,
    /// as a node that died would.
    fn serve(router: tonic::service::Routes) -> (String, tokio::runtime::Runtime) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr").to_string();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder().add_routes(router).serve_with_incoming(incoming).await;
        });
        (addr, runtime)
    }

    fn upstream(addr: &str) -> Upstream {
        let channel = Channel::from_shared(format!("http://{addr}")).expect("uri").connect_lazy();
        let batcher = Some(Arc::new(Batcher::new(addr, &channel, 1)));
        Upstream { channel, batcher }
    }

    async fn create(upstream: Upstream) -> Result<Response<warden_proto::v1::CreateResponse>, Status> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let request = CreateRequest { path: "/x".into(), sequential: true, ..CreateRequest::default() };
        upstream.forward(request, deadline, |mut client, request| async move { client.create(request).await }).await
    }

    fn code_of(status: &Status) -> Code {
        warden_proto::error_of(status).and_then(|e| Code::try_from(e.code).ok()).unwrap_or(Code::Unknown)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sent_calls_of_a_broken_stream_are_outcome_unknown_and_unsent_ones_unavailable() {
        let (received, mut ids) = mpsc::channel(16);
        let (addr, node) = serve(tonic::service::Routes::new(BatchForwardServer::new(Silent { received })));
        let upstream = upstream(&addr);
        let calls: Vec<_> = (0..3).map(|_| tokio::spawn(create(upstream.clone()))).collect();
        for _ in 0..3 {
            tokio::time::timeout(Duration::from_secs(10), ids.recv()).await.expect("the node got the call").expect("open");
        }
        // The node dies with three calls sent and unanswered.
        node.shutdown_background();
        for call in calls {
            let status = call.await.expect("task").expect_err("no answer came");
            assert_eq!(code_of(&status), Code::OutcomeUnknown, "{status:?}");
            assert!(is_link_failure(&status), "a broken stream is the link's failure: {status:?}");
        }
        // Nothing listens now: the next call is never sent, so it may go again.
        let status = create(upstream).await.expect_err("nobody listens");
        assert_eq!(code_of(&status), Code::Unavailable, "{status:?}");
        assert!(is_link_failure(&status), "a stream that cannot open is the link's failure: {status:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_without_the_stream_gets_unary_calls() {
        // A server of no service: the stream and the unary call are both UNIMPLEMENTED, and
        // the answer is the unary call's.
        let (addr, node) = serve(tonic::service::Routes::default());
        let upstream = upstream(&addr);
        let status = create(upstream.clone()).await.expect_err("no such service");
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(!is_link_failure(&status), "the node's own answer is no link failure: {status:?}");
        assert!(upstream.batcher.as_ref().is_some_and(|b| b.unsupported.load(Ordering::Relaxed)), "the node is marked as unbatched");
        node.shutdown_background();
    }
}
