//! `rigger-pull`: the image pull engine — registry → containerd, without containerd's
//! own pull, leaving exactly what containerd's pull leaves.
//!
//! A pull is a pipeline; each stage is a module, in the order it runs
//! (`Puller::pull_with_lease` states it in code):
//! 1. [`resolve`]: the reference, its registry's endpoints (`hosts.toml`) and
//!    credentials, the platform's manifest and the image config, each checked against
//!    its digest;
//! 2. [`fetch`]: each blob from the registry into containerd's ingest — one stream, or
//!    parallel byte ranges through an on-disk spool when the link is slow; resumable,
//!    bandwidth-capped, one fetch per blob in the process;
//! 3. [`store`]: containerd's content store — the pull's lease, ingests, labels, image
//!    records;
//! 4. [`stack`]: each layer decompressed and applied while it downloads, through
//!    `rigger_layer` (the only way into a snapshot), then committed in order (`layers`
//!    runs 2–4 for the layers of an image: bottom first, a few at a time);
//! 5. [`record`]: the metadata blobs with containerd's GC labels, and the image records
//!    CRI expects.
//!
//! Around the stages: [`registry`] (the HTTP side: manifests, blobs, ranges, auth,
//! mirrors), [`media`] (media types, platforms), [`progress`], [`options`], [`error`].

pub mod arriving;
pub mod containerd;
mod digest;
pub mod disk_guard;
pub mod error;
pub mod fetch;
mod layers;
pub mod media;
pub mod options;
pub mod peers;
mod presence;
pub mod progress;
mod record;
mod reference;
pub mod registry;
mod resolve;
pub mod stack;
pub mod store;

use std::sync::Arc;

use oci_client::Reference;
use tokio::sync::Semaphore;

pub use self::error::PullError;
use self::error::is_disk_full;
use self::fetch::Transfer;
use self::fetch::limit::RateLimit;
pub use self::options::{DEFAULT_CHUNK_SIZE, DEFAULT_MAX_CONNECTIONS, PullOptions};
pub use self::progress::{LayerBytes, NoProgress, Progress, ProgressEvent, PulledImage};
use self::reference::parse_reference;
pub use self::reference::{check_reference, normalized_and_pinned, normalized_name};
use self::registry::Registry;
use self::stack::unpack::chain_ids;
use self::store::Store;

/// The engine; one per agent, shared by all pulls so limits are node-wide.
#[derive(Debug, Clone)]
pub struct Puller {
    /// containerd, as the pipeline reaches it.
    containerd: Arc<dyn containerd::Containerd>,
    options: PullOptions,
    /// The node's connections and rate, the blobs in flight: what all pulls share.
    shared: fetch::Shared,
    /// Turns to pull an image, when the node limits images at once.
    image_turns: Option<Arc<Semaphore>>,
    /// What pulls in flight reserved on the image filesystem, when guarded.
    disk_guard: Option<disk_guard::DiskGuard>,
    /// containerd's content root opened for direct writes, once looked for.
    direct: Arc<tokio::sync::OnceCell<Arc<store::direct::DirectContent>>>,
}

impl Puller {
    /// The engine on containerd's socket, through the node's `connection`.
    pub fn new(connection: Arc<rigger_runtime::Connection>, options: PullOptions) -> Self {
        Self::on(Arc::new(containerd::grpc::Grpc::new(connection)), options)
    }

    /// The engine on `containerd` (another implementation than the socket: tests).
    pub fn on(containerd: Arc<dyn containerd::Containerd>, options: PullOptions) -> Self {
        let shared = fetch::Shared {
            connections: fetch::limit::Connections::new(options.max_connections),
            rate: options.limit_rate.map(|r| Arc::new(RateLimit::new(r))),
            in_flight: Arc::default(),
            ranging: presence::Presence::default(),
            arriving: None,
            clients: registry::endpoint_client::Clients::default(),
            speeds: Default::default(),
        };
        Self {
            containerd,
            image_turns: options
                .max_parallel_images
                .map(|n| Arc::new(Semaphore::new(n.max(1)))),
            disk_guard: options
                .image_fs_threshold_percent
                .map(disk_guard::DiskGuard::new),
            options,
            shared,
            direct: Arc::default(),
        }
    }

    /// The same engine — the same limits, in-flight blobs and announcements — pulling
    /// into `namespace` (a node's pods pull into CRI's, its jobs where configured).
    #[must_use]
    pub fn for_namespace(&self, namespace: &str) -> Self {
        let mut puller = self.clone();
        puller.options.namespace = namespace.to_owned();
        puller
    }

    /// The namespace this engine pulls into.
    pub fn namespace(&self) -> &str {
        &self.options.namespace
    }

    /// The digest containerd's record of `image` points at in the engine's namespace;
    /// `None` without one (or when containerd cannot say).
    pub async fn image_digest(&self, image: &str) -> Option<String> {
        let name = normalized_name(image).ok()?;
        self.containerd
            .image_get(&self.options.namespace, &name)
            .await
            .ok()?
            .map(|record| record.target.digest)
    }

    /// Announce in `arriving` the blobs and images this engine's pulls are fetching, so
    /// they can be served to peers while they arrive.
    #[must_use]
    pub fn announcing(mut self, arriving: arriving::Arriving) -> Self {
        self.shared.arriving = Some(arriving);
        self
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
    pub async fn pull_with_credentials(
        &self,
        image: &str,
        docker_configs: &[String],
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
        self.pull_from(image, docker_configs, None, progress).await
    }

    /// [`Puller::pull_with_credentials`], asking `peers` for each blob before the
    /// registry, and for the image's documents by digest when the registry cannot be
    /// reached (the name is resolved by the registry whenever it answers).
    #[tracing::instrument(level = "info", skip(self, docker_configs, peers, progress), fields(namespace = %self.options.namespace))]
    pub async fn pull_from(
        &self,
        image: &str,
        docker_configs: &[String],
        peers: Option<Arc<peers::Peers>>,
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
        let reference = parse_reference(image)?;
        let name = reference.whole();
        // The node's turn: images past its limit wait here, before any request.
        let _turn = match &self.image_turns {
            Some(turns) => {
                if turns.available_permits() == 0 {
                    tracing::info!(image = %name, "waiting for a turn: the node pulls at most {} images at once", self.options.max_parallel_images.unwrap_or(0));
                }
                Some(
                    turns
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|_| PullError::Image {
                            image: name.clone(),
                            detail: "the pull engine is shutting down".to_owned(),
                        })?,
                )
            }
            None => None,
        };
        let registry = Arc::new(resolve::registry(
            &reference,
            docker_configs,
            &self.options,
            &self.shared.clients,
        )?);

        let mut store = Store::new(self.containerd.clone(), &self.options.namespace)
            .writing_into(self.direct_content().await);
        if let Err(error) = store.reap_stale_leases().await {
            tracing::warn!(%error, "could not look for leases of interrupted pulls");
        }
        match fetch::spool::reap_stale(&self.options.spool_dir) {
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
            .pull_with_lease(&name, &reference, registry, &store, peers, progress)
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

    /// The pipeline, under the pull's lease.
    async fn pull_with_lease(
        &self,
        name: &str,
        reference: &Reference,
        registry: Arc<Registry>,
        store: &Store,
        peers: Option<Arc<peers::Peers>>,
        progress: Arc<dyn Progress>,
    ) -> Result<PulledImage, PullError> {
        let manifests = resolve::manifests(
            &registry,
            reference,
            &self.options.platform,
            name,
            peers.as_deref(),
        )
        .await?;
        let layers = manifests.manifest.layers().clone();
        // Peers may fetch this image's blobs from here while they arrive.
        let _resolving = self.shared.arriving.as_ref().map(|arriving| {
            let mut blobs: std::collections::BTreeSet<String> =
                layers.iter().map(|l| l.digest().to_string()).collect();
            blobs.insert(manifests.top_digest().to_owned());
            blobs.insert(manifests.raw.digest.clone());
            blobs.insert(manifests.manifest.config().digest().to_string());
            arriving.resolving(name, manifests.top_digest(), blobs)
        });
        progress.event(ProgressEvent::Resolved {
            image: name.to_owned(),
            digest: manifests.top_digest().to_owned(),
            layers: layers
                .iter()
                .map(|l| (l.digest().to_string(), l.size()))
                .collect(),
        });
        let transfer = Transfer::new(
            name,
            reference,
            registry,
            store,
            progress.clone(),
            &self.shared,
            &self.options,
            peers.clone(),
        );
        let config = resolve::config(&transfer, &manifests, &self.options).await?;
        let chains = chain_ids(&config.diff_ids);
        // Before any layer is fetched: held until the pull ends, whatever its end.
        let _reservation = self.reserve_disk(name, store, &layers, &chains).await?;
        let bytes_downloaded = layers::fetch_and_stack(
            &transfer,
            &self.options.snapshotter,
            &layers,
            &config.diff_ids,
            &chains,
        )
        .await?;
        let target = record::record(
            &transfer,
            reference,
            &manifests,
            &config,
            &chains,
            &self.options.snapshotter,
            &self.options.namespace,
        )
        .await?;
        progress.event(ProgressEvent::Done {
            image: name.to_owned(),
        });
        Ok(PulledImage {
            name: name.to_owned(),
            digest: target.digest,
            config_digest: config.descriptor.digest().to_string(),
            layers: layers.len(),
            bytes_downloaded,
            bytes_from_peers: peers.as_ref().map_or(0, |p| p.received()),
            suspected_peers: peers.as_ref().map(|p| p.suspects()).unwrap_or_default(),
        })
    }

    /// containerd's content root for direct writes, when enabled and this process sees
    /// it as containerd does (looked for once; a failure says why, once).
    async fn direct_content(&self) -> Option<Arc<store::direct::DirectContent>> {
        if !self.options.write_content_directly {
            return None;
        }
        // Only success is kept: containerd not answering now, or a content root not
        // there yet, is looked at again by the next pull.
        let content = self
            .direct
            .get_or_try_init(|| async {
                let root = match self.containerd.content_root().await {
                    Ok(Some(root)) => root,
                    Ok(None) => return Err(()),
                    Err(status) => {
                        tracing::debug!(error = %status.message(), "containerd's content root unknown: blobs go through Content.Write");
                        return Err(());
                    }
                };
                let opening = root.clone();
                match tokio::task::spawn_blocking(move || store::direct::DirectContent::open(&opening)).await {
                    Ok(Ok(content)) => Ok(Arc::new(content)),
                    Ok(Err(error)) => {
                        tracing::info!(root = %root.display(), %error, "cannot write blobs into containerd's content store: they go through Content.Write");
                        Err(())
                    }
                    Err(_) => Err(()),
                }
            })
            .await
            .ok()?
            .clone();
        // Files killed pulls left go after a day, whatever the agent's uptime.
        let sweeping = content.clone();
        let _ = tokio::task::spawn_blocking(move || {
            sweeping.remove_stale(std::time::SystemTime::now());
        })
        .await;
        Some(content)
    }

    /// The filesystems containerd keeps this engine's images on (its content store's and
    /// its snapshotter's, once each), with how full each is as kubelet counts it (used ÷
    /// size). Empty when containerd does not say where they are or they cannot be seen.
    pub async fn image_filesystems(&self) -> Vec<(std::path::PathBuf, f64)> {
        let mut roots = Vec::new();
        if let Ok(Some(root)) = self.containerd.content_root().await {
            roots.push(root);
        }
        if let Ok(Some(root)) = self
            .containerd
            .snapshotter_root(&self.options.snapshotter)
            .await
        {
            roots.push(root);
        }
        // stat and statvfs block (a hung filesystem would hold a runtime thread).
        tokio::task::spawn_blocking(move || disk_guard::used_ratios(&roots))
            .await
            .unwrap_or_default()
    }

    /// The disk guard's threshold (percent), when the engine is guarded.
    pub fn image_fs_threshold_percent(&self) -> Option<u8> {
        self.options.image_fs_threshold_percent
    }

    /// What the image still needs on disk, reserved, or the disk guard's refusal: each
    /// layer blob not in the content store, and each layer not unpacked yet at
    /// [`disk_guard::INFLATE_ESTIMATE`] times its compressed size.
    async fn reserve_disk(
        &self,
        name: &str,
        store: &Store,
        layers: &[oci_spec::image::Descriptor],
        chains: &[String],
    ) -> Result<Option<disk_guard::Reservation>, PullError> {
        let Some(guard) = &self.disk_guard else {
            return Ok(None);
        };
        let scope = store.scope();
        let (mut content, mut unpacked) = (0u64, 0u64);
        for (layer, chain) in layers.iter().zip(chains) {
            let size = layer.size();
            let digest = layer.digest().to_string();
            // Counted unless containerd says it holds it (an error counts it: the guard
            // errs on the side of the disk).
            if !matches!(
                self.containerd.content_info(scope, &digest).await,
                Ok(Some(_))
            ) {
                content = content.saturating_add(size);
            }
            if !self
                .containerd
                .snapshot_exists(scope, &self.options.snapshotter, chain)
                .await
                .unwrap_or(false)
            {
                let media_type = layer.media_type().to_string();
                let inflate = match media::layer_compression(&media_type) {
                    Ok(media::Compression::None) => 1,
                    _ => disk_guard::INFLATE_ESTIMATE,
                };
                unpacked = unpacked.saturating_add(size.saturating_mul(inflate));
            }
        }
        let mut needs = Vec::new();
        if let Ok(Some(root)) = self.containerd.content_root().await {
            needs.push((root, content));
        }
        if let Ok(Some(root)) = self
            .containerd
            .snapshotter_root(&self.options.snapshotter)
            .await
        {
            needs.push((root, unpacked));
        }
        guard
            .reserve(&needs)
            .map(Some)
            .map_err(|source| PullError::DiskGuard {
                image: name.to_owned(),
                source,
            })
    }
}
