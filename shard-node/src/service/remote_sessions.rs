//! Sessions across groups (DESIGN.md rule 7). A session lives in its home group (its id
//! names it). Another group may hold its ephemeral nodes and lock waiters:
//!
//! - Before such a group creates the first one, the service here confirms with the home
//!   group that the session is alive (`CheckSessions`: the home group notes the asking group
//!   in the session's record, a write) and proposes `AddRemoteSessions`: the group now
//!   records the session as remote. Apply refuses an ephemeral of a session the group has no
//!   record of (SESSION_EXPIRED).
//! - Every later call that creates an ephemeral or takes a lock for it asks the home group
//!   again (`CheckSessions` as a linearizable read there): a session its home group ended is
//!   ended here at once and refused, and while the home group cannot be asked nothing new
//!   is granted (UNAVAILABLE); what the session already holds stays
//!   (docs/design/remote-sessions.md).
//! - Closing a session at home ends it in every group its record notes
//!   ([`WardenService::end_at_holders`], `EndSessions`) before the close is answered: no
//!   call made after the close can use the session anywhere. A group that cannot be told
//!   within the call is named in the answer (`not_ended_in`).
//! - The leader of every group checks its remote sessions every `remote_session_check_ms`
//!   ([`WardenService::run_session_checks`]): one `CheckSessions` call per pair of groups
//!   (batches of at most `SESSION_IDS_PER_CHECK_MAX`), and proposes `EndRemoteSessions` for
//!   those the home group no longer has. Only that verdict ends them: a remote group never
//!   expires a session on its own, so while a home group cannot be reached its sessions'
//!   ephemerals stay (safe: no lock is released early), and [`RemoteSessionMetrics`] says so.
//! - The home side answers `CheckSessions` here too ([`SessionCheck`]).
//!
//! A confirmation can race with the end of the session (confirmed, then expired at home,
//! then recorded here): the next check finds it dead and deletes what it created, so such an
//! ephemeral lives at most one check interval. So do the ephemerals of an expired session
//! (an expiry is the home leader's own entry, with no service call to tell the others), of
//! a closed one in a group a subtree move gave the ephemerals before that group's first
//! check noted it at home (`checker_group`), or in a group the close could not reach in
//! time. A group past
//! the `REMOTE_HOLDERS_MAX` a session notes is refused the session (TOO_LARGE).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use warden_placement::PLACEMENT_GROUP_ID;
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::leader_request::Request as LeaderRequestKind;
use warden_proto::namespace::leader_response::Response as LeaderResponseKind;
use warden_proto::namespace::query::Query as QueryKind;
use warden_proto::namespace::query_result::Result as QueryOutcome;
use warden_proto::namespace::session_check_server::{SessionCheck, SessionCheckServer};
use warden_proto::namespace::{
    AddRemoteSessions, CheckSessionsRequest, CheckSessionsResponse, EndRemoteSessions, EndSessionsRequest, EndSessionsResponse, NoteRemoteHolders,
    RemoteSessionsPage, SessionIds,
};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{Consistency, WardenError};

use super::{error, internal, status, WardenService};
use warden_namespace::sessions::{home_group, REMOTE_HOLDERS_MAX, REMOTE_SESSIONS_PAGE_MAX, SESSION_IDS_PER_CHECK_MAX};

/// What a close keeps of its call's time for its answer when it waits for the groups that
/// recorded its session to end it there (a group out of reach ends it at its next check
/// instead, and the answer names it).
const END_AT_HOLDERS_MARGIN: Duration = Duration::from_millis(500);

/// Remote sessions one group's check looks at per round at most (the rest wait a round).
const REMOTE_SESSIONS_PER_ROUND_MAX: usize = 64 * REMOTE_SESSIONS_PAGE_MAX;

/// What this node's last round of remote-session checks found (summed over the groups it
/// leads). Non-zero `unreachable_*` means ephemerals are being kept for sessions whose
/// home group could not be asked.
#[derive(Debug, Default)]
pub struct RemoteSessionMetrics {
    /// Remote sessions recorded by the groups this node leads.
    pub remote_sessions: AtomicU64,
    /// Pairs (led group, home group) whose check failed in the last round.
    pub unreachable_homes: AtomicU64,
    /// Remote sessions whose home group could not be asked in the last round.
    pub unconfirmed_sessions: AtomicU64,
    /// `CheckSessions` calls made, ever.
    pub checks: AtomicU64,
    /// Home side: sessions homed in the groups this node leads that a check by a group
    /// recording them noted as held there (a subtree move had brought them), ever.
    pub holders_noted_by_checks: AtomicU64,
    /// Remote sessions ended on a home group's verdict, ever.
    pub ended: AtomicU64,
}

/// One group's round: how many sessions it records and how many could not be confirmed.
#[derive(Default)]
struct RoundOutcome {
    sessions: u64,
    unreachable_homes: u64,
    unconfirmed_sessions: u64,
}

/// What [`WardenService::ensure_remote_sessions`] does with a session its home group says
/// is not alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WhenEnded {
    /// Refuse the call SESSION_EXPIRED: the session is used whatever happens.
    Refuse,
    /// Record the others and go on: a transaction uses a session only in the branch it
    /// takes, and apply refuses an ephemeral of a session this group does not record
    /// (SESSION_EXPIRED), so a put of an ended session in the branch not taken changes
    /// nothing, as in etcd.
    LeaveToApply,
}

/// Groups `session_ids` by home group.
fn by_home(session_ids: &[u64]) -> BTreeMap<u64, Vec<u64>> {
    let mut homes: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for id in session_ids {
        homes.entry(home_group(*id)).or_default().push(*id);
    }
    homes
}

impl WardenService {
    /// Makes sure `group` records every session of `sessions` homed elsewhere, and that each
    /// is alive at its home group during this call: a new one is confirmed and noted there
    /// (a write at home), one already recorded here is asked again (a linearizable read at
    /// home), so a group never grants a new hold or creates an ephemeral for a session its
    /// home group already ended (docs/design/remote-sessions.md). A session the home group
    /// reports ended is ended here too (its verdict, rule 7), then refused SESSION_EXPIRED or
    /// left to apply, as `when_ended` says; UNAVAILABLE if a home group cannot be asked.
    pub(super) async fn ensure_remote_sessions(
        &self,
        group: u64,
        sessions: impl IntoIterator<Item = u64>,
        owners_needed: bool,
        when_ended: WhenEnded,
        timeout: Duration,
    ) -> Result<(), Status> {
        self.confirm_remote_sessions(group, sessions, owners_needed, when_ended, false, timeout).await
    }

    /// [`ensure_remote_sessions`](Self::ensure_remote_sessions) for a call that only names
    /// its sessions (an Unlock): those recorded here are not asked again.
    pub(super) async fn ensure_remote_sessions_named(
        &self,
        group: u64,
        sessions: impl IntoIterator<Item = u64>,
        timeout: Duration,
    ) -> Result<(), Status> {
        self.confirm_remote_sessions(group, sessions, true, WhenEnded::Refuse, true, timeout).await
    }

    /// The one sequence behind both: with `only_unrecorded` (a call that uses no session
    /// anew) sessions already recorded here are not asked again.
    async fn confirm_remote_sessions(
        &self,
        group: u64,
        sessions: impl IntoIterator<Item = u64>,
        owners_needed: bool,
        when_ended: WhenEnded,
        only_unrecorded: bool,
        timeout: Duration,
    ) -> Result<(), Status> {
        let mut remote: Vec<u64> = sessions.into_iter().filter(|id| *id != 0 && home_group(*id) != group).collect();
        remote.sort_unstable();
        remote.dedup();
        if remote.is_empty() {
            return Ok(());
        }
        // 1. Which this group already records: its applied state here is enough, since a
        //    stale answer only costs a repeated confirmation.
        //    With `owners_needed` (security on), a record that does not know its owner (an
        //    earlier release's subtree move brought it) counts as unknown: its owner is
        //    confirmed too, or apply refuses the session's use.
        let query = QueryKind::Sessions(SessionIds { session_ids: remote.clone(), ..SessionIds::default() });
        let known: Vec<u64> = match self.read_group(group, Consistency::Stale as i32, query, timeout).await? {
            (QueryOutcome::Sessions(known), _) => {
                known.session_ids.into_iter().filter(|id| !owners_needed || !known.owners_unknown.contains(id)).collect()
            }
            _ => return Err(internal("mismatched result".into())),
        };
        // 2. Each home group says which are alive: the unrecorded ones are noted there (so a
        //    close ends them here), the recorded ones only read, all homes at once. Nothing
        //    is recorded before every answer is in.
        let deadline = Instant::now() + timeout;
        let asked: Vec<u64> = if only_unrecorded { remote.iter().copied().filter(|id| !known.contains(id)).collect() } else { remote.clone() };
        let calls = by_home(&asked).into_iter().flat_map(|(home, ids)| {
            let (recorded, unrecorded): (Vec<u64>, Vec<u64>) = ids.into_iter().partition(|id| known.contains(id));
            [(home, unrecorded, true), (home, recorded, false)].into_iter().filter(|(_, ids, _)| !ids.is_empty())
        });
        let answers = futures::future::join_all(calls.map(|(home, ids, note)| async move {
            self.remote_metrics.checks.fetch_add(1, Ordering::Relaxed);
            let alive = self.links.check_sessions(group, home, &ids, note, deadline).await;
            (home, ids, alive)
        }))
        .await;
        let mut owners: HashMap<u64, String> = HashMap::new();
        let mut ended: Vec<(u64, u64)> = Vec::new();
        let mut holders_full: Vec<u64> = Vec::new();
        for (home, ids, answer) in answers {
            let answer = answer?;
            ended.extend(ids.iter().copied().filter(|id| !answer.is_live(*id)).map(|id| (id, home)));
            owners.extend(answer.alive);
            holders_full.extend(answer.holders_full);
        }
        // 3. Those their home group ended, recorded here, end here now (the home group's
        //    verdict), so apply refuses them whatever branch uses them.
        let ended_here: Vec<u64> = ended.iter().map(|(id, _)| *id).filter(|id| known.contains(id)).collect();
        for batch in ended_here.chunks(self.limits(group).sessions_per_expiry_max) {
            let op = CommandOp::EndRemoteSessions(EndRemoteSessions { session_ids: batch.to_vec(), closed: false });
            self.propose(group, op, "", timeout).await?;
            self.remote_metrics.ended.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        if let (Some((dead, home)), WhenEnded::Refuse) = (ended.first(), when_ended) {
            return Err(status(error(Code::SessionExpired, "", &format!("session {dead} has expired or was closed (home group {home})"))));
        }
        // A session noting as many groups as it may is refused here: its close could not
        // end it in this group before answering.
        if let Some(full) = holders_full.first() {
            let message = format!("session {full} already holds nodes or locks in {REMOTE_HOLDERS_MAX} groups besides its home group");
            return Err(status(WardenError { limit: REMOTE_HOLDERS_MAX as u64, ..error(Code::TooLarge, "", &message) }));
        }
        // 4. The new ones alive are recorded, with their owners (a command using one is
        //    checked against it): ephemerals of these sessions may now be created here.
        remote.retain(|id| !known.contains(id) && !ended.iter().any(|(dead, _)| dead == id));
        if remote.is_empty() {
            return Ok(());
        }
        let owners = remote.iter().map(|id| owners.remove(id).unwrap_or_default()).collect();
        let op = CommandOp::AddRemoteSessions(AddRemoteSessions { session_ids: remote, owners });
        self.propose(group, op, "", timeout).await.map(|_| ())
    }

    /// Checks the remote sessions of every group this node leads, every `interval`, until
    /// the runtime stops. Rounds never overlap.
    pub(crate) async fn run_session_checks(self, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let mut total = RoundOutcome::default();
            // A group whose state machine needs no clock has no remote session (one that has
            // keeps its leader ticking), so it is not asked: asking would wake it, and keep an
            // idle group from ever hibernating (`host/hibernate.rs`). The flag is published
            // in the round that applied the change, so a new remote session waits at most one
            // more interval for its first check.
            let led = self.node.led_groups().into_iter().filter(|g| *g != PLACEMENT_GROUP_ID && self.node.leader_info(*g).needs_ticks);
            for group in led {
                let outcome = self.check_group(group, interval).await;
                total.sessions += outcome.sessions;
                total.unreachable_homes += outcome.unreachable_homes;
                total.unconfirmed_sessions += outcome.unconfirmed_sessions;
            }
            let metrics = &self.remote_metrics;
            metrics.remote_sessions.store(total.sessions, Ordering::Relaxed);
            metrics.unreachable_homes.store(total.unreachable_homes, Ordering::Relaxed);
            metrics.unconfirmed_sessions.store(total.unconfirmed_sessions, Ordering::Relaxed);
        }
    }

    /// One round for `group`: list its remote sessions, ask each home group about its own
    /// (one call per home and batch, all homes at once), end those reported dead.
    async fn check_group(&self, group: u64, timeout: Duration) -> RoundOutcome {
        // 1. The leader's list (from its applied state).
        let mut sessions = Vec::new();
        let mut after = 0;
        while sessions.len() < REMOTE_SESSIONS_PER_ROUND_MAX {
            let page = LeaderRequestKind::RemoteSessions(RemoteSessionsPage { after, limit: REMOTE_SESSIONS_PAGE_MAX as u32 });
            let ids = match self.leader_call(group, page, "", timeout).await {
                Ok((LeaderResponseKind::RemoteSessions(ids), _)) => ids.session_ids,
                // Not leader any more, or not a namespace group: nothing to do.
                Ok(_) | Err(_) => return RoundOutcome::default(),
            };
            let full = ids.len() == REMOTE_SESSIONS_PAGE_MAX;
            after = ids.last().copied().unwrap_or(after);
            sessions.extend(ids);
            if !full {
                break;
            }
        }
        let mut outcome = RoundOutcome { sessions: sessions.len() as u64, ..RoundOutcome::default() };
        if sessions.is_empty() {
            return outcome;
        }
        // 2. One call per home group and batch, all at once.
        let deadline = Instant::now() + timeout;
        let homes = by_home(&sessions);
        let calls = homes.iter().flat_map(|(home, ids)| ids.chunks(SESSION_IDS_PER_CHECK_MAX).map(move |batch| (*home, batch))).map(
            |(home, batch)| async move {
                self.remote_metrics.checks.fetch_add(1, Ordering::Relaxed);
                (home, batch, self.links.check_sessions(group, home, batch, false, deadline).await)
            },
        );
        let mut dead = Vec::new();
        let mut unreachable = std::collections::BTreeSet::new();
        for (home, batch, answer) in futures::future::join_all(calls).await {
            match answer {
                Ok(answer) => {
                    // Alive, but noting as many groups as it may: kept here until it ends (the
                    // home's close cannot end it here; this group's next check after it does).
                    if !answer.holders_full.is_empty() {
                        tracing::warn!(group, home, sessions = answer.holders_full.len(), "sessions moved here cannot be noted at home");
                    }
                    dead.extend(batch.iter().filter(|id| !answer.is_live(**id)));
                }
                Err(error) => {
                    // Kept: only the home group's verdict ends a session (rule 7).
                    tracing::warn!(group, home, sessions = batch.len(), %error, "home group unreachable; keeping its sessions' ephemerals");
                    unreachable.insert(home);
                    outcome.unconfirmed_sessions += batch.len() as u64;
                }
            }
        }
        outcome.unreachable_homes = unreachable.len() as u64;
        // 3. End the dead ones, in bounded entries.
        for batch in dead.chunks(self.limits(group).sessions_per_expiry_max) {
            let op = CommandOp::EndRemoteSessions(EndRemoteSessions { session_ids: batch.to_vec(), closed: false });
            match self.propose(group, op, "", timeout).await {
                Ok(_) => {
                    self.remote_metrics.ended.fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::debug!(group, %error, "ending remote sessions; retried next round");
                    break;
                }
            }
        }
        outcome
    }

    /// Ends the closed `session` (homed in `home`) in each group of `holders` (those that
    /// recorded it as remote), all at once, within the call's `timeout` less
    /// [`END_AT_HOLDERS_MARGIN`] (the answer must still reach its caller). Answers the groups
    /// that could not be told: each ends it at its next check instead.
    pub(super) async fn end_at_holders(&self, home: u64, session: u64, holders: &[u64], timeout: Duration) -> Vec<u64> {
        let deadline = Instant::now() + timeout.saturating_sub(END_AT_HOLDERS_MARGIN).max(END_AT_HOLDERS_MARGIN);
        let ends = holders.iter().map(|holder| async move { (*holder, self.links.end_sessions(home, *holder, &[session], deadline).await) });
        let mut not_ended = Vec::new();
        for (holder, ended) in futures::future::join_all(ends).await {
            if let Err(error) = ended {
                tracing::warn!(home, holder, session, %error, "a closed session is ended in this group at its next check instead");
                not_ended.push(holder);
            }
        }
        not_ended
    }

    /// The `SessionCheck` service (home side) over this service.
    pub fn session_check_server(self) -> SessionCheckServer<WardenService> {
        SessionCheckServer::new(self)
    }
}

#[tonic::async_trait]
impl SessionCheck for WardenService {
    async fn check_sessions(&self, request: Request<CheckSessionsRequest>) -> Result<Response<CheckSessionsResponse>, Status> {
        // Only a group holding a session's nodes asks (with TLS on: a node).
        warden_proto::tls::calling_node(&request)?;
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let group = request.routing.as_ref().map_or(0, |r| r.group_id);
        if request.session_ids.iter().any(|id| home_group(*id) != group) {
            return Err(status(error(Code::InvalidArgument, "", "every session checked must be homed in the routed group")));
        }
        if request.holder_group != 0 {
            // The asking group is about to record the live ones: noted in their records (a
            // write, so linearizable too), a close ends them there.
            let note = CommandOp::NoteRemoteHolders(NoteRemoteHolders { session_ids: request.session_ids, group_id: request.holder_group });
            return match self.propose(group, note, "", timeout).await? {
                (CommandOutcome::Sessions(alive), header) => Ok(Response::new(CheckSessionsResponse {
                    header: Some(header),
                    alive: alive.session_ids,
                    owners: alive.owners,
                    holders_full: alive.holders_full,
                })),
                _ => Err(internal("mismatched result".into())),
            };
        }
        // A group never records its own sessions as remote.
        let checker = Some(request.checker_group).filter(|checker| *checker != group).unwrap_or(0);
        let query = QueryKind::Sessions(SessionIds { session_ids: request.session_ids, checker_group: checker, ..SessionIds::default() });
        let (alive, header) = match self.read_group(group, Consistency::Linearizable as i32, query, timeout).await? {
            (QueryOutcome::Sessions(alive), header) => (alive, header),
            _ => return Err(internal("mismatched result".into())),
        };
        if alive.unnoted.is_empty() {
            return Ok(Response::new(CheckSessionsResponse {
                header: Some(header),
                alive: alive.session_ids,
                owners: alive.owners,
                holders_full: Vec::new(),
            }));
        }
        // The checking group records sessions whose records here do not note it (a subtree
        // move brought them there): noted now, a write, so a close ends them there at once.
        let note = CommandOp::NoteRemoteHolders(NoteRemoteHolders { session_ids: alive.unnoted.clone(), group_id: checker });
        let (noted, header) = match self.propose(group, note, "", timeout).await? {
            (CommandOutcome::Sessions(noted), header) => (noted, header),
            _ => return Err(internal("mismatched result".into())),
        };
        self.remote_metrics.holders_noted_by_checks.fetch_add(noted.session_ids.len() as u64, Ordering::Relaxed);
        // Of the unnoted, those that ended meanwhile are not alive, and those that could not be
        // noted are answered apart (`holders_full`), as to a group asking to record them.
        let (unnoted, noted_ids): (HashSet<u64>, HashSet<u64>) = (alive.unnoted.into_iter().collect(), noted.session_ids.into_iter().collect());
        let kept = |id: &u64| !unnoted.contains(id) || noted_ids.contains(id);
        let (alive_ids, owners) = alive.session_ids.into_iter().zip(alive.owners).filter(|(id, _)| kept(id)).unzip();
        Ok(Response::new(CheckSessionsResponse { header: Some(header), alive: alive_ids, owners, holders_full: noted.holders_full }))
    }

    async fn end_sessions(&self, request: Request<EndSessionsRequest>) -> Result<Response<EndSessionsResponse>, Status> {
        // Only the node of a session's home group tells (with TLS on: a node).
        warden_proto::tls::calling_node(&request)?;
        let timeout = self.timeout(&request);
        let request = request.into_inner();
        let group = request.routing.as_ref().map_or(0, |r| r.group_id);
        if request.session_ids.len() > self.limits(group).sessions_per_expiry_max {
            return Err(status(error(Code::TooLarge, "", "more sessions than one expiry ends")));
        }
        // Only remote records end (apply skips the group's own sessions): a session id
        // names one session forever, so ending a closed one is always right. A close starts
        // no lock-delay here, as none at home (`CloseSession`).
        let op = CommandOp::EndRemoteSessions(EndRemoteSessions { session_ids: request.session_ids, closed: true });
        let (_, header) = self.propose(group, op, "", timeout).await?;
        Ok(Response::new(EndSessionsResponse { header: Some(header) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_namespace::sessions::session_id;

    #[test]
    fn sessions_are_grouped_by_their_home() {
        let ids = [session_id(2, 1), session_id(3, 1), session_id(2, 9)];
        let homes = by_home(&ids);
        assert_eq!(homes.len(), 2, "one batch per home group, not per session");
        assert_eq!(homes[&2], vec![session_id(2, 1), session_id(2, 9)]);
        assert_eq!(homes[&3], vec![session_id(3, 1)]);
    }
}
