//! The controller's Prometheus series, served at `/metrics` beside `/healthz`; gauges
//! are refreshed every few seconds from the node registry and the engines. The series
//! and their labels are listed in docs/operator-guide.md (Health and metrics); a test
//! below keeps that table and this registry in step.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::jobs::JobEngine;
use crate::leader::Leadership;
use crate::nodes::NodeRegistry;
use crate::recreate_requests::RecreateEngine;

const REFRESH: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct State {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    phase: String,
}

#[derive(Debug, Default)]
pub struct ControllerMetrics {
    agents: Family<State, Gauge>,
    jobs: Family<Phase, Gauge>,
    recreates: Family<Phase, Gauge>,
    jobs_past_deadline: Gauge,
    leader: Gauge,
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
        let guide = include_str!("../../docs/operator-guide.md");
        assert_eq!(
            rigger_daemon::metrics::check_documented(&registry, guide, "rigger_controller_"),
            Ok(()),
            "docs/operator-guide.md, Health and metrics"
        );
    }
}
