//! `rigger-bench-sidecar`: requests lost while a SidecarSet upgrades the sidecar that
//! serves them — hot upgrade against cold upgrade, same run, on the lab node.
//!
//! Starts a real controller and agent, two SidecarSets of the lab's test sidecar
//! (`scripts/lab image sidecar`: an HTTP server that shares its port by SO_REUSEPORT and
//! drains on SIGTERM), one HotUpgrade and one ColdUpgrade, each injected into its own
//! pod. Then, for each: a load generator of this binary opens a new connection per
//! request at a fixed rate against the sidecar's port, the SidecarSet's image moves from
//! `rigger-lab/sidecar:1` to `:2`, and the load goes on until the upgrade is complete
//! and a little after. Every request that did not get `200` is counted as failed.

use rigger_bench::cluster;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use rigger_proto::v1::control_client::ControlClient;
use rigger_proto::v1::{ApplyRequest, GetRequest};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(about = "Requests lost during a SidecarSet hot upgrade, against a cold upgrade")]
struct Args {
    #[arg(long, env = "RIGGER_LAB_CONTAINERD_ADDRESS")]
    address: PathBuf,
    #[arg(long, env = "RIGGER_LAB_HOSTS_DIR")]
    registry_config: PathBuf,
    /// The lab registry (host:port).
    #[arg(long, env = "RIGGER_LAB_REGISTRY")]
    registry: String,
    /// Requests per second.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Load before the upgrade starts and after it completed.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pad: Duration,
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

const IDLE: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

fn sidecar_set(name: &str, registry: &str, version: u32, port: u16, hot: bool) -> String {
    let upgrade = if hot {
        serde_json::json!({"upgradeType": "HotUpgrade",
            "hotUpgradeEmptyImage": format!("{registry}/rigger-lab/sidecar-empty:1")})
    } else {
        serde_json::json!({"upgradeType": "ColdUpgrade"})
    };
    serde_json::json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"bench-sidecar": name}},
            "containers": [{
                "name": "proxy",
                "image": format!("{registry}/rigger-lab/sidecar:{version}"),
                "command": ["/usr/local/bin/rigger-lab-sidecar", "--port", port.to_string()],
                // The state migration: the new sidecar counts as started once it serves.
                "lifecycle": {"postStart": {"exec": {"command":
                    ["sh", "-c", "until [ -e /tmp/listening ]; do sleep 0.02; done"]}}},
                "upgradeStrategy": upgrade,
            }],
        },
    })
    .to_string()
}

fn pod(name: &str, set: &str, registry: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"bench-sidecar": set}},
        "spec": {
            "hostNetwork": true, "terminationGracePeriodSeconds": 10,
            "containers": [{"name": "app", "image": format!("{registry}/rigger-lab/busybox:1"),
                "command": ["sh", "-c", IDLE]}],
        },
    })
    .to_string()
}

async fn apply(control: &mut ControlClient<Channel>, json: String) -> anyhow::Result<()> {
    control
        .apply(ApplyRequest {
            json,
            dry_run: false,
        })
        .await
        .map(drop)
        .map_err(|s| anyhow::anyhow!("{}", s.message()))
}

async fn pod_object(control: &mut ControlClient<Channel>, name: &str) -> serde_json::Value {
    control
        .get(GetRequest {
            kind: "pod".to_owned(),
            namespace: "default".to_owned(),
            name: name.to_owned(),
        })
        .await
        .ok()
        .and_then(|o| serde_json::from_str(&o.into_inner().json).ok())
        .unwrap_or_default()
}

/// Whether each container named in `want` runs the image given and is ready.
fn runs(pod: &serde_json::Value, want: &[(&str, &str)]) -> bool {
    let statuses = pod["status"]["containerStatuses"].as_array();
    want.iter().all(|(name, image)| {
        statuses
            .and_then(|s| s.iter().find(|c| c["name"] == *name))
            .is_some_and(|c| c["image"] == *image && c["ready"] == true)
    })
}

async fn wait_for(
    control: &mut ControlClient<Channel>,
    pod: &str,
    want: &[(&str, &str)],
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if runs(&pod_object(control, pod).await, want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pod {pod} never ran {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One request: a new connection, `GET /`, a `200` answer.
async fn request(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), attempt).await,
        Ok(Ok(true))
    )
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    failed: AtomicU64,
}

/// Requests at `rate` per second against `port` until `stop` is set.
fn load(
    port: u16,
    rate: u64,
    counts: Arc<Counts>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut requests = tokio::task::JoinSet::new();
        while !stop.load(Ordering::SeqCst) {
            ticker.tick().await;
            let counts = counts.clone();
            requests.spawn(async move {
                counts.sent.fetch_add(1, Ordering::Relaxed);
                if !request(port).await {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                }
            });
            while requests.try_join_next().is_some() {}
        }
        while requests.join_next().await.is_some() {}
    })
}

/// What one upgrade under load counted.
struct Outcome {
    /// Over the whole load (pads included).
    sent: u64,
    failed: u64,
    /// Between the SidecarSet change and the upgrade's completion.
    sent_during: u64,
    failed_during: u64,
    took: f64,
}

/// Upgrade `set` to `:2` under load.
async fn upgrade_under_load(
    control: &mut ControlClient<Channel>,
    args: &Args,
    set: &str,
    pod_name: &str,
    port: u16,
    hot: bool,
) -> anyhow::Result<Outcome> {
    let registry = &args.registry;
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let generator = load(port, args.rate, counts.clone(), stop.clone());
    tokio::time::sleep(args.pad).await;
    let started = Instant::now();
    let at_start = (
        counts.sent.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    apply(control, sidecar_set(set, registry, 2, port, hot)).await?;
    let (v2, empty) = (
        format!("{registry}/rigger-lab/sidecar:2"),
        format!("{registry}/rigger-lab/sidecar-empty:1"),
    );
    let done: Vec<(&str, &str)> = if hot {
        vec![("proxy-2", v2.as_str()), ("proxy-1", empty.as_str())]
    } else {
        vec![("proxy", v2.as_str())]
    };
    wait_for(control, pod_name, &done, Duration::from_secs(120)).await?;
    let took = started.elapsed().as_secs_f64();
    let at_end = (
        counts.sent.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    tokio::time::sleep(args.pad).await;
    stop.store(true, Ordering::SeqCst);
    generator.await.context("the load generator")?;
    Ok(Outcome {
        sent: counts.sent.load(Ordering::Relaxed),
        failed: counts.failed.load(Ordering::Relaxed),
        sent_during: at_end.0 - at_start.0,
        failed_during: at_end.1 - at_start.1,
        took,
    })
}

async fn run(args: &Args, work: &Path) -> anyhow::Result<()> {
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => cluster::own_bin_dir()?,
    };
    let cluster =
        cluster::Cluster::start(&bin_dir, work, &args.address, &args.registry_config).await?;
    let mut control = cluster.control.clone();
    let registry = &args.registry;
    let (hot_port, cold_port) = (19601, 19602);
    // The node must be ready before pods can be placed.
    let started = Instant::now();
    loop {
        apply(
            &mut control,
            sidecar_set("bench-hot", registry, 1, hot_port, true),
        )
        .await?;
        apply(
            &mut control,
            sidecar_set("bench-cold", registry, 1, cold_port, false),
        )
        .await?;
        match apply(&mut control, pod("bench-hot-pod", "bench-hot", registry)).await {
            Ok(()) => break,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
    apply(&mut control, pod("bench-cold-pod", "bench-cold", registry)).await?;
    let v1 = format!("{registry}/rigger-lab/sidecar:1");
    wait_for(
        &mut control,
        "bench-hot-pod",
        &[("proxy-1", &v1)],
        Duration::from_secs(120),
    )
    .await?;
    wait_for(
        &mut control,
        "bench-cold-pod",
        &[("proxy", &v1)],
        Duration::from_secs(120),
    )
    .await?;

    let hot = upgrade_under_load(
        &mut control,
        args,
        "bench-hot",
        "bench-hot-pod",
        hot_port,
        true,
    )
    .await?;
    let cold = upgrade_under_load(
        &mut control,
        args,
        "bench-cold",
        "bench-cold-pod",
        cold_port,
        false,
    )
    .await?;
    let rss = cluster::peak_rss_kib(cluster.agent.0.id());
    for name in ["bench-hot-pod", "bench-cold-pod"] {
        let _ = control
            .delete(rigger_proto::v1::DeleteRequest {
                kind: "pod".to_owned(),
                namespace: "default".to_owned(),
                name: name.to_owned(),
            })
            .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "| upgrade | requests during the upgrade (at {} /s) | failed | whole load (± {} pads) | failed | upgrade took | agent peak RSS |\n|---|---|---|---|---|---|---|",
        args.rate,
        humantime::format_duration(args.pad)
    );
    println!(
        "| hot (HotUpgrade) | {} | **{}** | {} | {} | {:.1} s | {} MiB |",
        hot.sent_during,
        hot.failed_during,
        hot.sent,
        hot.failed,
        hot.took,
        rss / 1024
    );
    println!(
        "| cold (ColdUpgrade, for contrast) | {} | {} | {} | {} | {:.1} s | |",
        cold.sent_during, cold.failed_during, cold.sent, cold.failed, cold.took
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    cluster::in_work_dir(args.work_dir.as_deref(), async |work| {
        run(&args, work).await
    })
    .await
}
