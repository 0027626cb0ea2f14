//! A registry mirror for the node's own containerd (optional, off by default): kubelet's
//! pulls fetch an image's documents and blobs by digest from the fleet's nodes too.
//!
//! containerd is pointed at it through `hosts.toml` with `capabilities = ["pull"]` (never
//! `resolve`): names are always resolved at the registry, and only what a name points at
//! is asked of the mirror ([`request`]). The mirror asks the controller which nodes may
//! serve that image to this node ([`queries`]; the controller names holders only for a
//! node that a job for the image names, with grants as for a job's pulls), fetches from
//! them over the peers' mTLS endpoint, and checks every byte against its digest before
//! containerd gets the last of it ([`answer`]). Anything it cannot serve is "not here"
//! (404): containerd then asks the registry, as without a mirror.
//!
//! It listens on loopback only, over HTTPS with a client certificate only root can read
//! ([`tls`]): containerd presents it (`hosts.toml`'s `client`), no other process on the
//! node gets an answer. And it answers only for the repository of a job that names
//! this node (the controller decides, from the request's `ns` and path).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use rigger_pull::peers::PeerIdentity;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub mod answer;
pub mod queries;
pub mod request;
pub mod tls;

use self::answer::Mirror;
use self::queries::PeerQueries;
use self::tls::MirrorTls;
use crate::sharing::peers::gate::{Gate, Limits};
use crate::sharing::peers::slow_reader::EvictSlowReaders;

/// containerd's connections at once, at most.
const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("cannot listen for containerd on {address} (mirror_listen): {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] tls::MirrorTlsError),
}

/// Bind `listen` and serve containerd there until `stop` with the TLS of `mirror_dir`
/// (made there when missing), fetching from peers as this node (`identity`) with the
/// peers the controller names through `queries`.
pub async fn start(
    listen: SocketAddr,
    mirror_dir: &std::path::Path,
    identity: PeerIdentity,
    pace: rigger_pull::peers::PeerPace,
    queries: Arc<PeerQueries>,
    metrics: Arc<crate::metrics::AgentMetrics>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, BindError> {
    let tls = tls::ensure(mirror_dir, listen.ip())?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| BindError::Listen {
            address: listen,
            source,
        })?;
    tracing::info!(%listen, dir = %tls.dir.display(), "serving containerd as a registry mirror (HTTPS, its client certificate required; blobs from peers)");
    let mirror = Arc::new(Mirror::new(queries, identity, pace, metrics));
    Ok(tokio::spawn(serve(listener, tls, mirror, stop)))
}

async fn serve(
    listener: TcpListener,
    tls: MirrorTls,
    mirror: Arc<Mirror>,
    stop: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls.server);
    let answer = move |stream,
                       remote,
                       admitted: crate::sharing::peers::gate::Admitted,
                       stop: CancellationToken| {
        let (mirror, acceptor) = (mirror.clone(), acceptor.clone());
        async move {
            // The verifier took only the mirror's client certificate: containerd's.
            let Some((tls, leaf)) =
                crate::sharing::peers::serve::handshake(&acceptor, stream, "mirror").await
            else {
                return;
            };
            let Some(_served) = admitted.handshaken(&leaf) else {
                return;
            };
            let service = service_fn(move |request| {
                let mirror = mirror.clone();
                async move {
                    let response = mirror.answer(&request).await;
                    tracing::debug!(path = %request.uri().path(), status = %response.status(), "mirror request");
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            crate::sharing::peers::serve::serve_http1(EvictSlowReaders::new(tls), service, &stop).await;
        }
        .instrument(tracing::debug_span!("mirror", %remote))
    };
    let gate = Gate::new(Limits {
        max_connections: MAX_CONNECTIONS,
        handshakes: MAX_CONNECTIONS,
        per_address: MAX_CONNECTIONS,
    });
    crate::sharing::peers::gate::accept(listener, gate, "mirror", stop, answer).await;
}
