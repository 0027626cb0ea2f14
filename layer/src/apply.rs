//! Applying a layer tar to a snapshot directory, the way containerd's applier does for
//! the overlayfs snapshotter (`archive.Apply` with `OverlayConvertWhiteout` and the lower
//! directories as parents), so the result is the same file for file — and, whatever the
//! tar holds, without touching anything outside the snapshot: every filesystem call goes
//! through [`crate::root`].
//!
//! It reads from any `Read` — in a pull, bytes still arriving from the registry,
//! decompressed on the fly — so unpacking overlaps the download instead of following it.
//!
//! Rules kept from containerd:
//! - names are cleaned; one that escapes the root is an invalid archive;
//! - parent directories are resolved within the root (symlinks followed, never out);
//!   missing ones are created with the attributes of the same directory in the lower
//!   layers (0755 when none has it);
//! - `.wh..wh..opq` marks the directory opaque (`trusted.overlay.opaque=y`), `.wh.NAME`
//!   becomes a 0:0 character device NAME owned like the whiteout entry; a whiteout whose
//!   NAME is empty, `.` or `..` is an invalid whiteout (containerd's `validateWhiteout`),
//!   and one of something the layer itself holds is refused (containerd's mknod fails);
//! - an existing path is replaced unless both are directories (then merged);
//! - hard links resolve within this layer only (a link to a lower layer's file fails);
//! - owner, then xattrs, then mode, then times; directory times last of all.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::root::{Dir, FsError, Kind, NewFile, Node, SnapshotRoot, Timespec};

const WHITEOUT_PREFIX: &str = ".wh.";
const WHITEOUT_META_PREFIX: &str = ".wh..wh.";
const WHITEOUT_OPAQUE: &str = ".wh..wh..opq";
const PAX_XATTR: &str = "SCHILY.xattr.";
/// The kernel's bound on a path, which containerd's path-based calls meet.
const PATH_MAX: usize = 4096;
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// overlayfs' own attributes: never copied from a lower layer.
const OVERLAY_XATTR_PREFIX: &[u8] = b"trusted.overlay.";

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid layer archive: {0}")]
    Invalid(String),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("reading the layer: {0}")]
    Read(std::io::Error),
    /// containerd's applier fails the same way when it unpacks layer by layer (on the
    /// layers below, mounted: its `mkparent` stops at `ENOTDIR`), so the image stays
    /// refused on both. containerd 2.2 and later, told to unpack layers in parallel
    /// (`max_concurrent_unpacks` > 1, overlayfs), unpack each onto an empty directory that
    /// the snapshot is rebased on later: they do not see the lower layers, and the
    /// implied directory hides the non-directory. Rigger refuses as the default unpack does.
    #[error(
        "directory {0:?} is implied below a non-directory of a lower layer (containerd's layer-by-layer unpack refuses the layer too)"
    )]
    ImpliedBelowNonDirectory(PathBuf),
    /// containerd sets directory times in a last pass, by name: one the layer removed or
    /// put below a non-directory since fails it there.
    #[error(
        "directory {0:?} of the layer is gone by its end (removed, or below a non-directory; containerd refuses the layer too)"
    )]
    DirectoryGone(PathBuf),
}

/// Where a layer goes: the snapshot's own directory, and the lower layers' directories
/// (top first) for the attributes of implied parent directories. The paths come from
/// containerd (the snapshot's mounts), never from an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyTarget {
    pub root: PathBuf,
    pub lowers: Vec<PathBuf>,
    /// The image's bottom layer. containerd applies it to a plain directory, not through
    /// overlayfs' conversion: a whiteout removes what it names (even what this layer
    /// wrote), an opaque marker removes what this layer did not write, neither leaves a
    /// marker. (A layer staged before its parent is committed is not a bottom layer.)
    pub bottom: bool,
}

/// A reader that hashes what passes through it: the layer's diff ID.
#[derive(Debug)]
pub struct DiffIdReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> DiffIdReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
        }
    }

    /// Read to the end (tar's trailing padding counts) and return `sha256:<hex>`.
    pub fn finish(mut self) -> std::io::Result<String> {
        std::io::copy(&mut self, &mut std::io::sink())?;
        Ok(format!("sha256:{}", hex::encode(self.hasher.finalize())))
    }
}

impl<R: Read> Read for DiffIdReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// What applying a layer produced.
#[derive(Debug, Default)]
pub struct Applied {
    /// `sha256:<hex>` of the uncompressed tar.
    pub diff_id: String,
    /// Directories the layer implies but does not contain, parents first.
    pub implied_parents: Vec<ImpliedParent>,
}

/// A directory created because an entry below it came without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImpliedParent {
    /// Relative to the layer root.
    pub path: PathBuf,
    /// The layer gave the directory itself later on (its attributes then win).
    pub explicit: bool,
}

/// Apply the uncompressed layer tar read from `reader` to `target`.
pub fn apply_layer<R: Read>(reader: R, target: &ApplyTarget) -> Result<Applied, ApplyError> {
    let root = SnapshotRoot::open(&target.root)?;
    let lowers = open_lowers(&target.lowers)?;
    let mut hashing = DiffIdReader::new(reader);
    let implied_parents = apply_entries(&mut hashing, &root, &lowers, target.bottom)?;
    Ok(Applied {
        diff_id: hashing.finish().map_err(ApplyError::Read)?,
        implied_parents,
    })
}

fn open_lowers(paths: &[PathBuf]) -> Result<Vec<SnapshotRoot>, ApplyError> {
    Ok(paths
        .iter()
        .map(|p| SnapshotRoot::open(p))
        .collect::<Result<_, _>>()?)
}

/// Give implied parent directories what they would have had if the layer had been
/// applied with its lower layers in place (it was applied without them, in parallel
/// with the layers below): owner, mode and atime of the nearest lower directory, and
/// its extended attributes where the layer set none of the same name. Their mtime is
/// the apply time either way.
///
/// An implied parent is only ever a directory the applier created: one the layer later
/// replaced (by a symlink, say) is no longer reached and keeps what it has.
pub fn adopt_lowers(
    root: &Path,
    lowers: &[PathBuf],
    implied: &[ImpliedParent],
) -> Result<(), ApplyError> {
    let root = SnapshotRoot::open(root)?;
    let lowers = open_lowers(lowers)?;
    for parent in implied {
        // Looked up first, as containerd does when it creates the directory: a lower
        // layer's non-directory above it refuses the layer even if the layer replaced it.
        let lower = nearest_lower_dir(&lowers, &parent.path)?;
        let Some((parent_dir, name)) = split(&parent.path) else {
            continue;
        };
        // Every component a real directory, none followed: where the layer put a symlink
        // since, there is nothing of ours to complete.
        let Some(dir) = root.dir_nofollow(parent_dir)? else {
            continue;
        };
        if dir.lstat(name)?.map(|s| s.kind) != Some(Kind::Directory) {
            continue;
        }
        let Some(lower) = lower else {
            continue;
        };
        let st = lower.stat()?;
        if !parent.explicit {
            dir.chown(name, st.uid, st.gid)?;
            dir.chmod(name, st.mode)?;
            dir.set_times(name, st.atime, omit())?;
        }
        copy_up_xattrs(&lower, &dir, name, false)?;
    }
    Ok(())
}

/// `path` split into its parent and last component (`None` for the root).
fn split(path: &Path) -> Option<(&Path, &OsStr)> {
    Some((path.parent()?, path.file_name()?))
}

/// The directory at `rel` in the nearest lower layer that has something there:
/// `None` when none has, or when the nearest one has a non-directory; an error when a
/// non-directory stands above it there (as containerd's `mkparent`).
fn nearest_lower_dir(lowers: &[SnapshotRoot], rel: &Path) -> Result<Option<Dir>, ApplyError> {
    for lower in lowers {
        let walk = match lower.walk(rel, true) {
            Ok(walk) => walk,
            Err(e) if e.is_not_a_directory() => {
                return Err(ApplyError::ImpliedBelowNonDirectory(rel.to_owned()));
            }
            Err(e) => return Err(e.into()),
        };
        let depth = walk.resolved.components().count();
        if walk.existing == depth {
            return Ok(walk.into_dir());
        }
        if walk.existing + 1 == depth {
            // The last component exists but is not a directory: replaced in that layer.
            let last = walk.resolved.file_name().unwrap_or_default();
            if walk.deepest().lstat(last)?.is_some() {
                return Ok(None);
            }
        }
    }
    Ok(None)
}

fn omit() -> Timespec {
    Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_OMIT,
    }
}

/// File contents are copied from the layer through a buffer this big.
const COPY_BUFFER: usize = 128 << 10;

/// Directory times are set last: creating entries in a directory changes its mtime.
struct DirTimes {
    /// The entry's name as cleaned, resolved again at the end (as containerd does).
    name: PathBuf,
    atime: Timespec,
    mtime: Timespec,
}

fn apply_entries<R: Read>(
    reader: &mut R,
    root: &SnapshotRoot,
    lowers: &[SnapshotRoot],
    bottom: bool,
) -> Result<Vec<ImpliedParent>, ApplyError> {
    let mut implied = Vec::new();
    // Paths (resolved) a bottom layer wrote: what an opaque marker keeps there.
    let mut unpacked: HashSet<PathBuf> = HashSet::new();
    let mut archive = tar::Archive::new(reader);
    let mut dirs: Vec<DirTimes> = Vec::new();
    // The directory of the last entry: consecutive entries mostly share one. Forgotten
    // whenever an entry could change where a path resolves (a removal, a whiteout, a
    // symlink); adding new names cannot.
    let mut cached: Option<(PathBuf, Dir)> = None;
    let mut copy_buffer = vec![0u8; COPY_BUFFER];
    let entries = archive.entries().map_err(ApplyError::Read)?;
    for entry in entries {
        let mut entry = entry.map_err(|e| ApplyError::Invalid(e.to_string()))?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            continue;
        }
        let raw_name = entry.path_bytes().into_owned();
        let name = clean(&raw_name)?;
        let Some((parent_rel, base)) = split(&name) else {
            continue; // the root itself
        };
        let base = base.to_owned();
        let top_name = name.to_string_lossy().into_owned();

        // The parent, resolved inside the root; missing directories created.
        if !matches!(&cached, Some((rel, _)) if rel.as_path() == parent_rel) {
            cached = Some((
                parent_rel.to_owned(),
                parent_dir(root, lowers, parent_rel, &mut implied)?,
            ));
        }
        let Some((_, parent)) = &cached else {
            continue; // just set
        };
        // containerd's calls take whole paths, which the kernel bounds: so does this,
        // whatever symlinks a layer resolves through (they could grow a path without end).
        if parent.path().as_os_str().len() + 1 + base.len() > PATH_MAX {
            return Err(ApplyError::Invalid(format!(
                "{top_name:?} resolves to a path longer than {PATH_MAX} bytes"
            )));
        }
        let mut changes_resolution = false;

        // AUFS metadata at the top level is not part of the filesystem.
        if top_name.starts_with(WHITEOUT_META_PREFIX) && top_name != WHITEOUT_OPAQUE {
            continue;
        }
        let header = entry.header().clone();
        let uid = id(header.uid(), "uid")?;
        let gid = id(header.gid(), "gid")?;

        // Whiteouts, converted to overlayfs' own markers (removals in a bottom layer).
        if base.as_bytes() == WHITEOUT_OPAQUE.as_bytes() {
            if bottom {
                remove_unpacked_not(parent.try_clone()?, &unpacked)?;
                cached = None;
            } else {
                parent.set_own_xattr(OsStr::new(OVERLAY_OPAQUE_XATTR), b"y")?;
            }
            continue;
        }
        if let Some(original) = base.as_bytes().strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            if matches!(original, b"" | b"." | b"..") {
                return Err(ApplyError::Invalid(format!(
                    "invalid whiteout name {top_name:?}"
                )));
            }
            let original = OsStr::from_bytes(original);
            if bottom {
                parent.remove_all(original)?;
                cached = None;
                continue;
            }
            // As containerd's mknod: a whiteout of something this layer itself holds is
            // refused, not taken as a removal.
            if parent.lstat(original)?.is_some() {
                return Err(ApplyError::Invalid(format!(
                    "whiteout {top_name:?} of an entry the layer itself holds"
                )));
            }
            parent.make_node(original, Node::CharDevice { major: 0, minor: 0 }, 0)?;
            parent.chown(original, uid, gid)?;
            cached = None;
            continue;
        }

        // Replace what is there, unless directory meets directory (merge).
        let existing = parent.lstat(&base)?;
        if let Some(existing) = existing
            && !(existing.kind == Kind::Directory && kind.is_dir())
        {
            parent.remove_all(&base)?;
            changes_resolution = true;
        }

        let mode = header
            .mode()
            .map_err(|e| ApplyError::Invalid(e.to_string()))?
            & 0o7777;
        let mut has_mode = true;
        let mut file = None;
        match kind {
            k if k.is_dir() => {
                let here = parent.path().join(&base);
                if let Some(earlier) = implied.iter_mut().find(|p| p.path == here) {
                    earlier.explicit = true;
                }
                if existing.map(|e| e.kind) != Some(Kind::Directory) {
                    parent.mkdir(&base, 0o755)?;
                }
            }
            k if k.is_file() || k == tar::EntryType::Continuous => {
                let mut new = parent.create_file(&base)?;
                new.write_from(&mut entry, &mut copy_buffer)?;
                file = Some(new);
            }
            k if k.is_hard_link() => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        ApplyError::Invalid(format!("{top_name}: hard link without target"))
                    })?
                    .into_owned();
                let target_rel = clean(&link)?;
                hard_link(root, parent, &base, &target_rel)?;
                // The link's own header sets the shared inode's mode (and owner and
                // times), as containerd's lchmod does: unless it links a symlink.
                has_mode = parent.lstat(&base)?.map(|s| s.kind) != Some(Kind::Symlink);
            }
            k if k.is_symlink() => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        ApplyError::Invalid(format!("{top_name}: symlink without target"))
                    })?
                    .into_owned();
                parent.symlink(&base, OsStr::from_bytes(&link))?;
                // A symlink has no mode of its own.
                has_mode = false;
                changes_resolution = true;
            }
            k if k.is_character_special() || k.is_block_special() || k.is_fifo() => {
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                let node = if k.is_character_special() {
                    Node::CharDevice { major, minor }
                } else if k.is_block_special() {
                    Node::BlockDevice { major, minor }
                } else {
                    Node::Fifo
                };
                parent.make_node(&base, node, mode)?;
            }
            other => {
                return Err(ApplyError::Invalid(format!(
                    "{top_name}: unsupported entry type {other:?}"
                )));
            }
        }

        let made = match &file {
            Some(file) => Made::File(file),
            None => Made::Entry(parent, &base),
        };
        made.chown(uid, gid)?;
        if let Some(extensions) = entry
            .pax_extensions()
            .map_err(|e| ApplyError::Invalid(e.to_string()))?
        {
            for ext in extensions {
                let ext = ext.map_err(|e| ApplyError::Invalid(e.to_string()))?;
                let Ok(key) = ext.key() else { continue };
                if let Some(attr) = key.strip_prefix(PAX_XATTR) {
                    match made.set_xattr(OsStr::new(attr), ext.value_bytes()) {
                        Ok(()) => {}
                        Err(e) if e.source.raw_os_error() == Some(nix_enotsup()) => {
                            tracing::warn!(attr, path = %e.path, "xattr not supported here; ignored");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        if has_mode {
            made.chmod(mode)?;
        }
        let (atime, mtime) = times(&mut entry, &header);
        if bottom {
            unpacked.insert(parent.path().join(&base));
        }
        if kind.is_dir() {
            dirs.push(DirTimes {
                name: name.to_path_buf(),
                atime,
                mtime,
            });
        } else {
            made.set_times(atime, mtime)?;
        }
        if changes_resolution {
            cached = None;
        }
    }
    for dir in dirs {
        // Resolved again by its name, symlinks followed inside the root, as containerd's
        // final pass does: what the name reaches now gets the times; nothing there (or a
        // non-directory on the way) fails the layer there too.
        let walk = match root.walk(&dir.name, true) {
            Ok(walk) => walk,
            Err(e) if e.is_not_a_directory() => {
                return Err(ApplyError::DirectoryGone(dir.name));
            }
            Err(e) => return Err(e.into()),
        };
        if walk.resolved.as_os_str().is_empty() {
            // Through a symlink to `/` or `..`: containerd sets the root's own times.
            walk.deepest().set_own_times(dir.atime, dir.mtime)?;
            continue;
        }
        let Some((parent, name)) = walk.last_entry()? else {
            return Err(ApplyError::DirectoryGone(dir.name));
        };
        parent.set_times(name, dir.atime, dir.mtime)?;
    }
    Ok(implied)
}

/// containerd's opaque marker in a bottom layer: everything below `dir` this layer did not
/// write goes (directories it wrote are kept and looked into).
fn remove_unpacked_not(dir: Dir, unpacked: &HashSet<PathBuf>) -> Result<(), ApplyError> {
    // A queue, not recursion: a layer chooses the depth.
    let mut pending = vec![dir];
    while let Some(dir) = pending.pop() {
        for name in dir.names()? {
            let path = dir.path().join(&name);
            if !unpacked.contains(&path) {
                dir.remove_all(&name)?;
            } else if dir.lstat(&name)?.map(|s| s.kind) == Some(Kind::Directory) {
                pending.push(dir.open_dir(&name)?);
            }
        }
    }
    Ok(())
}

/// What an entry's attributes go to: the descriptor of a file just written, or an entry
/// of its directory by name.
enum Made<'a> {
    File(&'a NewFile),
    Entry(&'a Dir, &'a OsStr),
}

impl Made<'_> {
    fn chown(&self, uid: u32, gid: u32) -> Result<(), FsError> {
        match self {
            Self::File(file) => file.chown(uid, gid),
            Self::Entry(dir, name) => dir.chown(name, uid, gid),
        }
    }

    fn chmod(&self, mode: u32) -> Result<(), FsError> {
        match self {
            Self::File(file) => file.chmod(mode),
            Self::Entry(dir, name) => dir.chmod(name, mode),
        }
    }

    fn set_xattr(&self, key: &OsStr, value: &[u8]) -> Result<(), FsError> {
        match self {
            Self::File(file) => file.set_xattr(key, value),
            Self::Entry(dir, name) => dir.set_xattr(name, key, value),
        }
    }

    fn set_times(&self, atime: Timespec, mtime: Timespec) -> Result<(), FsError> {
        match self {
            Self::File(file) => file.set_times(atime, mtime),
            Self::Entry(dir, name) => dir.set_times(name, atime, mtime),
        }
    }
}

fn nix_enotsup() -> i32 {
    rustix::io::Errno::NOTSUP.raw_os_error()
}

fn id(value: std::io::Result<u64>, what: &str) -> Result<u32, ApplyError> {
    let value = value.map_err(|e| ApplyError::Invalid(e.to_string()))?;
    u32::try_from(value).map_err(|_| ApplyError::Invalid(format!("{what} {value} out of range")))
}

/// The directory entries of the layer go into: `rel` resolved inside the root, and
/// what is missing of it created with the attributes the same directory has in the
/// nearest lower layer (0755 when none has it), each recorded as an implied parent.
fn parent_dir(
    root: &SnapshotRoot,
    lowers: &[SnapshotRoot],
    rel: &Path,
    implied: &mut Vec<ImpliedParent>,
) -> Result<Dir, ApplyError> {
    let walk = root.walk(rel, true)?;
    let missing: Vec<OsString> = walk.rest().iter().map(|c| (*c).to_owned()).collect();
    let mut resolved: PathBuf = walk.resolved.components().take(walk.existing).collect();
    let mut dir = match walk.into_dir() {
        Some(dir) => return Ok(dir),
        None => {
            // The real part of the path, where creation starts.
            root.dir_nofollow(&resolved)?
                .ok_or_else(|| ApplyError::Invalid(format!("{}: vanished", rel.display())))?
        }
    };
    for name in missing {
        if dir.lstat(&name)?.is_some() {
            // The last component exists and is not a directory.
            return Err(FsError {
                path: dir.path().join(&name).display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            }
            .into());
        }
        resolved.push(&name);
        dir.mkdir(&name, 0o755)?;
        implied.push(ImpliedParent {
            path: resolved.clone(),
            explicit: false,
        });
        if let Some(lower) = nearest_lower_dir(lowers, &resolved)? {
            let st = lower.stat()?;
            dir.chown(&name, st.uid, st.gid)?;
            dir.chmod(&name, st.mode)?;
            copy_up_xattrs(&lower, &dir, &name, true)?;
            dir.set_times(&name, st.atime, st.mtime)?;
        }
        dir = dir.open_dir(&name)?;
    }
    Ok(dir)
}

/// Hard link `name` in `dir` to `target` (cleaned, relative to the root), resolved
/// inside this layer: a target only a lower layer has is not found, as containerd finds.
/// As containerd's `hardlinkRootPath`, the target's parents are resolved in the root and
/// a final symlink is linked itself, never followed.
fn hard_link(
    root: &SnapshotRoot,
    dir: &Dir,
    name: &OsStr,
    target: &Path,
) -> Result<(), ApplyError> {
    let refused = |detail: String| {
        ApplyError::Fs(FsError {
            path: dir.path().join(name).display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "hard link to {} (links must point into the same layer): {detail}",
                    target.display()
                ),
            ),
        })
    };
    let walk = root
        .walk(target, false)
        .map_err(|e| refused(e.to_string()))?;
    let depth = walk.resolved.components().count();
    let Some(last) = walk.resolved.file_name().map(OsStr::to_owned) else {
        return Err(refused("the layer root".to_owned()));
    };
    if walk.existing + 1 != depth || walk.deepest().lstat(&last)?.is_none() {
        return Err(refused("no such file in this layer".to_owned()));
    }
    dir.hard_link(name, walk.deepest(), &last)?;
    Ok(())
}

/// atime = the later of atime and mtime (containerd's rule), both from PAX when given.
fn times<R: Read>(entry: &mut tar::Entry<'_, R>, header: &tar::Header) -> (Timespec, Timespec) {
    let mut mtime = Timespec {
        tv_sec: i64::try_from(header.mtime().unwrap_or(0)).unwrap_or(0),
        tv_nsec: 0,
    };
    let mut atime = None;
    if let Ok(Some(extensions)) = entry.pax_extensions() {
        for ext in extensions.flatten() {
            match (ext.key(), ext.value()) {
                (Ok("mtime"), Ok(v)) => {
                    if let Some(t) = parse_pax_time(v) {
                        mtime = t;
                    }
                }
                (Ok("atime"), Ok(v)) => atime = parse_pax_time(v),
                _ => {}
            }
        }
    }
    let later = |a: &Timespec, b: &Timespec| (a.tv_sec, a.tv_nsec) > (b.tv_sec, b.tv_nsec);
    let atime = match atime {
        Some(a) if later(&a, &mtime) => a,
        _ => mtime,
    };
    (atime, mtime)
}

fn parse_pax_time(value: &str) -> Option<Timespec> {
    let (secs, frac) = value.split_once('.').unwrap_or((value, ""));
    let secs: i64 = secs.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nanos: i64 = digits.parse().ok()?;
    Some(Timespec {
        tv_sec: secs,
        tv_nsec: if secs < 0 { -nanos } else { nanos },
    })
}

/// `filepath.Clean` of a tar name, relative to the root; `..` past the root is invalid.
fn clean(raw: &[u8]) -> Result<PathBuf, ApplyError> {
    let path = Path::new(OsStr::from_bytes(raw));
    let mut out: Vec<&OsStr> = Vec::new();
    let mut depth_escape = false;
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if out.pop().is_none() {
                    // A relative name climbing above the root escapes it; an absolute one
                    // ("/../x") is cleaned to "/x" like filepath.Clean does.
                    if !path.is_absolute() {
                        depth_escape = true;
                    }
                }
            }
            Component::Normal(part) => out.push(part),
        }
    }
    if depth_escape {
        return Err(ApplyError::Invalid(format!(
            "{:?} is outside of the layer root",
            String::from_utf8_lossy(raw)
        )));
    }
    Ok(out.iter().collect())
}

/// Extended attributes of a lower directory onto entry `name` of `dir`, except
/// overlayfs' own; with `overwrite` false, only names the entry does not have yet.
fn copy_up_xattrs(from: &Dir, dir: &Dir, name: &OsStr, overwrite: bool) -> Result<(), ApplyError> {
    for xattr in from.own_xattrs()? {
        if xattr.key.starts_with(OVERLAY_XATTR_PREFIX) {
            continue;
        }
        let key = OsStr::from_bytes(&xattr.key);
        if !overwrite && dir.has_xattr(name, key)? {
            continue;
        }
        dir.set_xattr(name, key, &xattr.value)?;
    }
    Ok(())
}
