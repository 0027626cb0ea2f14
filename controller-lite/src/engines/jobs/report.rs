//! An agent's report on a node's task, folded into the job: the node's phase, bytes and
//! resolved digest, a retry with back-off after a failed attempt, and the peers it
//! suspects (of its own sources only). Pure: the engine looked the task up, checked the
//! reporter owns it and read the clock.

use std::time::Duration;

use rigger_api::image_pull_job::NodePullPhase;
use rigger_proto::v1::{TaskPhase, TaskStatus};

use super::reconcile;
use super::state::{JobState, Now};
use rigger_store::ObjectKey;

/// Longest wait before a failed node's next attempt.
pub(super) const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// The wait before the attempt after `attempts` failed ones: 2 s, 4 s, … up to a minute.
pub(super) fn retry_delay(attempts: u32) -> Duration {
    Duration::from_secs(1 << attempts.min(6)).min(MAX_RETRY_DELAY)
}

/// Fold `status`, reported by `node` (the task's owner), into `job`. Whether the engine
/// should reconcile soon (a node resolved the image or finished).
pub(super) fn fold(
    key: &ObjectKey,
    job: &mut JobState,
    node: &str,
    status: TaskStatus,
    now: Now,
) -> bool {
    if job.finished()
        || job
            .entry(node)
            .is_none_or(|entry| entry.task_id != status.id)
    {
        return false; // An earlier attempt (or a node the job no longer has).
    }
    note_suspects(key, job, node, &status.suspected_peers);
    let backoff_limit = job.job.spec.pull_policy.backoff_limit;
    let phase = TaskPhase::try_from(status.phase).unwrap_or(TaskPhase::Unspecified);
    let Some(entry) = job.entry(node) else {
        return false;
    };
    // A digest is what the node says it resolved: it orders whom the others ask,
    // never what they take, and only a digest's form is accepted.
    let status_digest = if rigger_proto::peer_grant::is_sha256_digest(&status.image_digest) {
        status.image_digest.clone()
    } else {
        String::new()
    };
    let phase_before = entry.phase;
    entry.bytes_done = status.bytes_done;
    entry.bytes_total = status.bytes_total;
    let mut resolved = false;
    let mut retry_at = None;
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
        }
        TaskPhase::Succeeded => {
            entry.phase = NodePullPhase::Succeeded;
            entry.node_lost = false;
            entry.message = status.message;
            entry.image_digest = status_digest;
            entry.completion_time = Some(now.rfc3339());
        }
        TaskPhase::Failed => {
            entry.node_lost = false;
            entry.completion_time = Some(now.rfc3339());
            if entry.attempts <= backoff_limit {
                entry.phase = NodePullPhase::Waiting;
                entry.message = format!("attempt {} failed: {}", entry.attempts, status.message);
                retry_at = Some(now.mono + retry_delay(entry.attempts));
            } else {
                entry.phase = NodePullPhase::Failed;
                entry.message = status.message;
            }
        }
        TaskPhase::Unspecified => return false,
    }
    let changed_phase = entry.phase != phase_before;
    let run = job.run(node);
    if retry_at.is_some() {
        run.retry_at = retry_at;
    }
    if phase == TaskPhase::Running {
        // Running on the agent: nothing to send again.
        run.resend = false;
    }
    // The summary agrees with the nodes at every read, not only after the next pass
    // (recounted only when the node changed phase: progress reports are the many).
    if changed_phase {
        reconcile::count_nodes(&mut job.status);
        job.status.message = reconcile::progress_message(&job.status);
    }
    job.dirty = true;
    resolved || (phase != TaskPhase::Running && phase != TaskPhase::Accepted)
}

/// `node` found bytes of `suspected` wrong: those of its own planned sources are never
/// planned for it again. Bounded by the node's own sources: an agent cannot grow this
/// with names, and its word changes its own plan only.
fn note_suspects(key: &ObjectKey, job: &mut JobState, node: &str, suspected: &[String]) {
    let run = job.run(node);
    for suspect in suspected {
        if run.planned.contains(suspect) && run.suspects.insert(suspect.clone()) {
            tracing::warn!(job = %key, %node, peer = %suspect, "a peer sent bytes that did not match their digest; no longer planned as a source of this node for this job");
        }
    }
}
