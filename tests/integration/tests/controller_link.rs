//! An agent on the lab registers with a controller; riggerctl shows the node. Security:
//! certificates and tokens are required, and whoever lacks them is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::{Command, Stdio};
use std::time::Duration;

use std::path::Path;

use rigger_integration_tests::{
    Agent, Controller, Daemon, Lab, binary, controller_certs, free_port, wait_until,
};
use serde_json::Value;

fn nodes(server: &str) -> Option<Value> {
    let out = Command::new(binary("riggerctl"))
        .args(["--server", server, "get", "nodes", "-o", "json"])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn agent_registers_and_is_marked_not_ready_when_it_goes() {
    let lab = Lab::get();
    let (grpc, health) = (free_port(), free_port());
    let server = format!("http://127.0.0.1:{grpc}");
    let data = tempfile::tempdir().unwrap();
    let _controller = Daemon::spawn(
        Command::new(binary("rigger-controller"))
            .arg("--data-dir")
            .arg(data.path())
            .args(["--listen", &format!("127.0.0.1:{grpc}")])
            .args(["--health-listen", &format!("127.0.0.1:{health}")])
            .args(["--heartbeat-interval", "1s", "--node-timeout", "3s"])
            .arg("--insecure-plaintext")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let mut agent = Daemon::spawn(
        Command::new(binary("rigger-agent"))
            .args(["run", "--address"])
            .arg(&lab.containerd_address)
            .args(["--health-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--controller", &server, "--insecure-plaintext"])
            .args([
                "--node-name",
                "itest-node-1",
                "--node-labels",
                "zone=a,disk=ssd",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );

    let node = wait_until(
        "the node to be ready with its inventory",
        Duration::from_secs(30),
        || {
            let list = nodes(&server)?;
            let node = list["items"]
                .as_array()?
                .iter()
                .find(|n| n["metadata"]["name"] == "itest-node-1")?
                .clone();
            let ready = node["status"]["conditions"][0]["status"] == "True";
            (ready && node["status"]["nodeInfo"]["containerRuntimeVersion"] != "").then_some(node)
        },
    );
    assert_eq!(node["metadata"]["labels"]["zone"], "a");
    assert_eq!(node["metadata"]["labels"]["disk"], "ssd");
    assert_eq!(
        node["status"]["nodeInfo"]["agentVersion"],
        env!("CARGO_PKG_VERSION")
    );

    let table = Command::new(binary("riggerctl"))
        .args(["--server", &server, "get", "nodes"])
        .output()
        .unwrap();
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(
        table.contains("itest-node-1") && table.contains("Ready"),
        "{table}"
    );

    assert!(agent.terminate(Duration::from_secs(10)).success());
    let node = wait_until("the node to be not ready", Duration::from_secs(10), || {
        let list = nodes(&server)?;
        let node = list["items"].as_array()?.first()?.clone();
        (node["status"]["conditions"][0]["status"] == "False").then_some(node)
    });
    assert_eq!(
        node["status"]["conditions"][0]["message"],
        "agent disconnected"
    );
}

#[test]
fn riggerctl_without_a_controller_is_one_clear_line() {
    let out = Command::new(binary("riggerctl"))
        .args([
            "--server",
            &format!("http://127.0.0.1:{}", free_port()),
            "get",
            "nodes",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("riggerctl: error: cannot reach the controller"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

#[test]
fn riggerctl_waits_out_the_request_rate_limit_instead_of_failing() {
    // One request per second and none in reserve; applying three objects takes seven
    // (connect, three dry runs, three applies), so riggerctl must be refused and wait,
    // however fast or slow it runs.
    let data = tempfile::tempdir().unwrap();
    let controller = Controller::start_with(
        data.path(),
        &["--api-requests-per-second", "1", "--api-burst", "1"],
    );
    let secrets: Vec<String> = (1..=3)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: login-{i}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{{\"auths\":{{}}}}'\n"
            )
        })
        .collect();
    let out = controller.apply(&secrets.join("---\n"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "riggerctl: the controller limits this client's requests per second; retrying in"
        ),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for i in 1..=3 {
        assert!(
            stdout.contains(&format!("secret/login-{i} created")),
            "{stdout}"
        );
    }

    // A limit of nothing is refused before the controller binds.
    let out = Command::new(binary("rigger-controller"))
        .args(["--insecure-plaintext", "--api-burst", "0", "--check-config"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr
            .contains("`api_burst` (--api-burst, RIGGER_CONTROLLER_API_BURST): must be at least 1"),
        "{stderr}"
    );
}

#[test]
fn an_unusable_data_dir_stops_the_controller_before_it_listens() {
    let data = tempfile::tempdir().unwrap();
    let not_a_dir = data.path().join("file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let out = Command::new(binary("rigger-controller"))
        .arg("--data-dir")
        .arg(&not_a_dir)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--health-listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--insecure-plaintext")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(last.contains(&not_a_dir.display().to_string()), "{last}");
}

/// An agent started against `controller` with the given TLS files and node name; the
/// rest of its settings are the lab's.
fn agent_with(
    controller: &Controller,
    node: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    log: &Path,
) -> Daemon {
    let lab = Lab::get();
    Daemon::spawn(
        Command::new(binary("rigger-agent"))
            .args(["run", "--address"])
            .arg(&lab.containerd_address)
            .args(["--health-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--controller", &controller.server, "--node-name", node])
            .arg("--ca-file")
            .arg(ca)
            .arg("--cert-file")
            .arg(cert)
            .arg("--key-file")
            .arg(key)
            .arg("--state-dir")
            .arg(log.parent().unwrap())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap()),
    )
}

#[test]
fn agents_without_a_valid_certificate_or_with_another_nodes_name_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(dir.path());
    let sub = |name: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    };

    // A certificate from another CA: the TLS handshake fails.
    let other_pki = dir.path().join("other-pki");
    controller_certs(&other_pki, &["sec-stranger"]);
    let stranger_log = sub("stranger").join("agent.log");
    let _stranger = agent_with(
        &controller,
        "sec-stranger",
        &controller.pki.join("ca.pem"),
        &other_pki.join("agent-sec-stranger.pem"),
        &other_pki.join("agent-sec-stranger-key.pem"),
        &stranger_log,
    );
    // A valid certificate for sec-honest, used to claim sec-victim.
    let (ca, cert, key) = controller.agent_certs("sec-honest");
    let impostor_log = sub("impostor").join("agent.log");
    let _impostor = agent_with(&controller, "sec-victim", &ca, &cert, &key, &impostor_log);
    // And the same certificate with its own name is accepted.
    let honest_log = sub("honest").join("agent.log");
    let _honest = agent_with(&controller, "sec-honest", &ca, &cert, &key, &honest_log);

    wait_until(
        "the honest agent to register",
        Duration::from_secs(30),
        || controller.get_json(&["node", "sec-honest"]),
    );
    let impostor = wait_until(
        "the impostor to be refused",
        Duration::from_secs(30),
        || {
            let log = std::fs::read_to_string(&impostor_log).unwrap();
            log.lines()
                .find(|l| l.contains("not issued for node \"sec-victim\""))
                .map(str::to_owned)
        },
    );
    assert!(impostor.contains("controller link down"), "{impostor}");
    wait_until(
        "the stranger's handshake to fail",
        Duration::from_secs(30),
        || {
            let log = std::fs::read_to_string(&stranger_log).unwrap();
            log.contains("controller link down").then_some(())
        },
    );
    let nodes = controller.get_json(&["nodes"]).unwrap();
    let names: Vec<&str> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["sec-honest"], "only the honest agent is known");
    let controller_log = std::fs::read_to_string(&controller.log).unwrap();
    assert!(
        controller_log.contains("agent session refused"),
        "{controller_log}"
    );
}

#[test]
fn users_need_a_token_and_viewers_cannot_change_anything() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(dir.path());
    let job = "apiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: j\nspec:\n  image: registry.example/app:1\n  selector:\n    names: [nowhere]\n";
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, job).unwrap();
    let file = file.to_str().unwrap();

    let anonymous = Command::new(binary("riggerctl"))
        .args(["--server", &controller.server])
        .arg("--ca-file")
        .arg(controller.pki.join("ca.pem"))
        .args(["get", "nodes"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&anonymous.stderr);
    assert!(!anonymous.status.success());
    assert!(stderr.contains("no bearer token"), "{stderr}");

    let viewer = controller.ctl_as("viewer", &["apply", "-f", file]);
    let stderr = String::from_utf8_lossy(&viewer.stderr);
    assert!(!viewer.status.success());
    assert!(stderr.contains("may only read"), "{stderr}");
    assert!(
        controller
            .ctl_as("viewer", &["get", "nodes"])
            .status
            .success()
    );

    let admin = controller.ctl(&["apply", "-f", file]);
    assert!(
        admin.status.success(),
        "{}",
        String::from_utf8_lossy(&admin.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&admin.stdout).trim(),
        "imagepulljob.rigger.dev/j created"
    );
    let again = controller.ctl(&["apply", "-f", file]);
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        "imagepulljob.rigger.dev/j unchanged"
    );

    // Without the CA, riggerctl does not trust the controller.
    let untrusting = Command::new(binary("riggerctl"))
        .args(["--server", &controller.server])
        .arg("--ca-file")
        .arg(dir.path().join("job.yaml"))
        .args(["get", "nodes"])
        .output()
        .unwrap();
    assert!(!untrusting.status.success());
}

#[test]
fn an_invalid_object_is_refused_with_its_field_and_nothing_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(dir.path());
    let yaml = "apiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: fine\nspec:\n  image: registry.example/app:1\n---\napiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: broken\nspec:\n  image: registry.example/app:1\n  parallelism: \"150%\"\n";
    let out = controller.apply(yaml);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("ImagePullJob default/broken: spec.parallelism"),
        "{stderr}"
    );
    // All or nothing: the valid first document was not applied either.
    let list = controller.get_json(&["imagepulljobs"]).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");

    let out = controller.apply(
        "apiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: typo\nspec:\n  image: registry.example/app:1\n  paralelism: 2\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("spec.paralelism: unknown field `paralelism`"),
        "{stderr}"
    );
    let out = controller.apply(
        "apiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: both\nspec:\n  image: registry.example/app:1\n  selector:\n    names: [a]\n  podSelector:\n    matchLabels: {app: web}\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("spec.podSelector: selector and podSelector are mutually exclusive"),
        "{stderr}"
    );

    // An object over the size limit is refused as such, before anything is parsed.
    let big = format!(
        "apiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: big\n  annotations:\n    filler: \"{}\"\nspec:\n  image: registry.example/app:1\n  selector:\n    names: [a]\n",
        "x".repeat(2 << 20)
    );
    let out = controller.apply(&big);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at most 1048576 are accepted"), "{stderr}");
    assert!(controller.get_json(&["imagepulljob", "big"]).is_none());
}

#[test]
fn pods_are_placed_on_the_ready_node_with_the_fewest_and_unsupported_ones_refused() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let _agents: Vec<Agent> = [
        ("place-a", &lab.containerd_address),
        ("place-b", &lab.node2_containerd_address),
    ]
    .into_iter()
    .map(|(node, containerd)| {
        let state = dir.path().join(node);
        std::fs::create_dir_all(&state).unwrap();
        Agent::start(
            &controller,
            node,
            containerd,
            &lab.hosts_dir,
            "itest-place",
            &state,
        )
    })
    .collect();
    for node in ["place-a", "place-b"] {
        wait_until(
            &format!("{node} to be ready"),
            Duration::from_secs(30),
            || {
                let n = controller.get_json(&["node", node])?;
                (n["status"]["conditions"][0]["status"] == "True").then_some(())
            },
        );
    }
    let pod = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{extra}  nodeSelector:\n    rigger.test/agent: \"yes\"\n  containers:\n  - name: app\n    image: {}\n",
            lab.image("rigger-lab/busybox:1")
        )
    };
    let mut placed = Vec::new();
    for name in ["p1", "p2"] {
        let out = controller.apply(&pod(name, "  hostNetwork: true\n"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stored = controller.get_json(&["pod", name]).unwrap();
        placed.push(stored["spec"]["nodeName"].as_str().unwrap().to_owned());
    }
    placed.sort();
    assert_eq!(
        placed,
        ["place-a", "place-b"],
        "one pod per node: the fewest wins"
    );
    let again = controller.apply(&pod("p1", "  hostNetwork: true\n"));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        "pod/p1 unchanged"
    );

    let refused = controller.apply(&pod("p3", ""));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("Pod default/p3: spec.hostNetwork: must be true"),
        "{stderr}"
    );
    // No node matches: taken and left Pending, as Kubernetes does, with an event saying
    // why; placed once a node matches.
    let nowhere =
        controller.apply(&pod("p4", "  hostNetwork: true\n").replace("\"yes\"", "\"no\""));
    assert!(
        nowhere.status.success(),
        "{}",
        String::from_utf8_lossy(&nowhere.stderr)
    );
    let pending = controller.get_json(&["pod", "p4"]).unwrap();
    assert!(pending["spec"]["nodeName"].is_null(), "{pending}");
    wait_until(
        "p4's FailedScheduling event",
        Duration::from_secs(10),
        || {
            let events = controller.ctl(&["get", "events"]);
            let events = String::from_utf8_lossy(&events.stdout);
            (events.contains("FailedScheduling") && events.contains("no ready node matches"))
                .then_some(())
        },
    );
    let label = controller.ctl(&["label", "node", "place-b", "rigger.test/agent=no"]);
    assert!(
        label.status.success(),
        "{}",
        String::from_utf8_lossy(&label.stderr)
    );
    wait_until(
        "p4 to be placed on place-b",
        Duration::from_secs(10),
        || {
            let pod = controller.get_json(&["pod", "p4"])?;
            (pod["spec"]["nodeName"] == "place-b").then_some(())
        },
    );
    assert!(controller.ctl(&["delete", "pod", "p4"]).status.success());
    let label = controller.ctl(&["label", "node", "place-b", "rigger.test/agent-"]);
    assert!(
        label.status.success(),
        "{}",
        String::from_utf8_lossy(&label.stderr)
    );
    let table = controller.ctl(&["get", "pods", "-o", "wide"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("p1") && table.contains("place-"), "{table}");
    // ContainerRecreateRequests (Kruise's YAML) are checked against the pod.
    let crr = |container: &str| {
        format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\nmetadata:\n  name: restart-p1\nspec:\n  podName: p1\n  containers:\n  - name: {container}\n  strategy:\n    minStartedSeconds: 1\n"
        )
    };
    let refused = controller.apply(&crr("nope"));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("spec.containers[0].name: pod \"p1\" has no container \"nope\""),
        "{stderr}"
    );
    let created = controller.apply(&crr("app"));
    assert_eq!(
        String::from_utf8_lossy(&created.stdout).trim(),
        "containerrecreaterequest.apps.kruise.io/restart-p1 created"
    );
    let changed =
        controller.apply(&crr("app").replace("minStartedSeconds: 1", "minStartedSeconds: 2"));
    assert!(String::from_utf8_lossy(&changed.stderr).contains("spec: cannot change once created"));
    let listed = controller.ctl(&["get", "crr"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("restart-p1"));

    // The agents run what was placed; delete it so nothing outlives the test.
    for name in ["p1", "p2"] {
        assert!(controller.ctl(&["delete", "pod", name]).status.success());
    }
    wait_until(
        "the agents to remove the pods",
        Duration::from_secs(60),
        || {
            let out = Command::new(binary("rigger-agent"))
                .args(["status", "-o", "json", "--no-disk-usage", "--address"])
                .arg(&lab.containerd_address)
                .output()
                .ok()?;
            let inventory: Value = serde_json::from_slice(&out.stdout).ok()?;
            let left = inventory["pods"].as_array()?.iter().any(|p| {
                p["owner"] == "rigger"
                    && (p["name"] == "p1" || p["name"] == "p2")
                    && p["state"] == "ready"
            });
            (!left).then_some(())
        },
    );
}

/// A raw agent link with `node`'s certificate from `controller`'s PKI.
async fn link_as(controller: &Controller, node: &str) -> tonic::transport::Channel {
    let (ca, cert, key) = controller.agent_certs(node);
    let read = |path: &Path| std::fs::read(path).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(&ca)))
        .identity(tonic::transport::Identity::from_pem(
            read(&cert),
            read(&key),
        ));
    tonic::transport::Endpoint::from_shared(controller.server.clone())
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[test]
fn an_inventory_is_taken_only_from_the_nodes_own_current_session() {
    use rigger_proto::v1::agent_link_client::AgentLinkClient;
    use rigger_proto::v1::{
        AgentMessage, Heartbeat, Image, InventoryReport, NodeInventory, Register, agent_message,
        controller_message,
    };

    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let inventory = NodeInventory {
        images: vec![Image {
            namespace: "k8s.io".to_owned(),
            name: "registry.example/app:1".to_owned(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            ..Image::default()
        }],
        ..NodeInventory::default()
    };
    let report = |node: &str, session| InventoryReport {
        node_name: node.to_owned(),
        session,
        inventory: Some(inventory.clone()),
    };
    let node_state = || {
        let node = controller.get_json(&["node", "inv-a"]).unwrap();
        let ready = &node["status"]["conditions"][0];
        (
            ready["status"].as_str().unwrap().to_owned(),
            ready["message"].as_str().unwrap().to_owned(),
            node["status"]["images"].clone(),
        )
    };

    let channel = runtime.block_on(link_as(&controller, "inv-a"));
    let (tx, rx) = tokio::sync::mpsc::channel::<AgentMessage>(4);
    runtime
        .block_on(tx.send(AgentMessage {
            message: Some(agent_message::Message::Register(Register {
                node_name: "inv-a".to_owned(),
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                inventory_follows: true,
                ..Register::default()
            })),
        }))
        .unwrap();
    let mut client = AgentLinkClient::new(channel);
    let mut inbound = runtime
        .block_on(
            client
                .clone()
                .session(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .unwrap()
        .into_inner();
    let session = match runtime
        .block_on(inbound.message())
        .unwrap()
        .unwrap()
        .message
    {
        Some(controller_message::Message::RegisterAck(ack)) => ack.session,
        other => panic!("{other:?}"),
    };
    assert_ne!(session, 0, "the controller names the session");
    // Heartbeats, as an agent sends them: the steps below (each a riggerctl process) may
    // outlast the controller's node timeout on a loaded machine.
    let beat = tx.clone();
    let heartbeats = runtime.spawn(async move {
        for sequence in 1.. {
            let heartbeat = Heartbeat {
                sequence,
                ..Heartbeat::default()
            };
            let message = AgentMessage {
                message: Some(agent_message::Message::Heartbeat(heartbeat)),
            };
            if beat.send(message).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let (ready, why, images) = node_state();
    assert_eq!(ready, "False");
    assert_eq!(why, "registered; waiting for the agent's inventory");
    assert_eq!(images, serde_json::json!([]));

    // Another session's number, and another node's name with this node's certificate:
    // refused, and nothing of them is kept.
    let stale = runtime
        .block_on(client.report_inventory(report("inv-a", session + 1000)))
        .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    assert!(
        stale
            .message()
            .contains("is not node inv-a's current session"),
        "{stale:?}"
    );
    let impostor = runtime
        .block_on(client.report_inventory(report("inv-b", session)))
        .unwrap_err();
    assert!(
        impostor.message().contains("not issued for node \"inv-b\""),
        "{impostor:?}"
    );
    assert_eq!(node_state().0, "False");
    assert!(controller.get_json(&["node", "inv-b"]).is_none());
    // Without a certificate the call is refused before its body is read.
    let anonymous = runtime.block_on(async {
        let ca = std::fs::read(controller.agent_certs("inv-a").0).unwrap();
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca));
        let channel = tonic::transport::Endpoint::from_shared(controller.server.clone())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        AgentLinkClient::new(channel)
            .report_inventory(report("inv-a", session))
            .await
            .unwrap_err()
    });
    assert_eq!(
        anonymous.code(),
        tonic::Code::Unauthenticated,
        "{anonymous:?}"
    );

    runtime
        .block_on(client.report_inventory(report("inv-a", session)))
        .unwrap();
    let (ready, _, images) = node_state();
    assert_eq!(ready, "True");
    assert_eq!(images[0]["names"][0], "registry.example/app:1");
    assert_eq!(images[0]["digest"], format!("sha256:{}", "ab".repeat(32)));
    heartbeats.abort();
    drop(tx);
}

/// The version skew policy at the link: an agent of a release the controller does not
/// accept is refused, naming both versions, and its node is listed NotReady saying why;
/// the same node registering within the policy is taken.
#[test]
fn an_agent_outside_the_version_skew_policy_is_refused_naming_both_versions() {
    use rigger_proto::v1::agent_link_client::AgentLinkClient;
    use rigger_proto::v1::{AgentMessage, Register, agent_message, controller_message};

    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let register = |version: &str| -> Result<(), tonic::Status> {
        runtime.block_on(async {
            let channel = link_as(&controller, "skewed").await;
            let (tx, rx) = tokio::sync::mpsc::channel::<AgentMessage>(4);
            tx.send(AgentMessage {
                message: Some(agent_message::Message::Register(Register {
                    node_name: "skewed".to_owned(),
                    agent_version: version.to_owned(),
                    ..Register::default()
                })),
            })
            .await
            .unwrap();
            let mut inbound = AgentLinkClient::new(channel)
                .session(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await?
                .into_inner();
            match inbound.message().await?.and_then(|m| m.message) {
                Some(controller_message::Message::RegisterAck(ack)) => {
                    assert_eq!(ack.controller_version, env!("CARGO_PKG_VERSION"));
                    Ok(())
                }
                other => panic!("{other:?}"),
            }
        })
    };

    let refused = register("0.0.9").unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        refused.message(),
        format!(
            "node skewed: agent 0.0.9 is older than controller {} accepts (release {} at least): upgrade the agent",
            env!("CARGO_PKG_VERSION"),
            {
                let mut parts = env!("CARGO_PKG_VERSION").split('.');
                let major = parts.next().unwrap();
                let minor: u64 = parts.next().unwrap().parse().unwrap();
                format!("{major}.{}", minor.saturating_sub(1))
            }
        )
    );
    let node = controller.get_json(&["node", "skewed"]).unwrap();
    let ready = &node["status"]["conditions"][0];
    assert_eq!(ready["status"], "False", "{node:#}");
    assert_eq!(ready["reason"], "AgentVersionTooOld", "{node:#}");
    assert_eq!(
        ready["message"],
        refused.message().trim_start_matches("node skewed: ")
    );
    let table = controller.ctl(&["get", "nodes", "-o", "wide"]);
    let table = String::from_utf8_lossy(&table.stdout);
    println!("{table}");
    assert!(
        table.contains("skewed") && table.contains("NotReady") && table.contains("0.0.9"),
        "{table}"
    );
    let unreadable = register("bench").unwrap_err();
    assert!(
        unreadable.message().contains("no semantic version"),
        "{unreadable:?}"
    );

    // Within the policy, the same node is taken.
    register(env!("CARGO_PKG_VERSION")).unwrap();
}
