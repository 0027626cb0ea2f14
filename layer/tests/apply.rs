//! The applier's rules, as containerd applies a layer (the fidelity tests against
//! containerd itself are in tests/integration).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// test code
// Fixtures (canaries, lower layers) are made on the host, outside any snapshot under test.
#![allow(clippy::disallowed_methods)]

mod support;

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use rigger_layer::adopt_lowers;
use sha2::Digest as _;
use support::{Layer, Scene, is_root};

#[test]
fn hardlink_into_a_lower_layer_fails() {
    let scene = Scene::new();
    let lower = scene.lower("lower", |l| {
        std::fs::write(l.join("file"), b"lower").unwrap()
    });
    let err = scene
        .apply(Layer::default().hard_link("link", "file"), &[lower])
        .unwrap_err();
    assert!(err.to_string().contains("same layer"), "{err}");
}

#[test]
fn hardlinks_within_the_layer_share_the_inode() {
    let scene = Scene::new();
    let layer = Layer::default()
        .file("bin/tool", 0o755, b"tool")
        .symlink("bin/alias", "tool")
        .hard_link("bin/other", "bin/alias");
    scene.apply(layer, &[]).unwrap();
    let (a, b) = (
        std::fs::symlink_metadata(scene.root.join("bin/alias")).unwrap(),
        std::fs::symlink_metadata(scene.root.join("bin/other")).unwrap(),
    );
    // As containerd's os.Link (linkat without AT_SYMLINK_FOLLOW): the symlink itself
    // is linked, not what it points to.
    assert!(b.file_type().is_symlink());
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
}

#[test]
fn a_layer_applied_before_its_lowers_ends_up_as_if_applied_on_them() {
    let scene = Scene::new();
    let lower = scene.lower("lower", |l| {
        std::fs::create_dir_all(l.join("opt/app")).unwrap();
        std::fs::set_permissions(l.join("opt"), std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(l.join("opt/app"), std::fs::Permissions::from_mode(0o750))
            .unwrap();
    });
    // `opt` given after its content: the layer's own attributes win.
    let layer = || {
        Layer::default()
            .file("opt/app/bin/tool", 0o644, b"hi")
            .dir("opt/", 0o700)
    };
    let on_lowers = scene.dir.path().join("on-lowers");
    std::fs::create_dir(&on_lowers).unwrap();
    rigger_layer::apply_layer(
        &layer().bytes()[..],
        &rigger_layer::ApplyTarget {
            root: on_lowers.clone(),
            lowers: vec![lower.clone()],
            bottom: false,
        },
    )
    .unwrap();
    let applied = scene.apply(layer(), &[]).unwrap();
    let implied: Vec<_> = applied
        .implied_parents
        .iter()
        .map(|p| (p.path.to_str().unwrap(), p.explicit))
        .collect();
    assert_eq!(
        implied,
        [("opt", true), ("opt/app", false), ("opt/app/bin", false)]
    );
    adopt_lowers(&scene.root, &[lower], &applied.implied_parents).unwrap();
    for path in ["opt", "opt/app", "opt/app/bin", "opt/app/bin/tool"] {
        let mode = |root: &Path| std::fs::metadata(root.join(path)).unwrap().mode();
        assert_eq!(mode(&scene.root), mode(&on_lowers), "{path}");
    }
    let mode = std::fs::metadata(scene.root.join("opt/app"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o7777, 0o750, "from the lower layer");
}

/// containerd's `mkparent` looks an implied directory up in each lower layer and fails
/// on `ENOTDIR`: one right below a lower file is fine (replaced), one deeper refuses the
/// layer — applied on the lowers or before them.
#[test]
fn an_implied_directory_below_a_lower_file_is_refused_as_containerd_does() {
    let scene = Scene::new();
    let lower = scene.lower("lower", |l| {
        std::fs::write(l.join("lib"), b"a file").unwrap()
    });
    scene
        .apply(
            Layer::default().file("lib/f", 0o644, b"x"),
            std::slice::from_ref(&lower),
        )
        .unwrap();

    let deeper = || Layer::default().file("lib/lib/h/f", 0o644, b"x");
    let err = Scene::new()
        .apply(deeper(), std::slice::from_ref(&lower))
        .unwrap_err();
    assert!(
        err.to_string().contains("implied below a non-directory"),
        "{err}"
    );
    let scene = Scene::new();
    let applied = scene.apply(deeper(), &[]).unwrap();
    let err = adopt_lowers(&scene.root, &[lower], &applied.implied_parents).unwrap_err();
    assert!(err.to_string().contains("\"lib/lib\""), "{err}");
}

#[test]
fn whiteouts_and_implied_parents() {
    let scene = Scene::new();
    let lower = scene.lower("lower", |l| {
        std::fs::create_dir_all(l.join("etc/conf.d")).unwrap();
        std::fs::set_permissions(l.join("etc"), std::fs::Permissions::from_mode(0o750)).unwrap();
    });
    let layer = Layer::default()
        .file("etc/conf.d/new", 0o600, b"hi")
        .file("etc/.wh.gone", 0o644, b"")
        .file("etc/conf.d/.wh..wh..opq", 0o644, b"");
    let bytes = layer.bytes();
    let diff_id = rigger_layer::apply_layer(
        &bytes[..],
        &rigger_layer::ApplyTarget {
            root: scene.root.clone(),
            lowers: vec![lower],
            bottom: false,
        },
    )
    .unwrap()
    .diff_id;
    assert_eq!(
        diff_id,
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)))
    );
    // The implied parent took the lower layer's mode.
    let etc = std::fs::metadata(scene.root.join("etc")).unwrap();
    assert_eq!(etc.mode() & 0o7777, 0o750);
    let file = std::fs::metadata(scene.root.join("etc/conf.d/new")).unwrap();
    assert_eq!(file.mode() & 0o7777, 0o600);
    assert_eq!(file.mtime(), 1_700_000_000);
    let gone = std::fs::symlink_metadata(scene.root.join("etc/gone")).unwrap();
    assert!(gone.file_type().is_char_device());
    assert_eq!(gone.rdev(), 0);
    // trusted.* xattrs need root (the tests and the agent run as root).
    if is_root() {
        let mut value = [0u8; 4];
        let n = rustix::fs::getxattr(
            scene.root.join("etc/conf.d"),
            "trusted.overlay.opaque",
            &mut value[..],
        )
        .unwrap();
        assert_eq!(&value[..n], b"y");
    }
}

#[test]
fn dangling_parent_symlinks_are_created_where_they_point_inside_the_root() {
    let scene = Scene::new();
    // As containerd's RootPath: a link to a missing directory is followed lexically.
    let layer = Layer::default()
        .symlink("lib", "/usr/lib64")
        .file("lib/libc.so", 0o755, b"elf");
    let applied = scene.apply(layer, &[]).unwrap();
    assert_eq!(
        std::fs::read(scene.root.join("usr/lib64/libc.so")).unwrap(),
        b"elf"
    );
    let implied: Vec<_> = applied
        .implied_parents
        .iter()
        .map(|p| p.path.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(implied, ["usr", "usr/lib64"]);
}

/// As containerd's RootPath: a symlink's target is joined to the link's directory and
/// cleaned as a string before it is looked up, so `x/..` undoes `x` whatever it is — a
/// file (no "not a directory"), or a symlink (not followed). Found by the layer_apply
/// fuzz target.
#[test]
fn a_symlink_target_is_cleaned_before_it_is_followed() {
    let scene = Scene::new();
    let layer = Layer::default()
        .file("f", 0o644, b"file")
        .symlink("elsewhere", "deep/dir")
        .symlink("through-file", "f/../up")
        .symlink("through-link", "elsewhere/../there")
        .file("through-file/a", 0o644, b"a")
        .file("through-link/b", 0o644, b"b");
    scene.apply(layer, &[]).unwrap();
    assert_eq!(std::fs::read(scene.root.join("up/a")).unwrap(), b"a");
    assert_eq!(std::fs::read(scene.root.join("there/b")).unwrap(), b"b");
    assert!(!scene.root.join("deep").exists());
}

/// The bottom layer goes to a plain directory in containerd (no overlayfs conversion):
/// a whiteout removes what it names, even what the layer wrote, and leaves no marker; an
/// opaque marker removes what the layer did not write below it — directories it only
/// implied included — and keeps what it did.
#[test]
fn a_bottom_layers_whiteouts_remove_as_containerds_plain_apply() {
    let scene = Scene::new();
    let layer = Layer::default()
        .file("gone", 0o644, b"x")
        .file(".wh.gone", 0o644, b"")
        .file("keep/implied/f", 0o644, b"x")
        .file("keep/written", 0o644, b"x")
        .dir("keep/dir/", 0o755)
        .file("keep/dir/inner", 0o644, b"x")
        .file("keep/.wh..wh..opq", 0o644, b"")
        .file(".wh.never-there", 0o644, b"");
    scene.apply_bottom(layer).unwrap();
    let mut names: Vec<String> = walkdir(&scene.root);
    names.sort();
    assert_eq!(
        names,
        ["keep", "keep/dir", "keep/dir/inner", "keep/written"]
    );
    let opaque = xattr_names(&scene.root.join("keep"));
    assert!(opaque.is_empty(), "{opaque:?}");
}

/// A directory entry whose name reaches the root by the end (`a` made a symlink to `/`)
/// gives the root its times, as containerd's last pass does through `fs.RootPath`.
#[test]
fn a_directory_reaching_the_root_by_the_end_times_the_root() {
    let scene = Scene::new();
    let layer = Layer::default().dir("a/", 0o755).symlink("a", "/");
    scene.apply(layer, &[]).unwrap();
    let mtime = std::fs::metadata(&scene.root).unwrap().mtime();
    assert_eq!(mtime, 1_700_000_000);
}

/// Symlinks can make a path grow without end while each tar name stays short: past
/// the kernel's PATH_MAX (which containerd's path-based calls meet) the layer is refused.
#[test]
fn a_path_grown_past_path_max_through_symlinks_is_refused() {
    let scene = Scene::new();
    // `p{i}` points at `p{i-1}/N`, and `p{i}/N/` is a directory: each level resolves
    // 91 bytes deeper (`d/N/N/...`) through names of under 100 bytes.
    let long = "n".repeat(90);
    let mut layer = Layer::default().dir("d/", 0o755).symlink("p0", "d");
    for i in 0..60 {
        layer = layer.dir(&format!("p{i}/{long}/"), 0o755);
        layer = layer.symlink(&format!("p{}", i + 1), &format!("p{i}/{long}"));
    }
    let err = scene.apply(layer, &[]).unwrap_err();
    assert!(err.to_string().contains("longer than 4096 bytes"), "{err}");
}

fn walkdir(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            out.push(path.strip_prefix(root).unwrap().display().to_string());
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

fn xattr_names(path: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::listxattr(path, &mut buf).unwrap();
    buf[..n]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}
