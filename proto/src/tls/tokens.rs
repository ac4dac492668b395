//! Bearer tokens: a client without a certificate of its own names its principal
//! with a token, sent as `authorization: Bearer TOKEN` over a TLS connection (server
//! verified). The server keeps a token file of `NAME SHA256-HEX` lines (the SHA-256 of each
//! token, never the token), read again when it changes (checked at most once a second), so
//! tokens are added and revoked without a restart. A token names nobody unless a line has
//! its hash; lines that do not parse are skipped with a warning.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::{stamp, Stamp, TlsError, RELOAD_CHECK_INTERVAL};

/// The metadata key a token travels in.
pub const AUTHORIZATION_HEADER: &str = "authorization";
/// Longest token accepted, in bytes.
pub const TOKEN_BYTES_MAX: usize = 512;
/// Lines of a token file read at most.
pub const TOKENS_MAX: usize = 100_000;

/// SHA-256 of a token → the principal it names.
type Table = HashMap<[u8; 32], String>;

/// A token file and what it last said.
pub struct Tokens {
    path: PathBuf,
    /// Hash → principal, the file's stamp when read, and when it was last checked.
    current: Mutex<(Arc<Table>, Stamp, Instant)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("path", &self.path).finish()
    }
}

impl Tokens {
    /// Reads the token file at `path`.
    pub fn load(path: &Path) -> Result<Arc<Tokens>, TlsError> {
        let (table, stamp) = read_table(path)?;
        Ok(Arc::new(Tokens { path: path.to_path_buf(), current: Mutex::new((Arc::new(table), stamp, Instant::now())) }))
    }

    /// The principal `token` names, if any (the file read again first if it changed).
    pub fn principal(&self, token: &str) -> Option<String> {
        if token.is_empty() || token.len() > TOKEN_BYTES_MAX {
            return None;
        }
        let table = {
            let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
            if current.2.elapsed() >= RELOAD_CHECK_INTERVAL {
                current.2 = Instant::now();
                if stamp(&self.path) != current.1 {
                    match read_table(&self.path) {
                        Ok((table, stamp)) => (current.0, current.1) = (Arc::new(table), stamp),
                        Err(error) => tracing::warn!(%error, "the token file changed but does not read; keeping the previous tokens"),
                    }
                }
            }
            current.0.clone()
        };
        table.get(&hash(token)).cloned()
    }

    /// The principal the `authorization: Bearer TOKEN` metadata of a request names.
    pub fn principal_of(&self, metadata: &tonic::metadata::MetadataMap) -> Option<String> {
        let value = metadata.get(AUTHORIZATION_HEADER)?.to_str().ok()?;
        self.principal(value.strip_prefix("Bearer ")?.trim())
    }
}

/// The `authorization` metadata value carrying `token` (`Bearer TOKEN`); `None` when the
/// token is not printable ASCII.
pub fn bearer(token: &str) -> Option<tonic::metadata::AsciiMetadataValue> {
    format!("Bearer {token}").parse().ok()
}

/// Adds the `authorization` value `bearer` (see [`bearer`]), if any, to `request`.
pub fn authorize<T>(request: &mut tonic::Request<T>, bearer: Option<&tonic::metadata::AsciiMetadataValue>) {
    if let Some(value) = bearer {
        request.metadata_mut().insert(AUTHORIZATION_HEADER, value.clone());
    }
}

/// A new random token (32 bytes, hex).
pub fn generate() -> Result<String, TlsError> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| TlsError::Config("no randomness for a token".into()))?;
    Ok(hex(&bytes))
}

/// The token file line naming `principal` by `token`.
pub fn line(principal: &str, token: &str) -> String {
    format!("{principal} {}", hex(&hash(token)))
}

fn hash(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The file's lines as hash → principal, with its stamp (taken first: a change while it is
/// read makes the next check read it again).
fn read_table(path: &Path) -> Result<(Table, Stamp), TlsError> {
    let stamp = stamp(path);
    let text = std::fs::read_to_string(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })?;
    let mut table = HashMap::new();
    for (number, line) in text.lines().enumerate().take(TOKENS_MAX) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next().and_then(unhex), words.next()) {
            (Some(name), Some(hash), None) if !name.is_empty() => {
                table.insert(hash, name.to_string());
            }
            _ => tracing::warn!(path = %path.display(), line = number + 1, "a token file line is not `NAME SHA256-HEX`; skipped"),
        }
    }
    Ok((table, stamp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_line_and_a_changed_file_is_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens");
        let (alice, bob) = (generate().expect("token"), generate().expect("token"));
        std::fs::write(&path, format!("# comment\n{}\nnot a line\n", line("alice", &alice))).expect("write");
        let tokens = Tokens::load(&path).expect("load");
        assert_eq!(tokens.principal(&alice).as_deref(), Some("alice"));
        assert_eq!(tokens.principal(&bob), None, "a token without a line names nobody");
        assert_eq!(tokens.principal(""), None);
        assert_eq!(tokens.principal(&"x".repeat(TOKEN_BYTES_MAX + 1)), None);
        std::fs::write(&path, format!("{}\n", line("bob", &bob))).expect("rewrite");
        tokens.current.lock().expect("lock").2 -= RELOAD_CHECK_INTERVAL;
        assert_eq!(tokens.principal(&bob).as_deref(), Some("bob"));
        assert_eq!(tokens.principal(&alice), None, "a removed line revokes its token");
    }
}
