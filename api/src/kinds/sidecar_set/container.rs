//! A SidecarSet's container: Kubernetes' Container, every field of it as written (kubelet
//! carries them out in a cluster), with Kruise's sidecar fields beside its own (Go's
//! `json:",inline"`). Decoded by hand so that a field neither knows is refused with its
//! path (serde's `flatten` and k8s-openapi's decoders would pass unknown fields by).
//! Rigger's own pods run the subset Rigger's agent carries out ([`SidecarContainer::pod_container`]).

use std::fmt;

use k8s_openapi::api::core::v1 as core;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use rigger_proto::pod::{Container, FieldRef};

use super::resources::ResourcesPolicy;
use crate::fields::FieldError;
use crate::kube_types;

/// The env var Kruise adds to every injected container (how an injected container is
/// told from the pod's own).
pub const INJECTED_ENV: &str = "IS_INJECTED";

#[derive(Debug, Clone, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SidecarContainer {
    /// Kubernetes' container as written.
    #[serde(flatten)]
    pub container: core::Container,
    /// Before or after the pod's own containers [default: before for containers, after
    /// for initContainers, as Kruise defaults them].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_inject_policy: Option<PodInjectPolicy>,
    #[schemars(default)]
    pub upgrade_strategy: UpgradeStrategy,
    /// `enabled`: the sidecar also mounts every volume the pod's containers mount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_volume_policy: Option<ShareVolumePolicy>,
    /// Kruise's sharing of block devices (`volumeDevices`) with the pod's containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_volume_device_policy: Option<ShareVolumePolicy>,
    /// Env vars copied from the pod's containers.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(default)]
    pub transfer_env: Vec<TransferEnvVar>,
    /// The sidecar's resources computed from the pod's containers when it is injected
    /// (Kruise 1.9); not with `resources`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources_policy: Option<ResourcesPolicy>,
}

/// How a sidecar is written (stored, hashed into its version and revision names):
/// Rigger's container form for a container Rigger's pods can run — byte for byte as
/// SidecarSets were written before they took every Kubernetes field, so that stored
/// versions keep their hashes — and Kubernetes' form otherwise.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Written<'a, C: Serialize> {
    #[serde(flatten)]
    container: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_inject_policy: Option<PodInjectPolicy>,
    upgrade_strategy: &'a UpgradeStrategy,
    #[serde(skip_serializing_if = "Option::is_none")]
    share_volume_policy: Option<ShareVolumePolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    share_volume_device_policy: Option<ShareVolumePolicy>,
    #[serde(skip_serializing_if = "<[TransferEnvVar]>::is_empty")]
    transfer_env: &'a [TransferEnvVar],
    #[serde(skip_serializing_if = "Option::is_none")]
    resources_policy: Option<&'a ResourcesPolicy>,
}

impl Serialize for SidecarContainer {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match kube_types::to_rigger::<_, Container>(&self.container) {
            Ok(container) => self.written(container).serialize(serializer),
            Err(_) => self.written(&self.container).serialize(serializer),
        }
    }
}

impl SidecarContainer {
    fn written<C: Serialize>(&self, container: C) -> Written<'_, C> {
        Written {
            container,
            pod_inject_policy: self.pod_inject_policy,
            upgrade_strategy: &self.upgrade_strategy,
            share_volume_policy: self.share_volume_policy,
            share_volume_device_policy: self.share_volume_device_policy,
            transfer_env: &self.transfer_env,
            resources_policy: self.resources_policy.as_ref(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum PodInjectPolicy {
    BeforeAppContainer,
    AfterAppContainer,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeStrategy {
    #[serde(default)]
    pub upgrade_type: UpgradeType,
    /// HotUpgrade: the image the idle slot runs (it must run the same command and stay up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_upgrade_empty_image: Option<String>,
}

#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum UpgradeType {
    #[default]
    ColdUpgrade,
    HotUpgrade,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShareVolumePolicy {
    #[serde(rename = "type")]
    pub kind: ShareVolumePolicyType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ShareVolumePolicyType {
    Enabled,
    Disabled,
}

/// Kruise's `transferEnv[]`: env vars `envName`/`envNames` of the pod's container
/// `sourceContainerName` (or the one a pod label or annotation names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransferEnvVar {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source_container_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_container_name_from: Option<SourceContainerNameSource>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub env_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceContainerNameSource {
    pub field_ref: FieldRef,
}

impl SidecarContainer {
    pub fn name(&self) -> &str {
        &self.container.name
    }

    pub fn image(&self) -> &str {
        self.container.image.as_deref().unwrap_or_default()
    }

    /// The container as Rigger's own pods run it; `Err` names (relative to the
    /// container) the first field only kubelet carries out.
    pub fn pod_container(&self) -> Result<Container, String> {
        kube_types::to_rigger(&self.container)
    }

    /// HotUpgrade: the image the idle slot runs (validation requires it for hot
    /// upgrades; empty otherwise).
    pub fn empty_image(&self) -> &str {
        self.upgrade_strategy
            .hot_upgrade_empty_image
            .as_deref()
            .unwrap_or_default()
    }

    pub fn shares_volumes(&self) -> bool {
        self.share_volume_policy
            .is_some_and(|p| p.kind == ShareVolumePolicyType::Enabled)
    }

    /// A native sidecar: an init container with `restartPolicy: Always`, which runs beside
    /// the pod's containers.
    pub fn is_native(&self) -> bool {
        self.container.restart_policy.as_deref() == Some("Always")
    }

    pub fn shares_volume_devices(&self) -> bool {
        self.share_volume_device_policy
            .is_some_and(|p| p.kind == ShareVolumePolicyType::Enabled)
    }

    /// The sidecar-only fields checked (the container itself is checked as a pod's);
    /// `at` is its path, `init` whether it is one of `initContainers`.
    pub fn validate(&self, at: &str, init: bool) -> Result<(), FieldError> {
        let strategy = &self.upgrade_strategy;
        let empty_image = format!("{at}.upgradeStrategy.hotUpgradeEmptyImage");
        match (strategy.upgrade_type, &strategy.hot_upgrade_empty_image) {
            (UpgradeType::HotUpgrade, _) if init => {
                return Err(FieldError::new(
                    format!("{at}.upgradeStrategy.upgradeType"),
                    "HotUpgrade is for containers: an init container runs to completion before the pod starts",
                ));
            }
            (UpgradeType::HotUpgrade, None) => {
                return Err(FieldError::new(empty_image, "is required for HotUpgrade"));
            }
            (UpgradeType::ColdUpgrade, Some(_)) => {
                return Err(FieldError::new(empty_image, "is for HotUpgrade only"));
            }
            _ => {}
        }
        if let Some(policy) = &self.resources_policy {
            let path = format!("{at}.resourcesPolicy");
            if init && !self.is_native() {
                return Err(FieldError::new(
                    path,
                    "is only for native sidecars (restartPolicy Always): an init container runs before the pod's",
                ));
            }
            let resources = self.container.resources.as_ref();
            if resources.is_some_and(|r| {
                r.limits.as_ref().is_some_and(|l| !l.is_empty())
                    || r.requests.as_ref().is_some_and(|l| !l.is_empty())
            }) {
                return Err(FieldError::new(
                    path,
                    "resourcesPolicy and resources cannot be configured together",
                ));
            }
            policy.validate(&path)?;
        }
        for (i, transfer) in self.transfer_env.iter().enumerate() {
            transfer.validate(&format!("{at}.transferEnv[{i}]"))?;
        }
        Ok(())
    }
}

impl TransferEnvVar {
    fn validate(&self, at: &str) -> Result<(), FieldError> {
        match (
            &*self.source_container_name,
            &self.source_container_name_from,
        ) {
            ("", None) => {
                return Err(FieldError::new(
                    at,
                    "set sourceContainerName or sourceContainerNameFrom",
                ));
            }
            (name, Some(_)) if !name.is_empty() => {
                return Err(FieldError::new(
                    at,
                    "set sourceContainerName or sourceContainerNameFrom, not both",
                ));
            }
            (_, Some(from)) => {
                let path = &from.field_ref.field_path;
                if label_or_annotation(path).is_none() {
                    return Err(FieldError::new(
                        format!("{at}.sourceContainerNameFrom.fieldRef.fieldPath"),
                        format!(
                            "{path:?}: supported are metadata.labels['KEY'] and metadata.annotations['KEY']"
                        ),
                    ));
                }
            }
            _ => {}
        }
        if self.env_name.is_empty() && self.env_names.is_empty() {
            return Err(FieldError::new(at, "set envName or envNames"));
        }
        Ok(())
    }

    /// The names of the env vars to copy (envName and envNames, sorted, once each).
    pub fn names(&self) -> std::collections::BTreeSet<&str> {
        std::iter::once(self.env_name.as_str())
            .filter(|n| !n.is_empty())
            .chain(self.env_names.iter().map(String::as_str))
            .collect()
    }
}

/// Which of a pod's labels or annotations a field path names: `(true, key)` for
/// `metadata.labels['key']`, `(false, key)` for annotations.
pub fn label_or_annotation(path: &str) -> Option<(bool, &str)> {
    let (labels, rest) = if let Some(rest) = path.strip_prefix("metadata.labels[") {
        (true, rest)
    } else {
        (false, path.strip_prefix("metadata.annotations[")?)
    };
    let key = rest
        .strip_suffix(']')?
        .strip_prefix('\'')?
        .strip_suffix('\'')?;
    (!key.is_empty()).then_some((labels, key))
}

const SIDECAR_FIELDS: [&str; 6] = [
    "podInjectPolicy",
    "upgradeStrategy",
    "shareVolumePolicy",
    "shareVolumeDevicePolicy",
    "transferEnv",
    "resourcesPolicy",
];

impl<'de> Deserialize<'de> for SidecarContainer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(SidecarContainerVisitor)
    }
}

struct SidecarContainerVisitor;

impl<'de> Visitor<'de> for SidecarContainerVisitor {
    type Value = SidecarContainer;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sidecar container (a Kubernetes container with Kruise's sidecar fields)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SidecarContainer, A::Error> {
        let mut pod_inject_policy = None;
        let mut upgrade_strategy = None;
        let mut share_volume_policy = None;
        let mut share_volume_device_policy = None;
        let mut transfer_env = None;
        let mut resources_policy = None;
        // The container's own fields, decoded once all keys are seen.
        let mut rest = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let seen = match key.as_str() {
                "podInjectPolicy" => pod_inject_policy.replace(map.next_value()?).is_some(),
                "upgradeStrategy" => upgrade_strategy.replace(map.next_value()?).is_some(),
                "shareVolumePolicy" => share_volume_policy.replace(map.next_value()?).is_some(),
                "shareVolumeDevicePolicy" => share_volume_device_policy
                    .replace(map.next_value()?)
                    .is_some(),
                "transferEnv" => transfer_env.replace(map.next_value()?).is_some(),
                "resourcesPolicy" => resources_policy.replace(map.next_value()?).is_some(),
                _ => {
                    let value: serde_json::Value = map.next_value()?;
                    rest.insert(key.clone(), value).is_some()
                }
            };
            if seen {
                return Err(de::Error::custom(format!("duplicate field `{key}`")));
            }
        }
        let container: core::Container = kube_types::decode_strict(&serde_json::Value::Object(
            rest,
        ))
        .map_err(|mut message| {
            if message.starts_with("unknown field") {
                message.push_str(&format!(
                    " (neither Kubernetes' Container nor Kruise's {})",
                    SIDECAR_FIELDS.join(", ")
                ));
            }
            de::Error::custom(message)
        })?;
        Ok(SidecarContainer {
            container,
            pod_inject_policy,
            upgrade_strategy: upgrade_strategy.unwrap_or_default(),
            share_volume_policy,
            share_volume_device_policy,
            transfer_env: transfer_env.unwrap_or_default(),
            resources_policy,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn decode(value: serde_json::Value) -> Result<SidecarContainer, String> {
        serde_path_to_error::deserialize(value).map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }

    #[test]
    fn kruise_fields_sit_beside_the_container_and_round_trip() {
        let written = serde_json::json!({
            "name": "envoy", "image": "r.example/envoy:1",
            "podInjectPolicy": "AfterAppContainer",
            "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
            "shareVolumePolicy": {"type": "enabled"},
            "shareVolumeDevicePolicy": {"type": "disabled"},
            "transferEnv": [{"sourceContainerName": "app", "envNames": ["TZ", "LANG"]}],
        });
        let sidecar = decode(written.clone()).unwrap();
        assert_eq!(sidecar.container.name, "envoy");
        assert_eq!(
            sidecar.pod_inject_policy,
            Some(PodInjectPolicy::AfterAppContainer)
        );
        assert!(sidecar.shares_volumes());
        assert_eq!(serde_json::to_value(&sidecar).unwrap(), written);
    }

    #[test]
    fn unknown_fields_are_refused_with_their_path() {
        let cases = [
            (
                serde_json::json!({"name": "p", "image": "i", "podInjectPolcy": "AfterAppContainer"}),
                "unknown field `podInjectPolcy` (neither Kubernetes' Container nor Kruise's podInjectPolicy,",
            ),
            (
                serde_json::json!({"name": "p", "image": "i", "ports": [{"containerPort": 80, "hostIp": "1.2.3.4"}]}),
                "ports[0]: unknown field `hostIp`",
            ),
            (
                serde_json::json!({"name": "p", "image": "i", "shareVolumePolicy": {"type": "on"}}),
                "shareVolumePolicy.type: unknown variant `on`",
            ),
            (
                serde_json::json!({"name": "p", "image": "i", "transferEnv": [{"sourceContainerName": "a", "envName": "X", "extra": 1}]}),
                "transferEnv[0].extra: unknown field `extra`",
            ),
        ];
        for (value, expected) in cases {
            let err = decode(value).unwrap_err();
            assert!(err.contains(expected), "{err}\n  expected: {expected}");
        }
    }

    #[test]
    fn transfer_env_needs_a_source_and_a_name() {
        let check = |t: serde_json::Value| {
            let t: TransferEnvVar = serde_json::from_value(t).unwrap();
            t.validate("t").map_err(|e| e.to_string())
        };
        assert!(check(serde_json::json!({"sourceContainerName": "app", "envName": "TZ"})).is_ok());
        assert!(
            check(serde_json::json!({"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}, "envNames": ["TZ"]}))
                .is_ok()
        );
        for (t, expected) in [
            (
                serde_json::json!({"envName": "TZ"}),
                "t: set sourceContainerName or",
            ),
            (
                serde_json::json!({"sourceContainerName": "a"}),
                "t: set envName or envNames",
            ),
            (
                serde_json::json!({"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}, "envName": "TZ"}),
                "t.sourceContainerNameFrom.fieldRef.fieldPath: \"spec.nodeName\"",
            ),
        ] {
            let err = check(t).unwrap_err();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn field_paths_name_a_label_or_an_annotation() {
        assert_eq!(
            label_or_annotation("metadata.labels['app']"),
            Some((true, "app"))
        );
        assert_eq!(
            label_or_annotation("metadata.annotations['a/b']"),
            Some((false, "a/b"))
        );
        for bad in [
            "metadata.labels",
            "metadata.labels['']",
            "metadata.labels[app]",
            "spec.x['a']",
        ] {
            assert_eq!(label_or_annotation(bad), None, "{bad}");
        }
    }
}
