//! Calls to the groups themselves: namespace queries and commands of a group this node
//! hosts (placement's descriptors, split steps, quota shares, restores), and calls only a
//! group's leader answers, made to its replicas in turn.

use prost::Message as _;
use tonic::transport::Channel;
use tonic::{Response, Status};
use warden_placement::{GroupDescriptor, Placement};
use warden_proto::follow::{CallKind, Follow};
use warden_proto::namespace::command::Op as CommandOp;
use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::query::Query as NamespaceQuery;
use warden_proto::namespace::query_result::Result as NamespaceAnswer;
use warden_proto::namespace::{Command as NamespaceCommand, CommandResult};
use warden_proto::placement::placement_client::PlacementClient;
use warden_proto::placement::SetDescriptorRequest;

use super::wire::{descriptor_proto, internal};
use super::PlacementService;
use crate::service::{engine_status, is_not_hosted, status};
use warden_engine::host::ReadConsistency;

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
        let command = NamespaceCommand { now_ms: warden_engine::wall_clock::now_ms(), principal: String::new(), op: Some(op) };
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
    pub(in crate::placement) async fn set_descriptor_at(
        &self,
        state: &Placement,
        descriptor: &GroupDescriptor,
        revision_floor: u64,
    ) -> Result<u64, Status> {
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
    pub(in crate::placement) async fn at_group_leader<T, F, Fut>(
        &self,
        state: &Placement,
        group: &warden_placement::GroupInfo,
        call: F,
    ) -> Result<T, Status>
    where
        F: Fn(PlacementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        self.at_replicas(state, &group.replicas, call).await
    }

    /// Makes a call only a group's leader answers, trying the group's `replicas` in turn and
    /// following NOT_LEADER hints, until the timeout, by the rule of `warden_proto::follow`.
    /// Every call placement makes this way is idempotent (a descriptor or a split step set
    /// again is the same state; a step whose outcome is unknown is run again by the next
    /// placement leader anyway), so a lost connection is retried too. A node that hosts no
    /// replica of the group (a creation went on without it, and its heartbeat has not made
    /// it yet) is passed over for the next replica.
    async fn at_replicas<T, F, Fut>(&self, state: &Placement, replicas: &[u64], call: F) -> Result<T, Status>
    where
        F: Fn(PlacementClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let mut follow = Follow::new(CallKind::Idempotent, tokio::time::Instant::now() + self.timeout);
        loop {
            let turn = follow.turn();
            let target = turn.hint.filter(|id| replicas.contains(id)).or_else(|| replicas.get(turn.attempt % replicas.len().max(1)).copied());
            let addr = target.and_then(|id| state.node(id)).map(|n| n.addr.clone()).unwrap_or_default();
            match call(PlacementClient::new(self.channel(&addr)?)).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) if is_not_hosted(&status) => follow.retry_anyway(status).await?,
                Err(status) => follow.retry_after(status).await?,
            }
        }
    }

    /// A lazily connected channel to the node at `addr` (`host:port`), from this node's
    /// bounded cache.
    pub(in crate::placement) fn channel(&self, addr: &str) -> Result<Channel, Status> {
        self.channels.get(addr).map_err(|e| internal(format!("address {addr}: {e}")))
    }
}
