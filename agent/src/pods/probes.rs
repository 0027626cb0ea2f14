//! Probes (startup, liveness, readiness), run from the reconcile loop as kubelet does.

use std::time::{Duration, SystemTime};

use k8s_cri::v1::StopContainerRequest;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use rigger_proto::pod::{Container, Pod};
use tonic::transport::Channel;

use super::{PodRunner, lock};
use crate::handlers::{self, Action};

impl PodRunner {
    /// Run the container's probes that are due; (started, ready). A liveness (or
    /// startup) probe past its failure threshold stops the container, and the restart
    /// policy takes it from there.
    pub(super) async fn probe(
        &self,
        cri: &mut RuntimeServiceClient<Channel>,
        pod: &Pod,
        container: &Container,
        status: &k8s_cri::v1::ContainerStatus,
    ) -> Result<(bool, bool), tonic::Status> {
        let started_at = SystemTime::UNIX_EPOCH
            + Duration::from_nanos(u64::try_from(status.started_at).unwrap_or(0));
        let running_for = SystemTime::now()
            .duration_since(started_at)
            .unwrap_or_default();
        let probes = [
            ("startup", container.startup_probe.as_ref()),
            ("liveness", container.liveness_probe.as_ref()),
            ("readiness", container.readiness_probe.as_ref()),
        ];
        let mut kill: Option<String> = None;
        for (kind, probe) in probes {
            let Some(probe) = probe else { continue };
            let Some(action) = Action::of_probe(probe) else {
                continue;
            };
            let period = Duration::from_secs(u64::from(probe.period_seconds.unwrap_or(10)));
            let due = {
                let mut states = lock(&self.inner.probes);
                let state = states.entry(status.id.clone()).or_default();
                // Liveness and readiness wait for the startup probe; it stops once passed.
                let waiting =
                    kind != "startup" && container.startup_probe.is_some() && !state.started;
                let passed = kind == "startup" && state.started;
                if waiting || passed {
                    false
                } else {
                    running_for >= Duration::from_secs(u64::from(probe.initial_delay_seconds))
                        && state
                            .last_run
                            .get(kind)
                            .is_none_or(|at| at.elapsed() >= period)
                }
            };
            if !due {
                continue;
            }
            let timeout = Duration::from_secs(u64::from(probe.timeout_seconds.unwrap_or(1)));
            let outcome = handlers::run(cri, container, &status.id, action, timeout).await;
            let failure_threshold = probe.failure_threshold.unwrap_or(3);
            let mut states = lock(&self.inner.probes);
            let state = states.entry(status.id.clone()).or_default();
            state.last_run.insert(kind, std::time::Instant::now());
            match (kind, outcome) {
                ("startup", Ok(())) => state.started = true,
                ("startup", Err(reason)) => {
                    state.startup_failures += 1;
                    if state.startup_failures >= failure_threshold {
                        kill = Some(format!("startup probe failed: {reason}"));
                    }
                }
                ("liveness", Ok(())) => state.liveness_failures = 0,
                ("liveness", Err(reason)) => {
                    state.liveness_failures += 1;
                    if state.liveness_failures >= failure_threshold {
                        kill = Some(format!("liveness probe failed: {reason}"));
                    }
                }
                (_, Ok(())) => {
                    state.failures = 0;
                    state.successes += 1;
                    if state.successes >= probe.success_threshold.unwrap_or(1) {
                        state.ready = true;
                    }
                }
                (_, Err(reason)) => {
                    state.successes = 0;
                    state.failures += 1;
                    if state.failures >= failure_threshold && state.ready {
                        tracing::info!(pod = %pod.metadata.name, container = %container.name, %reason, "readiness probe failed; not ready");
                        state.ready = false;
                    }
                }
            }
        }
        if let Some(reason) = kill {
            tracing::warn!(pod = %pod.metadata.name, container = %container.name, %reason, "stopping the container");
            lock(&self.inner.probes).remove(&status.id);
            cri.stop_container(StopContainerRequest {
                container_id: status.id.clone(),
                timeout: i64::try_from(pod.spec.termination_grace_period_seconds).unwrap_or(30),
            })
            .await?;
            return Ok((false, false));
        }
        let states = lock(&self.inner.probes);
        let state = states.get(&status.id);
        let started = container.startup_probe.is_none() || state.is_some_and(|s| s.started);
        let ready =
            started && (container.readiness_probe.is_none() || state.is_some_and(|s| s.ready));
        Ok((started, ready))
    }
}
