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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use rigger_proto::v1::{ControllerMessage, TaskStatus};
use tokio::sync::Notify;

mod mirror;
mod reconcile;
mod report;
mod sources;
mod state;
pub mod status;
mod tasks;

use self::reconcile::{Out, Pass, cancel, reconcile_job};
use self::state::{JobState, Now};
use crate::fleet::nodes::NodeRegistry;
use rigger_api::Object as _;
use rigger_api::image_pull_job::{ImagePullJob, ImagePullJobStatus, NodePullPhase};
use rigger_api::secret::{self, Secret};
use rigger_store::{ObjectKey, Precondition, Store, StoreError};

const TICK: Duration = Duration::from_millis(500);

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
    /// When this engine first looked at the store: when the replica began to lead (the
    /// engines run on the leader only), not when its process started — a follower that
    /// waited long takes over with no agent connected yet.
    started: std::sync::OnceLock<Instant>,
    /// What the first look at the store found: jobs started before this controller (a
    /// restart or a takeover), whose agents were connected to another life of it.
    resumed: std::sync::OnceLock<bool>,
    /// Whether the last pass was within the start (agents may be reconnecting).
    was_starting: std::sync::atomic::AtomicBool,
    state: Mutex<EngineState>,
    wake: Notify,
    /// Counts the passes that wrote the status of a job of an image list (lists add
    /// theirs up).
    statuses_written: tokio::sync::watch::Sender<u64>,
    /// Signs the peer grants tasks carry; `None`: sharing is off.
    grants: Option<Arc<rigger_proto::peer_grant::GrantSigner>>,
    /// Where each node's pull that ends is told (Kruise's events, in a cluster).
    events: Arc<dyn crate::events::EventSink>,
    /// Jobs that did not decode at the last pass, left as they are.
    undecodable: crate::engines::undecodable::Undecodable,
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

/// The event of a job that just finished: Kruise's `PullImageSucceed` when every node
/// pulled, else `PullImageFailed` naming how many failed.
fn completion_event(key: &ObjectKey, job: &JobState) -> crate::events::Event {
    let status = &job.status;
    let regarding = regarding(key, job);
    let image = &job.job.spec.image;
    if status.failed == 0 {
        crate::events::Event {
            regarding,
            warning: false,
            reason: crate::events::PULL_IMAGE_SUCCEED,
            message: format!("Image {image} pulled on all {} nodes", status.succeeded),
        }
    } else {
        crate::events::Event {
            regarding,
            warning: true,
            reason: crate::events::PULL_IMAGE_FAILED,
            message: format!(
                "Image {image} pulled on {} nodes, failed on {}{}",
                status.succeeded,
                status.failed,
                failure_reasons(status)
            ),
        }
    }
}

/// Why the first few failed nodes failed (`: n1: why; n2: why`), so that a cluster user
/// sees it with `kubectl describe` (the status has only the failed nodes' names, as
/// Kruise's).
fn failure_reasons(status: &rigger_api::image_pull_job::ImagePullJobStatus) -> String {
    const SHOWN: usize = 3;
    let failed: Vec<String> = status
        .nodes
        .iter()
        .filter(|n| n.phase == NodePullPhase::Failed)
        .take(SHOWN)
        .map(|n| format!("{}: {}", n.name, n.message))
        .collect();
    if failed.is_empty() {
        return String::new();
    }
    let more = usize::try_from(status.failed)
        .unwrap_or(usize::MAX)
        .saturating_sub(failed.len());
    let more = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    format!(": {}{more}", failed.join("; "))
}

/// Whether agents may still be reconnecting to this controller, so that no job may yet
/// complete over the nodes back so far (pure). Only within `node_timeout` of its start,
/// and then: in a cluster, until every Node's agent is connected (`all_connected`, the
/// Nodes say who is expected); elsewhere, only when it `resumed` jobs an earlier life of
/// the controller started (a new controller has no agents to wait for).
fn agents_may_be_reconnecting(within: bool, all_connected: Option<bool>, resumed: bool) -> bool {
    within
        && match all_connected {
            Some(all) => !all,
            None => resumed,
        }
}

/// The job `key` as its events' object.
fn regarding(key: &ObjectKey, job: &JobState) -> crate::events::Regarding {
    crate::events::Regarding {
        api_version: job.job.api_version.clone(),
        kind: job.job.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        uid: job.job.metadata.uid.clone().unwrap_or_default(),
    }
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
                started: std::sync::OnceLock::new(),
                was_starting: std::sync::atomic::AtomicBool::new(false),
                resumed: std::sync::OnceLock::new(),
                state: Mutex::default(),
                wake: Notify::new(),
                statuses_written: tokio::sync::watch::channel(0).0,
                grants,
                events: Arc::new(crate::events::NoEvents),
                undecodable: crate::engines::undecodable::Undecodable::default(),
            }),
        }
    }

    /// As if the engine had started at `started` (tests: past its starting window).
    #[cfg(test)]
    fn started_at(mut self, started: Instant) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.started = std::sync::OnceLock::from(started);
        }
        self
    }

    /// Tell each node's pull that ends to `events` (before the engine runs).
    #[must_use]
    pub fn with_events(mut self, events: Arc<dyn crate::events::EventSink>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.events = events;
        }
        self
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

    /// Running jobs whose `activeDeadlineSeconds` passed before `now`: a pass ends such a
    /// job at once, so one counted for minutes means the engine is stuck.
    pub fn past_deadline(&self, now: SystemTime) -> usize {
        let state = self.lock();
        state
            .jobs
            .values()
            .filter(|job| !job.finished() && reconcile::deadline(job).is_some_and(|at| at < now))
            .count()
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

    /// The status the engine holds for the job `key` whose uid is `uid`. On a Kubernetes
    /// store every status write moves the object's revision, so the object is known by
    /// its uid (a job deleted and made again has another).
    pub fn status_by_uid(&self, key: &ObjectKey, uid: &str) -> Option<ImagePullJobStatus> {
        let state = self.lock();
        let job = state.jobs.get(key)?;
        (!uid.is_empty() && job.job.metadata.uid.as_deref() == Some(uid))
            .then(|| job.status.clone())
    }

    /// Reconcile soon (a job was applied or deleted, a node came or went).
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// Told each time statuses of image lists' jobs were written.
    pub fn statuses_written(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.statuses_written.subscribe()
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
    loaded: Option<Option<(ImagePullJobStatus, status::Written)>>,
}

impl crate::engines::Engine for JobEngine {
    const NAME: &'static str = "image pull jobs";
    const TICK: Duration = TICK;
    const WATCHES: &'static [&'static str] = &[ImagePullJob::INFO.name];
    type Snapshot = JobSnapshot;

    fn wake_signal(&self) -> &Notify {
        &self.inner.wake
    }

    async fn observe(&self) -> Result<JobSnapshot, StoreError> {
        let listed = self.inner.store.list_all_objects::<ImagePullJob>().await?;
        let known: HashMap<ObjectKey, u64> = self
            .lock()
            .jobs
            .iter()
            .map(|(k, j)| (k.clone(), j.spec_revision))
            .collect();
        let mut present = HashMap::with_capacity(listed.decoded.len());
        // A job this release cannot read (a newer one wrote it) is left as it is: never
        // taken for deleted, so its pulls go on and its status stays; one already held
        // goes on as it was read last.
        let mut undecodable = listed.undecodable;
        for (key, _) in &undecodable {
            present.insert(key.clone(), known.get(key).copied().unwrap_or_default());
        }
        let mut changed = Vec::new();
        for stored in listed.decoded {
            present.insert(stored.key.clone(), stored.revision);
            if known.get(&stored.key) == Some(&stored.revision) {
                continue;
            }
            let job = stored.value;
            // Deleted, and kept only by a finalizer (Kruise's `deletion-protection`, say):
            // gone for the engine, never loaded again as a new job that pulls again.
            if job.metadata.deletion_timestamp.is_some() {
                present.remove(&stored.key);
                continue;
            }
            // A job stored before today's bounds (or written around the API) is checked
            // as an apply would check it: one bad object never reaches the engine.
            if let Err(error) = job.validate() {
                tracing::warn!(job = %stored.key, %error, "stored job is not valid; skipped");
                continue;
            }
            let loaded = match known.contains_key(&stored.key) {
                true => None,
                false => match status::read(&self.inner.store, &stored.key).await {
                    Ok(status) => Some(status),
                    // A status this release cannot read is left as it is, and its job
                    // with it: started afresh, the job would pull again and overwrite it.
                    Err(StoreError::Undecodable { detail, .. }) => {
                        undecodable.push((stored.key, format!("its status: {detail}")));
                        continue;
                    }
                    Err(error) => return Err(error),
                },
            };
            changed.push(ChangedJob {
                key: stored.key,
                revision: stored.revision,
                job,
                loaded,
            });
        }
        self.inner.undecodable.observe(
            rigger_api::fields::KRUISE_API_VERSION,
            &undecodable,
            &*self.inner.events,
        );
        self.inner.started.get_or_init(Instant::now);
        self.inner.resumed.get_or_init(|| {
            changed.iter().any(
                |c| matches!(&c.loaded, Some(Some((status, _))) if status.start_time.is_some()),
            )
        });
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
        self.flush(false).await;
    }

    /// Last statuses reach the store before the controller exits.
    async fn finish(&self) {
        self.flush(true).await;
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
                    let timeout_changed = existing.job.spec.pull_policy.timeout_seconds
                        != changed.job.spec.pull_policy.timeout_seconds;
                    existing.job = changed.job;
                    existing.spec_revision = changed.revision;
                    if timeout_changed {
                        // The pulls going on take the new limit (kruise#2221): the task
                        // again, same id, with it.
                        existing.resend_pulling();
                    }
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
                    let now = Instant::now();
                    let JobState { status, runs, .. } = &mut job_state;
                    for entry in &status.nodes {
                        let run = runs.entry(entry.name.clone()).or_default();
                        if entry.phase == NodePullPhase::Pulling {
                            run.sent_at = Some(now);
                            run.resend = true;
                        }
                        if entry.node_lost {
                            run.lost_at = Some(now);
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
        if let Err(error) = status::delete(&self.inner.store, key).await {
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
            let document = match self.inner.store.get_as::<Secret>(key.clone()).await {
                Ok(Some(secret)) => secret
                    .value
                    .docker_config()
                    .unwrap_or_else(|| Err("is empty".to_owned())),
                Ok(None) => Err("does not exist".to_owned()),
                Err(StoreError::Undecodable { detail, .. }) => {
                    Err(format!("is unreadable: {detail}"))
                }
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
        let now = SystemTime::now();
        let views = self.inner.nodes.views(now, self.inner.node_timeout);
        let secrets = HashMap::new();
        let credentials = tasks::TaskCredentials {
            secrets: &secrets,
            grants: Some(grants),
        };
        let state = self.lock();
        for job in state.jobs.values() {
            if !mirror::same_repository(&job.job.spec.image, repository, registry) {
                continue;
            }
            let sources = sources::mirror_sources(
                &job.status.nodes,
                &views,
                job.runs.get(node).map(|r| &r.suspects),
                &job.runs,
                node,
                image,
            );
            if !sources.is_empty() {
                let window = tasks::grant_window(&job.job, now, reconcile::deadline(job));
                return tasks::peer_sources(&job.job, node, &credentials, &sources, window);
            }
        }
        Vec::new()
    }

    fn reconcile(&self, secrets: &HashMap<ObjectKey, Result<String, String>>) -> Effects {
        self.reconcile_at(secrets, Now::read())
    }

    /// One pass over every job at `now`: the clock is read by the caller only.
    fn reconcile_at(
        &self,
        secrets: &HashMap<ObjectKey, Result<String, String>>,
        now: Now,
    ) -> Effects {
        // Without jobs a pass decides nothing: the fleet's views (a copy of every node's
        // labels) are not built for it — a registering fleet wakes this engine per node.
        if self.lock().jobs.is_empty() {
            return Effects::default();
        }
        // Whether the start goes on before the fleet's views: an agent that registers
        // between the two reads is then in the views of a pass that still admits it.
        let starting = agents_may_be_reconnecting(
            now.mono
                .saturating_duration_since(*self.inner.started.get_or_init(Instant::now))
                < self.inner.node_timeout,
            self.inner
                .nodes
                .cluster_nodes_connected(now.wall, self.inner.node_timeout),
            self.inner.resumed.get().copied().unwrap_or(false),
        );
        let admitting = self
            .inner
            .was_starting
            .swap(starting, std::sync::atomic::Ordering::Relaxed)
            || starting;
        let views = self.inner.nodes.views(now.wall, self.inner.node_timeout);
        let mut effects = Effects::default();
        let credentials = tasks::TaskCredentials {
            secrets,
            grants: self.inner.grants.as_deref(),
        };
        let mut state = self.lock();
        let EngineState { jobs, tasks } = &mut *state;
        let mut out = Out {
            tasks,
            effects: &mut effects,
        };
        let mut ended = Vec::new();
        for (key, job) in jobs.iter_mut() {
            let pass = Pass {
                key,
                views: &views,
                credentials: &credentials,
                starting,
                admitting,
                now,
            };
            let was_finished = job.finished();
            reconcile_job(&pass, job, &mut out);
            if !was_finished && job.finished() {
                ended.push(completion_event(key, job));
            }
        }
        drop(state);
        for event in ended {
            self.inner.events.record(event);
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

    /// Write the statuses that changed and are due ([`state::status_write_due`]); all of
    /// them when the controller stops.
    async fn flush(&self, stopping: bool) {
        let now = Instant::now();
        let dirty: Vec<(ObjectKey, ImagePullJobStatus, status::Written)> = {
            let mut state = self.lock();
            state
                .jobs
                .iter_mut()
                .filter(|(_, j)| {
                    j.dirty && state::status_write_due(j.finished(), j.written_at, now, stopping)
                })
                .map(|(key, j)| {
                    j.dirty = false;
                    j.written_at = Some(now);
                    (key.clone(), j.status.clone(), j.written.clone())
                })
                .collect()
        };
        // Image lists add up their jobs' statuses: told when one of theirs was written.
        let mut listed_written = false;
        for (key, status, mut written) in dirty {
            let result = status::write(&self.inner.store, &key, status, &mut written).await;
            let mut state = self.lock();
            let Some(job) = state.jobs.get_mut(&key) else {
                continue;
            };
            match result {
                Ok(()) => {
                    job.written = written;
                    listed_written |= job
                        .job
                        .metadata
                        .labels
                        .contains_key(rigger_api::image_pull_job::OWNER_LABEL);
                }
                Err(error) => {
                    tracing::warn!(job = %key, %error, "cannot write the job's status");
                    job.dirty = true;
                }
            }
        }
        if listed_written {
            self.inner
                .statuses_written
                .send_modify(|count| *count = count.wrapping_add(1));
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
                    job.run(node).resend = true;
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
        let before = job.entry(node).map(|entry| entry.phase);
        // Few: a node suspects only its own planned sources.
        let suspected_before = job
            .runs
            .get(node)
            .map(|run| run.suspects.clone())
            .unwrap_or_default();
        let wake = report::fold(key, job, node, status, Now::read());
        // What this report tells, if anything (most are progress: nothing, no copies).
        let failed = match (before, job.entry(node)) {
            // Each node's failure is told at once; successes in one event when the job
            // ends (one per node would write as many events as the fleet has nodes).
            (Some(before), Some(entry))
                if before != entry.phase && entry.phase == NodePullPhase::Failed =>
            {
                Some(entry.message.clone())
            }
            _ => None,
        };
        // Peers newly suspected by this node (its own planned sources only).
        let suspected: Vec<String> = job
            .runs
            .get(node)
            .map(|run| {
                run.suspects
                    .difference(&suspected_before)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let mut events = Vec::new();
        if failed.is_some() || !suspected.is_empty() {
            let regarding = regarding(key, job);
            events.extend(failed.map(|why| {
                crate::events::pull_ended(regarding.clone(), node, &job.job.spec.image, Some(&why))
            }));
            events.extend(
                suspected
                    .iter()
                    .map(|peer| crate::events::peer_suspected(regarding.clone(), node, peer)),
            );
        }
        drop(state);
        for event in events {
            self.inner.events.record(event);
        }
        if wake {
            self.wake();
        }
    }
}

#[cfg(test)]
mod tests;
