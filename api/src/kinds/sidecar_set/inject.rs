//! Injection into new pods and what a pod keeps of it when its owner applies it again,
//! as Kruise's pod webhook does: metadata patches first, then each SidecarSet's init
//! containers and containers (prepared for the pod: shared volume mounts, `IS_INJECTED`,
//! transferred env), the volumes they mount, and Kruise's annotations.
//!
//! One injection for both kinds of pod: it works on Kubernetes' Pod ([`inject_kube`],
//! what the admission webhook gets from the API server), and Rigger's own pods go
//! through it in Kubernetes' shape ([`inject`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1 as core;
use rigger_proto::pod::{Container, Pod};

use super::{
    HASH_ANNOTATION, HASH_WITHOUT_IMAGE_ANNOTATION, INJECTED_ENV, INJECTED_LIST_ANNOTATION,
    InjectedVersion, PatchPodMetadata, PatchPolicy, PodInjectPolicy, SidecarContainer, SidecarSet,
    VERSION_ALT_ANNOTATION, VERSION_ANNOTATION, WORKING_ANNOTATION, container::label_or_annotation,
    slots_of,
};
use crate::fields::FieldError;
use crate::kube_types;

/// A SidecarSet as a new pod gets it: the version chosen for it (see
/// `injected_revision`) and that version's revision name.
#[derive(Debug, Clone)]
pub struct Versioned {
    pub set: SidecarSet,
    pub revision: String,
}

/// Where injected containers go relative to the pod's own.
#[derive(Default)]
struct Placed {
    before: Vec<core::Container>,
    after: Vec<core::Container>,
}

impl Placed {
    fn push(&mut self, policy: PodInjectPolicy, containers: Vec<core::Container>) {
        match policy {
            PodInjectPolicy::BeforeAppContainer => self.before.extend(containers),
            PodInjectPolicy::AfterAppContainer => self.after.extend(containers),
        }
    }

    /// `before`, the pod's containers, `after` — where the pod's containers start with
    /// sidecars another SidecarSet injected (the webhook is called once per matching
    /// set), `before` goes after those, so that sets injected one call at a time end up
    /// where they would all at once.
    fn around(mut self, own: Vec<core::Container>) -> Vec<core::Container> {
        let lead = own.iter().take_while(|c| is_injected_kube(c)).count();
        let mut own = own.into_iter();
        let mut out: Vec<core::Container> = own.by_ref().take(lead).collect();
        out.append(&mut self.before);
        out.extend(own);
        out.append(&mut self.after);
        out
    }
}

/// Rigger's own pod `pod` injected (see [`inject_kube`]): taken through Kubernetes'
/// shape, which holds every field of Rigger's; a sidecar field Rigger's agent does not
/// carry out is an error naming it (applies of such sets are refused before).
pub fn inject(pod: &mut Pod, sets: &[Versioned], now: &str) -> Result<(), FieldError> {
    let spec: core::PodSpec =
        kube_types::to_kube(&pod.spec).map_err(|e| FieldError::new("spec", e))?;
    let mut kube = core::Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            namespace: pod.metadata.namespace.clone(),
            labels: Some(pod.metadata.labels.clone()),
            annotations: Some(pod.metadata.annotations.clone()),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    // Rigger's namespaces carry only Kubernetes' automatic name label.
    let namespace_labels = BTreeMap::from([(super::NAMESPACE_NAME_LABEL.to_owned(), namespace)]);
    inject_kube(&mut kube, sets, &namespace_labels, now)?;
    let spec = kube.spec.unwrap_or_default();
    pod.spec = kube_types::to_rigger(&spec).map_err(|e| FieldError::new("spec", e))?;
    pod.metadata.annotations = kube.metadata.annotations.unwrap_or_default();
    Ok(())
}

/// Inject the SidecarSets matching a new pod (in a namespace with `namespace_labels`)
/// and not paused for injection, as Kruise's webhook does. Containers go before the pod's own unless `podInjectPolicy:
/// AfterAppContainer`; init containers (native sidecars among them) after the pod's own,
/// sorted by name, unless `BeforeAppContainer`; the volumes they mount are added where
/// the pod has none of that name; the pull secrets after the pod's own; the pod records
/// each SidecarSet's name, version, revision and containers in Kruise's annotations. A
/// container name the pod already uses is an error naming both (Kruise would replace the
/// pod's container; Rigger never touches a container that is not the sidecar's).
pub fn inject_kube(
    pod: &mut core::Pod,
    sets: &[Versioned],
    namespace_labels: &BTreeMap<String, String>,
    now: &str,
) -> Result<(), FieldError> {
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let matched: Vec<&Versioned> = sets
        .iter()
        .filter(|v| !v.set.spec.injection_strategy.paused)
        .filter(|v| v.set.matches_in(&namespace, namespace_labels, &labels))
        .collect();
    if matched.is_empty() {
        return Ok(());
    }
    let mut annotations = pod.metadata.annotations.take().unwrap_or_default();
    for versioned in &matched {
        let set = &versioned.set;
        patch_metadata(&mut annotations, &set.spec.patch_pod_metadata).map_err(|reason| {
            FieldError::new(
                "metadata.annotations",
                format!(
                    "SidecarSet {}: patchPodMetadata: {reason}",
                    set.metadata.name
                ),
            )
        })?;
    }
    let spec = pod.spec.get_or_insert_with(core::PodSpec::default);
    let own: Vec<core::Container> = spec
        .containers
        .iter()
        .filter(|c| !is_injected_kube(c))
        .cloned()
        .collect();
    let mut taken: BTreeSet<String> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| c.name.clone())
        .collect();
    // Every sidecar injected now: never a target of a resourcesPolicy.
    let sidecar_names: BTreeSet<String> = matched
        .iter()
        .flat_map(|v| {
            v.set
                .spec
                .init_containers
                .iter()
                .chain(&v.set.spec.containers)
        })
        .map(|c| c.container.name.clone())
        .collect();
    // The pod's own init containers: a native sidecar another set injected (the webhook
    // is called once per set) is no target, as in Kruise, where all sets inject at once.
    let own_init: Vec<core::Container> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| !is_injected_kube(c))
        .cloned()
        .collect();
    let mut init = Placed::default();
    let mut init_sidecars: Vec<(PodInjectPolicy, core::Container)> = Vec::new();
    let mut containers = Placed::default();
    let mut volumes = Vec::new();
    let mut versions: BTreeMap<String, InjectedVersion> = BTreeMap::new();
    let pod_labels = &labels;
    for versioned in &matched {
        let set = &versioned.set;
        let mut claim = |name: &str| {
            if taken.insert(name.to_owned()) {
                Ok(())
            } else {
                Err(FieldError::new(
                    "spec.containers",
                    format!(
                        "container {name:?} is also injected by SidecarSet {}; rename one",
                        set.metadata.name
                    ),
                ))
            }
        };
        let mut mounted = BTreeSet::new();
        let mut sidecar_list = Vec::new();
        let sized = |sidecar: &SidecarContainer, field: &str| {
            let mut prepared = prepare(sidecar, &own, pod_labels, &annotations);
            if let Some(policy) = &sidecar.resources_policy {
                prepared.resources = Some(
                    policy
                        .targets(&own_init, &own, &sidecar_names)
                        .and_then(|targets| policy.resources(&targets))
                        .map_err(|cause| {
                            FieldError::new(
                                field,
                                format!(
                                    "SidecarSet {}: sidecar {}: resourcesPolicy: {cause}",
                                    set.metadata.name, sidecar.container.name
                                ),
                            )
                        })?,
                );
            }
            Ok::<_, FieldError>(prepared)
        };
        for sidecar in &set.spec.init_containers {
            let prepared = sized(sidecar, "spec.initContainers")?;
            mounted.extend(mounts_of(&sidecar.container));
            // A native sidecar (restartPolicy Always) runs beside the pod's containers:
            // one of the set's sidecars (and hot-upgradable), as in Kruise.
            let native = sidecar.is_native();
            let slots = if native {
                slots_of(sidecar, prepared)
            } else {
                vec![prepared]
            };
            let policy = sidecar
                .pod_inject_policy
                .unwrap_or(PodInjectPolicy::AfterAppContainer);
            for slot in slots {
                claim(&slot.name)?;
                if native {
                    sidecar_list.push(slot.name.clone());
                }
                init_sidecars.push((policy, slot));
            }
        }
        for sidecar in &set.spec.containers {
            let prepared = sized(sidecar, "spec.containers")?;
            mounted.extend(mounts_of(&sidecar.container));
            let slots = slots_of(sidecar, prepared);
            for slot in &slots {
                claim(&slot.name)?;
                sidecar_list.push(slot.name.clone());
            }
            let policy = sidecar
                .pod_inject_policy
                .unwrap_or(PodInjectPolicy::BeforeAppContainer);
            containers.push(policy, slots);
        }
        // Only the set's volumes its sidecars mount (shared mounts are the pod's own).
        volumes.extend(
            set.spec
                .volumes
                .iter()
                .filter(|v| mounted.contains(&v.name))
                .cloned(),
        );
        sidecar_list.sort();
        versions.insert(
            set.metadata.name.clone(),
            InjectedVersion {
                sidecar_set_name: set.metadata.name.clone(),
                hash: set.hash(),
                hash_without_image: set.hash_without_image(),
                sidecar_list,
                controller_revision: versioned.revision.clone(),
                update_timestamp: Some(now.to_owned()),
            },
        );
    }
    init_sidecars.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    for (policy, container) in init_sidecars {
        init.push(policy, vec![container]);
    }
    let own_init = spec.init_containers.take().unwrap_or_default();
    let placed_init = init.around(own_init);
    spec.init_containers = (!placed_init.is_empty()).then_some(placed_init);
    spec.containers = containers.around(std::mem::take(&mut spec.containers));
    if !volumes.is_empty() {
        let pod_volumes = spec.volumes.get_or_insert_with(Vec::new);
        for volume in volumes {
            if !pod_volumes.iter().any(|v| v.name == volume.name) {
                pod_volumes.push(volume);
            }
        }
    }
    // The sets' pull secrets after the pod's own, each once (Kruise's merge).
    for secret in matched.iter().flat_map(|v| &v.set.spec.image_pull_secrets) {
        let secrets = spec.image_pull_secrets.get_or_insert_with(Vec::new);
        if !secrets.iter().any(|s| s.name == secret.name) {
            secrets.push(core::LocalObjectReference {
                name: secret.name.clone(),
            });
        }
    }
    record_versions(&mut annotations, &versions);
    for versioned in &matched {
        record_hot_slots(&mut annotations, &versioned.set);
    }
    pod.metadata.annotations = Some(annotations);
    Ok(())
}

/// Kruise's annotations for the injected versions, merged with what the pod already
/// records: the version per set (without the image-less hash, which has its own
/// annotation) and the sorted list of set names.
fn record_versions(
    annotations: &mut BTreeMap<String, String>,
    versions: &BTreeMap<String, InjectedVersion>,
) {
    let mut recorded = recorded_versions(annotations);
    let mut without_image: BTreeMap<String, InjectedVersion> = annotations
        .get(HASH_WITHOUT_IMAGE_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    for (name, version) in versions {
        let mut plain = version.clone();
        plain.hash_without_image.clear();
        recorded.insert(name.clone(), plain);
        without_image.insert(
            name.clone(),
            InjectedVersion {
                hash: version.hash_without_image.clone(),
                hash_without_image: String::new(),
                controller_revision: String::new(),
                ..version.clone()
            },
        );
    }
    let mut names: BTreeSet<String> = annotations
        .get(INJECTED_LIST_ANNOTATION)
        .map(|list| {
            list.split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    names.extend(versions.keys().cloned());
    annotations.insert(
        HASH_ANNOTATION.to_owned(),
        serde_json::to_string(&recorded).unwrap_or_default(),
    );
    annotations.insert(
        HASH_WITHOUT_IMAGE_ANNOTATION.to_owned(),
        serde_json::to_string(&without_image).unwrap_or_default(),
    );
    annotations.insert(
        INJECTED_LIST_ANNOTATION.to_owned(),
        names.into_iter().collect::<Vec<_>>().join(","),
    );
}

fn recorded_versions(annotations: &BTreeMap<String, String>) -> BTreeMap<String, InjectedVersion> {
    annotations
        .get(HASH_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// The volume names a container mounts (as files or as block devices).
fn mounts_of(container: &core::Container) -> impl Iterator<Item = String> + '_ {
    container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.clone())
        .chain(
            container
                .volume_devices
                .iter()
                .flatten()
                .map(|d| d.name.clone()),
        )
}

/// Whether `container` was injected by a SidecarSet (Kruise's marker env).
pub fn is_injected(container: &Container) -> bool {
    container
        .env
        .iter()
        .any(|e| e.name == INJECTED_ENV && e.value.as_deref() == Some("true"))
}

/// The same, for Kubernetes' container.
pub fn is_injected_kube(container: &core::Container) -> bool {
    container
        .env
        .iter()
        .flatten()
        .any(|e| e.name == INJECTED_ENV && e.value.as_deref() == Some("true"))
}

/// The sidecar as this pod gets it, in Kruise's order: its own env, `IS_INJECTED=true`,
/// then the env vars it transfers from the pod's containers and those the shared
/// mounts' `subPathExpr`s name (never over one it has). With `shareVolumePolicy`, the
/// pod's containers' mounts (whole, `subPath` included) where the sidecar has no mount
/// at that path; with `shareVolumeDevicePolicy`, their block devices likewise.
fn prepare(
    sidecar: &SidecarContainer,
    own: &[core::Container],
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> core::Container {
    let mut container = sidecar.container.clone();
    let mut transferred: Vec<core::EnvVar> = Vec::new();
    if sidecar.shares_volumes() {
        let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
        // Sets, not scans: a pod's creator chooses how many mounts there are.
        let mut paths: BTreeSet<String> = mounts.iter().map(|m| m.mount_path.clone()).collect();
        for (source, mount) in own
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten().map(move |m| (c, m)))
        {
            if !paths.insert(mount.mount_path.clone()) {
                continue;
            }
            mounts.push(mount.clone());
            if let Some(expr) = &mount.sub_path_expr {
                transferred.extend(referenced_vars(expr).filter_map(|name| {
                    source
                        .env
                        .iter()
                        .flatten()
                        .find(|e| e.name == name)
                        .cloned()
                }));
            }
        }
        if mounts.is_empty() {
            container.volume_mounts = None;
        }
    }
    if sidecar.shares_volume_devices() {
        let devices = container.volume_devices.get_or_insert_with(Vec::new);
        let mut paths: BTreeSet<String> = devices.iter().map(|d| d.device_path.clone()).collect();
        for device in own.iter().flat_map(|c| c.volume_devices.iter().flatten()) {
            if paths.insert(device.device_path.clone()) {
                devices.push(device.clone());
            }
        }
        if devices.is_empty() {
            container.volume_devices = None;
        }
    }
    let env = container.env.get_or_insert_with(Vec::new);
    env.push(core::EnvVar {
        name: INJECTED_ENV.to_owned(),
        value: Some("true".to_owned()),
        value_from: None,
    });
    let mut from_sources = Vec::new();
    for transfer in &sidecar.transfer_env {
        let source = match &transfer.source_container_name_from {
            Some(from) => match label_or_annotation(&from.field_ref.field_path) {
                Some((true, key)) => labels.get(key),
                Some((false, key)) => annotations.get(key),
                None => None,
            }
            .map_or("", String::as_str),
            None => &transfer.source_container_name,
        };
        // As Kruise: a source container or variable the pod lacks transfers nothing.
        let Some(source) = own.iter().find(|c| c.name == source) else {
            continue;
        };
        for name in transfer.names() {
            if let Some(var) = source.env.iter().flatten().find(|e| e.name == name) {
                from_sources.push(var.clone());
            }
        }
    }
    from_sources.extend(transferred);
    let mut names: BTreeSet<String> = env.iter().map(|e| e.name.clone()).collect();
    for var in from_sources {
        if names.insert(var.name.clone()) {
            env.push(var);
        }
    }
    container
}

/// The `$(NAME)` references in a `subPathExpr`.
fn referenced_vars(expr: &str) -> impl Iterator<Item = &str> {
    expr.split("$(")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(name, _)| name))
        .filter(|name| !name.is_empty())
}

/// Kruise's hot-upgrade annotations for a new pod: slot 1 works, slot 2 idles.
fn record_hot_slots(annotations: &mut BTreeMap<String, String>, set: &SidecarSet) {
    for sidecar in &set.spec.containers {
        if sidecar.upgrade_strategy.upgrade_type != super::UpgradeType::HotUpgrade {
            continue;
        }
        let name = &sidecar.container.name;
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

/// Kruise's `patchPodMetadata`, in order: Retain sets absent keys, Overwrite sets every
/// key, MergePatchJson merges the value (a JSON merge patch, RFC 7386) into the pod's.
fn patch_metadata(
    annotations: &mut BTreeMap<String, String>,
    patches: &[PatchPodMetadata],
) -> Result<(), String> {
    for patch in patches {
        for (key, value) in &patch.annotations {
            match patch.patch_policy.unwrap_or(PatchPolicy::Retain) {
                PatchPolicy::Retain => {
                    annotations
                        .entry(key.clone())
                        .or_insert_with(|| value.clone());
                }
                PatchPolicy::Overwrite => {
                    annotations.insert(key.clone(), value.clone());
                }
                PatchPolicy::MergePatchJson => {
                    let merged = match annotations.get(key).filter(|v| !v.is_empty()) {
                        Some(origin) => {
                            let mut target: serde_json::Value = serde_json::from_str(origin)
                                .map_err(|e| {
                                    format!("the pod's annotation {key} is not JSON ({e}); it cannot be merged into")
                                })?;
                            let patch: serde_json::Value = serde_json::from_str(value)
                                .map_err(|e| format!("{key}: the patch is not JSON ({e})"))?;
                            merge_patch(&mut target, &patch);
                            target.to_string()
                        }
                        None => value.clone(),
                    };
                    annotations.insert(key.clone(), merged);
                }
            }
        }
    }
    Ok(())
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(serde_json::Map::new());
    }
    if let serde_json::Value::Object(target) = target {
        for (key, value) in fields {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(
                    target.entry(key.clone()).or_insert(serde_json::Value::Null),
                    value,
                );
            }
        }
    }
}

/// The SidecarSets a pod was injected with, from its annotations.
pub fn injected(pod: &Pod) -> BTreeMap<String, InjectedVersion> {
    injected_by_annotations(&pod.metadata.annotations)
}

/// The same, from any pod's annotations (Kubernetes' pods too): each set's version with
/// its image-less hash, from Kruise's separate annotation where the version does not
/// carry it (Rigger wrote it inline before).
pub fn injected_by_annotations(
    annotations: &BTreeMap<String, String>,
) -> BTreeMap<String, InjectedVersion> {
    let mut versions = recorded_versions(annotations);
    let without_image: BTreeMap<String, InjectedVersion> = annotations
        .get(HASH_WITHOUT_IMAGE_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    for (name, version) in &mut versions {
        if version.hash_without_image.is_empty()
            && let Some(other) = without_image.get(name)
        {
            version.hash_without_image.clone_from(&other.hash);
        }
    }
    versions
}

/// A pod applied again by its owner carries what was injected at creation: sidecar
/// containers and init containers the new copy lacks are taken from the stored pod (as
/// they run now, where they stood), with the volumes they mount and Kruise's annotations.
pub fn keep_injected(new: &mut Pod, stored: &Pod) {
    let versions = injected(stored);
    if versions.is_empty() {
        return;
    }
    let sidecar_names: BTreeSet<&str> = versions
        .values()
        .flat_map(|v| v.sidecar_list.iter().map(String::as_str))
        .collect();
    let spec = &mut new.spec;
    spec.containers = kept(
        &stored.spec.containers,
        std::mem::take(&mut spec.containers),
        |c| sidecar_names.contains(c.name.as_str()),
    );
    spec.init_containers = kept(
        &stored.spec.init_containers,
        std::mem::take(&mut spec.init_containers),
        is_injected,
    );
    // The pull secrets injection added (an apply cannot change a pod's anyway).
    for secret in &stored.spec.image_pull_secrets {
        if !spec.image_pull_secrets.contains(secret) {
            spec.image_pull_secrets.push(secret.clone());
        }
    }
    // The volumes the sidecars mount (the owner's own volumes are the owner's to keep).
    let sidecar_volumes: BTreeSet<&str> = stored
        .spec
        .containers
        .iter()
        .filter(|c| sidecar_names.contains(c.name.as_str()))
        .chain(
            stored
                .spec
                .init_containers
                .iter()
                .filter(|c| is_injected(c)),
        )
        .flat_map(|c| c.volume_mounts.iter().map(|m| m.name.as_str()))
        .collect();
    for volume in &stored.spec.volumes {
        if sidecar_volumes.contains(volume.name.as_str())
            && !spec.volumes.iter().any(|v| v.name == volume.name)
        {
            spec.volumes.push(volume.clone());
        }
    }
    for (key, value) in &stored.metadata.annotations {
        let ours = key == HASH_ANNOTATION
            || key == HASH_WITHOUT_IMAGE_ANNOTATION
            || key == INJECTED_LIST_ANNOTATION
            || key == WORKING_ANNOTATION
            || key.starts_with(VERSION_ANNOTATION)
            || key.starts_with(VERSION_ALT_ANNOTATION);
        if ours && !new.metadata.annotations.contains_key(key) {
            new.metadata.annotations.insert(key.clone(), value.clone());
        }
    }
}

/// `new`'s containers with the stored sidecars it lacks put back where they stood.
fn kept(
    stored: &[Container],
    new: Vec<Container>,
    is_sidecar: impl Fn(&Container) -> bool,
) -> Vec<Container> {
    let lacks = |c: &Container| is_sidecar(c) && !new.iter().any(|n| n.name == c.name);
    if !stored.iter().any(lacks) {
        return new;
    }
    let mut out: Vec<Container> = stored
        .iter()
        .filter_map(|s| match new.iter().find(|n| n.name == s.name) {
            Some(n) => Some(n.clone()),
            None => is_sidecar(s).then(|| s.clone()),
        })
        .collect();
    out.extend(
        new.iter()
            .filter(|n| !stored.iter().any(|s| s.name == n.name))
            .cloned(),
    );
    out
}

#[cfg(test)]
mod tests;
