//! A blob written straight into containerd's content store, beside its API.
//!
//! `Content.Write` costs containerd more CPU than anything else in a pull (decoding every
//! message, hashing, writing: 1.6–1.9 CPU-seconds for six images of 465 MiB compressed,
//! more than half of containerd's own pull of them). containerd's metadata store shares
//! blobs between namespaces: a writer opened for a digest its local store already holds
//! answers at once that it holds all of it, and a commit then only records the blob, with
//! its labels, in the namespace (containerd 1.6 to 2.x, the default `shared` policy).
//! So the agent writes a big blob itself into `rigger-incoming/<hex>` beside the store
//! (same filesystem), checks its digest, makes it durable, links it into
//! `blobs/sha256/<hex>`, and commits it through the API. When containerd does not take
//! it (its garbage collection removed the link first, an `isolated` policy, a content
//! root this process does not see as containerd does), the bytes go through
//! `Content.Write` from the file after all: slower, never wrong.
//!
//! Every file is opened beneath the content root's descriptor with no symlink followed.
//! A file is written only while this process holds its lock and the name still leads to
//! it with one link: a blob once linked into containerd's store is never written again.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, ResolveFlags};
use sha2::{Digest as _, Sha256};

/// Beside containerd's `blobs/` and `ingest/`, in its content root: this agent's writes.
const INCOMING: &str = "rigger-incoming";
/// Files of writes no process holds, left longer than this, go (containerd lets an
/// ingest outside a lease expire after as long).
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Bytes read at a time when a resumed file is hashed again.
const READ_PIECE: usize = 1 << 20;

/// `path` beneath `dir`: no symlink, no magic link, no way out (a FIFO put there does
/// not hang the open: callers check what they opened). Also how the agent's peer endpoint
/// reads containerd's ingests.
pub fn open_beneath(dir: impl AsFd, path: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        path,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK,
        mode,
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// The directory `name` in `dir`, made (with `mode`) when missing.
fn directory(dir: impl AsFd, name: &str, mode: Mode) -> io::Result<OwnedFd> {
    match rustix::fs::mkdirat(&dir, name, mode) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    open_beneath(dir, name, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
}

/// `dir` is this process's user's and no one else may write to it.
fn owned_by_us(dir: impl AsFd, shown: &str) -> io::Result<()> {
    let stat = rustix::fs::fstat(dir)?;
    if stat.st_uid != rustix::process::geteuid().as_raw() || stat.st_mode & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{shown} is not this agent's own (owner {}, mode {:o})",
            stat.st_uid,
            stat.st_mode & 0o7777
        )));
    }
    Ok(())
}

/// Whether `name` in `dir` still leads to the file `fd` is open on.
fn names(dir: impl AsFd, name: &str, fd: impl AsFd) -> bool {
    match (
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
        rustix::fs::fstat(fd),
    ) {
        (Ok(named), Ok(open)) => same_inode(&named, &open),
        _ => false,
    }
}

/// Whether `a` and `b` are open on one file.
fn same_file(a: impl AsFd, b: impl AsFd) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(a), Ok(b)) => same_inode(&a, &b),
        _ => false,
    }
}

fn same_inode(a: &rustix::fs::Stat, b: &rustix::fs::Stat) -> bool {
    a.st_ino == b.st_ino && a.st_dev == b.st_dev
}

/// A blob digest's hex part, when it is a sha256 this module writes.
pub fn digest_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// After containerd did not take a blob written beside its store, how long blobs go
/// through `Content.Write` from their first byte: an `isolated` store takes none (each
/// would be written twice), while a link its garbage collection removed first is rare
/// and passes.
const NOT_TAKEN_PAUSE: Duration = Duration::from_secs(600);

/// Whether direct writes rest at `now`, containerd having last not taken one at `at`.
fn resting(at: Option<Instant>, now: Instant) -> bool {
    at.is_some_and(|at| now.saturating_duration_since(at) < NOT_TAKEN_PAUSE)
}

/// containerd's content root, opened for writing blobs into it.
#[derive(Debug)]
pub struct DirectContent {
    root: OwnedFd,
    incoming: OwnedFd,
    /// Where the content root is (for messages).
    shown: String,
    /// When containerd last did not take a blob written here.
    not_taken_at: Mutex<Option<Instant>>,
}

impl DirectContent {
    /// The content root at `content_root` (as containerd reports it), when it is a
    /// directory of this process's user that no one else may write to. (containerd 1.7.24
    /// and 2.x make its `ingest/` and `blobs/` only when first needed: a fresh node has
    /// neither.)
    pub fn open(content_root: &Path) -> io::Result<Self> {
        let root = rustix::fs::open(
            content_root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        owned_by_us(&root, &content_root.display().to_string())?;
        let incoming = directory(&root, INCOMING, Mode::from_raw_mode(0o700))?;
        // Only this agent's: a directory others may write to could hold their links.
        owned_by_us(&incoming, &format!("{}/{INCOMING}", content_root.display()))?;
        Ok(Self {
            root,
            incoming,
            shown: content_root.display().to_string(),
            not_taken_at: Mutex::default(),
        })
    }

    /// containerd did not take a blob written here: for a while, blobs go through
    /// `Content.Write` from their first byte (said once per pause).
    pub fn not_taken(&self) {
        let now = Instant::now();
        let mut at = self.last_not_taken();
        if !resting(*at, now) {
            tracing::info!(root = %self.shown, pause = ?NOT_TAKEN_PAUSE, "containerd does not take blobs written beside its store (its content_sharing_policy \"isolated\", or the file could not be linked): blobs go through Content.Write for a while");
        }
        *at = Some(now);
    }

    /// Whether blobs are written here now (not resting after containerd did not take one).
    pub fn in_use(&self) -> bool {
        let at = *self.last_not_taken();
        !resting(at, Instant::now())
    }

    fn last_not_taken(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.not_taken_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether containerd's local store holds the blob `hex` (in some namespace).
    pub fn holds(&self, hex: &str) -> bool {
        rustix::fs::statat(
            &self.root,
            format!("blobs/sha256/{hex}"),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .is_ok()
    }

    /// The write of blob `hex` (`size` bytes), resumed from what an earlier one left;
    /// `None` when another process writes it now.
    pub fn incoming(&self, hex: &str, size: u64) -> io::Result<Option<Incoming>> {
        // The name is checked after the lock: the holder before may have linked the file
        // into the store and removed the name meanwhile. A few tries are plenty.
        for _ in 0..4 {
            // Nothing but a regular file (or nothing) is opened: not a planted device.
            match rustix::fs::statat(&self.incoming, hex, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat)
                    if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                        != rustix::fs::FileType::RegularFile =>
                {
                    return Err(io::Error::other(format!(
                        "{}/{INCOMING}/{hex} is not a regular file",
                        self.shown
                    )));
                }
                Ok(_) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
            let fd = open_beneath(
                &self.incoming,
                hex,
                OFlags::RDWR | OFlags::CREATE,
                Mode::from_raw_mode(0o444),
            )?;
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            if !names(&self.incoming, hex, &fd) {
                continue;
            }
            let file = File::from(fd);
            let metadata = file.metadata()?;
            if !metadata.file_type().is_file() {
                return Err(io::Error::other(format!(
                    "{}/{INCOMING}/{hex} is not a regular file",
                    self.shown
                )));
            }
            if metadata.nlink() != 1 {
                // Linked into the store already (a crash between the link and the
                // removal): that inode is containerd's now; start a file of our own.
                rustix::fs::unlinkat(&self.incoming, hex, AtFlags::empty())?;
                continue;
            }
            let mut incoming = Incoming {
                file,
                hex: hex.to_owned(),
                hasher: Sha256::new(),
                len: 0,
                published: false,
            };
            if metadata.len() > size {
                incoming.truncate()?;
            } else {
                incoming.rehash(metadata.len())?;
            }
            return Ok(Some(incoming));
        }
        Err(io::Error::other(format!(
            "{}/{INCOMING}/{hex} kept changing under this process",
            self.shown
        )))
    }

    /// Make `incoming` durable and link it into containerd's store as its blob. From
    /// then on it is never written again.
    pub fn publish(&self, incoming: &mut Incoming) -> io::Result<()> {
        if incoming.file.metadata()?.len() != incoming.len {
            return Err(io::Error::other(format!(
                "{}/{INCOMING}/{} does not hold the bytes written",
                self.shown, incoming.hex
            )));
        }
        incoming.file.sync_data()?;
        incoming.published = true;
        let blobs = directory(&self.root, "blobs", Mode::from_raw_mode(0o755))?;
        let sha256 = directory(&blobs, "sha256", Mode::from_raw_mode(0o755))?;
        // The descriptor is linked, not the name: the file checked is the file linked.
        match rustix::fs::linkat(
            &incoming.file,
            "",
            &sha256,
            &incoming.hex,
            AtFlags::EMPTY_PATH,
        ) {
            // containerd (or another writer) stored it meanwhile: its blob stands.
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        rustix::fs::fsync(&sha256)?;
        Ok(())
    }

    /// A read-only descriptor of `incoming`'s file (peers follow the blob as it
    /// arrives through it; it holds neither the write nor its lock).
    pub fn reader(&self, incoming: &Incoming) -> io::Result<File> {
        let fd = open_beneath(&self.incoming, &incoming.hex, OFlags::RDONLY, Mode::empty())?;
        if !names(&self.incoming, &incoming.hex, &incoming.file) || !same_file(&fd, &incoming.file)
        {
            return Err(io::Error::other("the blob's file was replaced"));
        }
        Ok(File::from(fd))
    }

    /// Forget the write of `hex` (committed, or its bytes unwanted).
    pub fn remove(&self, hex: &str) -> io::Result<()> {
        match rustix::fs::unlinkat(&self.incoming, hex, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Remove the file of the write of `hex` unless a process holds it (a pull that
    /// failed for a full disk gives back what it wrote). Whether it was removed.
    pub fn discard(&self, hex: &str) -> io::Result<bool> {
        let fd = match open_beneath(&self.incoming, hex, OFlags::RDONLY, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err()
            || !names(&self.incoming, hex, &fd)
        {
            return Ok(false);
        }
        self.remove(hex)?;
        Ok(true)
    }

    /// Remove the files of writes no process holds that were last written before
    /// `now - STALE_AFTER` (a pull killed and never resumed), and at once the names of
    /// files linked into the store already (a pull stopped between its commit and its
    /// removal: the inode is containerd's blob, and the name would keep it after
    /// containerd's garbage collection removed it).
    pub fn remove_stale(&self, now: SystemTime) {
        let Ok(entries) = rustix::fs::Dir::read_from(&self.incoming) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if digest_hex(&format!("sha256:{name}")).is_none() {
                continue;
            }
            let Ok(fd) = open_beneath(&self.incoming, name, OFlags::RDONLY, Mode::empty()) else {
                continue;
            };
            if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err()
                || !names(&self.incoming, name, &fd)
            {
                continue;
            }
            let Ok(metadata) = File::from(fd).metadata() else {
                continue;
            };
            let linked = metadata.nlink() > 1;
            let old = metadata
                .modified()
                .is_ok_and(|modified| modified + STALE_AFTER < now);
            if (linked || old)
                && let Err(error) = self.remove(name)
            {
                tracing::debug!(%error, blob = name, "could not remove a stale incoming blob");
            }
        }
    }
}

/// One blob's file being written, locked by this process, and the hash of its bytes.
#[derive(Debug)]
pub struct Incoming {
    file: File,
    hex: String,
    hasher: Sha256,
    len: u64,
    /// Linked into containerd's store: never written again.
    published: bool,
}

impl Incoming {
    /// The blob's digest, hex.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Bytes in the file.
    pub fn written(&self) -> u64 {
        self.len
    }

    /// Append `pieces`.
    pub fn append(&mut self, pieces: &[bytes::Bytes]) -> io::Result<()> {
        self.unpublished()?;
        for piece in pieces {
            self.file.write_all_at(piece, self.len)?;
            self.hasher.update(piece);
            self.len += piece.len() as u64;
        }
        Ok(())
    }

    /// Start over, empty.
    pub fn truncate(&mut self) -> io::Result<()> {
        self.unpublished()?;
        self.file.set_len(0)?;
        self.hasher = Sha256::new();
        self.len = 0;
        Ok(())
    }

    /// Whether the bytes written hash to `hex`.
    pub fn matches(&self, hex: &str) -> bool {
        hex::encode(self.hasher.clone().finalize()) == hex
    }

    /// A descriptor of the file (read again when containerd does not take the link).
    pub fn file(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    fn unpublished(&self) -> io::Result<()> {
        match self.published {
            true => Err(io::Error::other(
                "the blob is linked into containerd's store: it is not written again",
            )),
            false => Ok(()),
        }
    }

    /// Hash the first `len` bytes an earlier write left, to go on from there.
    fn rehash(&mut self, len: u64) -> io::Result<()> {
        let mut buffer = vec![0; READ_PIECE];
        let mut at = 0;
        while at < len {
            let n = usize::try_from(len - at).map_or(READ_PIECE, |left| left.min(READ_PIECE));
            self.file.read_exact_at(&mut buffer[..n], at)?;
            self.hasher.update(&buffer[..n]);
            at += n as u64;
        }
        self.len = len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt as _;

    use bytes::Bytes;

    use super::*;

    const HEX: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"; // "hello"

    fn content_root() -> (tempfile::TempDir, DirectContent) {
        let dir = tempfile::tempdir().unwrap();
        let content = DirectContent::open(dir.path()).unwrap();
        (dir, content)
    }

    #[test]
    fn direct_writes_rest_for_a_while_after_containerd_did_not_take_one() {
        let now = Instant::now();
        assert!(!resting(None, now));
        assert!(resting(Some(now), now));
        assert!(resting(
            Some(now),
            now + NOT_TAKEN_PAUSE - Duration::from_secs(1)
        ));
        assert!(!resting(Some(now), now + NOT_TAKEN_PAUSE));
        // A clock read before the mark (another thread) is still within it.
        assert!(resting(Some(now + Duration::from_secs(1)), now));
    }

    #[test]
    fn a_blob_is_written_checked_and_linked_into_the_store() {
        let (dir, content) = content_root();
        assert!(!content.holds(HEX));
        let mut incoming = content.incoming(HEX, 5).unwrap().unwrap();
        incoming
            .append(&[Bytes::from_static(b"hel"), Bytes::from_static(b"lo")])
            .unwrap();
        assert!(incoming.matches(HEX));
        content.publish(&mut incoming).unwrap();
        // Linked: never written again, whoever asks.
        assert!(incoming.truncate().is_err());
        assert!(incoming.append(&[Bytes::from_static(b"!")]).is_err());
        content.remove(HEX).unwrap();
        assert!(content.holds(HEX));
        let blob = dir.path().join("blobs/sha256").join(HEX);
        assert_eq!(std::fs::read(&blob).unwrap(), b"hello");
        let metadata = std::fs::metadata(&blob).unwrap();
        assert_eq!(metadata.permissions().mode() & 0o777, 0o444);
        assert_eq!(metadata.nlink(), 1);
    }

    #[test]
    fn a_write_resumes_from_what_an_earlier_one_left_and_is_held_by_one_process_at_once() {
        let (_dir, content) = content_root();
        let mut first = content.incoming(HEX, 5).unwrap().unwrap();
        first.append(&[Bytes::from_static(b"he")]).unwrap();
        // Held: another writer is told so (flock is per open file, so this holds in one
        // process as across processes).
        assert!(content.incoming(HEX, 5).unwrap().is_none());
        drop(first);
        let mut again = content.incoming(HEX, 5).unwrap().unwrap();
        assert_eq!(again.written(), 2);
        again.append(&[Bytes::from_static(b"llo")]).unwrap();
        assert!(again.matches(HEX));
        // Longer than the blob: not the blob's start, begun again.
        drop(again);
        let shorter = content.incoming(HEX, 3).unwrap().unwrap();
        assert_eq!(shorter.written(), 0);
    }

    #[test]
    fn a_file_linked_into_the_store_is_never_written_again() {
        let (dir, content) = content_root();
        let mut incoming = content.incoming(HEX, 5).unwrap().unwrap();
        incoming.append(&[Bytes::from_static(b"hello")]).unwrap();
        content.publish(&mut incoming).unwrap();
        drop(incoming);
        // A crash before the name was removed: the next write starts a new file.
        let mut next = content.incoming(HEX, 5).unwrap().unwrap();
        assert_eq!(next.written(), 0);
        next.append(&[Bytes::from_static(b"junk!")]).unwrap();
        let blob = dir.path().join("blobs/sha256").join(HEX);
        assert_eq!(std::fs::read(blob).unwrap(), b"hello");
    }

    #[test]
    fn hostile_names_and_links_in_the_content_root_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        // A content root others may write to is not taken.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(DirectContent::open(dir.path()).is_err());
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        // Its incoming directory a symlink elsewhere: refused, nothing written there.
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(INCOMING)).unwrap();
        assert!(DirectContent::open(dir.path()).is_err());
        std::fs::remove_file(dir.path().join(INCOMING)).unwrap();
        let content = DirectContent::open(dir.path()).unwrap();
        // A symlink where the blob's file would be: not followed.
        let target = elsewhere.path().join("target");
        std::fs::write(&target, b"host").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(INCOMING).join(HEX)).unwrap();
        assert!(content.incoming(HEX, 5).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"host");
        // A FIFO there: refused without being opened (an open could block).
        std::fs::remove_file(dir.path().join(INCOMING).join(HEX)).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join(INCOMING).join(HEX),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(content.incoming(HEX, 5).is_err());
        assert!(digest_hex("sha256:../../etc/passwd").is_none());
        assert!(digest_hex(&format!("sha512:{HEX}")).is_none());
        assert!(digest_hex(&format!("sha256:{}", HEX.to_uppercase())).is_none());
    }

    #[test]
    fn writes_left_by_a_killed_pull_go_after_a_day_unless_held() {
        let (dir, content) = content_root();
        let held = content.incoming(HEX, 5).unwrap().unwrap();
        let other = "a".repeat(64);
        drop(content.incoming(&other, 5).unwrap().unwrap());
        // A name left linked into the store (a pull stopped after its commit) goes at
        // once; the blob stays.
        let linked = "b".repeat(64);
        let mut done = content.incoming(&linked, 0).unwrap().unwrap();
        content.publish(&mut done).unwrap();
        drop(done);
        content.remove_stale(SystemTime::now());
        let incoming = dir.path().join(INCOMING);
        assert!(!incoming.join(&linked).exists());
        assert!(dir.path().join("blobs/sha256").join(&linked).exists());
        assert!(incoming.join(&other).exists());
        let later = SystemTime::now() + STALE_AFTER + Duration::from_secs(60);
        content.remove_stale(later);
        assert!(incoming.join(HEX).exists());
        assert!(!incoming.join(&other).exists());
        drop(held);
    }
}
