//! A recreate as persisted with its task: the request, and how far each container got.

use rigger_proto::pod::{ContainerPort, Handler};
use rigger_proto::v1::{self as proto, ContainerRecreatePhase};
use serde::{Deserialize, Serialize};

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
    /// The request's own preStop for this container (instead of the container's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<Handler>,
    /// The ports that handler's named port resolves against (instead of the container's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
    /// The instance the request names (Kruise's statusContext): another one running
    /// means it was recreated already.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub named_instance: Option<String>,
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
            pre_stop: None,
            ports: Vec::new(),
            named_instance: None,
        }
    }

    /// A container with what the request says of it; a detail that cannot be read
    /// fails the container, naming it (nothing is stopped on a guess).
    fn with_detail(name: &str, detail: Option<&proto::RecreateContainerDetail>) -> Self {
        let mut progress = Self::pending(name);
        let Some(detail) = detail else {
            return progress;
        };
        let read = || -> Result<(Option<Handler>, Vec<ContainerPort>), String> {
            let pre_stop = (!detail.pre_stop_json.is_empty())
                .then(|| serde_json::from_str(&detail.pre_stop_json))
                .transpose()
                .map_err(|e| format!("the request's preStop is unreadable: {e}"))?;
            let ports = (!detail.ports_json.is_empty())
                .then(|| serde_json::from_str(&detail.ports_json))
                .transpose()
                .map_err(|e| format!("the request's ports are unreadable: {e}"))?
                .unwrap_or_default();
            Ok((pre_stop, ports))
        };
        match read() {
            Ok((pre_stop, ports)) => {
                progress.pre_stop = pre_stop;
                progress.ports = ports;
                progress.named_instance =
                    (!detail.container_id.is_empty()).then(|| detail.container_id.clone());
            }
            Err(reason) => {
                progress.phase = Phase::Failed;
                progress.message = reason;
            }
        }
        progress
    }

    /// The container this recreate chose is no longer the newest: a successor runs in
    /// its place (our stop before an agent restart, or a crash). The recreate's stop is
    /// then done; the successor is never stopped.
    pub(super) fn replaced_by(&self, newest_id: &str) -> bool {
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
    pub(super) fn finished(self) -> bool {
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
                .map(|name| {
                    let detail = task.details.iter().find(|d| &d.name == name);
                    ContainerProgress::with_detail(name, detail)
                })
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

    pub(super) fn what(&self) -> String {
        format!("pod {}/{}", self.pod_namespace, self.pod_name)
    }
}
