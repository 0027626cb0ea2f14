//! SidecarSets on the lab's real cluster: the API server calls Rigger's webhook through
//! its Service, kubelet starts what it injected and restarts what a rollout changed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rigger_integration_tests::real_cluster::{ClusterNamespace, DeletedOnDrop, RealCluster};
use rigger_integration_tests::{lab_image, wait_until};
use serde_json::Value;

const IDLE: &str = "[sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']";

fn pods(cluster: &RealCluster, ns: &ClusterNamespace, app: &str) -> Vec<Value> {
    cluster
        .get_json(&["pods", "-n", &ns.name, "-l", &format!("app={app}")])
        .map(|list| list["items"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
}

fn status<'a>(pod: &'a Value, container: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The webhook's entry reaches the API server a moment after its set: of `pods`, those
/// not `injected` (made before it) are deleted, as a user would, and their ReplicaSet
/// makes them again. Whether any of them was not already going.
fn replace_uninjected(
    cluster: &RealCluster,
    ns: &ClusterNamespace,
    pods: &[Value],
    injected: impl Fn(&Value) -> bool,
) -> bool {
    let mut replaced = false;
    for pod in pods.iter().filter(|p| !injected(p)) {
        replaced |= pod["metadata"]["deletionTimestamp"].is_null();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let _ = cluster.kubectl(&["-n", &ns.name, "delete", "pod", name, "--wait=false"]);
    }
    replaced
}

fn deployment(ns: &ClusterNamespace, app: &str, replicas: u32, busybox: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {app}, namespace: {ns}}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {app}}}}}\n  template:\n    \
         metadata: {{labels: {{app: {app}}}}}\n    spec:\n      terminationGracePeriodSeconds: 2\n      \
         containers:\n      - name: app\n        image: {busybox}\n        command: {IDLE}\n",
        ns = ns.name
    )
}

/// Each pod's uid and its `app` container's ID.
fn app_container_ids(pods: &[Value]) -> Vec<(String, Value)> {
    pods.iter()
        .map(|p| {
            (
                p["metadata"]["uid"].as_str().unwrap().to_owned(),
                status(p, "app").unwrap()["containerID"].clone(),
            )
        })
        .collect()
}

/// `pod` is one of those `app_ids` were read from (updated in place, not replaced), and
/// its `app` container was not restarted.
fn assert_app_kept(pod: &Value, app_ids: &[(String, Value)]) {
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let (_, app_id) = app_ids
        .iter()
        .find(|(u, _)| u == uid)
        .unwrap_or_else(|| panic!("pod {uid} was replaced, not updated in place"));
    assert_eq!(
        &status(pod, "app").unwrap()["containerID"],
        app_id,
        "the app container was restarted"
    );
}

/// Scenario 3: a Deployment's pods get the sidecar from the webhook, through its Service;
/// an image change rolls out in place — kubelet restarts only the sidecar, the app
/// container's ID unchanged, never more than `maxUnavailable` pods not Ready at once.
#[test]
fn injected_sidecars_roll_in_place_within_max_unavailable() {
    let cluster = RealCluster::get();
    lab_image(&["sidecar"]);
    let ns = cluster.namespace("roll");
    let set = format!("roll-{}", std::process::id());
    let _guard = DeletedOnDrop(cluster, "sidecarset", set.clone());
    let manifest = |version: u32| {
        format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
             updateStrategy: {{maxUnavailable: 2}}\n  containers:\n  - name: proxy\n    \
             image: {image}\n    command: [/usr/local/bin/rigger-lab-sidecar, --port, '8080']\n    \
             readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}\n",
            image = cluster.image(&format!("rigger-lab/sidecar:{version}"))
        )
    };
    cluster.apply(&manifest(1));
    let busybox = cluster.image("rigger-lab/busybox:1");
    // The webhook's entry reaches the API server a moment after the set: the Deployment's
    // ReplicaSet retries pods the webhook refused or missed until they carry the sidecar.
    cluster.apply(&deployment(&ns, &set, 5, &busybox));
    let before = wait_until(
        "five pods with the sidecar, Ready",
        Duration::from_secs(180),
        || {
            let pods = pods(cluster, &ns, &set);
            let injected = pods
                .iter()
                .filter(|p| status(p, "proxy").is_some() && ready(p))
                .count();
            if replace_uninjected(cluster, &ns, &pods, |p| status(p, "proxy").is_some()) {
                return None;
            }
            (injected == 5 && pods.len() == 5).then_some(pods)
        },
    );
    let app_ids = app_container_ids(&before);

    cluster.apply(&manifest(2));
    let new_image = cluster.image("rigger-lab/sidecar:2");
    let mut most_unready = 0;
    let after = wait_until(
        "every sidecar on version 2",
        Duration::from_secs(240),
        || {
            let pods = pods(cluster, &ns, &set);
            most_unready = most_unready.max(pods.iter().filter(|p| !ready(p)).count());
            pods.iter()
                .all(|p| {
                    status(p, "proxy")
                        .is_some_and(|c| c["image"] == new_image.as_str() && c["ready"] == true)
                })
                .then_some(pods)
        },
    );
    assert!(
        most_unready <= 2,
        "{most_unready} pods were not Ready at once (maxUnavailable 2)"
    );
    for pod in &after {
        assert_app_kept(pod, &app_ids);
        assert_eq!(status(pod, "proxy").unwrap()["restartCount"], 1, "{pod}");
    }
}

/// Scenario 3, hot upgrade: a sidecar upgraded with `HotUpgrade` under a real kubelet
/// serves an HTTP load through the upgrade with no failed request, and answers from the
/// new version after.
#[test]
fn a_hot_upgrade_under_load_fails_no_request() {
    let cluster = RealCluster::get();
    lab_image(&["sidecar"]);
    let ns = cluster.namespace("hot");
    let set = format!("hot-{}", std::process::id());
    let _guard = DeletedOnDrop(cluster, "sidecarset", set.clone());
    let manifest = |version: u32| {
        format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  containers:\n  - name: proxy\n    \
             image: {image}\n    command: [/usr/local/bin/rigger-lab-sidecar, --port, '8080']\n    \
             lifecycle: {{postStart: {{exec: {{command: [sh, -c, 'until [ -e /tmp/listening ]; do sleep 0.02; done']}}}}}}\n    \
             upgradeStrategy: {{upgradeType: HotUpgrade, hotUpgradeEmptyImage: {empty}}}\n",
            image = cluster.image(&format!("rigger-lab/sidecar:{version}")),
            empty = cluster.image("rigger-lab/sidecar-empty:1"),
        )
    };
    cluster.apply(&manifest(1));
    let busybox = cluster.image("rigger-lab/busybox:1");
    cluster.apply(&deployment(&ns, &set, 1, &busybox));
    let pod = wait_until(
        "the pod with its sidecar, serving",
        Duration::from_secs(180),
        || {
            let pods = pods(cluster, &ns, &set);
            replace_uninjected(cluster, &ns, &pods, |p| {
                p["spec"]["containers"]
                    .as_array()
                    .is_some_and(|c| c.len() > 1)
            });
            let p = pods.into_iter().find(|p| {
                p["spec"]["containers"]
                    .as_array()
                    .is_some_and(|c| c.len() == 3)
            })?;
            let ip = p["status"]["podIP"].as_str()?.to_owned();
            get(&ip).filter(|v| v == "1").map(|_| (p, ip))
        },
    );
    let (pod, ip) = pod;
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();

    // The load: one request after another, each a new connection, from the host.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let (stop, ok, failed, ip) = (stop.clone(), ok.clone(), failed.clone(), ip);
        std::thread::spawn(move || {
            let mut last = String::new();
            while !stop.load(Ordering::Relaxed) {
                match get(&ip) {
                    Some(version) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                        last = version;
                    }
                    None => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            last
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    cluster.apply(&manifest(2));
    wait_until(
        "the working slot on version 2, the old one emptied",
        Duration::from_secs(180),
        || {
            let p = cluster.get_json(&["pod", &name, "-n", &ns.name])?;
            let working =
                p["metadata"]["annotations"]["kruise.io/sidecarset-working-hotupgrade-container"]
                    .as_str()?
                    .to_owned();
            let emptied = p["spec"]["containers"].as_array()?.iter().any(|c| {
                c["image"].as_str() == Some(&*cluster.image("rigger-lab/sidecar-empty:1"))
            });
            (working.contains("proxy-2") && emptied).then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let last = load.join().unwrap();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed during the hot upgrade",
        ok + failed
    );
    assert!(ok > 100, "only {ok} requests were made");
    assert_eq!(last, "2", "the new version answers after the upgrade");
    let p = cluster.get_json(&["pod", &name, "-n", &ns.name]).unwrap();
    assert_eq!(
        status(&p, "app").unwrap()["restartCount"],
        0,
        "the app container was restarted"
    );
}

/// One HTTP request to the test sidecar at `ip`:8080; the version it answers.
fn get(ip: &str) -> Option<String> {
    let address = format!("{ip}:8080").parse().ok()?;
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: sidecar\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.trim().to_owned())
}

/// Scenario 3, native sidecars: a SidecarSet's `initContainers` with `restartPolicy:
/// Always` are injected as Kubernetes' native sidecars, and kubelet runs them beside the
/// app; an image change updates them in place as it does other sidecars (Kruise leaves
/// them at their old image: kruise#1671) — kubelet restarts only the native sidecar.
#[test]
fn a_native_sidecar_is_injected_runs_and_is_updated_in_place() {
    let cluster = RealCluster::get();
    lab_image(&["sidecar"]);
    let ns = cluster.namespace("native");
    let set = format!("native-{}", std::process::id());
    let _guard = DeletedOnDrop(cluster, "sidecarset", set.clone());
    let busybox = cluster.image("rigger-lab/busybox:1");
    let manifest = |version: u32| {
        format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
             spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
             updateStrategy: {{maxUnavailable: 2}}\n  initContainers:\n  - name: native\n    \
             image: {image}\n    restartPolicy: Always\n    \
             command: [/usr/local/bin/rigger-lab-sidecar, --port, '8080']\n    \
             readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}\n",
            image = cluster.image(&format!("rigger-lab/sidecar:{version}"))
        )
    };
    let native = |pod: &Value| -> Option<Value> {
        pod["status"]["initContainerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "native")
            .cloned()
    };
    cluster.apply(&manifest(1));
    cluster.apply(&deployment(&ns, &set, 2, &busybox));
    let before = wait_until(
        "the pods with their native sidecar running",
        Duration::from_secs(180),
        || {
            let pods = pods(cluster, &ns, &set);
            if replace_uninjected(cluster, &ns, &pods, |p| {
                !p["spec"]["initContainers"].is_null()
            }) {
                return None;
            }
            let running = pods
                .iter()
                .filter(|p| {
                    ready(p)
                        && native(p).is_some_and(|c| {
                            c["started"] == true && !c["state"]["running"].is_null()
                        })
                })
                .count();
            (running == 2 && pods.len() == 2).then_some(pods)
        },
    );
    assert_eq!(
        before[0]["spec"]["initContainers"][0]["restartPolicy"], "Always",
        "{}",
        before[0]
    );
    let app_ids = app_container_ids(&before);

    cluster.apply(&manifest(2));
    let new_image = cluster.image("rigger-lab/sidecar:2");
    let after = wait_until(
        "every native sidecar on version 2",
        Duration::from_secs(180),
        || {
            let pods = pods(cluster, &ns, &set);
            pods.iter()
                .all(|p| {
                    native(p)
                        .is_some_and(|c| c["image"] == new_image.as_str() && c["ready"] == true)
                })
                .then_some(pods)
        },
    );
    for pod in &after {
        assert_app_kept(pod, &app_ids);
        assert_eq!(native(pod).unwrap()["restartCount"], 1, "{pod}");
    }
    // (A cluster's object: the namespace is not read.)
    let counted = cluster.wait_status(
        "default",
        "sidecarset",
        &set,
        Duration::from_secs(60),
        |status| status["updatedPods"] == 2 && status["updatedReadyPods"] == 2,
    );
    assert_eq!(counted["matchedPods"], 2, "{counted}");
}

/// Defect: a SidecarSet edit Rigger cannot use (the API server stores it: an integer past
/// Rigger's types, an empty selector) must not let matched pods start without their
/// sidecars. The set's webhook entry stays, such pods are refused naming the set, other
/// pods are created, an InvalidSidecarSet event says why; fixed, pods get the sidecar.
#[test]
fn a_sidecarset_rigger_cannot_use_refuses_its_pods_and_leaves_others_alone() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("unusable");
    let set = format!("unusable-{}", std::process::id());
    let _guard = DeletedOnDrop(cluster, "sidecarset", set.clone());
    let busybox = cluster.image("rigger-lab/busybox:1");
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
         spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  containers:\n  - name: proxy\n    \
         image: {busybox}\n    command: {IDLE}\n"
    ));
    let pod = |name: &str, app: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: {app}}}}}\n\
             spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {busybox}\n    command: {IDLE}\n",
            ns = ns.name
        )
    };
    // Served: a matched pod gets the sidecar.
    wait_until("the webhook to inject", Duration::from_secs(60), || {
        let _ = cluster.kubectl(&["-n", &ns.name, "delete", "pod", "first", "--wait=true"]);
        let out = cluster.kubectl_stdin(&["create"], &pod("first", &set));
        out.status.success().then_some(())?;
        let made = cluster.get_json(&["pod", "first", "-n", &ns.name])?;
        (made["spec"]["containers"].as_array()?.len() == 2).then_some(())
    });

    for (what, patch) in [
        (
            "an integer past Rigger's types",
            r#"[{"op":"add","path":"/spec/revisionHistoryLimit","value":4294967296}]"#,
        ),
        (
            "an empty selector",
            // (A merge patch cannot empty a map: JSON patch.)
            r#"[{"op":"remove","path":"/spec/revisionHistoryLimit"},{"op":"replace","path":"/spec/selector","value":{}}]"#,
        ),
    ] {
        cluster.kubectl_ok(&["patch", "sidecarset", &set, "--type", "json", "-p", patch]);
        let refusal = wait_until(
            &format!("a matched pod refused ({what})"),
            Duration::from_secs(30),
            || {
                let out = cluster.kubectl_stdin(&["create"], &pod("matched", &set));
                if out.status.success() {
                    let _ = cluster.kubectl(&[
                        "-n",
                        &ns.name,
                        "delete",
                        "pod",
                        "matched",
                        "--wait=true",
                    ]);
                    return None;
                }
                Some(String::from_utf8_lossy(&out.stderr).into_owned())
            },
        );
        assert!(
            refusal.contains(&format!("SidecarSet {set} cannot be used by Rigger")),
            "{what}: {refusal}"
        );
        let configuration = cluster
            .get_json(&["mutatingwebhookconfiguration", "rigger-sidecar-injection"])
            .unwrap();
        assert!(
            configuration["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["name"] == format!("{set}.sidecarsets.rigger.dev")),
            "{what}: the set's webhook entry is gone: {configuration}"
        );
        let other = format!("other-{}", what.len());
        let out = cluster.kubectl_stdin(&["create"], &pod(&other, "unrelated"));
        assert!(
            out.status.success(),
            "{what}: an unrelated pod was refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_until(
            &format!("an InvalidSidecarSet event ({what})"),
            Duration::from_secs(30),
            || {
                let events = cluster.events_of("default", &set);
                events
                    .iter()
                    .any(|e| e.starts_with("InvalidSidecarSet: "))
                    .then_some(())
            },
        );
    }

    cluster.kubectl_ok(&[
        "patch",
        "sidecarset",
        &set,
        "--type",
        "merge",
        "-p",
        &format!(r#"{{"spec":{{"selector":{{"matchLabels":{{"app":"{set}"}}}}}}}}"#),
    ]);
    wait_until(
        "a matched pod made with its sidecar again",
        Duration::from_secs(30),
        || {
            let out = cluster.kubectl_stdin(&["create"], &pod("fixed", &set));
            out.status.success().then_some(())?;
            let made = cluster.get_json(&["pod", "fixed", "-n", &ns.name])?;
            (made["spec"]["containers"].as_array()?.len() == 2).then_some(())
        },
    );
}

/// Kruise 1.9's `resourcesPolicy` through the cluster's own admission: a pod created (as
/// the API server would, `--dry-run=server`) gets a sidecar sized from its containers
/// (Kruise's e2e story: the sum of two apps' limits and requests through expressions),
/// and a pod none of whose containers the policy names is refused, the cause in the
/// API server's answer.
#[test]
fn a_sidecar_is_sized_from_the_pods_containers_and_a_pod_it_cannot_size_is_refused() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("sized");
    let set = format!("sized-{}", std::process::id());
    let _guard = DeletedOnDrop(cluster, "sidecarset", set.clone());
    let busybox = cluster.image("rigger-lab/busybox:1");
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
         spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  \
         namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n  containers:\n  \
         - name: proxy\n    image: {busybox}\n    resourcesPolicy:\n      targetContainersMode: sum\n      \
         targetContainersNameRegex: '^app'\n      resourcesExpr:\n        \
         limits: {{cpu: 'cpu*50% + 100m', memory: 'max(memory*20% + 100Mi, 200Mi)'}}\n        \
         requests: {{cpu: 'cpu*30% + 50m', memory: 'memory*15% + 50Mi'}}\n",
        ns = ns.name
    ));
    let pod = |containers: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{generateName: sized-, namespace: {ns}, labels: {{app: {set}}}}}\n\
             spec:\n  containers:\n{containers}",
            ns = ns.name
        )
    };
    let app = |name: &str, limits: (&str, &str), requests: (&str, &str)| {
        format!(
            "  - name: {name}\n    image: {busybox}\n    resources:\n      \
             limits: {{cpu: {}, memory: {}}}\n      requests: {{cpu: {}, memory: {}}}\n",
            limits.0, limits.1, requests.0, requests.1
        )
    };
    let sized = pod(&(app("app1", ("200m", "400Mi"), ("100m", "200Mi"))
        + &app("app2", ("400m", "600Mi"), ("200m", "300Mi"))));
    let created = wait_until("the set's webhook entry", Duration::from_secs(60), || {
        let out = cluster.kubectl_stdin(&["create", "--dry-run=server", "-o", "json"], &sized);
        let created: Value = serde_json::from_slice(&out.stdout).ok()?;
        let injected = created["spec"]["containers"]
            .as_array()?
            .iter()
            .any(|c| c["name"] == "proxy");
        injected.then_some(created)
    });
    let proxy = created["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "proxy")
        .unwrap();
    assert_eq!(
        proxy["resources"],
        serde_json::json!({"limits": {"cpu": "400m", "memory": "300Mi"},
                           "requests": {"cpu": "140m", "memory": "125Mi"}}),
        "{created}"
    );
    let unsized_pod = pod(&app("db", ("1", "1Gi"), ("1", "1Gi")));
    let out = cluster.kubectl_stdin(&["create", "--dry-run=server", "-o", "json"], &unsized_pod);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("resourcesPolicy: no containers match the regex pattern"),
        "{stderr}"
    );
}
