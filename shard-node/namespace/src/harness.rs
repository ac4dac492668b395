//! A single-replica harness: applies namespace commands straight to a state machine over
//! a temporary RocksDB, without raft. For semantics tests and model-based property tests.

use std::sync::Arc;

use prost::Message as _;
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::leader_request::Request as LeaderRequestKind;
use warden_proto::namespace::leader_response::Response as LeaderResponseKind;
use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::namespace::{AcquireLock, Command, CommandResult, LeaderRequest, LeaderResponse, LockQuery, Query, QueryResult, ReleaseLock};
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::txn_op_result::Result as OpResult;
use warden_proto::v1::*;

use super::{Limits, NamespaceFactory};
use warden_engine::error::EngineError;
use warden_engine::state_machine::{ApplyOutput, LeaderClock, SmReader, SmWrites, StateMachine, StateMachineFactory};
use warden_engine::storage::Db;

const NODE: u64 = 1;

/// A namespace state machine applied to directly.
pub struct Harness {
    _dir: tempfile::TempDir,
    db: Arc<Db>,
    factory: NamespaceFactory,
    sm: Box<dyn StateMachine>,
    group: u64,
    index: u64,
    /// Leader time stamped into the next command.
    pub now_ms: u64,
    /// What each batch applied since the last [`Harness::take_batch_costs`] cost.
    #[cfg(test)]
    batch_costs: Vec<BatchCost>,
}

/// What applying one batch of entries cost (tests of this crate only).
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCost {
    /// State-machine records read by scans while the batch applied.
    pub records_scanned: u64,
    /// Writes the batch handed to the store.
    pub write_ops: usize,
    /// Keys whose awaiting calls the batch wakes (`SmWrites::notify`).
    pub notified: usize,
}

/// What a harness call returns: the response, or the typed error.
pub type Outcome<T> = Result<T, WardenError>;

impl Harness {
    /// A fresh, empty namespace with `limits` (group 1).
    pub fn new(limits: Limits) -> Result<Harness, EngineError> {
        Harness::for_group(limits, 1)
    }

    /// A fresh, empty namespace of `group` with `limits` (session ids name their home group).
    pub fn for_group(limits: Limits, group: u64) -> Result<Harness, EngineError> {
        let dir = tempfile::tempdir().map_err(|e| EngineError::Invalid(e.to_string()))?;
        let db = Db::open(dir.path()).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let factory = NamespaceFactory { limits: limits.clone(), ..NamespaceFactory::default() };
        let mut sm = factory.create(NODE, group);
        sm.reload(&SmReader::new(db.clone(), group), 0).map_err(|e| EngineError::Invalid(e.to_string()))?;
        let mut harness = Harness {
            _dir: dir,
            db,
            factory,
            sm,
            group,
            index: 0,
            now_ms: 1_000_000,
            #[cfg(test)]
            batch_costs: Vec::new(),
        };
        // Replicated limits other than the first release's come through the log, as in a
        // cluster (`limits.rs`).
        if limits.with_record(None) != limits {
            harness.set_limits(limits.to_record(1)).map_err(|e| EngineError::Invalid(e.message))?;
        }
        Ok(harness)
    }

    /// Applies a `SetLimits` of `record`: the limits the group applies after it.
    pub fn set_limits(&mut self, record: ApplyLimits) -> Outcome<ApplyLimits> {
        match self.apply_result(CommandOp::SetLimits(record))? {
            CommandOutcome::Limits(limits) => Ok(limits),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Rebuilds the state machine from disk, as a restart does.
    pub fn reopen(&mut self) -> Result<(), EngineError> {
        let mut sm = self.factory.create(NODE, self.group);
        sm.reload(&SmReader::new(self.db.clone(), self.group), self.index).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.sm = sm;
        Ok(())
    }

    /// The watch hub of the harness's replica (events are published after each apply).
    pub fn watch_hub(&self) -> Option<Arc<crate::watch::WatchHub>> {
        self.factory.hubs.get(NODE, self.group)
    }

    /// Applies raw command bytes as the next entry (bad bytes come back as `Err`).
    pub fn apply_bytes(&mut self, command: &[u8]) -> Result<Vec<u8>, EngineError> {
        let mut outputs = self.apply_batch(&[command])?;
        outputs.pop().unwrap_or_else(|| Err(EngineError::Invalid("no output".into())))
    }

    /// Applies `commands` as consecutive entries committed together, as the engine applies a
    /// ready's committed entries: into one set of writes, written once, then published. Each
    /// command's output, in order; `Err` only when the store fails (a read or the write).
    pub fn apply_batch<C: AsRef<[u8]>>(&mut self, commands: &[C]) -> Result<Vec<ApplyOutput>, EngineError> {
        let mut writes = SmWrites::new(self.group);
        let mut outputs = Vec::with_capacity(commands.len());
        #[cfg(test)]
        let scanned_before = self.db.records_scanned.load(std::sync::atomic::Ordering::Relaxed);
        for command in commands {
            self.index += 1;
            outputs.push(self.sm.apply(self.index, command.as_ref(), &mut writes).map_err(|e| EngineError::Invalid(e.to_string()))?);
        }
        self.sm.finish_batch(&mut writes);
        let (ops, _notified) = writes.into_parts();
        #[cfg(test)]
        self.batch_costs.push(BatchCost {
            records_scanned: self.db.records_scanned.load(std::sync::atomic::Ordering::Relaxed) - scanned_before,
            write_ops: ops.len(),
            notified: _notified.len(),
        });
        self.db.write_ops(&ops, false).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.sm.publish();
        Ok(outputs)
    }

    /// What each batch applied since the last call cost, in order.
    #[cfg(test)]
    pub fn take_batch_costs(&mut self) -> Vec<BatchCost> {
        std::mem::take(&mut self.batch_costs)
    }

    /// What the replica published it holds (the figures of `warden_namespace_held`).
    pub fn held(&self) -> super::counts::Counts {
        self.factory.counts.sum(NODE, &[self.group])
    }

    /// A reader of the harness's group, for reads below the state machine (`store`, `locks`).
    pub fn reader(&self) -> SmReader {
        SmReader::new(self.db.clone(), self.group)
    }

    fn apply_result(&mut self, op: CommandOp) -> Outcome<CommandOutcome> {
        self.apply_full(op).map(|(outcome, _)| outcome)
    }

    /// Applies `op`; its outcome and what it reported beside it (`result` taken out).
    fn apply_full(&mut self, op: CommandOp) -> Outcome<(CommandOutcome, CommandResult)> {
        let command = Command { now_ms: self.now_ms, principal: String::new(), op: Some(op) };
        let output = self.apply_bytes(&command.encode_to_vec()).map_err(engine)?;
        let mut result = CommandResult::decode(output.as_slice()).map_err(|e| engine(EngineError::Invalid(e.to_string())))?;
        match result.result.take() {
            Some(CommandOutcome::Error(error)) => Err(error),
            Some(outcome) => Ok((outcome, result)),
            None => Err(engine(EngineError::Invalid("empty result".into()))),
        }
    }

    fn apply(&mut self, op: CommandOp) -> Outcome<TxnResponse> {
        match self.apply_result(op)? {
            CommandOutcome::Txn(response) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Runs a transaction.
    pub fn txn(&mut self, request: TxnRequest) -> Outcome<TxnResponse> {
        self.apply(CommandOp::Txn(request))
    }

    fn one(&mut self, op: Op) -> Outcome<OpResult> {
        let response = self.txn(TxnRequest { then: vec![TxnOp { op: Some(op) }], ..TxnRequest::default() })?;
        response.results.into_iter().next().and_then(|r| r.result).ok_or_else(|| engine(EngineError::Invalid("no result".into())))
    }

    /// Creates a node.
    pub fn create(&mut self, request: CreateRequest) -> Outcome<CreateResponse> {
        match self.one(Op::Create(request))? {
            OpResult::Create(response) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Creates a persistent node with `data`.
    pub fn create_simple(&mut self, path: &str, data: &[u8]) -> Outcome<CreateResponse> {
        self.create(CreateRequest { path: path.into(), data: data.to_vec(), ..CreateRequest::default() })
    }

    /// Sets a node's data.
    pub fn set(&mut self, path: &str, data: &[u8], expected_version: Option<u64>) -> Outcome<SetResponse> {
        match self.one(Op::Set(SetRequest { path: path.into(), data: data.to_vec(), expected_version, routing: None }))? {
            OpResult::Set(response) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Deletes a node.
    pub fn delete(&mut self, path: &str, expected_version: Option<u64>, recursive: bool) -> Outcome<DeleteResponse> {
        match self.one(Op::Delete(DeleteRequest { path: path.into(), expected_version, recursive, routing: None }))? {
            OpResult::Delete(response) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Rewrites a stored node record directly, as a snapshot restore could, then reloads.
    /// For tests of states too expensive to reach through operations (a sequential counter
    /// near its end).
    pub fn rewrite_record(&mut self, path: &str, edit: impl FnOnce(&mut warden_proto::namespace::NodeRecord)) -> Result<(), EngineError> {
        let reader = SmReader::new(self.db.clone(), self.group);
        let mut record = super::store::read_node(&reader, path)
            .map_err(|e| EngineError::Invalid(e.to_string()))?
            .ok_or_else(|| EngineError::Invalid(format!("{path} does not exist")))?;
        edit(&mut record);
        let mut writes = SmWrites::new(self.group);
        writes.put(&super::store::node_key(path), &record.encode_to_vec());
        self.db.write_ops(&writes.into_ops(), false).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.reopen()
    }

    /// Rewrites the group's record of subtree moves directly, then reloads: a state an
    /// older binary's apply may have left (a freeze today's rules refuse).
    pub fn rewrite_split_state(&mut self, edit: impl FnOnce(&mut warden_proto::namespace::SplitState)) -> Result<(), EngineError> {
        let reader = SmReader::new(self.db.clone(), self.group);
        let mut view = super::store::TxnView::new(&reader, None);
        let mut state = view.split().map_err(|e| EngineError::Invalid(e.to_string()))?;
        edit(&mut state);
        view.put_split(&state);
        let mut writes = SmWrites::new(self.group);
        view.into_changes().commit_into(&mut writes);
        self.db.write_ops(&writes.into_ops(), false).map_err(|e| EngineError::Invalid(e.to_string()))?;
        self.reopen()
    }

    /// Proposes-and-applies what the leader would at time `now_ms` (TTL and session
    /// expiries); the harness's wall and monotonic clocks are the same number.
    pub fn leader_scan(&mut self, now_ms: u64) -> Result<usize, EngineError> {
        self.leader_scan_with(clock(now_ms))
    }

    /// [`Self::leader_scan`] with the leader's wall and monotonic clocks apart (a wall clock
    /// stepped or drifting).
    pub fn leader_scan_with(&mut self, clock: LeaderClock) -> Result<usize, EngineError> {
        self.sm.leader_clock(clock);
        let commands = self.sm.leader_proposals(clock);
        for command in &commands {
            self.apply_bytes(command)?;
        }
        Ok(commands.len())
    }

    /// Tells the state machine it leads (or not) from time `now_ms`.
    pub fn set_leading(&mut self, leading: bool, now_ms: u64) {
        self.sm.on_leadership(leading, clock(now_ms));
    }

    /// Opens a session.
    pub fn create_session(&mut self, ttl_ms: u64) -> Outcome<CreateSessionResponse> {
        let op = CommandOp::CreateSession(warden_proto::namespace::CreateSession { ttl_ms, owner: String::new(), scope: String::new() });
        match self.apply_result(op)? {
            CommandOutcome::CreateSession(response) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Applies placement's share of a subtree quota; answers the group's record after it.
    pub fn set_quota_share(&mut self, share: warden_proto::namespace::SetQuotaShare) -> Outcome<warden_proto::namespace::QuotaShare> {
        match self.apply_result(CommandOp::SetQuotaShare(share))? {
            CommandOutcome::QuotaShare(record) => Ok(record),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Closes a session.
    pub fn close_session(&mut self, session_id: u64) -> Outcome<CloseSessionResponse> {
        self.close_session_noted(session_id).map(|(response, _)| response)
    }

    /// Closes a session; answers also the groups its record noted as holding it remotely.
    pub fn close_session_noted(&mut self, session_id: u64) -> Outcome<(CloseSessionResponse, Vec<u64>)> {
        let op = CommandOp::CloseSession(warden_proto::namespace::CloseSession { session_id });
        match self.apply_full(op)? {
            (CommandOutcome::CloseSession(response), result) => Ok((response, result.remote_holders)),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Notes group `holder` as about to record `session_ids` as remote
    /// (`NoteRemoteHolders`); answers the live ones noted.
    pub fn note_remote_holders(&mut self, holder: u64, session_ids: &[u64]) -> Outcome<Vec<u64>> {
        self.note_remote_holders_full(holder, session_ids).map(|alive| alive.session_ids)
    }

    /// [`Self::note_remote_holders`], answered whole (`holders_full` too).
    pub fn note_remote_holders_full(&mut self, holder: u64, session_ids: &[u64]) -> Outcome<warden_proto::namespace::SessionIds> {
        let op = CommandOp::NoteRemoteHolders(warden_proto::namespace::NoteRemoteHolders { session_ids: session_ids.to_vec(), group_id: holder });
        match self.apply_result(op)? {
            CommandOutcome::Sessions(alive) => Ok(alive),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Records sessions of other groups as remote (`AddRemoteSessions`), opened with security
    /// off as their home groups say.
    pub fn add_remote_sessions(&mut self, session_ids: &[u64]) -> Outcome<()> {
        let owners = vec![String::new(); session_ids.len()];
        self.apply(CommandOp::AddRemoteSessions(warden_proto::namespace::AddRemoteSessions { session_ids: session_ids.to_vec(), owners })).map(drop)
    }

    /// Ends remote sessions on their home group's verdict (`EndRemoteSessions`): `closed` by
    /// their client (no lock-delay), or expired.
    pub fn end_remote_sessions(&mut self, session_ids: &[u64], closed: bool) -> Outcome<()> {
        let end = warden_proto::namespace::EndRemoteSessions { session_ids: session_ids.to_vec(), closed };
        self.apply(CommandOp::EndRemoteSessions(end)).map(drop)
    }

    /// The remote sessions the leader lists.
    pub fn remote_sessions(&mut self) -> Outcome<Vec<u64>> {
        let page = LeaderRequestKind::RemoteSessions(warden_proto::namespace::RemoteSessionsPage { after: 0, limit: 4096 });
        match self.leader_call(page, self.now_ms)? {
            LeaderResponseKind::RemoteSessions(ids) => Ok(ids.session_ids),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Which of `session_ids` the group holds a record of.
    pub fn sessions_known(&self, session_ids: &[u64]) -> Outcome<Vec<u64>> {
        match self
            .query(QueryKind::Sessions(warden_proto::namespace::SessionIds {
                session_ids: session_ids.to_vec(),
                ..warden_proto::namespace::SessionIds::default()
            }))?
            .result
        {
            Some(QueryOutcome::Sessions(known)) => Ok(known.session_ids),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Which of `session_ids`, homed here and alive, do not note group `checker` as holding
    /// them (a `Sessions` query with `checker_group`).
    pub fn sessions_unnoted(&self, checker: u64, session_ids: &[u64]) -> Outcome<Vec<u64>> {
        let query = warden_proto::namespace::SessionIds { session_ids: session_ids.to_vec(), checker_group: checker, ..Default::default() };
        match self.query(QueryKind::Sessions(query))?.result {
            Some(QueryOutcome::Sessions(known)) => Ok(known.unnoted),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Adds a lock waiter (see `Txn::acquire_lock`) at the harness's `now_ms`.
    pub fn lock(&mut self, request: AcquireLock) -> Outcome<LockResponse> {
        self.lock_attempt(request).map(|(response, _)| response)
    }

    /// The same, with the call's attempt on its waiter (what a release of the call names).
    pub fn lock_attempt(&mut self, request: AcquireLock) -> Outcome<(LockResponse, u64)> {
        match self.apply_full(CommandOp::AcquireLock(request))? {
            (CommandOutcome::Lock(response), result) => Ok((response, result.lock_attempt)),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Removes a sequencer's waiter (Unlock).
    pub fn unlock(&mut self, sequencer: Sequencer) -> Outcome<()> {
        self.release(sequencer, 0)
    }

    /// Removes a sequencer's waiter if `attempt` (nonzero) is still its call's: the release of
    /// an abandoned `Lock` call.
    pub fn release(&mut self, sequencer: Sequencer, attempt: u64) -> Outcome<()> {
        self.apply_result(CommandOp::ReleaseLock(ReleaseLock { sequencer: Some(sequencer), attempt })).map(drop)
    }

    /// Holders and waiters of a lock.
    pub fn lock_info(&self, path: &str) -> Outcome<LockInfoResponse> {
        match self.query(QueryKind::LockInfo(LockQuery { path: path.into(), ..LockQuery::default() }))?.result {
            Some(QueryOutcome::LockInfo(response)) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Whether a sequencer holds.
    pub fn check_sequencer(&self, sequencer: &Sequencer) -> Outcome<bool> {
        let query = LockQuery { path: sequencer.path.clone(), sequencer: Some(sequencer.clone()), ..LockQuery::default() };
        match self.query(QueryKind::CheckSequencer(query))?.result {
            Some(QueryOutcome::CheckSequencer(response)) => Ok(response.holds),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// A leader-only call at time `now_ms`.
    pub fn leader_call(&mut self, request: LeaderRequestKind, now_ms: u64) -> Outcome<LeaderResponseKind> {
        let bytes = LeaderRequest { principal: String::new(), request: Some(request) }.encode_to_vec();
        let output = self.sm.leader_call(&bytes, clock(now_ms)).map_err(engine)?;
        let response = LeaderResponse::decode(output.as_slice()).map_err(|e| engine(EngineError::Invalid(e.to_string())))?;
        match response.response {
            Some(LeaderResponseKind::Error(error)) => Err(error),
            Some(response) => Ok(response),
            None => Err(engine(EngineError::Invalid("empty leader response".into()))),
        }
    }

    /// Renews sessions at time `now_ms`.
    pub fn keep_alive(&mut self, session_ids: &[u64], now_ms: u64) -> Outcome<Vec<SessionLease>> {
        let request = LeaderRequestKind::KeepAlive(KeepAliveRequest { session_ids: session_ids.to_vec(), routing: None });
        match self.leader_call(request, now_ms)? {
            LeaderResponseKind::KeepAlive(response) => Ok(response.leases),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    fn query(&self, query: QueryKind) -> Outcome<QueryResult> {
        let bytes = self.sm.query(&Query { query: Some(query) }.encode_to_vec()).map_err(engine)?;
        let result = QueryResult::decode(bytes.as_slice()).map_err(|e| engine(EngineError::Invalid(e.to_string())))?;
        match result.result {
            Some(QueryOutcome::Error(error)) => Err(error),
            _ => Ok(result),
        }
    }

    /// Reads a node.
    pub fn get(&self, path: &str) -> Outcome<GetResponse> {
        match self.query(QueryKind::Get(GetRequest { path: path.into(), ..GetRequest::default() }))?.result {
            Some(QueryOutcome::Get(response)) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// A node's stat, or `None`.
    pub fn exists(&self, path: &str) -> Outcome<Option<Stat>> {
        match self.query(QueryKind::Exists(ExistsRequest { path: path.into(), ..ExistsRequest::default() }))?.result {
            Some(QueryOutcome::Exists(response)) => Ok(response.stat),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Lists children.
    pub fn children(&self, request: GetChildrenRequest) -> Outcome<GetChildrenResponse> {
        match self.query(QueryKind::Children(request))?.result {
            Some(QueryOutcome::Children(response)) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// A range query (`RangeRequest`), as a node answers it.
    pub fn range(&self, request: warden_proto::v1::RangeRequest) -> Outcome<warden_proto::v1::RangeResponse> {
        match self.query(QueryKind::Range(request))?.result {
            Some(QueryOutcome::Range(response)) => Ok(response),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// Every child name of `path` (all pages).
    pub fn all_children(&self, path: &str) -> Outcome<Vec<String>> {
        let mut names = Vec::new();
        loop {
            let start_after = names.last().cloned().unwrap_or_default();
            let page = self.children(GetChildrenRequest { path: path.into(), start_after, ..GetChildrenRequest::default() })?;
            names.extend(page.names);
            if !page.more {
                return Ok(names);
            }
        }
    }

    /// Applies a placement command (a descriptor, a split step); the group's revision after it.
    pub fn placement_step(&mut self, op: CommandOp) -> Outcome<u64> {
        Ok(self.apply(op)?.header.map_or(0, |h| h.revision))
    }

    /// Serves `descriptor` (its revision raised to `revision_floor` first).
    pub fn set_descriptor(&mut self, descriptor: GroupDescriptor, revision_floor: u64) -> Outcome<u64> {
        self.placement_step(CommandOp::SetDescriptor(warden_proto::namespace::SetDescriptor { descriptor: Some(descriptor), revision_floor }))
    }

    /// A page of a frozen subtree's export.
    pub fn export_page(&self, export: warden_proto::namespace::ExportSubtree) -> Outcome<warden_proto::namespace::SubtreePage> {
        match self.query(QueryKind::ExportSubtree(export))?.result {
            Some(QueryOutcome::SubtreePage(page)) => Ok(page),
            _ => Err(engine(EngineError::Invalid("mismatched result".into()))),
        }
    }

    /// The group revision.
    pub fn revision(&self) -> Outcome<u64> {
        Ok(self.query(QueryKind::Revision(true))?.revision)
    }
}

fn clock(now_ms: u64) -> LeaderClock {
    LeaderClock { wall_ms: now_ms, monotonic_ms: now_ms }
}

/// An engine error in the harness as a `WardenError` (code UNKNOWN).
fn engine(error: EngineError) -> WardenError {
    WardenError { message: error.to_string(), ..WardenError::default() }
}
