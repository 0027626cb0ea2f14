//! How to pull: the engine's options and their defaults.

use std::path::PathBuf;
use std::time::Duration;

use rigger_runtime::CRI_NAMESPACE;

use crate::media::Platform;
use crate::registry::{self, hosts};

/// Where ranges wait for containerd's ingest by default (the agent's state directory).
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/rigger/spool";
/// Blobs bigger than twice this are fetched as parallel byte ranges of this size (one
/// request covers several later in a blob: `fetch::ranges`).
pub const DEFAULT_CHUNK_SIZE: u64 = 2 << 20;
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
    /// Where ranges wait for containerd's ingest (the fetch stage's spool).
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
    /// Images pulled at once by the engine (kubelet's `maxParallelImagePulls`); others
    /// wait their turn. `None`: no limit.
    pub max_parallel_images: Option<usize>,
    /// The disk guard's threshold (percent of the image filesystem used); `None`: off.
    pub image_fs_threshold_percent: Option<u8>,
    /// Write big blobs straight into containerd's content store (then committed through
    /// its API) when this process sees it: `Content.Write` is most of containerd's CPU
    /// in a pull. Off: every byte goes through `Content.Write`.
    pub write_content_directly: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            namespace: CRI_NAMESPACE.to_owned(),
            snapshotter: "overlayfs".to_owned(),
            platform: Platform::host(),
            hosts_dir: PathBuf::from(hosts::DEFAULT_HOSTS_DIR),
            spool_dir: PathBuf::from(DEFAULT_SPOOL_DIR),
            plain_http: false,
            docker_config: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            chunk_size: DEFAULT_CHUNK_SIZE,
            limit_rate: None,
            stall_timeout: registry::DEFAULT_STALL_TIMEOUT,
            attempts: 5,
            max_document_size: registry::DEFAULT_MAX_DOCUMENT_SIZE,
            max_parallel_images: None,
            image_fs_threshold_percent: Some(crate::disk_guard::DEFAULT_THRESHOLD_PERCENT),
            write_content_directly: true,
        }
    }
}
