//! Running a task: a pull through the pull engine (progress counted into the task, the
//! image's digest recorded), or a container recreate (`crate::recreate`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rigger_pull::peers::{PeerSource, Peers};
use rigger_pull::{LayerBytes, Progress, ProgressEvent, PulledImage, Puller};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Phase, TaskRunner, TaskSecrets, Work};
use crate::metrics::{AgentMetrics, Outcome};
use crate::recreate::{Recreate, RecreateWork};

/// What a pull task ended with.
#[derive(Debug, Default)]
struct Pulled {
    digest: String,
    message: String,
    suspected_peers: Vec<String>,
    registry_bytes: u64,
    peer_bytes: u64,
}

/// What a pull's status says about its peers: how much they sent, and who sent bytes
/// that did not match (empty when no peer was involved).
fn from_peers(pulled: &PulledImage) -> String {
    let mut message = String::new();
    if pulled.bytes_from_peers > 0 {
        message = format!(
            "{} from peers, {} from the registry",
            bytesize::ByteSize::b(pulled.bytes_from_peers),
            bytesize::ByteSize::b(pulled.bytes_downloaded)
        );
    }
    if !pulled.suspected_peers.is_empty() {
        if !message.is_empty() {
            message.push_str("; ");
        }
        message.push_str(&format!(
            "bytes from {} did not match their digest (fetched again elsewhere)",
            pulled.suspected_peers.join(", ")
        ));
    }
    message
}

impl TaskRunner {
    pub(super) fn spawn(&self, id: &str, secrets: TaskSecrets) {
        let runner = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move { runner.run(&id, secrets).await });
    }

    #[tracing::instrument(level = "info", skip(self, secrets))]
    pub(super) async fn run(&self, id: &str, secrets: TaskSecrets) {
        let Some((work, cancel, timeout)) = self.update(id, |entry| {
            entry.record.phase = Phase::Running;
            (
                entry.record.work.clone(),
                entry.cancel.clone(),
                entry.timeout.subscribe(),
            )
        }) else {
            return;
        };
        let metrics = self.inner.metrics.clone();
        metrics.tasks_active.inc();
        let started = std::time::Instant::now();
        let work = match work {
            Work::Pull(pull) => pull,
            Work::Recreate(recreate) => {
                let succeeded = self.run_recreate(id, recreate, cancel).await;
                metrics.tasks_active.dec();
                if let Some(succeeded) = succeeded {
                    let result = if succeeded { "succeeded" } else { "failed" };
                    metrics.recreates.get_or_create(&Outcome::of(result)).inc();
                    AgentMetrics::observe(&metrics.recreate_seconds, started.elapsed());
                }
                return;
            }
        };
        // The disk guard's refusals are counted apart: an alert tells a full disk from a
        // failing registry.
        let refused_for_disk = std::sync::atomic::AtomicBool::new(false);
        let pulled = async {
            let puller = self.puller();
            if !work.always
                && let Some(digest) = self.present(puller, &work.image).await
            {
                return Ok(Pulled {
                    digest,
                    message: "already present".to_owned(),
                    ..Pulled::default()
                });
            }
            let progress: Arc<dyn Progress> = Arc::new(TaskProgress {
                runner: self.clone(),
                id: id.to_owned(),
                bytes: Mutex::default(),
            });
            let peers = self.peers(secrets.peers).await;
            let pulled = puller
                .pull_from(&work.image, &secrets.docker_configs, peers, progress)
                .await
                .map_err(|e| {
                    if e.is_disk_guard() {
                        refused_for_disk.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    e.to_string()
                })?;
            Ok::<_, String>(Pulled {
                message: from_peers(&pulled),
                digest: pulled.digest,
                suspected_peers: pulled.suspected_peers,
                registry_bytes: pulled.bytes_downloaded,
                peer_bytes: pulled.bytes_from_peers,
            })
        };
        let timed_out = time_limit(started.into(), timeout);
        let outcome = tokio::select! {
            _ = cancel.cancelled() => {
                if self.inner.shutdown.is_cancelled() {
                    // The agent is stopping: the task stays Running on disk and
                    // resumes when the agent starts again.
                    metrics.tasks_active.dec();
                    return;
                }
                Err(None)
            }
            result = pulled => result.map_err(Some),
            seconds = timed_out => Err(Some(format!(
                "timed out after {seconds}s (pullPolicy.timeoutSeconds)"
            ))),
        };
        metrics.tasks_active.dec();
        let result = match &outcome {
            Ok(pulled) if pulled.message == "already present" => "present",
            Ok(_) => "succeeded",
            Err(_) if refused_for_disk.load(std::sync::atomic::Ordering::Relaxed) => "refused_disk",
            Err(_) => "failed",
        };
        metrics.pulls.get_or_create(&Outcome::of(result)).inc();
        AgentMetrics::observe(&metrics.pull_seconds, started.elapsed());
        if let Ok(pulled) = &outcome {
            metrics.pull_bytes.inc_by(pulled.registry_bytes);
            metrics.peer_received_bytes.inc_by(pulled.peer_bytes);
            metrics
                .peer_suspects
                .inc_by(pulled.suspected_peers.len() as u64);
        }
        self.update(id, |entry| {
            match outcome {
                Ok(pulled) => {
                    entry.record.phase = Phase::Succeeded;
                    entry.record.image_digest = pulled.digest;
                    entry.record.message = pulled.message;
                    entry.record.suspected_peers = pulled.suspected_peers;
                    entry.bytes_done = entry.bytes_total;
                    tracing::info!(image = %work.image, "pull succeeded");
                }
                Err(reason) => {
                    entry.record.phase = Phase::Failed;
                    // A cancel wrote its reason already.
                    if let Some(reason) = reason {
                        entry.record.message = reason;
                    }
                    tracing::warn!(image = %work.image, reason = %entry.record.message, "pull failed");
                }
            }
            entry.record.finished_at = Some(SystemTime::now());
        });
    }

    /// `Some(succeeded)` once it ended; `None` when the agent stops first (it resumes).
    pub(super) async fn run_recreate(
        &self,
        id: &str,
        mut work: RecreateWork,
        cancel: CancellationToken,
    ) -> Option<bool> {
        let save = |progress: &RecreateWork| {
            self.update(id, |entry| {
                entry.record.work = Work::Recreate(progress.clone())
            });
        };
        let outcome = match crate::cri::connect(&self.inner.connection).await {
            Ok(runtime) => {
                let recreate = Recreate {
                    pods: &self.inner.pods,
                    runtime: &runtime,
                    save: &save,
                    operation: Some(rigger_proto::lifecycle::Operation::Recreate),
                };
                recreate.run(&mut work, &cancel).await
            }
            Err(reason) => Err(reason),
        };
        self.inner.pods.mark_ready(&work.pod_uid);
        if self.inner.shutdown.is_cancelled() {
            // The agent is stopping: the recreate resumes from its saved progress.
            return None;
        }
        let succeeded = outcome.is_ok();
        self.update(id, |entry| {
            let cancelled = entry.record.message.starts_with("cancelled: ");
            match outcome {
                Ok(summary) => {
                    entry.record.phase = Phase::Succeeded;
                    entry.record.message = summary;
                }
                Err(reason) => {
                    entry.record.phase = Phase::Failed;
                    // A cancel wrote its reason already.
                    if !cancelled {
                        entry.record.message = reason;
                    }
                    work.fail_open(&entry.record.message);
                }
            }
            tracing::info!(phase = ?entry.record.phase, message = %entry.record.message, "recreate finished");
            entry.record.work = Work::Recreate(work);
            entry.record.finished_at = Some(SystemTime::now());
        });
        Some(succeeded)
    }

    pub(super) fn progress(&self, id: &str, done: u64, total: u64) {
        let mut tasks = self.lock();
        if let Some(entry) = tasks.get_mut(id) {
            entry.bytes_done = done;
            entry.bytes_total = total;
            entry.version = self.bump();
        }
    }

    pub(super) fn resolved(&self, id: &str, digest: &str) {
        let mut tasks = self.lock();
        if let Some(entry) = tasks.get_mut(id)
            && entry.record.image_digest != digest
        {
            entry.record.image_digest = digest.to_owned();
            entry.version = self.bump();
        }
    }

    /// The node's pull engine, pulling into the tasks' namespace.
    pub(super) fn puller(&self) -> &Puller {
        &self.inner.puller
    }

    /// A client for the peers a task names; none without them, or without this node's
    /// identity (then the registry serves everything).
    async fn peers(&self, sources: Vec<PeerSource>) -> Option<Arc<Peers>> {
        if sources.is_empty() {
            return None;
        }
        let Some(identity) = &self.inner.peer_side.identity else {
            tracing::warn!(
                "the task names peers, but this node has no certificate to reach them with; using the registry"
            );
            return None;
        };
        match Peers::new(sources, identity, self.inner.peer_side.pace).await {
            Ok(peers) => Some(peers),
            Err(error) => {
                tracing::warn!(%error, "cannot reach peers; using the registry");
                None
            }
        }
    }

    /// The digest of `image` when containerd has a record of it.
    pub(super) async fn present(&self, puller: &Puller, image: &str) -> Option<String> {
        puller.image_digest(image).await
    }
}

/// Turns pull events into the task's byte counts.
struct TaskProgress {
    runner: TaskRunner,
    id: String,
    bytes: Mutex<LayerBytes>,
}

impl Progress for TaskProgress {
    fn event(&self, event: ProgressEvent) {
        if let ProgressEvent::Resolved { digest, .. } = &event {
            // Reported while pulling: the controller plans this node as a source of the
            // image's blobs as they arrive.
            self.runner.resolved(&self.id, digest);
        }
        let mut bytes = self
            .bytes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !bytes.count(&event) {
            return;
        }
        let (done, total) = (bytes.done(), bytes.total());
        drop(bytes);
        self.runner.progress(&self.id, done, total);
    }
}

impl std::fmt::Debug for TaskProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskProgress")
            .field("id", &self.id)
            .finish()
    }
}

/// Resolves when the pull started at `started` is past its time limit (seconds, 0 for
/// none), which an edit of its job may change meanwhile (kruise#2221): with the limit
/// that was passed.
async fn time_limit(started: tokio::time::Instant, mut seconds: watch::Receiver<u32>) -> u32 {
    loop {
        let limit = *seconds.borrow_and_update();
        let until = (limit > 0).then(|| started + Duration::from_secs(u64::from(limit)));
        let passed = async {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = passed => return limit,
            changed = seconds.changed() => {
                if changed.is_err() {
                    // The task's entry is gone: the last limit stays.
                    match until {
                        Some(until) => tokio::time::sleep_until(until).await,
                        None => std::future::pending().await,
                    }
                    return limit;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_pull_takes_the_time_limit_its_edited_job_brings() {
        let started = tokio::time::Instant::now();
        let (limit, seconds) = watch::channel(0);
        let waiting = tokio::spawn(time_limit(started, seconds));
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!waiting.is_finished(), "no limit: it waits");
        // Edited to 120 s: counted from the start, 20 s are left.
        limit.send_replace(120);
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert!(!waiting.is_finished());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(waiting.await.unwrap(), 120);

        // Edited to less than has passed: at once.
        let started = tokio::time::Instant::now();
        let (limit, seconds) = watch::channel(600);
        let waiting = tokio::spawn(time_limit(started, seconds));
        tokio::time::sleep(Duration::from_secs(30)).await;
        limit.send_replace(10);
        assert_eq!(waiting.await.unwrap(), 10);
    }
}
