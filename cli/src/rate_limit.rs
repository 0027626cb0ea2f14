//! riggerctl's side of the controller's request-rate limit: a refused request is sent
//! again after the controller's hint instead of failing.

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use rigger_proto::RETRY_AFTER_MS;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, StdError, http};

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
