//! `rigger-agent status` reports CRI pods and containers the way kubelet labels them.
//!
//! kubelet cannot run here, so this test plays kubelet's part over the real CRI socket:
//! it creates a host-network sandbox and a container with kubelet's labels, as kubelet
//! would, and checks the agent's report.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, PullImageRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopPodSandboxRequest,
};
use rigger_agent::runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};
use rigger_integration_tests::{Lab, agent, wait_until};
use serde_json::Value;
use tonic::transport::Channel;

struct Pod {
    client: RuntimeServiceClient<Channel>,
    id: String,
}

impl Pod {
    async fn remove(mut self) {
        let id = self.id.clone();
        let _ = self
            .client
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let _ = self
            .client
            .remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id })
            .await;
    }
}

fn kubelet_pod_labels(namespace: &str, name: &str, uid: &str) -> HashMap<String, String> {
    HashMap::from([
        (
            "io.kubernetes.pod.namespace".to_owned(),
            namespace.to_owned(),
        ),
        ("io.kubernetes.pod.name".to_owned(), name.to_owned()),
        ("io.kubernetes.pod.uid".to_owned(), uid.to_owned()),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_pod_and_container_are_reported_with_kubelet_names() {
    let lab = Lab::get();
    let runtime = Runtime::connect(&lab.containerd_address, DEFAULT_CONNECT_TIMEOUT)
        .await
        .unwrap();
    let image = lab.image("rigger-lab/busybox:1");
    ImageServiceClient::new(runtime.channel())
        .pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.clone(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap();

    let pid = std::process::id();
    let (pod_ns, pod_name, uid) = ("shop", format!("web-{pid}"), format!("uid-{pid}"));
    let labels = kubelet_pod_labels(pod_ns, &pod_name, &uid);
    let sandbox_config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: pod_name.clone(),
            uid: uid.clone(),
            namespace: pod_ns.to_owned(),
            attempt: 0,
        }),
        // No CNI here: host network, and no hostname (runc cannot set one without a UTS ns).
        hostname: String::new(),
        labels: labels.clone(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut client = RuntimeServiceClient::new(runtime.channel());
    let sandbox_id = client
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let pod = Pod {
        client: client.clone(),
        id: sandbox_id.clone(),
    };

    let mut container_labels = labels.clone();
    container_labels.insert("io.kubernetes.container.name".into(), "app".into());
    let container_id = client
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "app".into(),
                    attempt: 2,
                }),
                image: Some(ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                labels: container_labels,
                annotations: HashMap::from([(
                    "io.kubernetes.container.restartCount".to_owned(),
                    "2".to_owned(),
                )]),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    client
        .start_container(StartContainerRequest {
            container_id: container_id.clone(),
        })
        .await
        .unwrap();

    let address = lab.containerd_address.to_str().unwrap().to_owned();
    let inventory: Value = tokio::task::spawn_blocking(move || {
        wait_until(
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
        )
    })
    .await
    .unwrap();

    let pods = inventory["pods"].as_array().unwrap();
    let reported_pod = pods
        .iter()
        .find(|p| p["id"] == sandbox_id.as_str())
        .unwrap();
    assert_eq!(reported_pod["namespace"], pod_ns);
    assert_eq!(reported_pod["name"], pod_name.as_str());
    assert_eq!(reported_pod["uid"], uid.as_str());
    assert_eq!(reported_pod["state"], "ready");
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

    pod.remove().await;
}
