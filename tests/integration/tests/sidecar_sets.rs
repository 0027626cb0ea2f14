//! SidecarSet: injection into the matching pods created after it, cold and hot upgrades,
//! on the lab's real CRI (the hot upgrade on every containerd version the lab runs).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::{
    Lab, LabNode, container_status, controller_with_agent, controller_with_agent_on, log_tail,
    on_every_containerd, pod_ready, wait_until,
};
use serde_json::Value;

const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

/// The hot-upgrade slot of sidecar `proxy` that serves, from Kruise's annotation.
fn working(pod: &Value) -> String {
    let text = pod["metadata"]["annotations"]["kruise.io/sidecarset-working-hotupgrade-container"]
        .as_str()
        .unwrap_or("{}");
    serde_json::from_str::<Value>(text).unwrap()["proxy"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// A busybox-based image of its own (a digest no other test shares) in the lab registry.
fn busybox_variant(name: &str) -> String {
    Lab::get().image(&rigger_integration_tests::unique_image_with(
        name,
        1,
        4096,
        &["--base", "busybox"],
    ))
}

/// A SidecarSet hot-upgrading sidecar `proxy` (running `command`, idle slot on `empty`)
/// into pods labelled `label: "<test pid>"`.
fn hot_sidecar_set(name: &str, label: &str, image: &str, empty: &str, command: &str) -> String {
    let pid = std::process::id();
    format!(
        r#"apiVersion: apps.kruise.io/v1alpha1
kind: SidecarSet
metadata:
  name: {name}
spec:
  selector: {{matchLabels: {{{label}: "{pid}"}}}}
  containers:
  - name: proxy
    image: {image}
    command: ["sh", "-c", "{command}"]
    upgradeStrategy:
      upgradeType: HotUpgrade
      hotUpgradeEmptyImage: {empty}
"#
    )
}

/// A pod labelled `label: "<test pid>"` whose one container, `app`, idles on `image`.
fn idle_pod(name: &str, label: &str, image: &str) -> String {
    let pid = std::process::id();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{{label}: \"{pid}\"}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{IDLE}\"]\n"
    )
}

fn names(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn sidecars_are_injected_into_matching_new_pods_only_and_kept_on_reapply() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) = controller_with_agent(dir.path(), "sidecar-node", "itest-sidecar");
    let image = lab.image("rigger-lab/busybox:1");
    let pid = std::process::id();
    let set_name = format!("mesh-{pid}");
    controller.apply_ok(&format!(
        r#"apiVersion: apps.kruise.io/v1alpha1
kind: SidecarSet
metadata:
  name: {set_name}
spec:
  selector: {{matchLabels: {{mesh: "on-{pid}"}}}}
  namespace: default
  volumes:
  - name: mesh-config
    emptyDir: {{}}
  containers:
  - name: proxy
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    volumeMounts: [{{name: mesh-config, mountPath: /etc/mesh}}]
"#
    ));
    let pod = |name: &str, mesh: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{mesh: \"{mesh}\"}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{IDLE}\"]\n"
        )
    };
    let (meshed, plain) = (format!("meshed-{pid}"), format!("plain-{pid}"));
    controller.apply_ok(&pod(&meshed, &format!("on-{pid}")));
    controller.apply_ok(&pod(&plain, "off"));

    let stored = controller.get_json(&["pod", &meshed]).unwrap();
    assert_eq!(
        names(&stored),
        ["proxy", "app"],
        "sidecar first, as Kruise injects"
    );
    let record: Value = serde_json::from_str(
        stored["metadata"]["annotations"]["kruise.io/sidecarset-hash"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        record[&set_name]["sidecarList"],
        serde_json::json!(["proxy"])
    );
    assert!(
        stored["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "mesh-config")
    );
    assert_eq!(
        names(&controller.get_json(&["pod", &plain]).unwrap()),
        ["app"]
    );

    // Both run; the sidecar too.
    let running = wait_until(
        "the meshed pod to be ready",
        Duration::from_secs(90),
        || {
            let pod = controller.get_json(&["pod", &meshed])?;
            // Settled: ready, and each reporting the image it runs (CRI fills imageID
            // once its image cache has the record: a report or two after ready, seen).
            let settled = pod["status"]["containerStatuses"]
                .as_array()?
                .iter()
                .filter(|c| c["ready"] == true && c["imageID"].is_string())
                .count();
            (settled == 2).then_some(pod)
        },
    );

    // The owner applying its own YAML again changes nothing: the sidecar stays.
    let again = controller.apply_ok(&pod(&meshed, &format!("on-{pid}")));
    assert!(
        again.contains("unchanged"),
        "{again}\n{}",
        log_tail(&agent.log, 20)
    );
    std::thread::sleep(Duration::from_secs(2));
    let after = controller.get_json(&["pod", &meshed]).unwrap();
    assert_eq!(
        after["status"]["containerStatuses"],
        running["status"]["containerStatuses"]
    );

    // Status counts the pods it was injected into.
    let set = wait_until("the SidecarSet's counts", Duration::from_secs(30), || {
        let set = controller.get_json(&["sidecarset", &set_name])?;
        (set["status"]["readyPods"] == 1).then_some(set)
    });
    assert_eq!(set["status"]["matchedPods"], 1);
    assert_eq!(set["status"]["updatedPods"], 1);
    assert!(controller.ctl(&["delete", "pod", &meshed]).status.success());
    assert!(controller.ctl(&["delete", "pod", &plain]).status.success());
    assert!(
        controller
            .ctl(&["delete", "sidecarset", &set_name])
            .status
            .success()
    );
}

#[test]
#[allow(clippy::too_many_lines)] // one rollout, watched from start to end
fn a_cold_upgrade_rolls_within_max_unavailable_by_priority_up_to_the_partition() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) = controller_with_agent(dir.path(), "rollout-node", "itest-rollout");
    let v1 = lab.image("rigger-lab/busybox:1");
    let v2 = busybox_variant("proxy-v2");
    let pid = std::process::id();
    let set_name = format!("rollout-{pid}");
    let set = |image: &str, paused: bool| {
        format!(
            r#"apiVersion: apps.kruise.io/v1alpha1
kind: SidecarSet
metadata:
  name: {set_name}
spec:
  selector: {{matchLabels: {{rollout: "{pid}"}}}}
  containers:
  - name: proxy
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
  updateStrategy:
    maxUnavailable: 1
    partition: 1
    paused: {paused}
    priorityStrategy:
      weightPriority:
      - weight: 10
        matchSelector: {{matchLabels: {{tier: edge}}}}
"#
        )
    };
    controller.apply_ok(&set(&v1, false));
    let names: Vec<String> = (0..4).map(|i| format!("r{i}-{pid}")).collect();
    for (i, name) in names.iter().enumerate() {
        let tier = if i == 2 { ", tier: edge" } else { "" };
        controller.apply_ok(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{rollout: \"{pid}\"{tier}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {v1}\n    command: [\"sh\", \"-c\", \"{IDLE}\"]\n"
        ));
    }
    let apps: Vec<Value> = names
        .iter()
        .map(|name| {
            wait_until("the pods to be ready", Duration::from_secs(90), || {
                let pod = controller.get_json(&["pod", name])?;
                pod_ready(&pod).then(|| container_status(&pod, "app")["containerID"].clone())
            })
        })
        .collect();

    // Paused: the new version waits.
    controller.apply_ok(&set(&v2, true));
    std::thread::sleep(Duration::from_secs(4));
    for name in &names {
        let pod = controller.get_json(&["pod", name]).unwrap();
        assert_eq!(pod["spec"]["containers"][0]["image"], v1.as_str(), "paused");
    }

    // Resumed: one pod at a time, the edge pod first, one pod left on v1.
    controller.apply_ok(&set(&v2, false));
    let mut order: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let pods: Vec<Value> = names
            .iter()
            .map(|n| controller.get_json(&["pod", n]).unwrap())
            .collect();
        let mut upgrading = 0;
        for (name, pod) in names.iter().zip(&pods) {
            let on_v2 = pod["spec"]["containers"][0]["image"] == v2.as_str();
            if on_v2 && !order.contains(name) {
                order.push(name.clone());
            }
            let proxy = container_status(pod, "proxy");
            let done = proxy["image"] == v2.as_str() && proxy["ready"] == true && pod_ready(pod);
            if (on_v2 && !done) || !pod_ready(pod) {
                upgrading += 1;
            }
        }
        assert!(
            upgrading <= 1,
            "more than maxUnavailable at once: {order:?}"
        );
        let done = pods
            .iter()
            .filter(|p| container_status(p, "proxy")["image"] == v2.as_str() && pod_ready(p))
            .count();
        if done == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rollout stuck at {order:?}\n{}",
            log_tail(&agent.log, 30)
        );
        std::thread::sleep(Duration::from_millis(150));
    }
    assert_eq!(order[0], names[2], "weight priority first: {order:?}");
    assert_eq!(order[1..], [names[0].clone(), names[1].clone()]);
    std::thread::sleep(Duration::from_secs(3));
    let last = controller.get_json(&["pod", &names[3]]).unwrap();
    assert_eq!(
        last["spec"]["containers"][0]["image"],
        v1.as_str(),
        "partition 1 keeps one"
    );
    for (name, app) in names.iter().zip(&apps) {
        let pod = controller.get_json(&["pod", name]).unwrap();
        assert_eq!(
            &container_status(&pod, "app")["containerID"],
            app,
            "{name}: app untouched"
        );
    }
    // The new image was pre-downloaded by an ImagePullJob of the rollout.
    let jobs = controller.get_json(&["ipj"]).unwrap();
    let job = jobs["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["spec"]["image"] == v2.as_str())
        .unwrap_or_else(|| panic!("no pre-download job: {jobs:#}"));
    assert!(
        job["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with(&format!("sidecarset-{set_name}")),
        "{job:#}"
    );
    let status = controller.get_json(&["sidecarset", &set_name]).unwrap();
    assert_eq!(status["status"]["matchedPods"], 4);
    assert_eq!(status["status"]["updatedPods"], 3);
    for name in &names {
        assert!(controller.ctl(&["delete", "pod", name]).status.success());
    }
}

on_every_containerd!(a_hot_upgrade_swaps_slots_and_a_broken_image_leaves_the_old_slot_serving);

#[allow(clippy::too_many_lines)] // one hot upgrade, then a broken one
fn a_hot_upgrade_swaps_slots_and_a_broken_image_leaves_the_old_slot_serving(node: &LabNode) {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) = controller_with_agent_on(node, dir.path(), "hot-node", "itest-hot");
    let empty = lab.image("rigger-lab/busybox:1");
    // The same image under a name sorting before the lab's: containerd 1.6's CRI reports
    // a container's image as the image's first tag, so the pod's status must come from
    // what the container was created from, not from CRI's pick.
    node.ctr_pull("k8s.io", &empty);
    node.ctr(
        "k8s.io",
        &[
            "images",
            "tag",
            "--force",
            &empty,
            "0.invalid/rigger-lab/busybox:1",
        ],
    );
    let first = busybox_variant("hot-a");
    let second = busybox_variant("hot-b");
    let pid = std::process::id();
    let set_name = format!("hot-{pid}");
    let command = format!("echo $SIDECARSET_VERSION > /tmp/version; {IDLE}");
    let set = |image: &str| hot_sidecar_set(&set_name, "hot", image, &empty, &command);
    controller.apply_ok(&set(&first));
    let name = format!("hot-pod-{pid}");
    controller.apply_ok(&idle_pod(&name, "hot", &empty));
    let before = wait_until("the pod to be ready", Duration::from_secs(90), || {
        let pod = controller.get_json(&["pod", &name])?;
        pod_ready(&pod).then_some(pod)
    });
    assert_eq!(
        names(&before),
        ["proxy-1", "proxy-2", "app"],
        "two slots, injected first"
    );
    assert_eq!(working(&before), "proxy-1");
    assert_eq!(
        container_status(&before, "proxy-1")["image"],
        first.as_str()
    );
    assert_eq!(
        container_status(&before, "proxy-2")["image"],
        empty.as_str()
    );
    let app_id = container_status(&before, "app")["containerID"].clone();
    let old_slot_id = container_status(&before, "proxy-1")["containerID"].clone();

    // Upgrade: proxy-2 starts on the new image while proxy-1 keeps serving; then the
    // switch. The pod stays ready throughout.
    controller.apply_ok(&set(&second));
    let switched = wait_until("the hot upgrade", Duration::from_secs(120), || {
        let pod = controller.get_json(&["pod", &name])?;
        assert!(
            pod_ready(&pod),
            "the pod stayed ready: {pod:#}\n{}",
            log_tail(&agent.log, 30)
        );
        if working(&pod) == "proxy-1" {
            // Before the switch the old slot is the same container, still running.
            let old = container_status(&pod, "proxy-1");
            assert_eq!(
                old["containerID"], old_slot_id,
                "the old slot was never restarted before the switch"
            );
        }
        let done = working(&pod) == "proxy-2"
            && container_status(&pod, "proxy-2")["image"] == second.as_str()
            && container_status(&pod, "proxy-1")["image"] == empty.as_str()
            && container_status(&pod, "proxy-1")["ready"] == true;
        done.then_some(pod)
    });
    assert_eq!(
        container_status(&switched, "app")["containerID"],
        app_id,
        "app untouched"
    );
    let wide = controller.ctl(&["get", "pod", &name, "-o", "wide"]);
    let table = String::from_utf8_lossy(&wide.stdout);
    assert!(
        table.contains("WORKING SIDECARS") && table.contains("proxy-2"),
        "{table}"
    );
    let version = controller.ctl(&["exec", &name, "-c", "proxy-2", "--", "cat", "/tmp/version"]);
    assert!(
        !String::from_utf8_lossy(&version.stdout).trim().is_empty(),
        "SIDECARSET_VERSION reached the new slot"
    );

    // A broken image: the idle slot never gets ready, the working one keeps serving, and
    // the pod says why.
    let broken = lab.image("rigger-lab/busybox:no-such-tag");
    controller.apply_ok(&set(&broken));
    let held = wait_until(
        "the broken upgrade to be reported",
        Duration::from_secs(60),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            let message = pod["status"]["lifecycle"]["message"].as_str()?.to_owned();
            message.contains("no-such-tag").then_some(pod)
        },
    );
    assert_eq!(working(&held), "proxy-2");
    assert_eq!(
        container_status(&held, "proxy-2")["containerID"],
        container_status(&switched, "proxy-2")["containerID"],
        "the working slot kept running"
    );
    assert!(pod_ready(&held));
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}

#[test]
fn an_agent_killed_mid_hot_upgrade_finishes_it_with_one_container_per_slot() {
    use rigger_integration_tests::running_containers;
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, mut agent) =
        controller_with_agent(dir.path(), "hot-kill-node", "itest-hot-kill");
    let empty = lab.image("rigger-lab/busybox:1");
    let first = busybox_variant("hot-kill-a");
    let second = busybox_variant("hot-kill-b");
    let pid = std::process::id();
    let set_name = format!("hot-kill-{pid}");
    let set = |image: &str| hot_sidecar_set(&set_name, "hotkill", image, &empty, IDLE);
    controller.apply_ok(&set(&first));
    let name = format!("hot-kill-pod-{pid}");
    controller.apply_ok(&idle_pod(&name, "hotkill", &empty));
    let before = wait_until("the pod to be ready", Duration::from_secs(90), || {
        let pod = controller.get_json(&["pod", &name])?;
        pod_ready(&pod).then_some(pod)
    });
    let uid = before["metadata"]["uid"].as_str().unwrap().to_owned();
    let app_id = container_status(&before, "app")["containerID"].clone();

    // The upgrade starts: the idle slot gets the new image. SIGKILL the agent then, and
    // start it again on the same state.
    controller.apply_ok(&set(&second));
    wait_until(
        "the idle slot to get the new image",
        Duration::from_secs(60),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            let spec = pod["spec"]["containers"].as_array()?.clone();
            spec.iter()
                .any(|c| c["name"] == "proxy-2" && c["image"] == second.as_str())
                .then_some(())
        },
    );
    agent.restart();

    let switched = wait_until(
        "the hot upgrade after the restart",
        Duration::from_secs(120),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            let done = working(&pod) == "proxy-2"
                && container_status(&pod, "proxy-2")["image"] == second.as_str()
                && container_status(&pod, "proxy-1")["image"] == empty.as_str()
                && container_status(&pod, "proxy-1")["ready"] == true
                && pod_ready(&pod);
            done.then_some(pod)
        },
    );
    assert_eq!(
        container_status(&switched, "app")["containerID"],
        app_id,
        "app untouched"
    );
    assert_eq!(switched["metadata"]["uid"], uid.as_str(), "same pod");
    // One container per slot: nothing doubled, nothing orphaned by the kill.
    for container in ["proxy-1", "proxy-2", "app"] {
        assert_eq!(
            running_containers(&uid, container),
            1,
            "{container}\n{}",
            log_tail(&agent.log, 30)
        );
    }
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}
