//! Path prefixes: the validator for group prefixes and the segment-wise "at or below" relation
//! that routing, descriptors and [`crate::serves`] all share.
//!
//! A prefix follows the namespace's path rules (DESIGN.md "Data model"): absolute,
//! `/`-separated, no empty segment, no `.` or `..`, no trailing `/`, no control character,
//! bounded bytes and depth. The root `/` is always group 1's, so it is never a new prefix.

use serde::{Deserialize, Serialize};

/// Longest prefix accepted, in bytes (the namespace's path limit).
pub const PREFIX_BYTES_MAX: usize = 1024;
/// Deepest prefix accepted, in segments (the namespace's path limit: a deeper prefix could
/// own no path).
pub const PREFIX_DEPTH_MAX: usize = 64;

/// Why a prefix is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PrefixError {
    /// Empty string.
    #[error("prefix is empty")]
    Empty,
    /// Does not start with `/`.
    #[error("prefix must be absolute")]
    NotAbsolute,
    /// Is `/`, which always belongs to the first group.
    #[error("the root is always the first group's")]
    Root,
    /// Ends with `/`.
    #[error("prefix must not end with '/'")]
    TrailingSlash,
    /// Has `//`.
    #[error("prefix has an empty segment")]
    EmptySegment,
    /// Has a `.` or `..` segment.
    #[error("prefix has a relative segment '{0}'")]
    Relative(String),
    /// Has a control character (including NUL).
    #[error("prefix has a control character")]
    ControlCharacter,
    /// Longer than [`PREFIX_BYTES_MAX`].
    #[error("prefix is {0} bytes, limit {PREFIX_BYTES_MAX}")]
    TooLong(usize),
    /// Deeper than [`PREFIX_DEPTH_MAX`].
    #[error("prefix has {0} segments, limit {PREFIX_DEPTH_MAX}")]
    TooDeep(usize),
}

/// Checks that `prefix` may name a new group's subtree.
pub fn validate_prefix(prefix: &str) -> Result<(), PrefixError> {
    if prefix.is_empty() {
        return Err(PrefixError::Empty);
    }
    if prefix.len() > PREFIX_BYTES_MAX {
        return Err(PrefixError::TooLong(prefix.len()));
    }
    if !prefix.starts_with('/') {
        return Err(PrefixError::NotAbsolute);
    }
    if prefix == "/" {
        return Err(PrefixError::Root);
    }
    if prefix.chars().any(char::is_control) {
        return Err(PrefixError::ControlCharacter);
    }
    if prefix.ends_with('/') {
        return Err(PrefixError::TrailingSlash);
    }
    let mut depth = 0;
    for segment in prefix[1..].split('/') {
        depth += 1;
        match segment {
            "" => return Err(PrefixError::EmptySegment),
            "." | ".." => return Err(PrefixError::Relative(segment.to_string())),
            _ => {}
        }
    }
    if depth > PREFIX_DEPTH_MAX {
        return Err(PrefixError::TooDeep(depth));
    }
    Ok(())
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

/// The path one segment up: `/a/b` → `/a`, `/a` → `/`, `/` → none. Cuts at the last `/`,
/// so walking parents from any string visits exactly the prefixes it is at or below.
pub(crate) fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(index) => Some(&path[..index]),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_cases() {
        let cases: &[(&str, Result<(), PrefixError>)] = &[
            ("/a", Ok(())),
            ("/a/b-c_d.e/ünïcode", Ok(())),
            ("/warden/sessions", Ok(())),
            ("", Err(PrefixError::Empty)),
            ("/", Err(PrefixError::Root)),
            ("a/b", Err(PrefixError::NotAbsolute)),
            ("/a/", Err(PrefixError::TrailingSlash)),
            ("/a//b", Err(PrefixError::EmptySegment)),
            ("/a/./b", Err(PrefixError::Relative(".".into()))),
            ("/a/..", Err(PrefixError::Relative("..".into()))),
            ("/a\0b", Err(PrefixError::ControlCharacter)),
            ("/a\nb", Err(PrefixError::ControlCharacter)),
        ];
        for (prefix, expected) in cases {
            assert_eq!(&validate_prefix(prefix), expected, "prefix {prefix:?}");
        }
        assert_eq!(validate_prefix(&"/a".repeat(PREFIX_DEPTH_MAX)), Ok(()));
        let deep = "/a".repeat(PREFIX_DEPTH_MAX + 1);
        assert_eq!(validate_prefix(&deep), Err(PrefixError::TooDeep(PREFIX_DEPTH_MAX + 1)));
        let longest = format!("/{}", "x".repeat(PREFIX_BYTES_MAX - 1));
        assert_eq!(validate_prefix(&longest), Ok(()));
        let long = format!("/{}", "x".repeat(PREFIX_BYTES_MAX));
        assert_eq!(validate_prefix(&long), Err(PrefixError::TooLong(PREFIX_BYTES_MAX + 1)));
    }

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
    fn parents() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a//b"), Some("/a/"));
        assert_eq!(parent("a"), None);
        assert_eq!(parent(""), None);
    }
}
