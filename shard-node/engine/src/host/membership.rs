//! Membership checks on messages from the network, which raft-rs leaves to its host.
//!
//! A replica removed from its group while its node was down never applies its removal: when
//! the node comes back, the replica still believes it is a member, ticks and campaigns
//! (pre-votes) forever, and nobody answers it. So the group's leader answers a message from
//! a node outside its configuration with a removal notice, and the stale replica that
//! receives one destroys itself (as a replica that applied its own removal does).
//!
//! The notice is safe to act on only when it proves that the receiver's whole log is
//! behind the configuration that excludes it: it carries the leader's term and applied
//! index, and the receiver destroys itself only when its term is not newer and its log ends
//! at or before that index. Every replica's log is a prefix of the one committed log up to
//! its commit point, so a replica whose log ends there cannot hold a later change that
//! added it back, nor have acknowledged any entry after it; a replica added again later
//! (its log starts at a snapshot taken after it was added) ignores a notice delayed from
//! before, and so does one told by an old leader that lost its leadership. A replica that is
//! not in its own configuration ignores every notice: it was created empty to be added (or
//! re-added) and is waiting for its first snapshot, so its empty log proves nothing, and a
//! notice addressed to the incarnation destroyed before it must not end it.

use raft::eraftpb::{Message, MessageType};

use super::replica::Replica;
use crate::transport::RaftSender;

/// `context` of a removal notice. The notice travels as a raft message of a local type
/// (`MsgUnreachable`), which raft-rs never sends between nodes and refuses to step, so raft
/// traffic is never mistaken for a notice nor a notice for raft traffic.
const REMOVAL_NOTICE: &[u8] = b"warden/removed-from-group";

impl Replica {
    /// Looks at a message from the network before raft does: answers one from outside the
    /// group, acts on a removal notice. Returns the message if raft should step it.
    pub(crate) fn screen(&mut self, message: Message, sender: &dyn RaftSender) -> Option<Message> {
        if message.get_msg_type() == MessageType::MsgUnreachable && message.context.as_ref() == REMOVAL_NOTICE {
            self.on_removal_notice(&message);
            return None;
        }
        if self.raw.raft.prs().get(message.from).is_some() || !self.knows_current_configuration() {
            return Some(message);
        }
        // The sender is not in the configuration: it can only be a replica removed while it
        // was away. Its message means nothing to the group; tell it where the group stands.
        let mut notice = Message::default();
        notice.set_msg_type(MessageType::MsgUnreachable);
        notice.to = message.from;
        notice.from = self.raw.raft.id;
        notice.term = self.raw.raft.term;
        notice.index = self.applied.index;
        notice.context = REMOVAL_NOTICE.to_vec().into();
        tracing::debug!(group = self.group, to = notice.to, applied = notice.index, "telling a removed replica it left the group");
        self.send(sender, vec![notice]);
        None
    }

    /// True when this replica's configuration includes every change committed before now:
    /// it leads, and has applied an entry of its own term (so everything committed before
    /// its term).
    fn knows_current_configuration(&self) -> bool {
        self.is_leader() && self.applied.term == self.raw.raft.term
    }

    fn on_removal_notice(&mut self, notice: &Message) {
        let raft = &self.raw.raft;
        let last_index = raft.raft_log.last_index();
        let member_by_own_log = raft.prs().get(raft.id).is_some();
        if !member_by_own_log || notice.term < raft.term || last_index > notice.index || self.removed {
            tracing::debug!(group = self.group, from = notice.from, term = raft.term, last_index, "ignoring a removal notice that is not newer");
            return;
        }
        tracing::info!(
            node = raft.id,
            group = self.group,
            leader = notice.from,
            leader_term = notice.term,
            leader_applied = notice.index,
            last_index,
            "the group's leader says this replica was removed; destroying it"
        );
        self.removed = true;
    }
}
