//! Container recreate (a ContainerRecreateRequest routed to this node as a task): restart
//! some containers of one pod in place — same sandbox, same volumes, the other containers
//! untouched.
//!
//! Per container: run its preStop hook (exec, httpGet or tcpSocket) bounded by the grace
//! period, stop it with what is left of the grace (at least 2 s), then wait for the next
//! attempt and count it as succeeded once it has run `minStartedSeconds` (and is ready,
//! where the agent knows readiness). Who starts the next attempt depends on the pod:
//! - **agent-managed** pods (`pods`): the pod runner, at once (no back-off, whatever the
//!   restart policy), in the same sandbox with attempt+1, running postStart;
//! - **kubelet-managed** pods (found through CRI by kubelet's labels): kubelet. The
//!   preStop hook and grace period are the ones kubelet records on the container
//!   (`io.kubernetes.container.preStopHandler`, `io.kubernetes.pod.terminationGracePeriod`).
//!
//! Progress is saved after every step, so an agent restart resumes a request without
//! stopping a container twice.

mod kubelet_records;
#[cfg(test)]
mod scenarios;
mod stop;
mod wait;
mod work;

use self::wait::kubelets;
pub(crate) use self::wait::ready_sandbox;
pub use self::work::{ContainerProgress, Phase, RecreateWork};

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cri::Cri;
use crate::labels;
use crate::lifecycle::{LifecycleState, call_all};
use rigger_proto::lifecycle::Stage;

/// How often a waiting recreate looks at the containers.
const POLL: Duration = Duration::from_millis(100);
/// Kubernetes' default terminationGracePeriodSeconds.
const DEFAULT_GRACE_SECONDS: u32 = 30;
/// StopContainer never gets less than this (as kubelet and Kruise).
const MIN_STOP_SECONDS: u64 = 2;

/// kubelet's container label and annotations.
const KUBELET_CONTAINER_NAME: &str = "io.kubernetes.container.name";
const KUBELET_PRE_STOP: &str = "io.kubernetes.container.preStopHandler";
const KUBELET_PORTS: &str = "io.kubernetes.container.ports";
const KUBELET_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";

/// Where the pod lives and who restarts its containers.
enum Target {
    Agent {
        sandbox: String,
        pod: Box<rigger_proto::pod::Pod>,
    },
    Kubelet {
        sandbox: String,
    },
}

impl Target {
    fn sandbox(&self) -> &str {
        match self {
            Self::Agent { sandbox, .. } | Self::Kubelet { sandbox } => sandbox,
        }
    }

    fn name_label(&self) -> &'static str {
        match self {
            Self::Agent { .. } => labels::CONTAINER_NAME,
            Self::Kubelet { .. } => KUBELET_CONTAINER_NAME,
        }
    }
}

/// What a recreate needs from the runner of agent-managed pods (`pods::PodRunner`
/// implements it): whose pods are whose, the pod's spec, labels and cooperators, and the
/// signals that make the runner start the next attempt and report readiness.
pub trait PodHost: Send + Sync {
    /// This node's name.
    fn node(&self) -> &str;
    /// The spec of pod `uid`, when it is placed on this node.
    fn pod(&self, uid: &str) -> Option<rigger_proto::pod::Pod>;
    /// The uid of the agent-managed pod `sandbox` belongs to, when it is proven ours.
    fn owner_of(&self, sandbox: &k8s_cri::v1::PodSandbox) -> Option<String>;
    /// Pod `uid`'s labels as they are now.
    fn labels_of(&self, uid: &str) -> std::collections::BTreeMap<String, String>;
    /// The lifecycle cooperators of pod `uid`.
    fn cooperators_of(&self, uid: &str) -> Vec<rigger_proto::lifecycle::Cooperator>;
    /// Report pod `uid` in lifecycle `state`.
    fn set_lifecycle(&self, uid: &str, state: LifecycleState, message: &str);
    /// Report pod `uid` not ready, saying why.
    fn mark_unready(&self, uid: &str, reason: &str);
    /// Start the next attempt of the stopped container `container_id` now.
    fn recreate_now(&self, container_id: &str);
    /// Whether the container has started (startup probe and postStart passed).
    fn container_started(&self, uid: &str, name: &str, container_id: &str) -> Option<bool>;
    /// Whether the container is ready in the last status.
    fn container_ready(&self, uid: &str, name: &str, container_id: &str) -> Option<bool>;
}

/// Runs one recreate to its end. `save` persists and reports progress.
pub(crate) struct Recreate<'a, R> {
    pub(crate) pods: &'a dyn PodHost,
    /// The CRI runtime service (a fake in unit tests).
    pub(crate) runtime: &'a R,
    pub(crate) save: &'a (dyn Fn(&RecreateWork) + Send + Sync),
    /// What the pod's lifecycle cooperators are asked about (agent-managed pods), if
    /// anything: `None` when the caller asked them already.
    pub(crate) operation: Option<rigger_proto::lifecycle::Operation>,
}

impl<R: Cri> Recreate<'_, R> {
    /// `Ok` with a summary when every container was handled (some may have failed under
    /// failurePolicy Ignore); `Err` with the reason the request failed (the containers
    /// still open are left for the caller to fail, or to resume after a restart). A pod
    /// marked not ready stays so: the caller decides when it is ready again.
    pub async fn run(
        &self,
        work: &mut RecreateWork,
        cancel: &CancellationToken,
    ) -> Result<String, String> {
        let outcome = self.steps(work, cancel).await;
        match outcome {
            Ok(()) => {
                let failed: Vec<&str> = work
                    .containers
                    .iter()
                    .filter(|c| c.phase == Phase::Failed)
                    .map(|c| c.name.as_str())
                    .collect();
                if failed.is_empty() {
                    Ok(String::new())
                } else {
                    Ok(format!(
                        "containers failed (failurePolicy Ignore): {}",
                        failed.join(", ")
                    ))
                }
            }
            Err(reason) => Err(reason),
        }
    }

    async fn steps(
        &self,
        work: &mut RecreateWork,
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        let target = self.locate(work).await?;
        let cooperated = match (&target, self.operation) {
            (Target::Agent { pod, .. }, Some(operation)) => Some((
                operation,
                crate::lifecycle::PodRef {
                    namespace: work.pod_namespace.clone(),
                    name: pod.metadata.name.clone(),
                    uid: work.pod_uid.clone(),
                    node: self.pods.node().to_owned(),
                },
            )),
            _ => None,
        };
        if let Some((operation, what)) = &cooperated {
            self.pods
                .set_lifecycle(&work.pod_uid, LifecycleState::PreparingDelete, "");
            let cooperators = self.pods.cooperators_of(&work.pod_uid);
            if crate::lifecycle::marks_not_ready(&cooperators, *operation) {
                self.pods.mark_unready(
                    &work.pod_uid,
                    "a lifecycle cooperator asked (markPodNotReady)",
                );
            }
            let labels = || self.pods.labels_of(&work.pod_uid);
            let asked = call_all(&cooperators, *operation, Stage::Preparing, what, &labels).await;
            if let Err(reason) = asked {
                self.pods
                    .set_lifecycle(&work.pod_uid, LifecycleState::Normal, "");
                return Err(reason);
            }
        }
        let outcome = self.recreate_containers(&target, work, cancel).await;
        if let Some((operation, what)) = &cooperated {
            let cooperators = self.pods.cooperators_of(&work.pod_uid);
            let labels = || self.pods.labels_of(&work.pod_uid);
            let completing = call_all(&cooperators, *operation, Stage::Completing, what, &labels);
            if let Err(reason) = completing.await {
                tracing::warn!(%reason, "a cooperator did not acknowledge the recreate's completion");
            }
            self.pods
                .set_lifecycle(&work.pod_uid, LifecycleState::Normal, "");
        }
        outcome
    }

    async fn recreate_containers(
        &self,
        target: &Target,
        work: &mut RecreateWork,
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        if work.unready_grace_period_seconds > 0 && !work.unready_done {
            let grace = Duration::from_secs(u64::from(work.unready_grace_period_seconds));
            if matches!(target, Target::Agent { .. }) {
                self.pods.mark_unready(
                    &work.pod_uid,
                    "containers are being recreated (unreadyGracePeriodSeconds)",
                );
            }
            // kubelet pods: without an API server there is no readiness gate to set;
            // the grace period is still waited, so what watches the pod gets its time.
            tracing::info!(pod = %work.what(), ?grace, "pod marked not ready; waiting before the recreate");
            tokio::select! {
                _ = cancel.cancelled() => return Err("cancelled".to_owned()),
                _ = tokio::time::sleep(grace) => {}
            }
            work.unready_done = true;
            (self.save)(work);
        } else if work.unready_done && matches!(target, Target::Agent { .. }) {
            // Resumed after an agent restart: the pod stays not ready until the end.
            self.pods.mark_unready(
                &work.pod_uid,
                "containers are being recreated (unreadyGracePeriodSeconds)",
            );
        }
        if work.ordered {
            for i in 0..work.containers.len() {
                if work.containers[i].phase.finished() {
                    continue;
                }
                cancelled(cancel)?;
                self.stop(target, work, i).await?;
                self.wait(target, work, &[i], cancel).await?;
                self.check_failure_policy(work)?;
            }
        } else {
            let open: Vec<usize> = (0..work.containers.len())
                .filter(|&i| !work.containers[i].phase.finished())
                .collect();
            for &i in &open {
                // A stop begun goes on (as Kruise's daemon); a cancelled request (its
                // deadline passed) stops no further container.
                cancelled(cancel)?;
                self.stop(target, work, i).await?;
                self.check_failure_policy(work)?;
            }
            self.wait(target, work, &open, cancel).await?;
            self.check_failure_policy(work)?;
        }
        Ok(())
    }

    /// Under failurePolicy Fail, the first failed container ends the request.
    fn check_failure_policy(&self, work: &RecreateWork) -> Result<(), String> {
        if work.ignore_failures {
            return Ok(());
        }
        match work.containers.iter().find(|c| c.phase == Phase::Failed) {
            Some(failed) => Err(format!(
                "container {:?} failed: {}",
                failed.name, failed.message
            )),
            None => Ok(()),
        }
    }

    /// The pod's running sandbox on this node, agent-managed or kubelet's.
    async fn locate(&self, work: &RecreateWork) -> Result<Target, String> {
        if let Some(pod) = self.pods.pod(&work.pod_uid) {
            let sandbox = ready_sandbox(self.runtime, labels::POD_UID, &work.pod_uid, &|s| {
                self.pods.owner_of(s).as_deref() == Some(work.pod_uid.as_str())
            })
            .await?
            .ok_or_else(|| format!("{} has no running sandbox yet", work.what()))?;
            return Ok(Target::Agent {
                sandbox,
                pod: Box::new(pod),
            });
        }
        match ready_sandbox(self.runtime, labels::KUBELET_POD_UID, &work.pod_uid, &|s| {
            kubelets(s, &work.pod_uid)
        })
        .await?
        {
            Some(sandbox) => Ok(Target::Kubelet { sandbox }),
            None => Err(format!(
                "{} (uid {}) is not running on this node",
                work.what(),
                work.pod_uid
            )),
        }
    }
}

/// `Err("cancelled")` once the request is cancelled (the controller's word).
fn cancelled(cancel: &CancellationToken) -> Result<(), String> {
    if cancel.is_cancelled() {
        return Err("cancelled".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    use rigger_proto::v1::{self as proto, ContainerRecreatePhase};

    use super::stop::kubelet_pre_stop;

    #[test]
    fn a_chosen_container_replaced_by_its_successor_is_never_stopped_again() {
        let mut progress = ContainerProgress::pending("main");
        assert!(!progress.replaced_by("a"), "nothing chosen yet");
        progress.old_container_id = Some("a".to_owned());
        assert!(
            !progress.replaced_by("a"),
            "still the chosen one: stop (again) is right"
        );
        assert!(progress.replaced_by("b"), "a successor: the stop was done");
        // Progress saved before this field existed still loads.
        let old: ContainerProgress = serde_json::from_str(
            r#"{"name":"main","phase":"Recreating","oldContainerId":"a","isKilled":false}"#,
        )
        .unwrap();
        assert!(!old.stop_issued && old.replaced_by("b"));
    }

    #[test]
    fn kubelet_records_its_pre_stop_handler_as_json() {
        let annotations = HashMap::from([
            (
                KUBELET_PRE_STOP.to_owned(),
                r#"{"httpGet":{"path":"/drain","port":"http","scheme":"HTTP"}}"#.to_owned(),
            ),
            (
                KUBELET_PORTS.to_owned(),
                r#"[{"name":"http","containerPort":8080,"protocol":"TCP"}]"#.to_owned(),
            ),
        ]);
        let (container, handler) = kubelet_pre_stop("app", &annotations).unwrap().unwrap();
        assert_eq!(container.ports[0].container_port, 8080);
        assert_eq!(handler.http_get.unwrap().path.as_deref(), Some("/drain"));
        assert!(kubelet_pre_stop("app", &HashMap::new()).unwrap().is_none());
        let broken = HashMap::from([(KUBELET_PRE_STOP.to_owned(), "{".to_owned())]);
        assert!(
            kubelet_pre_stop("app", &broken)
                .unwrap_err()
                .contains("unreadable")
        );
    }

    #[test]
    fn open_containers_fail_with_the_reason_and_finished_ones_keep_theirs() {
        let mut work = RecreateWork::from_proto(&proto::RecreateContainers {
            pod_uid: "u".to_owned(),
            containers: vec!["a".to_owned(), "b".to_owned()],
            ..proto::RecreateContainers::default()
        });
        work.containers[0].phase = Phase::Succeeded;
        work.fail_open("deadline passed");
        let states = work.states();
        assert_eq!(states[0].phase(), ContainerRecreatePhase::Succeeded);
        assert_eq!(states[1].phase(), ContainerRecreatePhase::Failed);
        assert_eq!(states[1].message, "deadline passed");
    }
}
