//! The agent's Prometheus series, served at `/metrics` beside `/healthz`. The series
//! and their labels are listed in docs/operator-guide.md (Health and metrics); a test
//! below keeps that table and this registry in step.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub result: String,
}

impl Outcome {
    pub fn of(result: &str) -> Self {
        Self {
            result: result.to_owned(),
        }
    }
}

/// Values of `result` on `rigger_agent_pulls_total` (`refused_disk`: the disk guard
/// refused it before it downloaded).
pub const PULL_RESULTS: [&str; 4] = ["succeeded", "present", "failed", "refused_disk"];
/// Values of `result` on the recreate and update counters.
pub const OPERATION_RESULTS: [&str; 2] = ["succeeded", "failed"];
/// Values of `result` on `rigger_agent_peer_requests_total`: a blob served, a request
/// refused (no or a bad grant, another node's certificate), or a blob not held here
/// (or not reached by the grant).
pub const PEER_RESULTS: [&str; 3] = ["served", "refused", "missing"];
/// Values of `result` on `rigger_agent_mirror_requests_total`: served from peers, or
/// not (containerd then asks the registry).
pub const MIRROR_RESULTS: [&str; 2] = ["served", "missing"];

/// A filesystem containerd keeps images on, by the directory it was measured at.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Filesystem {
    pub filesystem: String,
}

type Ratio = Gauge<f64, std::sync::atomic::AtomicU64>;

#[derive(Debug)]
pub struct AgentMetrics {
    pub pulls: Family<Outcome, Counter>,
    pub pull_bytes: Counter,
    pub pull_seconds: Histogram,
    pub tasks_active: Gauge,
    pub recreates: Family<Outcome, Counter>,
    pub recreate_seconds: Histogram,
    pub updates: Family<Outcome, Counter>,
    pub update_seconds: Histogram,
    pub link_up: Gauge,
    pub peer_requests: Family<Outcome, Counter>,
    pub peer_served_bytes: Counter,
    pub peer_received_bytes: Counter,
    pub peer_suspects: Counter,
    pub mirror_requests: Family<Outcome, Counter>,
    pub mirror_bytes: Counter,
    pub image_fs_used: Family<Filesystem, Ratio>,
    pub image_fs_threshold: Ratio,
}

fn seconds() -> Histogram {
    // 50 ms to about 7 minutes.
    Histogram::new(exponential_buckets(0.05, 2.0, 14))
}

impl AgentMetrics {
    pub fn new() -> Self {
        let metrics = Self {
            pulls: Family::default(),
            pull_bytes: Counter::default(),
            pull_seconds: seconds(),
            tasks_active: Gauge::default(),
            recreates: Family::default(),
            recreate_seconds: seconds(),
            updates: Family::default(),
            update_seconds: seconds(),
            link_up: Gauge::default(),
            peer_requests: Family::default(),
            peer_served_bytes: Counter::default(),
            peer_received_bytes: Counter::default(),
            peer_suspects: Counter::default(),
            mirror_requests: Family::default(),
            mirror_bytes: Counter::default(),
            image_fs_used: Family::default(),
            image_fs_threshold: Ratio::default(),
        };
        // Every documented label value is served from the start (at 0), so rates and
        // alerts work before the first failure.
        for result in PULL_RESULTS {
            let _ = metrics.pulls.get_or_create(&Outcome::of(result));
        }
        for result in OPERATION_RESULTS {
            let _ = metrics.recreates.get_or_create(&Outcome::of(result));
            let _ = metrics.updates.get_or_create(&Outcome::of(result));
        }
        for result in PEER_RESULTS {
            let _ = metrics.peer_requests.get_or_create(&Outcome::of(result));
        }
        for result in MIRROR_RESULTS {
            let _ = metrics.mirror_requests.get_or_create(&Outcome::of(result));
        }
        metrics
    }

    /// A registry holding every series, for `/metrics`.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut registry = Registry::with_prefix("rigger_agent");
        registry.register(
            "pulls",
            "Image pulls run for tasks, by result",
            self.pulls.clone(),
        );
        registry.register(
            "pull_bytes",
            "Bytes of images downloaded from registries for tasks",
            self.pull_bytes.clone(),
        );
        registry.register(
            "pull_duration_seconds",
            "Time a pull task took",
            self.pull_seconds.clone(),
        );
        registry.register(
            "tasks_active",
            "Tasks running now",
            self.tasks_active.clone(),
        );
        registry.register(
            "recreates",
            "Container recreate requests run, by result",
            self.recreates.clone(),
        );
        registry.register(
            "recreate_duration_seconds",
            "Time a recreate request took",
            self.recreate_seconds.clone(),
        );
        registry.register(
            "updates",
            "In-place updates of pods, by result",
            self.updates.clone(),
        );
        registry.register(
            "update_duration_seconds",
            "Time an in-place update took",
            self.update_seconds.clone(),
        );
        registry.register(
            "controller_link_up",
            "1 while registered with a controller",
            self.link_up.clone(),
        );
        registry.register(
            "peer_requests",
            "Requests from other nodes for blobs, by result",
            self.peer_requests.clone(),
        );
        registry.register(
            "peer_served_bytes",
            "Bytes of blobs served to other nodes",
            self.peer_served_bytes.clone(),
        );
        registry.register(
            "peer_received_bytes",
            "Bytes of blobs received from other nodes for tasks",
            self.peer_received_bytes.clone(),
        );
        registry.register(
            "peer_suspects",
            "Peers whose bytes did not match their digest, per pull",
            self.peer_suspects.clone(),
        );
        registry.register(
            "mirror_requests",
            "Requests of the node's containerd to the registry mirror, by result",
            self.mirror_requests.clone(),
        );
        registry.register(
            "mirror_bytes",
            "Bytes the registry mirror served containerd from other nodes",
            self.mirror_bytes.clone(),
        );
        registry.register(
            "image_fs_used_ratio",
            "Used / size of each filesystem containerd keeps images on, as kubelet counts it",
            self.image_fs_used.clone(),
        );
        registry.register(
            "image_fs_threshold_ratio",
            "The disk guard's threshold / 100",
            self.image_fs_threshold.clone(),
        );
        registry
    }

    /// Set the image filesystem gauges from what `puller` measures now; how many
    /// filesystems were measured (none while containerd cannot say where they are).
    pub async fn measure_image_filesystems(&self, puller: &rigger_pull::Puller) -> usize {
        let measured = puller.image_filesystems().await;
        // A filesystem no longer measured (moved, unreadable) is not reported stale.
        self.image_fs_used.clear();
        for (dir, ratio) in &measured {
            self.image_fs_used
                .get_or_create(&Filesystem {
                    filesystem: dir.display().to_string(),
                })
                .set(*ratio);
        }
        let percent = puller.image_fs_threshold_percent().unwrap_or(100);
        self.image_fs_threshold.set(f64::from(percent) / 100.0);
        measured.len()
    }

    pub fn observe(histogram: &Histogram, took: Duration) {
        histogram.observe(took.as_secs_f64());
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_guide_lists_every_series() {
        let metrics = Arc::new(AgentMetrics::new());
        // Served once a filesystem was measured (containerd says where they are).
        let _ = metrics.image_fs_used.get_or_create(&Filesystem {
            filesystem: "/var/lib/containerd".to_owned(),
        });
        let registry = metrics.registry();
        let guide = include_str!("../../docs/operator-guide.md");
        assert_eq!(
            rigger_daemon::metrics::check_documented(&registry, guide, "rigger_agent_"),
            Ok(()),
            "docs/operator-guide.md, Health and metrics"
        );
    }
}
