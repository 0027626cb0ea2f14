//! A recreate's steps against fakes: a runtime that plays containerd and kubelet, and a
//! pod host that plays the pod runner. What is checked is what the recreate asks of
//! them: which containers it stops (and only those), with what grace, and what it
//! concludes. The lab's integration tests run the same paths on a real containerd.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_cri::v1::{
    Container, ContainerMetadata, ContainerState, ContainerStatus, PodSandbox, PodSandboxMetadata,
    PodSandboxState,
};
use rigger_proto::lifecycle::Cooperator;
use rigger_proto::pod::Pod;
use rigger_proto::v1 as proto;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::cri::Cri;

/// containerd as the recreate sees it; with `kubelet`, a stopped container gets its
/// next attempt at once, as kubelet would start it.
#[derive(Default)]
struct World {
    sandboxes: Vec<PodSandbox>,
    containers: Vec<(Container, ContainerStatus)>,
    stops: Vec<(String, u64)>,
    execs: Vec<(String, Vec<String>)>,
    kubelet: bool,
    /// Cancelled when a preStop runs: the controller's cancel arriving meanwhile.
    cancel_on_exec: Option<CancellationToken>,
}

impl World {
    fn add_container(&mut self, sandbox: &str, labels: &[(&str, &str)], attempt: u32) -> String {
        let id = format!("c{}", self.containers.len());
        let labels: HashMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
        let started_at = an_hour_ago
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let container = Container {
            id: id.clone(),
            pod_sandbox_id: sandbox.to_owned(),
            metadata: Some(ContainerMetadata {
                name: labels.values().next().cloned().unwrap_or_default(),
                attempt,
            }),
            labels,
            state: ContainerState::ContainerRunning as i32,
            created_at: i64::from(attempt),
            ..Container::default()
        };
        let status = ContainerStatus {
            id: id.clone(),
            state: ContainerState::ContainerRunning as i32,
            started_at: i64::try_from(started_at).unwrap(),
            ..ContainerStatus::default()
        };
        self.containers.push((container, status));
        id
    }

    fn annotate(&mut self, id: &str, key: &str, value: &str) {
        let (container, _) = self
            .containers
            .iter_mut()
            .find(|(c, _)| c.id == id)
            .unwrap();
        container
            .annotations
            .insert(key.to_owned(), value.to_owned());
    }

    fn exit(&mut self, id: &str) {
        let (container, status) = self
            .containers
            .iter_mut()
            .find(|(c, _)| c.id == id)
            .unwrap();
        container.state = ContainerState::ContainerExited as i32;
        status.state = ContainerState::ContainerExited as i32;
    }

    /// The next attempt of exited container `id`, running (and for an hour already).
    fn restart(&mut self, id: &str) {
        let Some((old, _)) = self.containers.iter().find(|(c, _)| c.id == id).cloned() else {
            return;
        };
        if old.state != ContainerState::ContainerExited as i32 {
            return;
        }
        let attempt = old.metadata.as_ref().map_or(0, |m| m.attempt) + 1;
        let labels: Vec<(String, String)> = old.labels.clone().into_iter().collect();
        let labels: Vec<(&str, &str)> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let new = self.add_container(&old.pod_sandbox_id, &labels, attempt);
        let (container, _) = self
            .containers
            .iter_mut()
            .find(|(c, _)| c.id == new)
            .unwrap();
        container.annotations = old.annotations;
    }
}

#[derive(Clone, Default)]
struct FakeRuntime(Arc<Mutex<World>>);

impl FakeRuntime {
    fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.0.lock().unwrap()
    }
}

impl Cri for FakeRuntime {
    async fn sandboxes(&self, label: &str, value: &str) -> Result<Vec<PodSandbox>, String> {
        Ok(self
            .world()
            .sandboxes
            .iter()
            .filter(|s| s.labels.get(label).map(String::as_str) == Some(value))
            .cloned()
            .collect())
    }

    async fn containers(
        &self,
        sandbox: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Container>, String> {
        Ok(self
            .world()
            .containers
            .iter()
            .map(|(c, _)| c)
            .filter(|c| sandbox.is_empty() || c.pod_sandbox_id == sandbox)
            .filter(|c| labels.iter().all(|(k, v)| c.labels.get(k) == Some(v)))
            .cloned()
            .collect())
    }

    async fn status_of(&self, id: &str) -> Result<Option<ContainerStatus>, String> {
        Ok(self
            .world()
            .containers
            .iter()
            .find(|(c, _)| c.id == id)
            .map(|(_, s)| s.clone()))
    }

    async fn stop(&self, id: &str, timeout_seconds: u64) -> Result<(), String> {
        let mut world = self.world();
        world.stops.push((id.to_owned(), timeout_seconds));
        world.exit(id);
        if world.kubelet {
            world.restart(id);
        }
        Ok(())
    }

    async fn sandbox_ip(&self, _: &str) -> Result<Option<String>, String> {
        Ok(None)
    }

    async fn exec(&self, id: &str, command: &[String], _: Duration) -> Result<i32, String> {
        let mut world = self.world();
        world.execs.push((id.to_owned(), command.to_vec()));
        if let Some(cancel) = &world.cancel_on_exec {
            cancel.cancel();
        }
        Ok(0)
    }
}

/// The pod runner: holds `pod` (if any), proves ownership of the sandboxes in `ours`,
/// and starts an exited container's next attempt when asked.
struct FakeHost {
    runtime: FakeRuntime,
    pod: Option<Pod>,
    ours: Vec<String>,
    lifecycle: Mutex<Vec<LifecycleState>>,
}

impl PodHost for FakeHost {
    fn node(&self) -> &str {
        "node-a"
    }

    fn pod(&self, uid: &str) -> Option<Pod> {
        self.pod
            .clone()
            .filter(|p| p.metadata.uid.as_deref() == Some(uid))
    }

    fn owner_of(&self, sandbox: &PodSandbox) -> Option<String> {
        let pod = self.pod.as_ref()?;
        self.ours
            .contains(&sandbox.id)
            .then(|| pod.metadata.uid.clone().unwrap_or_default())
    }

    fn labels_of(&self, _: &str) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn cooperators_of(&self, _: &str) -> Vec<Cooperator> {
        Vec::new()
    }

    fn set_lifecycle(&self, _: &str, state: LifecycleState, _: &str) {
        self.lifecycle.lock().unwrap().push(state);
    }

    fn mark_unready(&self, _: &str, _: &str) {}

    fn recreate_now(&self, container_id: &str) {
        self.runtime.world().restart(container_id);
    }

    fn container_started(&self, _: &str, _: &str, _: &str) -> Option<bool> {
        Some(true)
    }

    fn container_ready(&self, _: &str, _: &str, _: &str) -> Option<bool> {
        Some(true)
    }
}

fn host(runtime: &FakeRuntime, pod: Option<Pod>, ours: &[&str]) -> FakeHost {
    FakeHost {
        runtime: runtime.clone(),
        pod,
        ours: ours.iter().map(|s| (*s).to_owned()).collect(),
        lifecycle: Mutex::new(Vec::new()),
    }
}

fn sandbox(id: &str, labels: &[(&str, &str)], uid: &str) -> PodSandbox {
    PodSandbox {
        id: id.to_owned(),
        metadata: Some(PodSandboxMetadata {
            name: "web".to_owned(),
            uid: uid.to_owned(),
            namespace: "default".to_owned(),
            attempt: 0,
        }),
        state: PodSandboxState::SandboxReady as i32,
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..PodSandbox::default()
    }
}

fn work(uid: &str, containers: &[&str]) -> RecreateWork {
    let mut work = RecreateWork::from_proto(&proto::RecreateContainers {
        pod_uid: uid.to_owned(),
        pod_namespace: "default".to_owned(),
        pod_name: "web".to_owned(),
        containers: containers.iter().map(|c| (*c).to_owned()).collect(),
        ..proto::RecreateContainers::default()
    });
    work.force_recreate = true;
    work
}

async fn run(
    host: &FakeHost,
    runtime: &FakeRuntime,
    work: &mut RecreateWork,
    operation: Option<rigger_proto::lifecycle::Operation>,
) -> Result<String, String> {
    let save = |_: &RecreateWork| {};
    let recreate = Recreate {
        pods: host,
        runtime,
        save: &save,
        operation,
    };
    tokio::time::timeout(
        Duration::from_secs(10),
        recreate.run(work, &CancellationToken::new()),
    )
    .await
    .unwrap()
}

/// A kubelet pod `uid` with container `app` (kubelet's grace 7 s, an exec preStop).
fn kubelet_pod(runtime: &FakeRuntime, uid: &str) -> String {
    let mut world = runtime.world();
    world.kubelet = true;
    world
        .sandboxes
        .push(sandbox("s-kubelet", &[(labels::KUBELET_POD_UID, uid)], uid));
    let id = world.add_container("s-kubelet", &[(KUBELET_CONTAINER_NAME, "app")], 0);
    world.annotate(&id, KUBELET_GRACE, "7");
    world.annotate(&id, KUBELET_PRE_STOP, r#"{"exec":{"command":["/drain"]}}"#);
    id
}

#[tokio::test]
async fn a_kubelet_container_gets_its_pre_stop_one_stop_with_kubelets_grace_and_its_next_attempt_counts()
 {
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    let host = host(&runtime, None, &[]);
    let mut work = work("u1", &["app"]);
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    let world = runtime.world();
    assert_eq!(world.execs, vec![(old.clone(), vec!["/drain".to_owned()])]);
    assert_eq!(world.stops.len(), 1, "stopped once: {:?}", world.stops);
    let (stopped, grace) = &world.stops[0];
    assert_eq!(stopped, &old);
    assert!(
        (6..=7).contains(grace),
        "kubelet's grace, less the preStop: {grace}"
    );
    assert_eq!(work.containers[0].phase, Phase::Succeeded);
    assert!(work.containers[0].is_killed);
}

#[tokio::test]
async fn a_kubelet_containers_sleep_pre_stop_waits_then_stops_with_the_grace_left() {
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    runtime
        .world()
        .annotate(&old, KUBELET_PRE_STOP, r#"{"sleep":{"seconds":1}}"#);
    let host = host(&runtime, None, &[]);
    let mut work = work("u1", &["app"]);
    let began = std::time::Instant::now();
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    let world = runtime.world();
    assert!(
        world.execs.is_empty(),
        "a sleep runs nothing in the container"
    );
    let (stopped, grace) = &world.stops[0];
    assert_eq!(stopped, &old);
    assert!(began.elapsed() >= Duration::from_secs(1), "slept first");
    assert!((5..=6).contains(grace), "7 s less the sleep: {grace}");
    assert_eq!(work.containers[0].phase, Phase::Succeeded);
}

#[tokio::test]
async fn a_sleep_longer_than_the_grace_is_cut_short_and_the_stop_still_gets_two_seconds() {
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    {
        let mut world = runtime.world();
        world.annotate(&old, KUBELET_GRACE, "1");
        world.annotate(&old, KUBELET_PRE_STOP, r#"{"sleep":{"seconds":30}}"#);
    }
    let host = host(&runtime, None, &[]);
    let mut work = work("u1", &["app"]);
    let began = std::time::Instant::now();
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "bounded by the grace"
    );
    let message = &work.containers[0].message;
    assert!(
        message.contains("cut short by the grace period"),
        "{message}"
    );
    assert_eq!(runtime.world().stops, vec![(old, MIN_STOP_SECONDS)]);
}

#[tokio::test]
async fn a_sandbox_wearing_kubelets_uid_label_for_another_pod_is_left_alone() {
    let runtime = FakeRuntime::default();
    {
        let mut world = runtime.world();
        // The label says u1; the sandbox itself belongs to another pod.
        world.sandboxes.push(sandbox(
            "s-other",
            &[(labels::KUBELET_POD_UID, "u1")],
            "u-other",
        ));
        world.add_container("s-other", &[(KUBELET_CONTAINER_NAME, "app")], 0);
    }
    let host = host(&runtime, None, &[]);
    let reason = run(&host, &runtime, &mut work("u1", &["app"]), None)
        .await
        .unwrap_err();
    assert!(reason.contains("is not running on this node"), "{reason}");
    assert!(runtime.world().stops.is_empty());
}

fn agent_pod(uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 9,
            "containers": [{"name": "app", "image": "busybox"}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn a_sandbox_wearing_riggers_labels_but_not_proven_ours_is_left_alone() {
    let runtime = FakeRuntime::default();
    {
        let mut world = runtime.world();
        world
            .sandboxes
            .push(sandbox("s-forged", &[(labels::POD_UID, "u1")], "u1"));
        world.add_container("s-forged", &[(labels::CONTAINER_NAME, "app")], 0);
    }
    // The runner has pod u1 but did not create this sandbox.
    let host = host(&runtime, Some(agent_pod("u1")), &[]);
    let reason = run(&host, &runtime, &mut work("u1", &["app"]), None)
        .await
        .unwrap_err();
    assert!(reason.contains("has no running sandbox"), "{reason}");
    assert!(runtime.world().stops.is_empty());
}

#[tokio::test]
async fn an_agent_pod_container_is_stopped_with_the_pods_grace_and_restarted_by_the_runner() {
    let runtime = FakeRuntime::default();
    let old = {
        let mut world = runtime.world();
        world
            .sandboxes
            .push(sandbox("s-ours", &[(labels::POD_UID, "u1")], "u1"));
        world.add_container("s-ours", &[(labels::CONTAINER_NAME, "app")], 0)
    };
    let host = host(&runtime, Some(agent_pod("u1")), &["s-ours"]);
    let mut work = work("u1", &["app"]);
    let operation = Some(rigger_proto::lifecycle::Operation::Recreate);
    assert_eq!(
        run(&host, &runtime, &mut work, operation).await,
        Ok(String::new())
    );
    let world = runtime.world();
    assert_eq!(world.stops.len(), 1);
    assert_eq!(world.stops[0].0, old);
    assert!(
        (8..=9).contains(&world.stops[0].1),
        "the pod's grace: {:?}",
        world.stops
    );
    assert_eq!(work.containers[0].phase, Phase::Succeeded);
    assert_eq!(
        *host.lifecycle.lock().unwrap(),
        vec![LifecycleState::PreparingDelete, LifecycleState::Normal],
        "the lifecycle around the recreate"
    );
}

#[tokio::test]
async fn a_container_replaced_before_an_agent_restart_is_not_stopped_again() {
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    {
        let mut world = runtime.world();
        world.exit(&old);
        world.restart(&old);
    }
    let host = host(&runtime, None, &[]);
    let mut work = work("u1", &["app"]);
    // Saved progress: the stop was asked for, then the agent died.
    work.containers[0].phase = Phase::Recreating;
    work.containers[0].old_container_id = Some(old);
    work.containers[0].stop_issued = true;
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    assert!(
        runtime.world().stops.is_empty(),
        "the successor is never stopped"
    );
    assert_eq!(work.containers[0].phase, Phase::Succeeded);
    assert_eq!(
        work.containers[0].message,
        "stopped before the agent restarted"
    );
}

#[tokio::test]
async fn a_missing_container_fails_the_request_and_stops_nothing() {
    let runtime = FakeRuntime::default();
    kubelet_pod(&runtime, "u1");
    let host = host(&runtime, None, &[]);
    let reason = run(&host, &runtime, &mut work("u1", &["nope", "app"]), None)
        .await
        .unwrap_err();
    assert!(reason.contains("has no container \"nope\""), "{reason}");
    assert!(
        runtime.world().stops.is_empty(),
        "failurePolicy Fail: nothing else is touched"
    );
}

fn work_with(uid: &str, detail: proto::RecreateContainerDetail) -> RecreateWork {
    let mut work = RecreateWork::from_proto(&proto::RecreateContainers {
        pod_uid: uid.to_owned(),
        pod_namespace: "default".to_owned(),
        pod_name: "web".to_owned(),
        containers: vec![detail.name.clone()],
        details: vec![detail],
        ..proto::RecreateContainers::default()
    });
    work.force_recreate = true;
    work
}

#[tokio::test]
async fn the_instance_statuscontext_names_is_recreated_and_a_successor_is_left_alone() {
    // The instance the request names still runs: it is the one stopped.
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    let host = host(&runtime, None, &[]);
    let named = |id: &str| proto::RecreateContainerDetail {
        name: "app".to_owned(),
        container_id: id.to_owned(),
        ..proto::RecreateContainerDetail::default()
    };
    let mut work = work_with("u1", named(&old));
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    assert_eq!(runtime.world().stops.len(), 1);

    // It was replaced since the request was made: nothing is stopped, and the request
    // succeeds once the running one has started.
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    {
        let mut world = runtime.world();
        world.exit(&old);
        world.restart(&old);
    }
    let host = self::host(&runtime, None, &[]);
    let mut work = work_with("u1", named(&old));
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    assert!(
        runtime.world().stops.is_empty(),
        "the successor is never stopped"
    );
    assert!(runtime.world().execs.is_empty(), "nor its preStop run");
    assert_eq!(work.containers[0].phase, Phase::Succeeded);
    assert!(
        work.containers[0].message.starts_with("already recreated"),
        "{}",
        work.containers[0].message
    );
}

#[tokio::test]
async fn the_requests_pre_stop_runs_instead_of_the_containers_and_a_garbled_one_stops_nothing() {
    let runtime = FakeRuntime::default();
    let old = kubelet_pod(&runtime, "u1");
    let host = host(&runtime, None, &[]);
    let mut work = work_with(
        "u1",
        proto::RecreateContainerDetail {
            name: "app".to_owned(),
            pre_stop_json: r#"{"exec":{"command":["/flush","--fast"]}}"#.to_owned(),
            ..proto::RecreateContainerDetail::default()
        },
    );
    assert_eq!(
        run(&host, &runtime, &mut work, None).await,
        Ok(String::new())
    );
    assert_eq!(
        runtime.world().execs,
        vec![(old, vec!["/flush".to_owned(), "--fast".to_owned()])],
        "the request's hook, not kubelet's /drain"
    );

    let runtime = FakeRuntime::default();
    kubelet_pod(&runtime, "u1");
    let host = self::host(&runtime, None, &[]);
    let mut work = work_with(
        "u1",
        proto::RecreateContainerDetail {
            name: "app".to_owned(),
            pre_stop_json: "{not json".to_owned(),
            ..proto::RecreateContainerDetail::default()
        },
    );
    let reason = run(&host, &runtime, &mut work, None).await.unwrap_err();
    assert!(
        reason.contains("the request's preStop is unreadable"),
        "{reason}"
    );
    assert!(runtime.world().stops.is_empty());
}

/// A request cancelled while its first container's preStop runs (its deadline passed;
/// Kruise's e2e "recreates containers with preStopHook"): the stop begun goes on, the
/// next container is left alone.
#[tokio::test]
async fn a_request_cancelled_during_a_pre_stop_leaves_the_next_container_alone() {
    let runtime = FakeRuntime::default();
    let app = kubelet_pod(&runtime, "u1");
    {
        let mut world = runtime.world();
        let sidecar = world.add_container("s-kubelet", &[(KUBELET_CONTAINER_NAME, "sidecar")], 0);
        world.annotate(&sidecar, KUBELET_GRACE, "7");
    }
    let cancel = CancellationToken::new();
    runtime.world().cancel_on_exec = Some(cancel.clone());
    let host = host(&runtime, None, &[]);
    let mut work = work("u1", &["app", "sidecar"]);
    let save = |_: &RecreateWork| {};
    let recreate = Recreate {
        pods: &host,
        runtime: &runtime,
        save: &save,
        operation: None,
    };
    let outcome = tokio::time::timeout(Duration::from_secs(10), recreate.run(&mut work, &cancel))
        .await
        .unwrap();
    assert!(outcome.is_err(), "{outcome:?}");
    let world = runtime.world();
    let stopped: Vec<&str> = world.stops.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(stopped, [app.as_str()], "stopped after the cancel");
}
