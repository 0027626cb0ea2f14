//! Stopping a container for a recreate: its preStop hook (the pod's, or the one kubelet
//! recorded) bounded by the grace period, then StopContainer with what is left of it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use k8s_cri::v1::ContainerState;
use rigger_proto::pod::{Container, Handler};

use crate::cri::Cri;
use crate::handlers::{self, Action};

use super::kubelet_records;
use super::wait::latest_container;
use super::work::ContainerProgress;
use super::{
    DEFAULT_GRACE_SECONDS, KUBELET_GRACE, KUBELET_PORTS, KUBELET_PRE_STOP, MIN_STOP_SECONDS, Phase,
    Recreate, RecreateWork, Target,
};

impl<R: Cri> Recreate<'_, R> {
    /// preStop and stop of container `i` (nothing if it was stopped before).
    pub(super) async fn stop(
        &self,
        target: &Target,
        work: &mut RecreateWork,
        i: usize,
    ) -> Result<(), String> {
        let name = work.containers[i].name.clone();
        if work.containers[i].is_killed {
            return Ok(());
        }
        let current = latest_container(self.runtime, target, &name).await?;
        let Some(current) = current else {
            let message = format!("{} has no container {name:?}", work.what());
            let progress = &mut work.containers[i];
            progress.phase = Phase::Failed;
            progress.message = message;
            (self.save)(work);
            return Ok(());
        };
        if let Some(named) = work.containers[i].named_instance.clone()
            && work.containers[i].old_container_id.is_none()
            && named != current.id
        {
            // Kruise's statusContext: the instance the request names is gone, so the
            // container was recreated (or restarted) since; the one running is not it.
            tracing::info!(pod = %work.what(), container = %name, named = %named, running = %current.id, "the instance the request names was already replaced; not stopped");
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.old_container_id = Some(named);
            progress.is_killed = true;
            progress.message =
                "already recreated: the instance statusContext names is no longer running; the one running is not stopped".to_owned();
            (self.save)(work);
            return Ok(());
        }
        if work.containers[i].replaced_by(&current.id) {
            tracing::info!(pod = %work.what(), container = %name, successor = %current.id, "the chosen container was already replaced; its successor is not stopped");
            let progress = &mut work.containers[i];
            progress.is_killed = true;
            progress.message = if progress.stop_issued {
                "stopped before the agent restarted".to_owned()
            } else {
                "the container was replaced before it was stopped".to_owned()
            };
            (self.save)(work);
            return Ok(());
        }
        let resumed = work.containers[i].old_container_id.as_deref() == Some(current.id.as_str());
        let running = current.state == ContainerState::ContainerRunning as i32;
        if !running {
            // Already down (crashed or exiting): nothing to stop, its next attempt counts.
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.old_container_id = Some(current.id.clone());
            progress.message =
                "the container was not running; waiting for its next attempt".to_owned();
            (self.save)(work);
            if matches!(target, Target::Agent { .. }) {
                self.pods.recreate_now(&current.id);
            }
            return Ok(());
        }
        if !resumed && !work.force_recreate && !self.started(target, work, &name, &current.id) {
            // Still starting: recreating it now would only restart the wait.
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.message =
                "the container is still starting; not stopped (forceRecreate is off)".to_owned();
            progress.old_container_id = None;
            progress.is_killed = false;
            progress.stop_issued = false;
            (self.save)(work);
            return Ok(());
        }
        {
            let progress = &mut work.containers[i];
            progress.phase = Phase::Recreating;
            progress.old_container_id = Some(current.id.clone());
        }
        (self.save)(work);
        if let Target::Agent { .. } = target {
            // Registered before preStop: a hook that ends the process also gets the next
            // attempt at once.
            self.pods.recreate_now(&current.id);
        }
        let grace = u64::from(self.grace(target, work, &current));
        // The grace period runs from the first try, across agent restarts.
        let since = match work.containers[i].stopping_since {
            Some(since) if resumed => since,
            _ => {
                let now = unix_seconds();
                work.containers[i].stopping_since = Some(now);
                work.containers[i].pre_stop_done = false;
                (self.save)(work);
                now
            }
        };
        let grace_left = || grace.saturating_sub(unix_seconds().saturating_sub(since));
        let mut notes = Vec::new();
        if work.containers[i].pre_stop_done {
            notes.push("preStop ran before the agent restarted".to_owned());
        } else if resumed && grace_left() == 0 {
            notes.push(
                "preStop cut short by an agent restart; no grace left to run it again".to_owned(),
            );
        } else {
            if resumed {
                notes.push("preStop run again: an agent restart cut it short".to_owned());
            }
            match self.pre_stop(target, &work.containers[i], &current) {
                Ok(None) => {}
                Ok(Some((container, mut handler))) => {
                    if let Target::Kubelet { .. } = target {
                        self.aim_at_the_pod(&mut handler, &current.pod_sandbox_id)
                            .await;
                    }
                    let bound = Duration::from_secs(grace_left());
                    match Action::of_handler(&handler) {
                        Some(action) => {
                            match handlers::run(
                                self.runtime,
                                &container,
                                &current.id,
                                action,
                                bound,
                            )
                            .await
                            {
                                Ok(()) => {
                                    tracing::info!(pod = %work.what(), container = %name, "preStop hook ran");
                                }
                                Err(reason) => {
                                    tracing::warn!(pod = %work.what(), container = %name, %reason, "preStop hook failed; recreating anyway");
                                    notes.push(format!("preStop failed: {reason}"));
                                }
                            }
                        }
                        None => notes.push("preStop has no action; skipped".to_owned()),
                    }
                }
                Err(reason) => {
                    tracing::warn!(pod = %work.what(), container = %name, %reason, "preStop not run; recreating anyway");
                    notes.push(reason);
                }
            }
            work.containers[i].pre_stop_done = true;
            (self.save)(work);
        }
        // A stop begun before an agent restart is still under way: the container has had
        // its SIGTERM. It is waited for, within the grace left, not signalled again; past
        // the grace, StopContainer with no timeout kills it.
        let already_signalled = resumed && work.containers[i].stop_issued;
        let left = if already_signalled {
            notes.push("the stop begun before the agent restarted was waited for".to_owned());
            wait_for_exit(self.runtime, &current.id, Duration::from_secs(grace_left())).await?;
            0
        } else {
            grace_left().max(MIN_STOP_SECONDS)
        };
        work.containers[i].stop_issued = true;
        (self.save)(work);
        self.runtime
            .stop(&current.id, left)
            .await
            .map_err(|e| format!("container {name:?}: {e}"))?;
        tracing::info!(pod = %work.what(), container = %name, id = %current.id, "container stopped for recreate");
        let progress = &mut work.containers[i];
        progress.is_killed = true;
        progress.message = notes.join("; ");
        (self.save)(work);
        if let Target::Agent { .. } = target {
            self.pods.recreate_now(&current.id);
        }
        Ok(())
    }

    /// Whether a running container has started (agent pods: its startup probe and
    /// postStart passed; kubelet pods: running is all CRI tells).
    pub(super) fn started(
        &self,
        target: &Target,
        work: &RecreateWork,
        name: &str,
        id: &str,
    ) -> bool {
        match target {
            Target::Agent { pod, .. } => {
                let has_startup_probe = pod
                    .spec
                    .containers
                    .iter()
                    .any(|c| c.name == name && c.startup_probe.is_some());
                !has_startup_probe
                    || self
                        .pods
                        .container_started(&work.pod_uid, name, id)
                        .unwrap_or(false)
            }
            Target::Kubelet { .. } => true,
        }
    }

    /// The grace period: the request's, else the pod's.
    pub(super) fn grace(
        &self,
        target: &Target,
        work: &RecreateWork,
        current: &k8s_cri::v1::Container,
    ) -> u32 {
        if let Some(grace) = work.termination_grace_period_seconds {
            return grace;
        }
        match target {
            Target::Agent { pod, .. } => {
                u32::try_from(pod.spec.termination_grace_period_seconds).unwrap_or(u32::MAX)
            }
            Target::Kubelet { .. } => current
                .annotations
                .get(KUBELET_GRACE)
                .and_then(|g| g.parse().ok())
                .unwrap_or(DEFAULT_GRACE_SECONDS),
        }
    }

    /// The preStop hook to run (the request's, else the container's own) and the spec
    /// its named ports resolve against (the request's ports, else the container's).
    /// A kubelet pod's httpGet or tcpSocket hook without a host goes to the pod's IP, as
    /// kubelet sends it (the agent's own 127.0.0.1 is its pod's, not this one's). Without
    /// an IP (a pod on the host's network) it stays 127.0.0.1.
    async fn aim_at_the_pod(&self, handler: &mut Handler, sandbox: &str) {
        let wants_host = handler.http_get.as_ref().is_some_and(|h| h.host.is_none())
            || handler
                .tcp_socket
                .as_ref()
                .is_some_and(|t| t.host.is_none());
        if !wants_host {
            return;
        }
        match self.runtime.sandbox_ip(sandbox).await {
            Ok(Some(ip)) => {
                if let Some(http) = handler.http_get.as_mut() {
                    http.host.get_or_insert_with(|| ip.clone());
                }
                if let Some(tcp) = handler.tcp_socket.as_mut() {
                    tcp.host.get_or_insert(ip);
                }
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%sandbox, %error, "the pod's IP is unknown; its hook goes to 127.0.0.1");
            }
        }
    }

    pub(super) fn pre_stop(
        &self,
        target: &Target,
        progress: &ContainerProgress,
        current: &k8s_cri::v1::Container,
    ) -> Result<Option<(Container, Handler)>, String> {
        let name = progress.name.as_str();
        let own = match target {
            Target::Agent { pod, .. } => Ok(pod
                .spec
                .containers
                .iter()
                .find(|c| c.name == name)
                .map(|c| {
                    (
                        c.clone(),
                        c.lifecycle.as_ref().and_then(|l| l.pre_stop.clone()),
                    )
                })),
            Target::Kubelet { .. } => kubelet_pre_stop(name, &current.annotations)
                .map(|found| found.map(|(c, handler)| (c, Some(handler)))),
        };
        // A request's hook with no action is Kruise's copy of one it cannot represent
        // (`sleep`): the container's own runs.
        let requested = progress.pre_stop.as_ref().filter(|h| h.action_count() > 0);
        let (mut container, handler) = match (own, requested) {
            (Ok(Some((container, own_handler))), requested) => {
                (container, requested.cloned().or(own_handler))
            }
            // The container's own hook cannot be read, but the request brings one.
            (Err(_) | Ok(None), Some(requested)) => (
                Container {
                    name: name.to_owned(),
                    ..Container::default()
                },
                Some(requested.clone()),
            ),
            (Err(reason), None) => return Err(reason),
            (Ok(None), None) => return Ok(None),
        };
        if !progress.ports.is_empty() {
            container.ports.clone_from(&progress.ports);
        }
        Ok(handler.map(|handler| (container, handler)))
    }
}

/// The preStop hook kubelet recorded on a container, with its ports (for named ports).
pub(super) fn kubelet_pre_stop(
    name: &str,
    annotations: &HashMap<String, String>,
) -> Result<Option<(Container, Handler)>, String> {
    let Some(text) = annotations.get(KUBELET_PRE_STOP) else {
        return Ok(None);
    };
    let handler = kubelet_records::lifecycle_handler(text)
        .map_err(|e| format!("preStop skipped: kubelet's {KUBELET_PRE_STOP} is unreadable: {e}"))?;
    // Only a named port needs them; its own error says so when one is missing.
    let ports = match annotations.get(KUBELET_PORTS) {
        Some(text) => kubelet_records::container_ports(text).unwrap_or_else(|error| {
            tracing::warn!(container = name, %error, "kubelet's {KUBELET_PORTS} is unreadable");
            Vec::new()
        }),
        None => Vec::new(),
    };
    let container = Container {
        name: name.to_owned(),
        ports,
        ..Container::default()
    };
    Ok(Some((container, handler)))
}

/// Now, in whole seconds since the Unix epoch (persisted progress outlives the process).
pub(super) fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Until container `id` is no longer running, or `within` has passed.
pub(super) async fn wait_for_exit(
    cri: &impl Cri,
    id: &str,
    within: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let status = cri.status_of(id).await?;
        let running = status.is_some_and(|c| c.state == ContainerState::ContainerRunning as i32);
        if !running || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
