//! Sessions (DESIGN.md rules 6 and 7): a replicated record per session (id, granted TTL,
//! ephemeral count) with an index of its ephemeral nodes, and the lease deadlines, which live
//! only in the leader's memory ([`LeaseTable`]). The leader proposes expiries; apply deletes a
//! session's ephemerals in the same entry as the session, in path order.

use std::collections::{BTreeMap, HashMap};

pub use warden_engine::state_machine::LeaderClock;
use warden_proto::namespace::SessionRecord;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

use super::apply::{done, Effects};
use super::error::{error, invalid, session_expired, Failure};
use super::txn::{Deleter, SessionChange, Txn};
use super::NamespaceStateMachine;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::{CreateSession, SessionIds};
use warden_proto::v1::{CloseSessionResponse, CreateSessionResponse};

pub use warden_placement::{home_group, session_id, SESSION_SEQUENCE_BITS};

/// Remote session ids the leader lists per call.
pub const REMOTE_SESSIONS_PAGE_MAX: usize = 4096;
/// Home sessions the leader lists per call (`SessionInfoRequest.list_limit`'s maximum).
pub const SESSIONS_LIST_PAGE_MAX: usize = 10_000;
/// Session ids one `Sessions` query or `CheckSessions` call may name.
pub const SESSION_IDS_PER_CHECK_MAX: usize = 4096;
/// Groups a session notes as holding it remotely (`SessionRecord.remote_holders`): a close
/// ends it in these at once (each noted group costs the close one call); a further group is
/// refused the session (`SessionIds.holders_full`).
pub const REMOTE_HOLDERS_MAX: usize = 64;

/// Who may use a session, as its record here says (a session is its opener's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner<'a> {
    /// Opened with security off: anyone.
    Anyone,
    /// Only this principal (and root).
    Principal(&'a str),
    /// Not known here yet: a remote record an earlier release's subtree move brought without
    /// its owner. Nobody (but root and the system) until its home group says.
    Unknown,
}

/// Who may use the session of `record` (see `SessionRecord.owner_known`).
pub fn owner(record: &SessionRecord) -> Owner<'_> {
    match record.owner.as_str() {
        "" if record.remote && !record.owner_known => Owner::Unknown,
        "" => Owner::Anyone,
        owner => Owner::Principal(owner),
    }
}

/// Refuses `principal` the use of the session of `record` (its ephemerals, lock waiters,
/// releases, end, keepalives, description) unless it is the session's owner:
/// PERMISSION_DENIED for another principal's, UNAVAILABLE (retried; the service learns the
/// owner from the home group before it proposes) while the owner is unknown here. An empty
/// principal (security off, or the system's own command) and root are not checked.
pub fn check_use(record: &SessionRecord, principal: &str, path: &str) -> Result<(), WardenError> {
    if principal.is_empty() || principal == warden_placement::acl::ROOT_PRINCIPAL {
        return Ok(());
    }
    let session = record.session_id;
    match owner(record) {
        Owner::Anyone => Ok(()),
        Owner::Principal(owner) if owner == principal => Ok(()),
        Owner::Principal(_) => Err(error(Code::PermissionDenied, path, format!("session {session:#x} is not {principal}'s"))),
        Owner::Unknown => {
            let message = format!("the owner of session {session:#x} is not known here yet: retry once its home group has said");
            Err(error(Code::Unavailable, path, message))
        }
    }
}

/// Re-propose an expiry that has not applied after this long (it may have been dropped).
const EXPIRY_RETRY_MS: u64 = 5_000;

/// Session deadlines as the leader judges them. Not replicated and not persisted: a new
/// leader starts by granting every session a full TTL.
#[derive(Debug, Default)]
pub struct LeaseTable {
    leading: bool,
    deadlines: HashMap<u64, u64>,
    /// Sessions whose expiry was proposed, and when.
    expiring: HashMap<u64, u64>,
    /// Latest monotonic time seen.
    now_ms: u64,
    /// Nothing can be due before this time, so the per-tick scan is skipped until then.
    /// Renewals only move deadlines later, so it stays a valid lower bound between scans.
    recheck_at_ms: u64,
}

impl LeaseTable {
    /// This replica became leader (`true`) or stopped leading. A new leader grants every
    /// known session a fresh full TTL before it expires anything.
    pub fn set_leading(&mut self, leading: bool, sessions: &BTreeMap<u64, u64>, now_ms: u64) {
        self.leading = leading;
        self.now_ms = self.now_ms.max(now_ms);
        self.deadlines.clear();
        self.expiring.clear();
        self.recheck_at_ms = 0;
        if leading {
            for (id, ttl_ms) in sessions {
                self.deadlines.insert(*id, now_ms + ttl_ms);
            }
        }
    }

    /// Grants every session a full TTL from the latest time seen (after the set of sessions
    /// was replaced by a snapshot).
    pub fn regrant(&mut self, sessions: &BTreeMap<u64, u64>) {
        let (leading, now_ms) = (self.leading, self.now_ms);
        self.set_leading(leading, sessions, now_ms);
    }

    /// True while this replica leads.
    pub fn leading(&self) -> bool {
        self.leading
    }

    /// The latest monotonic time seen (on the leader, reported before every apply).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The leader's clock now (before an apply): what [`Self::add`] counts from.
    pub fn observe(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    /// A session appeared (applied): on the leader it gets a full TTL from now (the latest
    /// time seen: the host reports its clock before every apply on the leader).
    pub fn add(&mut self, id: u64, ttl_ms: u64) {
        if self.leading {
            let deadline = self.now_ms + ttl_ms;
            self.deadlines.insert(id, deadline);
            self.recheck_at_ms = self.recheck_at_ms.min(deadline);
        }
    }

    /// A session ended (applied).
    pub fn remove(&mut self, id: u64) {
        self.deadlines.remove(&id);
        self.expiring.remove(&id);
    }

    /// Renews a live session; `None` if it is unknown or already being expired.
    pub fn renew(&mut self, id: u64, ttl_ms: u64, now_ms: u64) -> Option<u64> {
        self.now_ms = self.now_ms.max(now_ms);
        if self.expiring.contains_key(&id) {
            return None;
        }
        let deadline = self.deadlines.get_mut(&id)?;
        *deadline = (*deadline).max(now_ms + ttl_ms);
        Some(*deadline - now_ms)
    }

    /// Time left for a live session.
    pub fn remaining(&self, id: u64, now_ms: u64) -> Option<u64> {
        if self.expiring.contains_key(&id) {
            return None;
        }
        self.deadlines.get(&id).map(|deadline| deadline.saturating_sub(now_ms))
    }

    /// Sessions whose lease ran out, at most `max`, in id order; they are marked as expiring
    /// so they are proposed once (again only after [`EXPIRY_RETRY_MS`]).
    pub fn take_expired(&mut self, now_ms: u64, max: usize) -> Vec<u64> {
        self.now_ms = self.now_ms.max(now_ms);
        if !self.leading || now_ms < self.recheck_at_ms {
            return Vec::new();
        }
        let mut due: Vec<u64> = self.deadlines.iter().filter(|(id, deadline)| self.due_at(**id, **deadline) <= now_ms).map(|(id, _)| *id).collect();
        let truncated = due.len() > max;
        due.sort_unstable();
        due.truncate(max);
        for id in &due {
            self.expiring.insert(*id, now_ms);
        }
        self.recheck_at_ms =
            if truncated { now_ms } else { self.deadlines.iter().map(|(id, deadline)| self.due_at(*id, *deadline)).min().unwrap_or(u64::MAX) };
        due
    }

    /// When a session can next come due: its deadline, or the retry time of its proposed expiry.
    fn due_at(&self, id: u64, deadline: u64) -> u64 {
        self.expiring.get(&id).map_or(deadline, |proposed| proposed + EXPIRY_RETRY_MS)
    }
}

/// Applies a `CreateSession`: a session homed in this group (a retired group, merged away,
/// opens none: it only lets the sessions it homes end).
pub(super) fn apply_create(sm: &NamespaceStateMachine, txn: &mut Txn<'_, '_>, create: &CreateSession) -> Result<CommandOutcome, Failure> {
    if sm.descriptor.as_ref().is_some_and(super::descriptor::is_retiring) {
        let retired = sm.descriptor.as_ref().map(|d| Box::new(d.clone()));
        let message = "this group serves nothing (merged away): sessions are homed in serving groups";
        return Err(Failure::Refused(WardenError { descriptor: retired, ..error(Code::WrongGroup, "", message) }));
    }
    txn.create_session(sm.group, create.ttl_ms, &create.owner, &create.scope).map(CommandOutcome::CreateSession)
}

/// Applies a client's `CloseSession` (refused SESSION_EXPIRED when it does not exist); the
/// groups that recorded the session as remote go to `effects`, for the service to end it
/// there.
pub(super) fn apply_close(txn: &mut Txn<'_, '_>, session: u64, effects: &mut Effects) -> Result<CommandOutcome, Failure> {
    match txn.close_session(session)? {
        Some((deleted, holders)) => {
            effects.remote_holders = holders;
            Ok(CommandOutcome::CloseSession(CloseSessionResponse { header: None, deleted, not_ended_in: Vec::new() }))
        }
        None => Err(Failure::Refused(session_expired(session, ""))),
    }
}

/// Applies the leader's `ExpireSessions`: at most the limit's sessions per entry.
pub(super) fn apply_expire(txn: &mut Txn<'_, '_>, ids: &[u64]) -> Result<CommandOutcome, Failure> {
    let ids = &ids[..ids.len().min(txn.limits.sessions_per_expiry_max)];
    txn.expire_sessions(ids).map(|()| done())
}

/// Applies `EndRemoteSessions` (the home groups' verdicts): at most the limit's per entry.
pub(super) fn apply_end_remote(txn: &mut Txn<'_, '_>, ids: &[u64], closed: bool) -> Result<CommandOutcome, Failure> {
    let ids = &ids[..ids.len().min(txn.limits.sessions_per_expiry_max)];
    txn.end_remote_sessions(ids, closed).map(|()| done())
}

impl NamespaceStateMachine {
    /// Keeps the session index and the leader's lease table in step with the sessions a
    /// command opened, recorded or ended.
    pub(super) fn apply_session_changes(&mut self, changes: Vec<SessionChange>) {
        for change in changes {
            match change {
                SessionChange::Added(id, ttl_ms) => {
                    self.sessions.insert(id, ttl_ms);
                    self.leases.add(id, ttl_ms);
                }
                SessionChange::RemoteAdded(id) => {
                    self.remote_sessions.insert(id);
                }
                SessionChange::Removed(id) => {
                    self.sessions.remove(&id);
                    self.remote_sessions.remove(&id);
                    self.leases.remove(id);
                }
            }
        }
    }
}

impl Txn<'_, '_> {
    /// Opens a session of `group` with `ttl_ms` (clamped to the limits).
    pub fn create_session(&mut self, group: u64, ttl_ms: u64, owner: &str, scope: &str) -> Result<CreateSessionResponse, Failure> {
        let granted = ttl_ms.clamp(self.limits.session_ttl_ms_min, self.limits.session_ttl_ms_max);
        let sequence = self.view.take_session_sequence()?;
        if sequence >= 1 << SESSION_SEQUENCE_BITS {
            return Err(error(Code::TooLarge, "", "session ids of this group are exhausted").into());
        }
        let session_id = session_id(group, sequence);
        let record = SessionRecord {
            session_id,
            ttl_ms: granted,
            ephemerals: 0,
            remote: false,
            owner: owner.to_string(),
            scope: scope.to_string(),
            owner_known: true,
            remote_holders: Vec::new(),
        };
        self.view.put_session(&record);
        self.session_changes.push(SessionChange::Added(session_id, granted));
        Ok(CreateSessionResponse { header: None, session_id, granted_ttl_ms: granted, ttl_adjusted: granted != ttl_ms })
    }

    /// Closes a session of this group (a client's CloseSession): answers the nodes deleted
    /// and the groups its record noted as holding it remotely; `None` if it does not exist.
    /// A remote session is refused: only its home group may end it (DESIGN.md rule 7).
    pub fn close_session(&mut self, session: u64) -> Result<Option<(u64, Vec<u64>)>, Failure> {
        self.check_owner(session, "")?;
        let Some(record) = self.view.session(session)? else { return Ok(None) };
        if record.remote {
            return Err(invalid("", format!("session {session} is homed in group {}: close it there", home_group(session))).into());
        }
        Ok(self.end_session(session, false)?.map(|deleted| (deleted, record.remote_holders)))
    }

    /// Ends sessions of this group whose lease ran out (the leader's expiry): remote
    /// records are skipped, since only their home groups' verdicts end them.
    pub fn expire_sessions(&mut self, ids: &[u64]) -> Result<(), Failure> {
        for id in ids {
            if self.view.session(*id)?.is_some_and(|record| !record.remote) {
                self.end_session(*id, true)?;
            }
        }
        Ok(())
    }

    /// Records sessions of other groups that their home groups confirmed alive, with their
    /// `owners` (in the order of `ids`; an entry of an earlier release without them leaves
    /// the owners unknown). A recorded one is left as it is, but for an owner it did not know.
    pub fn add_remote_sessions(&mut self, group: u64, ids: &[u64], owners: &[String]) -> Result<(), Failure> {
        if let Some(own) = ids.iter().find(|id| home_group(**id) == group || home_group(**id) == 0) {
            return Err(invalid("", format!("session {own} is not homed in another group")).into());
        }
        for (index, id) in ids.iter().enumerate() {
            let owner = owners.get(index);
            match self.view.session(*id)? {
                Some(mut record) => {
                    if let Some(owner) = owner.filter(|_| self::owner(&record) == Owner::Unknown) {
                        record.owner = owner.clone();
                        record.owner_known = true;
                        self.view.put_session(&record);
                    }
                }
                None => {
                    let record = SessionRecord {
                        session_id: *id,
                        remote: true,
                        owner: owner.cloned().unwrap_or_default(),
                        owner_known: owner.is_some(),
                        ..SessionRecord::default()
                    };
                    self.view.put_session(&record);
                    self.session_changes.push(SessionChange::RemoteAdded(*id));
                }
            }
        }
        Ok(())
    }

    /// Group `holder` (another group) is about to record sessions homed here as remote:
    /// each live one of `ids` notes it (at most [`REMOTE_HOLDERS_MAX`] groups per session).
    /// Answers the live ones noted with their owners, as a `Sessions` query does, and those
    /// live but already noting as many other groups as they may in `holders_full` (the
    /// holder must not record them: a close could not end them there).
    pub fn note_remote_holders(&mut self, group: u64, holder: u64, ids: &[u64]) -> Result<SessionIds, Failure> {
        if holder == 0 || holder == group {
            return Err(invalid("", format!("group {holder} cannot hold this group's sessions as remote")).into());
        }
        let mut alive = SessionIds::default();
        for id in ids {
            let Some(mut record) = self.view.session(*id)?.filter(|record| !record.remote) else { continue };
            if !record.remote_holders.contains(&holder) {
                if record.remote_holders.len() >= REMOTE_HOLDERS_MAX {
                    alive.holders_full.push(*id);
                    continue;
                }
                record.remote_holders.push(holder);
                self.view.put_session(&record);
            }
            if owner(&record) == Owner::Unknown {
                alive.owners_unknown.push(*id);
            }
            alive.session_ids.push(*id);
            alive.owners.push(record.owner);
        }
        Ok(alive)
    }

    /// Ends remote sessions whose home groups said they ended: their ephemerals are deleted
    /// as an expiry's would be (locks they held enter their lock-delay). Ids that are not
    /// remote records here are skipped.
    pub fn end_remote_sessions(&mut self, ids: &[u64], closed: bool) -> Result<(), Failure> {
        for id in ids {
            if self.view.session(*id)?.is_some_and(|record| record.remote) {
                self.end_session(*id, !closed)?;
            }
        }
        Ok(())
    }

    /// Ends a session: its ephemeral nodes go first, in path order, then its record. When it
    /// `expired` (rather than closed), locks it held enter their lock-delay. Returns how many
    /// nodes were deleted (with emptied containers); `None` if the session does not exist.
    pub fn end_session(&mut self, session: u64, expired: bool) -> Result<Option<u64>, Failure> {
        if self.view.session(session)?.is_none() {
            return Ok(None);
        }
        let mut deleted = 0;
        loop {
            let (paths, _) = self.view.ephemerals(session, 1024)?;
            if paths.is_empty() {
                break;
            }
            for path in paths {
                if self.view.node(&path)?.is_none() {
                    // Already gone with an ancestor deleted earlier in this loop.
                    self.view.remove_ephemeral(session, &path);
                    continue;
                }
                if expired {
                    self.start_lock_delay_if_holding(&path)?;
                }
                deleted += self.delete_subtree(&path, Deleter::Locks)?;
                deleted += self.detach_from_parent(&path)?;
            }
        }
        self.view.delete_session(session);
        self.session_changes.push(SessionChange::Removed(session));
        Ok(Some(deleted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_home_group() {
        let id = session_id(7, 42);
        assert_eq!(home_group(id), 7);
        assert_ne!(session_id(7, 1), session_id(8, 1));
    }

    #[test]
    fn a_new_leader_grants_full_ttls_before_expiring() {
        let sessions = BTreeMap::from([(1, 1000), (2, 5000)]);
        let mut leases = LeaseTable::default();
        assert!(leases.take_expired(10_000, 10).is_empty(), "a follower expires nothing");
        leases.set_leading(true, &sessions, 10_000);
        assert!(leases.take_expired(10_999, 10).is_empty(), "every session got a full TTL at election");
        assert_eq!(leases.take_expired(11_000, 10), vec![1]);
        assert!(leases.take_expired(11_001, 10).is_empty(), "proposed once");
        assert_eq!(leases.renew(1, 1000, 11_002), None, "an expiring session is not renewed");
        assert_eq!(leases.renew(2, 5000, 12_000), Some(5000));
        assert_eq!(leases.remaining(2, 13_000), Some(4000));
        assert_eq!(leases.take_expired(11_000 + EXPIRY_RETRY_MS, 10), vec![1], "retried if still not applied");
        leases.remove(1);
        leases.set_leading(false, &sessions, 20_000);
        assert_eq!(leases.remaining(2, 20_000), None, "a follower holds no deadlines");
    }

    #[test]
    fn skipping_idle_scans_never_delays_an_expiry() {
        let sessions = BTreeMap::from([(1, 10_000)]);
        let mut leases = LeaseTable::default();
        leases.set_leading(true, &sessions, 0);
        assert!(leases.take_expired(100, 10).is_empty(), "nothing due: the next scan waits for 10 s");
        leases.add(2, 500);
        assert!(leases.take_expired(599, 10).is_empty());
        assert_eq!(leases.take_expired(600, 10), vec![2], "a session added after the scan is still expired on time");
        leases.remove(2); // Its expiry entry applied.
        assert_eq!(leases.renew(1, 10_000, 5_000), Some(10_000));
        assert!(leases.take_expired(10_000, 10).is_empty(), "renewed to 15 s");
        assert_eq!(leases.take_expired(15_000, 10), vec![1]);
    }

    /// The bug hibernation exposed: a leader that slept for longer than a TTL (no ticks, so
    /// no `take_expired` to move its clock) granted a session created on waking a lease that
    /// had ended already, expired it at its next tick and freed its locks, while the client
    /// counted a full TTL from its request (a stale holder acted in `tests/suite/crash_cycles.rs`).
    #[test]
    fn a_session_created_after_the_clock_stood_still_gets_a_full_ttl_from_its_creation() {
        let mut leases = LeaseTable::default();
        leases.set_leading(true, &BTreeMap::new(), 1_000);
        assert!(leases.take_expired(1_100, 10).is_empty());
        // Asleep from here: no tick for 60 s. The request that wakes it creates a session.
        leases.observe(61_100);
        leases.add(1, 3_000);
        assert!(leases.take_expired(61_200, 10).is_empty(), "a full TTL from its creation, not from the last tick");
        assert_eq!(leases.remaining(1, 61_200), Some(2_900));
        assert_eq!(leases.take_expired(64_100, 10), vec![1]);
        leases.observe(50_000);
        leases.add(2, 3_000);
        assert_eq!(leases.remaining(2, 64_100), Some(3_000), "the clock never goes back");
    }

    #[test]
    fn expiries_come_in_bounded_batches() {
        let sessions: BTreeMap<u64, u64> = (1..=100).map(|id| (id, 10)).collect();
        let mut leases = LeaseTable::default();
        leases.set_leading(true, &sessions, 0);
        let first = leases.take_expired(10, 64);
        assert_eq!(first.len(), 64);
        assert_eq!(leases.take_expired(10, 64).len(), 36);
    }
}
