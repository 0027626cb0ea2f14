//! The agent's Prometheus series, served at `/metrics` beside `/healthz`:
//!
//! | series | type | labels |
//! |---|---|---|
//! | `rigger_agent_pulls_total` | counter | `result`: succeeded, present, failed |
//! | `rigger_agent_pull_bytes_total` | counter | |
//! | `rigger_agent_pull_duration_seconds` | histogram | |
//! | `rigger_agent_tasks_active` | gauge | |
//! | `rigger_agent_recreates_total` | counter | `result`: succeeded, failed |
//! | `rigger_agent_recreate_duration_seconds` | histogram | |
//! | `rigger_agent_updates_total` | counter | `result`: succeeded, failed (in-place updates) |
//! | `rigger_agent_update_duration_seconds` | histogram | |
//! | `rigger_agent_controller_link_up` | gauge | 1 while registered with a controller |

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
}

fn seconds() -> Histogram {
    // 50 ms to about 7 minutes.
    Histogram::new(exponential_buckets(0.05, 2.0, 14))
}

impl AgentMetrics {
    pub fn new() -> Self {
        Self {
            pulls: Family::default(),
            pull_bytes: Counter::default(),
            pull_seconds: seconds(),
            tasks_active: Gauge::default(),
            recreates: Family::default(),
            recreate_seconds: seconds(),
            updates: Family::default(),
            update_seconds: seconds(),
            link_up: Gauge::default(),
        }
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
            "Bytes of images pulled for tasks",
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
        registry
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
