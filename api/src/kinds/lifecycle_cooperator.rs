//! `kind: LifecycleCooperator` (rigger.dev/v1alpha1): an outside system that must
//! acknowledge operations on the agent-managed pods its selector matches, in its
//! namespace (see `rigger_proto::lifecycle`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use rigger_proto::lifecycle::{Cooperator, FailurePolicy, NodeExec, Operation, Webhook};

use crate::fields::{FieldError, LabelSelector, ObjectMeta, ValidateMeta as _, check_range};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age, or_dash};

pub const KIND: &str = "LifecycleCooperator";
pub use crate::fields::API_VERSION;
const DEFAULT_TIMEOUT_SECONDS: u32 = 30;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LifecycleCooperator {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CooperatorSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
        if let Some(timeout) = spec.timeout_seconds {
            // A pod's update waits for its cooperators: a day is longer than any should.
            check_range("spec.timeoutSeconds", u64::from(timeout), 1, 86_400)?;
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

/// LifecycleCooperator, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["lifecyclecooperators", "lc"],
    namespaced: true,
    read_only: None,
    notes: Some(
        "Rigger's own (`rigger.dev/v1alpha1`), in the spirit of Kuperator's \
             PodOpsLifecycle: outside systems asked at the Preparing and Completing steps of \
             in-place updates, recreates and deletions of the pods it selects.",
    ),
    schema: Some(crate::kind::schema_of::<LifecycleCooperator>),
    crd: Some(&crate::kind::CrdInfo {
        group: crate::kind::RIGGER_GROUP,
        versions: &["v1alpha1"],
        short_names: &["lc"],
        columns: &[crate::kind::AGE],
    }),
    table: crate::table::table_of::<LifecycleCooperator>,
};

impl Object for LifecycleCooperator {
    const INFO: &'static KindInfo = &INFO;
    metadata_field!();

    fn validate(&mut self) -> Result<(), FieldError> {
        LifecycleCooperator::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

impl Columns for LifecycleCooperator {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "OPERATIONS", "CALLS", "AGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        let operations: Vec<String> = self
            .spec
            .operations
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let calls = match (&self.spec.webhook, &self.spec.exec) {
            (Some(_), Some(_)) => "webhook,exec",
            (Some(_), None) => "webhook",
            (None, Some(_)) => "exec",
            (None, None) => "-",
        };
        vec![
            self.metadata.name.clone(),
            or_dash(&operations.join(",")),
            calls.to_owned(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_documented_examples_are_valid() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/examples/lifecycle-cooperator.yaml"
        ))
        .unwrap();
        let mut count = 0;
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let mut cooperator: LifecycleCooperator =
                serde::Deserialize::deserialize(document).unwrap();
            cooperator.metadata.namespace = Some("default".to_owned());
            cooperator.validate().unwrap();
            count += 1;
        }
        assert_eq!(count, 3);
    }

    #[test]
    fn one_kind_of_cooperator_and_no_labels_handler_on_deletions() {
        let cooperator = |spec: serde_json::Value| -> Result<(), String> {
            let object: LifecycleCooperator = serde_json::from_value(serde_json::json!({
                "apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": "c", "namespace": "default"}, "spec": spec,
            }))
            .map_err(|e| e.to_string())?;
            object.validate().map_err(|e| e.to_string())
        };
        let both =
            serde_json::json!({"webhook": {"url": "http://x"}, "exec": {"command": ["true"]}});
        assert!(
            cooperator(both)
                .unwrap_err()
                .starts_with("spec: exactly one")
        );
        let bad_url = serde_json::json!({"webhook": {"url": "ftp://x"}});
        assert!(
            cooperator(bad_url)
                .unwrap_err()
                .starts_with("spec.webhook.url")
        );
        let deletes = serde_json::json!({"labelsHandler": {"a": "b"}});
        assert!(
            cooperator(deletes)
                .unwrap_err()
                .starts_with("spec.operations")
        );
        let fine =
            serde_json::json!({"labelsHandler": {"a": "b"}, "operations": ["InPlaceUpdate"]});
        cooperator(fine).unwrap();
    }
}
