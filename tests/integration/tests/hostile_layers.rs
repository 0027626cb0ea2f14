//! Hostile images against the lab's containerd (every version it runs): layers built to
//! escape the snapshot, change the host or confuse the applier. Each is pulled by
//! `rigger-agent` and must end as containerd's own pull of it ends — the same tree, or
//! refused — with a canary directory outside every snapshot unchanged byte for byte and
//! mode for mode, and a refusal leaving no image record and no half-unpacked snapshot.
//! (The same cases without containerd, faster and at the applier itself:
//! `layer/tests/hostile.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

use rigger_integration_tests::fidelity::{
    agent_pull_on, assert_left_nothing, compare_with_ctr, compare_with_ctr_in,
};
use rigger_integration_tests::{
    Containerd, Lab, LabNode, TestNamespace, binary, on_every_containerd, tree_listing,
};

/// Not overlayfs: whiteouts there are removals, not overlayfs' device nodes, so layers go
/// through containerd's own diff service (whiteouts, opaque directories, hostile names
/// handled as containerd handles them).
fn the_native_snapshotter_unpacks_as_containerd_does(node: &LabNode) {
    unpacks_in_the_snapshotter_as_containerd_does(node, "native");
}

/// The fixtures image and a hostile one pulled into `snapshotter` (one Rigger hands to
/// containerd's diff service) end as containerd's own pull of them, the host untouched.
fn unpacks_in_the_snapshotter_as_containerd_does(node: &LabNode, snapshotter: &str) {
    compare_with_ctr_in(
        node,
        snapshotter,
        "rigger-lab/fixtures:1",
        &format!("pull-{snapshotter}"),
    );
    let canary = Canary::new();
    let image = hostile_image("symlink-to-target", Some(canary.dir.path()));
    compare_with_ctr_in(node, snapshotter, &image, &format!("hostile-{snapshotter}"));
    canary.assert_untouched();
}

/// containerd 2.3 and 2.4's erofs snapshotter (this kernel mounts erofs; mkfs.erofs is
/// Debian 12's erofs-utils): each committed layer an erofs image, the rootfs an overlay of
/// them. Rigger's pull goes through containerd's diff service there, as for native, and
/// ends as containerd's own: the same tree, a hostile layer's included, the host untouched.
fn the_erofs_snapshotter_unpacks_as_containerd_does(node: &LabNode) {
    unpacks_in_the_snapshotter_as_containerd_does(node, "erofs");
}

#[test]
fn the_erofs_snapshotter_unpacks_as_containerd_does_on_containerd_2_3() {
    the_erofs_snapshotter_unpacks_as_containerd_does(Lab::get().node(Containerd::V2_3));
}

#[test]
fn the_erofs_snapshotter_unpacks_as_containerd_does_on_containerd_2_4() {
    the_erofs_snapshotter_unpacks_as_containerd_does(Lab::get().node(Containerd::V2_4));
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
    assert_refused_image_leaving_nothing(node, kind, &hostile_image(kind, None), expected);
}

/// [`assert_refused_leaving_nothing`] for the lab image `repo_tag`.
fn assert_refused_image_leaving_nothing(
    node: &LabNode,
    kind: &str,
    repo_tag: &str,
    expected: &str,
) {
    let ns = TestNamespace::on(node, &format!("hostile-{kind}"));
    let image = Lab::get().image(repo_tag);
    let out = agent_pull_on(node, &ns.name, &[&image]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(
        last.starts_with("rigger-agent: error:") && last.contains(&image),
        "{last}"
    );
    assert!(last.contains(expected), "{last}");
    assert_left_nothing(node, &ns.name);
}

/// containerd's own pull (of the same version) refuses hostile image `kind` too.
fn assert_containerd_refuses(node: &LabNode, kind: &str) {
    assert_containerd_refuses_image(node, kind, &hostile_image(kind, None));
}

fn assert_containerd_refuses_image(node: &LabNode, kind: &str, repo_tag: &str) {
    let ns = TestNamespace::on(node, &format!("hostile-{kind}-ctr"));
    let out = Command::new(&node.ctr_path)
        .arg("--address")
        .arg(&node.address)
        .args(["--namespace", &ns.name, "images", "pull", "--hosts-dir"])
        .arg(&node.hosts_dir)
        .arg(Lab::get().image(repo_tag))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "containerd {} pulled it",
        node.version
    );
}

on_every_containerd!(
    the_native_snapshotter_unpacks_as_containerd_does,
    the_hostile_corpus_ends_as_containerds_pull_does,
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
        .env("RUST_LOG", "rigger_agent=debug,rigger_pull=debug")
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

/// How containerd's own pull ends for a kind, and so how Rigger's must.
#[derive(Debug, Clone, Copy)]
enum Expected {
    /// Pulled, with the same tree as containerd's.
    SameTree,
    /// Refused by both, Rigger's refusal saying this.
    Refused(&'static str),
}

/// The corpus beyond the cases above: symlinks over lower directories, chains of them,
/// hard links to symlinks (all aimed at the canary), device nodes, whiteouts at every
/// depth, absolute and non-UTF-8 names, an entry declaring 8 GiB, duplicates and a
/// directory replaced by a file and back.
const CORPUS: &[(&str, Expected)] = &[
    ("symlink-over-dir", Expected::SameTree),
    ("symlink-chain", Expected::SameTree),
    ("hardlink-to-symlink", Expected::SameTree),
    ("devices", Expected::SameTree),
    ("whiteouts-deep", Expected::SameTree),
    ("absolute-names", Expected::SameTree),
    ("non-utf8", Expected::SameTree),
    ("huge-size", Expected::Refused("invalid layer archive")),
    ("duplicates", Expected::SameTree),
    (
        "whiteout-own-entry",
        Expected::Refused("the layer itself holds"),
    ),
];

fn the_hostile_corpus_ends_as_containerds_pull_does(node: &LabNode) {
    for &(kind, expected) in CORPUS {
        let canary = Canary::new();
        let image = hostile_image(kind, Some(canary.dir.path()));
        match expected {
            Expected::SameTree => {
                compare_with_ctr(node, &image, &format!("corpus-{kind}"));
            }
            Expected::Refused(saying) => {
                assert_refused_image_leaving_nothing(node, kind, &image, saying);
                assert_containerd_refuses_image(node, kind, &image);
            }
        }
        canary.assert_untouched();
    }
}
