//! Locks on one replica's state machine: FIFO grants, shared runs, fencing tokens that only
//! grow, idempotent retries, lock-delay after a holder's session expires (and not after a
//! clean unlock), sequencer checks, and bad input.

mod support;

use support::{code, leading_harness};
use warden_engine::state_machine::LeaderClock;
use warden_proto::namespace::AcquireLock;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_testkit::harness::Harness;

fn acquire(path: &str, session_id: u64, mode: LockMode) -> AcquireLock {
    AcquireLock { path: path.into(), session_id, mode: mode as i32, ..AcquireLock::default() }
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
    let info = ns.lock_info("/locks/etl").expect("info");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.waiters.iter().map(|w| w.token).collect::<Vec<_>>(), vec![s2.token, s3.token], "FIFO order");
    ns.unlock(s1.clone()).expect("unlock");
    assert!(!ns.check_sequencer(&s1).expect("check"), "a released sequencer no longer holds");
    assert!(ns.check_sequencer(&s2).expect("check"), "the next waiter holds, with no lock-delay after a clean unlock");
    assert!(!ns.check_sequencer(&s3).expect("check"));
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
    assert!(!ns.check_sequencer(&sequencer(&w)).expect("check"), "the writer waits for every reader before it");
    ns.unlock(sequencer(&r2)).expect("unlock");
    assert!(ns.check_sequencer(&sequencer(&w)).expect("check"));
    assert!(!ns.check_sequencer(&sequencer(&r3)).expect("check"));
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
    assert_eq!(ns.lock_info("/l").expect("info").waiters.len(), 1);
}

/// A session homed elsewhere holding a lock here: its home group's close ends it here with
/// no lock-delay (a close at home starts none), its expiry with the lock-delay asked for.
#[test]
fn a_remote_holder_closed_at_home_starts_no_lock_delay_an_expired_one_does() {
    use warden_namespace::sessions::session_id;
    for (closed, delayed) in [(true, false), (false, true)] {
        let mut ns = leading_harness();
        let remote = session_id(2, 5);
        ns.add_remote_sessions(&[remote]).expect("recorded");
        let next = ns.create_session(600_000).expect("session").session_id;
        let held = ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/job", remote, LockMode::Exclusive) }).expect("lock");
        let waiting = ns.lock(acquire("/job", next, LockMode::Exclusive)).expect("lock");
        assert!(held.acquired && !waiting.acquired);
        ns.end_remote_sessions(&[remote], closed).expect("ended by the home group's verdict");
        let info = ns.lock_info("/job").expect("info");
        assert_eq!(info.blocked_until_ms > 0, delayed, "closed {closed}: {info:?}");
        assert_eq!(ns.check_sequencer(&sequencer(&waiting)).expect("check"), !delayed, "closed {closed}: the next waiter holds at once");
    }
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
    let info = ns.lock_info("/job").expect("info");
    assert!(info.holders.is_empty(), "nobody holds during the lock-delay");
    assert!(info.blocked_until_ms >= 3_000 + 5_000 - 1);
    assert!(!ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    // Judged by the leader's clock: once due, a LockDelayEnded entry grants the next waiter.
    ns.now_ms = info.blocked_until_ms;
    assert!(ns.leader_scan(info.blocked_until_ms).expect("scan") >= 1);
    assert!(ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    assert_eq!(ns.lock_info("/job").expect("info").blocked_until_ms, 0);
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
    assert!(!ns.check_sequencer(&forged).expect("check"));
    assert!(ns.check_sequencer(&sequencer(&held)).expect("check"));
}

#[test]
fn a_stale_release_cannot_delete_a_retried_waiter() {
    let mut ns = leading_harness();
    let holder = ns.create_session(10_000).expect("session").session_id;
    let client = ns.create_session(10_000).expect("session").session_id;
    let held = ns.lock(acquire("/l", holder, LockMode::Exclusive)).expect("lock");
    let request = AcquireLock { request_id: 7, ..acquire("/l", client, LockMode::Exclusive) };
    // A waiting call: its client hangs up, so the server sends a release of that call's
    // waiter, which has not applied yet.
    let (dropped, dropped_attempt) = ns.lock_attempt(request.clone()).expect("lock");
    assert!(!dropped.acquired);
    // Meanwhile the lock passes on and the client's retry (same request id) finds its waiter
    // holding: it is told it holds.
    ns.unlock(sequencer(&held)).expect("unlock");
    let (retry, retry_attempt) = ns.lock_attempt(request).expect("retry");
    assert!(retry.acquired && retry.sequencer == dropped.sequencer, "the retry re-attached to the same waiter, which holds");
    assert!(retry_attempt > dropped_attempt);
    // Now the dropped call's release applies (it names the call it cancels, as the service's
    // does): it must not take the hold from the retry.
    let revision = ns.revision().expect("revision");
    ns.release(sequencer(&dropped), dropped_attempt).expect("stale release");
    assert!(ns.check_sequencer(&sequencer(&retry)).expect("check"), "the retry's hold survives the dropped call's release");
    assert_eq!(ns.revision().expect("revision"), revision, "the stale release changed nothing");
    // A release naming the current call still removes the waiter.
    ns.release(sequencer(&retry), retry_attempt).expect("release");
    assert!(ns.lock_info("/l").expect("info").holders.is_empty());
}

/// A harness whose holder of `/job` (lock-delay 5 s, TTL 3 s) expired at 3 s, with the next
/// waiter's answer: the lock is in its delay until 8 s.
fn holder_expired_in_a_lock_delay() -> (Harness, LockResponse) {
    let mut ns = leading_harness();
    let holder = ns.create_session(3_000).expect("session").session_id;
    let next = ns.create_session(600_000).expect("session").session_id;
    ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/job", holder, LockMode::Exclusive) }).expect("lock");
    let waiting = ns.lock(acquire("/job", next, LockMode::Exclusive)).expect("lock");
    ns.now_ms = 3_000;
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1, "the holder's session expires");
    (ns, waiting)
}

#[test]
fn lock_delay_lasts_until_its_end_is_applied_whatever_the_replica_clock() {
    let (mut ns, waiting) = holder_expired_in_a_lock_delay();
    // No replica grants the lock before the leader has ended the lock-delay, however late its
    // own clock says it is (DESIGN.md rule 6: only the leader judges time): a query takes no
    // clock, and `blocked_until_ms` is not judged against one.
    let info = ns.lock_info("/job").expect("info");
    assert!(info.holders.is_empty() && info.blocked_until_ms != 0, "blocked until LockDelayEnded applies: {info:?}");
    assert!(!ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    ns.now_ms = info.blocked_until_ms;
    assert!(ns.leader_scan(info.blocked_until_ms).expect("scan") >= 1);
    assert!(ns.check_sequencer(&sequencer(&waiting)).expect("check"), "granted once the end applied, whatever the asking clock");
}

/// A lock-delay is judged by the leader's monotonic clock: its wall clock stepped an hour
/// ahead (an NTP step) does not end the delay early (a crashed holder's lock would go to the
/// next waiter while the crashed process may still act); the delay ends once the monotonic
/// clock has run all of it.
#[test]
fn a_wall_clock_step_on_the_leader_does_not_end_a_lock_delay_early() {
    let (mut ns, waiting) = holder_expired_in_a_lock_delay();
    let hour_ms = 3_600_000;
    let stepped = |monotonic_ms: u64| LeaderClock { wall_ms: hour_ms + monotonic_ms, monotonic_ms };
    ns.now_ms = hour_ms + 4_000;
    assert_eq!(ns.leader_scan_with(stepped(4_000)).expect("scan"), 0, "the wall clock is past the delay's end, the monotonic one is not");
    assert_eq!(ns.leader_scan_with(stepped(7_999)).expect("scan"), 0, "nor a millisecond before it");
    assert!(!ns.check_sequencer(&sequencer(&waiting)).expect("check"), "nobody holds the lock during its delay");
    ns.now_ms = hour_ms + 8_000;
    assert!(ns.leader_scan_with(stepped(8_000)).expect("scan") >= 1, "the delay ends after 5 s by the monotonic clock");
    assert!(ns.check_sequencer(&sequencer(&waiting)).expect("check"), "the next waiter holds it");
}

#[test]
fn lock_delay_keeps_surviving_shared_holders_and_holds_back_new_grants() {
    let mut ns = leading_harness();
    let short = ns.create_session(3_000).expect("session").session_id;
    let long: Vec<u64> = (0..2).map(|_| ns.create_session(600_000).expect("session").session_id).collect();
    let r1 = ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/rw", short, LockMode::Shared) }).expect("lock");
    let r2 = ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/rw", long[0], LockMode::Shared) }).expect("lock");
    assert!(r1.acquired && r2.acquired);
    ns.now_ms = 3_000;
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1, "the first reader's session expires");
    let info = ns.lock_info("/rw").expect("info");
    assert!(info.blocked_until_ms != 0, "the lock is in its lock-delay");
    assert!(ns.check_sequencer(&sequencer(&r2)).expect("check"), "a surviving shared holder keeps its hold");
    let r3 = ns.lock(acquire("/rw", long[1], LockMode::Shared)).expect("lock");
    assert!(!r3.acquired, "a new grant waits for the lock-delay to end");
    let info = ns.lock_info("/rw").expect("info");
    assert_eq!(info.holders.iter().map(|h| h.token).collect::<Vec<_>>(), vec![sequencer(&r2).token]);
    ns.now_ms = info.blocked_until_ms;
    assert!(ns.leader_scan(info.blocked_until_ms).expect("scan") >= 1);
    assert!(ns.check_sequencer(&sequencer(&r3)).expect("check"), "granted once the lock-delay ended");
    assert!(ns.check_sequencer(&sequencer(&r2)).expect("check"));
}

#[test]
fn plain_writes_cannot_create_change_or_delete_lock_waiters() {
    use warden_proto::v1::txn_op::Op;
    let mut ns = leading_harness();
    let holder = ns.create_session(10_000).expect("session").session_id;
    let other = ns.create_session(10_000).expect("session").session_id;
    let held = ns.lock(acquire("/l", holder, LockMode::Exclusive)).expect("lock");
    let waiting = ns.lock(acquire("/l", other, LockMode::Exclusive)).expect("lock");
    let revision = ns.revision().expect("revision");
    // Waiter data as the lock operations write it: the mode byte, then the request id.
    let exclusive_waiter_data = vec![0u8; 9];
    let forged = TxnOp {
        op: Some(Op::Create(CreateRequest {
            path: "/l/lock-".into(),
            data: exclusive_waiter_data.clone(),
            sequential: true,
            session_id: other,
            ..CreateRequest::default()
        })),
    };
    let two = TxnRequest { then: vec![forged.clone(), forged], ..TxnRequest::default() };
    assert_eq!(code(ns.txn(two)), Code::InvalidArgument, "two waiters created by a transaction");
    assert_eq!(code(ns.create_simple("/l/note", b"")), Code::InvalidArgument, "a lock's children are its waiters only");
    let waiter = sequencer(&waiting).waiter;
    let shared_waiter_data = [&[1u8][..], &[0u8; 8][..]].concat();
    assert_eq!(code(ns.set(&waiter, &shared_waiter_data, None)), Code::InvalidArgument, "a waiter's mode flipped by Set");
    assert_eq!(code(ns.delete(&waiter, None, false)), Code::InvalidArgument, "a waiter deleted by Delete");
    assert_eq!(code(ns.delete("/l", None, true)), Code::InvalidArgument, "waiters deleted by a recursive delete");
    assert_eq!(ns.revision().expect("revision"), revision, "refusals change nothing");
    assert!(ns.check_sequencer(&sequencer(&held)).expect("check"));
    assert!(!ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    // A waiter-looking node made before the path was a lock is no waiter either.
    let lookalike = CreateRequest {
        path: "/p/lock-0000000000".into(),
        data: exclusive_waiter_data,
        session_id: other,
        create_parents: true,
        ..CreateRequest::default()
    };
    ns.create(lookalike).expect("a plain node may have any name");
    assert_eq!(code(ns.lock(acquire("/p", holder, LockMode::Exclusive))), Code::InvalidArgument, "a forged waiter never holds");
    // The lock operations themselves still work.
    ns.unlock(sequencer(&held)).expect("unlock");
    assert!(ns.check_sequencer(&sequencer(&waiting)).expect("check"));
}

#[test]
fn each_lock_call_sets_its_own_lock_delay() {
    let mut ns = leading_harness();
    let first = ns.create_session(600_000).expect("session").session_id;
    let short = ns.create_session(3_000).expect("session").session_id;
    let next = ns.create_session(600_000).expect("session").session_id;
    // An earlier lifetime of the lock, without lock-delay: its metadata goes with it.
    let earlier = ns.lock(acquire("/job", first, LockMode::Exclusive)).expect("lock");
    ns.unlock(sequencer(&earlier)).expect("unlock");
    assert!(ns.exists("/job").expect("exists").is_none());
    // A holder without lock-delay, then one asking for 5 s whose session expires.
    let without = ns.lock(acquire("/job", first, LockMode::Exclusive)).expect("lock");
    let with = ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/job", short, LockMode::Exclusive) }).expect("lock");
    let waiting = ns.lock(acquire("/job", next, LockMode::Exclusive)).expect("lock");
    ns.unlock(sequencer(&without)).expect("unlock");
    assert!(ns.check_sequencer(&sequencer(&with)).expect("check"));
    ns.now_ms = 3_000;
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1, "the second holder's session expires");
    let info = ns.lock_info("/job").expect("info");
    assert!(info.blocked_until_ms >= 3_000 + 5_000 - 1 && info.holders.is_empty(), "the expired holder's own lock-delay applies: {info:?}");
    assert!(!ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    ns.now_ms = info.blocked_until_ms;
    assert!(ns.leader_scan(info.blocked_until_ms).expect("scan") >= 1);
    assert!(ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    // And the other way round: a first waiter's lock-delay does not stick to the path.
    ns.unlock(sequencer(&waiting)).expect("unlock");
    assert!(ns.exists("/job").expect("exists").is_none());
    let short = ns.create_session(3_000).expect("session").session_id;
    let after = ns.create_session(600_000).expect("session").session_id;
    let delayed = ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/job", first, LockMode::Exclusive) }).expect("lock");
    ns.unlock(sequencer(&delayed)).expect("unlock");
    let undelayed = ns.lock(acquire("/job", short, LockMode::Exclusive)).expect("lock");
    ns.lock(acquire("/job", after, LockMode::Exclusive)).expect("lock");
    assert!(undelayed.acquired);
    let expiry_at = ns.now_ms + 3_000;
    ns.now_ms = expiry_at;
    assert_eq!(ns.leader_scan(expiry_at).expect("scan"), 1);
    assert_eq!(ns.lock_info("/job").expect("info").blocked_until_ms, 0, "a holder without lock-delay leaves none");
}

/// What the replica publishes it holds (`warden_namespace_held`) follows sessions, their
/// ephemerals, lock waiters and lock-delays, and a restart counts the same from disk.
#[test]
fn held_counts_follow_sessions_ephemerals_waiters_and_lock_delays() {
    let mut ns = leading_harness();
    let counts = |ns: &mut Harness| {
        let held = ns.held();
        ns.reopen().expect("reopen");
        // Leading again from time 0: the sessions' leases start again (a new leader's do).
        ns.set_leading(true, 0);
        assert_eq!(ns.held(), held, "counted from disk as moved by the commands");
        (held.nodes, held.sessions, held.ephemerals, held.lock_waiters, held.lock_holders, held.lock_delays)
    };
    assert_eq!(counts(&mut ns), (0, 0, 0, 0, 0, 0), "the root is not counted");
    let holder = ns.create_session(3_000).expect("session").session_id;
    let waiter = ns.create_session(600_000).expect("session").session_id;
    for path in ["/m/a", "/m/b", "/m/lock"] {
        ns.create(CreateRequest { path: path.into(), create_parents: true, ..CreateRequest::default() }).expect("create");
    }
    for path in ["/m/e0", "/m/e1"] {
        ns.create(CreateRequest { path: path.into(), session_id: holder, ..CreateRequest::default() }).expect("ephemeral");
    }
    assert!(ns.lock(AcquireLock { lock_delay_ms: 5_000, ..acquire("/m/lock", holder, LockMode::Exclusive) }).expect("lock").acquired);
    let waiting = ns.lock(acquire("/m/lock", waiter, LockMode::Exclusive)).expect("lock");
    assert!(!waiting.acquired);
    // /m, /m/a, /m/b, /m/lock, two ephemerals, two waiters (ephemerals too), one holding.
    assert_eq!(counts(&mut ns), (8, 2, 4, 2, 1, 0));
    ns.now_ms = 3_000;
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1, "the holder's session expires");
    assert_eq!(counts(&mut ns), (5, 1, 1, 1, 0, 1), "the holder's nodes gone, its lock in its lock-delay: nobody holds");
    let blocked_until_ms = ns.lock_info("/m/lock").expect("info").blocked_until_ms;
    ns.now_ms = blocked_until_ms;
    assert!(ns.leader_scan(blocked_until_ms).expect("scan") >= 1);
    assert!(ns.check_sequencer(&sequencer(&waiting)).expect("check"));
    assert_eq!(counts(&mut ns), (5, 1, 1, 1, 1, 0), "the lock-delay over, the waiter holds");
    ns.close_session(waiter).expect("close");
    assert_eq!(counts(&mut ns), (4, 0, 0, 0, 0, 0), "the waiter's session and node gone too");
}

/// A lock's state changes only by the lock operations, also through the writes etcd's API
/// makes: a put on the lock or a waiter, and a range delete over its waiters, are refused
/// and change nothing.
#[test]
fn puts_and_range_deletes_leave_locks_to_the_lock_operations() {
    let mut ns = leading_harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    let held = ns.lock(acquire("/locks/job", session, LockMode::Exclusive)).expect("lock");
    let waiter = sequencer(&held).waiter;
    let one = |op: txn_op::Op| TxnRequest { then: vec![TxnOp { op: Some(op) }], ..TxnRequest::default() };
    let revision = ns.revision().expect("revision");
    for path in ["/locks/job".to_string(), waiter.clone()] {
        let put = PutRequest { path: path.clone(), data: b"x".to_vec(), ..PutRequest::default() };
        assert_eq!(code(ns.txn(one(txn_op::Op::Put(put)))), Code::InvalidArgument, "a put on {path}");
    }
    let delete = DeleteRangeRequest { path: "/locks".into(), ..DeleteRangeRequest::default() };
    assert_eq!(code(ns.txn(one(txn_op::Op::DeleteRange(delete)))), Code::InvalidArgument, "a range delete over a waiter");
    assert_eq!(ns.revision().expect("revision"), revision, "refusals change nothing");
    assert!(ns.check_sequencer(&sequencer(&held)).expect("check"), "the holder still holds");
}
