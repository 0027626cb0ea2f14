//! A pod's containers: created, started and restarted by the restart policy with
//! kubelet's back-off, their images pulled by the pull policy, their CRI config.

use rigger_proto::time::{rfc3339, rfc3339_from_nanos};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    ListContainersRequest, Mount, PodSandboxConfig, RemoveContainerRequest, StartContainerRequest,
    StopContainerRequest,
};
use rigger_proto::pod::{Container, Pod, RestartPolicy};
use tonic::transport::Channel;

use super::{BACKOFF_BASE, BACKOFF_MAX, HOT_UPGRADE_ENV, PodRunner, lock};
use crate::handlers::{self, Action};
use crate::labels;
use rigger_pull::NoProgress;

impl PodRunner {
    /// Make one container run (or, for init containers, run to completion); its status,
    /// and whether it is done (init containers: exited 0).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn ensure_container(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        pod: &Pod,
        uid: &str,
        sandbox: &str,
        sandbox_config: &PodSandboxConfig,
        container: &Container,
        existing: &[k8s_cri::v1::Container],
        init: bool,
    ) -> Result<(serde_json::Value, bool), tonic::Status> {
        let latest = existing
            .iter()
            .filter(|c| c.labels.get(labels::CONTAINER_NAME) == Some(&container.name))
            .max_by_key(|c| c.metadata.as_ref().map_or(0, |m| m.attempt));
        let current = match latest {
            Some(c) => Some(
                cri.container_status(ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: false,
                })
                .await?
                .into_inner()
                .status
                .unwrap_or_default(),
            ),
            None => None,
        };
        let attempt = current
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map_or(0, |m| m.attempt);
        let start_next = match &current {
            None => Some(0),
            Some(status)
                if status.state == ContainerState::ContainerExited as i32
                    && lock(&self.inner.recreate_now).remove(&status.id) =>
            {
                Some(attempt + 1)
            }
            Some(status) if status.state == ContainerState::ContainerExited as i32 => {
                let restart = restarts(pod.spec.restart_policy, init, status.exit_code);
                let delay = BACKOFF_BASE
                    .saturating_mul(1 << attempt.min(5))
                    .min(BACKOFF_MAX);
                let finished = SystemTime::UNIX_EPOCH
                    + Duration::from_nanos(u64::try_from(status.finished_at).unwrap_or(0));
                let waited = SystemTime::now()
                    .duration_since(finished)
                    .unwrap_or_default();
                (restart && waited >= delay).then_some(attempt + 1)
            }
            Some(_) => None,
        };
        if let Some(next) = start_next {
            if let Err(reason) = self.ensure_image(uid, container).await {
                let status = serde_json::json!({
                    "name": container.name, "image": container.image, "ready": false,
                    "restartCount": attempt,
                    "state": {"waiting": {"reason": "ErrImagePull", "message": reason}},
                });
                return Ok((status, false));
            }
            let id = cri
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: sandbox.to_owned(),
                    config: Some(self.container_config(pod, uid, container, next)),
                    sandbox_config: Some(sandbox_config.clone()),
                })
                .await?
                .into_inner()
                .container_id;
            cri.start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await?;
            tracing::info!(pod = %pod.metadata.name, container = %container.name, attempt = next, "container started");
            // As kubelet: one dead attempt is kept (its log is the "previous" one), older
            // ones are removed so restarts and recreates do not pile up containers.
            for dead in existing.iter().filter(|c| {
                c.labels.get(labels::CONTAINER_NAME) == Some(&container.name)
                    && c.metadata.as_ref().is_some_and(|m| m.attempt + 1 < next)
                    && c.state == ContainerState::ContainerExited as i32
            }) {
                if let Err(status) = cri
                    .remove_container(RemoveContainerRequest {
                        container_id: dead.id.clone(),
                    })
                    .await
                {
                    tracing::debug!(id = %dead.id, error = %status.message(), "old container not removed");
                }
            }
            if let Some(handler) = container
                .lifecycle
                .as_ref()
                .and_then(|l| l.post_start.as_ref())
                && let Some(action) = Action::of_handler(handler)
            {
                // As kubelet: the container counts as started only after postStart; a
                // failed hook kills it (and the restart policy decides what follows).
                let bound = Duration::from_secs(pod.spec.termination_grace_period_seconds.max(30));
                if let Err(reason) = handlers::run(cri, container, &id, action, bound).await {
                    tracing::warn!(pod = %pod.metadata.name, container = %container.name, %reason, "postStart hook failed; stopping the container");
                    cri.stop_container(StopContainerRequest {
                        container_id: id.clone(),
                        timeout: 2,
                    })
                    .await?;
                }
            }
            // Ready and started only once the probes say so (none: at once).
            let started = container.startup_probe.is_none();
            let ready = !init && started && container.readiness_probe.is_none();
            let status = serde_json::json!({
                "name": container.name, "image": container.image, "ready": ready,
                "restartCount": next, "containerID": format!("containerd://{id}"),
                "started": started, "state": {"running": {"startedAt": rfc3339(SystemTime::now())}},
            });
            return Ok((status, false));
        }
        let Some(status) = current else {
            return Ok((serde_json::Value::Null, false));
        };
        let running = status.state == ContainerState::ContainerRunning as i32;
        let (started, ready) = if running && !init {
            Box::pin(self.probe(cri, pod, container, &status)).await?
        } else {
            (running, false)
        };
        let state = if running {
            serde_json::json!({"running": {"startedAt": rfc3339_nanos(status.started_at)}})
        } else if status.state == ContainerState::ContainerExited as i32 {
            if restarts(pod.spec.restart_policy, init, status.exit_code) {
                serde_json::json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off restarting the container (exit code {})", status.exit_code)}})
            } else {
                serde_json::json!({"terminated": {"exitCode": status.exit_code, "reason": status.reason,
                    "startedAt": rfc3339_nanos(status.started_at), "finishedAt": rfc3339_nanos(status.finished_at)}})
            }
        } else {
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let done =
            init && status.state == ContainerState::ContainerExited as i32 && status.exit_code == 0;
        // The image this container was created from (as Kubernetes reports it), which
        // differs from the spec's while an in-place update is under way.
        let image = created_from(&status).unwrap_or_else(|| container.image.clone());
        Ok((
            serde_json::json!({
                "name": container.name,
                "image": image,
                "imageID": status.image_ref,
                "containerID": format!("containerd://{}", status.id),
                "ready": ready,
                "started": started,
                "restartCount": attempt,
                "state": state,
            }),
            done,
        ))
    }
}

impl PodRunner {
    /// The container's image on the node, as its `imagePullPolicy` asks (Kubernetes'
    /// default: Always for `:latest` or no tag, IfNotPresent otherwise).
    pub(super) async fn ensure_image(
        &self,
        uid: &str,
        container: &Container,
    ) -> Result<(), String> {
        let image = container.image.as_str();
        let policy = container
            .image_pull_policy
            .unwrap_or_else(|| default_pull_policy(image));
        let channel = self
            .inner
            .connection
            .channel()
            .await
            .map_err(|status| status.message().to_owned())?;
        let mut images = k8s_cri::v1::image_service_client::ImageServiceClient::new(channel)
            .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE);
        let present = images
            .image_status(k8s_cri::v1::ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.to_owned(),
                    ..ImageSpec::default()
                }),
                verbose: false,
            })
            .await
            .map_err(|s| s.message().to_owned())?
            .into_inner()
            .image
            .is_some();
        let pull = match policy {
            rigger_proto::pod::PullPolicy::Always => true,
            rigger_proto::pod::PullPolicy::IfNotPresent => !present,
            rigger_proto::pod::PullPolicy::Never if present => false,
            rigger_proto::pod::PullPolicy::Never => {
                return Err(format!(
                    "{image} is not on the node and imagePullPolicy is Never"
                ));
            }
        };
        if pull {
            // The pod's imagePullSecrets first, then the node's own credentials.
            let secrets = lock(&self.inner.pull_secrets)
                .get(uid)
                .cloned()
                .unwrap_or_default();
            // Boxed: a pull is a large future, and most reconciles never start one.
            Box::pin(self.inner.puller.pull_with_credentials(
                image,
                &secrets.0,
                Arc::new(NoProgress),
            ))
            .await
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    pub(super) fn container_config(
        &self,
        pod: &Pod,
        uid: &str,
        container: &Container,
        attempt: u32,
    ) -> ContainerConfig {
        let meta = &pod.metadata;
        let envs = resolved_env(pod, uid, container);
        let spec_hash = desired_hash(pod, uid, container);
        let mounts = container
            .volume_mounts
            .iter()
            .filter_map(|m| {
                let volume = pod.spec.volumes.iter().find(|v| v.name == m.name)?;
                let host_path = match (&volume.host_path, &volume.empty_dir) {
                    (Some(host), _) => {
                        if host.kind.as_deref() == Some("DirectoryOrCreate") {
                            let _ = std::fs::create_dir_all(&host.path);
                        }
                        host.path.clone()
                    }
                    (None, Some(_)) => {
                        let dir = self.inner.dir.join(uid).join("volumes").join(&volume.name);
                        let _ = std::fs::create_dir_all(&dir);
                        dir.display().to_string()
                    }
                    (None, None) => return None,
                };
                Some(Mount {
                    container_path: m.mount_path.clone(),
                    host_path,
                    readonly: m.read_only,
                    ..Mount::default()
                })
            })
            .collect();
        let limits = container.resources.as_ref().map(|r| &r.limits);
        let cpu = limits
            .and_then(|l| l.get("cpu"))
            .and_then(|c| rigger_proto::pod::parse_cpu(c));
        let memory = limits
            .and_then(|l| l.get("memory"))
            .and_then(|m| rigger_proto::pod::parse_memory(m));
        let resources = LinuxContainerResources {
            cpu_period: if cpu.is_some() { 100_000 } else { 0 },
            cpu_quota: cpu.map_or(0, |m| {
                i64::try_from(m.saturating_mul(100)).unwrap_or(i64::MAX)
            }),
            memory_limit_in_bytes: memory.map_or(0, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            ..LinuxContainerResources::default()
        };
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: container.name.clone(),
                attempt,
            }),
            image: Some(ImageSpec {
                image: container.image.clone(),
                user_specified_image: container.image.clone(),
                ..ImageSpec::default()
            }),
            annotations: [(labels::IMAGE.to_owned(), container.image.clone())].into(),
            command: container.command.clone(),
            args: container.args.clone(),
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs,
            mounts,
            labels: [
                (labels::MANAGED.to_owned(), "true".to_owned()),
                (labels::POD_UID.to_owned(), uid.to_owned()),
                (labels::POD_NAME.to_owned(), meta.name.clone()),
                (
                    labels::POD_NAMESPACE.to_owned(),
                    meta.namespace.clone().unwrap_or_default(),
                ),
                (labels::CONTAINER_NAME.to_owned(), container.name.clone()),
                (labels::SPEC_HASH.to_owned(), spec_hash),
            ]
            .into(),
            log_path: format!("{}/{attempt}.log", container.name),
            linux: Some(LinuxContainerConfig {
                resources: Some(resources),
                ..LinuxContainerConfig::default()
            }),
            ..ContainerConfig::default()
        }
    }
}

pub(super) async fn list_containers(
    cri: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
) -> Result<Vec<k8s_cri::v1::Container>, tonic::Status> {
    Ok(cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: sandbox.to_owned(),
                ..ContainerFilter::default()
            }),
        })
        .await?
        .into_inner()
        .containers)
}

/// Whether an exited container starts again under `policy` (an init container that
/// succeeded is done, whatever the policy).
pub(super) fn restarts(policy: RestartPolicy, init: bool, exit_code: i32) -> bool {
    let failed = exit_code != 0;
    match policy {
        RestartPolicy::Always => !init || failed,
        RestartPolicy::OnFailure => failed,
        RestartPolicy::Never => false,
    }
}

/// Kubernetes' default `imagePullPolicy`: Always for `:latest` or no tag, IfNotPresent
/// for any other tag or a digest.
pub(super) fn default_pull_policy(image: &str) -> rigger_proto::pod::PullPolicy {
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'))
        .map(|(_, tag)| tag);
    if image.contains('@') || tag.is_some_and(|t| t != "latest") {
        rigger_proto::pod::PullPolicy::IfNotPresent
    } else {
        rigger_proto::pod::PullPolicy::Always
    }
}

/// A short hash of a container's spec, to tell a changed spec from a restart.
pub(super) fn spec_hash(container: &Container) -> String {
    short_hash(&serde_json::to_vec(container).unwrap_or_default())
}

pub(super) fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(bytes)[..8])
}

/// What the running container should be: its spec, and the values of env that refers
/// to the pod's metadata (so a changed label reaches it through an in-place restart).
pub(super) fn desired_hash(pod: &Pod, uid: &str, container: &Container) -> String {
    let uses_metadata = container.env.iter().any(|e| e.value_from.is_some());
    if !uses_metadata {
        return spec_hash(container);
    }
    let values: Vec<String> = resolved_env(pod, uid, container)
        .into_iter()
        // A hot upgrade rewrites these on the working slot too; like kubelet, that
        // never restarts it (the value is read at the container's start).
        .filter(|kv| !HOT_UPGRADE_ENV.contains(&kv.key.as_str()))
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    let mut bytes = serde_json::to_vec(container).unwrap_or_default();
    bytes.extend(values.join("\n").into_bytes());
    short_hash(&bytes)
}

/// The container's environment, `fieldRef`s resolved against the pod.
pub(super) fn resolved_env(pod: &Pod, uid: &str, container: &Container) -> Vec<KeyValue> {
    let meta = &pod.metadata;
    let field = |path: &str| -> String {
        let quoted = |prefix: &str| path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']"));
        match path {
            "metadata.name" => meta.name.clone(),
            "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
            "metadata.uid" => uid.to_owned(),
            "spec.nodeName" => pod.spec.node_name.clone().unwrap_or_default(),
            _ => quoted("metadata.labels['")
                .and_then(|k| meta.labels.get(k).cloned())
                .or_else(|| {
                    quoted("metadata.annotations['").and_then(|k| meta.annotations.get(k).cloned())
                })
                .unwrap_or_default(),
        }
    };
    container
        .env
        .iter()
        .map(|e| KeyValue {
            key: e.name.clone(),
            value: match (&e.value, &e.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => field(&from.field_ref.field_path),
                (None, None) => String::new(),
            },
        })
        .collect()
}

/// CRI's nanoseconds as RFC 3339; "never" as the epoch.
pub(super) fn rfc3339_nanos(nanos: i64) -> String {
    rfc3339_from_nanos(nanos).unwrap_or_else(|| rfc3339(SystemTime::UNIX_EPOCH))
}

/// The image reference a container was created from: the one the agent wrote on it, else
/// what CRI says (containerd 2.x: the reference as given; 1.6: the image's first tag).
pub(super) fn created_from(status: &k8s_cri::v1::ContainerStatus) -> Option<String> {
    let spec = status.image.as_ref();
    [
        status.annotations.get(labels::IMAGE).cloned(),
        spec.map(|i| i.user_specified_image.clone()),
        spec.map(|i| i.image.clone()),
    ]
    .into_iter()
    .flatten()
    .find(|image| !image.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigger_proto::pod::PullPolicy;

    #[test]
    fn pull_policy_defaults_follow_kubernetes() {
        assert_eq!(default_pull_policy("busybox"), PullPolicy::Always);
        assert_eq!(default_pull_policy("busybox:latest"), PullPolicy::Always);
        assert_eq!(
            default_pull_policy("127.0.0.1:5000/app"),
            PullPolicy::Always
        );
        assert_eq!(
            default_pull_policy("127.0.0.1:5000/app:1"),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            default_pull_policy("app@sha256:00"),
            PullPolicy::IfNotPresent
        );
    }

    #[test]
    fn spec_hash_changes_with_the_spec_only() {
        let a = Container {
            name: "app".to_owned(),
            image: "r.example/app:1".to_owned(),
            ..Container::default()
        };
        let mut b = a.clone();
        assert_eq!(spec_hash(&a), spec_hash(&b));
        b.image = "r.example/app:2".to_owned();
        assert_ne!(spec_hash(&a), spec_hash(&b));
    }

    #[test]
    fn a_container_names_the_image_it_was_created_from_not_crs_pick() {
        use k8s_cri::v1::{ContainerStatus, ImageSpec};
        let status = |annotation: Option<&str>, user: &str, first_tag: &str| ContainerStatus {
            annotations: annotation
                .map(|a| (crate::labels::IMAGE.to_owned(), a.to_owned()))
                .into_iter()
                .collect(),
            image: Some(ImageSpec {
                image: first_tag.to_owned(),
                user_specified_image: user.to_owned(),
                ..ImageSpec::default()
            }),
            ..ContainerStatus::default()
        };
        // containerd 1.6: the image's first tag, whatever the pod asked for.
        let ours = status(Some("registry/app:1"), "", "0.invalid/app:1");
        assert_eq!(created_from(&ours).as_deref(), Some("registry/app:1"));
        // Created before the annotation: containerd 2.x's user-specified image, then CRI's.
        let older = status(None, "registry/app:1", "0.invalid/app:1");
        assert_eq!(created_from(&older).as_deref(), Some("registry/app:1"));
        let oldest = status(None, "", "0.invalid/app:1");
        assert_eq!(created_from(&oldest).as_deref(), Some("0.invalid/app:1"));
        assert_eq!(created_from(&ContainerStatus::default()), None);
    }
}
