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
//! - **The key names the hold**: `name/<lease in hex>/<token in decimal>/<waiter>` (etcd's
//!   `name/<lease in hex>`, the token, and the name of the hold's waiter node below the
//!   lock). Unlock is one native Unlock of that waiter and token, which releases the waiter
//!   only while its create revision is the token: an Unlock of a stale key (a retried
//!   Unlock, or one of an earlier hold of the same lease) releases nothing, as no later hold
//!   has that waiter and token. etcd's key also exists as a key while held; this one is a
//!   handle for Unlock only.
//! - **Waiting as long as the call**: each native Lock waits at most the router's request
//!   timeout, and keeps its waiter queued when that wait ends (`keep_queued`); the call asks
//!   again with the same request id, keeping its place, until it holds or its deadline
//!   passes. A call that ends without the lock (its client hung up, its deadline passed, an
//!   error) abandons its waiter: the same request as a try-lock removes it if it does not
//!   hold. A hold is never released by a clean-up: another Lock call of the lease may have
//!   been answered with it.

use std::sync::Arc;

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

/// A hold as its key names it.
#[derive(Debug, PartialEq, Eq)]
struct HoldKey<'a> {
    /// The lock's name (etcd key bytes).
    name: &'a [u8],
    /// The lease (session) that holds it.
    lease: u64,
    /// The hold's fencing token: its waiter's create revision.
    token: u64,
    /// The name of the hold's waiter node, a child of the lock's path.
    waiter: &'a str,
}

/// The key of `hold`.
fn lock_key(hold: &HoldKey<'_>) -> Vec<u8> {
    [hold.name, format!("/{:x}/{}/{}", hold.lease, hold.token, hold.waiter).as_bytes()].concat()
}

/// The hold a key [`lock_key`] made names (`None`: no lock's key).
fn parse_lock_key(key: &[u8]) -> Option<HoldKey<'_>> {
    let mut parts = key.rsplitn(4, |byte| *byte == b'/');
    let waiter = std::str::from_utf8(parts.next()?).ok().filter(|waiter| !waiter.is_empty())?;
    let token = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let lease = u64::from_str_radix(std::str::from_utf8(parts.next()?).ok()?, 16).ok()?;
    let name = parts.next().filter(|name| !name.is_empty())?;
    Some(HoldKey { name, lease, token, waiter })
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
    /// Makes sure the waiter of `request` (a Lock that ended without its answer) does not
    /// stay queued: the same request as a try-lock removes it if it does not hold. A hold
    /// it finds is left alone: every Lock of the lease shares that waiter, and an earlier
    /// call may have been answered with it (a holder's retried or cancelled Lock must not
    /// hand its lock to the next waiter). A hold granted just as this call ended stays the
    /// lease's, as an answered one would: the lease's next Lock answers it at once, and an
    /// Unlock or the lease's end releases it. Best effort (the waiter goes with its lease
    /// anyway).
    async fn abandon(&self, call: &Call, mut request: w::LockRequest) {
        request.wait = false;
        request.keep_queued = false;
        let answer = match call.request(request) {
            Ok(request) => Warden::lock(&self.router, request).await,
            Err(status) => Err(status),
        };
        match answer {
            Ok(answer) if answer.get_ref().acquired => tracing::debug!("an ended etcd Lock left its lease's hold in place"),
            Ok(_) => {}
            Err(status) => tracing::debug!(%status, "abandoning the waiter of an etcd Lock"),
        }
    }
}

#[tonic::async_trait]
impl pb::lock_server::Lock for EtcdService {
    async fn lock(&self, request: Request<pb::LockRequest>) -> Result<Response<pb::LockResponse>, Status> {
        let (call, request) = Call::of(request);
        let session_id = session_of(request.lease)?;
        let native = native_lock(path_of(&request.name)?, session_id);
        // Shared with the clean-up, which detaches its own copy only if it runs: most calls
        // end holding the lock, and copying the call's metadata for each would be waste.
        let call = Arc::new(call);
        let cleanup = {
            let (service, call, native) = (self.clone(), call.clone(), native.clone());
            Cleanup::new(async move { service.abandon(&call.detached(), native).await })
        };
        loop {
            let answer = Warden::lock(&self.router, call.request(native.clone())?).await.map_err(etcd_status)?.into_inner();
            if let Some(sequencer) = answer.sequencer.filter(|_| answer.acquired) {
                cleanup.disarm();
                let waiter = sequencer.waiter.rsplit('/').next().unwrap_or_default();
                let key = lock_key(&HoldKey { name: &request.name, lease: session_id, token: sequencer.token, waiter });
                return Ok(Response::new(pb::LockResponse { header: self.header(sequencer.token), key }));
            }
            // Not held yet: the wait ended with the waiter still queued, and the next call
            // waits on in its place (or, answered no waiter, another Lock of the lease gave
            // their waiter up, and the next call queues again).
        }
    }

    /// Releases the hold the key names, if it is still there; otherwise there is nothing to
    /// release, which etcd answers as success too (its Unlock deletes a key). One native
    /// Unlock: it releases the waiter only while its create revision is the key's token.
    async fn unlock(&self, request: Request<pb::UnlockRequest>) -> Result<Response<pb::UnlockResponse>, Status> {
        let (call, request) = Call::of(request);
        let hold = parse_lock_key(&request.key).ok_or_else(|| invalid("not a key a Lock answered (docs/etcd.md)"))?;
        let path = path_of(hold.name)?;
        let waiter = format!("{path}/{}", hold.waiter);
        let sequencer = w::Sequencer { path, mode: w::LockMode::Exclusive as i32, token: hold.token, group_id: 0, waiter };
        let unlock = w::UnlockRequest { sequencer: Some(sequencer), routing: None };
        let answer = Warden::unlock(&self.router, call.request(unlock)?).await.map_err(etcd_status)?.into_inner();
        Ok(Response::new(pb::UnlockResponse { header: self.header(answer.header.map_or(0, |h| h.revision)) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_key_names_its_lock_lease_token_and_waiter() {
        for name in [b"/locks/deploy".as_slice(), b"mylock", b"/a/", b"x/1/2/w", b"\xff/"] {
            let hold = HoldKey { name, lease: 0x694d_71ed_8e2a_3c04, token: 17, waiter: "lock-0000000003" };
            let key = lock_key(&hold);
            assert_eq!(parse_lock_key(&key), Some(hold), "{key:?}");
        }
        let hold = HoldKey { name: b"/locks/deploy", lease: 0xab, token: 9, waiter: "lock-0000000001" };
        assert_eq!(lock_key(&hold), b"/locks/deploy/ab/9/lock-0000000001");
        for other in [b"/locks/deploy".as_slice(), b"/ab/9/w", b"name/ab/x/w", b"name/zz/9/w", b"ab/9/w", b"name/ab/9/", b"name/ab/9"] {
            assert_eq!(parse_lock_key(other), None, "{other:?}");
        }
    }
}
