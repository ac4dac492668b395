//! Node-to-node raft transport: one long-lived gRPC stream per ordered pair of nodes,
//! carrying batches of messages of every group (group id + opaque raft-proto bytes).
//!
//! Sending never blocks the host loop: each peer has a bounded queue drained by its own
//! task; a full queue or a broken stream loses messages and reports the peer unreachable
//! to raft, which retransmits. Streams reconnect with backoff. Snapshots travel apart, each
//! on a call of its own (`snapshot.rs`).

pub mod chunk;
pub mod faults;
pub mod inbox;
pub mod server;
pub mod snapshot;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use tokio::sync::mpsc;
use warden_proto::channel::ChannelSettings;
use warden_proto::tls::{Expected, Tls};
use warden_proto::transport::raft_envelope::Body;
use warden_proto::transport::raft_transport_client::RaftTransportClient;
use warden_proto::transport::{RaftBatch, RaftEnvelope};

pub use faults::{NetFaults, Verdict};
pub use inbox::{Inbox, TransportEvents};

/// Where the host loop sends raft messages. `Err` hands back a message that could not be
/// queued; the host reports the peer unreachable.
pub trait RaftSender: Send + Sync {
    /// Queues `message` of `group` for its destination without blocking.
    #[allow(clippy::result_large_err, reason = "the message is handed back unboxed: a queue-full refusal must cost no allocation on the send path")]
    fn send(&self, group: u64, message: Message) -> Result<(), Message>;
}

/// Limits of the transport.
#[derive(Clone, Copy, Debug)]
pub struct TransportLimits {
    /// Messages queued for one peer before new ones are dropped.
    pub queue_msgs_max: usize,
    /// Bytes of one batch on the wire (a single larger message still goes alone).
    pub batch_bytes_max: usize,
    /// Messages larger than this are sent in chunks of this size; snapshot data travels in
    /// chunks of this size too, one per gRPC message.
    pub chunk_bytes: usize,
    /// Largest gRPC message accepted or sent.
    pub grpc_message_bytes_max: usize,
    /// Bytes of partial chunked messages one stream may hold.
    pub assembly_bytes_max: usize,
    /// Snapshots a node sends to one peer at once, and receives from one peer at once.
    pub snapshots_per_peer_max: usize,
    /// Bytes of the snapshots a node sends at once, and separately of those it receives at
    /// once (so also the largest snapshot it takes).
    pub snapshot_bytes_in_flight_max: usize,
    /// A snapshot transfer fails after this long plus its size at
    /// `snapshot_rate_min_bytes_per_sec`.
    pub snapshot_timeout_min: Duration,
    /// The slowest transfer rate a snapshot is given time for.
    pub snapshot_rate_min_bytes_per_sec: usize,
}

impl TransportLimits {
    /// How long a snapshot of `bytes` may take to send (and to receive) before it fails.
    pub fn snapshot_timeout(&self, bytes: usize) -> Duration {
        self.snapshot_timeout_min + Duration::from_secs_f64(bytes as f64 / self.snapshot_rate_min_bytes_per_sec.max(1) as f64)
    }
}

impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits {
            queue_msgs_max: 16384,
            batch_bytes_max: 2 << 20,
            chunk_bytes: 1 << 20,
            grpc_message_bytes_max: 8 << 20,
            assembly_bytes_max: 640 << 20,
            snapshots_per_peer_max: 2,
            snapshot_bytes_in_flight_max: 1 << 30,
            snapshot_timeout_min: Duration::from_secs(10),
            snapshot_rate_min_bytes_per_sec: 1 << 20,
        }
    }
}

/// Where each node listens. Shared by the nodes of a cluster; updated when a node moves.
#[derive(Debug, Default)]
pub struct PeerDirectory {
    addrs: RwLock<HashMap<u64, SocketAddr>>,
}

impl PeerDirectory {
    /// An empty directory.
    pub fn new() -> PeerDirectory {
        PeerDirectory::default()
    }

    /// Records that `node` listens on `addr`.
    pub fn insert(&self, node: u64, addr: SocketAddr) {
        self.addrs.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(node, addr);
    }

    /// Where `node` listens.
    pub fn get(&self, node: u64) -> Option<SocketAddr> {
        self.addrs.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(&node).copied()
    }

    /// Every node known, in id order.
    pub fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.addrs.read().unwrap_or_else(std::sync::PoisonError::into_inner).keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

struct Outgoing {
    group: u64,
    message: Message,
}

/// Counters of a node's sending side, readable while it runs.
#[derive(Debug, Default)]
pub struct TransportMetrics {
    /// Raft messages handed to the transport (snapshots included).
    pub messages_sent: AtomicU64,
    /// Of those, leader heartbeats (`MsgHeartbeat`): what an idle group costs its peers.
    pub heartbeats_sent: AtomicU64,
}

/// The sending side of a node's transport.
pub struct Transport {
    node_id: u64,
    directory: Arc<PeerDirectory>,
    faults: Arc<NetFaults>,
    node: Arc<dyn Inbox>,
    events: Arc<dyn TransportEvents>,
    runtime: tokio::runtime::Handle,
    limits: TransportLimits,
    /// This node's TLS: every connection to a peer presents its certificate and
    /// accepts only that peer's (`None`: plaintext).
    tls: Option<Arc<Tls>>,
    peers: Mutex<HashMap<u64, mpsc::Sender<Outgoing>>>,
    next_message_id: Arc<AtomicU64>,
    /// Snapshots being sent.
    snapshots: Arc<snapshot::Transfers>,
    metrics: Arc<TransportMetrics>,
}

impl Transport {
    /// A transport for `node`, counting into `events`, spawning its peer tasks on `runtime`.
    pub fn new(
        node: Arc<dyn Inbox>,
        events: Arc<dyn TransportEvents>,
        directory: Arc<PeerDirectory>,
        faults: Arc<NetFaults>,
        runtime: tokio::runtime::Handle,
        limits: TransportLimits,
        tls: Option<Arc<Tls>>,
    ) -> Transport {
        Transport {
            node_id: node.node_id(),
            directory,
            faults,
            node,
            events,
            runtime,
            limits,
            tls,
            peers: Mutex::new(HashMap::new()),
            next_message_id: Arc::new(AtomicU64::new(1)),
            snapshots: snapshot::Transfers::new(limits.snapshots_per_peer_max, limits.snapshot_bytes_in_flight_max),
            metrics: Arc::default(),
        }
    }

    /// The transport's counters.
    pub fn metrics(&self) -> Arc<TransportMetrics> {
        self.metrics.clone()
    }

    /// Sends a snapshot on a call of its own (see `snapshot.rs`).
    fn spawn_snapshot(&self, group: u64, message: Message, transfer: snapshot::Transfer) {
        let outgoing = snapshot::Outgoing {
            from: self.node_id,
            group,
            message,
            directory: self.directory.clone(),
            faults: self.faults.clone(),
            node: self.node.clone(),
            events: self.events.clone(),
            limits: self.limits,
            tls: self.tls.clone(),
            transfer,
        };
        self.runtime.spawn(outgoing.run());
    }

    fn peer_queue(&self, peer: u64) -> mpsc::Sender<Outgoing> {
        let mut peers = self.peers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        peers
            .entry(peer)
            .or_insert_with(|| {
                let (sender, receiver) = mpsc::channel(self.limits.queue_msgs_max);
                let task = PeerTask {
                    from: self.node_id,
                    to: peer,
                    directory: self.directory.clone(),
                    faults: self.faults.clone(),
                    node: self.node.clone(),
                    limits: self.limits,
                    tls: self.tls.clone(),
                    next_message_id: self.next_message_id.clone(),
                };
                self.runtime.spawn(task.run(receiver));
                sender
            })
            .clone()
    }
}

impl RaftSender for Transport {
    fn send(&self, group: u64, message: Message) -> Result<(), Message> {
        self.metrics.messages_sent.fetch_add(1, Ordering::Relaxed);
        if message.get_msg_type() == MessageType::MsgHeartbeat {
            self.metrics.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
        }
        if message.get_msg_type() == MessageType::MsgSnapshot {
            // Handed back when too many are in flight: the host reports the failure to raft,
            // which tries again later.
            let (to, bytes) = (message.to, message.get_snapshot().data.len());
            return match self.snapshots.start(to, bytes) {
                Ok(transfer) => {
                    self.spawn_snapshot(group, message, transfer);
                    Ok(())
                }
                Err(refused) => {
                    tracing::warn!(from = self.node_id, to, group, bytes, %refused, "snapshot not sent");
                    self.events.snapshot_sent(None);
                    Err(message)
                }
            };
        }
        let to = message.to;
        let queue = self.peer_queue(to);
        queue.try_send(Outgoing { group, message }).map_err(|error| {
            self.events.message_dropped(to);
            match error {
                mpsc::error::TrySendError::Full(outgoing) | mpsc::error::TrySendError::Closed(outgoing) => outgoing.message,
            }
        })
    }
}

/// Appends the envelopes of `group`'s raft `message` to `batch`: one envelope when its
/// encoding fits in `chunk_bytes`, else chunks under a fresh id from `next_message_id`.
/// Returns the message's encoded bytes. Public (with [`server::decode_envelope`], its
/// inverse) for the micro-benchmarks in the workspace's `benches/`.
pub fn encode_message(group: u64, message: &Message, chunk_bytes: usize, next_message_id: &AtomicU64, batch: &mut Vec<RaftEnvelope>) -> usize {
    let bytes = message.write_to_bytes().unwrap_or_default();
    let size = bytes.len();
    if size <= chunk_bytes {
        batch.push(RaftEnvelope { group_id: group, body: Some(Body::Message(bytes)) });
    } else {
        let id = next_message_id.fetch_add(1, Ordering::Relaxed);
        for chunk in chunk::split(id, &bytes, chunk_bytes) {
            batch.push(RaftEnvelope { group_id: group, body: Some(Body::Chunk(chunk)) });
        }
    }
    size
}

/// A new connection to node `to`'s transport (with `tls`, to the holder of node `to`'s
/// certificate only).
async fn connect(
    directory: &PeerDirectory,
    to: u64,
    limits: &TransportLimits,
    tls: Option<&Arc<Tls>>,
) -> Result<RaftTransportClient<tonic::transport::Channel>, String> {
    let addr = directory.get(to).ok_or_else(|| format!("no address for node {to}"))?;
    let settings = ChannelSettings::new(Expected::Node(to)).with_connect_timeout(Duration::from_millis(500)).with_windows(8 << 20, 16 << 20);
    let channel = warden_proto::channel::connect(&addr.to_string(), tls, &settings).await.map_err(|e| e.to_string())?;
    Ok(RaftTransportClient::new(channel)
        .max_encoding_message_size(limits.grpc_message_bytes_max)
        .max_decoding_message_size(limits.grpc_message_bytes_max))
}

/// The task that owns the stream to one peer.
struct PeerTask {
    from: u64,
    to: u64,
    directory: Arc<PeerDirectory>,
    faults: Arc<NetFaults>,
    node: Arc<dyn Inbox>,
    limits: TransportLimits,
    tls: Option<Arc<Tls>>,
    next_message_id: Arc<AtomicU64>,
}

const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(1000);

impl PeerTask {
    async fn run(self, queue: mpsc::Receiver<Outgoing>) {
        let task = Arc::new(self);
        // The queue outlives each connection: the request stream of a call borrows it, and
        // the reconnect loop takes it back when the call ends.
        let queue = Arc::new(tokio::sync::Mutex::new(queue));
        let mut backoff = BACKOFF_MIN;
        loop {
            match task.connect().await {
                Ok(mut client) => {
                    backoff = BACKOFF_MIN;
                    // The call's request body is pulled straight from the queue: no task or
                    // channel between the host loop's send and the HTTP/2 stream.
                    let batches = futures::stream::unfold((task.clone(), queue.clone()), |(task, queue)| async move {
                        let batch = task.next_batch(&queue).await?;
                        Some((batch, (task, queue)))
                    });
                    if let Err(status) = client.stream(batches).await {
                        tracing::debug!(from = task.from, to = task.to, %status, "raft stream ended");
                    }
                }
                Err(error) => tracing::debug!(from = task.from, to = task.to, %error, "connect failed"),
            }
            // While disconnected, whatever is queued is lost and raft is told.
            let mut pending = queue.lock().await;
            while let Ok(outgoing) = pending.try_recv() {
                task.undeliverable(&outgoing);
            }
            if pending.is_closed() {
                return; // The node is stopping: its queue closed.
            }
            drop(pending);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn connect(&self) -> Result<RaftTransportClient<tonic::transport::Channel>, String> {
        connect(&self.directory, self.to, &self.limits, self.tls.as_ref()).await
    }

    /// The next batch: everything queued (up to the batch limit) after the first message;
    /// `None` once the queue closes. Faults drop or delay here.
    async fn next_batch(&self, queue: &tokio::sync::Mutex<mpsc::Receiver<Outgoing>>) -> Option<RaftBatch> {
        let mut queue = queue.lock().await;
        loop {
            let first = queue.recv().await?;
            let mut batch = Vec::new();
            let mut batch_bytes = 0usize;
            let mut pending = Some(first);
            while let Some(outgoing) = pending.take() {
                if self.faults.verdict(self.from, self.to) == Verdict::Deliver {
                    batch_bytes += self.encode(&outgoing, &mut batch);
                }
                if batch_bytes < self.limits.batch_bytes_max {
                    pending = queue.try_recv().ok();
                }
            }
            if batch.is_empty() {
                continue;
            }
            let delay = self.faults.delay();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            return Some(RaftBatch { from_node: self.from, envelopes: batch });
        }
    }

    /// Appends the envelopes of one message to `batch`; returns bytes added.
    fn encode(&self, outgoing: &Outgoing, batch: &mut Vec<RaftEnvelope>) -> usize {
        encode_message(outgoing.group, &outgoing.message, self.limits.chunk_bytes, &self.next_message_id, batch)
    }

    /// Snapshots never come this way (see [`Transport::send`]).
    fn undeliverable(&self, outgoing: &Outgoing) {
        self.node.report_unreachable(outgoing.group, self.to);
    }
}
