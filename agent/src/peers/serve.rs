//! The HTTPS endpoint peers fetch blobs from: TLS 1.2+ with the node's own certificate,
//! a client certificate from the fleet's CA required of every peer, HTTP/1.1, a
//! node-wide cap on connections (one past it is closed at once, and the peer goes to
//! its next source), and a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use rigger_pull::peers::PeerIdentity;

use super::answer::{Answerer, Peer};

/// A TLS handshake and a request's headers each get this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("peer TLS: {0}")]
    Tls(String),
    #[error("cannot listen for peers on {address} (peer_listen): {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// The server side of peer TLS: this node's certificate, peers' certificates checked
/// against the CA (rustls' verifier also requires their `clientAuth` usage).
pub fn server_config(tls: &PeerIdentity) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let error = |what: &str, e: String| ServeError::Tls(format!("{what}: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        roots
            .add(ca.map_err(|e| error("ca_file", e.to_string()))?)
            .map_err(|e| error("ca_file", e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(error("ca_file", "no certificate in it".to_owned()));
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| error("ca_file", e.to_string()))?;
    let chain = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error("cert_file", e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem)
        .map_err(|e| error("key_file", e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| error("protocol versions", e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| error("cert_file/key_file", e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Bind `address` for peers (before the agent says it is ready, so a taken port is a
/// start-up error).
pub async fn bind(address: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ServeError::Bind { address, source })
}

/// Serve peers on `listener` until `stop`; connections open then finish their request.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    answerer: Arc<Answerer>,
    max_connections: usize,
    stop: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    accept(
        listener,
        max_connections,
        "peer",
        stop,
        move |stream, remote, stop| {
            connection(acceptor.clone(), stream, answerer.clone(), stop)
                .instrument(tracing::debug_span!("peer", %remote))
        },
    )
    .await;
}

/// Accept `what` connections on `listener` until `stop`, each handled by `handle` in a
/// task of its own; one past `max_connections` open is closed at once (the client goes
/// elsewhere).
pub async fn accept<H, F>(
    listener: TcpListener,
    max_connections: usize,
    what: &'static str,
    stop: CancellationToken,
    handle: H,
) where
    H: Fn(tokio::net::TcpStream, SocketAddr, CancellationToken) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let connections = Arc::new(Semaphore::new(max_connections.max(1)));
    loop {
        let (stream, remote) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a {what} connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::debug!(%remote, "{what} connection refused: at the connection limit");
            continue;
        };
        let handled = handle(stream, remote, stop.clone());
        tokio::spawn(async move {
            let _permit = permit;
            handled.await;
        });
    }
}

async fn connection(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    answerer: Arc<Answerer>,
    stop: CancellationToken,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::info!(%error, "peer TLS handshake refused");
            return;
        }
        Err(_) => {
            tracing::info!("peer TLS handshake timed out");
            return;
        }
    };
    let Some(leaf) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.clone().into_owned())
    else {
        return; // the verifier requires one; nothing to answer without it
    };
    let peer = Arc::new(Peer { leaf });
    let service = service_fn(move |request| {
        let (answerer, peer) = (answerer.clone(), peer.clone());
        async move {
            let response = answerer.answer(&peer, &request).await;
            tracing::debug!(path = %request.uri().path(), status = %response.status(), "peer request");
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    serve_http1(tls, service, &stop).await;
}

/// HTTP/1.1 on one connection (`io`), answered by `service`, until it ends or `stop`
/// (then the request under way finishes). A request's headers get [`HANDSHAKE_TIMEOUT`].
pub async fn serve_http1<I, S, B>(io: I, service: S, stop: &CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<B>,
            Error = std::convert::Infallible,
        >,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(TokioIo::new(io), service);
    let mut served = std::pin::pin!(served);
    tokio::select! {
        result = served.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended");
            }
        }
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            let _ = served.await;
        }
    }
}
