//! Per-principal request rate limits: each client principal — the name its
//! certificate or bearer token gives it — may start at most `requests_per_s` calls per second (bursts up to the
//! same number), counted by this router alone. A call over the limit is answered
//! RESOURCE_EXHAUSTED (`RATE_LIMITED`, `limit` = the rate) before it reaches any node, so a
//! noisy team slows only itself. Streams (watches, keepalive streams) count once, when they
//! open. Without TLS there is no principal and no limit (security off allows everything).

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::{Request, Status};
use warden_proto::tls::{caller, Caller};
use warden_proto::v1::warden_error::Code;
use warden_proto::v1::WardenError;

/// Principals whose buckets are kept at most; past it, the ones full again (idle for a
/// second or more) are dropped, which loses nothing (a full bucket is a fresh one).
const PRINCIPALS_TRACKED_MAX: usize = 10_000;

/// The rate limits of one router.
#[derive(Clone)]
pub struct PrincipalLimits {
    requests_per_s: NonZeroU32,
    buckets: Arc<DefaultKeyedRateLimiter<String>>,
}

impl PrincipalLimits {
    /// `requests_per_s` calls per second per principal.
    pub fn new(requests_per_s: NonZeroU32) -> PrincipalLimits {
        PrincipalLimits { requests_per_s, buckets: Arc::new(RateLimiter::keyed(Quota::per_second(requests_per_s))) }
    }

    /// Admits `request` if its principal is under its rate (a tonic interceptor).
    pub fn admit(&self, request: Request<()>) -> Result<Request<()>, Status> {
        // A caller the handler will refuse (no principal) is left to it.
        let Ok(Caller::Principal(principal)) = caller(&request) else { return Ok(request) };
        if self.buckets.len() > PRINCIPALS_TRACKED_MAX {
            self.buckets.retain_recent();
        }
        match self.buckets.check_key(&principal) {
            Ok(()) => Ok(request),
            Err(_) => Err(warden_proto::status(WardenError {
                code: Code::RateLimited as i32,
                message: format!("{principal} is over its rate limit of {} requests per second at this router", self.requests_per_s),
                limit: u64::from(self.requests_per_s.get()),
                ..WardenError::default()
            })),
        }
    }
}
