//! What the harness's integration tests share.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};

use warden_torture::TestNet;

/// The port test servers listen on, on their host's address.
pub const PORT: u16 = 7000;

/// Starts an echo server on `net`'s host `host` (a thread in its namespace).
pub fn serve_echo(net: &TestNet, host: usize) -> SocketAddr {
    let addr = SocketAddr::new(net.host(host).expect("host").addr.into(), PORT);
    let listener = net.host(host).expect("host").run(move || TcpListener::bind(addr)).expect("enter the host").expect("bind");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buffer = [0u8; 64];
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}
