//! The image pull engine: registry → containerd, without containerd's own pull.
//!
//! For each image: resolve the reference (mirrors from `hosts.toml`, credentials from a
//! docker `config.json`), pick the platform's manifest, then fetch the layers up to eight
//! at once — on a slow link as byte ranges over several connections, spooled on disk —
//! streaming into containerd's content store under a lease. Each layer is decompressed
//! and applied while it downloads (into a staging snapshot until the layer below it is
//! committed), and the layers are stacked in order. Finally the labels and image records
//! containerd's own pull would leave are written, so CRI and kubelet see an ordinary
//! pulled image.
//!
//! - [`hosts`]: `certs.d/<host>/hosts.toml` endpoints;
//! - [`registry`]: manifests and blob ranges over HTTP;
//! - [`media`]: media types, platform selection;
//! - [`store`]: lease, content ingestion (resumable), labels, image records;
//! - [`spool`]: ranges that arrived ahead of containerd's ingest, on disk;
//! - [`unpack`]: chain IDs and snapshots;
//! - [`limit`]: the node-wide bandwidth cap.

mod auth;
mod body;
mod credentials;
pub mod endpoint_client;
pub mod hosts;
pub mod limit;
pub mod media;
pub mod registry;
pub mod spool;
pub mod store;
pub mod unpack;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use containerd_client::types::Descriptor as ContainerdDescriptor;
use futures::StreamExt;
use oci_client::Reference;
use oci_spec::image::{Descriptor, ImageConfiguration};
use sha2::{Digest as _, Sha256};
use tokio::sync::{Mutex, Semaphore};

use self::credentials::{credentials, secret_credentials};
use self::limit::RateLimit;
use self::media::Platform;
use self::registry::{Registry, RegistryError};
use self::spool::{Spool, SpoolError};
use self::store::{BlobWriter, Store, StoreError};
use self::unpack::{StreamingApply, UnpackError, chain_ids};
use crate::runtime::{CRI_NAMESPACE, Runtime};
use bytes::Bytes;

/// Blobs bigger than this are fetched as parallel byte ranges of this size.
pub const DEFAULT_CHUNK_SIZE: u64 = 2 << 20;
/// Layers downloading at once in one pull (bottom first). Each decompresses as it
/// arrives, so this also bounds the appliers running (and their memory, about 2 MiB each).
const LAYERS_AT_ONCE: usize = 8;
/// Layers smaller than this are not unpacked in a staging snapshot.
const STAGING_MIN_SIZE: u64 = 1 << 20;
/// Byte ranges fetched ahead of the write position, per blob (they wait in the spool,
/// on disk, until containerd's ingest reaches them).
const RANGE_WINDOW: usize = 16;
/// Range data is appended to the spool in pieces of at least this much: few syscalls,
/// and little lost if the agent is killed.
const SPOOL_PIECE: usize = 64 << 10;
/// A single connection slower than this (bytes/s) is supplemented by parallel ranges.
const SLOW_STREAM_RATE: u64 = 48 << 20;
/// How long a single connection is watched before judging its speed.
const PROBE_TIME: Duration = Duration::from_millis(100);
/// Connections open at once across all pulls of this agent.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// containerd namespace (kubelet uses `k8s.io`).
    pub namespace: String,
    pub snapshotter: String,
    pub platform: Platform,
    /// containerd's `certs.d` directory of `hosts.toml` files.
    pub hosts_dir: PathBuf,
    /// Where ranges wait for containerd's ingest (see [`spool`]).
    pub spool_dir: PathBuf,
    /// Talk plain HTTP to registries that have no `hosts.toml`.
    pub plain_http: bool,
    /// A docker `config.json` with credentials; `None` for `$DOCKER_CONFIG` or `~/.docker`.
    pub docker_config: Option<PathBuf>,
    pub max_connections: usize,
    pub chunk_size: u64,
    /// Bytes per second for all downloads together.
    pub limit_rate: Option<u64>,
    /// A transfer with no byte for this long is retried.
    pub stall_timeout: Duration,
    /// Tries per blob (and per range) before giving up.
    pub attempts: u32,
    /// Manifests, indexes and configs bigger than this are refused as they stream.
    pub max_document_size: u64,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            namespace: CRI_NAMESPACE.to_owned(),
            snapshotter: "overlayfs".to_owned(),
            platform: Platform::host(),
            hosts_dir: PathBuf::from(hosts::DEFAULT_HOSTS_DIR),
            spool_dir: PathBuf::from(crate::DEFAULT_STATE_DIR).join("spool"),
            plain_http: false,
            docker_config: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            chunk_size: DEFAULT_CHUNK_SIZE,
            limit_rate: None,
            stall_timeout: registry::DEFAULT_STALL_TIMEOUT,
            attempts: 5,
            max_document_size: registry::DEFAULT_MAX_DOCUMENT_SIZE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("image reference {image:?} is invalid: {detail}")]
    InvalidReference { image: String, detail: String },
    #[error("registry hosts for {image}: {source}")]
    Hosts {
        image: String,
        source: hosts::HostsError,
    },
    #[error("credentials for {registry}: {detail}")]
    Credentials { registry: String, detail: String },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{image}: {detail}")]
    Image { image: String, detail: String },
    #[error("{image}: {source}")]
    Store { image: String, source: StoreError },
    #[error("{image}: {source}")]
    Unpack { image: String, source: UnpackError },
    #[error("{image}: {source}")]
    Spool { image: String, source: SpoolError },
    #[error("{image}: {blob}: gave up after {attempts} attempts; last error: {last}")]
    Exhausted {
        image: String,
        blob: String,
        attempts: u32,
        last: String,
    },
}

impl PullError {
    /// Every error names the image; a transfer error alone names only the blob.
    fn naming(self, image: &str) -> Self {
        match self {
            Self::Registry(e @ RegistryError::Transfer { .. }) => Self::Image {
                image: image.to_owned(),
                detail: e.to_string(),
            },
            other => other,
        }
    }
}

/// What progress displays are told.
#[derive(Debug, Clone)]
pub enum ProgressEvent {
    Resolved {
        image: String,
        digest: String,
        layers: Vec<(String, u64)>,
    },
    BlobStarted {
        digest: String,
        size: u64,
        /// Bytes containerd already held from an interrupted pull.
        resumed_from: u64,
    },
    BlobBytes {
        digest: String,
        bytes: u64,
    },
    BlobDone {
        digest: String,
        skipped: bool,
    },
    /// The blob's download stopped and will go on: `reason` says what it waits for (a
    /// registry to answer again, containerd to come back).
    BlobStalled {
        digest: String,
        reason: String,
    },
    /// The stalled blob goes on from `offset`, the bytes containerd holds of it (what
    /// arrived but was not stored comes again).
    BlobResumed {
        digest: String,
        offset: u64,
    },
    LayerUnpacked {
        digest: String,
    },
    Done {
        image: String,
    },
}

pub trait Progress: Send + Sync {
    fn event(&self, event: ProgressEvent);
}

/// Bytes per layer of a pull as containerd holds them, for progress that counts: a
/// layer that goes on from an earlier offset after a stall is not counted twice.
#[derive(Debug, Default)]
pub struct LayerBytes {
    /// Per layer: (size, bytes held or sent).
    layers: HashMap<String, (u64, u64)>,
}

impl LayerBytes {
    /// Count `event`; `false` for the events that carry no byte counts.
    pub fn count(&mut self, event: &ProgressEvent) -> bool {
        match event {
            ProgressEvent::Resolved { layers, .. } => {
                for (digest, size) in layers {
                    self.layers.entry(digest.clone()).or_insert((*size, 0));
                }
            }
            ProgressEvent::BlobStarted {
                digest,
                size,
                resumed_from,
            } => {
                let entry = self.layers.entry(digest.clone()).or_insert((*size, 0));
                entry.1 = entry.1.max(*resumed_from).min(entry.0);
            }
            ProgressEvent::BlobBytes { digest, bytes } => {
                if let Some(entry) = self.layers.get_mut(digest) {
                    entry.1 = (entry.1 + bytes).min(entry.0);
                }
            }
            ProgressEvent::BlobDone { digest, .. } => self.set(digest, u64::MAX),
            // What containerd holds is what counts: bytes fetched but not stored before
            // the stall come again.
            ProgressEvent::BlobResumed { digest, offset } => self.set(digest, *offset),
            ProgressEvent::BlobStalled { .. }
            | ProgressEvent::LayerUnpacked { .. }
            | ProgressEvent::Done { .. } => return false,
        }
        true
    }

    /// The layer's bytes held: `done`, at most its size.
    fn set(&mut self, digest: &str, done: u64) {
        if let Some(entry) = self.layers.get_mut(digest) {
            entry.1 = done.min(entry.0);
        }
    }

    pub fn total(&self) -> u64 {
        self.layers.values().map(|(size, _)| size).sum()
    }

    pub fn done(&self) -> u64 {
        self.layers.values().map(|(_, done)| done).sum()
    }
}

/// A progress sink that ignores everything.
#[derive(Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn event(&self, _event: ProgressEvent) {}
}

/// The result of a pull.
#[derive(Debug, Clone)]
pub struct PulledImage {
    pub name: String,
    /// Digest of what the name points at (index or manifest).
    pub digest: String,
    pub config_digest: String,
    pub layers: usize,
    /// Bytes fetched from registries (resumed and present blobs not counted).
    pub bytes_downloaded: u64,
}

/// The engine; one per agent, shared by all pulls so limits are node-wide.
#[derive(Debug, Clone)]
pub struct Puller {
    runtime: Runtime,
    options: PullOptions,
    connections: Arc<Semaphore>,
    rate: Option<Arc<RateLimit>>,
    /// One fetch per blob at a time in this agent; concurrent pulls wait and reuse it.
    in_flight: Arc<Mutex<HashMap<String, Arc<Mutex<()>>>>>,
}

/// Everything one blob transfer needs, cheap to clone into a task.
#[derive(Clone)]
struct Transfer {
    image: String,
    registry: Arc<Registry>,
    store: Store,
    progress: Arc<dyn Progress>,
    connections: Arc<Semaphore>,
    rate: Option<Arc<RateLimit>>,
    in_flight: Arc<Mutex<HashMap<String, Arc<Mutex<()>>>>>,
    chunk_size: u64,
    attempts: u32,
    source_label: (String, String),
    /// More than one connection allowed: ranges can help a slow single stream.
    parallel: bool,
    /// A stream from this registry proved slow: later blobs start with ranges.
    slow_registry: Arc<AtomicBool>,
    spool_dir: PathBuf,
    /// How far this image's layers are unpacked.
    stack: Arc<tokio::sync::watch::Sender<Stack>>,
}

/// Parse an image reference the way pulls do (repository names must be lowercase).
fn parse_reference(image: &str) -> Result<Reference, PullError> {
    let reference = Reference::from_str(image).map_err(|e| PullError::InvalidReference {
        image: image.to_owned(),
        detail: e.to_string(),
    })?;
    if reference
        .repository()
        .chars()
        .any(|c| c.is_ascii_uppercase())
    {
        return Err(PullError::InvalidReference {
            image: image.to_owned(),
            detail: "repository names must be lowercase".to_owned(),
        });
    }
    Ok(reference)
}

/// Refuse what a pull would refuse, before any work starts.
pub fn check_reference(image: &str) -> Result<(), String> {
    parse_reference(image).map(drop).map_err(|e| e.to_string())
}

/// The name containerd's image record gets for `image` (`docker.io/library/x:latest`).
pub fn normalized_name(image: &str) -> Result<String, String> {
    parse_reference(image)
        .map(|r| r.whole())
        .map_err(|e| e.to_string())
}

impl Puller {
    /// The containerd connection pulls go through.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    pub fn new(runtime: Runtime, options: PullOptions) -> Self {
        let connections = Arc::new(Semaphore::new(options.max_connections.max(1)));
        let rate = options.limit_rate.map(|r| Arc::new(RateLimit::new(r)));
        Self {
            runtime,
            options,
            connections,
            rate,
            in_flight: Arc::default(),
        }
    }

    /// Pull `image` into containerd.
    pub async fn pull(
        &self,
        image: &str,
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
        self.pull_with_credentials(image, &[], progress).await
    }

    /// Pull `image`, looking for its registry's credentials first in `docker_configs`
    /// (docker `config.json` documents, e.g. a job's pull secrets), then where
    /// [`PullOptions::docker_config`] says.
    #[tracing::instrument(level = "info", skip(self, docker_configs, progress), fields(namespace = %self.options.namespace))]
    pub async fn pull_with_credentials(
        &self,
        image: &str,
        docker_configs: &[String],
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
        let reference = parse_reference(image)?;
        let name = reference.whole();
        let registry_host = reference.registry().to_owned();
        let endpoints = hosts::endpoints(
            &self.options.hosts_dir,
            &registry_host,
            self.options.plain_http,
        )
        .map_err(|source| PullError::Hosts {
            image: name.clone(),
            source,
        })?;
        // Each host's own credentials: the registry's go to the registry, a mirror's
        // (if any are configured for it) to the mirror.
        let credentials = endpoints
            .iter()
            .map(|endpoint| {
                let host = if endpoint.upstream {
                    registry_host.as_str()
                } else {
                    endpoint.authority()
                };
                match secret_credentials(host, docker_configs)? {
                    Some(credential) => Ok(credential),
                    None => credentials(host, self.options.docker_config.as_deref()),
                }
            })
            .collect::<Result<Vec<_>, PullError>>()?;
        let registry = Arc::new(Registry::new(
            reference.clone(),
            endpoints,
            credentials,
            self.options.stall_timeout,
            self.options.max_document_size,
        )?);

        let mut store = Store::new(&self.runtime, &self.options.namespace);
        if let Err(error) = store.reap_stale_leases().await {
            tracing::warn!(%error, "could not look for leases of interrupted pulls");
        }
        match spool::reap_stale(&self.options.spool_dir) {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "removed spools of abandoned pulls"),
            Err(error) => tracing::warn!(%error, "could not look for abandoned spools"),
        }
        store
            .take_lease("pull")
            .await
            .map_err(|source| PullError::Store {
                image: name.clone(),
                source,
            })?;
        let result = self
            .pull_with_lease(&name, &reference, registry, &store, progress)
            .await
            .map_err(|e| e.naming(&name));
        // A full disk: partial downloads would keep it full, so they go (anything else
        // keeps them, for resuming).
        if let Err(error) = &result
            && is_disk_full(error)
        {
            let aborted = store.abort_opened().await;
            tracing::warn!(image = %name, aborted, "disk full: this pull's partial downloads removed");
        }
        // The lease goes in every case: on success the image record now holds everything;
        // on failure what was written becomes garbage (ingests stay, for resuming).
        if let Err(error) = store.release().await {
            tracing::warn!(%error, "could not release the pull lease; it expires by itself");
        }
        result
    }

    async fn pull_with_lease(
        &self,
        name: &str,
        reference: &Reference,
        registry: Arc<Registry>,
        store: &Store,
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
        let image_err = |detail: String| PullError::Image {
            image: name.to_owned(),
            detail,
        };
        let store_err = |source: StoreError| PullError::Store {
            image: name.to_owned(),
            source,
        };

        // Resolve: the top-level document (index or manifest), then the platform's manifest.
        let top = registry.manifest(None).await?;
        if let Some(pinned) = reference.digest()
            && pinned != top.digest
        {
            return Err(image_err(format!(
                "registry served {} for {pinned}",
                top.digest
            )));
        }
        verify_digest(&top.bytes, &top.digest).map_err(&image_err)?;
        let (index, manifest_raw) = if media::is_index(&top.media_type) {
            let chosen =
                media::select_manifest(&top.bytes, &self.options.platform).map_err(&image_err)?;
            let manifest = registry.manifest(Some(chosen.digest().as_ref())).await?;
            verify_digest(&manifest.bytes, &manifest.digest).map_err(&image_err)?;
            if manifest.digest != chosen.digest().to_string() {
                return Err(image_err(format!(
                    "index names {} but the registry served {}",
                    chosen.digest(),
                    manifest.digest
                )));
            }
            (Some(top), manifest)
        } else {
            (None, top)
        };
        if media::is_index(&manifest_raw.media_type) {
            return Err(image_err(
                "an index inside an index is not an image".to_owned(),
            ));
        }
        let manifest = media::parse_manifest(&manifest_raw.bytes).map_err(&image_err)?;
        let layers: Vec<Descriptor> = manifest.layers().clone();
        progress.event(ProgressEvent::Resolved {
            image: name.to_owned(),
            digest: index
                .as_ref()
                .map_or(&manifest_raw.digest, |i| &i.digest)
                .clone(),
            layers: layers
                .iter()
                .map(|l| (l.digest().to_string(), l.size()))
                .collect(),
        });

        let transfer = Transfer {
            image: name.to_owned(),
            registry: registry.clone(),
            store: store.clone(),
            progress: progress.clone(),
            connections: self.connections.clone(),
            rate: self.rate.clone(),
            in_flight: self.in_flight.clone(),
            chunk_size: self.options.chunk_size.clamp(1 << 20, 64 << 20),
            attempts: self.options.attempts.max(1),
            source_label: distribution_source(reference),
            parallel: self.options.max_connections > 1,
            slow_registry: Arc::default(),
            spool_dir: self.options.spool_dir.clone(),
            stack: Arc::new(tokio::sync::watch::Sender::new(Stack::default())),
        };

        // The config is small and tells us the uncompressed digests (diff IDs).
        let config_desc = manifest.config().clone();
        if config_desc.size() > self.options.max_document_size {
            return Err(image_err(format!(
                "config is {} bytes, too big",
                config_desc.size()
            )));
        }
        let config_bytes = transfer.fetch_small(config_desc.digest().as_ref()).await?;
        verify_digest(&config_bytes, config_desc.digest().as_ref()).map_err(&image_err)?;
        let config: ImageConfiguration = serde_json::from_slice(&config_bytes)
            .map_err(|e| image_err(format!("image config is invalid: {e}")))?;
        // A plain manifest has no platform list: containerd checks the config instead.
        if index.is_none() && !self.options.platform.matches_config(&config) {
            return Err(image_err(format!(
                "the image is for {}/{}, not {}",
                config.os(),
                config.architecture(),
                self.options.platform
            )));
        }
        let diff_ids: Vec<String> = config.rootfs().diff_ids().clone();
        if diff_ids.len() != layers.len() {
            return Err(image_err(format!(
                "manifest has {} layers but the config lists {} diff IDs",
                layers.len(),
                diff_ids.len()
            )));
        }
        let chains = chain_ids(&diff_ids);

        // What each layer needs: its labels, and how to unpack it while it downloads.
        let mut jobs = Vec::with_capacity(layers.len());
        let mut compressions = Vec::with_capacity(layers.len());
        for (i, (layer, diff_id)) in layers.iter().zip(&diff_ids).enumerate() {
            let labels =
                HashMap::from([("containerd.io/uncompressed".to_owned(), diff_id.clone())]);
            let plan = StreamPlan {
                index: i,
                snapshotter: self.options.snapshotter.clone(),
                parent: i.checked_sub(1).map(|p| chains[p].clone()),
                chain_id: chains[i].clone(),
                compression: media::layer_compression(layer.media_type().as_ref())
                    .map_err(&image_err)?,
                diff_id: diff_id.clone(),
            };
            compressions.push(plan.compression);
            jobs.push((layer.clone(), labels, plan));
        }
        // Layers start bottom first, a few downloading at a time: the lower ones finish
        // early. Each is decompressed and applied while it downloads (in a staging
        // snapshot while the layers below are not in yet) and then stacked in order.
        let (handles_tx, mut handles_rx) = tokio::sync::mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(LAYERS_AT_ONCE));
        let dispatcher_transfer = transfer.clone();
        let dispatcher = tokio::spawn(async move {
            for (layer, labels, plan) in jobs {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let t = dispatcher_transfer.clone();
                let handle = tokio::spawn(async move {
                    // Unpacked and stored already: nothing to do for this layer.
                    if unpack::is_unpacked(&t.store, &plan.snapshotter, &plan.chain_id)
                        .await
                        .unwrap_or(false)
                        && t.store
                            .blob_labels(layer.digest().as_ref())
                            .await
                            .ok()
                            .flatten()
                            .is_some()
                    {
                        t.progress.event(ProgressEvent::BlobDone {
                            digest: layer.digest().to_string(),
                            skipped: true,
                        });
                        return Ok(0);
                    }
                    t.fetch_blob(
                        layer.digest().as_ref(),
                        layer.size(),
                        labels,
                        Some((plan, slot)),
                    )
                    .await
                });
                if handles_tx.send(handle).is_err() {
                    return;
                }
            }
        });
        let mut bytes_downloaded = 0u64;
        let mut failure = None;
        for (i, layer) in layers.iter().enumerate() {
            // In order: layer i is stacked while later layers still download.
            let Some(download) = handles_rx.recv().await else {
                failure.get_or_insert(image_err("layer dispatch stopped".to_owned()));
                break;
            };
            let outcome = match download.await {
                Ok(outcome) => outcome,
                Err(join) => Err(image_err(format!("layer task failed: {join}"))),
            };
            let stacked = match outcome {
                Ok(n) if failure.is_none() => {
                    bytes_downloaded += n;
                    let parent = i.checked_sub(1).map(|p| chains[p].as_str());
                    self.stack_layer(
                        store,
                        layer,
                        compressions[i],
                        &diff_ids[i],
                        parent,
                        &chains[i],
                    )
                    .await
                    .inspect(|()| {
                        progress.event(ProgressEvent::LayerUnpacked {
                            digest: layer.digest().to_string(),
                        });
                    })
                    .map_err(|source| PullError::Unpack {
                        image: name.to_owned(),
                        source,
                    })
                }
                Ok(_) => continue,
                Err(e) => Err(e),
            };
            match stacked {
                Ok(()) => transfer.mark_unpacked(i),
                Err(e) => {
                    // Layers staged above this one stop waiting for it.
                    transfer.mark_failed();
                    failure.get_or_insert(e);
                }
            }
        }
        let _ = dispatcher.await;
        if let Some(e) = failure {
            return Err(e);
        }

        // Metadata blobs with the GC references containerd's pull writes.
        let top_chain = chains.last().cloned().unwrap_or_default();
        let config_labels = HashMap::from([(
            format!("containerd.io/gc.ref.snapshot.{}", self.options.snapshotter),
            top_chain,
        )]);
        transfer
            .put_small(config_desc.digest().as_ref(), &config_bytes, config_labels)
            .await
            .map_err(store_err)?;
        let mut manifest_labels = HashMap::from([(
            "containerd.io/gc.ref.content.config".to_owned(),
            config_desc.digest().to_string(),
        )]);
        for (i, layer) in layers.iter().enumerate() {
            manifest_labels.insert(
                format!("containerd.io/gc.ref.content.l.{i}"),
                layer.digest().to_string(),
            );
        }
        transfer
            .put_small(&manifest_raw.digest, &manifest_raw.bytes, manifest_labels)
            .await
            .map_err(store_err)?;
        let target = match &index {
            Some(index) => {
                // containerd labels every manifest of the index by its position (not only
                // the platform it fetched): GC keeps what is there.
                let labels = media::index_manifests(&index.bytes)
                    .map_err(&image_err)?
                    .into_iter()
                    .enumerate()
                    .map(|(i, digest)| (format!("containerd.io/gc.ref.content.m.{i}"), digest))
                    .collect();
                transfer
                    .put_small(&index.digest, &index.bytes, labels)
                    .await
                    .map_err(store_err)?;
                descriptor(&index.media_type, &index.digest, index.bytes.len())
            }
            None => descriptor(
                &manifest_raw.media_type,
                &manifest_raw.digest,
                manifest_raw.bytes.len(),
            ),
        };

        // Image records: the name, and in CRI's namespace also the two CRI adds.
        let cri = self.options.namespace == CRI_NAMESPACE;
        let labels = if cri {
            HashMap::from([("io.cri-containerd.image".to_owned(), "managed".to_owned())])
        } else {
            HashMap::new()
        };
        store
            .put_image(name, &target, &labels)
            .await
            .map_err(store_err)?;
        if cri {
            let by_digest = format!(
                "{}/{}@{}",
                reference.registry(),
                reference.repository(),
                target.digest
            );
            store
                .put_image(&by_digest, &target, &labels)
                .await
                .map_err(store_err)?;
            store
                .put_image(config_desc.digest().as_ref(), &target, &labels)
                .await
                .map_err(store_err)?;
        }
        progress.event(ProgressEvent::Done {
            image: name.to_owned(),
        });
        Ok(PulledImage {
            name: name.to_owned(),
            digest: target.digest,
            config_digest: config_desc.digest().to_string(),
            layers: layers.len(),
            bytes_downloaded,
        })
    }
}

impl Puller {
    /// Make sure a layer is in the snapshotter: unpacked while it downloaded (or by an
    /// earlier pull), else now, from the content store.
    async fn stack_layer(
        &self,
        store: &Store,
        layer: &Descriptor,
        compression: media::Compression,
        diff_id: &str,
        parent: Option<&str>,
        chain_id: &str,
    ) -> Result<(), UnpackError> {
        if unpack::is_unpacked(store, &self.options.snapshotter, chain_id).await? {
            return Ok(());
        }
        unpack::apply_from_store(
            store,
            &self.options.snapshotter,
            &containerd_descriptor(layer),
            compression,
            diff_id,
            parent,
            chain_id,
        )
        .await
    }
}

impl Transfer {
    fn exhausted(&self, blob: &str, last: String) -> PullError {
        PullError::Exhausted {
            image: self.image.clone(),
            blob: blob.to_owned(),
            attempts: self.attempts,
            last,
        }
    }

    fn spool_err(&self, source: SpoolError) -> PullError {
        PullError::Spool {
            image: self.image.clone(),
            source,
        }
    }

    /// The blob is in containerd (or its bytes were wrong): its spool is not needed.
    fn remove_spool(&self, digest: &str) {
        if let Err(error) = spool::remove(&self.spool_dir, digest) {
            tracing::warn!(%error, "could not remove a spool");
        }
    }

    fn store_err(&self, source: StoreError) -> PullError {
        PullError::Store {
            image: self.image.clone(),
            source,
        }
    }

    fn labels_with_source(
        &self,
        mut labels: HashMap<String, String>,
        existing: Option<&HashMap<String, String>>,
    ) -> HashMap<String, String> {
        let (key, repo) = &self.source_label;
        let value = match existing.and_then(|l| l.get(key)) {
            Some(have) if have.split(',').any(|r| r == repo) => have.clone(),
            Some(have) => format!("{have},{repo}"),
            None => repo.clone(),
        };
        labels.insert(key.clone(), value);
        labels
    }

    /// A small blob (config) in memory, from the store if present, else the registry.
    async fn fetch_small(&self, digest: &str) -> Result<Vec<u8>, PullError> {
        let mut last = String::new();
        for attempt in 0..self.attempts {
            for i in self.registry.blob_endpoints() {
                let _permit = self.connections.acquire().await;
                match self.registry.fetch_blob(i, digest, None).await {
                    Ok((_, mut body)) => {
                        let mut data = Vec::new();
                        loop {
                            match body.next().await {
                                Ok(Some(piece)) => {
                                    data.extend_from_slice(&piece);
                                    if data.len() as u64 > self.registry.max_document_size() {
                                        return Err(PullError::Image {
                                            image: self.image.clone(),
                                            detail: format!(
                                                "{digest} is bigger than a config may be"
                                            ),
                                        });
                                    }
                                }
                                Ok(None) => return Ok(data),
                                Err(e) => {
                                    last = format!("{}: {e}", self.registry.endpoint_url(i));
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) if !e.is_retryable() => return Err(e.into()),
                    Err(e) => last = e.to_string(),
                }
            }
            backoff(attempt, None).await;
        }
        Err(self.exhausted(digest, last))
    }

    /// Store a small blob we already hold (config, manifest, index) with `labels`.
    async fn put_small(
        &self,
        digest: &str,
        data: &[u8],
        labels: HashMap<String, String>,
    ) -> Result<(), StoreError> {
        if let Some(existing) = self.store.blob_labels(digest).await? {
            let labels = self.labels_with_source(labels, Some(&existing));
            return self.store.add_labels(digest, labels).await;
        }
        match self.open_writer_waiting(digest, data.len() as u64).await? {
            Some(mut writer) => {
                if writer.offset() != 0 {
                    writer.truncate().await?;
                }
                writer.write(data).await?;
                writer.commit(self.labels_with_source(labels, None)).await
            }
            // A concurrent pull of the same image stored it: label what it stored.
            None => {
                let existing = self.store.blob_labels(digest).await?;
                let labels = self.labels_with_source(labels, existing.as_ref());
                self.store.add_labels(digest, labels).await
            }
        }
    }

    /// The blob is in the store already: add this image's labels to it.
    async fn mark_present(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
        existing: Option<HashMap<String, String>>,
    ) -> Result<u64, PullError> {
        let existing = match existing {
            Some(existing) => Some(existing),
            None => self
                .store
                .blob_labels(digest)
                .await
                .map_err(|e| self.store_err(e))?,
        };
        let labels = self.labels_with_source(labels, existing.as_ref());
        self.store
            .add_labels(digest, labels)
            .await
            .map_err(|e| self.store_err(e))?;
        self.progress.event(ProgressEvent::BlobDone {
            digest: digest.to_owned(),
            skipped: true,
        });
        Ok(0)
    }

    /// Download a blob into the store (resuming what containerd holds), unpacking it on
    /// the way when `plan` allows. Returns the bytes fetched from the registry.
    async fn fetch_blob(
        &self,
        digest: &str,
        size: u64,
        labels: HashMap<String, String>,
        layer: Option<(StreamPlan, tokio::sync::OwnedSemaphorePermit)>,
    ) -> Result<u64, PullError> {
        let (plan, slot) = layer.unzip();
        // One fetch per blob in this agent: a concurrent pull of the same layer waits here
        // and then finds the blob present.
        let gate = {
            let mut map = self.in_flight.lock().await;
            map.entry(digest.to_owned()).or_default().clone()
        };
        let _turn = gate.lock().await;

        if let Some(existing) = self
            .store
            .blob_labels(digest)
            .await
            .map_err(|e| self.store_err(e))?
        {
            return self.mark_present(digest, labels, Some(existing)).await;
        }
        let Some(writer) = self
            .open_writer_waiting(digest, size)
            .await
            .map_err(|e| self.store_err(e))?
        else {
            // Fetched meanwhile by a concurrent pull: only our labels are missing.
            return self.mark_present(digest, labels, None).await;
        };
        let labels = self.labels_with_source(labels, None);
        self.progress.event(ProgressEvent::BlobStarted {
            digest: digest.to_owned(),
            size,
            resumed_from: writer.offset(),
        });
        let mut sink = Sink {
            writer,
            streaming: None,
            fetched: 0,
            fed: 0,
        };
        // Unpacking streams along from byte 0 (a resumed download is unpacked from the
        // content store afterwards). Staging costs two more snapshot calls, which small
        // layers do not win back: they wait for their parent and unpack from the store.
        if let Some(plan) = &plan
            && sink.writer.offset() == 0
            && (size >= STAGING_MIN_SIZE || self.stack.borrow().unpacked >= plan.index)
        {
            sink.streaming = self.start_streaming(plan).await;
        }
        let result = self.download(digest, size, labels, &mut sink).await;
        // The download slot goes to the next layer; applying and stacking this one may
        // still take a while.
        drop(slot);
        match (result, sink.streaming.take(), &plan) {
            (Ok(()), Some(streaming), Some(plan)) => {
                let mut stack = self.stack.subscribe();
                let below = plan.index;
                let parent_unpacked = async move {
                    stack
                        .wait_for(|s| s.unpacked >= below || s.failed)
                        .await
                        .is_ok_and(|s| !s.failed)
                };
                streaming
                    .finish(&self.store, digest, &plan.diff_id, parent_unpacked)
                    .await
                    .map_err(|source| PullError::Unpack {
                        image: self.image.clone(),
                        source,
                    })?;
                Ok(sink.fetched)
            }
            (Ok(()), _, _) => Ok(sink.fetched),
            (Err(e), streaming, _) => {
                if let Some(streaming) = streaming {
                    streaming.abandon(&self.store).await;
                }
                Err(e)
            }
        }
    }

    /// Layers `0..=index` are in the snapshotter.
    fn mark_unpacked(&self, index: usize) {
        self.stack.send_if_modified(|s| {
            let changed = s.unpacked < index + 1;
            s.unpacked = s.unpacked.max(index + 1);
            changed
        });
    }

    /// A layer failed: the ones above it will never be stacked.
    fn mark_failed(&self) {
        self.stack.send_modify(|s| s.failed = true);
    }

    /// Unpack while downloading: onto the parent when it is unpacked, else staged.
    async fn start_streaming(&self, plan: &StreamPlan) -> Option<StreamingApply> {
        let done = unpack::is_unpacked(&self.store, &plan.snapshotter, &plan.chain_id)
            .await
            .unwrap_or(true);
        if done {
            return None;
        }
        let parent_ready = self.stack.borrow().unpacked >= plan.index;
        match StreamingApply::start(
            &self.store,
            &plan.snapshotter,
            plan.parent.as_deref(),
            parent_ready,
            &plan.chain_id,
            plan.compression,
        )
        .await
        {
            Ok(streaming) => streaming,
            Err(error) => {
                tracing::debug!(%error, "unpacking after the download instead");
                None
            }
        }
    }

    /// Fetch until containerd holds the whole blob and accepts its digest.
    async fn download(
        &self,
        digest: &str,
        size: u64,
        labels: HashMap<String, String>,
        sink: &mut Sink,
    ) -> Result<(), PullError> {
        let mut last = String::new();
        let mut ranges_supported = true;
        for attempt in 0..self.attempts {
            let start = sink.writer.offset();
            let outcome = if start >= size {
                Ok(())
            } else {
                // One connection first: on a fast registry it is all we need, and ranges only
                // cost CPU. When it proves slow, the rest comes as parallel ranges; once
                // one blob found the registry slow, the others start with ranges. So does
                // a blob an interrupted pull left ranges of.
                let ranged =
                    ranges_supported && self.parallel && size - start > 2 * self.chunk_size;
                let first = if ranged
                    && (self.slow_registry.load(Ordering::Relaxed)
                        || spool::exists(&self.spool_dir, digest))
                {
                    Ok(StreamEnd::Slow)
                } else {
                    self.fetch_stream(digest, size, sink, ranged).await
                };
                match first {
                    Ok(StreamEnd::Complete) => Ok(()),
                    Ok(StreamEnd::Slow) => {
                        self.slow_registry.store(true, Ordering::Relaxed);
                        match self.fetch_ranges(digest, size, sink).await {
                            Err(RangeOutcome::Ignored) => {
                                ranges_supported = false;
                                self.remove_spool(digest);
                                self.fetch_stream(digest, size, sink, false).await.map(drop)
                            }
                            Err(RangeOutcome::Failed(e)) => Err(e),
                            Ok(()) => Ok(()),
                        }
                    }
                    Err(e) => Err(e),
                }
            };
            match outcome {
                Ok(()) => {
                    match sink.writer.commit(labels.clone()).await {
                        Ok(()) => {
                            self.remove_spool(digest);
                            self.progress.event(ProgressEvent::BlobDone {
                                digest: digest.to_owned(),
                                skipped: false,
                            });
                            return Ok(());
                        }
                        Err(StoreError::DigestMismatch { .. }) => {
                            // The bytes are wrong: start over (maybe from another host).
                            last = format!("{digest}: content does not match its digest");
                            tracing::warn!(%digest, "digest mismatch; downloading again");
                            self.stalled(
                                digest,
                                "content did not match its digest; downloading it again",
                            );
                            self.remove_spool(digest);
                            sink.drop_streaming(&self.store).await;
                            sink.writer
                                .reopen(&self.store)
                                .await
                                .map_err(|e| self.store_err(e))?;
                            if sink.writer.offset() != 0 {
                                sink.writer
                                    .truncate()
                                    .await
                                    .map_err(|e| self.store_err(e))?;
                            }
                            self.resumed(digest, sink.writer.offset());
                        }
                        Err(e) if e.is_connection_lost() => {
                            last = e.to_string();
                            self.resume_after_containerd(digest, sink).await?;
                        }
                        Err(e) => return Err(self.store_err(e)),
                    }
                }
                Err(PullError::Store { source, .. }) if source.is_connection_lost() => {
                    last = source.to_string();
                    self.resume_after_containerd(digest, sink).await?;
                }
                Err(e) => {
                    if let PullError::Registry(re) = &e {
                        if !re.is_retryable() {
                            return Err(e);
                        }
                        last = re.to_string();
                        // What arrived before the failure is good: store it all, then
                        // reopen the writer to learn the offset containerd really holds.
                        if let Err(error) = sink.writer.flush().await {
                            tracing::debug!(%error, "could not store the bytes before a failure");
                        }
                        self.stalled(digest, &format!("retrying after: {re}"));
                        backoff(attempt, re.retry_after()).await;
                        sink.writer
                            .reopen(&self.store)
                            .await
                            .map_err(|e| self.store_err(e))?;
                        self.resumed(digest, sink.writer.offset());
                        if sink.writer.offset() != sink.fed {
                            sink.drop_streaming(&self.store).await;
                        }
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(self.exhausted(digest, last))
    }

    fn stalled(&self, digest: &str, reason: &str) {
        self.progress.event(ProgressEvent::BlobStalled {
            digest: digest.to_owned(),
            reason: reason.to_owned(),
        });
    }

    fn resumed(&self, digest: &str, offset: u64) {
        self.progress.event(ProgressEvent::BlobResumed {
            digest: digest.to_owned(),
            offset,
        });
    }

    /// containerd went away mid-write (a restart, an upgrade): wait for it to answer
    /// again (up to [`CONTAINERD_RETURN`]), reopen the ingest at the offset it kept and
    /// go on from there.
    async fn resume_after_containerd(
        &self,
        digest: &str,
        sink: &mut Sink,
    ) -> Result<(), PullError> {
        tracing::warn!(%digest, "containerd went away mid-write; waiting for it to resume");
        self.stalled(
            digest,
            &format!(
                "containerd went away; waiting up to {} for it to come back",
                humantime::format_duration(CONTAINERD_RETURN)
            ),
        );
        let deadline = tokio::time::Instant::now() + CONTAINERD_RETURN;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match sink.writer.reopen(&self.store).await {
                Ok(()) => break,
                Err(e) if e.is_connection_lost() && tokio::time::Instant::now() < deadline => {}
                Err(e) => return Err(self.store_err(e)),
            }
        }
        tracing::info!(%digest, offset = sink.writer.offset(), "containerd is back; resuming the blob");
        self.resumed(digest, sink.writer.offset());
        if sink.writer.offset() != sink.fed {
            sink.drop_streaming(&self.store).await;
        }
        Ok(())
    }

    /// Open the ingest; if another process (a concurrent `ctr pull`) holds its lock,
    /// wait for it to finish or give up the lock.
    /// `None` when the blob appeared in the store while we waited (another pull, ours or
    /// containerd's, fetched it): then there is nothing to download.
    async fn open_writer_waiting(
        &self,
        digest: &str,
        size: u64,
    ) -> Result<Option<BlobWriter>, StoreError> {
        let reference = ingest_ref(digest);
        let mut waited = 0;
        loop {
            match self.store.open_writer(&reference, digest, size).await {
                Ok(writer) => return Ok(Some(writer)),
                // Committed by a concurrent pull between our look and the open.
                Err(StoreError::Call(call)) if call.status.code() == tonic::Code::AlreadyExists => {
                    return Ok(None);
                }
                Err(e) if e.to_string().contains("AlreadyExists") => return Ok(None),
                Err(e) => {
                    let text = e.to_string();
                    if (text.contains("locked") || text.contains("Unavailable")) && waited < 3000 {
                        waited += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if self.store.blob_labels(digest).await?.is_some() {
                            return Ok(None);
                        }
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// One stream from the writer's offset to the end, written as it arrives. With
    /// `probe`, gives up early (`Slow`) when the connection is slower than
    /// [`SLOW_STREAM_RATE`], so the rest can be fetched as parallel ranges.
    async fn fetch_stream(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
        probe: bool,
    ) -> Result<StreamEnd, PullError> {
        let _permit = self.connections.acquire().await;
        let mut last: Option<RegistryError> = None;
        for i in self.registry.blob_endpoints() {
            let start = sink.writer.offset();
            let range = (start > 0).then(|| (start, size - 1));
            let (partial, mut body) = match self.registry.fetch_blob(i, digest, range).await {
                Ok(ok) => ok,
                Err(e) if e.is_retryable() => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            // A server that ignores Range sends from byte 0: skip what we hold.
            let mut skip = if partial { 0 } else { start };
            // The connection is judged by the time spent waiting for its bytes, not by
            // the time spent storing and unpacking them: a busy agent is no reason for
            // more connections.
            let probe_start = std::time::Instant::now();
            let mut waited = Duration::ZERO;
            let mut probed = 0u64;
            loop {
                let asked = std::time::Instant::now();
                let next = body.next().await;
                waited += asked.elapsed();
                match next {
                    Ok(Some(mut piece)) => {
                        if skip > 0 {
                            let n = skip.min(piece.len() as u64) as usize;
                            skip -= n as u64;
                            piece = piece.slice(n..);
                            if piece.is_empty() {
                                continue;
                            }
                        }
                        if sink.writer.offset() + piece.len() as u64 > size {
                            return Err(RegistryError::Transfer {
                                what: format!("blob {digest}"),
                                endpoint: self.registry.endpoint_url(i).to_owned(),
                                detail: format!("more than the {size} bytes the manifest promises"),
                                retryable: false,
                                retry_after: None,
                            }
                            .into());
                        }
                        if let Some(rate) = &self.rate {
                            rate.acquire(piece.len()).await;
                        }
                        sink.write(piece.clone())
                            .await
                            .map_err(|e| self.store_err(e))?;
                        sink.fetched += piece.len() as u64;
                        self.progress.event(ProgressEvent::BlobBytes {
                            digest: digest.to_owned(),
                            bytes: piece.len() as u64,
                        });
                        probed += piece.len() as u64;
                        if probe
                            && probe_start.elapsed() >= PROBE_TIME
                            && (probed as f64 / waited.as_secs_f64()) < SLOW_STREAM_RATE as f64
                            && size - sink.writer.offset() > 2 * self.chunk_size
                        {
                            return Ok(StreamEnd::Slow);
                        }
                    }
                    Ok(None) => break,
                    Err(detail) => {
                        return Err(RegistryError::Transfer {
                            what: format!("blob {digest}"),
                            endpoint: self.registry.endpoint_url(i).to_owned(),
                            detail,
                            retryable: true,
                            retry_after: None,
                        }
                        .into());
                    }
                }
            }
            if sink.writer.offset() < size {
                return Err(RegistryError::Transfer {
                    what: format!("blob {digest}"),
                    endpoint: self.registry.endpoint_url(i).to_owned(),
                    detail: format!("body ended at byte {} of {size}", sink.writer.offset()),
                    retryable: true,
                    retry_after: None,
                }
                .into());
            }
            return Ok(StreamEnd::Complete);
        }
        Err(last.map_or_else(
            || PullError::Image {
                image: self.image.clone(),
                detail: "no registry host may serve blobs (check hosts.toml capabilities)"
                    .to_owned(),
            },
            PullError::from,
        ))
    }

    /// Parallel byte ranges from the writer's offset to the end, written to containerd
    /// in order. Ranges are aligned to the chunk size and wait in the blob's spool, so a
    /// killed agent continues each one where its bytes end. At most [`RANGE_WINDOW`]
    /// ranges run ahead of the write position.
    async fn fetch_ranges(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
    ) -> Result<(), RangeOutcome> {
        let spool = Spool::open(&self.spool_dir, digest, size, self.chunk_size)
            .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
        let spool = Arc::new(spool);
        let chunk = spool.range_size();
        // The start of the first range is taken as held by containerd: make it so.
        sink.writer
            .flush()
            .await
            .map_err(|e| RangeOutcome::Failed(self.store_err(e)))?;
        let start = sink.writer.offset();
        let first = start / chunk;
        // containerd holds the start of the first range already.
        spool
            .skip_to(first, start - first * chunk)
            .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
        // Each range in its own task: they keep downloading while a finished one is
        // being written (a stream polled only between writes would stall them).
        let mut ranges = futures::stream::iter(first..spool.ranges())
            .map(|k| {
                let transfer = self.clone();
                let digest = digest.to_owned();
                let spool = spool.clone();
                AbortOnDrop(tokio::spawn(async move {
                    transfer.fetch_range(&digest, &spool, k).await
                }))
            })
            .buffered(RANGE_WINDOW);
        // Written ranges leave the spool once containerd confirmed holding them.
        let mut written = std::collections::VecDeque::new();
        while let Some(joined) = ranges.next().await {
            let (k, fetched) = joined.map_err(|e| {
                RangeOutcome::Failed(PullError::Image {
                    image: self.image.clone(),
                    detail: format!("range task failed: {e}"),
                })
            })??;
            sink.fetched += fetched;
            let end = k * chunk + spool.range_len(k);
            loop {
                let from = sink.writer.offset().max(k * chunk);
                if from >= end {
                    break;
                }
                let len = (end - from).min(SPOOL_PIECE as u64 * 4);
                let data = spool
                    .read(from, usize::try_from(len).unwrap_or(usize::MAX))
                    .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                sink.write(Bytes::from(data))
                    .await
                    .map_err(|e| RangeOutcome::Failed(self.store_err(e)))?;
            }
            written.push_back(k);
            while let Some(&done) = written.front()
                && (done + 1) * chunk <= sink.writer.acked()
            {
                written.pop_front();
                if let Err(error) = spool.discard(done) {
                    tracing::debug!(%error, "could not free a written range");
                }
            }
        }
        Ok(())
    }

    /// Fetch range `k` of the blob into the spool, from where its bytes end. Returns `k`
    /// and the bytes fetched now (an earlier run may have spooled some).
    async fn fetch_range(
        &self,
        digest: &str,
        spool: &Spool,
        k: u64,
    ) -> Result<(u64, u64), RangeOutcome> {
        let begin = k * spool.range_size();
        let len = spool.range_len(k);
        let mut last = String::new();
        let mut fetched = 0u64;
        for attempt in 0..self.attempts {
            let have = spool.received(k);
            if have >= len {
                return Ok((k, fetched));
            }
            let (start, end) = (begin + have, begin + len - 1);
            for i in self.registry.blob_endpoints() {
                let _permit = self.connections.acquire().await;
                let began = std::time::Instant::now();
                let (partial, mut body) = match self
                    .registry
                    .fetch_blob(i, digest, Some((start, end)))
                    .await
                {
                    Ok(ok) => ok,
                    Err(e) if e.is_retryable() => {
                        last = e.to_string();
                        if let Some(after) = e.retry_after() {
                            tokio::time::sleep(after.min(Duration::from_secs(60))).await;
                        }
                        continue;
                    }
                    Err(e) => return Err(RangeOutcome::Failed(e.into())),
                };
                if !partial {
                    return Err(RangeOutcome::Ignored);
                }
                let mut pending: Vec<u8> = Vec::with_capacity(SPOOL_PIECE * 2);
                let mut failed = None;
                loop {
                    match body.next().await {
                        Ok(Some(piece)) => {
                            if let Some(rate) = &self.rate {
                                rate.acquire(piece.len()).await;
                            }
                            if spool.received(k) + (pending.len() + piece.len()) as u64 > len {
                                failed =
                                    Some(format!("range {start}-{end} returned more than asked"));
                                break;
                            }
                            pending.extend_from_slice(&piece);
                            fetched += piece.len() as u64;
                            self.progress.event(ProgressEvent::BlobBytes {
                                digest: digest.to_owned(),
                                bytes: piece.len() as u64,
                            });
                            if pending.len() >= SPOOL_PIECE {
                                spool
                                    .append(k, &pending)
                                    .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                                pending.clear();
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                // What arrived is kept even when the transfer broke: the retry continues.
                if !pending.is_empty() {
                    spool
                        .append(k, &pending)
                        .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                }
                match failed {
                    None if spool.received(k) == len => {
                        tracing::debug!(%digest, range = k, bytes = end + 1 - start, elapsed = ?began.elapsed(), "range fetched");
                        return Ok((k, fetched));
                    }
                    None => {
                        last = format!(
                            "range {start}-{end}: body ended at byte {} of the range",
                            spool.received(k)
                        );
                    }
                    Some(e) => last = format!("{}: {e}", self.registry.endpoint_url(i)),
                }
            }
            backoff(attempt, None).await;
        }
        Err(RangeOutcome::Failed(self.exhausted(
            &format!("{digest} bytes {begin}-{}", begin + len - 1),
            last,
        )))
    }
}

/// A spawned task that is cancelled when its handle is dropped: ranges of a failed or
/// abandoned blob stop downloading.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

/// Where downloaded bytes go: containerd's ingest, and the unpacker when streaming.
struct Sink {
    writer: BlobWriter,
    streaming: Option<StreamingApply>,
    /// Bytes fetched from registries in this run (not what an earlier run spooled).
    fetched: u64,
    /// Bytes handed to the unpacker (equals the ingest offset while streaming works).
    fed: u64,
}

/// How far the layers of one image are stacked in the snapshotter.
#[derive(Debug, Clone, Copy, Default)]
struct Stack {
    /// Layers `0..unpacked` are committed snapshots.
    unpacked: usize,
    /// A layer failed: nothing above it will be stacked.
    failed: bool,
}

impl Sink {
    /// Store and unpack at once: the unpacker works while containerd writes.
    async fn write(&mut self, bytes: Bytes) -> Result<(), StoreError> {
        let Self {
            writer,
            streaming,
            fed,
            ..
        } = self;
        let feed = async {
            if let Some(streaming) = streaming {
                *fed += streaming.feed(bytes.clone()).await;
            }
        };
        let (written, ()) = tokio::join!(writer.write(&bytes), feed);
        written
    }

    async fn drop_streaming(&mut self, store: &Store) {
        if let Some(streaming) = self.streaming.take() {
            streaming.abandon(store).await;
        }
    }
}

/// What a layer needs to be unpacked while it downloads.
#[derive(Debug, Clone)]
struct StreamPlan {
    /// Position of the layer, bottom first.
    index: usize,
    snapshotter: String,
    parent: Option<String>,
    chain_id: String,
    compression: media::Compression,
    diff_id: String,
}

/// How a single stream ended.
enum StreamEnd {
    Complete,
    /// Slower than [`SLOW_STREAM_RATE`]: fetch the rest as ranges.
    Slow,
}

enum RangeOutcome {
    /// The server answered a range request with the whole blob.
    Ignored,
    Failed(PullError),
}

impl From<PullError> for RangeOutcome {
    fn from(e: PullError) -> Self {
        Self::Failed(e)
    }
}

/// ENOSPC, whether containerd (a gRPC message) or the agent (an io error) ran into it.
fn is_disk_full(error: &PullError) -> bool {
    error
        .to_string()
        .to_ascii_lowercase()
        .contains("no space left on device")
}

/// How long a pull waits for a containerd that went away mid-write to come back.
const CONTAINERD_RETURN: Duration = Duration::from_secs(60);

/// containerd's ingest ref for a blob (remotes.MakeRefKey), so concurrent pulls by
/// containerd and Rigger of the same blob share one ingest and its lock.
fn ingest_ref(digest: &str) -> String {
    format!("layer-{digest}")
}

async fn backoff(attempt: u32, retry_after: Option<Duration>) {
    let exponential =
        Duration::from_millis(200).saturating_mul(2u32.saturating_pow(attempt.min(8)));
    let delay = retry_after
        .unwrap_or(exponential)
        .min(Duration::from_secs(60));
    tokio::time::sleep(delay.mul_f64(0.75 + fastrand::f64() / 2.0)).await;
}

fn verify_digest(data: &[u8], digest: &str) -> Result<(), String> {
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Err(format!("unsupported digest algorithm in {digest}"));
    };
    let actual = unpack::hex(&Sha256::digest(data));
    if actual == hex {
        Ok(())
    } else {
        Err(format!("content of {digest} hashes to sha256:{actual}"))
    }
}

/// `containerd.io/distribution.source.<host without port>` = repository.
fn distribution_source(reference: &Reference) -> (String, String) {
    let host = reference.registry();
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    (
        format!("containerd.io/distribution.source.{host}"),
        reference.repository().to_owned(),
    )
}

fn containerd_descriptor(d: &Descriptor) -> ContainerdDescriptor {
    ContainerdDescriptor {
        media_type: d.media_type().to_string(),
        digest: d.digest().to_string(),
        size: i64::try_from(d.size()).unwrap_or(i64::MAX),
        annotations: HashMap::new(),
    }
}

fn descriptor(media_type: &str, digest: &str, size: usize) -> ContainerdDescriptor {
    ContainerdDescriptor {
        media_type: media_type.to_owned(),
        digest: digest.to_owned(),
        size: i64::try_from(size).unwrap_or(i64::MAX),
        annotations: HashMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_label_drops_the_port() {
        let r = Reference::from_str("127.0.0.1:5000/team/app:1").unwrap();
        assert_eq!(
            distribution_source(&r),
            (
                "containerd.io/distribution.source.127.0.0.1".to_owned(),
                "team/app".to_owned()
            )
        );
        let r = Reference::from_str("busybox").unwrap();
        assert_eq!(
            distribution_source(&r).0,
            "containerd.io/distribution.source.docker.io"
        );
        assert_eq!(distribution_source(&r).1, "library/busybox");
    }

    #[test]
    fn digests_are_verified() {
        let digest = format!("sha256:{}", unpack::hex(&Sha256::digest(b"abc")));
        assert!(verify_digest(b"abc", &digest).is_ok());
        assert!(verify_digest(b"abd", &digest).is_err());
    }
}
