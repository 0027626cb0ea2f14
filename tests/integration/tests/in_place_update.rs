//! In-place updates of agent-managed pods (new images, metadata through fieldRef env),
//! with the pod's lifecycle and a webhook cooperator, on the lab's real CRI.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rigger_integration_tests::{
    Lab, container_status, controller_with_agent, log_tail, pod_ready, unique_image_with,
    wait_until,
};
use serde_json::Value;

/// A cooperator endpoint of the test: `/ack` answers 200 after a second (so the
/// PreparingUpdate window is visible), `/hold` always 503. Records (path, stage).
/// (request path, `operation/stage`) of each call.
type Calls = Arc<Mutex<Vec<(String, String)>>>;

fn cooperator_endpoint() -> (u16, Calls) {
    use std::io::{BufRead as _, Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let record = record.clone();
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                reader.read_line(&mut request).unwrap();
                let path = request.split(' ').nth(1).unwrap_or("").to_owned();
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if line.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap();
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let body: Value = serde_json::from_slice(&body).unwrap_or_default();
                record.lock().unwrap().push((
                    path.clone(),
                    format!(
                        "{}/{}",
                        body["operation"].as_str().unwrap_or(""),
                        body["stage"].as_str().unwrap_or("")
                    ),
                ));
                let mut stream = stream;
                if path == "/ack" {
                    std::thread::sleep(Duration::from_secs(1));
                    let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
                } else {
                    let _ = stream.write_all(
                        b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
                    );
                }
            });
        }
    });
    (port, seen)
}

fn lifecycle(pod: &Value) -> String {
    pod["metadata"]["labels"]["lifecycle.rigger.dev/state"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn pod_yaml(name: &str, app_image: &str, side_image: &str, track: &str, command: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}, track: {track}}}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  volumes:
  - name: data
    emptyDir: {{}}
  containers:
  - name: app
    image: {app_image}
    command: ["sh", "-c", "{command}"]
    volumeMounts: [{{name: data, mountPath: /data}}]
  - name: side
    image: {side_image}
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"]
    env:
    - name: TRACK
      valueFrom:
        fieldRef: {{fieldPath: "metadata.labels['track']"}}
"#
    )
}

/// When containerd recorded image `name` (k8s.io) and when container `id` finished, in
/// nanoseconds since the epoch.
fn image_recorded_and_container_finished(name: &str, id: &str) -> (i128, i128) {
    use containerd_client::services::v1::GetImageRequest;
    use containerd_client::services::v1::images_client::ImagesClient;
    use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime, namespaced};
    let lab = Lab::get();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let runtime = Runtime::connect(&lab.containerd_address, DEFAULT_CONNECT_TIMEOUT)
            .await
            .unwrap();
        let request = namespaced(
            GetImageRequest {
                name: name.to_owned(),
            },
            "k8s.io",
        )
        .unwrap();
        let created = ImagesClient::new(runtime.channel())
            .get(request)
            .await
            .unwrap()
            .into_inner()
            .image
            .unwrap()
            .created_at
            .unwrap();
        let status =
            k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(runtime.channel())
                .container_status(k8s_cri::v1::ContainerStatusRequest {
                    container_id: id.to_owned(),
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap();
        (
            i128::from(created.seconds) * 1_000_000_000 + i128::from(created.nanos),
            i128::from(status.finished_at),
        )
    })
}

/// Ids of the lab's sandboxes of pod uid `uid` (any state).
fn sandboxes(uid: &str) -> Vec<String> {
    let lab = Lab::get();
    let out = std::process::Command::new(rigger_integration_tests::binary("rigger-agent"))
        .args(["status", "-o", "json", "--no-disk-usage", "--address"])
        .arg(&lab.containerd_address)
        .output()
        .unwrap();
    let inventory: Value = serde_json::from_slice(&out.stdout).unwrap();
    inventory["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["uid"] == uid)
        .map(|p| p["id"].as_str().unwrap_or_default().to_owned())
        .collect()
}

const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

#[test]
#[allow(clippy::too_many_lines)] // one story: update, metadata, refusal, cooperator policies
fn images_and_metadata_update_in_place_with_the_lifecycle_and_cooperators() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) = controller_with_agent(dir.path(), "update-node", "itest-update");
    let logs = || {
        format!(
            "{}\n{}",
            log_tail(&controller.log, 20),
            log_tail(&agent.log, 300)
        )
    };
    let v1 = lab.image("rigger-lab/busybox:1");
    // Another image with the same shell and one more layer: a new imageID.
    let v2 = lab.image(&unique_image_with(
        "update-v2",
        1,
        4096,
        &["--base", "busybox"],
    ));
    let name = format!("updated-{}", std::process::id());
    let apply = |yaml: &str| controller.apply(yaml);
    let out = apply(&pod_yaml(&name, &v1, &v1, "a", IDLE));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = wait_until("the pod to be ready", Duration::from_secs(90), || {
        let pod = controller.get_json(&["pod", &name])?;
        pod_ready(&pod).then_some(pod)
    });
    let sandbox_before = sandboxes(before["metadata"]["uid"].as_str().unwrap());
    assert_eq!(sandbox_before.len(), 1);
    let exec = controller.ctl(&[
        "exec",
        &name,
        "-c",
        "app",
        "--",
        "sh",
        "-c",
        "echo kept > /data/marker",
    ]);
    assert!(
        exec.status.success(),
        "{}",
        String::from_utf8_lossy(&exec.stderr)
    );

    // A cooperator that acknowledges (after a second).
    let (port, calls) = cooperator_endpoint();
    let cooperator = |policy: &str, path: &str| {
        format!(
            "apiVersion: rigger.dev/v1alpha1\nkind: LifecycleCooperator\nmetadata:\n  name: lb\nspec:\n  selector: {{matchLabels: {{app: {name}}}}}\n  webhook: {{url: \"http://127.0.0.1:{port}{path}\"}}\n  timeoutSeconds: 3\n  failurePolicy: {policy}\n"
        )
    };
    assert!(apply(&cooperator("Fail", "/ack")).status.success());

    // New image for `app`: updated in place, the pod not ready throughout.
    let out = controller.ctl(&["set", "image", &format!("pod/{name}"), &format!("app={v2}")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut states = Vec::new();
    let after = wait_until("the in-place update", Duration::from_secs(90), || {
        let pod = controller.get_json(&["pod", &name])?;
        let state = lifecycle(&pod);
        if ["PreparingUpdate", "Updating", "Updated"].contains(&state.as_str()) {
            assert!(!pod_ready(&pod), "ready during {state}: {pod:#}");
        }
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        let app = container_status(&pod, "app");
        (state == "Normal"
            && app["containerID"] != container_status(&before, "app")["containerID"]
            && pod_ready(&pod))
        .then_some(pod)
    });
    assert!(states.contains(&"PreparingUpdate".to_owned()), "{states:?}");
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(
        sandboxes(before["metadata"]["uid"].as_str().unwrap()),
        sandbox_before,
        "the same sandbox, never replaced"
    );
    assert_eq!(
        container_status(&after, "side")["containerID"],
        container_status(&before, "side")["containerID"]
    );
    assert_eq!(container_status(&after, "app")["restartCount"], 1);
    assert_ne!(
        container_status(&after, "app")["imageID"],
        container_status(&before, "app")["imageID"],
        "the new container runs the new image\n{}",
        logs()
    );
    // The new image was on the node before the old container stopped: the pull is not
    // part of the gap.
    let old_app = container_status(&before, "app")["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let (recorded, finished) = image_recorded_and_container_finished(&v2, &old_app);
    assert!(
        recorded < finished,
        "image recorded at {recorded}, old container finished at {finished}"
    );
    let cat = controller.ctl(&["exec", &name, "-c", "app", "--", "cat", "/data/marker"]);
    assert_eq!(
        String::from_utf8_lossy(&cat.stdout),
        "kept\n",
        "volume data kept"
    );
    let seen: Vec<String> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, s)| s.clone())
        .collect();
    assert_eq!(
        seen,
        ["InPlaceUpdate/Preparing", "InPlaceUpdate/Completing"],
        "in order"
    );

    // A label that `side` reads through fieldRef: only `side` restarts, in place.
    let out = apply(&pod_yaml(&name, &v2, &v1, "b", IDLE));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let relabeled = wait_until(
        "side to restart with the new label",
        Duration::from_secs(60),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            (container_status(&pod, "side")["restartCount"] == 1
                && pod_ready(&pod)
                && lifecycle(&pod) == "Normal")
                .then_some(pod)
        },
    );
    assert_eq!(
        container_status(&relabeled, "app")["containerID"],
        container_status(&after, "app")["containerID"]
    );
    let env = controller.ctl(&["exec", &name, "-c", "side", "--", "sh", "-c", "echo $TRACK"]);
    assert_eq!(
        String::from_utf8_lossy(&env.stdout),
        "b\n",
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );

    // Anything else is refused with the field named.
    let out = apply(&pod_yaml(&name, &v2, &v1, "b", "sleep 1000"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("spec.containers[0].command[2]: cannot change"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A cooperator that never acknowledges holds the update for its timeout; with
    // failurePolicy Fail nothing changes.
    calls.lock().unwrap().clear();
    assert!(apply(&cooperator("Fail", "/hold")).status.success());
    let out = controller.ctl(&["set", "image", &format!("pod/{name}"), &format!("app={v1}")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held = wait_until("the update to fail", Duration::from_secs(60), || {
        let pod = controller.get_json(&["pod", &name])?;
        let message = pod["status"]["lifecycle"]["message"].as_str()?.to_owned();
        message.contains("did not acknowledge").then_some(pod)
    });
    assert_eq!(
        container_status(&held, "app")["containerID"],
        container_status(&after, "app")["containerID"]
    );
    // Asked again until the timeout, not once: how many calls fit in its 3 s depends on
    // how long each takes (three on an idle machine, two seen beside a full run).
    assert!(
        calls.lock().unwrap().len() >= 2,
        "asked again until the timeout"
    );
    wait_until("the pod ready again", Duration::from_secs(30), || {
        pod_ready(&controller.get_json(&["pod", &name])?).then_some(())
    });

    // With failurePolicy Ignore the update goes on after the timeout.
    assert!(apply(&cooperator("Ignore", "/hold")).status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let pod = controller.get_json(&["pod", &name]).unwrap();
        if container_status(&pod, "app")["containerID"]
            != container_status(&after, "app")["containerID"]
            && container_status(&pod, "app")["imageID"]
                != container_status(&after, "app")["imageID"]
            && lifecycle(&pod) == "Normal"
            && pod_ready(&pod)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no update despite failurePolicy Ignore: {pod:#}\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // A recreate asks the cooperators too (operation Recreate).
    calls.lock().unwrap().clear();
    assert!(apply(&cooperator("Fail", "/ack")).status.success());
    let out = controller.ctl(&["recreate", &name, "-c", "side", "--wait"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Vec<String> = calls
        .lock()
        .unwrap()
        .iter()
        .map(|(_, s)| s.clone())
        .collect();
    assert_eq!(seen, ["Recreate/Preparing", "Recreate/Completing"]);

    // A command on the node as a cooperator, for deletions only.
    let record = dir.path().join("deletes");
    let exec_cooperator = format!(
        "apiVersion: rigger.dev/v1alpha1\nkind: LifecycleCooperator\nmetadata:\n  name: node-hook\nspec:\n  operations: [Delete]\n  exec:\n    command: [\"sh\", \"-c\", \"echo $RIGGER_OPERATION/$RIGGER_STAGE/$RIGGER_POD_NAME >> {}\"]\n",
        record.display()
    );
    let out = apply(&exec_cooperator);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
    let lines = wait_until(
        "the deletion's cooperator calls",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&record).ok()?;
            (text.lines().count() >= 2).then_some(text)
        },
    );
    assert_eq!(
        lines,
        format!("Delete/Preparing/{name}\nDelete/Completing/{name}\n")
    );
}

#[test]
fn a_labels_handler_holds_an_update_until_its_label_is_removed_and_put_back() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) =
        controller_with_agent(dir.path(), "update-labels-node", "itest-update-labels");
    let v1 = lab.image("rigger-lab/busybox:1");
    let v2 = lab.image(&unique_image_with(
        "labels-v2",
        1,
        4096,
        &["--base", "busybox"],
    ));
    let name = format!("gated-{}", std::process::id());
    let pod = |image: &str, blocked: bool| {
        let block = if blocked {
            ", example.io/block-updating: \"true\""
        } else {
            ""
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: {name}{block}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{IDLE}\"]\n"
        )
    };
    let applied = |yaml: &str| {
        let out = controller.apply(yaml);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    applied(&format!(
        "apiVersion: rigger.dev/v1alpha1\nkind: LifecycleCooperator\nmetadata:\n  name: gate\nspec:\n  selector: {{matchLabels: {{app: {name}}}}}\n  operations: [InPlaceUpdate]\n  labelsHandler: {{example.io/block-updating: \"true\"}}\n  timeoutSeconds: 120\n"
    ));
    applied(&pod(&v1, true));
    let before = wait_until("the pod to be ready", Duration::from_secs(90), || {
        let pod = controller.get_json(&["pod", &name])?;
        pod_ready(&pod).then_some(pod)
    });

    // The new image waits in PreparingUpdate while the label is there.
    applied(&pod(&v2, true));
    wait_until("PreparingUpdate", Duration::from_secs(30), || {
        (lifecycle(&controller.get_json(&["pod", &name])?) == "PreparingUpdate").then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let held = controller.get_json(&["pod", &name]).unwrap();
    assert_eq!(
        lifecycle(&held),
        "PreparingUpdate",
        "{}",
        log_tail(&agent.log, 30)
    );
    assert_eq!(
        container_status(&held, "app")["containerID"],
        container_status(&before, "app")["containerID"]
    );
    assert!(!pod_ready(&held));

    // Removing the label lets it go on; it stays Updated until the label is back.
    applied(&pod(&v2, false));
    let updated = wait_until("Updated", Duration::from_secs(60), || {
        let pod = controller.get_json(&["pod", &name])?;
        (lifecycle(&pod) == "Updated").then_some(pod)
    });
    assert_ne!(
        container_status(&updated, "app")["containerID"],
        container_status(&before, "app")["containerID"]
    );
    applied(&pod(&v2, true));
    wait_until("Normal and ready", Duration::from_secs(60), || {
        let pod = controller.get_json(&["pod", &name])?;
        (lifecycle(&pod) == "Normal" && pod_ready(&pod)).then_some(())
    });
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}
