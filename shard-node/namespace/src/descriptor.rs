//! What a group serves (its descriptor, set by placement) and the checks made with it: a
//! path outside it is answered WRONG_GROUP with the descriptor, so a router with a stale
//! routing table learns where it stands; a node with a subtree served by another group
//! cannot be deleted (that subtree would be orphaned).

use warden_placement::{is_at_or_below, is_strictly_below};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{GroupDescriptor, WardenError};

use warden_proto::namespace::command_result::Result as CommandOutcome;
use warden_proto::namespace::NodeRecord;
use warden_proto::namespace::SetDescriptor;
use warden_proto::v1::{NodeKind, Stat};

use super::apply::{done, Effects};
use super::error::{error, invalid, invalid_path, Failure};
use super::path;
use super::txn::Txn;
use super::watch::hub::{Direction, Transfer};
use super::NamespaceStateMachine;

/// Whether `descriptor` (none: every path) serves `path`.
pub fn serves(descriptor: Option<&GroupDescriptor>, path: &str) -> bool {
    descriptor.is_none_or(|d| is_at_or_below(path, &d.prefix) && !d.excluded.iter().any(|e| is_at_or_below(path, e)))
}

/// Refuses `path` with WRONG_GROUP unless the group serves it.
pub fn check_served(descriptor: Option<&GroupDescriptor>, path: &str) -> Result<(), WardenError> {
    match descriptor {
        Some(d) if !serves(descriptor, path) => Err(WardenError {
            descriptor: Some(Box::new(d.clone())),
            ..error(Code::WrongGroup, path, format!("group {} serves {} (excluding {:?}), not this path", d.group_id, d.prefix, d.excluded))
        }),
        _ => Ok(()),
    }
}

/// Refuses deleting `path` when a subtree below it is served by another group.
pub fn check_deletable(descriptor: Option<&GroupDescriptor>, path: &str) -> Result<(), WardenError> {
    match descriptor.and_then(|d| d.excluded.iter().find(|e| is_strictly_below(e, path))) {
        Some(carved) => Err(error(Code::NotEmpty, path, format!("{carved} below it is served by another group"))),
        None => Ok(()),
    }
}

/// Refuses making `path` a lock or an ephemeral node (`what`) when a subtree below it is
/// served by another group: that subtree's root is its child, and a lock's children are
/// its waiters only, an ephemeral node has none (a merge would bring the child back).
pub fn check_childless_kind(descriptor: Option<&GroupDescriptor>, path: &str, what: &str) -> Result<(), WardenError> {
    match descriptor.and_then(|d| d.excluded.iter().find(|e| is_strictly_below(e, path))) {
        Some(carved) => Err(error(Code::InvalidArgument, path, format!("{path} cannot be {what}: {carved} below it is served by another group"))),
        None => Ok(()),
    }
}

/// Whether `descriptor` retires its group: it excludes its own prefix, so the group serves
/// nothing (placement is removing it and gives the prefix back to the parent path's group).
pub fn is_retiring(descriptor: &GroupDescriptor) -> bool {
    descriptor.excluded.contains(&descriptor.prefix)
}

/// The group's root: its prefix (`/` without a descriptor). It always exists and cannot be
/// deleted or locked.
pub fn root(descriptor: Option<&GroupDescriptor>) -> &str {
    descriptor.map_or("/", |d| d.prefix.as_str())
}

/// Applies a `SetDescriptor`: the group serves the new descriptor from now on (a merge's
/// target also the subtree it ingested). A group that homes sessions is not removed: their
/// ephemerals elsewhere would lose their home (the sessions must close or expire first).
pub(super) fn apply_set(
    sm: &NamespaceStateMachine,
    txn: &mut Txn<'_, '_>,
    set: SetDescriptor,
    effects: &mut Effects,
) -> Result<CommandOutcome, Failure> {
    if set.descriptor.as_ref().is_some_and(is_retiring) && !sm.sessions.is_empty() {
        let prefix = set.descriptor.as_ref().map_or("", |d| d.prefix.as_str());
        let homed = sm.sessions.len();
        return Err(Failure::Refused(error(
            Code::NotEmpty,
            prefix,
            format!("{homed} sessions are homed in this group: only an empty group is removed"),
        )));
    }
    let descriptor = txn.set_descriptor(sm.group, sm.descriptor.as_ref(), set.descriptor)?;
    // A subtree served from now on has its events before this revision in the group that
    // served it, which handed it over by the floor (placement passes the hand-over's
    // revision): the one ingested names that group; one given back by a removed group
    // (empty, with no ingest) does not.
    let settled = txn.settle_incoming(&descriptor)?;
    let settled = settled.map(|(state, prefix, source)| {
        effects.split = Some(state);
        (prefix, source)
    });
    let mut prefixes = newly_served(sm.descriptor.as_ref(), &descriptor);
    if let Some((prefix, _)) = settled.as_ref().filter(|(prefix, _)| !prefixes.contains(prefix)) {
        prefixes.push(prefix.clone());
    }
    for prefix in prefixes {
        let from_group = settled.as_ref().filter(|(settled, _)| *settled == prefix).map_or(0, |(_, source)| *source);
        let direction = Direction::In { from_group, handed_at: set.revision_floor };
        effects.moved.push(Transfer { prefix, revision: txn.revision, direction });
    }
    effects.descriptor = Some(descriptor);
    Ok(done())
}

/// The prefixes `new` serves that `old` excluded (a merged or removed group's prefix given
/// back), and `new`'s own prefix when `old` did not serve it (a split's new group).
fn newly_served(old: Option<&GroupDescriptor>, new: &GroupDescriptor) -> Vec<String> {
    let Some(old) = old else { return Vec::new() };
    let mut prefixes: Vec<String> = old.excluded.iter().filter(|e| serves(Some(new), e)).cloned().collect();
    if !serves(Some(old), &new.prefix) && serves(Some(new), &new.prefix) && !prefixes.contains(&new.prefix) {
        prefixes.push(new.prefix.clone());
    }
    prefixes
}

impl Txn<'_, '_> {
    /// Makes the group serve `new` (see `namespace.proto`, `SetDescriptor`): refused when it
    /// is older than `current`, changes the prefix, or gives away a path where this group
    /// holds a node. A prefix node missing here is created: it is the group's root.
    pub fn set_descriptor(
        &mut self,
        group: u64,
        current: Option<&GroupDescriptor>,
        new: Option<GroupDescriptor>,
    ) -> Result<GroupDescriptor, Failure> {
        let new = new.ok_or_else(|| invalid("", "set_descriptor without a descriptor"))?;
        if new.group_id != group {
            return Err(invalid(&new.prefix, format!("a descriptor of group {} sent to group {group}", new.group_id)).into());
        }
        path::validate(&new.prefix, true).map_err(|e| invalid_path(&new.prefix, &e))?;
        if let Some(current) = current {
            if new.conf_ver < current.conf_ver || new.version < current.version {
                return Err(invalid(&new.prefix, "the descriptor is older than the group's").into());
            }
            if new.prefix != current.prefix {
                return Err(invalid(&new.prefix, format!("the group's prefix is {}; it never changes", current.prefix)).into());
            }
            // One epoch names one set of served paths: the same epoch with other contents
            // comes from a placement decision made on a stale state, and accepting it would let
            // two groups serve the same paths. So serving a path again that
            // the group gave away (an exclusion dropped) always takes a newer version.
            if (new.conf_ver, new.version) == (current.conf_ver, current.version) && new != *current {
                return Err(invalid(&new.prefix, "the group already has this descriptor version with other contents").into());
            }
        }
        if is_retiring(&new) {
            return self.retire(new);
        }
        for excluded in &new.excluded {
            path::validate(excluded, true).map_err(|e| invalid_path(excluded, &e))?;
            if !warden_placement::is_strictly_below(excluded, &new.prefix) {
                return Err(invalid(excluded, "an excluded prefix must be below the group's prefix").into());
            }
            // A subtree handed over is excluded at once, while its records are still purged.
            if self.node(excluded)?.is_some() && !super::split::is_purging(&self.view.split()?, excluded) {
                return Err(
                    error(Code::NotEmpty, excluded, "this group holds nodes there (moving a subtree to another group is not supported)").into()
                );
            }
        }
        if self.node(&new.prefix)?.is_none() {
            let stat = Stat {
                create_revision: self.revision,
                mod_revision: self.revision,
                ctime_ms: self.now_ms,
                mtime_ms: self.now_ms,
                kind: NodeKind::Persistent as i32,
                ..Stat::default()
            };
            self.view.put_node(&new.prefix, &NodeRecord { stat: Some(stat), ..NodeRecord::default() });
        }
        self.view.put_descriptor(&new);
        Ok(new)
    }

    /// Takes a retiring descriptor (see [`is_retiring`]): the group stops serving anything,
    /// so placement can give its prefix back to the parent's group and remove it. Refused
    /// for the root group and while the prefix node has children (the caller refuses while
    /// the group homes sessions).
    fn retire(&mut self, new: GroupDescriptor) -> Result<GroupDescriptor, Failure> {
        if new.prefix == "/" || new.excluded.len() != 1 {
            return Err(invalid(&new.prefix, "only a group below the root retires, and its one exclusion is its prefix").into());
        }
        let children = self.node(&new.prefix)?.and_then(|node| node.stat).map_or(0, |stat| stat.num_children);
        // A merge's hand-over retires the group at once; the subtree's records go in pages.
        if children > 0 && !super::split::is_purging(&self.view.split()?, &new.prefix) {
            return Err(error(Code::NotEmpty, &new.prefix, format!("{} has {children} children: only an empty group is removed", new.prefix)).into());
        }
        self.view.put_descriptor(&new);
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(prefix: &str, excluded: &[&str]) -> GroupDescriptor {
        GroupDescriptor {
            group_id: 1,
            prefix: prefix.into(),
            excluded: excluded.iter().map(|e| e.to_string()).collect(),
            ..GroupDescriptor::default()
        }
    }

    #[test]
    fn paths_are_served_by_prefix_minus_carve_outs() {
        let top = descriptor("/", &["/a"]);
        assert!(serves(Some(&top), "/b") && serves(Some(&top), "/ab") && serves(Some(&top), "/"));
        assert!(!serves(Some(&top), "/a") && !serves(Some(&top), "/a/x"));
        let a = descriptor("/a", &[]);
        assert!(serves(Some(&a), "/a/x") && !serves(Some(&a), "/b"));
        assert!(serves(None, "/anything"));
        let refused = check_served(Some(&top), "/a/x").expect_err("refused");
        assert_eq!((refused.code, refused.descriptor.map(|d| d.prefix)), (Code::WrongGroup as i32, Some("/".into())));
        assert!(check_deletable(Some(&descriptor("/", &["/t/p"])), "/t").is_err());
        assert!(check_deletable(Some(&descriptor("/", &["/t/p"])), "/u").is_ok());
        assert!(check_childless_kind(Some(&descriptor("/", &["/t/p"])), "/t", "a lock").is_err());
        assert!(check_childless_kind(Some(&descriptor("/", &["/t/p"])), "/t/p/x", "a lock").is_ok());
        assert_eq!(root(Some(&a)), "/a");
        assert_eq!(root(None), "/");
    }

    /// What a group starts serving with a new descriptor (its watches from before need the
    /// events of the group that served it): a prefix given back, or its own prefix when it
    /// served nothing; never one given away or kept.
    #[test]
    fn a_prefix_given_back_or_first_served_is_newly_served() {
        assert_eq!(newly_served(Some(&descriptor("/", &["/a", "/b"])), &descriptor("/", &["/b"])), vec!["/a".to_string()]);
        assert!(newly_served(Some(&descriptor("/", &["/a"])), &descriptor("/", &["/a", "/c"])).is_empty());
        assert_eq!(newly_served(Some(&descriptor("/a", &["/a"])), &descriptor("/a", &[])), vec!["/a".to_string()]);
        assert!(newly_served(None, &descriptor("/a", &[])).is_empty(), "no descriptor served every path");
    }
}
