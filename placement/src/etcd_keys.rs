//! Which paths are etcd keys' own, the escape of the others, and which grant covers an
//! escaped key: the part of the etcd key mapping (`warden_router::etcd::keys` holds the rest,
//! with the whole contract) that the access check needs as much as the router.
//!
//! A **plain key** is its own path: valid UTF-8 that passes [`validate_path`], not the root,
//! neither at or below `/warden` nor at or below `/_etcd`. **Every other key** is the one
//! segment `/_etcd/` + escape(key), with a per-byte, prefix-free, order-preserving code:
//! bytes `0x30..=0x7d` stay; bytes `0x00..=0x2f` become `!` and two lowercase hex digits;
//! bytes `0x7e..=0xff` become `~` and two lowercase hex digits. So a key's `/` is `!2f`.
//!
//! **A grant covers the escaped keys of its prefix** ([`escaped_grant_path`]): etcd's
//! permission `--prefix P/` is the grant at the path `P`, and the keys starting with `P/`
//! that are not plain (`P/` itself, `P//x`, `P/x/`) are escaped under `/_etcd`, out of the
//! grant's subtree. The paths under `/_etcd` whose segment starts with escape(`P/`) are
//! judged as if at `P`, so a role granted a prefix reads, writes and deletes all of it.

use crate::paths::{is_at_or_below, validate_path};

/// The subtree of the paths of keys that are not plain: one escaped segment below it each.
pub const ESCAPED_PREFIX: &str = "/_etcd";

/// Warden's reserved subtree (the namespace refuses client writes there): keys at or below
/// it are escaped like any other key that cannot be its own path.
pub const RESERVED_PREFIX: &str = "/warden";

/// A key's `/`, escaped.
const ESCAPED_SLASH: &str = "!2f";

/// `key` as a path if it is a plain key.
pub fn plain_key_path(key: &[u8]) -> Option<&str> {
    let path = std::str::from_utf8(key).ok()?;
    let plain = validate_path(path).is_ok() && path != "/" && !is_at_or_below(path, RESERVED_PREFIX) && !is_at_or_below(path, ESCAPED_PREFIX);
    plain.then_some(path)
}

/// `/_etcd/` + escape(`key`), whatever its length.
pub fn escaped_path(key: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut path = String::with_capacity(ESCAPED_PREFIX.len() + 1 + 3 * key.len());
    path.push_str(ESCAPED_PREFIX);
    path.push('/');
    for &byte in key {
        let marker = match byte {
            0x30..=0x7d => {
                path.push(char::from(byte));
                continue;
            }
            0x00..=0x2f => '!',
            0x7e..=0xff => '~',
        };
        path.push(marker);
        path.push(char::from(HEX[usize::from(byte >> 4)]));
        path.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    path
}

/// The bytes `segment` is the escape of, if it is a valid escape (`!` only before the hex
/// of a byte `0x00..=0x2f`, `~` only before that of a byte `0x7e..=0xff`).
pub fn unescape(segment: &[u8]) -> Option<Vec<u8>> {
    let mut bytes = segment.iter().copied();
    let mut key = Vec::with_capacity(segment.len());
    while let Some(byte) = bytes.next() {
        key.push(match byte {
            0x30..=0x7d => byte,
            b'!' | b'~' => {
                let value = (hex_digit(bytes.next()?)? << 4) | hex_digit(bytes.next()?)?;
                // Only the byte classes escape encodes: anything else would be a second
                // spelling of some key.
                let escaped = if byte == b'!' { value <= 0x2f } else { value >= 0x7e };
                escaped.then_some(value)?
            }
            _ => return None,
        });
    }
    Some(key)
}

/// The value of a lowercase hex digit.
fn hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// The plain path `P` whose grants also hold for every byte string in `[from, to)`, when
/// each of them is under `/_etcd/` and starts with `/_etcd/` + escape(`P/`) (the escaped
/// keys of etcd's prefix `P/`, and nodes a native client named like them); the deepest such
/// `P`. `None` when the interval is empty, unbounded (`to` empty), or holds anything else.
/// A call on one path and its subtree passes `path` and `subtree_end(path)`.
pub fn escaped_grant_path(from: &[u8], to: &[u8]) -> Option<String> {
    if to.is_empty() || to <= from {
        return None;
    }
    // The longest prefix of `from` every byte string up to `to` starts with: its end (the
    // prefix with its last byte incremented) must be at or past `to`.
    let shared = (0..=from.len()).rev().map(|len| &from[..len]).find(|prefix| prefix_covers(prefix, to))?;
    let segment = shared.strip_prefix(format!("{ESCAPED_PREFIX}/").as_bytes())?;
    // Each `!2f` in the segment may end the escape of `P/`: the deepest plain `P` wins.
    (0..segment.len()).rev().filter(|&at| segment[at..].starts_with(ESCAPED_SLASH.as_bytes())).find_map(|at| {
        let key = unescape(&segment[..at])?;
        plain_key_path(&key).map(str::to_string)
    })
}

/// Whether every byte string from `prefix` (included) up to `to` (excluded) starts with
/// `prefix`: `to` is at most the first string after them all.
fn prefix_covers(prefix: &[u8], to: &[u8]) -> bool {
    match prefix.iter().rposition(|&byte| byte < 0xff) {
        Some(last) => {
            let mut end = prefix[..last].to_vec();
            end.push(prefix[last] + 1);
            to <= end.as_slice()
        }
        // All 0xff bytes (or empty): every later string starts with it only if it is empty.
        None => prefix.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::subtree_end;

    fn covered(from: &str, to: &str) -> Option<String> {
        escaped_grant_path(from.as_bytes(), to.as_bytes())
    }

    fn at(path: &str) -> Option<String> {
        escaped_grant_path(path.as_bytes(), subtree_end(path).as_bytes())
    }

    #[test]
    fn an_escaped_key_under_a_plain_prefix_is_judged_at_the_prefix() {
        assert_eq!(at(&escaped_path(b"/alice/")), Some("/alice".into()), "the prefix's own key");
        assert_eq!(at(&escaped_path(b"/alice//x")), Some("/alice".into()));
        assert_eq!(at(&escaped_path(b"/alice/x/")), Some("/alice/x".into()), "the deepest plain prefix");
        assert_eq!(at(&escaped_path(b"/a/b/./c")), Some("/a/b".into()));
        assert_eq!(at(&escaped_path(b"/alice/\xff")), Some("/alice".into()));
    }

    #[test]
    fn keys_without_a_plain_prefix_have_no_grant_path_but_their_own() {
        for key in [&b"foo"[..], b"/alice", b"/", b"//x", b"/warden/x", b"/_etcd/x", b"/./x"] {
            assert_eq!(at(&escaped_path(key)), None, "{key:?}");
        }
        for path in ["/_etcd", "/_etcd/", "/alice", "/_etcdx/!2fa!2f", "/_etcd/!2fa!2", "/_etcd/!2Fa!2f"] {
            assert_eq!(at(path), None, "{path}");
        }
        assert_eq!(at("/_etcd/!2fa!2g!2fb"), None, "not a valid escape before the slash");
    }

    #[test]
    fn an_interval_is_covered_only_when_it_stays_within_the_prefix() {
        let prefix = escaped_path(b"/alice/");
        let end = format!("{}!2g", escaped_path(b"/alice"));
        assert_eq!(covered(&prefix, &end), Some("/alice".into()), "the escaped keys of the prefix, tightened");
        assert_eq!(covered(&prefix, &escaped_path(b"/alice0")), None, "reaches past the prefix's escapes");
        assert_eq!(covered(&escaped_path(b"/alice/a"), &escaped_path(b"/alice/b")), Some("/alice".into()));
        assert_eq!(covered(&prefix, ""), None, "unbounded");
        assert_eq!(covered(&end, &prefix), None, "empty");
        assert_eq!(covered("/_etcd/", "/_etcd0"), None, "every escaped key");
    }
}
