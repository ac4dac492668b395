//! TLS of `warden_proto::tls` with certificates of this crate's [`Authority`]: identities
//! read from certificates, which peers each kind of port admits, which servers a connection
//! accepts, and files reloaded without a restart.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::transport::server::Connected;
use warden_proto::tls::{connect_tls, incoming, Admit, Expected, Identity, Tls};
use warden_server_kit::authority::Authority;

#[test]
fn a_certificate_names_its_identity() {
    let authority = Authority::create("test").expect("ca");
    let (certificate, _) = authority.issue(&Identity::router("r1"), &[]).expect("issue");
    let der = CertificateDer::from_pem_slice(certificate.as_bytes()).expect("pem");
    assert_eq!(Identity::of_certificate(&der).expect("identity"), Identity::router("r1"));
}

/// A standard TLS client checks that the server's certificate names the host it connected
/// to (Warden's own processes check the identity instead): certificates name loopback's
/// hosts by name and by address, and the hosts they were issued for, and no other.
#[test]
fn a_certificate_names_the_hosts_a_standard_client_connects_to() {
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls_pki_types::{ServerName, UnixTime};
    let dir = tempfile::tempdir().expect("tempdir");
    let authority = Authority::create("cluster").expect("ca");
    let hosts = ["10.1.2.3".to_string(), "warden.example".to_string(), "localhost".to_string()];
    let files = authority.issue_files_for(dir.path(), &Identity::router("r1"), &hosts).expect("issue");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&files.ca).expect("the CA's certificate")).expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build().expect("a verifier");
    let leaf = CertificateDer::from_pem_file(&files.cert).expect("the certificate");
    let verifies = |host: &str| {
        let name = ServerName::try_from(host.to_string()).expect("a server name");
        verifier.verify_server_cert(&leaf, &[], &name, &[], UnixTime::now()).is_ok()
    };
    for host in ["localhost", "127.0.0.1", "::1", "10.1.2.3", "warden.example"] {
        assert!(verifies(host), "the certificate must name {host}");
    }
    for host in ["10.1.2.4", "other.example", "warden"] {
        assert!(!verifies(host), "the certificate must not name {host}");
    }
    assert_eq!(Identity::of_certificate(&leaf).expect("identity"), Identity::router("r1"), "the identity is named as before");
}

struct Fixture {
    dir: tempfile::TempDir,
    ca: Authority,
    other_ca: Authority,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        Fixture { dir, ca: Authority::create("cluster").expect("ca"), other_ca: Authority::create("other").expect("ca") }
    }

    fn tls(&self, authority: &Authority, identity: &Identity, sub: &str) -> Arc<Tls> {
        let files = authority.issue_files(&self.dir.path().join(sub), identity).expect("issue");
        Tls::load(files).expect("load")
    }
}

/// Connects `tls` to `addr` expecting `expected`, then reads: Ok(()) once the server sent
/// what `listener` writes to each connection it admitted, Err when the handshake failed
/// or the server closed the connection.
async fn exchange(tls: &Arc<Tls>, addr: SocketAddr, expected: Expected) -> io::Result<()> {
    let mut stream = connect_tls(tls, addr, expected).await?;
    let mut byte = [0u8; 1];
    match stream.read(&mut byte).await? {
        1 => Ok(()),
        _ => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "closed by the server")),
    }
}

/// A listener admitting `admit` with `tls`; each admitted connection is answered one
/// byte and its peer's identity is sent on the returned channel.
async fn listener(tls: Arc<Tls>, admit: Admit) -> (SocketAddr, mpsc::UnboundedReceiver<Option<Identity>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (sender, receiver) = mpsc::unbounded_channel();
    let mut incoming = incoming(listener, Some(tls), admit);
    tokio::spawn(async move {
        while let Some(Ok(mut conn)) = incoming.next().await {
            let _ = sender.send(conn.connect_info().identity);
            let _ = conn.write_all(b"!").await;
            let _ = conn.flush().await;
            tokio::spawn(async move {
                let mut rest = Vec::new();
                let _ = conn.read_to_end(&mut rest).await;
            });
        }
    });
    (addr, receiver)
}

#[tokio::test]
async fn a_peer_port_admits_only_nodes_and_routers_of_the_cluster_ca() {
    let fixture = Fixture::new();
    let server = fixture.tls(&fixture.ca, &Identity::node(1), "n1");
    let (addr, mut admitted) = listener(server, Admit::Peers).await;

    let node = fixture.tls(&fixture.ca, &Identity::node(2), "n2");
    exchange(&node, addr, Expected::Node(1)).await.expect("a node of the CA connects");
    assert_eq!(admitted.recv().await, Some(Some(Identity::node(2))));
    let router = fixture.tls(&fixture.ca, &Identity::router("r"), "r");
    exchange(&router, addr, Expected::AnyNode).await.expect("a router of the CA connects");
    assert_eq!(admitted.recv().await, Some(Some(Identity::router("r"))));

    let client = fixture.tls(&fixture.ca, &Identity::client("alice"), "alice");
    assert!(exchange(&client, addr, Expected::AnyNode).await.is_err(), "a client certificate is refused on the peer port");
    let stranger = fixture.tls(&fixture.other_ca, &Identity::node(3), "stranger");
    assert!(exchange(&stranger, addr, Expected::AnyNode).await.is_err(), "a node of another CA is refused");
    // The server is verified too: a node that is not the one expected, a server of
    // another CA.
    assert!(exchange(&node, addr, Expected::Node(4)).await.is_err(), "node 1 is not node 4");
    assert!(exchange(&node, addr, Expected::Router).await.is_err(), "node 1 is not a router");
    let (other_addr, _other) = listener(fixture.tls(&fixture.other_ca, &Identity::node(1), "other-n1"), Admit::Clients).await;
    assert!(exchange(&node, other_addr, Expected::Node(1)).await.is_err(), "a server of another CA is not node 1");
    // None of the refused connections reached the server.
    exchange(&node, addr, Expected::Node(1)).await.expect("connects again");
    assert_eq!(admitted.recv().await, Some(Some(Identity::node(2))));
}

#[tokio::test]
async fn a_client_port_admits_any_holder_of_a_certificate_of_the_ca() {
    let fixture = Fixture::new();
    let (addr, mut admitted) = listener(fixture.tls(&fixture.ca, &Identity::router("r"), "r"), Admit::Clients).await;
    let client = fixture.tls(&fixture.ca, &Identity::client("alice"), "alice");
    exchange(&client, addr, Expected::Router).await.expect("a client of the CA connects");
    assert_eq!(admitted.recv().await, Some(Some(Identity::client("alice"))));
    let stranger = fixture.tls(&fixture.other_ca, &Identity::client("mallory"), "mallory");
    assert!(exchange(&stranger, addr, Expected::Router).await.is_err(), "a certificate of another CA is refused");
    exchange(&client, addr, Expected::Router).await.expect("connects again");
    assert_eq!(admitted.recv().await, Some(Some(Identity::client("alice"))), "the stranger never got in");
}

#[tokio::test]
async fn changed_files_are_used_by_new_connections_without_a_restart() {
    let fixture = Fixture::new();
    let server_dir = fixture.dir.path().join("n1");
    let server = fixture.tls(&fixture.ca, &Identity::node(1), "n1");
    let (addr, mut admitted) = listener(server.clone(), Admit::Peers).await;
    let old_node = fixture.tls(&fixture.ca, &Identity::node(2), "n2");
    exchange(&old_node, addr, Expected::Node(1)).await.expect("before the rotation");
    assert_eq!(admitted.recv().await, Some(Some(Identity::node(2))));

    // The cluster moves to a new CA: node 1's files are rewritten.
    let new_ca = Authority::create("rotated").expect("ca");
    new_ca.issue_files(&server_dir, &Identity::node(1)).expect("reissue");
    assert!(server.reload().expect("reload"), "the rewritten files are taken");
    assert!(!server.reload().expect("reload"), "unchanged files are not read again");
    assert!(exchange(&old_node, addr, Expected::Node(1)).await.is_err(), "the old CA's node is refused now");
    let new_node = fixture.tls(&new_ca, &Identity::node(2), "new-n2");
    exchange(&new_node, addr, Expected::Node(1)).await.expect("the new CA's node connects");
    assert_eq!(admitted.recv().await, Some(Some(Identity::node(2))));

    // A key that does not match its certificate is refused; the previous files stay.
    let (_, stray_key) = new_ca.issue(&Identity::node(1), &[]).expect("issue");
    std::fs::write(server_dir.join("node-1.key"), stray_key).expect("write");
    assert!(server.reload().is_err(), "a mismatched pair does not load");
    exchange(&new_node, addr, Expected::Node(1)).await.expect("still served with the previous files");
    assert_eq!(admitted.recv().await, Some(Some(Identity::node(2))));
}
