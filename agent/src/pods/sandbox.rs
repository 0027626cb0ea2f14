//! A pod's sandbox: created (host network, Rigger's labels, the creation recorded
//! first), its CRI config, and removal of pods no longer placed here (grace period).

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerState, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StopContainerRequest, StopPodSandboxRequest,
};
use rigger_proto::pod::{Pod, RestartPolicy};
use tonic::transport::Channel;

use super::containers::list_containers;
use super::{PodRunner, lock, ownership};
use crate::handlers::{self, Action};
use crate::labels;
use crate::lifecycle::LifecycleState;

impl PodRunner {
    /// Stop and remove a pod no longer placed here: cooperators (Delete), preStop, stop
    /// with the grace period, sandbox removed.
    pub(super) async fn remove(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        sandbox: &k8s_cri::v1::PodSandbox,
        uid: &str,
    ) -> Result<(), tonic::Status> {
        let uid = uid.to_owned();
        let spec = lock(&self.inner.known).get(&uid).cloned();
        let last_labels = spec
            .as_ref()
            .map(|p| p.metadata.labels.clone())
            .unwrap_or_default();
        let cooperators = lock(&self.inner.cooperators)
            .get(&uid)
            .cloned()
            .unwrap_or_default();
        let what = crate::lifecycle::PodRef {
            namespace: sandbox
                .labels
                .get(labels::POD_NAMESPACE)
                .cloned()
                .unwrap_or_default(),
            name: sandbox
                .labels
                .get(labels::POD_NAME)
                .cloned()
                .unwrap_or_default(),
            uid: uid.clone(),
            node: self.inner.node.clone(),
        };
        use rigger_proto::lifecycle::{Operation, Stage};
        if let Err(reason) = crate::lifecycle::call_all(
            &cooperators,
            Operation::Delete,
            Stage::Preparing,
            &what,
            &|| last_labels.clone(),
        )
        .await
        {
            // The controller already forgot the pod: the deletion goes on, said loudly.
            tracing::warn!(%uid, %reason, "deleting the pod without its cooperator's acknowledgement");
        }
        let grace = sandbox
            .labels
            .get(labels::GRACE_SECONDS)
            .and_then(|g| g.parse::<i64>().ok())
            .unwrap_or(30);
        tracing::info!(%uid, sandbox = %sandbox.id, grace, "removing a pod no longer placed on this node");
        for container in list_containers(cri, &sandbox.id).await? {
            let started = std::time::Instant::now();
            let name = container
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .unwrap_or_default();
            let pre_stop = spec.as_ref().and_then(|pod| {
                let c = pod.spec.containers.iter().find(|c| c.name == name)?;
                Some((c.clone(), c.lifecycle.as_ref()?.pre_stop.clone()?))
            });
            if let Some((spec_container, handler)) = pre_stop
                && container.state == ContainerState::ContainerRunning as i32
                && let Some(action) = Action::of_handler(&handler)
            {
                // preStop is bounded by the grace period.
                let bound = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                match handlers::run(cri, &spec_container, &container.id, action, bound).await {
                    Ok(()) => tracing::info!(%uid, container = %name, "preStop hook ran"),
                    Err(reason) => {
                        tracing::warn!(%uid, container = %name, %reason, "preStop hook failed")
                    }
                }
            }
            // What is left of the grace period, at least 2 s.
            let left = (grace - i64::try_from(started.elapsed().as_secs()).unwrap_or(0)).max(2);
            cri.stop_container(StopContainerRequest {
                container_id: container.id.clone(),
                timeout: left,
            })
            .await?;
            lock(&self.inner.probes).remove(&container.id);
            cri.remove_container(RemoveContainerRequest {
                container_id: container.id,
            })
            .await?;
        }
        cri.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: sandbox.id.clone(),
        })
        .await?;
        cri.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: sandbox.id.clone(),
        })
        .await?;
        let _ = std::fs::remove_dir_all(self.inner.dir.join(&uid));
        self.forget_created(&uid);
        lock(&self.inner.statuses).remove(&uid);
        lock(&self.inner.known).remove(&uid);
        if let Err(reason) = crate::lifecycle::call_all(
            &cooperators,
            Operation::Delete,
            Stage::Completing,
            &what,
            &|| last_labels.clone(),
        )
        .await
        {
            tracing::warn!(%uid, %reason, "a cooperator did not acknowledge the deletion's completion");
        }
        lock(&self.inner.cooperators).remove(&uid);
        Ok(())
    }

    /// Make one pod run; its status in Kubernetes' shape.
    pub(super) async fn ensure(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        pod: &Pod,
        uid: &str,
        sandbox: Option<String>,
    ) -> Result<serde_json::Value, tonic::Status> {
        let config = self.sandbox_config(pod, uid);
        let sandbox = match sandbox {
            Some(id) => id,
            None => {
                tracing::info!(pod = %pod.metadata.name, %uid, "creating the pod's sandbox");
                // Recorded (durably) first: a sandbox is ours only if its uid is.
                self.record_created(uid)?;
                cri.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await?
                .into_inner()
                .pod_sandbox_id
            }
        };
        let existing = list_containers(cri, &sandbox).await?;
        self.start_update_if_changed(pod, uid, &existing);
        let mut init_statuses = Vec::new();
        let mut initialized = true;
        for container in &pod.spec.init_containers {
            let (status, done) = Box::pin(
                self.ensure_container(cri, pod, uid, &sandbox, &config, container, &existing, true),
            )
            .await?;
            init_statuses.push(status);
            if !done {
                initialized = false;
                break;
            }
        }
        let mut statuses = Vec::new();
        if initialized {
            for container in &pod.spec.containers {
                let (status, _) = Box::pin(self.ensure_container(
                    cri, pod, uid, &sandbox, &config, container, &existing, false,
                ))
                .await?;
                statuses.push(status);
            }
        }
        let containers_ready = initialized
            && statuses.len() == pod.spec.containers.len()
            && statuses.iter().all(|s| s["ready"] == true);
        let unready = lock(&self.inner.unready).get(uid).cloned();
        let ready = containers_ready && unready.is_none();
        let terminated: Vec<&serde_json::Value> = statuses
            .iter()
            .filter_map(|s| s["state"].get("terminated"))
            .collect();
        let phase = if !initialized || statuses.is_empty() {
            "Pending"
        } else if terminated.len() == statuses.len()
            && pod.spec.restart_policy != RestartPolicy::Always
        {
            if terminated.iter().all(|t| t["exitCode"] == 0) {
                "Succeeded"
            } else {
                "Failed"
            }
        } else {
            "Running"
        };
        let condition = |kind: &str, ok: bool| serde_json::json!({"type": kind, "status": if ok { "True" } else { "False" }});
        let mut ready_condition = condition("Ready", ready);
        if let Some(reason) = unready {
            ready_condition["reason"] = "ContainerRecreating".into();
            ready_condition["message"] = reason.into();
        }
        let (state, message) = lock(&self.inner.lifecycle)
            .get(uid)
            .cloned()
            .unwrap_or((LifecycleState::Normal, String::new()));
        Ok(serde_json::json!({
            "phase": phase,
            "lifecycle": {"state": state, "message": message},
            "conditions": [
                condition("PodScheduled", true),
                condition("Initialized", initialized),
                condition("ContainersReady", containers_ready),
                ready_condition,
            ],
            "hostIP": host_ip(),
            "initContainerStatuses": init_statuses,
            "containerStatuses": statuses,
        }))
    }

    pub(super) fn sandbox_config(&self, pod: &Pod, uid: &str) -> PodSandboxConfig {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        // The pod's labels, but never kubelet's or Rigger's own: those say who owns it.
        let mut sandbox_labels: HashMap<String, String> = pod
            .metadata
            .labels
            .iter()
            .filter(|(k, _)| !ownership::is_reserved_label(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        sandbox_labels.extend([
            (labels::MANAGED.to_owned(), "true".to_owned()),
            (labels::NODE.to_owned(), self.inner.node.clone()),
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::POD_NAME.to_owned(), pod.metadata.name.clone()),
            (labels::POD_NAMESPACE.to_owned(), namespace.clone()),
            (
                labels::GRACE_SECONDS.to_owned(),
                pod.spec.termination_grace_period_seconds.to_string(),
            ),
        ]);
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.metadata.name.clone(),
                uid: uid.to_owned(),
                namespace,
                attempt: 0,
            }),
            // Host network, and no hostname: runc cannot set one without a UTS namespace.
            hostname: String::new(),
            log_directory: self.inner.dir.join(uid).join("logs").display().to_string(),
            labels: sandbox_labels,
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..NamespaceOption::default()
                    }),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        }
    }
}

/// The address the node is reached at (pods use the host's network).
pub(super) fn host_ip() -> String {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|socket| {
            socket.connect("192.0.2.1:9")?;
            socket.local_addr()
        })
        .map(|address| address.ip().to_string())
        .unwrap_or_default()
}
