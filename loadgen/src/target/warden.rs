//! Warden through its routers, with the client library (`warden-client`): the calls a user's
//! program makes, failover and retries included.

use std::time::Duration;

use warden_client::recipes::{Election, Leadership};
use warden_client::{
    Client, ClientConfig, Compare, CompareOp, Consistency, CreateOptions, DeleteOptions, Error, LockGuard, Session, SessionConfig, Txn, TxnOp,
    TxnOpResult, WatchOptions,
};

use super::{ConnectOptions, Connection, OpError, ReadConsistency, Target, WatchEvent, WatchEvents, WATCH_EVENTS_BUFFERED_MAX};

/// Warden's clients: `conns` client-library clients, each with its own connection to every
/// router; client `i` shares the `i % conns`-th. Connection `c` lists the routers starting
/// at the `c % routers`-th, so the connections (and the clients on them) spread evenly over
/// the routers: a client library sends to its first reachable router until that one fails.
/// With node addresses (`--nodes`), each client also calls group leaders directly.
pub struct WardenTarget {
    clients: Vec<Client>,
    session_ttl: Duration,
}

impl WardenTarget {
    /// Connects `options.conns` clients to the routers.
    pub async fn connect(options: &ConnectOptions) -> Result<WardenTarget, OpError> {
        let mut clients = Vec::with_capacity(options.conns.max(1));
        for conn in 0..options.conns.max(1) {
            let mut routers = options.endpoints.clone();
            let first = conn % routers.len().max(1);
            routers.rotate_left(first);
            let mut config = ClientConfig::new(routers);
            config.request_timeout = options.request_timeout;
            config.nodes = options.nodes.clone();
            clients.push(Client::connect(config).await.map_err(op_error)?);
        }
        Ok(WardenTarget { clients, session_ttl: options.session_ttl })
    }
}

impl Target for WardenTarget {
    type Connection = WardenConnection;

    async fn connect(&self, index: usize, _needs_own_session: bool) -> Result<WardenConnection, OpError> {
        // Sessions are server-side objects: many share one connection.
        let client = self.clients[index % self.clients.len()].clone();
        Ok(WardenConnection { client, session_ttl: self.session_ttl, session: None, held: None, leadership: None })
    }
}

/// One client's state on Warden.
pub struct WardenConnection {
    client: Client,
    session_ttl: Duration,
    session: Option<Session>,
    /// The lock taken by the last [`Connection::lock`], released by [`Connection::unlock`].
    held: Option<LockGuard>,
    /// Kept so the leadership lasts until the process ends (it ends with the session).
    leadership: Option<Leadership>,
}

impl WardenConnection {
    fn session(&self) -> Result<&Session, OpError> {
        self.session.as_ref().ok_or_else(|| OpError::new("no_session", "the workload did not open a session"))
    }
}

/// The report's name for a client error.
pub fn op_error(error: Error) -> OpError {
    let kind = match &error {
        Error::NoNode { .. } => "not_found",
        Error::NodeExists { .. } => "exists",
        Error::BadVersion { .. } => "compare_failed",
        Error::SessionExpired => "session_expired",
        Error::DeadlineExceeded => "timeout",
        Error::OutcomeUnknown { .. } => "outcome_unknown",
        Error::Unavailable { .. } | Error::NotLeader { .. } | Error::WrongGroup { .. } => "unavailable",
        Error::Transport { .. } => "transport",
        Error::TooLarge { .. } => "too_large",
        _ => "other",
    };
    OpError::new(kind, error.to_string())
}

impl Connection for WardenConnection {
    async fn upsert(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        match self.client.create(key, value.to_vec(), &CreateOptions::persistent().create_parents()).await {
            Ok(_) => Ok(()),
            Err(Error::NodeExists { .. }) => self.put(key, value).await,
            Err(error) => Err(op_error(error)),
        }
    }

    async fn put(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        self.client.set(key, value.to_vec(), None).await.map(drop).map_err(op_error)
    }

    async fn get(&mut self, key: &str, consistency: ReadConsistency) -> Result<(), OpError> {
        let consistency = match consistency {
            ReadConsistency::Linearizable => Consistency::Linearizable,
            ReadConsistency::Stale => Consistency::Stale,
        };
        self.client.with_consistency(consistency).get(key).await.map(drop).map_err(op_error)
    }

    async fn cas_token(&mut self, key: &str) -> Result<u64, OpError> {
        self.client.get(key).await.map(|node| node.stat.version).map_err(op_error)
    }

    async fn compare_and_set(&mut self, key: &str, token: u64, value: &[u8]) -> Result<Option<u64>, OpError> {
        let txn = Txn::new().when(Compare::version(key, CompareOp::Equal, token)).then(TxnOp::set(key, value.to_vec(), None));
        let result = self.client.txn(&txn).await.map_err(op_error)?;
        if !result.succeeded {
            return Ok(None);
        }
        match result.results.first() {
            Some(TxnOpResult::Set(stat)) => Ok(Some(stat.version)),
            other => Err(OpError::new("protocol", format!("a transaction's set answered {other:?}"))),
        }
    }

    async fn create(&mut self, key: &str, value: &[u8]) -> Result<(), OpError> {
        self.client.create(key, value.to_vec(), &CreateOptions::persistent()).await.map(drop).map_err(op_error)
    }

    async fn delete(&mut self, key: &str) -> Result<(), OpError> {
        self.client.delete(key, &DeleteOptions::default()).await.map(drop).map_err(op_error)
    }

    async fn open_session(&mut self) -> Result<(), OpError> {
        self.session = Some(self.client.session(SessionConfig::new(self.session_ttl)).await.map_err(op_error)?);
        Ok(())
    }

    async fn keep_alive(&mut self) -> Result<(), OpError> {
        let session = self.session()?;
        self.client.keep_alive(session.id(), session.ttl()).await.map(drop).map_err(op_error)
    }

    async fn lock(&mut self, path: &str) -> Result<(), OpError> {
        let guard = self.session()?.lock(path).await.map_err(op_error)?;
        self.held = Some(guard);
        Ok(())
    }

    async fn unlock(&mut self, path: &str) -> Result<(), OpError> {
        let guard = self.held.take().ok_or_else(|| OpError::new("not_held", format!("unlock of {path}, which this client does not hold")))?;
        guard.unlock().await.map_err(op_error)
    }

    async fn watch(&mut self, prefix: &str) -> Result<WatchEvents, OpError> {
        let options = WatchOptions { recursive: true, ..WatchOptions::new(prefix) };
        let mut watcher = self.client.watch(options).await.map_err(op_error)?;
        let (events, receiver) = tokio::sync::mpsc::channel(WATCH_EVENTS_BUFFERED_MAX);
        tokio::spawn(async move {
            loop {
                let next = match watcher.next().await {
                    Ok(Some(event)) => Ok(WatchEvent { key: event.node.path, value: event.node.data }),
                    Ok(None) => return,
                    Err(error) => Err(op_error(error)),
                };
                let failed = next.is_err();
                // The workload stopped listening, or the watch failed: end it.
                if events.send(next).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(receiver)
    }

    async fn campaign(&mut self, path: &str, candidate: &str) -> Result<(), OpError> {
        let election = Election::new(self.session()?, path);
        self.leadership = Some(election.campaign(candidate.as_bytes().to_vec()).await.map_err(op_error)?);
        Ok(())
    }
}
