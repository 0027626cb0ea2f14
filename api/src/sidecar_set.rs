//! `kind: SidecarSet` — OpenKruise's object and field names: sidecar containers owned by a
//! platform team, injected into the matching pods created after it, and upgraded across
//! them without touching the application containers (issue 8).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use rigger_proto::pod::{Container, EnvVar, EnvVarSource, FieldRef, Pod, PodSpec, Volume};

use super::{FieldError, IntOrPercent, LabelSelector, ObjectMeta, ValidateMeta as _};

pub const KIND: &str = "SidecarSet";
/// Kruise's annotation on pods: which SidecarSets were injected, at which version.
pub const HASH_ANNOTATION: &str = "kruise.io/sidecarset-hash";
/// Kruise's hot-upgrade annotations on pods: each slot's version and alternate version
/// (prefix + slot container name), and which slot of each sidecar is working.
pub const VERSION_ANNOTATION: &str = "version.sidecarset.kruise.io/";
pub const VERSION_ALT_ANNOTATION: &str = "versionalt.sidecarset.kruise.io/";
pub const WORKING_ANNOTATION: &str = "kruise.io/sidecarset-working-hotupgrade-container";
/// The namespace label Kubernetes puts on every namespace (namespaceSelector matches it).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSet {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: SidecarSetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SidecarSetStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSetSpec {
    /// Pods whose labels match (required, as in Kruise).
    pub selector: LabelSelector,
    /// Only pods of this namespace [default: every namespace].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Namespaces by label; Rigger's namespaces carry only Kubernetes' automatic
    /// `kubernetes.io/metadata.name` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    pub containers: Vec<SidecarContainer>,
    /// Volumes the sidecars mount, added to pods that lack a volume of that name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SidecarContainer {
    #[serde(flatten)]
    pub container: Container,
    #[serde(default)]
    pub upgrade_strategy: UpgradeStrategy,
}

impl SidecarContainer {
    /// HotUpgrade: the image the idle slot runs (validation requires it for hot
    /// upgrades; empty otherwise).
    pub fn empty_image(&self) -> &str {
        self.upgrade_strategy
            .hot_upgrade_empty_image
            .as_deref()
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeStrategy {
    #[serde(default)]
    pub upgrade_type: UpgradeType,
    /// HotUpgrade: the image the idle slot runs (it must run the same command and stay up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_upgrade_empty_image: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpgradeType {
    #[default]
    ColdUpgrade,
    HotUpgrade,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateStrategy {
    /// RollingUpdate [default] moves the pods that have the sidecars to the new version;
    /// NotUpdate leaves them, and only pods created from now on get it (Kruise's).
    #[serde(
        rename = "type",
        default,
        skip_serializing_if = "UpdateStrategyType::is_default"
    )]
    pub kind: UpdateStrategyType,
    /// Pods being upgraded (or not ready) at once [default: 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrPercent>,
    /// Pods left on the old version (int or percent of the matched pods) [default: 0].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<IntOrPercent>,
    #[serde(default)]
    pub paused: bool,
    /// Only these of the matched pods are upgraded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_strategy: Option<PriorityStrategy>,
    /// Spread the upgrades over the values of these labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scatter_strategy: Vec<ScatterTerm>,
}

/// Kruise's `updateStrategy.type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateStrategyType {
    #[default]
    RollingUpdate,
    NotUpdate,
}

impl UpdateStrategyType {
    fn is_default(&self) -> bool {
        *self == Self::RollingUpdate
    }
}

/// Kruise's priority: weights by selector (higher first) or order by a label's value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityStrategy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weight_priority: Vec<WeightTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order_priority: Vec<OrderTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightTerm {
    pub weight: i32,
    pub match_selector: LabelSelector,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderTerm {
    /// Pods with a higher integer value of this label go first (Kruise's `orderedKey`;
    /// `orderKey`, Rigger's earlier spelling, is still read from stored objects).
    #[serde(alias = "orderKey")]
    pub ordered_key: String,
}

impl OrderTerm {
    /// A pod's order under this term, as Kruise reads it: the integer the label's value
    /// ends with (`sts-10` → 10); 0 without one, or without the label.
    pub fn order_of(&self, labels: &std::collections::BTreeMap<String, String>) -> i64 {
        let value = labels.get(&self.ordered_key).map_or("", String::as_str);
        let digits = value.len() - value.bytes().rev().take_while(u8::is_ascii_digit).count();
        value[digits..].parse().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScatterTerm {
    pub key: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSetStatus {
    pub observed_generation: u64,
    pub matched_pods: u32,
    pub updated_pods: u32,
    pub ready_pods: u32,
    pub updated_ready_pods: u32,
}

/// What an injection recorded on a pod, per SidecarSet (Kruise's annotation value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectedVersion {
    pub sidecar_set_name: String,
    pub hash: String,
    /// The hash with images left out: pods whose sidecars differ in more than images
    /// cannot be upgraded in place (Kruise's sidecarset-hash-without-image).
    #[serde(default)]
    pub hash_without_image: String,
    pub sidecar_list: Vec<String>,
}

impl SidecarSet {
    /// Refuse what cannot run, naming the field; Kruise's API group is accepted too.
    pub fn validate(&self) -> Result<(), FieldError> {
        super::check_kruise_api_version(&self.api_version)?;
        self.metadata.validate()?;
        let spec = &self.spec;
        if spec.selector.is_empty() {
            return Err(FieldError::new(
                "spec.selector",
                "is required (a SidecarSet without one would join every pod)",
            ));
        }
        spec.selector.validate("spec.selector")?;
        if let Some(selector) = &spec.namespace_selector {
            selector.validate("spec.namespaceSelector")?;
            if spec.namespace.is_some() {
                return Err(FieldError::new(
                    "spec.namespaceSelector",
                    "set namespace or namespaceSelector, not both",
                ));
            }
        }
        if spec.containers.is_empty() {
            return Err(FieldError::new(
                "spec.containers",
                "at least one container is required",
            ));
        }
        for (i, sidecar) in spec.containers.iter().enumerate() {
            let strategy = &sidecar.upgrade_strategy;
            match (strategy.upgrade_type, &strategy.hot_upgrade_empty_image) {
                (UpgradeType::HotUpgrade, None) => {
                    return Err(FieldError::new(
                        format!("spec.containers[{i}].upgradeStrategy.hotUpgradeEmptyImage"),
                        "is required for HotUpgrade",
                    ));
                }
                (UpgradeType::ColdUpgrade, Some(_)) => {
                    return Err(FieldError::new(
                        format!("spec.containers[{i}].upgradeStrategy.hotUpgradeEmptyImage"),
                        "is for HotUpgrade only",
                    ));
                }
                _ => {}
            }
        }
        // The sidecars must be valid containers of a pod: checked as one, with the same
        // field paths (a SidecarSet's containers and volumes sit where a pod's do).
        let probe = Pod {
            api_version: rigger_proto::pod::API_VERSION.to_owned(),
            kind: rigger_proto::pod::KIND.to_owned(),
            metadata: ObjectMeta {
                name: self.metadata.name.clone(),
                ..ObjectMeta::default()
            },
            spec: PodSpec {
                host_network: true,
                containers: spec
                    .containers
                    .iter()
                    .map(|s| s.container.clone())
                    .collect(),
                volumes: spec.volumes.clone(),
                ..PodSpec::default()
            },
            status: None,
        };
        super::pod::validate(&probe)
    }

    /// Whether pod `pod` (its namespace and labels) is one of this SidecarSet's.
    pub fn matches(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        let spec = &self.spec;
        let namespace_ok = match (&spec.namespace, &spec.namespace_selector) {
            (Some(wanted), _) => wanted == namespace,
            (None, Some(selector)) => selector.matches(&BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_owned(),
                namespace.to_owned(),
            )])),
            (None, None) => true,
        };
        namespace_ok && spec.selector.matches(labels)
    }

    /// A short hash of what the sidecars are (Kruise's sidecarset hash): it changes when
    /// a container changes, so pods with another hash are on an older version.
    pub fn hash(&self) -> String {
        short_hash(&serde_json::to_vec(&self.spec.containers).unwrap_or_default())
    }

    /// The same, images left out.
    pub fn hash_without_image(&self) -> String {
        let mut containers = self.spec.containers.clone();
        for sidecar in &mut containers {
            sidecar.container.image.clear();
        }
        short_hash(&serde_json::to_vec(&containers).unwrap_or_default())
    }

    /// The containers to add to a pod: as written for ColdUpgrade; for HotUpgrade two
    /// slots, `<name>-1` with the image and `<name>-2` with the empty image, each told
    /// its version through env from pod annotations.
    pub fn injected_containers(&self) -> Vec<Container> {
        let mut out = Vec::new();
        for sidecar in &self.spec.containers {
            let container = &sidecar.container;
            match sidecar.upgrade_strategy.upgrade_type {
                UpgradeType::ColdUpgrade => out.push(container.clone()),
                UpgradeType::HotUpgrade => {
                    let empty = sidecar.empty_image().to_owned();
                    for (slot, image) in [(1, container.image.clone()), (2, empty)] {
                        let mut slot_container = container.clone();
                        slot_container.name = format!("{}-{slot}", container.name);
                        slot_container.image = image;
                        for (env, annotation) in [
                            ("SIDECARSET_VERSION", VERSION_ANNOTATION),
                            ("SIDECARSET_VERSION_ALT", VERSION_ALT_ANNOTATION),
                        ] {
                            slot_container.env.push(EnvVar {
                                name: env.to_owned(),
                                value: None,
                                value_from: Some(EnvVarSource {
                                    field_ref: FieldRef {
                                        field_path: format!(
                                            "metadata.annotations['{annotation}{}']",
                                            slot_container.name
                                        ),
                                        api_version: None,
                                    },
                                }),
                            });
                        }
                        out.push(slot_container);
                    }
                }
            }
        }
        out
    }
}

fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(bytes)[..5])
}

/// Inject the SidecarSets matching a new pod: their containers go before the pod's own
/// (Kruise's default), their volumes are added where the pod has none of that name, and
/// the pod records each SidecarSet's name, version and containers in Kruise's annotation.
/// A container name the pod already uses is an error naming both.
pub fn inject(pod: &mut Pod, sets: &[SidecarSet]) -> Result<(), FieldError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut injected: BTreeMap<String, InjectedVersion> = BTreeMap::new();
    let mut sidecars = Vec::new();
    for set in sets
        .iter()
        .filter(|s| s.matches(&namespace, &pod.metadata.labels))
    {
        let containers = set.injected_containers();
        for container in &containers {
            let taken = pod
                .spec
                .containers
                .iter()
                .chain(&sidecars)
                .any(|c| c.name == container.name);
            if taken {
                return Err(FieldError::new(
                    "spec.containers",
                    format!(
                        "container {:?} is also injected by SidecarSet {}; rename one",
                        container.name, set.metadata.name
                    ),
                ));
            }
        }
        for volume in &set.spec.volumes {
            if !pod.spec.volumes.iter().any(|v| v.name == volume.name) {
                pod.spec.volumes.push(volume.clone());
            }
        }
        for sidecar in &set.spec.containers {
            if sidecar.upgrade_strategy.upgrade_type == UpgradeType::HotUpgrade {
                let name = &sidecar.container.name;
                let annotations = &mut pod.metadata.annotations;
                for (slot, version, alt) in [(1, "1", "0"), (2, "0", "1")] {
                    annotations.insert(
                        format!("{VERSION_ANNOTATION}{name}-{slot}"),
                        version.to_owned(),
                    );
                    annotations.insert(
                        format!("{VERSION_ALT_ANNOTATION}{name}-{slot}"),
                        alt.to_owned(),
                    );
                }
                let mut working: BTreeMap<String, String> = annotations
                    .get(WORKING_ANNOTATION)
                    .and_then(|w| serde_json::from_str(w).ok())
                    .unwrap_or_default();
                working.insert(name.clone(), format!("{name}-1"));
                annotations.insert(
                    WORKING_ANNOTATION.to_owned(),
                    serde_json::to_string(&working).unwrap_or_default(),
                );
            }
        }
        injected.insert(
            set.metadata.name.clone(),
            InjectedVersion {
                sidecar_set_name: set.metadata.name.clone(),
                hash: set.hash(),
                hash_without_image: set.hash_without_image(),
                sidecar_list: containers.iter().map(|c| c.name.clone()).collect(),
            },
        );
        sidecars.extend(containers);
    }
    if injected.is_empty() {
        return Ok(());
    }
    sidecars.append(&mut pod.spec.containers);
    pod.spec.containers = sidecars;
    pod.metadata.annotations.insert(
        HASH_ANNOTATION.to_owned(),
        serde_json::to_string(&injected).unwrap_or_default(),
    );
    Ok(())
}

/// The SidecarSets a pod was injected with, from its annotation.
pub fn injected(pod: &Pod) -> BTreeMap<String, InjectedVersion> {
    pod.metadata
        .annotations
        .get(HASH_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// A pod applied again by its owner carries what was injected at creation: sidecar
/// containers the new copy lacks are taken from the stored pod (as they run now), with
/// the volumes and Kruise's annotations.
pub fn keep_injected(new: &mut Pod, stored: &Pod) {
    let versions = injected(stored);
    if versions.is_empty() {
        return;
    }
    let sidecar_names: Vec<&String> = versions.values().flat_map(|v| &v.sidecar_list).collect();
    let missing: Vec<Container> = stored
        .spec
        .containers
        .iter()
        .filter(|c| sidecar_names.contains(&&c.name))
        .filter(|c| !new.spec.containers.iter().any(|n| n.name == c.name))
        .cloned()
        .collect();
    if !missing.is_empty() {
        let mut containers = missing;
        containers.append(&mut new.spec.containers);
        new.spec.containers = containers;
    }
    // The volumes the sidecars mount (the owner's own volumes are the owner's to keep).
    let sidecar_volumes: Vec<&str> = stored
        .spec
        .containers
        .iter()
        .filter(|c| sidecar_names.contains(&&c.name))
        .flat_map(|c| c.volume_mounts.iter().map(|m| m.name.as_str()))
        .collect();
    for volume in &stored.spec.volumes {
        if sidecar_volumes.contains(&volume.name.as_str())
            && !new.spec.volumes.iter().any(|v| v.name == volume.name)
        {
            new.spec.volumes.push(volume.clone());
        }
    }
    for (key, value) in &stored.metadata.annotations {
        let ours = key == HASH_ANNOTATION
            || key == WORKING_ANNOTATION
            || key.starts_with(VERSION_ANNOTATION)
            || key.starts_with(VERSION_ALT_ANNOTATION);
        if ours && !new.metadata.annotations.contains_key(key) {
            new.metadata.annotations.insert(key.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::KRUISE_API_VERSION;

    #[test]
    fn ordered_keys_are_read_as_kruise_reads_them() {
        let term: OrderTerm =
            serde_json::from_value(serde_json::json!({"orderedKey": "rank"})).unwrap();
        // What Rigger stored before it spelled the field as Kruise does.
        let stored: OrderTerm =
            serde_json::from_value(serde_json::json!({"orderKey": "rank"})).unwrap();
        assert_eq!(term, stored);
        assert_eq!(
            serde_json::to_value(&term).unwrap(),
            serde_json::json!({"orderedKey": "rank"})
        );
        let order = |value: Option<&str>| {
            let labels = value
                .map(|v| [("rank".to_owned(), v.to_owned())].into())
                .unwrap_or_default();
            term.order_of(&labels)
        };
        assert_eq!(order(Some("5")), 5);
        assert_eq!(order(Some("sts-10")), 10);
        assert_eq!(order(Some("v2-canary")), 0);
        assert_eq!(order(Some("")), 0);
        assert_eq!(order(None), 0);
        // Digits past i64: 0, as Kruise's ParseInt error.
        assert_eq!(order(Some("99999999999999999999")), 0);
    }

    fn sidecar_set(spec: &serde_json::Value) -> Result<SidecarSet, String> {
        let value = serde_json::json!({
            "apiVersion": KRUISE_API_VERSION, "kind": KIND,
            "metadata": {"name": "mesh"}, "spec": spec,
        });
        let set: SidecarSet = serde_json::from_value(value).map_err(|e| e.to_string())?;
        set.validate().map_err(|e| e.to_string())?;
        Ok(set)
    }

    #[test]
    fn kruise_shapes_apply_and_refusals_name_the_field() {
        let set = sidecar_set(&serde_json::json!({
            "selector": {"matchLabels": {"app": "web"}},
            "namespace": "shop",
            "containers": [{
                "name": "proxy", "image": "r.example/proxy:1",
                "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "r.example/empty:1"}
            }],
            "updateStrategy": {"maxUnavailable": "50%", "partition": 1,
                "priorityStrategy": {"weightPriority": [{"weight": 10, "matchSelector": {"matchLabels": {"tier": "edge"}}}]}}
        }))
        .unwrap();
        let names: Vec<String> = set
            .injected_containers()
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["proxy-1", "proxy-2"]);
        assert!(set.matches(
            "shop",
            &BTreeMap::from([("app".to_owned(), "web".to_owned())])
        ));
        assert!(!set.matches(
            "other",
            &BTreeMap::from([("app".to_owned(), "web".to_owned())])
        ));

        let cases = [
            (
                serde_json::json!({"selector": {}, "containers": [{"name": "p", "image": "r.example/p:1"}]}),
                "spec.selector: is required",
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": []}),
                "spec.containers: at least one",
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": [{"name": "p", "image": "r.example/p:1", "upgradeStrategy": {"upgradeType": "HotUpgrade"}}]}),
                "spec.containers[0].upgradeStrategy.hotUpgradeEmptyImage: is required",
            ),
            (
                serde_json::json!({"selector": {"matchLabels": {"a": "b"}}, "containers": [{"name": "p", "image": ""}]}),
                "spec.containers[0].image: is required",
            ),
        ];
        for (spec, expected) in cases {
            let err = sidecar_set(&spec).unwrap_err();
            assert!(err.starts_with(expected), "{err}\n  expected: {expected}");
        }
    }

    #[test]
    fn the_hash_follows_the_containers_only() {
        let spec = serde_json::json!({"selector": {"matchLabels": {"a": "b"}},
            "containers": [{"name": "p", "image": "r.example/p:1"}]});
        let a = sidecar_set(&spec).unwrap();
        let mut b = a.clone();
        b.spec.update_strategy.paused = true;
        assert_eq!(a.hash(), b.hash());
        b.spec.containers[0].container.image = "r.example/p:2".to_owned();
        assert_ne!(a.hash(), b.hash());
    }
}
