//! A real controller and agent for benchmarks on the lab node: plaintext on loopback,
//! embedded store, logs in the work directory, both killed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rigger_proto::v1::control_client::ControlClient;
use tonic::transport::Channel;

/// A child process killed when dropped.
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Debug)]
pub struct Cluster {
    pub control: ControlClient<Channel>,
    pub agent: Killed,
    _controller: Killed,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The directory of this benchmark's binary (where the release daemons are).
pub fn own_bin_dir() -> anyhow::Result<PathBuf> {
    std::env::current_exe()?
        .parent()
        .map(Path::to_path_buf)
        .context("this binary has no directory")
}

impl Cluster {
    /// Start both; the agent is node `bench-node` on containerd `address`.
    pub async fn start(
        bin_dir: &Path,
        work: &Path,
        address: &Path,
        registry_config: &Path,
    ) -> anyhow::Result<Self> {
        let (port, health, agent_health) = (free_port()?, free_port()?, free_port()?);
        let log = |name: &str| -> anyhow::Result<Stdio> {
            Ok(std::fs::File::create(work.join(name))?.into())
        };
        let controller = Killed(
            Command::new(bin_dir.join("rigger-controller"))
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--health-listen", &format!("127.0.0.1:{health}")])
                .arg("--data-dir")
                .arg(work.join("controller"))
                .args(["--insecure-plaintext", "--heartbeat-interval", "1s"])
                .stderr(log("controller.log")?)
                .spawn()
                .context("starting rigger-controller")?,
        );
        let agent = Killed(
            Command::new(bin_dir.join("rigger-agent"))
                .arg("run")
                .arg("--address")
                .arg(address)
                .arg("--registry-config")
                .arg(registry_config)
                .arg("--state-dir")
                .arg(work.join("agent"))
                .args(["--health-listen", &format!("127.0.0.1:{agent_health}")])
                .args(["--controller", &format!("http://127.0.0.1:{port}")])
                .args(["--insecure-plaintext", "--node-name", "bench-node"])
                // The bench's containerd shares the machine's disk: only what does not fit.
                .args(["--image-fs-threshold-percent", "100"])
                .stderr(log("agent.log")?)
                .spawn()
                .context("starting rigger-agent")?,
        );
        let endpoint = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let control = loop {
            match ControlClient::connect(endpoint.clone()).await {
                Ok(client) => break client,
                Err(_) if started.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("the controller never answered"),
            }
        };
        Ok(Self {
            control,
            agent,
            _controller: controller,
        })
    }
}

/// Peak RSS of process `pid` in KiB (VmHWM).
pub fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Run `bench` in `work_dir` (a temporary folder when none is given); when it fails,
/// print the daemons' last log lines from there.
pub async fn in_work_dir(
    work_dir: Option<&Path>,
    bench: impl AsyncFnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let temporary = tempfile::tempdir()?;
    let work = work_dir.map_or_else(|| temporary.path().to_owned(), Path::to_owned);
    std::fs::create_dir_all(&work)?;
    let outcome = bench(&work).await;
    if outcome.is_err() {
        print_logs(&work);
    }
    outcome
}

/// The last lines of the controller's and agent's logs, for a failed run.
fn print_logs(work: &Path) {
    for name in ["controller.log", "agent.log"] {
        let text = std::fs::read_to_string(work.join(name)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        eprintln!("--- {name} (last lines)");
        for line in tail.iter().rev() {
            eprintln!("{line}");
        }
    }
}
