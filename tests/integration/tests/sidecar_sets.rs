//! SidecarSet: injection into the matching pods created after it (issue 8, first part),
//! on the lab's real CRI.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::{Agent, Controller, Lab, log_tail, wait_until};
use serde_json::Value;

const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

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
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let agent = Agent::start(
        &controller,
        "sidecar-node",
        &lab.containerd_address,
        &lab.hosts_dir,
        "itest-sidecar",
        &state,
    );
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = controller.get_json(&["node", "sidecar-node"])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });
    let image = lab.image("rigger-lab/busybox:1");
    let pid = std::process::id();
    let set_name = format!("mesh-{pid}");
    let applied = |yaml: &str| {
        let out = controller.apply(yaml);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            log_tail(&controller.log, 10)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    applied(&format!(
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
    applied(&pod(&meshed, &format!("on-{pid}")));
    applied(&pod(&plain, "off"));

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
            let ready = pod["status"]["containerStatuses"]
                .as_array()?
                .iter()
                .filter(|c| c["ready"] == true)
                .count();
            (ready == 2).then_some(pod)
        },
    );

    // The owner applying its own YAML again changes nothing: the sidecar stays.
    let again = applied(&pod(&meshed, &format!("on-{pid}")));
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
