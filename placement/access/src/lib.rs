//! What each public call needs of the access control list, judged the same way by
//! the router (to fail fast) and by the node serving the path (the authority): every call
//! names the permissions it needs at the paths it touches ([`Access::needs`]), and
//! [`authorize`] refuses PERMISSION_DENIED, before anything runs, a caller missing any one.
//! A call refused here changes nothing and reveals nothing: the refusal names only the path
//! the caller itself sent.
//!
//! What each call needs (a grant holds at its prefix and below; `admin` holds everything):
//!
//! | call | needs |
//! |---|---|
//! | Get, Exists, GetChildren, LockInfo, CheckSequencer | `read` at the path |
//! | Create, Set, Delete | `write` at the path; an ephemeral Create also `lock` |
//! | Txn | `read` at each compare's and Get's path, as above for each write |
//! | Lock, Unlock | `lock` at the lock's path |
//! | CreateSession | `lock` at its path hint; without one, `lock` somewhere (it then counts where the caller's `lock` grants meet, [`Acl::lock_scope`]) |
//! | KeepAlive, CloseSession, SessionInfo | the session is the caller's (checked by the group) |
//! | Watch | `watch` at the watched path (a recursive watch: its whole subtree, within its bounds) |
//! | Sync | an authenticated caller |
//!
//! A range (Range, DeleteRange, a compare's ranges, a bounded Watch) needs its permission at its path, or
//! only at what its `[from, to)` reaches: the escaped etcd keys of a prefix `P/` (under
//! `/_etcd`, [`warden_placement::etcd_keys`]) are judged at `P`, where etcd's permission
//! `--prefix P/` is granted, as is any call on one of them.
//!
//! Sessions belong to the principal that opened them: a command that uses one (an
//! ephemeral's owner, a lock's waiter, an Unlock, a close, a keepalive) is refused by the
//! group unless the session is the caller's (`Command.principal`).
//!
//! Used by the router and by every shard-node (and placement's copy of the list travels in
//! the routing table: [`acl_from_proto`], [`acl_to_proto`]).
//!
//! Architecture invariant: this crate knows the calls and the list, not the transport: who
//! the caller is comes from [`warden_proto::tls::caller`] (a router forwards it to nodes in
//! the [`warden_proto::tls::PRINCIPAL_HEADER`] metadata, see `warden_router::principal`).

use std::sync::{Arc, RwLock};

use tonic::Status;
use warden_placement::acl::{self, Acl};
use warden_placement::Grant;
use warden_proto::placement::{AclGrant, AclGroup, AclState};
use warden_proto::tls::Caller;
use warden_proto::v1::txn_op::Op;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::*;

/// What one call needs: permission bits at paths, and whether it needs `lock` somewhere.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs<'a> {
    /// Every one required.
    pub at: Vec<Need<'a>>,
    /// `lock` at some prefix (opening a session, which has no path).
    pub lock_somewhere: bool,
}

/// Permission bits needed at a path, for the nodes at or below it in `[from, to)`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Need<'a> {
    /// The path the call names.
    pub path: &'a str,
    /// The first path reached, compared as bytes (empty: `path`).
    pub from: &'a [u8],
    /// The first path past those reached (empty: the end of `path`'s subtree).
    pub to: &'a [u8],
    /// The permission bits.
    pub permission: u32,
}

impl<'a> Need<'a> {
    /// `permission` at `path` and its subtree.
    fn at(path: &'a str, permission: u32) -> Need<'a> {
        Need { path, from: &[], to: &[], permission }
    }

    /// `permission` over a range request's nodes.
    fn range(range: &'a RangeRequest, permission: u32) -> Need<'a> {
        Need { path: &range.path, from: &range.from, to: &range.to, permission }
    }

    /// The plain path whose grants also hold here: the escaped etcd keys' prefix, when all
    /// that is reached lies among them.
    fn escaped_grant_path(&self) -> Option<String> {
        if !self.path.starts_with(warden_placement::etcd_keys::ESCAPED_PREFIX) {
            return None;
        }
        let end = warden_placement::subtree_end(self.path);
        let from = self.from.max(self.path.as_bytes());
        let to = if self.to.is_empty() { end.as_bytes() } else { self.to.min(end.as_bytes()) };
        warden_placement::etcd_keys::escaped_grant_path(from, to)
    }
}

impl<'a> Needs<'a> {
    fn at(path: &'a str, permission: u32) -> Needs<'a> {
        Needs { at: vec![Need::at(path, permission)], lock_somewhere: false }
    }
}

/// A request of the public API: what it needs.
pub trait Access {
    /// The permissions the call needs.
    fn needs(&self) -> Needs<'_>;
}

/// `write` at the path, and `lock` too for an ephemeral.
fn create_needs(create: &CreateRequest) -> Need<'_> {
    let lock = if create.session_id != 0 { acl::LOCK } else { 0 };
    Need::at(&create.path, acl::WRITE | lock)
}

macro_rules! needs_at_path {
    ($($t:ty => $permission:expr),*) => {
        $(impl Access for $t {
            fn needs(&self) -> Needs<'_> {
                Needs::at(&self.path, $permission)
            }
        })*
    };
}

needs_at_path!(
    GetRequest => acl::READ,
    ExistsRequest => acl::READ,
    GetChildrenRequest => acl::READ,
    LockInfoRequest => acl::READ,
    SetRequest => acl::WRITE,
    DeleteRequest => acl::WRITE,
    LockRequest => acl::LOCK
);

// Everything a range answers or deletes is at or below its path, in `[from, to)`.
impl Access for RangeRequest {
    fn needs(&self) -> Needs<'_> {
        Needs { at: vec![Need::range(self, acl::READ)], lock_somewhere: false }
    }
}

impl Access for DeleteRangeRequest {
    fn needs(&self) -> Needs<'_> {
        let need = Need { path: &self.path, from: &self.from, to: &self.to, permission: acl::WRITE };
        Needs { at: vec![need], lock_somewhere: false }
    }
}

/// A put may make the node a session's ephemeral, as a create may.
fn put_needs(put: &PutRequest) -> Need<'_> {
    Need::at(&put.path, acl::WRITE | if put.session_id != 0 { acl::LOCK } else { 0 })
}

impl Access for PutRequest {
    fn needs(&self) -> Needs<'_> {
        Needs { at: vec![put_needs(self)], lock_somewhere: false }
    }
}

impl Access for CreateRequest {
    fn needs(&self) -> Needs<'_> {
        Needs { at: vec![create_needs(self)], lock_somewhere: false }
    }
}

impl Access for TxnRequest {
    fn needs(&self) -> Needs<'_> {
        let mut at = Vec::new();
        txn_needs(self, &mut at);
        Needs { at, lock_somewhere: false }
    }
}

/// What a transaction's compares (their ranges too) and operations need, those of its
/// nested transactions included.
fn txn_needs<'r>(request: &'r TxnRequest, at: &mut Vec<Need<'r>>) {
    for compare in &request.compares {
        // A compare over ranges reads only them; one without compares its path.
        if compare.ranges.is_empty() {
            at.push(Need::at(&compare.path, acl::READ));
        }
        at.extend(compare.ranges.iter().map(|range| Need::range(range, acl::READ)));
    }
    for op in request.then.iter().chain(&request.r#else).filter_map(|op| op.op.as_ref()) {
        at.push(match op {
            Op::Create(create) => create_needs(create),
            Op::Set(set) => Need::at(&set.path, acl::WRITE),
            Op::Delete(delete) => Need::at(&delete.path, acl::WRITE),
            Op::Get(get) => Need::at(&get.path, acl::READ),
            Op::Put(put) => put_needs(put),
            Op::Range(range) => Need::range(range, acl::READ),
            Op::DeleteRange(delete) => Need { path: &delete.path, from: &delete.from, to: &delete.to, permission: acl::WRITE },
            Op::Txn(nested) => {
                txn_needs(nested, at);
                continue;
            }
        });
    }
}

impl Access for UnlockRequest {
    fn needs(&self) -> Needs<'_> {
        Needs::at(self.sequencer.as_ref().map_or("", |s| s.path.as_str()), acl::LOCK)
    }
}

impl Access for CheckSequencerRequest {
    fn needs(&self) -> Needs<'_> {
        Needs::at(self.sequencer.as_ref().map_or("", |s| s.path.as_str()), acl::READ)
    }
}

/// A session counts for quotas at its path hint: opening one there takes `lock` there, so
/// nobody spends a subtree's session quota without the right to lock in it.
impl Access for CreateSessionRequest {
    fn needs(&self) -> Needs<'_> {
        if self.path_hint.is_empty() {
            Needs { at: Vec::new(), lock_somewhere: true }
        } else {
            Needs::at(&self.path_hint, acl::LOCK)
        }
    }
}

/// Calls whose only check is the session's owner (by the group) or authentication.
macro_rules! needs_nothing_more {
    ($($t:ty),*) => {
        $(impl Access for $t {
            fn needs(&self) -> Needs<'_> {
                Needs::default()
            }
        })*
    };
}

needs_nothing_more!(KeepAliveRequest, CloseSessionRequest, SessionInfoRequest, SyncRequest);

impl Access for WatchCreate {
    fn needs(&self) -> Needs<'_> {
        let need = Need { path: &self.path, from: &self.from, to: &self.to, permission: acl::WATCH };
        Needs { at: vec![need], lock_somewhere: false }
    }
}

/// Refuses PERMISSION_DENIED a principal missing anything the call needs.
pub fn authorize(list: &Acl, principal: &str, needs: &Needs<'_>) -> Result<(), Status> {
    for need in &needs.at {
        let allowed = list.allows(principal, need.path, need.permission)
            || need.escaped_grant_path().is_some_and(|path| list.allows(principal, &path, need.permission));
        if !allowed {
            let (path, permission) = (need.path, need.permission);
            let message = format!("{principal} may not {} at {path}", acl::permission_words(permission).replace(',', "+"));
            return Err(warden_proto::status(warden_proto::warden_error(Code::PermissionDenied, path, message)));
        }
    }
    if needs.lock_somewhere && !list.allows_somewhere(principal, acl::LOCK) {
        let message = format!("{principal} may not open sessions: it has no lock permission anywhere");
        return Err(warden_proto::status(warden_proto::warden_error(Code::PermissionDenied, "", message)));
    }
    Ok(())
}

/// Refuses what `caller` may not do with `request` (nothing is checked for
/// [`Caller::Open`] and [`Caller::Node`]).
pub fn authorize_call<R: Access>(list: &AclCache, caller: &Caller, request: &R) -> Result<(), Status> {
    match caller.principal() {
        Some(principal) => authorize(&list.get(), principal, &request.needs()),
        None => Ok(()),
    }
}

/// The list as this process last learned it, replaced whole when a newer one arrives.
#[derive(Debug, Default)]
pub struct AclCache {
    current: RwLock<Arc<Acl>>,
}

impl AclCache {
    /// The current list.
    pub fn get(&self) -> Arc<Acl> {
        self.current.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Its version (0: none learned yet: only `root` is allowed anything).
    pub fn version(&self) -> u64 {
        self.get().version()
    }

    /// Takes `acl` if it is newer than the current one.
    pub fn offer(&self, acl: Acl) {
        let mut current = self.current.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if acl.version() > current.version() {
            *current = Arc::new(acl);
        }
    }
}

/// The list as placement sends it.
pub fn acl_to_proto(acl: &Acl) -> AclState {
    AclState {
        version: acl.version(),
        grants: acl.grants().map(|g| AclGrant { prefix: g.prefix, principal: g.principal, permissions: g.permissions }).collect(),
        groups: acl.groups().map(|(name, members)| AclGroup { name: name.to_string(), members: members.iter().cloned().collect() }).collect(),
    }
}

/// The list placement sent.
pub fn acl_from_proto(state: AclState) -> Acl {
    let grants = state.grants.into_iter().map(|g| Grant { prefix: g.prefix, principal: g.principal, permissions: g.permissions });
    Acl::from_parts(state.version, grants, state.groups.into_iter().map(|g| (g.name, g.members)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Acl {
        let mut list = Acl::default();
        list.change("/a", "alice", acl::READ | acl::WRITE, false, &acl::AclMaxima::DEFAULT).expect("grant");
        list
    }

    #[test]
    fn a_transaction_needs_every_path_it_touches() {
        let txn = TxnRequest {
            compares: vec![Compare { path: "/b/x".into(), ..Compare::default() }],
            then: vec![TxnOp { op: Some(Op::Set(SetRequest { path: "/a/y".into(), ..SetRequest::default() })) }],
            ..TxnRequest::default()
        };
        let refused = authorize(&list(), "alice", &txn.needs()).expect_err("the compare is outside her grant");
        assert_eq!(warden_proto::error_of(&refused).map(|e| (e.code, e.path)), Some((Code::PermissionDenied as i32, "/b/x".to_string())));
        let inside = TxnRequest { compares: vec![Compare { path: "/a/x".into(), ..Compare::default() }], ..txn };
        assert!(authorize(&list(), "alice", &inside.needs()).is_ok());
    }

    #[test]
    fn an_ephemeral_needs_lock_too_and_a_session_needs_lock_at_its_hint_or_somewhere() {
        let ephemeral = CreateRequest { path: "/a/e".into(), session_id: 7, ..CreateRequest::default() };
        assert!(authorize(&list(), "alice", &ephemeral.needs()).is_err());
        assert!(authorize(&list(), "alice", &CreateSessionRequest::default().needs()).is_err());
        let mut with_lock = list();
        with_lock.change("/a", "alice", acl::LOCK, false, &acl::AclMaxima::DEFAULT).expect("grant");
        assert!(authorize(&with_lock, "alice", &ephemeral.needs()).is_ok());
        assert!(authorize(&with_lock, "alice", &CreateSessionRequest::default().needs()).is_ok());
        let hinted = |hint: &str| CreateSessionRequest { path_hint: hint.into(), ..CreateSessionRequest::default() };
        assert!(authorize(&with_lock, "alice", &hinted("/a/leases").needs()).is_ok(), "a hint where she may lock");
        let refused = authorize(&with_lock, "alice", &hinted("/b").needs()).expect_err("a hint where she may not lock");
        assert_eq!(warden_proto::error_of(&refused).map(|e| (e.code, e.path)), Some((Code::PermissionDenied as i32, "/b".to_string())));
    }

    #[test]
    fn a_grant_covers_the_escaped_etcd_keys_of_its_prefix_and_no_others() {
        use warden_placement::etcd_keys::escaped_path;
        let escaped_range =
            |from: &[u8], to: &[u8]| RangeRequest { path: "/_etcd".into(), from: from.to_vec(), to: to.to_vec(), ..RangeRequest::default() };
        let prefix = escaped_path(b"/a/");
        let own = escaped_range(prefix.as_bytes(), format!("{}!2g", escaped_path(b"/a")).as_bytes());
        assert!(authorize(&list(), "alice", &own.needs()).is_ok(), "her prefix's escaped keys");
        assert!(authorize(&list(), "alice", &GetRequest { path: escaped_path(b"/a//x"), ..GetRequest::default() }.needs()).is_ok());
        let delete = DeleteRangeRequest { path: "/_etcd".into(), from: own.from.clone(), to: own.to.clone(), ..DeleteRangeRequest::default() };
        assert!(authorize(&list(), "alice", &delete.needs()).is_ok(), "a delete of them");
        let wider = escaped_range(prefix.as_bytes(), escaped_path(b"/a0").as_bytes());
        let refused = authorize(&list(), "alice", &wider.needs()).expect_err("reaches past her prefix's escapes");
        assert_eq!(warden_proto::error_of(&refused).map(|e| (e.code, e.path)), Some((Code::PermissionDenied as i32, "/_etcd".to_string())));
        assert!(authorize(&list(), "alice", &escaped_range(b"", b"").needs()).is_err(), "every escaped key");
        assert!(authorize(&list(), "alice", &GetRequest { path: escaped_path(b"/b//x"), ..GetRequest::default() }.needs()).is_err());
        assert!(authorize(&list(), "alice", &GetRequest { path: escaped_path(b"foo"), ..GetRequest::default() }.needs()).is_err());
        let compare = Compare { path: "/_etcd".into(), ranges: vec![own.clone()], ..Compare::default() };
        assert!(authorize(&list(), "alice", &TxnRequest { compares: vec![compare], ..TxnRequest::default() }.needs()).is_ok(), "a compare over them");
    }

    #[test]
    fn the_list_survives_its_wire_form_and_a_stale_one_is_not_taken() {
        let mut list = list();
        list.change_group("ops", "bob", false, &acl::AclMaxima::DEFAULT).expect("group");
        assert_eq!(acl_from_proto(acl_to_proto(&list)), list);
        let cache = AclCache::default();
        cache.offer(list.clone());
        cache.offer(Acl::default());
        assert_eq!(cache.version(), list.version());
    }
}
