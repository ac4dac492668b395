//! Hibernation of idle groups (TiKV's "hibernate region"): a group that
//! nobody uses stops ticking and heartbeating on every replica, and wakes on any request or
//! raft message that is not routine.
//!
//! Going to sleep takes two steps, so that no replica is left ticking alone (it would miss
//! heartbeats and call an election). The leader, idle for `hibernate_after_ticks` with every
//! replica holding its whole log and nothing waiting, sends each member a *hibernate notice*
//! carrying its term and last index and keeps ticking. A follower that knows that leader at
//! that term, holds exactly that log, has committed and applied all of it and waits for
//! nothing, stops ticking and answers with an *ack*; anything else is ignored (it stays
//! awake, and the leader, still heartbeating, tries again after another idle period). The
//! leader stops ticking once every member acked. Notices, acks and *wake notices* travel as
//! raft messages of a local type marked in `context`, as `membership.rs` marks its removal
//! notice: raft-rs never sends such a type between nodes and refuses to step one.
//!
//! Waking: a request (anything but `Status`) or a raft message wakes a sleeping replica,
//! except the routine ones that a sleeping group still exchanges when its leader is awake
//! and its followers are not: heartbeats from the known leader at the current term, and
//! their responses. A follower woken by anything but its leader sends its leader a wake
//! notice, so the leader heartbeats again before the follower's election timer fires; a woken
//! leader heartbeats at once. A replica loaded when its node starts sends every member a wake
//! notice (`announce_start`): it knows no leader, and would otherwise campaign against a
//! sleeping one. A woken follower that then misses its leader for an election timeout
//! campaigns as usual, so failover after a request is what it is in an awake group.
//!
//! Leases. raft-rs refuses a (pre)vote while it heard from a leader less than an election
//! timeout ago (`in_lease`, counted in ticks by `election_elapsed`), so that a partitioned or
//! removed replica cannot disrupt a healthy leader. A sleeping replica's count stopped when it
//! fell asleep: it would claim to have heard from the leader moments ago however long it
//! slept. A follower woken by a raft message of another member (in practice a vote or
//! pre-vote of a replica that missed the leader) therefore counts the election timeout as
//! passed, and the message is judged on terms and logs alone (one of a node outside its
//! configuration, a replica removed while away, gets no such favour). That is safe: raft's safety
//! comes from terms, one vote per term (persisted) and the log comparison, none of which this
//! touches; the lease only prevents disruption, and a candidate here has missed the leader
//! for a whole election timeout itself (a woken leader heartbeats at once, which ends a
//! pre-candidacy). A follower woken by a request starts its count at zero instead, as a
//! restarted follower does: it expects its leader's heartbeat (the wake notice asks for it)
//! and campaigns only after a full randomized election timeout without one.

use raft::eraftpb::{Message, MessageType};
use raft::StateRole;

use super::msg::WorkerMsg;
use super::replica::Replica;
use crate::config::NodeConfig;
use crate::transport::RaftSender;

/// `context` of a hibernate notice (leader → member: term, last index, last term).
const HIBERNATE_NOTICE: &[u8] = b"warden/hibernate";
/// `context` of a member's answer to a notice it acted on (term, index of the notice).
const HIBERNATE_ACK: &[u8] = b"warden/hibernate-ack";
/// `context` of a wake notice (a follower woken by a request → its leader: term).
const WAKE_NOTICE: &[u8] = b"warden/wake";

/// Where a replica stands with hibernation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Hibernation {
    /// Ticking. A leader counts the ticks since its last request in `idle_ticks`.
    Awake { idle_ticks: u64 },
    /// Leader only, still ticking: notices for `(term, index)` went out `waited_ticks` ago;
    /// `acked` are the members that answered.
    Proposed { term: u64, index: u64, acked: Vec<u64>, waited_ticks: u64 },
    /// Not ticking: nothing happens until a request or a raft message that is not routine.
    Asleep,
}

impl Default for Hibernation {
    fn default() -> Self {
        Hibernation::Awake { idle_ticks: 0 }
    }
}

/// What a hibernation message says, read from a raft message of the local type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Notice {
    Hibernate,
    Ack,
    Wake,
}

fn notice_of(message: &Message) -> Option<Notice> {
    if message.get_msg_type() != MessageType::MsgUnreachable {
        return None;
    }
    match message.context.as_ref() {
        HIBERNATE_NOTICE => Some(Notice::Hibernate),
        HIBERNATE_ACK => Some(Notice::Ack),
        WAKE_NOTICE => Some(Notice::Wake),
        _ => None,
    }
}

/// True for the worker messages that wake a sleeping replica: every request for the group.
/// `Status` is for observation and must not change what it observes; transport reports
/// (`Unreachable`, `SnapshotStatus`) are about messages sent while awake and need no ticks;
/// raft messages are judged by [`Replica::screen_hibernation`].
pub(crate) fn request_wakes(message: &WorkerMsg) -> bool {
    match message {
        WorkerMsg::Propose { .. }
        | WorkerMsg::Read { .. }
        | WorkerMsg::ConfChange { .. }
        | WorkerMsg::TransferLeader { .. }
        | WorkerMsg::Campaign { .. }
        // Woken so it is destroyed by the loop's step that looks at awake replicas.
        | WorkerMsg::DestroyGroup { .. }
        | WorkerMsg::Await { .. }
        | WorkerMsg::LeaderCall { .. } => true,
        WorkerMsg::Raft { .. }
        | WorkerMsg::Unreachable { .. }
        | WorkerMsg::SnapshotStatus { .. }
        | WorkerMsg::Status { .. }
        | WorkerMsg::CreateGroup { .. } => false,
    }
}

impl Replica {
    /// True while the replica sleeps (the worker neither ticks nor polls it).
    pub(crate) fn is_asleep(&self) -> bool {
        self.hibernation == Hibernation::Asleep
    }

    /// A request for the group arrived here: a sleeping replica wakes (a follower tells its
    /// leader), and a leader's idle count starts over.
    pub(crate) fn on_request(&mut self, sender: &dyn RaftSender) {
        if self.is_asleep() && !self.is_leader() {
            // See the module comment: a full randomized election timeout to hear the leader.
            self.raw.raft.election_elapsed = 0;
            self.wake_leader(sender);
        }
        self.resume_ticking();
    }

    /// Asks the leader this follower knows to heartbeat again.
    fn wake_leader(&mut self, sender: &dyn RaftSender) {
        if let Some(leader) = self.leader_hint().filter(|leader| *leader != self.raw.raft.id) {
            let wake = self.local_message(leader, WAKE_NOTICE, 0, 0);
            self.send(sender, vec![wake]);
        }
    }

    /// Called once for each replica a node loads when it starts: the replica does not know
    /// its leader, and its group may be asleep, so it asks every member to wake. A sleeping
    /// leader then heartbeats before this replica's election timer fires; without this, a
    /// node restarting among sleeping groups would have each of its replicas call a
    /// (pre-)election that the sleeping followers, woken by it outside their old lease,
    /// would grant: an election per group for nothing.
    pub(crate) fn announce_start(&mut self, sender: &dyn RaftSender) {
        let raft = &self.raw.raft;
        if raft.prs().get(raft.id).is_none() {
            return; // Not in its own configuration yet: it waits for a snapshot.
        }
        let members: Vec<u64> = raft.prs().iter().map(|(id, _)| *id).filter(|id| *id != raft.id).collect();
        let notices = members.into_iter().map(|member| self.local_message(member, WAKE_NOTICE, 0, 0)).collect();
        self.send(sender, notices);
    }

    /// Once per tick of an awake replica: a leader idle long enough, whose group is settled,
    /// asks its members to sleep; one whose notices were not all answered in an election
    /// timeout waits another idle period before it asks again.
    pub(crate) fn tick_hibernation(&mut self, config: &NodeConfig, sender: &dyn RaftSender) {
        if config.hibernate_after_ticks == 0 || !self.is_leader() {
            self.hibernation = Hibernation::default();
            return;
        }
        match &mut self.hibernation {
            Hibernation::Awake { idle_ticks } => {
                *idle_ticks += 1;
                if *idle_ticks >= config.hibernate_after_ticks && self.leader_may_sleep() {
                    self.propose_hibernation(sender);
                }
            }
            Hibernation::Proposed { waited_ticks, .. } => {
                *waited_ticks += 1;
                if *waited_ticks >= config.election_tick as u64 {
                    self.hibernation = Hibernation::default();
                }
            }
            Hibernation::Asleep => {}
        }
    }

    /// Looks at a raft message before raft does: acts on hibernation messages (returns
    /// `None`: raft never steps them), and wakes this replica for any other message that is
    /// not routine.
    pub(crate) fn screen_hibernation(&mut self, config: &NodeConfig, message: Message, sender: &dyn RaftSender) -> Option<Message> {
        match notice_of(&message) {
            Some(Notice::Hibernate) => {
                self.on_hibernate_notice(config, &message, sender);
                None
            }
            Some(Notice::Ack) => {
                self.on_hibernate_ack(&message);
                None
            }
            Some(Notice::Wake) => {
                // From a member of this term or an older one (a restarted replica that missed
                // a term is told the new one by the heartbeat).
                if self.is_leader() && message.term <= self.raw.raft.term && self.raw.raft.prs().get(message.from).is_some() {
                    self.resume_ticking();
                }
                None
            }
            None => {
                if self.is_asleep() && !self.is_routine(&message) {
                    let raft = &self.raw.raft;
                    let from_leader = message.from == raft.leader_id && message.term == raft.term;
                    if raft.state != StateRole::Leader && !from_leader {
                        if raft.prs().get(message.from).is_some() {
                            // See the module comment: judge this message on terms and logs.
                            let timeout = raft.election_timeout();
                            self.raw.raft.election_elapsed = self.raw.raft.election_elapsed.max(timeout);
                        } else {
                            // Not a member (a replica removed while away): it gets no lease
                            // dropped for it; a full election timeout to hear the leader.
                            self.raw.raft.election_elapsed = 0;
                        }
                        // Whoever woke it, the leader must heartbeat again now.
                        self.wake_leader(sender);
                    }
                    self.resume_ticking();
                }
                Some(message)
            }
        }
    }

    /// Messages a sleeping replica steps without waking: a heartbeat from the leader it
    /// knows at its term (the leader woke for a read and confirms it with heartbeats; the
    /// follower has nothing to do but answer), and a heartbeat response at the leader's term
    /// (late, or an answer to such a confirmation).
    fn is_routine(&self, message: &Message) -> bool {
        let raft = &self.raw.raft;
        if message.term != raft.term {
            return false;
        }
        match message.get_msg_type() {
            MessageType::MsgHeartbeat => raft.state == StateRole::Follower && message.from == raft.leader_id,
            MessageType::MsgHeartbeatResponse => raft.state == StateRole::Leader && raft.prs().get(message.from).is_some(),
            _ => false,
        }
    }

    /// Resumes ticking. A leader heartbeats at once (a follower woken by a request or a
    /// campaign then hears it) and gives its followers a full election timeout to answer
    /// before check-quorum judges them.
    fn resume_ticking(&mut self) {
        if self.is_asleep() && self.is_leader() {
            self.raw.raft.election_elapsed = 0;
            self.raw.ping();
        }
        self.hibernation = Hibernation::default();
    }

    /// True when this leader's group is settled: every member holds its whole log, all of it
    /// is committed and applied, nothing waits, no configuration change or leader transfer
    /// is under way, and the state machine needs no clock (`StateMachine::needs_ticks`).
    fn leader_may_sleep(&self) -> bool {
        let raft = &self.raw.raft;
        let last = raft.raft_log.last_index();
        let conf = raft.prs().conf().to_conf_state();
        self.applied.term == raft.term
            && raft.raft_log.committed == last
            && self.applied.index == last
            && raft.lead_transferee.is_none()
            && !raft.has_pending_conf()
            && conf.voters_outgoing.is_empty()
            && raft.prs().iter().all(|(id, progress)| *id == raft.id || progress.matched == last)
            && self.is_idle()
            && !self.sm.needs_ticks()
    }

    /// Nothing waits on this replica and nothing of it is in flight.
    fn is_idle(&self) -> bool {
        self.proposals.is_empty()
            && self.batch.is_empty()
            && self.queued_reads.is_empty()
            && self.inflight_read.is_none()
            && self.confirmed_reads.is_empty()
            && self.awaiting.is_empty()
            && self.unpersisted.is_empty()
            && !self.installing_snapshot
            && !self.removed
    }

    fn propose_hibernation(&mut self, sender: &dyn RaftSender) {
        let raft = &self.raw.raft;
        let (term, index, log_term) = (raft.term, raft.raft_log.last_index(), raft.raft_log.last_term());
        let members: Vec<u64> = raft.prs().iter().map(|(id, _)| *id).filter(|id| *id != raft.id).collect();
        if members.is_empty() {
            self.hibernation = Hibernation::Asleep;
            return;
        }
        let notices = members.iter().map(|member| self.local_message(*member, HIBERNATE_NOTICE, index, log_term)).collect();
        self.send(sender, notices);
        self.hibernation = Hibernation::Proposed { term, index, acked: Vec::new(), waited_ticks: 0 };
    }

    fn on_hibernate_notice(&mut self, config: &NodeConfig, notice: &Message, sender: &dyn RaftSender) {
        if !self.accepts_hibernate_notice(config, notice) {
            tracing::debug!(group = self.group, from = notice.from, index = notice.index, "ignoring a hibernate notice");
            return;
        }
        self.hibernation = Hibernation::Asleep;
        // Answered again for a repeated notice: the first ack may have been lost.
        let ack = self.local_message(notice.from, HIBERNATE_ACK, notice.index, 0);
        self.send(sender, vec![ack]);
    }

    /// The follower's side of the rule in the module comment.
    fn accepts_hibernate_notice(&self, config: &NodeConfig, notice: &Message) -> bool {
        let raft = &self.raw.raft;
        config.hibernate_after_ticks > 0
            && raft.state == StateRole::Follower
            && notice.from == raft.leader_id
            && notice.term == raft.term
            && raft.raft_log.last_index() == notice.index
            && raft.raft_log.last_term() == notice.log_term
            && raft.raft_log.committed == notice.index
            && self.applied.index == notice.index
            && self.is_idle()
    }

    fn on_hibernate_ack(&mut self, ack: &Message) {
        let raft = &self.raw.raft;
        let member = raft.prs().get(ack.from).is_some();
        let Hibernation::Proposed { term, index, acked, .. } = &mut self.hibernation else { return };
        if raft.state != StateRole::Leader || !member || ack.term != *term || *term != raft.term || ack.index != *index {
            return;
        }
        if !acked.contains(&ack.from) {
            acked.push(ack.from);
        }
        let everyone = raft.prs().iter().all(|(id, _)| *id == raft.id || acked.contains(id));
        // The log cannot have moved (a proposal wakes the leader), but sleeping on a log the
        // members did not ack would leave them behind: checked, not assumed.
        if everyone && raft.raft_log.last_index() == *index {
            self.hibernation = Hibernation::Asleep;
        }
    }

    /// A hibernation message of this replica's term to `to`.
    fn local_message(&self, to: u64, context: &[u8], index: u64, log_term: u64) -> Message {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgUnreachable);
        message.to = to;
        message.from = self.raw.raft.id;
        message.term = self.raw.raft.term;
        message.index = index;
        message.log_term = log_term;
        message.context = context.to_vec().into();
        message
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::host::msg::ReadConsistency;

    /// Keeps what a replica sends.
    #[derive(Default)]
    struct Sent(Mutex<Vec<Message>>);

    impl RaftSender for Sent {
        fn send(&self, _group: u64, message: Message) -> Result<(), Message> {
            self.0.lock().expect("lock").push(message);
            Ok(())
        }
    }

    impl Sent {
        fn take(&self) -> Vec<Message> {
            std::mem::take(&mut *self.0.lock().expect("lock"))
        }
    }

    const GROUP: u64 = 9;

    /// Node `node`'s replica of a fresh group of voters 1, 2, 3 (log at index 5, term 5,
    /// committed and applied), with the directory it lives in.
    fn replica(node: u64) -> (Replica, NodeConfig, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = crate::storage::Db::open(dir.path()).expect("db");
        let mut config = NodeConfig::new(node, dir.path().to_path_buf());
        config.hibernate_after_ticks = crate::config::HIBERNATE_AFTER_TICKS_ON;
        db.write_ops(&crate::storage::PeerStorage::bootstrap_ops(GROUP, &[1, 2, 3]), true).expect("bootstrap");
        let replica = Replica::load(&config, db, GROUP, &crate::kv::KvFactory).expect("replica");
        (replica, config, dir)
    }

    /// Node 2's replica, a follower of leader 1 at term 5.
    fn follower() -> (Replica, NodeConfig, tempfile::TempDir) {
        let (mut replica, config, dir) = replica(2);
        replica.raw.raft.become_follower(5, 1);
        (replica, config, dir)
    }

    fn notice(from: u64, term: u64, index: u64, log_term: u64) -> Message {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgUnreachable);
        message.from = from;
        message.to = 2;
        message.term = term;
        message.index = index;
        message.log_term = log_term;
        message.context = HIBERNATE_NOTICE.to_vec().into();
        message
    }

    fn raft_message(kind: MessageType, from: u64, term: u64) -> Message {
        let mut message = Message::default();
        message.set_msg_type(kind);
        message.from = from;
        message.to = 2;
        message.term = term;
        message
    }

    #[test]
    fn a_follower_sleeps_on_its_leaders_notice_for_its_own_log_and_acks_it() {
        let (mut follower, config, _dir) = follower();
        let sent = Sent::default();
        assert!(follower.screen_hibernation(&config, notice(1, 5, 5, 5), &sent).is_none(), "raft never steps a notice");
        assert!(follower.is_asleep());
        let acks = sent.take();
        assert_eq!(acks.len(), 1);
        assert_eq!((acks[0].to, acks[0].term, acks[0].index, acks[0].context.as_ref()), (1, 5, 5, HIBERNATE_ACK));
        // A repeated notice is acked again (the first ack may have been lost).
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &sent);
        assert_eq!(sent.take().len(), 1);
    }

    #[test]
    fn a_follower_ignores_every_other_notice() {
        let cases: [(&str, Message); 5] = [
            ("from a node that is not its leader", notice(3, 5, 5, 5)),
            ("of another term", notice(1, 6, 5, 5)),
            ("for a longer log", notice(1, 5, 6, 5)),
            ("for a shorter log", notice(1, 5, 4, 5)),
            ("for a log whose last entry has another term", notice(1, 5, 5, 4)),
        ];
        for (what, message) in cases {
            let (mut follower, config, _dir) = follower();
            let sent = Sent::default();
            assert!(follower.screen_hibernation(&config, message, &sent).is_none());
            assert!(!follower.is_asleep(), "a notice {what} must be ignored");
            assert!(sent.take().is_empty(), "no ack for a notice {what}");
        }
        // A follower with a request waiting stays awake for its deadline and answer.
        let (mut follower, config, _dir) = follower();
        let (reply, _answer) = tokio::sync::oneshot::channel();
        follower.read(&config, crate::kv::get(b"k"), ReadConsistency::Linearizable, Instant::now() + Duration::from_secs(5), reply);
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &Sent::default());
        assert!(!follower.is_asleep(), "a follower with a read waiting stays awake");
        // Nor does a node with hibernation off sleep.
        let (mut follower, mut config, _dir) = self::follower();
        config.hibernate_after_ticks = 0;
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &Sent::default());
        assert!(!follower.is_asleep(), "hibernation off");
    }

    #[test]
    fn a_sleeping_follower_answers_its_leaders_heartbeats_asleep_and_wakes_for_anything_else() {
        let (mut follower, config, _dir) = follower();
        let sent = Sent::default();
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &sent);
        assert!(follower.is_asleep());
        let heartbeat = raft_message(MessageType::MsgHeartbeat, 1, 5);
        assert!(follower.screen_hibernation(&config, heartbeat, &sent).is_some(), "raft steps the heartbeat");
        assert!(follower.is_asleep(), "the leader's heartbeat is routine");
        // A pre-vote of another member wakes it, outside the lease it measured before sleeping,
        // and it asks its leader to heartbeat.
        sent.take();
        follower.raw.raft.election_elapsed = 1;
        let pre_vote = raft_message(MessageType::MsgRequestPreVote, 3, 6);
        assert!(follower.screen_hibernation(&config, pre_vote, &sent).is_some());
        assert!(!follower.is_asleep());
        assert!(follower.raw.raft.election_elapsed >= follower.raw.raft.election_timeout(), "not in the old leader's lease");
        let wake: Vec<(u64, Vec<u8>)> = sent.take().iter().map(|m| (m.to, m.context.to_vec())).collect();
        assert_eq!(wake, [(1, WAKE_NOTICE.to_vec())]);
        // A node outside its configuration (a replica removed while away) gets no lease dropped.
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &sent);
        follower.raw.raft.election_elapsed = 3;
        follower.screen_hibernation(&config, raft_message(MessageType::MsgRequestPreVote, 7, 6), &sent);
        assert!(!follower.is_asleep());
        assert_eq!(follower.raw.raft.election_elapsed, 0, "a full election timeout to hear its leader first");
        // An append from its leader wakes it too, lease untouched (raft resets it).
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &sent);
        follower.raw.raft.election_elapsed = 1;
        follower.screen_hibernation(&config, raft_message(MessageType::MsgAppend, 1, 5), &sent);
        assert!(!follower.is_asleep());
        assert_eq!(follower.raw.raft.election_elapsed, 1);
    }

    #[test]
    fn a_follower_woken_by_a_request_tells_its_leader() {
        let (mut follower, config, _dir) = follower();
        let sent = Sent::default();
        follower.screen_hibernation(&config, notice(1, 5, 5, 5), &sent);
        sent.take();
        follower.raw.raft.election_elapsed = 7;
        follower.on_request(&sent);
        assert!(!follower.is_asleep());
        assert_eq!(follower.raw.raft.election_elapsed, 0, "a full election timeout to hear the leader");
        let wake = sent.take();
        assert_eq!(wake.len(), 1);
        assert_eq!((wake[0].to, wake[0].term, wake[0].context.as_ref()), (1, 5, WAKE_NOTICE));
        // An awake replica sends nothing for a request.
        follower.on_request(&sent);
        assert!(sent.take().is_empty());
    }

    /// Node 1's replica, leader of term 6 with its first entry (6) committed, applied and
    /// held by both followers.
    fn settled_leader() -> (Replica, NodeConfig, tempfile::TempDir) {
        let (mut leader, config, dir) = replica(1);
        leader.raw.raft.become_candidate();
        leader.raw.raft.become_leader();
        let (term, last) = (leader.raw.raft.term, leader.raw.raft.raft_log.last_index());
        assert_eq!((term, last), (6, 6));
        for id in [2, 3] {
            if let Some(progress) = leader.raw.raft.mut_prs().get_mut(id) {
                progress.matched = last;
            }
        }
        leader.raw.raft.raft_log.committed = last;
        leader.applied.index = last;
        leader.applied.term = term;
        (leader, config, dir)
    }

    fn ack(from: u64, term: u64, index: u64) -> Message {
        let mut message = raft_message(MessageType::MsgUnreachable, from, term);
        message.to = 1;
        message.index = index;
        message.context = HIBERNATE_ACK.to_vec().into();
        message
    }

    #[test]
    fn an_idle_settled_leader_asks_every_member_and_sleeps_once_all_acked() {
        let (mut leader, config, _dir) = settled_leader();
        let sent = Sent::default();
        for _ in 1..config.hibernate_after_ticks {
            leader.tick_hibernation(&config, &sent);
        }
        assert!(sent.take().is_empty(), "not idle long enough yet");
        leader.tick_hibernation(&config, &sent);
        let mut notices: Vec<(u64, u64, u64, u64)> = sent.take().iter().map(|m| (m.to, m.term, m.index, m.log_term)).collect();
        notices.sort_unstable();
        assert_eq!(notices, [(2, 6, 6, 6), (3, 6, 6, 6)]);
        leader.screen_hibernation(&config, ack(2, 6, 5), &sent);
        leader.screen_hibernation(&config, ack(3, 5, 6), &sent);
        leader.screen_hibernation(&config, ack(2, 6, 6), &sent);
        assert!(!leader.is_asleep(), "acks of another index or term do not count, and node 3 has not acked");
        leader.screen_hibernation(&config, ack(3, 6, 6), &sent);
        assert!(leader.is_asleep());
        // A sleeping leader steps late heartbeat responses asleep; a wake notice wakes it and it heartbeats.
        let mut response = raft_message(MessageType::MsgHeartbeatResponse, 2, 6);
        response.to = 1;
        leader.screen_hibernation(&config, response, &sent);
        assert!(leader.is_asleep());
        let mut wake = raft_message(MessageType::MsgUnreachable, 2, 6);
        wake.to = 1;
        wake.context = WAKE_NOTICE.to_vec().into();
        leader.screen_hibernation(&config, wake, &sent);
        assert!(!leader.is_asleep());
        let heartbeats = leader.raw.raft.msgs.iter().filter(|m| m.get_msg_type() == MessageType::MsgHeartbeat).count();
        assert_eq!(heartbeats, 2, "a woken leader heartbeats at once");
    }

    #[test]
    fn a_replica_starting_up_wakes_every_member_and_a_leader_wakes_for_an_older_term() {
        let (mut restarted, _config, _dir) = replica(2);
        let sent = Sent::default();
        restarted.announce_start(&sent);
        let mut to: Vec<u64> = sent.take().iter().filter(|m| m.context.as_ref() == WAKE_NOTICE).map(|m| m.to).collect();
        to.sort_unstable();
        assert_eq!(to, [1, 3]);
        // The leader moved to term 6 while node 2 was down: its wake notice of term 5 still wakes it.
        let (mut leader, config, _dir) = settled_leader();
        leader.hibernation = Hibernation::Asleep;
        let mut wake = raft_message(MessageType::MsgUnreachable, 2, 5);
        wake.to = 1;
        wake.context = WAKE_NOTICE.to_vec().into();
        leader.screen_hibernation(&config, wake.clone(), &sent);
        assert!(!leader.is_asleep());
        // Not from a member: ignored.
        leader.hibernation = Hibernation::Asleep;
        wake.from = 7;
        leader.screen_hibernation(&config, wake, &sent);
        assert!(leader.is_asleep());
    }

    #[test]
    fn a_leader_does_not_ask_while_a_member_lags_or_a_request_came() {
        let (mut leader, config, _dir) = settled_leader();
        let sent = Sent::default();
        if let Some(progress) = leader.raw.raft.mut_prs().get_mut(3) {
            progress.matched = 5;
        }
        for _ in 0..config.hibernate_after_ticks * 2 {
            leader.tick_hibernation(&config, &sent);
        }
        assert!(sent.take().is_empty(), "node 3 lacks the last entry");
        let (mut leader, config, _dir) = settled_leader();
        for _ in 1..config.hibernate_after_ticks {
            leader.tick_hibernation(&config, &sent);
        }
        leader.on_request(&sent);
        leader.tick_hibernation(&config, &sent);
        assert!(sent.take().is_empty(), "a request starts the idle count over");
    }
}
