//! The disk guard: a pull never starts what would take the image filesystem past a
//! threshold (kubelet's `imageGCHighThresholdPercent`, 85 %, by default: past it kubelet
//! deletes images, and under pressure evicts pods). Before a byte of a layer is fetched,
//! the pull adds up what it still needs — each layer's blob not in the content store, and
//! about [`INFLATE_ESTIMATE`] times it for each layer not unpacked yet — and checks it,
//! with what pulls in flight have reserved, against each filesystem it lands on.
//!
//! The decision ([`check`]) is a pure function; measuring (`statvfs`) is at the edge.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The threshold by default, as kubelet's image garbage collection starts.
pub const DEFAULT_THRESHOLD_PERCENT: u8 = 85;
/// Unpacked, a compressed layer takes about this many times its size (container image
/// layers commonly inflate 2–4×): the estimate errs on the side of the disk.
pub const INFLATE_ESTIMATE: u64 = 3;

/// A filesystem's size and what is free on it for an unprivileged writer, as `df`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub total: u64,
    pub available: u64,
}

/// Why a pull would take a filesystem past the threshold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "needs about {} on {} ({} free), which would take it past {percent}% used{}: the image filesystem's threshold",
    mib(*need), filesystem.display(), mib(*available),
    if *reserved > 0 { format!(" with {} reserved by pulls in flight", mib(*reserved)) } else { String::new() }
)]
pub struct Refusal {
    pub filesystem: PathBuf,
    pub need: u64,
    pub available: u64,
    pub reserved: u64,
    pub percent: u8,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// Whether `need` more bytes, beside `reserved` ones, keep a filesystem of `usage` at or
/// under `percent` used (used = total − available, as kubelet counts it).
pub fn check(usage: Usage, reserved: u64, need: u64, percent: u8) -> Result<(), (u64, u64)> {
    let used = usage.total.saturating_sub(usage.available);
    let limit = u128::from(usage.total) * u128::from(percent) / 100;
    let after = u128::from(used) + u128::from(reserved) + u128::from(need);
    if after > limit {
        Err((need, reserved))
    } else {
        Ok(())
    }
}

/// The node's guard: its threshold, and what pulls in flight reserved per filesystem.
#[derive(Debug, Clone)]
pub struct DiskGuard {
    percent: u8,
    reserved: Arc<Mutex<HashMap<u64, u64>>>,
}

/// Bytes a pull holds on filesystems until it ends.
#[derive(Debug)]
pub struct Reservation {
    reserved: Arc<Mutex<HashMap<u64, u64>>>,
    held: Vec<(u64, u64)>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        for (device, bytes) in &self.held {
            if let Some(total) = reserved.get_mut(device) {
                *total = total.saturating_sub(*bytes);
            }
        }
    }
}

impl DiskGuard {
    pub fn new(percent: u8) -> Self {
        Self {
            percent,
            reserved: Arc::default(),
        }
    }

    /// Reserve `needs` (directory on a filesystem → bytes) or say which filesystem would
    /// pass the threshold. A directory this process cannot see is skipped (logged).
    pub fn reserve(&self, needs: &[(PathBuf, u64)]) -> Result<Reservation, Refusal> {
        // Per filesystem: the content store and the snapshots often share one.
        let mut per_device: Vec<(u64, PathBuf, u64)> = Vec::new();
        for (dir, bytes) in needs {
            let Some(device) = device_of(dir) else {
                continue;
            };
            match per_device.iter_mut().find(|(d, _, _)| *d == device) {
                Some((_, _, total)) => *total = total.saturating_add(*bytes),
                None => per_device.push((device, dir.clone(), *bytes)),
            }
        }
        let mut reserved = self.reserved.lock().unwrap_or_else(PoisonError::into_inner);
        for (device, dir, need) in &per_device {
            let Some(usage) = usage_of(dir) else {
                continue;
            };
            let already = reserved.get(device).copied().unwrap_or(0);
            if check(usage, already, *need, self.percent).is_err() {
                return Err(Refusal {
                    filesystem: dir.clone(),
                    need: *need,
                    available: usage.available,
                    reserved: already,
                    percent: self.percent,
                });
            }
        }
        let held = per_device
            .into_iter()
            .map(|(device, _, need)| {
                let total = reserved.entry(device).or_default();
                *total = total.saturating_add(need);
                (device, need)
            })
            .collect();
        Ok(Reservation {
            reserved: self.reserved.clone(),
            held,
        })
    }
}

/// Each filesystem among `dirs` once (the first directory naming it), with used ÷ size
/// (used = total − available, as kubelet counts it). Directories that cannot be
/// measured are left out (logged).
pub fn used_ratios(dirs: &[PathBuf]) -> Vec<(PathBuf, f64)> {
    let mut seen = Vec::new();
    let mut ratios = Vec::new();
    for dir in dirs {
        let Some(device) = device_of(dir) else {
            continue;
        };
        if seen.contains(&device) {
            continue;
        }
        seen.push(device);
        if let Some(usage) = usage_of(dir) {
            ratios.push((dir.clone(), usage.used_ratio()));
        }
    }
    ratios
}

impl Usage {
    /// Used ÷ size (0 for a filesystem of no size).
    pub fn used_ratio(self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.total.saturating_sub(self.available) as f64 / self.total as f64
    }
}

fn device_of(dir: &Path) -> Option<u64> {
    match std::fs::metadata(dir) {
        Ok(meta) => Some(meta.dev()),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "the disk guard cannot see this directory of containerd's: not measured");
            None
        }
    }
}

fn usage_of(dir: &Path) -> Option<Usage> {
    match crate::stack::unverified::Room::of(dir) {
        Ok(room) => Some(Usage {
            available: room.bytes.0,
            total: room.bytes.1,
        }),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "the disk guard cannot measure this filesystem");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn used_ratio_counts_what_is_not_available_and_survives_an_empty_filesystem() {
        let usage = Usage {
            total: 100 * MIB,
            available: 30 * MIB,
        };
        assert!((usage.used_ratio() - 0.7).abs() < 1e-9);
        let empty = Usage {
            total: 0,
            available: 0,
        };
        assert!(empty.used_ratio().abs() < f64::EPSILON);
    }

    #[test]
    fn each_filesystem_is_measured_once_and_unseen_directories_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let ratios = used_ratios(&[a.clone(), b, dir.path().join("missing")]);
        assert_eq!(ratios.len(), 1, "{ratios:?}");
        assert_eq!(ratios[0].0, a);
        assert!((0.0..=1.0).contains(&ratios[0].1));
    }

    #[test]
    fn a_pull_fits_up_to_the_threshold_and_not_a_byte_past_it() {
        let usage = Usage {
            total: 100 * MIB,
            available: 30 * MIB,
        };
        // 70 MiB used; 85 % of 100 MiB is 85 MiB: 15 MiB fit.
        assert!(check(usage, 0, 15 * MIB, 85).is_ok());
        assert_eq!(check(usage, 0, 15 * MIB + 1, 85), Err((15 * MIB + 1, 0)));
        // What pulls in flight reserved counts.
        assert!(check(usage, 10 * MIB, 5 * MIB, 85).is_ok());
        assert!(check(usage, 10 * MIB, 5 * MIB + 1, 85).is_err());
    }

    #[test]
    fn a_filesystem_already_past_the_threshold_takes_nothing_more() {
        let usage = Usage {
            total: 100 * MIB,
            available: 10 * MIB,
        };
        assert!(check(usage, 0, 1, 85).is_err());
        assert!(check(usage, 0, 0, 85).is_err());
        assert!(check(usage, 0, 10 * MIB, 100).is_ok());
    }

    #[test]
    fn reservations_are_held_until_the_pull_ends() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let usage = usage_of(dir.path()).unwrap_or_else(|| panic!("statvfs"));
        let used = usage.total - usage.available;
        let room = usage.total / 100 * 99 - used;
        let guard = DiskGuard::new(99);
        let first = guard
            .reserve(&[(dir.path().to_owned(), room / 2)])
            .unwrap_or_else(|e| panic!("{e}"));
        let refused = guard
            .reserve(&[(dir.path().to_owned(), room)])
            .err()
            .unwrap_or_else(|| panic!("a second pull fitted beside the first"));
        assert_eq!(refused.reserved, room / 2);
        assert!(
            refused.to_string().contains("reserved by pulls in flight"),
            "{refused}"
        );
        drop(first);
        assert!(guard.reserve(&[(dir.path().to_owned(), room / 2)]).is_ok());
    }
}
