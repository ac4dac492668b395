//! `warden_placement::Placement` as a replicated state machine. Commands and the state are
//! JSON (the placement crate's serde forms; the state is small: nodes, groups, routes).
//! The whole state is rewritten under one key with every change, so apply stays one write.

use warden_placement::{Command, Outcome, Placement, PlacementConfig, PlacementError};

use warden_engine::error::{EngineError, StorageError};
use warden_engine::state_machine::{Applied, ApplyOutput, LeaderClock, SmReader, SmWrites, StateMachine};

/// Key of the encoded state in the placement group's range.
const STATE_KEY: &[u8] = b"placement";

/// How long the leader waits before proposing the same nodes down again (the first
/// proposal is usually applied well before).
const MARK_DOWN_RETRY_MS: u64 = 1_000;

/// What applying a placement command answers: the crate's own result.
pub type PlacementResult = Result<Outcome, PlacementError>;

/// The placement group's state machine.
pub struct PlacementStateMachine {
    placement: Placement,
    config: PlacementConfig,
    /// Leader-only: when nodes were last proposed down (wall ms), so the proposal is not
    /// repeated every tick while it commits.
    mark_down_proposed_ms: u64,
    /// Leader-only: when this replica became leader, by its stepless clock (`None` while it
    /// follows). Until it has led for a heartbeat timeout it marks nobody down: the stamps
    /// it inherits were made by the previous leader's clock, which may read far from its own
    /// (a node's stepless clock starts from its wall clock, stepped or not); every live node
    /// heartbeats it within that time and is stamped again by its own clock.
    leading_since_ms: Option<u64>,
    /// Where the applied routing version goes once it is in the store (`publish`).
    routing_version: Option<tokio::sync::watch::Sender<u64>>,
}

impl PlacementStateMachine {
    /// An empty placement state with `config`.
    pub fn new(config: PlacementConfig) -> PlacementStateMachine {
        PlacementStateMachine {
            placement: Placement::new(config.clone()),
            config,
            mark_down_proposed_ms: 0,
            leading_since_ms: None,
            routing_version: None,
        }
    }

    /// The same, telling `sender` the routing version after each write (and load).
    pub fn publishing_to(self, sender: tokio::sync::watch::Sender<u64>) -> PlacementStateMachine {
        PlacementStateMachine { routing_version: Some(sender), ..self }
    }
}

/// Encodes a command for proposing.
pub fn encode_command(command: &Command) -> Vec<u8> {
    // Serializing these plain enums cannot fail.
    serde_json::to_vec(command).unwrap_or_default()
}

/// Decodes what apply answered.
pub fn decode_result(bytes: &[u8]) -> Result<PlacementResult, EngineError> {
    serde_json::from_slice(bytes).map_err(|e| EngineError::Invalid(format!("placement result: {e}")))
}

/// Decodes the state a query answered.
pub fn decode_state(bytes: &[u8], config: PlacementConfig) -> Result<Placement, EngineError> {
    Placement::from_bytes(bytes, config).map_err(|e| EngineError::Invalid(format!("placement state: {e}")))
}

fn decode_command(bytes: &[u8]) -> Result<Command, EngineError> {
    serde_json::from_slice(bytes).map_err(|e| EngineError::Invalid(format!("placement command: {e}")))
}

impl PlacementStateMachine {
    /// Applies one command; a malformed or refused one changes nothing, alike on every replica.
    fn apply_command(&mut self, command: &[u8], writes: &mut SmWrites) -> ApplyOutput {
        let command = decode_command(command)?;
        let result = self.placement.apply(&command);
        // Liveness changes are what an operator looks for first (logged by every placement
        // replica as it applies them; apply's state is untouched by this).
        match &result {
            Ok(Outcome::NodesDown(ids)) if !ids.is_empty() => tracing::info!(?ids, "placement marked nodes down"),
            Ok(Outcome::NodesUp(ids)) if !ids.is_empty() => tracing::info!(?ids, "placement marked nodes up again"),
            _ => {}
        }
        // A refused command changed nothing (the crate checks before it changes).
        if result.is_ok() {
            writes.put(STATE_KEY, &self.placement.to_bytes());
        }
        serde_json::to_vec(&result).map_err(|e| EngineError::Invalid(format!("placement result: {e}")))
    }
}

impl StateMachine for PlacementStateMachine {
    /// Apply reads nothing from the store (the state is in memory), so it never fails:
    /// every error it returns is the command's outcome.
    fn apply(&mut self, _index: u64, command: &[u8], writes: &mut SmWrites) -> Applied {
        Ok(self.apply_command(command, writes))
    }

    /// Every query answers the whole state (see [`decode_state`]).
    fn query(&self, _query: &[u8]) -> Result<Vec<u8>, EngineError> {
        Ok(self.placement.to_bytes())
    }

    fn reload(&mut self, reader: &SmReader, _applied_index: u64) -> Result<(), StorageError> {
        self.placement = match reader.get(STATE_KEY)? {
            Some(bytes) => Placement::from_bytes(&bytes, self.config.clone()).map_err(|e| StorageError::Corrupt(format!("placement state: {e}")))?,
            None => Placement::new(self.config.clone()),
        };
        // What was loaded is on disk: its version may be published at once.
        self.publish();
        Ok(())
    }

    fn validate(&self, command: &[u8]) -> Result<(), EngineError> {
        decode_command(command).map(drop)
    }

    fn publish(&mut self) {
        if let Some(sender) = &self.routing_version {
            let version = self.placement.routing_version();
            sender.send_if_modified(|published| std::mem::replace(published, version) != version);
        }
    }

    /// Marks down the nodes silent for the heartbeat timeout, judged by the stepless clock
    /// heartbeats are stamped by (`service::now_ms`), not the wall clock in `_clock`: a step
    /// of the wall clock would make every node look silent at once.
    fn leader_proposals(&mut self, _clock: LeaderClock) -> Vec<Vec<u8>> {
        let now_ms = super::service::now_ms();
        let leading_since_ms = *self.leading_since_ms.get_or_insert(now_ms);
        if now_ms < leading_since_ms.saturating_add(self.placement.settings().heartbeat_timeout_ms) {
            return Vec::new();
        }
        let down = self.placement.nodes_to_mark_down(now_ms);
        if down.is_empty() || now_ms < self.mark_down_proposed_ms.saturating_add(MARK_DOWN_RETRY_MS) {
            return Vec::new();
        }
        self.mark_down_proposed_ms = now_ms;
        vec![encode_command(&Command::MarkDown { ids: down, now_ms })]
    }

    fn on_leadership(&mut self, leading: bool, _clock: LeaderClock) {
        self.leading_since_ms = leading.then(super::service::now_ms);
        if !leading {
            self.mark_down_proposed_ms = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_engine::storage::Db;
    use warden_placement::AppliedSettings;

    fn apply(sm: &mut PlacementStateMachine, db: &std::sync::Arc<Db>, index: u64, command: &Command) -> PlacementResult {
        let mut writes = SmWrites::new(warden_placement::PLACEMENT_GROUP_ID);
        let output = sm.apply(index, &encode_command(command), &mut writes).expect("storage").expect("applied");
        db.write_ops(&writes.into_ops(), false).expect("write");
        decode_result(&output).expect("result")
    }

    #[test]
    fn state_survives_a_reload_and_refusals_write_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("db");
        let reader = SmReader::new(db.clone(), warden_placement::PLACEMENT_GROUP_ID);
        let mut sm = PlacementStateMachine::new(PlacementConfig::default());
        sm.reload(&reader, 0).expect("load");
        let nodes = (1..=5).map(|id| (id, format!("127.0.0.1:{}", 7000 + id), String::new())).collect();
        assert!(apply(&mut sm, &db, 1, &Command::Bootstrap { nodes, now_ms: 1, limits: Vec::new(), settings: None }).is_ok());
        let refused = apply(&mut sm, &db, 2, &Command::CreateGroup { prefix: "no-slash".into(), now_ms: 2 });
        assert!(matches!(refused, Err(PlacementError::InvalidPrefix { .. })));
        let created = apply(&mut sm, &db, 3, &Command::CreateGroup { prefix: "/a".into(), now_ms: 3 });
        assert!(matches!(created, Ok(Outcome::GroupCreated(_))));
        let before = sm.query(&[]).expect("query");
        let mut reloaded = PlacementStateMachine::new(PlacementConfig::default());
        reloaded.reload(&reader, 3).expect("reload");
        assert_eq!(reloaded.query(&[]).expect("query"), before);
        assert!(sm.validate(b"{not json").is_err());
    }

    /// A placement state machine (heartbeat timeout 10 s) whose nodes 1 and 2 registered
    /// `ago_ms` before now by the stepless clock; answers its directory (kept while the test
    /// runs), store, state machine and that now.
    fn two_nodes_registered_ms_ago(ago_ms: u64) -> (tempfile::TempDir, std::sync::Arc<Db>, PlacementStateMachine, u64) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(dir.path()).expect("db");
        let config = PlacementConfig { heartbeat_timeout_ms: 10_000, ..PlacementConfig::default() };
        let mut sm = PlacementStateMachine::new(config.clone());
        sm.reload(&SmReader::new(db.clone(), warden_placement::PLACEMENT_GROUP_ID), 0).expect("load");
        let nodes = vec![(1, "127.0.0.1:7001".to_string(), String::new()), (2, "127.0.0.1:7002".to_string(), String::new())];
        let settings = Some(AppliedSettings::of(&config));
        let now_ms = super::super::service::now_ms();
        let bootstrap = Command::Bootstrap { nodes, now_ms: now_ms - ago_ms, limits: Vec::new(), settings };
        assert!(apply(&mut sm, &db, 1, &bootstrap).is_ok());
        (dir, db, sm, now_ms)
    }

    /// Silence is judged by the stepless clock heartbeats are stamped by: a wall clock
    /// stepped an hour ahead (an NTP step) marks down only the node that really is silent.
    #[test]
    fn the_leader_proposes_silent_nodes_down_by_the_stepless_clock_once_per_retry_interval() {
        let (_dir, db, mut sm, now_ms) = two_nodes_registered_ms_ago(20_000);
        assert!(apply(&mut sm, &db, 2, &Command::Heartbeat { ids: vec![2], now_ms }).is_ok());
        // Leading for longer than the heartbeat timeout.
        sm.leading_since_ms = Some(now_ms - 10_000);
        let stepped = LeaderClock { wall_ms: now_ms + 3_600_000, monotonic_ms: 0 };
        let proposed = sm.leader_proposals(stepped);
        assert_eq!(proposed.len(), 1, "{proposed:?}");
        let Ok(Command::MarkDown { ids, now_ms: stamped }) = decode_command(&proposed[0]) else { panic!("a mark-down: {proposed:?}") };
        assert_eq!(ids, vec![1], "only the silent node, however far the wall clock stepped");
        assert!(stamped >= now_ms && stamped < now_ms + 60_000, "stamped by the stepless clock: {stamped} vs {now_ms}");
        assert!(sm.leader_proposals(stepped).is_empty(), "not again while it commits");
    }

    /// A new leader inherits heartbeat stamps made by its predecessor's clock, which may read
    /// far behind its own (each node's stepless clock starts from its wall clock, stepped or
    /// not): to the new leader every node looks a minute silent. It marks nobody down until it
    /// has led for a heartbeat timeout, and then only a node that did not heartbeat it.
    #[test]
    fn a_new_leader_marks_down_only_nodes_silent_for_a_timeout_of_its_own_leadership() {
        let (_dir, db, mut sm, now_ms) = two_nodes_registered_ms_ago(60_000);
        let clock = LeaderClock { wall_ms: now_ms, monotonic_ms: 0 };
        sm.on_leadership(true, clock);
        assert!(sm.leader_proposals(clock).is_empty(), "no node is judged silent by stamps of another clock");
        // A heartbeat timeout later, node 2 has heartbeated the new leader; node 1 has not.
        assert!(apply(&mut sm, &db, 2, &Command::Heartbeat { ids: vec![2], now_ms }).is_ok());
        sm.leading_since_ms = Some(now_ms - 10_000);
        let proposed = sm.leader_proposals(clock);
        let Some(Ok(Command::MarkDown { ids, .. })) = proposed.first().map(|p| decode_command(p)) else { panic!("a mark-down: {proposed:?}") };
        assert_eq!(ids, vec![1], "only the node that stayed silent");
        sm.on_leadership(false, clock);
        assert_eq!(sm.leading_since_ms, None, "a follower has no leadership to time");
    }
}
