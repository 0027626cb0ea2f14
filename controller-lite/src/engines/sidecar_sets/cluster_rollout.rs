//! The SidecarSet engine on a cluster's pods (leader only), Kruise's SidecarSet
//! controller: each SidecarSet made with kubectl gets its versions recorded (what
//! `injectionStrategy.revision` and the webhook pick from) and its status written
//! (`kubectl get sidecarset` shows it); its pods move to a new version in place, a few
//! at a time, by the decisions Rigger's own pods use (`crate::engines::sidecar_sets`: maxUnavailable,
//! partition, paused, selector, priority and scatter, hot upgrade's two slots). Only
//! images change in a running pod: a change of anything else is reported on the set's
//! status (condition `InPlaceUpdate`) and as an event, never dropped silently — those
//! pods keep their version, and pods created from now on get the new one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use rigger_api::Object as _;
use rigger_api::fields::Condition;
use rigger_api::sidecar_set::{
    History, IN_PLACE_UPDATE_CONDITION, NAMESPACE_NAME_LABEL, SidecarSet, SidecarSetStatus,
};
use tokio::sync::Notify;

use super::injected_pods::{InjectedPod, InjectedPods, patch_of};
use super::known_members::KnownMembers;
use crate::engines::sidecar_sets::{Member, histories, history_key, to_upgrade, upgraded};
use crate::events::{Event, EventSink};
use rigger_store::{Precondition, Store, StoreError};

const TICK: Duration = Duration::from_secs(1);

/// How often a set's pod counts alone are written. In a busy cluster they change with
/// every pod created or turning ready, and a write each time made the status patches
/// follow the pods' rate (595 a minute for one set at 42 pods a second); a new
/// generation, revision or condition is written at once.
const COUNTS_EVERY: Duration = Duration::from_secs(2);

/// The engine; cheap to clone.
#[derive(Debug, Clone)]
pub struct ClusterRollout {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    client: kube::Client,
    pods: Arc<InjectedPods>,
    events: Arc<dyn EventSink>,
    namespaces: crate::cluster::namespaces::NamespaceLabels,
    /// What was last written per set: a status, the report of pods left on an older
    /// version (an event each time it changes), and when.
    written: Mutex<HashMap<String, Written>>,
    /// Each set's members as last worked out (a pass works out only what changed).
    known: Mutex<KnownMembers>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRollout").finish_non_exhaustive()
    }
}

impl ClusterRollout {
    pub fn new(
        store: Store,
        client: kube::Client,
        pods: Arc<InjectedPods>,
        events: Arc<dyn EventSink>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                namespaces: crate::cluster::namespaces::NamespaceLabels::new(client.clone()),
                client,
                pods,
                events,
                written: Mutex::new(HashMap::new()),
                known: Mutex::new(KnownMembers::default()),
            }),
        }
    }
}

/// A set's status as last written.
#[derive(Debug, Clone)]
struct Written {
    status: SidecarSetStatus,
    left: String,
    at: Instant,
}

/// One pass's reading: the sets with their histories (and the version of each history
/// record), and the injected pods once listed.
#[derive(Debug)]
pub struct Snapshot {
    sets: Vec<(SidecarSet, History, Precondition)>,
    /// Sets that do not decode, by name, with why.
    undecodable: Vec<(String, String)>,
    pods: Option<Vec<std::sync::Arc<InjectedPod>>>,
}

impl crate::engines::Engine for ClusterRollout {
    const NAME: &'static str = "sidecar rollout (cluster)";
    const TICK: Duration = TICK;
    /// Every injected pod's change wakes a pass: in a busy cluster they come faster
    /// than passes end.
    const SPACING: Duration = Duration::from_millis(500);
    const WATCHES: &'static [&'static str] = &[SidecarSet::INFO.name];
    type Snapshot = Snapshot;

    fn wake_signal(&self) -> &Notify {
        &self.inner.pods.changed
    }

    async fn observe(&self) -> Result<Snapshot, StoreError> {
        let store = &self.inner.store;
        let mut histories = histories(store).await?;
        let mut sets = Vec::new();
        let listed = store.list_all_objects::<SidecarSet>().await?;
        let undecodable = listed
            .undecodable
            .into_iter()
            .map(|(key, detail)| (key.name, super::usable::undecodable(&detail)))
            .collect();
        for stored in listed.decoded {
            let set = stored.value;
            let (history, precondition) = histories
                .remove(&set.metadata.name)
                .unwrap_or((History::default(), Precondition::Absent));
            sets.push((set, history, precondition));
        }
        Ok(Snapshot {
            sets,
            undecodable,
            pods: self.inner.pods.snapshot(),
        })
    }

    async fn pass(&self, snapshot: Snapshot) {
        for (name, cause) in &snapshot.undecodable {
            self.refused(&undecodable_set(name), cause);
        }
        let mut rolled = std::collections::HashSet::new();
        for (set, mut history, precondition) in snapshot.sets {
            // What Rigger refuses (an empty selector, say: the API server prunes a
            // typo'd one to `{}`) is rolled nowhere, and the pods its webhook entry
            // sends are refused (`usable`); said once.
            if let Err(error) = set.validate_served() {
                self.refused(&crate::events::sidecar_set(&set), &error.to_string());
                continue;
            }
            if history.record(&set) {
                self.write_history(&set, &history, precondition).await;
            }
            let Some(pods) = &snapshot.pods else {
                continue;
            };
            self.roll(&set, &history, pods).await;
            rolled.insert(set.metadata.name);
        }
        // Deleted sets, refused ones and any not rolled this pass keep no members.
        self.known().keep_only(&rolled);
    }
}

impl ClusterRollout {
    /// The members as last worked out. A panic while they were being worked out (a
    /// bug a pod reached) leaves them in doubt: they are forgotten, and worked out
    /// anew, rather than the rollout stopping for good on a poisoned lock.
    fn known(&self) -> std::sync::MutexGuard<'_, KnownMembers> {
        self.inner.known.lock().unwrap_or_else(|poisoned| {
            tracing::warn!(
                "the SidecarSet members were being worked out when a pass panicked: worked out anew"
            );
            self.inner.known.clear_poison();
            let mut known = poisoned.into_inner();
            *known = KnownMembers::default();
            known
        })
    }

    /// Tell, once per cause, that the set `regarding` names is refused.
    fn refused(&self, regarding: &crate::events::Regarding, cause: &str) {
        let Ok(mut written) = self.inner.written.lock() else {
            return;
        };
        let said = written
            .get(&regarding.name)
            .is_some_and(|said| said.left == cause);
        if said {
            return;
        }
        let said = Written {
            status: SidecarSetStatus::default(),
            left: cause.to_owned(),
            at: Instant::now(),
        };
        written.insert(regarding.name.clone(), said);
        tracing::warn!(sidecar_set = %regarding.name, %cause, "SidecarSet refused: its pods are refused");
        self.inner.events.record(Event {
            regarding: regarding.clone(),
            warning: true,
            reason: "InvalidSidecarSet",
            message: format!(
                "the pods it selects are refused (not started without their sidecars) and nothing is rolled out until it is fixed: {cause}"
            ),
        });
    }

    async fn write_history(&self, set: &SidecarSet, history: &History, precondition: Precondition) {
        let Ok(bytes) = serde_json::to_vec(history) else {
            return;
        };
        if let Err(error) = self
            .inner
            .store
            .put(history_key(&set.metadata.name), bytes, precondition)
            .await
        {
            tracing::debug!(sidecar_set = %set.metadata.name, %error, "version not recorded yet");
        }
    }

    async fn roll(
        &self,
        set: &SidecarSet,
        history: &History,
        pods: &[std::sync::Arc<InjectedPod>],
    ) {
        let hash = set.hash();
        // The namespaces' labels, as the webhook matched them (when the set selects by
        // them); a namespace not read this pass leaves its pods out of it.
        let mut namespace_labels: HashMap<&str, BTreeMap<String, String>> = HashMap::new();
        for pod in pods {
            if namespace_labels.contains_key(pod.namespace.as_str()) {
                continue;
            }
            let labels = if set.selects_namespaces() {
                match self.inner.namespaces.of(&pod.namespace).await {
                    Ok(labels) => labels,
                    Err(error) => {
                        tracing::debug!(namespace = %pod.namespace, %error, "namespace not read");
                        continue;
                    }
                }
            } else {
                BTreeMap::from([(NAMESPACE_NAME_LABEL.to_owned(), pod.namespace.clone())])
            };
            namespace_labels.insert(&pod.namespace, labels);
        }
        let matched = pods.iter().filter(|pod| {
            namespace_labels
                .get(pod.namespace.as_str())
                .is_some_and(|ns| set.matches_in(&pod.namespace, ns, &pod.labels))
        });
        let (known, _) = self.known().of(set, &hash, matched);
        let members: Vec<Arc<Member>> = known.iter().map(|(member, _)| member.clone()).collect();
        let left = left_behind(set, &hash, history, &members);
        self.write_status(set, history, &hash, &members, &left)
            .await;
        for member in to_upgrade(set, &hash, &members) {
            let Some(after) = upgraded(set, &hash, member) else {
                continue;
            };
            let Some((_, pod)) = known.iter().find(|(m, _)| std::ptr::eq(&**m, member)) else {
                continue;
            };
            let patch = patch_of(
                pod,
                &after,
                &set.metadata.name,
                &hash,
                &rigger_proto::time::now_rfc3339(),
            );
            let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.inner.client.clone(), &pod.namespace);
            match api
                .patch(
                    &pod.name,
                    &PatchParams::default(),
                    &Patch::<()>::Json(patch),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        sidecar_set = %set.metadata.name, pod = %format!("{}/{}", pod.namespace, pod.name),
                        version = %hash, "sidecars of the pod updated in place"
                    );
                    // A hot upgrade moves in two steps: told once, when the version is reached.
                    if crate::engines::sidecar_sets::at_version(set, &hash, &after) {
                        self.inner.events.record(crate::events::sidecar_upgraded(
                            set,
                            &pod.namespace,
                            &pod.name,
                            &hash,
                        ));
                    }
                }
                // Changed meanwhile (its owner, kubelet): looked at again next pass.
                Err(error) => tracing::debug!(pod = %pod.name, %error, "sidecar update deferred"),
            }
        }
    }

    /// Kruise's counts (a pod is updated once it runs the version's images and is
    /// ready), and the report of pods left behind; written when they change.
    async fn write_status(
        &self,
        set: &SidecarSet,
        history: &History,
        hash: &str,
        members: &[Arc<Member>],
        left: &str,
    ) {
        let mut status = SidecarSetStatus {
            observed_generation: set.metadata.generation.unwrap_or(1),
            latest_revision: history.current_name(set),
            collision_count: Some(history.collision_count),
            ..SidecarSetStatus::default()
        };
        for member in members {
            let updated = member.updated(hash) && member.running_spec;
            status.matched_pods += 1;
            status.updated_pods += u32::from(updated);
            status.ready_pods += u32::from(member.ready);
            status.updated_ready_pods += u32::from(updated && member.ready);
        }
        let previous = self
            .inner
            .written
            .lock()
            .ok()
            .and_then(|w| w.get(&set.metadata.name).cloned());
        let transition = match &previous {
            Some(old) if old.left == left => old
                .status
                .conditions
                .first()
                .and_then(|c| c.last_transition_time.clone()),
            _ => Some(rigger_proto::time::now_rfc3339()),
        };
        status.conditions = vec![Condition {
            kind: IN_PLACE_UPDATE_CONDITION.to_owned(),
            status: if left.is_empty() { "True" } else { "False" }.to_owned(),
            reason: if left.is_empty() {
                "InPlace"
            } else {
                "ChangeNotInPlace"
            }
            .to_owned(),
            message: left.to_owned(),
            last_transition_time: transition,
        }];
        let now = Instant::now();
        if !write_due(previous.as_ref().map(|w| (&w.status, w.at)), &status, now) {
            return;
        }
        if !left.is_empty() && previous.as_ref().is_none_or(|old| old.left != left) {
            self.inner.events.record(Event {
                regarding: crate::events::sidecar_set(set),
                warning: true,
                reason: "NotUpgradablePods",
                message: left.to_owned(),
            });
        }
        let key = rigger_store::ObjectKey::new(
            &format!("{}.status", rigger_api::sidecar_set::KIND),
            "",
            &set.metadata.name,
        );
        let Ok(bytes) = serde_json::to_vec(&status) else {
            return;
        };
        match self.inner.store.put(key, bytes, Precondition::Any).await {
            Ok(_) => {
                if let Ok(mut written) = self.inner.written.lock() {
                    let left = left.to_owned();
                    written.insert(
                        set.metadata.name.clone(),
                        Written {
                            status,
                            left,
                            at: now,
                        },
                    );
                }
            }
            Err(error) => {
                tracing::debug!(sidecar_set = %set.metadata.name, %error, "status not written yet")
            }
        }
    }
}

/// Whether a status is written now (pure): when it differs from the last one written,
/// except that a change of the pod counts alone waits until [`COUNTS_EVERY`] has passed
/// since that write (a later pass writes it: passes run at least every [`TICK`]).
fn write_due(
    last: Option<(&SidecarSetStatus, Instant)>,
    status: &SidecarSetStatus,
    now: Instant,
) -> bool {
    let Some((last, at)) = last else {
        return true;
    };
    if last == status {
        return false;
    }
    let counts_alone = SidecarSetStatus {
        matched_pods: status.matched_pods,
        updated_pods: status.updated_pods,
        ready_pods: status.ready_pods,
        updated_ready_pods: status.updated_ready_pods,
        ..last.clone()
    } == *status;
    !counts_alone || now.saturating_duration_since(at) >= COUNTS_EVERY
}

/// Which pods keep an older version because it differs in more than images, and what
/// differs (pure): "" when none does.
fn left_behind(set: &SidecarSet, hash: &str, history: &History, members: &[Arc<Member>]) -> String {
    let without_image = set.hash_without_image();
    let mut by_revision: std::collections::BTreeMap<&str, usize> = Default::default();
    for member in members {
        if member.version.hash != hash && member.version.hash_without_image != without_image {
            *by_revision
                .entry(member.version.controller_revision.as_str())
                .or_default() += 1;
        }
    }
    let reports: Vec<String> = by_revision
        .into_iter()
        .map(|(revision, count)| {
            let what = history
                .changes_beyond_images(revision, set)
                .filter(|c| !c.is_empty())
                .map_or_else(|| "more than images".to_owned(), |c| c.join("; "));
            let pods = if count == 1 { "pod keeps" } else { "pods keep" };
            format!(
                "{count} {pods} revision {revision}: {what} changed, which Kubernetes does not change in a running pod; pods created from now on get it"
            )
        })
        .collect();
    reports.join(". ")
}

/// What an event about a SidecarSet that does not decode names: its name (its uid and
/// version are in what does not decode).
fn undecodable_set(name: &str) -> crate::events::Regarding {
    crate::events::Regarding {
        api_version: rigger_api::fields::KRUISE_API_VERSION.to_owned(),
        kind: "SidecarSet".to_owned(),
        namespace: String::new(),
        name: name.to_owned(),
        uid: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(matched: u32, revision: &str) -> SidecarSetStatus {
        SidecarSetStatus {
            observed_generation: 1,
            matched_pods: matched,
            latest_revision: revision.to_owned(),
            ..SidecarSetStatus::default()
        }
    }

    #[test]
    fn counts_alone_are_written_at_most_every_interval_and_other_changes_at_once() {
        let start = Instant::now();
        let first = status(1, "r1");
        assert!(
            write_due(None, &first, start),
            "a set's first status is written"
        );
        assert!(
            !write_due(Some((&first, start)), &first, start),
            "nor the same again"
        );

        let more_pods = status(40, "r1");
        let soon = start + COUNTS_EVERY / 2;
        assert!(!write_due(Some((&first, start)), &more_pods, soon));
        assert!(write_due(
            Some((&first, start)),
            &more_pods,
            start + COUNTS_EVERY
        ));

        let new_revision = status(1, "r2");
        assert!(write_due(Some((&first, start)), &new_revision, soon));
        let mut new_generation = first.clone();
        new_generation.observed_generation = 2;
        assert!(write_due(Some((&first, start)), &new_generation, soon));
        let mut condition = first.clone();
        condition.conditions = vec![Condition {
            kind: IN_PLACE_UPDATE_CONDITION.to_owned(),
            status: "False".to_owned(),
            ..Condition::default()
        }];
        assert!(write_due(Some((&first, start)), &condition, soon));
    }
}
