//! The image pull engine: registry → containerd, without containerd's own pull.
//!
//! For each image: resolve the reference (mirrors from `hosts.toml`, credentials from a
//! docker `config.json`), pick the platform's manifest, then fetch every layer at once —
//! big layers as byte ranges over several connections — streaming into containerd's
//! content store under a lease. Layers are unpacked into the snapshotter as they
//! complete, in order, while later ones still download. Finally the labels and image
//! records containerd's own pull would leave are written, so CRI and kubelet see an
//! ordinary pulled image.
//!
//! - [`hosts`]: `certs.d/<host>/hosts.toml` endpoints;
//! - [`registry`]: manifests and blob ranges over HTTP;
//! - [`media`]: media types, platform selection;
//! - [`store`]: lease, content ingestion (resumable), labels, image records;
//! - [`unpack`]: chain IDs and snapshots;
//! - [`limit`]: the node-wide bandwidth cap.

pub mod apply;
pub mod hosts;
pub mod limit;
pub mod media;
pub mod registry;
pub mod store;
pub mod unpack;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use containerd_client::types::Descriptor as ContainerdDescriptor;
use futures::StreamExt;
use oci_client::Reference;
use oci_client::secrets::RegistryAuth;
use oci_spec::image::{Descriptor, ImageConfiguration};
use sha2::{Digest as _, Sha256};
use tokio::sync::{Mutex, Semaphore};

use self::limit::RateLimit;
use self::media::Platform;
use self::registry::{Registry, RegistryError};
use self::store::{BlobWriter, Store, StoreError};
use self::unpack::{StreamingApply, UnpackError, chain_ids};
use crate::runtime::{CRI_NAMESPACE, Runtime};
use bytes::Bytes;

/// Blobs bigger than this are fetched as parallel byte ranges of this size.
pub const DEFAULT_CHUNK_SIZE: u64 = 2 << 20;
/// Layers downloading at once in one pull (bottom first).
const LAYERS_AT_ONCE: usize = 3;
/// Byte ranges fetched ahead of the write position, per blob.
const RANGE_WINDOW: usize = 12;
/// Memory for downloaded-but-not-yet-stored bytes across all pulls of this agent: range
/// chunks in flight, and the start of a layer held until its parent layer is unpacked.
const BUFFER_BUDGET: u64 = 24 << 20;
/// A single connection slower than this (bytes/s) is supplemented by parallel ranges.
const SLOW_STREAM_RATE: u64 = 48 << 20;
/// How long a single connection is watched before judging its speed.
const PROBE_TIME: Duration = Duration::from_millis(250);
/// Connections open at once across all pulls of this agent.
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;
/// Configs and manifests larger than this are refused (they are kilobytes in practice).
const MAX_METADATA_BLOB: u64 = 8 << 20;

/// How to pull.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// containerd namespace (kubelet uses `k8s.io`).
    pub namespace: String,
    pub snapshotter: String,
    pub platform: Platform,
    /// containerd's `certs.d` directory of `hosts.toml` files.
    pub hosts_dir: PathBuf,
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
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            namespace: CRI_NAMESPACE.to_owned(),
            snapshotter: "overlayfs".to_owned(),
            platform: Platform::host(),
            hosts_dir: PathBuf::from(hosts::DEFAULT_HOSTS_DIR),
            plain_http: false,
            docker_config: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            chunk_size: DEFAULT_CHUNK_SIZE,
            limit_rate: None,
            stall_timeout: registry::DEFAULT_STALL_TIMEOUT,
            attempts: 5,
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
    #[error("{image}: {blob}: gave up after {attempts} attempts; last error: {last}")]
    Exhausted {
        image: String,
        blob: String,
        attempts: u32,
        last: String,
    },
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
    buffers: Arc<Semaphore>,
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
    /// KiB of [`BUFFER_BUDGET`].
    buffers: Arc<Semaphore>,
    /// More than one connection allowed: ranges can help a slow single stream.
    parallel: bool,
    /// How many layers of this image, from the bottom, are unpacked.
    unpacked: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Puller {
    pub fn new(runtime: Runtime, options: PullOptions) -> Self {
        let connections = Arc::new(Semaphore::new(options.max_connections.max(1)));
        let rate = options.limit_rate.map(|r| Arc::new(RateLimit::new(r)));
        Self {
            runtime,
            options,
            connections,
            rate,
            in_flight: Arc::default(),
            buffers: Arc::new(Semaphore::new((BUFFER_BUDGET >> 10) as usize)),
        }
    }

    /// Pull `image` into containerd.
    #[tracing::instrument(level = "info", skip(self, progress), fields(namespace = %self.options.namespace))]
    pub async fn pull(
        &self,
        image: &str,
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
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
        let auth = credentials(&registry_host, self.options.docker_config.as_deref())?;
        let registry = Arc::new(Registry::new(
            reference.clone(),
            endpoints,
            auth,
            self.options.stall_timeout,
        )?);

        let mut store = Store::new(&self.runtime, &self.options.namespace);
        if let Err(error) = store.reap_stale_leases().await {
            tracing::warn!(%error, "could not look for leases of interrupted pulls");
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
            .await;
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
            chunk_size: self
                .options
                .chunk_size
                .clamp(1 << 20, BUFFER_BUDGET / RANGE_WINDOW as u64),
            attempts: self.options.attempts.max(1),
            source_label: distribution_source(reference),
            buffers: self.buffers.clone(),
            parallel: self.options.max_connections > 1,
            unpacked: Arc::new(tokio::sync::watch::Sender::new(0)),
        };

        // The config is small and tells us the uncompressed digests (diff IDs).
        let config_desc = manifest.config().clone();
        if config_desc.size() > MAX_METADATA_BLOB {
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

        // Every layer downloads at once (bounded by the connection limit); each is
        // unpacked as soon as it and the layers below it are in.
        let mut jobs = Vec::with_capacity(layers.len());
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
            jobs.push((layer.clone(), labels, plan));
        }
        // Layers start bottom first, a few at a time: the lower ones finish early and
        // unpack while the upper ones still download (a layer cannot be unpacked before
        // the one below it).
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
                    let _slot = slot;
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
                    t.fetch_blob(layer.digest().as_ref(), layer.size(), labels, Some(plan))
                        .await
                });
                if handles_tx.send(handle).is_err() {
                    return;
                }
            }
        });
        let mut bytes_downloaded = 0u64;
        let mut failure = None;
        for i in 0..layers.len() {
            // In order: layer i is unpacked while later layers still download.
            let Some(download) = handles_rx.recv().await else {
                failure.get_or_insert(image_err("layer dispatch stopped".to_owned()));
                break;
            };
            let outcome = match download.await {
                Ok(outcome) => outcome,
                Err(join) => Err(image_err(format!("layer task failed: {join}"))),
            };
            match outcome {
                Ok(n) => bytes_downloaded += n,
                Err(e) => {
                    failure.get_or_insert(e);
                    continue;
                }
            }
            if failure.is_some() {
                continue;
            }
            let layer = &layers[i];
            if unpack::is_unpacked(store, &self.options.snapshotter, &chains[i])
                .await
                .map_err(|source| PullError::Unpack {
                    image: name.to_owned(),
                    source,
                })?
            {
                continue;
            }
            let descriptor = containerd_descriptor(layer);
            let compression =
                media::layer_compression(layer.media_type().as_ref()).map_err(&image_err)?;
            unpack::apply_from_store(
                store,
                &self.options.snapshotter,
                &descriptor,
                compression,
                &diff_ids[i],
                i.checked_sub(1).map(|p| chains[p].as_str()),
                &chains[i],
            )
            .await
            .map_err(|source| PullError::Unpack {
                image: name.to_owned(),
                source,
            })?;
            transfer.mark_unpacked(i);
            progress.event(ProgressEvent::LayerUnpacked {
                digest: layer.digest().to_string(),
            });
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

impl Transfer {
    fn exhausted(&self, blob: &str, last: String) -> PullError {
        PullError::Exhausted {
            image: self.image.clone(),
            blob: blob.to_owned(),
            attempts: self.attempts,
            last,
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
                                    if data.len() as u64 > MAX_METADATA_BLOB {
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
        plan: Option<StreamPlan>,
    ) -> Result<u64, PullError> {
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
            waiting: None,
            fetched: 0,
            fed: 0,
        };
        if let Some(plan) = &plan
            && sink.writer.offset() == 0
        {
            let unpacked = *self.unpacked.borrow();
            if unpacked >= plan.index {
                sink.streaming = self.start_streaming(plan).await;
            } else if unpacked + 1 == plan.index {
                // The parent is still unpacking: hold the start of this layer (within the
                // buffer budget) and begin unpacking as soon as the parent is done.
                sink.waiting = Some(Waiting {
                    plan: plan.clone(),
                    held: Vec::new(),
                    permits: Vec::new(),
                });
            }
        }
        let result = self.download(digest, size, labels, &mut sink).await;
        match (result, sink.streaming.take(), &plan) {
            (Ok(()), Some(streaming), Some(plan)) => {
                streaming
                    .finish(&self.store, digest, &plan.diff_id)
                    .await
                    .map_err(|source| PullError::Unpack {
                        image: self.image.clone(),
                        source,
                    })?;
                self.mark_unpacked(plan.index);
                self.progress.event(ProgressEvent::LayerUnpacked {
                    digest: digest.to_owned(),
                });
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

    fn mark_unpacked(&self, index: usize) {
        self.unpacked.send_if_modified(|upto| {
            let changed = *upto < index + 1;
            *upto = (*upto).max(index + 1);
            changed
        });
    }

    /// Unpack while downloading. Only once the parent is unpacked: layers are stacked,
    /// and a child snapshot cannot be prepared before its parent is committed.
    async fn start_streaming(&self, plan: &StreamPlan) -> Option<StreamingApply> {
        let done = unpack::is_unpacked(&self.store, &plan.snapshotter, &plan.chain_id)
            .await
            .unwrap_or(true);
        if done {
            return None;
        }
        match StreamingApply::start(
            &self.store,
            &plan.snapshotter,
            plan.parent.as_deref(),
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
                // cost CPU. When it proves slow, the rest comes as parallel ranges.
                let probe = ranges_supported && self.parallel && size - start > 2 * self.chunk_size;
                match self.fetch_stream(digest, size, sink, probe).await {
                    Ok(StreamEnd::Complete) => Ok(()),
                    Ok(StreamEnd::Slow) => match self.fetch_ranges(digest, size, sink).await {
                        Err(RangeOutcome::Ignored) => {
                            ranges_supported = false;
                            self.fetch_stream(digest, size, sink, false).await.map(drop)
                        }
                        Err(RangeOutcome::Failed(e)) => Err(e),
                        Ok(()) => Ok(()),
                    },
                    Err(e) => Err(e),
                }
            };
            match outcome {
                Ok(()) => {
                    match sink.writer.commit(labels.clone()).await {
                        Ok(()) => {
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
                        }
                        Err(e) => return Err(self.store_err(e)),
                    }
                }
                Err(e) => {
                    if let PullError::Registry(re) = &e {
                        if !re.is_retryable() {
                            return Err(e);
                        }
                        last = re.to_string();
                        backoff(attempt, re.retry_after()).await;
                        // The writer may be out of step after a failed stream: reopen it to
                        // learn the offset containerd really holds.
                        sink.writer
                            .reopen(&self.store)
                            .await
                            .map_err(|e| self.store_err(e))?;
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
            let probe_start = std::time::Instant::now();
            let mut probed = 0u64;
            loop {
                match body.next().await {
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
                        sink.write(self, piece.clone())
                            .await
                            .map_err(|e| self.store_err(e))?;
                        self.progress.event(ProgressEvent::BlobBytes {
                            digest: digest.to_owned(),
                            bytes: piece.len() as u64,
                        });
                        probed += piece.len() as u64;
                        let elapsed = probe_start.elapsed();
                        if probe
                            && elapsed >= PROBE_TIME
                            && (probed as f64 / elapsed.as_secs_f64()) < SLOW_STREAM_RATE as f64
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

    /// Parallel byte ranges from the writer's offset, written in order. At most
    /// `window` ranges are held at once, so memory stays bounded whatever the blob size.
    async fn fetch_ranges(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
    ) -> Result<(), RangeOutcome> {
        let start = sink.writer.offset();
        let chunk = self.chunk_size;
        let ranges: Vec<(u64, u64)> = (start..size)
            .step_by(usize::try_from(chunk).unwrap_or(usize::MAX))
            .map(|s| (s, (s + chunk).min(size) - 1))
            .collect();
        let window = RANGE_WINDOW;
        let mut chunks = futures::stream::iter(ranges)
            .map(|(s, e)| self.fetch_range(digest, s, e))
            .buffered(window);
        while let Some(result) = chunks.next().await {
            let data = result?;
            let (data, _permit) = data;
            sink.write(self, Bytes::from(data))
                .await
                .map_err(|e| RangeOutcome::Failed(self.store_err(e)))?;
        }
        Ok(())
    }

    async fn fetch_range(
        &self,
        digest: &str,
        start: u64,
        end: u64,
    ) -> Result<(Vec<u8>, tokio::sync::OwnedSemaphorePermit), RangeOutcome> {
        let want = (end - start + 1) as usize;
        // The chunk's memory is budgeted from before it is fetched until it is stored.
        let budget = self
            .buffers
            .clone()
            .acquire_many_owned(kib(want as u64))
            .await
            .map_err(|_| {
                RangeOutcome::Failed(PullError::Image {
                    image: self.image.clone(),
                    detail: "buffer budget closed".to_owned(),
                })
            })?;
        let mut last = String::new();
        for attempt in 0..self.attempts {
            for i in self.registry.blob_endpoints() {
                let _permit = self.connections.acquire().await;
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
                let mut data = Vec::with_capacity(want);
                let mut failed = None;
                loop {
                    match body.next().await {
                        Ok(Some(piece)) => {
                            if let Some(rate) = &self.rate {
                                rate.acquire(piece.len()).await;
                            }
                            data.extend_from_slice(&piece);
                            self.progress.event(ProgressEvent::BlobBytes {
                                digest: digest.to_owned(),
                                bytes: piece.len() as u64,
                            });
                            if data.len() > want {
                                failed =
                                    Some(format!("range {start}-{end} returned more than asked"));
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                match failed {
                    None if data.len() == want => return Ok((data, budget)),
                    None => {
                        last = format!("range {start}-{end}: got {} of {want} bytes", data.len())
                    }
                    Some(e) => last = format!("{}: {e}", self.registry.endpoint_url(i)),
                }
            }
            backoff(attempt, None).await;
        }
        Err(RangeOutcome::Failed(
            self.exhausted(&format!("{digest} bytes {start}-{end}"), last),
        ))
    }
}

/// Where downloaded bytes go: containerd's ingest, and the unpacker when streaming.
struct Sink {
    writer: BlobWriter,
    streaming: Option<StreamingApply>,
    /// Waiting for the parent layer before streaming can start.
    waiting: Option<Waiting>,
    /// Bytes fetched from registries in this run.
    fetched: u64,
    /// Bytes handed to the unpacker (equals the ingest offset while streaming works).
    fed: u64,
}

/// The start of a layer, held in memory until its parent is unpacked.
struct Waiting {
    plan: StreamPlan,
    held: Vec<Bytes>,
    permits: Vec<tokio::sync::OwnedSemaphorePermit>,
}

fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

impl Sink {
    async fn write(&mut self, transfer: &Transfer, bytes: Bytes) -> Result<(), StoreError> {
        if self.waiting.is_none() {
            return self.store_and_feed(bytes).await;
        }
        let n = bytes.len() as u64;
        self.writer.write(&bytes).await?;
        self.fetched += n;
        if let Some(mut waiting) = self.waiting.take() {
            if *transfer.unpacked.borrow() >= waiting.plan.index {
                // The parent is in: start unpacking with what was held.
                self.streaming = transfer.start_streaming(&waiting.plan).await;
                self.fed = 0;
                for held in std::mem::take(&mut waiting.held) {
                    self.feed(held).await;
                }
            } else {
                match transfer.buffers.clone().try_acquire_many_owned(kib(n)) {
                    Ok(permit) => {
                        waiting.permits.push(permit);
                        waiting.held.push(bytes);
                        self.fed += n;
                        self.waiting = Some(waiting);
                        return Ok(());
                    }
                    // Out of budget: this layer is unpacked after its download instead.
                    Err(_) => {
                        self.fed = 0;
                        return Ok(());
                    }
                }
            }
        }
        if self.streaming.is_some() {
            self.feed(bytes).await;
        }
        Ok(())
    }

    /// Store and unpack at once: the unpacker works while containerd writes.
    async fn store_and_feed(&mut self, bytes: Bytes) -> Result<(), StoreError> {
        let n = bytes.len() as u64;
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
        written?;
        self.fetched += n;
        Ok(())
    }

    /// Hand bytes to the unpacker, if one is running.
    async fn feed(&mut self, bytes: Bytes) {
        if let Some(streaming) = &mut self.streaming {
            self.fed += streaming.feed(bytes).await;
        }
    }

    async fn drop_streaming(&mut self, store: &Store) {
        self.waiting = None;
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

/// Registry credentials from a docker `config.json` (explicit path, or docker's default).
fn credentials(
    registry: &str,
    docker_config: Option<&std::path::Path>,
) -> Result<RegistryAuth, PullError> {
    // docker keeps Docker Hub's credentials under its v1 URL.
    let server = if registry == "docker.io" {
        "https://index.docker.io/v1/"
    } else {
        registry
    };
    let found = match docker_config {
        Some(path) => {
            let file = std::fs::File::open(path).map_err(|e| PullError::Credentials {
                registry: registry.to_owned(),
                detail: format!("{}: {e}", path.display()),
            })?;
            docker_credential::get_credential_from_reader(file, server)
        }
        None => docker_credential::get_credential(server),
    };
    match found {
        Ok(docker_credential::DockerCredential::UsernamePassword(user, password)) => {
            Ok(RegistryAuth::Basic(user, password))
        }
        Ok(docker_credential::DockerCredential::IdentityToken(token)) => {
            Ok(RegistryAuth::Bearer(token))
        }
        Err(
            docker_credential::CredentialRetrievalError::ConfigNotFound
            | docker_credential::CredentialRetrievalError::ConfigReadError
            | docker_credential::CredentialRetrievalError::NoCredentialConfigured,
        ) if docker_config.is_none() => Ok(RegistryAuth::Anonymous),
        Err(docker_credential::CredentialRetrievalError::NoCredentialConfigured) => {
            Ok(RegistryAuth::Anonymous)
        }
        Err(e) => Err(PullError::Credentials {
            registry: registry.to_owned(),
            detail: e.to_string(),
        }),
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

    #[test]
    fn credentials_come_from_the_given_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // "user:secret" in base64.
        std::fs::write(
            &path,
            r#"{"auths":{"reg.example:5000":{"auth":"dXNlcjpzZWNyZXQ="}}}"#,
        )
        .unwrap();
        match credentials("reg.example:5000", Some(&path)).unwrap() {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("user", "secret")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            credentials("other.example", Some(&path)).unwrap(),
            RegistryAuth::Anonymous
        ));
        let err = credentials("x", Some(&dir.path().join("missing.json"))).unwrap_err();
        assert!(err.to_string().contains("missing.json"), "{err}");
    }
}
