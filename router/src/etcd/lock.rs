//! etcd's `v3lockpb.Lock` on Warden's locks: a Lock is a native exclusive `Lock` of the
//! path of its name ([`super::keys`]) for the session its lease is, waiting in the lock's
//! FIFO queue; an Unlock releases that hold.
//!
//! - **One hold per lease**, as in etcd (where the lease's lock key is `name/<lease>`): every
//!   etcd Lock asks with the same request id ([`LOCK_REQUEST_ID`]), so Lock calls with one
//!   lease find one waiter. A retried Lock (its answer lost) finds the hold it already has
//!   instead of queueing behind it, and a second Lock of a holding lease answers at once.
//! - **The revision is the fencing token**: the answer's `header.revision` is the hold's
//!   sequencer token (its waiter node's create revision), which only grows for a lock path,
//!   so a resource can refuse any request carrying a lower one.
//! - **The key names the hold**: `name/<lease in hex>/<token in decimal>` (etcd's
//!   `name/<lease in hex>` and the token). Unlock finds the hold among the lock's holders
//!   and waiters by its lease and token, so an Unlock of a stale key (a retried Unlock, or
//!   one of an earlier hold of the same lease) releases nothing: no later hold has that
//!   token. etcd's key also exists as a key while held; this one is a handle for Unlock only.
//! - **Waiting as long as the call**: each native Lock waits at most the router's request
//!   timeout, and keeps its waiter queued when that wait ends (`keep_queued`); the call asks
//!   again with the same request id, keeping its place, until it holds or its deadline
//!   passes. A call that ends without the lock (its client hung up, its deadline passed, an
//!   error) abandons its waiter: the same request as a try-lock removes it, or finds it
//!   holding and then unlocks it.

use tonic::{Request, Response, Status};
use warden_proto::etcd::v3lockpb as pb;
use warden_proto::v1 as w;
use warden_proto::v1::warden_server::Warden;

use super::kv::path_of;
use super::lease::session_of;
use super::{etcd_status, invalid, Call, Cleanup, EtcdService};

/// The request id of every etcd Lock ("etcdlock"): a lease's Lock calls on one name are one
/// acquisition, as etcd's are.
pub const LOCK_REQUEST_ID: u64 = u64::from_be_bytes(*b"etcdlock");

/// The key of the hold with `token` of `lease` on the lock `name`.
fn lock_key(name: &[u8], lease: u64, token: u64) -> Vec<u8> {
    [name, format!("/{lease:x}/{token}").as_bytes()].concat()
}

/// The lock name, lease and token of a key [`lock_key`] made (`None`: no lock's key).
fn parse_lock_key(key: &[u8]) -> Option<(&[u8], u64, u64)> {
    let mut parts = key.rsplitn(3, |byte| *byte == b'/');
    let token = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let lease = u64::from_str_radix(std::str::from_utf8(parts.next()?).ok()?, 16).ok()?;
    let name = parts.next().filter(|name| !name.is_empty())?;
    Some((name, lease, token))
}

/// The native Lock every call of an etcd Lock sends: exclusive, waiting as long as the
/// server lets it (`timeout_ms` 0: the time the call has left, within the router's request
/// timeout), staying queued when that wait ends.
fn native_lock(path: String, session_id: u64) -> w::LockRequest {
    w::LockRequest {
        path,
        session_id,
        mode: w::LockMode::Exclusive as i32,
        wait: true,
        timeout_ms: 0,
        lock_delay_ms: 0,
        request_id: LOCK_REQUEST_ID,
        keep_queued: true,
        routing: None,
    }
}

impl EtcdService {
    /// Makes sure the waiter of `request` (a Lock that ended without the lock) does not stay
    /// behind: the same request as a try-lock removes it if it does not hold, and answers
    /// its hold if it does, which is then released. Best effort (the waiter goes with its
    /// lease anyway).
    async fn abandon(&self, call: &Call, mut request: w::LockRequest) {
        request.wait = false;
        request.keep_queued = false;
        let abandoned = async {
            let answer = Warden::lock(&self.router, call.request(request)?).await?.into_inner();
            if let Some(sequencer) = answer.sequencer.filter(|_| answer.acquired) {
                Warden::unlock(&self.router, call.request(w::UnlockRequest { sequencer: Some(sequencer), routing: None })?).await?;
            }
            Ok::<(), Status>(())
        };
        if let Err(status) = abandoned.await {
            tracing::debug!(%status, "abandoning the waiter of an etcd Lock");
        }
    }
}

#[tonic::async_trait]
impl pb::lock_server::Lock for EtcdService {
    async fn lock(&self, request: Request<pb::LockRequest>) -> Result<Response<pb::LockResponse>, Status> {
        let (call, request) = Call::of(request);
        let session_id = session_of(request.lease)?;
        let native = native_lock(path_of(&request.name)?, session_id);
        let cleanup = {
            let (service, detached, native) = (self.clone(), call.detached(), native.clone());
            Cleanup::new(async move { service.abandon(&detached, native).await })
        };
        loop {
            let answer = Warden::lock(&self.router, call.request(native.clone())?).await.map_err(etcd_status)?.into_inner();
            if let Some(sequencer) = answer.sequencer.filter(|_| answer.acquired) {
                cleanup.disarm();
                let key = lock_key(&request.name, session_id, sequencer.token);
                return Ok(Response::new(pb::LockResponse { header: self.header(sequencer.token), key }));
            }
            // Not held yet: the wait ended with the waiter still queued, and the next call
            // waits on in its place (or, answered no waiter, another Lock of the lease gave
            // their waiter up, and the next call queues again).
        }
    }

    /// Releases the hold the key names, if it is still there; otherwise there is nothing to
    /// release, which etcd answers as success too (its Unlock deletes a key).
    async fn unlock(&self, request: Request<pb::UnlockRequest>) -> Result<Response<pb::UnlockResponse>, Status> {
        let (call, request) = Call::of(request);
        let (name, session_id, token) = parse_lock_key(&request.key).ok_or_else(|| invalid("not a key a Lock answered (docs/etcd.md)"))?;
        let path = path_of(name)?;
        let info = w::LockInfoRequest { path: path.clone(), routing: None };
        let info = Warden::lock_info(&self.router, call.request(info)?).await.map_err(etcd_status)?.into_inner();
        let hold = info.holders.iter().chain(&info.waiters).find(|hold| hold.token == token && hold.session_id == session_id);
        let revision = match hold {
            None => info.header.map_or(0, |h| h.revision),
            Some(hold) => {
                let sequencer = w::Sequencer { path, mode: hold.mode, token, group_id: 0, waiter: hold.waiter.clone() };
                let unlock = w::UnlockRequest { sequencer: Some(sequencer), routing: None };
                let answer = Warden::unlock(&self.router, call.request(unlock)?).await.map_err(etcd_status)?.into_inner();
                answer.header.map_or(0, |h| h.revision)
            }
        };
        Ok(Response::new(pb::UnlockResponse { header: self.header(revision) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_key_names_its_lock_lease_and_token() {
        for name in [b"/locks/deploy".as_slice(), b"mylock", b"/a/", b"x/1/2", b"\xff/"] {
            let key = lock_key(name, 0x694d_71ed_8e2a_3c04, 17);
            assert_eq!(parse_lock_key(&key), Some((name, 0x694d_71ed_8e2a_3c04, 17)), "{key:?}");
        }
        assert_eq!(lock_key(b"/locks/deploy", 0xab, 9), b"/locks/deploy/ab/9");
        for other in [b"/locks/deploy".as_slice(), b"/ab/9", b"name/ab/x", b"name/zz/9", b"ab/9"] {
            assert_eq!(parse_lock_key(other), None, "{other:?}");
        }
    }
}
