//! Leader election (etcd `concurrency.Election`, Curator `LeaderLatch`).
//!
//! Each campaign is an ephemeral-sequential candidate node `path/c-…` holding the
//! candidate's value; candidates are ordered by creation (create revision) and the first is
//! the leader. A candidate that does not lead watches only the candidate just before it, so
//! when the leader goes exactly one candidate (the next) is notified — no herd. When a
//! candidate in the middle goes, only the one behind it is notified, looks again, and
//! watches its new predecessor.
//!
//! The fencing token of a leadership is its candidate's create revision: each new leader's
//! is higher than every earlier leader's, so a resource that remembers the highest token
//! ([`FenceGuard`](crate::FenceGuard)) refuses a deposed leader that has not noticed yet.
//! Leadership ends when the candidate node goes: by [`Leadership::resign`], on drop, or when
//! the session ends (expires or closes). In jeopardy it may already have ended, so
//! [`Leadership::is_valid`] is false.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::session::Session;
use crate::watch::{WatchOptions, Watcher};

use super::{await_existence, delete_if_present, delete_in_background, queue, watch_ended, Owner};

/// Name prefix of candidate nodes.
const CANDIDATE_PREFIX: &str = "c-";
/// Times [`Election::leader`] reads again when the leader it found went before its value
/// could be read.
const LEADER_READS_MAX: usize = 16;

/// An election at one path, for the candidates of one session.
pub struct Election {
    owner: Owner,
    path: String,
    notifications: Arc<AtomicU64>,
}

/// The leader of an election as others see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The value it campaigned with, or proclaimed since.
    pub value: Vec<u8>,
    /// Its fencing token (its candidate node's create revision).
    pub fencing_token: u64,
    /// Its candidate node.
    pub path: String,
}

impl Election {
    /// The election at `path` (its candidates are children of `path`), with `session`'s
    /// candidates.
    pub fn new(session: &Session, path: impl Into<String>) -> Election {
        Election { owner: Owner::of(session), path: path.into(), notifications: Arc::new(AtomicU64::new(0)) }
    }

    /// Enters the election with `value` and waits until this candidate leads. Fails with
    /// [`Error::SessionExpired`] if the session ends first, or if the candidate node vanishes
    /// (deleted by someone else); the candidate node is removed when the campaign fails.
    /// Dropping the future leaves the candidate queued until the session ends: resign by
    /// closing the session, or campaign to completion and [`Leadership::resign`].
    pub async fn campaign(&self, value: Vec<u8>) -> Result<Leadership> {
        let me = self.owner.create_sequential(&self.path, CANDIDATE_PREFIX, value).await?;
        match self.owner.while_alive(self.wait_to_lead(&me.path)).await {
            Ok(()) => Ok(Leadership {
                owner: self.owner.clone(),
                path: me.path,
                token: me.stat.create_revision,
                version: tokio::sync::Mutex::new(me.stat.version),
                resigned: false,
            }),
            Err(error) => {
                if let Err(cleanup) = delete_if_present(&self.owner.client, &me.path).await {
                    tracing::debug!(path = %me.path, error = %cleanup, "removing the candidate of a failed campaign");
                }
                Err(error)
            }
        }
    }

    /// Waits until the candidate `me` is the first, watching only its predecessor.
    async fn wait_to_lead(&self, me: &str) -> Result<()> {
        loop {
            let candidates = queue(&self.owner.client, &self.path, CANDIDATE_PREFIX).await?;
            match candidates.iter().position(|(path, _)| path == me) {
                None => return Err(Error::SessionExpired),
                Some(0) => return Ok(()),
                Some(place) => await_existence(&self.owner.client, &candidates[place - 1].0, false, &self.notifications).await?,
            }
        }
    }

    /// The current leader, `None` when there are no candidates.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        leader(&self.owner.client, &self.path).await
    }

    /// A stream of the leader, reporting each change ([`LeaderObserver::next`]).
    pub async fn observe(&self) -> Result<LeaderObserver> {
        let watcher = self.owner.client.watch(WatchOptions { recursive: true, ..WatchOptions::new(self.path.clone()) }).await?;
        Ok(LeaderObserver { client: self.owner.client.clone(), path: self.path.clone(), watcher, last: None })
    }

    /// Watch events received by this handle's campaigns while they waited (one per
    /// predecessor that went, in the absence of other changes). A diagnostic: it shows that
    /// a leader change wakes one candidate, not all.
    pub fn watch_notifications(&self) -> u64 {
        self.notifications.load(Ordering::Relaxed)
    }
}

/// The first candidate of the election at `path` and its value.
async fn leader(client: &Client, path: &str) -> Result<Option<Leader>> {
    for _ in 0..LEADER_READS_MAX {
        let Some((first, token)) = queue(client, path, CANDIDATE_PREFIX).await?.into_iter().next() else {
            return Ok(None);
        };
        match client.get(&first).await {
            Ok(node) => return Ok(Some(Leader { value: node.data, fencing_token: token, path: first })),
            Err(Error::NoNode { .. }) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(Error::Unavailable { message: format!("the leader of {path} changed {LEADER_READS_MAX} times while being read") })
}

/// Leadership of an election, won by [`Election::campaign`].
pub struct Leadership {
    owner: Owner,
    path: String,
    token: u64,
    /// The candidate node's version as of this leader's last write (proclaims are CAS).
    version: tokio::sync::Mutex<u64>,
    resigned: bool,
}

impl Leadership {
    /// The fencing token to send with every action taken as leader.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The candidate node.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether the leadership can be relied on: false once the session is in jeopardy or has
    /// ended (true again if it comes back [`Safe`](crate::SessionState::Safe)).
    pub fn is_valid(&self) -> bool {
        !self.resigned && self.owner.is_live()
    }

    /// Publishes a new value as leader: a compare-and-swap of the candidate node's data, so it
    /// fails ([`Error::NoNode`]) once the leadership is gone, or ([`Error::BadVersion`]) if
    /// someone else wrote the node.
    pub async fn proclaim(&self, value: Vec<u8>) -> Result<()> {
        let mut version = self.version.lock().await;
        let stat = self.owner.client.set(&self.path, value, Some(*version)).await?;
        *version = stat.version;
        Ok(())
    }

    /// Gives the leadership up: the candidate node is deleted and the next candidate leads.
    pub async fn resign(mut self) -> Result<()> {
        self.resigned = true;
        delete_if_present(&self.owner.client, &self.path).await
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if !self.resigned && !self.owner.states.borrow().has_ended() {
            delete_in_background(&self.owner.client, &self.path);
        }
    }
}

/// The leader of an election as it changes: one watch of the election's subtree; each change
/// there reads the leader again, and [`LeaderObserver::next`] returns when it differs.
pub struct LeaderObserver {
    client: Client,
    path: String,
    watcher: Watcher,
    /// The leader last returned (`None`: nothing returned yet).
    last: Option<Option<Leader>>,
}

impl LeaderObserver {
    /// The leader the first time, then the next different one (a new candidate node, or a
    /// new value proclaimed); `None` when the election has no candidates.
    pub async fn next(&mut self) -> Result<Option<Leader>> {
        loop {
            let current = leader(&self.client, &self.path).await?;
            if self.last.as_ref() != Some(&current) {
                self.last = Some(current.clone());
                return Ok(current);
            }
            self.watcher.next().await?.ok_or_else(|| watch_ended(&self.path))?;
        }
    }
}
