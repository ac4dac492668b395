//! TLS on every link: the certificates' identities, the server side of a listener
//! (who may connect, and who they are), the client side of a channel (who the server must
//! be), and certificate files reloaded when they change.
//!
//! Identity: every certificate names its holder in one URI subject alternative name,
//! `warden://node/3`, `warden://router/r1` or `warden://client/alice` (as SPIFFE does), and is
//! signed by the cluster's CA. Host names play no part: a node is whoever holds a node
//! certificate of the CA, and a channel to node 3 is verified to reach `warden://node/3`.
//!
//! Rotation: the CA, certificate and key files are read again when one of them changes
//! (checked at most once per [`RELOAD_CHECK_INTERVAL`], on a handshake); new connections use
//! the new files, live ones keep theirs. A set of files that does not load (half written, a
//! key that does not match) is refused with a warning and the previous one stays.
//!
//! Architecture invariant: this module knows no service. Listeners admit by role
//! ([`Admit`]); what a role may call is decided where the services are wired.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod tokens;

pub use tokens::Tokens;

/// How often, at most, the files are checked for a change.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Time a connecting peer has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes one listener runs at once; more connections wait in the kernel's backlog.
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 256;
/// Accepted connections waiting for the gRPC server to take them.
const ACCEPTED_QUEUE_MAX: usize = 64;
/// The name every client asks for (SNI). Servers are verified by identity, not by name.
const SERVER_NAME: &str = "warden";
const URI_PREFIX: &str = "warden://";

/// What a certificate's holder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A shard-node (its name is its node id).
    Node,
    /// A router.
    Router,
    /// A client: a person or a program using the public API (its name is its principal).
    Client,
}

impl Role {
    /// Its name in identities and file names: `node`, `router`, `client`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Router => "router",
            Role::Client => "client",
        }
    }
}

/// The holder a certificate names: its role and its name within the role.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// What the holder is.
    pub role: Role,
    /// Who it is: a node's id in decimal, a router's or a client's name.
    pub name: String,
}

impl Identity {
    /// Node `id`.
    pub fn node(id: u64) -> Identity {
        Identity { role: Role::Node, name: id.to_string() }
    }

    /// The router called `name`.
    pub fn router(name: &str) -> Identity {
        Identity { role: Role::Router, name: name.to_string() }
    }

    /// The client (principal) called `name`.
    pub fn client(name: &str) -> Identity {
        Identity { role: Role::Client, name: name.to_string() }
    }

    /// The node id, when this is a node.
    pub fn node_id(&self) -> Option<u64> {
        if self.role == Role::Node {
            self.name.parse().ok().filter(|id| *id != 0)
        } else {
            None
        }
    }

    /// The URI a certificate names it by, `warden://ROLE/NAME`.
    pub fn uri(&self) -> String {
        format!("{URI_PREFIX}{}/{}", self.role.as_str(), self.name)
    }

    /// The identity a `warden://ROLE/NAME` URI names. A name is 1 to 128 letters, digits,
    /// `-`, `_`, `.` or `@`; a node's name is a node id.
    pub fn from_uri(uri: &str) -> Option<Identity> {
        let rest = uri.strip_prefix(URI_PREFIX)?;
        let (role, name) = rest.split_once('/')?;
        let role = match role {
            "node" => Role::Node,
            "router" => Role::Router,
            "client" => Role::Client,
            _ => return None,
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@');
        if name.is_empty() || name.len() > 128 || !name.chars().all(valid) {
            return None;
        }
        let identity = Identity { role, name: name.to_string() };
        if role == Role::Node && identity.node_id().is_none() {
            return None;
        }
        Some(identity)
    }

    /// Whether a certificate may name this identity (a positive node id; a name of 1 to 128
    /// letters, digits, `-`, `_`, `.` or `@`).
    pub fn is_valid(&self) -> bool {
        Identity::from_uri(&self.uri()).as_ref() == Some(self)
    }

    /// The identity certificate `der` names: its one `warden://` URI subject alternative
    /// name. (The chain is verified elsewhere, by rustls.) Read with rustls's own certificate
    /// parser (webpki), so both ends of a link need no other.
    pub fn of_certificate(der: &[u8]) -> Result<Identity, TlsError> {
        let der = CertificateDer::from(der);
        let certificate = webpki::EndEntityCert::try_from(&der).map_err(|e| TlsError::Identity(format!("unreadable certificate: {e}")))?;
        let mut found = None;
        for uri in certificate.valid_uri_names().filter(|uri| uri.starts_with(URI_PREFIX)) {
            let identity = Identity::from_uri(uri).ok_or_else(|| TlsError::Identity(format!("malformed identity {uri:?}")))?;
            if found.replace(identity).is_some() {
                return Err(TlsError::Identity("a certificate names one identity, this one several".into()));
            }
        }
        found.ok_or_else(|| TlsError::Identity("the certificate names no warden:// identity".into()))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri())
    }
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no usable PEM of the expected kind.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The certificate does not name exactly one well-formed identity.
    #[error("identity: {0}")]
    Identity(String),
    /// rustls refused the configuration (for example, a key that does not match the
    /// certificate).
    #[error("tls configuration: {0}")]
    Config(String),
}

/// Where a process's TLS material is: the cluster's CA certificate (PEM), the process's
/// certificate chain (PEM, its own first) and its private key (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s) every peer's certificate must chain to.
    pub ca: PathBuf,
    /// This process's certificate chain (empty: none, a client that names itself by a
    /// bearer token, [`Tls::load_ca_only`]).
    pub cert: PathBuf,
    /// This process's private key (empty with `cert`).
    pub key: PathBuf,
}

impl TlsFiles {
    fn paths(&self) -> [&Path; 3] {
        [&self.ca, &self.cert, &self.key]
    }

    /// Whether the files include a certificate of this process's own.
    fn has_own(&self) -> bool {
        !self.cert.as_os_str().is_empty()
    }
}

/// What a file looked like when it was read: a change of either means it is read again.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// One consistent load of the files.
struct Loaded {
    stamps: [Stamp; 3],
    roots: Arc<RootCertStore>,
    /// This process's certificate (`None`: a client without one).
    own: Option<Own>,
}

/// A process's own certificate, and the server configurations it makes.
struct Own {
    identity: Identity,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    /// For listeners: every peer presents a certificate of the CA.
    server: Arc<ServerConfig>,
    /// For client ports with bearer tokens: a peer may present no certificate (then it
    /// must name itself by token on each call).
    server_open: Arc<ServerConfig>,
}

/// A process's TLS material, reloaded when its files change. Shared by every listener and
/// channel of the process.
pub struct Tls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    /// Bearer tokens a client port also accepts (`None`: client certificates only).
    tokens: Option<Arc<Tokens>>,
    /// The current load, and when the files were last checked.
    current: Mutex<(Arc<Loaded>, Instant)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).field("identity", &self.identity()).finish()
    }
}

impl Tls {
    /// Loads `files`; fails when they do not make a usable configuration.
    pub fn load(files: TlsFiles) -> Result<Arc<Tls>, TlsError> {
        Tls::load_with_tokens(files, None)
    }

    /// As [`load`](Tls::load), for a process whose client port also admits callers that
    /// name themselves by a bearer token of `tokens` instead of a certificate.
    pub fn load_with_tokens(files: TlsFiles, tokens: Option<Arc<Tokens>>) -> Result<Arc<Tls>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let loaded = load(&files, &provider)?;
        Ok(Arc::new(Tls { files, provider, tokens, current: Mutex::new((Arc::new(loaded), Instant::now())) }))
    }

    /// The TLS of a client with no certificate of its own (it names itself by a bearer
    /// token): it verifies servers by the CA at `ca` and cannot listen.
    pub fn load_ca_only(ca: PathBuf) -> Result<Arc<Tls>, TlsError> {
        Tls::load(TlsFiles { ca, cert: PathBuf::new(), key: PathBuf::new() })
    }

    /// Who this process is (by its current certificate; `None`: it has none).
    pub fn identity(&self) -> Option<Identity> {
        self.lock().0.own.as_ref().map(|own| own.identity.clone())
    }

    /// The bearer tokens its client ports accept.
    pub fn tokens(&self) -> Option<&Arc<Tokens>> {
        self.tokens.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Arc<Loaded>, Instant)> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current load, read again first when a file changed (checked at most once per
    /// [`RELOAD_CHECK_INTERVAL`]).
    fn current(&self) -> Arc<Loaded> {
        let mut current = self.lock();
        if current.1.elapsed() >= RELOAD_CHECK_INTERVAL {
            current.1 = Instant::now();
            if let Err(error) = self.reload_locked(&mut current) {
                tracing::warn!(%error, "tls files changed but do not load; keeping the previous ones");
            }
        }
        current.0.clone()
    }

    /// Reads the files again now if one changed; true when the new ones were taken.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let mut current = self.lock();
        current.1 = Instant::now();
        self.reload_locked(&mut current)
    }

    fn reload_locked(&self, current: &mut (Arc<Loaded>, Instant)) -> Result<bool, TlsError> {
        let stamps = self.files.paths().map(stamp);
        if stamps == current.0.stamps {
            return Ok(false);
        }
        let loaded = load(&self.files, &self.provider)?;
        tracing::info!(identity = ?loaded.own.as_ref().map(|own| own.identity.to_string()), "tls files reloaded");
        current.0 = Arc::new(loaded);
        Ok(true)
    }

    /// A client configuration that presents this process's certificate and accepts only a
    /// server that is `expected`.
    fn client_config(&self, expected: Expected) -> Result<Arc<ClientConfig>, TlsError> {
        let loaded = self.current();
        let verifier = Arc::new(IdentityVerifier { roots: loaded.roots.clone(), provider: self.provider.clone(), expected });
        let builder = ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match &loaded.own {
            Some(own) => builder.with_client_auth_cert(own.chain.clone(), own.key.clone_key()).map_err(|e| TlsError::Config(e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_path_buf(), source })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let pem_error = |message: String| TlsError::Pem { path: path.to_path_buf(), message };
    let certificates = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| pem_error(e.to_string()))?;
    if certificates.is_empty() {
        return Err(pem_error("no certificate".into()));
    }
    Ok(certificates)
}

fn load(files: &TlsFiles, provider: &Arc<CryptoProvider>) -> Result<Loaded, TlsError> {
    // Stamps first: a file changed while it is read makes the next check read it again.
    let stamps = files.paths().map(stamp);
    let mut roots = RootCertStore::empty();
    for ca in certificates(&files.ca)? {
        roots.add(ca).map_err(|e| TlsError::Pem { path: files.ca.clone(), message: e.to_string() })?;
    }
    let roots = Arc::new(roots);
    if !files.has_own() {
        return Ok(Loaded { stamps, roots, own: None });
    }
    let chain = certificates(&files.cert)?;
    let identity = Identity::of_certificate(&chain[0])?;
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?).map_err(|e| TlsError::Pem { path: files.key.clone(), message: e.to_string() })?;
    let server_config = |certificate_optional: bool| -> Result<Arc<ServerConfig>, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
        let verifier = if certificate_optional { verifier.allow_unauthenticated() } else { verifier };
        let verifier = verifier.build().map_err(|e| TlsError::Config(e.to_string()))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        server.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(server))
    };
    let (server, server_open) = (server_config(false)?, server_config(true)?);
    Ok(Loaded { stamps, roots, own: Some(Own { identity, chain, key, server, server_open }) })
}

/// Which servers a channel accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Node `id` only.
    Node(u64),
    /// Any node.
    AnyNode,
    /// Any router.
    Router,
    /// Any node or router (the CLI, pointed at either).
    NodeOrRouter,
}

impl Expected {
    /// Whether a server that is `identity` is what is expected.
    pub fn admits(self, identity: &Identity) -> bool {
        match self {
            Expected::Node(id) => identity.node_id() == Some(id),
            Expected::AnyNode => identity.role == Role::Node,
            Expected::Router => identity.role == Role::Router,
            Expected::NodeOrRouter => matches!(identity.role, Role::Node | Role::Router),
        }
    }
}

/// Verifies a server's chain against the CA, then its identity against what is expected
/// (instead of a host name).
#[derive(Debug)]
struct IdentityVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    expected: Expected,
}

impl ServerCertVerifier for IdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let identity = Identity::of_certificate(end_entity).map_err(|e| rustls::Error::General(e.to_string()))?;
        if !self.expected.admits(&identity) {
            return Err(rustls::Error::General(format!("the server is {identity}, not {:?}", self.expected)));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Who may connect to a listener when TLS is on (without it, anyone). Either way the peer
/// presents a certificate of the CA during the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Nodes and routers only (a node's peer port).
    Peers,
    /// Any holder of a certificate of the CA: the client ports of nodes and routers.
    Clients,
}

impl Admit {
    fn admits(self, identity: &Identity) -> bool {
        match self {
            Admit::Peers => matches!(identity.role, Role::Node | Role::Router),
            Admit::Clients => true,
        }
    }
}

/// What a request's handler knows about the other end of its connection (in the request's
/// extensions; [`peer_identity`]).
#[derive(Clone, Debug)]
pub struct PeerInfo {
    /// The connection's remote address.
    pub remote_addr: Option<SocketAddr>,
    /// Whether the connection is TLS (then nothing unauthenticated gets in that a listener's
    /// [`Admit`] would refuse).
    pub tls: bool,
    /// Who the other end proved to be, by certificate (`None`: plaintext, or no certificate).
    pub identity: Option<Identity>,
    /// The bearer tokens the listener accepts from a peer without a certificate.
    pub tokens: Option<Arc<Tokens>>,
}

/// Who sent `request`, as its connection's certificate proved.
pub fn peer_identity<T>(request: &tonic::Request<T>) -> Option<&Identity> {
    request.extensions().get::<PeerInfo>().and_then(|peer| peer.identity.as_ref())
}

/// The node that sent `request`, for calls only nodes make (raft messages, placement's
/// internal calls): `Ok(None)` on a plaintext connection (TLS off: nobody is authenticated),
/// `Ok(Some(id))` when a node certificate proved it, PERMISSION_DENIED for anyone else.
pub fn calling_node<T>(request: &tonic::Request<T>) -> Result<Option<u64>, tonic::Status> {
    let Some(peer) = request.extensions().get::<PeerInfo>() else { return Ok(None) };
    if !peer.tls {
        return Ok(None);
    }
    match peer.identity.as_ref().and_then(Identity::node_id) {
        Some(id) => Ok(Some(id)),
        None => {
            let who = peer.identity.as_ref().map_or_else(|| "a caller without a certificate".to_string(), Identity::to_string);
            Err(tonic::Status::permission_denied(format!("only nodes make this call, not {who}")))
        }
    }
}

/// Whom a public call is made for, as the server judges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Security is off (a plaintext connection): everything is allowed.
    Open,
    /// A node, by certificate (calls between groups on the system's behalf): trusted.
    Node(u64),
    /// A principal: a client certificate's name, or the one a router's certificate asserts
    /// in `Routing.principal`.
    Principal(String),
}

impl Caller {
    /// The principal checked against the ACL and session owners (`None`: not checked).
    pub fn principal(&self) -> Option<&str> {
        match self {
            Caller::Principal(name) => Some(name),
            Caller::Open | Caller::Node(_) => None,
        }
    }

    /// The principal a command records and checks sessions against: empty when not checked.
    pub fn principal_or_empty(&self) -> String {
        self.principal().unwrap_or_default().to_string()
    }
}

/// The metadata key in which a router names the principal it forwards a call for.
pub const PRINCIPAL_HEADER: &str = "x-warden-principal";

/// The principal a request's [`PRINCIPAL_HEADER`] names (empty: none, or not text).
pub fn asserted_principal(metadata: &tonic::metadata::MetadataMap) -> &str {
    metadata.get(PRINCIPAL_HEADER).and_then(|value| value.to_str().ok()).unwrap_or_default()
}

/// Whom `request` is made for: [`Caller::Open`] on a plaintext connection, else by the
/// certificate its connection proved, or (no certificate, on a client port with tokens) by
/// its bearer token. A router's certificate speaks for the principal its
/// [`PRINCIPAL_HEADER`] names (a router always sets it); the header of anyone else is
/// ignored. Refused UNAUTHENTICATED: neither a certificate nor a valid token, or a router
/// naming nobody.
pub fn caller<T>(request: &tonic::Request<T>) -> Result<Caller, tonic::Status> {
    caller_of(request.extensions().get::<PeerInfo>(), request.metadata())
}

/// As [`caller`], from the connection's [`PeerInfo`] (`None`: not a network call, open) and
/// the call's metadata.
pub fn caller_of(peer: Option<&PeerInfo>, metadata: &tonic::metadata::MetadataMap) -> Result<Caller, tonic::Status> {
    let asserted = asserted_principal(metadata);
    let Some(peer) = peer else { return Ok(Caller::Open) };
    if !peer.tls {
        return Ok(Caller::Open);
    }
    let unauthenticated = |message: &str| {
        let error = crate::warden_error(crate::v1::warden_error::Code::Unauthenticated, "", message);
        crate::status(error)
    };
    match &peer.identity {
        None => match peer.tokens.as_ref().and_then(|tokens| tokens.principal_of(metadata)) {
            Some(principal) => Ok(Caller::Principal(principal)),
            None => Err(unauthenticated("neither a client certificate nor a valid bearer token")),
        },
        Some(identity) => match identity.role {
            Role::Node => identity.node_id().map(Caller::Node).ok_or_else(|| unauthenticated("a node certificate without a node id")),
            Role::Router if asserted.is_empty() => Err(unauthenticated("a router must name the principal it forwards for")),
            Role::Router => Ok(Caller::Principal(asserted.to_string())),
            Role::Client => Ok(Caller::Principal(identity.name.clone())),
        },
    }
}

/// An accepted connection: plaintext, or TLS with the peer it authenticated.
pub enum Conn {
    /// TLS off.
    Plain(TcpStream),
    /// TLS on, with the peer its certificate names (`None`: no certificate, on a client port
    /// that accepts these bearer tokens instead).
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, Option<Identity>, Option<Arc<Tokens>>),
}

impl Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        match self {
            Conn::Plain(stream) => PeerInfo { remote_addr: stream.peer_addr().ok(), tls: false, identity: None, tokens: None },
            Conn::Tls(stream, identity, tokens) => {
                PeerInfo { remote_addr: stream.get_ref().0.peer_addr().ok(), tls: true, identity: identity.clone(), tokens: tokens.clone() }
            }
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Conn::Tls(stream, ..) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Conn::Tls(stream, ..) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Conn::Tls(stream, ..) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(stream) => stream.is_write_vectored(),
            Conn::Tls(stream, ..) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Conn::Tls(stream, ..) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Conn::Tls(stream, ..) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The connections `listener` accepts, for `tonic`'s `serve_with_incoming`: with `tls`, only
/// those that finish a handshake within [`HANDSHAKE_TIMEOUT`] as someone `admit` lets in
/// (the others are closed and logged). TCP_NODELAY is set on each (a response written in
/// small frames would otherwise wait for a delayed ACK). Must be called inside a tokio
/// runtime; the accept task ends when the stream is dropped.
pub fn incoming(listener: TcpListener, tls: Option<Arc<Tls>>, admit: Admit) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn>> {
    let (sender, receiver) = mpsc::channel(ACCEPTED_QUEUE_MAX);
    tokio::spawn(accept_loop(listener, tls, admit, sender));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

async fn accept_loop(listener: TcpListener, tls: Option<Arc<Tls>>, admit: Admit, sender: mpsc::Sender<io::Result<Conn>>) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT_MAX));
    loop {
        let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, a connection reset before accept: wait a
                    // little rather than spin, and go on.
                    tracing::debug!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = sender.closed() => return,
        };
        let _ = stream.set_nodelay(true);
        let Some(tls) = tls.clone() else {
            if sender.send(Ok(Conn::Plain(stream))).await.is_err() {
                return;
            }
            continue;
        };
        let sender = sender.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&tls, admit, stream)).await {
                Ok(Ok(conn)) => {
                    let _ = sender.send(Ok(conn)).await;
                }
                Ok(Err(error)) => tracing::info!(%remote, %error, "tls connection refused"),
                Err(_) => tracing::info!(%remote, "tls handshake timed out"),
            }
        });
    }
}

async fn handshake(tls: &Tls, admit: Admit, stream: TcpStream) -> io::Result<Conn> {
    let loaded = tls.current();
    let own = loaded.own.as_ref().ok_or_else(|| io::Error::other("a process without a certificate of its own cannot listen"))?;
    // A client port with bearer tokens lets a client without a certificate in; each of its
    // calls must then carry a token (`caller`).
    let tokens = tls.tokens.clone().filter(|_| admit == Admit::Clients);
    let config = if tokens.is_some() { own.server_open.clone() } else { own.server.clone() };
    let stream = tokio_rustls::TlsAcceptor::from(config).accept(stream).await?;
    // rustls verified the chain; the identity is what the certificate names.
    let certificate = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first());
    let Some(certificate) = certificate else {
        return match tokens {
            Some(tokens) => Ok(Conn::Tls(Box::new(stream), None, Some(tokens))),
            None => Err(io::Error::new(io::ErrorKind::PermissionDenied, "no client certificate")),
        };
    };
    let identity = Identity::of_certificate(certificate).map_err(io::Error::other)?;
    if !admit.admits(&identity) {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{identity} may not connect to this port")));
    }
    Ok(Conn::Tls(Box::new(stream), Some(identity), tokens))
}

/// Opens TLS connections for a channel: TCP to the URI's host and port, then a handshake
/// that presents this process's certificate and accepts only an `expected` server.
#[derive(Clone)]
struct Connector {
    tls: Arc<Tls>,
    expected: Expected,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let (tls, expected) = (self.tls.clone(), self.expected);
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no port in {uri}")))?;
            Ok(TokioIo::new(connect_tls(&tls, (host, port), expected).await?))
        })
    }
}

/// One TLS connection to `addr` as this process (presenting its certificate, if any),
/// accepting only an `expected` server: what a channel's connector opens for each of its
/// connections.
pub async fn connect_tls(
    tls: &Tls,
    addr: impl tokio::net::ToSocketAddrs,
    expected: Expected,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let config = tls.client_config(expected).map_err(io::Error::other)?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    tokio_rustls::TlsConnector::from(config).connect(name, stream).await
}

/// A lazily connected channel through `endpoint`: plaintext without `tls`, else TLS to an
/// `expected` server (the endpoint's timeouts and HTTP/2 settings apply either way).
pub fn lazy_channel(endpoint: Endpoint, tls: Option<&Arc<Tls>>, expected: Expected) -> Channel {
    match tls {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(Connector { tls: tls.clone(), expected }),
    }
}

/// [`lazy_channel`], connected now.
pub async fn connect_channel(endpoint: Endpoint, tls: Option<&Arc<Tls>>, expected: Expected) -> Result<Channel, tonic::transport::Error> {
    match tls {
        None => endpoint.connect().await,
        Some(tls) => endpoint.connect_with_connector(Connector { tls: tls.clone(), expected }).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (Certificates and handshakes are tested with a CA, in `warden-server-kit`.)
    #[test]
    fn identities_are_named_by_one_well_formed_uri() {
        for identity in [Identity::node(3), Identity::router("r1"), Identity::client("alice@payments")] {
            assert_eq!(Identity::from_uri(&identity.uri()), Some(identity.clone()));
        }
        assert_eq!(Identity::node(7).node_id(), Some(7));
        assert_eq!(Identity::client("7").node_id(), None);
        for malformed in [
            "warden://node/0",
            "warden://node/x",
            "warden://admin/root",
            "warden://client/",
            "warden://client/a/b",
            "https://node/1",
            "warden://client/a b",
        ] {
            assert_eq!(Identity::from_uri(malformed), None, "{malformed}");
        }
    }
}
