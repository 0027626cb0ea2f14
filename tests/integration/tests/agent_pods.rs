//! Agent-managed pods on a lab node: applied through the controller, run by the agent
//! through CRI, adopted (not duplicated) after an agent restart, restarted after a crash,
//! removed when deleted; on every containerd version the lab runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;
use std::time::Duration;

use rigger_integration_tests::{
    Agent, Controller, Lab, LabNode, binary, log_tail, on_every_containerd, wait_until,
};
use serde_json::Value;

fn pod_yaml(name: &str, image: &str, command: &str, policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: {name}\nspec:\n  hostNetwork: true\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {image}\n    command: [\"sh\", \"-c\", \"{command}\"]\n    env:\n    - name: POD_NAME\n      valueFrom:\n        fieldRef:\n          fieldPath: metadata.name\n"
    )
}

/// Rigger-owned sandboxes `node` reports for pod `name`.
fn sandboxes(node: &LabNode, name: &str) -> Vec<Value> {
    let out = Command::new(binary("rigger-agent"))
        .args(["status", "-o", "json", "--no-disk-usage", "--address"])
        .arg(&node.address)
        .output()
        .unwrap();
    let inventory: Value = serde_json::from_slice(&out.stdout).unwrap();
    inventory["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["owner"] == "rigger" && p["name"] == name && p["state"] == "ready")
        .cloned()
        .collect()
}

on_every_containerd!(
    a_pod_runs_survives_an_agent_restart_restarts_crashes_and_goes_when_deleted,
    probes_and_hooks_run_as_kubelet_runs_them,
);

fn a_pod_runs_survives_an_agent_restart_restarts_crashes_and_goes_when_deleted(node: &LabNode) {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let mut agent = Agent::start(
        &controller,
        "pods-node",
        &node.address,
        &node.hosts_dir,
        "itest-pods",
        &state,
    );
    let image = lab.image("rigger-lab/busybox:1");
    let name = format!("web-{}", std::process::id());
    let crasher = format!("crash-{}", std::process::id());
    let agent_log = agent.log.clone();
    let logs = || {
        format!(
            "{}\n{}",
            log_tail(&controller.log, 20),
            log_tail(&agent_log, 30)
        )
    };
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = controller.get_json(&["node", "pods-node"])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });

    let out = controller.apply(&pod_yaml(
        &name,
        &image,
        "echo started $POD_NAME; sleep 3600",
        "Always",
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let running = wait_until("the pod to run", Duration::from_secs(60), || {
        let pod = controller.get_json(&["pod", &name])?;
        (pod["status"]["phase"] == "Running"
            && pod["status"]["containerStatuses"][0]["ready"] == true)
            .then_some(pod)
    });
    let container_id = running["status"]["containerStatuses"][0]["containerID"].clone();
    assert!(
        container_id.as_str().unwrap().starts_with("containerd://"),
        "{running:#}"
    );
    assert_eq!(running["status"]["conditions"][3]["type"], "Ready");
    assert_eq!(sandboxes(node, &name).len(), 1);
    let log_dir = state
        .join("pods")
        .join(running["metadata"]["uid"].as_str().unwrap())
        .join("logs");
    let log = wait_until("the container's log", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(log_dir.join("main/0.log")).ok()?;
        text.contains("started").then_some(text)
    });
    assert!(
        log.contains(&format!("started {name}")),
        "fieldRef env reached the container: {log}"
    );
    // riggerctl logs and exec reach the container through the controller and the agent.
    let logs_out = controller.ctl(&["logs", &name, "--tail", "1"]);
    assert!(
        logs_out.status.success(),
        "{}",
        String::from_utf8_lossy(&logs_out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&logs_out.stdout),
        format!("started {name}\n")
    );
    let exec_out = controller.ctl(&[
        "exec",
        &name,
        "-c",
        "main",
        "--",
        "sh",
        "-c",
        "echo in $POD_NAME; exit 3",
    ]);
    assert_eq!(
        exec_out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&exec_out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&exec_out.stdout),
        format!("in {name}\n")
    );
    // `logs -f` prints what is there and keeps following.
    {
        use std::io::BufRead as _;
        let mut follow = controller
            .ctl_command("viewer", &controller.endpoints, &["logs", "-f", &name])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(follow.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert_eq!(first, format!("started {name}\n"));
        assert!(follow.try_wait().unwrap().is_none(), "-f keeps running");
        follow.kill().unwrap();
        follow.wait().unwrap();
    }
    let viewer = controller.ctl_as("viewer", &["exec", &name, "--", "true"]);
    assert!(String::from_utf8_lossy(&viewer.stderr).contains("may only read"));

    // SIGKILL and start again: the same sandbox and container, nothing duplicated.
    agent.kill();
    agent.restart();
    std::thread::sleep(Duration::from_secs(4));
    let after = wait_until(
        "the restarted agent to report",
        Duration::from_secs(30),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            (pod["status"]["phase"] == "Running").then_some(pod)
        },
    );
    assert_eq!(
        after["status"]["containerStatuses"][0]["containerID"],
        container_id,
        "{}",
        logs()
    );
    assert_eq!(after["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(sandboxes(node, &name).len(), 1, "no second sandbox");

    // A controller restart changes nothing on the node.
    let mut controller = controller;
    controller.restart();
    std::thread::sleep(Duration::from_secs(3));
    let after_controller = wait_until(
        "the pod after a controller restart",
        Duration::from_secs(30),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            (pod["status"]["phase"] == "Running").then_some(pod)
        },
    );
    assert_eq!(
        after_controller["status"]["containerStatuses"][0]["containerID"],
        container_id
    );
    assert_eq!(
        after_controller["status"]["containerStatuses"][0]["restartCount"],
        0
    );
    assert_eq!(sandboxes(node, &name).len(), 1);

    // A crashing container is restarted (after kubelet's 10 s back-off) and counted.
    let out = controller.apply(&pod_yaml(&crasher, &image, "exit 3", "Always"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let crashed = wait_until(
        "a restart of the crashing container",
        Duration::from_secs(60),
        || {
            let pod = controller.get_json(&["pod", &crasher])?;
            (pod["status"]["containerStatuses"][0]["restartCount"].as_u64()? >= 1).then_some(pod)
        },
    );
    assert_eq!(crashed["status"]["phase"], "Running", "{crashed:#}");

    // Deleting the pod stops it and removes its sandbox.
    for pod in [&name, &crasher] {
        let out = controller.ctl(&["delete", "pod", pod]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_until("the sandboxes to go", Duration::from_secs(60), || {
        (sandboxes(node, &name).is_empty() && sandboxes(node, &crasher).is_empty()).then_some(())
    });
}

fn probes_and_hooks_run_as_kubelet_runs_them(node: &LabNode) {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let _agent = Agent::start(
        &controller,
        "probes-node",
        &node.address,
        &node.hosts_dir,
        "itest-probes",
        &state,
    );
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = controller.get_json(&["node", "probes-node"])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });
    let image = lab.image("rigger-lab/busybox:1");
    let web_port = rigger_integration_tests::free_port();
    let (hook_port, hooks) = rigger_integration_tests::http_recorder();
    let name = format!("probed-{}", std::process::id());
    let out_dir = dir.path().join("out");
    let out = out_dir.display();
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 5
  volumes:
  - name: shared
    emptyDir: {{}}
  - name: out
    hostPath: {{path: {out}, type: DirectoryOrCreate}}
  initContainers:
  - name: init
    image: {image}
    command: ["sh", "-c", "echo init > /shared/init.txt"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
  containers:
  - name: web
    image: {image}
    command: ["sh", "-c", "mkdir -p /www && sleep 2 && echo ok > /www/ready && exec httpd -f -p 127.0.0.1:{web_port} -h /www"]
    ports: [{{name: http, containerPort: {web_port}}}]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
    readinessProbe:
      httpGet: {{path: /ready, port: http}}
      periodSeconds: 1
    lifecycle:
      postStart:
        exec: {{command: ["sh", "-c", "echo poststart > /shared/poststart.txt"]}}
      preStop:
        httpGet: {{path: /prestop, port: {hook_port}}}
  - name: graceful
    image: {image}
    command: ["sh", "-c", "trap 'echo term > /out/term; exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts: [{{name: out, mountPath: /out}}]
  - name: sidecar
    image: {image}
    command: ["sh", "-c", "sleep 3600"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
    livenessProbe:
      exec: {{command: ["sh", "-c", "test ! -f /shared/kill"]}}
      periodSeconds: 1
      failureThreshold: 1
"#
    );
    let out = controller.apply(&yaml);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Init container first, then both containers; Ready only once the readiness probe
    // (httpd serving /ready after 2 s) passes.
    let mut last = serde_json::Value::Null;
    let ready = rigger_integration_tests::poll_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            let ready = pod["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            last = pod.clone();
            ready.then_some(pod)
        },
    )
    .unwrap_or_else(|| panic!("the pod was not ready within 60 s: {last:#}"));
    assert_eq!(
        ready["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"], 0,
        "{ready:#}"
    );
    let uid = ready["metadata"]["uid"].as_str().unwrap().to_owned();
    let shared = state.join("pods").join(&uid).join("volumes").join("shared");
    assert_eq!(
        std::fs::read_to_string(shared.join("init.txt"))
            .unwrap()
            .trim(),
        "init"
    );
    assert_eq!(
        std::fs::read_to_string(shared.join("poststart.txt"))
            .unwrap()
            .trim(),
        "poststart"
    );

    // A failing liveness probe restarts the sidecar.
    std::fs::write(shared.join("kill"), b"").unwrap();
    wait_until(
        "the liveness probe to restart the sidecar",
        Duration::from_secs(60),
        || {
            let pod = controller.get_json(&["pod", &name])?;
            let sidecar = pod["status"]["containerStatuses"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == "sidecar")?
                .clone();
            (sidecar["restartCount"].as_u64()? >= 1).then_some(())
        },
    );
    std::fs::remove_file(shared.join("kill")).unwrap();

    // Deleting the pod runs preStop (an httpGet the test sees) before stopping.
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
    wait_until("the preStop hook", Duration::from_secs(60), || {
        hooks
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("GET /prestop"))
            .then_some(())
    });
    wait_until("the pod's sandbox to go", Duration::from_secs(60), || {
        sandboxes(node, &name).is_empty().then_some(())
    });
}

/// `logs -f` follows the log as the container writes it: each line once, in order,
/// through the controller's stream (the agent is asked only for what is new).
#[test]
fn logs_follow_prints_each_new_line_once() {
    use std::io::BufRead as _;
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, _agent) =
        rigger_integration_tests::controller_with_agent(dir.path(), "follow-node", "itest-follow");
    let image = lab.image("rigger-lab/busybox:1");
    let name = format!("ticker-{}", std::process::id());
    controller.apply_ok(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: ticker\n    image: {image}\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done\"]\n"
    ));
    wait_until("the ticker's first line", Duration::from_secs(90), || {
        let out = controller.ctl(&["logs", &name]);
        String::from_utf8_lossy(&out.stdout)
            .contains("tick 1")
            .then_some(())
    });
    let mut follow = controller
        .ctl_command("viewer", &controller.endpoints, &["logs", "-f", &name])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = std::io::BufReader::new(follow.stdout.take().unwrap());
    let mut ticks = Vec::new();
    while ticks.len() < 15 {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let n: u32 = line
            .trim()
            .strip_prefix("tick ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line:?}"));
        ticks.push(n);
    }
    follow.kill().unwrap();
    follow.wait().unwrap();
    let expected: Vec<u32> = (1..=15).collect();
    assert_eq!(ticks, expected, "each line once, in order");
    // Without -f: the whole log so far (streamed in bounded pieces), and it ends.
    let whole = controller.ctl(&["logs", &name]);
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    let whole = String::from_utf8_lossy(&whole.stdout);
    assert!(whole.starts_with("tick 1\ntick 2\n"), "{whole}");
    assert!(whole.contains("tick 15\n"), "{whole}");
    let last = controller.ctl(&["logs", &name, "--tail", "1"]);
    let last = String::from_utf8_lossy(&last.stdout);
    assert_eq!(last.lines().count(), 1, "{last}");
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}

/// A log bigger than one answer (16 MiB): `--tail` reads only its end, a plain `logs`
/// streams all of it in pieces, every line once.
#[test]
fn a_log_bigger_than_one_answer_is_read_whole_and_tailed_from_its_end() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let (controller, _agent) =
        rigger_integration_tests::controller_with_agent(dir.path(), "biglog-node", "itest-biglog");
    let image = lab.image("rigger-lab/busybox:1");
    let name = format!("biglog-{}", std::process::id());
    controller.apply_ok(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: writer\n    image: {image}\n    command: [\"sh\", \"-c\", \"seq 1 500000; echo done; trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n"
    ));
    wait_until(
        "the whole log to be written",
        Duration::from_secs(120),
        || {
            let out = controller.ctl(&["logs", &name, "--tail", "1"]);
            (String::from_utf8_lossy(&out.stdout) == "done\n").then_some(())
        },
    );
    let out = controller.ctl(&["logs", &name]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 500_001, "every line once");
    assert_eq!(lines[0], "1");
    assert_eq!(lines[499_999], "500000");
    let tail = controller.ctl(&["logs", &name, "--tail", "3"]);
    assert_eq!(
        String::from_utf8_lossy(&tail.stdout),
        "499999\n500000\ndone\n"
    );
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}
