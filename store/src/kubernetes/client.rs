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

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt as _};
use kube::{Client, Config};

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

/// A client of the API server `config` names whose connections are aborted, their unsent
/// writes dropped, once data waits `unacknowledged` for the server's acknowledgement.
pub fn term_bounded(config: &Config, unacknowledged: Duration) -> Result<Client, kube::Error> {
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
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    // Authentication may fail on its own (a token file unreadable): one error type.
    let client = tower::ServiceBuilder::new()
        .map_err(tower::BoxError::from)
        .service(client);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_server_not_reached_is_waited_for() {
        assert!(unreached(&kube::Error::Service(
            "client error (Connect)".into()
        )));
        let refused = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        assert!(!unreached(&kube::Error::Api(Box::new(refused))));
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
