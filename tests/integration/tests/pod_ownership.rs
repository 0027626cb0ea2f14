//! The agent manages only sandboxes it can prove are its own. On a node that also runs
//! kubelet, a tenant can put Rigger's labels on a pod (kubelet copies them onto the
//! sandbox): such a sandbox must survive, whatever uid label it claims, and the agent's
//! own pod must stay as it was. And state the agent cannot read is no order to remove
//! anything.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::time::Duration;

use rigger_integration_tests::{
    Agent, Controller, CriPod, CriPodSpec, Lab, log_tail, running_containers, wait_until,
};

/// A controller and an agent (node `<prefix>-<pid>`) on the lab's first node, the node
/// ready.
struct Scene {
    controller: Controller,
    agent: Agent,
    state: std::path::PathBuf,
    node: String,
    image: String,
    _dir: tempfile::TempDir,
}

impl Scene {
    fn start(prefix: &str) -> Self {
        let lab = Lab::get();
        let dir = tempfile::tempdir().unwrap();
        let controller = Controller::start(&dir.path().join("controller"));
        let state = dir.path().join("agent");
        std::fs::create_dir_all(&state).unwrap();
        let node = format!("{prefix}-{}", std::process::id());
        let lab_node = lab.first_node();
        let agent = Agent::start(
            &controller,
            &node,
            &lab_node.address,
            &lab_node.hosts_dir,
            &format!("itest-{prefix}"),
            &state,
        );
        wait_until("the node to be ready", Duration::from_secs(30), || {
            let n = controller.get_json(&["node", &node])?;
            (n["status"]["conditions"][0]["status"] == "True").then_some(())
        });
        Self {
            controller,
            agent,
            state,
            node,
            image: lab.image("rigger-lab/busybox:1"),
            _dir: dir,
        }
    }

    /// Apply a pod `name` that sleeps, and wait until it is ready.
    fn run_pod(&self, name: &str) -> serde_json::Value {
        self.controller.apply_ok(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  nodeName: {}\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {}\n    command: [\"sleep\", \"3600\"]\n",
            self.node, self.image
        ));
        wait_until("the pod to run", Duration::from_secs(60), || {
            let pod = self.controller.get_json(&["pod", name])?;
            (pod["status"]["containerStatuses"][0]["ready"] == true).then_some(pod)
        })
    }
}

#[test]
fn a_kubelet_pod_wearing_riggers_labels_is_left_alone() {
    let scene = Scene::start("owner");
    let node = Lab::get().first_node();
    let (controller, agent, state, agent_node, image) = (
        &scene.controller,
        &scene.agent,
        &scene.state,
        &scene.node,
        &scene.image,
    );
    let name = format!("own-{}", std::process::id());
    let running = scene.run_pod(&name);
    let own_uid = running["metadata"]["uid"].as_str().unwrap().to_owned();
    let own_container = running["status"]["containerStatuses"][0]["containerID"].clone();

    // Kubelet's pods with Rigger's labels for this node: one claiming no uid (the old
    // code joined "" into a path: the whole pods directory), one claiming the agent's
    // own pod's uid, one a uid that is a path.
    let wearing = |pod: &str, claimed: Option<&str>| {
        let mut spec = CriPodSpec::on(node, pod, image, &["sleep", "3600"]);
        let mut labels: HashMap<String, String> = [
            ("rigger.dev/managed", "true"),
            ("rigger.dev/node", agent_node.as_str()),
            ("io.kubernetes.pod.name", pod),
            ("io.kubernetes.pod.namespace", "tenant"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        labels.insert("io.kubernetes.pod.uid".to_owned(), spec.uid.clone());
        if let Some(uid) = claimed {
            labels.insert("rigger.dev/pod-uid".to_owned(), uid.to_owned());
        }
        spec.labels = labels;
        CriPod::run_spec(&spec)
    };
    let mut tenants = [
        wearing(&format!("tenant-a-{}", std::process::id()), None),
        wearing(&format!("tenant-b-{}", std::process::id()), Some(&own_uid)),
        wearing(&format!("tenant-c-{}", std::process::id()), Some("../..")),
    ];
    let logs = || log_tail(&agent.log, 40);
    wait_until("the agent to notice them", Duration::from_secs(30), || {
        let log = std::fs::read_to_string(&agent.log).ok()?;
        (log.matches("is not this agent's").count() >= 3).then_some(())
    });
    // Several reconciles later (one a second), all still running.
    std::thread::sleep(Duration::from_secs(5));
    for tenant in &mut tenants {
        assert_eq!(tenant.container_state(), "CONTAINER_RUNNING", "{}", logs());
    }
    let pod = controller.get_json(&["pod", &name]).unwrap();
    assert_eq!(
        pod["status"]["containerStatuses"][0]["containerID"],
        own_container
    );
    assert_eq!(pod["status"]["containerStatuses"][0]["ready"], true);
    assert!(
        state.join("pods").join(&own_uid).is_dir(),
        "the pod's directory"
    );

    // Deleting the agent's pod removes only it.
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
    wait_until("the pod's directory to go", Duration::from_secs(60), || {
        (!state.join("pods").join(&own_uid).exists()).then_some(())
    });
    for tenant in &mut tenants {
        assert_eq!(tenant.container_state(), "CONTAINER_RUNNING", "{}", logs());
    }
    assert!(
        state.join("pods").is_dir(),
        "the pods directory itself stays"
    );
}

#[test]
fn a_torn_pod_set_at_start_removes_nothing_until_the_controller_sends_it() {
    let mut scene = Scene::start("torn");
    let name = format!("kept-{}", std::process::id());
    let running = scene.run_pod(&name);
    let uid = running["metadata"]["uid"].as_str().unwrap().to_owned();
    let container = running["status"]["containerStatuses"][0]["containerID"].clone();

    // Power lost mid-write, and the controller away: the agent starts on a torn file.
    let (controller, agent, state) = (&mut scene.controller, &mut scene.agent, &scene.state);
    agent.kill();
    controller.kill();
    let desired = state.join("pods/desired.json");
    let whole = std::fs::read(&desired).unwrap();
    std::fs::write(&desired, &whole[..whole.len() / 2]).unwrap();
    agent.restart();
    wait_until("the agent to say so", Duration::from_secs(30), || {
        let log = std::fs::read_to_string(&agent.log).ok()?;
        log.contains("the node's pods are unreadable").then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        running_containers(&uid, "main"),
        1,
        "{}",
        log_tail(&agent.log, 30)
    );
    let kept: Vec<String> = std::fs::read_dir(state.join("pods"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("desired.json.unreadable-"))
        .collect();
    assert_eq!(kept.len(), 1, "the torn file is kept for a human");

    // The controller's pod set arrives: the same pod, the same container.
    controller.restart();
    wait_until("the pod set to arrive", Duration::from_secs(60), || {
        let log = std::fs::read_to_string(&agent.log).ok()?;
        log.contains("the controller's pod set arrived")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    let pod = controller.get_json(&["pod", &name]).unwrap();
    assert_eq!(
        pod["status"]["containerStatuses"][0]["containerID"],
        container
    );
    assert_eq!(running_containers(&uid, "main"), 1);
    assert!(controller.ctl(&["delete", "pod", &name]).status.success());
}
