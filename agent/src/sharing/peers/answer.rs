//! One peer request answered: what [`request`] reads from it, checked against the
//! peer's grant and certificate and against what the grant's image [`reach`]es, served
//! from this node's [`Blobs`] under the node-wide upload cap.
//!
//! Refusals carry a one-line reason in their body (the fetching node logs it); a blob
//! the grant does not reach is answered as one this node does not hold, so a peer learns
//! nothing about other images.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use rigger_proto::peer_grant::GrantVerifier;
use rigger_pull::fetch::limit::RateLimit;
use rigger_pull::peers::RELAYED_HEADER;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::sync::watch;

use super::blobs::{Blobs, document};
use super::reach::{named, reached};
use super::request::{Asked, Part, Refusal, asked, part};
use crate::metrics::{AgentMetrics, Outcome};

/// The body of an answer.
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// Largest index or manifest read to check a grant (as a pull reads them).
const MAX_DOCUMENT: u64 = 8 << 20;
/// How long the blobs an image reaches are remembered (an image's documents do not
/// change; the bound only keeps the memory small).
const REACH_TTL: Duration = Duration::from_secs(60);
const REACH_CACHE: usize = 64;
/// Manifests of an index read (of those held here) to check a grant.
const MAX_MANIFESTS_READ: usize = 16;
/// How long a request for a blob of an image being pulled here waits for that blob's
/// download to begin (this node's pull fetches a few layers at a time, bottom first,
/// as the asking node does, so it is about to): well within the asking node's patience
/// for a silent peer.
const ARRIVAL_WAIT: Duration = Duration::from_secs(4);
const ARRIVAL_POLL: Duration = Duration::from_millis(50);

/// The blobs an image reaches, and when that was read.
type Reached = (Instant, Arc<BTreeSet<String>>);

/// A request answered with nothing: its status and a one-line reason.
#[derive(Debug)]
struct Refused {
    status: StatusCode,
    reason: String,
    /// For 416: the blob's size, which the answer names.
    size: Option<u64>,
}

fn refused(status: StatusCode, reason: impl Into<String>) -> Refused {
    Refused {
        status,
        reason: reason.into(),
        size: None,
    }
}

impl Refused {
    fn into_response(self) -> Response<Body> {
        let mut response = text(self.status, self.reason);
        if let Some(size) = self.size {
            response.headers_mut().insert(
                header::CONTENT_RANGE,
                header_value(format!("bytes */{size}")),
            );
        }
        response
    }
}

/// Who asked: the leaf of the certificate chain the TLS handshake verified against the
/// fleet's CA.
#[derive(Debug, Clone)]
pub struct Peer {
    pub leaf: CertificateDer<'static>,
}

impl Peer {
    /// Whether the peer's certificate is issued for node `name`.
    pub fn is_node(&self, name: &str) -> bool {
        let Ok(certificate) = webpki::EndEntityCert::try_from(&self.leaf) else {
            return false;
        };
        ServerName::try_from(name)
            .is_ok_and(|name| certificate.verify_is_valid_for_subject_name(&name).is_ok())
    }
}

/// Answers peers' requests.
pub struct Answerer {
    /// This node's name: the server a grant must name.
    node: String,
    blobs: Arc<dyn Blobs>,
    metrics: Arc<AgentMetrics>,
    /// The controller's grant key, once the link has brought it.
    grants: watch::Receiver<Option<GrantVerifier>>,
    upload: Option<Arc<RateLimit>>,
    reach_cache: Mutex<HashMap<String, Reached>>,
}

impl std::fmt::Debug for Answerer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answerer").finish_non_exhaustive()
    }
}

/// A body of `bytes`, whole.
pub(crate) fn whole(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An answer of `status` whose body is `reason`, a line of text.
pub(crate) fn text(status: StatusCode, reason: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(whole(Bytes::from(reason.into() + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `value` as a header's (empty if it cannot be one).
pub(crate) fn header_value(value: String) -> HeaderValue {
    HeaderValue::try_from(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

impl Answerer {
    pub fn new(
        node: String,
        blobs: Arc<dyn Blobs>,
        grants: watch::Receiver<Option<GrantVerifier>>,
        upload: Option<Arc<RateLimit>>,
        metrics: Arc<AgentMetrics>,
    ) -> Self {
        Self {
            node,
            blobs,
            metrics,
            grants,
            upload,
            reach_cache: Mutex::default(),
        }
    }

    /// The answer to `request` from `peer`.
    pub async fn answer<B>(&self, peer: &Peer, request: &Request<B>) -> Response<Body> {
        let response = self
            .try_answer(peer, request)
            .await
            .unwrap_or_else(Refused::into_response);
        if asked(request.uri().path()) != Ok(Asked::Ping) {
            let result = match response.status() {
                s if s.is_success() => "served",
                StatusCode::NOT_FOUND => "missing",
                _ => "refused",
            };
            self.metrics
                .peer_requests
                .get_or_create(&Outcome::of(result))
                .inc();
        }
        response
    }

    async fn try_answer<B>(
        &self,
        peer: &Peer,
        request: &Request<B>,
    ) -> Result<Response<Body>, Refused> {
        let head = request.method() == Method::HEAD;
        if request.method() != Method::GET && !head {
            return Err(refused(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD"));
        }
        let digest = match asked(request.uri().path()) {
            Ok(Asked::Ping) => {
                let mut response = text(StatusCode::OK, "rigger peer");
                response.headers_mut().insert(
                    "docker-distribution-api-version",
                    HeaderValue::from_static("registry/2.0"),
                );
                return Ok(response);
            }
            Ok(Asked::Blob { digest }) => digest,
            Err(refusal @ Refusal::NotServed(_)) => {
                return Err(refused(StatusCode::NOT_FOUND, refusal.to_string()));
            }
            Err(refusal @ Refusal::BadDigest(_)) => {
                return Err(refused(StatusCode::BAD_REQUEST, refusal.to_string()));
            }
        };
        let reference = self.granted_image(peer, request)?;
        let image = self.resolved(&reference).await?;
        let not_here = || refused(StatusCode::NOT_FOUND, format!("{digest} is not held here"));
        if !self.reached_by(&image).await?.contains(&digest) {
            return Err(not_here());
        }
        let size = self.size(&image, &digest).await?.ok_or_else(not_here)?;
        let range = request
            .headers()
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok());
        let (status, start, end) = match part(range, size) {
            Part::Whole => (StatusCode::OK, 0, size),
            Part::Range { start, end } => (StatusCode::PARTIAL_CONTENT, start, end),
            Part::Unsatisfiable => {
                return Err(Refused {
                    size: Some(size),
                    ..refused(
                        StatusCode::RANGE_NOT_SATISFIABLE,
                        "the range is past the blob's end",
                    )
                });
            }
        };
        // Asked before the body opens: bytes another node sent are not this node's word.
        let relayed = self.blobs.relayed(&digest);
        let body = if head || start == end {
            whole(Bytes::new())
        } else {
            self.body(&digest, start, end).await?
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if relayed {
            // The asking node does not take this one for the bytes' author.
            headers.insert(RELAYED_HEADER, HeaderValue::from_static("true"));
        }
        headers.insert(
            header::CONTENT_LENGTH,
            header_value((end - start).to_string()),
        );
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert("docker-content-digest", header_value(digest.clone()));
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if status == StatusCode::PARTIAL_CONTENT {
            headers.insert(
                header::CONTENT_RANGE,
                header_value(format!("bytes {start}-{}/{size}", end - 1)),
            );
        }
        Ok(response)
    }

    /// The image (its digest) this node resolved `reference` to itself: the one the
    /// reference pins, else the one a pull of it running here resolved, else the one
    /// containerd's record of that name points at.
    async fn resolved(&self, reference: &str) -> Result<String, Refused> {
        let (name, pinned) = rigger_pull::normalized_and_pinned(reference).map_err(|e| {
            refused(
                StatusCode::FORBIDDEN,
                format!("the peer grant names no image reference: {e}"),
            )
        })?;
        if let Some(pinned) = pinned {
            return Ok(pinned);
        }
        self.blobs
            .image(&name)
            .await
            .map_err(|e| refused(StatusCode::SERVICE_UNAVAILABLE, e))?
            .ok_or_else(|| refused(StatusCode::NOT_FOUND, format!("{name} is not held here")))
    }

    /// The image reference the request's grant names, once the grant is the controller's,
    /// unexpired, for this node as the server, and for the node whose certificate the
    /// peer presented.
    fn granted_image<B>(&self, peer: &Peer, request: &Request<B>) -> Result<String, Refused> {
        let token = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                refused(
                    StatusCode::UNAUTHORIZED,
                    "no peer grant: a node fetches from peers with the grant its task carries",
                )
            })?;
        let verifier = self.grants.borrow().clone().ok_or_else(|| {
            refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "this node has no grant key from the controller yet",
            )
        })?;
        let claims = verifier
            .verify(token.trim(), SystemTime::now())
            .map_err(|e| refused(StatusCode::FORBIDDEN, e.to_string()))?;
        if claims.srv != self.node {
            return Err(refused(
                StatusCode::FORBIDDEN,
                format!(
                    "the peer grant is for fetching from node {:?}, not this one",
                    claims.srv
                ),
            ));
        }
        if !peer.is_node(&claims.sub) {
            return Err(refused(
                StatusCode::FORBIDDEN,
                format!(
                    "the peer grant is for node {:?}, but the request came with another node's certificate",
                    claims.sub
                ),
            ));
        }
        Ok(claims.image)
    }

    /// The size of `digest`, a blob `image` reaches: when the image is being pulled here
    /// and the blob's download has not begun yet, once it begins (or `None` after
    /// [`ARRIVAL_WAIT`]).
    async fn size(&self, image: &str, digest: &str) -> Result<Option<u64>, Refused> {
        let deadline = Instant::now() + ARRIVAL_WAIT;
        loop {
            let size = self
                .blobs
                .size(digest)
                .await
                .map_err(|e| refused(StatusCode::SERVICE_UNAVAILABLE, e))?;
            if size.is_some() || self.blobs.pulling(image).is_none() || Instant::now() > deadline {
                return Ok(size);
            }
            tokio::time::sleep(ARRIVAL_POLL).await;
        }
    }

    /// The blobs `image` reaches on this node: as the pull of it running here resolved
    /// them, else from the documents containerd holds (remembered for a while).
    async fn reached_by(&self, image: &str) -> Result<Arc<BTreeSet<String>>, Refused> {
        if let Some(pulling) = self.blobs.pulling(image) {
            return Ok(pulling);
        }
        if let Ok(cache) = self.reach_cache.lock()
            && let Some((at, set)) = cache.get(image)
            && at.elapsed() < REACH_TTL
        {
            return Ok(set.clone());
        }
        let unavailable = |e: String| refused(StatusCode::SERVICE_UNAVAILABLE, e);
        let mut documents = HashMap::new();
        let Some(top) = document(self.blobs.as_ref(), image, MAX_DOCUMENT)
            .await
            .map_err(unavailable)?
        else {
            return Err(refused(
                StatusCode::NOT_FOUND,
                format!("image {image} is not held here"),
            ));
        };
        // An index names a manifest per platform (up to 1024 here); a node holds the one
        // it pulled, a few at most: each is looked up, and at most a handful read.
        let mut read = 0;
        for manifest in named(&top).map(|n| n.documents).unwrap_or_default() {
            if read == MAX_MANIFESTS_READ {
                break;
            }
            if let Some(doc) = document(self.blobs.as_ref(), &manifest, MAX_DOCUMENT)
                .await
                .map_err(unavailable)?
            {
                documents.insert(manifest, doc);
                read += 1;
            }
        }
        documents.insert(image.to_owned(), top);
        let set = Arc::new(
            reached(image, |d| documents.get(d).cloned())
                .map_err(|e| refused(StatusCode::NOT_FOUND, e))?,
        );
        if let Ok(mut cache) = self.reach_cache.lock() {
            cache.retain(|_, (at, _)| at.elapsed() < REACH_TTL);
            if cache.len() >= REACH_CACHE {
                cache.clear();
            }
            cache.insert(image.to_owned(), (Instant::now(), set.clone()));
        }
        Ok(set)
    }

    /// Bytes `start..end` of `digest` as a body, paced by the upload cap.
    async fn body(&self, digest: &str, start: u64, end: u64) -> Result<Body, Refused> {
        let pieces = self
            .blobs
            .read(digest, start, end)
            .await
            .map_err(|e| refused(StatusCode::SERVICE_UNAVAILABLE, e))?;
        let upload = self.upload.clone();
        let served = self.metrics.peer_served_bytes.clone();
        let frames = pieces.then(move |piece| {
            let (upload, served) = (upload.clone(), served.clone());
            async move {
                let piece = piece.map_err(std::io::Error::other)?;
                if let Some(upload) = &upload {
                    upload.acquire(piece.len()).await;
                }
                served.inc_by(piece.len() as u64);
                Ok(Frame::data(piece))
            }
        });
        Ok(http_body_util::BodyExt::boxed_unsync(StreamBody::new(
            frames,
        )))
    }
}
