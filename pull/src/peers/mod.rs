//! Peers: other nodes of the fleet that hold a job's blobs and serve them (their agent's
//! `peer_listen`). A pull given peers asks them for each blob before the registry, one
//! after the other; containerd checks every blob against its digest when it is
//! committed, whoever sent the bytes, and a peer whose bytes went into a blob that did
//! not match is not asked again in this pull and is named in its result.
//!
//! Peers are reached over TLS with the node's own certificate, trusting the fleet's CA
//! only (not the system's), and by node name: the name a peer's certificate must carry.
//! Each request carries the grant the controller signed for this node and image.

mod pace;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, RANGE};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use self::pace::{DEFAULT_PEER_MIN_RATE, DEFAULT_PEER_WINDOW, PeerPace};
use self::pace::{PaceJudge, Verdict};

/// Peers one pull asks at most, whatever a task names (each costs a name lookup, and a
/// try per blob before the registry).
const MAX_PEERS: usize = 8;
/// What is read of a peer's error answer, at most (its reason, for the log).
const MAX_ERROR_BODY: usize = 4 << 10;
/// Connection failures in a row after which a peer is left for the pull.
const MAX_CONNECTION_FAILURES: u32 = 3;

/// A node to ask for blobs, as the controller planned it.
#[derive(Clone)]
pub struct PeerSource {
    /// The node's name: what its certificate is checked against.
    pub node: String,
    /// `host:port` of its peer endpoint.
    pub address: String,
    /// The controller's grant for this node (the one pulling) to fetch from that one.
    pub grant: String,
}

impl std::fmt::Debug for PeerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSource")
            .field("node", &self.node)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Why a peer's answer stopped before its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerStreamError {
    /// Slower than the pace a peer must keep (a stall included): not asked again in
    /// this pull.
    #[error("slower than the peers' floor ({rate} B/s over the last window)")]
    TooSlow { rate: u64 },
    /// The connection broke.
    #[error("{0}")]
    Broken(String),
}

/// A peer's answer body, piece by piece, judged for pace as it comes.
pub type PeerBody = BoxStream<'static, Result<Bytes, PeerStreamError>>;

/// The header a peer's answer carries when it relays bytes another node sent it.
pub const RELAYED_HEADER: &str = "rigger-relayed";

/// A blob as a peer answers it.
pub struct PeerBlob {
    /// Who sends it.
    pub node: String,
    /// The whole blob's size.
    pub size: u64,
    /// The peer says the bytes are another node's, relayed (so it is no author of them).
    pub relayed: bool,
    /// Its bytes from the asked offset on.
    pub body: PeerBody,
}

impl std::fmt::Debug for PeerBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerBlob")
            .field("node", &self.node)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// This node's certificate and key and the fleet's CA, as PEM.
#[derive(Clone)]
pub struct PeerIdentity {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for PeerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerIdentity").finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("peer TLS: {0}")]
pub struct PeerSetupError(String);

/// Why a peer did not serve what was asked.
#[derive(Debug)]
pub(crate) enum PeerRefusal {
    /// It answered outside the protocol (a redirect, a body without a size, an error
    /// answer without end) or not at all within a window: not asked again in this pull.
    Unusable(String),
    /// The connection failed (refused, or closed at the handshake: a peer at its
    /// connection limit closes new ones): asked again, up to [`MAX_CONNECTION_FAILURES`]
    /// in a row.
    Unreachable(String),
    /// It answered no (it lacks the blob, the grant is refused): the next blob may be
    /// there.
    Declined(String),
}

impl std::fmt::Display for PeerRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unusable(reason) | Self::Unreachable(reason) | Self::Declined(reason) => {
                f.write_str(reason)
            }
        }
    }
}

/// The peers of one pull.
pub struct Peers {
    client: reqwest::Client,
    sources: Vec<PeerSource>,
    pace: PeerPace,
    /// Nodes whose bytes went into a blob that did not match its digest.
    suspects: Mutex<BTreeSet<String>>,
    /// Nodes left for the rest of the pull: too slow, unreachable, or off the protocol.
    /// Unlike suspects they are not reported: a slow node is not a liar.
    dropped: Mutex<BTreeSet<String>>,
    /// Connection failures in a row, per node.
    failures: Mutex<std::collections::HashMap<String, u32>>,
    received: AtomicU64,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("sources", &self.sources)
            .finish_non_exhaustive()
    }
}

/// A node name as Kubernetes has them (DNS subdomain): the only names a peer URL is
/// made of.
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|part| !part.is_empty() && !part.starts_with('-') && !part.ends_with('-'))
}

impl Peers {
    /// A client for `sources` (those whose name or address cannot be used are left out,
    /// with a warning), leaving a peer that does not keep `pace`.
    ///
    /// A peer is another node, so outside input: its answers are read over HTTPS only,
    /// never followed elsewhere (a redirect could point this node at its own loopback
    /// or a metadata address), and every body it sends is bounded in size and pace.
    pub async fn new(
        sources: Vec<PeerSource>,
        identity: &PeerIdentity,
        pace: PeerPace,
    ) -> Result<Arc<Self>, PeerSetupError> {
        let config = client_tls(identity)?;
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(config)
            .https_only(true)
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(pace.window)
            .no_proxy();
        let mut usable = Vec::new();
        if sources.len() > MAX_PEERS {
            tracing::warn!(
                peers = sources.len(),
                "the task names more peers than are asked; the first {MAX_PEERS} are"
            );
        }
        for source in sources.into_iter().take(MAX_PEERS) {
            if !is_node_name(&source.node) {
                tracing::warn!(node = %source.node, "a peer's node name is not a DNS name; not asked");
                continue;
            }
            let Some(address) = resolve(&source.address).await else {
                tracing::warn!(node = %source.node, address = %source.address, "a peer's address does not resolve; not asked");
                continue;
            };
            builder = builder.resolve(&source.node, address);
            usable.push(source);
        }
        let client = builder
            .build()
            .map_err(|e| PeerSetupError(format!("client: {e}")))?;
        Ok(Arc::new(Self {
            client,
            sources: usable,
            pace,
            suspects: Mutex::default(),
            dropped: Mutex::default(),
            failures: Mutex::default(),
            received: AtomicU64::new(0),
        }))
    }

    /// The peers still worth asking, in the planned order.
    pub(crate) fn usable(&self) -> Vec<PeerSource> {
        let suspects = self.suspects.lock().map(|s| s.clone()).unwrap_or_default();
        let dropped = self.dropped.lock().map(|s| s.clone()).unwrap_or_default();
        self.sources
            .iter()
            .filter(|s| !suspects.contains(&s.node) && !dropped.contains(&s.node))
            .cloned()
            .collect()
    }

    /// `node` is not asked again in this pull (too slow, unreachable, off the protocol).
    pub fn drop_source(&self, node: &str, reason: &str) {
        tracing::info!(%node, %reason, "a peer is left for the rest of the pull");
        if let Ok(mut dropped) = self.dropped.lock() {
            dropped.insert(node.to_owned());
        }
    }

    /// Nodes left for the rest of the pull (not reported: slow is not lying).
    pub fn dropped(&self) -> Vec<String> {
        self.dropped
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// What a failed request says of its peer: an unusable one is not asked again.
    pub(crate) fn refused(&self, node: &str, digest: &str, refusal: &PeerRefusal) {
        let failures = |reset: bool| {
            let mut failures = self.failures.lock().map_err(|_| ()).ok()?;
            let count = failures.entry(node.to_owned()).or_insert(0);
            *count = if reset { 0 } else { *count + 1 };
            Some(*count)
        };
        match refusal {
            PeerRefusal::Unusable(reason) => self.drop_source(node, reason),
            PeerRefusal::Unreachable(reason) => {
                if failures(false).is_some_and(|n| n >= MAX_CONNECTION_FAILURES) {
                    self.drop_source(node, reason);
                } else {
                    tracing::debug!(%digest, %node, %reason, "a peer could not be reached");
                }
            }
            PeerRefusal::Declined(reason) => {
                failures(true);
                tracing::debug!(%digest, %node, %reason, "a peer did not serve it");
            }
        }
    }

    /// What a broken stream says of its peer: a slow one is not asked again.
    pub fn broke(&self, node: &str, digest: &str, error: &PeerStreamError) {
        match error {
            PeerStreamError::TooSlow { .. } => self.drop_source(node, &error.to_string()),
            PeerStreamError::Broken(reason) => {
                tracing::debug!(%digest, %node, %reason, "a peer's stream broke");
            }
        }
    }

    /// Bytes of `nodes` went into a blob that did not match its digest.
    pub fn suspect(&self, nodes: &[String]) {
        if let Ok(mut suspects) = self.suspects.lock() {
            suspects.extend(nodes.iter().cloned());
        }
    }

    /// Bytes of `contributors` went into a blob that did not match its digest. One
    /// alone is suspected — unless it said it relayed another node's bytes (`relayed`):
    /// a relay is not their author. Of several, none is (any one may have sent the wrong
    /// bytes, and a liar could otherwise frame the honest node that went on after it).
    /// Whoever is not suspected but relayed, or whose answer ended before the blob did
    /// (`broken`), is left for the rest of the pull: a liar that hides behind either
    /// does it once.
    pub fn blame(&self, contributors: &[String], broken: &[String], relayed: &[String]) {
        match contributors {
            [one] if !relayed.contains(one) => self.suspect(std::slice::from_ref(one)),
            [] => {}
            several => {
                tracing::warn!(peers = ?several, relayed = ?relayed, "bytes from peers did not match the blob's digest; none is blamed, relays and those that hung up are left");
                for node in several
                    .iter()
                    .filter(|n| broken.contains(n) || relayed.contains(n))
                {
                    self.drop_source(
                        node,
                        "its part of a blob that did not match ended early or was relayed",
                    );
                }
            }
        }
    }

    /// Nodes whose bytes did not match (what the pull reports).
    pub fn suspects(&self) -> Vec<String> {
        self.suspects
            .lock()
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Bytes received from peers so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    pub(crate) fn count(&self, bytes: u64) {
        self.received.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A document (index, manifest, config) by `digest` from the first usable peer whose
    /// copy matches the digest, up to `limit` bytes; a peer whose copy does not match is
    /// suspected.
    pub async fn document(&self, repository: &str, digest: &str, limit: u64) -> Option<Vec<u8>> {
        for source in self.usable() {
            let (size, mut body) = match self.fetch(&source, repository, digest, 0).await {
                Ok(answer) => (answer.size, answer.body),
                Err(refusal) => {
                    self.refused(&source.node, digest, &refusal);
                    continue;
                }
            };
            if size > limit {
                tracing::debug!(%digest, node = %source.node, size, "a peer's document is bigger than a document may be");
                continue;
            }
            let mut document = Vec::new();
            let mut whole = true;
            while let Some(piece) = body.next().await {
                match piece {
                    Ok(piece) if document.len() as u64 + piece.len() as u64 <= size => {
                        document.extend_from_slice(&piece);
                    }
                    Ok(_) => {
                        whole = false;
                        break;
                    }
                    Err(error) => {
                        self.broke(&source.node, digest, &error);
                        whole = false;
                        break;
                    }
                }
            }
            if !whole {
                continue;
            }
            if crate::digest::verify_digest(&document, digest).is_err() {
                tracing::warn!(%digest, node = %source.node, "a peer's copy of a document did not match its digest");
                self.suspect(std::slice::from_ref(&source.node));
                continue;
            }
            self.count(document.len() as u64);
            return Some(document);
        }
        None
    }

    /// An index or manifest by `digest`, checked, as a registry would serve it (its media
    /// type read from the document).
    pub async fn manifest(
        &self,
        repository: &str,
        digest: &str,
        limit: u64,
    ) -> Option<crate::registry::RawManifest> {
        let bytes = self.document(repository, digest, limit).await?;
        let media_type = crate::media::manifest_media_type(&bytes).ok()?;
        Some(crate::registry::RawManifest {
            bytes: bytes.into(),
            digest: digest.to_owned(),
            media_type,
        })
    }

    /// Blob `digest` from byte `start` on, from the first usable peer that serves it.
    pub async fn blob(&self, repository: &str, digest: &str, start: u64) -> Option<PeerBlob> {
        for source in self.usable() {
            match self.fetch(&source, repository, digest, start).await {
                Ok(answer) => {
                    return Some(PeerBlob {
                        node: source.node,
                        size: answer.size,
                        relayed: answer.relayed,
                        body: answer.body,
                    });
                }
                Err(refusal) => self.refused(&source.node, digest, &refusal),
            }
        }
        None
    }

    /// `GET` `digest` from `source`, from byte `start` on: whether the peer relays
    /// them, and the bytes.
    pub(crate) async fn get(
        &self,
        source: &PeerSource,
        repository: &str,
        digest: &str,
        start: u64,
    ) -> Result<(bool, PeerBody), PeerRefusal> {
        let answer = self.fetch(source, repository, digest, start).await?;
        Ok((answer.relayed, answer.body))
    }

    /// `GET` `digest` from `source`, from byte `start` on: the blob's whole size (as the
    /// answer states it) and the bytes.
    async fn fetch(
        &self,
        source: &PeerSource,
        repository: &str,
        digest: &str,
        start: u64,
    ) -> Result<PeerAnswer, PeerRefusal> {
        let port = source
            .address
            .rsplit_once(':')
            .map(|(_, port)| port)
            .unwrap_or_default();
        let url = format!(
            "https://{}:{port}/v2/{repository}/blobs/{digest}",
            source.node
        );
        let mut request = self
            .client
            .get(&url)
            .header(AUTHORIZATION, format!("Bearer {}", source.grant));
        if start > 0 {
            request = request.header(RANGE, format!("bytes={start}-"));
        }
        let response = tokio::time::timeout(self.pace.window, request.send())
            .await
            .map_err(|_| {
                PeerRefusal::Unusable(format!(
                    "no answer within {} s",
                    self.pace.window.as_secs_f32()
                ))
            })?
            .map_err(|e| PeerRefusal::Unreachable(rigger_daemon::error_chain(&e)))?;
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(&source.node);
        }
        let status = response.status();
        let expected = if start > 0 {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        };
        if status.is_redirection() {
            return Err(PeerRefusal::Unusable(format!(
                "HTTP {status}: a peer serves what it holds itself, never elsewhere"
            )));
        }
        if status != expected {
            return Err(match error_reason(response, self.pace).await {
                Ok(reason) => PeerRefusal::Declined(format!("HTTP {status}: {}", reason.trim())),
                // A refusal that does not end: a peer that answers so is not asked again.
                Err(start) => PeerRefusal::Unusable(format!(
                    "HTTP {status} with an answer past {MAX_ERROR_BODY} bytes or one window: {}",
                    start.trim()
                )),
            });
        }
        let size = if start > 0 {
            response
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.rsplit_once('/'))
                .and_then(|(_, size)| size.parse().ok())
        } else {
            response.content_length()
        }
        .ok_or_else(|| {
            PeerRefusal::Unusable("the answer does not say the blob's size".to_owned())
        })?;
        let relayed = response.headers().contains_key(RELAYED_HEADER);
        Ok(PeerAnswer {
            size,
            relayed,
            body: paced(response, self.pace),
        })
    }
}

/// A peer's answer to a blob request.
struct PeerAnswer {
    /// The whole blob's size, as the answer states it.
    size: u64,
    relayed: bool,
    body: PeerBody,
}

/// A peer's error answer, for the log: whole when it ends within `MAX_ERROR_BODY` bytes
/// and one window of waiting; else `Err` with its start (the rest is never read).
async fn error_reason(response: reqwest::Response, pace: PeerPace) -> Result<String, String> {
    let mut body = response.bytes_stream();
    let mut reason = Vec::new();
    let read = async {
        while let Some(Ok(piece)) = body.next().await {
            if reason.len() + piece.len() > MAX_ERROR_BODY {
                let room = MAX_ERROR_BODY - reason.len();
                reason.extend_from_slice(&piece[..room]);
                return false;
            }
            reason.extend_from_slice(&piece);
        }
        true
    };
    let whole = tokio::time::timeout(pace.window, read)
        .await
        .unwrap_or(false);
    let text = String::from_utf8_lossy(&reason).into_owned();
    if whole { Ok(text) } else { Err(text) }
}

/// A response body judged window by window: a peer slower than `pace` (a stall
/// included) ends it with [`PeerStreamError::TooSlow`].
fn paced(response: reqwest::Response, pace: PeerPace) -> PeerBody {
    struct State {
        body: BoxStream<'static, reqwest::Result<Bytes>>,
        judge: PaceJudge,
        done: bool,
    }
    let state = State {
        body: response.bytes_stream().boxed(),
        judge: PaceJudge::new(pace, tokio::time::Instant::now().into_std()),
        done: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        if state.done {
            return None;
        }
        loop {
            let deadline = tokio::time::Instant::from_std(state.judge.window_end());
            let next = tokio::time::timeout_at(deadline, state.body.next()).await;
            let now = tokio::time::Instant::now().into_std();
            let (bytes, piece) = match next {
                Ok(Some(Ok(piece))) => (piece.len() as u64, Some(piece)),
                Ok(Some(Err(e))) => {
                    state.done = true;
                    return Some((
                        Err(PeerStreamError::Broken(rigger_daemon::error_chain(&e))),
                        state,
                    ));
                }
                Ok(None) => return None,
                Err(_) => (0, None),
            };
            if let Verdict::TooSlow { rate } = state.judge.record(now, bytes) {
                state.done = true;
                return Some((Err(PeerStreamError::TooSlow { rate }), state));
            }
            if let Some(piece) = piece {
                return Some((Ok(piece), state));
            }
        }
    })
    .boxed()
}

/// TLS as a node dialing its peers: the node's certificate for client authentication,
/// and the fleet's CA as the only trusted root (a public CA cannot vouch for a node).
pub fn client_tls(identity: &PeerIdentity) -> Result<rustls::ClientConfig, PeerSetupError> {
    let setup = |what: &str, e: String| PeerSetupError(format!("{what}: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&identity.ca_pem) {
        roots
            .add(ca.map_err(|e| setup("CA", e.to_string()))?)
            .map_err(|e| setup("CA", e.to_string()))?;
    }
    let chain = CertificateDer::pem_slice_iter(&identity.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| setup("certificate", e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(&identity.key_pem)
        .map_err(|e| setup("key", e.to_string()))?;
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| setup("protocol versions", e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| setup("certificate and key", e.to_string()))
}

/// The first address `host:port` resolves to, within a second (a node says where it is
/// reached; a name that resolves slowly must not hold a pull up).
async fn resolve(address: &str) -> Option<SocketAddr> {
    tokio::time::timeout(Duration::from_secs(1), tokio::net::lookup_host(address))
        .await
        .ok()?
        .ok()?
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_are_made_of_node_names_only() {
        for good in ["node-a", "n1.zone-b.example"] {
            assert!(is_node_name(good), "{good}");
        }
        for bad in [
            "",
            "Node-A",
            "node_a",
            "-node",
            "node..a",
            "evil.com/x",
            "a@b",
            "node:1",
        ] {
            assert!(!is_node_name(bad), "{bad}");
        }
    }
}
