//! Locks on one replica's state machine: FIFO grants, shared runs, fencing tokens that only
//! grow, idempotent retries, lock-delay after a holder's session expires (and not after a
//! clean unlock), sequencer checks, and bad input.

mod support;

use support::{code, leading_harness};
use warden_proto::namespace::AcquireLock;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;

fn acquire(path: &str, session_id: u64, mode: LockMode) -> AcquireLock {
    AcquireLock { path: path.into(), session_id, mode: mode as i32, lock_delay_ms: 0, request_id: 0 }
}

fn sequencer(response: &LockResponse) -> Sequencer {
    response.sequencer.clone().expect("sequencer")
}

#[test]
fn exclusive_locks_are_fifo_and_tokens_grow() {
    let mut ns = leading_harness();
    let sessions: Vec<u64> = (0..3).map(|_| ns.create_session(10_000).expect("session").session_id).collect();
    let first = ns.lock(acquire("/locks/etl", sessions[0], LockMode::Exclusive)).expect("lock");
    let second = ns.lock(acquire("/locks/etl", sessions[1], LockMode::Exclusive)).expect("lock");
    let third = ns.lock(acquire("/locks/etl", sessions[2], LockMode::Exclusive)).expect("lock");
    assert!(first.acquired && !second.acquired && !third.acquired);
    let (s1, s2, s3) = (sequencer(&first), sequencer(&second), sequencer(&third));
    assert!(s1.token < s2.token && s2.token < s3.token, "tokens are create revisions: they grow");
    let info = ns.lock_info("/locks/etl", ns.now_ms).expect("info");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.waiters.iter().map(|w| w.token).collect::<Vec<_>>(), vec![s2.token, s3.token], "FIFO order");
    ns.unlock(s1.clone()).expect("unlock");
    assert!(!ns.check_sequencer(&s1, ns.now_ms).expect("check"), "a released sequencer no longer holds");
    assert!(ns.check_sequencer(&s2, ns.now_ms).expect("check"), "the next waiter holds, with no lock-delay after a clean unlock");
    assert!(!ns.check_sequencer(&s3, ns.now_ms).expect("check"));
    ns.unlock(s2).expect("unlock");
    ns.unlock(s3.clone()).expect("unlock");
    ns.unlock(s3).expect("unlocking twice is harmless");
    assert!(ns.exists("/locks/etl").expect("exists").is_none(), "the lock node is a container: gone with its last waiter");
    let again = ns.lock(acquire("/locks/etl", sessions[0], LockMode::Exclusive)).expect("lock");
    assert!(again.acquired && sequencer(&again).token > sequencer(&third).token, "tokens keep growing across lock lifetimes");
}

#[test]
fn shared_holders_are_the_leading_run_of_shared_waiters() {
    let mut ns = leading_harness();
    let s: Vec<u64> = (0..4).map(|_| ns.create_session(10_000).expect("session").session_id).collect();
    let r1 = ns.lock(acquire("/rw", s[0], LockMode::Shared)).expect("lock");
    let r2 = ns.lock(acquire("/rw", s[1], LockMode::Shared)).expect("lock");
    let w = ns.lock(acquire("/rw", s[2], LockMode::Exclusive)).expect("lock");
    let r3 = ns.lock(acquire("/rw", s[3], LockMode::Shared)).expect("lock");
    assert_eq!((r1.acquired, r2.acquired, w.acquired, r3.acquired), (true, true, false, false), "a reader behind a writer waits");
    ns.unlock(sequencer(&r1)).expect("unlock");
    assert!(!ns.check_sequencer(&sequencer(&w), ns.now_ms).expect("check"), "the writer waits for every reader before it");
    ns.unlock(sequencer(&r2)).expect("unlock");
    assert!(ns.check_sequencer(&sequencer(&w), ns.now_ms).expect("check"));
    assert!(!ns.check_sequencer(&sequencer(&r3), ns.now_ms).expect("check"));
}

#[test]
fn retries_with_the_same_request_id_are_idempotent() {
    let mut ns = leading_harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    let other = ns.create_session(10_000).expect("session").session_id;
    ns.lock(acquire("/l", other, LockMode::Exclusive)).expect("lock");
    let request = AcquireLock { request_id: 42, ..acquire("/l", session, LockMode::Exclusive) };
    let first = ns.lock(request.clone()).expect("lock");
    let retry = ns.lock(request).expect("retry");
    assert_eq!(first.sequencer, retry.sequencer, "the same waiter, not a second one");
    assert_eq!(ns.lock_info("/l", ns.now_ms).expect("info").waiters.len(), 1);
}

#[test]
fn an_expired_holder_triggers_lock_delay_a_clean_unlock_does_not() {
    let mut ns = leading_harness();
    let holder = ns.create_session(3_000).expect("session").session_id;
    let next = ns.create_session(600_000).expect("session").session_id;
    let delayed = AcquireLock { lock_delay_ms: 5_000, ..acquire("/job", holder, LockMode::Exclusive) };
    let held = ns.lock(delayed).expect("lock");
    let waiting = ns.lock(acquire("/job", next, LockMode::Exclusive)).expect("lock");
    assert!(held.acquired && !waiting.acquired);
    // The holder stops renewing; the leader expires it at 3 s (its lease from election at 0).
    ns.now_ms = 3_000;
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1);
    let info = ns.lock_info("/job", 3_000).expect("info");
    assert!(info.holders.is_empty(), "nobody holds during the lock-delay");
    assert!(info.blocked_until_ms >= 3_000 + 5_000 - 1);
    assert!(!ns.check_sequencer(&sequencer(&waiting), 7_999).expect("check"));
    // Judged by the leader's clock: once due, a LockDelayEnded entry grants the next waiter.
    ns.now_ms = info.blocked_until_ms;
    assert!(ns.leader_scan(info.blocked_until_ms).expect("scan") >= 1);
    assert!(ns.check_sequencer(&sequencer(&waiting), info.blocked_until_ms).expect("check"));
    assert_eq!(ns.lock_info("/job", info.blocked_until_ms).expect("info").blocked_until_ms, 0);
    assert!(sequencer(&waiting).token > sequencer(&held).token, "the next holder's token is strictly larger");
}

#[test]
fn bad_lock_requests_change_nothing() {
    let mut ns = leading_harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    ns.create_simple("/plain", b"").expect("node");
    ns.create_simple("/plain/child", b"").expect("child");
    let revision = ns.revision().expect("revision");
    assert_eq!(code(ns.lock(acquire("/l", 0xbad, LockMode::Exclusive))), Code::SessionExpired);
    assert_eq!(code(ns.lock(acquire("/plain", session, LockMode::Exclusive))), Code::InvalidArgument, "children of another kind");
    assert_eq!(code(ns.lock(AcquireLock { lock_delay_ms: 60_001, ..acquire("/l", session, LockMode::Exclusive) })), Code::InvalidArgument);
    assert_eq!(code(ns.lock(AcquireLock { mode: 7, ..acquire("/l", session, LockMode::Exclusive) })), Code::InvalidArgument);
    assert_eq!(code(ns.lock(acquire("no-slash", session, LockMode::Exclusive))), Code::InvalidPath);
    assert_eq!(code(ns.lock(acquire("/", session, LockMode::Exclusive))), Code::InvalidArgument);
    assert_eq!(ns.revision().expect("revision"), revision, "refusals change nothing");
    let held = ns.lock(acquire("/l", session, LockMode::Exclusive)).expect("lock");
    let mut forged = sequencer(&held);
    forged.token += 1;
    assert_eq!(code(ns.unlock(forged.clone())), Code::InvalidArgument, "a sequencer naming another hold");
    assert!(!ns.check_sequencer(&forged, ns.now_ms).expect("check"));
    assert!(ns.check_sequencer(&sequencer(&held), ns.now_ms).expect("check"));
}
