//! Configuration of a shard-node's engine, with every limit in one place.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use warden_proto::tls::Tls;

use crate::storage::StorageLimits;

/// Default of [`NodeConfig::placement_heartbeat_ms`]: a heartbeat a second.
pub const PLACEMENT_HEARTBEAT_MS_DEFAULT: u64 = 1_000;

/// Default of [`NodeConfig::hibernate_after_ticks`]: on. (It was off while the pause test of
/// `tests/suite/crash_cycles.rs` saw a stale lock holder act with it on: a session opened by the
/// request that woke a group asleep longer than its TTL was born expired; see
/// `StateMachine::leader_clock`.)
pub const HIBERNATE_AFTER_TICKS_DEFAULT: u64 = HIBERNATE_AFTER_TICKS_ON;

/// The idle time to use when hibernation is turned on: two election timeouts of the default
/// `election_tick` (10), so a group sleeps 2 s after its last request at 100 ms ticks.
pub const HIBERNATE_AFTER_TICKS_ON: u64 = 20;

/// Everything a node needs to start. Names carry their unit last (`tick_ms`).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's id; also its raft peer id in every group it hosts. Never 0.
    pub node_id: u64,
    /// Directory of the node's RocksDB.
    pub data_dir: PathBuf,
    /// Host loop threads. Groups are spread over them by id (2 cores: keep this small).
    pub workers: usize,
    /// Interval between raft ticks.
    pub tick_ms: u64,
    /// Ticks without a leader before a follower campaigns.
    pub election_tick: usize,
    /// Ticks between leader heartbeats.
    pub heartbeat_tick: usize,
    /// Ticks a group's leader waits without a request before its group hibernates (stops
    /// ticking and heartbeating on every replica until a request or a raft message wakes it;
    /// `host/hibernate.rs`). 0: never.
    pub hibernate_after_ticks: u64,
    /// Largest append message raft builds.
    pub raft_msg_bytes_max: u64,
    /// Append messages in flight to one follower.
    pub raft_inflight_msgs_max: usize,
    /// Proposals waiting for apply in one group.
    pub proposals_per_group_max: usize,
    /// Reads waiting in one group.
    pub reads_per_group_max: usize,
    /// Largest command accepted for proposal.
    pub command_bytes_max: usize,
    /// Commands of one group taken in one worker round that go into one raft entry at most.
    pub proposal_batch_commands_max: usize,
    /// Bytes of commands that go into one raft entry at most; a larger command goes alone
    /// (within `command_bytes_max`).
    pub proposal_batch_bytes_max: usize,
    /// Messages a worker's inbox holds before senders see "busy".
    pub inbox_msgs_max: usize,
    /// Store-writer tasks a worker may have in flight (pipelining depth).
    pub write_tasks_in_flight_max: usize,
    /// Compact a group's log when it holds more applied entries than this; half is kept for
    /// followers that are slightly behind.
    pub log_compact_entries: u64,
    /// Tail cache and snapshot limits.
    pub storage: StorageLimits,
    /// Deadline of a public API request.
    pub request_timeout_ms: u64,
    /// This node's failure-domain label (placement spreads a group's replicas over zones).
    pub zone: String,
    /// How often the node tells the placement group it is alive (0: never).
    pub placement_heartbeat_ms: u64,
    /// Where the node serves its Prometheus metrics (`GET /metrics`; `None`: not served).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How often the leader of each group asks the home groups of its remote sessions
    /// whether they are alive (0: never; DESIGN.md rule 7).
    pub remote_session_check_ms: u64,
    /// What the node does when it cannot go on (a storage failure, an engine thread that
    /// panicked).
    pub fatal: FatalPolicy,
    /// TLS on both ports and on every connection the node opens (`None`:
    /// plaintext, the `warden dev` default). Its certificate must name this node
    /// (`warden://node/ID`).
    pub tls: Option<Arc<Tls>>,
}

/// What a node does when it cannot go on: its storage failed (it can no longer promise
/// durability) or one of its engine threads (a worker, the store writer, the transport
/// server) died. Going on with the rest would leave a zombie: a process that looks alive
/// while some or all of its groups answer `Stopped` forever.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FatalPolicy {
    /// Log the cause and abort the process, so that a supervisor restarts it on its data
    /// directory (`warden node`, `warden dev`).
    #[default]
    Abort,
    /// Log the cause and stop every engine thread of this node; the process goes on and
    /// every request to the node's groups fails (in-process clusters of tests, where an
    /// abort would end the whole test binary).
    StopNode,
}

impl NodeConfig {
    /// Defaults for a node with id `node_id` storing data in `data_dir`.
    pub fn new(node_id: u64, data_dir: PathBuf) -> NodeConfig {
        NodeConfig {
            node_id,
            data_dir,
            workers: 2,
            tick_ms: 100,
            election_tick: 10,
            heartbeat_tick: 2,
            hibernate_after_ticks: HIBERNATE_AFTER_TICKS_DEFAULT,
            raft_msg_bytes_max: 1 << 20,
            raft_inflight_msgs_max: 256,
            proposals_per_group_max: 8192,
            reads_per_group_max: 8192,
            command_bytes_max: 3 << 19,
            // Far more than one round of a busy group brings (a few dozen commands), and a
            // batch entry stays well under `raft_msg_bytes_max`.
            proposal_batch_commands_max: 256,
            proposal_batch_bytes_max: 256 << 10,
            inbox_msgs_max: 65536,
            write_tasks_in_flight_max: 8,
            log_compact_entries: 10_000,
            storage: StorageLimits::default(),
            request_timeout_ms: 5000,
            zone: String::new(),
            placement_heartbeat_ms: PLACEMENT_HEARTBEAT_MS_DEFAULT,
            metrics_listen: None,
            remote_session_check_ms: 1_000,
            fatal: FatalPolicy::Abort,
            tls: None,
        }
    }

    /// Time without a leader before an election, at the latest (raft randomizes the timeout
    /// in `[election, 2 × election)` ticks).
    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.tick_ms * 2 * self.election_tick as u64)
    }

    pub(crate) fn raft_config(&self, applied: u64) -> raft::Config {
        raft::Config {
            id: self.node_id,
            election_tick: self.election_tick,
            heartbeat_tick: self.heartbeat_tick,
            applied,
            max_size_per_msg: self.raft_msg_bytes_max,
            max_inflight_msgs: self.raft_inflight_msgs_max,
            // A leader that cannot hear a quorum steps down, so an isolated leader stops
            // serving and a new one can be elected; pre-vote keeps a rejoining replica from
            // disrupting a healthy leader.
            check_quorum: true,
            pre_vote: true,
            read_only_option: raft::ReadOnlyOption::Safe,
            max_committed_size_per_ready: 16 << 20,
            ..raft::Config::default()
        }
    }
}
