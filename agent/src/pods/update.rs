//! In-place updates of agent-managed pods: when a running container no longer matches
//! its pod's spec (a new image, or env that refers to changed metadata), it is
//! recreated in the same sandbox — the other containers, the sandbox and the volumes
//! stay. Around it runs the pod's lifecycle, shown in status (`lifecycle.state`) and as
//! the label `lifecycle.rigger.dev/state`:
//!
//! Normal → PreparingUpdate (pod not ready; cooperators asked; new images pre-downloaded;
//! the grace period from the annotation `rigger.dev/in-place-update-grace-seconds`) →
//! Updating (preStop, stop, next attempt with the new spec) → Updated (cooperators
//! asked) → Normal (ready again). Completion is checked by the running container's
//! imageID, not by the spec. A failed update leaves the pod as it is and is tried again
//! after a back-off.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_cri::v1::ContainerState;
use rigger_proto::lifecycle::{Operation, Stage};
use rigger_proto::pod::Pod;
use tokio_util::sync::CancellationToken;

use super::containers::desired_hash;
use super::{PodRunner, lock};
use crate::cri::{self, Cri};
use crate::labels;
use crate::lifecycle::{LifecycleState, PodRef, call_all};
use crate::recreate::{ContainerProgress, Phase, Recreate, RecreateWork, ready_sandbox};

pub use rigger_proto::pod::IN_PLACE_UPDATE_GRACE_ANNOTATION as GRACE_ANNOTATION;
/// A failed update is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);

impl PodRunner {
    pub(crate) fn set_lifecycle(&self, uid: &str, state: LifecycleState, message: &str) {
        let mut lifecycle = lock(&self.inner.lifecycle);
        if state == LifecycleState::Normal && message.is_empty() {
            lifecycle.remove(uid);
        } else {
            lifecycle.insert(uid.to_owned(), (state, message.to_owned()));
        }
        drop(lifecycle);
        self.inner.wake.notify_one();
    }

    /// Start an in-place update of `pod` when one of its running containers no longer
    /// matches the spec (and none runs already, and a failed one is not waiting).
    pub(super) fn start_update_if_changed(
        &self,
        pod: &Pod,
        uid: &str,
        existing: &[k8s_cri::v1::Container],
    ) {
        let mut latest: HashMap<&str, &k8s_cri::v1::Container> = HashMap::new();
        for container in existing {
            let Some(name) = container.labels.get(labels::CONTAINER_NAME) else {
                continue;
            };
            let attempt = |c: &k8s_cri::v1::Container| c.metadata.as_ref().map_or(0, |m| m.attempt);
            if latest
                .get(name.as_str())
                .is_none_or(|l| attempt(l) < attempt(container))
            {
                latest.insert(name, container);
            }
        }
        let changed: Vec<String> = pod
            .spec
            .containers
            .iter()
            .filter(|c| {
                latest.get(c.name.as_str()).is_some_and(|running| {
                    running.state == ContainerState::ContainerRunning as i32
                        && running.labels.get(labels::SPEC_HASH) != Some(&desired_hash(pod, uid, c))
                })
            })
            .map(|c| c.name.clone())
            .collect();
        if changed.is_empty() {
            return;
        }
        if lock(&self.inner.update_retry)
            .get(uid)
            .is_some_and(|at| Instant::now() < *at)
        {
            return;
        }
        if !lock(&self.inner.updating).insert(uid.to_owned()) {
            return;
        }
        let (runner, pod, uid) = (self.clone(), pod.clone(), uid.to_owned());
        tokio::spawn(async move {
            tracing::info!(pod = %pod.metadata.name, containers = ?changed, "in-place update started");
            let started = Instant::now();
            let outcome = runner.update(&pod, &uid, &changed).await;
            let metrics = &runner.inner.metrics;
            let result = if outcome.is_ok() {
                "succeeded"
            } else {
                "failed"
            };
            metrics
                .updates
                .get_or_create(&crate::metrics::Outcome::of(result))
                .inc();
            crate::metrics::AgentMetrics::observe(&metrics.update_seconds, started.elapsed());
            match outcome {
                Ok(()) => {
                    tracing::info!(pod = %pod.metadata.name, "in-place update done");
                    lock(&runner.inner.update_retry).remove(&uid);
                    runner.set_lifecycle(&uid, LifecycleState::Normal, "");
                }
                Err(reason) => {
                    tracing::warn!(pod = %pod.metadata.name, %reason, "in-place update failed; trying again later");
                    lock(&runner.inner.update_retry)
                        .insert(uid.clone(), Instant::now() + RETRY_AFTER);
                    runner.set_lifecycle(
                        &uid,
                        LifecycleState::Normal,
                        &format!(
                            "in-place update failed (tried again in {}s): {reason}",
                            RETRY_AFTER.as_secs()
                        ),
                    );
                }
            }
            runner.mark_ready(&uid);
            lock(&runner.inner.updating).remove(&uid);
            runner.inner.wake.notify_one();
        });
    }

    /// The labels pod `uid` has now (none once it left the node).
    pub(crate) fn labels_of(&self, uid: &str) -> std::collections::BTreeMap<String, String> {
        self.pod(uid).map(|p| p.metadata.labels).unwrap_or_default()
    }

    /// The lifecycle cooperators of pod `uid`.
    pub(crate) fn cooperators_of(&self, uid: &str) -> Vec<rigger_proto::lifecycle::Cooperator> {
        lock(&self.inner.cooperators)
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    async fn update(&self, pod: &Pod, uid: &str, changed: &[String]) -> Result<(), String> {
        let cooperators = self.cooperators_of(uid);
        let what = PodRef {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone(),
            uid: uid.to_owned(),
            node: self.inner.node.clone(),
        };
        // A hot upgrade restarts only an idle sidecar slot: the pod keeps serving, so it
        // stays ready.
        let hot = changed.iter().all(|name| is_hot_upgrade_slot(pod, name));
        self.set_lifecycle(uid, LifecycleState::PreparingUpdate, "");
        if !hot {
            self.mark_unready(uid, "in-place update (PreparingUpdate)");
        }
        call_all(
            &cooperators,
            Operation::InPlaceUpdate,
            Stage::Preparing,
            &what,
            &|| self.labels_of(uid),
        )
        .await?;

        // The new images are on the node before anything stops: the gap between the old
        // container and the new one never includes a pull.
        for name in changed {
            if let Some(container) = pod.spec.containers.iter().find(|c| &c.name == name) {
                Box::pin(self.ensure_image(uid, container))
                    .await
                    .map_err(|e| format!("pre-download of {}: {e}", container.image))?;
            }
        }
        if let Some(grace) = pod
            .metadata
            .annotations
            .get(GRACE_ANNOTATION)
            .and_then(|g| g.parse::<u64>().ok())
        {
            tokio::time::sleep(Duration::from_secs(grace)).await;
        }

        self.set_lifecycle(uid, LifecycleState::Updating, "");
        let cri = cri::connect(&self.inner.connection).await?;
        // The containers are looked for in the pod's sandbox, proven this agent's: labels
        // alone are anybody's to wear.
        let sandbox = ready_sandbox(&cri, labels::POD_UID, uid, &|s| {
            self.owner_of(s).as_deref() == Some(uid)
        })
        .await?
        .ok_or_else(|| format!("pod {uid} has no running sandbox of this agent's"))?;
        let mut before = HashMap::new();
        for name in changed {
            before.insert(name.clone(), image_of(&cri, &sandbox, uid, name).await?);
        }
        let mut work = RecreateWork {
            pod_uid: uid.to_owned(),
            pod_namespace: what.namespace.clone(),
            pod_name: what.name.clone(),
            ordered: false,
            ignore_failures: false,
            termination_grace_period_seconds: None,
            unready_grace_period_seconds: 0,
            min_started_seconds: 0,
            force_recreate: true,
            unready_done: false,
            containers: changed
                .iter()
                .map(|name| ContainerProgress::pending(name))
                .collect(),
        };
        let save = |_: &RecreateWork| {};
        let recreate = Recreate {
            pods: self,
            runtime: &cri,
            save: &save,
            // The update is the operation cooperators were asked about.
            operation: None,
        };
        recreate.run(&mut work, &CancellationToken::new()).await?;
        if let Some(failed) = work.containers.iter().find(|c| c.phase == Phase::Failed) {
            return Err(format!("container {:?}: {}", failed.name, failed.message));
        }
        // Done means the new image runs: checked on the container, not the spec.
        for name in changed {
            let spec_image = pod
                .spec
                .containers
                .iter()
                .find(|c| &c.name == name)
                .map(|c| c.image.as_str())
                .unwrap_or_default();
            let old: &Running = &before[name];
            let new = image_of(&cri, &sandbox, uid, name).await?;
            if new.id == old.id {
                return Err(format!("container {name:?} was not replaced"));
            }
            if old.image != spec_image && new.image_ref == old.image_ref {
                return Err(format!(
                    "container {name:?} still runs imageID {} after the update to {spec_image}",
                    new.image_ref
                ));
            }
        }
        self.set_lifecycle(uid, LifecycleState::Updated, "");
        call_all(
            &cooperators,
            Operation::InPlaceUpdate,
            Stage::Completing,
            &what,
            &|| self.labels_of(uid),
        )
        .await?;
        Ok(())
    }
}

/// Whether container `name` is a slot (`<sidecar>-1` / `-2`) of a hot-upgrade sidecar.
fn is_hot_upgrade_slot(pod: &Pod, name: &str) -> bool {
    let working: std::collections::BTreeMap<String, String> = pod
        .metadata
        .annotations
        .get(super::HOT_UPGRADE_WORKING)
        .and_then(|w| serde_json::from_str(w).ok())
        .unwrap_or_default();
    working
        .keys()
        .any(|sidecar| name == format!("{sidecar}-1") || name == format!("{sidecar}-2"))
}

/// A container as created: its id, the image it was asked for, and the imageID it runs.
#[derive(Debug)]
struct Running {
    id: String,
    image: String,
    image_ref: String,
}

/// The newest container `name` of pod `uid` in its sandbox `sandbox`.
async fn image_of(cri: &impl Cri, sandbox: &str, uid: &str, name: &str) -> Result<Running, String> {
    let labels = HashMap::from([
        (labels::POD_UID.to_owned(), uid.to_owned()),
        (labels::CONTAINER_NAME.to_owned(), name.to_owned()),
    ]);
    let newest = cri::newest(cri.containers(sandbox, labels).await?)
        .ok_or_else(|| format!("container {name:?} is gone"))?;
    let status = cri
        .status_of(&newest.id)
        .await
        .map_err(|e| format!("container {name:?}: {e}"))?
        .unwrap_or_default();
    Ok(Running {
        id: newest.id,
        image: super::containers::created_from(&status).unwrap_or_default(),
        image_ref: status.image_ref,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_cri::v1::{Container, ContainerMetadata, ContainerStatus, PodSandbox};

    use super::*;

    /// Two containers wearing the pod's labels: its own in its sandbox, and a newer one a
    /// tenant made elsewhere with the same labels.
    struct Forged;

    fn container(id: &str, sandbox: &str, attempt: u32) -> Container {
        Container {
            id: id.to_owned(),
            pod_sandbox_id: sandbox.to_owned(),
            metadata: Some(ContainerMetadata {
                name: "app".to_owned(),
                attempt,
            }),
            labels: [
                (labels::POD_UID.to_owned(), "uid-1".to_owned()),
                (labels::CONTAINER_NAME.to_owned(), "app".to_owned()),
            ]
            .into(),
            ..Container::default()
        }
    }

    impl Cri for Forged {
        async fn sandboxes(&self, _: &str, _: &str) -> Result<Vec<PodSandbox>, String> {
            Ok(Vec::new())
        }

        async fn containers(
            &self,
            sandbox: &str,
            labels: HashMap<String, String>,
        ) -> Result<Vec<Container>, String> {
            Ok([
                container("ours", "sandbox-ours", 1),
                container("forged", "elsewhere", 9),
            ]
            .into_iter()
            .filter(|c| sandbox.is_empty() || c.pod_sandbox_id == sandbox)
            .filter(|c| labels.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .collect())
        }

        async fn status_of(&self, id: &str) -> Result<Option<ContainerStatus>, String> {
            Ok(Some(ContainerStatus {
                id: id.to_owned(),
                image_ref: format!("sha256:{id}"),
                ..ContainerStatus::default()
            }))
        }

        async fn sandbox_ip(&self, _: &str) -> Result<Option<String>, String> {
            Ok(None)
        }

        async fn stop(&self, _: &str, _: u64) -> Result<(), String> {
            Ok(())
        }

        async fn exec(&self, _: &str, _: &[String], _: Duration) -> Result<i32, String> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn an_update_reads_the_pods_own_container_not_one_wearing_its_labels() {
        let running = image_of(&Forged, "sandbox-ours", "uid-1", "app")
            .await
            .unwrap();
        assert_eq!(running.id, "ours");
        assert_eq!(running.image_ref, "sha256:ours");
    }
}
