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
//! Probes and lifecycle hooks run as kubelet runs them (`crate::handlers`), from the
//! same loop. The runner is kept one operation per file: [`sandbox`] (create, configure,
//! remove), [`containers`] (create, start, restart, images), [`probes`], [`answers`]
//! (logs and exec for users), [`update`] (in-place updates), [`ownership`] (which
//! sandboxes are provably ours), [`state`] (what is persisted), [`host`] (the runner as
//! a recreate sees it).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{ListPodSandboxRequest, PodSandboxFilter, PodSandboxState};
use rigger_proto::pod::Pod;
use rigger_proto::v1::{AssignedPod, PodStatus};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

mod answers;
mod containers;
mod host;
mod ownership;
mod probes;
mod sandbox;
mod state;
mod update;

pub use crate::lifecycle::LifecycleState;

use crate::labels;
use rigger_pull::Puller;
use rigger_runtime::{CRI_NAMESPACE, Connection};

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

/// A pod's registry credentials (docker config documents); `{:?}` shows only how many.
#[derive(Clone, Default)]
struct PullSecrets(Vec<String>);

impl std::fmt::Debug for PullSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PullSecrets({} redacted)", self.0.len())
    }
}

#[derive(Debug)]
struct Inner {
    node: String,
    dir: PathBuf,
    /// The node's containerd connection (CRI calls go through it).
    connection: Arc<Connection>,
    /// The node's pull engine, pulling into CRI's namespace.
    puller: Puller,
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
    /// Each pod's imagePullSecrets, as the controller sent them: memory only, never
    /// persisted or printed.
    pull_secrets: Mutex<HashMap<String, PullSecrets>>,
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
        connection: Arc<Connection>,
        puller: &Puller,
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
                connection,
                // Pods run through CRI, whose images live in kubelet's namespace.
                puller: puller.for_namespace(CRI_NAMESPACE),
                desired: Mutex::new(desired),
                wake: Notify::new(),
                statuses: Mutex::default(),
                version: watch::channel(0).0,
                probes: Mutex::default(),
                known: Mutex::default(),
                unready: Mutex::default(),
                recreate_now: Mutex::default(),
                cooperators: Mutex::default(),
                pull_secrets: Mutex::default(),
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
        *lock(&self.inner.pull_secrets) = pods
            .iter()
            .filter(|p| !p.docker_configs.is_empty())
            .map(|p| (p.uid.clone(), PullSecrets(p.docker_configs.clone())))
            .collect();
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
        let mut session: Option<RuntimeServiceClient<Channel>> = None;
        loop {
            if session.is_none() {
                match self.inner.connection.channel().await {
                    Ok(channel) => {
                        session = Some(
                            RuntimeServiceClient::new(channel).max_decoding_message_size(
                                rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE,
                            ),
                        )
                    }
                    Err(error) => tracing::debug!(%error, "pods wait for containerd"),
                }
            }
            if let Some(cri) = session.as_mut()
                && let Err(error) = self.reconcile(cri).await
            {
                tracing::warn!(%error, "pods: CRI call failed; retrying");
                self.inner.connection.failed(&error).await;
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
    ) -> Result<(), tonic::Status> {
        // The hold first, then the set: `set_desired` stores the set before it lifts the
        // hold, so a pass that sees the hold lifted also sees the set that lifted it.
        // Read the other way round (found in `make test`), a pass that took the empty
        // set of a torn file, then saw the controller's set lift the hold, removed the
        // pod that set had just confirmed.
        let hold = self
            .inner
            .hold_removals
            .load(std::sync::atomic::Ordering::SeqCst);
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
            let status = self.ensure(cri, pod, &uid, sandbox).await?;
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
}
