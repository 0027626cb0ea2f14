//! Version skew, with real binaries of both releases: this tree's and the previous
//! release's (`scripts/lab-previous`, built from its git tag in the lab's cache). A
//! fleet is upgraded node by node and its controller replaced while a job runs: agents
//! of one release talk to a controller of the other, and each controller reads what the
//! other wrote, on the embedded store and on etcd. The policy is docs/operator-guide.md's
//! "Upgrades and version skew".

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rigger_integration_tests::{
    Agent, Controller, Etcd, Lab, Proxy, plain_http_hosts_dir, previous_release, unique_image,
    wait_until,
};
use serde_json::json;

const THIS: &str = env!("CARGO_PKG_VERSION");

/// The version the previous release's agent prints (`rigger-agent 0.1.0 ...`).
fn version_of(program: &Path) -> String {
    let out = std::process::Command::new(program)
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{}: {}", program.display(), text.trim());
    text.split_whitespace().nth(1).unwrap().to_owned()
}

/// Two agents on the lab's two nodes, the first of the previous release and the second
/// of this one, pulling through a proxy capped at `rate` per connection.
struct MixedFleet {
    controller: Controller,
    agents: Vec<Agent>,
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

impl MixedFleet {
    /// `store`: extra controller flags (`--store etcd://...`), none for the embedded one.
    /// The controller starts as the previous release.
    fn start(test: &str, rate: &str, store: &[&str]) -> Self {
        let previous = previous_release();
        let lab = Lab::get();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller");
        std::fs::create_dir_all(&path).unwrap();
        // Started as this release, which makes the lab PKI, then as the previous one.
        let mut controller = Controller::start_with(&path, store);
        controller.program = previous.join("rigger-controller");
        controller.restart();
        let proxy = Proxy::start(&json!([]), &["--connection-rate", rate]);
        let hosts = plain_http_hosts_dir(dir.path(), &[proxy.address.as_str()]);
        let namespace = format!("itest-{test}-{}", std::process::id());
        let agents: Vec<Agent> = [&lab.containerd_address, &lab.node2_containerd_address]
            .iter()
            .enumerate()
            .map(|(i, containerd)| {
                let node = format!("{test}-{}", i + 1);
                let state: PathBuf = dir.path().join(&node);
                std::fs::create_dir_all(&state).unwrap();
                let mut agent =
                    Agent::start(&controller, &node, containerd, &hosts, &namespace, &state);
                if i == 0 {
                    agent.program = previous.join("rigger-agent");
                    agent.restart();
                }
                agent
            })
            .collect();
        let fleet = Self {
            controller,
            agents,
            proxy,
            _dir: dir,
        };
        fleet.wait_ready();
        fleet
    }

    fn wait_ready(&self) {
        for agent in &self.agents {
            wait_until(
                &format!("node {} to be ready", agent.node),
                Duration::from_secs(30),
                || {
                    let node = self.controller.get_json(&["node", &agent.node])?;
                    (node["status"]["conditions"][0]["status"] == "True").then_some(())
                },
            );
        }
    }

    /// Replace the controller with `program` (SIGKILL, as a crashed or rolled one).
    fn replace_controller(&mut self, program: PathBuf) {
        self.controller.program = program;
        self.controller.restart();
    }

    fn phases(&self, name: &str) -> BTreeMap<String, String> {
        let job = self
            .controller
            .get_json(&["imagepulljob", name])
            .unwrap_or_default();
        job["status"]["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|n| {
                        (
                            n["name"].as_str().unwrap_or_default().to_owned(),
                            n["phase"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn logs(&self) -> String {
        let mut all = rigger_integration_tests::log_tail(&self.controller.log, 60);
        for agent in &self.agents {
            all.push_str(&rigger_integration_tests::log_tail(&agent.log, 40));
        }
        all
    }

    /// A job over both nodes, one at a time, run while the controller goes previous →
    /// this → previous release: it completes with each node pulling once and about one
    /// copy of the image per node crossing the network.
    fn job_completes_across_controller_releases(&mut self, image_bytes: u64) {
        let previous = previous_release();
        let image = unique_image(
            &format!("skew-{}", self.agents[0].node),
            2,
            usize::try_from(image_bytes).unwrap(),
        );
        let names = serde_json::to_string(
            &self
                .agents
                .iter()
                .map(|a| a.node.clone())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        self.controller.apply_ok(&format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: warm\nspec:\n  image: {}/{image}\n  parallelism: 1\n  selector:\n    names: {names}\n  completionPolicy:\n    type: Always\n  pullPolicy:\n    timeoutSeconds: 120\n",
            self.proxy.address
        ));
        wait_until(
            "one node done, the other pulling",
            Duration::from_secs(120),
            || {
                let phases = self.phases("warm");
                let done = phases.values().filter(|p| *p == "Succeeded").count();
                let pulling = phases.values().filter(|p| *p == "Pulling").count();
                (done == 1 && pulling == 1).then_some(())
            },
        );
        self.replace_controller(rigger_integration_tests::binary("rigger-controller"));
        self.wait_ready();
        self.replace_controller(previous.join("rigger-controller"));
        // Read through the controller's own start (on etcd it first waits out the lease
        // of the one killed).
        let deadline = Instant::now() + Duration::from_secs(180);
        let job = loop {
            let job = self
                .controller
                .get_json(&["imagepulljob", "warm"])
                .unwrap_or_default();
            if job["status"]["completionTime"].is_string() {
                break job;
            }
            assert!(
                Instant::now() < deadline,
                "job did not complete: {job:#}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        };
        assert_eq!(job["status"]["succeeded"], 2, "{job:#}\n{}", self.logs());
        for node in job["status"]["nodes"].as_array().unwrap() {
            assert_eq!(node["attempts"], 1, "no node pulled twice: {node:#}");
        }
        for request in self.proxy.requests() {
            let path = request["path"].as_str().unwrap_or("");
            let sent = request["sent"].as_u64().unwrap_or(0);
            assert!(
                !path.contains("/blobs/") || sent < image_bytes * 5 / 2,
                "{path}: {sent} bytes, more than two copies"
            );
        }
    }
}

#[test]
fn agents_of_both_releases_run_a_job_while_the_controller_goes_previous_this_previous() {
    let previous = previous_release();
    let old = version_of(&previous.join("rigger-agent"));
    assert_ne!(old, THIS, "the previous release is another version");
    let mut fleet = MixedFleet::start("skew", "2MiB", &[]);

    // The node list says which agent runs where, as kubectl's says kubelet's version.
    fleet.replace_controller(rigger_integration_tests::binary("rigger-controller"));
    fleet.wait_ready();
    let table = fleet.controller.ctl(&["get", "nodes", "-o", "wide"]);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    println!("{table}");
    // NAME STATUS AGENT ...
    let columns = |node: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(node))
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        columns("skew-1"),
        ["skew-1", "Ready", old.as_str()],
        "{table}"
    );
    assert_eq!(columns("skew-2"), ["skew-2", "Ready", THIS], "{table}");
    let version = fleet.controller.ctl(&["version"]);
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    println!("{version}");
    assert!(
        version.contains(&format!("Client Version: {THIS}")),
        "{version}"
    );
    assert!(
        version.contains(&format!("Server Version: {THIS}")),
        "{version}"
    );

    fleet.replace_controller(previous.join("rigger-controller"));
    fleet.wait_ready();
    fleet.job_completes_across_controller_releases(8 << 20);
}

#[test]
fn on_etcd_a_job_completes_while_the_controller_goes_previous_this_previous() {
    let etcd = Etcd::start();
    let store = format!("etcd://{}", etcd.endpoint);
    // A short lease: each controller killed holds it until it runs out.
    let mut fleet = MixedFleet::start(
        "skew-etcd",
        "2MiB",
        &["--store", &store, "--leader-lease", "3s"],
    );
    fleet.job_completes_across_controller_releases(8 << 20);
}
