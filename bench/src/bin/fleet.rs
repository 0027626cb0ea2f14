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

use rigger_bench::{report, simulated};

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use rigger_proto::v1::{ApplyRequest, GetRequest, ListRequest};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use simulated::{
    Lab, SYSTEMD_SOFT_OPEN_FILES, control_client, proc_stats, soft_open_files, wait_registered,
};

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
    let controller = simulated::controller_binary(args.controller.as_ref())?;
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
        report::FLEET.write(path, &table)?;
    }
    Ok(())
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

/// Asks for the job the bench runs.
fn the_fleet_job() -> GetRequest {
    GetRequest {
        kind: "ImagePullJob".to_owned(),
        namespace: String::new(),
        name: "fleet".to_owned(),
    }
}

async fn run(controller: &Path, nodes: usize, args: &Args) -> anyhow::Result<Row> {
    let (mut lab, ca, identity) = Lab::start(controller, args.plaintext, &[])?;
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
    let (shared, mut agents) = simulated::spawn_fleet(&endpoint, nodes, args.images);
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
