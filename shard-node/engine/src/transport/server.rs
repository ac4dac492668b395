//! The receiving side of the raft transport: a gRPC service that decodes each envelope and
//! hands the message to the worker owning its group.

use std::sync::Arc;

use protobuf::Message as _;
use raft::eraftpb::Message;
use tonic::{Request, Response, Status, Streaming};
use warden_proto::tls::calling_node;
use warden_proto::transport::raft_envelope::Body;
use warden_proto::transport::raft_transport_server::{RaftTransport, RaftTransportServer};
use warden_proto::transport::{RaftBatch, RaftEnvelope, SnapshotChunk, SnapshotDone, StreamDone};

use super::chunk::{Assembler, ChunkError};
use super::snapshot::{self, Transfers};
use super::TransportLimits;
use super::{Inbox, TransportEvents};

/// The raft transport service of one node.
pub struct RaftTransportService {
    node: Arc<dyn Inbox>,
    events: Arc<dyn TransportEvents>,
    limits: TransportLimits,
    /// Snapshots being received.
    snapshots: Arc<Transfers>,
}

impl RaftTransportService {
    /// The service delivering to `node` and counting into `events`, wrapped for tonic with the
    /// transport's message-size limits.
    pub fn server(node: Arc<dyn Inbox>, events: Arc<dyn TransportEvents>, limits: TransportLimits) -> RaftTransportServer<RaftTransportService> {
        let snapshots = Transfers::new(limits.snapshots_per_peer_max, limits.snapshot_bytes_in_flight_max);
        RaftTransportServer::new(RaftTransportService { node, events, limits, snapshots })
            .max_decoding_message_size(limits.grpc_message_bytes_max)
            .max_encoding_message_size(limits.grpc_message_bytes_max)
    }

    /// Hands `batch`'s messages to their workers. With TLS on, `sender` is the node the
    /// connection's certificate proved: a batch or a message claiming to come from another
    /// node ends the stream (a node cannot speak for another).
    fn deliver(&self, batch: RaftBatch, assembler: &mut Assembler, sender: Option<u64>) -> Result<(), Status> {
        let impostor = |claimed: u64| Status::permission_denied(format!("node {sender:?} sent a raft message as node {claimed}"));
        if sender.is_some_and(|sender| sender != batch.from_node) {
            return Err(impostor(batch.from_node));
        }
        for envelope in batch.envelopes {
            match decode_envelope(envelope, assembler) {
                Ok(Some((_, message))) if sender.is_some_and(|sender| sender != message.from) => return Err(impostor(message.from)),
                // A full inbox loses the message: raft retransmits.
                Ok(Some((group, message))) => drop(self.node.deliver(group, message)),
                Ok(None) => {}
                Err(error) => tracing::warn!(from = batch.from_node, %error, "dropping raft message"),
            }
        }
        Ok(())
    }
}

/// Why a received envelope gives no message (it is dropped; raft resends).
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// A chunk did not fit its message (the partial message is discarded).
    #[error("chunked message: {0}")]
    Chunk(#[from] ChunkError),
    /// The bytes are not a raft-proto message.
    #[error("undecodable raft message: {0}")]
    Decode(#[from] protobuf::ProtobufError),
}

/// The group and raft message an envelope completes: `Ok(None)` for a chunk of a message not
/// complete yet (held by `assembler`) or an envelope without a body. The inverse of
/// [`super::encode_message`]; public for the micro-benchmarks in the workspace's `benches/`.
pub fn decode_envelope(envelope: RaftEnvelope, assembler: &mut Assembler) -> Result<Option<(u64, Message)>, EnvelopeError> {
    let bytes = match envelope.body {
        Some(Body::Message(bytes)) => bytes,
        Some(Body::Chunk(chunk)) => match assembler.push(chunk)? {
            Some(bytes) => bytes,
            None => return Ok(None),
        },
        None => return Ok(None),
    };
    Ok(Some((envelope.group_id, Message::parse_from_bytes(&bytes)?)))
}

#[tonic::async_trait]
impl RaftTransport for RaftTransportService {
    async fn stream(&self, request: Request<Streaming<RaftBatch>>) -> Result<Response<StreamDone>, Status> {
        let sender = calling_node(&request)?;
        let mut stream = request.into_inner();
        let mut assembler = Assembler::new(self.limits.assembly_bytes_max);
        while let Some(batch) = stream.message().await? {
            if let Err(status) = self.deliver(batch, &mut assembler, sender) {
                tracing::warn!(node = self.node.node_id(), %status, "raft stream refused");
                return Err(status);
            }
        }
        Ok(Response::new(StreamDone {}))
    }

    async fn snapshot(&self, request: Request<Streaming<SnapshotChunk>>) -> Result<Response<SnapshotDone>, Status> {
        let sender = calling_node(&request)?;
        let received = snapshot::receive(self.node.as_ref(), self.events.as_ref(), &self.snapshots, &self.limits, request.into_inner(), sender).await;
        if let Err(status) = &received {
            tracing::warn!(node = self.node.node_id(), %status, "snapshot refused");
        }
        received.map(Response::new)
    }
}
