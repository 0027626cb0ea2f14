//! Byte ranges of one blob that arrived ahead of containerd's ingest, kept on disk.
//!
//! containerd's `Content.Write` takes a blob strictly in order, while parallel ranges
//! finish in any order. Ranges wait here instead of in memory, so the agent's memory
//! does not grow with the number of connections, and they survive the agent being
//! killed: a restarted pull continues every range where its bytes end. Ranges
//! containerd has taken are punched out, so the file holds about one window of ranges.
//!
//! One file per blob, `<algorithm>-<hex>.spool`: a header (magic, blob size, range size,
//! then for every range the number of bytes received from its start), padded to a
//! page, then the blob's bytes at their own offsets (a sparse file).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use nix::fcntl::{FallocateFlags, Flock, FlockArg, fallocate};

const MAGIC: &[u8; 8] = b"RGSPOOL1";
const PAGE: u64 = 4096;
/// Spools untouched for this long belong to pulls nobody resumed; their containerd
/// lease (and so the ingest they continue) has expired too.
pub const STALE_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

pub use crate::error::SpoolError;

/// The spool of one blob, locked by this process while open.
#[derive(Debug)]
pub struct Spool {
    file: Flock<File>,
    path: PathBuf,
    size: u64,
    range_size: u64,
    data_offset: u64,
    /// Bytes received of each range, counted from the range's start.
    received: Vec<AtomicU64>,
}

impl Spool {
    /// Open the spool of `digest` in `dir`, continuing what an earlier run left if it
    /// was for the same blob size and range size, else starting empty.
    pub fn open(dir: &Path, digest: &str, size: u64, range_size: u64) -> Result<Self, SpoolError> {
        let path = path_for(dir, digest);
        let err = |action, source| SpoolError {
            path: path.clone(),
            action,
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| err("create directory", e))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| err("open", e))?;
        // Two pulls of one blob never get here at once (containerd's ingest lock comes
        // first); the lock guards against anything else that shares the directory.
        let file = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| err("lock", std::io::Error::from(errno)))?;
        let count = size.div_ceil(range_size.max(1));
        let data_offset = (24 + 8 * count).div_ceil(PAGE) * PAGE;
        let mut spool = Self {
            file,
            path: path.clone(),
            size,
            range_size: range_size.max(1),
            data_offset,
            received: (0..count).map(|_| AtomicU64::new(0)).collect(),
        };
        if !spool.load_header().map_err(|e| err("read", e))? {
            spool.reset().map_err(|e| err("initialise", e))?;
        }
        Ok(spool)
    }

    /// Read an earlier run's header; `false` if there is none for this blob layout.
    fn load_header(&mut self) -> std::io::Result<bool> {
        let mut header = vec![0u8; self.data_offset as usize];
        if self.file.metadata()?.len() < self.data_offset + self.size {
            return Ok(false);
        }
        self.file.read_exact_at(&mut header, 0)?;
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[i..i + 8]);
            u64::from_le_bytes(b)
        };
        if &header[..8] != MAGIC || word(8) != self.size || word(16) != self.range_size {
            return Ok(false);
        }
        for (k, received) in self.received.iter().enumerate() {
            let value = word(24 + 8 * k).min(self.range_len(k as u64));
            received.store(value, Ordering::Relaxed);
        }
        Ok(true)
    }

    fn reset(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        let mut header = Vec::with_capacity(24);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&self.size.to_le_bytes());
        header.extend_from_slice(&self.range_size.to_le_bytes());
        self.file.write_all_at(&header, 0)?;
        self.file.set_len(self.data_offset + self.size)?;
        for received in &self.received {
            received.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The blob's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn range_size(&self) -> u64 {
        self.range_size
    }

    pub fn ranges(&self) -> u64 {
        self.received.len() as u64
    }

    /// Length of range `k` (the last one may be short).
    pub fn range_len(&self, k: u64) -> u64 {
        let start = k * self.range_size;
        (start + self.range_size)
            .min(self.size)
            .saturating_sub(start)
    }

    /// Bytes of range `k` present, from its start.
    pub fn received(&self, k: u64) -> u64 {
        self.received
            .get(k as usize)
            .map_or(0, |r| r.load(Ordering::Acquire))
    }

    /// Count range `k` as present up to `upto` bytes without storing them (containerd
    /// already holds them, so they will never be read from here).
    pub fn skip_to(&self, k: u64, upto: u64) -> Result<(), SpoolError> {
        if self.received(k) < upto {
            self.set_received(k, upto.min(self.range_len(k)))?;
        }
        Ok(())
    }

    /// Append `data` to range `k` (right after its received bytes).
    ///
    /// Plain blocking writes: they land in the page cache and take microseconds, less
    /// than handing them to a blocking thread would.
    pub fn append(&self, k: u64, data: &[u8]) -> Result<(), SpoolError> {
        let have = self.received(k);
        if have + data.len() as u64 > self.range_len(k) {
            return Err(self.error(
                "write",
                std::io::Error::other(format!("range {k} would exceed its length")),
            ));
        }
        let at = self.data_offset + k * self.range_size + have;
        self.file
            .write_all_at(data, at)
            .map_err(|e| self.error("write", e))?;
        // The count is written after the data: a killed agent never claims bytes it
        // did not write.
        self.set_received(k, have + data.len() as u64)
    }

    fn set_received(&self, k: u64, value: u64) -> Result<(), SpoolError> {
        self.file
            .write_all_at(&value.to_le_bytes(), 24 + 8 * k)
            .map_err(|e| self.error("write", e))?;
        // Release: whoever sees the count sees the bytes (the writer reads them back
        // while the range is still arriving).
        if let Some(r) = self.received.get(k as usize) {
            r.store(value, Ordering::Release);
        }
        Ok(())
    }

    /// The blob's bytes `offset..offset + len` (which must have been received).
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, SpoolError> {
        let mut data = vec![0u8; len];
        self.file
            .read_exact_at(&mut data, self.data_offset + offset)
            .map_err(|e| self.error("read", e))?;
        Ok(data)
    }

    /// Give range `k`'s disk space back (containerd holds its bytes now).
    pub fn discard(&self, k: u64) -> Result<(), SpoolError> {
        let start = self.data_offset + k * self.range_size;
        let len = self.range_len(k);
        fallocate(
            &*self.file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            i64::try_from(start).unwrap_or(i64::MAX),
            i64::try_from(len).unwrap_or(i64::MAX),
        )
        .map_err(|errno| self.error("free space", errno.into()))
    }

    fn error(&self, action: &'static str, source: std::io::Error) -> SpoolError {
        SpoolError {
            path: self.path.clone(),
            action,
            source,
        }
    }
}

/// Whether an earlier pull left ranges of `digest`.
pub fn exists(dir: &Path, digest: &str) -> bool {
    path_for(dir, digest).exists()
}

/// Delete the spool of `digest` (the blob is committed, or its bytes were wrong).
pub fn remove(dir: &Path, digest: &str) -> Result<(), SpoolError> {
    let path = path_for(dir, digest);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SpoolError {
            path,
            action: "remove",
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Delete spools nobody touched for [`STALE_AFTER`] and nobody holds open.
pub fn reap_stale(dir: &Path) -> Result<usize, SpoolError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(SpoolError {
                path: dir.to_owned(),
                action: "list",
                source: e,
            });
        }
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "spool") {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age > STALE_AFTER);
        if !stale {
            continue;
        }
        let Ok(file) = File::open(&path) else {
            continue;
        };
        if Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok()
            && std::fs::remove_file(&path).is_ok()
        {
            removed += 1;
        }
    }
    Ok(removed)
}

/// `sha256:abcd…` → `<dir>/sha256-abcd….spool`. Digests come from registries, so
/// anything but `[a-z0-9]+:[a-f0-9]+` is hashed instead of used as a file name.
fn path_for(dir: &Path, digest: &str) -> PathBuf {
    let safe = digest.split_once(':').is_some_and(|(algorithm, hex)| {
        !algorithm.is_empty()
            && !hex.is_empty()
            && algorithm
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
    });
    let name = if safe {
        digest.replacen(':', "-", 1)
    } else {
        use sha2::Digest;
        format!("other-{:x}", sha2::Sha256::digest(digest.as_bytes()))
    };
    dir.join(format!("{name}.spool"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef";

    #[test]
    fn ranges_are_kept_across_reopen_and_read_back_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), DIGEST, 10_000, 4096).unwrap();
        assert_eq!(spool.ranges(), 3);
        assert_eq!(spool.range_len(2), 10_000 - 8192);
        spool.append(1, &[7u8; 100]).unwrap();
        spool.append(1, &[8u8; 50]).unwrap();
        spool.append(2, &[9u8; 1808]).unwrap();
        drop(spool);

        let spool = Spool::open(dir.path(), DIGEST, 10_000, 4096).unwrap();
        assert_eq!(
            (spool.received(0), spool.received(1), spool.received(2)),
            (0, 150, 1808)
        );
        let back = spool.read(4096 + 95, 10).unwrap();
        assert_eq!(back, [7, 7, 7, 7, 7, 8, 8, 8, 8, 8]);
        assert!(
            spool.append(2, &[0u8; 1]).is_err(),
            "a range never overflows"
        );
    }

    #[test]
    fn a_different_layout_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), DIGEST, 10_000, 4096).unwrap();
        spool.append(0, &[1u8; 10]).unwrap();
        drop(spool);
        let spool = Spool::open(dir.path(), DIGEST, 10_000, 8192).unwrap();
        assert_eq!(spool.received(0), 0);
    }

    #[test]
    fn one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let _held = Spool::open(dir.path(), DIGEST, 100, 10).unwrap();
        let err = Spool::open(dir.path(), DIGEST, 100, 10).unwrap_err();
        assert_eq!(err.action, "lock");
    }

    #[test]
    fn discarded_ranges_free_their_space_and_removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), DIGEST, 1 << 20, 1 << 19).unwrap();
        spool.append(0, &vec![1u8; 1 << 19]).unwrap();
        spool.discard(0).unwrap();
        assert_eq!(spool.received(0), 1 << 19);
        drop(spool);
        remove(dir.path(), DIGEST).unwrap();
        remove(dir.path(), DIGEST).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn hostile_digests_do_not_become_paths() {
        let path = path_for(Path::new("/spool"), "sha256:../../etc/passwd");
        assert_eq!(path.parent(), Some(Path::new("/spool")));
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("other-")
        );
        assert_eq!(
            path_for(Path::new("/spool"), DIGEST),
            Path::new("/spool/sha256-0123456789abcdef.spool")
        );
    }
}
