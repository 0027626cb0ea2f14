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

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerFilter, ContainerState, ContainerStatusRequest, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxFilter, PodSandboxState, StopContainerRequest,
};
use rigger_proto::pod::{Container, ContainerPort, Handler};
use rigger_proto::v1::{self as proto, ContainerRecreatePhase};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::handlers::{self, Action};
use crate::labels;
use crate::lifecycle::{LifecycleState, call_all};
use rigger_proto::lifecycle::Stage;
use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};

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

/// A recreate as persisted with its task: the request and how far it got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecreateWork {
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
    pub ordered: bool,
    pub ignore_failures: bool,
    pub termination_grace_period_seconds: Option<u32>,
    pub unready_grace_period_seconds: u32,
    pub min_started_seconds: u32,
    pub force_recreate: bool,
    /// The unready grace period was waited out.
    #[serde(default)]
    pub unready_done: bool,
    pub containers: Vec<ContainerProgress>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerProgress {
    pub name: String,
    pub phase: Phase,
    #[serde(default)]
    pub message: String,
    /// The container being recreated, once chosen: its next attempt is what we wait for.
    #[serde(default)]
    pub old_container_id: Option<String>,
    #[serde(default)]
    pub is_killed: bool,
    /// When the preStop hook (or the stop, without one) began, in seconds since the Unix
    /// epoch: a resumed recreate counts the grace period from here.
    #[serde(default)]
    pub stopping_since: Option<u64>,
    /// The preStop hook ran to its end (or failed): a resumed recreate does not run it
    /// again. One the agent's restart cut short runs again: hooks are at least once, as
    /// in Kubernetes.
    #[serde(default)]
    pub pre_stop_done: bool,
    /// StopContainer was asked for (saved before asking): an agent killed during a long
    /// stop knows, on resume, that the container it finds next may be the successor.
    #[serde(default)]
    pub stop_issued: bool,
}

impl ContainerProgress {
    /// A container not yet looked at.
    pub fn pending(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            phase: Phase::Pending,
            message: String::new(),
            old_container_id: None,
            is_killed: false,
            stopping_since: None,
            pre_stop_done: false,
            stop_issued: false,
        }
    }

    /// The container this recreate chose is no longer the newest: a successor runs in
    /// its place (our stop before an agent restart, or a crash). The recreate's stop is
    /// then done; the successor is never stopped.
    fn replaced_by(&self, newest_id: &str) -> bool {
        self.old_container_id
            .as_deref()
            .is_some_and(|old| old != newest_id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Pending,
    Recreating,
    Succeeded,
    Failed,
}

impl Phase {
    fn finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

impl RecreateWork {
    pub fn from_proto(task: &proto::RecreateContainers) -> Self {
        Self {
            pod_uid: task.pod_uid.clone(),
            pod_namespace: task.pod_namespace.clone(),
            pod_name: task.pod_name.clone(),
            ordered: task.ordered,
            ignore_failures: task.ignore_failures,
            termination_grace_period_seconds: task.termination_grace_period_seconds,
            unready_grace_period_seconds: task.unready_grace_period_seconds,
            min_started_seconds: task.min_started_seconds,
            force_recreate: task.force_recreate,
            unready_done: false,
            containers: task
                .containers
                .iter()
                .map(|name| ContainerProgress::pending(name))
                .collect(),
        }
    }

    pub fn states(&self) -> Vec<proto::ContainerRecreateState> {
        self.containers
            .iter()
            .map(|c| proto::ContainerRecreateState {
                name: c.name.clone(),
                phase: match c.phase {
                    Phase::Pending => ContainerRecreatePhase::Pending,
                    Phase::Recreating => ContainerRecreatePhase::Recreating,
                    Phase::Succeeded => ContainerRecreatePhase::Succeeded,
                    Phase::Failed => ContainerRecreatePhase::Failed,
                }
                .into(),
                message: c.message.clone(),
                is_killed: c.is_killed,
            })
            .collect()
    }

    /// End every container still open as failed with `reason` (deadline, cancel).
    pub fn fail_open(&mut self, reason: &str) {
        for container in &mut self.containers {
            if !container.phase.finished() {
                container.phase = Phase::Failed;
                container.message = reason.to_owned();
            }
        }
    }

    fn what(&self) -> String {
        format!("pod {}/{}", self.pod_namespace, self.pod_name)
    }
}

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
pub(crate) struct Recreate<'a> {
    pub(crate) pods: &'a dyn PodHost,
    pub(crate) containerd_address: &'a Path,
    pub(crate) save: &'a (dyn Fn(&RecreateWork) + Send + Sync),
    /// What the pod's lifecycle cooperators are asked about (agent-managed pods), if
    /// anything: `None` when the caller asked them already.
    pub(crate) operation: Option<rigger_proto::lifecycle::Operation>,
}

impl Recreate<'_> {
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
        let runtime = Runtime::connect(self.containerd_address, DEFAULT_CONNECT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let mut cri = RuntimeServiceClient::new(runtime.channel());
        let target = self.locate(&mut cri, work).await?;
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
        let outcome = self
            .recreate_containers(&mut cri, &target, work, cancel)
            .await;
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
        cri: &mut RuntimeServiceClient<Channel>,
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
                self.stop(cri, target, work, i).await?;
                self.wait(cri, target, work, &[i], cancel).await?;
                self.check_failure_policy(work)?;
            }
        } else {
            let open: Vec<usize> = (0..work.containers.len())
                .filter(|&i| !work.containers[i].phase.finished())
                .collect();
            for &i in &open {
                self.stop(cri, target, work, i).await?;
                self.check_failure_policy(work)?;
            }
            self.wait(cri, target, work, &open, cancel).await?;
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
    async fn locate(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        work: &RecreateWork,
    ) -> Result<Target, String> {
        if let Some(pod) = self.pods.pod(&work.pod_uid) {
            let sandbox = ready_sandbox(cri, labels::POD_UID, &work.pod_uid, &|s| {
                self.pods.owner_of(s).as_deref() == Some(work.pod_uid.as_str())
            })
            .await?
            .ok_or_else(|| format!("{} has no running sandbox yet", work.what()))?;
            return Ok(Target::Agent {
                sandbox,
                pod: Box::new(pod),
            });
        }
        match ready_sandbox(cri, labels::KUBELET_POD_UID, &work.pod_uid, &|s| {
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

    /// preStop and stop of container `i` (nothing if it was stopped before).
    async fn stop(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        target: &Target,
        work: &mut RecreateWork,
        i: usize,
    ) -> Result<(), String> {
        let name = work.containers[i].name.clone();
        if work.containers[i].is_killed {
            return Ok(());
        }
        let current = latest_container(cri, target, &name).await?;
        let Some(current) = current else {
            let message = format!("{} has no container {name:?}", work.what());
            let progress = &mut work.containers[i];
            progress.phase = Phase::Failed;
            progress.message = message;
            (self.save)(work);
            return Ok(());
        };
        if work.containers[i].replaced_by(&current.id) {
            tracing::info!(pod = %work.what(), container = %name, successor = %current.id, "the chosen container was already replaced; its successor is not stopped");
            let progress = &mut work.containers[i];
            progress.is_killed = true;
            progress.message = if progress.stop_issued {
                "stopped before the agent restarted".to_owned()
            } else {
                "the container was replaced before it was stopped".to_owned()
            };
            (self.save)(work);
            return Ok(());
        }
        let resumed = work.containers[i].old_container_id.as_deref() == Some(current.id.as_str());
        let running = current.state == ContainerState::ContainerRunning as i32;
        if !running {
            // Already down (crashed or exiting): nothing to stop, its next attempt counts.
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.old_container_id = Some(current.id.clone());
            progress.message =
                "the container was not running; waiting for its next attempt".to_owned();
            (self.save)(work);
            if matches!(target, Target::Agent { .. }) {
                self.pods.recreate_now(&current.id);
            }
            return Ok(());
        }
        if !resumed && !work.force_recreate && !self.started(target, work, &name, &current.id) {
            // Still starting: recreating it now would only restart the wait.
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.message =
                "the container is still starting; not stopped (forceRecreate is off)".to_owned();
            progress.old_container_id = None;
            progress.is_killed = false;
            progress.stop_issued = false;
            (self.save)(work);
            return Ok(());
        }
        {
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.old_container_id = Some(current.id.clone());
        }
        (self.save)(work);
        if let Target::Agent { .. } = target {
            // Registered before preStop: a hook that ends the process also gets the next
            // attempt at once.
            self.pods.recreate_now(&current.id);
        }
        let grace = u64::from(self.grace(target, work, &current));
        // The grace period runs from the first try, across agent restarts.
        let since = match work.containers[i].stopping_since {
            Some(since) if resumed => since,
            _ => {
                let now = unix_seconds();
                work.containers[i].stopping_since = Some(now);
                work.containers[i].pre_stop_done = false;
                (self.save)(work);
                now
            }
        };
        let grace_left = || grace.saturating_sub(unix_seconds().saturating_sub(since));
        let mut notes = Vec::new();
        if work.containers[i].pre_stop_done {
            notes.push("preStop ran before the agent restarted".to_owned());
        } else if resumed && grace_left() == 0 {
            notes.push(
                "preStop cut short by an agent restart; no grace left to run it again".to_owned(),
            );
        } else {
            if resumed {
                notes.push("preStop run again: an agent restart cut it short".to_owned());
            }
            match self.pre_stop(target, &name, &current) {
                Ok(None) => {}
                Ok(Some((container, handler))) => {
                    let bound = Duration::from_secs(grace_left());
                    match Action::of_handler(&handler) {
                        Some(action) => {
                            match handlers::run(cri, &container, &current.id, action, bound).await {
                                Ok(()) => {
                                    tracing::info!(pod = %work.what(), container = %name, "preStop hook ran");
                                }
                                Err(reason) => {
                                    tracing::warn!(pod = %work.what(), container = %name, %reason, "preStop hook failed; recreating anyway");
                                    notes.push(format!("preStop failed: {reason}"));
                                }
                            }
                        }
                        None => notes.push("preStop has no action; skipped".to_owned()),
                    }
                }
                Err(reason) => notes.push(reason),
            }
            work.containers[i].pre_stop_done = true;
            (self.save)(work);
        }
        // A stop begun before an agent restart is still under way: the container has had
        // its SIGTERM. It is waited for, within the grace left, not signalled again; past
        // the grace, StopContainer with no timeout kills it.
        let already_signalled = resumed && work.containers[i].stop_issued;
        let left = if already_signalled {
            notes.push("the stop begun before the agent restarted was waited for".to_owned());
            wait_for_exit(cri, &current.id, Duration::from_secs(grace_left())).await?;
            0
        } else {
            grace_left().max(MIN_STOP_SECONDS)
        };
        work.containers[i].stop_issued = true;
        (self.save)(work);
        cri.stop_container(StopContainerRequest {
            container_id: current.id.clone(),
            timeout: i64::try_from(left).unwrap_or(i64::MAX),
        })
        .await
        .map_err(|s| format!("stopping container {name:?}: {}", s.message()))?;
        tracing::info!(pod = %work.what(), container = %name, id = %current.id, "container stopped for recreate");
        let progress = &mut work.containers[i];
        progress.is_killed = true;
        progress.message = notes.join("; ");
        (self.save)(work);
        if let Target::Agent { .. } = target {
            self.pods.recreate_now(&current.id);
        }
        Ok(())
    }

    /// Whether a running container has started (agent pods: its startup probe and
    /// postStart passed; kubelet pods: running is all CRI tells).
    fn started(&self, target: &Target, work: &RecreateWork, name: &str, id: &str) -> bool {
        match target {
            Target::Agent { pod, .. } => {
                let has_startup_probe = pod
                    .spec
                    .containers
                    .iter()
                    .any(|c| c.name == name && c.startup_probe.is_some());
                !has_startup_probe
                    || self
                        .pods
                        .container_started(&work.pod_uid, name, id)
                        .unwrap_or(false)
            }
            Target::Kubelet { .. } => true,
        }
    }

    /// The grace period: the request's, else the pod's.
    fn grace(&self, target: &Target, work: &RecreateWork, current: &k8s_cri::v1::Container) -> u32 {
        if let Some(grace) = work.termination_grace_period_seconds {
            return grace;
        }
        match target {
            Target::Agent { pod, .. } => {
                u32::try_from(pod.spec.termination_grace_period_seconds).unwrap_or(u32::MAX)
            }
            Target::Kubelet { .. } => current
                .annotations
                .get(KUBELET_GRACE)
                .and_then(|g| g.parse().ok())
                .unwrap_or(DEFAULT_GRACE_SECONDS),
        }
    }

    /// The container's preStop hook and the spec its named ports resolve against.
    fn pre_stop(
        &self,
        target: &Target,
        name: &str,
        current: &k8s_cri::v1::Container,
    ) -> Result<Option<(Container, Handler)>, String> {
        match target {
            Target::Agent { pod, .. } => Ok(pod
                .spec
                .containers
                .iter()
                .find(|c| c.name == name)
                .and_then(|c| {
                    let handler = c.lifecycle.as_ref()?.pre_stop.clone()?;
                    Some((c.clone(), handler))
                })),
            Target::Kubelet { .. } => kubelet_pre_stop(name, &current.annotations),
        }
    }

    /// Wait until each container in `which` has a new attempt that has run
    /// `minStartedSeconds` (and is ready, for agent pods), or failed.
    async fn wait(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        target: &Target,
        work: &mut RecreateWork,
        which: &[usize],
        cancel: &CancellationToken,
    ) -> Result<(), String> {
        let min_started = Duration::from_secs(u64::from(work.min_started_seconds));
        loop {
            if !self.pod_still_here(cri, target, work).await? {
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
                let Some(current) = latest_container(cri, target, &name).await? else {
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
                let status = cri
                    .container_status(ContainerStatusRequest {
                        container_id: current.id.clone(),
                        verbose: false,
                    })
                    .await
                    .map_err(|s| format!("status of container {name:?}: {}", s.message()))?
                    .into_inner()
                    .status
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

    async fn pod_still_here(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
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
        Ok(ready_sandbox(cri, label, &work.pod_uid, &owned)
            .await?
            .as_deref()
            == Some(target.sandbox()))
    }
}

/// A kubelet sandbox of pod `uid`: kubelet's uid label (the caller's filter) and the
/// sandbox's own uid agree. (The agent's sandboxes never carry kubelet's labels.)
fn kubelets(sandbox: &k8s_cri::v1::PodSandbox, uid: &str) -> bool {
    sandbox.metadata.as_ref().is_some_and(|m| m.uid == uid)
}

/// The ready sandbox whose `label` is `uid` and that `owned` accepts.
async fn ready_sandbox(
    cri: &mut RuntimeServiceClient<Channel>,
    label: &str,
    uid: &str,
    owned: &(dyn Fn(&k8s_cri::v1::PodSandbox) -> bool + Sync),
) -> Result<Option<String>, String> {
    let sandboxes = cri
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: HashMap::from([(label.to_owned(), uid.to_owned())]),
                ..PodSandboxFilter::default()
            }),
        })
        .await
        .map_err(|s| format!("listing pod sandboxes: {}", s.message()))?
        .into_inner()
        .items;
    Ok(sandboxes
        .into_iter()
        .find(|s| s.state == PodSandboxState::SandboxReady as i32 && owned(s))
        .map(|s| s.id))
}

/// The newest attempt of container `name` in the target's sandbox.
async fn latest_container(
    cri: &mut RuntimeServiceClient<Channel>,
    target: &Target,
    name: &str,
) -> Result<Option<k8s_cri::v1::Container>, String> {
    let labels = HashMap::from([(target.name_label().to_owned(), name.to_owned())]);
    newest_container(cri, target.sandbox(), labels).await
}

/// The newest attempt among the containers with `labels` (in `sandbox`; "" = any).
pub(crate) async fn newest_container(
    cri: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
    labels: HashMap<String, String>,
) -> Result<Option<k8s_cri::v1::Container>, String> {
    let containers = cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: sandbox.to_owned(),
                label_selector: labels,
                ..ContainerFilter::default()
            }),
        })
        .await
        .map_err(|s| format!("listing containers: {}", s.message()))?
        .into_inner()
        .containers;
    Ok(containers
        .into_iter()
        .max_by_key(|c| (c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at)))
}

/// The preStop hook kubelet recorded on a container, with its ports (for named ports).
fn kubelet_pre_stop(
    name: &str,
    annotations: &HashMap<String, String>,
) -> Result<Option<(Container, Handler)>, String> {
    let Some(text) = annotations.get(KUBELET_PRE_STOP) else {
        return Ok(None);
    };
    let handler: Handler = serde_json::from_str(text)
        .map_err(|e| format!("preStop skipped: kubelet's {KUBELET_PRE_STOP} is unreadable: {e}"))?;
    let ports: Vec<ContainerPort> = annotations
        .get(KUBELET_PORTS)
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or_default();
    let container = Container {
        name: name.to_owned(),
        ports,
        ..Container::default()
    };
    Ok(Some((container, handler)))
}

/// Now, in whole seconds since the Unix epoch (persisted progress outlives the process).
fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Until container `id` is no longer running, or `within` has passed.
async fn wait_for_exit(
    cri: &mut RuntimeServiceClient<Channel>,
    id: &str,
    within: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let status = cri
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await
            .map_err(|s| format!("container {id}: {}", s.message()))?
            .into_inner()
            .status;
        let running = status.is_some_and(|c| c.state == ContainerState::ContainerRunning as i32);
        if !running || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
