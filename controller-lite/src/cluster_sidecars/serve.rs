//! The webhook's HTTPS endpoint, on every replica (the Service sends the API server to
//! any): `POST /inject-sidecars` with an AdmissionReview of a Pod, answered from the
//! SidecarSets in the store. The body is whatever a pod's creator wrote: bounded in
//! size and time, and a review that does not decode is answered 400, naming why.

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
use rigger_api::sidecar_set::SidecarSet;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::configuration::WEBHOOK_PATH;
use super::review;
use crate::store::Store;

/// The largest review read: the API server's own request limit is 3 MiB.
const MAX_REVIEW: usize = 4 << 20;
/// A connection's TLS handshake and a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once (the API server keeps a few open).
const MAX_CONNECTIONS: usize = 256;

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
pub async fn serve(listener: TcpListener, tls: ServerTls, store: Store, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
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
                let store = store.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(request, &store).await) }
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

async fn handle(request: Request<Incoming>, store: &Store) -> Response<Full<Bytes>> {
    if request.uri().path() != WEBHOOK_PATH {
        return plain(
            StatusCode::NOT_FOUND,
            format!("only {WEBHOOK_PATH} is served here"),
        );
    }
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
    let response = match catalog_for(store, &request).await {
        Ok(catalog) => review::answer(
            &request,
            &catalog,
            &rigger_proto::time::now_rfc3339(),
            fastrand::f64(),
        ),
        // No answer from the store: refuse the pod rather than start it without its
        // sidecars (its owner retries).
        Err(error) => kube::core::admission::AdmissionResponse::from(&request).deny(format!(
            "SidecarSets cannot be read, so the pod's sidecars are unknown; retry: {error}"
        )),
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(bytes) => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))),
        Err(error) => plain(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

/// The SidecarSets that match the pod under review, with their recorded versions.
async fn catalog_for(
    store: &Store,
    request: &AdmissionRequest<Pod>,
) -> Result<Vec<(SidecarSet, rigger_api::sidecar_set::History)>, crate::store::StoreError> {
    let Some(pod) = &request.object else {
        return Ok(Vec::new());
    };
    let namespace = pod
        .metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .or(request.namespace.as_deref())
        .unwrap_or("default");
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let mut catalog = Vec::new();
    for stored in store.list_objects::<SidecarSet>().await? {
        let set = stored.value;
        if set.matches(namespace, &labels) {
            let history = crate::sidecars::read_history(store, &set.metadata.name).await?;
            catalog.push((set, history));
        }
    }
    Ok(catalog)
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response
}
