//! Events like Kubernetes': what happens to a job, a recreate and a node is recorded by
//! a standalone controller as core/v1-shaped Events, which `riggerctl get events` lists
//! (kubectl's columns) and `riggerctl describe` shows under the object; users cannot
//! write them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::{Agent, Controller, Lab, log_tail, wait_until};
use serde_json::Value;

/// The events about `kind`/`name` (in `namespace`), as `get events -o json` lists them.
fn events_about(controller: &Controller, namespace: &str, kind: &str, name: &str) -> Vec<Value> {
    let list = controller
        .get_json(&["events", "-n", namespace])
        .unwrap_or_default();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["kind"] == kind && e["involvedObject"]["name"] == name)
        .cloned()
        .collect()
}

fn reasons(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_job_a_recreate_and_a_lost_node_are_told_as_events() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let node = lab.first_node();
    let mut agent = Agent::start(
        &controller,
        "events-node",
        &node.address,
        &node.hosts_dir,
        "itest-events",
        &state,
    );
    let logs = || {
        format!(
            "{}\n{}",
            log_tail(&controller.log, 20),
            log_tail(&agent.log, 20)
        )
    };

    // The node registered: Kubernetes' RegisteredNode, in `default` as a Node's are.
    wait_until("RegisteredNode", Duration::from_secs(30), || {
        let events = events_about(&controller, "default", "Node", "events-node");
        reasons(&events)
            .contains(&"RegisteredNode".to_owned())
            .then_some(())
    });

    // A job's end: Kruise's PullImageSucceed, shown by describe.
    let image = lab.image("rigger-lab/busybox:1");
    controller.apply_ok(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: events-job\nspec:\n  image: {image}\n  selector:\n    names: [events-node]\n  completionPolicy:\n    type: Always\n"
    ));
    let job_events = wait_until("PullImageSucceed", Duration::from_secs(60), || {
        let events = events_about(&controller, "default", "ImagePullJob", "events-job");
        (!events.is_empty()).then_some(events)
    });
    assert_eq!(
        reasons(&job_events),
        ["PullImageSucceed"],
        "{job_events:#?}"
    );
    let event = &job_events[0];
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["count"], 1);
    assert_eq!(event["source"]["component"], "rigger-controller");
    let job = controller
        .get_json(&["imagepulljob", "events-job"])
        .unwrap();
    assert_eq!(event["involvedObject"]["uid"], job["metadata"]["uid"]);
    let described = controller.ctl(&["describe", "imagepulljob", "events-job"]);
    let described = String::from_utf8_lossy(&described.stdout);
    let section = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        section.contains("PullImageSucceed") && section.contains("rigger-controller"),
        "{described}"
    );

    // A recreate's end: Recreated, naming the container.
    controller.apply_ok(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: events-web\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n"
    ));
    wait_until("the pod to run", Duration::from_secs(60), || {
        let pod = controller.get_json(&["pod", "events-web"])?;
        (pod["status"]["phase"] == "Running").then_some(())
    });
    let recreate = controller.ctl(&["recreate", "events-web", "-c", "app", "--wait"]);
    assert!(
        recreate.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&recreate.stderr),
        logs()
    );
    let crr = controller
        .get_json(&["crr"])
        .and_then(|list| list["items"].as_array().and_then(|i| i.first().cloned()))
        .unwrap();
    let crr_name = crr["metadata"]["name"].as_str().unwrap().to_owned();
    let recreated = wait_until("Recreated", Duration::from_secs(30), || {
        let events = events_about(
            &controller,
            "default",
            "ContainerRecreateRequest",
            &crr_name,
        );
        (!events.is_empty()).then_some(events)
    });
    assert_eq!(reasons(&recreated), ["Recreated"]);
    assert_eq!(
        recreated[0]["message"], "Recreated app in pod events-web",
        "{recreated:#?}"
    );

    // `get events`: kubectl's columns.
    let table = controller.ctl(&["get", "events"]);
    let table = String::from_utf8_lossy(&table.stdout);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{table}"
    );
    assert!(table.contains("imagepulljob/events-job"), "{table}");

    // Users cannot write events.
    let forged = controller.apply(
        "apiVersion: v1\nkind: Event\nmetadata:\n  name: forged\ninvolvedObject: {kind: Node, name: events-node}\nreason: NodeReady\n",
    );
    assert!(!forged.status.success());
    assert!(
        String::from_utf8_lossy(&forged.stderr).contains("read-only"),
        "{}",
        String::from_utf8_lossy(&forged.stderr)
    );

    // The node lost: NodeNotReady, a warning naming why; back: NodeReady.
    let _ = controller.ctl(&["delete", "pod", "events-web"]);
    agent.kill();
    let lost = wait_until("NodeNotReady", Duration::from_secs(30), || {
        events_about(&controller, "default", "Node", "events-node")
            .into_iter()
            .find(|e| e["reason"] == "NodeNotReady")
    });
    assert_eq!(lost["type"], "Warning");
    agent.restart();
    wait_until("NodeReady", Duration::from_secs(30), || {
        let events = events_about(&controller, "default", "Node", "events-node");
        reasons(&events)
            .contains(&"NodeReady".to_owned())
            .then_some(())
    });
}
