//! The registry side of a pull: resolving a reference to a manifest (through mirrors,
//! with auth) and fetching blobs or byte ranges of them.
//!
//! `oci-client` does the protocol work that must be right (bearer-token and basic auth,
//! manifest negotiation). Blob bytes are fetched with our own requests on the same
//! `reqwest` stack, because the transfer needs what a convenience API hides: byte
//! ranges, the status and `Retry-After` of every response, and fallback between hosts.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, RANGE, RETRY_AFTER};
use tokio::sync::Mutex;

use super::hosts::Endpoint;
use super::media;

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
    auth: RegistryAuth,
    http: reqwest::Client,
    /// One oci-client per endpoint (its protocol setting is per client).
    clients: Vec<Client>,
    /// Bearer tokens per endpoint, asked for on first use: `Some(None)` means the
    /// endpoint needs none (so it is not asked again for every blob).
    tokens: Vec<Mutex<Option<Option<IssuedToken>>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("reference", &self.reference.whole())
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub fn new(
        reference: Reference,
        endpoints: Vec<Endpoint>,
        auth: RegistryAuth,
        stall_timeout: Duration,
    ) -> Result<Self, RegistryError> {
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(stall_timeout)
            .pool_max_idle_per_host(32)
            .build()
            .map_err(|e| RegistryError::Client(format!("HTTP client: {e}")))?;
        let clients = endpoints
            .iter()
            .map(|e| {
                Client::new(ClientConfig {
                    protocol: if e.is_plain_http() {
                        ClientProtocol::Http
                    } else {
                        ClientProtocol::Https
                    },
                    accept_invalid_certificates: e.skip_verify,
                    read_timeout: Some(stall_timeout),
                    connect_timeout: Some(Duration::from_secs(10)),
                    user_agent: concat!("rigger-agent/", env!("CARGO_PKG_VERSION")),
                    ..ClientConfig::default()
                })
            })
            .collect();
        let tokens = endpoints.iter().map(|_| Mutex::new(None)).collect();
        Ok(Self {
            reference,
            endpoints,
            auth,
            http,
            clients,
            tokens,
        })
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
        let mut last = None;
        let mut not_found = false;
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
                Err(ManifestFailure::NotFound) => not_found = true,
                Err(ManifestFailure::Other(detail)) => {
                    tracing::debug!(endpoint = %endpoint.url, error = %detail, "manifest fetch failed");
                    last = Some((endpoint.url.clone(), detail));
                }
            }
        }
        match last {
            Some((endpoint, detail)) if !not_found => Err(RegistryError::Manifest {
                image: self.image(),
                detail: format!("{endpoint}: {detail}"),
            }),
            _ => Err(RegistryError::NotFound {
                image: self.image(),
                endpoints: self
                    .endpoints
                    .iter()
                    .map(|e| e.url.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// GET manifest `name` (a tag or a digest) from endpoint `i`, read through
    /// [`MAX_DOCUMENT_SIZE`] as it streams: a registry answering with an endless body
    /// costs that much memory at most, not the node's.
    async fn get_manifest(&self, i: usize, name: &str) -> Result<Bytes, ManifestFailure> {
        let endpoint = &self.endpoints[i];
        let url = format!(
            "{}/v2/{}/manifests/{name}",
            endpoint.url,
            self.reference.repository()
        );
        let mut retried_token = false;
        loop {
            let mut request = self
                .http
                .get(&url)
                .header(ACCEPT, media::ACCEPTED_MANIFESTS.join(", "));
            let authorization = self.authorization(i).await;
            if let Some(authorization) = &authorization {
                request = request.header(AUTHORIZATION, &authorization.header);
            }
            let response = request
                .send()
                .await
                .map_err(|e| ManifestFailure::Other(rigger_daemon::error_chain(&e)))?;
            let status = response.status();
            match status {
                StatusCode::OK => return read_capped(response, MAX_DOCUMENT_SIZE).await,
                StatusCode::NOT_FOUND => return Err(ManifestFailure::NotFound),
                // A token of ours the registry no longer takes: ask for a new one, once.
                StatusCode::UNAUTHORIZED
                    if !retried_token && authorization.is_some_and(|a| a.issued.is_some()) =>
                {
                    self.forget_token(i).await;
                    retried_token = true;
                }
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                    return Err(ManifestFailure::Denied(format!(
                        "manifest {name}: HTTP {status}"
                    )));
                }
                _ => return Err(ManifestFailure::Other(format!("HTTP {status}"))),
            }
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

    /// The `Authorization` header for blob requests to endpoint `i`. The registry decides
    /// the scheme: oci-client asks it (once per endpoint) and, for a token registry,
    /// trades the credentials (or nothing) for a bearer token; a registry that wants
    /// basic auth gets the credentials themselves.
    async fn authorization(&self, i: usize) -> Option<Authorization> {
        if let RegistryAuth::Bearer(token) = &self.auth {
            return Some(Authorization {
                header: format!("Bearer {token}"),
                issued: None,
            });
        }
        let mut cached = self.tokens[i].lock().await;
        if cached.is_none() {
            let reference = self.reference_at(i, None);
            match self.clients[i]
                .auth(&reference, &self.auth, RegistryOperation::Pull)
                .await
            {
                Ok(token) => {
                    *cached = Some(token.map(|token| IssuedToken {
                        token,
                        issued: Instant::now(),
                    }));
                }
                // Not cached: the next request asks again.
                Err(error) => tracing::debug!(%error, "registry auth failed"),
            }
        }
        if let Some(Some(issued)) = cached.as_ref() {
            return Some(Authorization {
                header: format!("Bearer {}", issued.token),
                issued: Some(issued.issued),
            });
        }
        match &self.auth {
            RegistryAuth::Basic(user, password) => {
                use base64::Engine as _;
                let encoded =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
                Some(Authorization {
                    header: format!("Basic {encoded}"),
                    issued: None,
                })
            }
            _ => None,
        }
    }

    /// Drop endpoint `i`'s token (it expired): the next request asks for a new one.
    async fn forget_token(&self, i: usize) {
        *self.tokens[i].lock().await = None;
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
            "{}/v2/{}/blobs/{digest}",
            endpoint.url,
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
        let mut request = self.http.get(&url).header(ACCEPT, "*/*");
        if let Some((start, end)) = range {
            request = request.header(RANGE, format!("bytes={start}-{end}"));
        }
        let authorization = self.authorization(i).await;
        if let Some(authorization) = &authorization {
            request = request.header(AUTHORIZATION, &authorization.header);
        }
        let response = request
            .send()
            .await
            .map_err(|e| transfer(rigger_daemon::error_chain(&e), true, None))?;
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
            // Tokens live minutes (Docker Hub: 5); a long pull outlives them.
            StatusCode::UNAUTHORIZED
                if authorization
                    .and_then(|a| a.issued)
                    .is_some_and(|issued| issued.elapsed() > TOKEN_REFRESH_AGE) =>
            {
                self.forget_token(i).await;
                Err(transfer(
                    format!("HTTP {status}: the token expired; asking for a new one"),
                    true,
                    None,
                ))
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

/// A token refused after this long is taken as expired, not as denied.
const TOKEN_REFRESH_AGE: Duration = Duration::from_secs(1);

/// A bearer token the registry's token service gave us, and when.
struct IssuedToken {
    token: String,
    issued: Instant,
}

/// Tokens are secrets: never printed.
impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("issued", &self.issued)
            .finish_non_exhaustive()
    }
}

/// An `Authorization` header, and when its bearer token was issued (for our own tokens).
struct Authorization {
    header: String,
    issued: Option<Instant>,
}

/// Manifests, indexes and configs larger than this are refused as they stream (they are
/// kilobytes in practice).
pub const MAX_DOCUMENT_SIZE: u64 = 8 << 20;

/// Why a manifest request failed.
enum ManifestFailure {
    NotFound,
    Denied(String),
    TooBig(String),
    Other(String),
}

/// The body of `response`, refused (without reading further) past `cap` bytes.
async fn read_capped(response: reqwest::Response, cap: u64) -> Result<Bytes, ManifestFailure> {
    let too_big = || {
        ManifestFailure::TooBig(format!(
            "the manifest is bigger than {} (the limit for manifests and indexes); refused",
            bytesize::ByteSize(cap).display().iec()
        ))
    };
    if response.content_length().is_some_and(|n| n > cap) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| ManifestFailure::Other(rigger_daemon::error_chain(&e)))?;
        if (body.len() + piece.len()) as u64 > cap {
            return Err(too_big());
        }
        body.extend_from_slice(&piece);
    }
    Ok(Bytes::from(body))
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    super::unpack::hex(&sha2::Sha256::digest(bytes))
}

/// rustls needs a process-wide crypto provider; we build with ring (see Cargo.toml).
/// Every HTTPS client of the agent (registries, probes) calls this first.
pub fn install_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // Err only means another provider is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
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
