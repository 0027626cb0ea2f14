//! Building layer tars (hostile ones included) and watching a canary outside the
//! snapshot for any change.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use rigger_layer::{Applied, ApplyError, ApplyTarget, apply_layer};

/// A layer tar built entry by entry; names are written raw (no checks), as a hostile
/// image would.
pub struct Layer {
    builder: tar::Builder<Vec<u8>>,
}

impl Default for Layer {
    fn default() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }
}

fn header(kind: tar::EntryType, name: &[u8], mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(1_700_000_000);
    h.set_uid(0);
    h.set_gid(0);
    assert!(name.len() <= 100, "short names only");
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h
}

impl Layer {
    pub fn file(mut self, name: &str, mode: u32, data: &[u8]) -> Self {
        self.raw(
            header(
                tar::EntryType::Regular,
                name.as_bytes(),
                mode,
                data.len() as u64,
            ),
            data,
        );
        self
    }

    pub fn file_owned(mut self, name: &str, mode: u32, uid: u64, gid: u64) -> Self {
        let mut h = header(tar::EntryType::Regular, name.as_bytes(), mode, 0);
        h.set_uid(uid);
        h.set_gid(gid);
        self.raw(h, b"");
        self
    }

    pub fn dir(mut self, name: &str, mode: u32) -> Self {
        self.raw(
            header(tar::EntryType::Directory, name.as_bytes(), mode, 0),
            b"",
        );
        self
    }

    pub fn dir_owned(mut self, name: &str, mode: u32, uid: u64, gid: u64) -> Self {
        let mut h = header(tar::EntryType::Directory, name.as_bytes(), mode, 0);
        h.set_uid(uid);
        h.set_gid(gid);
        self.raw(h, b"");
        self
    }

    pub fn symlink(mut self, name: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Symlink, name.as_bytes(), 0o777, 0);
        h.set_link_name(target).unwrap();
        self.raw(h, b"");
        self
    }

    pub fn hard_link(mut self, name: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Link, name.as_bytes(), 0o644, 0);
        h.set_link_name(target).unwrap();
        self.raw(h, b"");
        self
    }

    pub fn fifo(mut self, name: &str, mode: u32) -> Self {
        self.raw(header(tar::EntryType::Fifo, name.as_bytes(), mode, 0), b"");
        self
    }

    pub fn char_device(mut self, name: &str, mode: u32, major: u32, minor: u32) -> Self {
        let mut h = header(tar::EntryType::Char, name.as_bytes(), mode, 0);
        h.set_device_major(major).unwrap();
        h.set_device_minor(minor).unwrap();
        self.raw(h, b"");
        self
    }

    /// An entry whose name bytes are exactly `name` (`..`, absolute, non-UTF-8).
    pub fn raw_file(mut self, name: &[u8], data: &[u8]) -> Self {
        self.raw(
            header(tar::EntryType::Regular, name, 0o644, data.len() as u64),
            data,
        );
        self
    }

    /// A file with PAX extended attributes (`SCHILY.xattr.<key>`).
    pub fn with_xattr(
        mut self,
        kind: tar::EntryType,
        name: &str,
        key: &str,
        value: &[u8],
        link: Option<&str>,
    ) -> Self {
        let pax_key = format!("SCHILY.xattr.{key}");
        self.builder
            .append_pax_extensions([(pax_key.as_str(), value)])
            .unwrap();
        let mut h = header(kind, name.as_bytes(), 0o644, 0);
        if let Some(link) = link {
            h.set_link_name(link).unwrap();
        }
        self.raw(h, b"");
        self
    }

    fn raw(&mut self, mut h: tar::Header, data: &[u8]) {
        h.set_cksum();
        self.builder.append(&h, data).unwrap();
    }

    pub fn bytes(self) -> Vec<u8> {
        self.builder.into_inner().unwrap()
    }
}

/// A snapshot root, lower layers and a canary directory beside them (what an image
/// must never reach), all in one temporary directory.
pub struct Scene {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub canary: PathBuf,
    before: BTreeMap<String, String>,
}

impl Scene {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let canary = dir.path().join("canary");
        std::fs::create_dir_all(canary.join("sub")).unwrap();
        std::fs::write(canary.join("file"), b"host data").unwrap();
        std::fs::write(canary.join("sub/inner"), b"inner").unwrap();
        let mut scene = Self {
            dir,
            root,
            canary,
            before: BTreeMap::new(),
        };
        scene.before = listing(&scene.canary);
        scene
    }

    /// A lower layer directory named `name`, made by `build`.
    pub fn lower(&self, name: &str, build: impl FnOnce(&Path)) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir(&path).unwrap();
        build(&path);
        path
    }

    pub fn apply(&self, layer: Layer, lowers: &[PathBuf]) -> Result<Applied, ApplyError> {
        apply_layer(
            &layer.bytes()[..],
            &ApplyTarget {
                root: self.root.clone(),
                lowers: lowers.to_vec(),
                bottom: false,
            },
        )
    }

    /// Apply `layer` as an image's bottom layer (containerd's plain apply).
    pub fn apply_bottom(&self, layer: Layer) -> Result<Applied, ApplyError> {
        apply_layer(
            &layer.bytes()[..],
            &ApplyTarget {
                root: self.root.clone(),
                lowers: Vec::new(),
                bottom: true,
            },
        )
    }

    /// The canary's absolute host path, as a hostile symlink target.
    pub fn canary_str(&self) -> String {
        self.canary.display().to_string()
    }

    /// The canary is byte for byte, mode for mode, owner for owner as it was.
    pub fn assert_canary_untouched(&self) {
        assert_eq!(
            listing(&self.canary),
            self.before,
            "the canary outside the snapshot changed"
        );
    }
}

/// Per path: type, mode, owner, size, mtime, content, xattr names.
pub fn listing(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        out.insert(
            dir.strip_prefix(root).unwrap().display().to_string(),
            describe(&dir, &meta),
        );
        if !meta.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else {
                out.insert(
                    path.strip_prefix(root).unwrap().display().to_string(),
                    describe(&path, &meta),
                );
            }
        }
    }
    out
}

fn describe(path: &Path, meta: &std::fs::Metadata) -> String {
    let content = if meta.is_file() {
        format!("{:?}", std::fs::read(path).unwrap())
    } else {
        String::new()
    };
    let xattrs: Vec<String> = xattr_names(path);
    format!(
        "{:o} {}:{} size {} mtime {} {content} xattrs {xattrs:?}",
        meta.mode(),
        meta.uid(),
        meta.gid(),
        if meta.is_dir() { 0 } else { meta.len() },
        meta.mtime(),
    )
}

fn xattr_names(path: &Path) -> Vec<String> {
    let size = rustix::fs::llistxattr_query(path).unwrap_or(0);
    let mut names = vec![0u8; size];
    let size = rustix::fs::llistxattr(path, &mut names[..]).unwrap_or(0);
    names.truncate(size);
    names
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
