//! ImagePullJobs end to end: a real controller, real agents on the lab's two containerd
//! nodes, pulls through a bandwidth-capped proxy so each pull takes seconds and every
//! step of the job can be observed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rigger_integration_tests::{
    Agent, AuthRegistry, Controller, Etcd, Lab, Proxy, TcpRelay, ctr_at, log_tail,
    plain_http_hosts_dir, unique_image, wait_until,
};
use serde_json::{Value, json};

/// Two agents (lab node1 and node2) on one controller, pulling through a proxy capped
/// at `rate` per connection, into containerd namespace `itest-<test>-<pid>`.
struct Fleet {
    controller: Controller,
    /// With etcd: the other replicas (`controller` is the first).
    replicas: Vec<Controller>,
    agents: Vec<Agent>,
    /// With `start_relayed`: agent i's link to the controller.
    relays: Vec<TcpRelay>,
    proxy: Proxy,
    namespace: String,
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn start(test: &str, rate: &str) -> Self {
        Self::start_with(test, rate, &[])
    }

    /// Agents also reach `registries` (plain HTTP).
    fn start_with(test: &str, rate: &str, registries: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller");
        std::fs::create_dir_all(&path).unwrap();
        let controller = Controller::start(&path);
        Self::with(test, rate, dir, vec![controller], registries, false)
    }

    /// Each agent reaches the controller through a [`TcpRelay`] of its own.
    fn start_relayed(test: &str, rate: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller");
        std::fs::create_dir_all(&path).unwrap();
        let controller = Controller::start(&path);
        Self::with(test, rate, dir, vec![controller], &[], true)
    }

    /// `controllers`: one, or replicas on etcd (agents get every replica's URL).
    fn with(
        test: &str,
        rate: &str,
        dir: tempfile::TempDir,
        mut controllers: Vec<Controller>,
        registries: &[&str],
        relayed: bool,
    ) -> Self {
        let lab = Lab::get();
        let proxy = Proxy::start(&json!([]), &["--connection-rate", rate]);
        let mut reachable = vec![proxy.address.as_str()];
        reachable.extend_from_slice(registries);
        let hosts = plain_http_hosts_dir(dir.path(), &reachable);
        let namespace = format!("itest-{test}-{}", std::process::id());
        let sub = |name: &str| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(&path).unwrap();
            path
        };
        let controller = controllers.remove(0);
        let mut relays = Vec::new();
        let agents = [&lab.containerd_address, &lab.node2_containerd_address]
            .iter()
            .enumerate()
            .map(|(i, containerd)| {
                let node = format!("{test}-{}", i + 1);
                let endpoints = if relayed {
                    let upstream = controller.server.trim_start_matches("https://");
                    let relay = TcpRelay::start(upstream);
                    let url = format!("https://{}", relay.address);
                    relays.push(relay);
                    url
                } else {
                    controller.endpoints.clone()
                };
                Agent::start_via(
                    &controller,
                    &endpoints,
                    &node,
                    containerd,
                    &hosts,
                    &namespace,
                    &sub(&node),
                )
            })
            .collect();
        let fleet = Self {
            controller,
            replicas: controllers,
            agents,
            relays,
            proxy,
            namespace,
            _dir: dir,
        };
        for agent in &fleet.agents {
            fleet.wait_ready(&agent.node);
        }
        fleet
    }

    fn wait_ready(&self, node: &str) {
        wait_until(
            &format!("node {node} to be ready"),
            Duration::from_secs(30),
            || {
                let node = self.controller.get_json(&["node", node])?;
                (node["status"]["conditions"][0]["status"] == "True").then_some(())
            },
        );
    }

    fn node_names(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.node.clone()).collect()
    }

    fn apply_job(&self, name: &str, image: &str, parallelism: u32) {
        let names = serde_json::to_string(&self.node_names()).unwrap();
        let yaml = format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: {}/{image}\n  parallelism: {parallelism}\n  selector:\n    names: {names}\n  completionPolicy:\n    type: Always\n  pullPolicy:\n    timeoutSeconds: 120\n",
            self.proxy.address
        );
        self.controller.apply_ok(&yaml);
    }

    /// The job as riggerctl shows it; while no controller leads (a restart, a handover
    /// within the leader lease), riggerctl is asked again for up to 20 s.
    fn job(&self, name: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self
                .controller
                .ctl(&["get", "imagepulljob", name, "-o", "json"]);
            if out.status.success() {
                return serde_json::from_slice(&out.stdout).unwrap();
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                Instant::now() < deadline
                    && (stderr.contains("not the leader") || stderr.contains("cannot reach")),
                "job {name} unreadable: {stderr}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(&self) -> String {
        let mut text = format!("--- controller\n{}\n", log_tail(&self.controller.log, 40));
        for (i, replica) in self.replicas.iter().enumerate() {
            text.push_str(&format!(
                "--- replica {}\n{}\n",
                i + 2,
                log_tail(&replica.log, 30)
            ));
        }
        for agent in &self.agents {
            text.push_str(&format!(
                "--- {}\n{}\n",
                agent.node,
                log_tail(&agent.log, 30)
            ));
        }
        text
    }

    /// Poll the job until it completes, checking `every` observation on the way.
    fn watch_until_complete(&self, name: &str, mut every: impl FnMut(&Value)) -> Value {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let job = self.job(name);
            every(&job);
            if job["status"]["completionTime"].is_string() {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job did not complete: {job:#}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Image names in the test's namespace on one containerd.
    fn images_on(&self, containerd: &Path) -> Vec<String> {
        ctr_at(containerd, &self.namespace, &["images", "ls", "-q"])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Bytes the proxy sent for blobs, per blob path.
    fn blob_bytes_sent(&self) -> BTreeMap<String, u64> {
        let mut sent = BTreeMap::new();
        for request in self.proxy.requests() {
            let path = request["path"].as_str().unwrap_or("");
            if path.contains("/blobs/") {
                *sent.entry(path.to_owned()).or_default() += request["sent"].as_u64().unwrap_or(0);
            }
        }
        sent
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for agent in &mut self.agents {
            agent.kill();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let lab = Lab::get();
        for containerd in [&lab.containerd_address, &lab.node2_containerd_address] {
            let ctr = |args: &[&str]| {
                Command::new("ctr")
                    .arg("--address")
                    .arg(containerd)
                    .args(["-n", &self.namespace])
                    .args(args)
                    .output()
            };
            if let Ok(out) = ctr(&["images", "ls", "-q"]) {
                for image in String::from_utf8_lossy(&out.stdout).lines() {
                    let _ = ctr(&["images", "rm", "--sync", image]);
                }
            }
            let _ = Command::new("ctr")
                .arg("--address")
                .arg(containerd)
                .args(["namespaces", "rm", &self.namespace])
                .output();
        }
    }
}

fn phases(job: &Value) -> BTreeMap<String, String> {
    job["status"]["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|n| {
                    (
                        n["name"].as_str().unwrap().to_owned(),
                        n["phase"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn count(job: &Value, field: &str) -> u64 {
    job["status"][field].as_u64().unwrap_or(0)
}

#[test]
fn parallelism_one_pulls_on_two_nodes_one_after_the_other() {
    let fleet = Fleet::start("job-serial", "4MiB");
    let image = unique_image("job-serial", 2, 3 << 20);
    fleet.apply_job("warm", &image, 1);

    let mut succeeded_before = 0;
    let mut pulling_order: Vec<String> = Vec::new();
    let job = fleet.watch_until_complete("warm", |job| {
        let phases = phases(job);
        if phases.is_empty() {
            return;
        }
        let pulling: Vec<&String> = phases
            .iter()
            .filter(|(_, p)| *p == "Pulling")
            .map(|(n, _)| n)
            .collect();
        let of = |phase: &str| phases.values().filter(|p| *p == phase).count() as u64;
        // The counts agree with the nodes at every step, and never more than one pulls.
        assert_eq!(count(job, "desired"), 2, "{job:#}");
        assert!(pulling.len() <= 1, "two nodes pulling at once: {job:#}");
        assert_eq!(count(job, "active"), pulling.len() as u64, "{job:#}");
        assert_eq!(count(job, "succeeded"), of("Succeeded"), "{job:#}");
        assert_eq!(count(job, "failed"), 0, "{job:#}");
        assert_eq!(
            of("Waiting") + of("Pulling") + of("Succeeded"),
            2,
            "{job:#}"
        );
        assert!(
            count(job, "succeeded") >= succeeded_before,
            "succeeded went down: {job:#}"
        );
        succeeded_before = count(job, "succeeded");
        if let Some(node) = pulling.first()
            && pulling_order.last() != Some(*node)
        {
            pulling_order.push((*node).clone());
        }
    });
    assert_eq!(count(&job, "succeeded"), 2, "{job:#}");
    assert_eq!(count(&job, "failed"), 0, "{job:#}");
    assert_eq!(job["status"]["conditions"][0]["type"], "Complete");
    // A poll can miss a short pull on a loaded machine, so the order is proved by the
    // times the controller recorded: the second node started after the first finished.
    assert!(pulling_order.len() <= 2, "{pulling_order:?}");
    let mut spans: Vec<(String, String)> = job["status"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let time = |field: &str| {
                n[field]
                    .as_str()
                    .unwrap_or_else(|| panic!("{field}: {n:#}"))
            };
            (
                time("startTime").to_owned(),
                time("completionTime").to_owned(),
            )
        })
        .collect();
    spans.sort();
    assert!(
        spans[1].0 >= spans[0].1,
        "the second pull started before the first finished: {spans:?}"
    );
    for node in job["status"]["nodes"].as_array().unwrap() {
        assert_eq!(node["phase"], "Succeeded", "{node:#}");
        // Two 3 MiB layers, gzipped: how much smaller depends on how many of their
        // 64 KiB blocks the seed (which holds the test's PID) made text, ~10 % of 96.
        assert!(node["bytesTotal"].as_u64().unwrap() > 4 << 20, "{node:#}");
        assert_eq!(node["bytesDone"], node["bytesTotal"], "{node:#}");
        assert!(node["imageDigest"].as_str().unwrap().starts_with("sha256:"));
    }

    let lab = Lab::get();
    let reference = format!("{}/{image}", fleet.proxy.address);
    for containerd in [&lab.containerd_address, &lab.node2_containerd_address] {
        assert_eq!(fleet.images_on(containerd), vec![reference.clone()]);
    }
    // Each layer crossed the network once per node.
    let manifest_layers = 2;
    let layer_bytes: Vec<u64> = fleet
        .blob_bytes_sent()
        .into_values()
        .filter(|sent| *sent > 1 << 20)
        .collect();
    assert_eq!(layer_bytes.len(), manifest_layers, "{layer_bytes:?}");
    let image_bytes = job["status"]["nodes"][0]["bytesTotal"].as_u64().unwrap();
    let total: u64 = layer_bytes.iter().sum();
    assert!(
        total >= 2 * (image_bytes - (64 << 10)) && total <= 2 * image_bytes,
        "layers sent {total} bytes for two nodes of an image of {image_bytes}"
    );

    // Each agent counts its pull on /metrics (the series docs/operator-guide.md lists),
    // and the controller its job by phase.
    for agent in &fleet.agents {
        let (code, metrics) =
            rigger_integration_tests::http_get(&agent.health, "/metrics").unwrap();
        assert_eq!(code, 200);
        let value = |series: &str| -> u64 {
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(series)?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{series} in\n{metrics}")) as u64
        };
        assert_eq!(
            value("rigger_agent_pulls_total{result=\"succeeded\"}"),
            1,
            "{metrics}"
        );
        assert_eq!(
            value("rigger_agent_pull_duration_seconds_count"),
            1,
            "{metrics}"
        );
        let bytes = value("rigger_agent_pull_bytes_total");
        assert!(
            bytes >= image_bytes - (64 << 10) && bytes <= image_bytes,
            "{bytes} of {image_bytes}"
        );
        assert_eq!(value("rigger_agent_tasks_active"), 0, "{metrics}");
        assert_eq!(value("rigger_agent_controller_link_up"), 1, "{metrics}");
    }
    wait_until(
        "the controller's job and agent gauges",
        Duration::from_secs(10),
        || {
            let (_, metrics) =
                rigger_integration_tests::http_get(&fleet.controller.health, "/metrics")?;
            (metrics.contains("rigger_controller_image_pull_jobs{phase=\"completed\"} 1")
                && metrics.contains("rigger_controller_agents{state=\"ready\"} 2"))
            .then_some(())
        },
    );
}

#[test]
fn a_controller_killed_mid_job_finishes_it_without_pulling_again() {
    let mut fleet = Fleet::start("job-restart", "4MiB");
    let image = unique_image("job-restart", 2, 4 << 20);
    fleet.apply_job("warm", &image, 1);

    // One node done, the other pulling: then the controller dies without a word.
    wait_until(
        "one node done, the other pulling",
        Duration::from_secs(120),
        || {
            let job = fleet.job("warm");
            let phases = phases(&job);
            let done = phases.values().filter(|p| *p == "Succeeded").count();
            let pulling = phases.values().filter(|p| *p == "Pulling").count();
            (done == 1 && pulling == 1).then_some(())
        },
    );
    fleet.controller.kill();
    std::thread::sleep(Duration::from_secs(1));
    fleet.controller.restart();

    let job = fleet.watch_until_complete("warm", |job| {
        assert!(count(job, "active") <= 1, "{job:#}");
        assert_eq!(count(job, "failed"), 0, "{job:#}\n{}", fleet.logs());
    });
    assert_eq!(count(&job, "succeeded"), 2, "{job:#}");
    for node in job["status"]["nodes"].as_array().unwrap() {
        assert_eq!(node["attempts"], 1, "no node pulled twice: {node:#}");
    }
    // Two copies of each layer crossed the network, not three.
    for (path, sent) in fleet.blob_bytes_sent() {
        if sent > 1 << 20 {
            let one_copy = 4u64 << 20;
            assert!(sent < 2 * one_copy + one_copy / 2, "{path}: {sent} bytes");
        }
    }
}

#[test]
fn a_killed_agent_is_marked_and_its_pull_resumes_when_it_returns() {
    let mut fleet = Fleet::start("job-agent-kill", "2MiB");
    let image = unique_image("job-agent-kill", 1, 8 << 20);
    fleet.apply_job("warm", &image, 2);

    let victim = fleet.agents[0].node.clone();
    wait_until(
        "the first node to be halfway",
        Duration::from_secs(60),
        || {
            let job = fleet.job("warm");
            let node = job["status"]["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == victim.as_str())?
                .clone();
            (node["bytesDone"].as_u64()? > 2 << 20).then_some(())
        },
    );
    fleet.agents[0].kill();

    let lost = wait_until(
        "the job to mark the node lost",
        Duration::from_secs(30),
        || {
            let job = fleet.job("warm");
            let node = job["status"]["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == victim.as_str())?
                .clone();
            (node["phase"] == "Failed").then_some((job, node))
        },
    );
    let (job, node) = lost;
    assert_eq!(node["nodeLost"], true, "{node:#}");
    assert!(
        node["message"]
            .as_str()
            .unwrap()
            .starts_with("node lost while pulling"),
        "{node:#}"
    );
    assert!(
        job["status"]["failedNodes"]
            .as_array()
            .unwrap()
            .contains(&json!(victim))
    );
    assert!(
        job["status"]["completionTime"].is_null(),
        "the job waits for the other node: {job:#}"
    );

    fleet.agents[0].restart();
    let job = fleet.watch_until_complete("warm", |_| {});
    assert_eq!(count(&job, "succeeded"), 2, "{job:#}\n{}", fleet.logs());
    assert_eq!(count(&job, "failed"), 0, "{job:#}");
    // The restarted agent continued from what containerd held: less than two copies.
    let sent: u64 = fleet
        .blob_bytes_sent()
        .values()
        .filter(|s| **s > 1 << 20)
        .sum();
    assert!(
        sent < 2 * (8 << 20) + (3 << 20),
        "{sent} bytes sent for two nodes"
    );
}

#[test]
fn with_three_controllers_on_etcd_killing_the_leader_hands_over_and_the_job_completes() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let replicas = Controller::replicas(dir.path(), &etcd, 3);
    let mut fleet = Fleet::with("job-ha", "4MiB", dir, replicas, &[], false);
    let image = unique_image("job-ha", 2, 3 << 20);

    let leaders = |fleet: &Fleet| {
        std::iter::once(&fleet.controller)
            .chain(&fleet.replicas)
            .filter(|c| c.is_leader())
            .count()
    };
    assert_eq!(leaders(&fleet), 1, "exactly one leader\n{}", fleet.logs());
    fleet.apply_job("warm", &image, 1);
    wait_until("a node to pull", Duration::from_secs(60), || {
        phases(&fleet.job("warm"))
            .values()
            .any(|p| p == "Pulling")
            .then_some(())
    });

    // Kill the leader without a word: its lease lapses and a follower takes over.
    let leader = std::iter::once(&mut fleet.controller)
        .chain(fleet.replicas.iter_mut())
        .find(|c| c.is_leader())
        .unwrap();
    leader.kill();
    let job = fleet.watch_until_complete("warm", |job| {
        assert!(count(job, "active") <= 1, "{job:#}");
    });
    assert_eq!(count(&job, "succeeded"), 2, "{job:#}\n{}", fleet.logs());
    assert_eq!(count(&job, "failed"), 0, "{job:#}");
    for node in job["status"]["nodes"].as_array().unwrap() {
        assert_eq!(node["attempts"], 1, "no node pulled twice: {node:#}");
    }
    let successors = fleet
        .replicas
        .iter()
        .chain([&fleet.controller])
        .filter(|c| c.is_leader())
        .count();
    assert_eq!(successors, 1, "one replica took over\n{}", fleet.logs());
}

#[test]
fn pull_secrets_reach_the_nodes_and_never_show() {
    let registry = AuthRegistry::start();
    registry.push("rigger-lab/private");
    let fleet = Fleet::start_with("job-creds", "64MiB", &[&registry.address]);
    let config_dir = tempfile::tempdir().unwrap();
    let docker_config = std::fs::read_to_string(registry.docker_config(config_dir.path())).unwrap();
    let names = serde_json::to_string(&fleet.node_names()).unwrap();
    let job = |name: &str, secrets: &str| {
        format!(
            "apiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: {}/rigger-lab/private:1\n  parallelism: 2\n  selector:\n    names: {names}\n  pullPolicy:\n    backoffLimit: 0\n{secrets}",
            registry.address
        )
    };

    // Without credentials the registry refuses, and the job says so.
    fleet.controller.apply_ok(&job("anonymous", ""));
    let refused = fleet.watch_until_complete("anonymous", |_| {});
    assert_eq!(count(&refused, "failed"), 2, "{refused:#}");
    let reason = refused["status"]["nodes"][0]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("access denied"), "{reason}");

    // With a Secret (Kubernetes' dockerconfigjson shape) named in pullSecrets.
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: registry-login\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{docker_config}'\n---\n{}",
        job("with-secret", "  pullSecrets: [registry-login]\n")
    );
    fleet.controller.apply_ok(&secret);
    let pulled = fleet.watch_until_complete("with-secret", |_| {});
    assert_eq!(count(&pulled, "succeeded"), 2, "{pulled:#}");

    // The password is nowhere: not in reads of the secret, logs, metrics, the job's
    // status, the agents' inventories or their task files.
    let shown = fleet
        .controller
        .ctl(&["get", "secret", "registry-login", "-o", "yaml"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("<redacted>"), "{shown}");
    let encoded_marker = encoded_auth(&docker_config);
    let mut places = vec![(String::from("riggerctl get secret"), shown.into_owned())];
    places.push((
        "controller log".into(),
        std::fs::read_to_string(&fleet.controller.log).unwrap(),
    ));
    let metrics = |address: &str| {
        rigger_integration_tests::http_get(address, "/metrics")
            .unwrap()
            .1
    };
    places.push((
        "controller /metrics".into(),
        metrics(&fleet.controller.health),
    ));
    places.push((
        "the job's status".into(),
        fleet.job("with-secret").to_string(),
    ));
    for agent in &fleet.agents {
        places.push((
            agent.node.clone(),
            std::fs::read_to_string(&agent.log).unwrap(),
        ));
        places.push((format!("{} /metrics", agent.node), metrics(&agent.health)));
        places.push((
            format!("{} /inventory", agent.node),
            rigger_integration_tests::http_get(&agent.health, "/inventory")
                .unwrap()
                .1,
        ));
        for entry in std::fs::read_dir(agent.state_dir.join("tasks")).unwrap() {
            let path = entry.unwrap().path();
            places.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    for (place, text) in places {
        let leak = text.lines().find(|l| l.contains(&registry.password));
        assert!(leak.is_none(), "the password shows in {place}: {leak:?}");
        assert!(
            !text.contains(&encoded_marker),
            "the encoded credentials show in {place}"
        );
    }
}

#[test]
fn a_node_cannot_pull_a_jobs_secret_by_advertising_a_label() {
    let registry = AuthRegistry::start();
    registry.push("rigger-lab/private");
    let mut fleet = Fleet::start_with("job-claim", "64MiB", &[&registry.address]);
    let (claimant, chosen) = (fleet.agents[0].node.clone(), fleet.agents[1].node.clone());
    // The claimant's agent says it is the payments team's node, in the plain label and
    // in the reserved prefix admins fence nodes with.
    fleet.agents[0].restart_with_node_labels(
        "rigger.test/agent=yes,team=payments,node-restriction.rigger.dev/team=payments",
    );
    fleet.wait_ready(&claimant);
    let node = fleet.controller.get_json(&["node", &claimant]).unwrap();
    assert_eq!(node["metadata"]["labels"]["team"], "payments", "{node:#}");
    assert!(
        node["metadata"]["labels"]
            .get("node-restriction.rigger.dev/team")
            .is_none(),
        "a reserved label taken from an agent: {node:#}"
    );
    assert_eq!(
        node["status"]["refusedAgentLabels"],
        json!(["node-restriction.rigger.dev/team"])
    );

    // An admin labels the node that is the team's; a viewer cannot, and a value is not
    // replaced without --overwrite.
    let label = |role: &str, args: &[&str]| {
        let mut all = vec!["label", "node", chosen.as_str()];
        all.extend_from_slice(args);
        fleet.controller.ctl_as(role, &all)
    };
    let out = label("viewer", &["team=payments"]);
    assert!(!out.status.success());
    let out = label(
        "admin",
        &["team=payments", "node-restriction.rigger.dev/team=payments"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("node/{chosen} labeled")
    );
    let out = label("admin", &["team=other"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("already has a value (payments)"),
        "{stderr}"
    );
    let node = fleet.controller.get_json(&["node", &chosen]).unwrap();
    assert_eq!(
        node["metadata"]["labels"]["node-restriction.rigger.dev/team"],
        "payments"
    );

    // A job with the team's credentials, choosing its nodes by the team label.
    let config_dir = tempfile::tempdir().unwrap();
    let docker_config = std::fs::read_to_string(registry.docker_config(config_dir.path())).unwrap();
    let job = |name: &str, selector: &str| {
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: payments-login\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{docker_config}'\n---\napiVersion: rigger.dev/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: {name}\nspec:\n  image: {}/rigger-lab/private:1\n  {selector}\n  pullSecrets: [payments-login]\n  pullPolicy:\n    backoffLimit: 0\n",
            registry.address
        )
    };
    fleet.controller.apply_ok(&job(
        "payments",
        "selector: {matchLabels: {team: payments}}",
    ));
    let done = fleet.watch_until_complete("payments", |_| {});
    assert_eq!(count(&done, "desired"), 1, "{done:#}");
    assert_eq!(count(&done, "succeeded"), 1, "{done:#}");
    assert_eq!(
        done["status"]["nodes"][0]["name"],
        chosen.as_str(),
        "{done:#}"
    );

    // Nor by the labels of the pods it reports.
    let pods = job("by-pods", "podSelector: {matchLabels: {app: payments}}");
    let path = config_dir.path().join("by-pods.yaml");
    std::fs::write(&path, pods).unwrap();
    let out = fleet
        .controller
        .ctl(&["apply", "--dry-run", "-f", path.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("spec.pullSecrets"),
        "{stderr}"
    );

    // Nothing of the secret reached the claimant: no task, no credential in its files.
    let claimant_agent = &fleet.agents[0];
    let tasks = std::fs::read_dir(claimant_agent.state_dir.join("tasks"))
        .map(|dir| {
            dir.filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "json")
            })
            .count()
        })
        .unwrap_or(0);
    assert_eq!(tasks, 0, "the claimant was given a task");
    let log = std::fs::read_to_string(&claimant_agent.log).unwrap();
    assert!(!log.contains("private:1"), "the claimant heard of the job");
    assert!(!log.contains(&registry.password));
}

#[test]
fn a_link_cut_longer_than_the_node_timeout_is_survived_without_lost_or_doubled_counts() {
    let fleet = Fleet::start_relayed("job-cut", "1MiB");
    let image = unique_image("job-cut", 2, 3 << 20);
    fleet.apply_job("warm", &image, 2);
    let cut_node = fleet.agents[0].node.clone();
    wait_until("both nodes pulling", Duration::from_secs(30), || {
        let phases = phases(&fleet.job("warm"));
        (phases.values().filter(|p| *p == "Pulling").count() == 2).then_some(())
    });

    // A partition between node 1 and the controller: no reset, nothing gets through,
    // for well over the node timeout (3 s here). The pull itself goes on.
    fleet.relays[0].cut();
    wait_until(
        "the cut node to be marked not ready",
        Duration::from_secs(20),
        || {
            let node = fleet.controller.get_json(&["node", &cut_node])?;
            (node["status"]["conditions"][0]["status"] == "False").then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(5));
    let during = fleet.job("warm");
    assert_eq!(count(&during, "desired"), 2, "{during:#}");
    fleet.relays[0].restore();

    fleet.wait_ready(&cut_node);
    let job = fleet.watch_until_complete("warm", |_| {});
    assert_eq!(count(&job, "desired"), 2, "{job:#}");
    assert_eq!(count(&job, "succeeded"), 2, "{job:#}\n{}", fleet.logs());
    assert_eq!(count(&job, "failed"), 0, "{job:#}");
    for node in job["status"]["nodes"].as_array().unwrap() {
        assert_eq!(node["phase"], "Succeeded", "{node:#}");
    }
    // Every layer crossed the network once per node: the cut did not restart the pull.
    let image_bytes = job["status"]["nodes"][0]["bytesTotal"].as_u64().unwrap();
    let sent: u64 = fleet
        .blob_bytes_sent()
        .into_values()
        .filter(|sent| *sent > 1 << 20)
        .sum();
    assert!(
        sent <= 2 * image_bytes,
        "layers sent {sent} bytes for two nodes of an image of {image_bytes}"
    );
    let lab = Lab::get();
    let reference = format!("{}/{image}", fleet.proxy.address);
    for containerd in [&lab.containerd_address, &lab.node2_containerd_address] {
        assert_eq!(fleet.images_on(containerd), vec![reference.clone()]);
    }
}

/// Kruise's v1beta1 ImagePullJob as its manual writes it: `parallelism: 0` holds the job
/// (the nodes are chosen, none pulls), `sandboxConfig` is kept, `get -o yaml` answers in
/// v1beta1; raising parallelism starts it, and it completes.
#[test]
fn a_v1beta1_job_with_parallelism_zero_waits_until_it_is_raised() {
    let fleet = Fleet::start("job-paused", "64MiB");
    let image = unique_image("job-paused", 1, 1 << 20);
    let names = serde_json::to_string(&fleet.node_names()).unwrap();
    let yaml = |parallelism: u32| {
        format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: held\nspec:\n  image: {}/{image}\n  parallelism: {parallelism}\n  selector:\n    names: {names}\n  sandboxConfig:\n    labels:\n      app.kubernetes.io/name: held\n    annotations:\n      example.com/why: before the rollout\n  completionPolicy:\n    type: Always\n",
            fleet.proxy.address
        )
    };
    fleet.controller.apply_ok(&yaml(0));
    let held = wait_until("the job's nodes", Duration::from_secs(20), || {
        let job = fleet.job("held");
        (count(&job, "desired") == 2).then_some(job)
    });
    // A few reconcile rounds: still nobody pulls.
    std::thread::sleep(Duration::from_secs(2));
    let job = fleet.job("held");
    assert!(
        phases(&job).values().all(|p| p == "Waiting"),
        "{job:#}\n{held:#}"
    );
    assert!(
        job["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("paused"),
        "{job:#}"
    );
    let yaml_out = fleet
        .controller
        .ctl(&["get", "imagepulljob", "held", "-o", "yaml"]);
    let shown = String::from_utf8_lossy(&yaml_out.stdout);
    assert!(
        shown.contains("apiVersion: apps.kruise.io/v1beta1"),
        "{shown}"
    );
    assert!(shown.contains("app.kubernetes.io/name: held"), "{shown}");

    fleet.controller.apply_ok(&yaml(2));
    let job = fleet.watch_until_complete("held", |_| {});
    assert_eq!(count(&job, "succeeded"), 2, "{job:#}");
}

/// A pod's `imagePullSecrets` (given by its owner or by a SidecarSet) reach its node and
/// pull its images from a registry that wants credentials; without them the pull is
/// refused, saying what the registry answered.
#[test]
fn a_pods_image_pull_secrets_pull_its_images_from_a_private_registry() {
    let registry = AuthRegistry::start();
    registry.push_with("rigger-lab/private-app", &["--base", "busybox"]);
    let fleet = Fleet::start_with("pod-creds", "64MiB", &[&registry.address]);
    let node = fleet.node_names()[0].clone();
    let config_dir = tempfile::tempdir().unwrap();
    let docker_config = std::fs::read_to_string(registry.docker_config(config_dir.path())).unwrap();
    let image = format!("{}/rigger-lab/private-app:1", registry.address);
    let pod = |name: &str, secrets: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{mesh: private}}\nspec:\n  nodeName: {node}\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{secrets}  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n"
        )
    };
    let waiting_reason = |name: &str| {
        let pod = fleet.controller.get_json(&["pod", name])?;
        let state = &pod["status"]["containerStatuses"][0]["state"];
        state["waiting"]["reason"].as_str().map(|r| {
            (
                r.to_owned(),
                state["waiting"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            )
        })
    };
    fleet.controller.apply_ok(&pod("anonymous", ""));
    let (reason, message) = wait_until(
        "the anonymous pull to fail",
        Duration::from_secs(60),
        || waiting_reason("anonymous").filter(|(r, _)| r == "ErrImagePull"),
    );
    assert!(message.contains("access denied"), "{reason}: {message}");

    // The pod's own secret.
    fleet.controller.apply_ok(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: private-login\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{docker_config}'\n"
    ));
    fleet.controller.apply_ok(&pod(
        "owned",
        "  imagePullSecrets: [{name: private-login}]\n",
    ));
    fleet.controller.ready_pod("owned", Duration::from_secs(90));

    // A SidecarSet's, joined to the pods it is injected into.
    fleet.controller.apply_ok(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata:\n  name: private-mesh\nspec:\n  selector: {{matchLabels: {{mesh: private}}}}\n  imagePullSecrets: [{{name: private-login}}]\n  containers:\n  - name: proxy\n    image: {image}\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 0.2; done\"]\n"
    ));
    fleet.controller.apply_ok(&pod("meshed", ""));
    let meshed = fleet
        .controller
        .ready_pod("meshed", Duration::from_secs(90));
    assert_eq!(
        meshed["spec"]["imagePullSecrets"][0]["name"],
        "private-login"
    );

    // The password is in no agent's log.
    let encoded = encoded_auth(&docker_config);
    for agent in &fleet.agents {
        let log = std::fs::read_to_string(&agent.log).unwrap();
        assert!(
            !log.contains(&encoded),
            "{} logged the credentials",
            agent.node
        );
    }
    for name in ["anonymous", "owned", "meshed"] {
        assert!(
            fleet
                .controller
                .ctl(&["delete", "pod", name])
                .status
                .success()
        );
    }
}

/// The base64 `auth` of a docker config: what must never show in logs or reads.
fn encoded_auth(docker_config: &str) -> String {
    docker_config
        .split("\"auth\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned()
}
