//! Finding the container runtime's socket when it is not configured (`containerd_address
//! = "auto"`), as kruise-daemon does: look for the sockets the common runtimes create
//! under the host's `/run` (mounted elsewhere in a DaemonSet).
//!
//! Rigger writes into containerd's content store and snapshots, so only containerd will
//! do; finding CRI-O or cri-dockerd instead is reported as such rather than as a missing
//! socket, since "not supported" and "not running yet" need different fixes.

use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};

/// The value of `containerd_address` that asks for detection.
pub const AUTO: &str = "auto";

/// Where detection looks by default: the host's own `/run`.
pub const DEFAULT_RUNTIME_SOCKET_DIR: &str = "/run";

/// containerd's sockets, relative to the run folder, in the order they are preferred.
const CONTAINERD_SOCKETS: &[&str] = &[
    "containerd/containerd.sock",
    // k3s and RKE2 run their own containerd.
    "k3s/containerd/containerd.sock",
];

/// Sockets of runtimes Rigger cannot drive.
const OTHER_RUNTIMES: &[(&str, &str)] = &[
    ("crio/crio.sock", "CRI-O"),
    ("cri-dockerd.sock", "cri-dockerd"),
    ("dockershim.sock", "dockershim"),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DetectError {
    #[error(
        "no containerd socket under {dir} (looked for {looked}); this node runs {runtime} \
         ({socket}), and Rigger needs containerd",
        dir = dir.display(),
        looked = CONTAINERD_SOCKETS.join(", "),
        socket = socket.display()
    )]
    UnsupportedRuntime {
        dir: PathBuf,
        runtime: &'static str,
        socket: PathBuf,
    },
    #[error(
        "no containerd socket under {dir} (looked for {looked}): is containerd running, \
         and is the host's /run mounted there?",
        dir = dir.display(),
        looked = CONTAINERD_SOCKETS.join(", ")
    )]
    NotFound { dir: PathBuf },
}

/// The containerd socket under `run_dir`, the first of the known places that holds a
/// socket.
pub fn detect(run_dir: &Path) -> Result<PathBuf, DetectError> {
    let is_socket = |path: &Path| {
        std::fs::metadata(path)
            .map(|m| m.file_type().is_socket())
            .unwrap_or(false)
    };
    if let Some(socket) = CONTAINERD_SOCKETS
        .iter()
        .map(|relative| run_dir.join(relative))
        .find(|path| is_socket(path))
    {
        return Ok(socket);
    }
    match OTHER_RUNTIMES
        .iter()
        .map(|(relative, runtime)| (run_dir.join(relative), *runtime))
        .find(|(path, _)| is_socket(path))
    {
        Some((socket, runtime)) => Err(DetectError::UnsupportedRuntime {
            dir: run_dir.to_owned(),
            runtime,
            socket,
        }),
        None => Err(DetectError::NotFound {
            dir: run_dir.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket_at(dir: &Path, relative: &str) -> std::os::unix::net::UnixListener {
        let path = dir.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::net::UnixListener::bind(path).unwrap()
    }

    #[test]
    fn finds_containerd_and_prefers_the_standard_place() {
        let dir = tempfile::tempdir().unwrap();
        let _k3s = socket_at(dir.path(), "k3s/containerd/containerd.sock");
        assert_eq!(
            detect(dir.path()).unwrap(),
            dir.path().join("k3s/containerd/containerd.sock")
        );
        let _standard = socket_at(dir.path(), "containerd/containerd.sock");
        assert_eq!(
            detect(dir.path()).unwrap(),
            dir.path().join("containerd/containerd.sock")
        );
    }

    #[test]
    fn names_a_runtime_it_cannot_drive() {
        let dir = tempfile::tempdir().unwrap();
        let _crio = socket_at(dir.path(), "crio/crio.sock");
        let error = detect(dir.path()).unwrap_err();
        assert!(
            matches!(
                error,
                DetectError::UnsupportedRuntime {
                    runtime: "CRI-O",
                    ..
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("Rigger needs containerd"));
    }

    #[test]
    fn a_plain_file_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("containerd")).unwrap();
        std::fs::write(dir.path().join("containerd/containerd.sock"), b"").unwrap();
        let error = detect(dir.path()).unwrap_err();
        assert!(matches!(error, DetectError::NotFound { .. }), "{error}");
        assert!(error.to_string().contains("is containerd running"));
    }
}
