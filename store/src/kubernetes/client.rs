//! The controller's client of the API server, with writes that cannot outlive the term
//! they were sent in.
//!
//! A leader cut off from the API server by a network partition still holds the requests
//! it sent before its renew deadline, unacknowledged in its sockets' send queues; the
//! kernel retransmits them until the partition heals, after a follower has taken the
//! Lease and begun writing, and the API server then applies them (seen on the lab's real
//! cluster: a NodeImage status patch received 4 s after the new leader's first write).
//! Every connection here sets `TCP_USER_TIMEOUT`: data unacknowledged that long aborts
//! the connection and its queue is dropped. The limit is kept below the gap between the
//! leader's renew deadline (two thirds of the Lease) and the soonest a follower may take
//! over (the whole Lease), so a write sent while leading reaches the API server's host
//! before any successor acts, or never. What it bounds is the network: a request the
//! server's kernel (or an L4 balancer in front of it) acknowledged may still wait in
//! the server's own queues.
//!
//! The stack is kube's documented custom client (`ConfigExt`): its TLS, base URI,
//! authentication and extra headers, over hyper's connector with these socket options.
//! Left out of kube's default stack: its retry of 429/503/504 (the engines' passes try
//! again, and a retried write would be sent again past the term), and its tracing layer.
//!
//! And a replica's writes are checked against its leadership one request at a time, as
//! each is handed to the connection pool ([`WriteFence`]): a store write that takes
//! several requests (`put_all`, a write read afresh after its conflict) stops at the
//! first one dispatched after the campaign said the replica no longer leads. A request
//! dispatched while leading may still wait for a connection (its TCP connect, bounded by
//! the kubeconfig's connect timeout, and TLS handshake) before its bytes go.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{Either, Ready, ready};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt as _};
use kube::{Client, Config};
use tokio::sync::watch;
use tower::BoxError;

/// Keepalive probes on idle connections (watches wait minutes for an event), so that a
/// partition also ends those in time. Their interval stays the kernel's: it is set in
/// whole seconds, and a quarter of a short lease is less than one (`EINVAL`, seen with a
/// 3 s lease).
const KEEPALIVE: Duration = Duration::from_secs(15);

/// How long data may stay unacknowledged before its connection is aborted, for a
/// leader lease of `lease` (pure): a quarter of it, inside the third between the renew
/// deadline and a successor's earliest start.
pub fn unacknowledged_limit(lease: Duration) -> Duration {
    lease / 4
}

/// Whether this replica's writes may be sent: bound once to its campaign's word, when
/// the store is fenced; until then (the checks at start, before any campaign) they go.
/// Reads always go.
#[derive(Debug, Clone, Default)]
pub struct WriteFence(Arc<OnceLock<watch::Receiver<bool>>>);

impl WriteFence {
    /// From now on, writes go only while `leading` is true.
    pub fn bind(&self, leading: watch::Receiver<bool>) {
        if self.0.set(leading).is_err() {
            tracing::warn!("the store's writes were fenced already; the first fence holds");
        }
    }

    /// Whether a request of this method is refused now (pure but for the word read).
    fn refuses(&self, method: &http::Method) -> bool {
        !method.is_safe() && self.0.get().is_some_and(|leading| !*leading.borrow())
    }
}

/// A write not sent: this replica does not lead (any more).
#[derive(Debug, thiserror::Error)]
#[error("not sent: this controller replica does not lead")]
pub struct WriteRefused;

/// Whether `error` is a write the fence kept from being sent.
pub fn refused_by_fence(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Service(source) if source.is::<WriteRefused>())
}

/// The fence as a service in front of the connection, so that it judges each request as
/// it is sent, retries and later requests of one store call included.
#[derive(Debug, Clone)]
struct Fenced<S> {
    inner: S,
    fence: WriteFence,
}

impl<S, B> tower::Service<http::Request<B>> for Fenced<S>
where
    S: tower::Service<http::Request<B>, Error = BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Either<Ready<Result<S::Response, BoxError>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if self.fence.refuses(request.method()) {
            Either::Left(ready(Err(Box::new(WriteRefused))))
        } else {
            Either::Right(self.inner.call(request))
        }
    }
}

/// A client of the API server `config` names whose connections are aborted, their unsent
/// writes dropped, once data waits `unacknowledged` for the server's acknowledgement;
/// its writes held by `fence` where one is given.
pub fn term_bounded(
    config: &Config,
    unacknowledged: Duration,
    fence: Option<&WriteFence>,
) -> Result<Client, kube::Error> {
    if let Some(proxy) = &config.proxy_url {
        // kube's own client refuses it too (its proxy features are off here): never
        // bypassed unsaid.
        return Err(kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(proxy.clone()),
        });
    }
    let mut connector = HttpConnector::new();
    connector.enforce_http(false);
    connector.set_nodelay(true);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_keepalive(Some(KEEPALIVE));
    connector.set_tcp_user_timeout(Some(unacknowledged));
    let https = config.rustls_https_connector_with_connector(connector)?;
    // A request hyper cancelled before it started is not sent again on another
    // connection, past the fence's word.
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .retry_canceled_requests(fence.is_none())
            .build(https);
    // Authentication may fail on its own (a token file unreadable): one error type.
    let client = tower::ServiceBuilder::new()
        .map_err(BoxError::from)
        .service(client);
    let client = Fenced {
        inner: client,
        fence: fence.cloned().unwrap_or_default(),
    };
    let namespace = config.default_namespace.clone();
    let headers = config.extra_headers_layer()?;
    let base = config.base_uri_layer();
    let client = match config.auth_layer()? {
        Some(auth) => ClientBuilder::new(client, namespace)
            .with_layer(&headers)
            .with_layer(&auth)
            .with_layer(&base)
            .build(),
        None => ClientBuilder::new(client, namespace)
            .with_layer(&headers)
            .with_layer(&base)
            .build(),
    };
    Ok(client)
}

/// How long a starting controller waits for the API server to answer at all: under the
/// 30 s its liveness probe allows (deploy/kubernetes/controller.yaml) before its health
/// endpoint is served.
const STARTUP_WAIT: Duration = Duration::from_secs(25);

/// `call`'s answer, the API server given [`STARTUP_WAIT`] to be reached: a replica that
/// restarted while cut off from it (a leader that lost its Lease in a partition) waits,
/// saying why, instead of failing at once and restarting in a loop. An answer, refusals
/// included, ends the wait.
pub async fn once_reachable<T, F, Fut>(location: &str, mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(500);
    loop {
        match call().await {
            Err(error) if unreached(&error) && started.elapsed() + pause < STARTUP_WAIT => {
                tracing::warn!(%location, %error, ?pause, "the API server is not reachable; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(8));
            }
            outcome => return outcome,
        }
    }
}

/// Whether `error` says the API server was not reached, rather than what it answered
/// (pure).
fn unreached(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Service(_) | kube::Error::HyperError(_))
        && !refused_by_fence(error)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};

    #[tokio::test]
    async fn a_write_is_refused_as_it_is_sent_once_the_replica_does_not_lead_and_reads_go() {
        let answered = Arc::new(AtomicUsize::new(0));
        let server = {
            let answered = answered.clone();
            tower::service_fn(move |_request: http::Request<kube::client::Body>| {
                answered.fetch_add(1, Ordering::SeqCst);
                let map = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m","resourceVersion":"1"}}"#;
                async move {
                    Ok::<_, BoxError>(http::Response::new(kube::client::Body::from(map.to_vec())))
                }
            })
        };
        let fence = WriteFence::default();
        let client = Client::new(
            Fenced {
                inner: server,
                fence: fence.clone(),
            },
            "default",
        );
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let map: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "m"}})).unwrap();
        // Before any campaign (the checks at start) writes go.
        api.create(&PostParams::default(), &map).await.unwrap();
        let (leading, word) = watch::channel(true);
        fence.bind(word);
        api.replace("m", &PostParams::default(), &map)
            .await
            .unwrap();
        leading.send_replace(false);
        let refused = api
            .replace("m", &PostParams::default(), &map)
            .await
            .unwrap_err();
        assert!(refused_by_fence(&refused), "{refused}");
        assert!(!refused_by_fence(&kube::Error::Service(
            "client error (Connect)".into()
        )));
        api.get("m").await.unwrap();
        // The refused write never reached the server.
        assert_eq!(answered.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn only_a_server_not_reached_is_waited_for() {
        assert!(unreached(&kube::Error::Service(
            "client error (Connect)".into()
        )));
        let refused = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        assert!(!unreached(&kube::Error::Api(Box::new(refused))));
        assert!(!unreached(&kube::Error::Service(Box::new(WriteRefused))));
    }

    #[test]
    fn a_write_is_given_up_before_a_successor_may_lead() {
        for lease in [2, 6, 15, 60].map(Duration::from_secs) {
            let renew_deadline = lease * 2 / 3;
            let limit = unacknowledged_limit(lease);
            assert!(
                renew_deadline + limit < lease,
                "{lease:?}: sent by the renew deadline, given up by {:?}",
                renew_deadline + limit
            );
        }
    }
}
