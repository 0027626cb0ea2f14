//! Requests per client on the controller's API (riggerctl and anything speaking it): a
//! runaway script or a stuck loop slows down instead of starving the controller and
//! every other user. Each user (by token) has its own allowance; without tokens
//! (plain-text mode) each client address has one.

use std::num::NonZeroU32;

use governor::clock::Clock as _;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tonic::Status;
use tonic::metadata::MetadataValue;

/// Sustained requests per second per client, unless configured (`api_requests_per_second`).
pub const REQUESTS_PER_SECOND: u32 = 50;
/// Requests a client may send at once before the sustained rate applies (`api_burst`).
pub const BURST: u32 = 200;

pub use rigger_proto::RETRY_AFTER_MS;

/// A client's allowance on the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiRate {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

impl Default for ApiRate {
    fn default() -> Self {
        const fn nonzero(n: u32) -> NonZeroU32 {
            match NonZeroU32::new(n) {
                Some(n) => n,
                None => NonZeroU32::MIN,
            }
        }
        Self {
            per_second: nonzero(REQUESTS_PER_SECOND),
            burst: nonzero(BURST),
        }
    }
}

#[derive(Debug)]
pub struct ClientLimiter {
    limiter: DefaultKeyedRateLimiter<String>,
    per_second: u32,
}

impl ClientLimiter {
    pub fn new(rate: ApiRate) -> Self {
        Self {
            limiter: RateLimiter::keyed(Quota::per_second(rate.per_second).allow_burst(rate.burst)),
            per_second: rate.per_second.get(),
        }
    }

    /// Admit one request of `client`, or refuse it with RESOURCE_EXHAUSTED naming the
    /// limit and carrying [`RETRY_AFTER_MS`].
    pub fn admit(&self, client: &str) -> Result<(), Status> {
        self.limiter
            .check_key(&client.to_owned())
            .map_err(|not_until| {
                let wait = not_until.wait_time_from(self.limiter.clock().now());
                let mut status = Status::resource_exhausted(format!(
                    "{client}: more than {} requests per second; slow down",
                    self.per_second
                ));
                // At least a millisecond: "0" would read as "no hint".
                let millis = wait.as_millis().clamp(1, u128::from(u32::MAX));
                if let Ok(value) = MetadataValue::try_from(millis.to_string()) {
                    status.metadata_mut().insert(RETRY_AFTER_MS, value);
                }
                status
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
    fn a_client_over_its_burst_is_refused_with_a_retry_hint_and_others_are_not() {
        let limiter = ClientLimiter::new(ApiRate {
            per_second: NonZeroU32::MIN,
            burst: NonZeroU32::new(3).unwrap(),
        });
        for _ in 0..3 {
            limiter.admit("alice").unwrap();
        }
        let refused = limiter.admit("alice").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            refused.message(),
            "alice: more than 1 requests per second; slow down"
        );
        let hint: u64 = refused
            .metadata()
            .get(RETRY_AFTER_MS)
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=1000).contains(&hint), "{hint}");
        limiter.admit("bob").unwrap();
    }
}
