//! Rigger's own workloads handled as a cluster operator handles them, on the lab's real
//! cluster: the controller's Deployment rolled and its leader's pod deleted; Rigger
//! upgraded from the previous release, the controller first and then the agents'
//! DaemonSet, and the controller rolled back; each while jobs run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::Duration;

use rigger_integration_tests::real_cluster::{ClusterNamespace, Progress, RealCluster};
use rigger_integration_tests::{Proxy, repo_root, unique_image_with, wait_until};
use serde_json::{Value, json};

fn job(cluster: &RealCluster, ns: &ClusterNamespace, name: &str) -> Value {
    cluster.object_status(&ns.name, "imagepulljob", name)
}

/// A job over every node, one node at a time, of an image big enough to be mid-pull when
/// something happens to Rigger's pods.
fn start_job(cluster: &RealCluster, ns: &ClusterNamespace, name: &str) -> String {
    let image = cluster.image(&unique_image_with(name, 2, 3 << 20, &["--base", "none"]));
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  parallelism: 1\n  completionPolicy: {{type: Always}}\n",
        ns = ns.name
    ));
    wait_until("the job to start", Duration::from_secs(60), || {
        let status = job(cluster, ns, name);
        (status["active"] == 1 || status["succeeded"].as_u64().unwrap_or(0) >= 1).then_some(())
    });
    image
}

fn wait_for_job(cluster: &RealCluster, ns: &ClusterNamespace, name: &str, nodes: usize) {
    let waited = cluster.kubectl(&[
        "-n",
        &ns.name,
        "wait",
        &format!("imagepulljob/{name}"),
        &format!("--for=jsonpath={{.status.succeeded}}={nodes}"),
        "--timeout=90s",
    ]);
    assert!(
        waited.status.success(),
        "job {name}: {}\n{}\n{}",
        String::from_utf8_lossy(&waited.stderr),
        job(cluster, ns, name),
        cluster.rigger_state()
    );
}

/// Who holds the controller's Lease (`POD/ADDRESS`).
fn lease_holder(cluster: &RealCluster) -> String {
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "get",
        "lease",
        "rigger-controller",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
}

/// How many pulls of `image` each node's agent accepted (its log lines `task accepted`).
fn pulls_per_node(cluster: &RealCluster, image: &str) -> Vec<(String, usize)> {
    cluster
        .nodes()
        .into_iter()
        .map(|node| {
            let pod = cluster.agent_pod(&node);
            let logs = cluster.kubectl_ok(&["-n", "rigger-system", "logs", &pod, "--tail=-1"]);
            let pulls = logs
                .lines()
                .filter(|l| l.contains("\"task accepted\"") && l.contains(image))
                .count();
            (node, pulls)
        })
        .collect()
}

/// Scenario 5 (controller): `kubectl rollout restart` of the controller completes
/// (`rollout status` succeeds: every replica that serves is Ready, not the leader alone),
/// and a job over every node completes when the leader's pod is deleted in the middle of
/// it, with no node pulling twice.
#[test]
fn the_controller_rolls_and_loses_its_leader_mid_job_and_nothing_is_pulled_twice() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("leader");
    let progress = Progress::start();
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "rollout",
        "restart",
        "deployment/rigger-controller",
    ]);
    cluster.rollout_status(
        "rigger-system",
        "deployment/rigger-controller",
        Duration::from_secs(60),
    );
    progress.say("the controller's Deployment rolled");
    let ready = cluster
        .get_json(&["deployment", "rigger-controller", "-n", "rigger-system"])
        .unwrap();
    assert_eq!(ready["status"]["readyReplicas"], 2, "{ready:#}");

    let nodes = cluster.nodes().len();
    let image = start_job(cluster, &ns, "leader");
    progress.say("the job started");
    let holder = lease_holder(cluster);
    let leader = holder.split('/').next().unwrap().to_owned();
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "delete",
        "pod",
        &leader,
        "--wait=false",
    ]);
    progress.say(&format!("the leader's pod {leader} deleted"));
    wait_for_job(cluster, &ns, "leader", nodes);
    progress.say("the job completed");
    let successor = lease_holder(cluster);
    assert!(
        !successor.starts_with(&format!("{leader}/")),
        "the deleted pod {leader} still holds the Lease"
    );
    for (node, pulls) in pulls_per_node(cluster, &image) {
        assert_eq!(pulls, 1, "{node} pulled {image} {pulls} times");
    }
    cluster.rollout_status(
        "rigger-system",
        "deployment/rigger-controller",
        Duration::from_secs(60),
    );
    progress.say("the deleted pod replaced");
}

/// The image of the DaemonSet's or the Deployment's first container.
fn deployed_image(cluster: &RealCluster, object: &str) -> String {
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "get",
        object,
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ])
}

/// `kubectl set image` of `object`'s container `container`, and its rollout awaited.
fn roll(cluster: &RealCluster, object: &str, container: &str, image: &str) {
    cluster.kubectl_ok(&[
        "-n",
        "rigger-system",
        "set",
        "image",
        object,
        &format!("{container}={image}"),
    ]);
    cluster.rollout_status("rigger-system", object, Duration::from_secs(120));
}

/// Puts this release's images back on Rigger's workloads however the test ends: the
/// real cluster is shared by the tests after it.
struct RestoreImages {
    cluster: &'static RealCluster,
    agent: String,
    controller: String,
}

impl Drop for RestoreImages {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (object, container, image) in [
            (
                "deployment/rigger-controller",
                "controller",
                &self.controller,
            ),
            ("daemonset/rigger-agent", "agent", &self.agent),
        ] {
            let _ = self.cluster.kubectl(&[
                "-n",
                "rigger-system",
                "set",
                "image",
                object,
                &format!("{container}={image}"),
            ]);
            let _ = self.cluster.kubectl(&[
                "-n",
                "rigger-system",
                "rollout",
                "status",
                object,
                "--timeout=120s",
            ]);
        }
    }
}

/// Version skew on the real cluster (docs/operator-guide.md, "Upgrades and version
/// skew"): Rigger runs as the previous release (its image assembled from
/// `scripts/lab-previous`'s binaries); a job over every node starts; the controller's
/// Deployment, then the agents' DaemonSet are rolled to this release while it runs — each
/// `kubectl rollout status` ends — and the job completes on every node, none failing.
/// Then the controller is rolled back to the previous release over this release's agents,
/// runs a job on them, and is rolled forward again.
#[test]
fn the_previous_release_is_rolled_to_this_one_mid_job_controller_first() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("skew");
    let previous = rigger_integration_tests::previous_release();
    let out = std::process::Command::new(repo_root().join("scripts/rigger-image"))
        .arg("--binaries")
        .arg(&previous)
        .args(["--registry", &cluster.registry, "--tag", "lab-previous"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let old = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let this_agent = deployed_image(cluster, "daemonset/rigger-agent");
    let this_controller = deployed_image(cluster, "deployment/rigger-controller");
    let _restore = RestoreImages {
        cluster,
        agent: this_agent.clone(),
        controller: this_controller.clone(),
    };
    let progress = Progress::start();
    roll(cluster, "deployment/rigger-controller", "controller", &old);
    roll(cluster, "daemonset/rigger-agent", "agent", &old);
    progress.say("Rigger runs as the previous release");

    // The job's image through a proxy capped at 512 KiB/s in all: each node needs 16 s of
    // the registry's bytes, one node at a time, so the job is still going when the agents
    // roll (the controller's roll took 20 s on an idle machine and 69 s beside a full run,
    // when 1 MiB/s let the job end first).
    let proxy = Proxy::start_to(
        &format!("http://{}", cluster.registry),
        &json!([]),
        &["--listen", "10.250.0.1:0", "--total-rate", "512KiB"],
    );
    let _hosts = cluster.registry_host(&proxy.address);
    let image = format!(
        "{}/{}",
        proxy.address,
        unique_image_with("skew", 2, 4 << 20, &["--base", "none"])
    );
    let nodes = cluster.nodes().len();
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: skew, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  parallelism: 1\n  completionPolicy: {{type: Always}}\n",
        ns = ns.name
    ));
    progress.say("the job started");
    roll(
        cluster,
        "deployment/rigger-controller",
        "controller",
        &this_controller,
    );
    progress.say("the controller's Deployment rolled to this release");
    let status = job(cluster, &ns, "skew");
    assert!(
        status["completionTime"].is_null(),
        "the job ended before the agents rolled: {status:#}"
    );
    roll(cluster, "daemonset/rigger-agent", "agent", &this_agent);
    progress.say("the agents' DaemonSet rolled to this release");
    wait_for_job(cluster, &ns, "skew", nodes);
    let status = job(cluster, &ns, "skew");
    assert_eq!(status["failed"].as_u64().unwrap_or(0), 0, "{status:#}");
    progress.say("the job completed");

    // A controller rolled back one release keeps this release's agents, and forward.
    roll(cluster, "deployment/rigger-controller", "controller", &old);
    progress.say("the controller rolled back over this release's agents");
    start_job(cluster, &ns, "skew-back");
    wait_for_job(cluster, &ns, "skew-back", nodes);
    progress.say("a job completed on the previous controller with this release's agents");
    roll(
        cluster,
        "deployment/rigger-controller",
        "controller",
        &this_controller,
    );
    progress.say("the controller back on this release");
}
