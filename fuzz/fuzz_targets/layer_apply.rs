//! Differential: a random layer (directories, files, symlinks aimed inside, up and out
//! of the root and at a host canary, hard links, whiteouts, opaque markers, names with
//! `.` and `..`) applied by rigger-layer into an empty snapshot directory, and by a model
//! of containerd's overlayfs applier (`archive.Apply` with `OverlayConvertWhiteout`:
//! `fs.RootPath` for parents, `mkparent`, replace unless directory meets directory,
//! `hardlinkRootPath`, mknod for whiteouts). Both must refuse, or end with the same tree;
//! and the canary outside the snapshot must never change.
//!
//! The one divergence allowed is documented: a name that climbs out of the root is
//! refused by Rigger where containerd clamps it back inside.

#![no_main]

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use rigger_layer::{ApplyTarget, apply_layer};

const NAMES: [&str; 5] = ["a", "b", "c", ".", ".."];
const MODES: [u32; 6] = [0o755, 0o700, 0o644, 0o4755, 0o777, 0o600];

/// One tar entry of the generated layer.
#[derive(Debug, Clone)]
enum Entry {
    Dir {
        name: String,
        mode: u32,
        uid: u32,
    },
    File {
        name: String,
        mode: u32,
        uid: u32,
        data: u8,
    },
    Symlink {
        name: String,
        target: String,
    },
    HardLink {
        name: String,
        target: String,
    },
    Whiteout {
        dir: String,
        name: String,
    },
    Opaque {
        dir: String,
    },
}

/// Reads choices off the fuzzer's bytes; zeros when they run out.
struct Choices<'a>(&'a [u8]);

impl Choices<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[usize::from(self.byte()) % from.len()]
    }

    /// 1 to 3 components, mostly real names.
    fn path(&mut self) -> String {
        let depth = 1 + usize::from(self.byte() % 3);
        (0..depth)
            .map(|_| {
                let b = self.byte();
                if b < 200 {
                    NAMES[usize::from(b) % 3]
                } else {
                    NAMES[usize::from(b) % 5]
                }
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    fn symlink_target(&mut self, canary: &str) -> String {
        match self.byte() % 7 {
            0 => format!("/{}", self.path()),
            1 => format!("../../{}", self.path()),
            2 => canary.to_owned(),
            3 => "..".to_owned(),
            4 => "/".to_owned(),
            _ => self.path(),
        }
    }
}

fn entries(data: &[u8], canary: &str) -> Vec<Entry> {
    let mut c = Choices(data);
    let count = 1 + usize::from(c.byte() % 12);
    (0..count)
        .map(|_| match c.byte() % 8 {
            0 | 1 => Entry::Dir {
                name: c.path(),
                mode: c.pick(&MODES),
                uid: c.pick(&[0, 1000]),
            },
            2 | 3 => Entry::File {
                name: c.path(),
                mode: c.pick(&MODES),
                uid: c.pick(&[0, 1000]),
                data: c.byte(),
            },
            4 => Entry::Symlink {
                name: c.path(),
                target: c.symlink_target(canary),
            },
            5 => Entry::HardLink {
                name: c.path(),
                target: c.path(),
            },
            6 => Entry::Whiteout {
                dir: c.path(),
                name: c.pick(&["a", "b", "c", "", ".", ".."]).to_owned(),
            },
            _ => Entry::Opaque { dir: c.path() },
        })
        .collect()
}

fn tar_of(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add =
        |kind: tar::EntryType, name: &str, mode: u32, uid: u32, link: Option<&str>, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_uid(u64::from(uid));
            h.set_gid(0);
            h.set_mtime(1_700_000_000);
            h.set_size(data.len() as u64);
            let raw = name.as_bytes();
            h.as_old_mut().name[..raw.len()].copy_from_slice(raw);
            if let Some(link) = link {
                h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
            h.set_cksum();
            builder.append(&h, data).expect("in-memory tar");
        };
    for entry in entries {
        match entry {
            Entry::Dir { name, mode, uid } => {
                add(tar::EntryType::Directory, name, *mode, *uid, None, b"")
            }
            Entry::File {
                name,
                mode,
                uid,
                data,
            } => add(tar::EntryType::Regular, name, *mode, *uid, None, &[*data]),
            Entry::Symlink { name, target } => {
                add(tar::EntryType::Symlink, name, 0o777, 0, Some(target), b"")
            }
            Entry::HardLink { name, target } => {
                add(tar::EntryType::Link, name, 0o644, 0, Some(target), b"")
            }
            Entry::Whiteout { dir, name } => add(
                tar::EntryType::Regular,
                &format!("{dir}/.wh.{name}"),
                0o644,
                0,
                None,
                b"",
            ),
            Entry::Opaque { dir } => add(
                tar::EntryType::Regular,
                &format!("{dir}/.wh..wh..opq"),
                0o644,
                0,
                None,
                b"",
            ),
        }
    }
    builder.into_inner().expect("in-memory tar")
}

/// A node of a snapshot's own directory, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    /// `opaque`: `trusted.overlay.opaque=y`.
    Dir {
        mode: u32,
        uid: u32,
        opaque: bool,
    },
    /// `mode` is `None` for files a hard link touched: containerd chmods a hard link by
    /// an `os.Lstat` of the link name relative to its own working directory (a host path),
    /// which no model can predict.
    File {
        mode: Option<u32>,
        uid: u32,
        data: Vec<u8>,
    },
    Symlink(Vec<u8>),
    Whiteout,
}

type Tree = BTreeMap<Vec<String>, Node>;

/// containerd's applier on an in-memory upper directory.
struct Model {
    tree: Tree,
    root_opaque: bool,
    /// The image's bottom layer: applied without overlayfs' conversion (a whiteout
    /// removes what it names, an opaque marker what this layer did not write).
    bottom: bool,
    /// Paths this layer's entries wrote (not the parents `mkparent` implied): what a
    /// bottom layer's opaque marker keeps (containerd's `unpackedPaths`).
    unpacked: std::collections::BTreeSet<Vec<String>>,
}

/// `filepath.Clean` of a relative tar name, as components (`None`: the root).
fn clean(name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|l| l != "..") {
                    out.pop();
                } else {
                    out.push("..".to_owned());
                }
            }
            p => out.push(p.to_owned()),
        }
    }
    out
}

impl Model {
    /// `fs.RootPath`: follow symlinks inside the root, `..` stops at it, missing parts
    /// taken as written. Errors only on too many links.
    fn root_path(&self, parts: &[String]) -> Result<Vec<String>, String> {
        let mut resolved: Vec<String> = Vec::new();
        let mut pending: Vec<String> = parts.iter().rev().cloned().collect();
        let mut links = 0;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                "" | "." => continue,
                ".." => {
                    resolved.pop();
                    continue;
                }
                _ => {}
            }
            let mut here = resolved.clone();
            here.push(part.clone());
            match self.tree.get(&here) {
                Some(Node::Symlink(target)) => {
                    links += 1;
                    if links > 255 {
                        return Err("too many links".to_owned());
                    }
                    // Joined to the link's directory and cleaned as a string
                    // (`filepath.Join`) before anything is looked up; walked again from
                    // the root.
                    let target = String::from_utf8_lossy(target).into_owned();
                    let mut joined = match target.starts_with('/') {
                        true => Vec::new(),
                        false => std::mem::take(&mut resolved),
                    };
                    for part in target.split('/') {
                        match part {
                            "" | "." => {}
                            ".." => {
                                joined.pop();
                            }
                            p => joined.push(p.to_owned()),
                        }
                    }
                    resolved.clear();
                    pending.extend(joined.into_iter().rev());
                }
                _ => resolved = here,
            }
        }
        Ok(resolved)
    }

    /// `mkparent`: every missing directory of `dir` made 0755 root; a non-directory on
    /// the way is an error.
    fn mkparent(&mut self, dir: &[String]) -> Result<(), String> {
        for depth in 1..=dir.len() {
            match self.tree.get(&dir[..depth]) {
                Some(Node::Dir { .. }) => {}
                Some(_) => return Err(format!("{}: not a directory", dir[..depth].join("/"))),
                None => {
                    self.tree.insert(
                        dir[..depth].to_vec(),
                        Node::Dir {
                            mode: 0o755,
                            uid: 0,
                            opaque: false,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    fn remove_all(&mut self, path: &[String]) {
        self.tree.retain(|k, _| !k.starts_with(path));
    }

    fn apply(entries: &[Entry], bottom: bool) -> Result<Model, String> {
        let mut model = Model {
            tree: Tree::new(),
            root_opaque: false,
            bottom,
            unpacked: Default::default(),
        };
        for entry in entries {
            model.entry(entry)?;
        }
        // containerd's last pass: each directory entry's times, set on what its name
        // resolves to now (`fs.RootPath`); a name that no longer reaches anything, or
        // loops, fails the layer.
        for entry in entries {
            if let Entry::Dir { name, .. } = entry {
                let resolved = model.root_path(&clean(name))?;
                if !resolved.is_empty() && !model.tree.contains_key(&resolved) {
                    return Err(format!("{name}: gone before its times were set"));
                }
            }
        }
        Ok(model)
    }

    fn entry(&mut self, entry: &Entry) -> Result<(), String> {
        let raw = match entry {
            Entry::Dir { name, .. }
            | Entry::File { name, .. }
            | Entry::Symlink { name, .. }
            | Entry::HardLink { name, .. } => name.clone(),
            Entry::Whiteout { dir, name } => format!("{dir}/.wh.{name}"),
            Entry::Opaque { dir } => format!("{dir}/.wh..wh..opq"),
        };
        let name = clean(&raw);
        let Some((base, parent)) = name.split_last() else {
            return Ok(()); // the root: ignored
        };
        let parent = self.root_path(parent)?;
        self.mkparent(&parent)?;
        if base == ".." {
            // Only reachable through a name climbing out (Rigger refuses those first).
            return Err("escapes".to_owned());
        }
        let mut path = parent.clone();
        path.push(base.clone());
        if base == ".wh..wh..opq" && self.bottom {
            // Below the directory, what this layer did not write goes (directories it
            // wrote are kept and looked into).
            let unpacked = &self.unpacked;
            self.tree.retain(|k, _| {
                !k.starts_with(&parent)
                    || k.len() == parent.len()
                    || (parent.len() + 1..=k.len()).all(|i| unpacked.contains(&k[..i]))
            });
            return Ok(());
        }
        if base == ".wh..wh..opq" {
            match parent.is_empty() {
                true => self.root_opaque = true,
                false => {
                    if let Some(Node::Dir { opaque, .. }) = self.tree.get_mut(&parent) {
                        *opaque = true;
                    }
                }
            }
            return Ok(());
        }
        if let Some(original) = base.strip_prefix(".wh.") {
            if matches!(original, "" | "." | "..") {
                return Err("invalid whiteout".to_owned());
            }
            let mut target = parent.clone();
            target.push(original.to_owned());
            if self.bottom {
                self.remove_all(&target);
                return Ok(());
            }
            if self.tree.contains_key(&target) {
                return Err("whiteout of an existing entry".to_owned());
            }
            self.tree.insert(target, Node::Whiteout);
            return Ok(());
        }
        if self.bottom {
            self.unpacked.insert(path.clone());
        }
        let existing = self.tree.get(&path).cloned();
        let is_dir_entry = matches!(entry, Entry::Dir { .. });
        if let Some(existing) = &existing
            && !(matches!(existing, Node::Dir { .. }) && is_dir_entry)
        {
            self.remove_all(&path);
        }
        match entry {
            Entry::Dir { mode, uid, .. } => {
                let opaque = matches!(existing, Some(Node::Dir { opaque: true, .. }));
                self.tree.insert(
                    path,
                    Node::Dir {
                        mode: *mode,
                        uid: *uid,
                        opaque,
                    },
                );
            }
            Entry::File {
                mode, uid, data, ..
            } => {
                self.tree.insert(
                    path,
                    Node::File {
                        mode: Some(*mode),
                        uid: *uid,
                        data: vec![*data],
                    },
                );
            }
            Entry::Symlink { target, .. } => {
                self.tree
                    .insert(path, Node::Symlink(target.as_bytes().to_vec()));
            }
            Entry::HardLink { target, .. } => {
                // hardlinkRootPath: the parent resolved, the last component as it is.
                let target = clean(target);
                let Some((last, dir)) = target.split_last() else {
                    return Err("hard link to the root".to_owned());
                };
                if last == ".." {
                    return Err("escapes".to_owned());
                }
                let mut at = self.root_path(dir)?;
                at.push(last.clone());
                match self.tree.get(&at).cloned() {
                    Some(Node::File { data, .. }) => {
                        // One inode: the link entry's owner (root here) is now both's.
                        let linked = Node::File {
                            mode: None,
                            uid: 0,
                            data,
                        };
                        self.tree.insert(at, linked.clone());
                        self.tree.insert(path, linked);
                    }
                    Some(Node::Symlink(link)) => {
                        self.tree.insert(path, Node::Symlink(link));
                    }
                    Some(Node::Whiteout) => {
                        self.tree.insert(path, Node::Whiteout);
                    }
                    Some(Node::Dir { .. }) => return Err("hard link to a directory".to_owned()),
                    None => return Err("hard link target missing".to_owned()),
                }
            }
            Entry::Whiteout { .. } | Entry::Opaque { .. } => {}
        }
        Ok(())
    }
}

/// The tree Rigger left in `root`.
fn read_tree(root: &Path) -> (Tree, bool) {
    fn walk(dir: &Path, prefix: &[String], out: &mut Tree) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = String::from_utf8_lossy(entry.file_name().as_bytes()).into_owned();
            let mut key = prefix.to_vec();
            key.push(name);
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let node = if meta.file_type().is_symlink() {
                Node::Symlink(
                    std::fs::read_link(&path)
                        .expect("readlink")
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                )
            } else if meta.is_dir() {
                walk(&path, &key, out);
                Node::Dir {
                    mode: meta.mode() & 0o7777,
                    uid: meta.uid(),
                    opaque: opaque(&path),
                }
            } else if meta.file_type().is_char_device() && meta.rdev() == 0 {
                Node::Whiteout
            } else {
                Node::File {
                    mode: (meta.nlink() == 1).then_some(meta.mode() & 0o7777),
                    uid: meta.uid(),
                    data: std::fs::read(&path).expect("read"),
                }
            };
            out.insert(key, node);
        }
    }
    let mut tree = Tree::new();
    walk(root, &[], &mut tree);
    (tree, opaque(root))
}

fn opaque(path: &Path) -> bool {
    let mut value = [0u8; 4];
    rustix::fs::lgetxattr(path, "trusted.overlay.opaque", &mut value)
        .is_ok_and(|n| &value[..n] == b"y")
}

/// Files a hard link touched have no comparable mode (see [`Node::File`]): where
/// either side has none, neither is compared.
fn forget_linked_modes(ours: &mut Tree, theirs: &mut Tree) {
    for (key, node) in ours.iter_mut() {
        if let (Node::File { mode: a, .. }, Some(Node::File { mode: b, .. })) =
            (node, theirs.get_mut(key))
            && (a.is_none() || b.is_none())
        {
            *a = None;
            *b = None;
        }
    }
}

fn canary_state(canary: &Path) -> Vec<(PathBuf, u32, u32, Vec<u8>)> {
    let mut state = Vec::new();
    for path in [canary.to_owned(), canary.join("file"), canary.join("a")] {
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            let data = if meta.is_file() {
                std::fs::read(&path).unwrap_or_default()
            } else {
                Vec::new()
            };
            state.push((path, meta.mode(), meta.uid(), data));
        }
    }
    let count = std::fs::read_dir(canary).map(|d| d.count()).unwrap_or(0);
    state.push((PathBuf::from("#entries"), count as u32, 0, Vec::new()));
    state
}

fuzz_target!(|data: &[u8]| {
    let scratch = tempfile::tempdir().expect("tempdir");
    let root = scratch.path().join("snapshot");
    let canary = scratch.path().join("canary");
    std::fs::create_dir_all(&root).expect("root");
    std::fs::create_dir_all(canary.join("a")).expect("canary");
    std::fs::write(canary.join("file"), b"host data").expect("canary file");
    let before = canary_state(&canary);

    let canary_str = canary.display().to_string();
    let layer = entries(data, &canary_str);
    let tar = tar_of(&layer);
    // Both ways whiteouts go: overlayfs' markers, and removals in a bottom layer.
    let bottom = data.len() % 2 == 1;
    let ours = apply_layer(
        &tar[..],
        &ApplyTarget {
            root: root.clone(),
            lowers: Vec::new(),
            bottom,
        },
    );
    assert_eq!(
        canary_state(&canary),
        before,
        "the canary outside the snapshot changed: {layer:?}"
    );

    let theirs = Model::apply(&layer, bottom);
    match (ours, theirs) {
        (Ok(_), Ok(model)) => {
            let (mut tree, root_opaque) = read_tree(&root);
            let mut expected = model.tree;
            forget_linked_modes(&mut tree, &mut expected);
            assert_eq!(tree, expected, "trees differ for {layer:?}");
            assert_eq!(
                root_opaque, model.root_opaque,
                "root opaque differs for {layer:?}"
            );
        }
        (Err(_), Err(_)) => {}
        // Rigger's documented strictness: containerd clamps such names into the root.
        (Err(e), Ok(_)) if e.to_string().contains("outside of the layer root") => {}
        (ours, theirs) => panic!(
            "rigger: {:?}, containerd's rules: {:?}, layer {layer:?}",
            ours.map(|_| ()),
            theirs.map(|_| ())
        ),
    }
});
