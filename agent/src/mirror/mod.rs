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
//! It listens on loopback only, in plain HTTP (as containerd's `http://` hosts are), for
//! this node's containerd.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use rigger_pull::peers::PeerIdentity;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub mod answer;
pub mod queries;
pub mod request;

use self::answer::Mirror;
use self::queries::PeerQueries;

/// containerd's connections at once, at most.
const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, thiserror::Error)]
#[error("cannot listen for containerd on {address} (mirror_listen): {source}")]
pub struct BindError {
    pub address: SocketAddr,
    pub source: std::io::Error,
}

/// Bind `listen` and serve containerd there until `stop`, fetching from peers as this
/// node (`identity`) with the peers the controller names through `queries`.
pub async fn start(
    listen: SocketAddr,
    identity: PeerIdentity,
    pace: rigger_pull::peers::PeerPace,
    queries: Arc<PeerQueries>,
    metrics: Arc<crate::metrics::AgentMetrics>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, BindError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| BindError {
            address: listen,
            source,
        })?;
    tracing::info!(%listen, "serving containerd as a registry mirror (blobs from peers)");
    let mirror = Arc::new(Mirror::new(queries, identity, pace, metrics));
    Ok(tokio::spawn(serve(listener, mirror, stop)))
}

async fn serve(listener: TcpListener, mirror: Arc<Mirror>, stop: CancellationToken) {
    let answer = move |stream, remote, stop: CancellationToken| {
        let mirror = mirror.clone();
        async move {
            let service = service_fn(move |request| {
                let mirror = mirror.clone();
                async move {
                    let response = mirror.answer(&request).await;
                    tracing::debug!(path = %request.uri().path(), status = %response.status(), "mirror request");
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            crate::peers::serve::serve_http1(stream, service, &stop).await;
        }
        .instrument(tracing::debug_span!("mirror", %remote))
    };
    crate::peers::serve::accept(listener, MAX_CONNECTIONS, "mirror", stop, answer).await;
}
