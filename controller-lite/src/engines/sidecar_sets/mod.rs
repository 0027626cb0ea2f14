//! The SidecarSet rollout engine (leader only): when a SidecarSet's containers change,
//! its pods are moved to the new version in place, a few at a time, the way Kruise's
//! SidecarSet controller does it:
//! - a pod is upgraded by changing the images of its ColdUpgrade sidecars in the stored
//!   Pod (and the version in Kruise's `kruise.io/sidecarset-hash` annotation); its agent
//!   then updates those containers in place (`agent/src/pods/update.rs`, lifecycle and
//!   cooperators included) — application containers are never touched;
//! - `maxUnavailable` bounds pods being upgraded or not ready; `partition` pods stay on
//!   the old version; `paused` stops new upgrades; `selector` narrows the pods;
//!   `priorityStrategy` (weights, then orders) and `scatterStrategy` choose who goes first;
//! - the new images are pre-downloaded on the nodes of the pods still on the old version
//!   (`predownload.rs`) as the rollout starts.
//!
//! Only images change in place (as in Kruise): any other change of a sidecar reaches
//! pods created afterwards.
//!
//! HotUpgrade sidecars run in two slots (`<name>-1`, `<name>-2`): the idle slot (on the
//! empty image) gets the new image first; once it runs it and is ready — its postStart,
//! the state migration, has finished — the old slot gets the empty image and the idle
//! one becomes the working one (Kruise's annotations record versions and the working
//! slot). The pod stays ready throughout; a new image that never gets ready leaves the
//! old slot serving, and the pod's status says why.

pub mod cluster_rollout;
pub mod injected_pods;
mod known_members;
pub mod usable;

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::engines::pods::{PodSync, is_ready};
use crate::engines::predownload::{self, PreDownload, RolloutPod};
use rigger_api::image_pull_job;
use rigger_api::pod::Pod;
use rigger_api::sidecar_set::{self, InjectedVersion, SidecarSet, UpdateStrategyType, UpgradeType};
use rigger_store::{ObjectKey, Precondition, Store, StoreError, Versioned};

const TICK: Duration = Duration::from_secs(1);

/// Where a SidecarSet's revision history is kept.
pub fn history_key(set: &str) -> ObjectKey {
    ObjectKey::new(sidecar_set::HISTORY_KIND, "", set)
}

/// Every SidecarSet's recorded versions by set name, each with the precondition a write
/// of it goes under. A history this release cannot read (a newer one wrote it) is left
/// out: its set's write then goes under `Absent` and is refused, so it is never
/// overwritten. One listing (on a Kubernetes store, from its watch), not a read per set.
pub async fn histories(
    store: &Store,
) -> Result<HashMap<String, (sidecar_set::History, Precondition)>, StoreError> {
    Ok(store
        .list(sidecar_set::HISTORY_KIND)
        .await?
        .into_iter()
        .filter_map(|stored| {
            let name = stored.key.name.clone();
            let precondition = Precondition::Revision(stored.revision);
            match rigger_store::typed::decode::<sidecar_set::History>(stored) {
                Ok(history) => Some((name, (history.value, precondition))),
                Err(error) => {
                    tracing::debug!(set = %name, %error, "a SidecarSet's history does not decode; left as it is");
                    None
                }
            }
        })
        .collect())
}

/// One pod of a SidecarSet, as the rollout sees it (Rigger's own pods here; the
/// cluster's pods in `cluster_rollout`, in the same shape).
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// The pod's key and the revision the rollout read it at (its write is conditional
    /// on it).
    pub(crate) key: ObjectKey,
    pub(crate) revision: u64,
    pub(crate) pod: Pod,
    pub(crate) version: InjectedVersion,
    pub(crate) ready: bool,
    /// Every sidecar of the set runs the image its spec names (checked on the reported
    /// status, not on the spec).
    pub(crate) running_spec: bool,
    pub(crate) status: serde_json::Value,
    /// A hot upgrade started (an idle slot got the new image) and has not switched yet.
    pub(crate) hot_in_progress: bool,
}

impl Member {
    /// The pod `pod` of set `set` (its version from its annotations) with its status as
    /// last reported; `None` when the set was not injected into it.
    pub(crate) fn of(
        set: &SidecarSet,
        hash: &str,
        key: ObjectKey,
        revision: u64,
        pod: Pod,
        status: serde_json::Value,
    ) -> Option<Self> {
        let version = sidecar_set::injected(&pod).remove(&set.metadata.name)?;
        Some(Member {
            key,
            revision,
            ready: is_ready(&status),
            running_spec: runs_spec(&pod, &status, &version.sidecar_list),
            hot_in_progress: version.hash != hash && hot_started(set, &pod),
            pod,
            status,
            version,
        })
    }

    pub(crate) fn updated(&self, hash: &str) -> bool {
        self.version.hash == hash
    }

    /// Being upgraded or not ready: what maxUnavailable bounds.
    pub(crate) fn unavailable(&self, hash: &str) -> bool {
        !self.ready || self.hot_in_progress || (self.updated(hash) && !self.running_spec)
    }
}

#[derive(Debug)]
struct Inner {
    store: Store,
    pods: PodSync,
    wake: Notify,
    /// Where each pod's upgrade is told.
    events: Arc<dyn crate::events::EventSink>,
}

/// The engine; cheap to clone.
#[derive(Debug, Clone)]
pub struct SidecarRollout {
    inner: Arc<Inner>,
}

impl SidecarRollout {
    pub fn new(store: Store, pods: PodSync) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                pods,
                wake: Notify::new(),
                events: Arc::new(crate::events::NoEvents),
            }),
        }
    }

    /// The engine, telling each pod's upgrade to `events`.
    #[must_use]
    pub fn with_events(mut self, events: Arc<dyn crate::events::EventSink>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.events = events;
        }
        self
    }

    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }
}

/// What a rollout pass reads from the store: the sets, and (when there is one) every
/// pod with its status as the agents last reported it.
#[derive(Debug)]
pub struct RolloutSnapshot {
    sets: Vec<SidecarSet>,
    pods: Vec<(Versioned<Pod>, serde_json::Value)>,
}

impl crate::engines::Engine for SidecarRollout {
    const NAME: &'static str = "sidecar rollout";
    const TICK: Duration = TICK;
    type Snapshot = RolloutSnapshot;

    fn wake_signal(&self) -> &Notify {
        &self.inner.wake
    }

    async fn observe(&self) -> Result<RolloutSnapshot, StoreError> {
        let store = &self.inner.store;
        let sets: Vec<SidecarSet> = store
            .list_objects::<SidecarSet>()
            .await?
            .into_iter()
            .map(|s| s.value)
            .collect();
        let mut pods = Vec::new();
        if sets.is_empty() {
            return Ok(RolloutSnapshot { sets, pods });
        }
        for pod in store.list_objects::<Pod>().await? {
            let status = match store
                .get_as::<serde_json::Value>(crate::engines::pods::status_key(&pod.key))
                .await
            {
                Ok(status) => status.map(|s| s.value).unwrap_or_default(),
                // An unreadable status is no status: the pod is not ready.
                Err(StoreError::Undecodable { .. }) => serde_json::Value::Null,
                Err(error) => return Err(error),
            };
            pods.push((pod, status));
        }
        Ok(RolloutSnapshot { sets, pods })
    }

    async fn pass(&self, snapshot: RolloutSnapshot) {
        for set in &snapshot.sets {
            self.roll(set, &snapshot.pods).await;
        }
    }
}

impl SidecarRollout {
    async fn roll(&self, set: &SidecarSet, pods: &[(Versioned<Pod>, serde_json::Value)]) {
        let hash = set.hash();
        let members = members(set, &hash, pods);
        if members.iter().all(|m| m.updated(&hash)) {
            return;
        }
        self.pre_download(set, &hash, &members).await;
        for member in to_upgrade(set, &hash, &members) {
            if let Some(pod) = upgraded(set, &hash, member) {
                self.store_upgrade(set, &hash, member, pod).await;
            }
        }
    }

    /// Store a pod moved towards the set's version, conditional on the revision read,
    /// and tell its node.
    async fn store_upgrade(&self, set: &SidecarSet, hash: &str, member: &Member, pod: Pod) {
        let arrived = at_version(set, hash, &pod);
        let Ok(bytes) = serde_json::to_vec(&pod) else {
            return;
        };
        let key = member.key.clone();
        match self
            .inner
            .store
            .put(key.clone(), bytes, Precondition::Revision(member.revision))
            .await
        {
            Ok(_) => {
                tracing::info!(sidecar_set = %set.metadata.name, pod = %key, version = %hash, "sidecars of the pod upgraded in place");
                // A hot upgrade moves in two steps: told once, when the version is reached.
                if arrived {
                    self.inner.events.record(crate::events::sidecar_upgraded(
                        set,
                        &key.namespace,
                        &key.name,
                        hash,
                    ));
                }
                if let Some(node) = &pod.spec.node_name {
                    self.inner.pods.send_to(node).await;
                }
            }
            Err(error) => {
                // Changed meanwhile (an apply): looked at again next tick.
                tracing::debug!(pod = %key, %error, "sidecar upgrade deferred");
            }
        }
    }

    /// ImagePullJobs for the new images on the nodes of pods still on the old version.
    async fn pre_download(&self, set: &SidecarSet, hash: &str, members: &[Member]) {
        let images: Vec<String> = set
            .spec
            .containers
            .iter()
            .map(|s| s.image().to_owned())
            .collect();
        let rollout: Vec<RolloutPod> = members
            .iter()
            .map(|m| RolloutPod {
                node: m.pod.spec.node_name.clone().unwrap_or_default(),
                updated: m.updated(hash),
                ready: m.ready,
            })
            .collect();
        let owner = format!("sidecarset-{}", set.metadata.name);
        for job in predownload::plan(
            &owner,
            "default",
            hash,
            &images,
            &rollout,
            PreDownload::default(),
        ) {
            let key = ObjectKey::new(image_pull_job::KIND, "default", &job.metadata.name);
            let mut job = job;
            job.metadata.uid = Some(format!("{owner}-{hash}-{}", job.metadata.name));
            job.metadata.creation_timestamp = Some(rigger_proto::time::now_rfc3339());
            let Ok(bytes) = serde_json::to_vec(&job) else {
                continue;
            };
            // Once per version: an existing job (running or done) is left alone.
            if self
                .inner
                .store
                .put(key.clone(), bytes, Precondition::Absent)
                .await
                .is_ok()
            {
                tracing::info!(sidecar_set = %set.metadata.name, job = %key, "pre-downloading the new sidecar image");
            }
        }
    }
}

/// The pods the set was injected into, with what the rollout needs to know of each.
fn members(
    set: &SidecarSet,
    hash: &str,
    pods: &[(Versioned<Pod>, serde_json::Value)],
) -> Vec<Member> {
    pods.iter()
        .filter_map(|(stored, status)| {
            Member::of(
                set,
                hash,
                stored.key.clone(),
                stored.revision,
                stored.value.clone(),
                status.clone(),
            )
        })
        .collect()
}

/// Which pods move now: hot upgrades under way (whatever the budget: they hold a
/// slot), then candidates by priority and scatter within maxUnavailable, partition and
/// selector; nothing while paused or with updateStrategy.type NotUpdate. Pods whose
/// sidecars changed more than their images are left alone (only pods created from now
/// on get the new version).
pub(crate) fn to_upgrade<'a, M: std::borrow::Borrow<Member>>(
    set: &SidecarSet,
    hash: &str,
    members: &'a [M],
) -> Vec<&'a Member> {
    let members: Vec<&Member> = members.iter().map(std::borrow::Borrow::borrow).collect();
    let strategy = &set.spec.update_strategy;
    if strategy.paused || strategy.kind == UpdateStrategyType::NotUpdate {
        return Vec::new();
    }
    let total = members.len();
    let keep_old = strategy.partition.map_or(0, |p| p.of(total));
    let updated = members.iter().filter(|m| m.updated(hash)).count();
    let budget = total.saturating_sub(keep_old).saturating_sub(updated);
    let max_unavailable = strategy.max_unavailable.map_or(1, |m| m.of(total)).max(1);
    let mut chosen: Vec<&Member> = members
        .iter()
        .copied()
        .filter(|m| m.hot_in_progress)
        .collect();
    let unavailable = members.iter().filter(|m| m.unavailable(hash)).count();
    let slots = max_unavailable.saturating_sub(unavailable).min(budget);
    if slots == 0 {
        return chosen;
    }
    let without_image = set.hash_without_image();
    let mut candidates: Vec<&Member> = members
        .iter()
        .copied()
        .filter(|m| !m.updated(hash) && !m.hot_in_progress)
        .filter(|m| m.version.hash_without_image == without_image)
        .filter(|m| {
            strategy
                .selector
                .as_ref()
                .is_none_or(|s| s.matches(&m.pod.metadata.labels))
        })
        .collect();
    order(set, &mut candidates);
    chosen.extend(candidates.into_iter().take(slots));
    chosen
}

/// The pod moved one step towards the set's version (`None`: nothing to do yet): new
/// images for its ColdUpgrade sidecars, native ones (init containers with `restartPolicy:
/// Always`, which kubelet restarts in place on an image change) too; for HotUpgrade ones, first the idle slot gets
/// the new image, and once it runs it and is ready the old slot gets the empty image
/// and the idle one becomes the working one. The version in the annotation moves when
/// all is done.
pub(crate) fn upgraded(set: &SidecarSet, hash: &str, member: &Member) -> Option<Pod> {
    let mut pod = member.pod.clone();
    let mut all_switched = true;
    // Only what the injection recorded as this set's: never a container of the pod's own
    // that happens to bear a sidecar's name.
    let injected = |name: &str| member.version.sidecar_list.iter().any(|s| s == name);
    // Kruise leaves native sidecars at their old image (kruise#1671). Only Kubernetes
    // mode has them (Rigger's own pods refuse them), and its pods show only their native
    // init containers here: an ordinary one is never changed.
    for sidecar in set.spec.init_containers.iter().filter(|s| s.is_native()) {
        let name = sidecar.name();
        if !injected(name) {
            continue;
        }
        if let Some(container) = pod.spec.init_containers.iter_mut().find(|c| c.name == name) {
            sidecar.image().clone_into(&mut container.image);
        }
    }
    for sidecar in &set.spec.containers {
        let name = sidecar.name();
        match sidecar.upgrade_strategy.upgrade_type {
            UpgradeType::ColdUpgrade => {
                if !injected(name) {
                    continue;
                }
                if let Some(container) = pod.spec.containers.iter_mut().find(|c| c.name == name) {
                    sidecar.image().clone_into(&mut container.image);
                }
            }
            UpgradeType::HotUpgrade => {
                let switched = hot_step(
                    &mut pod,
                    &member.status,
                    name,
                    sidecar.image(),
                    sidecar.empty_image(),
                    hash,
                );
                all_switched &= switched;
            }
        }
    }
    if pod == member.pod {
        return None; // Waiting for the new slot to be ready.
    }
    let mut versions = sidecar_set::injected(&pod);
    if all_switched && let Some(version) = versions.get_mut(&set.metadata.name) {
        hash.clone_into(&mut version.hash);
    }
    pod.metadata.annotations.insert(
        sidecar_set::HASH_ANNOTATION.to_owned(),
        serde_json::to_string(&versions).unwrap_or_default(),
    );
    pod.metadata.generation = Some(pod.metadata.generation.unwrap_or(1) + 1);
    Some(pod)
}

/// Whether `pod` records the set's version `hash` as its own (a hot upgrade's first step
/// does not yet).
pub(crate) fn at_version(set: &SidecarSet, hash: &str, pod: &Pod) -> bool {
    sidecar_set::injected(pod)
        .get(&set.metadata.name)
        .is_some_and(|version| version.hash == hash)
}

/// The working and idle slot of hot-upgrade sidecar `name`.
fn slots(pod: &Pod, name: &str) -> (String, String) {
    // Only one of the sidecar's own two slots can be the working one, whatever the
    // annotation (the pod's creator's to write) says.
    let working = working_slots(pod)
        .remove(name)
        .filter(|slot| *slot == format!("{name}-1") || *slot == format!("{name}-2"))
        .unwrap_or_else(|| format!("{name}-1"));
    let idle = if working.ends_with("-1") {
        format!("{name}-2")
    } else {
        format!("{name}-1")
    };
    (working, idle)
}

fn working_slots(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata
        .annotations
        .get(sidecar_set::WORKING_ANNOTATION)
        .and_then(|w| serde_json::from_str(w).ok())
        .unwrap_or_default()
}

/// Whether a hot upgrade of `set` started on `pod`: an idle slot runs (in spec) an image
/// other than its empty image.
fn hot_started(set: &SidecarSet, pod: &Pod) -> bool {
    set.spec.containers.iter().any(|sidecar| {
        if sidecar.upgrade_strategy.upgrade_type != UpgradeType::HotUpgrade {
            return false;
        }
        let (_, idle) = slots(pod, sidecar.name());
        let empty = sidecar.empty_image();
        pod.spec
            .containers
            .iter()
            .any(|c| c.name == idle && c.image != empty)
    })
}

/// One step of sidecar `name`'s hot upgrade to `image`; true once switched.
fn hot_step(
    pod: &mut Pod,
    status: &serde_json::Value,
    name: &str,
    image: &str,
    empty: &str,
    hash: &str,
) -> bool {
    let (working, idle) = slots(pod, name);
    let spec_image = |pod: &Pod, slot: &str| {
        pod.spec
            .containers
            .iter()
            .find(|c| c.name == slot)
            .map(|c| c.image.clone())
            .unwrap_or_default()
    };
    if spec_image(pod, &working) == image {
        return true; // Already on this version.
    }
    if spec_image(pod, &idle) != image {
        // Start the new version in the idle slot; versions as Kruise sets them.
        if let Some(slot) = pod.spec.containers.iter_mut().find(|c| c.name == idle) {
            slot.image = image.to_owned();
        }
        let annotations = &mut pod.metadata.annotations;
        let working_version = annotations
            .get(&format!("{}{working}", sidecar_set::VERSION_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        annotations.insert(
            format!("{}{idle}", sidecar_set::VERSION_ANNOTATION),
            hash.to_owned(),
        );
        annotations.insert(
            format!("{}{idle}", sidecar_set::VERSION_ALT_ANNOTATION),
            working_version,
        );
        annotations.insert(
            format!("{}{working}", sidecar_set::VERSION_ALT_ANNOTATION),
            hash.to_owned(),
        );
        return false;
    }
    // The new slot must run the new image and be ready (postStart, the state migration,
    // has finished by then) before the old one is emptied.
    let ready = status["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == idle.as_str()))
        .is_some_and(|c| {
            c["image"] == image && c["ready"] == true && c["state"].get("running").is_some()
        });
    if !ready {
        return false;
    }
    if let Some(slot) = pod.spec.containers.iter_mut().find(|c| c.name == working) {
        slot.image = empty.to_owned();
    }
    let mut slots = working_slots(pod);
    slots.insert(name.to_owned(), idle);
    pod.metadata.annotations.insert(
        sidecar_set::WORKING_ANNOTATION.to_owned(),
        serde_json::to_string(&slots).unwrap_or_default(),
    );
    true
}

/// Whether each of `sidecars` runs (per the agent's status) the image the spec names.
fn runs_spec(pod: &Pod, status: &serde_json::Value, sidecars: &[String]) -> bool {
    sidecars.iter().all(|name| {
        // A native sidecar's status is among the init containers'.
        let (spec, statuses) = match pod.spec.containers.iter().find(|c| &c.name == name) {
            Some(spec) => (spec, status["containerStatuses"].as_array()),
            None => match pod.spec.init_containers.iter().find(|c| &c.name == name) {
                Some(spec) => (spec, status["initContainerStatuses"].as_array()),
                None => return true,
            },
        };
        statuses
            .and_then(|s| s.iter().find(|c| c["name"] == name.as_str()))
            .is_some_and(|c| {
                c["image"] == spec.image.as_str()
                    && c["ready"] == true
                    && c["state"].get("running").is_some()
            })
    })
}

/// Who goes first: higher weight, then higher order-label value, then spread over the
/// scatter labels' values, then by name (stable).
fn order(set: &SidecarSet, candidates: &mut Vec<&Member>) {
    let strategy = &set.spec.update_strategy;
    let weight = |m: &Member| -> i64 {
        strategy.priority_strategy.as_ref().map_or(0, |p| {
            p.weight_priority
                .iter()
                .filter(|w| w.match_selector.matches(&m.pod.metadata.labels))
                .map(|w| i64::from(w.weight))
                .sum()
        })
    };
    let orders = |m: &Member| -> Vec<i64> {
        strategy.priority_strategy.as_ref().map_or(Vec::new(), |p| {
            p.order_priority
                .iter()
                .map(|o| o.order_of(&m.pod.metadata.labels))
                .collect()
        })
    };
    candidates.sort_by_key(|m| {
        (
            Reverse(weight(m)),
            Reverse(orders(m)),
            m.pod.metadata.name.clone(),
        )
    });
    if strategy.scatter_strategy.is_empty() {
        return;
    }
    // Scatter: pods carrying a scatter label are spread out among the others, so they
    // do not all go in the same batch.
    let (scattered, rest): (Vec<&Member>, Vec<&Member>) = candidates.iter().partition(|m| {
        strategy
            .scatter_strategy
            .iter()
            .any(|t| m.pod.metadata.labels.get(&t.key) == Some(&t.value))
    });
    if scattered.is_empty() || rest.is_empty() {
        return;
    }
    let every = (rest.len() + scattered.len()) / scattered.len();
    let mut merged = Vec::with_capacity(candidates.len());
    let mut scattered = scattered.into_iter();
    for (i, member) in rest.into_iter().enumerate() {
        if i % every == 0
            && let Some(next) = scattered.next()
        {
            merged.push(next);
        }
        merged.push(member);
    }
    merged.extend(scattered);
    *candidates = merged;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn set(strategy: &serde_json::Value) -> SidecarSet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "SidecarSet",
            "metadata": {"name": "log"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "containers": [{"name": "log", "image": "r.example/log:2"}],
                "updateStrategy": strategy,
            }
        }))
        .unwrap()
    }

    /// Pod `name` on the set's previous version (same sidecars, other images).
    fn member(set: &SidecarSet, name: &str, ready: bool) -> Member {
        Member {
            key: ObjectKey::new(rigger_api::pod::KIND, "default", name),
            revision: 1,
            pod: serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}]}
            }))
            .unwrap(),
            version: InjectedVersion {
                sidecar_set_name: "log".to_owned(),
                hash: "old".to_owned(),
                hash_without_image: set.hash_without_image(),
                sidecar_list: vec!["log".to_owned()],
                controller_revision: String::new(),
                update_timestamp: None,
            },
            ready,
            running_spec: true,
            status: serde_json::Value::Null,
            hot_in_progress: false,
        }
    }

    #[test]
    fn max_unavailable_bounds_the_pods_moved_and_paused_moves_none() {
        let set = set(&serde_json::json!({}));
        let hash = set.hash();
        let members: Vec<Member> = ["a", "b", "c"]
            .iter()
            .map(|n| member(&set, n, true))
            .collect();
        assert_eq!(
            to_upgrade(&set, &hash, &members).len(),
            1,
            "maxUnavailable 1"
        );

        let wide = set_with(&set, serde_json::json!({"maxUnavailable": 2}));
        assert_eq!(to_upgrade(&wide, &wide.hash(), &members).len(), 2);

        let mut one_down = members;
        one_down[0].ready = false;
        assert!(
            to_upgrade(&set, &hash, &one_down).is_empty(),
            "a pod not ready uses the only slot"
        );

        let paused = set_with(&set, serde_json::json!({"paused": true}));
        let members: Vec<Member> = ["a", "b"]
            .iter()
            .map(|n| member(&paused, n, true))
            .collect();
        assert!(to_upgrade(&paused, &paused.hash(), &members).is_empty());
        // NotUpdate: the pods that have the sidecars keep their version.
        let not_update = set_with(&set, serde_json::json!({"type": "NotUpdate"}));
        let members: Vec<Member> = ["p1", "p2", "p3"]
            .iter()
            .map(|n| member(&not_update, n, true))
            .collect();
        assert!(to_upgrade(&not_update, &not_update.hash(), &members).is_empty());
        let rolling = set_with(&set, serde_json::json!({"type": "RollingUpdate"}));
        assert_eq!(to_upgrade(&rolling, &rolling.hash(), &members).len(), 1);
    }

    #[test]
    fn a_pod_whose_sidecars_changed_more_than_images_is_left_alone() {
        let set = set(&serde_json::json!({"maxUnavailable": 3}));
        let mut other = member(&set, "a", true);
        other.version.hash_without_image = "different".to_owned();
        let members = vec![other, member(&set, "b", true)];
        let chosen = to_upgrade(&set, &set.hash(), &members);
        let names: Vec<&str> = chosen.iter().map(|m| m.key.name.as_str()).collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn a_pod_is_at_the_sets_version_once_its_annotation_records_it() {
        let set = set(&serde_json::json!({}));
        let hash = set.hash();
        let mut member = member(&set, "a", true);
        member.pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "a"},
            "spec": {"containers": [
                {"name": "log", "image": "r.example/log:1"},
                {"name": "app", "image": "r.example/app:1"},
            ]}
        }))
        .unwrap();
        member.pod.metadata.annotations.insert(
            sidecar_set::HASH_ANNOTATION.to_owned(),
            serde_json::to_string(&BTreeMap::from([("log", &member.version)])).unwrap(),
        );
        assert!(!at_version(&set, &hash, &member.pod));
        let after = upgraded(&set, &hash, &member).unwrap();
        assert!(
            at_version(&set, &hash, &after),
            "a cold upgrade arrives in one step"
        );
        assert!(!at_version(&set, "another", &after));
    }

    fn set_with(base: &SidecarSet, strategy: serde_json::Value) -> SidecarSet {
        let mut value = serde_json::to_value(base).unwrap();
        value["spec"]["updateStrategy"] = strategy;
        serde_json::from_value(value).unwrap()
    }
}
