//! The controller's Prometheus series, served at `/metrics` beside `/healthz`; gauges
//! are refreshed every few seconds from the node registry and the engines. The series
//! and their labels are listed in docs/operator-guide.md (Health and metrics); a test
//! below keeps that table and this registry in step.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::engines::jobs::JobEngine;
use crate::engines::recreate_requests::RecreateEngine;
use crate::fleet::nodes::NodeRegistry;
use rigger_store::Leadership;

const REFRESH: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    phase: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Answer {
    answer: &'static str,
}

/// How the sidecar webhook answered a review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewAnswer {
    /// Admitted, with or without sidecars.
    Allowed,
    /// Refused (the SidecarSets cannot be read, or a set Rigger cannot use).
    Denied,
    /// No review answer: a request that is not a review, too big, or too slow.
    Error,
}

impl ReviewAnswer {
    const ALL: [Self; 3] = [Self::Allowed, Self::Denied, Self::Error];

    fn label(self) -> Answer {
        Answer {
            answer: match self {
                Self::Allowed => "allowed",
                Self::Denied => "denied",
                Self::Error => "error",
            },
        }
    }
}

/// The webhook's own time per review, from its headers read to its answer built: set
/// beside the API server's `apiserver_admission_webhook_admission_duration_seconds`, it
/// tells the webhook's time from the network's and the API server's.
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    reviews: Family<Answer, Histogram>,
}

fn review_histogram() -> Histogram {
    // 0.5 ms to 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        let reviews = Family::new_with_constructor(review_histogram as fn() -> Histogram);
        // Every documented label value is served from the start.
        for answer in ReviewAnswer::ALL {
            let _ = reviews.get_or_create(&answer.label());
        }
        Self { reviews }
    }
}

impl WebhookMetrics {
    pub fn observe(&self, answer: ReviewAnswer, took: Duration) {
        self.reviews
            .get_or_create(&answer.label())
            .observe(took.as_secs_f64());
    }
}

#[derive(Debug, Default)]
pub struct ControllerMetrics {
    agents: Family<State, Gauge>,
    jobs: Family<Phase, Gauge>,
    recreates: Family<Phase, Gauge>,
    jobs_past_deadline: Gauge,
    leader: Gauge,
    /// The sidecar webhook's (a cluster's replicas serve it).
    pub webhook: WebhookMetrics,
}

/// What the gauges are read from.
#[derive(Debug, Clone)]
pub struct Sources {
    pub nodes: NodeRegistry,
    pub jobs: JobEngine,
    pub recreates: RecreateEngine,
    pub leadership: Leadership,
    pub node_timeout: Duration,
}

impl ControllerMetrics {
    pub fn registry(self: &Arc<Self>) -> Registry {
        // Every documented label value is served from the start (at 0).
        for state in ["ready", "not_ready"] {
            let _ = self.agents.get_or_create(&State {
                state: state.to_owned(),
            });
        }
        for phase in ["running", "completed"] {
            let _ = self.jobs.get_or_create(&Phase {
                phase: phase.to_owned(),
            });
        }
        for phase in ["pending", "recreating", "completed"] {
            let _ = self.recreates.get_or_create(&Phase {
                phase: phase.to_owned(),
            });
        }
        let mut registry = Registry::with_prefix("rigger_controller");
        registry.register("agents", "Agents known, by readiness", self.agents.clone());
        registry.register(
            "image_pull_jobs",
            "ImagePullJobs, by phase",
            self.jobs.clone(),
        );
        registry.register(
            "image_pull_jobs_past_deadline",
            "Running ImagePullJobs past their activeDeadlineSeconds (the engine ends them at once)",
            self.jobs_past_deadline.clone(),
        );
        registry.register(
            "recreate_requests",
            "ContainerRecreateRequests, by phase",
            self.recreates.clone(),
        );
        registry.register("leader", "1 on the replica that leads", self.leader.clone());
        registry.register(
            "webhook_review_duration_seconds",
            "The sidecar webhook's time per review, headers read to answer built, by answer",
            self.webhook.reviews.clone(),
        );
        registry
    }

    fn refresh(&self, sources: &Sources) {
        let views = sources
            .nodes
            .readiness(SystemTime::now(), sources.node_timeout);
        let ready = views
            .values()
            .filter(|not_ready| not_ready.is_none())
            .count();
        set(
            &self.agents,
            &State {
                state: "ready".to_owned(),
            },
            ready,
        );
        set(
            &self.agents,
            &State {
                state: "not_ready".to_owned(),
            },
            views.len() - ready,
        );
        for (phase, count) in sources.jobs.phase_counts() {
            set(
                &self.jobs,
                &Phase {
                    phase: phase.to_owned(),
                },
                count,
            );
        }
        self.jobs_past_deadline
            .set(i64::try_from(sources.jobs.past_deadline(SystemTime::now())).unwrap_or(i64::MAX));
        for (phase, count) in sources.recreates.phase_counts() {
            set(
                &self.recreates,
                &Phase {
                    phase: phase.to_owned(),
                },
                count,
            );
        }
        self.leader.set(i64::from(sources.leadership.is_leader()));
    }

    /// Refresh the gauges until `token` is cancelled.
    pub async fn run(self: Arc<Self>, sources: Sources, token: CancellationToken) {
        loop {
            self.refresh(&sources);
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(REFRESH) => {}
            }
        }
    }
}

fn set<L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug>(
    family: &Family<L, Gauge>,
    labels: &L,
    count: usize,
) {
    family
        .get_or_create(labels)
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_guide_lists_every_series() {
        let registry = Arc::new(ControllerMetrics::default()).registry();
        let guide = include_str!("../../../docs/operator-guide.md");
        assert_eq!(
            rigger_daemon::metrics::check_documented(&registry, guide, "rigger_controller_"),
            Ok(()),
            "docs/operator-guide.md, Health and metrics"
        );
    }
}
