//! An agent on the lab registers with a controller; riggerctl shows the node.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::{Command, Stdio};
use std::time::Duration;

use rigger_integration_tests::{Daemon, Lab, binary, free_port, wait_until};
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
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let mut agent = Daemon::spawn(
        Command::new(binary("rigger-agent"))
            .args(["run", "--address"])
            .arg(&lab.containerd_address)
            .args(["--health-listen", &format!("127.0.0.1:{}", free_port())])
            .args(["--controller", &server])
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
fn an_unusable_data_dir_stops_the_controller_before_it_listens() {
    let data = tempfile::tempdir().unwrap();
    let not_a_dir = data.path().join("file");
    std::fs::write(&not_a_dir, b"").unwrap();
    let out = Command::new(binary("rigger-controller"))
        .arg("--data-dir")
        .arg(&not_a_dir)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--health-listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(last.contains(&not_a_dir.display().to_string()), "{last}");
}
