//! Lifecycle cooperators: outside systems (load balancers, service registries) that take
//! part in operations on agent-managed pods — in the spirit of Kuperator's PodOpsLifecycle.
//! Each is called at `Preparing` (before anything is touched) and `Completing` (after)
//! and must acknowledge before the operation goes on. The controller keeps them as
//! `kind: LifecycleCooperator` objects and hands each pod's matching ones to its agent,
//! which makes the calls.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The operations a cooperator can take part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Operation {
    /// Container images (or fieldRef'd metadata) changed: containers restart in place.
    InPlaceUpdate,
    /// A ContainerRecreateRequest.
    Recreate,
    /// The pod is deleted.
    Delete,
}

impl Operation {
    pub const ALL: [Self; 3] = [Self::InPlaceUpdate, Self::Recreate, Self::Delete];
}

/// When a cooperator is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Stage {
    Preparing,
    Completing,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum FailurePolicy {
    /// No acknowledgement in time: the operation does not go on (it is tried again later).
    #[default]
    Fail,
    /// No acknowledgement in time: go on anyway.
    Ignore,
}

/// One cooperator as the agent runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cooperator {
    /// `namespace/name` of the LifecycleCooperator object, for messages.
    pub name: String,
    pub operations: Vec<Operation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<NodeExec>,
    /// Kruise's labelsHandler: `Preparing` is acknowledged once the pod no longer has
    /// these labels (a controller of the user's removed them), `Completing` once it has
    /// them again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels_handler: BTreeMap<String, String>,
    /// Kruise's markPodNotReady: the pod is reported not ready from `Preparing` on.
    #[serde(default)]
    pub mark_pod_not_ready: bool,
    pub timeout_seconds: u32,
    pub failure_policy: FailurePolicy,
}

/// POSTs a JSON description of the pod and the stage; any 2xx answer acknowledges, any
/// other answer (or none) is asked again each second until the timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    pub url: String,
}

/// Runs a command on the node (environment: RIGGER_STAGE, RIGGER_OPERATION,
/// RIGGER_POD_NAMESPACE, RIGGER_POD_NAME, RIGGER_POD_UID); exit 0 acknowledges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeExec {
    pub command: Vec<String>,
}
