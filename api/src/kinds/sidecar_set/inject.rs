//! Injection into new pods and what a pod keeps of it when its owner applies it again,
//! as Kruise's pod webhook does: metadata patches first, then each SidecarSet's init
//! containers and containers (prepared for the pod: shared volume mounts, transferred
//! env, `IS_INJECTED`), the volumes they mount, and Kruise's annotations.

use std::collections::{BTreeMap, BTreeSet};

use rigger_proto::pod::{Container, EnvVar, Pod};

use super::{
    HASH_ANNOTATION, INJECTED_ENV, INJECTED_LIST_ANNOTATION, InjectedVersion, PatchPodMetadata,
    PatchPolicy, PodInjectPolicy, SidecarContainer, SidecarSet, VERSION_ALT_ANNOTATION,
    VERSION_ANNOTATION, WORKING_ANNOTATION, container::label_or_annotation, slots_of,
};
use crate::fields::FieldError;

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
    before: Vec<Container>,
    after: Vec<Container>,
}

impl Placed {
    fn push(&mut self, policy: PodInjectPolicy, containers: Vec<Container>) {
        match policy {
            PodInjectPolicy::BeforeAppContainer => self.before.extend(containers),
            PodInjectPolicy::AfterAppContainer => self.after.extend(containers),
        }
    }

    fn around(mut self, own: Vec<Container>) -> Vec<Container> {
        self.before.extend(own);
        self.before.append(&mut self.after);
        self.before
    }
}

/// Inject the SidecarSets matching a new pod (and not paused for injection). Containers
/// go before the pod's own unless `podInjectPolicy: AfterAppContainer`; init containers
/// after the pod's own (sorted by name) unless `BeforeAppContainer`; the volumes they
/// mount are added where the pod has none of that name; the pod records each
/// SidecarSet's name, version, revision and containers in Kruise's annotations. A
/// container name the pod already uses is an error naming both (Kruise would replace
/// the pod's container; Rigger never touches a container that is not the sidecar's).
pub fn inject(pod: &mut Pod, sets: &[Versioned]) -> Result<(), FieldError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let matched: Vec<&Versioned> = sets
        .iter()
        .filter(|v| !v.set.spec.injection_strategy.paused)
        .filter(|v| v.set.matches(&namespace, &pod.metadata.labels))
        .collect();
    if matched.is_empty() {
        return Ok(());
    }
    for versioned in &matched {
        let set = &versioned.set;
        patch_metadata(&mut pod.metadata.annotations, &set.spec.patch_pod_metadata).map_err(
            |reason| {
                FieldError::new(
                    "metadata.annotations",
                    format!(
                        "SidecarSet {}: patchPodMetadata: {reason}",
                        set.metadata.name
                    ),
                )
            },
        )?;
    }
    let own: Vec<&Container> = pod
        .spec
        .containers
        .iter()
        .filter(|c| !is_injected(c))
        .collect();
    let mut taken: BTreeSet<String> = pod
        .spec
        .init_containers
        .iter()
        .chain(&pod.spec.containers)
        .map(|c| c.name.clone())
        .collect();
    let mut init = Placed::default();
    let mut init_sidecars: Vec<(PodInjectPolicy, Container)> = Vec::new();
    let mut containers = Placed::default();
    let mut volumes = Vec::new();
    let mut versions: BTreeMap<String, InjectedVersion> = BTreeMap::new();
    for versioned in &matched {
        let set = &versioned.set;
        let mut claim = |container: &Container| {
            if taken.insert(container.name.clone()) {
                Ok(())
            } else {
                Err(FieldError::new(
                    "spec.containers",
                    format!(
                        "container {:?} is also injected by SidecarSet {}; rename one",
                        container.name, set.metadata.name
                    ),
                ))
            }
        };
        let mut mounted = Vec::new();
        for sidecar in &set.spec.init_containers {
            let prepared = prepare(sidecar, &own, pod);
            claim(&prepared)?;
            mounted.extend(
                sidecar
                    .container
                    .volume_mounts
                    .iter()
                    .map(|m| m.name.clone()),
            );
            let policy = sidecar
                .pod_inject_policy
                .unwrap_or(PodInjectPolicy::AfterAppContainer);
            init_sidecars.push((policy, prepared));
        }
        let mut sidecar_list = Vec::new();
        for sidecar in &set.spec.containers {
            let prepared = prepare(sidecar, &own, pod);
            mounted.extend(
                sidecar
                    .container
                    .volume_mounts
                    .iter()
                    .map(|m| m.name.clone()),
            );
            let slots = slots_of(sidecar, prepared);
            for slot in &slots {
                claim(slot)?;
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
        versions.insert(
            set.metadata.name.clone(),
            InjectedVersion {
                sidecar_set_name: set.metadata.name.clone(),
                hash: set.hash(),
                hash_without_image: set.hash_without_image(),
                sidecar_list,
                controller_revision: versioned.revision.clone(),
            },
        );
    }
    init_sidecars.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    for (policy, container) in init_sidecars {
        init.push(policy, vec![container]);
    }
    let spec = &mut pod.spec;
    spec.init_containers = init.around(std::mem::take(&mut spec.init_containers));
    spec.containers = containers.around(std::mem::take(&mut spec.containers));
    for volume in volumes {
        if !spec.volumes.iter().any(|v| v.name == volume.name) {
            spec.volumes.push(volume);
        }
    }
    // The sets' pull secrets after the pod's own, each once (Kruise's merge).
    for secret in matched.iter().flat_map(|v| &v.set.spec.image_pull_secrets) {
        if !spec.image_pull_secrets.contains(secret) {
            spec.image_pull_secrets.push(secret.clone());
        }
    }
    let annotations = &mut pod.metadata.annotations;
    annotations.insert(
        HASH_ANNOTATION.to_owned(),
        serde_json::to_string(&versions).unwrap_or_default(),
    );
    let names: Vec<&str> = versions.keys().map(String::as_str).collect();
    annotations.insert(INJECTED_LIST_ANNOTATION.to_owned(), names.join(","));
    for versioned in &matched {
        record_hot_slots(annotations, &versioned.set);
    }
    Ok(())
}

/// Whether `container` was injected by a SidecarSet (Kruise's marker env).
pub fn is_injected(container: &Container) -> bool {
    container
        .env
        .iter()
        .any(|e| e.name == INJECTED_ENV && e.value.as_deref() == Some("true"))
}

/// The sidecar as this pod gets it: with the pod's containers' volume mounts when it
/// shares volumes (never over a mount of its own name or path), `IS_INJECTED=true`, and
/// the env vars it transfers from the pod's containers (never over its own).
fn prepare(sidecar: &SidecarContainer, own: &[&Container], pod: &Pod) -> Container {
    let mut container = sidecar.container.clone();
    if sidecar.shares_volumes() {
        for mount in own.iter().flat_map(|c| &c.volume_mounts) {
            let clash = container
                .volume_mounts
                .iter()
                .any(|m| m.name == mount.name || m.mount_path == mount.mount_path);
            if !clash {
                container.volume_mounts.push(mount.clone());
            }
        }
    }
    container.env.push(EnvVar {
        name: INJECTED_ENV.to_owned(),
        value: Some("true".to_owned()),
        value_from: None,
    });
    for transfer in &sidecar.transfer_env {
        let source = match &transfer.source_container_name_from {
            Some(from) => match label_or_annotation(&from.field_ref.field_path) {
                Some((true, key)) => pod.metadata.labels.get(key),
                Some((false, key)) => pod.metadata.annotations.get(key),
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
            let exists = container.env.iter().any(|e| e.name == name);
            if let Some(env) = source.env.iter().find(|e| e.name == name)
                && !exists
            {
                container.env.push(env.clone());
            }
        }
    }
    container
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

/// The SidecarSets a pod was injected with, from its annotation.
pub fn injected(pod: &Pod) -> BTreeMap<String, InjectedVersion> {
    pod.metadata
        .annotations
        .get(HASH_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
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
