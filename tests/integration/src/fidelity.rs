//! What "pulled as containerd pulls" means in tests: `rigger-agent pull` into one
//! namespace, `ctr images pull` (the same containerd) into another, and the same image
//! record, the same labels on every blob and the same rootfs, file by file.

use std::collections::HashMap;
use std::process::{Command, Output};

use crate::{Lab, LabNode, MountedSnapshot, TestNamespace, binary, top_chain_id, tree_listing};

/// `rigger-agent pull` into namespace `ns` of the lab's first node.
pub fn agent_pull(ns: &str, images: &[&str]) -> Output {
    agent_pull_on(Lab::get().first_node(), ns, images)
}

/// `rigger-agent pull` into namespace `ns` of `node`.
pub fn agent_pull_on(node: &LabNode, ns: &str, images: &[&str]) -> Output {
    agent_pull_with(node, "overlayfs", ns, images)
}

/// `rigger-agent pull` into namespace `ns` of `node`, unpacking into `snapshotter`.
pub fn agent_pull_with(node: &LabNode, snapshotter: &str, ns: &str, images: &[&str]) -> Output {
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

pub fn assert_pulled(out: &Output) {
    assert!(
        out.status.success(),
        "pull failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// diff IDs of a lab image, from its config as pulled into `ns` of `node`.
pub fn diff_ids(node: &LabNode, ns: &str, repo_tag: &str) -> Vec<String> {
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
pub fn assert_same_labels(
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

pub fn compare_with_ctr(node: &LabNode, repo_tag: &str, test: &str) {
    compare_with_ctr_in(node, "overlayfs", repo_tag, test);
}

/// As [`compare_with_ctr`], both pulls unpacking into `snapshotter`.
pub fn compare_with_ctr_in(node: &LabNode, snapshotter: &str, repo_tag: &str, test: &str) {
    let ours = TestNamespace::on(node, &format!("{test}-agent"));
    let theirs = TestNamespace::on(node, &format!("{test}-ctr"));
    let image = Lab::get().image(repo_tag);

    // The agent first, so it really downloads (content is shared across namespaces).
    assert_pulled(&agent_pull_with(node, snapshotter, &ours.name, &[&image]));
    let pull = ctr_pull_args(node, snapshotter, &image, false);
    node.ctr(
        &theirs.name,
        &pull.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_same_pull(node, snapshotter, &ours.name, &theirs.name, repo_tag);
}

/// How `repo_tag` ends when the agent pulls it and when `ctr images pull` does (overlayfs,
/// the same containerd): both pull it, the same way ([`compare_with_ctr`]), or both refuse
/// it, the agent leaving no image record and no half-unpacked snapshot. Whether it pulled.
pub fn compare_outcome_with_ctr(node: &LabNode, repo_tag: &str, test: &str) -> bool {
    let ours = TestNamespace::on(node, &format!("{test}-agent"));
    let theirs = TestNamespace::on(node, &format!("{test}-ctr"));
    let image = Lab::get().image(repo_tag);

    let agent = agent_pull_with(node, "overlayfs", &ours.name, &[&image]);
    // Unpacked in parallel, each layer onto an empty directory that is rebased later,
    // containerd does not see the layers below: a directory a layer only implies comes
    // out 0755 root-owned over the lower one, and one implied below a lower non-directory
    // hides it instead of failing the layer. Rigger applies layers in order, as
    // containerd's layer-by-layer unpack does; the random stacks draw such layers, so
    // they are compared with that.
    let layer_by_layer = node.containerd.unpacks_in_parallel();
    let ctr = node
        .ctr_command()
        .args(["--namespace", &theirs.name])
        .args(ctr_pull_args(node, "overlayfs", &image, layer_by_layer))
        .output()
        .unwrap();
    let said = |out: &Output| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        stderr
            .trim_end()
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned()
    };
    match (agent.status.success(), ctr.status.success()) {
        (true, true) => {
            assert_same_pull(node, "overlayfs", &ours.name, &theirs.name, repo_tag);
            true
        }
        (false, false) => {
            assert_left_nothing(node, &ours.name);
            false
        }
        (true, false) => panic!(
            "{image}: the agent pulled what containerd {} refuses: {}",
            node.version,
            said(&ctr)
        ),
        (false, true) => panic!(
            "{image}: the agent refused what containerd {} pulls: {}",
            node.version,
            said(&agent)
        ),
    }
}

/// A refused pull into namespace `ns` of `node` left no image record and no
/// half-unpacked snapshot (a good lower layer may linger until containerd's GC runs).
pub fn assert_left_nothing(node: &LabNode, ns: &str) {
    let records = node.ctr(ns, &["images", "ls", "-q"]);
    assert!(
        records.trim().is_empty(),
        "refused, yet recorded: {records}"
    );
    let snapshots = node.ctr(ns, &["snapshots", "ls"]);
    assert!(!snapshots.contains("Active"), "{snapshots}");
}

/// `ctr images pull` of `image` into `snapshotter`, from the node's registry settings;
/// unpacked `layer_by_layer` (in the client, `--local`) when asked.
fn ctr_pull_args(
    node: &LabNode,
    snapshotter: &str,
    image: &str,
    layer_by_layer: bool,
) -> Vec<String> {
    let mut pull = vec![
        "images".to_owned(),
        "pull".to_owned(),
        "--snapshotter".to_owned(),
        snapshotter.to_owned(),
        "--hosts-dir".to_owned(),
        node.hosts_dir.display().to_string(),
    ];
    // 2.x's transfer service unpacks only for the snapshotters its config lists
    // (overlayfs by default); ctr's own client-side pull unpacks anywhere, a layer at a
    // time.
    if layer_by_layer || (node.containerd.ctr_pulls_by_transfer() && snapshotter != "overlayfs") {
        pull.push("--local".to_owned());
    }
    pull.push(image.to_owned());
    pull
}

/// `repo_tag`, pulled into namespaces `ours` (the agent) and `theirs` (ctr), ended the
/// same: the same image record, the same labels on every blob, the same rootfs file for
/// file.
fn assert_same_pull(node: &LabNode, snapshotter: &str, ours: &str, theirs: &str, repo_tag: &str) {
    let record = |ns: &str| {
        node.ctr(ns, &["images", "ls"])
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
    };
    assert_eq!(record(ours), record(theirs));

    let (manifest, manifest_digest) = Lab::get().manifest(repo_tag);
    assert_same_labels(node, ours, theirs, vec![manifest_digest], &manifest);

    let ids = diff_ids(node, ours, repo_tag);
    let chain = top_chain_id(&ids);
    let ours_root = MountedSnapshot::view_with(node, snapshotter, ours, &chain);
    let theirs_root = MountedSnapshot::view_with(node, snapshotter, theirs, &chain);
    let (a, b) = (
        tree_listing(&ours_root.path),
        tree_listing(&theirs_root.path),
    );
    for (path, entry) in &b {
        assert_eq!(a.get(path), Some(entry), "{path} differs");
    }
    assert_eq!(a.len(), b.len(), "extra paths in the agent's rootfs");
}
