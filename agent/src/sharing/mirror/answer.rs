//! One request of containerd to the mirror answered: an image's documents and blobs by
//! digest, fetched from the nodes the controller names for this node and image, or "not
//! here" (404), after which containerd asks its next host — the registry.
//!
//! The first document asked for is an image's own (containerd resolved the name at the
//! registry and asks for what it points at); the documents served tell which digests
//! belong to that image, so later requests find the same peers. Every document is
//! checked against its digest before it is served; a whole blob is too, its last piece
//! held back until it is: a peer's wrong bytes never complete a blob in containerd.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use rigger_pull::peers::{PeerIdentity, PeerPace, PeerSource, Peers};
use sha2::{Digest as _, Sha256};

use super::queries::PeerQueries;
use super::request::{Wanted, wanted};
use crate::metrics::{AgentMetrics, Outcome};
use crate::sharing::peers::answer::{Body, header_value, text, whole};
use crate::sharing::peers::reach::named;

/// Largest document served (as a pull reads them).
const MAX_DOCUMENT: u64 = 8 << 20;
/// How long the controller gets to name peers.
const PATIENCE: Duration = Duration::from_secs(2);
/// How long an image's peers (and their grants) are used before asking again.
const PEERS_TTL: Duration = Duration::from_secs(300);
/// How long "nobody" is remembered: containerd asks for each blob of an image no job
/// put here, and the controller is not asked each time.
const NOBODY_TTL: Duration = Duration::from_secs(10);
/// Images and digests remembered, at most (cleared when full).
const REMEMBERED: usize = 4096;

/// Answers containerd.
pub struct Mirror {
    queries: Arc<PeerQueries>,
    identity: PeerIdentity,
    pace: PeerPace,
    metrics: Arc<AgentMetrics>,
    /// Image → when its peers were named, and the client for them (`None`: the
    /// controller named nobody).
    images: Mutex<HashMap<ImageKey, Named>>,
    /// Digest → the image whose documents named it, in the same repository.
    owners: Mutex<HashMap<ImageKey, String>>,
}

/// When the controller named an image's peers, and the client for them (`None`:
/// nobody).
type Named = (Instant, Option<Arc<Peers>>);

/// A digest in one repository of one registry: what the mirror is asked for, and what
/// the controller answers for (a job's image is of one repository only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ImageKey {
    registry: String,
    repository: String,
    digest: String,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror").finish_non_exhaustive()
    }
}

/// The registry a mirror request's query names (`ns=<host>`), as containerd sends it.
fn namespace_of(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes()).find_map(|(key, value)| {
        let valid = key == "ns"
            && !value.is_empty()
            && value.len() <= 255
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'_'));
        valid.then(|| value.to_ascii_lowercase())
    })
}

/// The offset a `Range: bytes=N-` header asks from (containerd resumes so); any other
/// range is ignored and the whole blob sent, as RFC 9110 allows.
fn range_start(range: Option<&str>) -> u64 {
    range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Mirror {
    pub fn new(
        queries: Arc<PeerQueries>,
        identity: PeerIdentity,
        pace: PeerPace,
        metrics: Arc<AgentMetrics>,
    ) -> Self {
        Self {
            queries,
            identity,
            pace,
            metrics,
            images: Mutex::default(),
            owners: Mutex::default(),
        }
    }

    pub async fn answer<B>(&self, request: &Request<B>) -> Response<Body> {
        let head = request.method() == Method::HEAD;
        if request.method() != Method::GET && !head {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
        }
        // containerd names the registry a mirror stands in for (`?ns=`): an answer is
        // only for a job's image of that registry.
        let registry = request
            .uri()
            .query()
            .and_then(namespace_of)
            .unwrap_or_default();
        let response = match wanted(request.uri().path()) {
            Ok(Wanted::Ping) => {
                let mut response = text(StatusCode::OK, "rigger mirror");
                response.headers_mut().insert(
                    "docker-distribution-api-version",
                    HeaderValue::from_static("registry/2.0"),
                );
                return response;
            }
            Ok(Wanted::Manifest { .. } | Wanted::Blob { .. }) if registry.is_empty() => {
                tracing::debug!(query = ?request.uri().query(), "a mirror request without ns=: not answered");
                text(
                    StatusCode::NOT_FOUND,
                    "the request names no registry (ns=): only containerd's mirror requests are answered",
                )
            }
            Ok(Wanted::Manifest { repository, digest }) => {
                self.manifest(&registry, &repository, &digest, head).await
            }
            Ok(Wanted::Blob { repository, digest }) => {
                let range = request
                    .headers()
                    .get(header::RANGE)
                    .and_then(|v| v.to_str().ok());
                self.blob(&registry, &repository, &digest, range_start(range), head)
                    .await
            }
            Err(reason) => text(StatusCode::NOT_FOUND, reason),
        };
        let result = if response.status().is_success() {
            "served"
        } else {
            "missing"
        };
        self.metrics
            .mirror_requests
            .get_or_create(&Outcome::of(result))
            .inc();
        response
    }

    /// The peers for the image `digest` belongs to (the image itself when no document
    /// served here named it), in `repository` at `registry`; none when the controller
    /// names none (remembered for a while, so containerd's next requests are answered
    /// at once).
    async fn peers_for(
        &self,
        registry: &str,
        repository: &str,
        digest: &str,
    ) -> Option<Arc<Peers>> {
        let key = |digest: &str| ImageKey {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            digest: digest.to_owned(),
        };
        let image = self
            .owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key(digest))
            .cloned()
            .unwrap_or_else(|| digest.to_owned());
        let image = key(&image);
        if let Some((at, peers)) = self
            .images
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&image)
        {
            let ttl = if peers.is_some() {
                PEERS_TTL
            } else {
                NOBODY_TTL
            };
            if at.elapsed() < ttl {
                return peers.clone();
            }
        }
        let sources: Vec<PeerSource> = self
            .queries
            .ask(&image.digest, repository, registry, PATIENCE)
            .await
            .into_iter()
            .map(|p| PeerSource {
                node: p.node,
                address: p.address,
                grant: p.grant,
            })
            .collect();
        let peers = if sources.is_empty() {
            None
        } else {
            match Peers::new(sources, &self.identity, self.pace).await {
                Ok(peers) => Some(peers),
                Err(error) => {
                    tracing::warn!(%error, "cannot reach peers for the mirror");
                    None
                }
            }
        };
        let mut images = self.images.lock().unwrap_or_else(PoisonError::into_inner);
        if images.len() >= REMEMBERED {
            images.clear();
        }
        images.insert(image, (Instant::now(), peers.clone()));
        peers
    }

    /// What `document` (of the image `image` belongs to) names belongs to that image too.
    fn learn(&self, registry: &str, repository: &str, digest: &str, document: &[u8]) {
        let Ok(named) = named(document) else {
            return;
        };
        let key = |digest: &str| ImageKey {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            digest: digest.to_owned(),
        };
        let mut owners = self.owners.lock().unwrap_or_else(PoisonError::into_inner);
        let image = owners
            .get(&key(digest))
            .cloned()
            .unwrap_or_else(|| digest.to_owned());
        if owners.len() + named.documents.len() + named.blobs.len() > REMEMBERED {
            owners.clear();
        }
        for child in named.documents.into_iter().chain(named.blobs) {
            owners.insert(key(&child), image.clone());
        }
    }

    async fn manifest(
        &self,
        registry: &str,
        repository: &str,
        digest: &str,
        head: bool,
    ) -> Response<Body> {
        let not_here = || text(StatusCode::NOT_FOUND, format!("{digest} is not on a peer"));
        let Some(peers) = self.peers_for(registry, repository, digest).await else {
            return not_here();
        };
        let Some(manifest) = peers.manifest(repository, digest, MAX_DOCUMENT).await else {
            return not_here();
        };
        self.learn(registry, repository, digest, &manifest.bytes);
        self.metrics
            .mirror_bytes
            .inc_by(manifest.bytes.len() as u64);
        let length = manifest.bytes.len();
        let body = if head { Bytes::new() } else { manifest.bytes };
        let media_type = manifest.media_type;
        let mut response = Response::new(whole(body));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, header_value(media_type));
        headers.insert(header::CONTENT_LENGTH, header_value(length.to_string()));
        headers.insert("docker-content-digest", header_value(digest.to_owned()));
        response
    }

    async fn blob(
        &self,
        registry: &str,
        repository: &str,
        digest: &str,
        start: u64,
        head: bool,
    ) -> Response<Body> {
        let not_here = || text(StatusCode::NOT_FOUND, format!("{digest} is not on a peer"));
        let Some(peers) = self.peers_for(registry, repository, digest).await else {
            return not_here();
        };
        let Some(blob) = peers.blob(repository, digest, start).await else {
            return not_here();
        };
        // A peer's word on the size is checked before it is used (a resumed request
        // past the end, or a size of 0, is nothing to serve).
        if start >= blob.size && (start > 0 || blob.size > 0) {
            return not_here();
        }
        let length = blob.size - start;
        let body = if head {
            whole(Bytes::new())
        } else {
            let served = self.metrics.mirror_bytes.clone();
            let (judged, node, wanted) = (peers.clone(), blob.node.clone(), digest.to_owned());
            let counted = blob.body.map(move |piece| {
                match &piece {
                    Ok(piece) => {
                        served.inc_by(piece.len() as u64);
                    }
                    Err(error) => judged.broke(&node, &wanted, error),
                }
                piece.map_err(|e| e.to_string())
            });
            let checked = if start == 0 {
                let suspect = (peers.clone(), blob.node.clone());
                verified(counted.boxed(), digest.to_owned(), move || {
                    suspect.0.suspect(std::slice::from_ref(&suspect.1));
                })
            } else {
                counted.boxed()
            };
            StreamBody::new(
                checked.map(|piece| piece.map(Frame::data).map_err(std::io::Error::other)),
            )
            .boxed_unsync()
        };
        let mut response = Response::new(body);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_LENGTH, header_value(length.to_string()));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert("docker-content-digest", header_value(digest.to_owned()));
        if start > 0 {
            headers.insert(
                header::CONTENT_RANGE,
                header_value(format!("bytes {start}-{}/{}", blob.size - 1, blob.size)),
            );
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        }
        response
    }
}

/// `pieces` of a whole blob, the last held back until all of them hash to `digest`;
/// when they do not, an error instead (and `wrong` is called).
fn verified(
    pieces: BoxStream<'static, Result<Bytes, String>>,
    digest: String,
    wrong: impl FnOnce() + Send + 'static,
) -> BoxStream<'static, Result<Bytes, String>> {
    struct State {
        pieces: BoxStream<'static, Result<Bytes, String>>,
        hasher: Sha256,
        held: Option<Bytes>,
        digest: String,
        wrong: Option<Box<dyn FnOnce() + Send>>,
    }
    let state = State {
        pieces,
        hasher: Sha256::new(),
        held: None,
        digest,
        wrong: Some(Box::new(wrong)),
    };
    futures::stream::try_unfold(state, |mut state| async move {
        loop {
            match state.pieces.next().await {
                Some(piece) => {
                    let piece = piece?;
                    state.hasher.update(&piece);
                    if let Some(previous) = state.held.replace(piece) {
                        return Ok(Some((previous, state)));
                    }
                }
                None => {
                    let Some(last) = state.held.take() else {
                        return Ok(None);
                    };
                    let actual = format!("sha256:{}", hex::encode(state.hasher.clone().finalize()));
                    if actual != state.digest {
                        if let Some(wrong) = state.wrong.take() {
                            wrong();
                        }
                        return Err(format!(
                            "the peer's bytes hash to {actual}, not {}",
                            state.digest
                        ));
                    }
                    return Ok(Some((last, state)));
                }
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicBool, Ordering};

    use futures::stream;

    use super::*;

    fn pieces(parts: &[&'static [u8]]) -> BoxStream<'static, Result<Bytes, String>> {
        stream::iter(
            parts
                .iter()
                .map(|p| Ok(Bytes::from_static(p)))
                .collect::<Vec<_>>(),
        )
        .boxed()
    }

    #[tokio::test]
    async fn a_blob_is_served_whole_only_when_it_matches_its_digest() {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(b"abcdef")));
        let right: Vec<_> = verified(pieces(&[b"ab", b"cd", b"ef"]), digest.clone(), || {})
            .collect()
            .await;
        assert_eq!(right.len(), 3);
        assert!(right.iter().all(Result::is_ok));
        let called = Arc::new(AtomicBool::new(false));
        let flag = called.clone();
        let wrong: Vec<_> = verified(pieces(&[b"ab", b"cd", b"eX"]), digest, move || {
            flag.store(true, Ordering::Relaxed);
        })
        .collect()
        .await;
        // The first pieces went; the last never did: an error came instead.
        assert_eq!(wrong.len(), 3);
        assert!(wrong[..2].iter().all(Result::is_ok));
        assert!(wrong[2].is_err());
        assert!(called.load(Ordering::Relaxed));
    }

    #[test]
    fn the_registry_is_what_containerd_names_with_ns() {
        assert_eq!(
            namespace_of("ns=registry.example:5000").as_deref(),
            Some("registry.example:5000")
        );
        assert_eq!(
            namespace_of("a=1&ns=Docker.IO").as_deref(),
            Some("docker.io")
        );
        assert_eq!(namespace_of("ns="), None);
        assert_eq!(namespace_of("ns=a/b"), None);
        assert_eq!(namespace_of("x=1"), None);
    }

    #[test]
    fn only_an_open_ended_range_resumes() {
        assert_eq!(range_start(Some("bytes=100-")), 100);
        assert_eq!(range_start(Some("bytes=100-200")), 0);
        assert_eq!(range_start(Some("items=1-")), 0);
        assert_eq!(range_start(None), 0);
    }
}
