//! ContainerRecreateRequest end to end: applied through the controller, routed to the
//! pod's node, executed by the agent over the lab's real CRI — for agent-managed pods
//! (the agent starts the next attempt) and for kubelet's pods (this test plays kubelet's
//! restart loop, as kubelet cannot run here). The recreate itself and kubelet's pods
//! are tested on every containerd version the lab runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rigger_integration_tests::{
    Controller, CriPod, CriPodSpec, Lab, LabNode, container_status, controller_with_agent,
    controller_with_agent_on, log_tail, on_every_containerd, running_containers, wait_until,
};
use serde_json::Value;

fn crr_yaml(name: &str, pod: &str, containers: &[&str], strategy: &str, extra: &str) -> String {
    let list: Vec<String> = containers
        .iter()
        .map(|c| format!("  - name: {c}\n"))
        .collect();
    format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\nmetadata:\n  name: {name}\nspec:\n  podName: {pod}\n  containers:\n{}  strategy: {{{strategy}}}\n{extra}",
        list.concat()
    )
}

/// The request once it completed.
fn completed(controller: &Controller, name: &str, within: Duration) -> Value {
    wait_until(&format!("recreate {name} to complete"), within, || {
        let crr = controller.get_json(&["crr", name])?;
        (crr["status"]["phase"] == "Completed").then_some(crr)
    })
}

fn state_of<'a>(crr: &'a Value, container: &str) -> &'a Value {
    crr["status"]["containerRecreateStates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == container)
        .unwrap()
}

fn ready_pod(controller: &Controller, name: &str) -> Value {
    controller.ready_pod(name, Duration::from_secs(90))
}

/// Connections a TCP listener of the test accepted.
fn tcp_recorder() -> (u16, Arc<Mutex<u32>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(Mutex::new(0));
    let record = count.clone();
    std::thread::spawn(move || {
        for _ in listener.incoming().flatten() {
            *record.lock().unwrap() += 1;
        }
    });
    (port, count)
}

/// A loop that ends at once on SIGTERM (shells as PID 1 ignore it otherwise).
const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

on_every_containerd!(
    recreate_keeps_the_pod_runs_every_kind_of_pre_stop_and_goes_in_order,
    kubelet_pods_are_recreated_with_kubelets_hook_and_restart_loop,
);

fn recreate_keeps_the_pod_runs_every_kind_of_pre_stop_and_goes_in_order(node: &LabNode) {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) =
        controller_with_agent_on(node, dir.path(), "recreate-node", "itest-recreate");
    let image = lab.image("rigger-lab/busybox:1");
    let (http_port, http_hooks) = rigger_integration_tests::http_recorder();
    let (tcp_port, tcp_hooks) = tcp_recorder();
    let out_dir = dir.path().join("out");
    let name = format!("recreated-{}", std::process::id());
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 10
  volumes:
  - name: data
    emptyDir: {{}}
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    volumeMounts: [{{name: data, mountPath: /data}}, {{name: out, mountPath: /out}}]
    lifecycle:
      preStop:
        exec: {{command: ["sh", "-c", "echo prestop > /out/app-prestop"]}}
  - name: web
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    lifecycle:
      preStop:
        httpGet: {{path: /prestop-web, port: {http_port}}}
  - name: tcp
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    lifecycle:
      preStop:
        tcpSocket: {{port: {tcp_port}}}
  - name: keeper
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
"#,
        out = out_dir.display()
    );
    controller.apply_ok(&yaml);
    let before = ready_pod(&controller, &name);
    let uid = before["metadata"]["uid"].as_str().unwrap().to_owned();
    // Data in the pod's volume, written from inside the container to be recreated.
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

    // Unknown pods and containers are refused with the field named; nothing is stored.
    let unknown = controller.ctl(&["recreate", "no-such-pod", "-c", "app"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr)
            .contains("spec.podName: pod default/no-such-pod not found"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    let unknown = controller.ctl(&["recreate", &name, "-c", "nope"]);
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("spec.containers[0].name"),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    let listed = controller.get_json(&["crr"]).unwrap();
    assert_eq!(
        listed["items"].as_array().map_or(0, Vec::len),
        0,
        "{listed:#}"
    );

    // Ordered: each container is stopped only once the one before is back for 2 s.
    let request = crr_yaml(
        "ordered",
        &name,
        &["app", "web", "tcp"],
        "orderedRecreate: true, minStartedSeconds: 2",
        "",
    );
    assert!(controller.apply_ok(&request).contains("created"));
    let mut saw_gap = false;
    let done = wait_until("the ordered recreate", Duration::from_secs(120), || {
        let crr = controller.get_json(&["crr", "ordered"])?;
        let states = crr["status"]["containerRecreateStates"].as_array()?.clone();
        let phase = |n: &str| {
            states.iter().find(|s| s["name"] == n).map(|s| {
                (
                    s["phase"].as_str().unwrap_or("").to_owned(),
                    s["isKilled"] == true,
                )
            })
        };
        let (app, web, tcp) = (phase("app")?, phase("web")?, phase("tcp")?);
        assert!(
            !web.1 || app.0 == "Succeeded",
            "web stopped before app was back: {crr:#}"
        );
        assert!(
            !tcp.1 || web.0 == "Succeeded",
            "tcp stopped before web was back: {crr:#}"
        );
        if app.1 && app.0 == "Recreating" && web.0 == "Pending" {
            saw_gap = true;
        }
        (crr["status"]["phase"] == "Completed").then_some(crr)
    });
    assert!(
        saw_gap,
        "app was seen back but not yet counted while web waited"
    );
    for c in ["app", "web", "tcp"] {
        let state = state_of(&done, c);
        assert_eq!(
            state["phase"],
            "Succeeded",
            "{done:#}\n{}",
            log_tail(&agent.log, 40)
        );
        assert_eq!(state["isKilled"], true);
    }
    assert_eq!(
        done["metadata"]["labels"]["crr.apps.kruise.io/pod-uid"],
        uid.as_str(),
        "Kruise's labels name the pod"
    );

    // Every kind of preStop ran.
    assert_eq!(
        std::fs::read_to_string(out_dir.join("app-prestop"))
            .unwrap()
            .trim(),
        "prestop"
    );
    assert!(
        http_hooks
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("GET /prestop-web"))
    );
    assert!(
        *tcp_hooks.lock().unwrap() >= 1,
        "tcpSocket preStop connected"
    );

    // Same pod, same sandbox; the other container untouched; volume data kept.
    let after = ready_pod(&controller, &name);
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    for c in ["app", "web", "tcp"] {
        assert_eq!(container_status(&after, c)["restartCount"], 1, "{after:#}");
        assert_ne!(
            container_status(&after, c)["containerID"],
            container_status(&before, c)["containerID"]
        );
    }
    assert_eq!(
        container_status(&after, "keeper")["containerID"],
        container_status(&before, "keeper")["containerID"]
    );
    assert_eq!(container_status(&after, "keeper")["restartCount"], 0);
    let sandboxes = lab_sandboxes(node, &uid);
    assert_eq!(sandboxes, 1, "one sandbox, never replaced");
    let cat = controller.ctl(&["exec", &name, "-c", "app", "--", "cat", "/data/marker"]);
    assert_eq!(String::from_utf8_lossy(&cat.stdout), "kept\n");

    // The same request again changes nothing.
    assert!(controller.apply_ok(&request).contains("unchanged"));
    std::thread::sleep(Duration::from_secs(3));
    let again = controller.get_json(&["pod", &name]).unwrap();
    assert_eq!(container_status(&again, "app")["restartCount"], 1);

    // The shorthand, waiting with per-container progress.
    let out = controller.ctl(&["recreate", &name, "-c", "web", "--grace", "3s", "--wait"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("web: Succeeded"), "{text}");
    assert!(text.contains("completed"), "{text}");

    // Both daemons count it on /metrics (Prometheus' text format).
    let (code, agent_metrics) =
        rigger_integration_tests::http_get(&agent.health, "/metrics").unwrap();
    assert_eq!(code, 200);
    for series in [
        "rigger_agent_recreates_total{result=\"succeeded\"} 2",
        "rigger_agent_recreate_duration_seconds_count 2",
        "rigger_agent_controller_link_up 1",
        "rigger_agent_tasks_active 0",
    ] {
        assert!(
            agent_metrics.contains(series),
            "{series} in\n{agent_metrics}"
        );
    }
    let controller_metrics = wait_until("the controller's gauges", Duration::from_secs(10), || {
        let (_, text) = rigger_integration_tests::http_get(&controller.health, "/metrics")?;
        text.contains("rigger_controller_recreate_requests{phase=\"completed\"} 2")
            .then_some(text)
    });
    for series in [
        "rigger_controller_agents{state=\"ready\"} 1",
        "rigger_controller_leader 1",
    ] {
        assert!(
            controller_metrics.contains(series),
            "{series} in\n{controller_metrics}"
        );
    }
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}

/// Ready sandboxes in the containerd of lab node `node` for pod uid `uid`.
fn lab_sandboxes(node: &LabNode, uid: &str) -> usize {
    let out = std::process::Command::new(rigger_integration_tests::binary("rigger-agent"))
        .args(["status", "-o", "json", "--no-disk-usage", "--address"])
        .arg(&node.address)
        .output()
        .unwrap();
    let inventory: Value = serde_json::from_slice(&out.stdout).unwrap();
    inventory["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["uid"] == uid && p["state"] == "ready")
        .count()
}

#[test]
fn failure_policies_deadlines_and_pods_that_go_away() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) =
        controller_with_agent(dir.path(), "recreate-fail-node", "itest-recreate");
    let image = lab.image("rigger-lab/busybox:1");
    let out_dir = dir.path().join("out");
    let name = format!("failing-{}", std::process::id());
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  volumes:
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
  containers:
  - name: crashy
    image: {image}
    command: ["sh", "-c", "test -f /out/crash && exit 1; {IDLE}"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  - name: steady
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
  - name: slow
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    volumeMounts: [{{name: out, mountPath: /out}}]
    readinessProbe:
      exec: {{command: ["sh", "-c", "test ! -f /out/unready"]}}
      periodSeconds: 1
"#,
        out = out_dir.display()
    );
    controller.apply_ok(&yaml);
    let before = ready_pod(&controller, &name);
    let logs = || {
        format!(
            "{}\n{}",
            log_tail(&controller.log, 20),
            log_tail(&agent.log, 40)
        )
    };

    // failurePolicy Fail: the crashing container (it exits before it has run
    // minStartedSeconds) fails the request; the next container is never touched.
    std::fs::write(out_dir.join("crash"), b"").unwrap();
    controller.apply_ok(&crr_yaml(
        "fail-fast",
        &name,
        &["crashy", "steady"],
        "orderedRecreate: true, minStartedSeconds: 2",
        "",
    ));
    let crr = completed(&controller, "fail-fast", Duration::from_secs(60));
    assert_eq!(
        state_of(&crr, "crashy")["phase"],
        "Failed",
        "{crr:#}\n{}",
        logs()
    );
    assert!(
        state_of(&crr, "crashy")["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 1"),
        "{crr:#}"
    );
    assert_eq!(state_of(&crr, "steady")["isKilled"], false, "{crr:#}");
    assert_ne!(state_of(&crr, "steady")["phase"], "Succeeded");
    assert!(
        crr["status"]["message"]
            .as_str()
            .unwrap()
            .contains("crashy"),
        "{crr:#}"
    );
    let pod = controller.get_json(&["pod", &name]).unwrap();
    assert_eq!(
        container_status(&pod, "steady")["containerID"],
        container_status(&before, "steady")["containerID"]
    );

    // failurePolicy Ignore: the failure is recorded and the next container recreated.
    controller.apply_ok(&crr_yaml(
        "go-on",
        &name,
        &["crashy", "steady"],
        "orderedRecreate: true, failurePolicy: Ignore, minStartedSeconds: 2",
        "",
    ));
    let crr = completed(&controller, "go-on", Duration::from_secs(60));
    assert_eq!(state_of(&crr, "crashy")["phase"], "Failed", "{crr:#}");
    assert_eq!(
        state_of(&crr, "steady")["phase"],
        "Succeeded",
        "{crr:#}\n{}",
        logs()
    );
    std::fs::remove_file(out_dir.join("crash")).unwrap();

    // unreadyGracePeriodSeconds: the pod is reported not ready before anything stops;
    // two requests for one pod run one after the other. Both were made while the same
    // instance ran (their statusContext names it, as Kruise fills it in), so the second
    // finds it recreated already and stops nothing, as in Kruise.
    controller.apply_ok(&format!(
        "{}---\n{}",
        crr_yaml(
            "first",
            &name,
            &["steady"],
            "unreadyGracePeriodSeconds: 2",
            ""
        ),
        crr_yaml("second", &name, &["steady"], "", "")
    ));
    wait_until(
        "the pod to be marked not ready",
        Duration::from_secs(30),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            pod["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| {
                    c["type"] == "Ready"
                        && c["status"] == "False"
                        && c["reason"] == "ContainerRecreating"
                })
                .then_some(())
        },
    );
    let second_waits = controller.get_json(&["crr", "second"]).unwrap();
    assert!(
        second_waits["status"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("waiting for first"),
        "{second_waits:#}"
    );
    let first = completed(&controller, "first", Duration::from_secs(60));
    let second = completed(&controller, "second", Duration::from_secs(60));
    assert_eq!(state_of(&first, "steady")["phase"], "Succeeded");
    assert_eq!(state_of(&second, "steady")["phase"], "Succeeded");
    assert!(
        state_of(&second, "steady")["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("already recreated"),
        "{second:#}"
    );
    assert!(
        first["status"]["completionTime"].as_str() <= second["status"]["completionTime"].as_str()
    );
    let pod = ready_pod(&controller, &name);
    assert_eq!(
        container_status(&pod, "steady")["restartCount"],
        2,
        "{pod:#}"
    );

    // The deadline fails a request whose container never comes back ready.
    std::fs::write(out_dir.join("unready"), b"").unwrap();
    controller.apply_ok(&crr_yaml(
        "too-slow",
        &name,
        &["slow"],
        "",
        "  activeDeadlineSeconds: 5\n",
    ));
    let crr = completed(&controller, "too-slow", Duration::from_secs(60));
    assert_eq!(state_of(&crr, "slow")["phase"], "Failed", "{crr:#}");
    assert!(
        crr["status"]["message"]
            .as_str()
            .unwrap()
            .contains("activeDeadlineSeconds (5s) passed"),
        "{crr:#}"
    );
    std::fs::remove_file(out_dir.join("unready")).unwrap();

    // A pod deleted during a request fails it with that reason.
    controller.apply_ok(&crr_yaml(
        "orphaned",
        &name,
        &["steady"],
        "minStartedSeconds: 600",
        "",
    ));
    wait_until("the recreate to start", Duration::from_secs(30), || {
        let crr = controller.get_json(&["crr", "orphaned"])?;
        (state_of(&crr, "steady")["isKilled"] == true).then_some(())
    });
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
    let crr = completed(&controller, "orphaned", Duration::from_secs(30));
    assert!(
        crr["status"]["message"]
            .as_str()
            .unwrap()
            .contains("was deleted"),
        "{crr:#}"
    );
    assert_eq!(state_of(&crr, "steady")["phase"], "Failed");
}

fn kubelet_pods_are_recreated_with_kubelets_hook_and_restart_loop(node: &LabNode) {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, agent) =
        controller_with_agent_on(node, dir.path(), "recreate-kubelet-node", "itest-recreate");
    let image = lab.image("rigger-lab/busybox:1");
    // The image comes the way kubelet gets it: CRI PullImage.
    let pulled =
        std::process::Command::new(rigger_integration_tests::binary("rigger-bench-cri-pull"))
            .arg(&node.address)
            .arg(&image)
            .output()
            .unwrap();
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    let out_dir = dir.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::write(out_dir.join("data"), b"kept").unwrap();

    let pid = std::process::id();
    let (namespace, name, uid) = (
        "shop",
        format!("kubelet-web-{pid}"),
        format!("kubelet-uid-{pid}"),
    );
    let labels = HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.name".to_owned(), name.clone()),
        ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
    ]);
    let mut container_labels = labels.clone();
    container_labels.insert("io.kubernetes.container.name".into(), "app".into());
    let mut spec = CriPodSpec::on(node, &name, &image, &["sh", "-c", IDLE]);
    spec.namespace = namespace.to_owned();
    spec.uid = uid;
    spec.labels = labels;
    spec.container = "app".to_owned();
    spec.container_labels = container_labels;
    // What kubelet records on every container it creates.
    spec.container_annotations = HashMap::from([
        (
            "io.kubernetes.container.restartCount".to_owned(),
            "0".to_owned(),
        ),
        (
            "io.kubernetes.pod.terminationGracePeriod".to_owned(),
            "3".to_owned(),
        ),
        (
            "io.kubernetes.container.preStopHandler".to_owned(),
            r#"{"exec":{"command":["sh","-c","echo prestop > /out/prestop"]}}"#.to_owned(),
        ),
    ]);
    spec.mounts = vec![(out_dir.clone(), "/out".to_owned())];
    let mut pod = CriPod::run_spec(&spec);
    let (sandbox, old_container) = (pod.sandbox_id.clone(), pod.container_id.clone());

    // The controller learns about the pod from the node's inventory.
    let request = crr_yaml("kubelet-recreate", &name, &["app"], "", "");
    let request = request.replace(
        "  name: kubelet-recreate\n",
        &format!("  name: kubelet-recreate\n  namespace: {namespace}\n"),
    );
    wait_until(
        "the kubelet pod in the inventory",
        Duration::from_secs(30),
        || controller.apply(&request).status.success().then_some(()),
    );
    let crr = wait_until(
        "the recreate, kubelet restarting",
        Duration::from_secs(60),
        || {
            pod.restart_if_exited();
            let out = controller.ctl(&[
                "-n",
                namespace,
                "get",
                "crr",
                "kubelet-recreate",
                "-o",
                "json",
            ]);
            let crr: Value = serde_json::from_slice(&out.stdout).ok()?;
            if crr["status"]["phase"] == "Completed" {
                return Some(crr);
            }
            std::thread::sleep(Duration::from_millis(200));
            None
        },
    );
    let state = state_of(&crr, "app");
    assert_eq!(
        state["phase"],
        "Succeeded",
        "{crr:#}\n{}",
        log_tail(&agent.log, 40)
    );
    assert_eq!(state["isKilled"], true);
    assert_eq!(
        crr["metadata"]["labels"]["crr.apps.kruise.io/node-name"],
        "recreate-kubelet-node"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("prestop"))
            .unwrap()
            .trim(),
        "prestop",
        "kubelet's preStop handler ran"
    );
    assert_ne!(
        pod.container_id, old_container,
        "kubelet started the next attempt"
    );
    assert_eq!(pod.sandbox_id, sandbox);
    assert_eq!(pod.container_state(), "CONTAINER_RUNNING");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("data")).unwrap(),
        "kept"
    );
}

#[test]
fn an_agent_killed_mid_recreate_finishes_it_once_after_a_restart() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, mut agent) =
        controller_with_agent(dir.path(), "recreate-kill-node", "itest-recreate-kill");
    let image = lab.image("rigger-lab/busybox:1");
    let out_dir = dir.path().join("out");
    let name = format!("killed-mid-recreate-{}", std::process::id());
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 20
  volumes:
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
      preStop:
        exec: {{command: ["sh", "-c", "echo start >> /out/prestop; sleep 3; echo end >> /out/prestop"]}}
  - name: keeper
    image: {image}
    command: ["sh", "-c", "{IDLE}"]
"#,
        out = out_dir.display()
    );
    controller.apply_ok(&yaml);
    let before = ready_pod(&controller, &name);
    let uid = before["metadata"]["uid"].as_str().unwrap().to_owned();
    let keeper_before = container_status(&before, "keeper")["containerID"].clone();

    let request = crr_yaml("killed", &name, &["app"], "minStartedSeconds: 1", "");
    controller.apply_ok(&request);
    // SIGKILL while the preStop hook runs, and start the agent again on the same state.
    wait_until("the preStop hook to start", Duration::from_secs(60), || {
        std::fs::read_to_string(out_dir.join("prestop"))
            .ok()
            .filter(|text| text.contains("start"))
    });
    agent.restart();

    let done = completed(&controller, "killed", Duration::from_secs(120));
    assert_eq!(
        state_of(&done, "app")["phase"],
        "Succeeded",
        "{done:#}\n{}",
        log_tail(&agent.log, 30)
    );
    let after = ready_pod(&controller, &name);
    // Recreated exactly once: one more attempt, one running container, the pod and its
    // other container untouched.
    assert_eq!(
        container_status(&after, "app")["restartCount"],
        1,
        "{after:#}"
    );
    assert_eq!(
        container_status(&after, "keeper")["containerID"],
        keeper_before
    );
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(running_containers(&uid, "app"), 1);
    assert_eq!(lab_sandboxes(Lab::get().first_node(), &uid), 1);
    // The preStop hook the restart cut short ran again, to its end (hooks are at least
    // once, as in Kubernetes), within the grace period counted from its first start.
    // (containerd ends the first exec when the agent's call goes away.)
    let hooks = std::fs::read_to_string(out_dir.join("prestop")).unwrap();
    assert_eq!(hooks.matches("start").count(), 2, "{hooks}");
    assert!(hooks.ends_with("end\n"), "{hooks}");
    assert!(
        state_of(&done, "app")["message"]
            .as_str()
            .unwrap()
            .contains("preStop run again"),
        "{done:#}"
    );
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}

#[test]
fn an_agent_killed_during_a_20s_stop_and_back_before_it_ends_restarts_the_container_once() {
    killed_during_a_long_stop("back-mid-stop", Duration::from_secs(5));
}

#[test]
fn an_agent_killed_during_a_20s_stop_and_back_after_it_ends_restarts_the_container_once() {
    killed_during_a_long_stop("back-after-stop", Duration::from_secs(23));
}

/// The agent is killed after StopContainer was asked for and comes back after `away`:
/// while the container is still stopping (the stop must be waited for, not signalled
/// again) or once it has exited (the pod runner's next attempt is the recreate's result,
/// never stopped again).
fn killed_during_a_long_stop(test: &str, away: Duration) {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, mut agent) = controller_with_agent(
        dir.path(),
        &format!("recreate-{test}"),
        &format!("itest-recreate-{test}"),
    );
    let image = lab.image("rigger-lab/busybox:1");
    let out_dir = dir.path().join("out");
    let name = format!("{test}-{}", std::process::id());
    // SIGTERM is noted and the process takes 20 s to go (the grace period is 40 s).
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 40
  volumes:
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
  containers:
  - name: app
    image: {image}
    command: ["sh", "-c", "trap 'echo term >> /out/term; sleep 20; exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts: [{{name: out, mountPath: /out}}]
"#,
        out = out_dir.display()
    );
    controller.apply_ok(&yaml);
    ready_pod(&controller, &name);
    controller.apply_ok(&crr_yaml(
        "long-stop",
        &name,
        &["app"],
        "minStartedSeconds: 1",
        "",
    ));
    wait_until("the stop to begin", Duration::from_secs(60), || {
        std::fs::read_to_string(out_dir.join("term")).ok()
    });
    agent.kill();
    std::thread::sleep(away);
    agent.restart();

    let done = completed(&controller, "long-stop", Duration::from_secs(120));
    assert_eq!(
        state_of(&done, "app")["phase"],
        "Succeeded",
        "{done:#}\n{}",
        log_tail(&agent.log, 30)
    );
    if away < Duration::from_secs(20) {
        let message = state_of(&done, "app")["message"].as_str().unwrap_or("");
        assert!(
            message.contains("the stop begun before the agent restarted was waited for"),
            "{done:#}"
        );
    }
    // Give a second (wrong) stop time to show.
    std::thread::sleep(Duration::from_secs(3));
    let after = ready_pod(&controller, &name);
    assert_eq!(
        container_status(&after, "app")["restartCount"],
        1,
        "{after:#}\n{}",
        log_tail(&agent.log, 30)
    );
    let terms = std::fs::read_to_string(out_dir.join("term")).unwrap();
    assert_eq!(terms.matches("term").count(), 1, "stopped once: {terms}");
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}
