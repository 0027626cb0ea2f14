//! Applying a layer tar to a snapshot directory, the way containerd 1.6's applier does
//! for the overlayfs snapshotter (`archive.Apply` with `OverlayConvertWhiteout` and the
//! lower directories as parents), so the result is the same file for file.
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
//!   becomes a 0:0 character device NAME owned like the whiteout entry;
//! - an existing path is replaced unless both are directories (then merged);
//! - hard links resolve within this layer only (a link to a lower layer's file fails);
//! - owner, then xattrs, then mode, then times; directory times last of all.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::AT_FDCWD;
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, makedev, mknod, utimensat};
use nix::sys::time::TimeSpec;
use sha2::{Digest as _, Sha256};

const WHITEOUT_PREFIX: &str = ".wh.";
const WHITEOUT_META_PREFIX: &str = ".wh..wh.";
const WHITEOUT_OPAQUE: &str = ".wh..wh..opq";
const PAX_XATTR: &str = "SCHILY.xattr.";
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("invalid layer archive: {0}")]
    Invalid(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("reading the layer: {0}")]
    Read(std::io::Error),
}

fn io_err(path: &Path, source: impl Into<std::io::Error>) -> ApplyError {
    ApplyError::Io {
        path: path.display().to_string(),
        source: source.into(),
    }
}

/// Where a layer goes: the snapshot's own directory, and the lower layers' directories
/// (top first) for the attributes of implied parent directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyTarget {
    pub root: PathBuf,
    pub lowers: Vec<PathBuf>,
}

impl ApplyTarget {
    /// From the mounts `Snapshots.Prepare` returned: a bind mount (the base layer) or an
    /// overlay mount (its `upperdir` and `lowerdir`s). `None` for any other snapshotter.
    pub fn from_mounts(mounts: &[containerd_client::types::Mount]) -> Option<Self> {
        let [mount] = mounts else { return None };
        match mount.r#type.as_str() {
            "bind" => Some(Self {
                root: PathBuf::from(&mount.source),
                lowers: Vec::new(),
            }),
            "overlay" => {
                let option = |key: &str| {
                    mount
                        .options
                        .iter()
                        .find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                };
                Some(Self {
                    root: PathBuf::from(option("upperdir")?),
                    lowers: option("lowerdir")
                        .map(|l| l.split(':').map(PathBuf::from).collect())
                        .unwrap_or_default(),
                })
            }
            _ => None,
        }
    }
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
        Ok(format!(
            "sha256:{}",
            super::unpack::hex(&self.hasher.finalize())
        ))
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
    let mut hashing = DiffIdReader::new(reader);
    let implied_parents = apply_entries(&mut hashing, target)?;
    Ok(Applied {
        diff_id: hashing.finish().map_err(ApplyError::Read)?,
        implied_parents,
    })
}

/// Give implied parent directories what they would have had if the layer had been
/// applied with its lower layers in place (it was applied without them, in parallel
/// with the layers below): owner, mode and atime of the nearest lower directory, and
/// its extended attributes where the layer set none of the same name. Their mtime is
/// the apply time either way.
pub fn adopt_lowers(
    root: &Path,
    lowers: &[PathBuf],
    implied: &[ImpliedParent],
) -> Result<(), ApplyError> {
    for parent in implied {
        let path = root.join(&parent.path);
        for lower in lowers {
            let lower_path = scoped_resolve(lower, &parent.path)?;
            match std::fs::symlink_metadata(&lower_path) {
                Ok(m) if m.is_dir() => {
                    if !parent.explicit {
                        chown(&path, u64::from(m.uid()), u64::from(m.gid()))?;
                        std::fs::set_permissions(
                            &path,
                            std::fs::Permissions::from_mode(m.mode() & 0o7777),
                        )
                        .map_err(|e| io_err(&path, e))?;
                        set_times(
                            &path,
                            TimeSpec::new(m.atime(), m.atime_nsec()),
                            TimeSpec::UTIME_OMIT,
                        )?;
                    }
                    copy_up_xattrs(&lower_path, &path, false)?;
                    break;
                }
                Ok(_) => break, // replaced by a non-directory: keep the defaults
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&lower_path, e)),
            }
        }
    }
    Ok(())
}

struct DirTimes {
    path: PathBuf,
    atime: TimeSpec,
    mtime: TimeSpec,
}

fn apply_entries<R: Read>(
    reader: &mut R,
    target: &ApplyTarget,
) -> Result<Vec<ImpliedParent>, ApplyError> {
    let root = &target.root;
    let mut implied = Vec::new();
    let mut archive = tar::Archive::new(reader);
    let mut dirs: Vec<DirTimes> = Vec::new();
    let entries = archive.entries().map_err(ApplyError::Read)?;
    for entry in entries {
        let mut entry = entry.map_err(|e| ApplyError::Invalid(e.to_string()))?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            continue;
        }
        let raw_name = entry.path_bytes().into_owned();
        let name = clean(&raw_name)?;
        if name.as_os_str().is_empty() {
            continue; // the root itself
        }
        let base = name
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent_rel = name.parent().unwrap_or(Path::new(""));
        let parent = scoped_resolve(root, parent_rel)?;
        let path = parent.join(&base);
        if path == *root {
            continue;
        }
        if parent != *root {
            make_parent(&parent, root, &target.lowers, &mut implied)?;
        }

        // AUFS metadata at the top level is not part of the filesystem.
        let top_name = name.to_string_lossy();
        if top_name.starts_with(WHITEOUT_META_PREFIX) && top_name != WHITEOUT_OPAQUE {
            continue;
        }
        let header = entry.header().clone();
        let uid = header
            .uid()
            .map_err(|e| ApplyError::Invalid(e.to_string()))?;
        let gid = header
            .gid()
            .map_err(|e| ApplyError::Invalid(e.to_string()))?;

        // Whiteouts, converted to overlayfs' own markers.
        if base == WHITEOUT_OPAQUE {
            xattr::set(&parent, OVERLAY_OPAQUE_XATTR, b"y").map_err(|e| io_err(&parent, e))?;
            continue;
        }
        if let Some(original) = base.strip_prefix(WHITEOUT_PREFIX) {
            if original.is_empty() || original.contains('/') {
                return Err(ApplyError::Invalid(format!(
                    "invalid whiteout name {base:?}"
                )));
            }
            let whiteout = parent.join(original);
            remove_existing(&whiteout)?;
            mknod(&whiteout, SFlag::S_IFCHR, Mode::empty(), 0).map_err(|e| io_err(&whiteout, e))?;
            chown(&whiteout, uid, gid)?;
            continue;
        }

        // Replace what is there, unless directory meets directory (merge).
        if let Ok(existing) = std::fs::symlink_metadata(&path)
            && !(existing.is_dir() && kind.is_dir())
        {
            remove_existing(&path)?;
        }

        let mode = header
            .mode()
            .map_err(|e| ApplyError::Invalid(e.to_string()))?
            & 0o7777;
        let mut is_symlink = false;
        match kind {
            k if k.is_dir() => {
                if let Some(earlier) = implied.iter_mut().find(|p| root.join(&p.path) == path) {
                    earlier.explicit = true;
                }
                if !path.is_dir() {
                    std::fs::create_dir(&path).map_err(|e| io_err(&path, e))?;
                }
            }
            k if k.is_file() || k == tar::EntryType::Continuous => {
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                    .map_err(|e| io_err(&path, e))?;
                std::io::copy(&mut entry, &mut file).map_err(|e| io_err(&path, e))?;
            }
            k if k.is_hard_link() => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        ApplyError::Invalid(format!("{top_name}: hard link without target"))
                    })?
                    .into_owned();
                let target_rel = clean(&link)?;
                let target_path = scoped_resolve(root, &target_rel)?;
                std::fs::hard_link(&target_path, &path).map_err(|e| {
                    io_err(
                        &path,
                        std::io::Error::new(
                            e.kind(),
                            format!(
                                "hard link to {} (links must point into the same layer): {e}",
                                target_rel.display()
                            ),
                        ),
                    )
                })?;
            }
            k if k.is_symlink() => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        ApplyError::Invalid(format!("{top_name}: symlink without target"))
                    })?
                    .into_owned();
                std::os::unix::fs::symlink(OsStr::from_bytes(&link), &path)
                    .map_err(|e| io_err(&path, e))?;
                is_symlink = true;
            }
            k if k.is_character_special() || k.is_block_special() => {
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                let flag = if k.is_character_special() {
                    SFlag::S_IFCHR
                } else {
                    SFlag::S_IFBLK
                };
                mknod(
                    &path,
                    flag,
                    Mode::from_bits_truncate(mode),
                    makedev(u64::from(major), u64::from(minor)),
                )
                .map_err(|e| io_err(&path, e))?;
            }
            k if k.is_fifo() => {
                mknod(&path, SFlag::S_IFIFO, Mode::from_bits_truncate(mode), 0)
                    .map_err(|e| io_err(&path, e))?;
            }
            other => {
                return Err(ApplyError::Invalid(format!(
                    "{top_name}: unsupported entry type {other:?}"
                )));
            }
        }

        chown(&path, uid, gid)?;
        if let Some(extensions) = entry
            .pax_extensions()
            .map_err(|e| ApplyError::Invalid(e.to_string()))?
        {
            for ext in extensions {
                let ext = ext.map_err(|e| ApplyError::Invalid(e.to_string()))?;
                let Ok(key) = ext.key() else { continue };
                if let Some(attr) = key.strip_prefix(PAX_XATTR) {
                    match xattr::set(&path, attr, ext.value_bytes()) {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(nix::libc::ENOTSUP) => {
                            tracing::warn!(attr, path = %path.display(), "xattr not supported here; ignored");
                        }
                        Err(e) => return Err(io_err(&path, e)),
                    }
                }
            }
        }
        // A symlink has no mode of its own; a hard link shares its target's.
        if !is_symlink && !kind.is_hard_link() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| io_err(&path, e))?;
        }
        let (atime, mtime) = times(&mut entry, &header);
        if kind.is_dir() {
            dirs.push(DirTimes { path, atime, mtime });
        } else {
            set_times(&path, atime, mtime)?;
        }
    }
    for dir in dirs {
        set_times(&dir.path, dir.atime, dir.mtime)?;
    }
    Ok(implied)
}

/// atime = the later of atime and mtime (containerd's rule), both from PAX when given.
fn times<R: Read>(entry: &mut tar::Entry<'_, R>, header: &tar::Header) -> (TimeSpec, TimeSpec) {
    let mut mtime = TimeSpec::new(i64::try_from(header.mtime().unwrap_or(0)).unwrap_or(0), 0);
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
    let atime = match atime {
        Some(a) if a > mtime => a,
        _ => mtime,
    };
    (atime, mtime)
}

fn parse_pax_time(value: &str) -> Option<TimeSpec> {
    let (secs, frac) = value.split_once('.').unwrap_or((value, ""));
    let secs: i64 = secs.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nanos: i64 = digits.parse().ok()?;
    Some(TimeSpec::new(secs, if secs < 0 { -nanos } else { nanos }))
}

fn set_times(path: &Path, atime: TimeSpec, mtime: TimeSpec) -> Result<(), ApplyError> {
    utimensat(
        AT_FDCWD,
        path,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| io_err(path, e))
}

fn chown(path: &Path, uid: u64, gid: u64) -> Result<(), ApplyError> {
    let uid =
        u32::try_from(uid).map_err(|_| ApplyError::Invalid(format!("uid {uid} out of range")))?;
    let gid =
        u32::try_from(gid).map_err(|_| ApplyError::Invalid(format!("gid {gid} out of range")))?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| io_err(path, e))
}

fn remove_existing(path: &Path) -> Result<(), ApplyError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(|e| io_err(path, e)),
        Ok(_) => std::fs::remove_file(path).map_err(|e| io_err(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path, e)),
    }
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

/// Resolve `rel` under `root` following symlinks as if `root` were `/` (containerd's
/// `fs.RootPath`): the result never leaves `root`.
fn scoped_resolve(root: &Path, rel: &Path) -> Result<PathBuf, ApplyError> {
    let mut resolved = root.to_owned();
    let mut pending: Vec<PathBuf> = rel
        .components()
        .rev()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match part.to_str() {
            Some("/") | Some(".") | Some("") => continue,
            Some("..") => {
                if resolved != *root {
                    resolved.pop();
                }
                continue;
            }
            _ => {}
        }
        let candidate = resolved.join(&part);
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > 255 {
                    return Err(ApplyError::Invalid(format!(
                        "too many symlinks resolving {}",
                        rel.display()
                    )));
                }
                let target = std::fs::read_link(&candidate).map_err(|e| io_err(&candidate, e))?;
                if target.is_absolute() {
                    resolved = root.to_owned();
                }
                for c in target.components().rev() {
                    pending.push(PathBuf::from(c.as_os_str()));
                }
            }
            _ => resolved = candidate,
        }
    }
    Ok(resolved)
}

/// Create `path` (and missing ancestors below `root`) with the attributes the same
/// directory has in the nearest lower layer, or 0755.
fn make_parent(
    path: &Path,
    root: &Path,
    lowers: &[PathBuf],
    implied: &mut Vec<ImpliedParent>,
) -> Result<(), ApplyError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(io_err(
                path,
                std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(path, e)),
        Err(_) => {}
    }
    if let Some(up) = path.parent()
        && up != root
        && up.starts_with(root)
    {
        make_parent(up, root, lowers, implied)?;
    }
    std::fs::create_dir(path).map_err(|e| io_err(path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| io_err(path, e))?;
    let rel = path.strip_prefix(root).unwrap_or(path);
    implied.push(ImpliedParent {
        path: rel.to_owned(),
        explicit: false,
    });
    for lower in lowers {
        let lower_path = scoped_resolve(lower, rel)?;
        match std::fs::symlink_metadata(&lower_path) {
            Ok(m) if m.is_dir() => {
                chown(path, u64::from(m.uid()), u64::from(m.gid()))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(m.mode() & 0o7777))
                    .map_err(|e| io_err(path, e))?;
                copy_up_xattrs(&lower_path, path, true)?;
                set_times(
                    path,
                    TimeSpec::new(m.atime(), m.atime_nsec()),
                    TimeSpec::new(m.mtime(), m.mtime_nsec()),
                )?;
                return Ok(());
            }
            Ok(_) => break, // replaced by a non-directory: keep the defaults
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&lower_path, e)),
        }
    }
    Ok(())
}

/// Extended attributes of a lower directory, except overlayfs' own; with `overwrite`
/// false, only names `to` does not have yet.
fn copy_up_xattrs(from: &Path, to: &Path, overwrite: bool) -> Result<(), ApplyError> {
    let Ok(names) = xattr::list(from) else {
        return Ok(());
    };
    for name in names {
        if name.to_string_lossy().starts_with("trusted.overlay.") {
            continue;
        }
        if !overwrite && matches!(xattr::get(to, &name), Ok(Some(_))) {
            continue;
        }
        if let Ok(Some(value)) = xattr::get(from, &name) {
            xattr::set(to, &name, &value).map_err(|e| io_err(to, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_and_escapes_refused() {
        assert_eq!(clean(b"./a/b/../c").unwrap(), PathBuf::from("a/c"));
        assert_eq!(clean(b"/abs/x").unwrap(), PathBuf::from("abs/x"));
        assert_eq!(clean(b"/../x").unwrap(), PathBuf::from("x"));
        assert_eq!(clean(b"./").unwrap(), PathBuf::from(""));
        assert!(clean(b"../../etc/passwd").is_err());
        assert!(clean(b"a/../../x").is_err());
    }

    #[test]
    fn scoped_resolution_never_leaves_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("../../../../", root.join("up")).unwrap();
        assert_eq!(
            scoped_resolve(root, Path::new("lib/x")).unwrap(),
            root.join("usr/lib/x")
        );
        assert_eq!(
            scoped_resolve(root, Path::new("up/etc")).unwrap(),
            root.join("etc")
        );
    }

    fn tar_with(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().unwrap()
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h
    }

    #[test]
    fn escaping_entries_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let data = tar_with(|b| {
            let mut h = header(tar::EntryType::Regular, 0o644, 1);
            // Bypass tar-rs's own path checks to write a hostile name.
            h.as_old_mut().name[..13].copy_from_slice(b"../escape.txt");
            h.set_cksum();
            b.append(&h, &b"x"[..]).unwrap();
        });
        let target = ApplyTarget {
            root: dir.path().join("root"),
            lowers: vec![],
        };
        std::fs::create_dir(&target.root).unwrap();
        let err = apply_layer(&data[..], &target).unwrap_err();
        assert!(
            err.to_string().contains("outside of the layer root"),
            "{err}"
        );
        assert!(!dir.path().join("escape.txt").exists());
    }

    #[test]
    fn hardlink_into_a_lower_layer_fails() {
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::write(lower.join("file"), b"lower").unwrap();
        let root = dir.path().join("upper");
        std::fs::create_dir(&root).unwrap();
        let data = tar_with(|b| {
            let mut h = header(tar::EntryType::Link, 0o644, 0);
            b.append_link(&mut h, "link", "file").unwrap();
        });
        let target = ApplyTarget {
            root,
            lowers: vec![lower],
        };
        let err = apply_layer(&data[..], &target).unwrap_err();
        assert!(err.to_string().contains("same layer"), "{err}");
    }

    #[test]
    fn a_layer_applied_before_its_lowers_ends_up_as_if_applied_on_them() {
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        std::fs::create_dir_all(lower.join("opt/app")).unwrap();
        std::fs::set_permissions(lower.join("opt"), std::fs::Permissions::from_mode(0o711))
            .unwrap();
        std::fs::set_permissions(
            lower.join("opt/app"),
            std::fs::Permissions::from_mode(0o750),
        )
        .unwrap();
        let data = tar_with(|b| {
            let mut h = header(tar::EntryType::Regular, 0o644, 2);
            b.append_data(&mut h, "opt/app/bin/tool", &b"hi"[..])
                .unwrap();
            // `opt` given after its content: the layer's own attributes win.
            let mut h = header(tar::EntryType::Directory, 0o700, 0);
            b.append_data(&mut h, "opt/", &b""[..]).unwrap();
        });
        let on_lowers = dir.path().join("on-lowers");
        let staged = dir.path().join("staged");
        std::fs::create_dir(&on_lowers).unwrap();
        std::fs::create_dir(&staged).unwrap();
        apply_layer(
            &data[..],
            &ApplyTarget {
                root: on_lowers.clone(),
                lowers: vec![lower.clone()],
            },
        )
        .unwrap();
        let applied = apply_layer(
            &data[..],
            &ApplyTarget {
                root: staged.clone(),
                lowers: vec![],
            },
        )
        .unwrap();
        let implied: Vec<_> = applied
            .implied_parents
            .iter()
            .map(|p| (p.path.to_str().unwrap(), p.explicit))
            .collect();
        assert_eq!(
            implied,
            [("opt", true), ("opt/app", false), ("opt/app/bin", false)]
        );
        adopt_lowers(&staged, &[lower], &applied.implied_parents).unwrap();
        for path in ["opt", "opt/app", "opt/app/bin", "opt/app/bin/tool"] {
            let mode = |root: &Path| std::fs::metadata(root.join(path)).unwrap().mode();
            assert_eq!(mode(&staged), mode(&on_lowers), "{path}");
        }
        let mode = std::fs::metadata(staged.join("opt/app")).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o750, "from the lower layer");
    }

    #[test]
    fn whiteouts_and_implied_parents() {
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        std::fs::create_dir_all(lower.join("etc/conf.d")).unwrap();
        std::fs::set_permissions(lower.join("etc"), std::fs::Permissions::from_mode(0o750))
            .unwrap();
        let root = dir.path().join("upper");
        std::fs::create_dir(&root).unwrap();
        let data = tar_with(|b| {
            let mut h = header(tar::EntryType::Regular, 0o600, 2);
            b.append_data(&mut h, "etc/conf.d/new", &b"hi"[..]).unwrap();
            let mut h = header(tar::EntryType::Regular, 0o644, 0);
            b.append_data(&mut h, "etc/.wh.gone", &b""[..]).unwrap();
            let mut h = header(tar::EntryType::Regular, 0o644, 0);
            b.append_data(&mut h, "etc/conf.d/.wh..wh..opq", &b""[..])
                .unwrap();
        });
        let target = ApplyTarget {
            root: root.clone(),
            lowers: vec![lower],
        };
        let diff_id = apply_layer(&data[..], &target).unwrap().diff_id;
        assert_eq!(
            diff_id,
            format!(
                "sha256:{}",
                super::super::unpack::hex(&Sha256::digest(&data))
            )
        );
        // The implied parent took the lower layer's mode.
        let etc = std::fs::metadata(root.join("etc")).unwrap();
        assert_eq!(etc.mode() & 0o7777, 0o750);
        let file = std::fs::metadata(root.join("etc/conf.d/new")).unwrap();
        assert_eq!(file.mode() & 0o7777, 0o600);
        assert_eq!(file.mtime(), 1_700_000_000);
        let gone = std::fs::symlink_metadata(root.join("etc/gone")).unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &gone.file_type()
        ));
        assert_eq!(gone.rdev(), 0);
        // trusted.* xattrs need root (the tests and the agent run as root).
        if nix::unistd::geteuid().is_root() {
            assert_eq!(
                xattr::get(root.join("etc/conf.d"), OVERLAY_OPAQUE_XATTR)
                    .unwrap()
                    .as_deref(),
                Some(&b"y"[..])
            );
        }
    }
}
