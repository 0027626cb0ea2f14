//! What the engine holds of one job: the job, its status, and per node what the status
//! does not say (when its attempt went out, when it may try again, since when it is
//! lost, whom it fetches from and whom it suspects), in one struct per node.

use std::collections::{BTreeSet, HashMap};
use std::time::{Instant, SystemTime};

use rigger_api::image_pull_job::{ImagePullJob, ImagePullJobStatus, NodePullPhase, NodePullStatus};

use super::status;
use crate::fleet::nodes::NodeView;

/// The moment a pass decides at, read once by the engine and handed down: the wall
/// clock (what statuses record; deadlines and TTLs are RFC 3339 times) and the
/// monotonic one (how long a node has had: immune to the wall clock's steps). Tests
/// set it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    pub(super) wall: SystemTime,
    pub(super) mono: Instant,
}

impl Now {
    /// The clocks now: the engine's edge is the only caller.
    pub(super) fn read() -> Self {
        Self {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }

    /// The wall time, as statuses record it.
    pub(super) fn rfc3339(self) -> String {
        rigger_proto::time::rfc3339(self.wall)
    }
}

/// A node's part of a job beyond its status entry (not persisted: a controller restart
/// restarts the timers and forgets plans and suspects).
#[derive(Debug, Default)]
pub(super) struct NodeRun {
    /// When the current attempt was sent.
    pub(super) sent_at: Option<Instant>,
    /// A failed attempt's next one goes out no earlier.
    pub(super) retry_at: Option<Instant>,
    /// Since when the node counts as lost; after `timeoutSeconds` its failure is final.
    pub(super) lost_at: Option<Instant>,
    /// Its task must be sent again (the node reconnected).
    pub(super) resend: bool,
    /// It was lost with its attempt under way: back, that attempt goes on (its task sent
    /// again, which the agent answers for) instead of a new one racing the report of the
    /// task it held.
    pub(super) lost_pulling: bool,
    /// The nodes its current task fetches from.
    pub(super) planned: Vec<String>,
    /// The nodes whose bytes it found wrong, never planned as its sources for this job
    /// again. Only the reporter's plan changes: a node's word about another is not
    /// trusted for anyone else.
    pub(super) suspects: BTreeSet<String>,
}

#[derive(Debug)]
pub(super) struct JobState {
    pub(super) spec_revision: u64,
    pub(super) job: ImagePullJob,
    pub(super) status: ImagePullJobStatus,
    /// Position of each node in `status.nodes`.
    pub(super) index: HashMap<String, usize>,
    /// Per node, what the status does not hold.
    pub(super) runs: HashMap<String, NodeRun>,
    pub(super) dirty: bool,
    /// What of the status is in the store (which shards to write again).
    pub(super) written: status::Written,
    /// When the status was last written.
    pub(super) written_at: Option<Instant>,
}

/// The least time between two writes of a running job's status: the nodes' reports
/// within it are one write (each write is a request to a Kubernetes API server, and
/// one more for each node shard that changed).
pub(super) const STATUS_WRITE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a job's changed status is written now (pure): at once when it starts, ends,
/// or the controller stops (`now_anyway`); else at most every [`STATUS_WRITE_EVERY`]
/// (passes run at least every tick, so a change held back lands within one tick of it).
pub(super) fn status_write_due(
    finished: bool,
    written_at: Option<Instant>,
    now: Instant,
    now_anyway: bool,
) -> bool {
    now_anyway
        || finished
        || written_at.is_none_or(|at| now.saturating_duration_since(at) >= STATUS_WRITE_EVERY)
}

impl JobState {
    pub(super) fn new(
        spec_revision: u64,
        job: ImagePullJob,
        status: ImagePullJobStatus,
        written: status::Written,
    ) -> Self {
        let mut state = Self {
            spec_revision,
            job,
            status,
            index: HashMap::new(),
            runs: HashMap::new(),
            dirty: false,
            written,
            written_at: None,
        };
        state.reindex();
        state
    }

    pub(super) fn reindex(&mut self) {
        self.index = self
            .status
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
    }

    /// Send each node's pull still going again (same task id, the job's spec as it is
    /// now): an edit of the job that its pulls must learn.
    pub(super) fn resend_pulling(&mut self) {
        let pulling: Vec<String> = self
            .status
            .nodes
            .iter()
            .filter(|n| n.phase == NodePullPhase::Pulling)
            .map(|n| n.name.clone())
            .collect();
        for node in pulling {
            self.run(&node).resend = true;
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.status.completion_time.is_some()
    }

    pub(super) fn uid(&self) -> &str {
        self.job
            .metadata
            .uid
            .as_deref()
            .unwrap_or(&self.job.metadata.name)
    }

    pub(super) fn entry(&mut self, node: &str) -> Option<&mut NodePullStatus> {
        let i = *self.index.get(node)?;
        self.status.nodes.get_mut(i)
    }

    /// `node`'s run, made when first needed.
    pub(super) fn run(&mut self, node: &str) -> &mut NodeRun {
        self.runs.entry(node.to_owned()).or_default()
    }

    /// Whether the job wants `node`.
    pub(super) fn selects(&self, name: &str, node: &NodeView) -> bool {
        let spec = &self.job.spec;
        match (&spec.selector, &spec.pod_selector) {
            (Some(selector), _) if !selector.names.is_empty() => {
                selector.names.iter().any(|n| n == name)
            }
            // Credentials go only where an admin's labels point (crate::fleet::node_labels).
            (Some(selector), _) if !spec.pull_secrets.is_empty() => {
                selector.labels.matches(&node.credential_labels)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_jobs_status_is_written_at_most_every_second_and_its_end_at_once() {
        let start = Instant::now();
        let soon = start + std::time::Duration::from_millis(300);
        let later = start + STATUS_WRITE_EVERY;
        assert!(
            status_write_due(false, None, start, false),
            "the first write"
        );
        assert!(
            !status_write_due(false, Some(start), soon, false),
            "held back"
        );
        assert!(status_write_due(false, Some(start), later, false));
        assert!(
            status_write_due(true, Some(start), soon, false),
            "its end at once"
        );
        assert!(
            status_write_due(false, Some(start), soon, true),
            "the controller stops"
        );
    }
}
