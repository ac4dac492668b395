//! Channels to an address (`host:port`, or a full URI): the one place that turns an address
//! into a tonic [`Endpoint`] with named settings (connect timeout, request timeout, HTTP/2
//! keepalive, which server TLS must prove to be), and a bounded cache of channels by address
//! ([`ChannelCache`], at most [`CHANNELS_MAX`]).
//!
//! Every channel is plaintext without TLS, else TLS to an [`Expected`] server
//! ([`crate::tls::lazy_channel`]); TCP_NODELAY is on (tonic's default).

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::tls::{Expected, Tls};

/// Channels a [`ChannelCache`] keeps at most, one per address (far more than a cluster's
/// nodes and routers; past it the least used go first, and come back lazily when used).
pub const CHANNELS_MAX: u64 = 1024;

/// HTTP/2 keepalive: a ping every `interval`; a connection whose ping is unanswered for
/// `timeout` is closed (and the streams on it end), so a peer that vanished without closing
/// (a partition) is noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Between pings.
    pub interval: Duration,
    /// Longest a ping may go unanswered.
    pub timeout: Duration,
}

/// Pings on a connection to a node while calls are open on it: a node gone silent (cut off,
/// paused) fails the calls waiting on it within 3 s, about when the group's other replicas
/// have elected a new leader (an election timeout is 1–2 s), so the caller tries them then
/// instead of waiting out each call's deadline (5 s at a router) at the silent one. A node
/// answers a ping from its connection's task, not behind its request queues; the 2 s it may
/// take leaves room for a loaded machine's scheduling delays.
pub const NODE_PINGS: Keepalive = Keepalive { interval: Duration::from_secs(1), timeout: Duration::from_secs(2) };

/// How a channel connects. [`ChannelSettings::new`] is tonic's defaults (no timeouts, no
/// keepalive); the `with_` methods name what differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelSettings {
    /// Longest opening a connection may take (`None`: no bound of its own).
    pub connect_timeout: Option<Duration>,
    /// Deadline of every request on the channel (`None`: only what each request carries).
    pub request_timeout: Option<Duration>,
    /// HTTP/2 keepalive pings (`None`: none).
    pub keepalive: Option<Keepalive>,
    /// HTTP/2 flow-control windows, bytes: per stream and per connection (`None`: hyper's
    /// defaults, 64 KiB).
    pub windows_bytes: Option<(u32, u32)>,
    /// Who the server must prove to be when TLS is on (its certificate's identity stands in
    /// for a host name).
    pub expected: Expected,
}

impl ChannelSettings {
    /// tonic's defaults, to an `expected` server.
    pub const fn new(expected: Expected) -> ChannelSettings {
        ChannelSettings { connect_timeout: None, request_timeout: None, keepalive: None, windows_bytes: None, expected }
    }

    /// From one node to another (a router's or a node's upstream calls): connected within a
    /// second; a node gone silent ends the calls waiting on it within [`NODE_PINGS`]' three
    /// seconds.
    pub const fn to_nodes() -> ChannelSettings {
        ChannelSettings::new(Expected::AnyNode).with_connect_timeout(Duration::from_secs(1)).with_keepalive(NODE_PINGS)
    }

    /// The same, connecting within `timeout`.
    pub const fn with_connect_timeout(self, timeout: Duration) -> ChannelSettings {
        ChannelSettings { connect_timeout: Some(timeout), ..self }
    }

    /// The same, every request bounded by `timeout`.
    pub const fn with_request_timeout(self, timeout: Duration) -> ChannelSettings {
        ChannelSettings { request_timeout: Some(timeout), ..self }
    }

    /// The same, with `keepalive` pings.
    pub const fn with_keepalive(self, keepalive: Keepalive) -> ChannelSettings {
        ChannelSettings { keepalive: Some(keepalive), ..self }
    }

    /// The same, with flow-control windows of `stream_bytes` per stream and
    /// `connection_bytes` per connection (a stream that carries bulk data, such as raft
    /// messages and snapshots, is not held to 64 KiB in flight).
    pub const fn with_windows(self, stream_bytes: u32, connection_bytes: u32) -> ChannelSettings {
        ChannelSettings { windows_bytes: Some((stream_bytes, connection_bytes)), ..self }
    }
}

/// The endpoint of `addr` (`host:port`, reached over `http://`, or a full URI) with
/// `settings`; fails when `addr` makes no URI.
pub fn endpoint(addr: &str, settings: &ChannelSettings) -> Result<Endpoint, tonic::transport::Error> {
    let uri = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let mut endpoint = Endpoint::from_shared(uri)?.tcp_nodelay(true);
    if let Some(timeout) = settings.connect_timeout {
        endpoint = endpoint.connect_timeout(timeout);
    }
    if let Some(timeout) = settings.request_timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if let Some(keepalive) = settings.keepalive {
        endpoint = endpoint.http2_keep_alive_interval(keepalive.interval).keep_alive_timeout(keepalive.timeout);
    }
    if let Some((stream_bytes, connection_bytes)) = settings.windows_bytes {
        endpoint = endpoint.initial_stream_window_size(Some(stream_bytes)).initial_connection_window_size(Some(connection_bytes));
    }
    Ok(endpoint)
}

/// A lazily connected channel to `addr` (see [`endpoint`]), with `tls` when it is on.
pub fn lazy(addr: &str, tls: Option<&Arc<Tls>>, settings: &ChannelSettings) -> Result<Channel, tonic::transport::Error> {
    Ok(crate::tls::lazy_channel(endpoint(addr, settings)?, tls, settings.expected))
}

/// [`lazy`], connected now.
pub async fn connect(addr: &str, tls: Option<&Arc<Tls>>, settings: &ChannelSettings) -> Result<Channel, tonic::transport::Error> {
    crate::tls::connect_channel(endpoint(addr, settings)?, tls, settings.expected).await
}

/// One lazily connected channel per address, shared by every caller (clones are cheap and
/// share the connection), at most [`CHANNELS_MAX`]. `V` is what is kept per address: the
/// channel, or something built on it once ([`ChannelCache::get_with`]).
pub struct ChannelCache<V: Clone + Send + Sync + 'static = Channel> {
    tls: Option<Arc<Tls>>,
    settings: ChannelSettings,
    channels: moka::sync::Cache<String, V>,
}

impl<V: Clone + Send + Sync + 'static> std::fmt::Debug for ChannelCache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelCache").field("settings", &self.settings).field("channels", &self.channels.entry_count()).finish()
    }
}

impl<V: Clone + Send + Sync + 'static> ChannelCache<V> {
    /// An empty cache of channels with `settings`, over `tls` when it is on.
    pub fn new(tls: Option<Arc<Tls>>, settings: ChannelSettings) -> ChannelCache<V> {
        ChannelCache { tls, settings, channels: moka::sync::Cache::new(CHANNELS_MAX) }
    }

    /// What is kept for `addr`, made by `wrap` from a new lazy channel the first time (once,
    /// however many callers ask at once).
    pub fn get_with(&self, addr: &str, wrap: impl FnOnce(Channel) -> V) -> Result<V, tonic::transport::Error> {
        if let Some(kept) = self.channels.get(addr) {
            return Ok(kept);
        }
        let endpoint = endpoint(addr, &self.settings)?;
        let (tls, expected) = (self.tls.as_ref(), self.settings.expected);
        Ok(self.channels.get_with_by_ref(addr, || wrap(crate::tls::lazy_channel(endpoint, tls, expected))))
    }
}

impl ChannelCache<Channel> {
    /// The channel to `addr`.
    pub fn get(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        self.get_with(addr, |channel| channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_channel_per_address_and_bad_addresses_refused() {
        let cache: ChannelCache<(Channel, u32)> = ChannelCache::new(None, ChannelSettings::to_nodes());
        let made = std::sync::atomic::AtomicU32::new(0);
        let first = cache.get_with("127.0.0.1:1", |c| (c, made.fetch_add(1, std::sync::atomic::Ordering::Relaxed))).expect("channel");
        let again = cache.get_with("127.0.0.1:1", |c| (c, made.fetch_add(1, std::sync::atomic::Ordering::Relaxed))).expect("channel");
        assert_eq!((first.1, again.1), (0, 0), "made once");
        assert!(cache.get_with("not a uri\n", |c| (c, 9)).is_err());
        assert!(endpoint("https://example:1", &ChannelSettings::new(Expected::Router)).is_ok(), "a full URI is taken as is");
    }
}
