//! The webhook's HTTPS endpoint, on every replica (the Service sends the API server to
//! any): `POST /inject-sidecars` with an AdmissionReview of a Pod, answered from the
//! SidecarSets in the store. The body is whatever a pod's creator wrote: bounded in
//! size and time, and a review that does not decode is answered 400, naming why.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use rigger_api::sidecar_set::{History, NAMESPACE_NAME_LABEL, SidecarSet};
use serde::Deserialize as _;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::configuration::{INJECTION_DISABLED, INJECTION_LABEL, WEBHOOK_PATH};
use super::connections::{Connections, Limits, Slot};
use super::review;
use crate::cluster::namespaces::NamespaceLabels;
use crate::engines::sidecar_sets::usable::{self, SetState};
use crate::serve::metrics::{ReviewAnswer, WebhookMetrics};
use rigger_store::Store;

/// The largest review read. The API server takes no request over 3 MiB, so no pod it
/// admits is larger; the review around the pod adds a few hundred bytes.
const MAX_REVIEW: usize = (3 << 20) + (16 << 10);
/// A connection's TLS handshake (the API server's takes milliseconds) and a request's
/// headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections kept ([`super::connections`]): the API server keeps a few open per
/// replica; anyone on the network can connect, and must not hold what it needs.
const CONNECTION_LIMITS: Limits = Limits {
    total: 256,
    per_address: 32,
    handshakes_per_address: 8,
};
/// A whole request, body included, from its first byte to its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Reviews decoded and answered at once (CPU work, off the async workers).
const ANSWERING: usize = 2;

/// The serving certificate as rustls takes it (`None` until the Secret is read).
pub type ServerTls = watch::Receiver<Option<Arc<rustls::ServerConfig>>>;

#[derive(Debug, thiserror::Error)]
#[error("the sidecar webhook cannot listen on {address}: {source}")]
pub struct BindError {
    address: SocketAddr,
    source: std::io::Error,
}

/// Bind the webhook's address (before the controller says it is ready).
pub async fn bind(address: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| BindError { address, source })
}

/// Serve reviews on `listener` until `stop`.
pub async fn serve(
    listener: TcpListener,
    tls: ServerTls,
    store: Store,
    namespaces: Arc<NamespaceLabels>,
    metrics: WebhookMetrics,
    stop: CancellationToken,
) {
    let connections = Connections::new(CONNECTION_LIMITS);
    let answering = Arc::new(Semaphore::new(ANSWERING));
    loop {
        let (stream, remote) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "sidecar webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(config) = tls.borrow().clone() else {
            // No certificate yet: the API server retries (failure policy Fail).
            continue;
        };
        let slot = match connections.take(remote.ip()) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::debug!(%remote, why, "sidecar webhook connection refused");
                continue;
            }
        };
        let serving = Serving {
            store: store.clone(),
            answering: answering.clone(),
            namespaces: namespaces.clone(),
            metrics: metrics.clone(),
        };
        let stop = stop.clone();
        tokio::spawn(async move {
            let evicted = slot.evicted.clone();
            tokio::select! {
                () = serve_connection(stream, config, &slot, serving, stop) => {}
                () = evicted.cancelled() => {
                    tracing::debug!(%remote, "sidecar webhook connection closed for a newcomer");
                }
            }
        });
    }
}

/// What every connection's requests share.
#[derive(Clone)]
struct Serving {
    store: Store,
    answering: Arc<Semaphore>,
    namespaces: Arc<NamespaceLabels>,
    metrics: WebhookMetrics,
}

/// One connection: its TLS handshake within [`HANDSHAKE_TIMEOUT`], then its requests
/// until it closes or the webhook stops.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    slot: &Slot,
    serving: Serving,
    stop: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(config);
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            tracing::debug!(%error, "sidecar webhook TLS handshake refused");
            return;
        }
        Err(_) => return,
    };
    slot.handshaken();
    let service = service_fn(move |request| {
        let serving = serving.clone();
        async move {
            let started = Instant::now();
            let reading = Reading {
                store: &serving.store,
                namespaces: &serving.namespaces,
            };
            let answered = tokio::time::timeout(
                REQUEST_TIMEOUT,
                handle(request, reading, &serving.answering),
            )
            .await
            .unwrap_or_else(|_| {
                plain(
                    StatusCode::REQUEST_TIMEOUT,
                    "the review took too long to arrive or to answer".to_owned(),
                )
            });
            let answer = answered
                .extensions()
                .get::<ReviewAnswer>()
                .copied()
                .unwrap_or(ReviewAnswer::Error);
            serving.metrics.observe(answer, started.elapsed());
            Ok::<_, std::convert::Infallible>(answered)
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let mut served = std::pin::pin!(served);
    tokio::select! {
        _ = served.as_mut() => {}
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), served).await;
        }
    }
}

/// What a review reads: the SidecarSets, and the namespaces' labels.
#[derive(Clone, Copy)]
struct Reading<'a> {
    store: &'a Store,
    namespaces: &'a NamespaceLabels,
}

async fn handle(
    request: Request<Incoming>,
    reading: Reading<'_>,
    answering: &Arc<Semaphore>,
) -> Response<Full<Bytes>> {
    // `/inject-sidecars/<SidecarSet>`: the set whose webhook entry called.
    let Some(set) = request
        .uri()
        .path()
        .strip_prefix(WEBHOOK_PATH)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|name| rigger_api::fields::check_dns_subdomain(name).is_ok())
        .map(str::to_owned)
    else {
        return plain(
            StatusCode::NOT_FOUND,
            format!("only {WEBHOOK_PATH}/<SidecarSet> is served here"),
        );
    };
    if request.method() != Method::POST {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST an AdmissionReview".to_owned(),
        );
    }
    let body = match Limited::new(request.into_body(), MAX_REVIEW)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the review cannot be read (at most {MAX_REVIEW} bytes): {error}"),
            );
        }
    };
    // Decoding is CPU work on what anyone may send: done once, off the async workers,
    // and only by the reviews answered at once.
    let Ok(decoding) = answering.clone().acquire_owned().await else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down".to_owned());
    };
    let decoded = match tokio::task::spawn_blocking(move || decode_review(&body)).await {
        Ok(decoded) => decoded,
        Err(error) => return plain(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    };
    // Reading the sets and the namespace waits on I/O, not on the CPU: no slot held.
    drop(decoding);
    let (request, sent) = match decoded {
        Ok(decoded) => decoded,
        Err(why) => return plain(StatusCode::BAD_REQUEST, why),
    };
    let response = match catalog_for(reading, &request, &set).await {
        Ok((catalog, namespace_labels)) => {
            let Ok(_answering) = answering.clone().acquire_owned().await else {
                return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down".to_owned());
            };
            let (request, now, chance) = (
                request.clone(),
                rigger_proto::time::now_rfc3339(),
                fastrand::f64(),
            );
            let answered = tokio::task::spawn_blocking(move || {
                review::answer(&request, &sent, &catalog, &namespace_labels, &now, chance)
            })
            .await;
            match answered {
                Ok(response) => response,
                Err(error) => {
                    return plain(StatusCode::INTERNAL_SERVER_ERROR, error.to_string());
                }
            }
        }
        // No answer from the store, or a set Rigger cannot use: refuse the pod rather
        // than start it without its sidecars (its owner retries).
        Err(refusal) => kube::core::admission::AdmissionResponse::from(&request).deny(refusal),
    };
    let answer = if response.allowed {
        ReviewAnswer::Allowed
    } else {
        ReviewAnswer::Denied
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(bytes) => Response::builder()
            .header("content-type", "application/json")
            // What the review's time is counted under (`serve_connection`).
            .extension(answer)
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        Err(error) => plain(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

/// The review in `body`, parsed once: the typed request, and its pod as sent, every
/// field (the typed pod drops what its types lack, and the patch must keep them).
fn decode_review(body: &[u8]) -> Result<(AdmissionRequest<Pod>, serde_json::Value), String> {
    let mut review: serde_json::Value = serde_json::from_slice(body)
        .map_err(|error| format!("not an AdmissionReview of a Pod: {error}"))?;
    let sent = review
        .get_mut("request")
        .and_then(|request| request.get_mut("object"))
        .map(serde_json::Value::take)
        .unwrap_or_default();
    let pod = if sent.is_null() {
        None
    } else {
        Some(
            Pod::deserialize(&sent)
                .map_err(|error| format!("the review's request.object is not a Pod: {error}"))?,
        )
    };
    let review: AdmissionReview<Pod> = serde_json::from_value(review)
        .map_err(|error| format!("not an AdmissionReview of a Pod: {error}"))?;
    let mut request: AdmissionRequest<Pod> = review.try_into().map_err(|e| format!("{e}"))?;
    request.object = pod;
    Ok((request, sent))
}

/// Why a pod is refused when what a review reads cannot be read.
fn unknown_sidecars(error: impl std::fmt::Display) -> String {
    format!("SidecarSets cannot be read, so the pod's sidecars are unknown; retry: {error}")
}

/// SidecarSet `only` with its recorded versions when it matches the pod under review,
/// and the namespace's labels (read when the set selects namespaces by them).
async fn catalog_for(
    reading: Reading<'_>,
    request: &AdmissionRequest<Pod>,
    only: &str,
) -> Result<(Vec<(SidecarSet, History)>, BTreeMap<String, String>), String> {
    let Some(pod) = &request.object else {
        return Ok((Vec::new(), BTreeMap::new()));
    };
    // The API server names the namespace of what it admits; a review that names none
    // (or a name no namespace can have) is no API server's, and makes no lookup.
    let namespace = request
        .namespace
        .as_deref()
        .or(pod.metadata.namespace.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    rigger_api::fields::check_dns_label(namespace)
        .map_err(|e| format!("the review's namespace is not a namespace's name: {e}"))?;
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    if opted_out(&labels) {
        return Ok((Vec::new(), BTreeMap::new()));
    }
    let listed = reading
        .store
        .list_all_objects::<SidecarSet>()
        .await
        .map_err(unknown_sidecars)?;
    let mut sets = Vec::new();
    for state in usable::states(listed) {
        match state {
            SetState::Usable(set) if set.metadata.name == only => sets.push(*set),
            SetState::Unusable { name, cause } if name == only => {
                return Err(usable::refusal(&name, &cause));
            }
            _ => {}
        }
    }
    let namespace_labels = if sets.iter().any(SidecarSet::selects_namespaces) {
        reading
            .namespaces
            .of(namespace)
            .await
            .map_err(unknown_sidecars)?
    } else {
        BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), namespace.to_owned())])
    };
    let matched: Vec<SidecarSet> = sets
        .into_iter()
        .filter(|set| set.matches_in(namespace, &namespace_labels, &labels))
        .collect();
    let mut histories = if matched.is_empty() {
        Default::default()
    } else {
        crate::engines::sidecar_sets::histories(reading.store)
            .await
            .map_err(unknown_sidecars)?
    };
    let catalog = matched
        .into_iter()
        .map(|set| {
            let history = histories
                .remove(&set.metadata.name)
                .map(|(history, _)| history)
                .unwrap_or_default();
            (set, history)
        })
        .collect();
    Ok((catalog, namespace_labels))
}

/// Whether a pod's labels keep it from every SidecarSet (the webhook entries' object
/// selector leaves such pods out; a review of one sent anyway changes nothing).
fn opted_out(labels: &BTreeMap<String, String>) -> bool {
    labels.get(INJECTION_LABEL).map(String::as_str) == Some(INJECTION_DISABLED)
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn review(object: &serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE", "namespace": "shop",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": object,
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_review_is_decoded_once_with_the_pod_as_sent_and_garbage_is_named() {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "busybox"}],
                     "someFieldOfANewerKubernetes": {"kept": true}},
        });
        let (request, sent) = decode_review(&review(&pod)).unwrap();
        assert_eq!(sent, pod, "the pod as sent, every field");
        assert_eq!(request.namespace.as_deref(), Some("shop"));
        let typed = request.object.unwrap();
        assert_eq!(typed.metadata.name.as_deref(), Some("web-1"));

        let refused = decode_review(b"\x16\x03\x01garbage").unwrap_err();
        assert!(
            refused.starts_with("not an AdmissionReview of a Pod"),
            "{refused}"
        );
        let not_a_pod = decode_review(&review(&serde_json::json!({"spec": 7}))).unwrap_err();
        assert!(
            not_a_pod.contains("request.object is not a Pod"),
            "{not_a_pod}"
        );
    }

    #[test]
    fn pods_that_opt_out_are_never_injected() {
        let labels = |v: &str| BTreeMap::from([(INJECTION_LABEL.to_owned(), v.to_owned())]);
        assert!(opted_out(&labels("disabled")));
        assert!(!opted_out(&labels("enabled")));
        assert!(!opted_out(&BTreeMap::new()));
    }
}
