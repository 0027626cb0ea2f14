//! The HTTPS endpoint peers fetch blobs from: TLS 1.2+ with the node's own certificate,
//! a client certificate from the fleet's CA required of every peer, HTTP/1.1, the
//! [`gate`](super::gate)'s bounds (a serving slot only after the handshake; one past the
//! cap is closed at once, and the peer goes to its next source), readers that stop
//! reading let go ([`super::slow_reader`]), and a graceful stop.

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
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use rigger_pull::peers::PeerIdentity;

use super::answer::{Answerer, Peer};
use super::gate::{Admitted, Gate, HANDSHAKE_TIMEOUT, Limits};
use super::slow_reader::EvictSlowReaders;

/// A request's headers get this long (an idle kept-alive connection is closed after it).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// However long a connection is kept alive, it ends after this: a node that pings to
/// hold its slot gives it up, and a peer's next request opens a new connection.
const MAX_CONNECTION_LIFE: Duration = Duration::from_secs(300);
/// How long a stopping endpoint lets the requests under way finish.
const DRAIN: Duration = Duration::from_secs(10);

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
    super::gate::accept(
        listener,
        Gate::new(Limits::for_peers(max_connections)),
        "peer",
        stop,
        move |stream, remote, admitted, stop| {
            connection(acceptor.clone(), stream, admitted, answerer.clone(), stop)
                .instrument(tracing::debug_span!("peer", %remote))
        },
    )
    .await;
}

/// The TLS handshake of a connection the gate let in, within [`HANDSHAKE_TIMEOUT`], and
/// its client certificate's leaf; `None` (logged) when it fails.
pub async fn handshake(
    acceptor: &TlsAcceptor,
    stream: tokio::net::TcpStream,
    what: &str,
) -> Option<(
    tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    CertificateDer<'static>,
)> {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::info!(%error, "{what} TLS handshake refused");
            return None;
        }
        Err(_) => {
            tracing::info!("{what} TLS handshake timed out");
            return None;
        }
    };
    // The verifier requires a certificate; nothing to answer without it.
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| leaf.clone().into_owned())?;
    Some((tls, leaf))
}

async fn connection(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    admitted: Admitted,
    answerer: Arc<Answerer>,
    stop: CancellationToken,
) {
    let Some((tls, leaf)) = handshake(&acceptor, stream, "peer").await else {
        return;
    };
    let Some(_served) = admitted.handshaken(&leaf) else {
        tracing::debug!(
            "peer connection closed: every serving slot is taken, or this certificate holds its share"
        );
        return;
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
    serve_http1(EvictSlowReaders::new(tls), service, &stop).await;
}

/// HTTP/1.1 on one connection (`io`), answered by `service`, until it ends, has lasted
/// [`MAX_CONNECTION_LIFE`] or `stop` (then the request under way gets [`DRAIN`] to
/// finish). A request's headers get [`HEADER_TIMEOUT`].
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
        .header_read_timeout(HEADER_TIMEOUT)
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
            let _ = tokio::time::timeout(DRAIN, served).await;
        }
        () = tokio::time::sleep(MAX_CONNECTION_LIFE) => {
            // The answer under way gets DRAIN to finish; a peer still reading then goes
            // on from its offset on a new connection.
            served.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, served).await;
        }
    }
}
