//! The etcd part of the workload: lockers taking etcd's `v3lockpb.Lock` through a router's
//! etcd API with leases they keep alive themselves, writing to the fenced resource with the
//! answer's revision as the token (etcd's fencing idiom) while their lease is known to
//! hold, as an etcd user's code does. The model is etcd's: a lock is held by one lease at
//! a time, a lease's hold ends with it, and tokens grow; the fenced resource's checks judge
//! it (holds exclusive, tokens growing in hold order). etcd has no lock-delay, so the
//! lock-delay check does not apply to these holds.
//!
//! Each hold also asks `Lock` again with a deadline too short to be answered and drops the
//! call, as a client library retrying after UNAVAILABLE does: the hold must survive it.
//! A crashing locker holds, writes once and stops renewing its lease, as a holder that
//! crashed would: the lock is handed on only once the lease expired.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, LockOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{FencedResource, Outcomes, CALL_TIMEOUT, CRASH_EVERY, WRITES_PER_HOLD};

/// The etcd lock's name (a Warden path in a group of its own, [`super::PREFIXES`]), and the
/// path its holds are logged under in the fenced resource.
pub const ETCD_LOCK: &str = "/b/etcd-locks/z";
pub const ETCD_RESOURCE: &str = "etcd /b/etcd-locks/z";
/// Lockers of [`ETCD_LOCK`] besides the crashing one.
const ETCD_LOCKERS: usize = 2;
/// The leases' TTL (Warden's session minimum) and how often they are renewed.
const LEASE_TTL_S: i64 = 3;
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long one `Lock` call may wait before the locker drops it.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// The deadline of a holder's repeated `Lock`: too short for an answer, so it is cancelled.
const REPEATED_LOCK_WAIT: Duration = Duration::from_millis(20);

/// Starts the etcd lockers against the etcd API at `etcd_addr`; each logs its calls in
/// `outcomes()` and its holds' writes in `resource`.
pub async fn start(etcd_addr: &str, outcomes: impl Fn() -> Outcomes, resource: &Arc<FencedResource>, tasks: &mut Vec<JoinHandle<()>>) {
    let options = ConnectOptions::new().with_timeout(CALL_TIMEOUT).with_connect_timeout(CALL_TIMEOUT);
    let client = Client::connect([etcd_addr], Some(options)).await.unwrap_or_else(|error| panic!("connect to the etcd API at {etcd_addr}: {error}"));
    for _ in 0..ETCD_LOCKERS {
        tasks.push(tokio::spawn(etcd_locker(client.clone(), outcomes(), resource.clone())));
    }
    tasks.push(tokio::spawn(crashing_etcd_locker(client, outcomes(), resource.clone())));
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

    /// Stops renewing the lease and revokes it (its hold ends with it).
    async fn revoke(self, client: &Client) {
        self.keeper.abort();
        // A revoke that fails leaves the lease to expire.
        drop(client.clone().lease_revoke(self.id).await);
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
        let current = match lease.take() {
            Some(current) if current.holds() => current,
            ended => {
                if let Some(ended) = ended {
                    ended.revoke(&client).await;
                }
                match Lease::grant(&client).await {
                    Some(granted) => granted,
                    None => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
        };
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
        let hold = resource.next_hold(ETCD_RESOURCE);
        for write in 0..WRITES_PER_HOLD {
            if !resource.write(ETCD_RESOURCE, hold, u64::try_from(token).unwrap_or(0), || current.holds()) {
                break;
            }
            if write == 0 {
                // Dropped before any answer can come: must not release the hold.
                drop(tokio::time::timeout(REPEATED_LOCK_WAIT, client.clone().lock(ETCD_LOCK, options.clone())).await);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let invoked = outcomes.clock.now();
        let unlocked = client.clone().unlock(answer.key()).await.is_ok();
        outcomes.note("etcd-unlock", ETCD_LOCK, invoked, unlocked);
        if unlocked {
            lease = Some(current);
        } else {
            // The hold may be kept: ending the lease ends it either way.
            current.revoke(&client).await;
        }
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
            _ => lease.revoke(&client).await,
        }
    }
}
