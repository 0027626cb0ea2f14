//! A real etcd for the controller's HA tests.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Daemon, PrivateCa, free_port, wait_until};

/// A single-member etcd (Debian's etcd-server) on loopback ports, data in a temporary
/// directory; stopped when dropped.
#[derive(Debug)]
pub struct Etcd {
    /// `127.0.0.1:PORT` for clients.
    pub endpoint: String,
    /// With TLS: the CA, and a client certificate and key it signed.
    pub tls: Option<EtcdClientTls>,
    _daemon: Daemon,
    _dir: tempfile::TempDir,
}

/// What a client of a TLS etcd needs (files from a private CA).
#[derive(Debug, Clone)]
pub struct EtcdClientTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Etcd {
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// An etcd serving clients over TLS only, with a certificate from a private CA, and
    /// requiring client certificates from that CA (as production etcds do).
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let scheme = if tls { "https" } else { "http" };
        let mut command = Command::new("etcd");
        command
            .args(["--name", "itest", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &format!("{scheme}://{endpoint}")])
            .args(["--advertise-client-urls", &format!("{scheme}://{endpoint}")])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("itest={peer_url}")]);
        let client_tls = tls.then(|| {
            let ca = PrivateCa::new(dir.path());
            let (server_cert, server_key) = ca.issue("etcd", "127.0.0.1", &["127.0.0.1"]);
            let (cert, key) = ca.issue("controller", "rigger-controller", &[]);
            command
                .arg("--cert-file")
                .arg(&server_cert)
                .arg("--key-file")
                .arg(&server_key)
                .arg("--trusted-ca-file")
                .arg(ca.ca_file())
                .arg("--client-cert-auth");
            EtcdClientTls {
                ca: ca.ca_file(),
                cert,
                key,
            }
        });
        let daemon = Daemon::spawn(
            command
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap()),
        );
        wait_until("etcd to serve", Duration::from_secs(30), || {
            let mut etcdctl = Command::new("etcdctl");
            etcdctl.env("ETCDCTL_API", "3");
            if let Some(tls) = &client_tls {
                etcdctl
                    .arg("--cacert")
                    .arg(&tls.ca)
                    .arg("--cert")
                    .arg(&tls.cert)
                    .arg("--key")
                    .arg(&tls.key);
            }
            etcdctl
                .args([
                    "--endpoints",
                    &format!("{scheme}://{endpoint}"),
                    "endpoint",
                    "health",
                ])
                .output()
                .ok()?
                .status
                .success()
                .then_some(())
        });
        Self {
            endpoint,
            tls: client_tls,
            _daemon: daemon,
            _dir: dir,
        }
    }
}
