//! The access control list: which principal may do what at or below which prefix.
//! Kept in the placement state (replicated, versioned), shipped to routers with the routing
//! table and to nodes with their heartbeat answers, and judged by [`Acl::allows`] wherever a
//! call is checked. Only grants exist (no denials), and a grant on a prefix holds for every
//! path below it: whoever may read a parent may read all of its subtree, so no listing,
//! watch or error of that subtree can reveal something the caller may not read.
//!
//! A grant names a principal (a client certificate's name, a token's name) or a group of
//! principals (`group:NAME`). [`ROOT_PRINCIPAL`] is the bootstrap administrator: it may do
//! everything everywhere, whatever the list says.
//!
//! Architecture invariant: this module knows nothing of certificates, tokens or RPCs; it
//! answers "may principal P do X at path Q" from the replicated list alone.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::paths::{parent, validate_path};

/// Get, Exists, GetChildren, LockInfo, CheckSequencer, a transaction's compares and reads.
pub const READ: u32 = 1;
/// Create, Set, Delete, a transaction's writes.
pub const WRITE: u32 = 2;
/// Sessions, ephemeral nodes, Lock and Unlock.
pub const LOCK: u32 = 4;
/// Watch.
pub const WATCH: u32 = 8;
/// Everything above, and changing the grants at or below the prefix.
pub const ADMIN: u32 = 16;
/// Every permission bit.
pub const ALL: u32 = READ | WRITE | LOCK | WATCH | ADMIN;

/// The bootstrap administrator: allowed everything everywhere.
pub const ROOT_PRINCIPAL: &str = "root";
/// How a grant names a group of principals: `group:NAME`.
pub const GROUP_MARK: &str = "group:";
/// Grants kept at most (a change past it is refused), by this binary's default: a cluster
/// applies the maxima recorded at its bootstrap ([`AclMaxima`]).
pub const GRANTS_MAX: usize = 10_000;
/// Groups of principals kept at most (this binary's default).
pub const GROUPS_MAX: usize = 1_000;
/// Members of one group at most (this binary's default).
pub const MEMBERS_MAX: usize = 10_000;

/// How much an ACL may hold: the cluster's recorded maxima.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AclMaxima {
    /// Grants.
    pub grants: usize,
    /// Groups of principals.
    pub groups: usize,
    /// Members of one group.
    pub members: usize,
}

impl AclMaxima {
    /// This binary's defaults.
    pub const DEFAULT: AclMaxima = AclMaxima { grants: GRANTS_MAX, groups: GROUPS_MAX, members: MEMBERS_MAX };
}
/// Longest principal or group name, in bytes.
pub const PRINCIPAL_BYTES_MAX: usize = 128;

/// Why an ACL change is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AclError {
    /// The name is empty, too long, or has characters other than letters, digits and `-_.@:`.
    #[error("invalid principal {0:?}: 1 to 128 bytes of letters, digits and -_.@:")]
    InvalidPrincipal(String),
    /// The prefix is not a valid path.
    #[error("invalid prefix {0:?}")]
    InvalidPrefix(String),
    /// No permission bit, or an unknown one.
    #[error("invalid permissions {0:#x}: a non-empty set of read, write, lock, watch, admin")]
    InvalidPermissions(u32),
    /// A limit of the list was reached.
    #[error("the ACL holds at most {limit} {what}")]
    Full {
        /// What is counted.
        what: String,
        /// Its limit.
        limit: usize,
    },
}

/// The access control list: grants by prefix, and groups of principals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    /// Grows with every change.
    version: u64,
    /// Prefix → principal (or `group:NAME`) → permission bits.
    grants: BTreeMap<String, BTreeMap<String, u32>>,
    /// Group name → its members.
    groups: BTreeMap<String, BTreeSet<String>>,
}

/// One grant, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Where it holds (and below).
    pub prefix: String,
    /// Whom it is for: a principal or `group:NAME`.
    pub principal: String,
    /// Permission bits.
    pub permissions: u32,
}

impl Acl {
    /// The list's version (0: never changed).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A list with these contents, at `version` (what a router or node received).
    pub fn from_parts(version: u64, grants: impl IntoIterator<Item = Grant>, groups: impl IntoIterator<Item = (String, Vec<String>)>) -> Acl {
        let mut acl = Acl { version, ..Acl::default() };
        for grant in grants {
            *acl.grants.entry(grant.prefix).or_default().entry(grant.principal).or_default() |= grant.permissions & ALL;
        }
        for (name, members) in groups {
            acl.groups.entry(name).or_default().extend(members);
        }
        acl
    }

    /// Every grant, by prefix then principal.
    pub fn grants(&self) -> impl Iterator<Item = Grant> + '_ {
        self.grants.iter().flat_map(|(prefix, by_principal)| {
            by_principal.iter().map(|(principal, bits)| Grant { prefix: prefix.clone(), principal: principal.clone(), permissions: *bits })
        })
    }

    /// Every group with its members.
    pub fn groups(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>)> + '_ {
        self.groups.iter().map(|(name, members)| (name.as_str(), members))
    }

    /// Whether `principal` holds every bit of `permission` at `path` (through a grant on
    /// `path` or an ancestor, to it or to a group it is in; `ADMIN` holds every permission).
    /// Looks up `path` and each ancestor (at most `PATH_DEPTH_MAX` + 1 lookups), and at each
    /// the principal's own grant and the group grants there: the cost does not grow with the
    /// number of grants elsewhere (benches/access.rs).
    pub fn allows(&self, principal: &str, path: &str, permission: u32) -> bool {
        if principal == ROOT_PRINCIPAL {
            return true;
        }
        if principal.is_empty() {
            return false;
        }
        let mut held = 0;
        let mut at = Some(path);
        while let Some(prefix) = at {
            if let Some(by_principal) = self.grants.get(prefix) {
                held |= by_principal.get(principal).copied().unwrap_or(0);
                // Grants to groups sort together (`group:` first): only those are scanned.
                let groups = by_principal.range::<str, _>((std::ops::Bound::Included(GROUP_MARK), std::ops::Bound::Unbounded));
                for (who, bits) in groups.take_while(|(who, _)| who.starts_with(GROUP_MARK)) {
                    if self.names(who, principal) {
                        held |= bits;
                    }
                }
            }
            at = parent(prefix);
        }
        debug_assert!(held & !ALL == 0, "only known permission bits are granted");
        held & ADMIN != 0 || held & permission == permission
    }

    /// Whether `principal` holds every bit of `permission` somewhere (a session, which has
    /// no path, needs `LOCK` somewhere).
    pub fn allows_somewhere(&self, principal: &str, permission: u32) -> bool {
        principal == ROOT_PRINCIPAL
            || self
                .grants
                .values()
                .flat_map(|by_principal| by_principal.iter())
                .any(|(who, bits)| self.names(who, principal) && (bits & ADMIN != 0 || bits & permission == permission))
    }

    /// Where a session `principal` opens without a path hint counts for session quotas: the
    /// deepest prefix at or above every prefix where it holds `lock` (or `admin`), `/` for
    /// [`ROOT_PRINCIPAL`] and for a principal holding none. A principal whose grants lie in
    /// one tenant's subtree so counts there, hint or not; one with grants in several subtrees
    /// counts at their common ancestor (`/` at worst), never nowhere.
    pub fn lock_scope(&self, principal: &str) -> String {
        if principal == ROOT_PRINCIPAL {
            return "/".to_string();
        }
        let mut scope: Option<&str> = None;
        for (prefix, by_principal) in &self.grants {
            let holds = by_principal.iter().any(|(who, bits)| self.names(who, principal) && bits & (LOCK | ADMIN) != 0);
            if holds {
                scope = Some(match scope {
                    None => prefix.as_str(),
                    Some(scope) => common_ancestor(scope, prefix),
                });
            }
        }
        scope.unwrap_or("/").to_string()
    }

    /// Whether the grantee `who` (a principal or `group:NAME`) covers `principal`.
    fn names(&self, who: &str, principal: &str) -> bool {
        match who.strip_prefix(GROUP_MARK) {
            Some(group) => self.groups.get(group).is_some_and(|members| members.contains(principal)),
            None => who == principal,
        }
    }

    /// Adds (`revoke` false) or removes `permissions` of `principal` at `prefix`; returns
    /// the new version. A revoke of what is not granted changes nothing but the version.
    pub fn change(&mut self, prefix: &str, principal: &str, permissions: u32, revoke: bool, maxima: &AclMaxima) -> Result<u64, AclError> {
        validate_path(prefix).map_err(|_| AclError::InvalidPrefix(prefix.to_string()))?;
        validate_grantee(principal)?;
        if permissions == 0 || permissions & !ALL != 0 {
            return Err(AclError::InvalidPermissions(permissions));
        }
        if revoke {
            if let Some(by_principal) = self.grants.get_mut(prefix) {
                if let Some(bits) = by_principal.get_mut(principal) {
                    *bits &= !permissions;
                    if *bits == 0 {
                        by_principal.remove(principal);
                    }
                }
                if by_principal.is_empty() {
                    self.grants.remove(prefix);
                }
            }
        } else {
            let exists = self.grants.get(prefix).is_some_and(|by_principal| by_principal.contains_key(principal));
            if !exists && self.grants.values().map(BTreeMap::len).sum::<usize>() >= maxima.grants {
                return Err(AclError::Full { what: "grants".into(), limit: maxima.grants });
            }
            *self.grants.entry(prefix.to_string()).or_default().entry(principal.to_string()).or_default() |= permissions;
        }
        self.version += 1;
        Ok(self.version)
    }

    /// Adds `principal` to `group` (or removes it); returns the new version. An emptied group
    /// is forgotten.
    pub fn change_group(&mut self, group: &str, principal: &str, remove: bool, maxima: &AclMaxima) -> Result<u64, AclError> {
        validate_name(group)?;
        validate_name(principal)?;
        if remove {
            if let Some(members) = self.groups.get_mut(group) {
                members.remove(principal);
                if members.is_empty() {
                    self.groups.remove(group);
                }
            }
        } else {
            if !self.groups.contains_key(group) && self.groups.len() >= maxima.groups {
                return Err(AclError::Full { what: "groups".into(), limit: maxima.groups });
            }
            let members = self.groups.entry(group.to_string()).or_default();
            if !members.contains(principal) && members.len() >= maxima.members {
                return Err(AclError::Full { what: "members of a group".into(), limit: maxima.members });
            }
            members.insert(principal.to_string());
        }
        self.version += 1;
        Ok(self.version)
    }

    /// The list as `principal` may see it: the grants at or below a prefix it administers
    /// (all of them for an admin of `/`), and the groups only for an admin of `/`.
    pub fn visible_to(&self, principal: &str) -> Acl {
        let everything = self.allows(principal, "/", ADMIN);
        let grants = self.grants().filter(|grant| everything || self.allows(principal, &grant.prefix, ADMIN));
        let groups = self.groups.iter().filter(|_| everything).map(|(name, members)| (name.clone(), members.iter().cloned().collect()));
        Acl::from_parts(self.version, grants, groups)
    }
}

/// Checks a grantee: a principal name, or `group:` and a group name.
fn validate_grantee(who: &str) -> Result<(), AclError> {
    validate_name(who.strip_prefix(GROUP_MARK).unwrap_or(who)).map_err(|_| AclError::InvalidPrincipal(who.to_string()))
}

/// Checks a principal or group name: 1 to [`PRINCIPAL_BYTES_MAX`] bytes of letters, digits
/// and `-_.@:` (what a certificate's name or a token file's first column may be).
pub fn validate_name(name: &str) -> Result<(), AclError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.@:".contains(c);
    if name.is_empty() || name.len() > PRINCIPAL_BYTES_MAX || !name.chars().all(allowed) || name.starts_with(GROUP_MARK) {
        return Err(AclError::InvalidPrincipal(name.to_string()));
    }
    Ok(())
}

/// The permission bits a word names (`read`, `write`, `lock`, `watch`, `admin`, `all`).
pub fn permission_named(word: &str) -> Option<u32> {
    match word {
        "read" => Some(READ),
        "write" => Some(WRITE),
        "lock" => Some(LOCK),
        "watch" => Some(WATCH),
        "admin" => Some(ADMIN),
        "all" => Some(ALL),
        _ => None,
    }
}

/// Where a principal needs `ADMIN` to set, change or remove the quota at `prefix`: its
/// parent, i.e. a strict ancestor (grants are inherited), so a tenant's admin at `/t` can
/// neither lift nor remove the quota an operator put on `/t`, yet may divide it below
/// (`/t/sub`); the quota at `/` needs `ADMIN` at `/`. The root principal may do everything.
pub fn quota_authority(prefix: &str) -> &str {
    parent(prefix).unwrap_or("/")
}

/// The words of a permission set, comma-separated (`read,write`).
pub fn permission_words(bits: u32) -> String {
    let words = [(READ, "read"), (WRITE, "write"), (LOCK, "lock"), (WATCH, "watch"), (ADMIN, "admin")];
    words.iter().filter(|(bit, _)| bits & bit != 0).map(|(_, word)| *word).collect::<Vec<_>>().join(",")
}

/// The deepest path at or above both `a` and `b` (valid paths).
fn common_ancestor<'a>(a: &'a str, b: &str) -> &'a str {
    let mut ancestor = a;
    while !crate::paths::is_at_or_below(b, ancestor) {
        match parent(ancestor) {
            Some(up) => ancestor = up,
            None => return "/",
        }
    }
    ancestor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_holds_at_and_below_its_prefix_and_nowhere_else() {
        let mut acl = Acl::default();
        acl.change("/team-a", "alice", READ | WRITE, false, &AclMaxima::DEFAULT).expect("grant");
        assert!(acl.allows("alice", "/team-a", READ));
        assert!(acl.allows("alice", "/team-a/x/y", READ | WRITE));
        assert!(!acl.allows("alice", "/team-a/x", LOCK), "a permission not granted");
        assert!(!acl.allows("alice", "/team-ab", READ), "a sibling sharing the name's start");
        assert!(!acl.allows("alice", "/", READ), "the parent");
        assert!(!acl.allows("bob", "/team-a", READ), "another principal");
        assert!(acl.allows(ROOT_PRINCIPAL, "/team-a", ADMIN), "root may do everything");
        assert!(!acl.allows("", "/team-a", READ), "nobody is nobody's");
    }

    #[test]
    fn a_quota_is_administered_from_strictly_above_it() {
        let mut acl = Acl::default();
        acl.change("/t", "tenant", ADMIN, false, &AclMaxima::DEFAULT).expect("grant");
        acl.change("/", "operator", ADMIN, false, &AclMaxima::DEFAULT).expect("grant");
        let may_set = |principal: &str, prefix: &str| acl.allows(principal, quota_authority(prefix), ADMIN);
        assert!(!may_set("tenant", "/t"), "a tenant's admin does not lift its own quota");
        assert!(may_set("tenant", "/t/sub") && may_set("tenant", "/t/sub/deeper"), "but divides it below");
        assert!(!may_set("tenant", "/"));
        assert!(may_set("operator", "/t") && may_set("operator", "/"), "an admin of / sets any, / included");
        assert!(may_set(ROOT_PRINCIPAL, "/"));
    }

    #[test]
    fn a_session_without_a_hint_counts_where_its_lock_grants_meet() {
        let mut acl = Acl::default();
        let grant = |acl: &mut Acl, prefix: &str, who: &str, bits: u32| acl.change(prefix, who, bits, false, &AclMaxima::DEFAULT).expect("grant");
        grant(&mut acl, "/q/locks", "alice", LOCK);
        grant(&mut acl, "/q", "alice", READ);
        assert_eq!(acl.lock_scope("alice"), "/q/locks", "one tenant's subtree, not its read grants");
        grant(&mut acl, "/q/leases", "alice", LOCK);
        assert_eq!(acl.lock_scope("alice"), "/q", "two subtrees meet at their common ancestor");
        grant(&mut acl, "/qq", "group:ops", ADMIN);
        acl.change_group("ops", "alice", false, &AclMaxima::DEFAULT).expect("join");
        assert_eq!(acl.lock_scope("alice"), "/", "a sibling sharing the name's start is not below /q");
        assert_eq!(acl.lock_scope("mallory"), "/", "no grant: counted at the root");
        assert_eq!(acl.lock_scope(ROOT_PRINCIPAL), "/");
    }

    #[test]
    fn admin_holds_every_permission_and_groups_grant_their_members() {
        let mut acl = Acl::default();
        acl.change("/b", "group:ops", ADMIN, false, &AclMaxima::DEFAULT).expect("grant");
        assert!(!acl.allows("carol", "/b/x", READ), "not a member yet");
        acl.change_group("ops", "carol", false, &AclMaxima::DEFAULT).expect("join");
        assert!(acl.allows("carol", "/b/x", READ | WRITE | LOCK | WATCH));
        assert!(acl.allows_somewhere("carol", LOCK));
        acl.change_group("ops", "carol", true, &AclMaxima::DEFAULT).expect("leave");
        assert!(!acl.allows("carol", "/b/x", READ));
        assert!(!acl.allows_somewhere("carol", LOCK));
    }

    #[test]
    fn revoke_removes_only_the_bits_named_and_every_change_grows_the_version() {
        let mut acl = Acl::default();
        let v1 = acl.change("/a", "alice", READ | WRITE, false, &AclMaxima::DEFAULT).expect("grant");
        let v2 = acl.change("/a", "alice", WRITE, true, &AclMaxima::DEFAULT).expect("revoke");
        assert!(v2 > v1);
        assert!(acl.allows("alice", "/a", READ));
        assert!(!acl.allows("alice", "/a", WRITE));
        acl.change("/a", "alice", READ, true, &AclMaxima::DEFAULT).expect("revoke the rest");
        assert_eq!(acl.grants().count(), 0, "an empty grant is forgotten");
    }

    #[test]
    fn bad_changes_are_refused_and_change_nothing() {
        let mut acl = Acl::default();
        acl.change("/a", "alice", READ, false, &AclMaxima::DEFAULT).expect("grant");
        let before = acl.clone();
        assert!(matches!(acl.change("a/b", "alice", READ, false, &AclMaxima::DEFAULT), Err(AclError::InvalidPrefix(_))));
        assert!(matches!(acl.change("/a", "", READ, false, &AclMaxima::DEFAULT), Err(AclError::InvalidPrincipal(_))));
        assert!(matches!(acl.change("/a", "al ice", READ, false, &AclMaxima::DEFAULT), Err(AclError::InvalidPrincipal(_))));
        assert!(matches!(acl.change("/a", "alice", 0, false, &AclMaxima::DEFAULT), Err(AclError::InvalidPermissions(0))));
        assert!(matches!(acl.change("/a", "alice", 64, false, &AclMaxima::DEFAULT), Err(AclError::InvalidPermissions(64))));
        assert!(matches!(acl.change_group("group:x", "alice", false, &AclMaxima::DEFAULT), Err(AclError::InvalidPrincipal(_))));
        assert_eq!(acl, before);
    }

    #[test]
    fn an_admin_of_a_subtree_sees_only_its_grants() {
        let mut acl = Acl::default();
        acl.change("/a", "alice", ADMIN, false, &AclMaxima::DEFAULT).expect("grant");
        acl.change("/a/x", "bob", READ, false, &AclMaxima::DEFAULT).expect("grant");
        acl.change("/b", "carol", READ, false, &AclMaxima::DEFAULT).expect("grant");
        acl.change_group("ops", "carol", false, &AclMaxima::DEFAULT).expect("group");
        let seen = acl.visible_to("alice");
        let prefixes: Vec<String> = seen.grants().map(|g| g.prefix).collect();
        assert_eq!(prefixes, ["/a", "/a/x"]);
        assert_eq!(seen.groups().count(), 0);
        assert_eq!(acl.visible_to(ROOT_PRINCIPAL), acl);
    }

    /// The same question answered by scanning every grant (what `allows` does by looking up
    /// ancestors only).
    fn allows_by_scan(acl: &Acl, principal: &str, path: &str, permission: u32) -> bool {
        if principal == ROOT_PRINCIPAL {
            return true;
        }
        let held = acl
            .grants()
            .filter(|grant| crate::paths::is_at_or_below(path, &grant.prefix) && acl.names(&grant.principal, principal))
            .fold(0, |held, grant| held | grant.permissions);
        !principal.is_empty() && (held & ADMIN != 0 || held & permission == permission)
    }

    proptest::proptest! {
        #[test]
        fn looking_up_ancestors_answers_as_scanning_every_grant(
            grants in proptest::collection::vec((0usize..6, 0usize..4, 1u32..32), 0..20),
            members in proptest::collection::vec((0usize..2, 0usize..3), 0..4),
            asks in proptest::collection::vec((0usize..8, 0usize..3, 1u32..32), 1..20),
        ) {
            let prefixes = ["/", "/a", "/a/b", "/a/b/c", "/ab", "/x"];
            let grantees = ["alice", "bob", "group:g0", "group:g1"];
            let paths = ["/", "/a", "/a/b", "/a/b/c/d", "/ab/c", "/x/y", "/b", "/a/bc"];
            let principals = ["alice", "bob", "carol"];
            let mut acl = Acl::default();
            for (prefix, who, bits) in grants {
                acl.change(prefixes[prefix], grantees[who], bits, false, &AclMaxima::DEFAULT).expect("grant");
            }
            for (group, who) in members {
                acl.change_group(&format!("g{group}"), principals[who], false, &AclMaxima::DEFAULT).expect("member");
            }
            for (path, who, permission) in asks {
                let (path, who) = (paths[path], principals[who]);
                proptest::prop_assert_eq!(acl.allows(who, path, permission), allows_by_scan(&acl, who, path, permission), "{} {} {}", who, path, permission);
            }
        }
    }

    #[test]
    fn permission_words_name_their_bits() {
        assert_eq!(permission_words(READ | LOCK), "read,lock");
        assert_eq!(permission_named("all"), Some(ALL));
        assert_eq!(permission_named("delete"), None);
    }
}
