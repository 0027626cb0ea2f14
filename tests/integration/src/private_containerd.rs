//! A containerd of one test's own, for faults that must not touch the shared lab.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Daemon, Lab, append_log, ctr_at, repo_root, wait_until};

/// A containerd of one test's own (the lab's configuration with its own root, state and
/// socket), for faults that must not touch the shared lab nodes: restarts, a full disk.
/// Its root may sit on a tmpfs of a given size. Stopped (and unmounted) when dropped.
#[derive(Debug)]
pub struct PrivateContainerd {
    pub address: PathBuf,
    pub root: PathBuf,
    config: PathBuf,
    log: PathBuf,
    tmpfs: bool,
    daemon: Option<Daemon>,
    _dir: tempfile::TempDir,
}

impl PrivateContainerd {
    /// `root_size`: put the root (content store and snapshots) on a tmpfs this big
    /// (`16m`), to fill it.
    pub fn start(root_size: Option<&str>) -> Self {
        Self::start_with(root_size, |config| config)
    }

    /// A containerd whose metadata store keeps each namespace's content apart
    /// (`content_sharing_policy = "isolated"`): a blob in its store is not a namespace's
    /// until written through its API.
    pub fn start_isolated() -> Self {
        Self::start_with(None, |config| {
            assert!(
                config.contains("content_sharing_policy = \"shared\""),
                "{config}"
            );
            config.replace(
                "content_sharing_policy = \"shared\"",
                "content_sharing_policy = \"isolated\"",
            )
        })
    }

    /// As [`Self::start`], the lab's configuration changed by `edit` first.
    pub fn start_with(root_size: Option<&str>, edit: impl FnOnce(String) -> String) -> Self {
        let lab = Lab::get();
        let dir = tempfile::tempdir().unwrap();
        let (root, state, opt) = (
            dir.path().join("root"),
            dir.path().join("state"),
            dir.path().join("opt"),
        );
        for path in [&root, &state, &opt] {
            std::fs::create_dir_all(path).unwrap();
        }
        if let Some(size) = root_size {
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&root)
                .status()
                .unwrap();
            assert!(mounted.success(), "mount a tmpfs at {}", root.display());
        }
        let default = Command::new("containerd")
            .args(["config", "default"])
            .output()
            .unwrap();
        let mut lab_config = Command::new("python3")
            .arg(repo_root().join("scripts/lab-containerd-config"))
            .arg("--root")
            .arg(&root)
            .arg("--state")
            .arg(&state)
            .arg("--opt")
            .arg(&opt)
            .arg("--certs-dir")
            .arg(&lab.hosts_dir)
            .arg("--sandbox-image")
            .arg(format!("{}/rigger-lab/pause:1", lab.registry))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        lab_config
            .stdin
            .take()
            .unwrap()
            .write_all(&default.stdout)
            .unwrap();
        let out = lab_config.wait_with_output().unwrap();
        assert!(out.status.success(), "lab-containerd-config");
        let config = dir.path().join("config.toml");
        std::fs::write(&config, edit(String::from_utf8(out.stdout).unwrap())).unwrap();
        let mut containerd = Self {
            address: state.join("containerd.sock"),
            root,
            config,
            log: dir.path().join("containerd.log"),
            tmpfs: root_size.is_some(),
            daemon: None,
            _dir: dir,
        };
        containerd.spawn();
        containerd
    }

    fn spawn(&mut self) {
        let log = append_log(&self.log);
        self.daemon = Some(Daemon::spawn(
            Command::new("containerd")
                .arg("--config")
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(log),
        ));
        let address = self.address.clone();
        wait_until("the private containerd", Duration::from_secs(30), || {
            Command::new("ctr")
                .arg("--address")
                .arg(&address)
                .arg("version")
                .output()
                .ok()?
                .status
                .success()
                .then_some(())
        });
    }

    /// Kill it (SIGKILL, as a crash) and start it again on the same root.
    pub fn restart(&mut self) {
        drop(self.daemon.take());
        self.spawn();
    }

    /// `ctr` against this containerd in namespace `ns`; panics on failure.
    pub fn ctr(&self, ns: &str, args: &[&str]) -> String {
        ctr_at(&self.address, ns, args)
    }
}

impl Drop for PrivateContainerd {
    fn drop(&mut self) {
        drop(self.daemon.take());
        if self.tmpfs {
            let _ = Command::new("umount").arg("-l").arg(&self.root).status();
        }
    }
}
