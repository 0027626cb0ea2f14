//! `kind: ContainerRecreateRequest` (CRR) — OpenKruise's object and field names: restart
//! some containers of one pod in place (same pod, same IP, volumes kept, the other
//! containers untouched). Issue 6 executes it; this is its shape and validation.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{FieldError, ObjectMeta, ValidateMeta as _};

pub const KIND: &str = "ContainerRecreateRequest";
/// Kruise's labels naming the request's pod and node (set when the request is applied).
pub const POD_UID_LABEL: &str = "crr.apps.kruise.io/pod-uid";
pub const NODE_NAME_LABEL: &str = "crr.apps.kruise.io/node-name";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerRecreateRequest {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CrrSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CrrStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrrSpec {
    /// The pod, in the request's namespace.
    pub pod_name: String,
    pub containers: Vec<CrrContainer>,
    #[serde(default)]
    pub strategy: CrrStrategy,
    /// The request fails when it runs longer (at least 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// Deleted this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrrContainer {
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CrrStrategy {
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Recreate the next container only once the previous one succeeded.
    #[serde(default)]
    pub ordered_recreate: bool,
    /// [default: the pod's terminationGracePeriodSeconds]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<u64>,
    /// Mark the pod not ready, then wait this long before stopping anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unready_grace_period_seconds: Option<u64>,
    /// A recreated container succeeds once it has run this long (and is ready).
    #[serde(default)]
    pub min_started_seconds: u64,
    /// Also recreate a container that is still starting.
    #[serde(default)]
    pub force_recreate: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// The request fails at the first container that fails.
    #[default]
    Fail,
    /// Go on with the other containers.
    Ignore,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CrrStatus {
    pub phase: CrrPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_recreate_states: Vec<ContainerRecreateState>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CrrPhase {
    #[default]
    Pending,
    Recreating,
    Completed,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecreateState {
    pub name: String,
    pub phase: ContainerRecreatePhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The old container was stopped.
    #[serde(default)]
    pub is_killed: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerRecreatePhase {
    #[default]
    Pending,
    Recreating,
    Succeeded,
    Failed,
}

impl ContainerRecreateRequest {
    /// Refuse what cannot run, naming the field; Kruise's API group is accepted too.
    pub fn validate(&self) -> Result<(), FieldError> {
        // v1beta1's spec is v1alpha1's (its status adds conditions and a snapshot).
        super::check_kruise_v1beta1_api_version(&self.api_version)?;
        self.metadata.validate()?;
        let spec = &self.spec;
        if spec.pod_name.is_empty() {
            return Err(FieldError::new("spec.podName", "is required"));
        }
        super::check_dns_subdomain(&spec.pod_name)
            .map_err(|r| FieldError::new("spec.podName", r))?;
        if spec.containers.is_empty() {
            return Err(FieldError::new(
                "spec.containers",
                "at least one container is required",
            ));
        }
        let mut seen = HashSet::new();
        for (i, container) in spec.containers.iter().enumerate() {
            if container.name.is_empty() {
                return Err(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    "is required",
                ));
            }
            if !seen.insert(container.name.as_str()) {
                return Err(FieldError::new(
                    format!("spec.containers[{i}].name"),
                    format!("{:?} is listed twice", container.name),
                ));
            }
        }
        if spec.active_deadline_seconds.is_some_and(|d| d < 3) {
            return Err(FieldError::new(
                "spec.activeDeadlineSeconds",
                "must be at least 3",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::KRUISE_API_VERSION;

    #[test]
    fn kruise_v1beta1_applies_and_keeps_its_version() {
        let value = serde_json::json!({
            "apiVersion": crate::KRUISE_API_VERSION_V1BETA1,
            "kind": KIND,
            "metadata": {"name": "restart-app", "namespace": "default"},
            "spec": {
                "podName": "web-0",
                "containers": [{"name": "app"}],
                "strategy": {"failurePolicy": "Fail", "orderedRecreate": true},
            },
        });
        let crr: ContainerRecreateRequest = serde_json::from_value(value).unwrap();
        crr.validate().unwrap();
        let round = serde_json::to_value(&crr).unwrap();
        assert_eq!(round["apiVersion"], crate::KRUISE_API_VERSION_V1BETA1);
    }

    fn crr(spec: &serde_json::Value) -> Result<ContainerRecreateRequest, String> {
        let value = serde_json::json!({
            "apiVersion": KRUISE_API_VERSION,
            "kind": KIND,
            "metadata": {"name": "restart-app", "namespace": "default"},
            "spec": spec,
        });
        let crr: ContainerRecreateRequest =
            serde_json::from_value(value).map_err(|e| e.to_string())?;
        crr.validate().map_err(|e| e.to_string())?;
        Ok(crr)
    }

    #[test]
    fn kruise_example_applies_with_kruise_defaults() {
        let c = crr(&serde_json::json!({
            "podName": "web-0",
            "containers": [{"name": "app"}, {"name": "sidecar"}],
            "strategy": {"orderedRecreate": true, "unreadyGracePeriodSeconds": 3, "minStartedSeconds": 5},
            "activeDeadlineSeconds": 300,
            "ttlSecondsAfterFinished": 1800
        }))
        .unwrap();
        assert_eq!(c.spec.strategy.failure_policy, FailurePolicy::Fail);
        assert!(!c.spec.strategy.force_recreate);
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (
                serde_json::json!({"podName": "web-0", "containers": []}),
                "spec.containers: at least one",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}, {"name": "a"}]}),
                "spec.containers[1].name: \"a\" is listed twice",
            ),
            (
                serde_json::json!({"podName": "web-0", "containers": [{"name": "a"}], "activeDeadlineSeconds": 1}),
                "spec.activeDeadlineSeconds: must be at least 3",
            ),
            (
                serde_json::json!({"podName": "Web_0", "containers": [{"name": "a"}]}),
                "spec.podName:",
            ),
        ];
        for (spec, expected) in cases {
            let err = crr(&spec).unwrap_err();
            assert!(err.starts_with(expected), "{err}\n  expected: {expected}");
        }
    }
}
