//! The containerd side of the inventory: namespaces, images, plain containers, root dir.

use oci_spec::image::{ImageIndex, ImageManifest};

use rigger_proto::time::rfc3339_from_timestamp;

use super::{ContainerInfo, ImageInfo};
use rigger_runtime::{CallError, Runtime};

/// Manifests and indexes bigger than this are not ours to parse for a size column.
const MAX_MANIFEST_BYTES: i64 = 4 << 20;

pub(super) async fn namespaces(runtime: &Runtime) -> Result<Vec<String>, CallError> {
    runtime.namespaces().await
}

/// Image records of `namespaces`, with sizes where the content store has the blobs.
pub(super) async fn images(
    runtime: &Runtime,
    namespaces: &[String],
) -> Result<(Vec<ImageInfo>, Vec<String>), CallError> {
    let mut images = Vec::new();
    let mut warnings = Vec::new();
    for namespace in namespaces {
        let (records, targetless) = runtime.image_records(namespace).await?;
        warnings.extend(
            targetless
                .into_iter()
                .map(|name| format!("image {name} in {namespace} has no target")),
        );
        for record in records {
            let size = match image_size(
                runtime,
                namespace,
                &record.media_type,
                &record.digest,
                record.size,
            )
            .await
            {
                Ok(size) => Some(size),
                Err(reason) => {
                    tracing::debug!(image = %record.name, %reason, "image size unknown");
                    None
                }
            };
            images.push(ImageInfo {
                namespace: namespace.clone(),
                name: record.name,
                digest: record.digest,
                media_type: record.media_type,
                size,
            });
        }
    }
    images.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok((images, warnings))
}

/// Size as `ctr images ls` computes it: the manifest for this host's platform plus its
/// config and layers (and the index, when the image points at one).
async fn image_size(
    runtime: &Runtime,
    namespace: &str,
    media_type: &str,
    digest: &str,
    size: i64,
) -> Result<u64, String> {
    let own = u64::try_from(size).map_err(|_| format!("negative size for {digest}"))?;
    if is_index(media_type) {
        let blob = read_blob(runtime, namespace, digest, size).await?;
        let index: ImageIndex =
            serde_json::from_slice(&blob).map_err(|e| format!("index {digest}: {e}"))?;
        let chosen = index
            .manifests()
            .iter()
            .find(|m| {
                m.platform().as_ref().is_some_and(|p| {
                    p.os().to_string() == "linux" && p.architecture().to_string() == host_arch()
                })
            })
            .ok_or_else(|| format!("index {digest} has no manifest for linux/{}", host_arch()))?;
        let inner = Box::pin(manifest_size(
            runtime,
            namespace,
            chosen.digest().as_ref(),
            i64::try_from(chosen.size()).unwrap_or(i64::MAX),
        ))
        .await?;
        Ok(own + inner)
    } else {
        manifest_size(runtime, namespace, digest, size).await
    }
}

async fn manifest_size(
    runtime: &Runtime,
    namespace: &str,
    digest: &str,
    size: i64,
) -> Result<u64, String> {
    let blob = read_blob(runtime, namespace, digest, size).await?;
    let manifest: ImageManifest =
        serde_json::from_slice(&blob).map_err(|e| format!("manifest {digest}: {e}"))?;
    let parts = manifest.config().size() + manifest.layers().iter().map(|l| l.size()).sum::<u64>();
    Ok(blob.len() as u64 + parts)
}

fn is_index(media_type: &str) -> bool {
    media_type == "application/vnd.oci.image.index.v1+json"
        || media_type == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// GOARCH-style name of this machine's architecture, as image platforms spell it.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

async fn read_blob(
    runtime: &Runtime,
    namespace: &str,
    digest: &str,
    size: i64,
) -> Result<Vec<u8>, String> {
    if size > MAX_MANIFEST_BYTES {
        return Err(format!("{digest} is {size} bytes, too big for a manifest"));
    }
    runtime
        .read_small(namespace, digest, MAX_MANIFEST_BYTES.unsigned_abs())
        .await
}

/// containerd containers (not only CRI's) with the state of their task.
pub(super) async fn containers(
    runtime: &Runtime,
    namespaces: &[String],
) -> Result<Vec<ContainerInfo>, CallError> {
    let mut found = Vec::new();
    for namespace in namespaces {
        for container in runtime.container_records(namespace).await? {
            found.push(ContainerInfo {
                namespace: namespace.clone(),
                pod_sandbox_id: None,
                pod_namespace: None,
                pod_name: None,
                name: container.id.clone(),
                image: container.image,
                state: container.task_state,
                attempt: 0,
                restart_count: 0,
                created_at: rfc3339_from_timestamp(container.created_at.as_ref()),
                // containerd's task API does not record when a task started.
                started_at: None,
                id: container.id,
            });
        }
    }
    Ok(found)
}

/// containerd's root directory: the parent of its content store's root.
pub(super) async fn root_dir(runtime: &Runtime) -> Result<Option<String>, CallError> {
    Ok(runtime
        .content_root()
        .await?
        .as_deref()
        .and_then(std::path::Path::parent)
        .map(|p| p.display().to_string()))
}
