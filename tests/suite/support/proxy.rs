//! A real TCP forwarder to put between a client and a server, which a test can pause: while
//! paused it drops every connection it carries and closes new ones at once, as a network
//! partition between the two would (seen from the client: connections fail, nothing gets
//! through). Resuming lets new connections through again.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A pausable forwarder from a loopback port to `target`. Dropping it ends every connection.
pub struct Proxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    listener: JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding from a fresh loopback port to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (paused, _) = watch::channel(false);
        let listener = tokio::spawn(accept(listener, target, paused.subscribe()));
        Proxy { addr, paused, listener }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection and refuses new ones until [`Proxy::resume`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Forwards new connections again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.listener.abort();
        self.paused.send_replace(true);
    }
}

async fn accept(listener: TcpListener, target: SocketAddr, paused: watch::Receiver<bool>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else { continue };
        if *paused.borrow() {
            continue; // dropped: the client sees its connection closed
        }
        let mut paused = paused.clone();
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(target).await else { return };
            let (mut inbound, mut outbound) = (inbound, outbound);
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                // Paused (or the proxy dropped): both sockets close here.
                _ = paused.wait_for(|paused| *paused) => {}
            }
        });
    }
}
