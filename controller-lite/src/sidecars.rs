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
//! pods created afterwards. HotUpgrade sidecars are not rolled by this engine yet.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::objects::image_pull_job;
use crate::objects::pod::{self, Pod};
use crate::objects::sidecar_set::{self, InjectedVersion, SidecarSet, UpgradeType};
use crate::pods::PodSync;
use crate::predownload::{self, PreDownload, RolloutPod};
use crate::store::{ObjectKey, Precondition, Store, Stored};

const TICK: Duration = Duration::from_secs(1);

/// One pod of a SidecarSet, as the rollout sees it.
#[derive(Debug, Clone)]
struct Member {
    stored: Stored,
    pod: Pod,
    version: InjectedVersion,
    ready: bool,
    /// Every sidecar of the set runs the image its spec names (checked on the agent's
    /// reported status, not on the spec).
    running_spec: bool,
}

impl Member {
    fn updated(&self, hash: &str) -> bool {
        self.version.hash == hash
    }

    /// Being upgraded or not ready: what maxUnavailable bounds.
    fn unavailable(&self, hash: &str) -> bool {
        !self.ready || (self.updated(hash) && !self.running_spec)
    }
}

#[derive(Debug)]
struct Inner {
    store: Store,
    pods: PodSync,
    wake: Notify,
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
            }),
        }
    }

    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    pub async fn run(self, token: CancellationToken) {
        loop {
            if let Err(error) = self.reconcile().await {
                tracing::warn!(%error, "sidecar rollout: cannot read the store");
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = self.inner.wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }

    async fn reconcile(&self) -> Result<(), crate::store::StoreError> {
        let store = &self.inner.store;
        let sets: Vec<SidecarSet> = store
            .list(sidecar_set::KIND)
            .await?
            .iter()
            .filter_map(|s| serde_json::from_slice(&s.object).ok())
            .collect();
        if sets.is_empty() {
            return Ok(());
        }
        let mut pods = Vec::new();
        for stored in store.list(pod::KIND).await? {
            let Ok(pod) = serde_json::from_slice::<Pod>(&stored.object) else {
                continue;
            };
            let status = store
                .get(crate::pods::status_key(&stored.key))
                .await?
                .and_then(|s| serde_json::from_slice::<serde_json::Value>(&s.object).ok())
                .unwrap_or_default();
            pods.push((stored, pod, status));
        }
        for set in &sets {
            self.roll(set, &pods).await;
        }
        Ok(())
    }

    async fn roll(&self, set: &SidecarSet, pods: &[(Stored, Pod, serde_json::Value)]) {
        let name = &set.metadata.name;
        let hash = set.hash();
        let members: Vec<Member> = pods
            .iter()
            .filter_map(|(stored, pod, status)| {
                let version = sidecar_set::injected(pod).remove(name)?;
                Some(Member {
                    stored: stored.clone(),
                    pod: pod.clone(),
                    ready: is_ready(status),
                    running_spec: runs_spec(pod, status, &version.sidecar_list),
                    version,
                })
            })
            .collect();
        if members.iter().all(|m| m.updated(&hash)) {
            return;
        }
        self.pre_download(set, &hash, &members).await;
        let strategy = &set.spec.update_strategy;
        if strategy.paused {
            return;
        }
        let total = members.len();
        let keep_old = strategy.partition.map_or(0, |p| p.of(total));
        let updated = members.iter().filter(|m| m.updated(&hash)).count();
        let budget = total.saturating_sub(keep_old).saturating_sub(updated);
        let max_unavailable = strategy.max_unavailable.map_or(1, |m| m.of(total)).max(1);
        let unavailable = members.iter().filter(|m| m.unavailable(&hash)).count();
        let slots = max_unavailable.saturating_sub(unavailable).min(budget);
        if slots == 0 {
            return;
        }
        let without_image = set.hash_without_image();
        let mut candidates: Vec<&Member> = members
            .iter()
            .filter(|m| !m.updated(&hash))
            // More than images changed: only pods created from now on get it.
            .filter(|m| m.version.hash_without_image == without_image)
            .filter(|m| {
                strategy
                    .selector
                    .as_ref()
                    .is_none_or(|s| s.matches(&m.pod.metadata.labels))
            })
            .collect();
        order(set, &mut candidates);
        for member in candidates.into_iter().take(slots) {
            self.upgrade(set, &hash, member).await;
        }
    }

    /// Move one pod to the SidecarSet's current version: new images for its ColdUpgrade
    /// sidecars, new version in the annotation; conditional on the revision read.
    async fn upgrade(&self, set: &SidecarSet, hash: &str, member: &Member) {
        let mut pod = member.pod.clone();
        for sidecar in &set.spec.containers {
            if sidecar.upgrade_strategy.upgrade_type != UpgradeType::ColdUpgrade {
                continue;
            }
            if let Some(container) = pod
                .spec
                .containers
                .iter_mut()
                .find(|c| c.name == sidecar.container.name)
            {
                container.image.clone_from(&sidecar.container.image);
            }
        }
        let mut versions = sidecar_set::injected(&pod);
        if let Some(version) = versions.get_mut(&set.metadata.name) {
            hash.clone_into(&mut version.hash);
        }
        pod.metadata.annotations.insert(
            sidecar_set::HASH_ANNOTATION.to_owned(),
            serde_json::to_string(&versions).unwrap_or_default(),
        );
        pod.metadata.generation = Some(pod.metadata.generation.unwrap_or(1) + 1);
        let Ok(bytes) = serde_json::to_vec(&pod) else {
            return;
        };
        let key = member.stored.key.clone();
        match self
            .inner
            .store
            .put(
                key.clone(),
                bytes,
                Precondition::Revision(member.stored.revision),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(sidecar_set = %set.metadata.name, pod = %key, version = %hash, "sidecars of the pod upgraded in place");
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
            .filter(|s| s.upgrade_strategy.upgrade_type == UpgradeType::ColdUpgrade)
            .map(|s| s.container.image.clone())
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
            job.metadata.creation_timestamp =
                Some(humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string());
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

fn is_ready(status: &serde_json::Value) -> bool {
    status["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Whether each of `sidecars` runs (per the agent's status) the image the spec names.
fn runs_spec(pod: &Pod, status: &serde_json::Value, sidecars: &[String]) -> bool {
    let statuses = status["containerStatuses"].as_array();
    sidecars.iter().all(|name| {
        let Some(spec) = pod.spec.containers.iter().find(|c| &c.name == name) else {
            return true;
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
                .map(|o| {
                    m.pod
                        .metadata
                        .labels
                        .get(&o.order_key)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(i64::MIN)
                })
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
