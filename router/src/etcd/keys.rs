//! etcd keys as Warden paths, and etcd key ranges as the path intervals a scan covers.
//!
//! etcd keys are arbitrary non-empty byte strings in one flat, byte-ordered space; Warden
//! paths are absolute `/`-separated UTF-8 (`warden_placement::validate_path`). The mapping is
//! the documented contract:
//!
//! 1. A **plain key** maps to the path with the same bytes: a key that is valid UTF-8, passes
//!    `validate_path`, is not the root `/`, and is neither at or below `/warden` (Warden's
//!    reserved subtree) nor at or below `/_etcd` (segment-wise). So `/registry/pods/default/x`
//!    is the node `/registry/pods/default/x` and lands in the group serving its longest prefix.
//! 2. **Every other key** (e.g. `foo`, `/a/`, `/a//b`, binary bytes, `/`, `/warden/x`,
//!    `/_etcd/x`) maps to `/_etcd/` + escape(key): one segment under `/_etcd`. escape is a
//!    per-byte, prefix-free, order-preserving code: bytes `0x30..=0x7d` stay as they are;
//!    bytes `0x00..=0x2f` become `!` followed by two lowercase hex digits; bytes `0x7e..=0xff`
//!    become `~` followed by two lowercase hex digits. (Order-preserving: for any keys a < b
//!    bytewise, escape(a) < escape(b); prefix-preserving: a is a prefix of b iff escape(a) is a
//!    prefix of escape(b).) The escaped path must still be ≤ 1024 bytes, else the key is
//!    refused.
//! 3. The reverse: a path maps back to a key only if it is a plain key's path (rule 1), or
//!    `/_etcd/<one segment>` whose segment is a valid escape (every `!`/`~` followed by two
//!    lowercase hex digits, other bytes in `0x30..=0x7d`) of a key that is NOT plain (so every
//!    key has exactly one path and the mapping is a bijection on the keys). Any other path
//!    (e.g. `/_etcd` itself, `/_etcd/a/b`, paths under `/warden`, `/`) is not an etcd key.
//!
//! A valid escape is the escape of some key: `!` only before the hex of a byte `0x00..=0x2f`,
//! `~` only before that of a byte `0x7e..=0xff` (`!41` is not `A`'s escape, `A` is).
//!
//! etcd ranges (`[key, range_end)` over raw bytes) become [`KeyInterval`]s ([`etcd_range`]),
//! and an interval becomes the intervals of path bytes a scan covers ([`path_intervals`]):
//! the same bytes for plain keys, their escapes under `/_etcd/` for the others.

pub use warden_placement::etcd_keys::ESCAPED_PREFIX;
use warden_placement::etcd_keys::{escaped_path, plain_key_path as plain_path, unescape, RESERVED_PREFIX};
use warden_placement::PATH_BYTES_MAX;

/// Why a key has no path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The empty key (etcd refuses it too).
    #[error("key is empty")]
    Empty,
    /// Not a plain key, and its escaped path is longer than a path may be.
    #[error("key of {key_bytes} bytes maps to a path longer than {PATH_BYTES_MAX} bytes")]
    TooLong {
        /// Bytes of the key.
        key_bytes: usize,
    },
}

/// The path of `key` (rules 1 and 2 of the module doc).
pub fn key_to_path(key: &[u8]) -> Result<String, KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if let Some(path) = plain_path(key) {
        return Ok(path.to_string());
    }
    // Escaping never shortens a key: a key longer than a path cannot fit, and the check
    // comes first so a huge key is not escaped for nothing.
    let too_long = KeyError::TooLong { key_bytes: key.len() };
    if key.len() > PATH_BYTES_MAX {
        return Err(too_long);
    }
    let path = escaped_path(key);
    if path.len() > PATH_BYTES_MAX {
        return Err(too_long);
    }
    Ok(path)
}

/// The key whose path `path` is, if any (rule 3 of the module doc).
pub fn path_to_key(path: &str) -> Option<Vec<u8>> {
    if plain_path(path.as_bytes()).is_some() {
        return Some(path.as_bytes().to_vec());
    }
    // A path longer than the limit is no key's: `key_to_path` refuses the key it decodes to.
    if path.len() > PATH_BYTES_MAX {
        return None;
    }
    let key = unescape(path.strip_prefix(ESCAPED_PREFIX)?.strip_prefix('/')?.as_bytes())?;
    // A plain key's path is its own bytes: its escape would be a second path for it.
    (!key.is_empty() && plain_path(&key).is_none()).then_some(key)
}

/// The byte strings from `from` (included) to `to` (excluded; `None`: no end), compared
/// byte-wise: raw etcd keys, or path bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInterval {
    /// The first byte string in the interval.
    pub from: Vec<u8>,
    /// The first byte string past the interval (`None`: unbounded).
    pub to: Option<Vec<u8>>,
}

impl KeyInterval {
    /// Whether `bytes` lies in the interval.
    pub fn contains(&self, bytes: &[u8]) -> bool {
        self.from.as_slice() <= bytes && self.to.as_ref().is_none_or(|to| bytes < to.as_slice())
    }

    /// Whether no byte string lies in the interval.
    pub fn is_empty(&self) -> bool {
        self.to.as_ref().is_some_and(|to| *to <= self.from)
    }

    /// The longest byte string every byte string in the interval starts with (a prefix
    /// range's prefix; empty when the interval is unbounded or spans several first bytes).
    fn shared_prefix(&self) -> &[u8] {
        let Some(to) = &self.to else { return &[] };
        // Every string from a prefix of `from` up to that prefix's end starts with it.
        (0..=self.from.len())
            .rev()
            .map(|len| &self.from[..len])
            .find(|prefix| {
                let end = prefix_end(prefix);
                // `[0]`: no end (the prefix is all 0xff bytes, which every later string starts with).
                end == [0] || end.as_slice() >= to.as_slice()
            })
            .unwrap_or(&[])
    }

    /// The non-empty parts of the interval outside `[cut_from, cut_to)`, in order.
    fn without(&self, cut_from: &[u8], cut_to: &[u8]) -> impl Iterator<Item = KeyInterval> {
        let below_to = match &self.to {
            Some(to) if to.as_slice() <= cut_from => to.clone(),
            _ => cut_from.to_vec(),
        };
        let below = KeyInterval { from: self.from.clone(), to: Some(below_to) };
        let above = KeyInterval { from: self.from.as_slice().max(cut_to).to_vec(), to: self.to.clone() };
        [below, above].into_iter().filter(|part| !part.is_empty())
    }
}

/// What an etcd range request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeSpec {
    /// One key.
    Single(Vec<u8>),
    /// Every key in the interval.
    Interval(KeyInterval),
}

/// The keys an etcd request's `key` and `range_end` name, with etcd's conventions: an empty
/// `range_end` is the single key; `range_end` `[0]` is every key ≥ `key` (so `key` `[0]` with
/// `range_end` `[0]` is every key, all being non-empty); otherwise `[key, range_end)`, empty
/// when `range_end` ≤ `key`.
pub fn etcd_range(key: &[u8], range_end: &[u8]) -> RangeSpec {
    let to = match range_end {
        [] => return RangeSpec::Single(key.to_vec()),
        [0] => None,
        _ => Some(range_end.to_vec()),
    };
    RangeSpec::Interval(KeyInterval { from: key.to_vec(), to })
}

/// The `range_end` etcd clients send for the keys starting with `prefix`
/// (`clientv3.GetPrefixRangeEnd`): the prefix without its trailing `0xff` bytes, its last
/// byte incremented; `[0]` (every key from the prefix on) when no byte can be incremented.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&byte| byte < 0xff) {
        Some(last) => {
            let mut end = prefix[..last].to_vec();
            end.push(prefix[last] + 1);
            end
        }
        None => vec![0],
    }
}

/// The intervals of path bytes a scan covers to find exactly the keys in `interval`
/// (non-empty ones, plain parts in order, then the escaped part):
///
/// - the plain part: `interval` itself, less the valid paths that are no plain key's (the
///   root and the subtrees of `/_etcd` and `/warden`). A plain key's path is its own bytes, so
///   the plain paths found there are exactly the plain keys in the interval; cutting `/_etcd`
///   keeps escaped paths, whose keys may lie anywhere, out of it.
/// - the escaped part: `/_etcd/` + escape(`from`) to `/_etcd/` + escape(`to`) (or the end of
///   the `/_etcd/` subtree when unbounded), cut to the strings starting with the escape of
///   the prefix every key in the interval shares: escape preserves order and prefixes, so
///   the escaped paths there are exactly those of the keys in the interval. It finds no plain key (rule 3);
///   callers decode what they find with [`path_to_key`] anyway.
pub fn path_intervals(interval: &KeyInterval) -> Vec<KeyInterval> {
    let mut cuts = vec![(b"/".to_vec(), b"/\0".to_vec())];
    for prefix in [ESCAPED_PREFIX, RESERVED_PREFIX] {
        // A subtree, as byte strings: its root, then `prefix/` up to `prefix0` (`0` follows
        // `/`). `/_etcd!` sorts between the two and is plain: it stays.
        let prefix = prefix.as_bytes();
        cuts.push((prefix.to_vec(), [prefix, b"\0"].concat()));
        cuts.push(([prefix, b"/"].concat(), [prefix, b"0"].concat()));
    }
    let mut intervals = vec![interval.clone()];
    for (cut_from, cut_to) in &cuts {
        intervals = intervals.iter().flat_map(|part| part.without(cut_from, cut_to)).collect();
    }
    // A plain part whose every byte string starts with what no path can (`/e//` of the keys
    // of an election at `/e/`) holds no plain key: scanning it would only add a group
    // answering nothing, whose revision an empty range's header could name.
    intervals.retain(|part| !no_path_starts_with(part.shared_prefix()));
    let escaped_end = match &interval.to {
        Some(to) => escaped_path(to).into_bytes(),
        None => format!("{ESCAPED_PREFIX}0").into_bytes(),
    };
    // Every key in the interval starts with its shared prefix, so every escape with that
    // prefix's escape: ending there (not at the escape of `to`) leaves out only strings no
    // key escapes to, and keeps a prefix's escaped part within the grant of the prefix
    // (`warden_placement::etcd_keys::escaped_grant_path`).
    let escaped_end = escaped_end.min(prefix_end(escaped_path(interval.shared_prefix()).as_bytes()));
    let escaped = KeyInterval { from: escaped_path(&interval.from).into_bytes(), to: Some(escaped_end) };
    if !escaped.is_empty() {
        intervals.push(escaped);
    }
    intervals
}

/// Whether no valid path starts with `prefix` (`warden_placement::validate_path`): it holds
/// an empty segment, a `.` or `..` segment, or a control character. Conservative: `false`
/// when unsure.
fn no_path_starts_with(prefix: &[u8]) -> bool {
    let segment_invalid = [b"//".as_slice(), b"/./", b"/../"].iter().any(|bad| prefix.windows(bad.len()).any(|window| window == *bad));
    segment_invalid || prefix.iter().any(|&byte| byte < 0x20 || byte == 0x7f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use warden_placement::validate_path;

    fn interval(from: &[u8], to: Option<&[u8]>) -> KeyInterval {
        KeyInterval { from: from.to_vec(), to: to.map(<[u8]>::to_vec) }
    }

    #[test]
    fn a_path_like_key_maps_to_its_own_path() {
        for key in ["/registry/pods/default/x", "/a", "/wardens", "/_etcd!", "/_etcdx", "/a/_etcd", "/a/warden/b", "/é/ü"] {
            assert_eq!(key_to_path(key.as_bytes()), Ok(key.to_string()), "{key}");
            assert_eq!(path_to_key(key), Some(key.as_bytes().to_vec()), "{key}");
        }
    }

    #[test]
    fn keys_under_reserved_subtrees_are_escaped() {
        let cases = [
            ("/", "/_etcd/!2f"),
            ("/warden", "/_etcd/!2fwarden"),
            ("/warden/sessions", "/_etcd/!2fwarden!2fsessions"),
            ("/_etcd", "/_etcd/!2f_etcd"),
            ("/_etcd/x", "/_etcd/!2f_etcd!2fx"),
        ];
        for (key, path) in cases {
            assert_eq!(key_to_path(key.as_bytes()), Ok(path.to_string()), "{key}");
            assert_eq!(path_to_key(path), Some(key.as_bytes().to_vec()), "{path}");
        }
    }

    #[test]
    fn keys_that_are_not_valid_paths_are_escaped() {
        let cases: [(&[u8], &str); 9] = [
            (b"foo", "/_etcd/foo"),
            (b"/a/", "/_etcd/!2fa!2f"),
            (b"/a//b", "/_etcd/!2fa!2f!2fb"),
            (b"/a/./b", "/_etcd/!2fa!2f!2e!2fb"),
            (b"/a\tb", "/_etcd/!2fa!09b"),
            (b"\0\xff", "/_etcd/!00~ff"),
            ("é".as_bytes(), "/_etcd/~c3~a9"),
            (b"0}~", "/_etcd/0}~7e"),
            (b"a b!", "/_etcd/a!20b!21"),
        ];
        for (key, path) in cases {
            assert_eq!(key_to_path(key), Ok(path.to_string()), "{key:?}");
            assert_eq!(path_to_key(path), Some(key.to_vec()), "{path}");
        }
        let deep = "/a".repeat(65);
        assert!(key_to_path(deep.as_bytes()).is_ok_and(|path| path.starts_with("/_etcd/!2fa!2fa")), "deeper than a path may be");
    }

    #[test]
    fn empty_keys_and_keys_too_long_once_escaped_are_refused() {
        assert_eq!(key_to_path(b""), Err(KeyError::Empty));
        let longest = "a".repeat(PATH_BYTES_MAX - "/_etcd/".len());
        assert_eq!(key_to_path(longest.as_bytes()).map(|path| path.len()), Ok(PATH_BYTES_MAX));
        let longer = format!("{longest}a");
        assert_eq!(key_to_path(longer.as_bytes()), Err(KeyError::TooLong { key_bytes: longer.len() }));
        assert_eq!(key_to_path(&[0xff; 400]), Err(KeyError::TooLong { key_bytes: 400 }));
        let plain = format!("/{}", "a".repeat(PATH_BYTES_MAX - 1));
        assert_eq!(key_to_path(plain.as_bytes()), Ok(plain.clone()), "a plain key may use the whole path length");
        let not_plain = format!("{plain}a");
        assert_eq!(key_to_path(not_plain.as_bytes()), Err(KeyError::TooLong { key_bytes: not_plain.len() }));
        assert_eq!(key_to_path(&vec![b'a'; 10 << 20]), Err(KeyError::TooLong { key_bytes: 10 << 20 }));
    }

    #[test]
    fn paths_of_no_key_map_to_none() {
        let too_long = format!("/_etcd/{}", "a".repeat(PATH_BYTES_MAX));
        for path in [
            "/",
            "/_etcd",
            "/_etcd/",
            "/_etcd/a/b",
            "/warden",
            "/warden/x",
            "relative",
            "/a/",
            "/_etcd/!2",
            "/_etcd/!2F",
            "/_etcd/!41",
            "/_etcd/~20",
            "/_etcd/a.b",
            "/_etcd/!2fregistry",
            &too_long,
        ] {
            assert_eq!(path_to_key(path), None, "{path}");
        }
    }

    #[test]
    fn etcd_ranges_follow_etcd_conventions() {
        assert_eq!(etcd_range(b"a", b""), RangeSpec::Single(b"a".to_vec()));
        assert_eq!(etcd_range(b"a", b"\0"), RangeSpec::Interval(interval(b"a", None)));
        assert_eq!(etcd_range(b"a", b"c"), RangeSpec::Interval(interval(b"a", Some(b"c"))));
        let RangeSpec::Interval(every_key) = etcd_range(b"\0", b"\0") else { panic!("an interval") };
        assert!([&b"\0"[..], b"a", b"\xff\xff"].iter().all(|key| every_key.contains(key)));
        let RangeSpec::Interval(backwards) = etcd_range(b"c", b"a") else { panic!("an interval") };
        assert!(backwards.is_empty());
        assert!(path_intervals(&backwards).is_empty());
    }

    #[test]
    fn a_prefix_no_path_starts_with_is_scanned_only_among_the_escaped_keys() {
        // An election at `/e/` puts its candidates at `/e//<lease>`: escaped keys.
        let election = interval(b"/e//", Some(&prefix_end(b"/e//")));
        assert_eq!(path_intervals(&election), [interval(b"/_etcd/!2fe!2f!2f", Some(b"/_etcd/!2fe!2f!2g"))]);
        for no_path in [&b"/e/./"[..], b"/e/../", b"/e", b"/e/"] {
            let scanned = path_intervals(&interval(no_path, Some(&prefix_end(no_path))));
            assert_eq!(scanned.len(), 1, "{no_path:?}: {scanned:?}");
            assert!(scanned[0].from.starts_with(b"/_etcd/"), "{no_path:?}: {scanned:?}");
        }
        // An election at `/e` puts them at `/e/<lease>`: plain keys, and `/e/` itself escaped.
        let plain = interval(b"/e/", Some(&prefix_end(b"/e/")));
        assert_eq!(path_intervals(&plain), [interval(b"/e/", Some(b"/e0")), interval(b"/_etcd/!2fe!2f", Some(b"/_etcd/!2fe!2g"))]);
        // A segment that only begins like `.` may still be a path's (`/e/.x`).
        assert_eq!(path_intervals(&interval(b"/e/.", Some(b"/e/0"))).len(), 2);
    }

    #[test]
    fn prefix_ends_match_etcd_clients() {
        assert_eq!(prefix_end(b"foo"), b"fop");
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(&[1, 0xff, 0xff]), [2]);
        assert_eq!(prefix_end(&[0xff, 0xff]), [0]);
        assert_eq!(prefix_end(b""), [0]);
    }

    #[test]
    fn every_key_is_scanned_around_the_reserved_subtrees() {
        let expected = [
            interval(b"\0", Some(b"/")),
            interval(b"/\0", Some(b"/_etcd")),
            interval(b"/_etcd\0", Some(b"/_etcd/")),
            interval(b"/_etcd0", Some(b"/warden")),
            interval(b"/warden\0", Some(b"/warden/")),
            interval(b"/warden0", None),
            interval(b"/_etcd/!00", Some(b"/_etcd0")),
        ];
        assert_eq!(path_intervals(&interval(b"\0", None)), expected);
        assert_eq!(path_intervals(&interval(b"/a", Some(b"/b"))), [interval(b"/a", Some(b"/b")), interval(b"/_etcd/!2fa", Some(b"/_etcd/!2fb"))]);
    }

    /// Bytes that matter to the mapping (separators, dots, both ends of each escape class, the
    /// escape markers, a UTF-8 sequence) more often than others.
    fn byte() -> impl Strategy<Value = u8> {
        prop_oneof![3 => prop::sample::select(b"/._a!~0}\x00\x2f\x30\x7d\x7e\xff\xc3\xa9".to_vec()), 1 => any::<u8>()]
    }

    /// A path-like key, valid or not: segments (reserved, relative, empty, with controls)
    /// joined by `/`.
    fn path_like_key() -> impl Strategy<Value = Vec<u8>> {
        let segments = prop::sample::select(vec!["a", "b", "ab", "warden", "_etcd", "_etcd!", ".", "..", "", "é", "\u{85}", "\t"]);
        prop::collection::vec(segments, 0..6).prop_map(|segments| format!("/{}", segments.join("/")).into_bytes())
    }

    /// Any non-empty key, often short or path-like so that keys share prefixes and plain keys
    /// are common.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(byte(), 1..6),
            prop::collection::vec(byte(), 1..300),
            path_like_key(),
            (path_like_key(), prop::collection::vec(byte(), 1..4)).prop_map(|(path, tail)| [path, tail].concat()),
        ]
    }

    /// An interval bound: a key, the empty string, or the edges of the cut subtrees.
    fn bound() -> impl Strategy<Value = Vec<u8>> {
        let edges: Vec<&[u8]> =
            vec![b"", b"/", b"/\0", b"/_etcd", b"/_etcd\0", b"/_etcd!", b"/_etcd/", b"/_etcd0", b"/warden", b"/warden/", b"/warden0", b"\0", b"\xff"];
        prop_oneof![key(), prop::sample::select(edges).prop_map(<[u8]>::to_vec)]
    }

    /// An interval: from a bound to another, to none, or to the end of the bound as a prefix.
    fn any_interval() -> impl Strategy<Value = KeyInterval> {
        bound().prop_flat_map(|from| {
            let end = prefix_end(&from);
            let to = prop_oneof![Just(None), bound().prop_map(Some), Just(Some(end))];
            (Just(from), to).prop_map(|(from, to)| KeyInterval { from, to })
        })
    }

    /// A path-like string, key's path or not: escape-like segments under `/_etcd`, among others.
    fn any_path() -> impl Strategy<Value = String> {
        prop_oneof![
            key().prop_filter_map("no path", |key| key_to_path(&key).ok()),
            // Escape-like segments: plain characters, marker and hex (canonical or not), strays.
            prop::collection::vec(prop_oneof!["[0-9a-z_}]", "[!~][0-9a-f]{2}", "[!~/.A-F]"], 0..6)
                .prop_map(|tokens| format!("{ESCAPED_PREFIX}/{}", tokens.concat())),
            "(/_etcd|/warden|/a|/)[/a._!~é]{0,6}",
        ]
    }

    proptest! {
        /// Every key has a valid path that maps back to it, its own bytes when plain.
        #[test]
        fn keys_round_trip_through_their_paths(key in key()) {
            let path = key_to_path(&key).map_err(|error| TestCaseError::fail(error.to_string()))?;
            prop_assert_eq!(validate_path(&path), Ok(()));
            prop_assert_eq!(plain_path(&key).is_some(), path.as_bytes() == key.as_slice());
            prop_assert_eq!(path_to_key(&path), Some(key));
        }

        /// A path maps back only to the key whose path it is: one path per key.
        #[test]
        fn a_path_maps_back_only_to_the_key_it_is_the_path_of(path in any_path()) {
            if let Some(key) = path_to_key(&path) {
                prop_assert_eq!(key_to_path(&key), Ok(path));
            }
        }

        /// Escape keeps the keys' order and prefixes.
        #[test]
        fn escape_preserves_order_and_prefixes(a in key(), b in key()) {
            let (escaped_a, escaped_b) = (escaped_path(&a), escaped_path(&b));
            prop_assert_eq!(a.cmp(&b), escaped_a.cmp(&escaped_b));
            prop_assert_eq!(a.starts_with(&b), escaped_a.starts_with(&escaped_b));
        }

        /// A scan of the path intervals of an interval finds exactly the keys in it.
        #[test]
        fn a_scan_of_the_path_intervals_finds_exactly_the_keys_in_the_interval(
            keys in prop::collection::btree_set(key(), 0..24),
            interval in any_interval(),
        ) {
            let intervals = path_intervals(&interval);
            prop_assert!(intervals.iter().all(|part| !part.is_empty()));
            let mut found = BTreeSet::new();
            for key in &keys {
                let path = key_to_path(key).map_err(|error| TestCaseError::fail(error.to_string()))?;
                if intervals.iter().any(|part| part.contains(path.as_bytes())) {
                    found.insert(key.clone());
                }
            }
            let inside: BTreeSet<_> = keys.iter().filter(|key| interval.contains(key)).cloned().collect();
            prop_assert_eq!(found, inside);
        }

        /// etcd's prefix range holds exactly the keys starting with the prefix; its single-key
        /// range names the key.
        #[test]
        fn etcd_prefix_ranges_hold_exactly_the_keys_with_the_prefix(prefix in key(), key in key()) {
            prop_assert_eq!(etcd_range(&key, b""), RangeSpec::Single(key.clone()));
            let RangeSpec::Interval(range) = etcd_range(&prefix, &prefix_end(&prefix)) else {
                return Err(TestCaseError::fail("a prefix range is an interval"));
            };
            prop_assert_eq!(range.contains(&key), key.starts_with(&prefix));
        }
    }
}
