//! A counting semaphore (Curator `InterProcessSemaphoreV2`): at most `permits` sessions
//! hold a permit of one path at a time.
//!
//! Design (chosen over "the first N of a queue hold", whose waiters must each watch the
//! node N places ahead and can miss a free permit when nodes between them leave):
//!
//! - `path/lock` is a server lock that serialises acquirers: it queues them FIFO and wakes
//!   only the next one — waiters do not herd;
//! - `path/leases/lease-…` are the permits: ephemeral-sequential nodes of their holders;
//! - the one acquirer holding `path/lock` counts the leases; while there are `permits` or
//!   more it waits for a deletion below `path/leases` (it alone watches them); then it
//!   creates its lease in a transaction that requires its lock waiter node to still exist,
//!   so an acquirer whose lock was lost (its session expired while it paused) cannot add a
//!   lease beside the next acquirer's;
//! - it then releases `path/lock`.
//!
//! So the number of leases never exceeds `permits`, and a release wakes one process.

use crate::error::{Error, Result};
use crate::lock::LockGuard;
use crate::node::CreateOptions;
use crate::session::Session;
use crate::txn::{Compare, Txn, TxnOp, TxnOpResult};

use super::{children, delete_if_present, delete_in_background, deletions, ensure_node, join, watch_ended, Owner};

/// Name prefix of lease nodes.
const LEASE_PREFIX: &str = "lease-";

/// A semaphore of `permits` permits at `path`, acquired by one session.
pub struct Semaphore<'s> {
    session: &'s Session,
    path: String,
    permits: usize,
}

impl<'s> Semaphore<'s> {
    /// The semaphore at `path` with `permits` permits. Every user of one path must give the
    /// same number.
    pub fn new(session: &'s Session, path: impl Into<String>, permits: usize) -> Semaphore<'s> {
        Semaphore { session, path: path.into(), permits }
    }

    /// Waits for a permit (as long as the session lives). Fails with
    /// [`Error::InvalidArgument`] for a semaphore of no permits.
    pub async fn acquire(&self) -> Result<Permit> {
        if self.permits == 0 {
            return Err(Error::InvalidArgument { message: format!("the semaphore {} has no permits", self.path) });
        }
        let owner = Owner::of(self.session);
        let leases = join(&self.path, "leases");
        ensure_node(&owner.client, &leases).await?;
        let turn = self.session.lock(&join(&self.path, "lock")).await?;
        let permit = owner.while_alive(self.take_lease(&owner, &leases, &turn)).await;
        if let Err(error) = turn.unlock().await {
            tracing::debug!(path = %self.path, %error, "releasing a semaphore's turn");
        }
        permit
    }

    /// With the turn held: waits until fewer than `permits` leases exist, then creates one.
    async fn take_lease(&self, owner: &Owner, leases: &str, turn: &LockGuard) -> Result<Permit> {
        let client = &owner.client;
        // Registered before counting: no release after the count is missed.
        let mut released = client.watch(deletions(leases, true)).await?;
        loop {
            let held = children(client, leases).await?.iter().filter(|child| child.name.starts_with(LEASE_PREFIX)).count();
            if held < self.permits {
                break;
            }
            released.next().await?.ok_or_else(|| watch_ended(leases))?;
        }
        let txn = Txn::new().when(Compare::exists(turn.sequencer().waiter.clone(), true)).then(TxnOp::create(
            join(leases, LEASE_PREFIX),
            Vec::new(),
            CreateOptions::ephemeral(owner.id).sequential(),
        ));
        let result = client.txn(&txn).await?;
        match result.results.into_iter().next() {
            Some(TxnOpResult::Created(lease)) if result.succeeded => {
                Ok(Permit { owner: owner.clone(), path: lease.path, token: lease.stat.create_revision, released: false })
            }
            _ if !result.succeeded => Err(Error::SessionExpired),
            other => Err(Error::Protocol { message: format!("a lease creation returned {other:?}") }),
        }
    }
}

/// A permit of a [`Semaphore`]: an ephemeral lease node. Released by [`Permit::release`], on
/// drop (in the background, best effort), or when the session ends; while the session is in
/// jeopardy it may already be gone ([`Permit::is_valid`] is false).
pub struct Permit {
    owner: Owner,
    path: String,
    token: u64,
    released: bool,
}

impl Permit {
    /// The lease's create revision: grows with every permit granted at this semaphore.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The lease node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the permit can be relied on (the session is alive and it was not released).
    pub fn is_valid(&self) -> bool {
        !self.released && self.owner.is_live()
    }

    /// Gives the permit back.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        delete_if_present(&self.owner.client, &self.path).await
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.released && !self.owner.states.borrow().has_ended() {
            delete_in_background(&self.owner.client, &self.path);
        }
    }
}
