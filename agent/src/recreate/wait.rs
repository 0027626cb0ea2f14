//! Waiting for a recreated container's next attempt: found, started, running long
//! enough and ready, while its pod is still there.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_cri::v1::{ContainerState, PodSandboxState};
use tokio_util::sync::CancellationToken;

use crate::cri::{self, Cri};
use crate::labels;

use super::{POLL, Phase, Recreate, RecreateWork, Target};

impl<R: Cri> Recreate<'_, R> {
    /// Wait until each container in `which` has a new attempt that has run
    /// `minStartedSeconds` (and is ready, for agent pods), or failed.
    pub(super) async fn wait(
        &self,
        target: &Target,
        work: &mut RecreateWork,
        which: &[usize],
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        let min_started = Duration::from_secs(u64::from(work.min_started_seconds));
        loop {
            if !self.pod_still_here(target, work).await? {
                return Err(format!(
                    "{} was deleted or replaced during the request",
                    work.what()
                ));
            }
            let mut open = false;
            for &i in which {
                if work.containers[i].phase.finished() {
                    continue;
                }
                let name = work.containers[i].name.clone();
                let old = work.containers[i].old_container_id.clone();
                let Some(current) = latest_container(self.runtime, target, &name).await? else {
                    open = true;
                    continue;
                };
                if old.as_deref() == Some(current.id.as_str()) {
                    // No next attempt yet.
                    if let Target::Agent { .. } = target
                        && current.state == ContainerState::ContainerExited as i32
                    {
                        self.pods.recreate_now(&current.id);
                    }
                    open = true;
                    continue;
                }
                let status = self
                    .runtime
                    .status_of(&current.id)
                    .await
                    .map_err(|e| format!("container {name:?}: {e}"))?
                    .unwrap_or_default();
                let outcome = if status.state == ContainerState::ContainerExited as i32 {
                    Some((
                        Phase::Failed,
                        format!(
                            "the new container exited with code {}{}",
                            status.exit_code,
                            if status.reason.is_empty() {
                                String::new()
                            } else {
                                format!(" ({})", status.reason)
                            }
                        ),
                    ))
                } else if status.state == ContainerState::ContainerRunning as i32 {
                    let started_at = SystemTime::UNIX_EPOCH
                        + Duration::from_nanos(u64::try_from(status.started_at).unwrap_or(0));
                    let ran = SystemTime::now()
                        .duration_since(started_at)
                        .unwrap_or_default();
                    let ready = match target {
                        Target::Agent { .. } => self
                            .pods
                            .container_ready(&work.pod_uid, &name, &current.id)
                            .unwrap_or(false),
                        Target::Kubelet { .. } => true,
                    };
                    (ran >= min_started && ready).then(|| (Phase::Succeeded, String::new()))
                } else {
                    None
                };
                match outcome {
                    Some((phase, message)) => {
                        let progress = &mut work.containers[i];
                        progress.phase = phase;
                        if !message.is_empty() {
                            progress.message = if progress.message.is_empty() {
                                message
                            } else {
                                format!("{}; {message}", progress.message)
                            };
                        }
                        tracing::info!(pod = %work.what(), container = %name, ?phase, "container recreate finished");
                        (self.save)(work);
                    }
                    None => open = true,
                }
            }
            if !open {
                return Ok(());
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err("cancelled".to_owned()),
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }

    pub(super) async fn pod_still_here(
        &self,
        target: &Target,
        work: &RecreateWork,
    ) -> Result<bool, String> {
        let (label, placed) = match target {
            Target::Agent { .. } => (labels::POD_UID, self.pods.pod(&work.pod_uid).is_some()),
            Target::Kubelet { .. } => (labels::KUBELET_POD_UID, true),
        };
        if !placed {
            return Ok(false);
        }
        let owned = |s: &k8s_cri::v1::PodSandbox| match target {
            Target::Agent { .. } => self.pods.owner_of(s).as_deref() == Some(work.pod_uid.as_str()),
            Target::Kubelet { .. } => kubelets(s, &work.pod_uid),
        };
        Ok(ready_sandbox(self.runtime, label, &work.pod_uid, &owned)
            .await?
            .as_deref()
            == Some(target.sandbox()))
    }
}

/// A kubelet sandbox of pod `uid`: kubelet's uid label (the caller's filter) and the
/// sandbox's own uid agree. (The agent's sandboxes never carry kubelet's labels.)
pub(super) fn kubelets(sandbox: &k8s_cri::v1::PodSandbox, uid: &str) -> bool {
    sandbox.metadata.as_ref().is_some_and(|m| m.uid == uid)
}

/// The ready sandbox whose `label` is `uid` and that `owned` accepts.
pub(crate) async fn ready_sandbox(
    cri: &impl Cri,
    label: &str,
    uid: &str,
    owned: &(dyn Fn(&k8s_cri::v1::PodSandbox) -> bool + Sync),
) -> Result<Option<String>, String> {
    Ok(cri
        .sandboxes(label, uid)
        .await?
        .into_iter()
        .find(|s| s.state == PodSandboxState::SandboxReady as i32 && owned(s))
        .map(|s| s.id))
}

/// The newest attempt of container `name` in the target's sandbox.
pub(super) async fn latest_container(
    cri: &impl Cri,
    target: &Target,
    name: &str,
) -> Result<Option<k8s_cri::v1::Container>, String> {
    let labels = HashMap::from([(target.name_label().to_owned(), name.to_owned())]);
    Ok(cri::newest(cri.containers(target.sandbox(), labels).await?))
}
