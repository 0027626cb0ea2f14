//! Requests per client on the controller's API (riggerctl and anything speaking it): a
//! runaway script or a stuck loop slows down instead of starving the controller and
//! every other user. Each user (by token) has its own allowance; without tokens
//! (plain-text mode) each client address has one.

use std::num::NonZeroU32;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use governor::clock::Clock as _;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use http_body_util::{BodyExt as _, Full};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, StdError, http};
use tonic::metadata::MetadataValue;

/// Sustained requests per second per client, unless configured (`api_requests_per_second`).
pub const REQUESTS_PER_SECOND: u32 = 50;
/// Requests a client may send at once before the sustained rate applies (`api_burst`).
pub const BURST: u32 = 200;

/// Metadata of a refusal: milliseconds until the client's next request is admitted.
/// riggerctl waits this long before retrying (gRPC has no Retry-After of its own).
pub const RETRY_AFTER_MS: &str = "rigger-retry-after-ms";

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

/// riggerctl's side of the limit, under its API client: a request refused for coming too
/// fast is sent again once the controller's [`RETRY_AFTER_MS`] has passed, for up to
/// `patience` in all; then the refusal goes to the caller. Every API call riggerctl
/// makes is unary, so the request body is small and kept for the resend.
#[derive(Debug, Clone)]
pub struct WaitOutRateLimit<S> {
    inner: S,
    patience: Duration,
    notify: fn(Duration),
}

impl<S> WaitOutRateLimit<S> {
    /// `notify` is told of each wait before it starts (riggerctl says so on stderr).
    pub fn new(inner: S, patience: Duration, notify: fn(Duration)) -> Self {
        Self {
            inner,
            patience,
            notify,
        }
    }
}

/// gRPC's RESOURCE_EXHAUSTED, in the status header of a refusal sent before any message.
const GRPC_RESOURCE_EXHAUSTED: &str = "8";

/// How long a request refused by the rate limit should wait: the hint, plus up to a
/// quarter of jitter so clients refused together do not all come back at once. Other
/// RESOURCE_EXHAUSTED refusals (without the hint) go to the caller at once.
fn wait_before_retry(response: &http::Response<Body>) -> Option<Duration> {
    let headers = response.headers();
    if headers.get("grpc-status")?.as_bytes() != GRPC_RESOURCE_EXHAUSTED.as_bytes() {
        return None;
    }
    let hint: u64 = headers.get(RETRY_AFTER_MS)?.to_str().ok()?.parse().ok()?;
    Some(Duration::from_millis(hint).mul_f64(1.0 + fastrand::f64() / 4.0))
}

impl<S> Service<http::Request<Body>> for WaitOutRateLimit<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<StdError>,
{
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // `self.inner` was polled ready; a clone may not be, so the ready one goes along.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (patience, notify) = (self.patience, self.notify);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await?.to_bytes();
            let started = Instant::now();
            loop {
                let mut resend = http::Request::new(Body::new(Full::new(body.clone())));
                *resend.method_mut() = parts.method.clone();
                *resend.uri_mut() = parts.uri.clone();
                *resend.version_mut() = parts.version;
                *resend.headers_mut() = parts.headers.clone();
                *resend.extensions_mut() = parts.extensions.clone();
                let response = inner.call(resend).await.map_err(Into::into)?;
                match wait_before_retry(&response) {
                    Some(wait) if started.elapsed() + wait <= patience => {
                        notify(wait);
                        tokio::time::sleep(wait).await;
                        std::future::poll_fn(|cx| inner.poll_ready(cx))
                            .await
                            .map_err(Into::into)?;
                    }
                    _ => return Ok(response),
                }
            }
        })
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
