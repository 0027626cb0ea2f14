//! Agent-managed pods: the node side of `kind: Pod` on hosts without kubelet.
//!
//! The controller sends the full set of pods placed on this node; the set is persisted
//! under `<state_dir>/pods/desired.json`, and a reconcile loop makes CRI match it: one
//! host-network sandbox per pod, init containers in order, then the containers,
//! restarted by the pod's `restartPolicy` with kubelet's back-off (10 s doubling to
//! 5 min). Everything created carries Rigger's labels (`labels.rs`), so after an agent
//! restart the same sandboxes and containers are adopted, never duplicated, and kubelet's
//! are never touched. Pods no longer in the set are stopped (grace period) and removed.
//! Each pod's status, in Kubernetes' PodStatus shape, goes back over the link when it
//! changes.
//!
//! Probes and lifecycle hooks run as kubelet runs them (`handlers.rs`), from the same
//! loop. Not yet: logs and exec through riggerctl.

use rigger_proto::time::{rfc3339, rfc3339_from_nanos};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, ListContainersRequest,
    ListPodSandboxRequest, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxFilter, PodSandboxMetadata, PodSandboxState, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest,
};
use rigger_proto::pod::{Container, Pod, RestartPolicy};
use rigger_proto::v1::{AssignedPod, PodStatus};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

mod host;
mod ownership;
mod state;
mod update;

pub use crate::lifecycle::LifecycleState;

use crate::handlers::{self, Action};
use crate::labels;
use rigger_pull::{NoProgress, PullOptions, Puller};
use rigger_runtime::{CRI_NAMESPACE, DEFAULT_CONNECT_TIMEOUT, Runtime};

/// Env a SidecarSet hot upgrade changes without restarting the container.
const HOT_UPGRADE_ENV: [&str; 2] = ["SIDECARSET_VERSION", "SIDECARSET_VERSION_ALT"];
/// Kruise's pod annotation naming each hot-upgrade sidecar's working slot.
const HOT_UPGRADE_WORKING: &str = "kruise.io/sidecarset-working-hotupgrade-container";

/// How often pods are checked when nothing else wakes the loop.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);
/// kubelet's crash back-off: 10 s, doubling, at most 5 min.
const BACKOFF_BASE: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("pod directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug)]
struct Inner {
    node: String,
    dir: PathBuf,
    containerd_address: PathBuf,
    pull_options: PullOptions,
    desired: Mutex<Vec<Pod>>,
    wake: Notify,
    /// Per pod uid: the last status (JSON) and the version it changed at.
    statuses: Mutex<HashMap<String, (PodStatus, u64)>>,
    version: watch::Sender<u64>,
    /// Probe results per running container id.
    probes: Mutex<HashMap<String, ProbeState>>,
    /// The last spec of each pod, for preStop hooks once a pod was removed.
    known: Mutex<HashMap<String, Pod>>,
    /// Pods a container recreate marked not ready (uid → the request's reason).
    unready: Mutex<HashMap<String, String>>,
    /// Containers a recreate stopped: their next attempt starts at once, whatever the
    /// restart policy and back-off say.
    recreate_now: Mutex<std::collections::HashSet<String>>,
    /// Each pod's lifecycle cooperators, as the controller sent them.
    cooperators: Mutex<HashMap<String, Vec<rigger_proto::lifecycle::Cooperator>>>,
    /// Pods not in state Normal (uid → state and why).
    lifecycle: Mutex<HashMap<String, (LifecycleState, String)>>,
    /// In-place updates running, and when a failed one may be tried again.
    updating: Mutex<std::collections::HashSet<String>>,
    update_retry: Mutex<HashMap<String, std::time::Instant>>,
    /// Pods being removed (their removal runs in its own task).
    removing: Mutex<std::collections::HashSet<String>>,
    /// Pod uids this agent created a sandbox for (persisted before each creation): a
    /// sandbox is only ever the agent's if its uid is here (`ownership.rs`).
    created: Mutex<std::collections::BTreeSet<String>>,
    /// Sandboxes with Rigger's labels that are not ours, already warned about.
    warned: Mutex<std::collections::HashSet<String>>,
    /// The node's pod set on disk was unreadable: nothing is removed until the
    /// controller has sent the set again.
    hold_removals: std::sync::atomic::AtomicBool,
    metrics: Arc<crate::metrics::AgentMetrics>,
}

/// What the probes of one running container found so far.
#[derive(Debug, Default)]
struct ProbeState {
    /// The startup probe passed (or there is none).
    started: bool,
    ready: bool,
    successes: u32,
    failures: u32,
    liveness_failures: u32,
    startup_failures: u32,
    /// When each probe (readiness, liveness, startup) last ran.
    last_run: HashMap<&'static str, std::time::Instant>,
}

/// Runs the pods placed on this node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PodRunner {
    inner: Arc<Inner>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is one assignment: a poisoned lock is consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PodRunner {
    /// Load the pods this node had, and keep them running until `token` is cancelled.
    pub fn start(
        node: &str,
        state_dir: &Path,
        containerd_address: &Path,
        pull_options: &PullOptions,
        metrics: Arc<crate::metrics::AgentMetrics>,
        token: CancellationToken,
    ) -> Result<Self, PodError> {
        let dir = state_dir.join("pods");
        std::fs::create_dir_all(&dir).map_err(|source| PodError::Directory {
            path: dir.clone(),
            source,
        })?;
        let (desired, hold_removals) = state::load_desired(&dir);
        let created = state::load_created(&dir, &desired);
        let runner = Self {
            inner: Arc::new(Inner {
                node: node.to_owned(),
                dir,
                containerd_address: containerd_address.to_owned(),
                // Pods run through CRI, whose images live in kubelet's namespace.
                pull_options: PullOptions {
                    namespace: CRI_NAMESPACE.to_owned(),
                    ..pull_options.clone()
                },
                desired: Mutex::new(desired),
                wake: Notify::new(),
                statuses: Mutex::default(),
                version: watch::channel(0).0,
                probes: Mutex::default(),
                known: Mutex::default(),
                unready: Mutex::default(),
                recreate_now: Mutex::default(),
                cooperators: Mutex::default(),
                lifecycle: Mutex::default(),
                updating: Mutex::default(),
                update_retry: Mutex::default(),
                removing: Mutex::default(),
                created: Mutex::new(created),
                warned: Mutex::default(),
                hold_removals: std::sync::atomic::AtomicBool::new(hold_removals),
                metrics,
            }),
        };
        // A bug in one reconcile must not leave the node's pods unattended: the loop is
        // restarted (and the panic logged) instead of dying silently.
        let supervised = runner.clone();
        tokio::spawn(async move {
            loop {
                match tokio::spawn(supervised.clone().run(token.clone())).await {
                    Ok(()) => return,
                    Err(error) => {
                        tracing::error!(%error, "the pod loop failed; restarting it");
                        tokio::time::sleep(RECONCILE_INTERVAL).await;
                    }
                }
            }
        });
        Ok(runner)
    }

    /// The controller's full set of pods for this node.
    pub fn set_desired(&self, pods: Vec<AssignedPod>) {
        let mut cooperators = HashMap::new();
        let pods: Vec<Pod> = pods
            .into_iter()
            .filter_map(|assigned| match serde_json::from_str::<Pod>(&assigned.json) {
                Ok(pod) => {
                    if !assigned.cooperators.is_empty() {
                        match serde_json::from_str(&assigned.cooperators) {
                            Ok(list) => {
                                cooperators.insert(assigned.uid.clone(), list);
                            }
                            Err(error) => {
                                tracing::warn!(uid = %assigned.uid, %error, "unreadable lifecycle cooperators skipped");
                            }
                        }
                    }
                    Some(pod)
                }
                Err(error) => {
                    tracing::warn!(uid = %assigned.uid, %error, "unreadable pod from the controller skipped");
                    None
                }
            })
            .collect();
        {
            // Pods leaving keep theirs until removed: a deletion asks them too.
            let mut known = lock(&self.inner.cooperators);
            known.retain(|uid, _| !pods.iter().any(|p| p.metadata.uid.as_deref() == Some(uid)));
            known.extend(cooperators);
        }
        // New specs or cooperators: a failed update may succeed now, try at once.
        lock(&self.inner.update_retry).clear();
        let path = self.inner.dir.join("desired.json");
        if let Err(error) = rigger_daemon::durable::write_json_atomically(&path, &pods) {
            tracing::warn!(path = %path.display(), %error, "cannot persist the node's pods");
        }
        tracing::info!(pods = pods.len(), "pods for this node updated");
        *lock(&self.inner.desired) = pods;
        if self
            .inner
            .hold_removals
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            tracing::info!(
                "the controller's pod set arrived; pods no longer placed here may be removed again"
            );
        }
        self.inner.wake.notify_one();
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// The node this runner runs pods for.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The spec of pod `uid`, when it is placed on this node.
    pub fn pod(&self, uid: &str) -> Option<Pod> {
        lock(&self.inner.desired)
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .cloned()
    }

    /// Report pod `uid` not ready (its containers keep running) until [`Self::mark_ready`].
    pub fn mark_unready(&self, uid: &str, reason: &str) {
        lock(&self.inner.unready).insert(uid.to_owned(), reason.to_owned());
        self.inner.wake.notify_one();
    }

    pub fn mark_ready(&self, uid: &str) {
        if lock(&self.inner.unready).remove(uid).is_some() {
            self.inner.wake.notify_one();
        }
    }

    /// Start the next attempt of the container that `container_id` was as soon as it has
    /// exited (a recreate stopped it, or is about to).
    pub fn recreate_now(&self, container_id: &str) {
        lock(&self.inner.recreate_now).insert(container_id.to_owned());
        self.inner.wake.notify_one();
    }

    /// Whether container `name` of pod `uid`, as the container `container_id`, is ready
    /// in the last status (`None`: no status for that container yet).
    pub fn container_ready(&self, uid: &str, name: &str, container_id: &str) -> Option<bool> {
        self.container_flag(uid, name, container_id, "ready")
    }

    /// Whether it has started (its startup probe and postStart passed).
    pub fn container_started(&self, uid: &str, name: &str, container_id: &str) -> Option<bool> {
        self.container_flag(uid, name, container_id, "started")
    }

    fn container_flag(
        &self,
        uid: &str,
        name: &str,
        container_id: &str,
        flag: &str,
    ) -> Option<bool> {
        let statuses = lock(&self.inner.statuses);
        let (status, _) = statuses.get(uid)?;
        let status: serde_json::Value = serde_json::from_str(&status.json).ok()?;
        let container = status["containerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)?;
        (container["containerID"] == format!("containerd://{container_id}"))
            .then(|| container[flag] == true)
    }

    /// Statuses that changed after `version` (all of them for 0).
    pub fn statuses_since(&self, version: u64) -> Vec<PodStatus> {
        lock(&self.inner.statuses)
            .values()
            .filter(|(_, changed)| *changed > version)
            .map(|(status, _)| status.clone())
            .collect()
    }

    fn publish(&self, status: PodStatus) {
        let mut statuses = lock(&self.inner.statuses);
        let same = statuses
            .get(&status.uid)
            .is_some_and(|(old, _)| old.json == status.json);
        if !same {
            let mut next = 0;
            self.inner.version.send_modify(|v| {
                *v += 1;
                next = *v;
            });
            statuses.insert(status.uid.clone(), (status, next));
        }
    }

    async fn run(self, token: CancellationToken) {
        let mut session: Option<(RuntimeServiceClient<Channel>, Puller)> = None;
        loop {
            if session.is_none() {
                match Runtime::connect(&self.inner.containerd_address, DEFAULT_CONNECT_TIMEOUT)
                    .await
                {
                    Ok(runtime) => {
                        let cri = RuntimeServiceClient::new(runtime.channel());
                        session =
                            Some((cri, Puller::new(runtime, self.inner.pull_options.clone())));
                    }
                    Err(error) => tracing::debug!(%error, "pods wait for containerd"),
                }
            }
            if let Some((cri, puller)) = session.as_mut()
                && let Err(error) = self.reconcile(cri, puller).await
            {
                tracing::warn!(%error, "pods: CRI call failed; retrying");
                session = None;
            }
            tokio::select! {
                _ = token.cancelled() => return,
                _ = self.inner.wake.notified() => {}
                _ = tokio::time::sleep(RECONCILE_INTERVAL) => {}
            }
        }
    }

    async fn reconcile(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        puller: &Puller,
    ) -> Result<(), tonic::Status> {
        let desired = lock(&self.inner.desired).clone();
        {
            let mut known = lock(&self.inner.known);
            for pod in &desired {
                if let Some(uid) = &pod.metadata.uid {
                    known.insert(uid.clone(), pod.clone());
                }
            }
        }
        let sandboxes = cri
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(PodSandboxFilter {
                    label_selector: [
                        (labels::MANAGED.to_owned(), "true".to_owned()),
                        (labels::NODE.to_owned(), self.inner.node.clone()),
                    ]
                    .into(),
                    ..PodSandboxFilter::default()
                }),
            })
            .await?
            .into_inner()
            .items;
        let sandboxes = self.only_ours(sandboxes);
        for pod in &desired {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            if !ownership::is_valid_uid(&uid) {
                // It would name the pod's directory: refused, whoever sent it.
                tracing::warn!(pod = %pod.metadata.name, %uid, "a pod whose uid is not a uid is not run");
                continue;
            }
            let sandbox = sandboxes
                .iter()
                .find(|(owner, s)| *owner == uid && s.state == PodSandboxState::SandboxReady as i32)
                .map(|(_, s)| s.id.clone());
            let status = self.ensure(cri, puller, pod, &uid, sandbox).await?;
            self.publish(PodStatus {
                uid,
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone(),
                json: status.to_string(),
            });
        }
        // Sandboxes of pods no longer placed here: stop and remove them, each in its own
        // task (cooperators may hold a deletion; other pods must not wait for it). Not
        // while the node's pod set is unknown: an unreadable file is no order to remove.
        let hold = self
            .inner
            .hold_removals
            .load(std::sync::atomic::Ordering::SeqCst);
        for (uid, sandbox) in sandboxes.iter().filter(|_| !hold) {
            let uid = uid.clone();
            if desired
                .iter()
                .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
            {
                continue;
            }
            if !lock(&self.inner.removing).insert(uid.clone()) {
                continue;
            }
            let (runner, mut cri, sandbox) = (self.clone(), cri.clone(), sandbox.clone());
            tokio::spawn(async move {
                if let Err(error) = runner.remove(&mut cri, &sandbox, &uid).await {
                    tracing::warn!(%uid, %error, "removing the pod failed; trying again");
                }
                lock(&runner.inner.removing).remove(&uid);
                runner.inner.wake.notify_one();
            });
        }
        Ok(())
    }

    /// The sandboxes that are this agent's own, each with its pod uid; the others are
    /// left alone, and one carrying Rigger's labels is warned about once.
    fn only_ours(
        &self,
        sandboxes: Vec<k8s_cri::v1::PodSandbox>,
    ) -> Vec<(String, k8s_cri::v1::PodSandbox)> {
        let mut ours = Vec::new();
        for sandbox in sandboxes {
            match self.ownership(&sandbox) {
                ownership::Ownership::Ours(uid) => ours.push((uid, sandbox)),
                ownership::Ownership::NotOurs(why) => {
                    if lock(&self.inner.warned).insert(sandbox.id.clone()) {
                        tracing::warn!(sandbox = %sandbox.id, reason = why, "a sandbox with Rigger's labels is not this agent's: left alone");
                    }
                }
            }
        }
        ours
    }

    /// Whether `sandbox` is this agent's own (see `ownership.rs`).
    fn ownership(&self, sandbox: &k8s_cri::v1::PodSandbox) -> ownership::Ownership {
        let metadata_uid = sandbox.metadata.as_ref().map_or("", |m| m.uid.as_str());
        let created = lock(&self.inner.created);
        ownership::ownership(&sandbox.labels, metadata_uid, &self.inner.node, &created)
    }

    /// The pod uid of `sandbox` when it is this agent's own, for other parts of the
    /// agent (recreate) that must never act on a sandbox by its labels alone.
    pub fn owner_of(&self, sandbox: &k8s_cri::v1::PodSandbox) -> Option<String> {
        match self.ownership(sandbox) {
            ownership::Ownership::Ours(uid) => Some(uid),
            ownership::Ownership::NotOurs(_) => None,
        }
    }

    /// Record (durably) that this agent creates a sandbox for `uid`.
    fn record_created(&self, uid: &str) -> Result<(), tonic::Status> {
        let mut created = lock(&self.inner.created);
        if created.contains(uid) {
            return Ok(());
        }
        let mut next = created.clone();
        next.insert(uid.to_owned());
        let path = self.inner.dir.join(state::CREATED_FILE);
        rigger_daemon::durable::write_json_atomically(&path, &next).map_err(|e| {
            tonic::Status::internal(format!(
                "cannot record the pod's sandbox in {}: {e}",
                path.display()
            ))
        })?;
        *created = next;
        Ok(())
    }

    /// The pod's sandbox is gone: its uid is no longer ours.
    fn forget_created(&self, uid: &str) {
        let mut created = lock(&self.inner.created);
        if created.remove(uid) {
            let path = self.inner.dir.join(state::CREATED_FILE);
            if let Err(error) = rigger_daemon::durable::write_json_atomically(&path, &*created) {
                tracing::warn!(path = %path.display(), %error, "cannot persist the pods' sandboxes");
            }
        }
    }

    /// Stop and remove a pod no longer placed here: cooperators (Delete), preStop, stop
    /// with the grace period, sandbox removed.
    async fn remove(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        sandbox: &k8s_cri::v1::PodSandbox,
        uid: &str,
    ) -> Result<(), tonic::Status> {
        let uid = uid.to_owned();
        let spec = lock(&self.inner.known).get(&uid).cloned();
        let last_labels = spec
            .as_ref()
            .map(|p| p.metadata.labels.clone())
            .unwrap_or_default();
        let cooperators = lock(&self.inner.cooperators)
            .get(&uid)
            .cloned()
            .unwrap_or_default();
        let what = crate::lifecycle::PodRef {
            namespace: sandbox
                .labels
                .get(labels::POD_NAMESPACE)
                .cloned()
                .unwrap_or_default(),
            name: sandbox
                .labels
                .get(labels::POD_NAME)
                .cloned()
                .unwrap_or_default(),
            uid: uid.clone(),
            node: self.inner.node.clone(),
        };
        use rigger_proto::lifecycle::{Operation, Stage};
        if let Err(reason) = crate::lifecycle::call_all(
            &cooperators,
            Operation::Delete,
            Stage::Preparing,
            &what,
            &|| last_labels.clone(),
        )
        .await
        {
            // The controller already forgot the pod: the deletion goes on, said loudly.
            tracing::warn!(%uid, %reason, "deleting the pod without its cooperator's acknowledgement");
        }
        let grace = sandbox
            .labels
            .get(labels::GRACE_SECONDS)
            .and_then(|g| g.parse::<i64>().ok())
            .unwrap_or(30);
        tracing::info!(%uid, sandbox = %sandbox.id, grace, "removing a pod no longer placed on this node");
        for container in list_containers(cri, &sandbox.id).await? {
            let started = std::time::Instant::now();
            let name = container
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .unwrap_or_default();
            let pre_stop = spec.as_ref().and_then(|pod| {
                let c = pod.spec.containers.iter().find(|c| c.name == name)?;
                Some((c.clone(), c.lifecycle.as_ref()?.pre_stop.clone()?))
            });
            if let Some((spec_container, handler)) = pre_stop
                && container.state == ContainerState::ContainerRunning as i32
                && let Some(action) = Action::of_handler(&handler)
            {
                // preStop is bounded by the grace period.
                let bound = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                match handlers::run(cri, &spec_container, &container.id, action, bound).await {
                    Ok(()) => tracing::info!(%uid, container = %name, "preStop hook ran"),
                    Err(reason) => {
                        tracing::warn!(%uid, container = %name, %reason, "preStop hook failed")
                    }
                }
            }
            // What is left of the grace period, at least 2 s.
            let left = (grace - i64::try_from(started.elapsed().as_secs()).unwrap_or(0)).max(2);
            cri.stop_container(StopContainerRequest {
                container_id: container.id.clone(),
                timeout: left,
            })
            .await?;
            lock(&self.inner.probes).remove(&container.id);
            cri.remove_container(RemoveContainerRequest {
                container_id: container.id,
            })
            .await?;
        }
        cri.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: sandbox.id.clone(),
        })
        .await?;
        cri.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: sandbox.id.clone(),
        })
        .await?;
        let _ = std::fs::remove_dir_all(self.inner.dir.join(&uid));
        self.forget_created(&uid);
        lock(&self.inner.statuses).remove(&uid);
        lock(&self.inner.known).remove(&uid);
        if let Err(reason) = crate::lifecycle::call_all(
            &cooperators,
            Operation::Delete,
            Stage::Completing,
            &what,
            &|| last_labels.clone(),
        )
        .await
        {
            tracing::warn!(%uid, %reason, "a cooperator did not acknowledge the deletion's completion");
        }
        lock(&self.inner.cooperators).remove(&uid);
        Ok(())
    }

    /// Make one pod run; its status in Kubernetes' shape.
    async fn ensure(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        puller: &Puller,
        pod: &Pod,
        uid: &str,
        sandbox: Option<String>,
    ) -> Result<serde_json::Value, tonic::Status> {
        let config = self.sandbox_config(pod, uid);
        let sandbox = match sandbox {
            Some(id) => id,
            None => {
                tracing::info!(pod = %pod.metadata.name, %uid, "creating the pod's sandbox");
                // Recorded (durably) first: a sandbox is ours only if its uid is.
                self.record_created(uid)?;
                cri.run_pod_sandbox(RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await?
                .into_inner()
                .pod_sandbox_id
            }
        };
        let existing = list_containers(cri, &sandbox).await?;
        self.start_update_if_changed(pod, uid, &existing);
        let mut init_statuses = Vec::new();
        let mut initialized = true;
        for container in &pod.spec.init_containers {
            let (status, done) = Box::pin(self.ensure_container(
                cri, puller, pod, uid, &sandbox, &config, container, &existing, true,
            ))
            .await?;
            init_statuses.push(status);
            if !done {
                initialized = false;
                break;
            }
        }
        let mut statuses = Vec::new();
        if initialized {
            for container in &pod.spec.containers {
                let (status, _) = Box::pin(self.ensure_container(
                    cri, puller, pod, uid, &sandbox, &config, container, &existing, false,
                ))
                .await?;
                statuses.push(status);
            }
        }
        let containers_ready = initialized
            && statuses.len() == pod.spec.containers.len()
            && statuses.iter().all(|s| s["ready"] == true);
        let unready = lock(&self.inner.unready).get(uid).cloned();
        let ready = containers_ready && unready.is_none();
        let terminated: Vec<&serde_json::Value> = statuses
            .iter()
            .filter_map(|s| s["state"].get("terminated"))
            .collect();
        let phase = if !initialized || statuses.is_empty() {
            "Pending"
        } else if terminated.len() == statuses.len()
            && pod.spec.restart_policy != RestartPolicy::Always
        {
            if terminated.iter().all(|t| t["exitCode"] == 0) {
                "Succeeded"
            } else {
                "Failed"
            }
        } else {
            "Running"
        };
        let condition = |kind: &str, ok: bool| serde_json::json!({"type": kind, "status": if ok { "True" } else { "False" }});
        let mut ready_condition = condition("Ready", ready);
        if let Some(reason) = unready {
            ready_condition["reason"] = "ContainerRecreating".into();
            ready_condition["message"] = reason.into();
        }
        let (state, message) = lock(&self.inner.lifecycle)
            .get(uid)
            .cloned()
            .unwrap_or((LifecycleState::Normal, String::new()));
        Ok(serde_json::json!({
            "phase": phase,
            "lifecycle": {"state": state, "message": message},
            "conditions": [
                condition("PodScheduled", true),
                condition("Initialized", initialized),
                condition("ContainersReady", containers_ready),
                ready_condition,
            ],
            "hostIP": host_ip(),
            "initContainerStatuses": init_statuses,
            "containerStatuses": statuses,
        }))
    }

    fn sandbox_config(&self, pod: &Pod, uid: &str) -> PodSandboxConfig {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        // The pod's labels, but never kubelet's or Rigger's own: those say who owns it.
        let mut sandbox_labels: HashMap<String, String> = pod
            .metadata
            .labels
            .iter()
            .filter(|(k, _)| !ownership::is_reserved_label(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        sandbox_labels.extend([
            (labels::MANAGED.to_owned(), "true".to_owned()),
            (labels::NODE.to_owned(), self.inner.node.clone()),
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::POD_NAME.to_owned(), pod.metadata.name.clone()),
            (labels::POD_NAMESPACE.to_owned(), namespace.clone()),
            (
                labels::GRACE_SECONDS.to_owned(),
                pod.spec.termination_grace_period_seconds.to_string(),
            ),
        ]);
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.metadata.name.clone(),
                uid: uid.to_owned(),
                namespace,
                attempt: 0,
            }),
            // Host network, and no hostname: runc cannot set one without a UTS namespace.
            hostname: String::new(),
            log_directory: self.inner.dir.join(uid).join("logs").display().to_string(),
            labels: sandbox_labels,
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: NamespaceMode::Node as i32,
                        ..NamespaceOption::default()
                    }),
                    ..LinuxSandboxSecurityContext::default()
                }),
                ..LinuxPodSandboxConfig::default()
            }),
            ..PodSandboxConfig::default()
        }
    }

    /// Make one container run (or, for init containers, run to completion); its status,
    /// and whether it is done (init containers: exited 0).
    #[allow(clippy::too_many_arguments)]
    async fn ensure_container(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        puller: &Puller,
        pod: &Pod,
        uid: &str,
        sandbox: &str,
        sandbox_config: &PodSandboxConfig,
        container: &Container,
        existing: &[k8s_cri::v1::Container],
        init: bool,
    ) -> Result<(serde_json::Value, bool), tonic::Status> {
        let latest = existing
            .iter()
            .filter(|c| c.labels.get(labels::CONTAINER_NAME) == Some(&container.name))
            .max_by_key(|c| c.metadata.as_ref().map_or(0, |m| m.attempt));
        let current = match latest {
            Some(c) => Some(
                cri.container_status(ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: false,
                })
                .await?
                .into_inner()
                .status
                .unwrap_or_default(),
            ),
            None => None,
        };
        let attempt = current
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map_or(0, |m| m.attempt);
        let start_next = match &current {
            None => Some(0),
            Some(status)
                if status.state == ContainerState::ContainerExited as i32
                    && lock(&self.inner.recreate_now).remove(&status.id) =>
            {
                Some(attempt + 1)
            }
            Some(status) if status.state == ContainerState::ContainerExited as i32 => {
                let restart = restarts(pod.spec.restart_policy, init, status.exit_code);
                let delay = BACKOFF_BASE
                    .saturating_mul(1 << attempt.min(5))
                    .min(BACKOFF_MAX);
                let finished = SystemTime::UNIX_EPOCH
                    + Duration::from_nanos(u64::try_from(status.finished_at).unwrap_or(0));
                let waited = SystemTime::now()
                    .duration_since(finished)
                    .unwrap_or_default();
                (restart && waited >= delay).then_some(attempt + 1)
            }
            Some(_) => None,
        };
        if let Some(next) = start_next {
            if let Err(reason) = self.ensure_image(puller, container).await {
                let status = serde_json::json!({
                    "name": container.name, "image": container.image, "ready": false,
                    "restartCount": attempt,
                    "state": {"waiting": {"reason": "ErrImagePull", "message": reason}},
                });
                return Ok((status, false));
            }
            let id = cri
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: sandbox.to_owned(),
                    config: Some(self.container_config(pod, uid, container, next)),
                    sandbox_config: Some(sandbox_config.clone()),
                })
                .await?
                .into_inner()
                .container_id;
            cri.start_container(StartContainerRequest {
                container_id: id.clone(),
            })
            .await?;
            tracing::info!(pod = %pod.metadata.name, container = %container.name, attempt = next, "container started");
            // As kubelet: one dead attempt is kept (its log is the "previous" one), older
            // ones are removed so restarts and recreates do not pile up containers.
            for dead in existing.iter().filter(|c| {
                c.labels.get(labels::CONTAINER_NAME) == Some(&container.name)
                    && c.metadata.as_ref().is_some_and(|m| m.attempt + 1 < next)
                    && c.state == ContainerState::ContainerExited as i32
            }) {
                if let Err(status) = cri
                    .remove_container(RemoveContainerRequest {
                        container_id: dead.id.clone(),
                    })
                    .await
                {
                    tracing::debug!(id = %dead.id, error = %status.message(), "old container not removed");
                }
            }
            if let Some(handler) = container
                .lifecycle
                .as_ref()
                .and_then(|l| l.post_start.as_ref())
                && let Some(action) = Action::of_handler(handler)
            {
                // As kubelet: the container counts as started only after postStart; a
                // failed hook kills it (and the restart policy decides what follows).
                let bound = Duration::from_secs(pod.spec.termination_grace_period_seconds.max(30));
                if let Err(reason) = handlers::run(cri, container, &id, action, bound).await {
                    tracing::warn!(pod = %pod.metadata.name, container = %container.name, %reason, "postStart hook failed; stopping the container");
                    cri.stop_container(StopContainerRequest {
                        container_id: id.clone(),
                        timeout: 2,
                    })
                    .await?;
                }
            }
            // Ready and started only once the probes say so (none: at once).
            let started = container.startup_probe.is_none();
            let ready = !init && started && container.readiness_probe.is_none();
            let status = serde_json::json!({
                "name": container.name, "image": container.image, "ready": ready,
                "restartCount": next, "containerID": format!("containerd://{id}"),
                "started": started, "state": {"running": {"startedAt": rfc3339(SystemTime::now())}},
            });
            return Ok((status, false));
        }
        let Some(status) = current else {
            return Ok((serde_json::Value::Null, false));
        };
        let running = status.state == ContainerState::ContainerRunning as i32;
        let (started, ready) = if running && !init {
            Box::pin(self.probe(cri, pod, container, &status)).await?
        } else {
            (running, false)
        };
        let state = if running {
            serde_json::json!({"running": {"startedAt": rfc3339_nanos(status.started_at)}})
        } else if status.state == ContainerState::ContainerExited as i32 {
            if restarts(pod.spec.restart_policy, init, status.exit_code) {
                serde_json::json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off restarting the container (exit code {})", status.exit_code)}})
            } else {
                serde_json::json!({"terminated": {"exitCode": status.exit_code, "reason": status.reason,
                    "startedAt": rfc3339_nanos(status.started_at), "finishedAt": rfc3339_nanos(status.finished_at)}})
            }
        } else {
            serde_json::json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let done =
            init && status.state == ContainerState::ContainerExited as i32 && status.exit_code == 0;
        // The image this container was created from (as Kubernetes reports it), which
        // differs from the spec's while an in-place update is under way.
        let image = status
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| container.image.clone());
        Ok((
            serde_json::json!({
                "name": container.name,
                "image": image,
                "imageID": status.image_ref,
                "containerID": format!("containerd://{}", status.id),
                "ready": ready,
                "started": started,
                "restartCount": attempt,
                "state": state,
            }),
            done,
        ))
    }

    /// Run the container's probes that are due; (started, ready). A liveness (or
    /// startup) probe past its failure threshold stops the container, and the restart
    /// policy takes it from there.
    async fn probe(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        pod: &Pod,
        container: &Container,
        status: &k8s_cri::v1::ContainerStatus,
    ) -> Result<(bool, bool), tonic::Status> {
        let started_at = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(status.started_at).unwrap_or(0));
        let running_for = SystemTime::now()
            .duration_since(started_at)
            .unwrap_or_default();
        let probes = [
            ("startup", container.startup_probe.as_ref()),
            ("liveness", container.liveness_probe.as_ref()),
            ("readiness", container.readiness_probe.as_ref()),
        ];
        let mut kill: Option<String> = None;
        for (kind, probe) in probes {
            let Some(probe) = probe else { continue };
            let Some(action) = Action::of_probe(probe) else {
                continue;
            };
            let period = Duration::from_secs(u64::from(probe.period_seconds.unwrap_or(10)));
            let due = {
                let mut states = lock(&self.inner.probes);
                let state = states.entry(status.id.clone()).or_default();
                // Liveness and readiness wait for the startup probe; it stops once passed.
                let waiting =
                    kind != "startup" && container.startup_probe.is_some() && !state.started;
                let passed = kind == "startup" && state.started;
                if waiting || passed {
                    false
                } else {
                    running_for >= Duration::from_secs(u64::from(probe.initial_delay_seconds))
                        && state
                            .last_run
                            .get(kind)
                            .is_none_or(|at| at.elapsed() >= period)
                }
            };
            if !due {
                continue;
            }
            let timeout = Duration::from_secs(u64::from(probe.timeout_seconds.unwrap_or(1)));
            let outcome = handlers::run(cri, container, &status.id, action, timeout).await;
            let failure_threshold = probe.failure_threshold.unwrap_or(3);
            let mut states = lock(&self.inner.probes);
            let state = states.entry(status.id.clone()).or_default();
            state.last_run.insert(kind, std::time::Instant::now());
            match (kind, outcome) {
                ("startup", Ok(())) => state.started = true,
                ("startup", Err(reason)) => {
                    state.startup_failures += 1;
                    if state.startup_failures >= failure_threshold {
                        kill = Some(format!("startup probe failed: {reason}"));
                    }
                }
                ("liveness", Ok(())) => state.liveness_failures = 0,
                ("liveness", Err(reason)) => {
                    state.liveness_failures += 1;
                    if state.liveness_failures >= failure_threshold {
                        kill = Some(format!("liveness probe failed: {reason}"));
                    }
                }
                (_, Ok(())) => {
                    state.failures = 0;
                    state.successes += 1;
                    if state.successes >= probe.success_threshold.unwrap_or(1) {
                        state.ready = true;
                    }
                }
                (_, Err(reason)) => {
                    state.successes = 0;
                    state.failures += 1;
                    if state.failures >= failure_threshold && state.ready {
                        tracing::info!(pod = %pod.metadata.name, container = %container.name, %reason, "readiness probe failed; not ready");
                        state.ready = false;
                    }
                }
            }
        }
        if let Some(reason) = kill {
            tracing::warn!(pod = %pod.metadata.name, container = %container.name, %reason, "stopping the container");
            lock(&self.inner.probes).remove(&status.id);
            cri.stop_container(StopContainerRequest {
                container_id: status.id.clone(),
                timeout: i64::try_from(pod.spec.termination_grace_period_seconds).unwrap_or(30),
            })
            .await?;
            return Ok((false, false));
        }
        let states = lock(&self.inner.probes);
        let state = states.get(&status.id);
        let started = container.startup_probe.is_none() || state.is_some_and(|s| s.started);
        let ready =
            started && (container.readiness_probe.is_none() || state.is_some_and(|s| s.ready));
        Ok((started, ready))
    }

    /// The container's image on the node, as its `imagePullPolicy` asks (Kubernetes'
    /// default: Always for `:latest` or no tag, IfNotPresent otherwise).
    async fn ensure_image(&self, puller: &Puller, container: &Container) -> Result<(), String> {
        let image = container.image.as_str();
        let policy = container
            .image_pull_policy
            .unwrap_or_else(|| default_pull_policy(image));
        let mut images =
            k8s_cri::v1::image_service_client::ImageServiceClient::new(puller.runtime().channel());
        let present = images
            .image_status(k8s_cri::v1::ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.to_owned(),
                    ..ImageSpec::default()
                }),
                verbose: false,
            })
            .await
            .map_err(|s| s.message().to_owned())?
            .into_inner()
            .image
            .is_some();
        let pull = match policy {
            rigger_proto::pod::PullPolicy::Always => true,
            rigger_proto::pod::PullPolicy::IfNotPresent => !present,
            rigger_proto::pod::PullPolicy::Never if present => false,
            rigger_proto::pod::PullPolicy::Never => {
                return Err(format!(
                    "{image} is not on the node and imagePullPolicy is Never"
                ));
            }
        };
        if pull {
            // Boxed: a pull is a large future, and most reconciles never start one.
            Box::pin(puller.pull(image, Arc::new(NoProgress)))
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn container_config(
        &self,
        pod: &Pod,
        uid: &str,
        container: &Container,
        attempt: u32,
    ) -> ContainerConfig {
        let meta = &pod.metadata;
        let envs = resolved_env(pod, uid, container);
        let spec_hash = desired_hash(pod, uid, container);
        let mounts = container
            .volume_mounts
            .iter()
            .filter_map(|m| {
                let volume = pod.spec.volumes.iter().find(|v| v.name == m.name)?;
                let host_path = match (&volume.host_path, &volume.empty_dir) {
                    (Some(host), _) => {
                        if host.kind.as_deref() == Some("DirectoryOrCreate") {
                            let _ = std::fs::create_dir_all(&host.path);
                        }
                        host.path.clone()
                    }
                    (None, Some(_)) => {
                        let dir = self.inner.dir.join(uid).join("volumes").join(&volume.name);
                        let _ = std::fs::create_dir_all(&dir);
                        dir.display().to_string()
                    }
                    (None, None) => return None,
                };
                Some(Mount {
                    container_path: m.mount_path.clone(),
                    host_path,
                    readonly: m.read_only,
                    ..Mount::default()
                })
            })
            .collect();
        let limits = container.resources.as_ref().map(|r| &r.limits);
        let cpu = limits
            .and_then(|l| l.get("cpu"))
            .and_then(|c| rigger_proto::pod::parse_cpu(c));
        let memory = limits
            .and_then(|l| l.get("memory"))
            .and_then(|m| rigger_proto::pod::parse_memory(m));
        let resources = LinuxContainerResources {
            cpu_period: if cpu.is_some() { 100_000 } else { 0 },
            cpu_quota: cpu.map_or(0, |m| i64::try_from(m * 100).unwrap_or(i64::MAX)),
            memory_limit_in_bytes: memory.map_or(0, |m| i64::try_from(m).unwrap_or(i64::MAX)),
            ..LinuxContainerResources::default()
        };
        ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: container.name.clone(),
                attempt,
            }),
            image: Some(ImageSpec {
                image: container.image.clone(),
                ..ImageSpec::default()
            }),
            command: container.command.clone(),
            args: container.args.clone(),
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs,
            mounts,
            labels: [
                (labels::MANAGED.to_owned(), "true".to_owned()),
                (labels::POD_UID.to_owned(), uid.to_owned()),
                (labels::POD_NAME.to_owned(), meta.name.clone()),
                (
                    labels::POD_NAMESPACE.to_owned(),
                    meta.namespace.clone().unwrap_or_default(),
                ),
                (labels::CONTAINER_NAME.to_owned(), container.name.clone()),
                (labels::SPEC_HASH.to_owned(), spec_hash),
            ]
            .into(),
            log_path: format!("{}/{attempt}.log", container.name),
            linux: Some(LinuxContainerConfig {
                resources: Some(resources),
                ..LinuxContainerConfig::default()
            }),
            ..ContainerConfig::default()
        }
    }
}

async fn list_containers(
    cri: &mut RuntimeServiceClient<Channel>,
    sandbox: &str,
) -> Result<Vec<k8s_cri::v1::Container>, tonic::Status> {
    Ok(cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: sandbox.to_owned(),
                ..ContainerFilter::default()
            }),
        })
        .await?
        .into_inner()
        .containers)
}

/// Whether an exited container starts again under `policy` (an init container that
/// succeeded is done, whatever the policy).
fn restarts(policy: RestartPolicy, init: bool, exit_code: i32) -> bool {
    let failed = exit_code != 0;
    match policy {
        RestartPolicy::Always => !init || failed,
        RestartPolicy::OnFailure => failed,
        RestartPolicy::Never => false,
    }
}

/// Kubernetes' default `imagePullPolicy`: Always for `:latest` or no tag, IfNotPresent
/// for any other tag or a digest.
fn default_pull_policy(image: &str) -> rigger_proto::pod::PullPolicy {
    let tag = image
        .rsplit('/')
        .next()
        .and_then(|last| last.split_once(':'))
        .map(|(_, tag)| tag);
    if image.contains('@') || tag.is_some_and(|t| t != "latest") {
        rigger_proto::pod::PullPolicy::IfNotPresent
    } else {
        rigger_proto::pod::PullPolicy::Always
    }
}

/// The messages of a CRI log file (each line is `TIME STREAM TAG MESSAGE`), the last
/// `tail` of them (all for 0), newline-terminated.
fn log_messages(text: &str, tail: u32) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|line| line.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    let skip = if tail == 0 {
        0
    } else {
        lines.len().saturating_sub(tail as usize)
    };
    let mut out = lines[skip..].join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// A short hash of a container's spec, to tell a changed spec from a restart.
fn spec_hash(container: &Container) -> String {
    short_hash(&serde_json::to_vec(container).unwrap_or_default())
}

fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(bytes)[..8])
}

/// What the running container should be: its spec, and the values of env that refers
/// to the pod's metadata (so a changed label reaches it through an in-place restart).
fn desired_hash(pod: &Pod, uid: &str, container: &Container) -> String {
    let uses_metadata = container.env.iter().any(|e| e.value_from.is_some());
    if !uses_metadata {
        return spec_hash(container);
    }
    let values: Vec<String> = resolved_env(pod, uid, container)
        .into_iter()
        // A hot upgrade rewrites these on the working slot too; like kubelet, that
        // never restarts it (the value is read at the container's start).
        .filter(|kv| !HOT_UPGRADE_ENV.contains(&kv.key.as_str()))
        .map(|kv| format!("{}={}", kv.key, kv.value))
        .collect();
    let mut bytes = serde_json::to_vec(container).unwrap_or_default();
    bytes.extend(values.join("\n").into_bytes());
    short_hash(&bytes)
}

/// The container's environment, `fieldRef`s resolved against the pod.
fn resolved_env(pod: &Pod, uid: &str, container: &Container) -> Vec<KeyValue> {
    let meta = &pod.metadata;
    let field = |path: &str| -> String {
        let quoted = |prefix: &str| path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']"));
        match path {
            "metadata.name" => meta.name.clone(),
            "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
            "metadata.uid" => uid.to_owned(),
            "spec.nodeName" => pod.spec.node_name.clone().unwrap_or_default(),
            _ => quoted("metadata.labels['")
                .and_then(|k| meta.labels.get(k).cloned())
                .or_else(|| {
                    quoted("metadata.annotations['").and_then(|k| meta.annotations.get(k).cloned())
                })
                .unwrap_or_default(),
        }
    };
    container
        .env
        .iter()
        .map(|e| KeyValue {
            key: e.name.clone(),
            value: match (&e.value, &e.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => field(&from.field_ref.field_path),
                (None, None) => String::new(),
            },
        })
        .collect()
}

/// CRI's nanoseconds as RFC 3339; "never" as the epoch.
fn rfc3339_nanos(nanos: i64) -> String {
    rfc3339_from_nanos(nanos).unwrap_or_else(|| rfc3339(SystemTime::UNIX_EPOCH))
}

/// The address the node is reached at (pods use the host's network).
fn host_ip() -> String {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|socket| {
            socket.connect("192.0.2.1:9")?;
            socket.local_addr()
        })
        .map(|address| address.ip().to_string())
        .unwrap_or_default()
}

impl PodRunner {
    /// Answer a user's question about one of this node's pods (logs, exec).
    pub async fn answer(
        &self,
        request: rigger_proto::v1::AgentRequest,
    ) -> rigger_proto::v1::AgentResponse {
        use rigger_proto::v1::{AgentResponse, agent_request};
        let id = request.id;
        let result = match request.kind {
            Some(agent_request::Kind::Logs(logs)) => self
                .logs(&logs.pod_uid, &logs.container, logs.tail_lines)
                .map(|text| (text.into_bytes(), Vec::new(), 0)),
            Some(agent_request::Kind::Exec(exec)) => {
                Box::pin(self.exec(
                    &exec.pod_uid,
                    &exec.container,
                    exec.command,
                    exec.timeout_seconds,
                ))
                .await
            }
            None => Err("this agent does not know the request (upgrade it)".to_owned()),
        };
        match result {
            Ok((stdout, stderr, exit_code)) => AgentResponse {
                id,
                stdout,
                stderr,
                exit_code,
                error: String::new(),
            },
            Err(error) => AgentResponse {
                id,
                error,
                ..AgentResponse::default()
            },
        }
    }

    /// The container named `container` (or the pod's first) of pod `uid`.
    fn container_name(&self, uid: &str, container: &str) -> Result<String, String> {
        let desired = lock(&self.inner.desired);
        let pod = desired
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .ok_or_else(|| format!("pod {uid} does not run on this node"))?;
        if container.is_empty() {
            return pod
                .spec
                .containers
                .first()
                .map(|c| c.name.clone())
                .ok_or_else(|| "the pod has no containers".to_owned());
        }
        let known = pod
            .spec
            .containers
            .iter()
            .chain(&pod.spec.init_containers)
            .any(|c| c.name == container);
        if known {
            Ok(container.to_owned())
        } else {
            Err(format!("the pod has no container named {container:?}"))
        }
    }

    /// The latest attempt's log, messages only (CRI's timestamp/stream/tag prefix dropped).
    fn logs(&self, uid: &str, container: &str, tail: u32) -> Result<String, String> {
        let name = self.container_name(uid, container)?;
        let dir = self.inner.dir.join(uid).join("logs").join(&name);
        let latest = std::fs::read_dir(&dir)
            .map_err(|e| format!("no log for container {name:?} yet ({e})"))?
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let attempt: u32 = path.file_stem()?.to_str()?.parse().ok()?;
                Some((attempt, path))
            })
            .max_by_key(|(attempt, _)| *attempt)
            .map(|(_, path)| path)
            .ok_or_else(|| format!("no log for container {name:?} yet"))?;
        let text =
            std::fs::read_to_string(&latest).map_err(|e| format!("{}: {e}", latest.display()))?;
        Ok(log_messages(&text, tail))
    }

    async fn exec(
        &self,
        uid: &str,
        container: &str,
        command: Vec<String>,
        timeout: u32,
    ) -> Result<(Vec<u8>, Vec<u8>, i32), String> {
        let name = self.container_name(uid, container)?;
        let runtime = Runtime::connect(&self.inner.containerd_address, DEFAULT_CONNECT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let mut cri = RuntimeServiceClient::new(runtime.channel());
        let running = cri
            .list_containers(ListContainersRequest {
                filter: Some(ContainerFilter {
                    state: Some(k8s_cri::v1::ContainerStateValue {
                        state: ContainerState::ContainerRunning as i32,
                    }),
                    label_selector: [
                        (labels::POD_UID.to_owned(), uid.to_owned()),
                        (labels::CONTAINER_NAME.to_owned(), name.clone()),
                    ]
                    .into(),
                    ..ContainerFilter::default()
                }),
            })
            .await
            .map_err(|s| s.message().to_owned())?
            .into_inner()
            .containers;
        let target = running
            .first()
            .ok_or_else(|| format!("container {name:?} is not running"))?;
        let response = cri
            .exec_sync(k8s_cri::v1::ExecSyncRequest {
                container_id: target.id.clone(),
                cmd: command,
                timeout: i64::from(timeout),
            })
            .await
            .map_err(|s| s.message().to_owned())?
            .into_inner();
        Ok((response.stdout, response.stderr, response.exit_code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rigger_proto::pod::PullPolicy;

    #[test]
    fn pull_policy_defaults_follow_kubernetes() {
        assert_eq!(default_pull_policy("busybox"), PullPolicy::Always);
        assert_eq!(default_pull_policy("busybox:latest"), PullPolicy::Always);
        assert_eq!(
            default_pull_policy("127.0.0.1:5000/app"),
            PullPolicy::Always
        );
        assert_eq!(
            default_pull_policy("127.0.0.1:5000/app:1"),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            default_pull_policy("app@sha256:00"),
            PullPolicy::IfNotPresent
        );
    }

    #[test]
    fn cri_log_lines_become_messages() {
        let text =
            "2026-11-22T16:00:00.1Z stdout F one\n2026-11-22T16:00:01.2Z stderr F two words\n";
        assert_eq!(log_messages(text, 0), "one\ntwo words\n");
        assert_eq!(log_messages(text, 1), "two words\n");
        assert_eq!(log_messages("", 5), "");
    }

    #[test]
    fn spec_hash_changes_with_the_spec_only() {
        let a = Container {
            name: "app".to_owned(),
            image: "r.example/app:1".to_owned(),
            ..Container::default()
        };
        let mut b = a.clone();
        assert_eq!(spec_hash(&a), spec_hash(&b));
        b.image = "r.example/app:2".to_owned();
        assert_ne!(spec_hash(&a), spec_hash(&b));
    }
}
