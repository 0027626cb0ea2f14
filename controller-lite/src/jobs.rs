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
use std::str::FromStr as _;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use rigger_proto::v1::{
    CancelTask, ControllerMessage, PullImage, Task, TaskPhase, TaskStatus, controller_message, task,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::job_status;
use crate::nodes::{NodeRegistry, NodeView};
use crate::store::{ObjectKey, Precondition, Store, StoreError};
use rigger_api::Condition;
use rigger_api::image_pull_job::{
    self, CompletionPolicyType, ImagePullJob, ImagePullJobStatus, ImagePullPolicy, NodePullPhase,
    NodePullStatus,
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
            (None, Some(pods)) => node.pod_labels.iter().any(|labels| pods.matches(labels)),
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
    pub fn new(store: Store, nodes: NodeRegistry, node_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                nodes,
                node_timeout,
                started: Instant::now(),
                state: Mutex::default(),
                wake: Notify::new(),
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

    /// Run until `token` is cancelled.
    pub async fn run(self, token: CancellationToken) {
        crate::engine::run(&self, token).await;
    }
}

impl crate::engine::Engine for JobEngine {
    const TICK: Duration = TICK;

    fn wake_signal(&self) -> &Notify {
        &self.inner.wake
    }

    async fn pass(&self) {
        if let Err(error) = self.sync_specs().await {
            tracing::warn!(%error, "cannot read jobs from the store");
        }
        let secrets = self.load_secrets().await;
        let effects = self.reconcile(&secrets);
        self.apply(effects).await;
        self.flush().await;
    }

    /// Last statuses reach the store before the controller exits.
    async fn finish(&self) {
        self.flush().await;
    }
}

impl JobEngine {
    /// Pick up created, changed and deleted job specs.
    async fn sync_specs(&self) -> Result<(), StoreError> {
        let specs = self.inner.store.list(image_pull_job::KIND).await?;
        let known: HashMap<ObjectKey, u64> = self
            .lock()
            .jobs
            .iter()
            .map(|(k, j)| (k.clone(), j.spec_revision))
            .collect();
        let mut seen = Vec::with_capacity(specs.len());
        for stored in specs {
            seen.push(stored.key.clone());
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
            let status = match known.contains_key(&stored.key) {
                true => None,
                false => job_status::read(&self.inner.store, &stored.key).await?,
            };
            let mut state = self.lock();
            let state = &mut *state;
            match state.jobs.get_mut(&stored.key) {
                Some(existing) => {
                    existing.job = job;
                    existing.spec_revision = stored.revision;
                }
                None => {
                    let (status, written) = status.unwrap_or_default();
                    let mut job_state = JobState::new(stored.revision, job, status, written);
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
                                (stored.key.clone(), entry.name.clone()),
                            );
                        }
                    }
                    tracing::info!(job = %stored.key, image = %job_state.job.spec.image, "job loaded");
                    state.jobs.insert(stored.key.clone(), job_state);
                }
            }
        }
        let removed: Vec<ObjectKey> = known
            .keys()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for key in removed {
            self.forget(&key).await;
        }
        Ok(())
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

    /// The docker config documents of every secret some unfinished job names.
    async fn load_secrets(&self) -> HashMap<ObjectKey, Result<String, String>> {
        let wanted: Vec<ObjectKey> = self
            .lock()
            .jobs
            .iter()
            .filter(|(_, j)| !j.finished())
            .flat_map(|(key, j)| {
                j.job
                    .spec
                    .pull_secrets
                    .iter()
                    .map(|name| ObjectKey::new(secret::KIND, &key.namespace, name))
                    .collect::<Vec<_>>()
            })
            .collect();
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

    fn reconcile(&self, secrets: &HashMap<ObjectKey, Result<String, String>>) -> Effects {
        let views = self
            .inner
            .nodes
            .views(SystemTime::now(), self.inner.node_timeout);
        let starting = self.inner.started.elapsed() < self.inner.node_timeout;
        let mut effects = Effects::default();
        let mut state = self.lock();
        let EngineState { jobs, tasks } = &mut *state;
        for (key, job) in jobs.iter_mut() {
            reconcile_job(key, job, &views, secrets, starting, tasks, &mut effects);
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
        let Some(entry) = job.entry(node) else {
            return;
        };
        if entry.task_id != status.id {
            return; // An earlier attempt.
        }
        let phase = TaskPhase::try_from(status.phase).unwrap_or(TaskPhase::Unspecified);
        entry.bytes_done = status.bytes_done;
        entry.bytes_total = status.bytes_total;
        let mut resent = false;
        match phase {
            TaskPhase::Accepted | TaskPhase::Running => {
                if entry.phase != NodePullPhase::Pulling {
                    // The node kept pulling while it was away.
                    entry.phase = NodePullPhase::Pulling;
                    entry.node_lost = false;
                    entry.message.clear();
                }
                resent = true;
            }
            TaskPhase::Succeeded => {
                entry.phase = NodePullPhase::Succeeded;
                entry.node_lost = false;
                entry.message = status.message;
                entry.image_digest = status.image_digest;
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
        job.dirty = true;
        drop(state);
        if phase != TaskPhase::Running && phase != TaskPhase::Accepted {
            self.wake();
        }
    }
}

fn cancel(id: &str, reason: &str) -> ControllerMessage {
    ControllerMessage {
        message: Some(controller_message::Message::CancelTask(CancelTask {
            id: id.to_owned(),
            reason: reason.to_owned(),
        })),
    }
}

#[allow(clippy::too_many_lines)] // one pass over a job, in the order a reader checks it
fn reconcile_job(
    key: &ObjectKey,
    job: &mut JobState,
    views: &HashMap<String, NodeView>,
    secrets: &HashMap<ObjectKey, Result<String, String>>,
    starting: bool,
    tasks: &mut HashMap<String, (ObjectKey, String)>,
    effects: &mut Effects,
) {
    let policy = job.job.spec.completion_policy.clone();
    if job.finished() {
        if policy.kind == CompletionPolicyType::Always
            && let Some(ttl) = policy.ttl_seconds_after_finished
            && let Some(done) = parse_time(job.status.completion_time.as_deref())
            && SystemTime::now()
                .duration_since(done)
                .is_ok_and(|d| d >= Duration::from_secs(ttl))
        {
            effects.expired.push(key.clone());
        }
        return;
    }
    let now = SystemTime::now();
    let first = job.status.start_time.is_none();
    if first {
        job.status.start_time = Some(now_rfc3339());
        job.dirty = true;
    }

    // Membership: fixed at the start for Always; Never takes nodes that join later.
    if first || policy.kind == CompletionPolicyType::Never {
        let mut names: Vec<&String> = views
            .iter()
            .filter(|(name, view)| job.selects(name, view))
            .map(|(name, _)| name)
            .collect();
        if let Some(selector) = &job.job.spec.selector {
            // Named nodes that never registered are part of the job (and fail as such).
            names.extend(selector.names.iter());
        }
        names.sort();
        names.dedup();
        for name in names {
            if !job.index.contains_key(name.as_str()) {
                job.status.nodes.push(NodePullStatus {
                    name: name.clone(),
                    ..NodePullStatus::default()
                });
                job.dirty = true;
            }
        }
        job.status.nodes.sort_by(|a, b| a.name.cmp(&b.name));
        job.reindex();
    }

    // The deadline ends everything still open.
    let deadline_passed = policy.kind == CompletionPolicyType::Always
        && policy.active_deadline_seconds.is_some_and(|limit| {
            parse_time(job.status.start_time.as_deref()).is_some_and(|start| {
                now.duration_since(start)
                    .is_ok_and(|d| d >= Duration::from_secs(limit))
            })
        });

    let timeout = Duration::from_secs(job.job.spec.pull_policy.timeout_seconds);
    let backoff_limit = job.job.spec.pull_policy.backoff_limit;
    let resend: Vec<String> = std::mem::take(&mut job.resend);
    for entry in &mut job.status.nodes {
        let view = views.get(&entry.name);
        let not_ready = why_not_ready(view);
        if deadline_passed {
            if entry.phase == NodePullPhase::Pulling {
                effects.messages.push((
                    entry.name.clone(),
                    cancel(&entry.task_id, "job deadline exceeded"),
                ));
            }
            if matches!(entry.phase, NodePullPhase::Pulling | NodePullPhase::Waiting)
                || entry.node_lost
            {
                entry.phase = NodePullPhase::Failed;
                entry.node_lost = false;
                entry.message = "activeDeadlineSeconds exceeded".to_owned();
                job.dirty = true;
            }
            continue;
        }
        match entry.phase {
            NodePullPhase::Pulling => {
                if let Some(reason) = not_ready {
                    // Right after a controller start, agents are still reconnecting.
                    if starting && view.is_none_or(|v| v.not_ready.is_some()) {
                        continue;
                    }
                    entry.phase = NodePullPhase::Failed;
                    entry.node_lost = true;
                    entry.message = format!("node lost while pulling: {reason}");
                    job.lost_at.insert(entry.name.clone(), Instant::now());
                    job.dirty = true;
                } else if job
                    .sent_at
                    .get(&entry.name)
                    .is_some_and(|at| at.elapsed() > timeout + Duration::from_secs(30))
                {
                    // The agent enforces the timeout; this catches an agent that stopped
                    // reporting without losing its link.
                    effects.messages.push((
                        entry.name.clone(),
                        cancel(&entry.task_id, "no result in time"),
                    ));
                    entry.phase = if entry.attempts <= backoff_limit {
                        NodePullPhase::Waiting
                    } else {
                        NodePullPhase::Failed
                    };
                    entry.message = format!(
                        "no result within pullPolicy.timeoutSeconds ({}s)",
                        timeout.as_secs()
                    );
                    job.dirty = true;
                } else if resend.contains(&entry.name) {
                    match pull_task(&job.job, key, &entry.name, &entry.task_id, secrets) {
                        Ok(message) => effects.messages.push((entry.name.clone(), message)),
                        Err(reason) => fail(entry, &reason),
                    }
                }
            }
            // completionPolicy Never keeps the image on the node: an inventory taken
            // after the pull that lacks it sends the node back to pulling.
            NodePullPhase::Succeeded
                if policy.kind == CompletionPolicyType::Never
                    && image_gone(view, &job.job.spec.image, entry.completion_time.as_deref()) =>
            {
                entry.phase = NodePullPhase::Waiting;
                entry.message = "the image left the node; pulling it again".to_owned();
                job.dirty = true;
            }
            NodePullPhase::Failed if entry.node_lost && not_ready.is_none() => {
                // Back before the job finished: the work resumes.
                entry.phase = NodePullPhase::Waiting;
                entry.node_lost = false;
                entry.message = "node is back".to_owned();
                job.lost_at.remove(&entry.name);
                job.dirty = true;
            }
            NodePullPhase::Failed
                if entry.node_lost
                    && job
                        .lost_at
                        .get(&entry.name)
                        .is_none_or(|at| at.elapsed() > timeout) =>
            {
                // A node gets as long as one pull may take to come back.
                entry.node_lost = false;
                entry.message = format!(
                    "{}; not back within pullPolicy.timeoutSeconds ({}s)",
                    entry.message,
                    timeout.as_secs()
                );
                job.lost_at.remove(&entry.name);
                job.dirty = true;
            }
            _ => {}
        }
    }

    // Dispatch within parallelism.
    let desired = job.status.nodes.len();
    let limit = job.job.spec.parallelism_for(desired);
    let mut active = job
        .status
        .nodes
        .iter()
        .filter(|n| n.phase == NodePullPhase::Pulling)
        .count();
    let uid = job.uid().to_owned();
    let instant = Instant::now();
    for entry in &mut job.status.nodes {
        if active >= limit || deadline_passed {
            break;
        }
        if entry.phase != NodePullPhase::Waiting
            || job
                .retry_at
                .get(&entry.name)
                .is_some_and(|at| *at > instant)
        {
            continue;
        }
        let not_ready = why_not_ready(views.get(&entry.name));
        if let Some(reason) = not_ready {
            if starting {
                continue;
            }
            entry.phase = NodePullPhase::Failed;
            entry.node_lost = true;
            entry.message = format!("node not ready: {reason}");
            job.lost_at.insert(entry.name.clone(), instant);
            job.dirty = true;
            continue;
        }
        let attempt = entry.attempts + 1;
        let task_id = format!("{uid}/{}/{attempt}", entry.name);
        match pull_task(&job.job, key, &entry.name, &task_id, secrets) {
            Ok(message) => {
                effects.messages.push((entry.name.clone(), message));
                tasks.insert(task_id.clone(), (key.clone(), entry.name.clone()));
                entry.attempts = attempt;
                entry.task_id = task_id;
                entry.phase = NodePullPhase::Pulling;
                entry.bytes_done = 0;
                entry.message.clear();
                entry.start_time = Some(now_rfc3339());
                entry.completion_time = None;
                job.sent_at.insert(entry.name.clone(), instant);
                active += 1;
            }
            Err(reason) => fail(entry, &reason),
        }
        job.dirty = true;
    }

    // Counts, and completion for Always.
    let status = &mut job.status;
    let count = |phase| status.nodes.iter().filter(|n| n.phase == phase).count();
    let as_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let (succeeded, failed) = (
        count(NodePullPhase::Succeeded),
        count(NodePullPhase::Failed),
    );
    // Lost nodes count as failed but may still come back: the job waits for them.
    let lost = status.nodes.iter().filter(|n| n.node_lost).count();
    status.desired = as_u32(desired);
    status.active = as_u32(active);
    status.succeeded = as_u32(succeeded);
    status.failed = as_u32(failed);
    status.failed_nodes = status
        .nodes
        .iter()
        .filter(|n| n.phase == NodePullPhase::Failed)
        .map(|n| n.name.clone())
        .collect();
    if policy.kind == CompletionPolicyType::Always && succeeded + failed == desired && lost == 0 {
        status.completion_time = Some(now_rfc3339());
        status.conditions = vec![Condition {
            kind: "Complete".to_owned(),
            status: "True".to_owned(),
            reason: if deadline_passed {
                "DeadlineExceeded"
            } else if failed > 0 {
                "CompletedWithFailures"
            } else {
                "Completed"
            }
            .to_owned(),
            message: String::new(),
            last_transition_time: status.completion_time.clone(),
        }];
        status.message = if deadline_passed {
            format!(
                "activeDeadlineSeconds exceeded: {succeeded} of {desired} nodes pulled the image"
            )
        } else if desired == 0 {
            "no node matches the job's selector".to_owned()
        } else {
            format!("{succeeded} of {desired} nodes pulled the image, {failed} failed")
        };
        job.dirty = true;
        tracing::info!(job = %key, succeeded, failed, "job complete");
    } else {
        let message = format!("{succeeded} of {desired} nodes pulled the image, {active} pulling");
        if status.message != message {
            status.message = message;
        }
    }
}

/// Why a node cannot take work now (`None`: it can).
fn why_not_ready(view: Option<&NodeView>) -> Option<String> {
    match view {
        None => Some("node is not registered".to_owned()),
        Some(v) => v.not_ready.clone(),
    }
}

/// Whether `view`'s inventory, reported after `pulled_at`, lacks `image`.
fn image_gone(view: Option<&NodeView>, image: &str, pulled_at: Option<&str>) -> bool {
    let Some((reported_at, names)) = view.and_then(|v| v.images.as_ref()) else {
        return false;
    };
    // Seconds resolution on both sides: wait a second past the pull to be sure the
    // inventory was taken after it.
    let fresh = parse_time(pulled_at).is_some_and(|done| {
        reported_at
            .duration_since(done)
            .is_ok_and(|d| d > Duration::from_secs(1))
    });
    let name = oci_spec::distribution::Reference::from_str(image)
        .map(|r| r.whole())
        .unwrap_or_else(|_| image.to_owned());
    fresh && !names.contains(name.as_str())
}

/// A node's attempt that cannot even start (its pull secret is missing, say).
fn fail(entry: &mut NodePullStatus, reason: &str) {
    entry.phase = NodePullPhase::Failed;
    entry.node_lost = false;
    entry.message = reason.to_owned();
}

fn pull_task(
    job: &ImagePullJob,
    key: &ObjectKey,
    node: &str,
    task_id: &str,
    secrets: &HashMap<ObjectKey, Result<String, String>>,
) -> Result<ControllerMessage, String> {
    let mut docker_configs = Vec::new();
    for name in &job.spec.pull_secrets {
        match secrets.get(&ObjectKey::new(secret::KIND, &key.namespace, name)) {
            Some(Ok(document)) => docker_configs.push(document.clone()),
            Some(Err(reason)) => return Err(format!("pull secret {name:?} {reason}")),
            None => return Err(format!("pull secret {name:?} is not loaded yet")),
        }
    }
    Ok(ControllerMessage {
        message: Some(controller_message::Message::Task(Task {
            id: task_id.to_owned(),
            node_name: node.to_owned(),
            work: Some(task::Work::PullImage(PullImage {
                image: job.spec.image.clone(),
                always: job.spec.image_pull_policy == ImagePullPolicy::Always,
                timeout_seconds: u32::try_from(job.spec.pull_policy.timeout_seconds)
                    .unwrap_or(u32::MAX),
                docker_configs,
            })),
        })),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rigger_proto::time::rfc3339;
    use std::sync::Arc;

    fn job(spec: &serde_json::Value) -> JobState {
        let job: ImagePullJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "rigger.dev/v1alpha1",
            "kind": "ImagePullJob",
            "metadata": {"name": "j", "namespace": "default", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap();
        job.validate().unwrap();
        JobState::new(
            1,
            job,
            ImagePullJobStatus::default(),
            job_status::Written::default(),
        )
    }

    fn nodes(names: &[&str]) -> HashMap<String, NodeView> {
        names
            .iter()
            .map(|n| {
                (
                    (*n).to_owned(),
                    NodeView {
                        labels: [("zone".to_owned(), "a".to_owned())].into(),
                        admin_labels: BTreeMap::new(),
                        not_ready: None,
                        pod_labels: Vec::new(),
                        images: None,
                    },
                )
            })
            .collect()
    }

    fn key() -> ObjectKey {
        ObjectKey::new("ImagePullJob", "default", "j")
    }

    /// One reconcile; the nodes that were sent a task.
    fn step(job: &mut JobState, views: &HashMap<String, NodeView>) -> Vec<String> {
        let mut effects = Effects::default();
        let mut tasks = HashMap::new();
        reconcile_job(
            &key(),
            job,
            views,
            &HashMap::new(),
            false,
            &mut tasks,
            &mut effects,
        );
        effects
            .messages
            .into_iter()
            .filter(|(_, m)| matches!(m.message, Some(controller_message::Message::Task(_))))
            .map(|(node, _)| node)
            .collect()
    }

    /// The nodes a job of `spec` takes, after one reconcile over `views`.
    fn selected(spec: &serde_json::Value, views: &HashMap<String, NodeView>) -> Vec<String> {
        let mut j = job(spec);
        step(&mut j, views);
        j.status.nodes.iter().map(|n| n.name.clone()).collect()
    }

    fn finish(job: &mut JobState, node: &str, phase: NodePullPhase) {
        let entry = job.entry(node).unwrap();
        entry.phase = phase;
    }

    #[test]
    fn parallelism_counts_only_nodes_pulling() {
        let views = nodes(&["n1", "n2", "n3", "n4", "n5"]);
        let mut j = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": "40%"}));
        assert_eq!(
            step(&mut j, &views),
            ["n1", "n2"],
            "40% of 5 rounds up to 2"
        );
        assert_eq!(
            step(&mut j, &views),
            Vec::<String>::new(),
            "both slots are taken"
        );
        finish(&mut j, "n1", NodePullPhase::Succeeded);
        finish(&mut j, "n2", NodePullPhase::Failed);
        // Finished nodes, failed or not, hold no slot (kruise #1271).
        assert_eq!(step(&mut j, &views), ["n3", "n4"]);
        assert_eq!(j.status.active, 2);
        assert_eq!((j.status.succeeded, j.status.failed), (1, 1));
        assert_eq!(j.status.failed_nodes, ["n2"]);
        assert!(j.status.completion_time.is_none());
    }

    #[test]
    fn always_fixes_the_nodes_at_the_start_and_never_takes_newcomers() {
        let mut always = job(&serde_json::json!({"image": "r.example/a:1", "parallelism": 10}));
        step(&mut always, &nodes(&["n1"]));
        step(&mut always, &nodes(&["n1", "n2"]));
        assert_eq!(always.status.desired, 1);
        finish(&mut always, "n1", NodePullPhase::Succeeded);
        step(&mut always, &nodes(&["n1", "n2"]));
        assert!(always.status.completion_time.is_some());
        assert_eq!(always.status.conditions[0].kind, "Complete");

        let mut never = job(&serde_json::json!({
            "image": "r.example/a:1", "parallelism": 10, "completionPolicy": {"type": "Never"}
        }));
        step(&mut never, &nodes(&["n1"]));
        finish(&mut never, "n1", NodePullPhase::Succeeded);
        assert_eq!(
            step(&mut never, &nodes(&["n1", "n2"])),
            ["n2"],
            "a node that joins later pulls"
        );
        finish(&mut never, "n2", NodePullPhase::Succeeded);
        step(&mut never, &nodes(&["n1", "n2"]));
        assert!(
            never.status.completion_time.is_none(),
            "Never jobs never complete"
        );
    }

    #[test]
    fn never_pulls_again_when_the_image_left_the_node() {
        let mut never = job(&serde_json::json!({
            "image": "r.example/a:1", "parallelism": 10, "completionPolicy": {"type": "Never"}
        }));
        let mut views = nodes(&["n1"]);
        step(&mut never, &views);
        let done = SystemTime::now() - Duration::from_secs(60);
        let entry = never.entry("n1").unwrap();
        entry.phase = NodePullPhase::Succeeded;
        entry.completion_time = Some(rfc3339(done));
        let names = |list: &[&str]| Arc::new(list.iter().map(|n| Arc::<str>::from(*n)).collect());
        // An inventory from before the pull proves nothing; one after it with the image is fine.
        views.get_mut("n1").unwrap().images = Some((done - Duration::from_secs(5), names(&[])));
        assert!(step(&mut never, &views).is_empty());
        views.get_mut("n1").unwrap().images = Some((SystemTime::now(), names(&["r.example/a:1"])));
        assert!(step(&mut never, &views).is_empty());
        // The image is gone: pulled again.
        views.get_mut("n1").unwrap().images = Some((SystemTime::now(), names(&["r.example/b:1"])));
        assert_eq!(step(&mut never, &views), ["n1"]);
    }

    #[test]
    fn selectors_pick_nodes_by_label_name_or_pods() {
        let mut views = nodes(&["n1", "n2", "n3"]);
        views
            .get_mut("n2")
            .unwrap()
            .labels
            .insert("disk".to_owned(), "ssd".to_owned());
        views
            .get_mut("n3")
            .unwrap()
            .pod_labels
            .push([("app".to_owned(), "web".to_owned())].into());
        let by_label = |spec| selected(&spec, &views);
        assert_eq!(
            by_label(
                serde_json::json!({"image": "r.example/a:1", "selector": {"matchLabels": {"disk": "ssd"}}})
            ),
            ["n2"]
        );
        assert_eq!(
            by_label(
                serde_json::json!({"image": "r.example/a:1", "selector": {"names": ["n1", "gone"]}})
            ),
            ["gone", "n1"],
            "named nodes are part of the job even when unknown"
        );
        assert_eq!(
            by_label(
                serde_json::json!({"image": "r.example/a:1", "podSelector": {"matchLabels": {"app": "web"}}})
            ),
            ["n3"]
        );
    }

    #[test]
    fn a_job_with_pull_secrets_believes_only_the_labels_an_admin_set() {
        let mut views = nodes(&["claims", "chosen"]);
        let team = || [("team".to_owned(), "payments".to_owned())].into();
        // "claims" reports the label itself; "chosen" was labelled by an admin.
        views.get_mut("claims").unwrap().labels = team();
        let chosen = views.get_mut("chosen").unwrap();
        chosen.labels = team();
        chosen.admin_labels = team();
        let selected = |spec| selected(&spec, &views);
        let selector = serde_json::json!({"matchLabels": {"team": "payments"}});
        assert_eq!(
            selected(serde_json::json!({"image": "r.example/a:1", "selector": selector})),
            ["chosen", "claims"]
        );
        assert_eq!(
            selected(
                serde_json::json!({"image": "r.example/a:1", "selector": selector, "pullSecrets": ["creds"]})
            ),
            ["chosen"]
        );
    }

    #[test]
    fn an_unknown_node_fails_as_lost_and_the_job_waits_for_it() {
        let mut j =
            job(&serde_json::json!({"image": "r.example/a:1", "selector": {"names": ["gone"]}}));
        step(&mut j, &HashMap::new());
        let entry = &j.status.nodes[0];
        assert_eq!(entry.phase, NodePullPhase::Failed);
        assert!(entry.node_lost);
        assert_eq!(entry.message, "node not ready: node is not registered");
        assert!(
            j.status.completion_time.is_none(),
            "a lost node may come back"
        );
        // It registers: the work resumes at once.
        assert_eq!(step(&mut j, &nodes(&["gone"])), ["gone"]);
        assert_eq!(j.status.nodes[0].phase, NodePullPhase::Pulling);
        assert!(!j.status.nodes[0].node_lost);
    }

    #[test]
    fn the_deadline_fails_what_is_open_and_the_ttl_deletes_the_job() {
        let mut j = job(&serde_json::json!({
            "image": "r.example/a:1", "parallelism": 1,
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 60, "ttlSecondsAfterFinished": 30}
        }));
        let views = nodes(&["n1", "n2"]);
        assert_eq!(step(&mut j, &views), ["n1"]);
        let long_ago = SystemTime::now() - Duration::from_secs(61);
        j.status.start_time = Some(rfc3339(long_ago));
        let mut effects = Effects::default();
        reconcile_job(
            &key(),
            &mut j,
            &views,
            &HashMap::new(),
            false,
            &mut HashMap::new(),
            &mut effects,
        );
        let cancelled: Vec<&String> = effects
            .messages
            .iter()
            .filter(|(_, m)| matches!(m.message, Some(controller_message::Message::CancelTask(_))))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(cancelled, ["n1"], "the pull in flight is cancelled");
        assert_eq!(j.status.failed, 2);
        assert_eq!(j.status.conditions[0].reason, "DeadlineExceeded");
        assert!(
            j.status
                .message
                .starts_with("activeDeadlineSeconds exceeded"),
            "{}",
            j.status.message
        );

        // Finished 31 s ago with a TTL of 30 s: the job goes.
        let done = SystemTime::now() - Duration::from_secs(31);
        j.status.completion_time = Some(rfc3339(done));
        let mut effects = Effects::default();
        reconcile_job(
            &key(),
            &mut j,
            &views,
            &HashMap::new(),
            false,
            &mut HashMap::new(),
            &mut effects,
        );
        assert_eq!(effects.expired, [key()]);
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
        let engine = JobEngine::new(store, registry, Duration::from_secs(30));
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

    #[test]
    fn a_missing_pull_secret_fails_the_node_with_the_reason() {
        let mut j = job(&serde_json::json!({"image": "r.example/a:1", "pullSecrets": ["creds"]}));
        let mut effects = Effects::default();
        let secrets: HashMap<ObjectKey, Result<String, String>> = [(
            ObjectKey::new(secret::KIND, "default", "creds"),
            Err("does not exist".to_owned()),
        )]
        .into();
        reconcile_job(
            &key(),
            &mut j,
            &nodes(&["n1"]),
            &secrets,
            false,
            &mut HashMap::new(),
            &mut effects,
        );
        assert!(effects.messages.is_empty());
        assert_eq!(
            j.status.nodes[0].message,
            "pull secret \"creds\" does not exist"
        );
        assert!(j.status.completion_time.is_some());
    }
}
