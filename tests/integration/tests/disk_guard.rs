//! The disk guard on a small filesystem holding a containerd root (a tmpfs of 64 MiB):
//! a pull that would take it past the threshold (kubelet's 85 % by default, or as set)
//! is refused before a byte of a layer is fetched — the content store left empty —, the
//! refusal naming the image, the filesystem and the threshold; in a job, the node's
//! status says so and `rigger_agent_pulls_total{result="refused_disk"}` counts it. A
//! pull that fits goes through.
//!
//! Layers here are mostly random bytes (they barely compress), so each image's need is
//! known: its compressed size, and three times that unpacked (the guard's estimate).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::{Command, Output};
use std::time::Duration;

use rigger_integration_tests::{
    Agent, Controller, Lab, PrivateContainerd, binary, http_get, unique_image, wait_until,
};

const MIB: usize = 1 << 20;

/// `rigger-agent pull` of `image` into `containerd`, the guard's threshold as given
/// (`None`: its default).
fn pull(containerd: &PrivateContainerd, image: &str, threshold: Option<&str>) -> Output {
    let lab = Lab::get();
    let mut command = Command::new(binary("rigger-agent"));
    command
        .arg("pull")
        .arg("--address")
        .arg(&containerd.address)
        .arg("--registry-config")
        .arg(&lab.hosts_dir)
        .args(["--namespace", "guarded"])
        .arg(lab.image(image))
        // The tests' own environment turns the guard off (.cargo/config.toml).
        .env_remove("RIGGER_AGENT_IMAGE_FS_THRESHOLD_PERCENT");
    if let Some(percent) = threshold {
        command.args(["--image-fs-threshold-percent", percent]);
    }
    command.output().unwrap()
}

fn content(containerd: &PrivateContainerd) -> String {
    containerd.ctr("guarded", &["content", "ls", "-q"])
}

#[test]
fn a_pull_past_the_threshold_is_refused_before_it_downloads() {
    let containerd = PrivateContainerd::start(Some("64m"));
    // ~7 MiB compressed: ~28 MiB needed; 40 % of 64 MiB is 25.6 MiB, 85 % 54.4 MiB.
    let medium = unique_image("guard-medium", 2, 4 * MIB);
    // ~16 MiB compressed: ~64 MiB needed, the whole filesystem.
    let big = unique_image("guard-big", 2, 8 * MIB);

    let refused = pull(&containerd, &medium, Some("40"));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("rigger-agent: error:")
            && last.contains(&Lab::get().image(&medium))
            && last.contains("past 40% used")
            && last.contains(&containerd.root.display().to_string()),
        "{last}"
    );
    assert_eq!(content(&containerd).trim(), "", "nothing fetched");
    assert_eq!(
        containerd
            .ctr("guarded", &["content", "active"])
            .lines()
            .count(),
        1
    );

    // At kubelet's 85 % it fits.
    let pulled = pull(&containerd, &medium, None);
    assert!(
        pulled.status.success(),
        "{}",
        String::from_utf8_lossy(&pulled.stderr)
    );
    let held = content(&containerd);

    // The big one would fill the filesystem: refused at the default, and even at 100 %.
    for threshold in [None, Some("100")] {
        let refused = pull(&containerd, &big, threshold);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{stderr}");
        assert!(
            stderr.contains("the image filesystem's threshold"),
            "{stderr}"
        );
        assert_eq!(content(&containerd), held, "nothing more fetched");
    }

    // Pulled again, the medium image needs nothing more: it fits even at 40 %.
    let again = pull(&containerd, &medium, Some("40"));
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
fn a_job_reports_the_refusal_in_its_status_and_a_metric() {
    let containerd = PrivateContainerd::start(Some("64m"));
    // The guard counts a layer's blob and about 3 times it unpacked: 2 × 9 MiB (about
    // 15 MiB compressed) needs about 60 MiB, well past 85 % of 64 MiB and under 100 %.
    // At 2 × 8 MiB (53 MiB) only the few MiB containerd itself holds made it refuse: CI
    // once found the pull fitting.
    let big = unique_image("guard-job", 2, 9 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let controller = Controller::start(&dir.path().join("controller"));
    let state = dir.path().join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let lab = Lab::get();
    let mut agent = Agent::start(
        &controller,
        "guarded-node",
        &containerd.address,
        &lab.hosts_dir,
        "guarded",
        &state,
    );
    // The guard at kubelet's threshold (the tests' environment turns it off).
    agent.restart_with_flags(&["--image-fs-threshold-percent", "85"]);
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = controller.get_json(&["node", "guarded-node"])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });

    controller.apply_ok(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata:\n  name: too-big\nspec:\n  image: {}\n  selector:\n    names: [guarded-node]\n  pullPolicy:\n    backoffLimit: 0\n    timeoutSeconds: 60\n",
        lab.image(&big)
    ));
    let job = wait_until("the job to complete", Duration::from_secs(60), || {
        let job = controller.get_json(&["imagepulljob", "too-big"])?;
        job["status"]["completionTime"].is_string().then_some(job)
    });
    assert_eq!(job["status"]["failed"], 1, "{job:#}");
    let message = job["status"]["nodes"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("past 85% used") && message.contains("the image filesystem's threshold"),
        "{message}"
    );
    assert_eq!(content(&containerd).trim(), "", "nothing fetched");
    let (_, metrics) = http_get(&agent.health, "/metrics").unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "rigger_agent_pulls_total{result=\"refused_disk\"} 1"),
        "{metrics}"
    );
}
