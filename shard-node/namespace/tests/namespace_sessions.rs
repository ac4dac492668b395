//! Sessions and ephemeral nodes on one replica's state machine: creation and TTL limits,
//! ephemerals owned by a session, close and expiry deleting exactly that session's
//! ephemerals in one entry, and leases judged only by the leader.

mod support;

use support::{code, leading_harness};
use warden_namespace::sessions::home_group;
use warden_namespace::Limits;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;
use warden_testkit::harness::Harness;

fn ephemeral(path: &str, session_id: u64) -> CreateRequest {
    CreateRequest { path: path.into(), session_id, ..CreateRequest::default() }
}

#[test]
fn sessions_get_ids_of_their_home_group_and_clamped_ttls() {
    let mut ns = leading_harness();
    let a = ns.create_session(10_000).expect("session");
    let b = ns.create_session(10_000).expect("session");
    assert_ne!(a.session_id, b.session_id);
    assert_eq!(home_group(a.session_id), 1, "the id names the home group");
    assert_eq!((a.granted_ttl_ms, a.ttl_adjusted), (10_000, false));
    let short = ns.create_session(5).expect("session");
    assert_eq!((short.granted_ttl_ms, short.ttl_adjusted), (Limits::default().session_ttl_ms_min, true), "raised to the minimum");
    let long = ns.create_session(u64::MAX).expect("session");
    assert_eq!((long.granted_ttl_ms, long.ttl_adjusted), (Limits::default().session_ttl_ms_max, true), "lowered to the maximum");
}

#[test]
fn ephemerals_belong_to_a_live_session_and_have_no_children() {
    let mut ns = leading_harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    let made = ns.create(ephemeral("/e", session)).expect("ephemeral");
    assert_eq!(made.stat.expect("stat").ephemeral_owner, session);
    assert_eq!(code(ns.create(CreateRequest { path: "/e/child".into(), ..CreateRequest::default() })), Code::NoChildrenForEphemerals);
    let revision = ns.revision().expect("revision");
    assert_eq!(code(ns.create(ephemeral("/ghost", 0xdead))), Code::SessionExpired, "unknown session");
    assert_eq!(code(ns.create(CreateRequest { kind: NodeKind::Container as i32, ..ephemeral("/c", session) })), Code::InvalidArgument);
    assert_eq!(ns.revision().expect("revision"), revision, "refusals change nothing");
    // Sequential ephemerals (the lock and election building block).
    ns.create_simple("/q", b"").expect("parent");
    let waiter = ns.create(CreateRequest { sequential: true, ..ephemeral("/q/w-", session) }).expect("seq ephemeral");
    assert_eq!(waiter.path, "/q/w-0000000000");
}

#[test]
fn closing_a_session_deletes_exactly_its_ephemerals_in_one_revision() {
    let mut ns = leading_harness();
    let mine = ns.create_session(10_000).expect("session").session_id;
    let other = ns.create_session(10_000).expect("session").session_id;
    ns.create(CreateRequest { kind: NodeKind::Container as i32, path: "/members".into(), ..CreateRequest::default() }).expect("container");
    for name in ["b", "a", "c"] {
        ns.create(ephemeral(&format!("/members/{name}"), mine)).expect("member");
    }
    ns.create(ephemeral("/members/other", other)).expect("other member");
    ns.create(ephemeral("/mine-top", mine)).expect("top-level");
    let before = ns.revision().expect("revision");
    let closed = ns.close_session(mine).expect("close");
    assert_eq!(closed.deleted, 4);
    assert_eq!(ns.revision().expect("revision"), before + 1, "one entry, one revision");
    assert_eq!(ns.all_children("/members").expect("children"), vec!["other"]);
    assert!(ns.exists("/mine-top").expect("exists").is_none());
    assert_eq!(code(ns.close_session(mine)), Code::SessionExpired, "closing twice");
    assert_eq!(code(ns.create(ephemeral("/late", mine))), Code::SessionExpired, "a closed session owns nothing new");
    // The last member going takes the container with it, in the same entry.
    assert_eq!(ns.close_session(other).expect("close").deleted, 2);
    assert!(ns.exists("/members").expect("exists").is_none());
}

#[test]
fn deleting_an_ephemeral_by_hand_updates_its_session() {
    let mut ns = leading_harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    ns.create(ephemeral("/x", session)).expect("ephemeral");
    ns.delete("/x", None, false).expect("delete");
    ns.create_simple("/x", b"persistent now").expect("recreate as persistent");
    assert_eq!(ns.close_session(session).expect("close").deleted, 0, "the session no longer owns /x");
    assert!(ns.exists("/x").expect("exists").is_some());
}

/// A put as one transaction, answering its result.
fn put(ns: &mut Harness, request: PutRequest) -> Result<PutResponse, WardenError> {
    let response = ns.txn(TxnRequest { then: vec![TxnOp { op: Some(txn_op::Op::Put(request)) }], ..TxnRequest::default() })?;
    match response.results.into_iter().next().and_then(|result| result.result) {
        Some(txn_op_result::Result::Put(put)) => Ok(put),
        other => panic!("a put answered {other:?}"),
    }
}

/// What etcd's leases are to keys: a put with a session makes the node its ephemeral, one
/// without (or with another) takes it from the session, one that keeps the owner keeps it;
/// the session's end deletes exactly what it owns then.
#[test]
fn a_put_gives_a_node_to_a_session_and_takes_it_back() {
    let mut ns = leading_harness();
    let lease = ns.create_session(10_000).expect("session").session_id;
    let other = ns.create_session(10_000).expect("session").session_id;
    let leased = |path: &str, session_id: u64| PutRequest { path: path.into(), data: b"v".to_vec(), session_id, ..PutRequest::default() };
    let made = put(&mut ns, leased("/svc/a", lease)).expect("put with a lease");
    assert_eq!(made.stat.expect("stat").ephemeral_owner, lease);
    assert_eq!(ns.get("/svc").expect("parent").stat.expect("stat").kind, NodeKind::Container as i32, "parents are containers");
    put(&mut ns, leased("/svc/b", lease)).expect("put with a lease");
    put(&mut ns, leased("/svc/b", 0)).expect("put without a lease takes the node back");
    put(&mut ns, leased("/svc/c", other)).expect("another session's node");
    put(&mut ns, leased("/svc/c", lease)).expect("moved to the lease");
    let kept = put(&mut ns, PutRequest { keep_owner: true, ..leased("/svc/a", 0) }).expect("keep the owner");
    assert_eq!(kept.stat.expect("stat").ephemeral_owner, lease, "keep_owner keeps the lease");
    assert_eq!(code(put(&mut ns, leased("/svc/a/child", 0))), Code::NoChildrenForEphemerals);
    assert_eq!(code(put(&mut ns, leased("/svc", lease))), Code::NoChildrenForEphemerals, "a container with children cannot be an ephemeral");
    assert_eq!(code(put(&mut ns, leased("/gone", 0xdead))), Code::SessionExpired, "an unknown session owns nothing");
    assert_eq!(code(put(&mut ns, PutRequest { keep_owner: true, ..leased("/absent", 0) })), Code::NoNode, "keeping needs a node");
    assert_eq!(ns.close_session(other).expect("close").deleted, 0, "/svc/c is no longer the other session's");
    assert_eq!(ns.close_session(lease).expect("close").deleted, 2, "/svc/a and /svc/c");
    assert_eq!(ns.all_children("/svc").expect("children"), vec!["b"]);
}

#[test]
fn leases_expire_only_by_the_leaders_judgement() {
    let mut ns = Harness::new(Limits::default()).expect("harness");
    let quiet = ns.create_session(3_000).expect("session").session_id;
    let chatty = ns.create_session(3_000).expect("session").session_id;
    ns.create(ephemeral("/quiet", quiet)).expect("ephemeral");
    ns.create(ephemeral("/chatty", chatty)).expect("ephemeral");
    // A follower expires nothing, however late.
    assert_eq!(ns.leader_scan(1_000_000).expect("scan"), 0);
    // Elected at t = 10 s: every session gets a full TTL from then.
    ns.set_leading(true, 10_000);
    assert_eq!(ns.leader_scan(12_999).expect("scan"), 0);
    let leases = ns.keep_alive(&[chatty], 12_000).expect("keepalive");
    assert!(leases[0].alive && leases[0].remaining_ms == 3_000);
    assert_eq!(ns.leader_scan(13_000).expect("scan"), 1, "one entry expires the quiet session");
    assert!(ns.exists("/quiet").expect("exists").is_none());
    assert!(ns.exists("/chatty").expect("exists").is_some());
    let leases = ns.keep_alive(&[quiet, chatty], 13_500).expect("keepalive");
    assert_eq!((leases[0].alive, leases[1].alive), (false, true), "an expired session stays expired");
    // Leadership moves: the new leader re-grants full leases before expiring anything.
    ns.set_leading(false, 14_000);
    ns.set_leading(true, 20_000);
    assert_eq!(ns.leader_scan(22_999).expect("scan"), 0);
    assert_eq!(ns.leader_scan(23_000).expect("scan"), 1);
    assert!(ns.exists("/chatty").expect("exists").is_none());
}

#[test]
fn many_expiries_are_batched_into_bounded_entries() {
    let limits = Limits { sessions_per_expiry_max: 8, ..Limits::default() };
    let mut ns = Harness::new(limits).expect("harness");
    ns.set_leading(true, 0);
    for i in 0..20 {
        let session = ns.create_session(3_000).expect("session").session_id;
        ns.create(ephemeral(&format!("/s{i}"), session)).expect("ephemeral");
    }
    let before = ns.revision().expect("revision");
    assert_eq!(ns.leader_scan(3_000).expect("scan"), 1, "one bounded entry per scan");
    assert_eq!(ns.revision().expect("revision"), before + 1);
    assert_eq!(ns.all_children("/").expect("children").len(), 12, "8 sessions went in that entry");
    ns.leader_scan(3_001).expect("scan");
    ns.leader_scan(3_002).expect("scan");
    assert!(ns.all_children("/").expect("children").is_empty());
}

#[test]
fn sessions_and_their_ephemerals_survive_a_restart() {
    let mut ns = leading_harness();
    let session = ns.create_session(3_000).expect("session").session_id;
    ns.create(ephemeral("/e", session)).expect("ephemeral");
    ns.reopen().expect("reopen");
    ns.set_leading(true, 50_000);
    assert!(ns.keep_alive(&[session], 50_000).expect("keepalive")[0].alive, "the session is known after a restart");
    assert_eq!(ns.leader_scan(53_000).expect("scan"), 1);
    assert!(ns.exists("/e").expect("exists").is_none());
}

/// A session homed in another group (DESIGN.md rule 7): its ephemerals need it recorded
/// first; this group never expires or closes it; only `EndRemoteSessions` (the home group's
/// verdict, proposed by the leader) deletes them.
#[test]
fn remote_sessions_are_kept_until_their_home_group_ends_them() {
    use warden_namespace::sessions::session_id;
    let mut ns = leading_harness();
    let remote = session_id(2, 5);
    assert_eq!(code(ns.create(ephemeral("/e", remote))), Code::SessionExpired, "not recorded yet");
    assert_eq!(code(ns.add_remote_sessions(&[session_id(1, 9)])), Code::InvalidArgument, "own sessions are never remote");
    ns.add_remote_sessions(&[remote]).expect("recorded");
    ns.add_remote_sessions(&[remote]).expect("recording again changes nothing");
    ns.create(ephemeral("/e", remote)).expect("ephemeral of a remote session");
    assert_eq!(ns.remote_sessions().expect("list"), vec![remote]);
    assert_eq!(ns.sessions_known(&[remote, session_id(2, 6)]).expect("known"), vec![remote]);

    // No lease here: the leader never expires it, keepalives here do not know it, and only
    // its home group may close it.
    ns.leader_scan(1_000_000_000).expect("scan");
    assert!(ns.exists("/e").expect("exists").is_some(), "a remote session is not expired by this group");
    assert!(!ns.keep_alive(&[remote], 1_000_000_000).expect("keepalive")[0].alive);
    assert_eq!(code(ns.close_session(remote)), Code::InvalidArgument);
    assert!(ns.exists("/e").expect("exists").is_some());

    // The record survives a reload (rebuilt from disk, still remote, still not expired).
    ns.reopen().expect("reopen");
    ns.set_leading(true, 0);
    ns.leader_scan(1_000_000_000).expect("scan");
    assert_eq!(ns.remote_sessions().expect("list"), vec![remote]);
    assert!(ns.exists("/e").expect("exists").is_some());

    // The home group's verdict ends it: its ephemerals go with it.
    let local = ns.create_session(10_000).expect("session").session_id;
    ns.end_remote_sessions(&[local, remote], false).expect("ended");
    assert!(ns.exists("/e").expect("exists").is_none());
    assert!(ns.remote_sessions().expect("list").is_empty());
    assert_eq!(ns.sessions_known(&[local]).expect("known"), vec![local], "a local session is not ended by a remote verdict");
}

/// A session's home group notes each group about to record it as remote (the group's
/// confirmation, `NoteRemoteHolders`): once, at most `REMOTE_HOLDERS_MAX` groups, as
/// replicated state; a further group is answered that it may not record the session. A
/// group asking about sessions it records (`checker_group`) is told which do not note it.
/// Closing the session answers those groups, for the service to end it there before the
/// close is answered. A session that is not alive here (ended, or only a
/// remote record) is neither noted nor answered.
#[test]
fn a_closed_session_names_the_groups_that_record_it_as_remote() {
    use warden_namespace::sessions::{session_id, REMOTE_HOLDERS_MAX};
    let mut ns = leading_harness();
    let session = ns.create_session(10_000).expect("session").session_id;
    let busy = ns.create_session(10_000).expect("session").session_id;
    let remote = session_id(2, 5);
    ns.add_remote_sessions(&[remote]).expect("recorded");
    assert_eq!(code(ns.note_remote_holders(1, &[session])), Code::InvalidArgument, "a group holds its own sessions");
    assert_eq!(code(ns.note_remote_holders(0, &[session])), Code::InvalidArgument, "group 0 names none");
    let never = session_id(1, 999);
    assert_eq!(ns.note_remote_holders(7, &[session, never, remote]).expect("noted"), vec![session], "only live sessions homed here");
    assert_eq!(ns.note_remote_holders(7, &[session]).expect("noted"), vec![session], "noted again: still once");
    ns.note_remote_holders(8, &[session]).expect("noted");
    for holder in 100..100 + REMOTE_HOLDERS_MAX as u64 {
        ns.note_remote_holders(holder, &[busy]).expect("noted");
    }
    // A group that records sessions without having asked (a subtree move brought them)
    // learns which do not note it yet; remote records and unknown sessions are not named.
    assert_eq!(ns.sessions_unnoted(7, &[session, busy, never, remote]).expect("asked"), vec![busy], "7 is noted by the first only");
    assert!(ns.sessions_unnoted(0, &[session, busy]).expect("asked").is_empty(), "no checker, nothing unnoted");
    let past = ns.note_remote_holders_full(99, &[busy, session]).expect("answered");
    assert_eq!((past.session_ids, past.holders_full), (vec![session], vec![busy]), "alive past the bound: not noted, and said so");

    // Replicated state: the notes survive a reload.
    ns.reopen().expect("reopen");
    ns.set_leading(true, 0);
    assert_eq!(ns.close_session_noted(session).expect("closed").1, vec![7, 8, 99]);
    let holders = ns.close_session_noted(busy).expect("closed").1;
    assert_eq!(holders, (100..100 + REMOTE_HOLDERS_MAX as u64).collect::<Vec<_>>(), "the first groups, not the one past the bound");
    assert!(ns.note_remote_holders(7, &[session]).expect("answered").is_empty(), "a closed session is not alive");
}
