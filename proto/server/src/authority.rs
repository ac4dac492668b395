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

fn write(path: &Path, contents: &str) -> Result<(), TlsError> {
    std::fs::write(path, contents).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

/// Writes `contents` to `path` readable by its owner only (a private key).
fn write_private(path: &Path, contents: &str) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TlsError::Read { path: path.to_path_buf(), source };
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)
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
