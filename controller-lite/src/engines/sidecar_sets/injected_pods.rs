//! The cluster's pods that SidecarSets were injected into, as the rollout reads and
//! writes them: the Pods' one watch (`cluster::pods::keep_placed`) keeps those carrying
//! Kruise's injection annotation ([`InjectedPods`]); each seen as a member of its sets in the rollout's
//! shape ([`member_of`], pure); and an upgrade written back as a JSON patch of the
//! sidecars' images and Kruise's annotations only, at the version read ([`patch_of`],
//! pure) — kubelet restarts just those containers.
//!
//! kubelet reports a container's image in its own spelling (`docker.io/library/…`), so
//! "runs the new image" is read as Kruise reads it: the container's image ID (or its
//! container ID) changed from what the update recorded, and it is running and ready.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use rigger_api::pod::Pod as RiggerPod;
use rigger_api::sidecar_set::{HASH_ANNOTATION, IN_PLACE_STATE_ANNOTATION, SidecarSet};
use rigger_proto::pod::{Container, ObjectMeta, PodSpec};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::cluster::watched::Relisted;
use crate::engines::sidecar_sets::Member;
use rigger_store::ObjectKey;

/// One injected pod, as much of it as the rollout reads: in a big cluster every injected
/// pod is kept, so nothing more (its status cut to [`rollout_status`]).
#[derive(Debug, Clone)]
pub struct InjectedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Name and image of each of `spec.containers`, in order.
    pub containers: Vec<(String, String)>,
    /// The same of `spec.initContainers` (native sidecars are updated in place too).
    pub init_containers: Vec<(String, String)>,
    /// The init containers that are native sidecars (`restartPolicy: Always`): the only
    /// ones the rollout may change.
    pub native: std::collections::BTreeSet<String>,
    /// The containers (and init containers) marked injected (`IS_INJECTED=true`): only
    /// those are a set's sidecars, whatever the annotations say.
    pub marked: std::collections::BTreeSet<String>,
    pub node: Option<String>,
    /// What the rollout reads of `status` ([`rollout_status`]).
    pub status: Value,
}

/// The same pod, whatever its resourceVersion: a change the rollout does not read (a
/// probe's time, a condition it ignores) is no change, and wakes no pass. The version
/// kept is still the newest, for the patch's test.
impl PartialEq for InjectedPod {
    fn eq(&self, other: &Self) -> bool {
        self.namespace == other.namespace
            && self.name == other.name
            && self.uid == other.uid
            && self.labels == other.labels
            && self.annotations == other.annotations
            && self.containers == other.containers
            && self.init_containers == other.init_containers
            && self.native == other.native
            && self.marked == other.marked
            && self.node == other.node
            && self.status == other.status
    }
}

/// What the rollout reads of a pod's status (`Member::of`, its readiness, and
/// which image each container runs): the Ready condition, and each container's name,
/// image, image and container IDs, readiness and whether it runs.
pub fn rollout_status(status: &k8s_openapi::api::core::v1::PodStatus) -> Value {
    let containers = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        statuses
            .iter()
            .flatten()
            .map(|c| {
                let mut kept = json!({
                    "name": c.name, "image": c.image, "imageID": c.image_id,
                    "containerID": c.container_id, "ready": c.ready,
                });
                if c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                    kept["state"] = json!({"running": {}});
                }
                kept
            })
            .collect::<Vec<_>>()
    };
    let ready: Vec<Value> = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ == "Ready")
        .map(|c| json!({"type": c.type_, "status": c.status}))
        .collect();
    json!({
        "conditions": ready,
        "containerStatuses": containers(&status.container_statuses),
        "initContainerStatuses": containers(&status.init_container_statuses),
    })
}

fn injected_of(pod: &Pod) -> Option<(String, Arc<InjectedPod>)> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    // Pods going away, or done, are nobody's to update.
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !annotations.contains_key(HASH_ANNOTATION)
        || pod.metadata.deletion_timestamp.is_some()
        || matches!(phase, Some("Succeeded" | "Failed"))
    {
        return None;
    }
    let uid = pod.metadata.uid.clone()?;
    let spec = pod.spec.as_ref()?;
    Some((
        uid.clone(),
        Arc::new(InjectedPod {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid,
            resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations,
            containers: spec
                .containers
                .iter()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect(),
            init_containers: spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
                .collect(),
            native: spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"))
                .map(|c| c.name.clone())
                .collect(),
            marked: spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .filter(|c| rigger_api::sidecar_set::is_injected_kube(c))
                .map(|c| c.name.clone())
                .collect(),
            node: spec.node_name.clone(),
            status: pod.status.as_ref().map_or(Value::Null, rollout_status),
        }),
    ))
}

/// The injected pods, kept by one watch; `listed` once the first listing is in.
#[derive(Debug, Default)]
pub struct InjectedPods {
    kept: Mutex<(Relisted<Arc<InjectedPod>>, bool)>,
    /// Notified when they change.
    pub changed: Notify,
}

impl InjectedPods {
    /// Take in one watch event.
    pub fn apply(&self, event: Event<Pod>) {
        let changed = {
            let Ok(mut kept) = self.kept.lock() else {
                return;
            };
            let listing_done = matches!(event, Event::InitDone);
            let changed = kept
                .0
                .apply(event, injected_of, |pod| pod.metadata.uid.clone());
            kept.1 |= listing_done;
            changed
        };
        if changed {
            self.changed.notify_one();
        }
    }

    /// Every injected pod, once listed (shared: a pass copies no pod).
    pub fn snapshot(&self) -> Option<Vec<Arc<InjectedPod>>> {
        let kept = self.kept.lock().ok()?;
        kept.1.then(|| kept.0.current.values().cloned().collect())
    }
}

/// What an update recorded of a set's containers: image and container ID by name.
type Recorded = HashMap<String, (String, String)>;

fn recorded(pod: &InjectedPod, set: &str) -> Recorded {
    let state: Value = pod
        .annotations
        .get(IN_PLACE_STATE_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(Value::Null);
    state[set]["lastContainerStatuses"]
        .as_object()
        .map(|containers| {
            containers
                .iter()
                .map(|(name, last)| {
                    let id = |key: &str| last[key].as_str().unwrap_or_default().to_owned();
                    (name.clone(), (id("imageID"), id("containerID")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `pod` as a member of `set` (pure): Rigger's pod shape with the containers' names and
/// images, and a status whose containers show the image the spec names once they run
/// it — a container an update recorded runs it once its image or container ID moved
/// on; one never updated runs what it was created with.
pub(crate) fn member_of(set: &SidecarSet, hash: &str, pod: &InjectedPod) -> Option<Member> {
    let shadow = RiggerPod {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        metadata: ObjectMeta {
            name: pod.name.clone(),
            namespace: Some(pod.namespace.clone()),
            labels: pod.labels.clone(),
            annotations: pod.annotations.clone(),
            uid: Some(pod.uid.clone()),
            ..ObjectMeta::default()
        },
        spec: PodSpec {
            node_name: pod.node.clone(),
            init_containers: shadow_containers(
                &pod.init_containers
                    .iter()
                    .filter(|(name, _)| pod.native.contains(name))
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
            containers: shadow_containers(&pod.containers),
            ..PodSpec::default()
        },
        status: None,
    };
    let records = recorded(pod, &set.metadata.name);
    let mut status = pod.status.clone();
    for (statuses, specs) in [
        ("containerStatuses", &pod.containers),
        ("initContainerStatuses", &pod.init_containers),
    ] {
        let Some(statuses) = status[statuses].as_array_mut() else {
            continue;
        };
        for container in statuses {
            let name = container["name"].as_str().unwrap_or_default().to_owned();
            let Some((_, spec_image)) = specs.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            let id = |key: &str| container[key].as_str().unwrap_or_default().to_owned();
            let moved_on = records.get(&name).is_none_or(|(image_id, container_id)| {
                (!id("imageID").is_empty() && id("imageID") != *image_id)
                    || (!id("containerID").is_empty() && id("containerID") != *container_id)
            });
            container["image"] = if moved_on {
                Value::String(spec_image.clone())
            } else {
                Value::String(String::new())
            };
        }
    }
    let member = Member::of(
        set,
        hash,
        ObjectKey::new("Pod", &pod.namespace, &pod.name),
        0,
        shadow,
        status,
    )?;
    // Kruise's annotations are the pod's creator's to write: a pod is the set's only if
    // every sidecar they name is one the webhook injected (else a forged list would
    // steer the rollout to the pod's own containers, or hold its budget; an empty one
    // names none).
    let sidecars = &member.version.sidecar_list;
    (!sidecars.is_empty() && sidecars.iter().all(|name| pod.marked.contains(name)))
        .then_some(member)
}

fn shadow_containers(containers: &[(String, String)]) -> Vec<Container> {
    containers
        .iter()
        .map(|(name, image)| Container {
            name: name.clone(),
            image: image.clone(),
            ..Container::default()
        })
        .collect()
}

/// The JSON patch (RFC 6902) moving `pod` to `after` (the rollout's next step for it):
/// only if it is still at the version read; each container whose image changes, by its
/// place; and the annotations, with what the changed containers run now recorded under
/// `set` (Kruise's in-place update state), so that their restart can be told.
pub fn patch_of(pod: &InjectedPod, after: &RiggerPod, set: &str, hash: &str, now: &str) -> Value {
    let mut operations = vec![json!({
        "op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version,
    })];
    let mut state: Value = pod
        .annotations
        .get(IN_PLACE_STATE_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    let entry = &mut state[set];
    if !entry.is_object() {
        *entry = json!({});
    }
    entry["revision"] = json!(hash);
    entry["updateTimestamp"] = json!(now);
    if !entry["lastContainerStatuses"].is_object() {
        entry["lastContainerStatuses"] = json!({});
    }
    for (field, statuses, before, now) in [
        (
            "containers",
            "containerStatuses",
            &pod.containers,
            &after.spec.containers,
        ),
        (
            "initContainers",
            "initContainerStatuses",
            &pod.init_containers,
            &after.spec.init_containers,
        ),
    ] {
        let statuses = pod.status[statuses].as_array();
        for (i, (name, image)) in before.iter().enumerate() {
            let Some(new) = now.iter().find(|c| c.name == *name) else {
                continue;
            };
            if new.image == *image {
                continue;
            }
            operations.push(json!({
                "op": "replace", "path": format!("/spec/{field}/{i}/image"), "value": new.image,
            }));
            let running = statuses
                .and_then(|s| s.iter().find(|c| c["name"] == name.as_str()))
                .cloned()
                .unwrap_or(Value::Null);
            entry["lastContainerStatuses"][name] = json!({
                "imageID": running["imageID"].as_str().unwrap_or_default(),
                "containerID": running["containerID"].as_str().unwrap_or_default(),
            });
        }
    }
    let mut annotations = after.metadata.annotations.clone();
    annotations.insert(IN_PLACE_STATE_ANNOTATION.to_owned(), state.to_string());
    operations.push(json!({"op": "add", "path": "/metadata/annotations", "value": annotations}));
    Value::Array(operations)
}

#[cfg(test)]
mod tests;
