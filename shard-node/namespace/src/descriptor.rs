//! What a group serves (its descriptor, set by placement) and the checks made with it: a
//! path outside it is answered WRONG_GROUP with the descriptor, so a router with a stale
//! routing table learns where it stands; a node with a subtree served by another group
//! cannot be deleted (that subtree would be orphaned).

use warden_placement::{is_at_or_below, is_strictly_below};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::{GroupDescriptor, WardenError};

use super::error::error;

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
}
