//! The only way Rigger touches the inside of a snapshot: the snapshot's directory opened
//! once by descriptor ([`SnapshotRoot`]), every path below it resolved *inside* it, and
//! every change made to one name in a directory held by descriptor ([`Dir`]).
//!
//! - Paths resolve as if the snapshot root were `/` (containerd's `fs.RootPath`): a
//!   symlink a layer planted, absolute or full of `..`, can lead anywhere in the
//!   snapshot and nowhere outside it. The kernel does this (`openat2` with
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, through the `pathrs` crate, which falls
//!   back to a checked userspace walk on kernels before 5.6).
//! - A change (create, chown, chmod, times, xattrs, link, remove) names one entry of a
//!   directory held open, and never follows a symlink in that last name: `*at` calls
//!   with `AT_SYMLINK_NOFOLLOW` / `O_NOFOLLOW`, or calls on a descriptor of the entry.
//!
//! Nothing else in this crate may use a path-based filesystem call (`clippy.toml` of
//! this crate forbids them); this module opens the snapshot's own directory, whose path
//! comes from containerd, and uses `/proc/thread-self/fd` for the one call Linux has no
//! descriptor form of before 6.13 (an xattr on a symlink or device node).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use pathrs::Root;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Timestamps, Uid, XattrFlags};
use rustix::io::Errno;

pub use rustix::fs::Timespec;

/// A filesystem call inside a snapshot failed; `path` is relative to the snapshot root.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FsError {
    pub path: String,
    pub source: std::io::Error,
}

impl FsError {
    fn new(path: &Path, source: impl Into<std::io::Error>) -> Self {
        Self {
            path: path.display().to_string(),
            source: source.into(),
        }
    }

    /// Something on the way was not a directory (ENOTDIR).
    pub fn is_not_a_directory(&self) -> bool {
        self.source.raw_os_error() == Some(Errno::NOTDIR.raw_os_error())
    }

    fn pathrs(path: &Path, error: &pathrs::error::Error) -> Self {
        let source = match error.kind() {
            pathrs::error::ErrorKind::OsError(Some(errno)) => {
                std::io::Error::from_raw_os_error(errno)
            }
            _ => std::io::Error::other(error.to_string()),
        };
        Self::new(path, source)
    }

    /// The entry (or a directory on the way to it) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.source.kind() == std::io::ErrorKind::NotFound
    }
}

/// What kind of entry a name is, as `lstat` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Directory,
    File,
    Symlink,
    Other,
}

/// An entry's attributes, as `lstat` sees them.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: Timespec,
    pub mtime: Timespec,
}

impl Stat {
    fn from_raw(st: &rustix::fs::Stat) -> Self {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => Kind::Directory,
            FileType::RegularFile => Kind::File,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        };
        Self {
            kind,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            atime: Timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec as _,
            },
            mtime: Timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec as _,
            },
        }
    }
}

/// An extended attribute: its name and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// What [`Dir::make_node`] creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    CharDevice { major: u32, minor: u32 },
    BlockDevice { major: u32, minor: u32 },
    Fifo,
}

/// A snapshot's directory, held by descriptor; the root every path below resolves in.
#[derive(Debug)]
pub struct SnapshotRoot {
    root: Root,
}

impl SnapshotRoot {
    /// Open the snapshot directory at `path` (containerd's own path for it: the only
    /// path this module follows on the host).
    #[allow(clippy::disallowed_methods)] // the one host path: containerd's, for the root
    pub fn open(path: &Path) -> Result<Self, FsError> {
        let fd: OwnedFd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::new(path, e))?;
        Ok(Self {
            root: Root::from_fd(fd),
        })
    }

    /// The root directory itself.
    pub fn top(&self) -> Result<Dir, FsError> {
        let fd = rustix::io::dup(&self.root).map_err(|e| FsError::new(Path::new("/"), e))?;
        Ok(Dir {
            fd,
            path: PathBuf::new(),
        })
    }

    /// Resolve `rel` inside the root as containerd's `fs.RootPath` does: symlinks are
    /// followed as if the root were `/` (an absolute target starts again at the root,
    /// `..` stops there, at most 255 links), a missing component ends the real part and
    /// the rest is taken as written. With `follow_last` false a final symlink is the
    /// entry itself. Every step into a directory is an `O_NOFOLLOW` open of a real
    /// directory held by descriptor, so nothing here can leave the root.
    pub fn walk(&self, rel: &Path, follow_last: bool) -> Result<Walk, FsError> {
        let mut dirs = vec![self.top()?];
        let mut resolved: Vec<std::ffi::OsString> = Vec::new();
        let mut pending: Vec<std::ffi::OsString> = rel
            .components()
            .rev()
            .map(|c| c.as_os_str().to_owned())
            .collect();
        let mut links = 0;
        while let Some(part) = pending.pop() {
            match part.as_bytes() {
                b"" | b"." | b"/" => continue,
                b".." => {
                    resolved.pop();
                    dirs.truncate(resolved.len() + 1);
                    continue;
                }
                _ => {}
            }
            let existing = dirs.len() - 1 == resolved.len();
            let Some(dir) = dirs.last().filter(|_| existing) else {
                resolved.push(part);
                continue;
            };
            let here = dir.child(&part);
            match dir.lstat(&part)? {
                None => resolved.push(part),
                Some(st) if st.kind == Kind::Symlink && (follow_last || !pending.is_empty()) => {
                    links += 1;
                    if links > 255 {
                        return Err(FsError::new(&here, Errno::LOOP));
                    }
                    let target = rustix::fs::readlinkat(&dir.fd, part.as_os_str(), Vec::new())
                        .map_err(|e| FsError::new(&here, e))?;
                    let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                    // As `fs.RootPath`: the target joined to the link's directory and
                    // cleaned as a string before anything is looked up (`x/..` undoes `x`
                    // whatever `x` is: a symlink is not followed, a file is no error),
                    // then walked again from the root.
                    let mut joined = match target.is_absolute() {
                        true => Vec::new(),
                        false => std::mem::take(&mut resolved),
                    };
                    for component in target.components() {
                        match component {
                            Component::Normal(name) => joined.push(name.to_owned()),
                            Component::ParentDir => {
                                joined.pop();
                            }
                            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                        }
                    }
                    resolved.clear();
                    dirs.truncate(1);
                    pending.extend(joined.into_iter().rev());
                }
                Some(st) if st.kind == Kind::Directory => {
                    let child = dir.open_dir(&part)?;
                    dirs.push(child);
                    resolved.push(part);
                }
                Some(_) if pending.is_empty() => resolved.push(part),
                Some(_) => return Err(FsError::new(&here, Errno::NOTDIR)),
            }
        }
        Ok(Walk {
            resolved: resolved.iter().collect(),
            existing: dirs.len() - 1,
            dirs,
        })
    }

    /// The directory `rel` resolves to (symlinks followed inside the root); `Ok(None)`
    /// when it, or a directory on the way, does not exist or is not a directory.
    pub fn dir(&self, rel: &Path) -> Result<Option<Dir>, FsError> {
        let walk = match self.walk(rel, true) {
            Ok(walk) => walk,
            Err(e) if e.is_not_a_directory() => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        Ok(walk.into_dir())
    }
}

impl SnapshotRoot {
    /// The directory at `rel` reached without following any symlink: each component a
    /// real directory. `Ok(None)` when any component is missing or is not a directory.
    pub fn dir_nofollow(&self, rel: &Path) -> Result<Option<Dir>, FsError> {
        let mut dir = self.top()?;
        for component in rel.components() {
            let name = component.as_os_str();
            match dir.open_dir(name) {
                Ok(child) => dir = child,
                Err(e) if is_not_a_directory(&e) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(dir))
    }
}

/// Missing, not a directory, or a symlink where a directory was asked for.
fn is_not_a_directory(e: &FsError) -> bool {
    e.is_not_found()
        || [Errno::NOTDIR, Errno::LOOP]
            .iter()
            .any(|errno| e.source.raw_os_error() == Some(errno.raw_os_error()))
}

/// Put the staged snapshot directory `staging` in the place of the (empty) snapshot
/// directory `target`, and leave an empty directory where `staging` was (its snapshot is
/// removed next). Both paths are containerd's (from its mounts); the move goes through
/// descriptors of their parents, so neither last component is followed.
#[allow(clippy::disallowed_methods)] // the parents of two snapshot roots, containerd's paths
pub fn move_snapshot_dir(staging: &Path, target: &Path) -> Result<(), FsError> {
    let parent = |path: &Path| -> Result<(OwnedFd, std::ffi::OsString), FsError> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(FsError::new(path, Errno::INVAL));
        };
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::new(dir, e))?;
        Ok((fd, name.to_owned()))
    };
    let (staging_dir, staging_name) = parent(staging)?;
    let (target_dir, target_name) = parent(target)?;
    rustix::fs::unlinkat(&target_dir, &target_name, AtFlags::REMOVEDIR)
        .map_err(|e| FsError::new(target, e))?;
    rustix::fs::renameat(&staging_dir, &staging_name, &target_dir, &target_name)
        .map_err(|e| FsError::new(target, e))?;
    rustix::fs::mkdirat(&staging_dir, &staging_name, Mode::from_raw_mode(0o755))
        .map_err(|e| FsError::new(staging, e))
}

/// Where [`SnapshotRoot::walk`] led.
#[derive(Debug)]
pub struct Walk {
    /// The path resolved, relative to the root: real directories, then (past
    /// `existing` components) what does not exist yet, or a last entry that is not a
    /// directory.
    pub resolved: PathBuf,
    /// How many leading components of `resolved` are directories held open.
    pub existing: usize,
    dirs: Vec<Dir>,
}

impl Walk {
    /// The deepest directory reached: the whole path when it is a directory.
    pub fn deepest(&self) -> &Dir {
        // `dirs` always holds the root.
        &self.dirs[self.dirs.len() - 1]
    }

    /// The components of `resolved` past the directories reached.
    pub fn rest(&self) -> Vec<&OsStr> {
        self.resolved
            .components()
            .skip(self.existing)
            .map(|c| c.as_os_str())
            .collect()
    }

    /// The resolved path's last entry, as its directory and its name, when it exists
    /// (`None` for the root itself or a path that does not exist).
    pub fn last_entry(&self) -> Result<Option<(&Dir, &OsStr)>, FsError> {
        let depth = self.resolved.components().count();
        let Some(last) = self.resolved.file_name() else {
            return Ok(None);
        };
        if self.existing == depth && self.dirs.len() >= 2 {
            return Ok(Some((&self.dirs[self.dirs.len() - 2], last)));
        }
        if self.existing + 1 == depth && self.deepest().lstat(last)?.is_some() {
            return Ok(Some((self.deepest(), last)));
        }
        Ok(None)
    }

    /// The resolved path as a directory, if it is one.
    pub fn into_dir(mut self) -> Option<Dir> {
        if self.existing == self.resolved.components().count() {
            self.dirs.pop()
        } else {
            None
        }
    }
}

/// A directory inside a snapshot, held by an `O_PATH` descriptor. Every method works on
/// one entry `name` of it (a single path component) and never follows a symlink there.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// Relative to the snapshot root: for messages.
    path: PathBuf,
}

impl Dir {
    /// Another descriptor of the same directory.
    pub fn try_clone(&self) -> Result<Dir, FsError> {
        Ok(Dir {
            fd: rustix::io::dup(&self.fd).map_err(|e| FsError::new(&self.path, e))?,
            path: self.path.clone(),
        })
    }

    /// Where this directory is, relative to the snapshot root (as resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn child(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    fn check_name(&self, name: &OsStr) -> Result<(), FsError> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
            return Err(FsError::new(
                &self.child(name),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a single path component",
                ),
            ));
        }
        Ok(())
    }

    /// `lstat` of `name`; `Ok(None)` when there is none.
    pub fn lstat(&self, name: &OsStr) -> Result<Option<Stat>, FsError> {
        self.check_name(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Stat::from_raw(&st))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(FsError::new(&self.child(name), e)),
        }
    }

    /// This directory's own attributes.
    pub fn stat(&self) -> Result<Stat, FsError> {
        rustix::fs::fstat(&self.fd)
            .map(|st| Stat::from_raw(&st))
            .map_err(|e| FsError::new(&self.path, e))
    }

    /// The directory `name`, which must be a real directory (not a symlink to one).
    pub fn open_dir(&self, name: &OsStr) -> Result<Dir, FsError> {
        self.check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::new(&self.child(name), e))?;
        Ok(Dir {
            fd,
            path: self.child(name),
        })
    }

    /// Create directory `name` (mode set exactly: the umask does not apply).
    pub fn mkdir(&self, name: &OsStr, mode: u32) -> Result<(), FsError> {
        self.check_name(name)?;
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700))
            .map_err(|e| FsError::new(&self.child(name), e))?;
        self.chmod(name, mode)
    }

    /// Create regular file `name` (there must be none), open for writing; its
    /// attributes are then set through the same descriptor.
    pub fn create_file(&self, name: &OsStr) -> Result<NewFile, FsError> {
        self.check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| FsError::new(&self.child(name), e))?;
        Ok(NewFile {
            file: File::from(fd),
            path: self.child(name),
        })
    }

    /// Create symlink `name` pointing at `target` (never followed here).
    pub fn symlink(&self, name: &OsStr, target: &OsStr) -> Result<(), FsError> {
        self.check_name(name)?;
        rustix::fs::symlinkat(target, &self.fd, name)
            .map_err(|e| FsError::new(&self.child(name), e))
    }

    /// Create device node or FIFO `name` with permission bits `mode`.
    pub fn make_node(&self, name: &OsStr, node: Node, mode: u32) -> Result<(), FsError> {
        self.check_name(name)?;
        let (kind, dev) = match node {
            Node::CharDevice { major, minor } => {
                (FileType::CharacterDevice, rustix::fs::makedev(major, minor))
            }
            Node::BlockDevice { major, minor } => {
                (FileType::BlockDevice, rustix::fs::makedev(major, minor))
            }
            Node::Fifo => (FileType::Fifo, 0),
        };
        rustix::fs::mknodat(&self.fd, name, kind, Mode::empty(), dev)
            .map_err(|e| FsError::new(&self.child(name), e))?;
        self.chmod(name, mode)
    }

    /// Hard link `name` to entry `target` of directory `target_dir` (the entry itself,
    /// not what it may point to).
    pub fn hard_link(&self, name: &OsStr, target_dir: &Dir, target: &OsStr) -> Result<(), FsError> {
        self.check_name(name)?;
        target_dir.check_name(target)?;
        rustix::fs::linkat(&target_dir.fd, target, &self.fd, name, AtFlags::empty())
            .map_err(|e| FsError::new(&self.child(name), e))
    }

    /// The names in this directory (without `.` and `..`).
    pub fn names(&self) -> Result<Vec<OsString>, FsError> {
        let fail = |e| FsError::new(&self.path, e);
        // The held descriptor is `O_PATH`: reading entries needs the directory opened.
        let opened = self.reopen_self()?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&opened).map_err(fail)? {
            let entry = entry.map_err(fail)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_owned());
            }
        }
        Ok(names)
    }

    /// Remove `name` whatever it is (a directory with everything below it); nothing
    /// when there is none. Symlinks are removed, never followed.
    pub fn remove_all(&self, name: &OsStr) -> Result<(), FsError> {
        self.check_name(name)?;
        match self.lstat(name)? {
            None => Ok(()),
            Some(st) if st.kind == Kind::Directory => {
                let inner = pathrs::RootRef::from_fd(self.fd.as_fd());
                inner
                    .remove_all(Path::new(name))
                    .map_err(|e| FsError::pathrs(&self.child(name), &e))
            }
            Some(_) => rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())
                .map_err(|e| FsError::new(&self.child(name), e)),
        }
    }

    /// Owner of `name` (a symlink's own).
    pub fn chown(&self, name: &OsStr, uid: u32, gid: u32) -> Result<(), FsError> {
        self.check_name(name)?;
        rustix::fs::chownat(
            &self.fd,
            name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| FsError::new(&self.child(name), e))
    }

    /// Permission bits of `name`; a symlink has none of its own and is refused.
    pub fn chmod(&self, name: &OsStr, mode: u32) -> Result<(), FsError> {
        let opened = self.open_entry(name)?;
        let mode = Mode::from_raw_mode(mode & 0o7777);
        match opened {
            Opened::Readable(file) => rustix::fs::fchmod(&file, mode),
            Opened::Other(Kind::Symlink) => Err(Errno::LOOP),
            // A node: `fchmodat` on its name. It follows a final symlink, but the entry
            // was just seen (by descriptor) not to be one, and only the agent writes in a
            // snapshot it prepared.
            Opened::Other(_) => rustix::fs::chmodat(&self.fd, name, mode, AtFlags::empty()),
        }
        .map_err(|e| FsError::new(&self.child(name), e))
    }

    /// Access and modification times of `name` (a symlink's own).
    pub fn set_times(&self, name: &OsStr, atime: Timespec, mtime: Timespec) -> Result<(), FsError> {
        self.check_name(name)?;
        rustix::fs::utimensat(
            &self.fd,
            name,
            &Timestamps {
                last_access: atime,
                last_modification: mtime,
            },
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| FsError::new(&self.child(name), e))
    }

    /// Set extended attribute `key` of `name` (a symlink's own).
    #[allow(clippy::disallowed_methods)] // lsetxattr below /proc/thread-self/fd/<held dir>
    pub fn set_xattr(&self, name: &OsStr, key: &OsStr, value: &[u8]) -> Result<(), FsError> {
        match self.open_entry(name)? {
            Opened::Readable(file) => rustix::fs::fsetxattr(&file, key, value, XattrFlags::empty()),
            // No descriptor form for these before Linux 6.13 (setxattrat): the directory
            // by its descriptor's /proc entry, the name itself not followed.
            Opened::Other(_) => {
                rustix::fs::lsetxattr(self.proc_path(name), key, value, XattrFlags::empty())
            }
        }
        .map_err(|e| FsError::new(&self.child(name), e))
    }

    /// Access and modification times of this directory itself.
    pub fn set_own_times(&self, atime: Timespec, mtime: Timespec) -> Result<(), FsError> {
        let file = self.reopen_self()?;
        rustix::fs::futimens(
            &file,
            &Timestamps {
                last_access: atime,
                last_modification: mtime,
            },
        )
        .map_err(|e| FsError::new(&self.path, e))
    }

    /// Set extended attribute `key` of this directory itself.
    pub fn set_own_xattr(&self, key: &OsStr, value: &[u8]) -> Result<(), FsError> {
        let file = self.reopen_self()?;
        rustix::fs::fsetxattr(&file, key, value, XattrFlags::empty())
            .map_err(|e| FsError::new(&self.path, e))
    }

    /// Whether entry `name` has extended attribute `key`.
    pub fn has_xattr(&self, name: &OsStr, key: &OsStr) -> Result<bool, FsError> {
        let path = self.child(name);
        let Opened::Readable(file) = self.open_entry(name)? else {
            return Ok(false);
        };
        match rustix::fs::fgetxattr_query(&file, key) {
            Ok(_) => Ok(true),
            Err(Errno::NODATA | Errno::NOTSUP) => Ok(false),
            Err(e) => Err(FsError::new(&path, e)),
        }
    }

    /// Every extended attribute of this directory itself, with its value.
    pub fn own_xattrs(&self) -> Result<Vec<Xattr>, FsError> {
        let file = self.reopen_self()?;
        let err = |e: Errno| FsError::new(&self.path, e);
        let size = match rustix::fs::flistxattr_query(&file) {
            Ok(size) => size,
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        };
        let mut names = vec![0u8; size];
        let size = rustix::fs::flistxattr(&file, &mut names[..]).map_err(err)?;
        names.truncate(size);
        let mut out = Vec::new();
        for key in names.split(|b| *b == 0).filter(|k| !k.is_empty()) {
            let key = OsStr::from_bytes(key);
            let size = match rustix::fs::fgetxattr_query(&file, key) {
                Ok(size) => size,
                Err(Errno::NODATA) => continue,
                Err(e) => return Err(err(e)),
            };
            let mut value = vec![0u8; size];
            let size = rustix::fs::fgetxattr(&file, key, &mut value[..]).map_err(err)?;
            value.truncate(size);
            out.push(Xattr {
                key: key.as_bytes().to_vec(),
                value,
            });
        }
        Ok(out)
    }

    /// `name` opened without following it: a readable descriptor for a directory or a
    /// regular file, else just its kind.
    fn open_entry(&self, name: &OsStr) -> Result<Opened, FsError> {
        self.check_name(name)?;
        let path = self.child(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FsError::new(&path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FsError::new(&path, e))?;
        let kind = Stat::from_raw(&st).kind;
        match kind {
            Kind::Directory | Kind::File => {
                // Opened again by name, never following it, and checked to be the same
                // inode: a directory or regular file, so the open has no side effect.
                let mut flags =
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
                if kind == Kind::Directory {
                    flags |= OFlags::DIRECTORY;
                }
                let file = rustix::fs::openat(&self.fd, name, flags, Mode::empty())
                    .map_err(|e| FsError::new(&path, e))?;
                let again = rustix::fs::fstat(&file).map_err(|e| FsError::new(&path, e))?;
                if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
                    return Err(FsError::new(&path, Errno::STALE));
                }
                Ok(Opened::Readable(File::from(file)))
            }
            other => Ok(Opened::Other(other)),
        }
    }

    fn reopen_self(&self) -> Result<File, FsError> {
        rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(File::from)
        .map_err(|e| FsError::new(&self.path, e))
    }

    fn proc_path(&self, name: &OsStr) -> PathBuf {
        use std::os::fd::AsRawFd as _;
        let mut path = PathBuf::from(format!("/proc/thread-self/fd/{}", self.fd.as_raw_fd()));
        path.push(name);
        path
    }
}

/// A regular file [`Dir::create_file`] made, held open.
#[derive(Debug)]
pub struct NewFile {
    file: File,
    path: PathBuf,
}

impl NewFile {
    fn err(&self, e: impl Into<std::io::Error>) -> FsError {
        FsError::new(&self.path, e)
    }

    /// Copy everything `reader` gives into the file through `buffer` (the caller's, so
    /// one allocation serves a whole layer; big, so a big file costs few syscalls and
    /// few digest updates — `io::copy`'s 8 KiB buffer made 32,768 of each per 256 MiB).
    pub fn write_from(
        &mut self,
        reader: &mut impl std::io::Read,
        buffer: &mut [u8],
    ) -> Result<u64, FsError> {
        use std::io::Write as _;
        let mut written = 0u64;
        loop {
            let n = match reader.read(buffer) {
                Ok(0) => return Ok(written),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.err(e)),
            };
            let data = buffer.get(..n).unwrap_or_default();
            self.file.write_all(data).map_err(|e| self.err(e))?;
            written += n as u64;
        }
    }

    pub fn chown(&self, uid: u32, gid: u32) -> Result<(), FsError> {
        rustix::fs::fchown(
            &self.file,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
        )
        .map_err(|e| self.err(e))
    }

    pub fn chmod(&self, mode: u32) -> Result<(), FsError> {
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode & 0o7777)).map_err(|e| self.err(e))
    }

    pub fn set_xattr(&self, key: &OsStr, value: &[u8]) -> Result<(), FsError> {
        rustix::fs::fsetxattr(&self.file, key, value, XattrFlags::empty()).map_err(|e| self.err(e))
    }

    pub fn set_times(&self, atime: Timespec, mtime: Timespec) -> Result<(), FsError> {
        rustix::fs::futimens(
            &self.file,
            &Timestamps {
                last_access: atime,
                last_modification: mtime,
            },
        )
        .map_err(|e| self.err(e))
    }
}

enum Opened {
    Readable(File),
    Other(Kind),
}
