//! What may be retried after a failed attempt, and the pause before the next one.
//!
//! The rule (the router applies the same one towards the nodes):
//! an idempotent call is retried on any failure of the connection, on UNAVAILABLE,
//! NOT_LEADER and OUTCOME_UNKNOWN; a write only when the failure proves it was not applied —
//! the connection was refused before anything was sent (`never_sent`), or the server answered
//! NOT_LEADER or UNAVAILABLE. A write whose connection failed after it was sent, or that got
//! OUTCOME_UNKNOWN, is never sent again: the caller gets [`Error::OutcomeUnknown`].

use std::time::Duration;

use tonic::Status;

use crate::error::Error;

/// First pause before a retry; doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause between retries.
const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Whether sending a call twice can change the outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// Reads, keepalives, and calls the server deduplicates (`Lock` with a request id,
    /// `Unlock` of a sequencer): safe to send again whatever happened to the last attempt.
    Idempotent,
    /// Everything else: sent again only when the last attempt was provably not applied.
    Write,
}

/// What to do after a failed attempt.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// The caller's error if no retry follows.
    pub error: Error,
    /// Whether another attempt may follow.
    pub retry: bool,
    /// Whether the router was unreachable (the next attempt goes to the next endpoint).
    pub next_endpoint: bool,
}

/// Judges a failed attempt of a call of `kind`.
pub(crate) fn judge(status: &Status, kind: CallKind) -> Verdict {
    let error = Error::from_status(status);
    match &error {
        Error::NotLeader { .. } | Error::Unavailable { .. } => Verdict { error, retry: true, next_endpoint: false },
        Error::OutcomeUnknown { .. } => Verdict { error, retry: kind == CallKind::Idempotent, next_endpoint: false },
        Error::Transport { .. } if warden_proto::never_sent(status) => Verdict { error, retry: true, next_endpoint: true },
        Error::Transport { message } => match kind {
            CallKind::Idempotent => Verdict { error, retry: true, next_endpoint: true },
            CallKind::Write => {
                let error = Error::OutcomeUnknown { message: format!("the connection failed after the write was sent: {message}") };
                Verdict { error, retry: false, next_endpoint: true }
            }
        },
        _ => Verdict { error, retry: false, next_endpoint: false },
    }
}

/// How one attempt of a call failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A gRPC status, judged by [`judge`].
    Status(Status),
    /// An answer that ends the call at once (for example a malformed one).
    Final(Error),
}

impl From<Status> for Failure {
    fn from(status: Status) -> Failure {
        Failure::Status(status)
    }
}

/// Whether an error may pass with time (the group or the connection was unavailable, or the
/// outcome is unknown), as opposed to a definite refusal.
pub(crate) fn is_transient(error: &Error) -> bool {
    matches!(
        error,
        Error::Transport { .. } | Error::DeadlineExceeded | Error::Unavailable { .. } | Error::NotLeader { .. } | Error::OutcomeUnknown { .. }
    )
}

/// Exponential backoff: 10 ms doubling to 500 ms.
#[derive(Debug)]
pub(crate) struct Backoff {
    pause: Duration,
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

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::v1::warden_error::Code;

    fn status(code: Code) -> Status {
        warden_proto::status(warden_proto::warden_error(code, "/p", "m"))
    }

    #[test]
    fn writes_are_resent_only_when_not_applied() {
        for kind in [CallKind::Idempotent, CallKind::Write] {
            assert!(judge(&status(Code::NotLeader), kind).retry);
            assert!(judge(&status(Code::Unavailable), kind).retry);
            assert!(!judge(&status(Code::NoNode), kind).retry);
        }
        assert!(judge(&status(Code::OutcomeUnknown), CallKind::Idempotent).retry);
        let unknown = judge(&status(Code::OutcomeUnknown), CallKind::Write);
        assert!(!unknown.retry && matches!(unknown.error, Error::OutcomeUnknown { .. }));
        let reset = Status::unknown("error reading a body from connection");
        assert!(judge(&reset, CallKind::Idempotent).retry);
        let lost = judge(&reset, CallKind::Write);
        assert!(!lost.retry && lost.next_endpoint && matches!(lost.error, Error::OutcomeUnknown { .. }));
        let refused = judge(&Status::unavailable("tcp connect error: Connection refused"), CallKind::Write);
        assert!(refused.retry && refused.next_endpoint);
    }

    #[test]
    fn backoff_doubles_to_its_cap() {
        let mut backoff = Backoff::new();
        let pauses: Vec<u64> = (0..8).map(|_| backoff.next_pause().as_millis() as u64).collect();
        assert_eq!(pauses, vec![10, 20, 40, 80, 160, 320, 500, 500]);
    }
}
