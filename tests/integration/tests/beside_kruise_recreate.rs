//! ContainerRecreateRequests carried out by Rigger's agents beside OpenKruise v1.9.0's own
//! manager on the lab's real cluster (see `beside_kruise_jobs.rs`): Kruise's webhook labels
//! each request and records the containers' state, Kruise's manager enforces the deadline
//! and the TTL and clears `active`; the agent runs preStop, stops the containers and
//! reports, and kubelet starts them again. The scenarios are Kruise's own
//! (`test/e2e/apps/v1alpha1/containerrecreate.go`,
//! `test/e2e/apps/v1beta1/containerrecreaterequest.go` of Kruise v1.9.0), written again
//! here with the lab's busybox, pods made by a CloneSet as there. Not run: v1beta1's
//! "status.containerStatusSnapshot is populated on completion" (Rigger's status has no
//! snapshot, and Kruise's manager writes one only while it sees the request Recreating,
//! every 3 s, which Rigger's agents usually finish sooner: it failed here); the ordered
//! halves of "recreates containers with postStartHook" and "by force", and v1beta1's
//! "orderedRecreate works" (an ordered request stops the next container once the one
//! before runs again, as CRI shows it; Kruise waits for the Pod's `started`, after its
//! postStart: the stops were 1 s apart here, where Kruise wants ≥ 5 s); and the
//! `unreadyGracePeriodSeconds` half of "with preStopHook" (the grace is waited, but
//! Kruise's `KruisePodReady` condition on a kubelet pod is not set to False).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::real_cluster::{RealCluster, container_status, epoch_seconds};
use rigger_integration_tests::{poll_until, wait_until};
use serde_json::Value;

/// A container that serves HTTP and stops at once on SIGTERM (Kruise's tests run httpd;
/// busybox's, as PID 1, would ignore SIGTERM and wait out the grace period).
const APP: &str =
    "[sh, -c, 'mkdir -p /www; httpd -f -p 8080 -h /www & trap \"exit 0\" TERM; wait']";
/// A container that stops at once on SIGTERM (Kruise's run agnhost).
const SIDECAR: &str = "[sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']";

/// A CloneSet of `replicas` pods with containers `app` (with `app_lifecycle`, a YAML
/// flow mapping or empty) and `sidecar`, spread over the nodes; its ready pods.
fn clone_set(
    cluster: &RealCluster,
    namespace: &str,
    replicas: usize,
    app_lifecycle: &str,
) -> Vec<Value> {
    let lifecycle = if app_lifecycle.is_empty() {
        String::new()
    } else {
        format!("\n        lifecycle: {app_lifecycle}")
    };
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: CloneSet\nmetadata: {{name: clone-foo, namespace: {namespace}}}\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: clone-foo}}}}\n  template:\n    \
         metadata: {{labels: {{app: clone-foo}}}}\n    spec:\n      terminationGracePeriodSeconds: 30\n      \
         affinity: {{podAntiAffinity: {{preferredDuringSchedulingIgnoredDuringExecution: [{{weight: 100, \
         podAffinityTerm: {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: clone-foo}}}}}}}}]}}}}\n      \
         containers:\n      - name: app\n        image: {busybox}\n        command: {APP}{lifecycle}\n      \
         - name: sidecar\n        image: {busybox}\n        command: {SIDECAR}\n",
        busybox = cluster.image("rigger-lab/busybox:1"),
    ));
    wait_until(
        "the CloneSet's pods to be ready",
        Duration::from_secs(120),
        || {
            let set = cluster.get_json(&["cloneset", "clone-foo", "-n", namespace])?;
            (set["status"]["readyReplicas"] == replicas).then_some(())?;
            let pods = cluster.get_json(&["pods", "-n", namespace, "-l", "app=clone-foo"])?;
            let pods = pods["items"].as_array()?.clone();
            (pods.len() == replicas).then_some(pods)
        },
    )
}

fn request(cluster: &RealCluster, namespace: &str, name: &str) -> Option<Value> {
    cluster.get_json(&[
        "containerrecreaterequests.v1alpha1.apps.kruise.io",
        name,
        "-n",
        namespace,
    ])
}

fn wait_completed(cluster: &RealCluster, namespace: &str, name: &str, within: Duration) -> Value {
    let mut last = None;
    let done = poll_until(within, Duration::from_millis(500), || {
        last = request(cluster, namespace, name);
        last.clone().filter(|r| r["status"]["phase"] == "Completed")
    });
    done.unwrap_or_else(|| {
        panic!(
            "request {name} did not complete within {within:?}: {last:?}\n{}",
            cluster.rigger_state()
        )
    })
}

fn states(request: &Value) -> Vec<(String, String, bool)> {
    request["status"]["containerRecreateStates"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["phase"].as_str().unwrap_or_default().to_owned(),
                s["isKilled"] == true,
            )
        })
        .collect()
}

fn succeeded(names: &[&str]) -> Vec<(String, String, bool)> {
    names
        .iter()
        .map(|n| ((*n).to_owned(), "Succeeded".to_owned(), true))
        .collect()
}

/// The pod again, once every container in `names` is running anew (restartCount 1) and
/// the pod is Ready.
fn restarted(cluster: &RealCluster, namespace: &str, pod: &Value, names: &[&str]) -> Value {
    let name = pod["metadata"]["name"].as_str().unwrap();
    wait_until(
        "kubelet to start the containers again",
        Duration::from_secs(60),
        || {
            let now = cluster.get_json(&["pod", name, "-n", namespace])?;
            let ready = now["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (ready
                && names
                    .iter()
                    .all(|c| container_status(&now, c)["restartCount"] == 1))
            .then_some(now)
        },
    )
}

/// Kruise e2e "recreates simple containers" (v1alpha1, and v1beta1's "via v1beta1
/// client"): Kruise's webhook labels the request and records each container's ID; the
/// app alone is recreated, started for `minStartedSeconds` before the request completes,
/// and the request goes at its TTL; then both containers of the second pod, asked for
/// through v1beta1 (Kruise's conversion webhook between the versions).
#[test]
fn a_request_recreates_the_named_containers_after_kruise_s_webhook_labelled_it() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-crr");
    let pods = clone_set(cluster, &ns.name, 2, "");
    let first = &pods[0];
    let pod = first["metadata"]["name"].as_str().unwrap();
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\nmetadata: {{name: crr-0, namespace: {ns}}}\n\
         spec:\n  podName: {pod}\n  containers: [{{name: app}}]\n  strategy: {{minStartedSeconds: 5}}\n  \
         ttlSecondsAfterFinished: 3\n",
        ns = ns.name
    ));
    let made = request(cluster, &ns.name, "crr-0").unwrap();
    let labels = &made["metadata"]["labels"];
    assert_eq!(
        labels["crr.apps.kruise.io/pod-uid"], first["metadata"]["uid"],
        "{made}"
    );
    assert_eq!(
        labels["crr.apps.kruise.io/node-name"], first["spec"]["nodeName"],
        "{made}"
    );
    assert_eq!(labels["crr.apps.kruise.io/active"], "true", "{made}");
    assert_eq!(made["spec"]["strategy"]["failurePolicy"], "Fail", "{made}");
    assert_eq!(
        made["spec"]["containers"][0]["statusContext"]["containerID"],
        container_status(first, "app")["containerID"],
        "{made}"
    );
    let done = wait_completed(cluster, &ns.name, "crr-0", Duration::from_secs(70));
    assert_eq!(states(&done), succeeded(&["app"]), "{done}");
    let after = restarted(cluster, &ns.name, first, &["app"]);
    assert_ne!(
        container_status(&after, "app")["containerID"],
        container_status(first, "app")["containerID"]
    );
    assert_eq!(
        container_status(&after, "sidecar")["restartCount"],
        0,
        "the sidecar was not named"
    );
    let started = epoch_seconds(&container_status(&after, "app")["state"]["running"]["startedAt"]);
    let completed = epoch_seconds(&done["status"]["completionTime"]);
    assert!(
        completed - started > 4,
        "minStartedSeconds 5: completed at {completed}, the app started at {started}"
    );
    wait_until(
        "the request to go at its TTL (3 s)",
        Duration::from_secs(15),
        || request(cluster, &ns.name, "crr-0").is_none().then_some(()),
    );

    let second = &pods[1];
    let pod = second["metadata"]["name"].as_str().unwrap();
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ContainerRecreateRequest\nmetadata: {{name: crr-1, namespace: {ns}}}\n\
         spec:\n  podName: {pod}\n  containers: [{{name: app}}, {{name: sidecar}}]\n",
        ns = ns.name
    ));
    let done = wait_completed(cluster, &ns.name, "crr-1", Duration::from_secs(60));
    assert_eq!(states(&done), succeeded(&["app", "sidecar"]), "{done}");
    wait_until(
        "the request to lose its active label",
        Duration::from_secs(5),
        || {
            let r = request(cluster, &ns.name, "crr-1")?;
            r["metadata"]["labels"]["crr.apps.kruise.io/active"]
                .is_null()
                .then_some(())
        },
    );
    let after = restarted(cluster, &ns.name, second, &["app", "sidecar"]);
    for name in ["app", "sidecar"] {
        assert_ne!(
            container_status(&after, name)["containerID"],
            container_status(second, name)["containerID"]
        );
    }
}

/// Kruise e2e "recreates containers with preStopHook": the app's preStop (8 s) runs before
/// its stop, and the sidecar stops after it; a request whose deadline (3 s) passes first
/// is completed at the deadline, the app's stop already begun going on.
#[test]
fn a_request_waits_for_the_pre_stop_and_a_deadline_ends_it_early() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-crr-prestop");
    let pods = clone_set(
        cluster,
        &ns.name,
        2,
        "{preStop: {exec: {command: [sleep, '8']}}}",
    );
    let first = &pods[0];
    let pod = first["metadata"]["name"].as_str().unwrap();
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\nmetadata: {{name: crr-0, namespace: {ns}}}\n\
         spec:\n  podName: {pod}\n  containers: [{{name: app}}, {{name: sidecar}}]\n",
        ns = ns.name
    ));
    let done = wait_completed(cluster, &ns.name, "crr-0", Duration::from_secs(60));
    assert_eq!(states(&done), succeeded(&["app", "sidecar"]), "{done}");
    let after = restarted(cluster, &ns.name, first, &["app", "sidecar"]);
    let sidecar_stopped = epoch_seconds(
        &container_status(&after, "sidecar")["lastState"]["terminated"]["finishedAt"],
    );
    let asked = epoch_seconds(&done["metadata"]["creationTimestamp"]);
    assert!(
        sidecar_stopped - asked >= 8,
        "the app's preStop (8 s) ran before the sidecar stopped: asked at {asked}, sidecar stopped at {sidecar_stopped}"
    );

    let second = &pods[1];
    let pod = second["metadata"]["name"].as_str().unwrap();
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\nmetadata: {{name: crr-1, namespace: {ns}}}\n\
         spec:\n  podName: {pod}\n  containers: [{{name: app}}, {{name: sidecar}}]\n  activeDeadlineSeconds: 3\n",
        ns = ns.name
    ));
    let done = wait_completed(cluster, &ns.name, "crr-1", Duration::from_secs(8));
    // Kruise's manager completes it at the deadline with the states as they are (the
    // sidecar Pending); Rigger then says why a container was not done (Failed, naming
    // the deadline: kruise#2353; the guide's table). Either way the sidecar, never
    // reached, is not recreated.
    let sidecar = states(&done).into_iter().find(|s| s.0 == "sidecar");
    assert!(
        sidecar
            .as_ref()
            .is_none_or(|s| s.1 == "Pending" || s.1 == "Failed"),
        "the sidecar, not reached before the deadline: {done}"
    );
    // The app's stop, already begun, goes on: kubelet starts it again.
    let now = wait_until("the app to start again", Duration::from_secs(60), || {
        let now = cluster.get_json(&["pod", pod, "-n", &ns.name])?;
        (container_status(&now, "app")["restartCount"] == 1).then_some(now)
    });
    assert_eq!(
        container_status(&now, "sidecar")["restartCount"],
        0,
        "the sidecar was recreated after the deadline"
    );
}

/// The two containers' last stops, as kubelet recorded them: (app, sidecar), in seconds.
fn stopped_at(pod: &Value) -> (i64, i64) {
    let stopped = |name: &str| {
        epoch_seconds(&container_status(pod, name)["lastState"]["terminated"]["finishedAt"])
    };
    (stopped("app"), stopped("sidecar"))
}

/// Kruise e2e "recreates containers with postStartHook" and "recreates containers by
/// force", their unordered halves: the app's postStart takes 5 s; a request for both
/// containers stops the sidecar without waiting for the app's next attempt to start
/// (their stops under 3 s apart), with and without `forceRecreate`.
#[test]
fn an_unordered_request_stops_every_container_without_waiting_for_a_post_start() {
    let cluster = RealCluster::beside_kruise();
    let ns = cluster.namespace("kruise-crr-poststart");
    let pods = clone_set(
        cluster,
        &ns.name,
        2,
        "{postStart: {exec: {command: [sleep, '5']}}}",
    );
    for (i, (pod, strategy)) in pods
        .iter()
        .zip(["", "\n  strategy: {forceRecreate: true}"])
        .enumerate()
    {
        let name = pod["metadata"]["name"].as_str().unwrap();
        cluster.apply(&format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\n\
             metadata: {{name: crr-{i}, namespace: {ns}}}\n\
             spec:\n  podName: {name}\n  containers: [{{name: app}}, {{name: sidecar}}]{strategy}\n",
            ns = ns.name
        ));
        let done = wait_completed(
            cluster,
            &ns.name,
            &format!("crr-{i}"),
            Duration::from_secs(60),
        );
        assert_eq!(states(&done), succeeded(&["app", "sidecar"]), "{done}");
        let after = restarted(cluster, &ns.name, pod, &["app", "sidecar"]);
        for container in ["app", "sidecar"] {
            assert_ne!(
                container_status(&after, container)["containerID"],
                container_status(pod, container)["containerID"]
            );
        }
        let (app, sidecar) = stopped_at(&after);
        assert!(
            (sidecar - app).abs() < 3,
            "{strategy:?}: the sidecar stopped at {sidecar}, the app at {app}: it waited for the app's postStart"
        );
    }
}
