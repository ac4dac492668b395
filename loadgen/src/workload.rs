//! The workloads, written once against [`Connection`]: the key space they set up and the
//! operation each client repeats. Watch and election measure something other than a call's
//! latency and have runners of their own (`watch` and `election` modules).

use std::collections::HashMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::driver::ClientLoop;
use crate::options::{prefix, LoadArgs, Workload};
use crate::target::{Connection, OpError, ReadConsistency, Target};

/// Clients that create the key space at once before a run.
const SETUP_CONCURRENCY_MAX: usize = 64;

/// Creates every key of the key space (and each prefix's subtree) with a value of
/// `--value-bytes`, `SETUP_CONCURRENCY_MAX` at a time.
pub async fn create_key_space<T: Target>(target: &T, args: &LoadArgs, keys: usize) -> Result<(), OpError> {
    let value = value(args.value_bytes);
    let workers = keys.clamp(1, SETUP_CONCURRENCY_MAX);
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..workers {
        let mut connection = target.connect(worker, false).await?;
        let (args, value) = (args.clone(), value.clone());
        tasks.spawn(async move {
            for index in (worker..keys).step_by(workers) {
                connection.upsert(&args.key(index), &value).await?;
            }
            Ok::<(), OpError>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|error| OpError::new("setup", format!("a setup task failed: {error}")))??;
    }
    Ok(())
}

/// Makes every prefix's subtree exist (its node, for creates below it).
pub async fn create_prefixes<C: Connection>(connection: &mut C, args: &LoadArgs, below: &str) -> Result<(), OpError> {
    for index in 0..args.prefixes {
        connection.upsert(&format!("{}{below}", prefix(index)), b"").await?;
    }
    Ok(())
}

/// A value of `bytes` bytes.
pub fn value(bytes: usize) -> Vec<u8> {
    vec![b'v'; bytes]
}

/// One client of a key-value or lock workload.
pub struct KeyClient<C> {
    connection: C,
    workload: Workload,
    args: LoadArgs,
    index: usize,
    value: Vec<u8>,
    random: SmallRng,
    /// txn-cas: the token this client last saw per key (bounded by its share of the key space).
    tokens: HashMap<usize, u64>,
}

impl<C: Connection> KeyClient<C> {
    /// Client `index` of `args.workload` on `connection` (its session, if the workload needs
    /// one, already open).
    pub fn new(connection: C, args: &LoadArgs, index: usize) -> KeyClient<C> {
        KeyClient {
            connection,
            workload: args.workload,
            args: args.clone(),
            index,
            value: value(args.value_bytes),
            // Seeded by the client's index: runs repeat the same key sequence.
            random: SmallRng::seed_from_u64(index as u64),
            tokens: HashMap::new(),
        }
    }

    /// A key of the key space, uniformly.
    fn any_key(&mut self) -> String {
        let index = self.random.random_range(0..self.args.key_space);
        self.args.key(index)
    }

    /// A key of this client's own share (keys `index`, `index + clients`, …) so clients do not
    /// contend; shared by all when there are more clients than keys.
    fn own_key(&mut self) -> usize {
        let (clients, keys) = (self.args.clients, self.args.key_space);
        if clients > keys {
            return self.index % keys;
        }
        let share = (keys - self.index).div_ceil(clients);
        self.index + clients * self.random.random_range(0..share)
    }

    /// The lock this client takes: `--contention` clients per lock.
    fn lock_path(&self) -> String {
        let lock = self.index / self.args.contention;
        format!("{}/lock{lock}", prefix(lock % self.args.prefixes))
    }

    async fn compare_and_set(&mut self) -> Result<(), OpError> {
        let index = self.own_key();
        let key = self.args.key(index);
        let token = match self.tokens.get(&index) {
            Some(&token) => token,
            None => self.connection.cas_token(&key).await?,
        };
        match self.connection.compare_and_set(&key, token, &self.value).await? {
            Some(next) => {
                self.tokens.insert(index, next);
                Ok(())
            }
            None => {
                // Someone else wrote it (only when clients share keys): read it next time.
                self.tokens.remove(&index);
                Err(OpError::new("compare_failed", format!("{key} changed since version {token}")))
            }
        }
    }
}

impl<C: Connection> ClientLoop for KeyClient<C> {
    async fn op(&mut self, seq: u64) -> Result<(), OpError> {
        match self.workload {
            Workload::Put => {
                let key = self.any_key();
                self.connection.put(&key, &self.value).await
            }
            Workload::Get => {
                let key = self.any_key();
                self.connection.get(&key, self.args.consistency).await
            }
            Workload::Mixed => {
                let key = self.any_key();
                if self.random.random_bool(self.args.read_ratio) {
                    self.connection.get(&key, self.args.consistency).await
                } else {
                    self.connection.put(&key, &self.value).await
                }
            }
            Workload::TxnCas => self.compare_and_set().await,
            Workload::CreateDelete => {
                let key = format!("{}/cd/c{}-{seq}", prefix(self.index % self.args.prefixes), self.index);
                self.connection.create(&key, &self.value).await?;
                self.connection.delete(&key).await
            }
            Workload::Lock => {
                let path = self.lock_path();
                self.connection.lock(&path).await?;
                self.connection.unlock(&path).await
            }
            Workload::SessionKeepalive => self.connection.keep_alive().await,
            Workload::Watch | Workload::Election => Err(OpError::new("internal", format!("{} has its own runner", self.workload.name()))),
        }
    }
}

/// Sets up a key-value or lock workload and makes its clients.
pub async fn key_clients<T: Target>(target: &T, args: &LoadArgs) -> Result<Vec<KeyClient<T::Connection>>, OpError> {
    match args.workload {
        Workload::Put | Workload::Get | Workload::Mixed | Workload::TxnCas => create_key_space(target, args, args.key_space).await?,
        Workload::CreateDelete => create_prefixes(&mut target.connect(0, false).await?, args, "/cd").await?,
        Workload::Lock => create_prefixes(&mut target.connect(0, false).await?, args, "").await?,
        Workload::SessionKeepalive => {}
        Workload::Watch | Workload::Election => return Err(OpError::new("internal", format!("{} has its own runner", args.workload.name()))),
    }
    let needs_session = matches!(args.workload, Workload::Lock | Workload::SessionKeepalive);
    let mut clients = Vec::with_capacity(args.clients);
    for index in 0..args.clients {
        let mut connection = target.connect(index, needs_session).await?;
        if needs_session {
            connection.open_session().await?;
        }
        clients.push(KeyClient::new(connection, args, index));
    }
    Ok(clients)
}

/// The consistency a workload's reads use, if it reads.
pub fn reads_with(args: &LoadArgs) -> Option<ReadConsistency> {
    matches!(args.workload, Workload::Get | Workload::Mixed).then_some(args.consistency)
}
