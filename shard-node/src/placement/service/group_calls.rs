//! Calls to the groups themselves: namespace queries and commands of a group this node
//! hosts (placement's descriptors, split steps, quota shares, restores), and calls only a
//! group's leader answers, made to its replicas in turn.

use std::time::Duration;

use prost::Message as _;
use tonic::transport::Channel;
use tonic::{Response, Status};
use warden_placement::{GroupDescriptor, Placement};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::query::Query as NamespaceQuery;
use warden_proto::namespace::query_result::Result as NamespaceAnswer;
use warden_proto::namespace::{Command as NamespaceCommand, CommandResult};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::SetDescriptorRequest;
use warden_proto::tls::Expected;
use warden_proto::v1::warden_error::Code;

use super::wire::{descriptor_proto, internal, now_ms};
use super::PlacementService;
use warden_engine::host::ReadConsistency;
use crate::service::{engine_status, status};

/// Pause between tries of a call only a group's leader answers.
const LEADER_RETRY_PAUSE: Duration = Duration::from_millis(50);

impl PlacementService {
    /// Asks a namespace query of a group this node hosts; its answer, or the typed refusal.
    pub(super) async fn query_namespace(&self, group: u64, query: NamespaceQuery, consistency: ReadConsistency) -> Result<NamespaceAnswer, Status> {
        let query = warden_proto::namespace::Query { query: Some(query) };
        let bytes =
            self.node.read(group, query.encode_to_vec(), consistency, self.timeout).await.map_err(|e| engine_status(&self.directory, group, e))?;
        match warden_proto::namespace::QueryResult::decode(bytes.as_slice()).map_err(internal)?.result {
            Some(NamespaceAnswer::Error(error)) => Err(status(error)),
            Some(answer) => Ok(answer),
            None => Err(internal("a namespace query without an answer")),
        }
    }

    /// Proposes a namespace command of placement's (a descriptor, a split step, a quota share)
    /// to `group`, which this node must lead; answers its outcome once applied (a refusal as
    /// its status).
    pub(super) async fn propose_namespace(&self, group: u64, op: CommandOp) -> Result<CommandOutcome, Status> {
        let command = NamespaceCommand { now_ms: now_ms(), principal: String::new(), op: Some(op) };
        let output = self.node.propose(group, command.encode_to_vec(), self.timeout).await.map_err(|e| engine_status(&self.directory, group, e))?;
        match CommandResult::decode(output.as_slice()).map_err(internal)?.result {
            Some(CommandOutcome::Error(error)) => Err(status(error)),
            Some(outcome) => Ok(outcome),
            None => Err(internal("a namespace command without an outcome")),
        }
    }

    /// As [`Self::propose_namespace`], for a command answered by a transaction: the group's
    /// revision once it applied.
    pub(super) async fn propose_namespace_txn(&self, group: u64, op: CommandOp) -> Result<u64, Status> {
        match self.propose_namespace(group, op).await? {
            CommandOutcome::Txn(txn) => Ok(txn.header.map_or(0, |h| h.revision)),
            other => Err(internal(format!("unexpected outcome of a placement command: {other:?}"))),
        }
    }

    /// Has the leader of `descriptor`'s group apply it (its revision raised to at least
    /// `revision_floor` first). Answers the group's revision once applied.
    pub(in crate::placement) async fn set_descriptor_at(&self, state: &Placement, descriptor: &GroupDescriptor, revision_floor: u64) -> Result<u64, Status> {
        let request = SetDescriptorRequest { descriptor: Some(descriptor_proto(descriptor)), revision_floor };
        let answer = self
            .at_replicas(state, &descriptor.replicas, |mut client| {
                let request = request.clone();
                async move { client.set_descriptor(request).await }
            })
            .await?;
        Ok(answer.revision)
    }

    /// Calls the leader of `group` (see [`Self::at_replicas`]).
    pub(in crate::placement) async fn at_group_leader<T, F, Fut>(&self, state: &Placement, group: &warden_placement::GroupInfo, call: F) -> Result<T, Status>
    where
        F: Fn(PlacementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        self.at_replicas(state, &group.replicas, call).await
    }

    /// Makes a call only a group's leader answers, trying the group's `replicas` in turn and
    /// following NOT_LEADER hints, until the timeout.
    async fn at_replicas<T, F, Fut>(&self, state: &Placement, replicas: &[u64], call: F) -> Result<T, Status>
    where
        F: Fn(PlacementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut target = replicas.first().copied();
        let mut turn = 0usize;
        loop {
            let addr = target.and_then(|id| state.node(id)).map(|n| n.addr.clone()).unwrap_or_default();
            let status = match call(PlacementClient::new(self.channel(&addr)?)).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            let error = crate::service::error_of(&status);
            let retry = error.as_ref().is_none_or(|e| e.code == Code::NotLeader as i32 || e.code == Code::Unavailable as i32);
            if !retry || tokio::time::Instant::now() >= deadline {
                return Err(status);
            }
            turn += 1;
            let hint = error.map(|e| e.leader_id).filter(|id| *id != 0 && replicas.contains(id));
            target = hint.or_else(|| replicas.get(turn % replicas.len().max(1)).copied());
            tokio::time::sleep(LEADER_RETRY_PAUSE).await;
        }
    }

    /// A lazily connected channel to the node at `addr` (`host:port`).
    pub(in crate::placement) fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let endpoint = Channel::from_shared(format!("http://{addr}"))
            .map_err(|e| internal(format!("address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(1));
        Ok(warden_proto::tls::lazy_channel(endpoint, self.tls.as_ref(), Expected::AnyNode))
    }
}
