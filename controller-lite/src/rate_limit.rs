//! Requests per client on the controller's API (riggerctl and anything speaking it): a
//! runaway script or a stuck loop slows down instead of starving the controller and
//! every other user. Each user (by token) has its own allowance; without tokens
//! (plain-text mode) each client address has one.

use std::num::NonZeroU32;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::Status;

/// Sustained requests per second per client.
pub const REQUESTS_PER_SECOND: u32 = 50;
/// Requests a client may send at once before the sustained rate applies.
pub const BURST: u32 = 200;

#[derive(Debug)]
pub struct ClientLimiter {
    limiter: DefaultKeyedRateLimiter<String>,
    per_second: u32,
}

impl ClientLimiter {
    pub fn new(per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        Self {
            limiter: RateLimiter::keyed(Quota::per_second(per_second).allow_burst(burst)),
            per_second: per_second.get(),
        }
    }

    /// The API's limits: [`REQUESTS_PER_SECOND`], bursts of [`BURST`].
    pub fn api() -> Self {
        const fn nonzero(n: u32) -> NonZeroU32 {
            match NonZeroU32::new(n) {
                Some(n) => n,
                None => NonZeroU32::MIN,
            }
        }
        Self::new(nonzero(REQUESTS_PER_SECOND), nonzero(BURST))
    }

    /// Admit one request of `client`, or refuse it with RESOURCE_EXHAUSTED naming the
    /// limit (gRPC clients back off on it).
    pub fn admit(&self, client: &str) -> Result<(), Status> {
        self.limiter.check_key(&client.to_owned()).map_err(|_| {
            Status::resource_exhausted(format!(
                "{client}: more than {} requests per second; slow down",
                self.per_second
            ))
        })
    }

    /// Forget clients that have been quiet long enough to be back at full allowance.
    pub fn forget_idle(&self) {
        self.limiter.retain_recent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_over_its_burst_is_refused_and_others_are_not() {
        let limiter = ClientLimiter::new(NonZeroU32::MIN, NonZeroU32::new(3).unwrap());
        for _ in 0..3 {
            limiter.admit("alice").unwrap();
        }
        let refused = limiter.admit("alice").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            refused.message(),
            "alice: more than 1 requests per second; slow down"
        );
        limiter.admit("bob").unwrap();
    }
}
