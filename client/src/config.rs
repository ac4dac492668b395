//! How a [`Client`](crate::Client) and a [`Session`](crate::Session) are set up.

use std::sync::Arc;
use std::time::Duration;

use warden_proto::tls::Tls;

/// Deadline of one call, retries included, unless configured otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed to open a connection to one router, unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a session in jeopardy keeps trying before it is given up (Chubby's 45 s).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(45);

/// Where a client connects and how long its calls may take.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Router addresses (`host:port`, or a full `http://` URI); every router serves the whole
    /// `warden.v1.Warden` API. Calls start at the first and move to the next when one is
    /// unreachable.
    pub endpoints: Vec<String>,
    /// Deadline of one call, retries and failover included; sent to the router as the call's
    /// `grpc-timeout`.
    pub request_timeout: Duration,
    /// Time allowed to open a TCP connection to one router.
    pub connect_timeout: Duration,
    /// TLS to the routers: the CA they must prove themselves by, and the
    /// certificate naming this client (`warden://client/NAME`). `None`: plaintext.
    pub tls: Option<Arc<Tls>>,
    /// A bearer token naming this client's principal, sent with every call (`authorization:
    /// Bearer TOKEN`): for a client without a certificate of its own ([`Tls::load_ca_only`]).
    pub token: Option<String>,
    /// Node addresses (`host:port`) to read the routing table from. Set: a call that one
    /// group serves goes straight to that group's leader, one hop and one process fewer
    /// than through a router; the routers (`endpoints`) still take everything else and any
    /// call the table cannot place (see docs/concepts.md, "Direct calls"). Empty (the
    /// default): every call goes through the routers. Needs a cluster without TLS.
    pub nodes: Vec<String>,
}

impl ClientConfig {
    /// The default timeouts for `endpoints`.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            tls: None,
            token: None,
            nodes: Vec::new(),
        }
    }
}

/// How a session is opened and kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// The lease asked for; the server may raise it to its minimum or lower it to its maximum
    /// ([`Session::ttl`](crate::Session::ttl) is what it granted). Keepalives go every third of it.
    pub ttl: Duration,
    /// How long the session stays in [`Jeopardy`](crate::SessionState::Jeopardy) after its
    /// local lease lapsed before it is given up as [`Expired`](crate::SessionState::Expired).
    pub grace_period: Duration,
    /// Home the session in the group serving this path (near the ephemerals and locks it will
    /// hold); `None`: the router picks a group.
    pub path_hint: Option<String>,
}

impl SessionConfig {
    /// A session of `ttl` with the default grace period and no path hint.
    pub fn new(ttl: Duration) -> SessionConfig {
        SessionConfig { ttl, grace_period: DEFAULT_GRACE_PERIOD, path_hint: None }
    }
}
