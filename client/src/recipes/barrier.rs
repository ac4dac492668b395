//! Barriers (Curator `DistributedBarrier` and `DistributedDoubleBarrier`).

use std::sync::atomic::AtomicU64;

use crate::client::Client;
use crate::error::Result;
use crate::session::Session;

use super::{await_existence, delete_if_present, deletions, ensure_node, join, queue, watch_ended, Owner};

/// A barrier that holds processes back while its node exists: [`Barrier::set`] raises it,
/// [`Barrier::remove`] lowers it, [`Barrier::wait`] returns once it is down. The node is
/// persistent: a barrier outlives the session of whoever set it.
pub struct Barrier {
    client: Client,
    path: String,
}

impl Barrier {
    /// The barrier at `path`.
    pub fn new(client: &Client, path: impl Into<String>) -> Barrier {
        Barrier { client: client.clone(), path: path.into() }
    }

    /// Raises the barrier (creates its node; already raised is fine).
    pub async fn set(&self) -> Result<()> {
        ensure_node(&self.client, &self.path).await
    }

    /// Lowers the barrier: every waiter proceeds.
    pub async fn remove(&self) -> Result<()> {
        delete_if_present(&self.client, &self.path).await
    }

    /// Waits until the barrier is down (returns at once if it is not raised). Every waiter
    /// watches the one barrier node: lowering it wakes them all, which is the point.
    pub async fn wait(&self) -> Result<()> {
        await_existence(&self.client, &self.path, false, &AtomicU64::new(0)).await
    }
}

/// Name prefix of participant nodes.
const PARTICIPANT_PREFIX: &str = "p-";

/// A double barrier: `participants` processes [`enter`](DoubleBarrier::enter) (each waits
/// until all have entered), compute, then [`leave`](DoubleBarrier::leave) (each waits
/// until all have left).
///
/// Participants are ephemeral nodes `path/p-…` of their sessions; the last to enter creates
/// `path/ready`, which everyone entering waits for; the last to leave deletes it. A
/// participant whose session ends leaves (its node goes): the others' `leave` then does not
/// wait for it, but an `enter` still short of participants waits for a replacement. One
/// round at a time per path: start the next round once everyone has left.
pub struct DoubleBarrier {
    owner: Owner,
    path: String,
    participants: usize,
    /// This participant's node, while entered.
    node: tokio::sync::Mutex<Option<String>>,
}

impl DoubleBarrier {
    /// The double barrier at `path` for `participants` processes; `session` holds this
    /// process's place.
    pub fn new(session: &Session, path: impl Into<String>, participants: usize) -> DoubleBarrier {
        DoubleBarrier { owner: Owner::of(session), path: path.into(), participants, node: tokio::sync::Mutex::new(None) }
    }

    fn ready(&self) -> String {
        join(&self.path, "ready")
    }

    /// Enters, and waits until `participants` processes have entered (or the session ends:
    /// [`Error::SessionExpired`](crate::Error::SessionExpired)).
    pub async fn enter(&self) -> Result<()> {
        let mut node = self.node.lock().await;
        if node.is_none() {
            *node = Some(self.owner.create_sequential(&self.path, PARTICIPANT_PREFIX, Vec::new()).await?.path);
        }
        let client = &self.owner.client;
        if queue(client, &self.path, PARTICIPANT_PREFIX).await?.len() >= self.participants {
            return ensure_node(client, &self.ready()).await;
        }
        self.owner.while_alive(await_existence(client, &self.ready(), true, &AtomicU64::new(0))).await
    }

    /// Leaves, and waits until every participant has left. Each departure makes every
    /// waiting participant count again (O(participants²) reads in all: for small groups).
    pub async fn leave(&self) -> Result<()> {
        let client = &self.owner.client;
        if let Some(node) = self.node.lock().await.take() {
            delete_if_present(client, &node).await?;
        }
        let mut departures = client.watch(deletions(&self.path, true)).await?;
        while !queue(client, &self.path, PARTICIPANT_PREFIX).await?.is_empty() {
            departures.next().await?.ok_or_else(|| watch_ended(&self.path))?;
        }
        delete_if_present(client, &self.ready()).await
    }
}
