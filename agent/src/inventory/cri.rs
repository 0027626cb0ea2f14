//! The CRI side of the inventory: runtime version, pod sandboxes and their containers.
//!
//! Names come from kubelet's labels on the CRI objects where present (that is how kubelet
//! itself finds them again), otherwise from the CRI metadata.

use std::collections::HashMap;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerState, ContainerStatusRequest, ListContainersRequest, ListPodSandboxRequest,
    PodSandboxState, VersionRequest,
};
use tonic::Request;
use tonic::transport::Channel;

use rigger_proto::time::rfc3339_from_nanos;

use super::{ContainerInfo, CriVersion, PodInfo};
use rigger_runtime::{CRI_NAMESPACE, Runtime, describe_status};

const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
const LABEL_POD_UID: &str = crate::labels::KUBELET_POD_UID;
const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";

pub(super) struct CriInventory {
    pub version: CriVersion,
    pub pods: Vec<PodInfo>,
    pub containers: Vec<ContainerInfo>,
}

/// CRI's view; `Err` carries a one-line reason when CRI cannot be used.
pub(super) async fn collect(
    runtime: &Runtime,
    namespaces: &[String],
) -> Result<CriInventory, String> {
    let mut client = RuntimeServiceClient::new(runtime.channel())
        .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE);
    let version = client
        .version(Request::new(VersionRequest {
            version: String::new(),
        }))
        .await
        .map_err(|s| format!("runtime version: {}", describe_status(&s)))?
        .into_inner();
    let version = CriVersion {
        runtime_name: version.runtime_name,
        runtime_version: version.runtime_version,
        api_version: version.runtime_api_version,
    };
    // CRI objects all live in containerd's k8s.io namespace.
    if !namespaces.iter().any(|n| n == CRI_NAMESPACE) {
        return Ok(CriInventory {
            version,
            pods: Vec::new(),
            containers: Vec::new(),
        });
    }

    let sandboxes = client
        .list_pod_sandbox(Request::new(ListPodSandboxRequest { filter: None }))
        .await
        .map_err(|s| format!("list pod sandboxes: {}", describe_status(&s)))?
        .into_inner()
        .items;
    let mut pods: Vec<PodInfo> = sandboxes
        .into_iter()
        .map(|s| {
            let meta = s.metadata.unwrap_or_default();
            PodInfo {
                owner: super::PodOwner::of(&s.labels),
                namespace: label_or(&s.labels, LABEL_POD_NAMESPACE, meta.namespace),
                name: label_or(&s.labels, LABEL_POD_NAME, meta.name),
                uid: label_or(&s.labels, LABEL_POD_UID, meta.uid),
                state: PodSandboxState::try_from(s.state)
                    .map(|st| match st {
                        PodSandboxState::SandboxReady => "ready",
                        PodSandboxState::SandboxNotready => "notready",
                    })
                    .unwrap_or("unknown")
                    .to_owned(),
                attempt: meta.attempt,
                created_at: rfc3339_from_nanos(s.created_at),
                labels: s.labels.clone().into_iter().collect(),
                id: s.id,
            }
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name, &a.id).cmp(&(&b.namespace, &b.name, &b.id)));

    let listed = client
        .list_containers(Request::new(ListContainersRequest { filter: None }))
        .await
        .map_err(|s| format!("list containers: {}", describe_status(&s)))?
        .into_inner()
        .containers;
    let pods_by_id: HashMap<&str, &PodInfo> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
    let mut containers = Vec::with_capacity(listed.len());
    for c in listed {
        let meta = c.metadata.clone().unwrap_or_default();
        let pod = pods_by_id.get(c.pod_sandbox_id.as_str());
        let started_at = started_at(&mut client, &c.id).await;
        let restart_count = c
            .annotations
            .get(ANNOTATION_RESTART_COUNT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(meta.attempt);
        containers.push(ContainerInfo {
            namespace: CRI_NAMESPACE.to_owned(),
            pod_sandbox_id: Some(c.pod_sandbox_id.clone()),
            pod_namespace: c
                .labels
                .get(LABEL_POD_NAMESPACE)
                .cloned()
                .or_else(|| pod.map(|p| p.namespace.clone())),
            pod_name: c
                .labels
                .get(LABEL_POD_NAME)
                .cloned()
                .or_else(|| pod.map(|p| p.name.clone())),
            name: label_or(&c.labels, LABEL_CONTAINER_NAME, meta.name),
            image: c
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| c.image_ref.clone()),
            state: ContainerState::try_from(c.state)
                .map(|st| match st {
                    ContainerState::ContainerCreated => "created",
                    ContainerState::ContainerRunning => "running",
                    ContainerState::ContainerExited => "exited",
                    ContainerState::ContainerUnknown => "unknown",
                })
                .unwrap_or("unknown")
                .to_owned(),
            attempt: meta.attempt,
            restart_count,
            created_at: rfc3339_from_nanos(c.created_at),
            started_at,
            id: c.id,
        });
    }
    containers.sort_by(|a, b| {
        (&a.pod_namespace, &a.pod_name, &a.name, a.attempt).cmp(&(
            &b.pod_namespace,
            &b.pod_name,
            &b.name,
            b.attempt,
        ))
    });
    Ok(CriInventory {
        version,
        pods,
        containers,
    })
}

/// ListContainers has no start time; ContainerStatus does. A container removed in
/// between simply has none.
async fn started_at(client: &mut RuntimeServiceClient<Channel>, id: &str) -> Option<String> {
    let status = client
        .container_status(Request::new(ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        }))
        .await
        .ok()?
        .into_inner()
        .status?;
    rfc3339_from_nanos(status.started_at)
}

fn label_or(labels: &HashMap<String, String>, key: &str, fallback: String) -> String {
    labels
        .get(key)
        .filter(|v| !v.is_empty())
        .cloned()
        .unwrap_or(fallback)
}
