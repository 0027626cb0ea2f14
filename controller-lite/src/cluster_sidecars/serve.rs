//! The webhook's HTTPS endpoint, on every replica (the Service sends the API server to
//! any): `POST /inject-sidecars` with an AdmissionReview of a Pod, answered from the
//! SidecarSets in the store. The body is whatever a pod's creator wrote: bounded in
//! size and time, and a review that does not decode is answered 400, naming why.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use rigger_api::sidecar_set::{History, NAMESPACE_NAME_LABEL, SidecarSet};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::configuration::WEBHOOK_PATH;
use super::namespaces::NamespaceLabels;
use super::review;
use super::usable::{self, SetState};
use crate::store::Store;

/// The largest review read: the API server's own request limit is 3 MiB.
const MAX_REVIEW: usize = 4 << 20;
/// A connection's TLS handshake and a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (the API server keeps a few open), and from one address:
/// anyone on the network can connect, and must not hold every slot.
const MAX_CONNECTIONS: usize = 256;
const MAX_CONNECTIONS_PER_ADDRESS: usize = 64;
/// A whole request, body included, from its first byte to its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Reviews answered at once (the injection is CPU work, off the async workers).
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
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let answering = Arc::new(Semaphore::new(ANSWERING));
    let per_address: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>> =
        Arc::default();
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => return,
            permit = slots.clone().acquire_owned() => permit,
        };
        let Ok(permit) = permit else {
            return;
        };
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
        let Some(address_slot) = AddressSlot::take(&per_address, remote.ip()) else {
            tracing::debug!(%remote, "sidecar webhook: too many connections from one address");
            continue;
        };
        let (store, stop, answering, namespaces) = (
            store.clone(),
            stop.clone(),
            answering.clone(),
            namespaces.clone(),
        );
        tokio::spawn(async move {
            let _permit = permit;
            let _address_slot = address_slot;
            let acceptor = TlsAcceptor::from(config);
            let stream =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tracing::debug!(%remote, %error, "sidecar webhook TLS handshake refused");
                        return;
                    }
                    Err(_) => return,
                };
            let service = service_fn(move |request| {
                let (store, answering, namespaces) =
                    (store.clone(), answering.clone(), namespaces.clone());
                async move {
                    let reading = Reading {
                        store: &store,
                        namespaces: &namespaces,
                    };
                    let answered =
                        tokio::time::timeout(REQUEST_TIMEOUT, handle(request, reading, &answering))
                            .await
                            .unwrap_or_else(|_| {
                                plain(
                                    StatusCode::REQUEST_TIMEOUT,
                                    "the review took too long to arrive or to answer".to_owned(),
                                )
                            });
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
        });
    }
}

/// One connection's place in the count of connections from its address.
struct AddressSlot {
    counts: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    address: std::net::IpAddr,
}

impl AddressSlot {
    fn take(
        counts: &Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
        address: std::net::IpAddr,
    ) -> Option<Self> {
        let mut held = counts.lock().ok()?;
        let count = held.entry(address).or_default();
        if *count >= MAX_CONNECTIONS_PER_ADDRESS {
            return None;
        }
        *count += 1;
        Some(Self {
            counts: counts.clone(),
            address,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.counts.lock()
            && let Some(count) = held.get_mut(&self.address)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.address);
            }
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
    // The pod as sent, every field (the typed review drops what its types lack).
    let sent: serde_json::Value = serde_json::from_slice::<serde_json::Value>(&body)
        .map(|mut review| review["request"]["object"].take())
        .unwrap_or_default();
    let review: AdmissionReview<Pod> = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(error) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("not an AdmissionReview of a Pod: {error}"),
            );
        }
    };
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(request) => request,
        Err(error) => return plain(StatusCode::BAD_REQUEST, format!("{error}")),
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
    match serde_json::to_vec(&response.into_review()) {
        Ok(bytes) => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        Err(error) => plain(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
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
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .or(request.namespace.as_deref())
        .unwrap_or("default");
    let labels = pod.metadata.labels.clone().unwrap_or_default();
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
            .map_err(|e| unknown_sidecars(format!("namespace {namespace}: {e}")))?
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
        crate::sidecars::histories(reading.store)
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

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
}
