//! The ImagePullJob engine: decides which node pulls when, sends the tasks, folds the
//! agents' reports into status.
//!
//! Users own a job's spec (`ImagePullJob/<ns>/<name>` in the store); the engine owns its
//! status (`ImagePullJob.status/<ns>/<name>`), so an apply never races a status write.
//! The engine keeps every job in memory, reconciles on each report and twice a second,
//! and writes statuses that changed at most that often: with thousands of nodes the
//! store sees one write per job per tick, not one per report.
//!
//! Task ids are `<job uid>/<node>/<attempt>`: a retry is a new task; the same task sent
//! again (after a reconnect) is recognized by the agent and never runs twice. Parallelism
//! counts nodes in `Pulling` only — waiting, finished and lost nodes hold no slot.

use rigger_proto::time::now_rfc3339;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use rigger_proto::v1::{ControllerMessage, TaskPhase, TaskStatus};
use tokio::sync::Notify;

mod mirror;
mod reconcile;
mod sources;
mod tasks;

use self::reconcile::{cancel, reconcile_job};
use crate::job_status;
use crate::nodes::{NodeRegistry, NodeView};
use crate::store::{ObjectKey, Precondition, Store, StoreError};
use rigger_api::image_pull_job::{
    self, ImagePullJob, ImagePullJobStatus, NodePullPhase, NodePullStatus,
};
use rigger_api::secret::{self, Secret};

const TICK: Duration = Duration::from_millis(500);
/// Longest wait before a failed node's next attempt.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct JobState {
    spec_revision: u64,
    job: ImagePullJob,
    status: ImagePullJobStatus,
    /// Position of each node in `status.nodes`.
    index: HashMap<String, usize>,
    /// Per node: when the current attempt was sent / may be retried (not persisted).
    sent_at: HashMap<String, Instant>,
    retry_at: HashMap<String, Instant>,
    /// Since when a node counted as lost; after `timeoutSeconds` its failure is final.
    lost_at: HashMap<String, Instant>,
    /// Nodes whose task must be sent again (they reconnected).
    resend: Vec<String>,
    /// Per node: the nodes whose bytes it found wrong, never planned as its sources for
    /// this job again. Only the reporter's plan changes: a node's word about another is
    /// not trusted for anyone else (not persisted: a controller restart forgets them).
    suspects: HashMap<String, std::collections::BTreeSet<String>>,
    /// Per node: the nodes its current task fetches from (not persisted).
    planned: HashMap<String, Vec<String>>,
    dirty: bool,
    /// What of the status is in the store (which shards to write again).
    written: job_status::Written,
}

impl JobState {
    fn new(
        spec_revision: u64,
        job: ImagePullJob,
        status: ImagePullJobStatus,
        written: job_status::Written,
    ) -> Self {
        let mut state = Self {
            spec_revision,
            job,
            status,
            index: HashMap::new(),
            sent_at: HashMap::new(),
            retry_at: HashMap::new(),
            lost_at: HashMap::new(),
            resend: Vec::new(),
            suspects: HashMap::new(),
            planned: HashMap::new(),
            dirty: false,
            written,
        };
        state.reindex();
        state
    }

    fn reindex(&mut self) {
        self.index = self
            .status
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
    }

    fn finished(&self) -> bool {
        self.status.completion_time.is_some()
    }

    fn uid(&self) -> &str {
        self.job
            .metadata
            .uid
            .as_deref()
            .unwrap_or(&self.job.metadata.name)
    }

    fn entry(&mut self, node: &str) -> Option<&mut NodePullStatus> {
        let i = *self.index.get(node)?;
        self.status.nodes.get_mut(i)
    }

    /// Whether the job wants `node`.
    fn selects(&self, name: &str, node: &NodeView) -> bool {
        let spec = &self.job.spec;
        match (&spec.selector, &spec.pod_selector) {
            (Some(selector), _) if !selector.names.is_empty() => {
                selector.names.iter().any(|n| n == name)
            }
            // Credentials go only where an admin's labels point (crate::node_labels).
            (Some(selector), _) if !spec.pull_secrets.is_empty() => {
                selector.labels.matches(&node.admin_labels)
            }
            (Some(selector), _) => selector.labels.matches(&node.labels),
            // As in Kruise, only pods in the job's namespace count.
            (None, Some(pods)) => {
                let job_namespace = (self.job.metadata.namespace.as_deref())
                    .unwrap_or(rigger_api::DEFAULT_NAMESPACE);
                node.pod_labels.iter().any(|(namespace, labels)| {
                    **namespace == *job_namespace && pods.matches(labels)
                })
            }
            (None, None) => true,
        }
    }
}

#[derive(Debug, Default)]
struct EngineState {
    jobs: BTreeMap<ObjectKey, JobState>,
    /// Task id → (job, node).
    tasks: HashMap<String, (ObjectKey, String)>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    nodes: NodeRegistry,
    node_timeout: Duration,
    started: Instant,
    state: Mutex<EngineState>,
    wake: Notify,
    /// Signs the peer grants tasks carry; `None`: sharing is off.
    grants: Option<Arc<rigger_proto::peer_grant::GrantSigner>>,
}

/// The engine; cheap to clone.
#[derive(Debug, Clone)]
pub struct JobEngine {
    inner: Arc<Inner>,
}

/// What a reconcile asks for outside the lock.
#[derive(Debug, Default)]
struct Effects {
    messages: Vec<(String, ControllerMessage)>,
    expired: Vec<ObjectKey>,
}

fn parse_time(text: Option<&str>) -> Option<SystemTime> {
    humantime::parse_rfc3339(text?).ok()
}

impl JobEngine {
    /// `grants`: the signer of peer grants, when the controller has a key (fleet
    /// distribution on).
    pub fn new(
        store: Store,
        nodes: NodeRegistry,
        node_timeout: Duration,
        grants: Option<Arc<rigger_proto::peer_grant::GrantSigner>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                nodes,
                node_timeout,
                started: Instant::now(),
                state: Mutex::default(),
                wake: Notify::new(),
                grants,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, EngineState> {
        // Every change under the lock is a field write; a panic cannot leave it torn.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many jobs are running and completed (for metrics).
    pub fn phase_counts(&self) -> [(&'static str, usize); 2] {
        let state = self.lock();
        let completed = state.jobs.values().filter(|j| j.finished()).count();
        [
            ("running", state.jobs.len() - completed),
            ("completed", completed),
        ]
    }

    /// A job's status as the engine holds it (the leader's, ahead of the store), if the
    /// engine has loaded the job at `spec_revision`. Reads come from here: the stored
    /// status is a summary and shards written one after the other, which a reader could
    /// see half-way.
    pub fn status_of(&self, key: &ObjectKey, spec_revision: u64) -> Option<ImagePullJobStatus> {
        let state = self.lock();
        let job = state.jobs.get(key)?;
        (job.spec_revision == spec_revision).then(|| job.status.clone())
    }

    /// Reconcile soon (a job was applied or deleted, a node came or went).
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }
}

/// What a job pass reads from the store.
#[derive(Debug)]
pub struct JobSnapshot {
    /// Every job in the store, with its spec revision.
    present: HashMap<ObjectKey, u64>,
    /// Jobs new or changed since the last pass; with the stored status of new ones.
    changed: Vec<ChangedJob>,
    /// The docker config documents of every secret some unfinished job names.
    secrets: HashMap<ObjectKey, Result<String, String>>,
}

#[derive(Debug)]
struct ChangedJob {
    key: ObjectKey,
    revision: u64,
    job: ImagePullJob,
    /// `Some` for a job this engine did not know: its status as stored, if any.
    loaded: Option<Option<(ImagePullJobStatus, job_status::Written)>>,
}

impl crate::engine::Engine for JobEngine {
    const NAME: &'static str = "image pull jobs";
    const TICK: Duration = TICK;
    type Snapshot = JobSnapshot;

    fn wake_signal(&self) -> &Notify {
        &self.inner.wake
    }

    async fn observe(&self) -> Result<JobSnapshot, StoreError> {
        let specs = self.inner.store.list(image_pull_job::KIND).await?;
        let known: HashMap<ObjectKey, u64> = self
            .lock()
            .jobs
            .iter()
            .map(|(k, j)| (k.clone(), j.spec_revision))
            .collect();
        let mut present = HashMap::with_capacity(specs.len());
        let mut changed = Vec::new();
        for stored in specs {
            present.insert(stored.key.clone(), stored.revision);
            if known.get(&stored.key) == Some(&stored.revision) {
                continue;
            }
            let job: ImagePullJob = match serde_json::from_slice(&stored.object) {
                Ok(job) => job,
                Err(error) => {
                    tracing::warn!(job = %stored.key, %error, "stored job unreadable; skipped");
                    continue;
                }
            };
            // A job stored before today's bounds (or written around the API) is checked
            // as an apply would check it: one bad object never reaches the engine.
            if let Err(error) = job.validate() {
                tracing::warn!(job = %stored.key, %error, "stored job is not valid; skipped");
                continue;
            }
            let loaded = match known.contains_key(&stored.key) {
                true => None,
                false => Some(job_status::read(&self.inner.store, &stored.key).await?),
            };
            changed.push(ChangedJob {
                key: stored.key,
                revision: stored.revision,
                job,
                loaded,
            });
        }
        let secrets = self.read_secrets(&changed).await;
        Ok(JobSnapshot {
            present,
            changed,
            secrets,
        })
    }

    async fn pass(&self, snapshot: JobSnapshot) {
        self.sync_specs(snapshot.present, snapshot.changed).await;
        let effects = self.reconcile(&snapshot.secrets);
        self.apply(effects).await;
        self.flush().await;
    }

    /// Last statuses reach the store before the controller exits.
    async fn finish(&self) {
        self.flush().await;
    }
}

impl JobEngine {
    /// Take in created, changed and deleted job specs.
    async fn sync_specs(&self, present: HashMap<ObjectKey, u64>, changed: Vec<ChangedJob>) {
        for changed in changed {
            let mut state = self.lock();
            let state = &mut *state;
            match (state.jobs.get_mut(&changed.key), changed.loaded) {
                (Some(existing), _) => {
                    existing.job = changed.job;
                    existing.spec_revision = changed.revision;
                }
                (None, None) => {
                    // Forgotten meanwhile (a concurrent delete): the next pass loads it.
                }
                (None, Some(status)) => {
                    let (status, written) = status.unwrap_or_default();
                    let mut job_state =
                        JobState::new(changed.revision, changed.job, status, written);
                    // Attempts in flight when the controller stopped: their timers
                    // restart now; agents report or get the task again on reconnect.
                    for entry in &job_state.status.nodes {
                        if entry.phase == NodePullPhase::Pulling {
                            job_state.sent_at.insert(entry.name.clone(), Instant::now());
                            job_state.resend.push(entry.name.clone());
                        }
                        if entry.node_lost {
                            job_state.lost_at.insert(entry.name.clone(), Instant::now());
                        }
                        if !entry.task_id.is_empty() {
                            state.tasks.insert(
                                entry.task_id.clone(),
                                (changed.key.clone(), entry.name.clone()),
                            );
                        }
                    }
                    tracing::info!(job = %changed.key, image = %job_state.job.spec.image, "job loaded");
                    state.jobs.insert(changed.key, job_state);
                }
            }
        }
        let removed: Vec<ObjectKey> = self
            .lock()
            .jobs
            .keys()
            .filter(|k| !present.contains_key(*k))
            .cloned()
            .collect();
        for key in removed {
            self.forget(&key).await;
        }
    }

    /// A job was deleted: stop its pulls and drop its status.
    async fn forget(&self, key: &ObjectKey) {
        let cancels = {
            let mut state = self.lock();
            let Some(job) = state.jobs.remove(key) else {
                return;
            };
            state.tasks.retain(|_, (k, _)| k != key);
            job.status
                .nodes
                .iter()
                .filter(|n| n.phase == NodePullPhase::Pulling)
                .map(|n| (n.name.clone(), cancel(&n.task_id, "the job was deleted")))
                .collect::<Vec<_>>()
        };
        for (node, message) in cancels {
            self.inner.nodes.send(&node, message);
        }
        if let Err(error) = job_status::delete(&self.inner.store, key).await {
            tracing::warn!(job = %key, %error, "cannot delete the job's status");
        }
        tracing::info!(job = %key, "job deleted");
    }

    /// The docker config documents of every secret some unfinished job names (or a
    /// job just created or changed).
    async fn read_secrets(
        &self,
        changed: &[ChangedJob],
    ) -> HashMap<ObjectKey, Result<String, String>> {
        let names = |key: &ObjectKey, job: &ImagePullJob| {
            job.spec
                .pull_secrets
                .iter()
                .map(|name| ObjectKey::new(secret::KIND, &key.namespace, name))
                .collect::<Vec<_>>()
        };
        let mut wanted: Vec<ObjectKey> = self
            .lock()
            .jobs
            .iter()
            .filter(|(_, j)| !j.finished())
            .flat_map(|(key, j)| names(key, &j.job))
            .collect();
        wanted.extend(changed.iter().flat_map(|c| names(&c.key, &c.job)));
        let mut secrets = HashMap::new();
        for key in wanted {
            if secrets.contains_key(&key) {
                continue;
            }
            let document = match self.inner.store.get(key.clone()).await {
                Ok(Some(stored)) => serde_json::from_slice::<Secret>(&stored.object)
                    .map_err(|e| format!("is unreadable: {e}"))
                    .and_then(|s| {
                        s.docker_config()
                            .unwrap_or_else(|| Err("is empty".to_owned()))
                    }),
                Ok(None) => Err("does not exist".to_owned()),
                Err(e) => Err(format!("cannot be read: {e}")),
            };
            secrets.insert(key, document);
        }
        secrets
    }

    /// The nodes `node`'s containerd may fetch `image` (a digest, asked under
    /// `repository` for `registry`) from through its agent's registry mirror, with
    /// grants: the holders of the image in a job that names `node` and whose image
    /// reference is of that repository (none when sharing is off or no such job exists).
    pub fn mirror_peers(
        &self,
        node: &str,
        image: &str,
        repository: &str,
        registry: &str,
    ) -> Vec<rigger_proto::v1::PeerSource> {
        let Some(grants) = self.inner.grants.as_deref() else {
            return Vec::new();
        };
        let views = self
            .inner
            .nodes
            .views(SystemTime::now(), self.inner.node_timeout);
        let secrets = HashMap::new();
        let credentials = tasks::TaskCredentials {
            secrets: &secrets,
            grants: Some(grants),
        };
        let now = SystemTime::now();
        let state = self.lock();
        for job in state.jobs.values() {
            if !mirror::same_repository(&job.job.spec.image, repository, registry) {
                continue;
            }
            let sources = sources::mirror_sources(
                &job.status.nodes,
                &views,
                job.suspects.get(node),
                &job.planned,
                node,
                image,
            );
            if !sources.is_empty() {
                let until = tasks::grants_until(&job.job, now, reconcile::deadline(job));
                return tasks::peer_sources(&job.job, node, &credentials, &sources, until);
            }
        }
        Vec::new()
    }

    fn reconcile(&self, secrets: &HashMap<ObjectKey, Result<String, String>>) -> Effects {
        let views = self
            .inner
            .nodes
            .views(SystemTime::now(), self.inner.node_timeout);
        let starting = self.inner.started.elapsed() < self.inner.node_timeout;
        let mut effects = Effects::default();
        let credentials = tasks::TaskCredentials {
            secrets,
            grants: self.inner.grants.as_deref(),
        };
        let mut state = self.lock();
        let EngineState { jobs, tasks } = &mut *state;
        for (key, job) in jobs.iter_mut() {
            reconcile_job(
                key,
                job,
                &views,
                &credentials,
                starting,
                tasks,
                &mut effects,
            );
        }
        effects
    }

    async fn apply(&self, effects: Effects) {
        for (node, message) in effects.messages {
            if !self.inner.nodes.send(&node, message) {
                tracing::debug!(%node, "message not queued; the node's agent is away or busy");
            }
        }
        for key in effects.expired {
            tracing::info!(job = %key, "ttlSecondsAfterFinished passed; deleting the job");
            match self
                .inner
                .store
                .delete(key.clone(), Precondition::Any)
                .await
            {
                Ok(()) | Err(StoreError::NotFound { .. }) => {}
                Err(error) => tracing::warn!(job = %key, %error, "cannot delete the expired job"),
            }
            self.forget(&key).await;
        }
    }

    /// Write the statuses that changed.
    async fn flush(&self) {
        let dirty: Vec<(ObjectKey, ImagePullJobStatus, job_status::Written)> = {
            let mut state = self.lock();
            state
                .jobs
                .iter_mut()
                .filter(|(_, j)| j.dirty)
                .map(|(key, j)| {
                    j.dirty = false;
                    (key.clone(), j.status.clone(), j.written.clone())
                })
                .collect()
        };
        for (key, status, mut written) in dirty {
            let result = job_status::write(&self.inner.store, &key, status, &mut written).await;
            let mut state = self.lock();
            let Some(job) = state.jobs.get_mut(&key) else {
                continue;
            };
            match result {
                Ok(()) => job.written = written,
                Err(error) => {
                    tracing::warn!(job = %key, %error, "cannot write the job's status");
                    job.dirty = true;
                }
            }
        }
    }

    /// An agent (re)registered: take the statuses it holds, and send again the tasks it
    /// should be running.
    pub fn node_connected(&self, node: &str, statuses: Vec<TaskStatus>) {
        {
            let mut state = self.lock();
            let EngineState { jobs, .. } = &mut *state;
            for job in jobs.values_mut() {
                if job.index.contains_key(node) && !job.finished() {
                    job.resend.push(node.to_owned());
                }
            }
        }
        for status in statuses {
            self.report(node, status);
        }
        self.wake();
    }

    /// A task status from `node`'s agent.
    pub fn report(&self, node: &str, status: TaskStatus) {
        let mut state = self.lock();
        let EngineState { jobs, tasks } = &mut *state;
        let Some((key, owner)) = tasks.get(&status.id) else {
            return; // A task of a deleted job.
        };
        if owner != node {
            tracing::warn!(%node, task = %status.id, "report for a task of another node refused");
            return;
        }
        let Some(job) = jobs.get_mut(key) else {
            return;
        };
        if job.finished() {
            return;
        }
        let backoff_limit = job.job.spec.pull_policy.backoff_limit;
        if job
            .entry(node)
            .is_none_or(|entry| entry.task_id != status.id)
        {
            return; // An earlier attempt (or a node the job no longer has).
        }
        // Bounded by the node's own sources: an agent cannot grow this with names, and
        // its word changes its own plan only.
        let own_sources = job.planned.get(node).cloned().unwrap_or_default();
        for suspect in &status.suspected_peers {
            if own_sources.contains(suspect)
                && job
                    .suspects
                    .entry(node.to_owned())
                    .or_default()
                    .insert(suspect.clone())
            {
                tracing::warn!(job = %key, %node, peer = %suspect, "a peer sent bytes that did not match their digest; no longer planned as a source of this node for this job");
            }
        }
        let Some(entry) = job.entry(node) else {
            return;
        };
        // A digest is what the node says it resolved: it orders whom the others ask,
        // never what they take, and only a digest's form is accepted.
        let status_digest = if rigger_proto::peer_grant::is_sha256_digest(&status.image_digest) {
            status.image_digest.clone()
        } else {
            String::new()
        };
        let phase = TaskPhase::try_from(status.phase).unwrap_or(TaskPhase::Unspecified);
        let phase_before = entry.phase;
        entry.bytes_done = status.bytes_done;
        entry.bytes_total = status.bytes_total;
        let mut resent = false;
        let mut resolved = false;
        match phase {
            TaskPhase::Accepted | TaskPhase::Running => {
                if entry.phase != NodePullPhase::Pulling {
                    // The node kept pulling while it was away.
                    entry.phase = NodePullPhase::Pulling;
                    entry.node_lost = false;
                    entry.message.clear();
                }
                // Resolved while pulling: the node serves the image's blobs as they arrive
                // (nodes waiting for a source may start now).
                if !status_digest.is_empty() && entry.image_digest != status_digest {
                    entry.image_digest = status_digest;
                    resolved = true;
                }
                resent = true;
            }
            TaskPhase::Succeeded => {
                entry.phase = NodePullPhase::Succeeded;
                entry.node_lost = false;
                entry.message = status.message;
                entry.image_digest = status_digest;
                entry.completion_time = Some(now_rfc3339());
            }
            TaskPhase::Failed => {
                entry.node_lost = false;
                entry.completion_time = Some(now_rfc3339());
                if entry.attempts <= backoff_limit {
                    entry.phase = NodePullPhase::Waiting;
                    entry.message =
                        format!("attempt {} failed: {}", entry.attempts, status.message);
                    let delay =
                        Duration::from_secs(1 << entry.attempts.min(6)).min(MAX_RETRY_DELAY);
                    job.retry_at.insert(node.to_owned(), Instant::now() + delay);
                } else {
                    entry.phase = NodePullPhase::Failed;
                    entry.message = status.message;
                }
            }
            TaskPhase::Unspecified => return,
        }
        if resent && status.phase == TaskPhase::Running as i32 {
            // Running on the agent: nothing to send again.
            job.resend.retain(|n| n != node);
        }
        // The summary agrees with the nodes at every read, not only after the next pass
        // (recounted only when the node changed phase: progress reports are the many).
        if job.entry(node).is_some_and(|e| e.phase != phase_before) {
            reconcile::count_nodes(&mut job.status);
            job.status.message = reconcile::progress_message(&job.status);
        }
        job.dirty = true;
        drop(state);
        if resolved || (phase != TaskPhase::Running && phase != TaskPhase::Accepted) {
            self.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::reconcile::tests::{job, key};
    use super::*;

    /// A job stored past today's bounds (written around the API, or by an older
    /// version) never reaches the engine; the valid one beside it does.
    #[tokio::test]
    async fn a_stored_job_past_its_bounds_is_skipped_when_loaded() {
        use crate::engine::Engine as _;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::Embedded(crate::store::EmbeddedStore::open(dir.path()).unwrap());
        let engine = JobEngine::new(
            store.clone(),
            NodeRegistry::default(),
            Duration::from_secs(30),
            None,
        );
        for (name, timeout) in [("huge", u64::MAX), ("fine", 60)] {
            let job = serde_json::json!({
                "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                "metadata": {"name": name, "namespace": "default", "uid": name},
                "spec": {"image": "r.example/a:1", "pullPolicy": {"timeoutSeconds": timeout}},
            });
            store
                .put(
                    ObjectKey::new(image_pull_job::KIND, "default", name),
                    serde_json::to_vec(&job).unwrap(),
                    Precondition::Any,
                )
                .await
                .unwrap();
        }
        let snapshot = engine.observe().await.unwrap();
        let loaded: Vec<&str> = snapshot
            .changed
            .iter()
            .map(|c| c.job.metadata.name.as_str())
            .collect();
        assert_eq!(loaded, ["fine"]);
    }

    #[tokio::test]
    async fn failed_attempts_retry_up_to_the_backoff_limit_and_reports_need_the_right_node() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::Embedded(crate::store::EmbeddedStore::open(dir.path()).unwrap());
        let registry = NodeRegistry::default();
        let (tx, _rx) = tokio::sync::mpsc::channel(8);
        let register = rigger_proto::v1::Register {
            node_name: "n1".to_owned(),
            ..rigger_proto::v1::Register::default()
        };
        registry.register(&register, 1, tx, SystemTime::now());
        let engine = JobEngine::new(store, registry, Duration::from_secs(30), None);
        let j =
            job(&serde_json::json!({"image": "r.example/a:1", "pullPolicy": {"backoffLimit": 1}}));
        engine.lock().jobs.insert(key(), j);
        let failed = |id: &str| TaskStatus {
            id: id.to_owned(),
            phase: TaskPhase::Failed.into(),
            message: "registry said no".to_owned(),
            ..TaskStatus::default()
        };
        let entry = |engine: &JobEngine| engine.lock().jobs[&key()].status.nodes[0].clone();

        engine.reconcile(&HashMap::new());
        assert_eq!(entry(&engine).task_id, "u1/n1/1");
        // Another node cannot report for n1.
        engine.report("n2", failed("u1/n1/1"));
        assert_eq!(entry(&engine).phase, NodePullPhase::Pulling);

        engine.report("n1", failed("u1/n1/1"));
        let first = entry(&engine);
        assert_eq!(first.phase, NodePullPhase::Waiting);
        assert_eq!(first.message, "attempt 1 failed: registry said no");
        assert!(
            engine.lock().jobs[&key()].retry_at.contains_key("n1"),
            "retried after a delay"
        );
        engine.lock().jobs.get_mut(&key()).unwrap().retry_at.clear();

        engine.reconcile(&HashMap::new());
        assert_eq!(entry(&engine).task_id, "u1/n1/2", "a retry is a new task");
        // A late report of the first attempt changes nothing.
        engine.report("n1", failed("u1/n1/1"));
        assert_eq!(entry(&engine).phase, NodePullPhase::Pulling);

        engine.report("n1", failed("u1/n1/2"));
        assert_eq!(
            entry(&engine).phase,
            NodePullPhase::Failed,
            "backoffLimit 1: two attempts"
        );
        engine.reconcile(&HashMap::new());
        assert!(engine.lock().jobs[&key()].status.completion_time.is_some());
    }
}
