//! `rigger-agent pull` against the lab: the result must be what containerd's own pull
//! leaves (same rootfs, same labels, same records), and CRI must use it as pulled, on
//! every containerd version the lab runs (1.6, 1.7, 2.1: each compared with the same
//! version's own pull).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, ImageStatusRequest};
use rigger_integration_tests::fidelity::{
    agent_pull, agent_pull_on, assert_pulled, assert_same_labels, compare_with_ctr,
};
use rigger_integration_tests::{
    Lab, LabNode, MountedSnapshot, TestNamespace, agent, on_every_containerd, top_chain_id,
    tree_listing,
};
use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};

on_every_containerd!(
    fixtures_rootfs_matches_containerds_pull,
    multi_layer_rootfs_matches_containerds_pull,
    zstd_layers_match_containerds_pull,
    uncompressed_layers_match_containerds_pull,
    docker_schema2_images_match_containerds_pull,
    oci_index_picks_the_host_platform_like_ctr,
    docker_manifest_list_picks_the_host_platform_like_ctr,
    cri_finds_an_agent_pulled_image,
);

fn fixtures_rootfs_matches_containerds_pull(node: &LabNode) {
    // Whiteouts, opaque dirs, hardlinks, symlinks, setuid, owners, fifos, long names.
    compare_with_ctr(node, "rigger-lab/fixtures:1", "pull-fixtures");
}

fn multi_layer_rootfs_matches_containerds_pull(node: &LabNode) {
    compare_with_ctr(node, "rigger-lab/multi:1", "pull-multi");
}

fn zstd_layers_match_containerds_pull(node: &LabNode) {
    let image =
        rigger_integration_tests::unique_image_with("zstd", 2, 300_000, &["--compression", "zstd"]);
    compare_with_ctr(node, &image, "pull-zstd");
}

fn uncompressed_layers_match_containerds_pull(node: &LabNode) {
    let image = rigger_integration_tests::unique_image_with(
        "plain",
        2,
        300_000,
        &["--compression", "none"],
    );
    compare_with_ctr(node, &image, "pull-plain");
}

fn docker_schema2_images_match_containerds_pull(node: &LabNode) {
    let image =
        rigger_integration_tests::unique_image_with("docker", 2, 300_000, &["--format", "docker"]);
    compare_with_ctr(node, &image, "pull-docker");
}

fn compare_index_with_ctr(node: &LabNode, format: &str, test: &str) {
    let lab = Lab::get();
    let repo = format!("rigger-lab/{test}-{}", std::process::id());
    rigger_integration_tests::lab_image(&["index", "--name", &repo, "--format", format]);
    let repo_tag = format!("{repo}:1");
    let image = lab.image(&repo_tag);
    let ours = TestNamespace::on(node, &format!("{test}-agent"));
    let theirs = TestNamespace::on(node, &format!("{test}-ctr"));
    assert_pulled(&agent_pull_on(node, &ours.name, &[&image]));
    node.ctr_pull(&theirs.name, &image);

    let (index, index_digest) = lab.index(&repo_tag);
    let record = |ns: &str| {
        node.ctr(ns, &["images", "ls"])
            .lines()
            .nth(1)
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
    };
    assert_eq!(record(&ours.name), record(&theirs.name));
    assert!(record(&ours.name).unwrap().contains(&index_digest));

    // The host's manifest was chosen, and every blob carries ctr's labels.
    let host_arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let chosen = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["platform"]["architecture"] == host_arch)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let manifest: serde_json::Value =
        serde_json::from_str(&node.ctr(&ours.name, &["content", "get", &chosen])).unwrap();
    let a = assert_same_labels(
        node,
        &ours.name,
        &theirs.name,
        vec![index_digest, chosen],
        &manifest,
    );
    // Other platforms' manifests were not fetched.
    for other in index["manifests"].as_array().unwrap() {
        let digest = other["digest"].as_str().unwrap();
        if other["platform"]["architecture"] != host_arch {
            assert!(
                !a.contains_key(digest),
                "{digest} of another platform was stored"
            );
        }
    }
    let config: serde_json::Value = serde_json::from_str(&node.ctr(
        &ours.name,
        &[
            "content",
            "get",
            manifest["config"]["digest"].as_str().unwrap(),
        ],
    ))
    .unwrap();
    let ids: Vec<String> = config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    let chain = top_chain_id(&ids);
    let (x, y) = (
        MountedSnapshot::view_on(node, &ours.name, &chain),
        MountedSnapshot::view_on(node, &theirs.name, &chain),
    );
    assert_eq!(tree_listing(&x.path), tree_listing(&y.path));
}

fn oci_index_picks_the_host_platform_like_ctr(node: &LabNode) {
    compare_index_with_ctr(node, "oci", "pull-index");
}

fn docker_manifest_list_picks_the_host_platform_like_ctr(node: &LabNode) {
    compare_index_with_ctr(node, "docker", "pull-list");
}

fn cri_finds_an_agent_pulled_image(node: &LabNode) {
    let lab = Lab::get();
    // An image no other test pulls, so CRI can only know it from the agent.
    let repo = format!("rigger-lab/cri-{}", std::process::id());
    rigger_integration_tests::lab_image(&[
        "layers", "--name", &repo, "--count", "2", "--size", "65536",
    ]);
    let image = lab.image(&format!("{repo}:1"));
    let out = agent_pull_on(node, "k8s.io", &[&image]);
    assert_pulled(&out);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let status = runtime.block_on(async {
        let rt = Runtime::connect(&node.address, DEFAULT_CONNECT_TIMEOUT)
            .await
            .unwrap();
        ImageServiceClient::new(rt.channel())
            .image_status(ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
    });
    let found = status.image.expect("CRI ImageStatus finds the image");
    let (manifest, digest) = lab.manifest(&format!("{repo}:1"));
    assert_eq!(found.id, manifest["config"]["digest"].as_str().unwrap());
    assert!(found.repo_tags.contains(&image), "{:?}", found.repo_tags);
    assert!(
        found.repo_digests.iter().any(|d| d.ends_with(&digest)),
        "{:?}",
        found.repo_digests
    );

    // kubelet would now start a container from it without pulling: so does this.
    let mut pod = rigger_integration_tests::CriPod::run_on(
        node,
        "agent-pulled",
        &image,
        &["/bin/sleep", "3600"],
    );
    rigger_integration_tests::wait_until(
        "the container to run",
        std::time::Duration::from_secs(30),
        || (pod.container_state() == "CONTAINER_RUNNING").then_some(()),
    );
    drop(pod);

    // Clean up the image from CRI's namespace.
    let records = node.ctr("k8s.io", &["images", "ls", "-q"]);
    for name in records
        .lines()
        .filter(|l| l.contains(&repo) || l == &found.id)
    {
        node.ctr("k8s.io", &["images", "rm", name]);
    }
}

#[test]
fn already_present_image_downloads_nothing() {
    let lab = Lab::get();
    let ns = TestNamespace::new("pull-again");
    let image = lab.image("rigger-lab/busybox:1");
    assert_pulled(&agent_pull(&ns.name, &[&image]));
    let again = agent_pull(&ns.name, &[&image]);
    assert_pulled(&again);
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(log.contains("already present"), "{log}");
    assert!(!log.contains(": downloaded"), "{log}");
}

#[test]
fn bad_references_fail_with_one_line_naming_the_image() {
    let lab = Lab::get();
    let ns = TestNamespace::new("pull-bad");
    let cases: HashMap<String, &str> = HashMap::from([
        (lab.image("rigger-lab/busybox:no-such-tag"), "not found"),
        (lab.image("rigger-lab/no-such-repo:1"), "not found"),
        (format!("{}/UPPER/case:1", lab.registry), "invalid"),
        ("no spaces allowed:1".to_owned(), "invalid"),
    ]);
    for (image, expected) in cases {
        let out = agent_pull(&ns.name, &[&image]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{image}");
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        assert!(last.starts_with("rigger-agent: error:"), "{stderr}");
        assert!(last.contains(expected), "{image}: {last}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // Nothing was recorded.
    assert!(lab.ctr(&ns.name, &["images", "ls", "-q"]).trim().is_empty());

    let out = agent(&[
        "pull",
        "--address",
        lab.containerd_address.to_str().unwrap(),
        "--registry-config",
        lab.hosts_dir.to_str().unwrap(),
        "--namespace",
        &ns.name,
        "--platform",
        "linux/s390x",
        &lab.image("rigger-lab/busybox:1"),
    ]);
    assert!(!out.status.success());
}
