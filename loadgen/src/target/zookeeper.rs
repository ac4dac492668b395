//! ZooKeeper through the `zookeeper-client` crate (its native protocol): the calls a
//! ZooKeeper user's program makes.
//!
//! Differences from Warden worth knowing when reading a comparison:
//! - A session is a connection (one TCP connection to one server). The plain key-value
//!   workloads share `conns` sessions; the session workloads (lock, session-keepalive,
//!   election) give each client its own, with the options' session TTL as the session timeout,
//!   which the server clamps to [2, 20] × its `tickTime` (4 s to 40 s with the defaults).
//! - There is no explicit keep-alive call: the client library pings on its own.
//! - Watch events carry no data: the watch reads the value of each created or changed node
//!   (`getData`) before delivering the event, which is what a ZooKeeper user must do, so its
//!   delivery latency includes that read. The value read may be newer than the change that
//!   triggered the event.
//! - Locks and elections are Curator's recipes done here (`InterProcessMutex`, `LeaderLatch`):
//!   the crate's own Curator-compatible lock releases its node in the background when dropped,
//!   so an unlock could not be awaited (and measured). Unlike Curator, a node's name has no
//!   UUID guard, so a connection loss while creating it fails the operation instead of looking
//!   for the node.
//! - `lock` and `campaign` wait in their queue without a deadline; every other call has the
//!   options' `request_timeout` (the library has no per-request deadline of its own).

use std::time::Duration;

use zookeeper_client::{Acls, AddWatchMode, Client, CreateMode, CreateOptions, Error, EventType, MultiWriteError, MultiWriteResult, SessionState};

use super::{within, ConnectOptions, Connection, OpError, ReadConsistency, Target, WatchEvent, WatchEvents, WATCH_EVENTS_BUFFERED_MAX};

/// Nodes the loadgen creates: persistent, anyone may do anything (no ACL checks to pay for).
const PERSISTENT: CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());

/// Queue nodes of locks and elections: ephemeral (gone with the session) and sequential.
const EPHEMERAL_SEQUENTIAL: CreateOptions<'static> = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());

/// The name prefix of a lock's queue nodes (Curator's `InterProcessMutex`).
const LOCK_NODE_PREFIX: &str = "lock-";

/// The name prefix of an election's candidate nodes.
const CANDIDATE_NODE_PREFIX: &str = "c-";

/// ZooKeeper's sessions: `conns` shared ones for the key-value workloads; the session
/// workloads open one per client.
pub struct ZookeeperTarget {
    shared: Vec<Client>,
    /// The endpoints joined with `,`.
    cluster: String,
    session_ttl: Duration,
    request_timeout: Duration,
}

impl ZookeeperTarget {
    /// Opens `options.conns` sessions to the ensemble (`options.endpoints`).
    pub async fn connect(options: &ConnectOptions) -> Result<ZookeeperTarget, OpError> {
        let cluster = options.endpoints.join(",");
        let mut shared = Vec::with_capacity(options.conns.max(1));
        for _ in 0..options.conns.max(1) {
            shared.push(open_session(&cluster, options.session_ttl, options.request_timeout).await?);
        }
        Ok(ZookeeperTarget { shared, cluster, session_ttl: options.session_ttl, request_timeout: options.request_timeout })
    }
}

/// A new session to `cluster`.
async fn open_session(cluster: &str, session_ttl: Duration, request_timeout: Duration) -> Result<Client, OpError> {
    within(request_timeout, async { Client::connector().with_session_timeout(session_ttl).connect(cluster).await.map_err(op_error) }).await
}

impl Target for ZookeeperTarget {
    type Connection = ZookeeperConnection;

    /// Client `index` shares session `index % conns`, or opens its own when
    /// `needs_own_session` (its session is its connection).
    async fn connect(&self, index: usize, needs_own_session: bool) -> Result<ZookeeperConnection, OpError> {
        let client = if needs_own_session {
            open_session(&self.cluster, self.session_ttl, self.request_timeout).await?
        } else {
            self.shared[index % self.shared.len()].clone()
        };
        Ok(ZookeeperConnection { client, request_timeout: self.request_timeout, held: None })
    }
}

/// One client's state on ZooKeeper.
pub struct ZookeeperConnection {
    client: Client,
    request_timeout: Duration,
    /// The queue node of the lock taken by the last [`Connection::lock`], deleted by
    /// [`Connection::unlock`].
    held: Option<String>,
}

/// The report's name for a client error.
pub fn op_error(error: Error) -> OpError {
    let kind = match &error {
        Error::NoNode => "not_found",
        Error::NodeExists => "exists",
        Error::BadVersion => "compare_failed",
        Error::SessionExpired | Error::ClientClosed => "session_expired",
        Error::Timeout => "timeout",
        Error::ConnectionLoss => "transport",
        Error::NoHosts => "unavailable",
        Error::Throttled => "throttled",
        _ => "other",
    };
    OpError::new(kind, error.to_string())
}

/// The node `path/name`.
fn child(path: &str, name: &str) -> String {
    format!("{}/{name}", path.trim_end_matches('/'))
}

/// The sequence number of the queue node `name` if it is one of `prefix`'s.
fn queue_sequence(name: &str, prefix: &str) -> Option<i64> {
    name.strip_prefix(prefix)?.parse().ok()
}

impl ZookeeperConnection {
    /// Curator's queue recipe (`InterProcessMutex`, `LeaderLatch`): creates the
    /// ephemeral-sequential node `dir/prefix…` (and `dir` if missing), then until it is the
    /// lowest of the queue, watches its predecessor (the next lower) and waits for it to go.
    /// Returns the node's path. The wait has no deadline; each call has the request timeout.
    async fn enqueue_and_wait(&self, dir: &str, prefix: &str, data: &[u8]) -> Result<String, OpError> {
        let timeout = self.request_timeout;
        let node_prefix = child(dir, prefix);
        let (node, sequence) = loop {
            match within(timeout, async { self.client.create(&node_prefix, data, &EPHEMERAL_SEQUENTIAL).await.map_err(op_error) }).await {
                Ok((_stat, sequence)) => break (format!("{node_prefix}{sequence}"), sequence.into_i64()),
                Err(error) if error.kind == "not_found" => {
                    within(timeout, async { self.client.mkdir(dir, &PERSISTENT).await.map_err(op_error) }).await?;
                }
                Err(error) => return Err(error),
            }
        };
        match self.wait_until_lowest(dir, prefix, &node, sequence).await {
            Ok(()) => Ok(node),
            Err(error) => {
                // Leave the queue so as not to block the others until the session ends; if
                // this fails too, the session's end removes the node.
                let _ = within(timeout, async { self.client.delete(&node, None).await.map_err(op_error) }).await;
                Err(error)
            }
        }
    }

    /// Waits until `node` (sequence number `sequence`) is the lowest of `dir`'s queue `prefix`.
    async fn wait_until_lowest(&self, dir: &str, prefix: &str, node: &str, sequence: i64) -> Result<(), OpError> {
        let timeout = self.request_timeout;
        loop {
            let children = within(timeout, async { self.client.list_children(dir).await.map_err(op_error) }).await?;
            let mut present = false;
            let mut predecessor: Option<(i64, &String)> = None;
            for name in &children {
                match queue_sequence(name, prefix) {
                    Some(other) if other == sequence => present = true,
                    Some(other) if other < sequence && predecessor.is_none_or(|(highest, _)| other > highest) => predecessor = Some((other, name)),
                    _ => {}
                }
            }
            if !present {
                return Err(OpError::new("session_expired", format!("{node} left its queue (its session ended)")));
            }
            let Some((_, predecessor)) = predecessor else {
                return Ok(());
            };
            let predecessor = child(dir, predecessor);
            let (stat, watcher) = within(timeout, async { self.client.check_and_watch_stat(&predecessor).await.map_err(op_error) }).await?;
            if stat.is_some() {
                // Deleted, or a session event: either way, look at the queue again.
                watcher.changed().await;
            }
        }
    }
}

impl Connection for ZookeeperConnection {
    /// `create` of the key after making its missing parents (persistent); `setData` when it
    /// exists.
    async fn upsert(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        let client = &self.client;
        within(self.request_timeout, async {
            if let Some((parent, _)) = key.rsplit_once('/').filter(|(parent, _)| !parent.is_empty()) {
                client.mkdir(parent, &PERSISTENT).await.map_err(op_error)?;
            }
            match client.create(key, value, &PERSISTENT).await {
                Ok(_) => Ok(()),
                Err(Error::NodeExists) => client.set_data(key, value, None).await.map(drop).map_err(op_error),
                Err(error) => Err(op_error(error)),
            }
        })
        .await
    }

    /// `setData` with any version.
    async fn put(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        within(self.request_timeout, async { self.client.set_data(key, value, None).await.map(drop).map_err(op_error) }).await
    }

    /// Linearizable: `sync` of the key, then `getData` (the connected server has caught up
    /// with the leader when `sync` answers). Stale: `getData`, served by the connected server.
    async fn get(&mut self, key: &str, consistency: ReadConsistency) -> Result<(), OpError> {
        let client = &self.client;
        within(self.request_timeout, async {
            if consistency == ReadConsistency::Linearizable {
                client.sync(key).await.map_err(op_error)?;
            }
            client.get_data(key).await.map(drop).map_err(op_error)
        })
        .await
    }

    /// The data version of the key's `Stat` (`getData`).
    async fn cas_token(&mut self, key: &str) -> Result<u64, OpError> {
        let (_, stat) = within(self.request_timeout, async { self.client.get_data(key).await.map_err(op_error) }).await?;
        u64::try_from(stat.version).map_err(|_| OpError::new("protocol", format!("{key} has version {}", stat.version)))
    }

    /// `multi(check(version), setData)`: one round trip, like etcd's and Warden's
    /// transactions (a conditional `setData` would do the same in a lighter request, but the
    /// workload measures transactions). A failed check is `Ok(None)`; the new token is the
    /// set's data version.
    async fn compare_and_set(&mut self, key: &str, token: u64, value: &[u8]) -> Result<Option<u64>, OpError> {
        let Ok(version) = i32::try_from(token) else {
            // No node has such a version: the check fails, as it would on the server.
            return Ok(None);
        };
        let mut writer = self.client.new_multi_writer();
        writer.add_check_version(key, version).map_err(op_error)?;
        writer.add_set_data(key, value, None).map_err(op_error)?;
        let results = match within(self.request_timeout, async { Ok(writer.commit().await) }).await? {
            Ok(results) => results,
            Err(MultiWriteError::OperationFailed { index: 0, source: Error::BadVersion }) => return Ok(None),
            Err(error) => return Err(op_error(error.into())),
        };
        match results.get(1) {
            Some(MultiWriteResult::SetData { stat }) => {
                u64::try_from(stat.version).map(Some).map_err(|_| OpError::new("protocol", format!("{key} has version {}", stat.version)))
            }
            other => Err(OpError::new("protocol", format!("a multi's setData answered {other:?}"))),
        }
    }

    /// `create` of a persistent node (an existing one is `exists`).
    async fn create(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        within(self.request_timeout, async { self.client.create(key, value, &PERSISTENT).await.map(drop).map_err(op_error) }).await
    }

    /// `delete` with any version.
    async fn delete(&mut self, key: &str) -> Result<(), OpError> {
        within(self.request_timeout, async { self.client.delete(key, None).await.map_err(op_error) }).await
    }

    /// Nothing to open: the session is the connection, opened with it and kept alive by the
    /// client library. Fails if that session is not connected.
    async fn open_session(&mut self) -> Result<(), OpError> {
        match self.client.state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => Ok(()),
            SessionState::Disconnected => Err(OpError::new("unavailable", "the session is disconnected")),
            state => Err(OpError::new("session_expired", format!("the session is {state:?}"))),
        }
    }

    /// [`super::UNSUPPORTED`]: ZooKeeper has no explicit keep-alive call.
    async fn keep_alive(&mut self) -> Result<(), OpError> {
        Err(OpError::unsupported("ZooKeeper has no keep-alive call: its client library pings the server on its own"))
    }

    /// Curator's `InterProcessMutex` recipe: an ephemeral-sequential `path/lock-…` node, held
    /// once it is the lowest of `path`'s queue (waiting on a watch of its predecessor).
    async fn lock(&mut self, path: &str) -> Result<(), OpError> {
        self.held = Some(self.enqueue_and_wait(path, LOCK_NODE_PREFIX, &[]).await?);
        Ok(())
    }

    /// `delete` of the lock's queue node, which wakes its successor.
    async fn unlock(&mut self, path: &str) -> Result<(), OpError> {
        let node = self.held.take().ok_or_else(|| OpError::new("not_held", format!("unlock of {path}, which this client does not hold")))?;
        within(self.request_timeout, async { self.client.delete(&node, None).await.map_err(op_error) }).await
    }

    /// A persistent recursive watch of `prefix` (`addWatch`), from when the server registered
    /// it. ZooKeeper's events carry no data: for each created or changed node, the value is
    /// read (`getData`) before the event is delivered; deleted nodes have an empty value.
    async fn watch(&mut self, prefix: &str) -> Result<WatchEvents, OpError> {
        let timeout = self.request_timeout;
        let mut watcher = within(timeout, async { self.client.watch(prefix, AddWatchMode::PersistentRecursive).await.map_err(op_error) }).await?;
        let client = self.client.clone();
        let (events, receiver) = tokio::sync::mpsc::channel(WATCH_EVENTS_BUFFERED_MAX);
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    // The workload stopped listening: end the watch (and let go of the session).
                    _ = events.closed() => return,
                    event = watcher.changed() => event,
                };
                let change = match event.event_type {
                    EventType::NodeCreated | EventType::NodeDataChanged => {
                        match within(timeout, async { client.get_data(&event.path).await.map_err(op_error) }).await {
                            Ok((value, _)) => Ok(WatchEvent { key: event.path, value }),
                            // Deleted since: its deletion event follows.
                            Err(error) if error.kind == "not_found" => continue,
                            Err(error) => Err(error),
                        }
                    }
                    EventType::NodeDeleted => Ok(WatchEvent { key: event.path, value: Vec::new() }),
                    // Not sent to recursive watches; a disconnection is survived by the watch.
                    EventType::NodeChildrenChanged => continue,
                    EventType::Session => match event.session_state {
                        SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                            Err(OpError::new("session_expired", format!("the watch's session ended: {:?}", event.session_state)))
                        }
                        _ => continue,
                    },
                };
                let failed = change.is_err();
                // The workload stopped listening, or the watch failed: end it.
                if events.send(change).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(receiver)
    }

    /// Curator's `LeaderLatch` recipe: an ephemeral-sequential candidate node `path/c-…`
    /// holding `candidate`, leading once it is the lowest (waiting on a watch of its
    /// predecessor). The leadership lasts as long as the session.
    async fn campaign(&mut self, path: &str, candidate: &str) -> Result<(), OpError> {
        self.enqueue_and_wait(path, CANDIDATE_NODE_PREFIX, candidate.as_bytes()).await.map(drop)
    }
}
