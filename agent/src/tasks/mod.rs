//! Work the controller hands this agent: image pulls (ImagePullJobs) and container
//! recreates (ContainerRecreateRequests, run by `recreate.rs`).
//!
//! A task is persisted under `<state_dir>/tasks` the moment it is accepted, so an agent
//! restart finishes it (or reports how it ended) instead of losing it. Delivery is at
//! least once: a task id seen before is never run twice, its status is reported again.
//! Every change bumps a version the link watches; the link sends what changed since it
//! last looked, so progress is coalesced, never queued.
//!
//! Pull secrets travel with the task but are never written to disk: a persisted task
//! that needed them waits, after a restart, until the controller sends it again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use rigger_proto::v1::{self as proto, TaskPhase, task};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::AgentMetrics;
use crate::pods::PodRunner;
use crate::recreate::RecreateWork;

mod run;
use rigger_pull::Puller;
use rigger_runtime::Connection;

/// Finished tasks are kept (and reported on every reconnect) this long.
const KEEP_FINISHED: Duration = Duration::from_secs(24 * 3600);
/// How often finished tasks past [`KEEP_FINISHED`] are forgotten.
const PRUNE_INTERVAL: Duration = Duration::from_secs(600);
/// Where unreadable task records are kept, under the tasks directory.
const UNREADABLE_DIR: &str = "unreadable";

/// A finished task kept long enough.
fn is_expired(record: &TaskRecord, now: SystemTime) -> bool {
    record
        .finished_at
        .is_some_and(|at| now.duration_since(at).unwrap_or_default() > KEEP_FINISHED)
}
/// Longest task id accepted (ids become file names only through a hash).
const MAX_TASK_ID: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("task directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a task does, as persisted (without secrets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PullWork {
    image: String,
    always: bool,
    timeout_seconds: u32,
    /// It came with pull secrets: after a restart it waits for them to be sent again.
    needs_secrets: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Phase {
    Accepted,
    Running,
    Succeeded,
    Failed,
}

impl Phase {
    fn finished(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    fn to_proto(self) -> TaskPhase {
        match self {
            Self::Accepted => TaskPhase::Accepted,
            Self::Running => TaskPhase::Running,
            Self::Succeeded => TaskPhase::Succeeded,
            Self::Failed => TaskPhase::Failed,
        }
    }
}

/// What a task does: `{"pull": ...}` or `{"recreate": ...}` in its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum Work {
    Pull(PullWork),
    Recreate(RecreateWork),
}

impl Work {
    fn needs_secrets(&self) -> bool {
        matches!(self, Self::Pull(pull) if pull.needs_secrets)
    }
}

/// A task as it lives in `<state_dir>/tasks/<hash of id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TaskRecord {
    id: String,
    #[serde(flatten)]
    work: Work,
    phase: Phase,
    #[serde(default)]
    message: String,
    #[serde(default)]
    image_digest: String,
    /// Peers whose bytes did not match their digest in this pull.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    suspected_peers: Vec<String>,
    #[serde(with = "humantime_serde")]
    accepted_at: SystemTime,
    #[serde(default, with = "humantime_serde")]
    finished_at: Option<SystemTime>,
}

impl TaskRecord {
    /// `work` accepted now under `id`: nothing run, reported or finished yet.
    fn accepted(id: &str, work: Work) -> Self {
        Self {
            id: id.to_owned(),
            work,
            phase: Phase::Accepted,
            message: String::new(),
            image_digest: String::new(),
            suspected_peers: Vec::new(),
            accepted_at: SystemTime::now(),
            finished_at: None,
        }
    }
}

#[derive(Debug)]
struct Entry {
    record: TaskRecord,
    bytes_done: u64,
    bytes_total: u64,
    /// The runner's version when this entry last changed.
    version: u64,
    cancel: CancellationToken,
    /// A pull's `pullPolicy.timeoutSeconds`, which an edit of its job may change while
    /// it runs (the controller sends the task again; kruise#2221).
    timeout: watch::Sender<u32>,
}

impl Entry {
    fn status(&self) -> proto::TaskStatus {
        proto::TaskStatus {
            id: self.record.id.clone(),
            phase: self.record.phase.to_proto().into(),
            bytes_done: self.bytes_done,
            bytes_total: self.bytes_total,
            message: self.record.message.clone(),
            image_digest: self.record.image_digest.clone(),
            suspected_peers: self.record.suspected_peers.clone(),
            recreate_states: match &self.record.work {
                Work::Recreate(recreate) => recreate.states(),
                Work::Pull(_) => Vec::new(),
            },
        }
    }
}

/// What a pull task carries that is never written to disk: its pull secrets and its
/// peers' grants (a task resumed after a restart runs without them: from the registry).
#[derive(Default)]
pub(super) struct TaskSecrets {
    pub(super) docker_configs: Vec<String>,
    pub(super) peers: Vec<rigger_pull::peers::PeerSource>,
}

/// How the node's pulls take part in fleet distribution.
#[derive(Debug, Clone, Default)]
pub struct PeerSide {
    /// This node's identity for fetching from peers (an https:// controller's).
    pub identity: Option<rigger_pull::peers::PeerIdentity>,
    /// The pace peers must keep while this node fetches from them.
    pub pace: rigger_pull::peers::PeerPace,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    peer_side: PeerSide,
    /// The node's containerd connection (recreates call CRI on it).
    connection: Arc<Connection>,
    /// The node's pull engine, pulling into the tasks' namespace.
    puller: Puller,
    /// Recreates of agent-managed pods go through the pod runner.
    pods: PodRunner,
    metrics: Arc<AgentMetrics>,
    tasks: Mutex<HashMap<String, Entry>>,
    version: watch::Sender<u64>,
    shutdown: CancellationToken,
}

/// Accepts, persists, runs and reports tasks. Cheap to clone.
#[derive(Debug, Clone)]
pub struct TaskRunner {
    inner: Arc<Inner>,
}

impl TaskRunner {
    /// Load what an earlier run of the agent accepted and resume the unfinished tasks.
    pub fn start(
        state_dir: &Path,
        connection: Arc<Connection>,
        puller: Puller,
        peer_side: PeerSide,
        pods: PodRunner,
        metrics: Arc<AgentMetrics>,
        shutdown: CancellationToken,
    ) -> Result<Self, TaskError> {
        let dir = state_dir.join("tasks");
        let directory_error = |source| TaskError::Directory {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(directory_error)?;
        let runner = Self {
            inner: Arc::new(Inner {
                dir: dir.clone(),
                connection,
                peer_side,
                puller,
                pods,
                metrics,
                tasks: Mutex::new(HashMap::new()),
                version: watch::channel(0).0,
                shutdown,
            }),
        };
        let mut resume = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(directory_error)? {
            let path = entry.map_err(directory_error)?.path();
            if path.is_dir() {
                continue; // `unreadable/`
            }
            if path.extension().is_none_or(|e| e != "json") {
                // A temporary file of a write the agent did not finish.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let record = match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<TaskRecord>(&b).map_err(|e| e.to_string()))
            {
                Ok(record) => record,
                Err(error) => {
                    // Kept for a human (a crash mid-write, a format from another version):
                    // never silently gone.
                    let aside = dir
                        .join(UNREADABLE_DIR)
                        .join(path.file_name().unwrap_or_default());
                    let moved = std::fs::create_dir_all(dir.join(UNREADABLE_DIR))
                        .and_then(|()| std::fs::rename(&path, &aside));
                    tracing::error!(path = %path.display(), aside = %aside.display(), moved = moved.is_ok(), %error, "unreadable task record moved aside; its task is not resumed");
                    continue;
                }
            };
            if is_expired(&record, SystemTime::now()) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if !record.phase.finished() && !record.work.needs_secrets() {
                resume.push(record.id.clone());
            }
            runner.insert(record);
        }
        for id in resume {
            tracing::info!(task = %id, "resuming a task accepted before the agent restarted");
            runner.spawn(&id, TaskSecrets::default());
        }
        let pruner = runner.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PRUNE_INTERVAL);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = pruner.inner.shutdown.cancelled() => return,
                    _ = every.tick() => pruner.prune_finished(SystemTime::now()),
                }
            }
        });
        Ok(runner)
    }

    /// Forget finished tasks older than [`KEEP_FINISHED`], in memory and on disk.
    fn prune_finished(&self, now: SystemTime) {
        let expired: Vec<String> = self
            .lock()
            .values()
            .filter(|e| is_expired(&e.record, now))
            .map(|e| e.record.id.clone())
            .collect();
        for id in &expired {
            self.lock().remove(id);
            let path = self.path_of(id);
            if let Err(error) = std::fs::remove_file(&path)
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), %error, "cannot remove a finished task's record");
            }
        }
        if !expired.is_empty() {
            tracing::debug!(pruned = expired.len(), "finished tasks forgotten");
            self.bump();
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic elsewhere cannot leave the map half-updated: every change is one insert
        // or field write, so a poisoned lock is still consistent.
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) -> u64 {
        let mut next = 0;
        self.inner.version.send_modify(|v| {
            *v += 1;
            next = *v;
        });
        next
    }

    fn insert(&self, record: TaskRecord) {
        let version = self.bump();
        let timeout = match &record.work {
            Work::Pull(pull) => pull.timeout_seconds,
            Work::Recreate(_) => 0,
        };
        self.lock().insert(
            record.id.clone(),
            Entry {
                record,
                bytes_done: 0,
                bytes_total: 0,
                version,
                cancel: self.inner.shutdown.child_token(),
                timeout: watch::Sender::new(timeout),
            },
        );
    }

    /// The agent's metrics (the link reports its state there too).
    pub fn metrics(&self) -> &Arc<AgentMetrics> {
        &self.inner.metrics
    }

    /// Watch this to learn that some status changed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// Statuses of every task held (for the link's Register).
    pub fn all_statuses(&self) -> Vec<proto::TaskStatus> {
        let tasks = self.lock();
        let mut statuses: Vec<_> = tasks.values().map(Entry::status).collect();
        statuses.sort_by(|a, b| a.id.cmp(&b.id));
        statuses
    }

    /// Statuses that changed after `version`.
    pub fn statuses_since(&self, version: u64) -> Vec<proto::TaskStatus> {
        self.lock()
            .values()
            .filter(|e| e.version > version)
            .map(Entry::status)
            .collect()
    }

    /// Take a task from the controller. A known id is not run again; its status is
    /// reported again instead (the controller resends what it has not seen finish), and
    /// a pull still going takes the time limit it now brings (its job was edited).
    pub fn accept(&self, task: proto::Task) {
        let id = task.id;
        if id.is_empty() || id.len() > MAX_TASK_ID {
            tracing::warn!(len = id.len(), "task refused: its id is empty or too long");
            return;
        }
        let pull = match task.work {
            Some(task::Work::PullImage(pull)) => pull,
            Some(task::Work::RecreateContainers(recreate)) => {
                self.accept_recreate(&id, &recreate);
                return;
            }
            None => {
                self.refuse(
                    &id,
                    "this agent does not know the task's kind of work (upgrade it)",
                );
                return;
            }
        };
        if let Err(reason) = rigger_pull::check_reference(&pull.image) {
            self.refuse(&id, &reason);
            return;
        }
        let waiting_for_secrets = {
            let mut tasks = self.lock();
            match tasks.get_mut(&id) {
                Some(entry) => {
                    let waiting =
                        entry.record.phase == Phase::Accepted && entry.record.work.needs_secrets();
                    if !waiting {
                        entry.version = self.bump();
                        let changed = match &mut entry.record.work {
                            Work::Pull(work)
                                if !entry.record.phase.finished()
                                    && work.timeout_seconds != pull.timeout_seconds =>
                            {
                                work.timeout_seconds = pull.timeout_seconds;
                                entry.timeout.send_replace(pull.timeout_seconds);
                                Some(entry.record.clone())
                            }
                            _ => None,
                        };
                        drop(tasks);
                        if let Some(record) = changed {
                            tracing::info!(task = %id, timeout_seconds = pull.timeout_seconds, "the pull's time limit changed (pullPolicy.timeoutSeconds)");
                            self.persist(&record);
                        }
                        return;
                    }
                    true
                }
                None => false,
            }
        };
        if !waiting_for_secrets {
            let record = TaskRecord::accepted(
                &id,
                Work::Pull(PullWork {
                    image: pull.image.clone(),
                    always: pull.always,
                    timeout_seconds: pull.timeout_seconds,
                    needs_secrets: !pull.docker_configs.is_empty(),
                }),
            );
            self.persist(&record);
            tracing::info!(task = %id, image = %pull.image, "task accepted");
            self.insert(record);
        }
        let peers = pull
            .peers
            .iter()
            .map(|p| rigger_pull::peers::PeerSource {
                node: p.node.clone(),
                address: p.address.clone(),
                grant: p.grant.clone(),
            })
            .collect();
        self.spawn(
            &id,
            TaskSecrets {
                docker_configs: pull.docker_configs,
                peers,
            },
        );
    }

    /// Take a recreate; a known id is reported again, never run twice.
    fn accept_recreate(&self, id: &str, recreate: &proto::RecreateContainers) {
        if let Some(entry) = self.lock().get_mut(id) {
            entry.version = self.bump();
            return;
        }
        if recreate.pod_uid.is_empty() || recreate.containers.is_empty() {
            self.refuse(id, "a recreate needs a pod uid and at least one container");
            return;
        }
        let record = TaskRecord::accepted(id, Work::Recreate(RecreateWork::from_proto(recreate)));
        self.persist(&record);
        tracing::info!(task = %id, pod = %format!("{}/{}", recreate.pod_namespace, recreate.pod_name), containers = ?recreate.containers, "recreate accepted");
        self.insert(record);
        self.spawn(id, TaskSecrets::default());
    }

    /// A task that cannot run is recorded as failed, so the controller learns why.
    fn refuse(&self, id: &str, reason: &str) {
        tracing::warn!(task = %id, %reason, "task refused");
        let mut record = TaskRecord::accepted(
            id,
            Work::Pull(PullWork {
                image: String::new(),
                always: false,
                timeout_seconds: 0,
                needs_secrets: false,
            }),
        );
        record.phase = Phase::Failed;
        record.message = reason.to_owned();
        record.finished_at = Some(record.accepted_at);
        self.persist(&record);
        self.insert(record);
    }

    /// Stop a task; it ends as failed with `reason`.
    pub fn cancel(&self, id: &str, reason: &str) {
        if let Some(entry) = self.lock().get_mut(id)
            && !entry.record.phase.finished()
        {
            tracing::info!(task = %id, %reason, "task cancelled by the controller");
            entry.record.message = format!("cancelled: {reason}");
            entry.cancel.cancel();
        }
    }

    /// Change an entry, persist it and tell the link; `None` if the task is unknown.
    fn update<T>(&self, id: &str, change: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let (result, record) = {
            let mut tasks = self.lock();
            let entry = tasks.get_mut(id)?;
            let result = change(entry);
            entry.version = self.bump();
            (result, entry.record.clone())
        };
        self.persist(&record);
        Some(result)
    }

    fn path_of(&self, id: &str) -> PathBuf {
        let hash = sha2::Sha256::digest(id.as_bytes());
        let name: String = hex::encode(&hash[..16]);
        self.inner.dir.join(format!("{name}.json"))
    }

    /// Write the record atomically; a failure is logged: the task still runs, it only
    /// would not survive a restart.
    fn persist(&self, record: &TaskRecord) {
        let path = self.path_of(&record.id);
        if let Err(error) = rigger_daemon::durable::write_json_atomically(&path, record) {
            tracing::warn!(task = %record.id, path = %path.display(), %error, "cannot persist the task");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PullSettings;

    fn settings() -> PullSettings {
        PullSettings {
            namespace: "itest".to_owned(),
            registry_config: PathBuf::from("/nonexistent"),
            max_connections: 1,
            limit_rate: None,
            max_document_size: rigger_pull::registry::DEFAULT_MAX_DOCUMENT_SIZE,
            max_parallel_image_pulls: None,
            image_fs_threshold_percent: 100,
            write_content_directly: true,
        }
    }

    fn pull_task(id: &str, image: &str) -> proto::Task {
        proto::Task {
            id: id.to_owned(),
            node_name: "n1".to_owned(),
            work: Some(task::Work::PullImage(proto::PullImage {
                image: image.to_owned(),
                always: true,
                timeout_seconds: 5,
                docker_configs: vec!["{\"auths\":{}}".to_owned()],
                peers: Vec::new(),
            })),
        }
    }

    /// A connection to a containerd that is not there, and an engine on it.
    fn nowhere(state: &Path) -> (Arc<Connection>, Puller) {
        let connection = Arc::new(Connection::new(
            Path::new("/nonexistent.sock"),
            Duration::from_secs(1),
        ));
        let puller = Puller::new(connection.clone(), settings().pull_options(state));
        (connection, puller)
    }

    /// A pod runner with no containerd behind it (pull tasks never use it).
    fn pods(state: &Path) -> PodRunner {
        let (connection, puller) = nowhere(state);
        PodRunner::start(
            "test-node",
            state,
            connection,
            &puller,
            Arc::default(),
            CancellationToken::new(),
        )
        .unwrap()
    }

    /// A task runner on `state` with no containerd behind it.
    fn runner_in(state: &Path, token: CancellationToken) -> TaskRunner {
        let (connection, puller) = nowhere(state);
        TaskRunner::start(
            state,
            connection,
            puller,
            PeerSide::default(),
            pods(state),
            Arc::default(),
            token,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn accepted_tasks_survive_a_restart_without_their_secrets() {
        let state = tempfile::tempdir().unwrap();
        let token = CancellationToken::new();
        let runner = runner_in(state.path(), token.clone());
        runner.accept(pull_task("job-1/n1/1", "registry.example/app:1"));
        // The pull fails (no containerd); wait until it is recorded.
        let mut watch = runner.subscribe();
        loop {
            let statuses = runner.all_statuses();
            if statuses[0].phase == TaskPhase::Failed as i32 {
                assert!(
                    statuses[0].message.contains("nonexistent.sock"),
                    "{statuses:?}"
                );
                break;
            }
            watch.changed().await.unwrap();
        }
        let files: Vec<_> = std::fs::read_dir(state.path().join("tasks"))
            .unwrap()
            .collect();
        assert_eq!(files.len(), 1);
        let text = std::fs::read_to_string(files[0].as_ref().unwrap().path()).unwrap();
        assert!(!text.contains("auths"), "secrets were persisted: {text}");

        // A restarted agent knows the task and its outcome; the same id is not run again.
        token.cancel();
        let again = runner_in(state.path(), CancellationToken::new());
        let statuses = again.all_statuses();
        assert_eq!(statuses.len(), 1);
        assert_eq!(statuses[0].phase, TaskPhase::Failed as i32);
        let before = *again.subscribe().borrow();
        again.accept(pull_task("job-1/n1/1", "registry.example/app:1"));
        let resent = again.statuses_since(before);
        assert_eq!(resent.len(), 1, "a known id is reported again");
        assert_eq!(resent[0].phase, TaskPhase::Failed as i32);
    }

    #[tokio::test]
    async fn bad_tasks_are_reported_failed_with_the_reason() {
        let state = tempfile::tempdir().unwrap();
        let runner = runner_in(state.path(), CancellationToken::new());
        runner.accept(pull_task("t1", "Not A Reference"));
        runner.accept(proto::Task {
            id: "t2".to_owned(),
            node_name: "n1".to_owned(),
            work: None,
        });
        let statuses = runner.all_statuses();
        assert_eq!(statuses.len(), 2);
        assert!(statuses.iter().all(|s| s.phase == TaskPhase::Failed as i32));
        assert!(
            statuses[0].message.contains("Not A Reference"),
            "{statuses:?}"
        );
        assert!(statuses[1].message.contains("kind of work"), "{statuses:?}");
    }

    #[tokio::test]
    async fn unreadable_records_are_kept_aside_and_finished_tasks_are_pruned() {
        let state = tempfile::tempdir().unwrap();
        let tasks = state.path().join("tasks");
        std::fs::create_dir_all(&tasks).unwrap();
        std::fs::write(tasks.join("0123.json"), b"{\"id\": \"half-writ").unwrap();
        std::fs::write(tasks.join(".0123.json.Xy12.tmp"), b"{}").unwrap();
        let runner = runner_in(state.path(), CancellationToken::new());
        // The torn record is kept for a human; the temporary file of a write is gone.
        assert_eq!(
            std::fs::read(tasks.join("unreadable/0123.json")).unwrap(),
            b"{\"id\": \"half-writ"
        );
        let left: Vec<_> = std::fs::read_dir(&tasks)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["unreadable"]);

        // A finished task is forgotten once past KEEP_FINISHED, from memory and disk.
        runner.accept(pull_task("t1", "Not A Reference"));
        assert_eq!(runner.all_statuses().len(), 1);
        runner.prune_finished(SystemTime::now());
        assert_eq!(runner.all_statuses().len(), 1, "kept while recent");
        runner.prune_finished(SystemTime::now() + KEEP_FINISHED + Duration::from_secs(1));
        assert!(runner.all_statuses().is_empty());
        assert!(!runner.path_of("t1").exists());
    }
}
