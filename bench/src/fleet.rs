//! `rigger-bench-fleet`: the controller under a fleet of simulated agents.
//!
//! For each fleet size it starts a real `rigger-controller` (mTLS, embedded store), opens
//! that many agent-link streams over loopback from this process — each a real gRPC
//! session over its own TLS connection, registering with a small inventory, sending
//! heartbeats at the controller's interval and answering tasks at once — and measures:
//! how long the fleet takes to register, the controller's RSS and CPU while the fleet
//! only sends heartbeats, the time for an ImagePullJob over every node with
//! `parallelism: 1000` to complete, with peak RSS, and a controller restart (SIGTERM, a
//! new process on the same data directory) until every agent has registered again, the
//! agents reconnecting with the real agent's jittered backoff.
//!
//! The controller runs under the limits its systemd unit gives it before its own raise:
//! a soft open-files limit of 1024 (systemd's default), so the fleet holds only if the
//! controller raises it to the hard limit itself.
//!
//! The agents use one wildcard client certificate (`*.bench.rigger`, signed by the lab
//! CA), so the controller's check of the node name against the certificate is exercised
//! without issuing thousands of certificates.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use rigger_proto::v1::agent_link_client::AgentLinkClient;
use rigger_proto::v1::control_client::ControlClient;
use rigger_proto::v1::{
    AgentMessage, ApplyRequest, GetRequest, Heartbeat, ListRequest, NodeInventory, Register,
    RuntimeInfo, TaskPhase, TaskStatus, agent_message, controller_message,
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-bench-fleet",
    about = "The controller under simulated agents"
)]
struct Args {
    /// Fleet sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    nodes: Vec<usize>,
    /// The job's parallelism.
    #[arg(long, default_value_t = 1000)]
    parallelism: usize,
    /// How long the heartbeat-only steady state is sampled.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    steady: Duration,
    /// The controller binary [default: rigger-controller next to this one].
    #[arg(long)]
    controller: Option<PathBuf>,
    /// Write the results into this markdown file (its fleet section).
    #[arg(long)]
    write: Option<PathBuf>,
    /// Images in each simulated agent's inventory.
    #[arg(long, default_value_t = 10)]
    images: usize,
    /// No TLS between agents and controller (`insecure_plaintext`), to see what TLS costs.
    #[arg(long)]
    plaintext: bool,
}

/// One fleet size's results.
#[derive(Debug)]
struct Row {
    nodes: usize,
    register: Duration,
    steady_rss: u64,
    steady_cpu: f64,
    job: Duration,
    job_cpu: Duration,
    peak_rss: u64,
    tasks: u64,
    /// The controller's soft open-files limit at start, and after its raise.
    open_files: (u64, u64),
    restart: Restart,
}

/// A controller restart under the whole fleet.
#[derive(Debug)]
struct Restart {
    /// From SIGTERM to the old process's exit.
    stop: Duration,
    /// From the new process's start until every agent registered again.
    reregister: Duration,
    /// The new controller's CPU time and peak RSS over that time.
    cpu: Duration,
    peak_rss: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // This process holds a connection per simulated agent.
    rigger_daemon::limits::raise_open_files_limit()?;
    let controller = match &args.controller {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory for this binary")?
            .join("rigger-controller"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &nodes in &args.nodes {
        eprintln!("== {nodes} simulated agents");
        let row = runtime.block_on(run(&controller, nodes, &args))?;
        eprintln!("{row:?}");
        rows.push(row);
    }
    let table = render(&rows, &args);
    print!("{table}");
    if let Some(path) = &args.write {
        write_section(path, &table)?;
    }
    Ok(())
}

const BEGIN: &str = "<!-- fleet: written by rigger-bench-fleet -->";
const END: &str = "<!-- fleet: end -->";

fn write_section(path: &Path, table: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let section = format!("{BEGIN}\n{table}{END}\n");
    let updated = match (text.find(BEGIN), text.find(END)) {
        (Some(start), Some(end)) if end > start => {
            format!(
                "{}{section}{}",
                &text[..start],
                &text[end + END.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{}\n{section}", text.trim_end()),
    };
    std::fs::write(path, updated).with_context(|| format!("cannot write {}", path.display()))
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

fn render(rows: &[Row], args: &Args) -> String {
    let mut out = String::from(
        "## Controller under a simulated fleet\n\nReproduce with:\n\n```sh\ncargo build --release -p rigger-controller -p rigger-bench\n",
    );
    out.push_str(&format!(
        "target/release/rigger-bench-fleet --nodes {} --parallelism {} --steady {} --write BENCHMARKS.md\n```\n\n",
        args.nodes.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        args.parallelism,
        humantime::format_duration(args.steady)
    ));
    out.push_str("| agents | all registered | RSS, heartbeats only | CPU, heartbeats only | ImagePullJob over all (parallelism 1000) | controller CPU during the job | peak RSS | tasks sent |\n|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.1} s | **{}** | {:.1} % of a core | **{:.2} s** | {:.2} s | {} | {} |\n",
            r.nodes,
            r.register.as_secs_f64(),
            mib(r.steady_rss),
            r.steady_cpu * 100.0,
            r.job.as_secs_f64(),
            r.job_cpu.as_secs_f64(),
            mib(r.peak_rss),
            r.tasks,
        ));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && last.nodes > first.nodes
    {
        let scale = last.nodes as f64 / first.nodes as f64;
        out.push_str(&format!(
            "\nFrom {} to {} agents (x{scale:.0}): job time x{:.1}, steady RSS x{:.1}, heartbeat CPU x{:.1}.\n",
            first.nodes,
            last.nodes,
            last.job.as_secs_f64() / first.job.as_secs_f64().max(1e-9),
            last.steady_rss as f64 / first.steady_rss.max(1) as f64,
            last.steady_cpu / first.steady_cpu.max(1e-9),
        ));
    }
    out.push_str("\nA controller restart under the fleet (SIGTERM; a new process on the same data directory and address; agents reconnect with the agent's backoff, 0.5 s doubling to 30 s, jittered):\n\n| agents | stop (SIGTERM to exit) | all registered again | controller CPU meanwhile | peak RSS meanwhile | open files, soft limit at start → after the raise |\n|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.1} s | **{:.1} s** | {:.1} s | {} | {} → {} |\n",
            r.nodes,
            r.restart.stop.as_secs_f64(),
            r.restart.reregister.as_secs_f64(),
            r.restart.cpu.as_secs_f64(),
            mib(r.restart.peak_rss),
            r.open_files.0,
            r.open_files.1,
        ));
    }
    out.push_str("\nEach agent is a real agent-link session (its own TLS connection, mTLS with the node name checked against the certificate) from one bench process on the same 2 cores as the controller; heartbeats every 10 s (the default), node timeout 30 s, embedded store; the controller is started with a soft open-files limit of 1024, as systemd starts services, and raises it itself. Targets: 10,000 agents held with controller RSS ≤ 512 MiB, the 10,000-node job complete in ≤ 10 s, growth no worse than linear.\n\n");
    out
}

/// The controller's resident and peak memory (bytes), and CPU time used, from /proc.
fn proc_stats(pid: u32) -> anyhow::Result<(u64, u64, Duration)> {
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
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let hz = 100; // USER_HZ on Linux
    let cpu = Duration::from_millis((ticks(11) + ticks(12)) * 1000 / hz);
    Ok((field("VmRSS:"), field("VmHWM:"), cpu))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A lab PKI (via `rigger-controller certs`) plus a wildcard agent certificate.
fn pki(controller: &Path, dir: &Path) -> anyhow::Result<(Vec<u8>, Identity)> {
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
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(out.join("ca-key.pem"))?)?;
    let ca = rcgen::CertificateParams::from_ca_cert_pem(&ca_pem)?.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(vec!["*.bench.rigger".to_owned()])?;
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    Ok((
        ca_pem.into_bytes(),
        Identity::from_pem(cert.pem(), key.serialize_pem()),
    ))
}

/// The controller's soft open-files limit, from /proc.
fn soft_open_files(pid: u32) -> anyhow::Result<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .context("no open-files limit in /proc/PID/limits")
}

/// A controller with its PKI and data directory, which can be restarted in place.
struct Lab {
    dir: tempfile::TempDir,
    binary: PathBuf,
    plaintext: bool,
    child: Child,
    address: String,
    health: String,
    token: String,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Lab {
    fn start(binary: &Path, plaintext: bool) -> anyhow::Result<(Self, Vec<u8>, Identity)> {
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
        let child = spawn_controller(binary, dir.path(), &address, &health, plaintext)?;
        let lab = Self {
            dir,
            binary: binary.to_owned(),
            plaintext,
            child,
            address,
            health,
            token,
        };
        lab.wait_listening()?;
        Ok((lab, ca, identity))
    }

    fn wait_listening(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&self.address).is_err() {
            if Instant::now() > deadline {
                bail!("the controller did not listen on {}", self.address);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// SIGTERM, wait for the exit (how long it took), start a new process in its place.
    fn restart(&mut self) -> anyhow::Result<Duration> {
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
        )?;
        Ok(stop)
    }
}

/// The soft open-files limit systemd starts services with.
const SYSTEMD_SOFT_OPEN_FILES: u64 = 1024;

/// `rigger-controller` as its unit runs it, but with systemd's default soft open-files
/// limit (1024) at exec: `prlimit` (util-linux) sets it and execs the controller, so the
/// pid is the controller's.
fn spawn_controller(
    binary: &Path,
    dir: &Path,
    address: &str,
    health: &str,
    plaintext: bool,
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
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("prlimit (util-linux) runs the controller")
}

/// What every simulated agent shares.
struct Shared {
    /// Registrations acknowledged, reconnections included.
    registered: AtomicUsize,
    tasks: AtomicU64,
    failures: AtomicUsize,
    /// The controller is being restarted: a lost session is reconnected, not a failure.
    reconnect: AtomicBool,
}

fn inventory(node: usize, images: usize) -> NodeInventory {
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
async fn agent(
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
async fn session(
    endpoint: &Endpoint,
    node: usize,
    images: usize,
    shared: &Shared,
    handshake: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    backoff: &mut rigger_daemon::backoff::Backoff,
) -> anyhow::Result<()> {
    let channel = endpoint.connect().await?;
    let (tx, rx) = mpsc::channel(8);
    tx.send(AgentMessage {
        message: Some(agent_message::Message::Register(Register {
            node_name: format!("node-{node:05}.bench.rigger"),
            labels: [("bench".to_owned(), "fleet".to_owned())].into(),
            agent_version: "bench".to_owned(),
            inventory: Some(inventory(node, images)),
            tasks: Vec::new(),
            peer_address: String::new(),
        })),
    })
    .await?;
    let mut inbound = AgentLinkClient::new(channel)
        .session(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let interval = match inbound.message().await?.and_then(|m| m.message) {
        Some(controller_message::Message::RegisterAck(ack)) => {
            Duration::from_secs(u64::from(ack.heartbeat_interval_seconds.max(1)))
        }
        _ => bail!("no RegisterAck"),
    };
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
async fn wait_registered(shared: &Shared, target: usize, nodes: usize) -> anyhow::Result<Duration> {
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

async fn control_client(
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

/// Asks for the job the bench runs.
fn the_fleet_job() -> GetRequest {
    GetRequest {
        kind: "ImagePullJob".to_owned(),
        namespace: String::new(),
        name: "fleet".to_owned(),
    }
}

async fn run(controller: &Path, nodes: usize, args: &Args) -> anyhow::Result<Row> {
    let (mut lab, ca, identity) = Lab::start(controller, args.plaintext)?;
    let pid = lab.child.id();
    let scheme = if args.plaintext { "http" } else { "https" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{}", lab.address))?
        .connect_timeout(Duration::from_secs(30));
    let mut control_endpoint = Endpoint::from_shared(format!("{scheme}://{}", lab.address))?;
    if !args.plaintext {
        endpoint = endpoint.tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca.clone()))
                .identity(identity)
                .domain_name("localhost"),
        )?;
        control_endpoint = control_endpoint.tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost"),
        )?;
    }
    let shared = Arc::new(Shared {
        registered: AtomicUsize::new(0),
        tasks: AtomicU64::new(0),
        failures: AtomicUsize::new(0),
        reconnect: AtomicBool::new(false),
    });

    // Register the fleet, at most 256 handshakes in flight.
    let gate = Arc::new(Semaphore::new(256));
    let mut agents = tokio::task::JoinSet::new();
    for node in 0..nodes {
        let (endpoint, shared, gate) = (endpoint.clone(), shared.clone(), gate.clone());
        let images = args.images;
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
    let register = wait_registered(&shared, nodes, nodes).await?;
    let open_files = (SYSTEMD_SOFT_OPEN_FILES, soft_open_files(pid)?);

    let mut control = control_client(&control_endpoint, &lab.token).await?;
    let known = control
        .list(ListRequest {
            kind: "Node".to_owned(),
            ..ListRequest::default()
        })
        .await?
        .into_inner()
        .items
        .len();
    if known != nodes {
        bail!("the controller knows {known} nodes, not {nodes}");
    }

    // Steady state: heartbeats only.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, _, cpu0) = proc_stats(pid)?;
    let t0 = Instant::now();
    tokio::time::sleep(args.steady).await;
    let (steady_rss, _, cpu1) = proc_stats(pid)?;
    let steady_cpu = (cpu1 - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();

    // The job over every node.
    let job = format!(
        r#"{{"apiVersion":"rigger.dev/v1alpha1","kind":"ImagePullJob","metadata":{{"name":"fleet"}},"spec":{{"image":"registry.example.com/app:1","parallelism":{},"selector":{{"matchLabels":{{"bench":"fleet"}}}},"imagePullPolicy":"Always"}}}}"#,
        args.parallelism
    );
    let (_, _, cpu_before) = proc_stats(pid)?;
    let applied = Instant::now();
    control
        .apply(ApplyRequest {
            json: job,
            dry_run: false,
        })
        .await?;
    let status = loop {
        let object = control.get(the_fleet_job()).await?.into_inner();
        let value: serde_json::Value = serde_json::from_str(&object.json)?;
        if value["status"]["completionTime"].is_string() {
            break value["status"].clone();
        }
        if applied.elapsed() > Duration::from_secs(300) {
            bail!("the job did not complete: {}", value["status"]["message"]);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let job_time = applied.elapsed();
    let (_, peak_rss, cpu_after) = proc_stats(pid)?;
    if status["succeeded"].as_u64() != Some(nodes as u64) {
        bail!("the job ended with {}", status["message"]);
    }

    // A restart under the whole fleet.
    shared.reconnect.store(true, Ordering::Relaxed);
    let before = shared.registered.load(Ordering::Relaxed);
    let stop = tokio::task::block_in_place(|| lab.restart())?;
    let restarted = Instant::now();
    let new_pid = lab.child.id();
    let reregister = wait_registered(&shared, before + nodes, nodes).await?;
    let reregister = reregister.max(restarted.elapsed());
    let (_, restart_peak_rss, restart_cpu) = proc_stats(new_pid)?;
    let mut control = control_client(&control_endpoint, &lab.token).await?;
    let job = control.get(the_fleet_job()).await?.into_inner();
    let job: serde_json::Value = serde_json::from_str(&job.json)?;
    if job["status"]["succeeded"].as_u64() != Some(nodes as u64) {
        bail!("after the restart the job shows {}", job["status"]);
    }
    agents.abort_all();
    drop(lab);
    Ok(Row {
        nodes,
        register,
        steady_rss,
        steady_cpu,
        job: job_time,
        job_cpu: cpu_after - cpu_before,
        peak_rss,
        tasks: shared.tasks.load(Ordering::Relaxed),
        open_files,
        restart: Restart {
            stop,
            reregister,
            cpu: restart_cpu,
            peak_rss: restart_peak_rss,
        },
    })
}
