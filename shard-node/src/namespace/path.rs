//! Path validation (DESIGN.md "Data model"): absolute, `/`-separated UTF-8, no empty
//! segment, no `.` or `..`, no trailing `/` except the root, no control characters, bounded
//! length and depth.

/// Longest path accepted, in bytes.
pub const PATH_BYTES_MAX: usize = 1024;
/// Deepest path accepted, in segments.
pub const PATH_DEPTH_MAX: usize = 64;
/// Prefix reserved for the system.
pub const RESERVED_PREFIX: &str = "/warden";

/// Why a path is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Empty string.
    #[error("path is empty")]
    Empty,
    /// Does not start with `/`.
    #[error("path must be absolute")]
    NotAbsolute,
    /// Ends with `/` (and is not the root).
    #[error("path must not end with '/'")]
    TrailingSlash,
    /// Has `//`.
    #[error("path has an empty segment")]
    EmptySegment,
    /// Has a `.` or `..` segment.
    #[error("path has a relative segment '{0}'")]
    Relative(String),
    /// Has a control character (including NUL).
    #[error("path has a control character")]
    ControlCharacter,
    /// Longer than [`PATH_BYTES_MAX`].
    #[error("path is {0} bytes, limit {PATH_BYTES_MAX}")]
    TooLong(usize),
    /// Deeper than [`PATH_DEPTH_MAX`].
    #[error("path has {0} segments, limit {PATH_DEPTH_MAX}")]
    TooDeep(usize),
    /// Under `/warden`, which is the system's.
    #[error("paths under {RESERVED_PREFIX} are reserved")]
    Reserved,
}

/// Checks `path`; `allow_reserved` lets the system itself write under `/warden`.
pub fn validate(path: &str, allow_reserved: bool) -> Result<(), PathError> {
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
    if !allow_reserved && (path == RESERVED_PREFIX || path.starts_with("/warden/")) {
        return Err(PathError::Reserved);
    }
    Ok(())
}

/// The parent of a valid non-root path.
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

/// The last segment of a valid non-root path.
pub fn name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

/// `parent` joined with child `name`.
pub fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_cases() {
        let cases: &[(&str, Result<(), PathError>)] = &[
            ("/", Ok(())),
            ("/a", Ok(())),
            ("/a/b-c_d.e/ünïcode", Ok(())),
            ("", Err(PathError::Empty)),
            ("a/b", Err(PathError::NotAbsolute)),
            ("/a/", Err(PathError::TrailingSlash)),
            ("/a//b", Err(PathError::EmptySegment)),
            ("/a/./b", Err(PathError::Relative(".".into()))),
            ("/a/..", Err(PathError::Relative("..".into()))),
            ("/a\0b", Err(PathError::ControlCharacter)),
            ("/a\nb", Err(PathError::ControlCharacter)),
            ("/warden", Err(PathError::Reserved)),
            ("/warden/sessions", Err(PathError::Reserved)),
            ("/wardens", Ok(())),
        ];
        for (path, expected) in cases {
            assert_eq!(&validate(path, false), expected, "path {path:?}");
        }
        assert_eq!(validate("/warden/x", true), Ok(()));
        let deep = "/a".repeat(PATH_DEPTH_MAX + 1);
        assert_eq!(validate(&deep, false), Err(PathError::TooDeep(PATH_DEPTH_MAX + 1)));
        assert_eq!(validate(&"/a".repeat(PATH_DEPTH_MAX), false), Ok(()));
        let long = format!("/{}", "x".repeat(PATH_BYTES_MAX));
        assert_eq!(validate(&long, false), Err(PathError::TooLong(PATH_BYTES_MAX + 1)));
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
