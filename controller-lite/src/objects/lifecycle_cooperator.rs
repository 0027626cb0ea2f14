//! `kind: LifecycleCooperator` (rigger.dev/v1alpha1): an outside system that must
//! acknowledge operations on the agent-managed pods its selector matches, in its
//! namespace (see `rigger_proto::lifecycle`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use rigger_proto::lifecycle::{Cooperator, FailurePolicy, NodeExec, Operation, Webhook};

use super::{FieldError, LabelSelector, ObjectMeta, ValidateMeta as _};

pub const KIND: &str = "LifecycleCooperator";
pub const API_VERSION: &str = "rigger.dev/v1alpha1";
const DEFAULT_TIMEOUT_SECONDS: u32 = 30;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LifecycleCooperator {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CooperatorSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CooperatorSpec {
    /// Pods of the object's namespace it cooperates on (empty: all).
    #[serde(default)]
    pub selector: LabelSelector,
    /// [default: all of InPlaceUpdate, Recreate, Delete]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operations: Vec<Operation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<Webhook>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<NodeExec>,
    /// Kruise's labelsHandler: hold Preparing while the pod has these labels, and
    /// Completing until it has them again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels_handler: BTreeMap<String, String>,
    /// Kruise's markPodNotReady: the pod is reported not ready from Preparing on.
    #[serde(default)]
    pub mark_pod_not_ready: bool,
    /// How long an unacknowledged call holds the operation [default: 30].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    #[serde(default)]
    pub failure_policy: FailurePolicy,
}

impl LifecycleCooperator {
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.api_version != API_VERSION {
            return Err(FieldError::new(
                "apiVersion",
                format!("must be {API_VERSION}"),
            ));
        }
        self.metadata.validate()?;
        let spec = &self.spec;
        spec.selector.validate("spec.selector")?;
        let kinds = usize::from(spec.webhook.is_some())
            + usize::from(spec.exec.is_some())
            + usize::from(!spec.labels_handler.is_empty());
        if kinds != 1 {
            return Err(FieldError::new(
                "spec",
                "exactly one of webhook, exec and labelsHandler is required",
            ));
        }
        if let Some(webhook) = &spec.webhook {
            check_url(&webhook.url)
                .map_err(|reason| FieldError::new("spec.webhook.url", reason))?;
        }
        if spec.exec.as_ref().is_some_and(|e| e.command.is_empty()) {
            return Err(FieldError::new("spec.exec.command", "is required"));
        }
        if !spec.labels_handler.is_empty()
            && (spec.operations.is_empty() || spec.operations.contains(&Operation::Delete))
        {
            return Err(FieldError::new(
                "spec.operations",
                "a labelsHandler needs operations without Delete (a deleted pod's labels can no longer change: Rigger deletes at once)",
            ));
        }
        if spec.timeout_seconds == Some(0) {
            return Err(FieldError::new("spec.timeoutSeconds", "must be at least 1"));
        }
        Ok(())
    }

    /// As the agent runs it.
    pub fn cooperator(&self) -> Cooperator {
        let spec = &self.spec;
        Cooperator {
            name: format!(
                "{}/{}",
                self.metadata.namespace.as_deref().unwrap_or_default(),
                self.metadata.name
            ),
            operations: if spec.operations.is_empty() {
                Operation::ALL.to_vec()
            } else {
                spec.operations.clone()
            },
            webhook: spec.webhook.clone(),
            exec: spec.exec.clone(),
            labels_handler: spec.labels_handler.clone(),
            mark_pod_not_ready: spec.mark_pod_not_ready,
            timeout_seconds: spec.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS),
            failure_policy: spec.failure_policy,
        }
    }
}

/// An http(s) URL with a host.
fn check_url(text: &str) -> Result<(), String> {
    let rest = text
        .strip_prefix("http://")
        .or_else(|| text.strip_prefix("https://"))
        .ok_or_else(|| format!("{text:?} is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("{text:?} has no host"));
    }
    Ok(())
}
