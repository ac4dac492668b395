//! Which group answers which part of a key range. A range of etcd keys is one or more
//! intervals of path bytes ([`super::keys::path_intervals`]); each interval lies inside the
//! subtree of its deepest enclosing path (its scope), whose group answers the paths it
//! serves there, and each group below the scope answers the part inside its own prefix.
//! Together they answer every path of the interval exactly once.

use warden_paths::is_at_or_below;
use warden_placement::validate_path;
use warden_proto::routing::Table;

use super::keys::KeyInterval;

/// One group's part of a range: the scope routes it, `[from, to)` lies inside the scope's
/// subtree (`RangeRequest.path`, `from`, `to`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// The path the part lies at or below (routing and permissions go by it).
    pub scope: String,
    /// The first path byte string of the part.
    pub from: Vec<u8>,
    /// The first path byte string past it.
    pub to: Vec<u8>,
}

/// Every path sorts in `["/", "0")`: `0` follows `/`.
const PATHS_END: &[u8] = b"0";

/// The parts of the path interval `interval` by `table`: the scope's group first, then the
/// groups below the scope whose prefix meets the interval, in prefix order.
pub fn parts(table: &Table, interval: &KeyInterval) -> Vec<Part> {
    let Some((from, to)) = path_bounds(interval) else { return Vec::new() };
    let scope = scope_of(&from, &to);
    let mut parts = vec![Part { scope: scope.clone(), from: from.clone(), to: to.clone() }];
    for group in table.groups_below(&scope) {
        let prefix = group.descriptor.prefix.as_str();
        let end = warden_paths::subtree_end(prefix);
        let part_from = from.as_slice().max(prefix.as_bytes()).to_vec();
        let part_to = to.as_slice().min(end.as_bytes()).to_vec();
        if part_from < part_to {
            parts.push(Part { scope: prefix.to_string(), from: part_from, to: part_to });
        }
    }
    parts
}

/// The subtrees a watch of the keys in `keys` (an interval of etcd keys) watches: the
/// deepest subtree holding each of its path intervals, less those inside another (none when
/// the interval holds no key). Plain and escaped keys lie in different subtrees, so a prefix
/// like `/registry/pods/` (whose own key is escaped) watches `/registry/pods` and `/_etcd`,
/// not the whole tree.
pub fn watch_scopes(keys: &KeyInterval) -> Vec<String> {
    let mut scopes: Vec<String> = super::keys::path_intervals(keys).iter().filter_map(path_bounds).map(|(from, to)| scope_of(&from, &to)).collect();
    scopes.sort();
    scopes.dedup();
    let outer: Vec<String> =
        scopes.iter().filter(|scope| !scopes.iter().any(|other| other != *scope && is_at_or_below(scope, other))).cloned().collect();
    outer
}

/// `interval` cut to the byte strings paths can be, as `[from, to)`; `None` when empty.
fn path_bounds(interval: &KeyInterval) -> Option<(Vec<u8>, Vec<u8>)> {
    let from = interval.from.as_slice().max(b"/".as_slice()).to_vec();
    let to = interval.to.as_deref().map_or(PATHS_END, |to| to.min(PATHS_END)).to_vec();
    (from < to).then_some((from, to))
}

/// The deepest valid path `P` whose subtree holds every path of `[from, to)`: the bounds'
/// common prefix, or that prefix cut at a `/`, moved up until it holds them (the root always
/// does: `from` starts with `/`, `to` is at most `0`). As byte strings a subtree is `P` and
/// `[P + "/", P + "0")`; the strings between `P` and `P + "/"` (`P!`) are beside it, so `P`
/// holds an interval only from `P + "/"` on, or when the interval is `P` alone.
fn scope_of(from: &[u8], to: &[u8]) -> String {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    let mut prefix = &from[..common];
    loop {
        if let Ok(path) = std::str::from_utf8(prefix) {
            let end = warden_paths::subtree_end(path);
            let below = [path.as_bytes(), b"/"].concat();
            let alone = [path.as_bytes(), b"\0"].concat();
            let holds = (from >= below.as_slice() && to <= end.as_bytes()) || (from >= path.as_bytes() && to <= alone.as_slice());
            if validate_path(path).is_ok() && holds {
                return path.to_string();
            }
        }
        match prefix.iter().rposition(|&byte| byte == b'/') {
            Some(slash) if slash > 0 => prefix = &prefix[..slash],
            _ => return "/".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_proto::placement::{GroupEntry, RoutingTable};
    use warden_proto::v1::GroupDescriptor;

    fn table(prefixes: &[&str]) -> Table {
        let groups = prefixes
            .iter()
            .enumerate()
            .map(|(i, prefix)| GroupEntry {
                descriptor: Some(GroupDescriptor { group_id: i as u64 + 1, prefix: prefix.to_string(), ..GroupDescriptor::default() }),
                ready: true,
                ..GroupEntry::default()
            })
            .collect();
        Table::from_proto(RoutingTable { groups, ..RoutingTable::default() })
    }

    fn interval(from: &str, to: Option<&str>) -> KeyInterval {
        KeyInterval { from: from.as_bytes().to_vec(), to: to.map(|to| to.as_bytes().to_vec()) }
    }

    fn part(scope: &str, from: &str, to: &str) -> Part {
        Part { scope: scope.into(), from: from.as_bytes().to_vec(), to: to.as_bytes().to_vec() }
    }

    #[test]
    fn a_watch_of_keys_watches_the_deepest_subtrees_holding_their_paths() {
        let keys = |from: &str, to: Option<&str>| KeyInterval { from: from.as_bytes().to_vec(), to: to.map(|to| to.as_bytes().to_vec()) };
        assert_eq!(watch_scopes(&keys("/registry/pods/", Some("/registry/pods0"))), ["/_etcd", "/registry/pods"], "the prefix's own key is escaped");
        assert_eq!(watch_scopes(&keys("/registry/pods/a", Some("/registry/pods/b"))), ["/_etcd", "/registry/pods"], "`/registry/pods/a/` is escaped");
        assert_eq!(watch_scopes(&keys("foo", Some("fop"))), ["/_etcd"], "escaped keys live under /_etcd");
        assert_eq!(watch_scopes(&keys("", None)), ["/"], "every key: the whole tree, once");
        assert!(watch_scopes(&keys("b", Some("a"))).is_empty(), "an empty interval holds no key");
    }

    #[test]
    fn a_range_inside_one_subtree_goes_to_its_deepest_enclosing_path() {
        let table = table(&["/"]);
        assert_eq!(
            parts(&table, &interval("/registry/pods/", Some("/registry/pods0"))),
            vec![part("/registry/pods", "/registry/pods/", "/registry/pods0")]
        );
        assert_eq!(parts(&table, &interval("/registry/po", Some("/registry/pp"))), vec![part("/registry", "/registry/po", "/registry/pp")]);
        assert_eq!(parts(&table, &interval("/a//b", Some("/a//c"))), vec![part("/a", "/a//b", "/a//c")], "an invalid prefix moves up");
        assert_eq!(parts(&table, &interval("", None)), vec![part("/", "/", "0")], "every key: every path");
        assert!(parts(&table, &interval("0", None)).is_empty(), "no path sorts after 0");
        assert_eq!(
            parts(&table, &interval("/_etcd/!2fa!2f", Some("/_etcd/!2fa0"))),
            vec![part("/_etcd", "/_etcd/!2fa!2f", "/_etcd/!2fa0")],
            "/_etcd/!2fa!2f is beside /_etcd/!2fa, not below it"
        );
        assert_eq!(parts(&table, &interval("/a", Some("/a\0"))), vec![part("/a", "/a", "/a\0")], "one path alone");
    }

    #[test]
    fn groups_below_the_scope_answer_their_own_part() {
        let table = table(&["/", "/registry/pods", "/registry/pods/kube-system", "/other"]);
        let got = parts(&table, &interval("/registry/p", Some("/registry/q")));
        assert_eq!(
            got,
            vec![
                part("/registry", "/registry/p", "/registry/q"),
                part("/registry/pods", "/registry/pods", "/registry/pods0"),
                part("/registry/pods/kube-system", "/registry/pods/kube-system", "/registry/pods/kube-system0"),
            ]
        );
        let got = parts(&table, &interval("/registry/pods/a", Some("/registry/pods/l")));
        assert_eq!(
            got,
            vec![
                part("/registry/pods", "/registry/pods/a", "/registry/pods/l"),
                part("/registry/pods/kube-system", "/registry/pods/kube-system", "/registry/pods/kube-system0")
            ]
        );
        let got = parts(&table, &interval("/registry/pods/a", Some("/registry/pods/b")));
        assert_eq!(got, vec![part("/registry/pods", "/registry/pods/a", "/registry/pods/b")], "a group outside the interval is not asked");
    }

    /// A path of up to three segments over a tiny alphabet (so prefixes nest and collide).
    fn small_path() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop::collection::vec(prop::sample::select(vec!["a", "b", "ab", "a!", "a!b"]), 1..=3).prop_map(|segments| format!("/{}", segments.join("/")))
    }

    proptest::proptest! {
        /// Every path of an interval is answered by exactly one part's group (the one
        /// serving it, inside the part's bounds and scope), and no path outside it is.
        #[test]
        fn every_path_of_an_interval_is_answered_exactly_once(
            prefixes in proptest::collection::btree_set(small_path(), 0..5),
            from in proptest::prop_oneof![small_path(), proptest::strategy::Just("/".to_string())],
            to in proptest::option::of(proptest::prop_oneof![small_path(), proptest::strategy::Just("/b0".to_string())]),
            paths in proptest::collection::vec(small_path(), 1..20),
        ) {
            let mut all: Vec<&str> = vec!["/"];
            all.extend(prefixes.iter().map(String::as_str));
            let table = table(&all);
            let interval = KeyInterval { from: from.clone().into_bytes(), to: to.clone().map(String::into_bytes) };
            let parts = parts(&table, &interval);
            for path in paths.iter().chain(prefixes.iter()) {
                let serving = table.route(path).map(|group| group.id());
                let answering = parts
                    .iter()
                    .filter(|part| {
                        (part.from.as_slice()..part.to.as_slice()).contains(&path.as_bytes())
                            && warden_paths::is_at_or_below(path, &part.scope)
                            && table.route(&part.scope).map(|group| group.id()) == serving
                    })
                    .count();
                proptest::prop_assert_eq!(answering, usize::from(interval.contains(path.as_bytes())), "{} in {:?}: {:?}", path, interval, parts);
            }
        }
    }
}
