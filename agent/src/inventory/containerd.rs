//! The containerd side of the inventory: namespaces, images, plain containers, root dir.

use containerd_client::services::v1::{
    Container, ListContainersRequest, ListImagesRequest, ListNamespacesRequest, ListTasksRequest,
    ReadContentRequest, containers_client::ContainersClient, content_client::ContentClient,
    images_client::ImagesClient, namespaces_client::NamespacesClient, tasks_client::TasksClient,
};
use containerd_client::types::v1::Status as TaskStatus;
use futures::StreamExt;
use oci_spec::image::{ImageIndex, ImageManifest};
use tonic::Request;

use rigger_proto::time::rfc3339_from_timestamp;

use super::{ContainerInfo, ImageInfo};
use rigger_runtime::{CallError, Runtime, describe_status, namespaced};

/// Manifests and indexes bigger than this are not ours to parse for a size column.
const MAX_MANIFEST_BYTES: i64 = 4 << 20;

pub(super) async fn namespaces(runtime: &Runtime) -> Result<Vec<String>, CallError> {
    let response = NamespacesClient::new(runtime.channel())
        .list(Request::new(ListNamespacesRequest::default()))
        .await
        .map_err(|s| CallError::new("list containerd namespaces", s))?;
    let mut names: Vec<String> = response
        .into_inner()
        .namespaces
        .into_iter()
        .map(|n| n.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Image records of `namespaces`, with sizes where the content store has the blobs.
pub(super) async fn images(
    runtime: &Runtime,
    namespaces: &[String],
) -> Result<(Vec<ImageInfo>, Vec<String>), CallError> {
    let mut images = Vec::new();
    let mut warnings = Vec::new();
    for namespace in namespaces {
        let request = namespaced(ListImagesRequest::default(), namespace)
            .map_err(|s| CallError::new("list images", s))?;
        let records = ImagesClient::new(runtime.channel())
            .list(request)
            .await
            .map_err(|s| CallError::new("list images", s))?
            .into_inner()
            .images;
        for record in records {
            let Some(target) = record.target else {
                warnings.push(format!(
                    "image {} in {namespace} has no target",
                    record.name
                ));
                continue;
            };
            let size = match image_size(
                runtime,
                namespace,
                &target.media_type,
                &target.digest,
                target.size,
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
                digest: target.digest,
                media_type: target.media_type,
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
    let request = namespaced(
        ReadContentRequest {
            digest: digest.to_owned(),
            offset: 0,
            size: 0,
        },
        namespace,
    )
    .map_err(|s| describe_status(&s))?;
    let mut stream = ContentClient::new(runtime.channel())
        .read(request)
        .await
        .map_err(|s| format!("read {digest}: {}", describe_status(&s)))?
        .into_inner();
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|s| format!("read {digest}: {}", describe_status(&s)))?;
        data.extend_from_slice(&chunk.data);
        if data.len() as i64 > MAX_MANIFEST_BYTES {
            return Err(format!("{digest} is bigger than a manifest may be"));
        }
    }
    Ok(data)
}

/// containerd containers (not only CRI's) with the state of their task.
pub(super) async fn containers(
    runtime: &Runtime,
    namespaces: &[String],
) -> Result<Vec<ContainerInfo>, CallError> {
    let mut found = Vec::new();
    for namespace in namespaces {
        let request = namespaced(ListContainersRequest::default(), namespace)
            .map_err(|s| CallError::new("list containers", s))?;
        let containers: Vec<Container> = ContainersClient::new(runtime.channel())
            .list(request)
            .await
            .map_err(|s| CallError::new("list containers", s))?
            .into_inner()
            .containers;
        if containers.is_empty() {
            continue;
        }
        let request = namespaced(ListTasksRequest::default(), namespace)
            .map_err(|s| CallError::new("list tasks", s))?;
        let tasks = TasksClient::new(runtime.channel())
            .list(request)
            .await
            .map_err(|s| CallError::new("list tasks", s))?
            .into_inner()
            .tasks;
        for container in containers {
            let task = tasks.iter().find(|t| t.id == container.id);
            let state = match task {
                None => "no task".to_owned(),
                Some(t) => TaskStatus::try_from(t.status)
                    .map(|s| s.as_str_name().to_ascii_lowercase())
                    .unwrap_or_else(|_| "unknown".to_owned()),
            };
            found.push(ContainerInfo {
                namespace: namespace.clone(),
                pod_sandbox_id: None,
                pod_namespace: None,
                pod_name: None,
                name: container.id.clone(),
                image: container.image,
                state,
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
