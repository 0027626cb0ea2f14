//! SidecarSet updates on the cluster's pods, on the lab's API server: a sidecar image
//! change rolls out in place within `maxUnavailable`, `partition` and `paused`; a change
//! Kubernetes cannot make in a running pod (env) is reported on the set, not dropped; a
//! hot upgrade starts the new slot, then empties the old one, and a broken new image
//! leaves the old slot serving.
//!
//! No kubelet runs here, so a stand-in plays its part the way the API server sees it
//! ([`StandInKubelet`]): it writes each pod's status — a container whose image changed
//! goes not-ready, then runs the new image (a new image ID and container ID) — as
//! kubelet would after restarting it. Running the containers through CRI would not make
//! the status any more real: writing `pods/status` is kubelet's part in either case.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rigger_integration_tests::kubernetes::{Cluster, Made};
use rigger_integration_tests::wait_until;
use serde_json::{Value, json};

/// How long a restarted container takes to run and be ready.
const RESTART: Duration = Duration::from_millis(600);

/// A pod's containers' names and images, in order.
type SpecImages = Vec<(String, String)>;
/// Each pod's spec images as they changed, by pod name.
type Histories = Arc<Mutex<HashMap<String, Vec<SpecImages>>>>;

/// One container as the stand-in runs it.
#[derive(Debug, Clone)]
struct Running {
    image: String,
    restarting_since: Option<Instant>,
    generation: u32,
}

/// kubelet's part for the pods of one namespace: their status, as kubelet writes it.
/// It also counts, at every look, the pods that are not ready or whose containers do
/// not all run their spec's image (what `maxUnavailable` bounds), and keeps the most.
struct StandInKubelet {
    stop: Arc<AtomicBool>,
    most_unavailable: Arc<AtomicUsize>,
    /// Each pod's spec images as they changed, in order.
    history: Histories,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn image_id(image: &str) -> String {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    image.hash(&mut hasher);
    format!("sha256:{:064x}", hasher.finish())
}

impl StandInKubelet {
    fn start(cluster: &'static Cluster, namespace: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let most_unavailable = Arc::new(AtomicUsize::new(0));
        let history: Histories = Arc::default();
        let thread = {
            let (stop, most, history) = (stop.clone(), most_unavailable.clone(), history.clone());
            std::thread::spawn(move || {
                let mut running: HashMap<(String, String), Running> = HashMap::new();
                let mut written: HashMap<String, Value> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let Some(pods) = cluster.get_json(&["pods", "-n", &namespace]) else {
                        continue;
                    };
                    let mut unavailable = 0;
                    for pod in pods["items"].as_array().unwrap() {
                        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
                        let spec: SpecImages = pod["spec"]["containers"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|c| {
                                (
                                    c["name"].as_str().unwrap().to_owned(),
                                    c["image"].as_str().unwrap().to_owned(),
                                )
                            })
                            .collect();
                        {
                            let mut history = history.lock().unwrap();
                            let seen = history.entry(name.clone()).or_default();
                            if seen.last() != Some(&spec) {
                                seen.push(spec.clone());
                            }
                        }
                        let mut statuses = Vec::new();
                        let mut all_ready = true;
                        let mut all_spec = true;
                        for (container, image) in &spec {
                            let state = running
                                .entry((name.clone(), container.clone()))
                                .or_insert_with(|| Running {
                                    image: image.clone(),
                                    restarting_since: None,
                                    generation: 0,
                                });
                            if state.image != *image && state.restarting_since.is_none() {
                                state.restarting_since = Some(Instant::now());
                            }
                            if let Some(since) = state.restarting_since
                                && since.elapsed() >= RESTART
                                && !image.contains("broken")
                            {
                                state.image.clone_from(image);
                                state.restarting_since = None;
                                state.generation += 1;
                            }
                            let ready = state.restarting_since.is_none();
                            all_ready &= ready;
                            all_spec &= ready && state.image == *image;
                            let container_state = if ready {
                                json!({"running": {"startedAt": "2026-11-26T00:00:00Z"}})
                            } else {
                                json!({"waiting": {"reason": "ContainerCreating"}})
                            };
                            statuses.push(json!({
                                "name": container, "image": state.image, "imageID": image_id(&state.image),
                                "containerID": format!("containerd://{name}-{container}-{}", state.generation),
                                "ready": ready, "started": ready, "restartCount": state.generation,
                                "state": container_state,
                            }));
                        }
                        if !(all_ready && all_spec) {
                            unavailable += 1;
                        }
                        let status = json!({"status": {"phase": "Running",
                            "conditions": [{"type": "Ready", "status": if all_ready { "True" } else { "False" }}],
                            "containerStatuses": statuses}});
                        if written.get(&name) != Some(&status) {
                            let out = cluster.kubectl(&[
                                "patch",
                                "pod",
                                &name,
                                "-n",
                                &namespace,
                                "--subresource",
                                "status",
                                "--type",
                                "merge",
                                "-p",
                                &status.to_string(),
                            ]);
                            if out.status.success() {
                                written.insert(name, status);
                            }
                        }
                    }
                    most.fetch_max(unavailable, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self {
            stop,
            most_unavailable,
            history,
            thread: Some(thread),
        }
    }

    fn most_unavailable(&self) -> usize {
        self.most_unavailable.load(Ordering::Relaxed)
    }

    /// The spec images pod `name` had, in order.
    fn history(&self, name: &str) -> Vec<SpecImages> {
        self.history
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for StandInKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn apply(cluster: &Cluster, yaml: &str) {
    let out = cluster.kubectl_stdin(&["apply"], yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn create_pod(cluster: &Cluster, namespace: &str, name: &str, app: &str) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}},
        "spec": {"containers": [{"name": "app", "image": "r.example/app:1"}]}});
    let out = cluster.kubectl_stdin(&["create"], &pod.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn set_status(cluster: &Cluster, set: &str) -> Value {
    cluster
        .get_json(&["sidecarset", set])
        .map(|s| s["status"].clone())
        .unwrap_or(Value::Null)
}

/// The images of container `container` across the namespace's pods.
fn images(cluster: &Cluster, namespace: &str, container: &str) -> Vec<String> {
    let pods = cluster.get_json(&["pods", "-n", namespace]).unwrap();
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|pod| {
            pod["spec"]["containers"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == container)
                .map(|c| c["image"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn wait_for_updated(cluster: &Cluster, set: &str, count: u64) {
    wait_until(
        &format!("{count} pods updated and ready"),
        Duration::from_secs(90),
        || {
            let status = set_status(cluster, set);
            (status["updatedPods"] == count && status["updatedReadyPods"] == count).then_some(())
        },
    );
}

#[test]
fn an_image_change_rolls_out_within_max_unavailable_partition_and_paused() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let namespace = cluster.namespace("sidecar-roll");
    let apps = cluster.namespace("sidecar-roll-apps");
    let dir = tempfile::tempdir().unwrap();
    let id = format!("r{}", std::process::id());
    let set = format!("roll-{id}");
    let _made = Made {
        cluster,
        objects: vec![("sidecarset".to_owned(), set.clone())],
    };
    let _controller = cluster.controller(dir.path(), &namespace.name);
    let manifest = |image: &str, strategy: &str, env: &str| {
        format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
             updateStrategy: {strategy}\n  \
             containers:\n  - name: proxy\n    image: {image}\n{env}"
        )
    };
    apply(
        cluster,
        &manifest("r.example/proxy:1", "{maxUnavailable: 2, partition: 3}", ""),
    );
    cluster.wait_for_sidecar_webhook(std::slice::from_ref(&set));
    for i in 0..10 {
        create_pod(cluster, &apps.name, &format!("web-{i}"), &set);
    }
    let kubelet = StandInKubelet::start(cluster, apps.name.clone());
    wait_for_updated(cluster, &set, 10);
    assert_eq!(set_status(cluster, &set)["matchedPods"], 10);

    // A new image: 7 pods move (partition 3), never more than 2 at once.
    apply(
        cluster,
        &manifest("r.example/proxy:2", "{maxUnavailable: 2, partition: 3}", ""),
    );
    wait_for_updated(cluster, &set, 7);
    std::thread::sleep(Duration::from_secs(3));
    let moved = |cluster: &Cluster| {
        images(cluster, &apps.name, "proxy")
            .iter()
            .filter(|i| *i == "r.example/proxy:2")
            .count()
    };
    assert_eq!(
        moved(cluster),
        7,
        "partition 3 keeps 3 pods on the old version"
    );
    assert_eq!(
        images(cluster, &apps.name, "app"),
        vec!["r.example/app:1"; 10],
        "the pods' own containers are never touched"
    );
    // Paused: nothing more moves, whatever the partition says.
    apply(
        cluster,
        &manifest(
            "r.example/proxy:2",
            "{maxUnavailable: 2, partition: 0, paused: true}",
            "",
        ),
    );
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(moved(cluster), 7, "paused");
    apply(
        cluster,
        &manifest("r.example/proxy:2", "{maxUnavailable: 2, partition: 0}", ""),
    );
    wait_for_updated(cluster, &set, 10);
    let most = kubelet.most_unavailable();
    assert!(
        most <= 2,
        "{most} pods were unavailable at once (maxUnavailable 2)"
    );
    assert!(most >= 1, "the rollout was seen");
    // Each pod the rollout moved is told in the cluster's Events, on the set.
    wait_until(
        "an event for each pod moved",
        Duration::from_secs(30),
        || {
            let events = cluster.get_json(&["events", "-A"])?;
            let told: std::collections::BTreeSet<String> = events["items"]
                .as_array()?
                .iter()
                .filter(|e| {
                    e["reason"] == "SidecarUpgraded" && e["involvedObject"]["name"] == set.as_str()
                })
                .filter_map(|e| {
                    let message = e["message"].as_str()?;
                    let pod = message.strip_prefix(&format!("Pod {}/", apps.name))?;
                    Some(pod.split(':').next()?.to_owned())
                })
                .collect();
            (told.len() == 10).then_some(())
        },
    );

    // Env only: Kubernetes cannot change it in a running pod. Reported, not dropped:
    // the pods keep their version, new pods get it.
    apply(
        cluster,
        &manifest(
            "r.example/proxy:2",
            "{maxUnavailable: 2, partition: 0}",
            "    env: [{name: LOG_LEVEL, value: debug}]\n",
        ),
    );
    let mut message = String::new();
    wait_until(
        "the set to report pods left on their version",
        Duration::from_secs(30),
        || {
            let status = set_status(cluster, &set);
            let condition = status["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "InPlaceUpdate")?
                .clone();
            (condition["status"] == "False")
                .then(|| message = condition["message"].as_str().unwrap().to_owned())
        },
    );
    assert!(message.starts_with("10 pods keep revision "), "{message}");
    assert!(message.contains("proxy: env changed"), "{message}");
    wait_until("the event", Duration::from_secs(30), || {
        let events = cluster.get_json(&["events", "-A"])?;
        events["items"]
            .as_array()?
            .iter()
            .any(|e| {
                e["reason"] == "NotUpgradablePods" && e["involvedObject"]["name"] == set.as_str()
            })
            .then_some(())
    });
    let pods = cluster.get_json(&["pods", "-n", &apps.name]).unwrap();
    for pod in pods["items"].as_array().unwrap() {
        let proxy = &pod["spec"]["containers"][0];
        assert_eq!(proxy["name"], "proxy");
        assert!(
            !proxy["env"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "LOG_LEVEL"),
            "a running pod's env is not changed"
        );
    }
    create_pod(cluster, &apps.name, "web-new", &set);
    let new = cluster
        .get_json(&["pod", "web-new", "-n", &apps.name])
        .unwrap();
    assert!(
        new["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "LOG_LEVEL"),
        "a new pod gets the change"
    );
    drop(kubelet);
}

#[test]
fn a_hot_upgrade_starts_the_new_slot_then_empties_the_old_and_a_broken_image_changes_nothing() {
    let cluster = Cluster::get();
    let _exclusive = cluster.exclusive();
    let namespace = cluster.namespace("sidecar-hot");
    let apps = cluster.namespace("sidecar-hot-apps");
    let dir = tempfile::tempdir().unwrap();
    let id = format!("h{}", std::process::id());
    let set = format!("hot-{id}");
    let _made = Made {
        cluster,
        objects: vec![("sidecarset".to_owned(), set.clone())],
    };
    let _controller = cluster.controller(dir.path(), &namespace.name);
    let manifest = |image: &str| {
        format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
             containers:\n  - name: agent\n    image: {image}\n    \
             upgradeStrategy: {{upgradeType: HotUpgrade, hotUpgradeEmptyImage: r.example/empty:1}}\n"
        )
    };
    apply(cluster, &manifest("r.example/agent:1"));
    cluster.wait_for_sidecar_webhook(std::slice::from_ref(&set));
    create_pod(cluster, &apps.name, "api", &set);
    let kubelet = StandInKubelet::start(cluster, apps.name.clone());
    wait_for_updated(cluster, &set, 1);

    apply(cluster, &manifest("r.example/agent:2"));
    wait_until("the old slot emptied", Duration::from_secs(30), || {
        let pod = cluster.get_json(&["pod", "api", "-n", &apps.name])?;
        (pod["spec"]["containers"][0]["image"] == "r.example/empty:1").then_some(())
    });
    wait_for_updated(cluster, &set, 1);
    let slots = |spec: &SpecImages| (spec[0].1.clone(), spec[1].1.clone());
    let seen: Vec<(String, String)> = kubelet.history("api").iter().map(slots).collect();
    let expected = [
        ("r.example/agent:1", "r.example/empty:1"),
        ("r.example/agent:1", "r.example/agent:2"),
        ("r.example/empty:1", "r.example/agent:2"),
    ]
    .map(|(a, b)| (a.to_owned(), b.to_owned()));
    assert_eq!(
        seen, expected,
        "the new slot starts first, the old is emptied after"
    );
    let pod = cluster.get_json(&["pod", "api", "-n", &apps.name]).unwrap();
    let working: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["kruise.io/sidecarset-working-hotupgrade-container"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(working, json!({"agent": "agent-2"}));

    // A new image that never gets ready: it goes to the idle slot and stays there; the
    // working slot keeps serving the old version.
    apply(cluster, &manifest("r.example/agent:broken"));
    wait_until(
        "the idle slot to get the new image",
        Duration::from_secs(30),
        || {
            let pod = cluster.get_json(&["pod", "api", "-n", &apps.name])?;
            (pod["spec"]["containers"][0]["image"] == "r.example/agent:broken").then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(4));
    let pod = cluster.get_json(&["pod", "api", "-n", &apps.name]).unwrap();
    assert_eq!(
        pod["spec"]["containers"][1]["image"], "r.example/agent:2",
        "the working slot keeps serving"
    );
    let status = set_status(cluster, &set);
    assert_eq!(status["updatedPods"], 0, "{status}");
    drop(kubelet);
}
