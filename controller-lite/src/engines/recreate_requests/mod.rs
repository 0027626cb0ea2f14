//! The ContainerRecreateRequest engine: routes each request to its pod's node as a task,
//! one request per pod at a time (oldest first), and folds the agent's reports into the
//! request's status.
//!
//! The apply step (`serve/control/`) resolves the pod once and records it in Kruise's labels
//! `crr.apps.kruise.io/pod-uid` and `crr.apps.kruise.io/node-name`; the engine trusts
//! those. Users own the spec (`ContainerRecreateRequest/<ns>/<name>`), the engine owns the
//! status (`ContainerRecreateRequest.status/<ns>/<name>`). The deadline
//! (`activeDeadlineSeconds`, from creation) and the TTL are enforced here, so they hold
//! even when the node is gone. Task ids are `crr/<request uid>`.

use rigger_proto::time::now_rfc3339;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rigger_proto::v1::{
    ContainerRecreatePhase as WirePhase, ControllerMessage, TaskPhase, TaskStatus,
};
use tokio::sync::Notify;

use crate::fleet::nodes::NodeRegistry;
use rigger_api::Condition;
use rigger_api::Object as _;
use rigger_api::container_recreate_request::{
    self as crr, ContainerRecreatePhase, ContainerRecreateRequest, ContainerRecreateState,
    CrrPhase, CrrStatus,
};
use rigger_api::pod::{self, Pod};
use rigger_store::{ObjectKey, Precondition, Store, StoreError};

/// The store kind under which request statuses live.
pub const STATUS_KIND: &str = "ContainerRecreateRequest.status";
pub use rigger_api::container_recreate_request::{NODE_NAME_LABEL, POD_UID_LABEL};

mod active;
mod admission;
mod decide;
mod events;
mod tasks;

use tasks::cancel;

pub use admission::{ACTIVE_LABEL, ClusterPods, PodFacts};

use decide::decide;
/// Who runs the pod: `rigger` (an agent-managed Pod object) or `kubelet`.
pub const POD_OWNER_LABEL: &str = "rigger.dev/pod-owner";
/// Task ids of recreates start with this.
pub const TASK_PREFIX: &str = "crr/";
const TICK: Duration = Duration::from_millis(500);

pub fn status_key(request: &ObjectKey) -> ObjectKey {
    ObjectKey::new(STATUS_KIND, &request.namespace, &request.name)
}

pub fn is_recreate_task(id: &str) -> bool {
    id.starts_with(TASK_PREFIX)
}

#[derive(Debug)]
struct Tracked {
    request: ContainerRecreateRequest,
    status: CrrStatus,
    /// The task reached the agent's queue in this session of the node (not persisted:
    /// after a reconnect or a controller restart it is sent again; the agent knows it).
    sent: bool,
    dirty: bool,
    /// Completed since the last flush: its event is still to be recorded.
    announce: bool,
}

impl Tracked {
    fn task_id(&self) -> String {
        format!(
            "{TASK_PREFIX}{}",
            self.request.metadata.uid.as_deref().unwrap_or_default()
        )
    }

    fn label(&self, key: &str) -> &str {
        self.request
            .metadata
            .labels
            .get(key)
            .map_or("", String::as_str)
    }

    fn finished(&self) -> bool {
        self.status.phase == CrrPhase::Completed
    }

    fn created(&self) -> SystemTime {
        self.request
            .metadata
            .creation_timestamp
            .as_deref()
            .and_then(|t| humantime::parse_rfc3339(t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }

    /// End the request: every container still open fails with `reason`.
    fn complete(&mut self, reason: &str) {
        for state in &mut self.status.container_recreate_states {
            if !matches!(
                state.phase,
                ContainerRecreatePhase::Succeeded | ContainerRecreatePhase::Failed
            ) {
                state.phase = ContainerRecreatePhase::Failed;
                state.message = reason.to_owned();
            }
        }
        self.status.phase = CrrPhase::Completed;
        self.status.message = reason.to_owned();
        self.status.completion_time = Some(now_rfc3339());
        self.dirty = true;
        self.announce = true;
    }
}

#[derive(Debug, Default)]
struct State {
    requests: BTreeMap<ObjectKey, Tracked>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    nodes: NodeRegistry,
    node_timeout: Duration,
    state: Mutex<State>,
    wake: Notify,
    /// In a cluster: where requests created on the API server find their pod.
    cluster_pods: Option<Arc<dyn ClusterPods>>,
    /// Kruise's manager runs beside: its webhook labels requests (and refuses any change
    /// of their spec) and its controller clears `active`, so Rigger writes only status.
    beside_kruise_manager: bool,
    /// Where a request's completion is told.
    events: Arc<dyn crate::events::EventSink>,
    /// Requests that did not decode at the last pass, left as they are.
    undecodable: crate::engines::undecodable::Undecodable,
}

/// The engine; cheap to clone.
#[derive(Debug, Clone)]
pub struct RecreateEngine {
    inner: Arc<Inner>,
}

impl RecreateEngine {
    pub fn new(store: Store, nodes: NodeRegistry, node_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                nodes,
                node_timeout,
                state: Mutex::default(),
                wake: Notify::new(),
                cluster_pods: None,
                beside_kruise_manager: false,
                events: Arc::new(crate::events::NoEvents),
                undecodable: crate::engines::undecodable::Undecodable::default(),
            }),
        }
    }

    /// The engine, telling each request's completion to `events`.
    #[must_use]
    pub fn with_events(mut self, events: Arc<dyn crate::events::EventSink>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.events = events;
        }
        self
    }

    /// An engine for a cluster: requests created on the API server (without Rigger's
    /// apply) are admitted as Kruise's webhook admits them, from the cluster's Pods.
    pub fn in_cluster(
        store: Store,
        nodes: NodeRegistry,
        node_timeout: Duration,
        pods: impl ClusterPods,
    ) -> Self {
        let mut engine = Self::new(store, nodes, node_timeout);
        if let Some(inner) = Arc::get_mut(&mut engine.inner) {
            inner.cluster_pods = Some(Arc::new(pods));
        }
        engine
    }

    /// The engine beside Kruise's manager (`kruise_manager`): requests are still admitted
    /// from their Pod (the node and the pod a recreate acts on are Rigger's own finding),
    /// but only in memory — Kruise's webhook has labelled them and makes their spec
    /// immutable, and Kruise's controller clears `active` — and only status is written
    /// (a finished request is still deleted at its TTL, which Kruise's manager does too).
    #[must_use]
    pub fn beside_kruise_manager(mut self) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.beside_kruise_manager = true;
        }
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every change under the lock is a field write; a panic cannot leave it torn.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many requests are in each phase (for metrics).
    pub fn phase_counts(&self) -> [(&'static str, usize); 3] {
        let state = self.lock();
        let count = |phase: CrrPhase| {
            state
                .requests
                .values()
                .filter(|t| t.status.phase == phase)
                .count()
        };
        [
            ("pending", count(CrrPhase::Pending)),
            ("recreating", count(CrrPhase::Recreating)),
            ("completed", count(CrrPhase::Completed)),
        ]
    }

    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }
}

/// What a recreate pass reads from the store.
#[derive(Debug)]
pub struct RecreateSnapshot {
    /// Every request in the store.
    present: HashSet<ObjectKey>,
    /// Requests this engine did not know, with their stored status if any.
    new: Vec<(ObjectKey, ContainerRecreateRequest, Option<CrrStatus>)>,
    /// The uid of each agent-managed pod an unfinished request targets (`None`: gone).
    pods: HashMap<ObjectKey, Option<String>>,
    /// New requests that cannot run, and why (their pod is missing, say).
    refused: Vec<(ObjectKey, String)>,
}

/// Whether a stored status says nothing of a recreate yet: no `phase`, or an empty one
/// (Kruise's webhook creates requests with `phase: ""`): the request starts from the
/// beginning. A status with a phase this release cannot read is a newer release's, and
/// left alone.
fn carries_no_phase(status: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(status)
        .map(|v| match v.get("phase") {
            None | Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::String(phase)) => phase.is_empty(),
            Some(_) => false,
        })
        .unwrap_or(false)
}

impl crate::engines::Engine for RecreateEngine {
    const NAME: &'static str = "container recreate requests";
    const TICK: Duration = TICK;
    const WATCHES: &'static [&'static str] = &[ContainerRecreateRequest::INFO.name];
    type Snapshot = RecreateSnapshot;

    fn wake_signal(&self) -> &Notify {
        &self.inner.wake
    }

    async fn finish(&self) {
        self.flush().await;
    }

    async fn observe(&self) -> Result<RecreateSnapshot, StoreError> {
        let store = &self.inner.store;
        let listed = store.list_all_objects::<ContainerRecreateRequest>().await?;
        // A request this release cannot read (a newer one wrote it) is left as it is:
        // never taken for deleted, so its recreate is not cancelled.
        let specs = listed.decoded;
        let mut undecodable = listed.undecodable;
        let (known, mut pod_keys): (HashSet<ObjectKey>, Vec<ObjectKey>) = {
            let state = self.lock();
            let pods = state
                .requests
                .iter()
                .filter(|(_, t)| !t.finished())
                .filter_map(|(k, t)| pod_key(k, &t.request));
            (state.requests.keys().cloned().collect(), pods.collect())
        };
        let mut present = HashSet::with_capacity(specs.len());
        present.extend(undecodable.iter().map(|(key, _)| key.clone()));
        let mut new = Vec::new();
        let mut refused = Vec::new();
        for stored in specs {
            present.insert(stored.key.clone());
            if known.contains(&stored.key) {
                continue;
            }
            let mut request = stored.value;
            // A status this release cannot read is left as it is, and its request with
            // it: started afresh, the request would recreate the container again.
            let status = match store.get(status_key(&stored.key)).await? {
                None => None,
                Some(raw) if carries_no_phase(&raw.object) => None,
                Some(raw) => match rigger_store::typed::decode::<CrrStatus>(raw) {
                    Ok(status) => Some(status.value),
                    Err(StoreError::Undecodable { detail, .. }) => {
                        undecodable.push((stored.key, format!("its status: {detail}")));
                        continue;
                    }
                    Err(error) => return Err(error),
                },
            };
            let finished = status
                .as_ref()
                .is_some_and(|s| s.phase == CrrPhase::Completed);
            // In a cluster, every open request is admitted from its Pod, labelled or not:
            // labels a user wrote never choose the node or the pod a recreate acts on.
            if let Some(cluster) = &self.inner.cluster_pods
                && !finished
            {
                // One request that cannot be read or looked up is that request's
                // trouble, never every request's.
                if let Err(error) = request.validate() {
                    refused.push((stored.key.clone(), format!("invalid: {error}")));
                    pod_keys.extend(pod_key(&stored.key, &request));
                    new.push((stored.key, request, status));
                    continue;
                }
                let pod = match cluster
                    .pod(&stored.key.namespace, &request.spec.pod_name)
                    .await
                {
                    Ok(pod) => pod,
                    Err(detail) => {
                        tracing::warn!(request = %stored.key, %detail, "cannot look up the request's pod; trying again next pass");
                        present.remove(&stored.key);
                        continue;
                    }
                };
                let before = request.clone();
                // A request an earlier life of the controller started is the pod's it
                // was admitted for: one made since under the same name is not it.
                let admitted =
                    admission::admit(&mut request, pod.as_ref()).and_then(|()| match &status {
                        Some(_) => admission::same_pod(&before, &request),
                        None => Ok(()),
                    });
                if admitted.is_err() {
                    request = before.clone();
                }
                match admitted {
                    Ok(()) if request == before => {}
                    Ok(()) if self.inner.beside_kruise_manager => {
                        if let Err(reason) = admission::matches_kruise_labels(&before, &request) {
                            // Kept as stored: never relabelled for a pod it is not for.
                            request = before;
                            refused.push((stored.key.clone(), reason));
                            pod_keys.extend(pod_key(&stored.key, &request));
                            new.push((stored.key, request, status));
                            continue;
                        }
                        tracing::info!(request = %stored.key, pod = %request.spec.pod_name, node = %request.metadata.labels.get(NODE_NAME_LABEL).map_or("", String::as_str), "recreate request admitted (Kruise's webhook labelled it)");
                    }
                    Ok(()) => {
                        // Labelled where users and Kruise's tools look for them; a
                        // request changed meanwhile is read again next pass.
                        let bytes = rigger_store::typed::encode(&stored.key, &request)?;
                        match store
                            .put(
                                stored.key.clone(),
                                bytes,
                                Precondition::Revision(stored.revision),
                            )
                            .await
                        {
                            Ok(_) => {}
                            Err(StoreError::Conflict { .. }) => {
                                present.remove(&stored.key);
                                continue;
                            }
                            // Refused by the API server (a webhook, say): that request's
                            // trouble alone, tried again next pass.
                            Err(error) => {
                                tracing::warn!(request = %stored.key, %error, "cannot label the recreate request; trying again next pass");
                                present.remove(&stored.key);
                                continue;
                            }
                        }
                        tracing::info!(request = %stored.key, pod = %request.spec.pod_name, node = %request.metadata.labels.get(NODE_NAME_LABEL).map_or("", String::as_str), "recreate request admitted");
                    }
                    Err(reason) => refused.push((stored.key.clone(), reason)),
                }
            }
            pod_keys.extend(pod_key(&stored.key, &request));
            new.push((stored.key, request, status));
        }
        let mut pods = HashMap::new();
        for key in pod_keys {
            let uid = match store.get_as::<Pod>(key.clone()).await {
                Ok(pod) => pod.and_then(|p| p.value.metadata.uid),
                // A pod that does not decode is no pod to recreate in.
                Err(StoreError::Undecodable { .. }) => None,
                Err(error) => return Err(error),
            };
            pods.insert(key, uid);
        }
        self.inner.undecodable.observe(
            rigger_api::fields::KRUISE_API_VERSION,
            &undecodable,
            &*self.inner.events,
        );
        Ok(RecreateSnapshot {
            present,
            new,
            pods,
            refused,
        })
    }

    async fn pass(&self, snapshot: RecreateSnapshot) {
        self.sync(snapshot.present, snapshot.new).await;
        for (key, reason) in snapshot.refused {
            if let Some(tracked) = self.lock().requests.get_mut(&key)
                && !tracked.finished()
            {
                tracing::info!(request = %key, %reason, "recreate request failed");
                tracked.complete(&reason);
            }
        }
        let (messages, expired) = self.reconcile(&snapshot.pods);
        for (node, message) in messages {
            self.inner.nodes.send(&node, message);
        }
        for key in expired {
            tracing::info!(request = %key, "recreate request deleted (ttlSecondsAfterFinished)");
            let _ = self
                .inner
                .store
                .delete(key.clone(), Precondition::Any)
                .await;
            let _ = self
                .inner
                .store
                .delete(status_key(&key), Precondition::Any)
                .await;
            self.lock().requests.remove(&key);
        }
        self.flush().await;
    }
}

/// The store key of the agent-managed pod `request` targets (kubelet's pods are not in
/// the store).
fn pod_key(key: &ObjectKey, request: &ContainerRecreateRequest) -> Option<ObjectKey> {
    let rigger = request
        .metadata
        .labels
        .get(POD_OWNER_LABEL)
        .map(String::as_str)
        == Some("rigger");
    rigger.then(|| ObjectKey::new(pod::KIND, &key.namespace, &request.spec.pod_name))
}

impl RecreateEngine {
    /// Take in created and deleted requests (specs never change once created).
    async fn sync(
        &self,
        present: HashSet<ObjectKey>,
        new: Vec<(ObjectKey, ContainerRecreateRequest, Option<CrrStatus>)>,
    ) {
        for (key, request, status) in new {
            let fresh = status.is_none();
            let status = status.unwrap_or_else(|| CrrStatus {
                phase: CrrPhase::Pending,
                container_recreate_states: request
                    .spec
                    .containers
                    .iter()
                    .map(|c| ContainerRecreateState {
                        name: c.name.clone(),
                        ..ContainerRecreateState::default()
                    })
                    .collect(),
                ..CrrStatus::default()
            });
            self.lock().requests.insert(
                key,
                Tracked {
                    request,
                    status,
                    sent: false,
                    dirty: fresh,
                    announce: false,
                },
            );
        }
        // Deleted by a user: stop the work, forget the status.
        let gone: Vec<(ObjectKey, Tracked)> = {
            let mut state = self.lock();
            let keys: Vec<ObjectKey> = state
                .requests
                .keys()
                .filter(|k| !present.contains(*k))
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| state.requests.remove(&k).map(|t| (k, t)))
                .collect()
        };
        for (key, tracked) in gone {
            if !tracked.finished() {
                self.inner.nodes.send(
                    tracked.label(NODE_NAME_LABEL),
                    cancel(&tracked.task_id(), "the request was deleted"),
                );
            }
            let _ = self
                .inner
                .store
                .delete(status_key(&key), Precondition::Any)
                .await;
        }
    }

    /// Decide what each request needs now: messages to nodes, requests to delete.
    fn reconcile(
        &self,
        pods: &HashMap<ObjectKey, Option<String>>,
    ) -> (Vec<(String, ControllerMessage)>, Vec<ObjectKey>) {
        // Without requests a pass decides nothing: every node's readiness is not read
        // for it (a registering fleet wakes this engine per node).
        if self.lock().requests.is_empty() {
            return (Vec::new(), Vec::new());
        }
        // The clock is read once per pass: readiness and the decisions see the same time.
        let now = SystemTime::now();
        // Each node's readiness: `None` ready, else why not.
        let readiness = self.inner.nodes.readiness(now, self.inner.node_timeout);
        let mut state = self.lock();
        let decided = decide(&mut state.requests, pods, &readiness, now);
        for (key, node, task) in decided.dispatch {
            if self.inner.nodes.send(&node, task)
                && let Some(tracked) = state.requests.get_mut(&key)
            {
                tracing::info!(request = %key, %node, "recreate request sent to the node");
                tracked.sent = true;
                if !tracked.status.message.is_empty() {
                    tracked.status.message.clear();
                    tracked.dirty = true;
                }
            }
        }
        (decided.messages, decided.expired)
    }

    async fn flush(&self) {
        let dirty: Vec<(ObjectKey, CrrStatus)> = {
            let mut state = self.lock();
            for (key, tracked) in state.requests.iter_mut().filter(|(_, t)| t.announce) {
                tracked.announce = false;
                self.inner
                    .events
                    .record(events::completed(key, &tracked.request, &tracked.status));
            }
            state
                .requests
                .iter_mut()
                .filter(|(_, t)| t.dirty)
                .map(|(k, t)| {
                    t.dirty = false;
                    (k.clone(), t.status.clone())
                })
                .collect()
        };
        for (key, status) in dirty {
            let Ok(bytes) = serde_json::to_vec(&status) else {
                continue;
            };
            if let Err(error) = self
                .inner
                .store
                .put(status_key(&key), bytes, Precondition::Any)
                .await
            {
                tracing::warn!(request = %key, %error, "cannot write the request's status");
                if let Some(t) = self.lock().requests.get_mut(&key) {
                    t.dirty = true;
                }
            }
        }
        self.clear_active().await;
    }

    /// An agent (re)registered: send its open requests again (it recognizes the ids)
    /// and take the statuses it holds.
    pub fn node_connected(&self, node: &str, statuses: &[TaskStatus]) {
        {
            let mut state = self.lock();
            for tracked in state.requests.values_mut() {
                if tracked.label(NODE_NAME_LABEL) == node {
                    tracked.sent = false;
                }
            }
        }
        for status in statuses {
            self.report(node, status);
        }
        self.wake();
    }

    /// A recreate task's status from `node`'s agent.
    pub fn report(&self, node: &str, report: &TaskStatus) {
        let mut state = self.lock();
        let Some(tracked) = state
            .requests
            .values_mut()
            .find(|t| t.task_id() == report.id)
        else {
            return; // A deleted request.
        };
        if tracked.label(NODE_NAME_LABEL) != node {
            tracing::warn!(%node, task = %report.id, "report for a request of another node refused");
            return;
        }
        if tracked.finished() {
            return;
        }
        let phase = TaskPhase::try_from(report.phase).unwrap_or(TaskPhase::Unspecified);
        for reported in &report.recreate_states {
            if let Some(state) = tracked
                .status
                .container_recreate_states
                .iter_mut()
                .find(|s| s.name == reported.name)
            {
                state.phase = match reported.phase() {
                    WirePhase::Pending => ContainerRecreatePhase::Pending,
                    WirePhase::Recreating => ContainerRecreatePhase::Recreating,
                    WirePhase::Succeeded => ContainerRecreatePhase::Succeeded,
                    WirePhase::Failed => ContainerRecreatePhase::Failed,
                };
                state.message.clone_from(&reported.message);
                state.is_killed = reported.is_killed;
            }
        }
        match phase {
            TaskPhase::Accepted | TaskPhase::Running => {
                tracked.sent = true;
                tracked.status.phase = CrrPhase::Recreating;
                tracked.status.message.clear();
                tracked.dirty = true;
                // The agent's first step holds the pod not ready (Kruise's condition).
                let grace = tracked.request.spec.strategy.unready_grace_period_seconds;
                let conditions = &mut tracked.status.conditions;
                if grace.is_some_and(|g| g > 0)
                    && !conditions.iter().any(|c| c.kind == crr::PRE_RECREATE_GRACE)
                {
                    conditions.push(Condition {
                        kind: crr::PRE_RECREATE_GRACE.to_owned(),
                        status: "True".to_owned(),
                        reason: crr::PRE_RECREATE_GRACE.to_owned(),
                        message: "the pod is held not ready for unreadyGracePeriodSeconds before its containers stop".to_owned(),
                        last_transition_time: Some(now_rfc3339()),
                    });
                }
            }
            TaskPhase::Succeeded | TaskPhase::Failed => {
                tracked.complete(&report.message);
                drop(state);
                self.wake();
            }
            TaskPhase::Unspecified => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_status_without_a_phase_is_none_and_one_with_an_unknown_phase_is_held() {
        assert!(carries_no_phase(b"{}"));
        assert!(carries_no_phase(b"null"));
        assert!(carries_no_phase(br#"{"phase": ""}"#));
        assert!(!carries_no_phase(br#"{"phase": "Paused"}"#));
        assert!(!carries_no_phase(br#"{"phase": "Recreating"}"#));
        assert!(!carries_no_phase(b"not json"));
    }

    #[tokio::test]
    async fn reports_count_only_from_the_requests_node() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(rigger_store::EmbeddedStore::open(dir.path()).unwrap());
        let engine = RecreateEngine::new(store, NodeRegistry::default(), Duration::from_secs(30));
        let request: ContainerRecreateRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1",
            "kind": "ContainerRecreateRequest",
            "metadata": {
                "name": "r", "namespace": "default", "uid": "u1",
                "labels": {NODE_NAME_LABEL: "n1", POD_UID_LABEL: "p1"}
            },
            "spec": {"podName": "web", "containers": [{"name": "app"}]}
        }))
        .unwrap();
        let key = ObjectKey::new("ContainerRecreateRequest", "default", "r");
        engine.lock().requests.insert(
            key.clone(),
            Tracked {
                announce: false,
                request,
                status: CrrStatus {
                    container_recreate_states: vec![ContainerRecreateState {
                        name: "app".to_owned(),
                        ..ContainerRecreateState::default()
                    }],
                    ..CrrStatus::default()
                },
                sent: true,
                dirty: false,
            },
        );
        let done = TaskStatus {
            id: "crr/u1".to_owned(),
            phase: TaskPhase::Succeeded.into(),
            recreate_states: vec![rigger_proto::v1::ContainerRecreateState {
                name: "app".to_owned(),
                phase: WirePhase::Succeeded.into(),
                ..Default::default()
            }],
            ..TaskStatus::default()
        };
        let app = |engine: &RecreateEngine| {
            engine.lock().requests[&key]
                .status
                .container_recreate_states[0]
                .phase
        };

        // Another node's word changes nothing.
        engine.report("n2", &done);
        assert_eq!(app(&engine), ContainerRecreatePhase::Pending);
        assert_ne!(
            engine.lock().requests[&key].status.phase,
            CrrPhase::Completed
        );

        engine.report("n1", &done);
        assert_eq!(app(&engine), ContainerRecreatePhase::Succeeded);
        assert_eq!(
            engine.lock().requests[&key].status.phase,
            CrrPhase::Completed
        );
    }
}
