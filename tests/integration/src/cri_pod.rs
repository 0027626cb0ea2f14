//! Playing kubelet's part over the real CRI API of a lab node.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::lab::{Lab, LabNode};

/// Playing kubelet's part over the real CRI API (kubelet cannot run here): a host-network
/// pod sandbox with one container, removed when dropped.
#[derive(Debug)]
pub struct CriPod {
    pub sandbox_id: String,
    pub container_id: String,
    spec: CriPodSpec,
    sandbox_config: k8s_cri::v1::PodSandboxConfig,
    runtime: tokio::runtime::Runtime,
    client: k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
}

/// What a test pod looks like; `CriPodSpec::new` fills the usual values.
#[derive(Debug, Clone, Default)]
pub struct CriPodSpec {
    /// The socket of the containerd whose CRI runs the pod (a lab node's).
    pub containerd: PathBuf,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// Labels of the sandbox and its container (kubelet puts its own here).
    pub labels: HashMap<String, String>,
    pub container: String,
    pub container_labels: HashMap<String, String>,
    pub container_annotations: HashMap<String, String>,
    pub attempt: u32,
    pub image: String,
    pub command: Vec<String>,
    /// Bind mounts: (host path, container path).
    pub mounts: Vec<(PathBuf, String)>,
}

impl CriPodSpec {
    /// A pod on the lab's first node.
    pub fn new(name: &str, image: &str, command: &[&str]) -> Self {
        Self::on(Lab::get().first_node(), name, image, command)
    }

    /// A pod on `node`.
    pub fn on(node: &LabNode, name: &str, image: &str, command: &[&str]) -> Self {
        Self {
            containerd: node.address.clone(),
            name: name.to_owned(),
            namespace: "itest".to_owned(),
            uid: format!("{name}-{}", std::process::id()),
            container: "main".to_owned(),
            image: image.to_owned(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            ..Self::default()
        }
    }
}

impl CriPod {
    /// Run `command` from `image` on `node` (the image must already be pulled: this
    /// never pulls it).
    pub fn run_on(node: &LabNode, name: &str, image: &str, command: &[&str]) -> Self {
        Self::run_spec(&CriPodSpec::on(node, name, image, command))
    }

    /// Run the pod `spec` describes (its image must already be pulled).
    pub fn run_spec(spec: &CriPodSpec) -> Self {
        use k8s_cri::v1::*;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut client = runtime.block_on(async {
            let rt = rigger_runtime::Runtime::connect(
                &spec.containerd,
                rigger_runtime::DEFAULT_CONNECT_TIMEOUT,
            )
            .await
            .unwrap();
            runtime_service_client::RuntimeServiceClient::new(rt.channel())
        });
        let sandbox_config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            // No CNI here: host network, and no hostname (runc cannot set one without a
            // UTS namespace).
            hostname: String::new(),
            labels: spec.labels.clone(),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (sandbox_id, container_id) = runtime.block_on(async {
            let sandbox_id = client
                .run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(sandbox_config.clone()),
                    runtime_handler: String::new(),
                })
                .await
                .unwrap()
                .into_inner()
                .pod_sandbox_id;
            let container_id = Box::pin(Self::start_container(
                &mut client,
                &sandbox_id,
                &sandbox_config,
                spec,
            ))
            .await;
            (sandbox_id, container_id)
        });
        Self {
            sandbox_id,
            container_id,
            spec: spec.clone(),
            sandbox_config,
            runtime,
            client,
        }
    }

    async fn start_container(
        client: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<
            tonic::transport::Channel,
        >,
        sandbox_id: &str,
        sandbox_config: &k8s_cri::v1::PodSandboxConfig,
        spec: &CriPodSpec,
    ) -> String {
        use k8s_cri::v1::*;
        let container_id = client
            .create_container(CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
                config: Some(ContainerConfig {
                    metadata: Some(ContainerMetadata {
                        name: spec.container.clone(),
                        attempt: spec.attempt,
                    }),
                    image: Some(ImageSpec {
                        image: spec.image.clone(),
                        ..Default::default()
                    }),
                    command: spec.command.clone(),
                    labels: spec.container_labels.clone(),
                    annotations: spec.container_annotations.clone(),
                    mounts: spec
                        .mounts
                        .iter()
                        .map(|(host, path)| Mount {
                            container_path: path.clone(),
                            host_path: host.display().to_string(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }),
                sandbox_config: Some(sandbox_config.clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .container_id;
        client
            .start_container(StartContainerRequest {
                container_id: container_id.clone(),
            })
            .await
            .unwrap();
        container_id
    }

    /// One turn of kubelet's restart loop: when the container has exited, start its next
    /// attempt (restart count annotation included) and return the new container's id.
    pub fn restart_if_exited(&mut self) -> Option<String> {
        if self.container_state() != "CONTAINER_EXITED" {
            return None;
        }
        self.spec.attempt += 1;
        self.spec.container_annotations.insert(
            "io.kubernetes.container.restartCount".to_owned(),
            self.spec.attempt.to_string(),
        );
        let id = self.runtime.block_on(Box::pin(Self::start_container(
            &mut self.client,
            &self.sandbox_id,
            &self.sandbox_config,
            &self.spec,
        )));
        self.container_id = id.clone();
        Some(id)
    }

    /// Start one more container, `name`, in the pod's sandbox, as the first one was
    /// started (kubelet's labels naming it): its id. Only the first container is
    /// restarted by [`CriPod::restart_if_exited`].
    pub fn add_container(&mut self, name: &str) -> String {
        let mut spec = self.spec.clone();
        spec.container = name.to_owned();
        spec.attempt = 0;
        spec.container_labels
            .insert("io.kubernetes.container.name".to_owned(), name.to_owned());
        spec.container_annotations.insert(
            "io.kubernetes.container.restartCount".to_owned(),
            "0".to_owned(),
        );
        self.runtime.block_on(Box::pin(Self::start_container(
            &mut self.client,
            &self.sandbox_id,
            &self.sandbox_config,
            &spec,
        )))
    }

    /// The container's CRI state name, e.g. `CONTAINER_RUNNING`.
    pub fn container_state(&mut self) -> String {
        let id = self.container_id.clone();
        let status = self
            .runtime
            .block_on(
                self.client
                    .container_status(k8s_cri::v1::ContainerStatusRequest {
                        container_id: id,
                        verbose: false,
                    }),
            )
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        k8s_cri::v1::ContainerState::try_from(status.state)
            .unwrap()
            .as_str_name()
            .to_owned()
    }
}

impl Drop for CriPod {
    fn drop(&mut self) {
        let id = self.sandbox_id.clone();
        self.runtime.block_on(remove_sandbox(&mut self.client, id));
    }
}

/// Stop sandbox `id` and remove it with its containers; best effort.
pub(crate) async fn remove_sandbox(
    cri: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    id: String,
) {
    let _ = cri
        .stop_pod_sandbox(k8s_cri::v1::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await;
    let _ = cri
        .remove_pod_sandbox(k8s_cri::v1::RemovePodSandboxRequest { pod_sandbox_id: id })
        .await;
}
