//! Serving blobs to other nodes (fleet distribution).
//!
//! A node that holds an image's blobs in containerd serves them to the other nodes of a
//! job, so a fleet fetches an image from the registry about once. What a request may
//! get, and from whom:
//! - only over mTLS with the fleet's CA, and only from a node certificate (the peer is
//!   the node its certificate names);
//! - only blobs by digest ([`request`]), never manifests by tag;
//! - only with a peer grant the controller signed for that node and an image whose
//!   blobs include the one asked for ([`reach`], `rigger_proto::peer_grant`).
//!
//! Blobs still arriving are served too, as far as containerd holds them ([`ingest`]):
//! the nodes of a job fetch from one that is itself still downloading.

use std::net::SocketAddr;
use std::sync::Arc;

use rigger_proto::peer_grant::GrantVerifier;
use rigger_pull::arriving::Arriving;
use rigger_pull::fetch::limit::RateLimit;
use rigger_pull::peers::PeerIdentity;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::answer::Answerer;
use self::blobs::ContainerdBlobs;
use self::serve::{ServeError, bind, serve, server_config};

/// How this node serves peers (the `peer_*` settings, checked by `crate::config`).
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// This node's name: the server its grants must name.
    pub node: String,
    pub listen: SocketAddr,
    /// What the controller tells other nodes to dial (`host:port`).
    pub address: String,
    pub max_connections: usize,
    pub upload_rate: u64,
    /// This node's certificate (what peers check it by), key and the fleet's CA.
    pub identity: PeerIdentity,
}

pub mod answer;
pub mod blobs;
pub mod gate;
pub mod ingest;
pub mod reach;
pub mod request;
pub mod serve;
pub mod slow_reader;

#[cfg(test)]
mod tests;

/// Bind the peer endpoint and serve it until `stop`: blobs from containerd's content
/// store in `namespace` and those this node's pulls announce in `arriving`, under the
/// grant key the controller link puts in `grants`.
pub async fn start(
    settings: &PeerSettings,
    containerd: Arc<dyn rigger_pull::containerd::Containerd>,
    namespace: &str,
    arriving: Arriving,
    grants: watch::Receiver<Option<GrantVerifier>>,
    metrics: Arc<crate::metrics::AgentMetrics>,
    stop: CancellationToken,
) -> Result<JoinHandle<()>, ServeError> {
    let tls = server_config(&settings.identity)?;
    let listener = bind(settings.listen).await?;
    tracing::info!(listen = %settings.listen, address = %settings.address, "serving blobs to peers");
    let answerer = Arc::new(Answerer::new(
        settings.node.clone(),
        Arc::new(ContainerdBlobs::new(containerd, namespace, arriving)),
        grants,
        Some(Arc::new(RateLimit::new(settings.upload_rate))),
        metrics,
    ));
    Ok(tokio::spawn(serve(
        listener,
        tls,
        answerer,
        settings.max_connections,
        stop,
    )))
}
