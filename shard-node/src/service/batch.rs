//! `warden.batch.BatchForward`: a router's long-lived stream of unary calls to this node.
//! Each item is decoded by its method and handed to the same [`Warden`] method a unary call
//! reaches (with the item's time left as its `grpc-timeout`), so the stream changes how
//! calls travel, never what they do. Items run concurrently (a waiting `Lock` holds back
//! nothing); once [`BATCH_ITEMS_IN_FLIGHT_MAX`] of a stream are in flight its next message is
//! not read until some finish (backpressure; a router sends no more than that); results go back as soon as they are ready, coalesced into
//! messages of at most [`BATCH_ITEMS_MAX`] items and about [`BATCH_BYTES_MAX`] bytes.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures::future::{AbortHandle, Abortable};
use futures::stream::{FuturesUnordered, StreamExt as _};
use prost::bytes::Bytes;
use prost::Message;
use tonic::{Request, Response, Status, Streaming};
use warden_proto::batch::batch_forward_server::{BatchForward, BatchForwardServer};
use warden_proto::batch::item_result::Result as ItemOutcome;
use warden_proto::batch::{BatchRequest, BatchResponse, Item, ItemError, ItemResult, Method};
use warden_proto::tls::{PeerInfo, PRINCIPAL_HEADER};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::warden_server::Warden;
use warden_proto::v1::WardenError;
use warden_proto::{BATCH_BYTES_MAX, BATCH_ITEMS_IN_FLIGHT_MAX, BATCH_ITEMS_MAX};

use super::{status, WardenService, REQUEST_BYTES_MAX, RESPONSE_BYTES_MAX};

/// Response messages queued on one stream before its items wait for the router to read.
const RESPONSES_QUEUED_MAX: usize = 4;
/// Largest batch message accepted: a full batch plus one item of the largest size.
const BATCH_REQUEST_BYTES_MAX: usize = BATCH_BYTES_MAX + REQUEST_BYTES_MAX + (64 << 10);
/// Largest batch message sent: a full batch plus one response of the largest size.
const BATCH_RESPONSE_BYTES_MAX: usize = BATCH_BYTES_MAX + RESPONSE_BYTES_MAX + (64 << 10);

impl WardenService {
    /// The batch stream over this service, wrapped for tonic with its message-size limits.
    pub fn batch_server(self) -> BatchForwardServer<WardenService> {
        BatchForwardServer::new(self).max_decoding_message_size(BATCH_REQUEST_BYTES_MAX).max_encoding_message_size(BATCH_RESPONSE_BYTES_MAX)
    }
}

#[tonic::async_trait]
impl BatchForward for WardenService {
    type ForwardStream = tokio_stream::wrappers::ReceiverStream<Result<BatchResponse, Status>>;

    async fn forward(&self, request: Request<Streaming<BatchRequest>>) -> Result<Response<Self::ForwardStream>, Status> {
        let (responses, stream) = tokio::sync::mpsc::channel(RESPONSES_QUEUED_MAX);
        // Each item is judged as a unary call over this stream's connection would be.
        let peer = request.extensions().get::<PeerInfo>().cloned();
        tokio::spawn(serve(self.clone(), peer, request.into_inner(), responses));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(stream)))
    }
}

/// One item's handling, abortable by a cancel; its id and result.
type Running = futures::future::BoxFuture<'static, Option<ItemResult>>;

/// Serves one batch stream until the router closes it and every item is answered, or until
/// the router goes away (then the items in flight are dropped, as the unary calls of a
/// client that hung up are).
async fn serve(
    service: WardenService,
    peer: Option<PeerInfo>,
    mut incoming: Streaming<BatchRequest>,
    responses: tokio::sync::mpsc::Sender<Result<BatchResponse, Status>>,
) {
    let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
    let mut aborts: HashMap<u64, AbortHandle> = HashMap::new();
    let mut ready: Vec<ItemResult> = Vec::new();
    let mut reading = true;
    loop {
        tokio::select! {
            // Finished items first: whatever is done by the time the writer can send goes
            // in one message.
            biased;
            Some(done) = running.next(), if !running.is_empty() && ready.len() < BATCH_ITEMS_MAX => {
                if let Some(result) = done {
                    aborts.remove(&result.id);
                    ready.push(result);
                }
            }
            permit = responses.reserve(), if !ready.is_empty() => {
                let Ok(permit) = permit else { return };
                permit.send(Ok(BatchResponse { results: take_batch(&mut ready) }));
            }
            message = incoming.message(), if reading && running.len() < BATCH_ITEMS_IN_FLIGHT_MAX => match message {
                Ok(Some(batch)) => {
                    for id in batch.cancels {
                        if let Some(abort) = aborts.remove(&id) {
                            abort.abort();
                        }
                    }
                    for item in batch.items {
                        let (abort, registration) = AbortHandle::new_pair();
                        aborts.insert(item.id, abort);
                        let handling = Abortable::new(answer(service.clone(), peer.clone(), item), registration);
                        running.push(Box::pin(async move { handling.await.ok() }));
                    }
                }
                // The router is done sending: answer what is in flight, then end.
                Ok(None) => reading = false,
                // The router's stream broke: nobody is left to answer.
                Err(_) => return,
            },
            else => return,
        }
    }
}

/// The first results of `ready`, up to [`BATCH_ITEMS_MAX`] items and about
/// [`BATCH_BYTES_MAX`] bytes (at least one).
fn take_batch(ready: &mut Vec<ItemResult>) -> Vec<ItemResult> {
    let mut bytes = 0;
    let mut count = 0;
    for result in ready.iter().take(BATCH_ITEMS_MAX) {
        if count > 0 && bytes + result.encoded_len() > BATCH_BYTES_MAX {
            break;
        }
        bytes += result.encoded_len();
        count += 1;
    }
    ready.drain(..count).collect()
}

/// How one item's unary call is made: its deadline, and whom it is for.
struct ItemCall {
    timeout: Option<Duration>,
    /// The stream's connection.
    peer: Option<PeerInfo>,
    /// The principal the router named for the item.
    principal: String,
}

/// Handles one item with the unary method it names, as a call over `peer`'s connection.
async fn answer(service: WardenService, peer: Option<PeerInfo>, item: Item) -> ItemResult {
    let Item { id, method, request, timeout_us, principal } = item;
    let timeout = (timeout_us > 0).then(|| Duration::from_micros(timeout_us));
    let context = &ItemCall { timeout, peer, principal };
    let outcome = if request.len() > REQUEST_BYTES_MAX {
        let message = format!("a request has at most {REQUEST_BYTES_MAX} bytes; this one has {}", request.len());
        Err(status(WardenError { limit: REQUEST_BYTES_MAX as u64, ..warden_proto::warden_error(Code::TooLarge, "", message) }))
    } else {
        let service = &service;
        match Method::try_from(method).unwrap_or(Method::Unspecified) {
            Method::Create => call(request, context, |r| service.create(r)).await,
            Method::Get => call(request, context, |r| service.get(r)).await,
            Method::Exists => call(request, context, |r| service.exists(r)).await,
            Method::Set => call(request, context, |r| service.set(r)).await,
            Method::Delete => call(request, context, |r| service.delete(r)).await,
            Method::GetChildren => call(request, context, |r| service.get_children(r)).await,
            Method::Txn => call(request, context, |r| service.txn(r)).await,
            Method::Sync => call(request, context, |r| service.sync(r)).await,
            Method::CreateSession => call(request, context, |r| service.create_session(r)).await,
            Method::KeepAlive => call(request, context, |r| service.keep_alive(r)).await,
            Method::CloseSession => call(request, context, |r| service.close_session(r)).await,
            Method::SessionInfo => call(request, context, |r| service.session_info(r)).await,
            Method::Lock => call(request, context, |r| service.lock(r)).await,
            Method::Unlock => call(request, context, |r| service.unlock(r)).await,
            Method::CheckSequencer => call(request, context, |r| service.check_sequencer(r)).await,
            Method::LockInfo => call(request, context, |r| service.lock_info(r)).await,
            Method::Put => call(request, context, |r| service.put(r)).await,
            Method::Range => call(request, context, |r| service.range(r)).await,
            Method::DeleteRange => call(request, context, |r| service.delete_range(r)).await,
            Method::Unspecified => Err(Status::unimplemented(format!("no batchable method {method}"))),
        }
    };
    let result = match outcome {
        Ok(response) => ItemOutcome::Ok(response),
        Err(status) => ItemOutcome::Error(ItemError {
            code: status.code() as i32,
            message: status.message().to_string(),
            details: status.details().to_vec().into(),
        }),
    };
    ItemResult { id, result: Some(result) }
}

/// Decodes `request`, calls `method` with it as a unary call that carries `timeout` as its
/// `grpc-timeout`, and encodes the answer; refused as tonic refuses it on the unary path
/// (INTERNAL for a request that does not decode, OUT_OF_RANGE for a response above the
/// unary path's limit).
async fn call<Req, Resp, F, Fut>(request: Bytes, context: &ItemCall, method: F) -> Result<Bytes, Status>
where
    Req: Message + Default,
    Resp: Message,
    F: FnOnce(Request<Req>) -> Fut,
    Fut: Future<Output = Result<Response<Resp>, Status>>,
{
    let message = Req::decode(request).map_err(|e| Status::internal(format!("failed to decode Protobuf message: {e}")))?;
    let mut request = Request::new(message);
    if let Some(timeout) = context.timeout {
        request.set_timeout(timeout);
    }
    if let Some(peer) = &context.peer {
        request.extensions_mut().insert(peer.clone());
    }
    if let Ok(principal) = context.principal.parse() {
        request.metadata_mut().insert(PRINCIPAL_HEADER, principal);
    }
    let response = method(request).await?.into_inner();
    let len = response.encoded_len();
    if len > RESPONSE_BYTES_MAX {
        return Err(Status::out_of_range(format!(
            "Error, encoded message length too large: found {len} bytes, the limit is: {RESPONSE_BYTES_MAX} bytes"
        )));
    }
    Ok(response.encode_to_vec().into())
}
