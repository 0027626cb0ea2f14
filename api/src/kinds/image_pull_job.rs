//! `kind: ImagePullJob` — OpenKruise's object and field names: pre-download one image on a
//! set of nodes, at most `parallelism` nodes at a time.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::fields::{
    FieldError, IntOrPercent, LabelSelector, MAX_INT32, ObjectMeta, ValidateMeta as _, check_range,
};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age, bytes};

pub const KIND: &str = "ImagePullJob";
/// The label an ImageListPullJob's ImagePullJobs carry: the list's name. Set only by the
/// controller (an apply never keeps it), so that a list manages only its own jobs.
pub const OWNER_LABEL: &str = "imagelistpulljob.rigger.dev/name";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullJob {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ImagePullJobSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ImagePullJobStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullJobSpec {
    pub image: String,
    /// Which nodes: by name or labels. Exclusive with `podSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<NodeSelector>,
    /// Nodes running pods whose labels match. Exclusive with `selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Nodes pulling at once [default: 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<IntOrPercent>,
    #[serde(default)]
    pub completion_policy: CompletionPolicy,
    #[serde(default)]
    pub pull_policy: PullPolicy,
    /// Names of `kind: Secret` objects (docker config JSON) in the job's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_secrets: Vec<String>,
    #[serde(default)]
    pub image_pull_policy: ImagePullPolicy,
    /// Kruise passes these to CRI's `PullImage` as the pull's sandbox metadata. Rigger
    /// pulls through containerd's API, where a pull has no sandbox: they are kept on the
    /// job (and shown by `get -o yaml`), not sent anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<SandboxConfig>,
}

/// Kruise's `sandboxConfig`: metadata of the pull's sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxConfig {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Kruise's `selector`: node names, or node labels — not both.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(from = "NodeSelectorFields", into = "NodeSelectorFields")]
pub struct NodeSelector {
    pub names: Vec<String>,
    pub labels: LabelSelector,
}

/// [`NodeSelector`] as written: Kruise embeds the label selector's fields beside
/// `names`; spelled out here so that an unknown field is refused (serde's `flatten`
/// would let it by).
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeSelectorFields {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    names: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    match_expressions: Vec<crate::fields::LabelSelectorRequirement>,
}

impl From<NodeSelectorFields> for NodeSelector {
    fn from(fields: NodeSelectorFields) -> Self {
        Self {
            names: fields.names,
            labels: LabelSelector {
                match_labels: fields.match_labels,
                match_expressions: fields.match_expressions,
            },
        }
    }
}

impl From<NodeSelector> for NodeSelectorFields {
    fn from(selector: NodeSelector) -> Self {
        Self {
            names: selector.names,
            match_labels: selector.labels.match_labels,
            match_expressions: selector.labels.match_expressions,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompletionPolicy {
    #[serde(rename = "type", default)]
    pub kind: CompletionPolicyType,
    /// `Always` only: the job fails when it runs longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u64>,
    /// `Always` only: the job is deleted this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u64>,
}

impl CompletionPolicy {
    /// Whether `ttlSecondsAfterFinished` has passed at `now` for what finished at
    /// `completion_time` (RFC 3339; `None`, or unreadable, is not finished): a job's, or
    /// an image list's (whose template this is).
    pub fn ttl_passed(&self, completion_time: Option<&str>, now: SystemTime) -> bool {
        self.kind == CompletionPolicyType::Always
            && self.ttl_seconds_after_finished.is_some_and(|ttl| {
                completion_time
                    .and_then(|text| humantime::parse_rfc3339(text).ok())
                    .is_some_and(|done| {
                        now.duration_since(done)
                            .is_ok_and(|since| since >= std::time::Duration::from_secs(ttl))
                    })
            })
    }
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum CompletionPolicyType {
    /// Finish once every selected node pulled (or failed).
    #[default]
    Always,
    /// Never finish: keep the image on matching nodes, including nodes that join later.
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PullPolicy {
    /// One node's pull fails after this long [default: 600].
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Retries of one node's pull before it counts as failed [default: 3].
    #[serde(default = "default_backoff_limit")]
    pub backoff_limit: u32,
}

impl Default for PullPolicy {
    fn default() -> Self {
        Self {
            timeout_seconds: default_timeout_seconds(),
            backoff_limit: default_backoff_limit(),
        }
    }
}

fn default_timeout_seconds() -> u64 {
    600
}

fn default_backoff_limit() -> u32 {
    3
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ImagePullPolicy {
    /// Pull even when the node has the image (a tag may have moved).
    Always,
    /// Skip nodes that have the image already.
    #[default]
    IfNotPresent,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePullJobStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    pub desired: u32,
    pub active: u32,
    pub succeeded: u32,
    pub failed: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `Complete` once the job finished (completionPolicy Always).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::fields::Condition>,
    /// Each selected node's pull (Rigger's addition to Kruise's status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodePullStatus>,
}

/// One node's part of a job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePullStatus {
    pub name: String,
    pub phase: NodePullPhase,
    /// Pulls started on this node (retries included).
    #[serde(default)]
    pub attempts: u32,
    /// The current attempt's task id on the agent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default)]
    pub bytes_total: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Digest the image name points at on the node, once pulled.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// Failed because the node went silent or away: the pull resumes if it returns
    /// before the job finishes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_lost: bool,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum NodePullPhase {
    /// Waiting for a parallelism slot (or for a retry).
    #[default]
    Waiting,
    Pulling,
    Succeeded,
    Failed,
}

impl ImagePullJob {
    /// Refuse what cannot run, naming the field; Kruise's API group is accepted too.
    pub fn validate(&self) -> Result<(), FieldError> {
        crate::fields::check_kruise_v1beta1_api_version(&self.api_version)?;
        if self.kind != KIND {
            return Err(FieldError::new(
                "kind",
                format!("{:?}: expected {KIND}", self.kind),
            ));
        }
        self.metadata.validate()?;
        self.spec.validate()
    }
}

impl ImagePullJobSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.image.trim().is_empty() {
            return Err(FieldError::new("spec.image", "is required"));
        }
        oci_spec::distribution::Reference::from_str(&self.image).map_err(|e| {
            FieldError::new(
                "spec.image",
                format!("{:?} is not an image reference: {e}", self.image),
            )
        })?;
        match (&self.selector, &self.pod_selector) {
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "spec.podSelector",
                    "selector and podSelector are mutually exclusive",
                ));
            }
            (Some(selector), None) => {
                if !selector.names.is_empty() && !selector.labels.is_empty() {
                    return Err(FieldError::new(
                        "spec.selector.names",
                        "names and matchLabels/matchExpressions are mutually exclusive",
                    ));
                }
                for (i, name) in selector.names.iter().enumerate() {
                    if rigger_proto::check_node_name(name).is_err() {
                        return Err(FieldError::new(
                            format!("spec.selector.names[{i}]"),
                            format!("{name:?} is not a node name"),
                        ));
                    }
                }
                selector.labels.validate("spec.selector")?;
            }
            (None, Some(pods)) => pods.validate("spec.podSelector")?,
            (None, None) => {}
        }
        if let Some(sandbox) = &self.sandbox_config {
            for (key, value) in &sandbox.labels {
                crate::fields::check_label(key, value).map_err(|why| {
                    FieldError::new(format!("spec.sandboxConfig.labels[{key:?}]"), why)
                })?;
            }
            for key in sandbox.annotations.keys() {
                crate::fields::check_label_key(key).map_err(|why| {
                    FieldError::new(format!("spec.sandboxConfig.annotations[{key:?}]"), why)
                })?;
            }
        }
        let policy = &self.completion_policy;
        if policy.kind == CompletionPolicyType::Never
            && (policy.active_deadline_seconds.is_some()
                || policy.ttl_seconds_after_finished.is_some())
        {
            return Err(FieldError::new(
                "spec.completionPolicy",
                "activeDeadlineSeconds and ttlSecondsAfterFinished only apply to type Always",
            ));
        }
        if let Some(deadline) = policy.active_deadline_seconds {
            check_range(
                "spec.completionPolicy.activeDeadlineSeconds",
                deadline,
                1,
                MAX_INT32,
            )?;
        }
        if let Some(ttl) = policy.ttl_seconds_after_finished {
            check_range(
                "spec.completionPolicy.ttlSecondsAfterFinished",
                ttl,
                0,
                MAX_INT32,
            )?;
        }
        check_range(
            "spec.pullPolicy.timeoutSeconds",
            self.pull_policy.timeout_seconds,
            1,
            MAX_INT32,
        )?;
        check_range(
            "spec.pullPolicy.backoffLimit",
            u64::from(self.pull_policy.backoff_limit),
            0,
            MAX_INT32,
        )?;
        if self.pod_selector.is_some() && !self.pull_secrets.is_empty() {
            // Pod labels are what nodes report about themselves; credentials go only
            // to nodes an admin chose (rigger-controller's node_labels).
            return Err(FieldError::new(
                "spec.pullSecrets",
                "a job that chooses nodes by podSelector cannot carry pull secrets: nodes report their pods' labels themselves; choose the nodes by selector.names or by labels an admin set (riggerctl label node)",
            ));
        }
        for (i, secret) in self.pull_secrets.iter().enumerate() {
            if crate::fields::check_dns_subdomain(secret).is_err() {
                return Err(FieldError::new(
                    format!("spec.pullSecrets[{i}]"),
                    format!("{secret:?} is not a Secret name"),
                ));
            }
        }
        Ok(())
    }

    /// Nodes pulling at once for a job over `nodes` nodes [default: 1]. 0 (or 0%)
    /// pauses the job, as in Kruise, until it is raised; any other value lets at least
    /// one node pull.
    pub fn parallelism_for(&self, nodes: usize) -> usize {
        match self.parallelism.unwrap_or(IntOrPercent::Int(1)) {
            IntOrPercent::Int(0) | IntOrPercent::Percent(0) => 0,
            parallelism => parallelism.of(nodes).clamp(1, nodes.max(1)),
        }
    }

    /// `parallelism: 0`: nothing starts until it is raised.
    pub fn paused(&self) -> bool {
        matches!(
            self.parallelism,
            Some(IntOrPercent::Int(0) | IntOrPercent::Percent(0))
        )
    }
}

/// ImagePullJob, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["imagepulljobs", "ipj"],
    namespaced: true,
    read_only: None,
    notes: Some(
        "Pre-download one image on a set of nodes, at most `parallelism` at a time. \
             Accepted as `apps.kruise.io/v1alpha1`, `apps.kruise.io/v1beta1` and \
             `rigger.dev/v1alpha1`, kept in the version applied.\n\n\
             Differs from Kruise: `sandboxConfig` is kept on the job but sent nowhere (Rigger \
             pulls through containerd's API, where a pull has no sandbox); a job choosing \
             nodes by `podSelector` cannot carry `pullSecrets` (nodes report their pods' \
             labels themselves); `status.nodes` adds each node's phase and bytes. An edit of \
             `pullPolicy.timeoutSeconds` reaches the pulls still going (each node's task is \
             sent again with the new limit, counted from that pull's start; kruise#2221: \
             Kruise's daemon keeps the limit it started with).",
    ),
    schema: Some(crate::kind::schema_of::<ImagePullJob>),
    crd: Some(&crate::kind::CrdInfo {
        group: crate::kind::KRUISE_GROUP,
        versions: &["v1alpha1", "v1beta1"],
        short_names: &[],
        columns: &[
            crate::kind::PrinterColumn {
                name: "TOTAL",
                kind: "integer",
                json_path: ".status.desired",
                description: "Nodes the job selected.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "ACTIVE",
                kind: "integer",
                json_path: ".status.active",
                description: "Nodes pulling now.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "SUCCEED",
                kind: "integer",
                json_path: ".status.succeeded",
                description: "Nodes that pulled the image.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "FAILED",
                kind: "integer",
                json_path: ".status.failed",
                description: "Nodes whose pull failed.",
                only_in: None,
            },
            crate::kind::AGE,
            crate::kind::PrinterColumn {
                name: "MESSAGE",
                kind: "string",
                json_path: ".status.message",
                description: "Why the job failed, if it did.",
                only_in: Some("v1alpha1"),
            },
        ],
    }),
    table: crate::table::table_of::<ImagePullJob>,
};

impl Object for ImagePullJob {
    const INFO: &'static KindInfo = &INFO;
    metadata_field!();

    /// The owner label of an ImageListPullJob's jobs is the controller's to set: a job
    /// applied with it does not become a list's (to be replaced or deleted with it).
    fn strip_owned(&mut self) {
        self.status = None;
        self.metadata.labels.remove(OWNER_LABEL);
    }

    /// A list's job applied again stays the list's.
    fn keep_filled(&mut self, old: &Self) {
        if let Some(owner) = old.metadata.labels.get(OWNER_LABEL) {
            self.metadata
                .labels
                .insert(OWNER_LABEL.to_owned(), owner.clone());
        }
    }

    fn validate(&mut self) -> Result<(), FieldError> {
        ImagePullJob::validate(self)
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }

    fn check_update(&self, old: &Self) -> Result<(), FieldError> {
        let immutable = [
            ("spec.image", old.spec.image != self.spec.image),
            ("spec.selector", old.spec.selector != self.spec.selector),
            (
                "spec.podSelector",
                old.spec.pod_selector != self.spec.pod_selector,
            ),
        ];
        match immutable.iter().find(|(_, changed)| *changed) {
            Some((field, _)) => Err(FieldError::new(
                *field,
                "cannot change on an existing job; delete it and apply again",
            )),
            None => Ok(()),
        }
    }
}

impl Columns for ImagePullJob {
    fn header(wide: bool) -> Vec<&'static str> {
        let mut header = vec![
            "NAME",
            "TOTAL",
            "ACTIVE",
            "SUCCEEDED",
            "FAILED",
            "PROGRESS",
            "AGE",
            "MESSAGE",
        ];
        if wide {
            header.push("IMAGE");
        }
        header
    }

    fn row(&self, wide: bool, now: SystemTime) -> Vec<String> {
        // Borrowed, not cloned: a job's status holds an entry per node.
        let none = ImagePullJobStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        let (done, total) = status
            .nodes
            .iter()
            .fold((0, 0), |(d, t), n| (d + n.bytes_done, t + n.bytes_total));
        let progress = match total {
            0 => "-".to_owned(),
            _ => format!("{}/{}", bytes(done), bytes(total)),
        };
        let mut row = vec![
            self.metadata.name.clone(),
            status.desired.to_string(),
            status.active.to_string(),
            status.succeeded.to_string(),
            status.failed.to_string(),
            progress,
            age(self.metadata.creation_timestamp.as_deref(), now),
            status.message.clone(),
        ];
        if wide {
            row.push(self.spec.image.clone());
        }
        row
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fields::KRUISE_API_VERSION;

    fn job(spec: &serde_json::Value) -> Result<ImagePullJob, String> {
        let value = serde_json::json!({
            "apiVersion": KRUISE_API_VERSION,
            "kind": "ImagePullJob",
            "metadata": {"name": "warm-nginx", "namespace": "default"},
            "spec": spec,
        });
        let job: ImagePullJob = serde_json::from_value(value).map_err(|e| e.to_string())?;
        job.validate().map_err(|e| e.to_string())?;
        Ok(job)
    }

    #[test]
    fn kruise_example_applies_with_kruise_defaults() {
        let job = job(&serde_json::json!({
            "image": "nginx:1.27",
            "parallelism": "25%",
            "selector": {"matchLabels": {"pool": "web"}},
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 1200},
        }))
        .unwrap();
        assert_eq!(job.spec.pull_policy, PullPolicy::default());
        assert_eq!(job.spec.pull_policy.timeout_seconds, 600);
        assert_eq!(job.spec.image_pull_policy, ImagePullPolicy::IfNotPresent);
        assert_eq!(job.spec.parallelism_for(10), 3);
        assert_eq!(job.spec.parallelism_for(0), 1);
        let round = serde_json::to_value(&job).unwrap();
        assert_eq!(round["spec"]["parallelism"], "25%");
        assert_eq!(
            round["spec"]["selector"],
            serde_json::json!({"matchLabels": {"pool": "web"}})
        );
    }

    #[test]
    fn an_unknown_selector_field_is_refused() {
        let err = job(&serde_json::json!({
            "image": "nginx:1.27",
            "selector": {"matchLabel": {"pool": "web"}},
        }))
        .unwrap_err();
        assert!(err.contains("unknown field `matchLabel`"), "{err}");
    }

    #[test]
    fn kruise_v1beta1_applies_and_keeps_its_version() {
        let value = serde_json::json!({
            "apiVersion": crate::fields::KRUISE_API_VERSION_V1BETA1,
            "kind": "ImagePullJob",
            "metadata": {"name": "warm", "namespace": "default"},
            "spec": {
                "image": "nginx:1.27",
                "parallelism": 0,
                "sandboxConfig": {
                    "labels": {"app.kubernetes.io/name": "warm"},
                    "annotations": {"example.com/why": "pre-download before the rollout"},
                },
                "completionPolicy": {"type": "Always"},
            },
        });
        let job: ImagePullJob = serde_json::from_value(value).unwrap();
        job.validate().unwrap();
        // parallelism 0 pauses, as in Kruise.
        assert!(job.spec.paused());
        assert_eq!(job.spec.parallelism_for(10), 0);
        let round = serde_json::to_value(&job).unwrap();
        assert_eq!(
            round["apiVersion"],
            crate::fields::KRUISE_API_VERSION_V1BETA1
        );
        assert_eq!(
            round["spec"]["sandboxConfig"]["labels"]["app.kubernetes.io/name"],
            "warm"
        );
        let mut other = job;
        other.api_version = "apps.kruise.io/v2".to_owned();
        assert!(
            other
                .validate()
                .unwrap_err()
                .to_string()
                .contains("apiVersion")
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (serde_json::json!({"image": ""}), "spec.image"),
            (serde_json::json!({"image": "Not A Ref"}), "spec.image"),
            (
                serde_json::json!({"image": "a:1", "selector": {"names": ["n1"]}, "podSelector": {}}),
                "spec.podSelector",
            ),
            (
                serde_json::json!({"image": "a:1", "selector": {"names": ["n1"], "matchLabels": {"a": "b"}}}),
                "spec.selector.names",
            ),
            (
                serde_json::json!({"image": "a:1", "selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
                "spec.selector.matchExpressions[0].values",
            ),
            (
                serde_json::json!({"image": "a:1", "sandboxConfig": {"labels": {"bad key!": "v"}}}),
                "spec.sandboxConfig.labels",
            ),
            (
                serde_json::json!({"image": "a:1", "sandboxConfig": {"annotations": {"a/b/c": "v"}}}),
                "spec.sandboxConfig.annotations",
            ),
            (
                serde_json::json!({"image": "a:1", "sandboxConfig": {"podLabels": {}}}),
                "podLabels",
            ),
            (
                serde_json::json!({"image": "a:1", "parallelism": "150%"}),
                "150%",
            ),
            (
                serde_json::json!({"image": "a:1", "completionPolicy": {"type": "Never", "ttlSecondsAfterFinished": 5}}),
                "spec.completionPolicy",
            ),
            (
                serde_json::json!({"image": "a:1", "pullSecrets": ["Bad_Name"]}),
                "spec.pullSecrets[0]",
            ),
            (
                serde_json::json!({"image": "a:1", "imagePullPolicy": "Sometimes"}),
                "Sometimes",
            ),
            (
                serde_json::json!({"image": "a:1", "paralelism": 2}),
                "paralelism",
            ),
            // Every number is bounded (Kubernetes' int32), the field named.
            (
                serde_json::json!({"image": "a:1", "pullPolicy": {"timeoutSeconds": 18446744073709551615u64}}),
                "spec.pullPolicy.timeoutSeconds: must be between 1 and 2147483647",
            ),
            (
                serde_json::json!({"image": "a:1", "pullPolicy": {"timeoutSeconds": 0}}),
                "spec.pullPolicy.timeoutSeconds",
            ),
            (
                serde_json::json!({"image": "a:1", "pullPolicy": {"backoffLimit": 4294967295u32}}),
                "spec.pullPolicy.backoffLimit",
            ),
            (
                serde_json::json!({"image": "a:1", "completionPolicy": {"activeDeadlineSeconds": 2147483648u64}}),
                "spec.completionPolicy.activeDeadlineSeconds",
            ),
            (
                serde_json::json!({"image": "a:1", "completionPolicy": {"ttlSecondsAfterFinished": 18446744073709551615u64}}),
                "spec.completionPolicy.ttlSecondsAfterFinished",
            ),
            (
                serde_json::json!({"image": "a:1", "parallelism": 4294967295u32}),
                "must be between 0 and 2147483647",
            ),
            (
                serde_json::json!({"image": "a:1", "parallelism": -1}),
                "must be between 0 and 2147483647",
            ),
        ];
        for (spec, field) in cases {
            let err = job(&spec).unwrap_err();
            assert!(err.contains(field), "{spec}: {err}");
        }
    }

    #[test]
    fn selectors_match_like_kubernetes() {
        let selector: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"pool": "web"},
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "drain", "operator": "DoesNotExist"},
            ],
        }))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert!(selector.matches(&labels(&[("pool", "web"), ("zone", "a")])));
        assert!(!selector.matches(&labels(&[("pool", "web"), ("zone", "c")])));
        assert!(!selector.matches(&labels(&[("pool", "web"), ("zone", "a"), ("drain", "y")])));
        assert!(LabelSelector::default().matches(&labels(&[])));
    }
}
