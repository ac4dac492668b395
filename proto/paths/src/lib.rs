//! Warden's path syntax and the one longest-prefix lookup every routing decision makes.
//!
//! Paths are absolute and `/`-separated (DESIGN.md "Data model"; the validator of their shape
//! is placement's, `warden_placement::validate_path`). This crate holds the relations between
//! them that placement, the router, the shard-nodes and the client library all share:
//! [`parent`], [`join`], [`name`], [`is_at_or_below`] (by segments: `/a/b` is below `/a`, `/ab`
//! is not), and [`RouteTable`], which finds the entry with the longest prefix at or above a
//! path by walking the path's parents (`O(depth)` map lookups, whatever the table's size).
//! The one routing rule that is not about paths lives here too: a session id names its home
//! group ([`home_group`]).
//!
//! Architecture invariant: no dependencies, no I/O; pure functions of strings.

use std::borrow::Borrow;
use std::collections::BTreeMap;

/// Bits of a session id that count sessions within its home group; the bits above name the
/// home group (DESIGN.md rule 7: a session's id names its one authority).
pub const SESSION_SEQUENCE_BITS: u32 = 40;

/// The group a session id names as its home (where its calls are routed).
pub fn home_group(session_id: u64) -> u64 {
    session_id >> SESSION_SEQUENCE_BITS
}

/// Whether `path` is `prefix` or below it, by segments: `/a/b` is below `/a`, `/ab` is not.
/// Every absolute path is at or below `/`.
pub fn is_at_or_below(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Whether `path` is below `prefix` and not `prefix` itself.
pub fn is_strictly_below(path: &str, prefix: &str) -> bool {
    path != prefix && is_at_or_below(path, prefix)
}

/// The first byte string after every path at or below `prefix`, compared as bytes: the
/// prefix followed by `0` (which follows `/`), and `0` alone for the root. Every path at or
/// below `prefix` sorts in `[prefix, subtree_end(prefix))`; so do some paths that are not
/// (`/a!` for `/a`).
pub fn subtree_end(prefix: &str) -> String {
    if prefix == "/" {
        "0".to_string()
    } else {
        format!("{prefix}0")
    }
}

/// `parent` joined with its child `name`: `/a` + `b` → `/a/b`, `/` + `b` → `/b`.
pub fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The path one segment up: `/a/b` → `/a`, `/a` → `/`, `/` → none. Cuts at the last `/`,
/// so walking parents from any string visits exactly the prefixes it is at or below.
pub fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(index) => Some(&path[..index]),
        None => None,
    }
}

/// The last segment of a path (`/a/b` → `b`; the root's is empty).
pub fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

/// `path` and then each of its parents, longest first: the only prefixes a valid prefix
/// (no empty segment, no trailing `/`) can be at or above it as.
pub fn ancestors_and_self(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |path| parent(path))
}

/// The entry of `routes` whose key is the longest prefix at or above `path`, by segments:
/// the one routing rule. Keys must be valid prefixes (absolute, no empty segment, no trailing
/// `/` except the root); the lookup walks `path`'s parents, one map lookup per segment.
pub fn longest_prefix<'a, K, V>(routes: &'a BTreeMap<K, V>, path: &str) -> Option<(&'a K, &'a V)>
where
    K: Borrow<str> + Ord,
{
    ancestors_and_self(path).find_map(|prefix| routes.get_key_value(prefix))
}

/// The entries of `routes` whose key is strictly below `path`, by segments, in key order: a
/// range of the map (keys must be valid prefixes, as for [`longest_prefix`]).
pub fn below<'a, V>(routes: &'a BTreeMap<String, V>, path: &str) -> impl Iterator<Item = (&'a String, &'a V)> + 'a {
    let start = if path == "/" { "/".to_string() } else { format!("{path}/") };
    let own = path.to_string();
    routes
        .range::<str, _>((std::ops::Bound::Included(start.as_str()), std::ops::Bound::Unbounded))
        .take_while(move |(prefix, _)| prefix.starts_with(&start))
        .filter(move |(prefix, _)| **prefix != own)
}

/// Values by path prefix, looked up by the longest prefix at or above a path
/// ([`longest_prefix`]); ordered by prefix, so the prefixes below a path are a range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTable<T> {
    routes: BTreeMap<String, T>,
}

impl<T> Default for RouteTable<T> {
    fn default() -> Self {
        RouteTable { routes: BTreeMap::new() }
    }
}

impl<T> RouteTable<T> {
    /// An empty table.
    pub fn new() -> RouteTable<T> {
        RouteTable::default()
    }

    /// Routes `prefix` (a valid prefix) to `value`; returns the value it replaced.
    pub fn insert(&mut self, prefix: String, value: T) -> Option<T> {
        self.routes.insert(prefix, value)
    }

    /// The value with the longest prefix at or above `path`, by segments.
    pub fn route(&self, path: &str) -> Option<&T> {
        self.route_entry(path).map(|(_, value)| value)
    }

    /// As [`route`](RouteTable::route), with the prefix that matched.
    pub fn route_entry<'a>(&'a self, path: &str) -> Option<(&'a str, &'a T)> {
        longest_prefix(&self.routes, path).map(|(prefix, value)| (prefix.as_str(), value))
    }

    /// The value routed at exactly `prefix`.
    pub fn get(&self, prefix: &str) -> Option<&T> {
        self.routes.get(prefix)
    }

    /// Entries whose prefix is strictly below `path`, in prefix order.
    pub fn below<'a>(&'a self, path: &str) -> impl Iterator<Item = (&'a str, &'a T)> + 'a {
        below(&self.routes, path).map(|(prefix, value)| (prefix.as_str(), value))
    }

    /// Entries whose prefix is a direct child of `parent_path`, in prefix order.
    pub fn children<'a>(&'a self, parent_path: &str) -> impl Iterator<Item = (&'a str, &'a T)> + 'a {
        let parent_path = parent_path.to_string();
        self.below(&parent_path).filter(move |(prefix, _)| parent(prefix) == Some(parent_path.as_str()))
    }

    /// Every entry, in prefix order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &T)> {
        self.routes.iter().map(|(prefix, value)| (prefix.as_str(), value))
    }

    /// Every value, in prefix order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.routes.values()
    }

    /// How many prefixes are routed.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether no prefix is routed.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

impl<T> FromIterator<(String, T)> for RouteTable<T> {
    fn from_iter<I: IntoIterator<Item = (String, T)>>(entries: I) -> Self {
        RouteTable { routes: entries.into_iter().collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn below_is_by_segments() {
        assert!(is_at_or_below("/a", "/a"));
        assert!(is_at_or_below("/a/b", "/a"));
        assert!(is_at_or_below("/a/b/c", "/a/b"));
        assert!(!is_at_or_below("/ab", "/a"));
        assert!(!is_at_or_below("/a", "/a/b"));
        assert!(!is_at_or_below("/b", "/a"));
        assert!(is_at_or_below("/", "/"));
        assert!(is_at_or_below("/anything/at/all", "/"));
        assert!(!is_at_or_below("relative", "/"));
        assert!(!is_strictly_below("/a", "/a"));
        assert!(is_strictly_below("/a/b", "/a"));
        assert!(is_strictly_below("/a", "/"));
        assert!(!is_strictly_below("/", "/"));
    }

    #[test]
    fn parents_names_joins() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a//b"), Some("/a/"));
        assert_eq!(parent("a"), None);
        assert_eq!(parent(""), None);
        assert_eq!(name("/a/b"), "b");
        assert_eq!(name("/"), "");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
        assert_eq!(ancestors_and_self("/a/b").collect::<Vec<_>>(), ["/a/b", "/a", "/"]);
    }

    #[test]
    fn longest_prefix_by_segments() {
        let table: RouteTable<u64> = [("/", 1), ("/a", 2), ("/a/b", 3), ("/c", 4)].into_iter().map(|(p, id)| (p.to_string(), id)).collect();
        let cases = [("/", 1), ("/x", 1), ("/ab", 1), ("/a", 2), ("/a/bc", 2), ("/a/b", 3), ("/a/b/c/d", 3), ("/c", 4), ("/cd", 1)];
        for (path, expected) in cases {
            assert_eq!(table.route(path), Some(&expected), "path {path}");
        }
        assert_eq!(table.route("relative"), None);
        assert_eq!(table.route_entry("/a/x"), Some(("/a", &2)));
        assert_eq!(table.below("/").map(|(p, _)| p).collect::<Vec<_>>(), ["/a", "/a/b", "/c"]);
        assert_eq!(table.below("/a").map(|(p, _)| p).collect::<Vec<_>>(), ["/a/b"]);
        assert_eq!(table.children("/").map(|(p, _)| p).collect::<Vec<_>>(), ["/a", "/c"]);
        assert!(RouteTable::<u64>::new().route("/").is_none());
    }

    /// A valid prefix of up to four segments over a tiny alphabet (so prefixes collide,
    /// nest, and share leading characters as `/a` and `/ab` do).
    fn prefix() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(vec!["a", "b", "ab", "ba"]), 0..4).prop_map(|segments| {
            if segments.is_empty() {
                "/".to_string()
            } else {
                format!("/{}", segments.join("/"))
            }
        })
    }

    /// Any string of the path alphabet, valid or not (empty segments, trailing `/`, relative).
    fn any_path() -> impl Strategy<Value = String> {
        "[ab/]{0,10}"
    }

    proptest! {
        /// The parent walk finds exactly what a scan of every route for the longest prefix
        /// the path is at or below finds.
        #[test]
        fn walk_matches_a_scan(prefixes in prop::collection::btree_set(prefix(), 0..12), path in prop_oneof![prefix(), any_path()]) {
            let table: RouteTable<usize> = prefixes.iter().cloned().enumerate().map(|(i, p)| (p, i)).collect();
            let scanned = table.iter().filter(|(p, _)| is_at_or_below(&path, p)).max_by_key(|(p, _)| p.len());
            prop_assert_eq!(table.route_entry(&path), scanned);
        }

        /// Every path at or below a prefix sorts, as bytes, from the prefix to its subtree's
        /// end; a path past the end is not below it.
        #[test]
        fn a_subtree_sorts_before_its_end(prefix in prefix(), path in prop_oneof![prefix(), any_path()]) {
            let end = subtree_end(&prefix);
            if is_at_or_below(&path, &prefix) {
                prop_assert!(prefix.as_str() <= path.as_str() && path.as_str() < end.as_str(), "{} below {} sorts in [{}, {})", path, prefix, prefix, end);
            }
            if path.as_str() >= end.as_str() || path.as_str() < prefix.as_str() {
                prop_assert!(!is_at_or_below(&path, &prefix));
            }
        }

        /// Below and children agree with their definitions by segments.
        #[test]
        fn below_and_children_match_a_scan(prefixes in prop::collection::btree_set(prefix(), 0..12), path in prefix()) {
            let table: RouteTable<()> = prefixes.iter().cloned().map(|p| (p, ())).collect();
            let below: Vec<&str> = table.below(&path).map(|(p, _)| p).collect();
            let scanned: Vec<&str> = table.iter().map(|(p, _)| p).filter(|p| is_strictly_below(p, &path)).collect();
            prop_assert_eq!(below, scanned);
            let children: Vec<&str> = table.children(&path).map(|(p, _)| p).collect();
            let scanned: Vec<&str> = table.iter().map(|(p, _)| p).filter(|p| parent(p) == Some(path.as_str())).collect();
            prop_assert_eq!(children, scanned);
        }
    }
}
