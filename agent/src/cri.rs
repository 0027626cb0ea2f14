//! The CRI runtime service as the agent's container operations use it: the handful of
//! calls a recreate and a handler make ([`Cri`]), implemented by the CRI
//! client and, in unit tests, by a fake that plays kubelet and containerd.
//!
//! Errors are one-line causes naming the call, ready to be a request's message.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    Container, ContainerFilter, ContainerStatus, ContainerStatusRequest, ExecSyncRequest,
    ListContainersRequest, ListPodSandboxRequest, PodSandbox, PodSandboxFilter,
    PodSandboxStatusRequest, StopContainerRequest,
};
use tonic::transport::Channel;

use rigger_runtime::Connection;

/// What the agent's container operations ask of the runtime.
pub trait Cri: Send + Sync {
    /// The sandboxes whose label `label` is `value`.
    fn sandboxes(
        &self,
        label: &str,
        value: &str,
    ) -> impl Future<Output = Result<Vec<PodSandbox>, String>> + Send;

    /// The containers with all of `labels`, in `sandbox` ("" = any sandbox).
    fn containers(
        &self,
        sandbox: &str,
        labels: HashMap<String, String>,
    ) -> impl Future<Output = Result<Vec<Container>, String>> + Send;

    /// Container `id`'s status (`None` when the runtime has none to give).
    fn status_of(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<ContainerStatus>, String>> + Send;

    /// Stop container `id`: SIGTERM, SIGKILL after `timeout_seconds` (0: at once).
    fn stop(
        &self,
        id: &str,
        timeout_seconds: u64,
    ) -> impl Future<Output = Result<(), String>> + Send;

    /// The IP of sandbox `id`'s own network (the pod IP kubelet reports); `None` when it
    /// has none (on the host's network).
    fn sandbox_ip(&self, id: &str) -> impl Future<Output = Result<Option<String>, String>> + Send;

    /// Run `command` in container `id`, bounded by `timeout`; its exit code.
    fn exec(
        &self,
        id: &str,
        command: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<i32, String>> + Send;
}

/// A CRI client on the node's containerd connection.
pub async fn connect(connection: &Connection) -> Result<RuntimeServiceClient<Channel>, String> {
    connection
        .channel()
        .await
        .map(|channel| {
            RuntimeServiceClient::new(channel)
                .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE)
        })
        .map_err(|status| status.message().to_owned())
}

/// The newest attempt among `containers` (highest attempt, then latest created).
pub fn newest(containers: Vec<Container>) -> Option<Container> {
    containers
        .into_iter()
        .max_by_key(|c| (c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at))
}

// The client is a cheap handle on one channel: each call clones it, so the trait's
// methods take `&self`. (Distinct method names keep the client's own calls unambiguous.)
impl Cri for RuntimeServiceClient<Channel> {
    async fn sandboxes(&self, label: &str, value: &str) -> Result<Vec<PodSandbox>, String> {
        let request = ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: HashMap::from([(label.to_owned(), value.to_owned())]),
                ..PodSandboxFilter::default()
            }),
        };
        Ok(self
            .clone()
            .list_pod_sandbox(request)
            .await
            .map_err(|s| format!("listing pod sandboxes: {}", s.message()))?
            .into_inner()
            .items)
    }

    async fn containers(
        &self,
        sandbox: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Container>, String> {
        let request = ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: sandbox.to_owned(),
                label_selector: labels,
                ..ContainerFilter::default()
            }),
        };
        Ok(self
            .clone()
            .list_containers(request)
            .await
            .map_err(|s| format!("listing containers: {}", s.message()))?
            .into_inner()
            .containers)
    }

    async fn status_of(&self, id: &str) -> Result<Option<ContainerStatus>, String> {
        let request = ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        Ok(self
            .clone()
            .container_status(request)
            .await
            .map_err(|s| format!("status of container {id}: {}", s.message()))?
            .into_inner()
            .status)
    }

    async fn stop(&self, id: &str, timeout_seconds: u64) -> Result<(), String> {
        let request = StopContainerRequest {
            container_id: id.to_owned(),
            timeout: i64::try_from(timeout_seconds).unwrap_or(i64::MAX),
        };
        self.clone()
            .stop_container(request)
            .await
            .map_err(|s| format!("stopping container {id}: {}", s.message()))?;
        Ok(())
    }

    async fn sandbox_ip(&self, id: &str) -> Result<Option<String>, String> {
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: false,
        };
        Ok(self
            .clone()
            .pod_sandbox_status(request)
            .await
            .map_err(|s| format!("status of pod sandbox {id}: {}", s.message()))?
            .into_inner()
            .status
            .and_then(|status| status.network)
            .map(|network| network.ip)
            .filter(|ip| !ip.is_empty()))
    }

    async fn exec(&self, id: &str, command: &[String], timeout: Duration) -> Result<i32, String> {
        let request = ExecSyncRequest {
            container_id: id.to_owned(),
            cmd: command.to_vec(),
            timeout: i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX),
        };
        Ok(self
            .clone()
            .exec_sync(request)
            .await
            .map_err(|s| format!("exec failed: {}", s.message()))?
            .into_inner()
            .exit_code)
    }
}
