//! Group membership (Curator `GroupMember`): each member is an ephemeral node
//! `path/{member_id}` holding the member's data, so a member that crashes leaves the group
//! when its session expires, and one that leaves cleanly leaves at once.

use std::collections::BTreeMap;

use crate::children::ChildrenOptions;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::node::{CreateOptions, Node};
use crate::session::Session;
use crate::watch::{EventKind, WatchOptions, Watcher};

use super::{delete_if_present, delete_in_background, ensure_node, join, parent_of, watch_ended, Owner};

/// One member of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its id (its node's name).
    pub id: String,
    /// The data it joined with (or set since).
    pub data: Vec<u8>,
}

/// This session's membership of a group. It ends with [`Membership::leave`], on drop (in the
/// background), or when the session ends; in jeopardy it may already have ended
/// ([`Membership::is_valid`]).
pub struct Membership {
    owner: Owner,
    group: String,
    node: String,
    left: bool,
}

impl Membership {
    /// Joins the group at `path` as `member_id` with `data` (the group node is created if
    /// missing). Fails with [`Error::NodeExists`] if a live member already has that id.
    pub async fn join(session: &Session, path: impl Into<String>, member_id: &str, data: Vec<u8>) -> Result<Membership> {
        let owner = Owner::of(session);
        let group = path.into();
        let node = join(&group, member_id);
        owner.client.create(&node, data, &CreateOptions::ephemeral(owner.id).create_parents()).await?;
        Ok(Membership { owner, group, node, left: false })
    }

    /// This member's node.
    pub fn path(&self) -> &str {
        &self.node
    }

    /// Whether the membership can be relied on (the session is alive and it did not leave).
    pub fn is_valid(&self) -> bool {
        !self.left && self.owner.is_live()
    }

    /// The group's members now.
    pub async fn members(&self) -> Result<Vec<Member>> {
        let (members, _) = read(&self.owner.client, &self.group).await?;
        Ok(listed(&members))
    }

    /// A live view of the group's members.
    pub async fn watch(&self) -> Result<MembersWatch> {
        MembersWatch::open(&self.owner.client, &self.group).await
    }

    /// Leaves the group now.
    pub async fn leave(mut self) -> Result<()> {
        self.left = true;
        delete_if_present(&self.owner.client, &self.node).await
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        if !self.left && !self.owner.states.borrow().has_ended() {
            delete_in_background(&self.owner.client, &self.node);
        }
    }
}

/// The members of a group, kept current by a watch: read at a revision, then updated by
/// every event after it, in order, so the view is never older than the events received.
/// Anyone may open one ([`MembersWatch::open`]); members need no session for it.
pub struct MembersWatch {
    group: String,
    /// By id: the member's node as last read or reported.
    members: BTreeMap<String, Node>,
    watcher: Watcher,
}

impl MembersWatch {
    /// Reads the members of the group at `path` (at most one page of the server's listing,
    /// 10,000 members) and watches it from the revision after the read. Creates the group
    /// node if it is missing (the read needs its revision).
    pub async fn open(client: &Client, path: &str) -> Result<MembersWatch> {
        ensure_node(client, path).await?;
        let (members, revision) = read(client, path).await?;
        let watcher = client.watch(WatchOptions { recursive: true, start_revision: revision.saturating_add(1), ..WatchOptions::new(path) }).await?;
        Ok(MembersWatch { group: path.to_string(), members, watcher })
    }

    /// The members as of the last change received.
    pub fn members(&self) -> Vec<Member> {
        listed(&self.members)
    }

    /// Waits for the next change of the member list (a join, a leave, a member's new data)
    /// and returns the list after it.
    pub async fn next(&mut self) -> Result<Vec<Member>> {
        loop {
            let event = self.watcher.next().await?.ok_or_else(|| watch_ended(&self.group))?;
            if parent_of(&event.node.path) != self.group || event.node.path == self.group {
                continue;
            }
            let id = warden_paths::name(&event.node.path).to_string();
            // A member read after the event (its stat is newer) already shows it.
            let newer = self.members.get(&id).is_none_or(|known| event.revision > known.stat.mod_revision);
            let changed = match event.kind {
                EventKind::Created if newer => {
                    self.members.insert(id, event.node);
                    true
                }
                EventKind::Changed if newer && self.members.contains_key(&id) => self.members.insert(id, event.node).is_some(),
                EventKind::Deleted if newer => self.members.remove(&id).is_some(),
                _ => false,
            };
            if changed {
                return Ok(self.members());
            }
        }
    }
}

/// The members of the group at `path` (at most one page of the server's listing, 10,000
/// members) by id, and the revision of the listing (0: the group does not exist). A
/// member that left between the listing and the read of its data is left out (a watch from
/// the revision after the listing reports its leaving).
async fn read(client: &Client, path: &str) -> Result<(BTreeMap<String, Node>, u64)> {
    let (names, revision) = match client.children(path, ChildrenOptions::default()).next_page().await {
        Ok(Some(page)) => (page.children.into_iter().map(|child| child.name).collect(), page.revision),
        Ok(None) | Err(Error::NoNode { .. }) => (Vec::new(), 0),
        Err(error) => return Err(error),
    };
    let mut members = BTreeMap::new();
    for name in names {
        match client.get(&join(path, &name)).await {
            Ok(node) => {
                members.insert(name, node);
            }
            Err(Error::NoNode { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok((members, revision))
}

fn listed(members: &BTreeMap<String, Node>) -> Vec<Member> {
    members.iter().map(|(id, node)| Member { id: id.clone(), data: node.data.clone() }).collect()
}
