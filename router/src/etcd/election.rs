//! etcd's `v3electionpb.Election` on Warden's nodes, as ZooKeeper's election recipe:
//!
//! - **Candidates**: a campaign is an ephemeral sequential node `candidate-NNNNNNNNNN` of
//!   its lease's session below the election's path (the path of its name, [`super::keys`]),
//!   holding the candidate's value. The path is made a container if missing, so it goes
//!   with its last candidate. A lease campaigns once per election, as in etcd (where its
//!   key is `name/<lease>`): a campaign of a lease that has a candidate goes on with it
//!   (with the new value), so a retried Campaign never queues behind itself.
//! - **The leader** is the candidate with the lowest sequence number (the first in path
//!   order). A waiting candidate watches only its predecessor (and itself), with one-shot
//!   watches set atomically with a read, and looks again when one goes: no herd, no poll.
//!   Once first, a candidate stays first until its node goes (later ones sort after it,
//!   and the numbers restart only with a new container, after every candidate went).
//! - **`LeaderKey`**: `key` is `name/candidate-NNNNNNNNNN` (for a name that is a plain
//!   path, the candidate node's own etcd key, so transactions can compare its creation),
//!   `rev` the node's create revision. Successive leaders of an election are candidates in
//!   creation order, so `rev` only grows from one leader to the next: a fencing token.
//! - **Proclaim** writes the leader's value if the key is still the first candidate, with
//!   that create revision and lease; **Resign** deletes the candidate if it still has that
//!   create revision (a stale key changes nothing, as in etcd).
//! - **Observe** reads the leader, then watches the election's subtree from the revision
//!   after the read: a write of the leader's node is its new value; the leader's deletion,
//!   or a candidate's creation while there is none, reads the leader again. It answers each
//!   new leader and value, never a gap between the read and the watch.
//!
//! A Campaign that ends without leading (its client hung up, its deadline passed, an error)
//! withdraws its candidate. etcd's errors are answered with etcd's messages
//! ("election: not leader", "election: no leader").

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use warden_proto::etcd::v3electionpb as pb;
use warden_proto::v1 as w;
use warden_proto::v1::warden_server::Warden;
use warden_proto::v1::watch_event::Type as EventType;

use super::kv::{key_value, path_of};
use super::lease::session_of;
use super::{etcd_revision, etcd_status, Call, Cleanup, EtcdService};

/// Name prefix of candidate nodes (the namespace appends ten digits).
pub const CANDIDATE_PREFIX: &str = "candidate-";
/// Leader answers queued on one Observe stream before the router waits for its client.
const OBSERVE_QUEUE_MAX: usize = 16;

/// etcd's refusal of a Proclaim by a key that does not lead.
fn not_leader() -> Status {
    Status::unknown("election: not leader")
}

/// etcd's refusal of a Proclaim or Resign without a leader key.
fn missing_leader() -> Status {
    Status::invalid_argument("\"leader\" field must be provided")
}

/// One election: its etcd name and the path its candidates are children of.
struct Election {
    name: Vec<u8>,
    path: String,
}

impl Election {
    /// The election named `name`.
    fn of(name: &[u8]) -> Result<Election, Status> {
        Ok(Election { name: name.to_vec(), path: path_of(name)? })
    }

    /// The candidates, in sequence order, up to `to` (excluded; `None`: all), at most `limit`
    /// (0: a page, the most a group answers).
    fn candidates(&self, to: Option<Vec<u8>>, limit: u32, keys_only: bool) -> w::RangeRequest {
        let prefix = format!("{}/{CANDIDATE_PREFIX}", self.path);
        // The prefix with its last byte `-` raised to `.`: names starting with the prefix,
        // and only they, sort between the two.
        let end = format!("{}/{}.", self.path, CANDIDATE_PREFIX.trim_end_matches('-'));
        w::RangeRequest {
            path: self.path.clone(),
            from: prefix.into_bytes(),
            to: to.unwrap_or_else(|| end.into_bytes()),
            limit,
            keys_only,
            ..w::RangeRequest::default()
        }
    }

    /// The key of the candidate node at `path`.
    fn key_of(&self, path: &str) -> Vec<u8> {
        [self.name.as_slice(), b"/", warden_paths::name(path).as_bytes()].concat()
    }

    /// The candidate node a key of this election names (`None`: not a candidate's key).
    fn node_of(&self, key: &[u8]) -> Option<String> {
        let name = std::str::from_utf8(key.strip_prefix(self.name.as_slice())?.strip_prefix(b"/")?).ok()?;
        let sequence = name.strip_prefix(CANDIDATE_PREFIX)?;
        (!sequence.is_empty() && sequence.bytes().all(|byte| byte.is_ascii_digit())).then(|| format!("{}/{name}", self.path))
    }

    /// Whether `path` is one of its candidates' nodes.
    fn is_candidate(&self, path: &str) -> bool {
        warden_paths::parent(path) == Some(self.path.as_str()) && warden_paths::name(path).starts_with(CANDIDATE_PREFIX)
    }
}

/// A candidate node: its path and create revision (which tells it from a later node at the
/// same path).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Candidate {
    path: String,
    create_revision: u64,
}

impl Candidate {
    /// The candidate a range answered.
    fn of(node: &w::Node) -> Candidate {
        Candidate { path: node.path.clone(), create_revision: node.stat.map_or(0, |stat| stat.create_revision) }
    }

    /// The compare that holds while this node is there.
    fn still_there(&self) -> w::Compare {
        w::Compare {
            path: self.path.clone(),
            target: w::compare::Target::CreateRevision as i32,
            op: w::compare::Op::Equal as i32,
            number: self.create_revision,
            ..w::Compare::default()
        }
    }
}

/// The error a native watch ended with.
fn watch_ended(canceled: w::WatchCanceled) -> Status {
    canceled.error.map_or_else(|| Status::unavailable("etcdserver: a watch ended"), |error| etcd_status(warden_proto::status(error)))
}

/// Whether `now` is another leader, or another value of it, than `before`.
fn is_news(before: Option<&w::Node>, now: &w::Node) -> bool {
    let mod_revision = |node: &w::Node| node.stat.map_or(0, |stat| stat.mod_revision);
    before.is_none_or(|before| Candidate::of(before) != Candidate::of(now) || mod_revision(before) != mod_revision(now))
}

impl EtcdService {
    /// A range of candidates, linearizable; one asking for all of them (`limit` 0) must get
    /// all.
    async fn candidates(&self, call: &Call, range: w::RangeRequest) -> Result<w::RangeResponse, Status> {
        let all = range.limit == 0;
        let answer = Warden::range(&self.router, call.request(range)?).await.map_err(etcd_status)?.into_inner();
        if all && answer.more {
            return Err(Status::resource_exhausted("etcdserver: the election has more candidates than one group answers at once"));
        }
        Ok(answer)
    }

    /// The leading candidate's node, if any, and the revision of the read.
    async fn leader_node(&self, call: &Call, election: &Election) -> Result<(Option<w::Node>, u64), Status> {
        let answer = self.candidates(call, election.candidates(None, 1, false)).await?;
        Ok((answer.nodes.into_iter().next(), answer.header.map_or(0, |h| h.revision)))
    }

    /// Runs `op` if `candidate` is still there: whether it ran, and the revision after.
    async fn write_if(&self, call: &Call, candidate: &Candidate, op: w::txn_op::Op) -> Result<(bool, u64), Status> {
        let txn = w::TxnRequest { compares: vec![candidate.still_there()], then: vec![w::TxnOp { op: Some(op) }], ..w::TxnRequest::default() };
        let answer = Warden::txn(&self.router, call.request(txn)?).await.map_err(etcd_status)?.into_inner();
        Ok((answer.succeeded, answer.header.map_or(0, |h| h.revision)))
    }

    /// Deletes `candidate` if it is still there; the revision after.
    async fn withdraw(&self, call: &Call, candidate: &Candidate) -> Result<u64, Status> {
        let delete = w::DeleteRequest { path: candidate.path.clone(), ..w::DeleteRequest::default() };
        Ok(self.write_if(call, candidate, w::txn_op::Op::Delete(delete)).await?.1)
    }

    /// The candidate of `session_id` in `election`, now with `value`: the one it has (a
    /// lease campaigns once), or a new one.
    async fn candidacy(&self, call: &Call, election: &Election, session_id: u64, value: &[u8]) -> Result<Candidate, Status> {
        use w::txn_op::Op;
        let listed = self.candidates(call, election.candidates(None, 0, true)).await?;
        if let Some(node) = listed.nodes.iter().find(|node| node.stat.is_some_and(|stat| stat.ephemeral_owner == session_id)) {
            let existing = Candidate::of(node);
            let set = w::SetRequest { path: existing.path.clone(), data: value.to_vec(), ..w::SetRequest::default() };
            if self.write_if(call, &existing, Op::Set(set)).await?.0 {
                return Ok(existing);
            }
        }
        let candidate = w::CreateRequest {
            path: format!("{}/{CANDIDATE_PREFIX}", election.path),
            data: value.to_vec(),
            sequential: true,
            session_id,
            ..w::CreateRequest::default()
        };
        // The election's path is made a container, so it goes with its last candidate.
        let container = w::CreateRequest {
            path: election.path.clone(),
            kind: w::NodeKind::Container as i32,
            create_parents: true,
            ..w::CreateRequest::default()
        };
        let exists = w::Compare { path: election.path.clone(), target: w::compare::Target::Exists as i32, exists: true, ..w::Compare::default() };
        let txn = w::TxnRequest {
            compares: vec![exists],
            then: vec![w::TxnOp { op: Some(Op::Create(candidate.clone())) }],
            r#else: vec![w::TxnOp { op: Some(Op::Create(container)) }, w::TxnOp { op: Some(Op::Create(candidate)) }],
            raise_to: 0,
            routing: None,
        };
        let answer = Warden::txn(&self.router, call.request(txn)?).await.map_err(etcd_status)?.into_inner();
        match answer.results.into_iter().last().and_then(|result| result.result) {
            Some(w::txn_op_result::Result::Create(created)) => {
                Ok(Candidate { path: created.path, create_revision: created.stat.map_or(0, |stat| stat.create_revision) })
            }
            _ => Err(Status::internal("a candidate's creation answered no creation")),
        }
    }

    /// Waits until `mine` leads; the revision of the read that found it first.
    async fn wait_to_lead(&self, call: &Call, election: &Election, session_id: u64, mine: &Candidate) -> Result<u64, Status> {
        let mut through_mine = mine.path.clone().into_bytes();
        through_mine.push(0);
        loop {
            let listed = self.candidates(call, election.candidates(Some(through_mine.clone()), 0, true)).await?;
            let ahead: Vec<Candidate> = listed.nodes.iter().map(Candidate::of).collect();
            match ahead.as_slice() {
                [only] if only == mine => return Ok(listed.header.map_or(0, |h| h.revision)),
                [.., predecessor, last] if last == mine => self.until_either_goes(&predecessor.path, &mine.path).await?,
                _ => return Err(self.candidacy_gone(call, session_id).await),
            }
        }
    }

    /// Why a campaign's candidate is gone: its lease ended, or someone resigned it.
    async fn candidacy_gone(&self, call: &Call, session_id: u64) -> Status {
        let info = match call.request(w::SessionInfoRequest { session_id, ..w::SessionInfoRequest::default() }) {
            Ok(info) => Warden::session_info(&self.router, info).await,
            Err(status) => return status,
        };
        match info {
            Ok(info) if info.get_ref().lease.as_ref().is_some_and(|lease| lease.alive) => {
                Status::aborted("election: the candidate's key was deleted while it campaigned")
            }
            Ok(_) => Status::not_found("etcdserver: requested lease not found"),
            Err(status) => etcd_status(status),
        }
    }

    /// Waits until the node at `first` or at `second` is deleted (or is gone already): one
    /// one-shot watch of each, set with a read of it.
    async fn until_either_goes(&self, first: &str, second: &str) -> Result<(), Status> {
        let create = |watch_id: u64, path: &str| {
            let create = w::WatchCreate {
                watch_id,
                path: path.to_string(),
                kind: w::watch_create::Kind::Exists as i32,
                // A value written is no change of turn.
                no_change: true,
                read: true,
                ..w::WatchCreate::default()
            };
            Ok(w::WatchRequest { request: Some(w::watch_request::Request::Create(create)) })
        };
        let requests = futures::stream::iter([create(1, first), create(2, second)]);
        let mut responses = crate::watch::proxy(self.router.upstreams().clone(), Box::pin(requests));
        while let Some(response) = responses.next().await {
            let response = response?;
            if let Some(canceled) = response.canceled {
                return Err(watch_ended(canceled));
            }
            let gone = matches!(response.created.and_then(|created| created.read), Some(w::watch_created::Read::Exists(read)) if read.stat.is_none());
            if gone || !response.events.is_empty() {
                return Ok(());
            }
        }
        Err(Status::unavailable("etcdserver: a watch ended"))
    }

    /// An etcd leader answer of `node` at `revision`.
    fn leader_answer(&self, election: &Election, node: w::Node, revision: u64) -> pb::LeaderResponse {
        pb::LeaderResponse { header: self.header(revision), kv: Some(key_value(election.key_of(&node.path), node)) }
    }

    /// Sends `answers` the leader of `election` and then each new leader or value, until the
    /// watch or a read fails or the observer goes away.
    async fn observe_leaders(
        &self,
        call: &Call,
        election: &Election,
        answers: &mpsc::Sender<Result<pb::LeaderResponse, Status>>,
    ) -> Result<(), Status> {
        let closed = || Status::cancelled("the observer went away");
        let (mut leader, revision) = self.leader_node(call, election).await?;
        // Every change after the read, so none is missed between the read and the watch.
        let create = w::WatchCreate { path: election.path.clone(), recursive: true, start_revision: revision + 1, ..w::WatchCreate::default() };
        let requests = futures::stream::iter([Ok(w::WatchRequest { request: Some(w::watch_request::Request::Create(create)) })]);
        let mut responses = crate::watch::proxy(self.router.upstreams().clone(), Box::pin(requests));
        let mut reported: Option<w::Node> = None;
        let mut at = revision;
        loop {
            if let Some(node) = leader.as_ref().filter(|node| is_news(reported.as_ref(), node)) {
                answers.send(Ok(self.leader_answer(election, node.clone(), at))).await.map_err(|_| closed())?;
                reported = Some(node.clone());
            }
            let response = responses.next().await.ok_or_else(|| Status::unavailable("etcdserver: a watch ended"))??;
            if let Some(canceled) = response.canceled {
                return Err(watch_ended(canceled));
            }
            at = response.header.map_or(0, |h| h.revision);
            let mut look_again = false;
            for event in response.events {
                let of_leader = leader.as_ref().is_some_and(|node| node.path == event.path);
                if of_leader && event.r#type == EventType::Changed as i32 {
                    leader = Some(w::Node { path: event.path, data: event.data.to_vec(), stat: event.stat });
                } else if of_leader || (leader.is_none() && event.r#type == EventType::Created as i32 && election.is_candidate(&event.path)) {
                    look_again = true;
                }
            }
            if look_again {
                (leader, at) = self.leader_node(call, election).await?;
            }
        }
    }
}

#[tonic::async_trait]
impl pb::election_server::Election for EtcdService {
    /// Campaigns for `lease` and waits until it leads; a campaign that ends otherwise
    /// withdraws its candidate.
    async fn campaign(&self, request: Request<pb::CampaignRequest>) -> Result<Response<pb::CampaignResponse>, Status> {
        let (call, request) = Call::of(request);
        let session_id = session_of(request.lease)?;
        let election = Election::of(&request.name)?;
        let mine = self.candidacy(&call, &election, session_id, &request.value).await?;
        // Shared with the clean-up, which detaches its own copy only if it runs.
        let call = Arc::new(call);
        let cleanup = {
            let (service, call, mine) = (self.clone(), call.clone(), mine.clone());
            Cleanup::new(async move {
                if let Err(status) = service.withdraw(&call.detached(), &mine).await {
                    tracing::debug!(%status, "withdrawing the candidate of an etcd Campaign");
                }
            })
        };
        let revision = self.wait_to_lead(&call, &election, session_id, &mine).await?;
        cleanup.disarm();
        let leader =
            pb::LeaderKey { name: request.name, key: election.key_of(&mine.path), rev: etcd_revision(mine.create_revision), lease: request.lease };
        Ok(Response::new(pb::CampaignResponse { header: self.header(revision), leader: Some(leader) }))
    }

    /// Writes the leader's value while the key leads: it is the first candidate (which it
    /// stays until its node goes), and its node is still the one the key was created as.
    async fn proclaim(&self, request: Request<pb::ProclaimRequest>) -> Result<Response<pb::ProclaimResponse>, Status> {
        let (call, request) = Call::of(request);
        let leader = request.leader.ok_or_else(missing_leader)?;
        let election = Election::of(&leader.name)?;
        let path = election.node_of(&leader.key).ok_or_else(not_leader)?;
        let mine = Candidate { path, create_revision: u64::try_from(leader.rev).map_err(|_| not_leader())? };
        let (first, _) = self.leader_node(&call, &election).await?;
        let leads = first.is_some_and(|first| {
            Candidate::of(&first) == mine && first.stat.is_some_and(|stat| i64::try_from(stat.ephemeral_owner) == Ok(leader.lease))
        });
        if !leads {
            return Err(not_leader());
        }
        let set = w::SetRequest { path: mine.path.clone(), data: request.value, ..w::SetRequest::default() };
        match self.write_if(&call, &mine, w::txn_op::Op::Set(set)).await? {
            (true, revision) => Ok(Response::new(pb::ProclaimResponse { header: self.header(revision) })),
            (false, _) => Err(not_leader()),
        }
    }

    async fn leader(&self, request: Request<pb::LeaderRequest>) -> Result<Response<pb::LeaderResponse>, Status> {
        let (call, request) = Call::of(request);
        let election = Election::of(&request.name)?;
        match self.leader_node(&call, &election).await? {
            (Some(node), revision) => Ok(Response::new(self.leader_answer(&election, node, revision))),
            (None, _) => Err(Status::unknown("election: no leader")),
        }
    }

    type ObserveStream = Pin<Box<dyn Stream<Item = Result<pb::LeaderResponse, Status>> + Send + 'static>>;

    async fn observe(&self, request: Request<pb::LeaderRequest>) -> Result<Response<Self::ObserveStream>, Status> {
        let (call, request) = Call::of(request);
        let election = Election::of(&request.name)?;
        let (answers, stream) = mpsc::channel(OBSERVE_QUEUE_MAX);
        let service = self.clone();
        tokio::spawn(crate::principal::scoped(crate::principal::current(), async move {
            // An observer that hung up ends the watch, even while nothing changes.
            let ended = tokio::select! {
                ended = service.observe_leaders(&call, &election, &answers) => ended,
                () = answers.closed() => Ok(()),
            };
            if let Err(status) = ended {
                let _ = answers.send(Err(status)).await;
            }
        }));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))))
    }

    /// Withdraws the key's candidate if it is still the one the key was created as (leading
    /// or not); a stale key changes nothing, as in etcd.
    async fn resign(&self, request: Request<pb::ResignRequest>) -> Result<Response<pb::ResignResponse>, Status> {
        let (call, request) = Call::of(request);
        let leader = request.leader.ok_or_else(missing_leader)?;
        let election = Election::of(&leader.name)?;
        let revision = match (election.node_of(&leader.key), u64::try_from(leader.rev)) {
            (Some(path), Ok(create_revision)) => self.withdraw(&call, &Candidate { path, create_revision }).await?,
            // No candidate's key: nothing to withdraw.
            _ => 0,
        };
        Ok(Response::new(pb::ResignResponse { header: self.header(revision) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_keys_are_the_name_and_the_candidates_node_name() {
        for (name, path) in [(b"/elect/web".as_slice(), "/elect/web"), (b"web", "/_etcd/web"), (b"/a/", "/_etcd/!2fa!2f")] {
            let election = Election::of(name).expect("an election");
            assert_eq!(election.path, path);
            let node = format!("{path}/{CANDIDATE_PREFIX}0000000007");
            let key = election.key_of(&node);
            assert_eq!(key, [name, b"/candidate-0000000007"].concat());
            assert_eq!(election.node_of(&key), Some(node.clone()), "{key:?}");
            assert!(election.is_candidate(&node));
        }
        let election = Election::of(b"/elect/web").expect("an election");
        assert_eq!(
            election.key_of("/elect/web/candidate-0000000003"),
            b"/elect/web/candidate-0000000003",
            "a plain name's key is the node's own key"
        );
        for other in
            [b"/elect/web/candidate-".as_slice(), b"/elect/web/candidate-12x", b"/elect/webcandidate-1", b"/elect/other/candidate-1", b"/elect/web/x"]
        {
            assert_eq!(election.node_of(other), None, "{other:?}");
        }
        assert!(!election.is_candidate("/elect/web/candidate-1/x") && !election.is_candidate("/elect/web/other"));
    }

    #[test]
    fn the_candidates_range_holds_exactly_the_candidates_names() {
        let range = Election::of(b"/e").expect("an election").candidates(None, 0, true);
        let inside = |path: &str| range.from.as_slice() <= path.as_bytes() && path.as_bytes() < range.to.as_slice();
        assert!(inside("/e/candidate-0000000000") && inside("/e/candidate-9999999999"));
        assert!(!inside("/e/candidate") && !inside("/e/candidates") && !inside("/e/694d71ed8e2a3c04") && !inside("/e/zz"));
    }
}
