//! A test client of the `Watch` stream: one stream to one node, requests sent in-band,
//! responses read with a timeout, and conversion to the validators' event records.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::Channel;
use warden_loadgen::watch_check::{self, EventKind};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::watch_event::Type;
use warden_proto::v1::watch_request::Request as WatchRequestKind;
use warden_proto::v1::*;

/// Requests a test may queue on one stream before `send` waits.
const REQUESTS_QUEUED_MAX: usize = 1024;

/// One open `Watch` stream.
pub struct WatchConn {
    requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
}

impl WatchConn {
    /// Opens a stream to the node at `addr`.
    pub async fn open(addr: SocketAddr) -> Result<WatchConn, tonic::Status> {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| tonic::Status::internal(e.to_string()))?
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        WatchConn::over(WardenClient::new(channel)).await
    }

    /// Opens a watch stream with `client` (its channel's TLS and identity).
    pub async fn over(client: WardenClient<Channel>) -> Result<WatchConn, tonic::Status> {
        let (requests, outgoing) = mpsc::channel(REQUESTS_QUEUED_MAX);
        let responses = client.max_decoding_message_size(64 << 20).watch(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await?.into_inner();
        Ok(WatchConn { requests, responses })
    }

    /// Sends a request.
    pub async fn send(&self, request: WatchRequestKind) {
        // A closed stream shows on the next read.
        let _ = self.requests.send(WatchRequest { request: Some(request) }).await;
    }

    /// Creates a watch and returns the answer (created or canceled), skipping nothing else:
    /// call it before other watches of the stream have events.
    pub async fn create(&mut self, create: WatchCreate) -> Result<WatchResponse, tonic::Status> {
        self.send(WatchRequestKind::Create(create)).await;
        self.next(Duration::from_secs(10)).await?.ok_or_else(|| tonic::Status::deadline_exceeded("no answer to the creation"))
    }

    /// The next response: `Ok(None)` when none comes within `timeout`, `Err` when the
    /// stream ended or failed.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<WatchResponse>, tonic::Status> {
        match tokio::time::timeout(timeout, self.responses.message()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(response))) => Ok(Some(response)),
            Ok(Ok(None)) => Err(tonic::Status::unavailable("the stream ended")),
            Ok(Err(status)) => Err(status),
        }
    }
}

/// A persistent watch of `path` (recursive when asked) from `start_revision`.
pub fn persistent(path: &str, recursive: bool, start_revision: u64) -> WatchCreate {
    WatchCreate { path: path.into(), recursive, start_revision, ..WatchCreate::default() }
}

/// The events of a response as the validators take them.
pub fn events_of(response: &WatchResponse) -> Vec<watch_check::Event> {
    response
        .events
        .iter()
        .map(|event| watch_check::Event {
            revision: event.revision,
            path: event.path.clone(),
            kind: match Type::try_from(event.r#type) {
                Ok(Type::Created) => EventKind::Created,
                Ok(Type::Changed) => EventKind::Changed,
                Ok(Type::Deleted) | Err(_) => EventKind::Deleted,
            },
            data: event.data.to_vec(),
        })
        .collect()
}
