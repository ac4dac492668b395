//! One group's replica on this node: its `RawNode`, state machine, and the requests waiting
//! on it. Behaviour is grouped by feature in sibling modules (`command`, `query`, `ready`,
//! `hibernate`), all as `impl Replica` blocks; this file holds the state and its construction.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use raft::eraftpb::Message;
use raft::{RawNode, StateRole};
use tokio::sync::oneshot;

use super::command::CommandBatch;
use super::msg::{GroupStatus, PeerProgress, Reply};
use crate::config::NodeConfig;
use crate::error::{EngineError, StorageError};
use crate::state_machine::{ApplyOutput, LeaderClock, SmReader, StateMachine, StateMachineFactory};
use crate::storage::{ApplyState, Db, PeerStorage};

/// A proposed entry waiting to be applied.
pub(crate) struct Proposal {
    /// Term the entry was proposed in: the proposal succeeded only if the entry applied at
    /// its index carries this term.
    pub term: u64,
    /// The proposers of its commands (one per command of the entry, fewer once some passed
    /// their deadline).
    pub waiters: Vec<Waiter>,
}

/// A proposer waiting for the output of its command.
pub(crate) struct Waiter {
    /// Position of its command in the entry (0 in a single-command entry).
    pub position: usize,
    pub deadline: Instant,
    pub reply: oneshot::Sender<ApplyOutput>,
}

/// A read waiting to be served.
pub(crate) struct ReadRequest {
    pub query: Vec<u8>,
    pub kind: ReadKind,
    pub deadline: Instant,
    pub reply: Reply<Vec<u8>>,
}

/// What a confirmed read does.
#[derive(Clone, Copy)]
pub(crate) enum ReadKind {
    /// A query of the applied state (`StateMachine::query`).
    Query,
    /// A leader-only request (`StateMachine::leader_call`), answered with the clock read when
    /// it arrived: the ReadIndex round that confirms it sent its heartbeats later, so no other
    /// leader was elected before that moment.
    LeaderCall(LeaderClock),
}

/// A ReadIndex request raft has been asked for, covering a batch of reads.
pub(crate) struct InflightRead {
    pub ctx: u64,
    pub issued_tick: u64,
    pub reads: Vec<ReadRequest>,
}

/// A ready whose writes are with the store writer.
pub(crate) struct Unpersisted {
    pub number: u64,
    /// Messages raft allows only after the ready is durable (votes, follower acks).
    pub messages: Vec<Message>,
    /// Log index covered once durable.
    pub last_index: u64,
    /// The ready installed a snapshot: reload the state machine once durable.
    pub snapshot_index: Option<u64>,
}

/// One group's replica.
pub struct Replica {
    pub(crate) group: u64,
    pub(crate) raw: RawNode<PeerStorage>,
    pub(crate) sm: Box<dyn StateMachine>,
    pub(crate) db: Arc<Db>,
    pub(crate) applied: ApplyState,
    pub(crate) proposals: BTreeMap<u64, Proposal>,
    /// Commands waiting in `proposals` (the per-group bound counts commands, not entries).
    pub(crate) proposed_commands: usize,
    /// Commands taken this round, proposed together at the round's end (`propose_batch`).
    pub(crate) batch: CommandBatch,
    pub(crate) queued_reads: Vec<ReadRequest>,
    pub(crate) inflight_read: Option<InflightRead>,
    /// Read batches confirmed at a read index, waiting for apply to reach it.
    pub(crate) confirmed_reads: VecDeque<(u64, Vec<ReadRequest>)>,
    pub(crate) unpersisted: VecDeque<Unpersisted>,
    /// Set when a configuration change removed this replica from its group, or its group's
    /// leader said it was removed while away (see `membership`).
    pub(crate) removed: bool,
    /// A snapshot is being installed: nothing may be applied until it is durable.
    pub(crate) installing_snapshot: bool,
    /// Set when committed entries could not be applied: the worker stops the replica at
    /// once (see `failed`).
    pub(crate) failed: Option<super::failed::ApplyFailure>,
    /// Compact the log when it holds more applied entries than this.
    pub(crate) log_compact_entries: u64,
    /// Leadership last published to the node's leader table.
    pub(crate) published_leader: crate::leaders::LeaderInfo,
    /// Whether the state machine was last told it leads.
    pub(crate) told_leading: bool,
    /// The raft term this replica last became leader in (0: never led).
    pub(crate) led_term: u64,
    /// Callers waiting for a notification key (see `SmWrites::notify`).
    pub(crate) awaiting: HashMap<Vec<u8>, Vec<(Instant, Reply<()>)>>,
    /// Ticking, asking to sleep, or asleep (see `hibernate`).
    pub(crate) hibernation: super::hibernate::Hibernation,
    /// When each peer was last heard from (see `transfer`).
    pub(crate) heard: super::transfer::Heard,
}

/// Callers one replica lets wait for notifications at once.
const AWAITING_MAX: usize = 65_536;

impl Replica {
    /// Loads the replica of `group` from disk (its records must exist).
    pub fn load(config: &NodeConfig, db: Arc<Db>, group: u64, factory: &dyn StateMachineFactory) -> Result<Replica, ReplicaError> {
        let storage = PeerStorage::load(db.clone(), group, config.storage)?;
        let applied = storage.apply_state()?;
        let mut sm = factory.create(config.node_id, group);
        sm.reload(&SmReader::new(db.clone(), group), applied.index)?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let mut raw = RawNode::new(&config.raft_config(applied.index), storage, &logger)?;
        // Merge appends to the same follower produced in one round into one message.
        raw.set_batch_append(true);
        Ok(Replica {
            group,
            raw,
            sm,
            db,
            applied,
            proposals: BTreeMap::new(),
            proposed_commands: 0,
            batch: CommandBatch::default(),
            queued_reads: Vec::new(),
            inflight_read: None,
            confirmed_reads: VecDeque::new(),
            unpersisted: VecDeque::new(),
            removed: false,
            installing_snapshot: false,
            failed: None,
            log_compact_entries: config.log_compact_entries.max(2),
            published_leader: crate::leaders::LeaderInfo::default(),
            told_leading: false,
            led_term: 0,
            awaiting: HashMap::new(),
            hibernation: super::hibernate::Hibernation::default(),
            heard: super::transfer::Heard::default(),
        })
    }

    /// The leader this replica knows of, if any.
    pub fn leader_hint(&self) -> Option<u64> {
        Some(self.raw.raft.leader_id).filter(|id| *id != raft::INVALID_ID)
    }

    /// True when this replica leads its group.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Tells the state machine when leadership changed, so leader-only state starts over.
    pub(crate) fn notice_leadership(&mut self) {
        let leading = self.is_leader();
        if leading != self.told_leading {
            self.told_leading = leading;
            static LEADER_CHANGES: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new(20);
            if let Some(suppressed) = LEADER_CHANGES.admit() {
                let (group, node, term) = (self.group, self.raw.raft.id, self.raw.raft.term);
                let event = if leading { "became leader" } else { "stepped down as leader" };
                tracing::info!(group, node, term, suppressed, "{event}");
            }
            self.sm.on_leadership(leading, LeaderClock::now());
            if leading {
                self.led_term = self.raw.raft.term;
            } else {
                self.fail_leader_calls();
                self.answer_early_after_stepping_down();
            }
        }
    }

    /// Answers now the calls a replica that stepped down with no leader in sight would
    /// otherwise keep waiting.
    ///
    /// - Unconfirmed reads: raft drops a stepped-down leader's ReadIndex rounds, and a read
    ///   changes nothing, so its caller may retry it at whichever replica leads next.
    /// - Proposals, only when the term did not move: raft-rs steps a leader down in its own
    ///   term only when check-quorum finds it cut off from a majority, and then nothing
    ///   answers them until a partition heals — so they are answered OUTCOME_UNKNOWN now and
    ///   their callers try the replicas that can elect a leader. A higher term with no leader
    ///   yet is an election another replica started — a leadership hand-over's target, which
    ///   raft sent every entry before handing over: its entries commit or are overwritten
    ///   soon, and the apply answers each with its result (or the deadline does).
    fn answer_early_after_stepping_down(&mut self) {
        if self.leader_hint().is_some() {
            return;
        }
        let (group, term) = (self.group, self.raw.raft.term);
        let reason = if term == self.led_term {
            let reason = format!("group {group}: the leader stepped down out of reach of a majority");
            self.fail_proposals(&reason);
            reason
        } else {
            format!("group {group}: the leader stepped down for an election in term {term}")
        };
        self.fail_unconfirmed_reads(&EngineError::busy(reason));
    }

    /// Takes a leader-only request. It is answered only after a ReadIndex round confirms that
    /// this replica still led when the request arrived: a leader cut off from its quorum keeps
    /// leading until check-quorum notices (up to two election timeouts), while the rest may
    /// elect a new leader after one, which grants every session only a full TTL from its
    /// election. Renewing a lease without that check would promise the client time the new
    /// leader does not give (DESIGN.md rule 6).
    pub(crate) fn leader_call(&mut self, config: &NodeConfig, request: Vec<u8>, deadline: Instant, reply: Reply<Vec<u8>>) {
        if !self.is_leader() {
            let _ = reply.send(Err(self.not_leader()));
            return;
        }
        self.queue_read(config, ReadRequest { query: request, kind: ReadKind::LeaderCall(LeaderClock::now()), deadline, reply });
    }

    /// Answers a confirmed leader-only request with the clock read when it arrived. The
    /// leader must still lead and have applied an entry of its own term: only then has it
    /// applied everything committed before it took over (and so knows every session a
    /// previous leader created).
    pub(crate) fn answer_leader_call(&mut self, request: &[u8], arrived: LeaderClock) -> Result<Vec<u8>, EngineError> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        if self.applied.term != self.raw.raft.term {
            return Err(EngineError::busy(format!("group {}: new leader still catching up", self.group)));
        }
        self.notice_leadership();
        self.sm.leader_call(request, arrived)
    }

    pub(crate) fn not_leader(&self) -> EngineError {
        EngineError::NotLeader { group: self.group, leader_hint: self.leader_hint() }
    }

    /// The replica's view of its group.
    pub fn status(&self) -> GroupStatus {
        let raft = &self.raw.raft;
        let conf = raft.prs().conf().to_conf_state();
        GroupStatus {
            group: self.group,
            node_id: raft.id,
            term: raft.term,
            vote: raft.vote,
            leader_id: raft.leader_id,
            is_leader: self.is_leader(),
            commit: raft.raft_log.committed,
            applied: self.applied.index,
            first_index: raft.raft_log.first_index(),
            last_index: raft.raft_log.last_index(),
            voters: conf.voters,
            learners: conf.learners,
            conf_fence: self.raw.store().conf_fence(),
            asleep: self.is_asleep(),
            progress: if self.is_leader() {
                raft.prs().iter().map(|(id, pr)| PeerProgress { id: *id, matched: pr.matched, recent_active: pr.recent_active }).collect()
            } else {
                Vec::new()
            },
            failure: None,
        }
    }

    /// Registers a caller waiting for `key`.
    pub(crate) fn register_await(&mut self, key: Vec<u8>, deadline: Instant, reply: Reply<()>) {
        let waiting: usize = self.awaiting.values().map(Vec::len).sum();
        if waiting >= AWAITING_MAX {
            let _ = reply.send(Err(EngineError::busy(format!("group {}: too many callers waiting", self.group))));
            return;
        }
        self.awaiting.entry(key).or_default().push((deadline, reply));
    }

    /// Wakes the callers waiting for `keys`.
    pub(crate) fn wake(&mut self, keys: Vec<Vec<u8>>) {
        for key in keys {
            for (_, reply) in self.awaiting.remove(&key).unwrap_or_default() {
                let _ = reply.send(Ok(()));
            }
        }
    }

    /// Fails every waiting request (the replica is going away).
    pub(crate) fn fail_all(&mut self, error: &EngineError) {
        self.fail_proposals(&error.to_string());
        // Commands not proposed yet were certainly not applied.
        for (_, reply) in std::mem::take(&mut self.batch).into_waiters() {
            let _ = reply.send(Err(error.clone()));
        }
        self.fail_unconfirmed_reads(error);
        for read in std::mem::take(&mut self.confirmed_reads).into_iter().flat_map(|(_, reads)| reads) {
            let _ = read.reply.send(Err(error.clone()));
        }
        for (_, reply) in std::mem::take(&mut self.awaiting).into_values().flatten() {
            let _ = reply.send(Err(error.clone()));
        }
    }

    /// Answers every pending proposal OUTCOME_UNKNOWN: its entry may already be on a quorum
    /// and commit without this replica, so "unknown" is the only true answer, whatever
    /// ended the wait (`why`).
    fn fail_proposals(&mut self, why: &str) {
        self.proposed_commands = 0;
        for (index, proposal) in std::mem::take(&mut self.proposals) {
            let reason = format!("group {}: {why} while entry {index} was pending", self.group);
            for waiter in proposal.waiters {
                let _ = waiter.reply.send(Err(EngineError::Unavailable { reason: reason.clone(), outcome_unknown: true }));
            }
        }
    }

    /// Answers `error` to every read no read index confirmed yet (queued, or in a ReadIndex
    /// round): a read changes nothing, so its caller may retry it anywhere. Confirmed reads
    /// stay: their index is committed and this replica applies up to it.
    fn fail_unconfirmed_reads(&mut self, error: &EngineError) {
        let inflight = self.inflight_read.take().into_iter().flat_map(|inflight| inflight.reads);
        for read in std::mem::take(&mut self.queued_reads).into_iter().chain(inflight) {
            let _ = read.reply.send(Err(error.clone()));
        }
    }

    /// Answers requests whose deadline has passed. A proposal past its deadline may still be
    /// applied later, so its error says the outcome is unknown.
    pub(crate) fn expire_requests(&mut self, now: Instant) {
        let group = self.group;
        let mut expired_commands = 0;
        self.proposals.retain(|index, proposal| {
            if proposal.waiters.iter().all(|w| w.deadline > now) {
                return true;
            }
            let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut proposal.waiters).into_iter().partition(|w| w.deadline <= now);
            proposal.waiters = kept;
            expired_commands += expired.len();
            for waiter in expired {
                let reason = format!("group {group}: deadline passed before entry {index} applied");
                let _ = waiter.reply.send(Err(EngineError::Unavailable { reason, outcome_unknown: true }));
            }
            !proposal.waiters.is_empty()
        });
        self.proposed_commands -= expired_commands;
        let expire = |reads: &mut Vec<ReadRequest>| {
            let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(reads).into_iter().partition(|r| r.deadline <= now);
            *reads = kept;
            for read in expired {
                let _ = read.reply.send(Err(EngineError::busy(format!("group {group}: read not confirmed before its deadline"))));
            }
        };
        expire(&mut self.queued_reads);
        self.awaiting.retain(|_, waiting| {
            let (expired, kept): (Vec<_>, Vec<_>) = std::mem::take(waiting).into_iter().partition(|(deadline, _)| *deadline <= now);
            *waiting = kept;
            for (_, reply) in expired {
                let _ = reply.send(Err(EngineError::busy(format!("group {group}: nothing happened before the deadline"))));
            }
            !waiting.is_empty()
        });
        if let Some(inflight) = &mut self.inflight_read {
            expire(&mut inflight.reads);
        }
        for (_, reads) in &mut self.confirmed_reads {
            expire(reads);
        }
    }
}

/// Why a replica could not be created or loaded.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// Its storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// raft-rs refused its configuration or state.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
}
