//! `rigger-agent pull` against the lab: the result must be what containerd's own pull
//! leaves (same rootfs, same labels, same records), and CRI must use it as pulled, on
//! every containerd version the lab runs (1.6, 1.7, 2.1: each compared with the same
//! version's own pull).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::collections::HashMap;
use std::process::{Command, Output};

use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, ImageStatusRequest};
use rigger_agent::runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};
use rigger_integration_tests::{
    Containerd, Lab, LabNode, MountedSnapshot, TestNamespace, agent, binary, on_every_containerd,
    top_chain_id, tree_listing,
};

/// `rigger-agent pull` into namespace `ns` of the lab's first node.
fn agent_pull(ns: &str, images: &[&str]) -> Output {
    agent_pull_on(Lab::get().first_node(), ns, images)
}

/// `rigger-agent pull` into namespace `ns` of `node`.
fn agent_pull_on(node: &LabNode, ns: &str, images: &[&str]) -> Output {
    agent_pull_with(node, "overlayfs", ns, images)
}

/// `rigger-agent pull` into namespace `ns` of `node`, unpacking into `snapshotter`.
fn agent_pull_with(node: &LabNode, snapshotter: &str, ns: &str, images: &[&str]) -> Output {
    let mut args = vec![
        "--snapshotter".to_owned(),
        snapshotter.to_owned(),
        "--address".to_owned(),
        node.address.display().to_string(),
        "--registry-config".to_owned(),
        node.hosts_dir.display().to_string(),
        "--namespace".to_owned(),
        ns.to_owned(),
    ];
    args.extend(images.iter().map(|s| (*s).to_owned()));
    Command::new(binary("rigger-agent"))
        .arg("pull")
        .args(&args)
        .output()
        .unwrap()
}

fn assert_pulled(out: &Output) {
    assert!(
        out.status.success(),
        "pull failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// diff IDs of a lab image, from its config as pulled into `ns` of `node`.
fn diff_ids(node: &LabNode, ns: &str, repo_tag: &str) -> Vec<String> {
    let (manifest, _) = Lab::get().manifest(repo_tag);
    let config = node.ctr(
        ns,
        &[
            "content",
            "get",
            manifest["config"]["digest"].as_str().unwrap(),
        ],
    );
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["rootfs"]["diff_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect()
}

/// Every blob of the image — `blobs` (index, manifest), then the manifest's config and
/// layers — is in `ours` with the labels it has in `theirs`. Returns `ours`' labels.
fn assert_same_labels(
    node: &LabNode,
    ours: &str,
    theirs: &str,
    mut blobs: Vec<String>,
    manifest: &serde_json::Value,
) -> HashMap<String, std::collections::BTreeMap<String, String>> {
    blobs.push(manifest["config"]["digest"].as_str().unwrap().to_owned());
    blobs.extend(
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_owned()),
    );
    let (a, b) = (node.content_labels(ours), node.content_labels(theirs));
    for blob in &blobs {
        assert!(a.contains_key(blob), "{blob} missing");
        assert_eq!(
            a.get(blob),
            b.get(blob),
            "labels of {blob} differ (agent vs ctr)"
        );
    }
    a
}

fn compare_with_ctr(node: &LabNode, repo_tag: &str, test: &str) {
    compare_with_ctr_in(node, "overlayfs", repo_tag, test);
}

/// As [`compare_with_ctr`], both pulls unpacking into `snapshotter`.
fn compare_with_ctr_in(node: &LabNode, snapshotter: &str, repo_tag: &str, test: &str) {
    let lab = Lab::get();
    let ours = TestNamespace::on(node, &format!("{test}-agent"));
    let theirs = TestNamespace::on(node, &format!("{test}-ctr"));
    let image = lab.image(repo_tag);

    // The agent first, so it really downloads (content is shared across namespaces).
    assert_pulled(&agent_pull_with(node, snapshotter, &ours.name, &[&image]));
    let hosts = node.hosts_dir.display().to_string();
    let mut pull = vec![
        "images",
        "pull",
        "--snapshotter",
        snapshotter,
        "--hosts-dir",
        &hosts,
    ];
    if node.containerd == Containerd::V2_1 && snapshotter != "overlayfs" {
        // 2.x's transfer service unpacks only for the snapshotters its config lists
        // (overlayfs by default); ctr's own client-side pull unpacks anywhere.
        pull.push("--local");
    }
    pull.push(&image);
    node.ctr(&theirs.name, &pull);

    // Same image record.
    let record = |ns: &str| {
        node.ctr(ns, &["images", "ls"])
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
    };
    assert_eq!(record(&ours.name), record(&theirs.name));

    // Same labels on every blob of the image.
    let (manifest, manifest_digest) = lab.manifest(repo_tag);
    assert_same_labels(
        node,
        &ours.name,
        &theirs.name,
        vec![manifest_digest],
        &manifest,
    );

    // Same snapshots and the same rootfs, file by file.
    let ids = diff_ids(node, &ours.name, repo_tag);
    let chain = top_chain_id(&ids);
    let ours_root = MountedSnapshot::view_with(node, snapshotter, &ours.name, &chain);
    let theirs_root = MountedSnapshot::view_with(node, snapshotter, &theirs.name, &chain);
    let (a, b) = (
        tree_listing(&ours_root.path),
        tree_listing(&theirs_root.path),
    );
    assert!(!a.is_empty());
    for (path, entry) in &b {
        assert_eq!(a.get(path), Some(entry), "{path} differs");
    }
    assert_eq!(a.len(), b.len(), "extra paths in the agent's rootfs");
}

on_every_containerd!(
    fixtures_rootfs_matches_containerds_pull,
    the_native_snapshotter_unpacks_as_containerd_does,
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

/// Not overlayfs: whiteouts there are removals, not overlayfs' device nodes, so layers go
/// through containerd's own diff service (whiteouts, opaque directories, hostile names
/// handled as containerd handles them).
fn the_native_snapshotter_unpacks_as_containerd_does(node: &LabNode) {
    compare_with_ctr_in(node, "native", "rigger-lab/fixtures:1", "pull-native");
    let canary = Canary::new();
    let image = hostile_image("symlink-to-target", Some(canary.dir.path()));
    compare_with_ctr_in(node, "native", &image, "hostile-native");
    canary.assert_untouched();
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

/// A hostile lab image of `kind` (scripts/lab-images), its symlinks aimed at `target`.
fn hostile_image(kind: &str, target: Option<&std::path::Path>) -> String {
    let repo = format!("rigger-lab/hostile-{kind}-{}", std::process::id());
    let mut args = vec!["hostile", "--name", &repo, "--kind", kind];
    let target = target.map(|t| t.display().to_string());
    if let Some(target) = &target {
        args.extend(["--target", target]);
    }
    rigger_integration_tests::lab_image(&args);
    format!("{repo}:1")
}

/// `rigger-agent pull` of hostile image `kind` fails with one line naming the image and
/// saying `expected`, and leaves no image record and no half-unpacked snapshot.
fn assert_refused_leaving_nothing(node: &LabNode, kind: &str, expected: &str) {
    let lab = Lab::get();
    let ns = TestNamespace::on(node, &format!("hostile-{kind}"));
    let image = lab.image(&hostile_image(kind, None));
    let out = agent_pull_on(node, &ns.name, &[&image]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("rigger-agent: error:") && last.contains(&image),
        "{last}"
    );
    assert!(last.contains(expected), "{last}");
    assert!(
        node.ctr(&ns.name, &["images", "ls", "-q"])
            .trim()
            .is_empty(),
        "no image record"
    );
    // No half-unpacked snapshot (the good base layer may linger until GC runs).
    let snapshots = node.ctr(&ns.name, &["snapshots", "ls"]);
    assert!(!snapshots.contains("Active"), "{snapshots}");
}

/// containerd's own pull (of the same version) refuses hostile image `kind` too.
fn assert_containerd_refuses(node: &LabNode, kind: &str) {
    let ns = TestNamespace::on(node, &format!("hostile-{kind}-ctr"));
    let out = Command::new(&node.ctr_path)
        .arg("--address")
        .arg(&node.address)
        .args(["--namespace", &ns.name, "images", "pull", "--hosts-dir"])
        .arg(&node.hosts_dir)
        .arg(Lab::get().image(&hostile_image(kind, None)))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "containerd {} pulled it",
        node.version
    );
}

on_every_containerd!(
    a_hardlink_into_a_lower_layer_is_refused_as_containerd_does,
    a_path_escaping_the_root_is_refused,
    invalid_whiteout_names_are_refused_as_containerd_refuses_them,
    a_symlink_over_implied_parents_never_changes_the_host,
    writing_through_a_symlink_to_the_host_stays_in_the_snapshot,
);

fn a_hardlink_into_a_lower_layer_is_refused_as_containerd_does(node: &LabNode) {
    assert_refused_leaving_nothing(
        node,
        "hardlink-lower",
        "links must point into the same layer",
    );
    assert_containerd_refuses(node, "hardlink-lower");
}

fn a_path_escaping_the_root_is_refused(node: &LabNode) {
    // Stricter than containerd, which cleans such a name back into the root.
    assert_refused_leaving_nothing(node, "escape", "outside of the layer root");
}

fn invalid_whiteout_names_are_refused_as_containerd_refuses_them(node: &LabNode) {
    for kind in ["whiteout-dot", "whiteout-dotdot"] {
        assert_refused_leaving_nothing(node, kind, "invalid whiteout");
        assert_containerd_refuses(node, kind);
    }
}

/// A directory outside every snapshot that hostile layers aim their symlinks at, with
/// what it held before, for "byte for byte and mode for mode unchanged".
struct Canary {
    dir: tempfile::TempDir,
    before: std::collections::BTreeMap<String, String>,
}

impl Canary {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("file"), b"host data").unwrap();
        std::fs::write(dir.path().join("b/inner"), b"host data").unwrap();
        let before = Self::listing(dir.path());
        Self { dir, before }
    }

    /// tree_listing of the directory, and of the directory itself.
    fn listing(path: &std::path::Path) -> std::collections::BTreeMap<String, String> {
        use std::os::unix::fs::MetadataExt as _;
        let mut listing = tree_listing(path);
        let meta = std::fs::metadata(path).unwrap();
        listing.insert(
            ".".to_owned(),
            format!("mode {:o} owner {}:{}", meta.mode(), meta.uid(), meta.gid()),
        );
        listing
    }

    fn assert_untouched(&self) {
        assert_eq!(
            Self::listing(self.dir.path()),
            self.before,
            "a directory outside the snapshots changed"
        );
    }
}

/// The case: after `a/b/f` (implying `a` and `a/b`), `a` becomes a symlink to a
/// host directory, above a lower `a/` (6777, uid 1000) and `a/b/` (0700, uid 1000).
/// Rigger's pull must leave the host as it was and the image as containerd's pull does.
fn a_symlink_over_implied_parents_never_changes_the_host(node: &LabNode) {
    let canary = Canary::new();
    let image = hostile_image("symlink-over-implied-parent", Some(canary.dir.path()));
    // The top layer unpacks staged, apart from its parent, and its implied parents are
    // completed from the lower layer afterwards: the pass that followed the symlink.
    let staged = TestNamespace::on(node, "hostile-implied-staged");
    let out = Command::new(binary("rigger-agent"))
        .args(["pull", "--address"])
        .arg(&node.address)
        .arg("--registry-config")
        .arg(&node.hosts_dir)
        .args(["--namespace", &staged.name, &Lab::get().image(&image)])
        .env("RUST_LOG", "rigger_agent=debug")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("staging snapshot"),
        "the top layer was not staged:\n{log}"
    );
    canary.assert_untouched();
    compare_with_ctr(node, &image, "hostile-implied");
    canary.assert_untouched();
}

/// Files, a directory, a whiteout and an opaque marker written through a symlink to a
/// host directory land in the snapshot, as containerd's pull puts them.
fn writing_through_a_symlink_to_the_host_stays_in_the_snapshot(node: &LabNode) {
    let canary = Canary::new();
    let image = hostile_image("symlink-to-target", Some(canary.dir.path()));
    compare_with_ctr(node, &image, "hostile-through");
    canary.assert_untouched();
}
