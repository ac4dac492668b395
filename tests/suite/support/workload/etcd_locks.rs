//! The etcd part of the workload, through a router's etcd API with leases the clients keep
//! alive themselves, as an etcd user's code does:
//!
//! - lockers take etcd's `v3lockpb.Lock`, and campaigners win etcd's `v3electionpb`
//!   election (`Campaign`, `Proclaim`, `Resign`), each writing to the fenced resource while
//!   its lease is known to hold, with etcd's fencing token: the lock's answer revision, the
//!   leader key's creation revision. The model is etcd's: a lock or a leadership is held by
//!   one lease at a time, a lease's hold ends with it, and tokens grow; the fenced
//!   resource's checks judge it (holds exclusive, tokens growing in hold order). etcd has
//!   no lock-delay, so the lock-delay check does not apply to these holds. Each lock hold
//!   also asks `Lock` again with a deadline too short to be answered and drops the call,
//!   as a client library retrying after UNAVAILABLE does: the hold must survive it. A
//!   crashing locker holds, writes once and stops renewing its lease, as a holder that
//!   crashed would: the lock is handed on only once the lease expired.
//! - a leased-key client puts a key with a fresh lease, reads it back while the lease
//!   surely holds (it must be there), revokes the lease and, once the revoke answered,
//!   reads it again (it must be gone: etcd deletes a lease's keys before it answers).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, LockOptions, ProclaimOptions, PutOptions, ResignOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Anomaly, FencedResource, Outcomes, CALL_TIMEOUT, CRASH_EVERY, WRITES_PER_HOLD};

/// The etcd lock's name (a Warden path in a group of its own, [`super::PREFIXES`]), and the
/// path its holds are logged under in the fenced resource.
pub const ETCD_LOCK: &str = "/b/etcd-locks/z";
pub const ETCD_RESOURCE: &str = "etcd /b/etcd-locks/z";
/// Lockers of [`ETCD_LOCK`] besides the crashing one.
const ETCD_LOCKERS: usize = 2;
/// The etcd election's name (in another group than the lock), and the path its leaders'
/// terms are logged under in the fenced resource.
pub const ETCD_ELECTION: &str = "/c/etcd-elections/e";
pub const ELECTION_RESOURCE: &str = "etcd-election /c/etcd-elections/e";
/// Campaigners of [`ETCD_ELECTION`].
const CAMPAIGNERS: usize = 2;
/// Where the leased-key client puts its keys (in another group than the leases' homes'
/// usual one: the key's group learns of the lease from its home).
const LEASED_KEYS: &str = "/d/etcd-leased";
/// The leases' TTL (Warden's session minimum) and how often they are renewed.
const LEASE_TTL_S: i64 = 3;
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long one `Lock` call may wait before the locker drops it.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// The deadline of a holder's repeated `Lock`: too short for an answer, so it is cancelled.
const REPEATED_LOCK_WAIT: Duration = Duration::from_millis(20);

/// Starts the etcd lockers, campaigners and the leased-key client against the etcd API at
/// `etcd_addr`; each logs its calls in `outcomes()`, the holds' writes go to `resource`,
/// and the leased keys' findings to `leased`.
pub async fn start(
    etcd_addr: &str,
    outcomes: impl Fn() -> Outcomes,
    resource: &Arc<FencedResource>,
    leased: &Arc<LeasedKeys>,
    tasks: &mut Vec<JoinHandle<()>>,
) {
    let options = ConnectOptions::new().with_timeout(CALL_TIMEOUT).with_connect_timeout(CALL_TIMEOUT);
    let client = Client::connect([etcd_addr], Some(options)).await.unwrap_or_else(|error| panic!("connect to the etcd API at {etcd_addr}: {error}"));
    for _ in 0..ETCD_LOCKERS {
        tasks.push(tokio::spawn(etcd_locker(client.clone(), outcomes(), resource.clone())));
    }
    for _ in 0..CAMPAIGNERS {
        tasks.push(tokio::spawn(campaigner(client.clone(), outcomes(), resource.clone())));
    }
    tasks.push(tokio::spawn(leased_key_client(client.clone(), outcomes(), leased.clone())));
    tasks.push(tokio::spawn(crashing_etcd_locker(client, outcomes(), resource.clone())));
}

/// What the leased-key client found: the keys checked gone after their lease's revoke, the
/// reads that found a key while its lease held, and the anomalies (`etcd-leased-key-lost`:
/// not found while its lease surely held; `etcd-leased-key-kept`: found after the revoke
/// answered).
#[derive(Default)]
pub struct LeasedKeys {
    revoked: std::sync::atomic::AtomicUsize,
    found: std::sync::atomic::AtomicUsize,
    anomalies: Mutex<Vec<Anomaly>>,
}

impl LeasedKeys {
    /// Keys read gone after their lease's revoke answered.
    pub fn revoked(&self) -> usize {
        self.revoked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reads that found a key while its lease held.
    pub fn found(&self) -> usize {
        self.found.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The anomalies found.
    pub fn anomalies(&self) -> Vec<Anomaly> {
        self.anomalies.lock().expect("leased keys").clone()
    }

    fn anomaly(&self, kind: &'static str, detail: String, at_ms: u64) {
        self.anomalies.lock().expect("leased keys").push(Anomaly { kind, detail, at_ms: Some(at_ms) });
    }
}

/// A lease granted through etcd's API and kept alive by a task of its own; it holds, as
/// far as its owner knows, until [`Lease::until`].
struct Lease {
    id: i64,
    /// When the lease ends at the latest on the server's count: the TTL from when the last
    /// renewal answered was sent (the server counts from its receipt, later).
    until: Arc<Mutex<Instant>>,
    keeper: JoinHandle<()>,
}

impl Lease {
    /// Grants a lease and starts renewing it every [`RENEW_EVERY`]; answers `None` if the
    /// grant or the keep-alive stream failed.
    async fn grant(client: &Client) -> Option<Lease> {
        let sent = Instant::now();
        let granted = client.clone().lease_grant(LEASE_TTL_S, None).await.ok()?;
        let until = Arc::new(Mutex::new(sent + ttl(granted.ttl())));
        let (mut keeper, mut answers) = client.clone().lease_keep_alive(granted.id()).await.ok()?;
        let renewed = until.clone();
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(RENEW_EVERY).await;
                let sent = Instant::now();
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                match answers.message().await {
                    Ok(Some(answer)) if answer.ttl() > 0 => *renewed.lock().expect("lease") = sent + ttl(answer.ttl()),
                    // The lease is gone, or the stream broke: it is not renewed any more.
                    _ => return,
                }
            }
        });
        Some(Lease { id: granted.id(), until, keeper })
    }

    /// Whether the lease surely still holds.
    fn holds(&self) -> bool {
        Instant::now() < *self.until.lock().expect("lease")
    }

    /// Stops renewing the lease (it expires after its TTL), as a crashed holder would.
    fn abandon(self) {
        self.keeper.abort();
    }

    /// Stops renewing the lease and revokes it (its hold ends with it); answers whether the
    /// revoke was acknowledged (one that failed leaves the lease to expire).
    async fn revoke(self, client: &Client) -> bool {
        self.keeper.abort();
        client.clone().lease_revoke(self.id).await.is_ok()
    }
}

/// `ttl_s` seconds (0 for a negative one).
fn ttl(ttl_s: i64) -> Duration {
    Duration::from_secs(u64::try_from(ttl_s).unwrap_or(0))
}

/// Takes [`ETCD_LOCK`] again and again with its lease, writing to the fenced resource a few
/// times per hold while the lease holds, asking `Lock` again once per hold with a call it
/// drops, and unlocking; a lease that ended, or an unlock that failed, is given up (revoked)
/// for a new one.
async fn etcd_locker(client: Client, outcomes: Outcomes, resource: Arc<FencedResource>) {
    let mut lease: Option<Lease> = None;
    while !outcomes.stopped() {
        let Some(current) = holding(&client, lease.take()).await else { continue };
        let invoked = outcomes.clock.now();
        let options = Some(LockOptions::new().with_lease(current.id));
        let locked = tokio::time::timeout(LOCK_WAIT, client.clone().lock(ETCD_LOCK, options.clone())).await;
        outcomes.note("etcd-lock", ETCD_LOCK, invoked, matches!(locked, Ok(Ok(_)) | Err(_)));
        let answer = match locked {
            Ok(Ok(answer)) => answer,
            // Waited as long as it may (the call is dropped), or failed.
            _ => {
                lease = Some(current);
                continue;
            }
        };
        let token = answer.header().map_or(0, |header| header.revision());
        // Dropped before any answer can come: must not release the hold.
        let repeated = async { drop(tokio::time::timeout(REPEATED_LOCK_WAIT, client.clone().lock(ETCD_LOCK, options.clone())).await) };
        let unlock = async { client.clone().unlock(answer.key()).await.is_ok() };
        let held = Hold { resource: &resource, name: ETCD_RESOURCE, token, lease: current };
        lease = held.write_and_release(&client, &outcomes, repeated, ("etcd-unlock", ETCD_LOCK), unlock).await;
    }
    if let Some(current) = lease {
        current.revoke(&client).await;
    }
}

/// Every [`CRASH_EVERY`], takes [`ETCD_LOCK`] with a lease of its own, writes once and
/// stops renewing the lease while holding.
async fn crashing_etcd_locker(client: Client, outcomes: Outcomes, resource: Arc<FencedResource>) {
    while !outcomes.stopped() {
        // A pause between crashes, not a wait for something.
        tokio::time::sleep(CRASH_EVERY).await;
        if outcomes.stopped() {
            break;
        }
        let Some(lease) = Lease::grant(&client).await else { continue };
        let invoked = outcomes.clock.now();
        let locked = tokio::time::timeout(LOCK_WAIT, client.clone().lock(ETCD_LOCK, Some(LockOptions::new().with_lease(lease.id)))).await;
        outcomes.note("etcd-lock", ETCD_LOCK, invoked, matches!(locked, Ok(Ok(_)) | Err(_)));
        match locked {
            Ok(Ok(answer)) => {
                let token = answer.header().map_or(0, |header| header.revision());
                let hold = resource.next_hold(ETCD_RESOURCE);
                resource.write(ETCD_RESOURCE, hold, u64::try_from(token).unwrap_or(0), || lease.holds());
                lease.abandon();
            }
            _ => {
                lease.revoke(&client).await;
            }
        }
    }
}

/// One hold of an etcd lock or leadership, logged in the fenced resource under `name` with
/// etcd's fencing token `token`, while `lease` holds.
struct Hold<'a> {
    resource: &'a FencedResource,
    name: &'static str,
    token: i64,
    lease: Lease,
}

impl Hold<'_> {
    /// Writes [`WRITES_PER_HOLD`] times while the lease holds, runs `after_first` after the
    /// first write, then ends the hold with `release` (noted as `noted`: its kind and path).
    /// Answers the lease to go on with; `None` when the release failed (the lease is then
    /// revoked: the hold may be kept, and ending the lease ends it either way).
    async fn write_and_release(
        self,
        client: &Client,
        outcomes: &Outcomes,
        after_first: impl std::future::Future<Output = ()>,
        noted: (&'static str, &str),
        release: impl std::future::Future<Output = bool>,
    ) -> Option<Lease> {
        let hold = self.resource.next_hold(self.name);
        let token = u64::try_from(self.token).unwrap_or(0);
        let mut after_first = Some(after_first);
        for _ in 0..WRITES_PER_HOLD {
            if !self.resource.write(self.name, hold, token, || self.lease.holds()) {
                break;
            }
            if let Some(action) = after_first.take() {
                action.await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let invoked = outcomes.clock.now();
        let released = release.await;
        outcomes.note(noted.0, noted.1, invoked, released);
        if released {
            return Some(self.lease);
        }
        self.lease.revoke(client).await;
        None
    }
}

/// A lease that holds, as far as its owner knows: `lease` if it does, else a new one (the
/// old one revoked); `None` when none could be granted (after a pause).
async fn holding(client: &Client, lease: Option<Lease>) -> Option<Lease> {
    match lease {
        Some(current) if current.holds() => return Some(current),
        Some(ended) => {
            ended.revoke(client).await;
        }
        None => {}
    }
    let granted = Lease::grant(client).await;
    if granted.is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    granted
}

/// Campaigns in [`ETCD_ELECTION`] again and again with its lease; as leader, writes to the
/// fenced resource a few times with the leader key's creation revision as the token while
/// the lease holds, proclaims a new value once, and resigns. A campaign not answered in
/// time is dropped (the router resigns it, as etcd does); a resign that failed gives the
/// lease up (revoked).
async fn campaigner(client: Client, outcomes: Outcomes, resource: Arc<FencedResource>) {
    let mut lease: Option<Lease> = None;
    while !outcomes.stopped() {
        let Some(current) = holding(&client, lease.take()).await else { continue };
        let invoked = outcomes.clock.now();
        let campaigned = tokio::time::timeout(LOCK_WAIT, client.clone().campaign(ETCD_ELECTION, "candidate", current.id)).await;
        outcomes.note("etcd-campaign", ETCD_ELECTION, invoked, matches!(campaigned, Ok(Ok(_)) | Err(_)));
        let Some(leader) = campaigned.ok().and_then(Result::ok).and_then(|mut answer| answer.take_leader()) else {
            lease = Some(current);
            continue;
        };
        let proclaim = async {
            let invoked = outcomes.clock.now();
            let options = ProclaimOptions::new().with_leader(leader.clone());
            let proclaimed = client.clone().proclaim("leading", Some(options)).await.is_ok();
            outcomes.note("etcd-proclaim", ETCD_ELECTION, invoked, proclaimed);
        };
        let resign = async { client.clone().resign(Some(ResignOptions::new().with_leader(leader.clone()))).await.is_ok() };
        let held = Hold { resource: &resource, name: ELECTION_RESOURCE, token: leader.rev(), lease: current };
        lease = held.write_and_release(&client, &outcomes, proclaim, ("etcd-resign", ETCD_ELECTION), resign).await;
    }
    if let Some(current) = lease {
        current.revoke(&client).await;
    }
}

/// Puts a key of its own under [`LEASED_KEYS`] with a fresh lease, reads it back (it must
/// be there while the lease surely holds), revokes the lease and, once the revoke was
/// acknowledged, reads it again (it must be gone); again and again.
async fn leased_key_client(client: Client, outcomes: Outcomes, leased: Arc<LeasedKeys>) {
    let mut n = 0u64;
    while !outcomes.stopped() {
        let Some(lease) = holding(&client, None).await else { continue };
        n += 1;
        let key = format!("{LEASED_KEYS}/k{n}");
        let invoked = outcomes.clock.now();
        let put = client.clone().put(key.as_str(), "leased", Some(PutOptions::new().with_lease(lease.id))).await;
        outcomes.note("etcd-put-leased", &key, invoked, put.is_ok());
        if put.is_ok() {
            let invoked = outcomes.clock.now();
            let read = client.clone().get(key.as_str(), None).await;
            outcomes.note("etcd-get-leased", &key, invoked, read.is_ok());
            if let Ok(read) = read {
                // Checked after the answer: the lease held until then.
                match (read.count(), lease.holds()) {
                    (0, true) => {
                        leased.anomaly("etcd-leased-key-lost", format!("{key} was not found while its lease held"), outcomes.clock.now() / 1_000_000)
                    }
                    (_, true) => {
                        leased.found.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
        let invoked = outcomes.clock.now();
        let revoked = lease.revoke(&client).await;
        outcomes.note("etcd-revoke", &key, invoked, revoked);
        if !revoked {
            continue;
        }
        let invoked = outcomes.clock.now();
        let read = client.clone().get(key.as_str(), None).await;
        outcomes.note("etcd-get-leased", &key, invoked, read.is_ok());
        match read {
            Ok(read) if read.count() > 0 => {
                leased.anomaly("etcd-leased-key-kept", format!("{key} was found after its lease's revoke answered"), outcomes.clock.now() / 1_000_000)
            }
            Ok(_) => {
                leased.revoked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Err(_) => {}
        }
    }
}
