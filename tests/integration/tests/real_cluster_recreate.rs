//! ContainerRecreateRequests on kubelet's own pods in the lab's real cluster: the agent
//! runs each container's preStop as kubelet would, stops it, and kubelet starts it again.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::real_cluster::{RealCluster, container_status, epoch_seconds};
use rigger_integration_tests::wait_until;

/// A container that stops at once on SIGTERM (a shell's `sleep` as PID 1 would not).
const WAITS: &str = "[sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']";

/// Scenario 2: a ContainerRecreateRequest on a Deployment's pod runs each container's own
/// preStop — exec, httpGet (at the pod's IP, as kubelet sends it) and `sleep` — then
/// kubelet starts the container again: its restartCount one more, the pod's uid the same,
/// the container not named untouched, the request completed.
#[test]
fn a_recreate_runs_the_containers_own_pre_stops_and_kubelet_starts_them_again() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("recreate");
    cluster.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: hooks, namespace: {ns}}}\n\
         spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: hooks}}}}\n  template:\n    \
         metadata: {{labels: {{app: hooks}}}}\n    spec:\n      terminationGracePeriodSeconds: 20\n      \
         volumes: [{{name: shared, emptyDir: {{}}}}]\n      containers:\n      \
         - name: recorder\n        image: {busybox}\n        volumeMounts: [{{name: shared, mountPath: /shared}}]\n        \
           command: [sh, -c, 'mkdir -p /shared/www && echo ok > /shared/www/drain && exec httpd -f -vv -p 8080 -h /shared/www 2>>/shared/http.log']\n      \
         - name: exec-hook\n        image: {busybox}\n        volumeMounts: [{{name: shared, mountPath: /shared}}]\n        \
           command: {WAITS}\n        lifecycle: {{preStop: {{exec: {{command: [sh, -c, 'date +%s > /shared/exec-pre-stop']}}}}}}\n      \
         - name: http-hook\n        image: {busybox}\n        command: {WAITS}\n        \
           lifecycle: {{preStop: {{httpGet: {{path: /drain, port: 8080}}}}}}\n      \
         - name: sleep-hook\n        image: {busybox}\n        command: {WAITS}\n        \
           lifecycle: {{preStop: {{sleep: {{seconds: 4}}}}}}\n",
        ns = ns.name,
        busybox = cluster.image("rigger-lab/busybox:1"),
    ));
    cluster.rollout_status(&ns.name, "deployment/hooks", Duration::from_secs(120));
    let pods = cluster
        .get_json(&["pods", "-n", &ns.name, "-l", "app=hooks"])
        .unwrap();
    let before = pods["items"][0].clone();
    let pod = before["metadata"]["name"].as_str().unwrap().to_owned();
    let recorder_id = container_status(&before, "recorder")["containerID"].clone();

    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\n\
         metadata: {{name: again, namespace: {ns}}}\nspec:\n  podName: {pod}\n  \
         containers: [{{name: exec-hook}}, {{name: http-hook}}, {{name: sleep-hook}}]\n",
        ns = ns.name
    ));
    let request = wait_until(
        "the recreate request to complete",
        Duration::from_secs(120),
        || {
            let request =
                cluster.get_json(&["containerrecreaterequest", "again", "-n", &ns.name])?;
            (request["status"]["phase"] == "Completed").then_some(request)
        },
    );
    let states = request["status"]["containerRecreateStates"]
        .as_array()
        .unwrap();
    assert_eq!(states.len(), 3, "{request}");
    for state in states {
        assert_eq!(state["phase"], "Succeeded", "{request}");
    }

    // kubelet started each container again; the pod and the container not named stay.
    let after = wait_until(
        "kubelet to start them again",
        Duration::from_secs(60),
        || {
            let pod = cluster.get_json(&["pod", &pod, "-n", &ns.name])?;
            ["exec-hook", "http-hook", "sleep-hook"]
                .iter()
                .all(|name| {
                    let c = container_status(&pod, name);
                    c["restartCount"] == 1 && c["ready"] == true
                })
                .then_some(pod)
        },
    );
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    let recorder = container_status(&after, "recorder");
    assert_eq!(
        recorder["containerID"], recorder_id,
        "the recorder was recreated"
    );
    assert_eq!(recorder["restartCount"], 0);

    // Each hook did what it says.
    let exec = |command: &str| {
        cluster.kubectl_ok(&[
            "-n", &ns.name, "exec", &pod, "-c", "recorder", "--", "sh", "-c", command,
        ])
    };
    assert!(
        !exec("cat /shared/exec-pre-stop").trim().is_empty(),
        "the exec preStop did not run"
    );
    let requests = exec("cat /shared/http.log");
    assert!(
        requests.contains("url:/drain"),
        "the httpGet preStop did not reach the pod: {requests}"
    );
    let sleep = container_status(&after, "sleep-hook");
    let stopped = epoch_seconds(&sleep["lastState"]["terminated"]["finishedAt"]);
    let asked = epoch_seconds(&request["metadata"]["creationTimestamp"]);
    assert!(
        stopped - asked >= 3,
        "the sleep preStop (4 s) did not delay the stop: asked at {asked}, stopped at {stopped}"
    );
}

/// What a user writes on a request while Rigger works on it stays: a label, an annotation
/// and a finalizer added while the recreate runs are there once Rigger has finished the
/// request and cleared its `crr.apps.kruise.io/active` label; deleted, the request is
/// kept by the user's finalizer until the user removes it.
#[test]
fn a_users_edits_to_a_running_request_are_kept_when_rigger_finishes_it() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("crr-edits");
    cluster.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: slow, namespace: {ns}}}\n\
         spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: slow}}}}\n  template:\n    \
         metadata: {{labels: {{app: slow}}}}\n    spec:\n      terminationGracePeriodSeconds: 20\n      \
         containers:\n      - name: main\n        image: {busybox}\n        command: {WAITS}\n        \
           lifecycle: {{preStop: {{sleep: {{seconds: 6}}}}}}\n",
        ns = ns.name,
        busybox = cluster.image("rigger-lab/busybox:1"),
    ));
    cluster.rollout_status(&ns.name, "deployment/slow", Duration::from_secs(120));
    let pods = cluster
        .get_json(&["pods", "-n", &ns.name, "-l", "app=slow"])
        .unwrap();
    let pod = pods["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\n\
         metadata: {{name: edited, namespace: {ns}}}\nspec:\n  podName: {pod}\n  \
         containers: [{{name: main}}]\n",
        ns = ns.name
    ));
    let get = || cluster.get_json(&["containerrecreaterequest", "edited", "-n", &ns.name]);
    // Rigger has taken it (its active label) and the 6 s preStop runs.
    wait_until(
        "Rigger to take the request",
        Duration::from_secs(60),
        || {
            let request = get()?;
            (request["metadata"]["labels"]["crr.apps.kruise.io/active"] == "true").then_some(())
        },
    );
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "patch",
        "containerrecreaterequest/edited",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"team":"checkout"},"annotations":{"audit/ticket":"T-42"},"finalizers":["example.com/audit"]}}"#,
    ]);
    let finished = wait_until(
        "the request to complete and lose its active label",
        Duration::from_secs(120),
        || {
            let request = get()?;
            (request["status"]["phase"] == "Completed"
                && request["metadata"]["labels"]
                    .get("crr.apps.kruise.io/active")
                    .is_none())
            .then_some(request)
        },
    );
    assert_eq!(
        finished["metadata"]["labels"]["team"], "checkout",
        "{finished}"
    );
    assert_eq!(
        finished["metadata"]["annotations"]["audit/ticket"], "T-42",
        "{finished}"
    );
    assert_eq!(
        finished["metadata"]["finalizers"],
        serde_json::json!(["example.com/audit"]),
        "{finished}"
    );
    // Spec and status as Rigger left them; the user's finalizer holds a deletion.
    assert_eq!(finished["spec"]["podName"], pod.as_str());
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "delete",
        "containerrecreaterequest/edited",
        "--wait=false",
    ]);
    std::thread::sleep(Duration::from_secs(3));
    let held = get().expect("the user's finalizer keeps the request");
    assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
    assert_eq!(held["metadata"]["labels"]["team"], "checkout", "{held}");
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "patch",
        "containerrecreaterequest/edited",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    wait_until(
        "the request to go once its finalizer is removed",
        Duration::from_secs(30),
        || get().is_none().then_some(()),
    );
}
