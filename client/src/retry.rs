//! What may be retried after a failed attempt, and the pause before the next one: the rule
//! is `warden_proto::follow`'s (the router applies the same one towards the nodes):
//! an idempotent call is retried on any failure of the connection, on UNAVAILABLE,
//! NOT_LEADER and OUTCOME_UNKNOWN; a write only when the failure proves it was not applied —
//! the connection was refused before anything was sent (`never_sent`), or the server answered
//! NOT_LEADER or UNAVAILABLE. A write whose connection failed after it was sent, or that got
//! OUTCOME_UNKNOWN, is never sent again: the caller gets [`Error::OutcomeUnknown`]. This
//! module turns the rule's verdicts into the client's errors.

use tonic::Status;
use warden_proto::follow::Fault;
pub(crate) use warden_proto::follow::{Backoff, CallKind};

use crate::error::Error;

/// What to do after a failed attempt.
#[derive(Debug)]
pub(crate) struct Verdict {
    /// The caller's error if no retry follows (whether one does is the rule's:
    /// `warden_proto::follow`).
    pub error: Error,
    /// Whether the router was unreachable (the next attempt goes to the next endpoint).
    pub next_endpoint: bool,
}

/// Judges a failed attempt of a call of `kind`.
pub(crate) fn judge(status: &Status, kind: CallKind) -> Verdict {
    let fault = Fault::of(status);
    let error = Error::from_status(status);
    match (fault, error) {
        (Fault::Lost { never_sent: false }, Error::Transport { message }) if kind == CallKind::Write => {
            let error = Error::OutcomeUnknown { message: format!("the connection failed after the write was sent: {message}") };
            Verdict { error, next_endpoint: true }
        }
        (Fault::Lost { .. }, error) => Verdict { error, next_endpoint: true },
        (_, error) => Verdict { error, next_endpoint: false },
    }
}

/// How one attempt of a call failed: a gRPC status, judged by [`judge`], or (`Final`) an
/// answer that ends the call at once (for example a malformed one).
pub(crate) type Failure = warden_proto::follow::Failed<Error>;

/// Whether an error may pass with time (the group or the connection was unavailable, or the
/// outcome is unknown), as opposed to a definite refusal.
pub(crate) fn is_transient(error: &Error) -> bool {
    matches!(
        error,
        Error::Transport { .. } | Error::DeadlineExceeded | Error::Unavailable { .. } | Error::NotLeader { .. } | Error::OutcomeUnknown { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::v1::warden_error::Code;

    fn status(code: Code) -> Status {
        warden_proto::status(warden_proto::warden_error(code, "/p", "m"))
    }

    /// The rule is `warden_proto::follow`'s (tested there); the client turns a lost write into
    /// an unknown outcome and moves on from a router it could not reach.
    #[test]
    fn lost_writes_have_unknown_outcomes() {
        let unknown = judge(&status(Code::OutcomeUnknown), CallKind::Write);
        assert!(matches!(unknown.error, Error::OutcomeUnknown { .. }) && !unknown.next_endpoint);
        let reset = Status::unknown("error reading a body from connection");
        assert!(matches!(judge(&reset, CallKind::Idempotent).error, Error::Transport { .. }));
        let lost = judge(&reset, CallKind::Write);
        assert!(lost.next_endpoint && matches!(lost.error, Error::OutcomeUnknown { .. }));
        let refused = judge(&Status::unavailable("tcp connect error: Connection refused"), CallKind::Write);
        assert!(refused.next_endpoint && matches!(refused.error, Error::Transport { .. }));
        assert!(!judge(&status(Code::NotLeader), CallKind::Write).next_endpoint);
    }
}
