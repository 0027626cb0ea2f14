//! The registry side of a pull: resolving a reference to a manifest (through mirrors)
//! and fetching blobs or byte ranges of them, over `reqwest`.
//!
//! Our own requests, because the transfer needs what a convenience API hides: byte
//! ranges, the status and `Retry-After` of every response, fallback between hosts, a
//! size limit while a manifest streams, and authentication that sends credentials only
//! to the host they are for and only when it asks ([`auth`]).

mod auth;
mod body;
pub(crate) mod credentials;
pub mod endpoint_client;
pub mod hosts;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use oci_client::Reference;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, RANGE, RETRY_AFTER, WWW_AUTHENTICATE};

use self::auth::{AuthError, Credential, HostAuth};
use self::body::{CappedRead, read_capped};
use self::hosts::Endpoint;
use crate::media;

/// No byte for this long on an open response: the transfer is stalled.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{image}: not found at {endpoints}")]
    NotFound { image: String, endpoints: String },
    #[error(
        "{image}: access denied by {endpoint} ({detail}); check the credentials (--docker-config, or the job's pullSecrets)"
    )]
    Denied {
        image: String,
        endpoint: String,
        detail: String,
    },
    #[error("{image}: {detail}")]
    Manifest { image: String, detail: String },
    /// No host answered the manifest request (unreachable, or failing with a 5xx): an
    /// outage, not an answer about the image. A 429 is an answer ("slow down"), not an
    /// outage.
    #[error("{image}: {detail}")]
    Unanswered { image: String, detail: String },
    #[error("{what} from {endpoint}: {detail}")]
    Transfer {
        what: String,
        endpoint: String,
        detail: String,
        /// Whether another try (same or next host) can help.
        retryable: bool,
        /// What the registry asked for with `Retry-After`.
        retry_after: Option<Duration>,
    },
    #[error("{0}")]
    Client(String),
}

impl RegistryError {
    /// No registry host answered at all (unreachable, or failing with a 5xx). Only then
    /// may a document pinned by digest come from elsewhere (it is checked against the
    /// digest); what a tag points at is never taken from anyone but the registry.
    pub fn is_outage(&self) -> bool {
        matches!(self, Self::Unanswered { .. })
    }

    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Transfer {
                retryable: true,
                ..
            }
        )
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Transfer { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// A manifest (or index) as served, with its digest.
#[derive(Debug, Clone)]
pub struct RawManifest {
    pub bytes: Bytes,
    pub digest: String,
    pub media_type: String,
}

/// One repository on one registry, reachable through `endpoints` in order.
pub struct Registry {
    /// The reference as the user gave it, normalised (`docker.io/library/x:1`).
    pub reference: Reference,
    endpoints: Vec<Endpoint>,
    /// Per endpoint: its HTTP client (TLS as its `hosts.toml` says) and credentials.
    http: Vec<reqwest::Client>,
    auths: Vec<HostAuth>,
    /// Manifests and indexes bigger than this are refused as they stream.
    max_document_size: u64,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("reference", &self.reference.whole())
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

/// Why a request with authentication failed before any status of its own.
enum SendError {
    Network(String),
    Auth(AuthError),
}

impl Registry {
    /// `credentials[i]` are endpoint `i`'s own (looked up for its host).
    pub fn new(
        reference: Reference,
        endpoints: Vec<Endpoint>,
        credentials: Vec<Credential>,
        stall_timeout: Duration,
        max_document_size: u64,
        clients: &endpoint_client::Clients,
    ) -> Result<Self, RegistryError> {
        rigger_daemon::tls::install_crypto_provider();
        let http = endpoints
            .iter()
            .map(|e| clients.get(e, stall_timeout))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RegistryError::Client(e.to_string()))?;
        let mut credentials = credentials.into_iter();
        let auths = endpoints
            .iter()
            .map(|e| HostAuth::new(&e.url, credentials.next().unwrap_or_default()))
            .collect();
        Ok(Self {
            reference,
            endpoints,
            http,
            auths,
            max_document_size,
        })
    }

    /// Manifests, indexes and configs bigger than this are refused.
    pub fn max_document_size(&self) -> u64 {
        self.max_document_size
    }

    /// What the pull asks a token service for.
    fn scope(&self) -> String {
        format!("repository:{}:pull", self.reference.repository())
    }

    /// Send the request `build` makes to endpoint `i` with what the host asked for
    /// before (nothing until it asks); a 401 is answered once (a token asked for, or
    /// the host's own credentials) and the request sent again.
    async fn send(
        &self,
        i: usize,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, SendError> {
        let (client, auth) = (&self.http[i], &self.auths[i]);
        let mut answered = false;
        loop {
            let header = auth.header().await;
            let mut request = build(client);
            if let Some(header) = &header {
                request = request.header(AUTHORIZATION, header);
            }
            let response = request
                .send()
                .await
                .map_err(|e| SendError::Network(rigger_daemon::error_chain(&e)))?;
            if response.status() != StatusCode::UNAUTHORIZED || answered {
                return Ok(response);
            }
            answered = true;
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            auth.challenged(
                client,
                challenge.as_deref(),
                &self.scope(),
                header.as_deref(),
            )
            .await
            .map_err(SendError::Auth)?;
        }
    }

    /// The reference as served by endpoint `i` (mirrors keep the repository path).
    fn reference_at(&self, i: usize, by_digest: Option<&str>) -> Reference {
        let host = self.endpoints[i].authority().to_owned();
        let repo = self.reference.repository().to_owned();
        match (by_digest, self.reference.digest(), self.reference.tag()) {
            (Some(d), _, _) | (None, Some(d), _) => {
                Reference::with_digest(host, repo, d.to_owned())
            }
            (None, None, tag) => {
                Reference::with_tag(host, repo, tag.unwrap_or("latest").to_owned())
            }
        }
    }

    fn image(&self) -> String {
        self.reference.whole()
    }

    /// Fetch the manifest or index the reference names (a tag needs `resolve`).
    pub async fn manifest(&self, digest: Option<&str>) -> Result<RawManifest, RegistryError> {
        let by_tag = digest.is_none() && self.reference.digest().is_none();
        // Every host's reason, so a failure shows the mirror's TLS error and not only
        // the upstream's answer after it.
        let mut failures = Vec::new();
        let mut not_found = Vec::new();
        // A host that answered with a status of its own (429, 4xx) spoke: the registry
        // is there, so this is not an outage.
        let mut answered = false;
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            if (by_tag || !endpoint.pull) && !endpoint.resolve {
                continue;
            }
            let reference = self.reference_at(i, digest);
            let name = reference
                .digest()
                .or(reference.tag())
                .unwrap_or("latest")
                .to_owned();
            match self.get_manifest(i, &name).await {
                Ok(bytes) => {
                    let media_type = media::manifest_media_type(&bytes).map_err(|detail| {
                        RegistryError::Manifest {
                            image: self.image(),
                            detail,
                        }
                    })?;
                    // What is stored is the body: its digest is the manifest's.
                    let digest = format!("sha256:{}", sha256_hex(&bytes));
                    return Ok(RawManifest {
                        bytes,
                        digest,
                        media_type,
                    });
                }
                Err(ManifestFailure::Denied(detail)) => {
                    return Err(RegistryError::Denied {
                        image: self.image(),
                        endpoint: endpoint.url.clone(),
                        detail,
                    });
                }
                Err(ManifestFailure::TooBig(detail)) => {
                    return Err(RegistryError::Manifest {
                        image: self.image(),
                        detail: format!("{}: {detail}", endpoint.url),
                    });
                }
                // containerd also moves on to the next host when one lacks the image.
                Err(ManifestFailure::NotFound) => {
                    not_found.push(endpoint.url.as_str());
                }
                Err(ManifestFailure::Other(detail)) => {
                    tracing::debug!(endpoint = %endpoint.url, error = %detail, "manifest fetch failed");
                    failures.push(format!("{}: {detail}", endpoint.url));
                }
                Err(ManifestFailure::Refused(detail)) => {
                    tracing::debug!(endpoint = %endpoint.url, error = %detail, "manifest fetch refused");
                    answered = true;
                    failures.push(format!("{}: {detail}", endpoint.url));
                }
            }
        }
        if failures.is_empty() {
            if not_found.is_empty() {
                // No host may resolve this reference.
                not_found = self.endpoints.iter().map(|e| e.url.as_str()).collect();
            }
            return Err(RegistryError::NotFound {
                image: self.image(),
                endpoints: not_found.join(", "),
            });
        }
        let unanswered = not_found.is_empty() && !answered;
        failures.extend(not_found.iter().map(|url| format!("{url}: not found")));
        let (image, detail) = (self.image(), failures.join("; "));
        Err(if unanswered {
            RegistryError::Unanswered { image, detail }
        } else {
            RegistryError::Manifest { image, detail }
        })
    }

    /// GET manifest `name` (a tag or a digest) from endpoint `i`, read through
    /// `max_document_size` as it streams: a registry answering with an endless body
    /// costs that much memory at most, not the node's.
    async fn get_manifest(&self, i: usize, name: &str) -> Result<Bytes, ManifestFailure> {
        let endpoint = &self.endpoints[i];
        let url = format!(
            "{}/{}/manifests/{name}",
            endpoint.api_url(),
            self.reference.repository()
        );
        let response = self
            .send(i, |http| {
                http.get(&url)
                    .header(ACCEPT, media::ACCEPTED_MANIFESTS.join(", "))
            })
            .await
            .map_err(|e| match e {
                SendError::Network(detail) => ManifestFailure::Other(detail),
                SendError::Auth(AuthError::Denied(detail)) => ManifestFailure::Denied(detail),
                SendError::Auth(e) => ManifestFailure::Other(e.to_string()),
            })?;
        let status = response.status();
        match status {
            StatusCode::OK => read_capped(response, self.max_document_size)
                .await
                .map_err(|e| match e {
                    CappedRead::TooBig => ManifestFailure::TooBig(format!(
                        "the manifest is bigger than {} (max_document_size, the limit for manifests, indexes and configs); refused",
                        bytesize::ByteSize(self.max_document_size).display().iec()
                    )),
                    CappedRead::Failed(detail) => ManifestFailure::Other(detail),
                }),
            StatusCode::NOT_FOUND => Err(ManifestFailure::NotFound),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(ManifestFailure::Denied(
                format!("manifest {name}: HTTP {status}"),
            )),
            s if s.is_server_error() => Err(ManifestFailure::Other(format!("HTTP {status}"))),
            _ => Err(ManifestFailure::Refused(format!("HTTP {status}"))),
        }
    }

    /// Endpoints that may serve blobs, in fallback order.
    pub fn blob_endpoints(&self) -> impl Iterator<Item = usize> + '_ {
        self.endpoints
            .iter()
            .enumerate()
            .filter(|(_, e)| e.pull)
            .map(|(i, _)| i)
    }

    pub fn endpoint_url(&self, i: usize) -> &str {
        &self.endpoints[i].url
    }

    /// GET a blob (or `range` of it) from endpoint `i`. `Ok((true, body))` when the server
    /// honoured the range (206), `Ok((false, body))` when it sent the whole blob (200).
    pub async fn fetch_blob(
        &self,
        i: usize,
        digest: &str,
        range: Option<(u64, u64)>,
    ) -> Result<(bool, BlobBody), RegistryError> {
        let endpoint = &self.endpoints[i];
        let url = format!(
            "{}/{}/blobs/{digest}",
            endpoint.api_url(),
            self.reference.repository()
        );
        let what = match range {
            Some((start, end)) => format!("blob {digest} bytes {start}-{end}"),
            None => format!("blob {digest}"),
        };
        let transfer = |detail: String, retryable: bool, retry_after: Option<Duration>| {
            RegistryError::Transfer {
                what: what.clone(),
                endpoint: endpoint.url.clone(),
                detail,
                retryable,
                retry_after,
            }
        };
        let response = self
            .send(i, |http| {
                let request = http.get(&url).header(ACCEPT, "*/*");
                match range {
                    Some((start, end)) => request.header(RANGE, format!("bytes={start}-{end}")),
                    None => request,
                }
            })
            .await
            .map_err(|e| match e {
                SendError::Network(detail) => transfer(detail, true, None),
                SendError::Auth(AuthError::Denied(detail)) => RegistryError::Denied {
                    image: self.reference.whole(),
                    endpoint: endpoint.url.clone(),
                    detail,
                },
                // A token service that failed may answer the next try.
                SendError::Auth(e) => transfer(e.to_string(), true, None),
            })?;
        let status = response.status();
        match status {
            StatusCode::OK | StatusCode::PARTIAL_CONTENT => Ok((
                status == StatusCode::PARTIAL_CONTENT,
                BlobBody {
                    stream: Box::pin(response.bytes_stream()),
                },
            )),
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                let retry_after = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                Err(transfer(format!("HTTP {status}"), true, retry_after))
            }
            s if s.is_server_error() => Err(transfer(format!("HTTP {status}"), true, None)),
            // As containerd: a host without the blob sends the request to the next one;
            // the last one's answer is final.
            StatusCode::NOT_FOUND => {
                let later_host = self.blob_endpoints().any(|j| j > i);
                Err(transfer(format!("HTTP {status}"), later_host, None))
            }
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(RegistryError::Denied {
                image: self.reference.whole(),
                endpoint: endpoint.url.clone(),
                detail: format!("{what}: HTTP {status}"),
            }),
            _ => Err(transfer(format!("HTTP {status}"), false, None)),
        }
    }
}

/// Manifests, indexes and configs larger than this are refused as they stream (they are
/// kilobytes in practice); `max_document_size` in the agent's configuration.
pub const DEFAULT_MAX_DOCUMENT_SIZE: u64 = 8 << 20;
/// What `max_document_size` may be set to: real manifests fit in the least, and the
/// most is memory a node can spare for each document in flight.
pub const MAX_DOCUMENT_SIZE_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(1 << 30);

/// Why a manifest request failed.
enum ManifestFailure {
    NotFound,
    Denied(String),
    TooBig(String),
    /// No answer: the network, or the host failing (5xx).
    Other(String),
    /// An answer that is not the document: 429 and the other statuses.
    Refused(String),
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A response body being received.
pub struct BlobBody {
    stream: futures::stream::BoxStream<'static, reqwest::Result<Bytes>>,
}

impl std::fmt::Debug for BlobBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobBody").finish_non_exhaustive()
    }
}

impl BlobBody {
    /// The next piece of the body; `Ok(None)` at its end. A stall (no byte within the
    /// stall timeout) is an error.
    pub async fn next(&mut self) -> Result<Option<Bytes>, String> {
        match self.stream.next().await {
            None => Ok(None),
            Some(Ok(bytes)) => Ok(Some(bytes)),
            Some(Err(e)) => Err(rigger_daemon::error_chain(&e)),
        }
    }
}
