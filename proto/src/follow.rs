//! Calling a group's leader and retrying: the one rule the client library, the router, the
//! shard-nodes' calls to other groups, the `warden admin` commands and the tests follow.
//!
//! **The rule.** A call is attempted until it is answered, fails for good, or its deadline
//! would pass during the next pause. After a failed attempt ([`Fault::of`] reads the status
//! and its Warden error detail):
//!
//! - NOT_LEADER and UNAVAILABLE are retried, for every call: the replica did nothing. A
//!   NOT_LEADER that names the leader is followed: the next attempt's [`Turn::hint`] is that
//!   node (the caller sends it there if it knows the node; else it tries the next one).
//! - A connection failure (no Warden error, and a gRPC code a failed connection gives:
//!   UNAVAILABLE, UNKNOWN, CANCELLED, INTERNAL, DEADLINE_EXCEEDED) is retried for an
//!   idempotent call; for a write only when the call provably never reached a server (the
//!   connection was refused: [`crate::never_sent`]).
//! - OUTCOME_UNKNOWN is retried for an idempotent call only.
//! - Anything else is the answer, never retried.
//!
//! So a write ([`CallKind::Write`]) whose connection failed after it was sent, or that got
//! OUTCOME_UNKNOWN, is never sent again: its outcome is unknown to the caller. A caller may
//! also retry an answer it knows changed nothing ([`Follow::retry_anyway`]: the router after
//! WRONG_GROUP, once it has refreshed its routing table).
//!
//! **Pauses and deadline.** The pause before a retry starts at [`BACKOFF_MIN`] and doubles
//! up to [`BACKOFF_MAX`]; no retry starts when `now + pause` reaches the deadline (the last
//! failure is then the call's). Each attempt should carry the time left as its
//! `grpc-timeout` ([`bounded`]) and be cut at the deadline by its caller.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use crate::v1::warden_error::Code;

/// First pause before a retry; doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause between retries.
pub const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Whether sending a call twice can change the outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Reads, keepalives, and calls the server deduplicates (`Lock` with a request id,
    /// `Unlock` of a sequencer): safe to send again whatever happened to the last attempt.
    Idempotent,
    /// Everything else: sent again only when the last attempt was provably not applied.
    Write,
}

impl CallKind {
    /// [`CallKind::Idempotent`] when `idempotent`, else [`CallKind::Write`].
    pub fn of(idempotent: bool) -> CallKind {
        if idempotent {
            CallKind::Idempotent
        } else {
            CallKind::Write
        }
    }
}

/// How an attempt failed, as the rule reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// NOT_LEADER, naming the leader when the replica knows it (never 0).
    NotLeader {
        /// The leader's node id.
        leader: Option<u64>,
    },
    /// UNAVAILABLE: nothing was done (no leader yet, a busy group, a node starting).
    Unavailable,
    /// OUTCOME_UNKNOWN: a write may or may not have been applied.
    OutcomeUnknown,
    /// No Warden error, and a gRPC code of a failed connection.
    Lost {
        /// The call provably never reached a server (the connection was refused).
        never_sent: bool,
    },
    /// An answer: a Warden error of another code (one this build does not know reads as
    /// UNKNOWN), or (`None`) a status without one that is no connection failure.
    Answer {
        /// The Warden error's code.
        code: Option<Code>,
    },
}

impl Fault {
    /// How the attempt that ended with `status` failed.
    pub fn of(status: &Status) -> Fault {
        match crate::error_of(status) {
            Some(error) => match Code::try_from(error.code) {
                Ok(Code::NotLeader) => Fault::NotLeader { leader: Some(error.leader_id).filter(|id| *id != 0) },
                Ok(Code::Unavailable) => Fault::Unavailable,
                Ok(Code::OutcomeUnknown) => Fault::OutcomeUnknown,
                Ok(code) => Fault::Answer { code: Some(code) },
                Err(_) => Fault::Answer { code: Some(Code::Unknown) },
            },
            None if is_connection_failure(status.code()) => Fault::Lost { never_sent: crate::never_sent(status) },
            None => Fault::Answer { code: None },
        }
    }

    /// Whether the rule retries a call of `kind` after this.
    pub fn retried(self, kind: CallKind) -> bool {
        match self {
            Fault::NotLeader { .. } | Fault::Unavailable => true,
            Fault::OutcomeUnknown => kind == CallKind::Idempotent,
            Fault::Lost { never_sent } => never_sent || kind == CallKind::Idempotent,
            Fault::Answer { .. } => false,
        }
    }

    /// The leader a NOT_LEADER named.
    pub fn hint(self) -> Option<u64> {
        match self {
            Fault::NotLeader { leader } => leader,
            _ => None,
        }
    }
}

/// How one attempt failed, as its caller hands it on: a gRPC status, for the rule to judge,
/// or an error that ends the call at once (for example a malformed answer).
#[derive(Debug)]
pub enum Failed<E> {
    /// A status, judged by the rule.
    Status(Status),
    /// The call's error, at once.
    Final(E),
}

impl<E> From<Status> for Failed<E> {
    fn from(status: Status) -> Failed<E> {
        Failed::Status(status)
    }
}

/// Whether a status without a Warden error, of gRPC `code`, is a failure of the connection (or
/// of a router reaching a node) rather than an answer.
pub fn is_connection_failure(code: tonic::Code) -> bool {
    use tonic::Code as Grpc;
    matches!(code, Grpc::Unavailable | Grpc::Unknown | Grpc::Cancelled | Grpc::Internal | Grpc::DeadlineExceeded)
}

/// Exponential backoff: [`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`].
#[derive(Debug)]
pub struct Backoff {
    pause: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
    }
}

impl Backoff {
    /// A backoff at its first pause.
    pub fn new() -> Backoff {
        Backoff { pause: BACKOFF_MIN }
    }

    /// The next pause (and doubles the one after).
    pub fn next_pause(&mut self) -> Duration {
        let pause = self.pause;
        self.pause = (self.pause * 2).min(BACKOFF_MAX);
        pause
    }
}

/// Where an attempt stands in its call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// Attempts made before this one (0: the first).
    pub attempt: usize,
    /// The leader the last attempt's NOT_LEADER named.
    pub hint: Option<u64>,
    /// How the last attempt failed (`None`: this is the first).
    pub last: Option<Fault>,
}

/// One call's retries under the rule: the caller makes an attempt per [`Follow::turn`] and
/// hands each failure to [`Follow::retry_after`], which pauses and lets it try again, or
/// gives the failure back as the call's.
#[derive(Debug)]
pub struct Follow {
    kind: CallKind,
    deadline: Instant,
    backoff: Backoff,
    turn: Turn,
}

impl Follow {
    /// The retries of a call of `kind` that must end by `deadline`.
    pub fn new(kind: CallKind, deadline: Instant) -> Follow {
        Follow { kind, deadline, backoff: Backoff::new(), turn: Turn::default() }
    }

    /// The attempt to make now.
    pub fn turn(&self) -> Turn {
        self.turn
    }

    /// The deadline of the call.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// After an attempt failed with `status`: `Ok` after the pause when the rule retries it
    /// and the deadline allows, else `Err(status)`, the call's failure.
    pub async fn retry_after(&mut self, status: Status) -> Result<(), Status> {
        let fault = Fault::of(&status);
        self.next(status, fault, fault.retried(self.kind)).await
    }

    /// As [`retry_after`](Follow::retry_after) for a failure the caller knows changed nothing
    /// (so only the deadline ends the call).
    pub async fn retry_anyway(&mut self, status: Status) -> Result<(), Status> {
        let fault = Fault::of(&status);
        self.next(status, fault, true).await
    }

    async fn next(&mut self, status: Status, fault: Fault, retry: bool) -> Result<(), Status> {
        let pause = self.backoff.next_pause();
        if !retry || Instant::now() + pause >= self.deadline {
            return Err(status);
        }
        tokio::time::sleep(pause).await;
        self.turn = Turn { attempt: self.turn.attempt + 1, hint: fault.hint(), last: Some(fault) };
        Ok(())
    }
}

/// `message` as a request that carries the time left until `deadline` as its
/// `grpc-timeout`, so the server answers (typed) within the caller's deadline.
pub fn bounded<T>(message: T, deadline: Instant) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: Code) -> Status {
        crate::status(crate::warden_error(code, "/p", "m"))
    }

    #[test]
    fn writes_are_resent_only_when_not_applied() {
        for kind in [CallKind::Idempotent, CallKind::Write] {
            assert!(Fault::of(&status(Code::NotLeader)).retried(kind));
            assert!(Fault::of(&status(Code::Unavailable)).retried(kind));
            assert!(!Fault::of(&status(Code::NoNode)).retried(kind));
            assert!(!Fault::of(&status(Code::WrongGroup)).retried(kind), "only a caller that refreshed its table retries it");
        }
        assert!(Fault::of(&status(Code::OutcomeUnknown)).retried(CallKind::Idempotent));
        assert!(!Fault::of(&status(Code::OutcomeUnknown)).retried(CallKind::Write));
        let reset = Status::unknown("error reading a body from connection");
        assert_eq!(Fault::of(&reset), Fault::Lost { never_sent: false });
        assert!(Fault::of(&reset).retried(CallKind::Idempotent) && !Fault::of(&reset).retried(CallKind::Write));
        let refused = Status::unavailable("tcp connect error: Connection refused");
        assert!(Fault::of(&refused).retried(CallKind::Write));
        assert_eq!(Fault::of(&Status::invalid_argument("no detail")), Fault::Answer { code: None });
    }

    #[test]
    fn not_leader_names_its_leader() {
        let named = crate::status(crate::v1::WardenError { leader_id: 4, ..crate::warden_error(Code::NotLeader, "", "m") });
        assert_eq!(Fault::of(&named).hint(), Some(4));
        assert_eq!(Fault::of(&status(Code::NotLeader)).hint(), None, "0 names no leader");
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let mut backoff = Backoff::new();
        let pauses: Vec<u64> = (0..8).map(|_| backoff.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, vec![10, 20, 40, 80, 160, 320, 500, 500]);
    }

    #[tokio::test]
    async fn a_call_follows_the_hint_and_ends_at_its_deadline() {
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut follow = Follow::new(CallKind::Write, deadline);
        let named = crate::status(crate::v1::WardenError { leader_id: 2, ..crate::warden_error(Code::NotLeader, "", "m") });
        follow.retry_after(named).await.expect("retried");
        assert_eq!((follow.turn().attempt, follow.turn().hint), (1, Some(2)));
        assert!(follow.retry_after(status(Code::OutcomeUnknown)).await.is_err(), "a write is not resent after an unknown outcome");
        let mut follow = Follow::new(CallKind::Idempotent, deadline);
        let mut attempts = 0;
        while follow.retry_after(status(Code::Unavailable)).await.is_ok() {
            attempts += 1;
        }
        assert!(Instant::now() + Duration::from_millis(500) >= deadline && attempts >= 2, "{attempts} retries");
    }
}
