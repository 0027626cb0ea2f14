//! The fleet the controller benches run under: a real `rigger-controller` (mTLS, its
//! own data directory and PKI, started as systemd starts it) and simulated agents — each
//! a real agent-link session over its own TLS connection, registering with a small
//! inventory, sending heartbeats and answering tasks at once. Shared by
//! `rigger-bench-fleet` and `rigger-bench-api-load`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rigger_proto::v1::agent_link_client::AgentLinkClient;
use rigger_proto::v1::control_client::ControlClient;
use rigger_proto::v1::{
    AgentMessage, Heartbeat, InventoryReport, NodeInventory, Register, RuntimeInfo, TaskPhase,
    TaskStatus, agent_message, controller_message,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint, Identity};

/// The controller's resident and peak memory (bytes), and CPU time used, from /proc.
pub fn proc_stats(pid: u32) -> anyhow::Result<(u64, u64, Duration)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = crate::machine::process_ticks(&stat).map_or(0, |(_, ticks)| ticks);
    let cpu = crate::machine::cpu_time(ticks);
    Ok((field("VmRSS:"), field("VmHWM:"), cpu))
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A lab PKI (via `rigger-controller certs`) plus a wildcard agent certificate.
pub fn pki(controller: &Path, dir: &Path) -> anyhow::Result<(Vec<u8>, Identity)> {
    let out = dir.join("pki");
    let status = Command::new(controller)
        .arg("certs")
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("rigger-controller certs failed");
    }
    let ca_pem = std::fs::read_to_string(out.join("ca.pem"))?;
    let identity = agent_identity(&out)?;
    Ok((ca_pem.into_bytes(), identity))
}

/// A client certificate for every simulated agent (`*.bench.rigger`, the names
/// [`session`] registers), signed by the CA in `pki` (`ca.pem`, `ca-key.pem`, as
/// `rigger-controller certs` writes them).
pub fn agent_identity(pki: &Path) -> anyhow::Result<Identity> {
    let ca_pem = std::fs::read_to_string(pki.join("ca.pem"))?;
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca-key.pem"))?)?;
    let ca = rcgen::CertificateParams::from_ca_cert_pem(&ca_pem)?.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec!["*.bench.rigger".to_owned()])?;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    Ok(Identity::from_pem(cert.pem(), key.serialize_pem()))
}

/// The name simulated agent `node` registers as.
pub fn node_name(node: usize) -> String {
    format!("node-{node:05}.bench.rigger")
}

/// The controller's soft open-files limit, from /proc.
pub fn soft_open_files(pid: u32) -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .context("no open-files limit in /proc/PID/limits")
}

/// A controller with its PKI and data directory, which can be restarted in place.
#[derive(Debug)]
pub struct Lab {
    pub dir: tempfile::TempDir,
    pub binary: PathBuf,
    plaintext: bool,
    pub child: Child,
    pub address: String,
    pub health: String,
    pub token: String,
    /// More controller flags (its store, say).
    extra: Vec<String>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Lab {
    pub fn start(
        binary: &Path,
        plaintext: bool,
        extra: &[String],
    ) -> anyhow::Result<(Self, Vec<u8>, Identity)> {
        let dir = tempfile::tempdir()?;
        let (ca, identity) = pki(binary, dir.path())?;
        let address = format!("127.0.0.1:{}", free_port()?);
        let health = format!("127.0.0.1:{}", free_port()?);
        let token = std::fs::read_to_string(dir.path().join("pki/tokens.csv"))?
            .lines()
            .find(|l| l.ends_with(",admin"))
            .and_then(|l| l.split(',').next())
            .context("no admin token")?
            .to_owned();
        let child = spawn_controller(binary, dir.path(), &address, &health, plaintext, extra)?;
        let lab = Self {
            dir,
            binary: binary.to_owned(),
            plaintext,
            child,
            address,
            health,
            token,
            extra: extra.to_vec(),
        };
        lab.wait_ready()?;
        Ok((lab, ca, identity))
    }

    /// Until the controller listens and says it is ready (`/readyz`): on a store whose
    /// replicas elect a leader, only once it leads — agents registering before would be
    /// told "not the leader".
    pub fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&self.address).is_err() || !self.ready() {
            if Instant::now() > deadline {
                bail!(
                    "the controller was not listening and ready on {} within 30 s",
                    self.address
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// `GET /readyz` on the health address answers 200.
    fn ready(&self) -> bool {
        use std::io::{Read as _, Write as _};
        let Ok(mut stream) = std::net::TcpStream::connect(&self.health) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        if stream
            .write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
    }

    /// SIGTERM, wait for the exit (how long it took), start a new process in its place.
    pub fn restart(&mut self) -> anyhow::Result<Duration> {
        let stopping = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.child.id());
        }
        self.child.wait()?;
        let stop = stopping.elapsed();
        self.child = spawn_controller(
            &self.binary,
            self.dir.path(),
            &self.address,
            &self.health,
            self.plaintext,
            &self.extra,
        )?;
        Ok(stop)
    }
}

/// The soft open-files limit systemd starts services with.
pub const SYSTEMD_SOFT_OPEN_FILES: u64 = 1024;

/// `rigger-controller` as its unit runs it, but with systemd's default soft open-files
/// limit (1024) at exec: `prlimit` (util-linux) sets it and execs the controller, so the
/// pid is the controller's.
pub fn spawn_controller(
    binary: &Path,
    dir: &Path,
    address: &str,
    health: &str,
    plaintext: bool,
    extra: &[String],
) -> anyhow::Result<Child> {
    let pki = dir.join("pki");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("controller.log"))?;
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--nofile={SYSTEMD_SOFT_OPEN_FILES}:"))
        .arg("--")
        .arg(binary);
    if plaintext {
        command.arg("--insecure-plaintext");
    } else {
        command
            .arg("--tls-cert-file")
            .arg(pki.join("controller.pem"))
            .arg("--tls-key-file")
            .arg(pki.join("controller-key.pem"))
            .arg("--client-ca-file")
            .arg(pki.join("ca.pem"));
    }
    command
        .args(["--listen", address])
        .args(["--health-listen", health])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--tokens-file")
        .arg(pki.join("tokens.csv"))
        .args(["--log-level", "warn"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("prlimit (util-linux) runs the controller")
}

/// What every simulated agent shares.
#[derive(Debug)]
pub struct Shared {
    /// Registrations acknowledged, reconnections included.
    pub registered: AtomicUsize,
    pub tasks: AtomicU64,
    pub failures: AtomicUsize,
    /// The controller is being restarted: a lost session is reconnected, not a failure.
    pub reconnect: AtomicBool,
}

pub fn inventory(node: usize, images: usize) -> NodeInventory {
    NodeInventory {
        runtime: Some(RuntimeInfo {
            containerd_version: "1.6.20".to_owned(),
            cri_runtime_name: "containerd".to_owned(),
            cri_runtime_version: "1.6.20".to_owned(),
            cri_api_version: "v1".to_owned(),
            root_dir: "/var/lib/containerd".to_owned(),
            ..RuntimeInfo::default()
        }),
        images: (0..images)
            .map(|i| rigger_proto::v1::Image {
                namespace: "k8s.io".to_owned(),
                name: format!("registry.example.com/team-{i}/service-{}:v{i}", node % 50),
                digest: format!("sha256:{:064x}", node * 10 + i),
                media_type: "application/vnd.oci.image.index.v1+json".to_owned(),
                size: 50 << 20,
            })
            .collect(),
        ..NodeInventory::default()
    }
}

/// One agent: sessions with the controller, reconnected as the real agent does once the
/// bench restarts the controller.
pub async fn agent(
    endpoint: Endpoint,
    node: usize,
    images: usize,
    shared: Arc<Shared>,
    handshake: tokio::sync::OwnedSemaphorePermit,
) -> anyhow::Result<()> {
    let mut handshake = Some(handshake);
    let mut backoff =
        rigger_daemon::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    loop {
        let result = session(
            &endpoint,
            node,
            images,
            &shared,
            &mut handshake,
            &mut backoff,
        )
        .await;
        if !shared.reconnect.load(Ordering::Relaxed) {
            return result;
        }

        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// One session: register, heartbeat, answer tasks at once, until the stream ends.
pub async fn session(
    endpoint: &Endpoint,
    node: usize,
    images: usize,
    shared: &Shared,
    handshake: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    backoff: &mut rigger_daemon::backoff::Backoff,
) -> anyhow::Result<()> {
    let channel = endpoint.connect().await?;
    let node_name = node_name(node);
    let (tx, rx) = mpsc::channel(8);
    tx.send(AgentMessage {
        message: Some(agent_message::Message::Register(Register {
            node_name: node_name.clone(),
            labels: [("bench".to_owned(), "fleet".to_owned())].into(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            inventory: None,
            tasks: Vec::new(),
            peer_address: String::new(),
            // As the agent does: the inventory beside the session, not on it.
            inventory_follows: true,
        })),
    })
    .await?;
    let mut client = AgentLinkClient::new(channel);
    let mut inbound = client
        .clone()
        .session(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let (interval, session) = match inbound.message().await?.and_then(|m| m.message) {
        Some(controller_message::Message::RegisterAck(ack)) => (
            Duration::from_secs(u64::from(ack.heartbeat_interval_seconds.max(1))),
            ack.session,
        ),
        _ => bail!("no RegisterAck"),
    };
    client
        .report_inventory(InventoryReport {
            node_name: node_name.clone(),
            session,
            inventory: Some(inventory(node, images)),
        })
        .await?;
    shared.registered.fetch_add(1, Ordering::Relaxed);
    backoff.reset();
    drop(handshake.take());
    // Spread heartbeats over the interval, as real agents started at different times.
    let mut ticker = tokio::time::interval_at(
        tokio::time::Instant::now() + interval.mul_f64(fastrand::f64()),
        interval,
    );
    let mut sequence = 0;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                sequence += 1;
                tx.send(AgentMessage {
                    message: Some(agent_message::Message::Heartbeat(Heartbeat { sequence, inventory: None })),
                }).await?;
            }
            message = inbound.message() => match message?.and_then(|m| m.message) {
                Some(controller_message::Message::Task(task)) => {
                    shared.tasks.fetch_add(1, Ordering::Relaxed);
                    tx.send(AgentMessage {
                        message: Some(agent_message::Message::TaskStatus(TaskStatus {
                            id: task.id,
                            phase: TaskPhase::Succeeded.into(),
                            bytes_done: 200 << 20,
                            bytes_total: 200 << 20,
                            message: String::new(),
                            image_digest: format!("sha256:{:064x}", 1),
                            ..TaskStatus::default()
                        })),
                    }).await?;
                }
                Some(_) => {}
                None => return Ok(()),
            },
        }
    }
}

/// Until `shared` counts `target` registrations; how long that took.
pub async fn wait_registered(
    shared: &Shared,
    target: usize,
    nodes: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while shared.registered.load(Ordering::Relaxed) < target {
        if shared.failures.load(Ordering::Relaxed) > 0 {
            bail!("{} agents failed", shared.failures.load(Ordering::Relaxed));
        }
        if started.elapsed() > Duration::from_secs(600) {
            let done = shared.registered.load(Ordering::Relaxed) + nodes - target;
            bail!("only {done} of {nodes} registered");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

pub async fn control_client(
    endpoint: &Endpoint,
    token: &str,
) -> anyhow::Result<
    ControlClient<
        tonic::service::interceptor::InterceptedService<
            Channel,
            impl FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + use<>,
        >,
    >,
> {
    let channel: Channel = endpoint.connect().await?;
    let token: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse()?;
    Ok(
        ControlClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
            Ok(request)
        })
        .max_decoding_message_size(1 << 30),
    )
}

/// The controller binary a bench runs: `given`, else `rigger-controller` beside the
/// bench's own binary.
pub fn controller_binary(given: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(path) => Ok(path.clone()),
        None => Ok(std::env::current_exe()?
            .parent()
            .context("no directory for this binary")?
            .join("rigger-controller")),
    }
}

/// `nodes` simulated agents, each with `images` in its inventory, registering with
/// `endpoint` (at most 256 handshakes in flight): what they share, and their tasks.
pub fn spawn_fleet(
    endpoint: &Endpoint,
    nodes: usize,
    images: usize,
) -> (Arc<Shared>, tokio::task::JoinSet<()>) {
    let shared = Arc::new(Shared {
        registered: AtomicUsize::new(0),
        tasks: AtomicU64::new(0),
        failures: AtomicUsize::new(0),
        reconnect: AtomicBool::new(false),
    });
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let mut agents = tokio::task::JoinSet::new();
    for node in 0..nodes {
        let (endpoint, shared, gate) = (endpoint.clone(), shared.clone(), gate.clone());
        agents.spawn(async move {
            let Ok(permit) = gate.acquire_owned().await else {
                return;
            };
            if let Err(e) = agent(endpoint, node, images, shared.clone(), permit).await
                && shared.failures.fetch_add(1, Ordering::Relaxed) < 3
            {
                eprintln!("agent {node}: {e:#}");
            }
        });
    }
    (shared, agents)
}
