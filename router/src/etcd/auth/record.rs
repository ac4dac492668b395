//! What the etcd `Auth` service keeps and how it judges it, without I/O: the record of users
//! (password hashes), roles (key permissions) and the enabled flag that placement keeps
//! opaque ([`warden_placement::etcd_auth`]); password hashing; the tokens `Authenticate`
//! hands out; and how an etcd permission maps onto a Warden grant.
//!
//! - A user `NAME` is the Warden principal `etcd:NAME`; a role `ROLE` is the ACL group
//!   `etcd:ROLE`, whose members are its users' principals and whose grants are the role's
//!   permissions (`group:etcd:ROLE`). The role `root` holds `admin` on `/`.
//! - Passwords are kept as PBKDF2-HMAC-SHA256 hashes with a random salt (ring).
//! - A token is `NAME.EXPIRY.GENERATION.MAC`: the MAC (HMAC-SHA256 under the record's secret)
//!   covers the rest; the generation is the user's at `Authenticate`, so a password change or
//!   a deletion ends the user's tokens, and `AuthDisable` draws a new secret, ending all.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;

use ring::{hmac, pbkdf2};
use serde::{Deserialize, Serialize};
use warden_placement::acl;
use warden_proto::etcd::authpb::permission::Type as PermissionType;

use crate::etcd::keys::{key_to_path, prefix_end};

/// Users kept at most (each adds a principal to the ACL's groups; the record travels whole
/// in every read of it and must stay within placement's `ETCD_AUTH_BYTES_MAX`).
pub const USERS_MAX: usize = 1_000;
/// Roles kept at most (each is an ACL group).
pub const ROLES_MAX: usize = 1_000;
/// Permissions of one role at most (each is an ACL grant).
pub const PERMISSIONS_PER_ROLE_MAX: usize = 100;
/// Roles one user holds at most.
pub const ROLES_PER_USER_MAX: usize = 100;
/// Longest password, in bytes (hashing cost grows with it).
pub const PASSWORD_BYTES_MAX: usize = 1_024;
/// How long a token is accepted after `Authenticate` (etcd's default simple-token TTL is
/// 5 minutes, renewed on use; clients authenticate again when refused).
pub const TOKEN_TTL_S: u64 = 3_600;
/// PBKDF2 rounds of a password hash: about 50 ms of one core, per `Authenticate`.
const HASH_ROUNDS: u32 = 100_000;
/// How a user's principal starts.
pub const PRINCIPAL_MARK: &str = "etcd:";
/// etcd's all-powerful role and user.
pub const ROOT: &str = "root";

/// The record: every router reads the same one from placement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthRecord {
    /// Whether tokens are honoured (`AuthEnable`).
    pub enabled: bool,
    /// The tokens' HMAC key (hex); drawn anew by `AuthDisable`.
    pub secret: String,
    /// The next user generation handed out (a new user or password takes one).
    pub next_generation: u64,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// Roles by name.
    pub roles: BTreeMap<String, Role>,
}

/// One user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// `pbkdf2-sha256$ROUNDS$SALT$HASH` (hex), or empty: no password (no `Authenticate`).
    pub hash: String,
    /// Its generation: tokens name it, and a new password changes it.
    pub generation: u64,
    /// The roles it holds.
    pub roles: BTreeSet<String>,
}

/// One role: its key permissions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Role {
    /// `(key, range_end)` → etcd's permission type (`authpb.Permission.Type`).
    pub permissions: BTreeMap<(Vec<u8>, Vec<u8>), i32>,
}

/// Why a record cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("the etcd auth record does not decode: {0}")]
pub struct BadRecord(String);

impl AuthRecord {
    /// The record `encoded` (empty: never set).
    pub fn decode(encoded: &[u8]) -> Result<AuthRecord, BadRecord> {
        if encoded.is_empty() {
            return Ok(AuthRecord::default());
        }
        serde_json::from_slice(encoded).map_err(|error| BadRecord(error.to_string()))
    }

    /// Its encoding.
    pub fn encode(&self) -> Vec<u8> {
        // Only strings, numbers, lists and string-keyed maps: it always encodes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A new generation for a user.
    pub fn generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    /// The user a token names, if it is valid at `now_s` (seconds since the Unix epoch).
    pub fn verify(&self, token: &str, now_s: u64) -> Option<&str> {
        let secret = unhex(&self.secret)?;
        let (signed, mac) = token.rsplit_once('.')?;
        let mut fields = signed.rsplitn(3, '.');
        let (generation, expiry, name) = (fields.next()?, fields.next()?, fields.next()?);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &secret);
        hmac::verify(&key, signed.as_bytes(), &unhex(mac)?).ok()?;
        let (user_name, user) = self.users.get_key_value(name)?;
        let fresh = expiry.parse::<u64>().ok()? > now_s && generation.parse::<u64>().ok()? == user.generation;
        fresh.then_some(user_name.as_str())
    }

    /// A token for `name` (a user of this record), valid until `now_s` + [`TOKEN_TTL_S`].
    pub fn token(&self, name: &str, now_s: u64) -> Option<String> {
        let user = self.users.get(name)?;
        let signed = format!("{name}.{}.{}", now_s + TOKEN_TTL_S, user.generation);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &unhex(&self.secret)?);
        Some(format!("{signed}.{}", hex(hmac::sign(&key, signed.as_bytes()).as_ref())))
    }
}

// A role's permissions as a list in JSON (whose object keys are strings only).
impl Serialize for Role {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let list: Vec<(&Vec<u8>, &Vec<u8>, i32)> = self.permissions.iter().map(|((key, end), kind)| (key, end, *kind)).collect();
        list.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Role, D::Error> {
        let list = Vec::<(Vec<u8>, Vec<u8>, i32)>::deserialize(deserializer)?;
        Ok(Role { permissions: list.into_iter().map(|(key, end, kind)| ((key, end), kind)).collect() })
    }
}

/// The principal of user `name`.
pub fn principal(name: &str) -> String {
    format!("{PRINCIPAL_MARK}{name}")
}

/// The ACL group of role `name`.
pub fn group(name: &str) -> String {
    format!("{PRINCIPAL_MARK}{name}")
}

/// Whether `name` can name a user or a role: its principal or group must be a valid ACL name
/// (letters, digits and `-_.@:`, at most 128 bytes with the `etcd:` mark).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && acl::validate_name(&principal(name)).is_ok()
}

/// A new random secret (hex) for the tokens' MAC.
pub fn new_secret() -> Option<String> {
    random::<32>().map(|bytes| hex(&bytes))
}

/// The hash of `password` (slow on purpose: run it off the async threads).
pub fn hash_password(password: &str) -> Option<String> {
    let salt = random::<16>()?;
    let rounds = NonZeroU32::new(HASH_ROUNDS)?;
    let mut out = [0u8; 32];
    pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, rounds, &salt, password.as_bytes(), &mut out);
    Some(format!("pbkdf2-sha256${HASH_ROUNDS}${}${}", hex(&salt), hex(&out)))
}

/// Whether `password` is the one `hash` was made of (slow on purpose, constant-time compare).
pub fn password_matches(hash: &str, password: &str) -> bool {
    let mut parts = hash.split('$');
    let (Some("pbkdf2-sha256"), Some(rounds), Some(salt), Some(expected), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let (Some(rounds), Some(salt), Some(expected)) = (rounds.parse().ok().and_then(NonZeroU32::new), unhex(salt), unhex(expected)) else {
        return false;
    };
    pbkdf2::verify(pbkdf2::PBKDF2_HMAC_SHA256, rounds, &salt, password.as_bytes(), &expected).is_ok()
}

/// The Warden permission bits of an etcd permission type: reading is `read` and `watch`;
/// writing is `write` and `lock` (leases are sessions, keys with a lease are ephemerals, and
/// etcd's lock and election services write keys).
pub fn warden_bits(kind: i32) -> u32 {
    let read = acl::READ | acl::WATCH;
    let write = acl::WRITE | acl::LOCK;
    match PermissionType::try_from(kind) {
        Ok(PermissionType::Read) => read,
        Ok(PermissionType::Write) => write,
        Ok(PermissionType::Readwrite) | Err(_) => read | write,
    }
}

/// The Warden prefix an etcd permission on `[key, range_end)` is granted at, or why it
/// cannot be (Warden grants by path prefix):
///
/// - one key (empty `range_end`): its path (a plain key's grant holds for the paths below
///   it too);
/// - every key (`key` empty or `\0`, `range_end` `\0`), or the prefix `/`: `/`;
/// - the prefix `P/` of a plain key's path `P` (`--prefix /teams/a/`): `P`, which also holds
///   the key `P` itself (and not the keys `P/` or `P//x`, which live under `/_etcd`).
pub fn grant_prefix(key: &[u8], range_end: &[u8]) -> Result<String, String> {
    if range_end.is_empty() {
        return key_to_path(key).map_err(|error| error.to_string());
    }
    let everything = (key.is_empty() || key == [0]) && range_end == [0];
    if everything || (key == b"/" && range_end == prefix_end(b"/")) {
        return Ok("/".to_string());
    }
    if range_end == prefix_end(key) {
        if let Some(parent) = key.strip_suffix(b"/") {
            if let Ok(path) = key_to_path(parent) {
                if path.as_bytes() == parent {
                    return Ok(path);
                }
            }
        }
    }
    Err(format!(
        "the range [{}, {}) is neither one key nor a prefix ending in / of a path: Warden grants by path prefix (docs/etcd.md)",
        String::from_utf8_lossy(&key[..key.len().min(64)]),
        String::from_utf8_lossy(&range_end[..range_end.len().min(64)])
    ))
}

fn random<const N: usize>() -> Option<[u8; N]> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; N];
    ring::rand::SystemRandom::new().fill(&mut bytes).ok()?;
    Some(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 256 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_with(name: &str, password: &str) -> AuthRecord {
        let mut record = AuthRecord { enabled: true, secret: new_secret().expect("secret"), ..AuthRecord::default() };
        let generation = record.generation();
        record.users.insert(name.into(), User { hash: hash_password(password).expect("hash"), generation, roles: BTreeSet::new() });
        record
    }

    #[test]
    fn a_password_matches_only_its_own_hash() {
        let hash = hash_password("pw").expect("hash");
        assert!(password_matches(&hash, "pw"));
        assert!(!password_matches(&hash, "pW"));
        assert!(!password_matches("", "pw"), "a user without a password never matches");
    }

    #[test]
    fn a_token_names_its_user_until_it_expires_or_the_password_or_secret_changes() {
        let mut record = record_with("alice.b", "pw");
        let token = record.token("alice.b", 100).expect("token");
        assert_eq!(record.verify(&token, 100), Some("alice.b"), "a name with dots");
        assert_eq!(record.verify(&token, 100 + TOKEN_TTL_S), None, "expired");
        assert_eq!(record.verify(&token.replace("alice.b.", "alice.c."), 100), None, "another name, same MAC");
        let decoded = AuthRecord::decode(&record.encode()).expect("decodes");
        assert_eq!(decoded, record);
        let generation = record.generation();
        record.users.get_mut("alice.b").expect("user").generation = generation;
        assert_eq!(record.verify(&token, 100), None, "a new password ends the tokens");
        let token = record.token("alice.b", 100).expect("token");
        record.secret = new_secret().expect("secret");
        assert_eq!(record.verify(&token, 100), None, "a new secret ends every token");
    }

    #[test]
    fn a_permission_is_granted_at_a_path_prefix_or_refused() {
        assert_eq!(grant_prefix(b"/a/b", b"").as_deref(), Ok("/a/b"));
        assert_eq!(grant_prefix(b"/a/", &prefix_end(b"/a/")).as_deref(), Ok("/a"));
        assert_eq!(grant_prefix(b"/", &prefix_end(b"/")).as_deref(), Ok("/"));
        assert_eq!(grant_prefix(b"", b"\0").as_deref(), Ok("/"));
        assert!(grant_prefix(b"/a", &prefix_end(b"/a")).is_err(), "a prefix not ending in /");
        assert!(grant_prefix(b"/a/", b"/b").is_err(), "an interval");
        assert!(grant_prefix(b"cfg/", &prefix_end(b"cfg/")).is_err(), "not a path");
        assert!(grant_prefix(b"cfg", b"").expect("one escaped key").starts_with("/_etcd/"));
    }
}
