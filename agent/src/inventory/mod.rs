//! The node inventory: what containerd, CRI and the host report about this node.
//!
//! Collection is best effort past the first contact: if containerd answers but CRI is
//! disabled, or one image's manifest is missing, the rest is still reported and the gap
//! is listed in `warnings`.

mod containerd;
mod cri;
mod host;

use serde::Serialize;

use rigger_runtime::{CallError, ContainerdVersion, Runtime};

pub use host::{disk_usage, host_info};

/// What `rigger-agent status` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// RFC 3339 time the inventory was collected.
    pub collected_at: String,
    pub runtime: RuntimeInfo,
    pub host: HostInfo,
    pub images: Vec<ImageInfo>,
    pub pods: Vec<PodInfo>,
    pub containers: Vec<ContainerInfo>,
    /// Parts that could not be read; everything else is still valid.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RuntimeInfo {
    pub address: String,
    pub containerd: ContainerdVersion,
    /// `None` when CRI is not served on the socket (the reason is in `warnings`).
    pub cri: Option<CriVersion>,
    /// containerd's root directory, as its content plugin reports it.
    pub root_dir: Option<String>,
    /// Bytes allocated under `root_dir` (content, snapshots, metadata).
    pub root_bytes_used: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CriVersion {
    pub runtime_name: String,
    pub runtime_version: String,
    pub api_version: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    pub namespace: String,
    pub name: String,
    /// Digest of the manifest or index the image record points at.
    pub digest: String,
    pub media_type: String,
    /// Compressed bytes of this platform's manifest, config and layers (`ctr images ls`'s
    /// SIZE); `None` when some of that content is not in the store.
    pub size: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PodInfo {
    pub id: String,
    /// Who runs the pod: kubelet, Rigger's agent, or neither (the agent never starts,
    /// stops or restarts a pod it does not own).
    pub owner: PodOwner,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub state: String,
    pub attempt: u32,
    pub created_at: Option<String>,
    /// The sandbox's CRI labels: kubelet copies the pod's labels here.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodOwner {
    /// kubelet's labels (`io.kubernetes.pod.uid`).
    Kubelet,
    /// Rigger's labels (`rigger.dev/pod-uid`): an agent-managed pod.
    Rigger,
    /// Created by something else through CRI.
    Unknown,
}

impl PodOwner {
    pub fn of(labels: &std::collections::HashMap<String, String>) -> Self {
        if labels.contains_key(crate::labels::POD_UID) {
            Self::Rigger
        } else if labels.contains_key(crate::labels::KUBELET_POD_UID) {
            Self::Kubelet
        } else {
            Self::Unknown
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubelet => "kubelet",
            Self::Rigger => "rigger",
            Self::Unknown => "unknown",
        }
    }
}

/// A container: a CRI container (with its pod) or a plain containerd container.
#[derive(Debug, Clone, Serialize)]
pub struct ContainerInfo {
    pub id: String,
    /// The containerd namespace the container lives in.
    pub namespace: String,
    pub pod_sandbox_id: Option<String>,
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub name: String,
    pub image: String,
    pub state: String,
    pub attempt: u32,
    /// kubelet's restart count where kubelet recorded one, otherwise the CRI attempt.
    pub restart_count: u32,
    pub created_at: Option<String>,
    pub started_at: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct HostInfo {
    pub hostname: Option<String>,
    pub kernel_version: Option<String>,
    pub cpus: usize,
    pub load_average: [f64; 3],
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    /// The filesystem holding containerd's root (or `/` when the root is unknown).
    pub filesystem: Option<FilesystemInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FilesystemInfo {
    pub mount_point: String,
    pub fs_type: String,
    pub total_bytes: u64,
    pub available_bytes: u64,
}

/// What to collect.
#[derive(Debug, Clone, Default)]
pub struct InventoryOptions {
    /// Only this containerd namespace; `None` for all of them.
    pub namespace: Option<String>,
    /// Skip walking containerd's root to measure it (it can take a while on big nodes).
    pub skip_disk_usage: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("containerd namespace {0:?} does not exist")]
    UnknownNamespace(String),
}

/// Collect the inventory of the node `runtime` is connected to.
#[tracing::instrument(level = "debug", skip_all, fields(address = %runtime.address().display()))]
pub async fn collect(
    runtime: &Runtime,
    options: &InventoryOptions,
) -> Result<Inventory, InventoryError> {
    let mut warnings = Vec::new();
    let all_namespaces = containerd::namespaces(runtime).await?;
    let namespaces = match &options.namespace {
        Some(ns) if all_namespaces.contains(ns) => vec![ns.clone()],
        Some(ns) => return Err(InventoryError::UnknownNamespace(ns.clone())),
        None => all_namespaces,
    };

    let (images, native_containers, root_dir, cri) = tokio::join!(
        containerd::images(runtime, &namespaces),
        containerd::containers(runtime, &namespaces),
        containerd::root_dir(runtime),
        cri::collect(runtime, &namespaces),
    );
    let (images, image_warnings) = images?;
    warnings.extend(image_warnings);
    let native_containers = native_containers?;

    let (cri_version, pods, mut containers) = match cri {
        Ok(found) => (Some(found.version), found.pods, found.containers),
        Err(reason) => {
            warnings.push(format!("CRI: {reason}"));
            (None, Vec::new(), Vec::new())
        }
    };
    // CRI's sandboxes and containers are containerd containers in k8s.io too: list
    // only the ones CRI does not know, so nothing appears twice.
    let known: std::collections::HashSet<&str> = pods
        .iter()
        .map(|p| p.id.as_str())
        .chain(containers.iter().map(|c| c.id.as_str()))
        .collect();
    let native: Vec<ContainerInfo> = native_containers
        .into_iter()
        .filter(|c| !known.contains(c.id.as_str()))
        .collect();
    containers.extend(native);

    let root_dir = match root_dir {
        Ok(dir) => dir,
        Err(e) => {
            warnings.push(format!("containerd root: {e}"));
            None
        }
    };
    let root_bytes_used = match (&root_dir, options.skip_disk_usage) {
        (Some(dir), false) => {
            let dir = std::path::PathBuf::from(dir);
            match tokio::task::spawn_blocking(move || disk_usage(&dir)).await {
                Ok(Ok(bytes)) => Some(bytes),
                Ok(Err(e)) => {
                    warnings.push(format!("disk usage of containerd root: {e}"));
                    None
                }
                Err(e) => {
                    warnings.push(format!("disk usage of containerd root: {e}"));
                    None
                }
            }
        }
        _ => None,
    };
    let host = {
        let root = root_dir.clone();
        tokio::task::spawn_blocking(move || host_info(root.as_deref().map(std::path::Path::new)))
            .await
            .map_err(|e| {
                warnings.push(format!("host information: {e}"));
            })
            .ok()
    };
    let host = host.unwrap_or_default();

    Ok(Inventory {
        collected_at: rigger_proto::time::now_rfc3339(),
        runtime: RuntimeInfo {
            address: runtime.address().display().to_string(),
            containerd: runtime.version().clone(),
            cri: cri_version,
            root_dir,
            root_bytes_used,
        },
        host,
        images,
        pods,
        containers,
        warnings,
    })
}

/// The latest inventory, shared by the refresher, the HTTP endpoint and the link.
pub type SharedInventory = std::sync::Arc<tokio::sync::RwLock<Option<Inventory>>>;
