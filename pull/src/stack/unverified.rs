//! What a layer's bytes may write before containerd has checked them against the
//! layer's digest. A layer unpacks while it downloads; until the blob is committed,
//! its bytes are anybody's (a peer's above all: another node, outside input), and a
//! decompression bomb would fill the disk before the digest check fails. So while
//! unverified, the unpacked output stays within [`FLOOR`] plus [`RATIO`] times the
//! compressed bytes read (real layers inflate 2–5 times), and the snapshot's filesystem
//! keeps what the disk guard's threshold leaves of its space ([`RESERVE_PERCENT`] at
//! kubelet's 85 %: its default image filesystem eviction threshold, 15 % free; nothing
//! when the threshold is 100 %) and [`INODE_RESERVE_PERCENT`] of its inodes free (above
//! kubelet's 5 %). Past either, the streaming unpack stops, its snapshot
//! goes, and the layer unpacks from the content store once containerd has verified it
//! (a legitimate layer that inflates more, say a large file of zeros, costs only that
//! second unpack). Tar entries cost at least 512 bytes of output each, so the output
//! bound bounds them too.
//!
//! The bound is measured on the applier's own thread, as it reads: nothing is written
//! past it (the applier stops at its next read).

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Output always allowed before the ratio counts.
pub const FLOOR: u64 = 64 << 20;
/// Output allowed per compressed byte.
pub const RATIO: u64 = 16;
/// Free space the filesystem keeps by default, in percent of its size.
pub const RESERVE_PERCENT: u64 = 15;

/// The free space (percent) unverified bytes leave: what the disk guard's `threshold`
/// (percent used) leaves; [`RESERVE_PERCENT`] without a guard.
pub fn reserve_percent(threshold: Option<u8>) -> u64 {
    threshold.map_or(RESERVE_PERCENT, |t| 100 - u64::from(t.min(100)))
}
/// Free inodes the filesystem keeps, in percent of its inodes.
pub const INODE_RESERVE_PERCENT: u64 = 10;
/// How often (in output bytes) the filesystem's free space is read: every 32 MiB, or
/// every 2 MiB of tar headers and small files (each entry costs 512 bytes of output, so
/// inodes go by the thousand per MiB).
const DISK_CHECK_EVERY: u64 = 2 << 20;

/// Why unverified output was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error(
        "the layer inflated to {out} bytes from {compressed} unverified bytes (at most {FLOOR} + {RATIO}x before its digest is checked)"
    )]
    Inflation { out: u64, compressed: u64 },
    #[error(
        "the snapshot's filesystem has {available} of {total} bytes free, under the {reserve_percent}% kept while a layer is unverified"
    )]
    Disk {
        available: u64,
        total: u64,
        reserve_percent: u64,
    },
    #[error(
        "the snapshot's filesystem has {available} of {total} inodes free, under the {INODE_RESERVE_PERCENT}% kept while a layer is unverified"
    )]
    Inodes { available: u64, total: u64 },
}

/// A filesystem's free and total space and inodes, as just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub bytes: (u64, u64),
    pub inodes: (u64, u64),
}

impl Room {
    /// The room of the filesystem holding `dir`, for an unprivileged writer (as `df`).
    pub fn of(dir: &std::path::Path) -> nix::Result<Self> {
        let stat = nix::sys::statvfs::statvfs(dir)?;
        let block = stat.fragment_size();
        Ok(Self {
            bytes: (
                stat.blocks_available().saturating_mul(block),
                stat.blocks().saturating_mul(block),
            ),
            inodes: (stat.files_available(), stat.files()),
        })
    }
}

/// The budget decision, pure: `out` bytes written from `compressed` bytes read, and
/// the filesystem's room when just read.
pub fn check(
    out: u64,
    compressed: u64,
    room: Option<Room>,
    reserve_percent: u64,
) -> Result<(), OverBudget> {
    if out > FLOOR.saturating_add(RATIO.saturating_mul(compressed)) {
        return Err(OverBudget::Inflation { out, compressed });
    }
    let Some(Room { bytes, inodes }) = room else {
        return Ok(());
    };
    let short = |(available, total): (u64, u64), percent: u64| {
        available.saturating_mul(100) < total.saturating_mul(percent)
    };
    if short(bytes, reserve_percent) {
        return Err(OverBudget::Disk {
            available: bytes.0,
            total: bytes.1,
            reserve_percent,
        });
    }
    // A filesystem without inode accounting (some report 0 of 0) has none to keep.
    if inodes.1 > 0 && short(inodes, INODE_RESERVE_PERCENT) {
        return Err(OverBudget::Inodes {
            available: inodes.0,
            total: inodes.1,
        });
    }
    Ok(())
}

/// One streaming unpack's account: compressed bytes read, whether containerd verified
/// the blob (then nothing is bounded), and whether the bound stopped it.
#[derive(Debug)]
pub struct Account {
    compressed: AtomicU64,
    verified: AtomicBool,
    stopped: AtomicBool,
    /// Free space (percent) the filesystem keeps while the bytes are unverified.
    reserve_percent: u64,
}

impl Default for Account {
    fn default() -> Self {
        Self::keeping(RESERVE_PERCENT)
    }
}

impl Account {
    /// An account whose unverified bytes leave `reserve_percent` of the filesystem free.
    pub fn keeping(reserve_percent: u64) -> Self {
        Self {
            compressed: AtomicU64::new(0),
            verified: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            reserve_percent,
        }
    }

    pub fn read_compressed(&self, bytes: usize) {
        self.compressed.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// containerd accepted the blob's digest: its bytes are the layer's.
    pub fn verified(&self) {
        self.verified.store(true, Ordering::Relaxed);
    }

    /// The bound stopped the unpack: it goes, and the layer unpacks from the store.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }
}

/// The uncompressed stream, held to the account's bound while unverified.
#[derive(Debug)]
pub struct Bounded<R> {
    inner: R,
    account: Arc<Account>,
    /// The snapshot's directory: its filesystem's free space is read.
    root: PathBuf,
    out: u64,
    next_disk_check: u64,
}

impl<R> Bounded<R> {
    pub fn new(inner: R, account: Arc<Account>, root: PathBuf) -> Self {
        Self {
            inner,
            account,
            root,
            out: 0,
            next_disk_check: 0,
        }
    }

    fn room(&self) -> Option<Room> {
        Room::of(&self.root).ok()
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out = self.out.saturating_add(n as u64);
        if self.account.verified.load(Ordering::Relaxed) {
            return Ok(n);
        }
        let disk = (self.out >= self.next_disk_check).then(|| {
            self.next_disk_check = self.out.saturating_add(DISK_CHECK_EVERY);
            self.room()
        });
        let compressed = self.account.compressed.load(Ordering::Relaxed);
        if let Err(over) = check(
            self.out,
            compressed,
            disk.flatten(),
            self.account.reserve_percent,
        ) {
            if !self.account.stopped.swap(true, Ordering::Relaxed) {
                tracing::warn!(reason = %over, "unverified bytes may write no more: the streaming unpack stops (the layer unpacks from the content store once containerd verified it)");
            }
            return Err(std::io::Error::other(over));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unverified_output_stays_within_the_floor_and_the_ratio() {
        assert!(check(FLOOR, 0, None, RESERVE_PERCENT).is_ok());
        assert_eq!(
            check(FLOOR + 1, 0, None, RESERVE_PERCENT),
            Err(OverBudget::Inflation {
                out: FLOOR + 1,
                compressed: 0
            })
        );
        assert!(check(FLOOR + RATIO * 1000, 1000, None, RESERVE_PERCENT).is_ok());
        assert!(check(FLOOR + RATIO * 1000 + 1, 1000, None, RESERVE_PERCENT).is_err());
        // Nothing overflows at the edges.
        assert!(check(u64::MAX, u64::MAX, None, RESERVE_PERCENT).is_ok());
    }

    #[test]
    fn a_filling_disk_or_inode_table_stops_unverified_output() {
        let room = |bytes: u64, inodes: u64| Room {
            bytes: (bytes, 100),
            inodes: (inodes, 100),
        };
        assert!(check(1, 1, Some(room(16, 11)), RESERVE_PERCENT).is_ok());
        assert_eq!(
            check(1, 1, Some(room(14, 50)), RESERVE_PERCENT),
            Err(OverBudget::Disk {
                available: 14,
                total: 100,
                reserve_percent: RESERVE_PERCENT
            })
        );
        assert_eq!(
            check(1, 1, Some(room(50, 9)), RESERVE_PERCENT),
            Err(OverBudget::Inodes {
                available: 9,
                total: 100
            })
        );
        // No inode accounting: nothing to keep.
        let no_inodes = Room {
            bytes: (50, 100),
            inodes: (0, 0),
        };
        assert!(check(1, 1, Some(no_inodes), RESERVE_PERCENT).is_ok());
    }

    #[test]
    fn the_reserve_is_what_the_disk_guards_threshold_leaves() {
        assert_eq!(reserve_percent(Some(85)), 15);
        assert_eq!(reserve_percent(Some(100)), 0);
        assert_eq!(reserve_percent(None), RESERVE_PERCENT);
        let room = Room {
            bytes: (8, 100),
            inodes: (50, 100),
        };
        // 8 % free: past kubelet's 15 %, within a guard at 90 % (10 % kept) no more.
        assert!(check(1, 1, Some(room), reserve_percent(Some(85))).is_err());
        assert!(check(1, 1, Some(room), reserve_percent(Some(90))).is_err());
        assert!(check(1, 1, Some(room), reserve_percent(Some(95))).is_ok());
        assert!(check(1, 1, Some(room), reserve_percent(Some(100))).is_ok());
    }

    /// A gzip'd tar whose one file is `zeros` bytes of zeros, cut at `size` bytes.
    fn bomb(zeros: u64, size: usize) -> Vec<u8> {
        use std::io::Write as _;
        let mut header = tar::Header::new_gnu();
        header.set_path("zeros").unwrap_or_else(|e| panic!("{e}"));
        header.set_size(zeros);
        header.set_mode(0o644);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_cksum();
        let header = header.as_bytes().to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&header).unwrap_or_else(|e| panic!("{e}"));
        let block = vec![0u8; 1 << 20];
        while gz.get_ref().len() < size {
            gz.write_all(&block).unwrap_or_else(|e| panic!("{e}"));
        }
        let mut bytes = gz.finish().unwrap_or_else(|e| panic!("{e}"));
        bytes.truncate(size);
        bytes
    }

    #[test]
    fn a_bomb_unpacked_into_a_snapshot_stops_at_the_bound() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join("fs");
        std::fs::create_dir(&root).unwrap_or_else(|e| panic!("{e}"));
        let compressed = bomb(64 << 30, 1 << 20);
        let account = Arc::new(Account::default());
        let counted = Counted(std::io::Cursor::new(compressed), account.clone());
        let inflated =
            crate::stack::decompress::decompress(crate::media::Compression::Gzip, counted)
                .unwrap_or_else(|e| panic!("{e}"));
        let bounded = Bounded::new(inflated, account.clone(), root.clone());
        let target = rigger_layer::ApplyTarget {
            root: root.clone(),
            lowers: Vec::new(),
            bottom: false,
        };
        let applied = rigger_layer::apply_layer(bounded, &target);
        assert!(account.stopped(), "{applied:?}");
        let written = std::fs::metadata(root.join("zeros"))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(written <= FLOOR + RATIO * (1 << 20), "{written}");
    }

    /// Counts what is read into the account, as the applier's channel does.
    struct Counted<R>(R, Arc<Account>);

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.read_compressed(n);
            Ok(n)
        }
    }

    #[test]
    fn a_bomb_is_stopped_at_the_bound_and_a_verified_layer_is_not() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let zeros = std::io::repeat(0).take(FLOOR * 2);
        let account = Arc::new(Account::default());
        account.read_compressed(1000);
        let mut bounded = Bounded::new(zeros, account.clone(), dir.path().to_owned());
        let read = std::io::copy(&mut bounded, &mut std::io::sink());
        assert!(read.is_err());
        assert!(account.stopped());
        assert!(bounded.out <= FLOOR + RATIO * 1000 + (64 << 10));

        let zeros = std::io::repeat(0).take(FLOOR * 2);
        let account = Arc::new(Account::default());
        account.verified();
        let mut bounded = Bounded::new(zeros, account.clone(), dir.path().to_owned());
        assert_eq!(
            std::io::copy(&mut bounded, &mut std::io::sink()).ok(),
            Some(FLOOR * 2)
        );
        assert!(!account.stopped());
    }
}
