//! Snapshots on a flow of their own.
//!
//! A raft snapshot holds a whole group's data: far more than one gRPC message may carry, and
//! more than the batches of the raft stream should wait behind. Each snapshot goes on its own
//! `RaftTransport/Snapshot` call over its own connection: a header, then the data in chunks
//! of `chunk_bytes`, made one at a time as HTTP/2 flow control pulls them, so the sender holds
//! the snapshot and a few chunks. The receiver reassembles it within its byte budget, checks
//! it and hands the whole message to the group's worker before it answers. The sender reports
//! `Finish` to raft-rs when the receiver took the snapshot and `Failure` on every other
//! outcome (refused, broken stream, malformed, full inbox, timeout), so that raft-rs tries
//! again with a fresh snapshot instead of waiting forever. Both sides bound the snapshots in
//! flight per peer and their bytes per node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use raft::SnapshotStatus;
use tonic::{Status, Streaming};
use warden_proto::transport::{SnapshotChunk, SnapshotDone, SnapshotHeader};

use super::{connect, Inbox, NetFaults, PeerDirectory, TransportEvents, TransportLimits, Verdict};
use crate::error::EngineError;
use crate::storage::snapshot::SnapshotData;

/// The snapshot transfers in flight in one direction of one node, bounded per peer and in
/// bytes.
pub struct Transfers {
    per_peer_max: usize,
    bytes_max: usize,
    state: Mutex<TransferState>,
}

#[derive(Default)]
struct TransferState {
    per_peer: HashMap<u64, usize>,
    bytes: usize,
}

/// One transfer's place in its [`Transfers`], given back when dropped (whatever the outcome).
pub struct Transfer {
    transfers: Arc<Transfers>,
    peer: u64,
    bytes: usize,
}

/// Why a snapshot transfer could not start.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferRefused {
    /// The peer already has as many transfers in flight as allowed.
    #[error("{in_flight} snapshots with node {peer} in flight already (limit {limit})")]
    PeerBusy { peer: u64, in_flight: usize, limit: usize },
    /// The snapshot's bytes do not fit beside those in flight.
    #[error("a snapshot of {bytes} bytes does not fit beside {held} bytes in flight (limit {limit})")]
    TooManyBytes { bytes: usize, held: usize, limit: usize },
}

impl Transfers {
    /// At most `per_peer_max` transfers per peer and `bytes_max` bytes in all.
    pub fn new(per_peer_max: usize, bytes_max: usize) -> Arc<Transfers> {
        Arc::new(Transfers { per_peer_max, bytes_max, state: Mutex::new(TransferState::default()) })
    }

    fn state(&self) -> MutexGuard<'_, TransferState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place for a transfer of `bytes` with `peer`.
    pub fn start(self: &Arc<Self>, peer: u64, bytes: usize) -> Result<Transfer, TransferRefused> {
        let mut state = self.state();
        let in_flight = state.per_peer.get(&peer).copied().unwrap_or(0);
        if in_flight >= self.per_peer_max {
            return Err(TransferRefused::PeerBusy { peer, in_flight, limit: self.per_peer_max });
        }
        if state.bytes.checked_add(bytes).is_none_or(|total| total > self.bytes_max) {
            return Err(TransferRefused::TooManyBytes { bytes, held: state.bytes, limit: self.bytes_max });
        }
        *state.per_peer.entry(peer).or_default() += 1;
        state.bytes += bytes;
        Ok(Transfer { transfers: self.clone(), peer, bytes })
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        let mut state = self.transfers.state();
        state.bytes -= self.bytes;
        if let Some(count) = state.per_peer.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                state.per_peer.remove(&self.peer);
            }
        }
    }
}

/// One snapshot message being sent, with everything its task needs.
pub struct Outgoing {
    /// The sending node.
    pub from: u64,
    /// The snapshot's group.
    pub group: u64,
    /// The raft `MsgSnapshot`.
    pub message: Message,
    /// Where the peer listens.
    pub directory: Arc<PeerDirectory>,
    /// This node's TLS (`None`: plaintext).
    pub tls: Option<Arc<warden_proto::tls::Tls>>,
    /// Fault injection (a lost chunk breaks the stream).
    pub faults: Arc<NetFaults>,
    /// The sending node, told how the transfer ended.
    pub node: Arc<dyn Inbox>,
    /// Where the outcome is counted.
    pub events: Arc<dyn TransportEvents>,
    /// Chunk size, message size and timeouts.
    pub limits: TransportLimits,
    /// The transfer's place among those in flight.
    pub transfer: Transfer,
}

impl Outgoing {
    /// Sends the snapshot, then reports the outcome to raft-rs (always, exactly once).
    pub async fn run(self) {
        let to = self.message.to;
        let index = self.message.get_snapshot().get_metadata().index;
        let bytes = self.message.get_snapshot().data.len();
        let timeout = self.limits.snapshot_timeout(bytes);
        let started = Instant::now();
        let outcome = tokio::time::timeout(timeout, self.send()).await.unwrap_or_else(|_| Err(format!("not taken within {timeout:?}")));
        let (from, group, elapsed) = (self.from, self.group, started.elapsed());
        let status = match outcome {
            Ok(()) => {
                tracing::info!(from, to, group, index, bytes, ?elapsed, "snapshot sent");
                SnapshotStatus::Finish
            }
            Err(error) => {
                tracing::warn!(from, to, group, index, bytes, ?elapsed, %error, "snapshot not delivered");
                SnapshotStatus::Failure
            }
        };
        let node = self.node.clone();
        self.events.snapshot_sent((status == SnapshotStatus::Finish).then_some(bytes));
        // Free the transfer's place first: raft-rs may try again as soon as it hears.
        drop(self);
        report_snapshot(node.as_ref(), group, to, status).await;
    }

    async fn send(&self) -> Result<(), String> {
        let to = self.message.to;
        let mut message = self.message.clone();
        let data = std::mem::take(&mut message.mut_snapshot().data);
        let header = SnapshotHeader {
            from_node: self.from,
            group_id: self.group,
            message: message.write_to_bytes().map_err(|e| format!("encoding the snapshot message: {e}"))?,
            data_bytes: data.len() as u64,
        };
        if self.faults.verdict(self.from, to) == Verdict::Drop {
            return Err("lost by fault injection".into());
        }
        let mut client = connect(&self.directory, to, &self.limits, self.tls.as_ref()).await?;
        let (from, faults, chunk_bytes) = (self.from, self.faults.clone(), self.limits.chunk_bytes.max(1));
        // Chunks are made as the call pulls them. A chunk lost to fault injection ends the
        // stream early, which the receiver refuses as truncated.
        let chunks = futures::stream::unfold((Some(header), 0usize), move |(header, offset)| {
            let done = header.is_none() && (offset >= data.len() || faults.verdict(from, to) == Verdict::Drop);
            let next = (!done).then(|| {
                let end = (offset + chunk_bytes).min(data.len());
                (SnapshotChunk { header, data: data[offset..end].to_vec() }, (None, end))
            });
            futures::future::ready(next)
        });
        client.snapshot(chunks).await.map(drop).map_err(|status| format!("refused: {status}"))
    }
}

/// Tells `group` how sending a snapshot to `to` ended. Unlike other notices this one is never
/// dropped, since raft-rs sends that follower nothing more until it hears: while the group's
/// worker cannot take it, it waits and tries again.
async fn report_snapshot(node: &dyn Inbox, group: u64, to: u64, mut status: SnapshotStatus) {
    while let Err(back) = node.try_report_snapshot(group, to, status) {
        status = back;
        tokio::time::sleep(REPORT_RETRY_PAUSE).await;
    }
}

/// The pause before telling a busy worker again how a snapshot send ended.
const REPORT_RETRY_PAUSE: Duration = Duration::from_millis(10);

/// Receives one snapshot call: reserves its bytes, reassembles and checks it, and hands it to
/// its group's worker. An error status tells the sender to report `Failure`. With TLS on,
/// `sender` is the node the connection's certificate proved: a snapshot from anyone else is
/// refused.
pub async fn receive(
    node: &dyn Inbox,
    events: &dyn TransportEvents,
    transfers: &Arc<Transfers>,
    limits: &TransportLimits,
    stream: Streaming<SnapshotChunk>,
    sender: Option<u64>,
) -> Result<SnapshotDone, Status> {
    let taken = take(node, transfers, limits, stream, sender).await;
    events.snapshot_received(taken.as_ref().ok().copied());
    taken.map(|_| SnapshotDone {})
}

/// [`receive`]'s work: the snapshot's bytes once its worker took it.
async fn take(
    node: &dyn Inbox,
    transfers: &Arc<Transfers>,
    limits: &TransportLimits,
    mut stream: Streaming<SnapshotChunk>,
    sender: Option<u64>,
) -> Result<usize, Status> {
    let first = stream.message().await?.ok_or_else(|| Status::invalid_argument("snapshot call without a header"))?;
    let header = first.header.ok_or_else(|| Status::invalid_argument("first snapshot chunk without a header"))?;
    let (from, group) = (header.from_node, header.group_id);
    if sender.is_some_and(|sender| sender != from) {
        return Err(Status::permission_denied(format!("node {sender:?} sent a snapshot as node {from}")));
    }
    let bytes = usize::try_from(header.data_bytes).map_err(|_| Status::resource_exhausted(format!("snapshot of {} bytes", header.data_bytes)))?;
    let _transfer = transfers.start(from, bytes).map_err(|refused| Status::resource_exhausted(refused.to_string()))?;
    let timeout = limits.snapshot_timeout(bytes);
    let data = tokio::time::timeout(timeout, reassemble(first.data, &mut stream, bytes))
        .await
        .map_err(|_| Status::deadline_exceeded(format!("snapshot of {bytes} bytes not received within {timeout:?}")))??;
    let mut message = Message::parse_from_bytes(&header.message).map_err(|e| Status::invalid_argument(format!("snapshot message: {e}")))?;
    if message.get_msg_type() != MessageType::MsgSnapshot || message.from != from {
        return Err(Status::invalid_argument(format!("not a snapshot from node {from}: {:?} from {}", message.get_msg_type(), message.from)));
    }
    SnapshotData::validate(&data).map_err(|error| Status::invalid_argument(error.to_string()))?;
    let index = message.get_snapshot().get_metadata().index;
    message.mut_snapshot().data = data.into();
    node.deliver(group, message).map_err(|error| match error {
        EngineError::Stopped => Status::unavailable(error.to_string()),
        error => Status::resource_exhausted(error.to_string()),
    })?;
    tracing::info!(node = node.node_id(), from, group, index, bytes, "snapshot received");
    Ok(bytes)
}

/// The data of a snapshot call: exactly `bytes`, in chunks after the header's own.
async fn reassemble(first: Vec<u8>, stream: &mut Streaming<SnapshotChunk>, bytes: usize) -> Result<Vec<u8>, Status> {
    // `bytes` is reserved in the node's budget, so allocating it at once is bounded.
    let mut data = Vec::with_capacity(bytes);
    let mut piece = Some(first);
    loop {
        if let Some(piece) = piece.take() {
            if data.len() + piece.len() > bytes {
                return Err(Status::invalid_argument(format!("snapshot data exceeds the {bytes} bytes announced")));
            }
            data.extend_from_slice(&piece);
        }
        match stream.message().await? {
            Some(SnapshotChunk { header: Some(_), .. }) => return Err(Status::invalid_argument("a second snapshot header")),
            Some(chunk) => piece = Some(chunk.data),
            None => break,
        }
    }
    if data.len() != bytes {
        return Err(Status::invalid_argument(format!("snapshot stream ended after {} of {bytes} bytes", data.len())));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use crossbeam_channel::{Receiver, Sender, TrySendError};

    use super::*;

    const GROUP: u64 = 7;

    /// What reached a test node's groups.
    enum Received {
        Raft { group: u64, message: Message },
        SnapshotStatus { group: u64, status: SnapshotStatus },
    }

    /// A node whose groups all live behind one bounded queue, as a worker's inbox does.
    struct Queue {
        node_id: u64,
        sender: Sender<Received>,
    }

    impl Inbox for Queue {
        fn node_id(&self) -> u64 {
            self.node_id
        }

        fn deliver(&self, group: u64, message: Message) -> Result<(), EngineError> {
            self.sender.try_send(Received::Raft { group, message }).map_err(|_| EngineError::busy("inbox full"))
        }

        fn report_unreachable(&self, _group: u64, _to: u64) {}

        fn try_report_snapshot(&self, group: u64, _to: u64, status: SnapshotStatus) -> Result<(), SnapshotStatus> {
            match self.sender.try_send(Received::SnapshotStatus { group, status }) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => Ok(()),
                Err(TrySendError::Full(_)) => Err(status),
            }
        }
    }

    /// Counts nothing: these tests read what the groups were told.
    struct Uncounted;

    impl TransportEvents for Uncounted {
        fn snapshot_sent(&self, _: Option<usize>) {}
        fn snapshot_received(&self, _: Option<usize>) {}
        fn message_dropped(&self, _: u64) {}
    }

    fn node(node_id: u64, sender: Sender<Received>) -> Arc<dyn Inbox> {
        Arc::new(Queue { node_id, sender })
    }

    fn limits() -> TransportLimits {
        // Small chunks so that a small snapshot still travels in many; one transfer per peer.
        TransportLimits { chunk_bytes: 16 << 10, snapshots_per_peer_max: 1, ..TransportLimits::default() }
    }

    /// Node 2's transport server, its one worker's inbox holding `inbox_msgs`.
    async fn receiver(directory: &PeerDirectory, inbox_msgs: usize) -> Receiver<Received> {
        let (sender, inbox) = crossbeam_channel::bounded(inbox_msgs);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        directory.insert(2, listener.local_addr().expect("address"));
        let service = super::super::server::RaftTransportService::server(node(2, sender), Arc::new(Uncounted), limits());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
        inbox
    }

    fn snapshot_message(to: u64, data: Vec<u8>) -> Message {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgSnapshot);
        (message.from, message.to, message.term) = (1, to, 3);
        let snapshot = message.mut_snapshot();
        (snapshot.mut_metadata().index, snapshot.mut_metadata().term) = (42, 3);
        snapshot.data = data.into();
        message
    }

    /// Sends `message` from node 1 as its transport does; returns what raft-rs was told.
    async fn send(directory: &Arc<PeerDirectory>, transfers: &Arc<Transfers>, limits: TransportLimits, message: Message) -> SnapshotStatus {
        let (sender, inbox) = crossbeam_channel::bounded(4);
        let transfer = transfers.start(message.to, message.get_snapshot().data.len()).expect("a free place");
        let (node, events) = (node(1, sender), Arc::new(Uncounted));
        let outgoing = Outgoing {
            from: 1,
            group: GROUP,
            message,
            directory: directory.clone(),
            tls: None,
            faults: Arc::default(),
            node,
            events,
            limits,
            transfer,
        };
        outgoing.run().await;
        match inbox.try_recv() {
            Ok(Received::SnapshotStatus { group: GROUP, status }) => status,
            _ => panic!("raft was not told how the snapshot ended"),
        }
    }

    fn valid_data() -> Vec<u8> {
        SnapshotData { pairs: (0..40u8).map(|i| (vec![i], vec![i; 10_000])).collect(), conf_fence: 0 }.encode()
    }

    #[tokio::test]
    async fn malformed_truncated_refused_and_timed_out_snapshots_are_failures_and_the_next_attempt_is_taken() {
        let directory = Arc::new(PeerDirectory::new());
        let inbox = receiver(&directory, 1).await;
        let transfers = Transfers::new(1, 1 << 30);

        // Malformed data: the receiver refuses it, raft hears Failure, the group sees nothing.
        assert_eq!(send(&directory, &transfers, limits(), snapshot_message(2, b"not a snapshot".to_vec())).await, SnapshotStatus::Failure);
        assert!(inbox.is_empty());

        // A stream that ends before the data the header announced (a sender gone mid-way).
        let mut client = connect(&directory, 2, &limits(), None).await.expect("connect");
        let message = snapshot_message(2, Vec::new()).write_to_bytes().expect("encode");
        let header = SnapshotHeader { from_node: 1, group_id: GROUP, message, data_bytes: 1000 };
        let truncated = futures::stream::iter([SnapshotChunk { header: Some(header), data: vec![0; 10] }]);
        let status = client.snapshot(truncated).await.expect_err("a truncated snapshot is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
        assert!(inbox.is_empty());

        // The next attempt is taken whole, though a peer has only one transfer at a time on
        // either side: the failed ones gave their places back.
        let data = valid_data();
        assert_eq!(send(&directory, &transfers, limits(), snapshot_message(2, data.clone())).await, SnapshotStatus::Finish);
        match inbox.try_recv() {
            Ok(Received::Raft { group: GROUP, message }) => {
                assert_eq!(message.get_snapshot().get_metadata().index, 42);
                assert!(message.get_snapshot().data[..] == data[..], "the group got the snapshot's data unchanged");
            }
            _ => panic!("the snapshot did not reach its group"),
        }

        // A full inbox refuses it: Failure, not a snapshot silently lost.
        assert_eq!(send(&directory, &transfers, limits(), snapshot_message(2, data.clone())).await, SnapshotStatus::Finish);
        assert_eq!(send(&directory, &transfers, limits(), snapshot_message(2, data.clone())).await, SnapshotStatus::Failure);

        // A peer that never answers: Failure at the timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        directory.insert(3, silent.local_addr().expect("address"));
        let impatient = TransportLimits { snapshot_timeout_min: Duration::from_millis(300), ..limits() };
        assert_eq!(send(&directory, &transfers, impatient, snapshot_message(3, data)).await, SnapshotStatus::Failure);
    }

    #[test]
    fn transfers_are_bounded_per_peer_and_in_bytes() {
        let transfers = Transfers::new(1, 100);
        let first = transfers.start(1, 60).expect("room");
        assert!(matches!(transfers.start(1, 1), Err(TransferRefused::PeerBusy { .. })));
        assert!(matches!(transfers.start(2, 41), Err(TransferRefused::TooManyBytes { .. })));
        let second = transfers.start(2, 40).expect("room");
        drop(first);
        drop(second);
        assert!(transfers.start(1, 100).is_ok(), "places come back when transfers end");
    }
}
