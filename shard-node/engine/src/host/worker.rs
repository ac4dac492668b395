//! A host-loop worker: one thread driving the replicas of the groups assigned to it.
//!
//! Threading is the only thing this file decides; what happens to a replica lives in the
//! feature modules (`command`, `query`, `ready`, `hibernate`). A worker visits only the
//! replicas that are awake, plus those a message touched this round: a sleeping group costs
//! nothing per tick or per round.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use raft::eraftpb::{Message, MessageType};

use super::command::Proposed;
use super::failed::FailedReplica;
use super::msg::WorkerMsg;
use super::ready::RoundWrites;
use super::replica::Replica;
use crate::config::NodeConfig;
use crate::error::{EngineError, StorageError};
use crate::state_machine::StateMachineFactory;
use crate::storage::snapshot::SnapshotData;
use crate::storage::{Db, PeerStorage};
use crate::store_writer::{Persisted, WriteTask};
use crate::transport::RaftSender;

/// Inbox messages handled per round at most, so readies and ticks are never starved.
const INBOX_MSGS_PER_ROUND_MAX: usize = 4096;

/// What woke the worker.
enum Event {
    Message(Option<WorkerMsg>),
    Persisted(Option<Persisted>),
    Idle,
}

/// Everything a worker thread owns.
pub(crate) struct Worker {
    /// The node's metrics (apply latency is observed here).
    pub node_metrics: Arc<crate::metrics::NodeMetrics>,
    pub config: Arc<NodeConfig>,
    pub db: Arc<Db>,
    pub factory: Arc<dyn StateMachineFactory>,
    pub sender: Arc<dyn RaftSender>,
    pub inbox: Receiver<WorkerMsg>,
    pub store: Sender<WriteTask>,
    pub persisted_tx: Sender<Persisted>,
    pub persisted_rx: Receiver<Persisted>,
    pub stop: Arc<AtomicBool>,
    pub fatal: super::fatal::Fatal,
    pub leaders: Arc<crate::leaders::LeaderTable>,
    pub replicas: HashMap<u64, Replica>,
    /// Replicas that stopped applying their group (see `failed`): no longer in `replicas`.
    pub failed: HashMap<u64, FailedReplica>,
    /// Groups whose replica is awake: ticked and polled every round. Every other hosted
    /// replica is asleep.
    pub awake: HashSet<u64>,
    /// Sleeping replicas that something touched (a stepped message, a durable write): their
    /// readies are polled once, at the next round that polls readies.
    pub touched: HashSet<u64>,
    pub metrics: Arc<crate::metrics::HostMetrics>,
    pub tasks_in_flight: usize,
    pub tick: u64,
    pub next_read_ctx: u64,
}

impl Worker {
    /// Runs until the node stops. A storage failure or a panic here fails the whole node
    /// (see `fatal`): its other workers must not go on without this one.
    pub fn run(mut self) {
        let thread = std::thread::current().name().unwrap_or("worker").to_string();
        let _watch = self.fatal.watch_thread(thread.clone());
        if let Err(error) = self.run_loop() {
            for replica in self.replicas.values_mut() {
                replica.fail_all(&EngineError::Stopped);
            }
            self.fatal.fail(&format!("{thread}: storage failure: {error}"));
        }
    }

    fn run_loop(&mut self) -> Result<(), StorageError> {
        // Groups may have fallen asleep while this node was down (see `hibernate`).
        if self.config.hibernate_after_ticks > 0 {
            for replica in self.replicas.values_mut() {
                replica.announce_start(self.sender.as_ref());
            }
        }
        let tick_interval = Duration::from_millis(self.config.tick_ms);
        let mut next_tick = Instant::now() + tick_interval;
        while !self.stop.load(Ordering::Relaxed) {
            // 1. Wait for work or the next tick.
            let timeout = next_tick.saturating_duration_since(Instant::now());
            let first = crossbeam_channel::select! {
                recv(self.inbox) -> message => Event::Message(message.ok()),
                recv(self.persisted_rx) -> persisted => Event::Persisted(persisted.ok()),
                default(timeout) => Event::Idle,
            };
            let first = match first {
                Event::Message(message) => message,
                Event::Persisted(persisted) => {
                    if let Some(persisted) = persisted {
                        self.on_persisted(persisted)?;
                    }
                    None
                }
                Event::Idle => None,
            };
            // 2. Tick every replica when due: elections, heartbeats, read retries, deadlines.
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + tick_interval;
                self.on_tick(now);
            }
            // 3. Step what arrived (raft state changes only, no I/O), bounded per round.
            if let Some(message) = first {
                self.handle(message)?;
            }
            for _ in 0..INBOX_MSGS_PER_ROUND_MAX {
                let Ok(message) = self.inbox.try_recv() else { break };
                self.handle(message)?;
            }
            // 4. The commands each leader took this round go into its log as one entry: after
            //    every message of the round was stepped, so the batch is as large as the round
            //    allows, and before the readies, so this round's write carries it. A replica
            //    that stepped down meanwhile fails them as a single proposal would.
            for group in &self.awake {
                if let Some(replica) = self.replicas.get_mut(group) {
                    replica.propose_batch();
                }
            }
            // 5. Durability notices before readies: they release withheld messages and let
            //    raft hand out the entries they made durable for apply in this same round.
            while let Ok(persisted) = self.persisted_rx.try_recv() {
                self.on_persisted(persisted)?;
            }
            // 6. One ReadIndex per group for the reads that queued up.
            for group in &self.awake {
                if let Some(replica) = self.replicas.get_mut(group) {
                    replica.issue_read_index(self.tick, &mut self.next_read_ctx);
                }
            }
            // 7. Readies of every group into one store task: one fsync serves them all. With
            //    too many tasks in flight the readies wait (raft keeps them) for a later round.
            if self.tasks_in_flight < self.config.write_tasks_in_flight_max {
                self.handle_readies()?;
            }
            // 8. Replicas removed from their group go once nothing of theirs is in flight.
            self.destroy_removed()?;
        }
        Ok(())
    }

    fn on_tick(&mut self, now: Instant) {
        self.tick += 1;
        let retry_ticks = self.config.election_tick as u64;
        // Time-driven proposals (expiries) are judged by the leader's clock every tick.
        let clock = crate::state_machine::LeaderClock::now();
        let mut asleep = Vec::new();
        for group in &self.awake {
            let Some(replica) = self.replicas.get_mut(group) else { continue };
            replica.raw.tick();
            replica.retry_read_index(self.tick, retry_ticks);
            replica.expire_requests(now);
            replica.propose_leader_commands(&self.config, clock);
            replica.tick_hibernation(&self.config, self.sender.as_ref());
            if replica.is_asleep() {
                asleep.push(*group);
            }
        }
        for group in asleep {
            self.sync_awake(group);
        }
    }

    /// Puts `group` in the awake set or takes it out, as its replica now is; a replica that
    /// falls asleep is polled once more (what put it to sleep may have left messages).
    fn sync_awake(&mut self, group: u64) {
        let Some(replica) = self.replicas.get(&group) else { return };
        if replica.is_asleep() {
            if self.awake.remove(&group) {
                self.metrics.sleeping_replicas.fetch_add(1, Ordering::Relaxed);
                self.metrics.hibernations.fetch_add(1, Ordering::Relaxed);
            }
            self.touched.insert(group);
        } else if self.awake.insert(group) {
            self.touched.remove(&group);
            self.metrics.sleeping_replicas.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn handle(&mut self, message: WorkerMsg) -> Result<(), StorageError> {
        let group = message.group();
        if let Some(failed) = self.failed.get(&group) {
            failed.answer(message);
            return Ok(());
        }
        if super::hibernate::request_wakes(&message) {
            if let Some(replica) = self.replicas.get_mut(&group) {
                replica.on_request(self.sender.as_ref());
            }
        }
        self.handle_message(message)?;
        self.sync_awake(group);
        Ok(())
    }

    fn handle_message(&mut self, message: WorkerMsg) -> Result<(), StorageError> {
        let config = self.config.clone();
        match message {
            WorkerMsg::Raft { group, message } => self.step(group, *message),
            WorkerMsg::Propose { group, command, deadline, reply } => match self.replicas.get_mut(&group) {
                Some(replica) => replica.propose(&config, Proposed::Command(command), deadline, reply),
                None => drop(reply.send(Err(EngineError::GroupNotFound(group)))),
            },
            WorkerMsg::ConfChange { group, change, deadline, reply } => match self.replicas.get_mut(&group) {
                Some(replica) => replica.propose(&config, Proposed::ConfChange(change), deadline, reply),
                None => drop(reply.send(Err(EngineError::GroupNotFound(group)))),
            },
            WorkerMsg::Read { group, query, consistency, deadline, reply } => match self.replicas.get_mut(&group) {
                Some(replica) => replica.read(&config, query, consistency, deadline, reply),
                None => drop(reply.send(Err(EngineError::GroupNotFound(group)))),
            },
            WorkerMsg::TransferLeader { group, to, reply } => {
                let result = self.replica(group).and_then(|replica| replica.transfer_leader(&config, to, Instant::now()));
                let _ = reply.send(result);
            }
            WorkerMsg::Campaign { group, reply } => {
                let result =
                    self.replica(group).and_then(|replica| replica.raw.campaign().map_err(|e| EngineError::Invalid(format!("campaign: {e}"))));
                let _ = reply.send(result);
            }
            WorkerMsg::Unreachable { group, to } => {
                if let Some(replica) = self.replicas.get_mut(&group) {
                    replica.report_unreachable(to, false);
                }
            }
            WorkerMsg::SnapshotStatus { group, to, status } => {
                if let Some(replica) = self.replicas.get_mut(&group) {
                    replica.raw.report_snapshot(to, status);
                }
            }
            WorkerMsg::Await { group, key, deadline, reply } => match self.replicas.get_mut(&group) {
                Some(replica) => replica.register_await(key, deadline, reply),
                None => drop(reply.send(Err(EngineError::GroupNotFound(group)))),
            },
            WorkerMsg::LeaderCall { group, request, deadline, reply } => match self.replicas.get_mut(&group) {
                Some(replica) => replica.leader_call(&config, request, deadline, reply),
                None => drop(reply.send(Err(EngineError::GroupNotFound(group)))),
            },
            WorkerMsg::Status { group, reply } => {
                let _ = reply.send(self.replica(group).map(|replica| replica.status()));
            }
            WorkerMsg::CreateGroup { group, voters, reply } => {
                let _ = reply.send(self.create_group(group, &voters)?);
            }
            WorkerMsg::DestroyGroup { group, reply } => {
                let answer = self.replica(group).map(|replica| {
                    tracing::info!(group, "placement no longer has this group; destroying its replica");
                    // Step 8 of the loop destroys it once nothing of its is in flight.
                    replica.removed = true;
                });
                let _ = reply.send(answer);
            }
        }
        Ok(())
    }

    fn replica(&mut self, group: u64) -> Result<&mut Replica, EngineError> {
        self.replicas.get_mut(&group).ok_or(EngineError::GroupNotFound(group))
    }

    /// Steps a message from the network, after checks raft-rs leaves to the host.
    fn step(&mut self, group: u64, message: Message) {
        let Some(replica) = self.replicas.get_mut(&group) else {
            tracing::debug!(group, from = message.from, "message for a group not hosted here");
            return;
        };
        if message.to != self.config.node_id {
            tracing::warn!(group, to = message.to, "message addressed to another node");
            return;
        }
        replica.heard.note(message.from, Instant::now());
        let Some(message) = replica.screen_hibernation(&self.config, message, self.sender.as_ref()) else { return };
        let Some(message) = replica.screen(message, self.sender.as_ref()) else { return };
        // Snapshot data is decoded only once the message is in the log; check it now, while a
        // bad one can still be dropped (the snapshot flow checked it already, but a peer may
        // still send one inside a batch).
        if message.get_msg_type() == MessageType::MsgSnapshot {
            if let Err(error) = SnapshotData::validate(&message.get_snapshot().data) {
                tracing::warn!(group, from = message.from, %error, "dropping malformed snapshot");
                return;
            }
        }
        // raft-rs refuses local message types and unknown peers with an error: nothing to do.
        if let Err(error) = replica.raw.step(message) {
            tracing::debug!(group, %error, "raft refused a message");
        }
    }

    fn create_group(&mut self, group: u64, voters: &[u64]) -> Result<Result<(), EngineError>, StorageError> {
        if self.replicas.contains_key(&group) {
            return Ok(Err(EngineError::GroupExists(group)));
        }
        if group == 0 || group > crate::storage::keys::GROUP_ID_MAX {
            return Ok(Err(EngineError::Invalid(format!("group id {group} is reserved"))));
        }
        if !voters.is_empty() && !voters.contains(&self.config.node_id) {
            return Ok(Err(EngineError::Invalid(format!("voters {voters:?} do not include this node"))));
        }
        if voters.contains(&0) {
            return Ok(Err(EngineError::Invalid("node id 0 is reserved".into())));
        }
        self.db.write_ops(&PeerStorage::bootstrap_ops(group, voters), true)?;
        let replica = Replica::load(&self.config, self.db.clone(), group, self.factory.as_ref())
            .map_err(|error| StorageError::Corrupt(format!("group {group} just created: {error}")))?;
        self.replicas.insert(group, replica);
        self.awake.insert(group);
        self.leaders.set(group, crate::leaders::LeaderInfo::default());
        Ok(Ok(()))
    }

    fn handle_readies(&mut self) -> Result<(), StorageError> {
        let mut round = RoundWrites::default();
        let mut failed = Vec::new();
        for group in self.awake.iter().copied().chain(self.touched.drain()) {
            let Some(replica) = self.replicas.get_mut(&group) else { continue };
            replica.handle_ready(self.sender.as_ref(), &mut round)?;
            if replica.failed.is_some() {
                failed.push(group);
                continue;
            }
            for seconds in round.apply_seconds.drain(..) {
                self.node_metrics.apply_seconds.observe(seconds);
            }
            self.node_metrics.entries_applied.inc_by(std::mem::take(&mut round.entries_applied));
            let info = crate::leaders::LeaderInfo {
                term: replica.raw.raft.term,
                leader_id: replica.raw.raft.leader_id,
                needs_ticks: replica.sm.needs_ticks(),
            };
            if info != replica.published_leader {
                replica.published_leader = info;
                self.leaders.set(replica.group, info);
            }
        }
        for group in failed {
            self.stop_failed(group);
        }
        if round.readies.is_empty() {
            assert!(round.ops.is_empty(), "writes without a ready to notify");
            return Ok(());
        }
        let task = WriteTask { ops: round.ops, entries: round.entries, readies: round.readies, done: self.persisted_tx.clone() };
        // The queue holds `write_tasks_in_flight_max` tasks per worker and this worker has
        // fewer in flight, so this send does not block.
        self.store.send(task).map_err(|_| StorageError::Corrupt("store writer stopped".into()))?;
        self.tasks_in_flight += 1;
        Ok(())
    }

    /// Replaces the replica of `group`, which could not apply its entries, with what is left
    /// of it (see `failed`); the node's other groups go on.
    fn stop_failed(&mut self, group: u64) {
        let Some(failure) = self.replicas.get_mut(&group).and_then(|replica| replica.failed.take()) else { return };
        let Some(replica) = self.replicas.remove(&group) else { return };
        if !self.awake.remove(&group) {
            self.metrics.sleeping_replicas.fetch_sub(1, Ordering::Relaxed);
        }
        self.touched.remove(&group);
        // Out of the table of serving replicas (its records stay until a restart loads it):
        // it leads nothing, and is counted as failed, not as a replica without a leader.
        self.leaders.remove(group);
        self.failed.insert(group, FailedReplica::stop(replica, &failure));
        self.metrics.failed_replicas.fetch_add(1, Ordering::Relaxed);
    }

    fn on_persisted(&mut self, persisted: Persisted) -> Result<(), StorageError> {
        self.tasks_in_flight -= 1;
        persisted.result.map_err(StorageError::Corrupt)?;
        for (group, number) in persisted.readies {
            if let Some(replica) = self.replicas.get_mut(&group) {
                replica.on_persisted(number, self.sender.as_ref())?;
                if replica.is_asleep() {
                    self.touched.insert(group);
                }
            }
        }
        Ok(())
    }

    fn destroy_removed(&mut self) -> Result<(), StorageError> {
        // A removed replica never sleeps (see `hibernate`), so the awake ones are all to look at.
        let removable: Vec<u64> =
            self.awake.iter().filter(|group| self.replicas.get(group).is_some_and(|r| r.removed && r.unpersisted.is_empty())).copied().collect();
        for group in removable {
            self.awake.remove(&group);
            if let Some(mut replica) = self.replicas.remove(&group) {
                replica.fail_all(&EngineError::GroupNotFound(group));
                self.leaders.remove(group);
                self.db.write_ops(&PeerStorage::destroy_ops(group, &replica.raw.raft.hard_state()), true)?;
                tracing::info!(node = self.config.node_id, group, "replica removed from its group and destroyed");
            }
        }
        Ok(())
    }
}
