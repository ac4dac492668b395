//! A minimal test client of the public API: talks to every node of an in-process cluster,
//! follows NOT_LEADER hints, and retries only what is safe to retry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;
use warden_namespace::NamespaceFactory;
use warden_proto::follow::{CallKind, Fault, Follow};
use warden_proto::v1::warden_client::WardenClient;
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;
use warden_shard_node::cluster::{Cluster, ClusterConfig};
use warden_shard_node::service::error_of;

/// A 5-node cluster serving the namespace API with group 1 on all nodes.
pub async fn namespace_cluster(config: ClusterConfig) -> Arc<Cluster> {
    namespace_cluster_with(config, NamespaceFactory::default()).await
}

/// The same with the namespace's limits (and watch limits) of `factory`.
pub async fn namespace_cluster_with(config: ClusterConfig, factory: NamespaceFactory) -> Arc<Cluster> {
    let config = ClusterConfig { serve_api: true, ..config };
    let cluster = Arc::new(Cluster::start(config, Arc::new(factory)).expect("cluster starts"));
    let voters: Vec<u64> = cluster.node_ids();
    cluster.create_group(1, &voters).await.expect("group");
    cluster.wait_leader(1, Duration::from_secs(30)).await.expect("leader");
    cluster
}

/// The outcome of one API call.
#[derive(Debug)]
pub enum CallError {
    /// A typed refusal: nothing changed.
    Refused(WardenError),
    /// The outcome is unknown (deadline, connection lost after sending a write); the text
    /// says why.
    Unknown(#[allow(dead_code)] String),
}

impl CallError {
    /// The error code of a refusal.
    pub fn code(&self) -> Option<Code> {
        match self {
            CallError::Refused(error) => Code::try_from(error.code).ok(),
            CallError::Unknown(_) => None,
        }
    }
}

/// A client over every node of a cluster.
#[derive(Clone)]
pub struct ApiClient {
    clients: BTreeMap<u64, WardenClient<Channel>>,
    preferred: Arc<std::sync::Mutex<u64>>,
}

impl ApiClient {
    /// Connects (lazily) to every node of `cluster`.
    pub fn new(cluster: &Cluster) -> ApiClient {
        let mut clients = BTreeMap::new();
        for id in cluster.node_ids() {
            let addr = cluster.addr(id).expect("addr");
            let channel = Channel::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect_timeout(Duration::from_millis(300))
                .timeout(Duration::from_secs(3))
                .connect_lazy();
            clients.insert(id, WardenClient::new(channel));
        }
        ApiClient { clients, preferred: Arc::new(std::sync::Mutex::new(1)) }
    }

    /// A client of one node only.
    pub fn node(&self, id: u64) -> WardenClient<Channel> {
        self.clients[&id].clone()
    }

    /// Runs `call` against the believed leader until it succeeds, is refused, or its
    /// outcome becomes unknown, retried by the rule of `warden_proto::follow` (NOT_LEADER's
    /// hint followed); `idempotent` calls (reads) are also retried on unknown outcomes. Gives
    /// up after `timeout` (as unknown).
    pub async fn call<T, F, Fut>(&self, timeout: Duration, idempotent: bool, call: F) -> Result<T, CallError>
    where
        F: Fn(WardenClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let kind = CallKind::of(idempotent);
        let mut follow = Follow::new(kind, tokio::time::Instant::now() + timeout);
        loop {
            let node = *self.preferred.lock().expect("lock");
            let status = match call(self.clients[&node].clone()).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) => status,
            };
            let fault = Fault::of(&status);
            if let Err(status) = follow.retry_after(status).await {
                return Err(match error_of(&status) {
                    // Retried until the deadline, or an outcome left unknown.
                    _ if fault.retried(kind) => CallError::Unknown("deadline".into()),
                    Some(error) if error.code == Code::OutcomeUnknown as i32 => CallError::Unknown(error.message),
                    Some(error) => CallError::Refused(error),
                    // No Warden detail: the connection failed after a write was sent (a reset
                    // may follow an applied write).
                    None => CallError::Unknown(status.to_string()),
                });
            }
            // The hinted leader, else the next node.
            let turn = follow.turn();
            let ids: Vec<u64> = self.clients.keys().copied().collect();
            let next = turn.hint.filter(|id| *id != node && self.clients.contains_key(id)).unwrap_or(ids[turn.attempt % ids.len()]);
            *self.preferred.lock().expect("lock") = next;
        }
    }
}
