//! Path prefixes: the validator for paths and group prefixes. The segment-wise "at or below"
//! relation that routing, descriptors and [`crate::serves`] all share is `warden-paths`'s.
//!
//! A prefix follows the namespace's path rules (DESIGN.md "Data model"): absolute,
//! `/`-separated, no empty segment, no `.` or `..`, no trailing `/`, no control character,
//! bounded bytes and depth. The root `/` is always group 1's, so it is never a new prefix.

use serde::{Deserialize, Serialize};

/// The relations between paths (parent, join, "at or below") are `warden-paths`'s, shared
/// with the router, the shard-nodes and the client library.
pub use warden_paths::{is_at_or_below, is_strictly_below, join, name, parent, subtree_end};

/// Longest path, in bytes.
pub const PATH_BYTES_MAX: usize = 1024;
/// Deepest path, in segments.
pub const PATH_DEPTH_MAX: usize = 64;

/// Why a path has the wrong shape (DESIGN.md "Data model"; the namespace adds its reserved
/// subtree on top).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PathError {
    /// The empty string.
    #[error("path is empty")]
    Empty,
    /// Does not start with `/`.
    #[error("path must be absolute")]
    NotAbsolute,
    /// Ends with `/` (only the root may).
    #[error("path must not end with '/'")]
    TrailingSlash,
    /// Has `//`.
    #[error("path has an empty segment")]
    EmptySegment,
    /// Has a `.` or `..` segment.
    #[error("path has a relative segment '{0}'")]
    Relative(String),
    /// Has a control character.
    #[error("path has a control character")]
    ControlCharacter,
    /// Longer than [`PATH_BYTES_MAX`].
    #[error("path is {0} bytes, limit {PATH_BYTES_MAX}")]
    TooLong(usize),
    /// Deeper than [`PATH_DEPTH_MAX`].
    #[error("path has {0} segments, limit {PATH_DEPTH_MAX}")]
    TooDeep(usize),
}

/// Checks a path's shape: absolute, `/`-separated, no empty segment, no `.` or `..`, no
/// trailing `/` except the root `/`, no control character, bounded bytes and depth.
pub fn validate_path(path: &str) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.len() > PATH_BYTES_MAX {
        return Err(PathError::TooLong(path.len()));
    }
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if path.chars().any(char::is_control) {
        return Err(PathError::ControlCharacter);
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(PathError::TrailingSlash);
    }
    let mut depth = 0;
    for segment in path[1..].split('/') {
        depth += 1;
        match segment {
            "" => return Err(PathError::EmptySegment),
            "." | ".." => return Err(PathError::Relative(segment.to_string())),
            _ => {}
        }
    }
    if depth > PATH_DEPTH_MAX {
        return Err(PathError::TooDeep(depth));
    }
    Ok(())
}

/// Why a prefix is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PrefixError {
    /// `/` is always the root group's.
    #[error("the root is always the first group's")]
    Root,
    /// Not a valid path.
    #[error(transparent)]
    Path(#[from] PathError),
}

/// Checks that `prefix` may name a new group's subtree: a valid path other than the root.
pub fn validate_prefix(prefix: &str) -> Result<(), PrefixError> {
    validate_path(prefix)?;
    if prefix == "/" {
        return Err(PrefixError::Root);
    }
    Ok(())
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
            ("", Err(PrefixError::Path(PathError::Empty))),
            ("/", Err(PrefixError::Root)),
            ("a/b", Err(PrefixError::Path(PathError::NotAbsolute))),
            ("/a/", Err(PrefixError::Path(PathError::TrailingSlash))),
            ("/a//b", Err(PrefixError::Path(PathError::EmptySegment))),
            ("/a/./b", Err(PrefixError::Path(PathError::Relative(".".into())))),
            ("/a/..", Err(PrefixError::Path(PathError::Relative("..".into())))),
            ("/a\0b", Err(PrefixError::Path(PathError::ControlCharacter))),
            ("/a\nb", Err(PrefixError::Path(PathError::ControlCharacter))),
        ];
        for (prefix, expected) in cases {
            assert_eq!(&validate_prefix(prefix), expected, "prefix {prefix:?}");
        }
        assert_eq!(validate_prefix(&"/a".repeat(PATH_DEPTH_MAX)), Ok(()));
        let deep = "/a".repeat(PATH_DEPTH_MAX + 1);
        assert_eq!(validate_prefix(&deep), Err(PrefixError::Path(PathError::TooDeep(PATH_DEPTH_MAX + 1))));
        let longest = format!("/{}", "x".repeat(PATH_BYTES_MAX - 1));
        assert_eq!(validate_prefix(&longest), Ok(()));
        let long = format!("/{}", "x".repeat(PATH_BYTES_MAX));
        assert_eq!(validate_prefix(&long), Err(PrefixError::Path(PathError::TooLong(PATH_BYTES_MAX + 1))));
    }
}
