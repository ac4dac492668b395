//! etcd v3 through the `etcd-client` crate (gRPC): the calls an etcd user's program makes.
//!
//! Differences from Warden worth knowing when reading a comparison:
//! - etcd has no hierarchy: a key is a flat string, `upsert` needs no parents and a watch of a
//!   prefix is a range watch over every key starting with it.
//! - A session is a lease. Its TTL is in whole seconds (rounded up, at least 1) and the server
//!   raises it to its minimum (about 1.5 × the election timeout, 2 s with the defaults).
//! - `lock` and `campaign` have no deadline: they wait in the queue as long as it takes, which
//!   is what the workloads measure. Every other call has the options' `request_timeout`.
//! - Dropping a connection stops its keep-alives without revoking its lease: the lease, with
//!   the locks and leadership it holds, ends at its expiry, as when a client process is killed.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, Error, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, LockOptions, Txn, TxnOp, WatchOptions,
};

use super::{within, ConnectOptions, Connection, OpError, ReadConsistency, Target, WatchEvent, WatchEvents, WATCH_EVENTS_BUFFERED_MAX};

/// etcd's clients: `conns` gRPC clients, each with its own channel (one HTTP/2 connection per
/// endpoint, requests balanced over them); client `i` shares the `i % conns`-th.
pub struct EtcdTarget {
    clients: Vec<Client>,
    session_ttl: Duration,
    request_timeout: Duration,
}

impl EtcdTarget {
    /// Connects `options.conns` clients to the etcd endpoints.
    pub async fn connect(options: &ConnectOptions) -> Result<EtcdTarget, OpError> {
        let mut clients = Vec::with_capacity(options.conns.max(1));
        for _ in 0..options.conns.max(1) {
            let connect_options = etcd_client::ConnectOptions::new().with_connect_timeout(options.request_timeout);
            let client = within(options.request_timeout, async {
                let mut client = Client::connect(&options.endpoints, Some(connect_options)).await.map_err(op_error)?;
                // The client's channel dials lazily: one call, so that an unreachable cluster
                // fails the connection (a setup failure) rather than the workload's first call.
                client.status().await.map_err(op_error)?;
                Ok(client)
            })
            .await?;
            clients.push(client);
        }
        Ok(EtcdTarget { clients, session_ttl: options.session_ttl, request_timeout: options.request_timeout })
    }
}

impl Target for EtcdTarget {
    type Connection = EtcdConnection;

    /// Client `index` shares channel `index % conns`; `needs_own_session` changes nothing, as
    /// leases are server-side objects multiplexed over a channel.
    async fn connect(&self, index: usize, _needs_own_session: bool) -> Result<EtcdConnection, OpError> {
        let client = self.clients[index % self.clients.len()].clone();
        Ok(EtcdConnection { client, session_ttl: self.session_ttl, request_timeout: self.request_timeout, session: None, held: None })
    }
}

/// One client's state on etcd.
pub struct EtcdConnection {
    client: Client,
    session_ttl: Duration,
    request_timeout: Duration,
    session: Option<EtcdSession>,
    /// The key of the lock taken by the last [`Connection::lock`], released by
    /// [`Connection::unlock`].
    held: Option<Vec<u8>>,
}

/// A lease kept alive in the background, with a keep-alive stream of its own for explicit
/// keep-alives.
struct EtcdSession {
    lease: i64,
    keeper: LeaseKeeper,
    responses: LeaseKeepAliveStream,
    /// Dropped with the connection, which ends the background keep-alive task.
    _stop_keep_alives: tokio::sync::oneshot::Sender<()>,
}

impl EtcdConnection {
    fn session(&mut self) -> Result<&mut EtcdSession, OpError> {
        self.session.as_mut().ok_or_else(|| OpError::new("no_session", "the workload did not open a session"))
    }
}

/// The report's name for a client error.
pub fn op_error(error: Error) -> OpError {
    let kind = match &error {
        Error::GRpcStatus(status) => match status.code() {
            tonic::Code::DeadlineExceeded => "timeout",
            tonic::Code::Unavailable => "unavailable",
            tonic::Code::NotFound => "not_found",
            tonic::Code::ResourceExhausted => "too_large",
            _ => "other",
        },
        Error::TransportError(_) | Error::IoError(_) => "transport",
        // A keep-alive stream that cannot be written to any more.
        Error::LeaseKeepAliveError(_) => "transport",
        _ => "other",
    };
    OpError::new(kind, error.to_string())
}

/// `key` does not exist.
fn not_found(key: &str) -> OpError {
    OpError::new("not_found", format!("{key} does not exist"))
}

/// One keep-alive request on `keeper`'s stream and its answer; a lease the server no longer
/// has (TTL ≤ 0) is an expired session.
async fn keep_alive_once(keeper: &mut LeaseKeeper, responses: &mut LeaseKeepAliveStream) -> Result<(), OpError> {
    keeper.keep_alive().await.map_err(op_error)?;
    match responses.message().await.map_err(op_error)? {
        Some(response) if response.ttl() > 0 => Ok(()),
        Some(_) => Err(OpError::new("session_expired", format!("lease {:x} expired", keeper.id()))),
        None => Err(OpError::new("transport", "the keep-alive stream ended")),
    }
}

impl Connection for EtcdConnection {
    /// `Put`: etcd keys have no parents to create.
    async fn upsert(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        self.put(key, value).await
    }

    /// `Put` (which would also create a missing key).
    async fn put(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        within(self.request_timeout, async { self.client.put(key, value, None).await.map(drop).map_err(op_error) }).await
    }

    /// `Range` of the key: linearizable is etcd's default range (through the leader's read
    /// index), stale its `serializable` range (served by the connected member).
    async fn get(&mut self, key: &str, consistency: ReadConsistency) -> Result<(), OpError> {
        let options = match consistency {
            ReadConsistency::Linearizable => GetOptions::new(),
            ReadConsistency::Stale => GetOptions::new().with_serializable(),
        };
        let response = within(self.request_timeout, async { self.client.get(key, Some(options)).await.map_err(op_error) }).await?;
        if response.kvs().is_empty() {
            return Err(not_found(key));
        }
        Ok(())
    }

    /// The key's `mod_revision` (a linearizable `Range`).
    async fn cas_token(&mut self, key: &str) -> Result<u64, OpError> {
        let response = within(self.request_timeout, async { self.client.get(key, None).await.map_err(op_error) }).await?;
        let kv = response.kvs().first().ok_or_else(|| not_found(key))?;
        u64::try_from(kv.mod_revision()).map_err(|_| OpError::new("protocol", format!("{key} has mod_revision {}", kv.mod_revision())))
    }

    /// `Txn`: if the key's `mod_revision` is `token`, `Put`; the new token is the transaction's
    /// revision (the key's new `mod_revision`).
    async fn compare_and_set(&mut self, key: &str, token: u64, value: &[u8]) -> Result<Option<u64>, OpError> {
        let Ok(revision) = i64::try_from(token) else {
            // No key has such a revision: the compare fails, as it would on the server.
            return Ok(None);
        };
        let txn = Txn::new().when([Compare::mod_revision(key, CompareOp::Equal, revision)]).and_then([TxnOp::put(key, value, None)]);
        let response = within(self.request_timeout, async { self.client.txn(txn).await.map_err(op_error) }).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        let revision = response.header().map(|header| header.revision()).unwrap_or_default();
        u64::try_from(revision).map(Some).map_err(|_| OpError::new("protocol", format!("a transaction answered revision {revision}")))
    }

    /// `Txn`: if the key's `create_revision` is 0 (it does not exist), `Put`; otherwise `exists`.
    async fn create(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(key, value, None)]);
        let response = within(self.request_timeout, async { self.client.txn(txn).await.map_err(op_error) }).await?;
        if !response.succeeded() {
            return Err(OpError::new("exists", format!("{key} already exists")));
        }
        Ok(())
    }

    /// `DeleteRange` of the key; nothing deleted is `not_found`.
    async fn delete(&mut self, key: &str) -> Result<(), OpError> {
        let response = within(self.request_timeout, async { self.client.delete(key, None).await.map_err(op_error) }).await?;
        if response.deleted() == 0 {
            return Err(not_found(key));
        }
        Ok(())
    }

    /// `LeaseGrant` with the TTL in whole seconds (rounded up, at least 1), then two
    /// `LeaseKeepAlive` streams: one a background task uses every third of the granted TTL
    /// until the connection is dropped, one kept for [`Connection::keep_alive`].
    async fn open_session(&mut self) -> Result<(), OpError> {
        let ttl_s = i64::try_from(self.session_ttl.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1);
        let client = &mut self.client;
        let (lease, granted_ttl_s, (mut background_keeper, mut background_responses), (keeper, responses)) = within(self.request_timeout, async {
            let grant = client.lease_grant(ttl_s, None).await.map_err(op_error)?;
            let background = client.lease_keep_alive(grant.id()).await.map_err(op_error)?;
            let explicit = client.lease_keep_alive(grant.id()).await.map_err(op_error)?;
            Ok((grant.id(), grant.ttl(), background, explicit))
        })
        .await?;
        // The granted TTL: the server raises a TTL below its minimum.
        let period = Duration::from_secs(u64::try_from(granted_ttl_s).unwrap_or(1).max(1)) / 3;
        let (stop_keep_alives, mut stopped) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let keep_alive = async {
                    ticks.tick().await;
                    keep_alive_once(&mut background_keeper, &mut background_responses).await
                };
                tokio::select! {
                    // The connection was dropped, even while a keep-alive is unanswered.
                    _ = &mut stopped => return,
                    result = keep_alive => {
                        // A failed keep-alive ends the session: the workload sees it on its
                        // next call that uses the lease (as a user's program would).
                        if result.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        self.session = Some(EtcdSession { lease, keeper, responses, _stop_keep_alives: stop_keep_alives });
        Ok(())
    }

    /// One request on the session's `LeaseKeepAlive` stream and its response.
    async fn keep_alive(&mut self) -> Result<(), OpError> {
        let timeout = self.request_timeout;
        let session = self.session()?;
        within(timeout, keep_alive_once(&mut session.keeper, &mut session.responses)).await
    }

    /// etcd's `Lock` service with the session's lease (waits in the lock's queue, no deadline),
    /// keeping the returned key for [`Connection::unlock`].
    async fn lock(&mut self, path: &str) -> Result<(), OpError> {
        let lease = self.session()?.lease;
        let response = self.client.lock(path, Some(LockOptions::new().with_lease(lease))).await.map_err(op_error)?;
        self.held = Some(response.key().to_vec());
        Ok(())
    }

    /// `Unlock` of the key [`Connection::lock`] returned.
    async fn unlock(&mut self, path: &str) -> Result<(), OpError> {
        let key = self.held.take().ok_or_else(|| OpError::new("not_held", format!("unlock of {path}, which this client does not hold")))?;
        within(self.request_timeout, async { self.client.unlock(key).await.map(drop).map_err(op_error) }).await
    }

    /// `Watch` of every key starting with `prefix`, from the watch's creation (this returns once
    /// the server confirmed it); `Put` events carry the value, `Delete` events an empty one.
    async fn watch(&mut self, prefix: &str) -> Result<WatchEvents, OpError> {
        let client = &mut self.client;
        let mut stream = within(self.request_timeout, async {
            let mut stream = client.watch(prefix, Some(WatchOptions::new().with_prefix())).await.map_err(op_error)?;
            match stream.message().await.map_err(op_error)? {
                Some(response) if response.created() => Ok(stream),
                Some(response) => Err(OpError::new("other", format!("the watch was not created: {}", response.cancel_reason()))),
                None => Err(OpError::new("transport", "the watch stream ended before the watch was created")),
            }
        })
        .await?;
        let (events, receiver) = tokio::sync::mpsc::channel(WATCH_EVENTS_BUFFERED_MAX);
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    // The workload stopped listening: end the watch (closing its stream).
                    _ = events.closed() => return,
                    message = stream.message() => message,
                };
                let response = match message {
                    Ok(Some(response)) if response.canceled() => {
                        Err(OpError::new("other", format!("the server canceled the watch: {}", response.cancel_reason())))
                    }
                    Ok(Some(response)) => Ok(response),
                    Ok(None) => return,
                    Err(error) => Err(op_error(error)),
                };
                let changes = match response {
                    Ok(response) => response
                        .events()
                        .iter()
                        .filter_map(|event| {
                            let kv = event.kv()?;
                            let value = match event.event_type() {
                                EventType::Put => kv.value().to_vec(),
                                EventType::Delete => Vec::new(),
                            };
                            Some(Ok(WatchEvent { key: String::from_utf8_lossy(kv.key()).into_owned(), value }))
                        })
                        .collect(),
                    Err(error) => vec![Err(error)],
                };
                for change in changes {
                    let failed = change.is_err();
                    // The workload stopped listening, or the watch failed: end it.
                    if events.send(change).await.is_err() || failed {
                        return;
                    }
                }
            }
        });
        Ok(receiver)
    }

    /// etcd's `Election.Campaign` with the session's lease, as `candidate` (no deadline: it
    /// returns when this client leads). The leadership lasts as long as the lease.
    async fn campaign(&mut self, path: &str, candidate: &str) -> Result<(), OpError> {
        let lease = self.session()?.lease;
        self.client.campaign(path, candidate, lease).await.map(drop).map_err(op_error)
    }
}
