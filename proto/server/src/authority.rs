//! A small certificate authority for a small deployment, `warden dev --secure` and tests:
//! makes a CA, and certificates for nodes, routers and clients that name their
//! [`Identity`] (rcgen). A larger deployment uses its own PKI; Warden only needs the
//! `warden://ROLE/NAME` URI in each certificate.
//!
//! Files in a directory: `ca.pem`, `ca.key` (the CA's key: keep it away from the nodes),
//! and `ROLE-NAME.pem` / `ROLE-NAME.key` per holder.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};

use warden_proto::tls::{Identity, TlsError, TlsFiles};

/// A CA: its certificate and its signing key.
pub struct Authority {
    certificate_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// The hosts every certificate [`Authority::issue_files`] makes names: loopback's, by name
/// and by address, so a standard TLS client connecting to `localhost:PORT`,
/// `127.0.0.1:PORT` or `[::1]:PORT` verifies the name it asked for.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

fn failed(error: rcgen::Error) -> TlsError {
    TlsError::Config(format!("certificate: {error}"))
}

/// Writes `contents` to `path` in one step: into a new file beside it (with the permission
/// bits `mode`), synced, then renamed over `path`. A reader, or a restart after a crash,
/// finds the old file or the new one, never a part of one (a certificate, key or token
/// file read half-written would refuse every connection).
pub fn write_atomically(path: &Path, contents: &str, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(contents.as_bytes())?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|persist| persist.error)?;
    Ok(())
}

/// Writes `contents` to `path` (a certificate: anyone may read it), in one step.
fn write(path: &Path, contents: &str) -> Result<(), TlsError> {
    write_atomically(path, contents, 0o644).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

/// Writes `contents` to `path` readable by its owner only (a private key), in one step.
fn write_private(path: &Path, contents: &str) -> Result<(), TlsError> {
    write_atomically(path, contents, 0o600).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

fn read(path: &Path) -> Result<String, TlsError> {
    std::fs::read_to_string(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

impl Authority {
    /// A new CA named `name` (its certificate's common name).
    pub fn create(name: &str) -> Result<Authority, TlsError> {
        let key = KeyPair::generate().map_err(failed)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let certificate = params.self_signed(&key).map_err(failed)?;
        Ok(Authority { certificate_pem: certificate.pem(), issuer: Issuer::new(params, key) })
    }

    /// The CA kept in `dir` (`ca.pem`, `ca.key`).
    pub fn load(dir: &Path) -> Result<Authority, TlsError> {
        let certificate_pem = read(&dir.join("ca.pem"))?;
        let key = KeyPair::from_pem(&read(&dir.join("ca.key"))?).map_err(failed)?;
        let issuer = Issuer::from_ca_cert_pem(&certificate_pem, key).map_err(failed)?;
        Ok(Authority { certificate_pem, issuer })
    }

    /// The CA in `dir`, made there first if `dir` has none.
    pub fn load_or_create(dir: &Path, name: &str) -> Result<Authority, TlsError> {
        if dir.join("ca.pem").exists() {
            return Authority::load(dir);
        }
        let authority = Authority::create(name)?;
        authority.save(dir)?;
        Ok(authority)
    }

    /// Writes `ca.pem` and `ca.key` into `dir` (made if missing).
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Read { path: dir.to_path_buf(), source })?;
        write(&dir.join("ca.pem"), &self.certificate_pem)?;
        write_private(&dir.join("ca.key"), &self.issuer.key().serialize_pem())
    }

    /// The CA's certificate (PEM).
    pub fn certificate_pem(&self) -> &str {
        &self.certificate_pem
    }

    /// A certificate (PEM) and its new key (PEM) for `identity`, usable to serve and to
    /// connect (a node is both), with `hosts` beside the identity for clients that check
    /// the name they connect to (each a DNS name, or an IP address: an IP address entry).
    /// Warden's own processes verify the identity, not the name.
    pub fn issue(&self, identity: &Identity, hosts: &[String]) -> Result<(String, String), TlsError> {
        if !identity.is_valid() {
            return Err(TlsError::Identity(format!("{identity} cannot be named in a certificate")));
        }
        let key = KeyPair::generate().map_err(failed)?;
        let mut params = CertificateParams::new(hosts.to_vec()).map_err(failed)?;
        params.distinguished_name.push(DnType::CommonName, identity.uri());
        let uri = rcgen::string::Ia5String::try_from(identity.uri()).map_err(failed)?;
        params.subject_alt_names.push(SanType::URI(uri));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let certificate = params.signed_by(&key, &self.issuer).map_err(failed)?;
        Ok((certificate.pem(), key.serialize_pem()))
    }

    /// Issues a certificate for `identity` into `dir` (`ROLE-NAME.pem`, `ROLE-NAME.key`,
    /// beside `ca.pem`) naming loopback's hosts ([`LOOPBACK_HOSTS`]), and returns the files a
    /// process started as `identity` uses.
    pub fn issue_files(&self, dir: &Path, identity: &Identity) -> Result<TlsFiles, TlsError> {
        self.issue_files_for(dir, identity, &[])
    }

    /// [`Authority::issue_files`] naming `hosts` (DNS names or IP addresses the holder is
    /// reached at) beside loopback's.
    pub fn issue_files_for(&self, dir: &Path, identity: &Identity, hosts: &[String]) -> Result<TlsFiles, TlsError> {
        let mut names: Vec<String> = LOOPBACK_HOSTS.iter().map(|host| host.to_string()).collect();
        for host in hosts {
            if !names.contains(host) {
                names.push(host.clone());
            }
        }
        let (certificate, key) = self.issue(identity, &names)?;
        let files = Authority::files(dir, identity);
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Read { path: dir.to_path_buf(), source })?;
        write(&files.ca, &self.certificate_pem)?;
        // Key first, then the certificate: a process reloading in between sees a pair that
        // does not match, refuses it and keeps its previous one until the next check.
        write_private(&files.key, &key)?;
        write(&files.cert, &certificate)?;
        Ok(files)
    }

    /// Where [`Authority::issue_files`] puts `identity`'s files in `dir`.
    pub fn files(dir: &Path, identity: &Identity) -> TlsFiles {
        let stem = format!("{}-{}", identity.role.as_str(), identity.name);
        TlsFiles { ca: dir.join("ca.pem"), cert: dir.join(format!("{stem}.pem")), key: dir.join(format!("{stem}.key")) }
    }
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_written_atomically_is_whole_with_its_mode_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("root.token");
        write_atomically(&path, "first", 0o600).expect("written");
        write_atomically(&path, "second, longer", 0o600).expect("written over");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "second, longer");
        assert_eq!(std::fs::metadata(&path).expect("metadata").permissions().mode() & 0o777, 0o600, "a secret stays private");
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("list").map(|entry| entry.expect("entry").file_name()).collect();
        assert_eq!(names, ["root.token"], "no temporary file is left");
        write_atomically(&dir.path().join("ca.pem"), "certificate", 0o644).expect("written");
        assert_eq!(std::fs::metadata(dir.path().join("ca.pem")).expect("metadata").permissions().mode() & 0o777, 0o644);
        let missing = dir.path().join("no-such-dir").join("x");
        assert!(write_atomically(&missing, "x", 0o600).is_err(), "a directory that does not exist is an error, not a panic");
    }
}
