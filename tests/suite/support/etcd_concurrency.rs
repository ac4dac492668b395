//! etcd's client-side concurrency recipes (Go's `go.etcd.io/etcd/client/v3/concurrency`:
//! `Session`, `Mutex`, `Election`) ported to Rust over `etcd-client`, call for call, so the
//! tests can run them against a router's etcd API where Go is not installed. They use only
//! the KV, Lease and Watch services: transactions comparing a key's create revision with 0,
//! puts with a lease, ranges sorted by create revision with a limit and filtered by a
//! maximum create revision, and watches from a revision that must see a key's delete.
//!
//! The port keeps Go's algorithm (`mutex.go`, `election.go`, `key.go`, `session.go`)
//! exactly: the same keys (`prefix/<lease in hex>`), the same transactions and reads, the
//! same revisions watched from, the same errors. Go's context cancellation has no
//! counterpart: a caller gives up by dropping the future (its key then stays until its
//! session ends, as after a Go client's crash).

use std::fmt;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, GetResponse, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse, WatchOptions,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The errors of the recipes, with Go's messages.
#[derive(Debug)]
pub enum Error {
    /// `ErrLocked`: `TryLock` found the lock held by another session.
    Locked,
    /// `ErrSessionExpired`: `Lock`'s own key was gone when the keys before it were.
    SessionExpired,
    /// `ErrLockReleased`: `Unlock` of a mutex that holds nothing.
    LockReleased,
    /// `ErrElectionNotLeader`: `Proclaim` by a candidate that does not lead.
    NotLeader,
    /// `ErrElectionNoLeader`: `Leader` of an election without candidates.
    NoLeader,
    /// A watch awaiting a delete ended without it (Go's "lost watcher waiting for delete",
    /// or the watch's error).
    LostWatcher(String),
    /// A call of etcd's API failed.
    Etcd(etcd_client::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Locked => f.write_str("mutex: Locked by another session"),
            Error::SessionExpired => f.write_str("mutex: session is expired"),
            Error::LockReleased => f.write_str("mutex: lock has already been released"),
            Error::NotLeader => f.write_str("election: not leader"),
            Error::NoLeader => f.write_str("election: no leader"),
            Error::LostWatcher(reason) => write!(f, "lost watcher waiting for delete: {reason}"),
            Error::Etcd(error) => write!(f, "{error}"),
        }
    }
}

impl From<etcd_client::Error> for Error {
    fn from(error: etcd_client::Error) -> Error {
        Error::Etcd(error)
    }
}

/// The revision of a response's header (0 without one).
fn revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |header| header.revision())
}

/// Go's `v3.WithFirstCreate()`: the key of a prefix created first (sorted by create
/// revision ascending, limit 1).
fn first_create() -> GetOptions {
    GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend).with_limit(1)
}

/// Go's `v3.WithLastCreate()`: the key of a prefix created last.
fn last_create() -> GetOptions {
    GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Descend).with_limit(1)
}

/// The keys of the `index`th operation's answer of a transaction (a range's).
fn range_kvs(answer: &TxnResponse, index: usize) -> Vec<KeyValue> {
    match answer.op_responses().into_iter().nth(index) {
        Some(TxnOpResponse::Get(range)) => range.kvs().to_vec(),
        other => panic!("operation {index} of the transaction is no range: {other:?}"),
    }
}

/// Go's `concurrency.Session`: a lease kept alive by a task renewing it every third of its
/// TTL (as Go's `client.KeepAlive`) until the lease ends, the session is orphaned or closed,
/// or it is dropped.
pub struct Session {
    client: Client,
    lease: i64,
    keeper: Option<JoinHandle<()>>,
}

impl Session {
    /// `NewSession(client, WithTTL(ttl_s))`: grants a lease and keeps it alive.
    pub async fn new(client: &Client, ttl_s: i64) -> Result<Session, Error> {
        let granted = client.clone().lease_grant(ttl_s, None).await?;
        Session::with_lease(client, granted.id(), granted.ttl()).await
    }

    /// `NewSession(client, WithLease(lease))`: keeps an existing lease of `ttl_s` alive.
    pub async fn with_lease(client: &Client, lease: i64, ttl_s: i64) -> Result<Session, Error> {
        let mut client = client.clone();
        let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
        let renew_every = Duration::from_millis(u64::try_from(ttl_s.max(1)).unwrap_or(1) * 1000 / 3);
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(renew_every).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                match answers.message().await {
                    Ok(Some(answer)) if answer.ttl() > 0 => {}
                    _ => return,
                }
            }
        });
        Ok(Session { client, lease, keeper: Some(keeper) })
    }

    /// `Session.Lease()`.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// `Session.Client()`.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// `Session.Orphan()`: stops renewing the lease, which then expires after its TTL.
    pub fn orphan(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
    }

    /// `Session.Close()`: orphans the session and revokes its lease (deleting its keys).
    pub async fn close(mut self) -> Result<(), Error> {
        self.orphan();
        self.client.lease_revoke(self.lease).await?;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.orphan();
    }
}

/// Go's `waitDelete`: watches `key` from `revision` until an event deletes it.
async fn wait_delete(client: &mut Client, key: &[u8], revision: i64) -> Result<(), Error> {
    let mut watch = client.watch(key, Some(WatchOptions::new().with_start_revision(revision))).await?;
    while let Some(answer) = watch.message().await? {
        if answer.canceled() {
            return Err(Error::LostWatcher(format!("the watch was cancelled: {}", answer.cancel_reason())));
        }
        if answer.events().iter().any(|event| event.event_type() == EventType::Delete) {
            return Ok(());
        }
    }
    Err(Error::LostWatcher("the watch ended".into()))
}

/// Go's `waitDeletes`: waits until no key of `prefix` has a create revision up to
/// `max_create_revision`, watching the last created of them for its delete at each step.
async fn wait_deletes(client: &mut Client, prefix: &str, max_create_revision: i64) -> Result<(), Error> {
    loop {
        let answer = client.get(prefix, Some(last_create().with_max_create_revision(max_create_revision))).await?;
        let Some(last) = answer.kvs().first() else { return Ok(()) };
        wait_delete(client, last.key(), revision(answer.header())).await?;
    }
}

/// The key Go's `Mutex` holds when it holds none (`"\x00"`).
const RELEASED_KEY: &str = "\0";

/// Go's `concurrency.Mutex`: a session's key `prefix/<lease in hex>`; the key of the prefix
/// created first holds the lock, the others wait for the keys created before theirs.
pub struct Mutex {
    client: Client,
    lease: i64,
    prefix: String,
    my_key: String,
    my_revision: i64,
    header_revision: i64,
}

impl Mutex {
    /// `NewMutex(session, prefix)`: the lock of the keys below `prefix + "/"`.
    pub fn new(session: &Session, prefix: &str) -> Mutex {
        Mutex {
            client: session.client(),
            lease: session.lease(),
            prefix: format!("{prefix}/"),
            my_key: String::new(),
            my_revision: -1,
            header_revision: 0,
        }
    }

    /// `Mutex.tryAcquire`: puts this session's key unless it exists (`CreateRevision == 0`)
    /// and reads the prefix's first created key, in one transaction.
    async fn try_acquire(&mut self) -> Result<TxnResponse, Error> {
        self.my_key = format!("{}{:x}", self.prefix, self.lease);
        let compare = Compare::create_revision(self.my_key.as_str(), CompareOp::Equal, 0);
        let put = TxnOp::put(self.my_key.as_str(), "", Some(PutOptions::new().with_lease(self.lease)));
        let get = TxnOp::get(self.my_key.as_str(), None);
        let get_owner = TxnOp::get(self.prefix.as_str(), Some(first_create()));
        let answer = self.client.txn(Txn::new().when([compare]).and_then([put, get_owner.clone()]).or_else([get, get_owner])).await?;
        self.my_revision = revision(answer.header());
        if !answer.succeeded() {
            let mine = range_kvs(&answer, 0);
            self.my_revision = mine.first().expect("the else branch runs only when the key exists").create_revision();
        }
        Ok(answer)
    }

    /// Whether the owner read by [`Mutex::try_acquire`] is this mutex's key (or none is).
    fn owns(&self, acquired: &TxnResponse) -> bool {
        range_kvs(acquired, 1).first().is_none_or(|owner| owner.create_revision() == self.my_revision)
    }

    /// `Mutex.TryLock`: the lock if no other session holds it, else [`Error::Locked`] (and
    /// this session's key deleted again).
    pub async fn try_lock(&mut self) -> Result<(), Error> {
        let acquired = self.try_acquire().await?;
        if self.owns(&acquired) {
            self.header_revision = revision(acquired.header());
            return Ok(());
        }
        self.client.delete(self.my_key.as_str(), None).await?;
        self.my_key = RELEASED_KEY.into();
        self.my_revision = -1;
        Err(Error::Locked)
    }

    /// `Mutex.Lock`: puts this session's key, waits until every key of the prefix created
    /// before it is deleted, then checks its own key still exists ([`Error::SessionExpired`]
    /// if not).
    pub async fn lock(&mut self) -> Result<(), Error> {
        let acquired = self.try_acquire().await?;
        if self.owns(&acquired) {
            self.header_revision = revision(acquired.header());
            return Ok(());
        }
        let mut client = self.client.clone();
        if let Err(error) = wait_deletes(&mut client, &self.prefix, self.my_revision - 1).await {
            let _ = self.unlock().await;
            return Err(error);
        }
        let mine = match client.get(self.my_key.as_str(), None).await {
            Ok(mine) => mine,
            Err(error) => {
                let _ = self.unlock().await;
                return Err(error.into());
            }
        };
        if mine.kvs().is_empty() {
            return Err(Error::SessionExpired);
        }
        self.header_revision = revision(mine.header());
        Ok(())
    }

    /// `Mutex.Unlock`: deletes this session's key ([`Error::LockReleased`] if it holds none).
    pub async fn unlock(&mut self) -> Result<(), Error> {
        if self.my_key.is_empty() || self.my_revision <= 0 || self.my_key == RELEASED_KEY {
            return Err(Error::LockReleased);
        }
        assert!(self.my_key.starts_with(&self.prefix), "invalid key {:?}, it should have prefix {:?}", self.my_key, self.prefix);
        self.client.delete(self.my_key.as_str(), None).await?;
        self.my_key = RELEASED_KEY.into();
        self.my_revision = -1;
        Ok(())
    }

    /// `Mutex.IsOwner()`: the compare that holds while this mutex holds the lock (for a
    /// transaction fenced by it).
    pub fn is_owner(&self) -> Compare {
        Compare::create_revision(self.my_key.as_str(), CompareOp::Equal, self.my_revision)
    }

    /// `Mutex.Key()`.
    pub fn key(&self) -> &str {
        &self.my_key
    }

    /// The create revision of this mutex's key (Go's private `myRev`).
    pub fn revision(&self) -> i64 {
        self.my_revision
    }

    /// The revision of `Mutex.Header()`: of the answer that gave the lock.
    pub fn header_revision(&self) -> i64 {
        self.header_revision
    }
}

/// One answer of [`Election::observe`] (Go's `GetResponse` on its channel): the leader's
/// key and the revision answered with it.
#[derive(Clone, Debug)]
pub struct Observation {
    /// The header's revision.
    pub revision: i64,
    /// The leader's key, value and revisions.
    pub kv: KeyValue,
}

impl Observation {
    /// The leader's value, as text.
    pub fn value(&self) -> String {
        String::from_utf8_lossy(self.kv.value()).into_owned()
    }
}

/// The channel of [`Election::observe`]: its task stops when this is dropped (Go's
/// cancelled context).
pub struct Observer {
    answers: mpsc::Receiver<Observation>,
    task: JoinHandle<()>,
}

impl Observer {
    /// The next answer (`None`: the observation ended, as Go's closed channel).
    pub async fn next(&mut self) -> Option<Observation> {
        self.answers.recv().await
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Go's `concurrency.Election`: each candidate a key `prefix/<lease in hex>` holding its
/// value; the key of the prefix created first leads.
pub struct Election {
    client: Client,
    lease: i64,
    key_prefix: String,
    leader_key: String,
    leader_revision: i64,
    /// The lease of the leader's session (Go's `leaderSession`), while campaigning or leading.
    leader_lease: Option<i64>,
    header_revision: i64,
}

impl Election {
    /// `NewElection(session, prefix)`: the election of the keys below `prefix + "/"`.
    pub fn new(session: &Session, prefix: &str) -> Election {
        Election {
            client: session.client(),
            lease: session.lease(),
            key_prefix: format!("{prefix}/"),
            leader_key: String::new(),
            leader_revision: 0,
            leader_lease: None,
            header_revision: 0,
        }
    }

    /// `ResumeElection(session, prefix, leader_key, leader_revision)`: an election led by
    /// `leader_key`. As in Go, `prefix` is taken as the key prefix itself (no `/` added).
    pub fn resume(session: &Session, prefix: &str, leader_key: &str, leader_revision: i64) -> Election {
        Election {
            client: session.client(),
            lease: session.lease(),
            key_prefix: prefix.into(),
            leader_key: leader_key.into(),
            leader_revision,
            leader_lease: Some(session.lease()),
            header_revision: 0,
        }
    }

    /// `Election.Campaign`: puts this session's key holding `value` unless it exists (then
    /// proclaims `value` if it differs), and waits until every key of the prefix created
    /// before it is deleted.
    pub async fn campaign(&mut self, value: &str) -> Result<(), Error> {
        let key = format!("{}{:x}", self.key_prefix, self.lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), value, Some(PutOptions::new().with_lease(self.lease)))])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let answer = self.client.txn(txn).await?;
        (self.leader_key, self.leader_revision, self.leader_lease) = (key, revision(answer.header()), Some(self.lease));
        if !answer.succeeded() {
            let existing = range_kvs(&answer, 0);
            let kv = existing.first().expect("the else branch runs only when the key exists");
            self.leader_revision = kv.create_revision();
            if kv.value() != value.as_bytes() {
                if let Err(error) = self.proclaim(value).await {
                    let _ = self.resign().await;
                    return Err(error);
                }
            }
        }
        let mut client = self.client.clone();
        if let Err(error) = wait_deletes(&mut client, &self.key_prefix, self.leader_revision - 1).await {
            self.leader_lease = None;
            return Err(error);
        }
        self.header_revision = revision(answer.header());
        Ok(())
    }

    /// `Election.Proclaim`: puts `value` in the leader's key if it is still the key this
    /// election created ([`Error::NotLeader`] otherwise).
    pub async fn proclaim(&mut self, value: &str) -> Result<(), Error> {
        let Some(lease) = self.leader_lease else { return Err(Error::NotLeader) };
        let txn = Txn::new()
            .when([Compare::create_revision(self.leader_key.as_str(), CompareOp::Equal, self.leader_revision)])
            .and_then([TxnOp::put(self.leader_key.as_str(), value, Some(PutOptions::new().with_lease(lease)))]);
        let answer = self.client.txn(txn).await?;
        if !answer.succeeded() {
            self.leader_key.clear();
            return Err(Error::NotLeader);
        }
        self.header_revision = revision(answer.header());
        Ok(())
    }

    /// `Election.Resign`: deletes the leader's key if it is still the key this election
    /// created.
    pub async fn resign(&mut self) -> Result<(), Error> {
        if self.leader_lease.is_none() {
            return Ok(());
        }
        let txn = Txn::new()
            .when([Compare::create_revision(self.leader_key.as_str(), CompareOp::Equal, self.leader_revision)])
            .and_then([TxnOp::delete(self.leader_key.as_str(), None)]);
        let answer = self.client.txn(txn).await;
        if let Ok(answer) = &answer {
            self.header_revision = revision(answer.header());
        }
        self.leader_key.clear();
        self.leader_lease = None;
        answer.map(drop).map_err(Error::from)
    }

    /// `Election.Leader`: the key of the prefix created first ([`Error::NoLeader`] if none).
    pub async fn leader(&self) -> Result<GetResponse, Error> {
        let answer = self.client.clone().get(self.key_prefix.as_str(), Some(first_create())).await?;
        if answer.kvs().is_empty() {
            return Err(Error::NoLeader);
        }
        Ok(answer)
    }

    /// `Election.Observe`: the leader, then each value it proclaims, then the next leader
    /// once its key is deleted, and so on.
    pub fn observe(&self) -> Observer {
        let (sender, answers) = mpsc::channel(1);
        let task = tokio::spawn(observe(self.client.clone(), self.key_prefix.clone(), sender));
        Observer { answers, task }
    }

    /// `Election.Key()`.
    pub fn key(&self) -> &str {
        &self.leader_key
    }

    /// `Election.Rev()`: the create revision of the leader's key.
    pub fn revision(&self) -> i64 {
        self.leader_revision
    }

    /// The revision of `Election.Header()`.
    pub fn header_revision(&self) -> i64 {
        self.header_revision
    }
}

/// Go's `Election.observe`: sends each leader and value to `sender` until a call fails or
/// the receiver is gone.
async fn observe(mut client: Client, prefix: String, sender: mpsc::Sender<Observation>) {
    loop {
        let Ok(answer) = client.get(prefix.as_str(), Some(first_create())).await else { return };
        let leader = match answer.kvs().first() {
            Some(kv) => Observation { revision: revision(answer.header()), kv: kv.clone() },
            None => {
                // Waits for the first key put on the prefix (a delete would make it spin).
                let options = WatchOptions::new().with_start_revision(revision(answer.header())).with_prefix();
                let Ok(mut watch) = client.watch(prefix.as_str(), Some(options)).await else { return };
                loop {
                    let Ok(Some(answer)) = watch.message().await else { return };
                    if answer.canceled() {
                        return;
                    }
                    let put = answer.events().iter().find(|event| event.event_type() == EventType::Put).and_then(|event| event.kv());
                    if let Some(kv) = put {
                        break Observation { revision: kv.mod_revision(), kv: kv.clone() };
                    }
                }
            }
        };
        let key = leader.kv.key().to_vec();
        let watch_from = leader.revision + 1;
        if sender.send(leader).await.is_err() {
            return;
        }
        let Ok(mut watch) = client.watch(key, Some(WatchOptions::new().with_start_revision(watch_from))).await else { return };
        'deleted: loop {
            let Ok(Some(answer)) = watch.message().await else { return };
            if answer.canceled() {
                return;
            }
            for event in answer.events() {
                if event.event_type() == EventType::Delete {
                    break 'deleted;
                }
                let Some(kv) = event.kv() else { continue };
                if sender.send(Observation { revision: revision(answer.header()), kv: kv.clone() }).await.is_err() {
                    return;
                }
            }
        }
    }
}
