//! `kind: LifecycleCooperator` (rigger.dev/v1alpha1): an outside system that must
//! acknowledge operations on the agent-managed pods its selector matches, in its
//! namespace (see `rigger_proto::lifecycle`).

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
        match (&spec.webhook, &spec.exec) {
            (None, None) | (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "spec",
                    "exactly one of webhook and exec is required",
                ));
            }
            (Some(webhook), None) => {
                check_url(&webhook.url)
                    .map_err(|reason| FieldError::new("spec.webhook.url", reason))?;
            }
            (None, Some(exec)) if exec.command.is_empty() => {
                return Err(FieldError::new("spec.exec.command", "is required"));
            }
            (None, Some(_)) => {}
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
