//! Debian's `etcdctl` (package `etcd-client`, installed by `make setup`) as the tests run it
//! against a router's etcd port or a real etcd.

use std::net::SocketAddr;
use std::process::Command;

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
