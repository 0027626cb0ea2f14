//! `rigger-agent status` reports CRI pods and containers the way kubelet labels them.
//!
//! kubelet cannot run here, so this test plays kubelet's part over the real CRI socket:
//! it creates a host-network sandbox and a container with kubelet's labels, as kubelet
//! would, and checks the agent's report.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::time::Duration;

use rigger_integration_tests::{CriPod, CriPodSpec, Lab, agent, wait_until};
use serde_json::Value;

#[test]
fn cri_pod_and_container_are_reported_with_kubelet_names() {
    let lab = Lab::get();
    let image = lab.image("rigger-lab/busybox:1");
    // The image comes the way kubelet gets it: CRI PullImage.
    let out = std::process::Command::new(rigger_integration_tests::binary("rigger-bench-cri-pull"))
        .arg(&lab.containerd_address)
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let pid = std::process::id();
    let (pod_ns, pod_name, uid) = ("shop", format!("web-{pid}"), format!("uid-{pid}"));
    let labels = HashMap::from([
        ("io.kubernetes.pod.namespace".to_owned(), pod_ns.to_owned()),
        ("io.kubernetes.pod.name".to_owned(), pod_name.clone()),
        ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
    ]);
    let mut container_labels = labels.clone();
    container_labels.insert("io.kubernetes.container.name".into(), "app".into());
    let mut spec = CriPodSpec::new(&pod_name, &image, &[]);
    spec.namespace = pod_ns.to_owned();
    spec.uid = uid.clone();
    spec.labels = labels;
    spec.container = "app".to_owned();
    spec.container_labels = container_labels;
    spec.container_annotations = HashMap::from([(
        "io.kubernetes.container.restartCount".to_owned(),
        "2".to_owned(),
    )]);
    spec.attempt = 2;
    let pod = CriPod::run_spec(&spec);
    let (sandbox_id, container_id) = (pod.sandbox_id.clone(), pod.container_id.clone());

    let address = lab.containerd_address.to_str().unwrap().to_owned();
    let inventory: Value = wait_until(
        "the container to be running",
        Duration::from_secs(30),
        || {
            let out = agent(&[
                "status",
                "--address",
                &address,
                "-o",
                "json",
                "--no-disk-usage",
            ]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let inv: Value = serde_json::from_slice(&out.stdout).unwrap();
            let running = inv["containers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["id"] == container_id.as_str() && c["state"] == "running");
            running.then_some(inv)
        },
    );

    let pods = inventory["pods"].as_array().unwrap();
    let reported_pod = pods
        .iter()
        .find(|p| p["id"] == sandbox_id.as_str())
        .unwrap();
    assert_eq!(reported_pod["namespace"], pod_ns);
    assert_eq!(reported_pod["name"], pod_name.as_str());
    assert_eq!(reported_pod["uid"], uid.as_str());
    assert_eq!(reported_pod["state"], "ready");
    assert_eq!(
        reported_pod["owner"], "kubelet",
        "kubelet's labels make it kubelet's pod"
    );
    assert!(reported_pod["created_at"].is_string());

    let containers = inventory["containers"].as_array().unwrap();
    let reported = containers
        .iter()
        .find(|c| c["pod_sandbox_id"] == sandbox_id.as_str())
        .unwrap();
    assert_eq!(reported["pod_namespace"], pod_ns);
    assert_eq!(reported["pod_name"], pod_name.as_str());
    assert_eq!(reported["name"], "app");
    assert_eq!(reported["image"], image.as_str());
    assert_eq!(reported["attempt"], 2);
    assert_eq!(reported["restart_count"], 2);
    assert!(reported["started_at"].is_string(), "{reported}");
    // The sandbox is CRI's, so it is not listed again as a plain containerd container.
    assert!(!containers.iter().any(|c| c["id"] == sandbox_id.as_str()));

    let table = agent(&[
        "status",
        "--address",
        lab.containerd_address.to_str().unwrap(),
    ]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.contains(&format!("shop/{pod_name}")), "{table}");
    drop(pod);
}
