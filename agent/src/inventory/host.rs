//! The host side of the inventory: CPU, memory, and the filesystem under containerd.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sysinfo::{CpuRefreshKind, System};

use super::{FilesystemInfo, HostInfo};

/// CPU, memory and the filesystem holding `containerd_root` (or `/`).
pub fn host_info(containerd_root: Option<&Path>) -> HostInfo {
    let (cpus, memory_total_bytes, memory_available_bytes) = match System::new() {
        Ok(mut system) => {
            system.refresh_cpu_list(CpuRefreshKind::nothing());
            system.refresh_memory();
            (
                system.cpus().len(),
                system.total_memory(),
                system.available_memory(),
            )
        }
        Err(error) => {
            tracing::warn!(%error, "cannot read CPU and memory");
            (0, 0, 0)
        }
    };
    let load_average = System::load_average()
        .map(|l| [l.one, l.five, l.fifteen])
        .unwrap_or([0.0; 3]);
    HostInfo {
        hostname: System::host_name().ok(),
        kernel_version: System::kernel_version().ok(),
        cpus,
        load_average,
        memory_total_bytes,
        memory_available_bytes,
        filesystem: filesystem_of(containerd_root.unwrap_or(Path::new("/"))),
    }
}

/// The mount holding `path` (longest mount point that prefixes it) and its usage.
fn filesystem_of(path: &Path) -> Option<FilesystemInfo> {
    let mounts = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .ok()?;
    let mount = mounts
        .into_iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len())?;
    let stat = nix::sys::statvfs::statvfs(path).ok()?;
    let fragment = stat.fragment_size();
    Some(FilesystemInfo {
        mount_point: mount.mount_point.display().to_string(),
        fs_type: mount.fs_type,
        total_bytes: stat.blocks().saturating_mul(fragment),
        available_bytes: stat.blocks_available().saturating_mul(fragment),
    })
}

/// Bytes allocated under `dir` like `du -sx`: hard links counted once, other
/// filesystems mounted below (running containers' rootfs) not entered.
pub fn disk_usage(dir: &Path) -> std::io::Result<u64> {
    let root = std::fs::symlink_metadata(dir)?;
    let device = root.dev();
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            // Entries can vanish under a running containerd (GC, removed snapshots).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if current == dir => return Err(e),
            Err(_) => continue,
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != device {
                continue;
            }
            if meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total.saturating_add(root.blocks().saturating_mul(512)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_counts_hardlinks_once() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![7u8; 64 * 1024];
        std::fs::write(dir.path().join("a"), &data).unwrap();
        let single = disk_usage(dir.path()).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        assert_eq!(disk_usage(dir.path()).unwrap(), single);
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/c"), &data).unwrap();
        assert!(disk_usage(dir.path()).unwrap() >= single + 64 * 1024);
    }

    #[test]
    fn host_info_reads_this_machine() {
        let info = host_info(None);
        assert!(info.cpus >= 1);
        assert!(info.memory_total_bytes > 0);
        let fs = info.filesystem.expect("root filesystem");
        assert_eq!(fs.mount_point, "/");
        assert!(fs.total_bytes > 0);
    }
}
