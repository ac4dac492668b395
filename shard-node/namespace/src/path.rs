//! Path validation (DESIGN.md "Data model"): the shape rules (absolute, `/`-separated UTF-8,
//! no empty segment, no `.` or `..`, no trailing `/` except the root, no control characters,
//! bounded length and depth) are placement's, shared with group prefixes; the namespace adds
//! its reserved subtree.

pub use warden_placement::{is_at_or_below, join, name, parent, subtree_end, PATH_BYTES_MAX, PATH_DEPTH_MAX};

/// Prefix reserved for the system.
pub const RESERVED_PREFIX: &str = "/warden";

/// Why a path is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not a well-formed path (the rules placement's prefixes share).
    #[error(transparent)]
    Shape(warden_placement::PathError),
    /// Under the system's reserved subtree.
    #[error("paths under {RESERVED_PREFIX} are reserved")]
    Reserved,
}

/// Checks `path`; `allow_reserved` lets the system itself write under `/warden`.
pub fn validate(path: &str, allow_reserved: bool) -> Result<(), PathError> {
    warden_placement::validate_path(path).map_err(PathError::Shape)?;
    if !allow_reserved && (path == RESERVED_PREFIX || path.starts_with("/warden/")) {
        return Err(PathError::Reserved);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape rules are placement's (tested there); the namespace adds the reserved subtree.
    #[test]
    fn validation_cases() {
        let cases: &[(&str, Result<(), PathError>)] = &[
            ("/", Ok(())),
            ("/a/b-c_d.e/ünïcode", Ok(())),
            ("a/b", Err(PathError::Shape(warden_placement::PathError::NotAbsolute))),
            ("/a//b", Err(PathError::Shape(warden_placement::PathError::EmptySegment))),
            ("/warden", Err(PathError::Reserved)),
            ("/warden/sessions", Err(PathError::Reserved)),
            ("/wardens", Ok(())),
        ];
        for (path, expected) in cases {
            assert_eq!(&validate(path, false), expected, "path {path:?}");
        }
        assert_eq!(validate("/warden/x", true), Ok(()));
    }

    #[test]
    fn parent_name_join() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(name("/a/b"), "b");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }
}
