//! Debian's `etcdctl` (package `etcd-client`, installed by `make setup`) as the tests run it
//! against a router's etcd port or a real etcd.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use crate::support::routed::TIMEOUT;

/// An `etcdctl` command line speaking etcd's v3 API to the endpoint `addr`, with `args`;
/// the caller chooses what happens to its standard streams and runs it.
pub fn etcdctl_command(addr: SocketAddr, args: &[&str]) -> Command {
    let mut command = Command::new("etcdctl");
    command
        .env("ETCDCTL_API", "3")
        // Without a scheme: etcdctl 3.4's `endpoint status` sends `http://host:port` as the
        // HTTP/2 authority, which the router's HTTP/2 server refuses (docs/etcd.md).
        .arg(format!("--endpoints={addr}"))
        .args(args);
    command
}

/// A single-member etcd on free loopback ports, its data in a temporary directory; killed
/// when dropped.
pub struct RealEtcd {
    child: Child,
    /// Its client URL's address.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl RealEtcd {
    /// Starts it and waits until it answers a linearizable read.
    pub fn start() -> RealEtcd {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = warden_testkit::free_port_base(&[0, 1]);
        let (client, peer) = (format!("http://127.0.0.1:{base}"), format!("http://127.0.0.1:{}", base + 1));
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd's log");
        let child = std::process::Command::new("etcd")
            .args(["--name", "solo", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .arg(format!("--initial-cluster=solo={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs (make setup installs Debian's etcd-server)");
        let etcd = RealEtcd { child, addr: SocketAddr::from(([127, 0, 0, 1], base)), _dir: dir };
        let deadline = Instant::now() + TIMEOUT;
        while !etcdctl_command(etcd.addr, &["get", "ready"]).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success()) {
            assert!(Instant::now() < deadline, "etcd did not answer within {TIMEOUT:?}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        etcd
    }
}

impl Drop for RealEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
