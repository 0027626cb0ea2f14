//! `kind: SidecarSet` — OpenKruise's object and field names: sidecar containers owned by a
//! platform team, injected into the matching pods created after it, and upgraded across
//! them without touching the application containers (issue 8). Both of Kruise's versions
//! are read and kept as applied: v1alpha1 names one namespace in `spec.namespace` and a
//! custom version in a label, v1beta1 uses `namespaceSelector` and `spec.customVersion`.

mod container;
mod inject;
pub mod resources;
mod revision;
mod update_strategy;
mod volumes;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use k8s_openapi::api::core::v1 as core;
use rigger_proto::pod::{Container, LocalObjectReference, Pod, PodSpec};

use crate::fields::{
    FieldError, LabelSelector, ObjectMeta, ValidateMeta as _, check_range, short_hash,
};

use std::time::SystemTime;

use crate::kind::KindInfo;
use crate::object::{Object, metadata_field};
use crate::table::{Columns, age};

/// The most revisions a SidecarSet keeps: its whole history is one stored record, which
/// must stay well inside a store's value limit (etcd's is 1.5 MiB).
pub const MAX_REVISION_HISTORY_LIMIT: u64 = 100;

pub use container::{
    INJECTED_ENV, PodInjectPolicy, ShareVolumePolicy, ShareVolumePolicyType, SidecarContainer,
    SourceContainerNameSource, TransferEnvVar, UpgradeStrategy, UpgradeType,
};
pub use inject::{
    Versioned, inject, inject_kube, injected, injected_by_annotations, is_injected,
    is_injected_kube, keep_injected,
};
pub use revision::{HISTORY_KIND, History, Revision, RevisionNotFound, injected_revision};
pub use update_strategy::{
    OrderTerm, PriorityStrategy, ScatterTerm, UpdateStrategy, UpdateStrategyType, WeightTerm,
};

pub const KIND: &str = "SidecarSet";
/// Kruise's annotation on pods: which SidecarSets were injected, at which version.
pub const HASH_ANNOTATION: &str = "kruise.io/sidecarset-hash";
/// Kruise's annotation on pods: each SidecarSet's version with images left out.
pub const HASH_WITHOUT_IMAGE_ANNOTATION: &str = "kruise.io/sidecarset-hash-without-image";
/// Kruise's annotation on pods: the names of the SidecarSets injected, comma-separated.
pub const INJECTED_LIST_ANNOTATION: &str = "kruise.io/sidecarset-injected-list";
/// Kruise's hot-upgrade annotations on pods: each slot's version and alternate version
/// (prefix + slot container name), and which slot of each sidecar is working.
pub const VERSION_ANNOTATION: &str = "version.sidecarset.kruise.io/";
pub const VERSION_ALT_ANNOTATION: &str = "versionalt.sidecarset.kruise.io/";
pub const WORKING_ANNOTATION: &str = "kruise.io/sidecarset-working-hotupgrade-container";
/// The namespace label Kubernetes puts on every namespace (namespaceSelector matches it).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// v1alpha1's place for a SidecarSet's custom version (v1beta1's is `spec.customVersion`).
pub const CUSTOM_VERSION_LABEL: &str = "apps.kruise.io/sidecarset-custom-version";
/// Kruise's default `revisionHistoryLimit`.
pub const DEFAULT_REVISION_HISTORY_LIMIT: u32 = 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSet {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: SidecarSetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SidecarSetStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSetSpec {
    /// Pods whose labels match (required, as in Kruise).
    pub selector: LabelSelector,
    /// v1alpha1 only: only pods of this namespace [default: every namespace].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Namespaces by label; Rigger's namespaces carry only Kubernetes' automatic
    /// `kubernetes.io/metadata.name` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Run before the pod's containers start: after the pod's own init containers
    /// (sorted by name), or before them with `podInjectPolicy: BeforeAppContainer`.
    /// Given to new pods only, never upgraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<SidecarContainer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<SidecarContainer>,
    /// Volumes the sidecars mount (every Kubernetes volume source, as written): those a
    /// sidecar mounts are added to pods that lack a volume of that name.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "volumes")]
    #[schemars(with = "Vec<core::Volume>")]
    pub volumes: Vec<core::Volume>,
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
    #[serde(default, skip_serializing_if = "InjectionStrategy::is_default")]
    pub injection_strategy: InjectionStrategy,
    /// Pull secrets added to the pods it is injected into (Kruise's, for the sidecars'
    /// images).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Versions kept for `injectionStrategy.revision` [default: 10].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<u32>,
    /// Annotations set on the pods it is injected into.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patch_pod_metadata: Vec<PatchPodMetadata>,
    /// v1beta1 only: a name for this version, recorded in its revision so that
    /// `injectionStrategy.revision.customVersion` can pick it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_version: Option<String>,
}

/// Kruise's `injectionStrategy`: whether new pods get the sidecars, and which version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectionStrategy {
    /// New pods get nothing from this SidecarSet while true.
    #[serde(default)]
    pub paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<InjectRevision>,
}

impl InjectionStrategy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Inject a recorded version instead of the current one: by revision name (as
/// `status.latestRevision` showed it) or by custom version (the newest with it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InjectRevision {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// Always [default]: every new pod gets that version. Partial: pods outside
    /// `updateStrategy.selector` get it; the others get it with the probability of
    /// `updateStrategy.partition`'s percentage, else the current version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<InjectRevisionPolicy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum InjectRevisionPolicy {
    Always,
    Partial,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchPodMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Retain [default]: set where the pod has no such annotation. Overwrite: always
    /// set. MergePatchJson: the value is a JSON merge patch of the pod's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_policy: Option<PatchPolicy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum PatchPolicy {
    Retain,
    Overwrite,
    MergePatchJson,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetStatus {
    pub observed_generation: u64,
    pub matched_pods: u32,
    pub updated_pods: u32,
    pub ready_pods: u32,
    pub updated_ready_pods: u32,
    /// The name of the current version's revision (what `injectionStrategy.revision.
    /// revisionName` takes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub latest_revision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<u32>,
    /// Rigger's, beside Kruise's counts: `InPlaceUpdate` is `False` while pods keep an
    /// older version because its sidecars differ in more than images (env, resources:
    /// what Kubernetes does not change in a running pod), naming what changed. Those
    /// pods keep their version; pods created from now on get the new one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::fields::Condition>,
}

/// The condition a SidecarSet's status reports its in-place updates with.
pub const IN_PLACE_UPDATE_CONDITION: &str = "InPlaceUpdate";
/// Kruise's pod annotation: what each set's last in-place update found running (the
/// image IDs it waits to see change).
pub const IN_PLACE_STATE_ANNOTATION: &str = "kruise.io/sidecarset-inplace-update-state";

/// What an injection recorded on a pod, per SidecarSet (Kruise's annotation value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InjectedVersion {
    /// When the version was injected or last rolled out (Kruise's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_timestamp: Option<String>,
    pub sidecar_set_name: String,
    pub hash: String,
    /// The hash with images left out: pods whose sidecars differ in more than images
    /// cannot be upgraded in place. Kruise keeps it in its own annotation
    /// (`kruise.io/sidecarset-hash-without-image`), as Rigger does now; read inline too,
    /// where Rigger wrote it before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash_without_image: String,
    pub sidecar_list: Vec<String>,
    /// The revision injected (Kruise's).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub controller_revision: String,
}

/// Annotation keys a SidecarSet's `patchPodMetadata` may not set: those the injection
/// and the rollout themselves keep, and Rigger's own.
fn reserved_annotation(key: &str) -> bool {
    key.starts_with("kruise.io/sidecarset")
        || key.starts_with(VERSION_ANNOTATION)
        || key.starts_with(VERSION_ALT_ANNOTATION)
        || key
            .split_once('/')
            .is_some_and(|(prefix, _)| prefix == "rigger.dev" || prefix.ends_with(".rigger.dev"))
}

impl SidecarSet {
    /// Refuse what cannot run, naming the field; Kruise's API group (both versions) is
    /// accepted too.
    pub fn validate(&self) -> Result<(), FieldError> {
        self.check(true)
    }

    /// [`SidecarSet::validate`] for a set an API server serves: its fields as any
    /// version wrote them. With no conversion webhook, a v1alpha1 set reads back in the
    /// stored version (v1beta1) with v1alpha1's `spec.namespace`, which still means
    /// what it meant.
    pub fn validate_served(&self) -> Result<(), FieldError> {
        self.check(false)
    }

    fn check(&self, version_fields: bool) -> Result<(), FieldError> {
        crate::fields::check_kruise_v1beta1_api_version(&self.api_version)?;
        self.metadata.validate()?;
        let spec = &self.spec;
        if let Some(limit) = spec.revision_history_limit {
            check_range(
                "spec.revisionHistoryLimit",
                u64::from(limit),
                0,
                MAX_REVISION_HISTORY_LIMIT,
            )?;
        }
        spec.update_strategy.validate()?;
        let v1beta1 =
            version_fields && self.api_version == crate::fields::KRUISE_API_VERSION_V1BETA1;
        let v1alpha1 = version_fields && !v1beta1;
        if spec.selector.is_empty() {
            return Err(FieldError::new(
                "spec.selector",
                "is required (a SidecarSet without one would join every pod)",
            ));
        }
        spec.selector.validate("spec.selector")?;
        if v1beta1 && spec.namespace.is_some() {
            return Err(FieldError::new(
                "spec.namespace",
                format!(
                    "is v1alpha1's; in v1beta1 write namespaceSelector: {{matchLabels: {{{NAMESPACE_NAME_LABEL}: NAME}}}}"
                ),
            ));
        }
        if v1alpha1 && spec.custom_version.is_some() {
            return Err(FieldError::new(
                "spec.customVersion",
                format!("is v1beta1's; in v1alpha1 set the label {CUSTOM_VERSION_LABEL}"),
            ));
        }
        if let Some(selector) = &spec.namespace_selector {
            selector.validate("spec.namespaceSelector")?;
            if spec.namespace.is_some() {
                return Err(FieldError::new(
                    "spec.namespaceSelector",
                    "set namespace or namespaceSelector, not both",
                ));
            }
        }
        if spec.containers.is_empty() && spec.init_containers.is_empty() {
            return Err(FieldError::new(
                "spec.containers",
                "at least one container (or init container) is required",
            ));
        }
        for (i, sidecar) in spec.init_containers.iter().enumerate() {
            sidecar.validate(&format!("spec.initContainers[{i}]"), true)?;
        }
        for (i, sidecar) in spec.containers.iter().enumerate() {
            sidecar.validate(&format!("spec.containers[{i}]"), false)?;
        }
        if let Some(revision) = &spec.injection_strategy.revision {
            let at = "spec.injectionStrategy.revision";
            match (&revision.revision_name, &revision.custom_version) {
                (None, None) => {
                    return Err(FieldError::new(at, "set revisionName or customVersion"));
                }
                (Some(name), _) if !name.starts_with(&format!("{}-", self.metadata.name)) => {
                    return Err(FieldError::new(
                        format!("{at}.revisionName"),
                        format!(
                            "{name:?} is not one of this SidecarSet's revisions (they are named {}-HASH)",
                            self.metadata.name
                        ),
                    ));
                }
                _ => {}
            }
        }
        for (i, patch) in spec.patch_pod_metadata.iter().enumerate() {
            for (key, value) in &patch.annotations {
                let at = format!("spec.patchPodMetadata[{i}].annotations[{key}]");
                if reserved_annotation(key) {
                    return Err(FieldError::new(
                        at,
                        "is kept by the sidecar injection and rollout themselves; a SidecarSet may not set it",
                    ));
                }
                crate::fields::check_label_key(key)
                    .map_err(|reason| FieldError::new(at.clone(), reason))?;
                if patch.patch_policy == Some(PatchPolicy::MergePatchJson)
                    && !serde_json::from_str::<serde_json::Value>(value)
                        .is_ok_and(|v| v.is_object())
                {
                    return Err(FieldError::new(
                        at,
                        "MergePatchJson takes a JSON object (a merge patch of the pod's value)",
                    ));
                }
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (field, sidecars) in [
            ("initContainers", &spec.init_containers),
            ("containers", &spec.containers),
        ] {
            for (i, sidecar) in sidecars.iter().enumerate() {
                let at = format!("spec.{field}[{i}]");
                if sidecar.name().is_empty() {
                    return Err(FieldError::new(format!("{at}.name"), "is required"));
                }
                if sidecar.image().is_empty() {
                    return Err(FieldError::new(format!("{at}.image"), "is required"));
                }
                if !names.insert(sidecar.name()) {
                    return Err(FieldError::new(
                        format!("{at}.name"),
                        format!(
                            "{:?} is used by another sidecar of this set",
                            sidecar.name()
                        ),
                    ));
                }
                let restart = sidecar.container.restart_policy.as_deref();
                match (field, restart) {
                    (_, None) | ("initContainers", Some("Always")) => {}
                    ("initContainers", Some(other)) => {
                        return Err(FieldError::new(
                            format!("{at}.restartPolicy"),
                            format!(
                                "{other:?}: an init container takes only Always (a native sidecar)"
                            ),
                        ));
                    }
                    (_, Some(_)) => {
                        return Err(FieldError::new(
                            format!("{at}.restartPolicy"),
                            "is for init containers (native sidecars) only",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// What Rigger's own pods need on top of [`SidecarSet::validate`]: the sidecars must
    /// be containers Rigger's agent runs, checked as a pod's, with the same field paths
    /// (a SidecarSet's containers and volumes sit where a pod's do). What only kubelet
    /// carries out (`subPath`, `configMap` volumes, native sidecars, …) is refused here,
    /// naming the field; a cluster's pods take it.
    pub fn validate_for_rigger_pods(&self) -> Result<(), FieldError> {
        let spec = &self.spec;
        let probe = Pod {
            api_version: rigger_proto::pod::API_VERSION.to_owned(),
            kind: rigger_proto::pod::KIND.to_owned(),
            metadata: ObjectMeta {
                name: self.metadata.name.clone(),
                ..ObjectMeta::default()
            },
            spec: PodSpec {
                host_network: true,
                init_containers: pod_containers(&spec.init_containers, "spec.initContainers")?,
                containers: pod_containers(&spec.containers, "spec.containers")?,
                volumes: spec
                    .volumes
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        crate::kube_types::to_rigger(v)
                            .map_err(|e| FieldError::new(format!("spec.volumes[{i}]"), e))
                    })
                    .collect::<Result<_, _>>()?,
                image_pull_secrets: spec.image_pull_secrets.clone(),
                ..PodSpec::default()
            },
            status: None,
        };
        // A pod needs a container; a set of init containers only is checked with a
        // stand-in so that the rule does not refuse it.
        let mut probe = probe;
        if probe.spec.containers.is_empty() {
            probe.spec.containers.push(Container {
                name: "rigger-probe".to_owned(),
                image: "rigger.invalid/probe".to_owned(),
                ..Container::default()
            });
        }
        super::pod::validate(&probe)
    }

    /// The version's custom name: v1beta1's `spec.customVersion`, v1alpha1's label.
    pub fn custom_version(&self) -> Option<&str> {
        self.spec.custom_version.as_deref().or_else(|| {
            self.metadata
                .labels
                .get(CUSTOM_VERSION_LABEL)
                .map(String::as_str)
        })
    }

    pub fn revision_history_limit(&self) -> usize {
        self.spec
            .revision_history_limit
            .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT) as usize
    }

    /// Whether pod `pod` (its namespace and labels) is one of this SidecarSet's, where
    /// namespaces carry only Kubernetes' automatic `kubernetes.io/metadata.name` label
    /// (Rigger's own).
    pub fn matches(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let namespace_labels =
            BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), namespace.to_owned())]);
        self.matches_in(namespace, &namespace_labels, labels)
    }

    /// The same, with the namespace's labels as the cluster has them.
    pub fn matches_in(
        &self,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        let spec = &self.spec;
        let namespace_ok = match (&spec.namespace, &spec.namespace_selector) {
            (Some(wanted), _) => wanted == namespace,
            (None, Some(selector)) => selector.matches(namespace_labels),
            (None, None) => true,
        };
        namespace_ok && spec.selector.matches(labels)
    }

    /// Whether matching needs the namespace's labels (a `namespaceSelector`).
    pub fn selects_namespaces(&self) -> bool {
        self.spec.namespace_selector.is_some()
    }

    /// A short hash of what the sidecars are (Kruise's sidecarset hash): it changes when
    /// a container changes, so pods with another hash are on an older version. As
    /// Kruise's, it covers the init containers too once one of them is a native sidecar.
    pub fn hash(&self) -> String {
        short_hash(&self.hashed(&self.spec.containers, &self.spec.init_containers))
    }

    /// The same, images left out.
    pub fn hash_without_image(&self) -> String {
        let without_image = |sidecars: &[SidecarContainer]| {
            let mut sidecars = sidecars.to_vec();
            for sidecar in &mut sidecars {
                sidecar.container.image = Some(String::new());
            }
            sidecars
        };
        short_hash(&self.hashed(
            &without_image(&self.spec.containers),
            &without_image(&self.spec.init_containers),
        ))
    }

    fn hashed(&self, containers: &[SidecarContainer], init: &[SidecarContainer]) -> Vec<u8> {
        let native = self
            .spec
            .init_containers
            .iter()
            .any(SidecarContainer::is_native);
        let bytes = if native {
            serde_json::to_vec(&(containers, init))
        } else {
            // What sets without native sidecars always hashed (stored pods carry it).
            serde_json::to_vec(containers)
        };
        bytes.unwrap_or_default()
    }
}

/// The containers a sidecar becomes in a pod, from `container` (the sidecar as prepared
/// for this pod): itself for ColdUpgrade; for HotUpgrade two slots, `<name>-1` with the
/// image and `<name>-2` with the empty image, each told its version through env from
/// pod annotations.
pub fn slots_of(sidecar: &SidecarContainer, container: core::Container) -> Vec<core::Container> {
    if sidecar.upgrade_strategy.upgrade_type == UpgradeType::ColdUpgrade {
        return vec![container];
    }
    let empty = sidecar.empty_image().to_owned();
    let image = container.image.clone();
    [(1, image), (2, Some(empty))]
        .into_iter()
        .map(|(slot, image)| {
            let mut slot_container = container.clone();
            slot_container.name = format!("{}-{slot}", container.name);
            slot_container.image = image;
            let env = slot_container.env.get_or_insert_with(Vec::new);
            for (name, annotation) in [
                ("SIDECARSET_VERSION", VERSION_ANNOTATION),
                ("SIDECARSET_VERSION_ALT", VERSION_ALT_ANNOTATION),
            ] {
                env.push(core::EnvVar {
                    name: name.to_owned(),
                    value_from: Some(core::EnvVarSource {
                        field_ref: Some(core::ObjectFieldSelector {
                            field_path: format!(
                                "metadata.annotations['{annotation}{}-{slot}']",
                                container.name
                            ),
                            api_version: None,
                        }),
                        ..core::EnvVarSource::default()
                    }),
                    ..core::EnvVar::default()
                });
            }
            slot_container
        })
        .collect()
}

/// The sidecars as Rigger's pods run them, or the first field only kubelet carries out.
fn pod_containers(sidecars: &[SidecarContainer], at: &str) -> Result<Vec<Container>, FieldError> {
    sidecars
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.pod_container()
                .map_err(|e| FieldError::new(format!("{at}[{i}]"), e))
        })
        .collect()
}

/// SidecarSet, as the registry (`kinds/mod.rs`) lists it.
pub const INFO: KindInfo = KindInfo {
    name: KIND,
    spellings: &["sidecarsets"],
    namespaced: false,
    read_only: None,
    notes: Some(
        "Sidecar containers injected into matching pods created after it, and upgraded \
             in place. Both Kruise versions: `spec.namespace` is v1alpha1's, \
             `spec.customVersion` v1beta1's.\n\n\
             `containers[].resourcesPolicy` (Kruise 1.9) sizes a sidecar from the pod's \
             containers as Kruise's webhook does; where Kruise reads a malformed number \
             (`2x`) as 0, or accepts an expression no pod could compute (`cpu*cpu`), \
             Rigger refuses the set, naming the field.\n\n\
             Native sidecars (`initContainers` with `restartPolicy: Always`) are upgraded \
             in place like the others, kubelet restarting only them; Kruise leaves them at \
             their old image (kruise#1671).\n\n\
             Differs from Kruise (refused, naming the field): \
             `patchPodMetadata` keys the injection keeps itself, HotUpgrade on init containers, and a sidecar named like \
             a container of the pod (Kruise would replace the pod's container).\n\n\
             Containers and volumes take every Kubernetes field, as written. On a cluster's \
             pods (Kubernetes mode) kubelet carries them all out; on Rigger's own pods, \
             what Rigger's agent does not run (`subPath`, `configMap`/`secret`/`downwardAPI` \
             volumes, native sidecars with `restartPolicy: Always`, …) is refused, naming \
             the field.",
    ),
    schema: Some(crate::kind::schema_of::<SidecarSet>),
    crd: Some(&crate::kind::CrdInfo {
        group: crate::kind::KRUISE_GROUP,
        versions: &["v1alpha1", "v1beta1"],
        short_names: &[],
        columns: &[
            crate::kind::PrinterColumn {
                name: "MATCHED",
                kind: "integer",
                json_path: ".status.matchedPods",
                description: "Pods the SidecarSet matches.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "UPDATED",
                kind: "integer",
                json_path: ".status.updatedPods",
                description: "Matched pods at the latest revision.",
                only_in: None,
            },
            crate::kind::PrinterColumn {
                name: "READY",
                kind: "integer",
                json_path: ".status.readyPods",
                description: "Matched pods that are ready.",
                only_in: None,
            },
            crate::kind::AGE,
        ],
    }),
    table: crate::table::table_of::<SidecarSet>,
};

impl Object for SidecarSet {
    const INFO: &'static KindInfo = &INFO;
    metadata_field!();

    fn strip_owned(&mut self) {
        self.status = None;
    }

    /// What riggerctl applies (standalone) must run on Rigger's pods too; in a
    /// cluster, SidecarSets come from the API server and are checked by
    /// [`SidecarSet::validate`] alone.
    fn validate(&mut self) -> Result<(), FieldError> {
        SidecarSet::validate(self)?;
        self.validate_for_rigger_pods()
    }

    fn spec_differs(&self, old: &Self) -> bool {
        self.spec != old.spec
    }
}

impl Columns for SidecarSet {
    fn header(_wide: bool) -> Vec<&'static str> {
        vec!["NAME", "MATCHED", "UPDATED", "READY", "AGE"]
    }

    fn row(&self, _wide: bool, now: SystemTime) -> Vec<String> {
        let none = SidecarSetStatus::default();
        let status = self.status.as_ref().unwrap_or(&none);
        vec![
            self.metadata.name.clone(),
            status.matched_pods.to_string(),
            status.updated_pods.to_string(),
            status.ready_pods.to_string(),
            age(self.metadata.creation_timestamp.as_deref(), now),
        ]
    }
}

#[cfg(test)]
mod tests;
