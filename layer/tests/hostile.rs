//! Hostile layers: each tries to reach outside the snapshot through symlinks, `..`,
//! hard links or bad whiteout names. The outcome must be a clean refusal or a tree that
//! stays inside the snapshot, and the canary directory beside it must not change.
//! (Run as root, as the agent does: owners and `trusted.*` attributes need it.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// test code
// Fixtures (canaries, lower layers) are made on the host, outside any snapshot under test.
#![allow(clippy::disallowed_methods)]

mod support;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use rigger_layer::{ApplyError, adopt_lowers};
use support::{Layer, Scene, is_root};

/// The case: a staged layer implies `a` and `a/b` (writing `a/b/f`), then
/// replaces `a` with a symlink to a host directory; the lower layer has `a/` and `a/b/`
/// with other modes and owners. Completing the implied parents afterwards used to chmod
/// and chown the host directory through the symlink.
#[test]
fn completing_implied_parents_never_follows_a_symlink_the_layer_put_there() {
    let scene = Scene::new();
    let lower = scene.lower("lower", |l| {
        std::fs::create_dir_all(l.join("a/b")).unwrap();
        std::fs::set_permissions(l.join("a"), std::fs::Permissions::from_mode(0o6777)).unwrap();
        std::fs::set_permissions(l.join("a/b"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(l.join("a/b"), Some(1000), Some(1000)).unwrap();
    });
    let layer = Layer::default()
        .file("a/b/f", 0o644, b"x")
        .symlink("a", &scene.canary_str());
    // Staged: applied without its lowers, completed from them afterwards.
    let applied = scene.apply(layer, &[]).unwrap();
    adopt_lowers(&scene.root, &[lower], &applied.implied_parents).unwrap();
    scene.assert_canary_untouched();
    assert!(
        std::fs::symlink_metadata(scene.root.join("a"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// The same layer applied on its lowers directly, then a file written "through" the
/// symlink: it lands inside the snapshot (the absolute target resolves in the root).
#[test]
fn writing_through_a_symlink_to_a_host_path_stays_in_the_snapshot() {
    let scene = Scene::new();
    let lower = scene.lower("lower", |l| std::fs::create_dir_all(l.join("a/b")).unwrap());
    let host = scene.canary_str();
    let layer = Layer::default()
        .file("a/b/f", 0o644, b"x")
        .symlink("a", &host)
        .file("a/file", 0o4777, b"planted")
        .dir("a/sub", 0o777)
        .file("a/sub/inner", 0o4777, b"planted");
    scene.apply(layer, &[lower]).unwrap();
    scene.assert_canary_untouched();
    let inside = scene.root.join(host.trim_start_matches('/'));
    assert_eq!(std::fs::read(inside.join("file")).unwrap(), b"planted");
}

#[test]
fn relative_symlinks_climbing_out_are_clamped_at_the_root() {
    let scene = Scene::new();
    // root/up -> ../../../.. ; then up/canary/file: resolves to root/canary/file.
    let layer = Layer::default()
        .symlink("up", "../../../../../..")
        .symlink("chain", "up/canary")
        .file("chain/file", 0o644, b"planted")
        .file("up/canary/sub/inner", 0o644, b"planted");
    scene.apply(layer, &[]).unwrap();
    scene.assert_canary_untouched();
    assert_eq!(
        std::fs::read(scene.root.join("canary/file")).unwrap(),
        b"planted"
    );
}

#[test]
fn an_entry_replacing_a_symlink_replaces_the_link_not_its_target() {
    let scene = Scene::new();
    let layer = Layer::default()
        .symlink("d", &scene.canary_str())
        .dir("d", 0o777)
        .symlink("f", &format!("{}/file", scene.canary_str()))
        .file("f", 0o666, b"new");
    scene.apply(layer, &[]).unwrap();
    scene.assert_canary_untouched();
    assert!(
        std::fs::symlink_metadata(scene.root.join("d"))
            .unwrap()
            .is_dir()
    );
    assert_eq!(std::fs::read(scene.root.join("f")).unwrap(), b"new");
}

#[test]
fn a_directory_replaced_by_a_symlink_keeps_its_times_off_the_target() {
    let scene = Scene::new();
    // Directory times are set at the end, after `x` became a symlink to the host: the
    // name resolves inside the root, to nothing there, and the layer is refused (as
    // containerd's last pass refuses it), the host untouched.
    let layer = Layer::default()
        .dir("x", 0o755)
        .symlink("x", &scene.canary_str());
    let err = scene.apply(layer, &[]).unwrap_err();
    assert!(err.to_string().contains("is gone by its end"), "{err}");
    scene.assert_canary_untouched();
}

#[test]
fn hard_links_to_symlinks_and_outside_paths_never_reach_the_host() {
    // A hard link to a symlink links the symlink (containerd does the same), and writing
    // through it stays inside.
    let scene = Scene::new();
    let host_file = format!("{}/file", scene.canary_str());
    let layer = Layer::default()
        .symlink("s", &host_file)
        .hard_link("h", "s")
        .file("h", 0o644, b"replaces the link, not the host file");
    scene.apply(layer, &[]).unwrap();
    let s = std::fs::symlink_metadata(scene.root.join("s")).unwrap();
    assert!(s.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(scene.root.join("s")).unwrap(),
        std::path::Path::new(&host_file)
    );
    assert_eq!(
        std::fs::read(scene.root.join("h")).unwrap(),
        b"replaces the link, not the host file"
    );
    scene.assert_canary_untouched();
    let scene = Scene::new();
    let layer = Layer::default()
        .symlink("s", &host_file)
        .hard_link("h", "s");
    scene.apply(layer, &[]).unwrap();
    let h = std::fs::symlink_metadata(scene.root.join("h")).unwrap();
    assert!(h.file_type().is_symlink(), "the link itself was linked");
    scene.assert_canary_untouched();
    // Through `..`: clamped at the root, not found there.
    let scene = Scene::new();
    let layer = Layer::default().hard_link("h", "../canary/file");
    assert!(scene.apply(layer, &[]).is_err());
    scene.assert_canary_untouched();
}

#[test]
fn xattrs_on_a_symlink_go_to_the_link_never_its_target() {
    if !is_root() {
        return;
    }
    let scene = Scene::new();
    let layer = Layer::default().with_xattr(
        tar::EntryType::Symlink,
        "s",
        "trusted.rigger-test",
        b"planted",
        Some(&format!("{}/file", scene.canary_str())),
    );
    let _ = scene.apply(layer, &[]);
    scene.assert_canary_untouched();
}

#[test]
fn an_opaque_marker_under_a_symlink_marks_a_directory_inside_the_snapshot() {
    if !is_root() {
        return;
    }
    let scene = Scene::new();
    let layer =
        Layer::default()
            .symlink("o", &scene.canary_str())
            .file("o/.wh..wh..opq", 0o644, b"");
    scene.apply(layer, &[]).unwrap();
    scene.assert_canary_untouched();
}

#[test]
fn whiteouts_of_dot_names_are_invalid_whiteouts_and_touch_nothing() {
    for name in [".wh.", ".wh..", ".wh...", "a/.wh..", "a/.wh..."] {
        let scene = Scene::new();
        let layer = Layer::default().dir("a", 0o755).file(name, 0o644, b"");
        let err = scene.apply(layer, &[]).unwrap_err();
        assert!(
            matches!(err, ApplyError::Invalid(_)) && err.to_string().contains("invalid whiteout"),
            "{name}: {err}"
        );
        scene.assert_canary_untouched();
        assert!(
            scene.root.join("a").is_dir(),
            "{name}: the directory is still there"
        );
    }
}

#[test]
fn whiteouts_through_a_symlink_remove_inside_the_snapshot_only() {
    let scene = Scene::new();
    let layer = Layer::default()
        .symlink("w", &scene.canary_str())
        .file("w/.wh.file", 0o644, b"")
        .file("w/.wh.sub", 0o644, b"");
    scene.apply(layer, &[]).unwrap();
    scene.assert_canary_untouched();
}

#[test]
fn names_with_dot_dot_absolute_and_non_utf8_stay_inside() {
    let scene = Scene::new();
    let err = scene
        .apply(Layer::default().raw_file(b"../canary/file", b"x"), &[])
        .unwrap_err();
    assert!(
        err.to_string().contains("outside of the layer root"),
        "{err}"
    );
    scene.assert_canary_untouched();
    let layer = Layer::default()
        .raw_file(b"/abs/x", b"x")
        .raw_file(b"/../../canary/file", b"x")
        .raw_file(b"odd\xff\xfename", b"x");
    scene.apply(layer, &[]).unwrap();
    scene.assert_canary_untouched();
    assert!(scene.root.join("abs/x").is_file());
    assert!(scene.root.join("canary/file").is_file());
}

#[test]
fn duplicates_and_type_changes_end_with_the_last_entry() {
    let scene = Scene::new();
    let layer = Layer::default()
        .file("p", 0o644, b"one")
        .file("p", 0o600, b"two")
        .dir("q", 0o755)
        .file("q/inside", 0o644, b"x")
        .file("q", 0o644, b"now a file")
        .dir("q", 0o700);
    scene.apply(layer, &[]).unwrap();
    assert_eq!(std::fs::read(scene.root.join("p")).unwrap(), b"two");
    let q = std::fs::symlink_metadata(scene.root.join("q")).unwrap();
    assert!(q.is_dir());
    assert_eq!(q.mode() & 0o7777, 0o700);
    assert!(!scene.root.join("q/inside").exists());
    scene.assert_canary_untouched();
}

#[test]
fn device_nodes_and_fifos_are_made_inside_with_their_modes() {
    if !is_root() {
        return;
    }
    let scene = Scene::new();
    let layer = Layer::default()
        .symlink("dev", &scene.canary_str())
        .char_device("dev/null", 0o666, 1, 3)
        .fifo("pipe", 0o640);
    scene.apply(layer, &[]).unwrap();
    scene.assert_canary_untouched();
    let pipe = std::fs::symlink_metadata(scene.root.join("pipe")).unwrap();
    assert_eq!(pipe.mode() & 0o7777, 0o640);
}

#[test]
fn a_layer_cannot_chown_or_chmod_the_host_through_a_parent_symlink() {
    let scene = Scene::new();
    let before = std::fs::metadata(&scene.canary).unwrap();
    let layer = Layer::default()
        .symlink("c", &scene.canary_str())
        .dir_owned("c", 0o6777, 1000, 1000)
        .file_owned("c/../c/x", 0o6777, 1000, 1000);
    scene.apply(layer, &[]).unwrap();
    let after = std::fs::metadata(&scene.canary).unwrap();
    assert_eq!(before.mode(), after.mode());
    assert_eq!(before.uid(), after.uid());
    scene.assert_canary_untouched();
}
