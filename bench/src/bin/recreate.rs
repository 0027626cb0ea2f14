//! `rigger-bench-recreate`: how long a container recreate takes, against deleting and
//! re-creating the whole pod, in the same run on the lab's containerd.
//!
//! Starts a real `rigger-controller` (embedded store, plaintext on loopback) and a
//! `rigger-agent` on the lab node, applies a one-container pod (no preStop, zero grace,
//! a process that exits on SIGTERM), then alternates:
//! - **recreate**: apply a ContainerRecreateRequest for the container;
//! - **pod**: delete the pod and apply it again (new sandbox and container).
//!
//! Each latency runs from just before the first request to the moment CRI shows the new
//! container running (the benchmark polls CRI itself every 2 ms, so the controller's and
//! the agent's status reporting are not part of the measurement). Reports medians, the
//! ratio, and the agent's peak RSS.

use rigger_bench::cluster;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerFilter, ContainerState, ContainerStateValue, ListContainersRequest,
    ListPodSandboxRequest, PodSandboxFilter,
};
use rigger_proto::v1::{ApplyRequest, DeleteRequest, GetRequest};
use rigger_runtime::{DEFAULT_CONNECT_TIMEOUT, Runtime};
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(about = "Container recreate latency against deleting and re-creating the pod")]
struct Args {
    /// The lab node's containerd socket.
    #[arg(long, env = "RIGGER_LAB_CONTAINERD_ADDRESS")]
    address: PathBuf,
    /// Its registry configuration (hosts.toml directory).
    #[arg(long, env = "RIGGER_LAB_HOSTS_DIR")]
    registry_config: PathBuf,
    /// The pod's image.
    #[arg(long, env = "RIGGER_LAB_BENCH_IMAGE")]
    image: String,
    /// Measurements of each kind (the median of these is reported).
    #[arg(long, default_value_t = 21)]
    runs: usize,
    /// Directory with rigger-controller and rigger-agent [default: this binary's].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Append the results to this Markdown file.
    #[arg(long)]
    write: Option<PathBuf>,
    /// Keep the controller's and agent's logs here [default: a temporary directory].
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

const POD: &str = "bench-recreate";

fn pod_json(image: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.05; done"],
            }],
        },
    })
    .to_string()
}

fn crr_json(name: &str) -> String {
    serde_json::json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "podName": POD,
            "containers": [{"name": "app"}],
            "strategy": {"terminationGracePeriodSeconds": 0},
            "ttlSecondsAfterFinished": 5,
        },
    })
    .to_string()
}

/// The running `app` containers of the benchmark pod (old and new may overlap).
async fn running(cri: &mut RuntimeServiceClient<Channel>) -> anyhow::Result<Vec<String>> {
    let containers = cri
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                state: Some(ContainerStateValue {
                    state: ContainerState::ContainerRunning as i32,
                }),
                label_selector: [
                    ("rigger.dev/pod-name".to_owned(), POD.to_owned()),
                    ("rigger.dev/container-name".to_owned(), "app".to_owned()),
                ]
                .into(),
                ..ContainerFilter::default()
            }),
        })
        .await?
        .into_inner()
        .containers;
    Ok(containers.into_iter().map(|c| c.id).collect())
}

/// Wait until a running container not in `before` shows up; its id.
async fn new_container(
    cri: &mut RuntimeServiceClient<Channel>,
    before: &[String],
    timeout: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(id) = running(cri)
            .await?
            .into_iter()
            .find(|id| !before.contains(id))
        {
            return Ok(id);
        }
        if Instant::now() > deadline {
            bail!("no new running container within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Sandboxes of the benchmark pod, ready or not.
async fn sandboxes(cri: &mut RuntimeServiceClient<Channel>) -> anyhow::Result<usize> {
    Ok(cri
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: [("rigger.dev/pod-name".to_owned(), POD.to_owned())].into(),
                ..PodSandboxFilter::default()
            }),
        })
        .await?
        .into_inner()
        .items
        .len())
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    cluster::in_work_dir(args.work_dir.as_deref(), async |work| {
        run(&args, work).await
    })
    .await
}

async fn run(args: &Args, work: &Path) -> anyhow::Result<()> {
    if args.runs < 1 {
        bail!("--runs must be at least 1");
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => cluster::own_bin_dir()?,
    };
    let cluster =
        cluster::Cluster::start(&bin_dir, work, &args.address, &args.registry_config).await?;
    let agent = &cluster.agent;
    let mut control = cluster.control.clone();
    let runtime = Runtime::connect(&args.address, DEFAULT_CONNECT_TIMEOUT).await?;
    let mut cri = RuntimeServiceClient::new(runtime.channel());
    // The node must be ready before a pod can be placed.
    let started = Instant::now();
    let _first = loop {
        let applied = control
            .apply(ApplyRequest {
                json: pod_json(&args.image),
                dry_run: false,
            })
            .await;
        if applied.is_ok() {
            break new_container(&mut cri, &[], Duration::from_secs(120)).await?;
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the pod was never placed: {applied:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let (mut recreates, mut pods) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        // Recreate the container.
        let name = format!("bench-{run}");
        let before = running(&mut cri).await?;
        let t0 = Instant::now();
        control
            .apply(ApplyRequest {
                json: crr_json(&name),
                dry_run: false,
            })
            .await
            .context("applying the recreate request")?;
        new_container(&mut cri, &before, Duration::from_secs(60)).await?;
        recreates.push(t0.elapsed());
        // Let the request complete before the pod is replaced under it.
        let started = Instant::now();
        loop {
            let object = control
                .get(GetRequest {
                    kind: "crr".to_owned(),
                    namespace: "default".to_owned(),
                    name: name.clone(),
                })
                .await?
                .into_inner()
                .json;
            if object.contains("\"Completed\"") {
                break;
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("recreate {name} never completed: {object}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Delete the pod, wait until it is gone (as `kubectl delete` does: a pod's name
        // is free again only then), and create it again.
        let before = running(&mut cri).await?;
        let t0 = Instant::now();
        control
            .delete(DeleteRequest {
                kind: "pod".to_owned(),
                namespace: "default".to_owned(),
                name: POD.to_owned(),
            })
            .await
            .context("deleting the pod")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while sandboxes(&mut cri).await? > 0 {
            if Instant::now() > deadline {
                bail!("the deleted pod's sandbox never went away");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        control
            .apply(ApplyRequest {
                json: pod_json(&args.image),
                dry_run: false,
            })
            .await
            .context("applying the pod again")?;
        new_container(&mut cri, &before, Duration::from_secs(60)).await?;
        pods.push(t0.elapsed());
        eprintln!(
            "run {}: recreate {}, delete+create pod {}",
            run + 1,
            ms(*recreates.last().unwrap_or(&Duration::ZERO)),
            ms(*pods.last().unwrap_or(&Duration::ZERO))
        );
    }
    let _ = control
        .delete(DeleteRequest {
            kind: "pod".to_owned(),
            namespace: "default".to_owned(),
            name: POD.to_owned(),
        })
        .await;
    // The agent stops the pod before it is killed.
    let started = Instant::now();
    while !running(&mut cri).await?.is_empty() && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rss = cluster::peak_rss_kib(agent.0.id());
    let (recreate, pod) = (median(&mut recreates), median(&mut pods));
    let ratio = recreate.as_secs_f64() / pod.as_secs_f64();
    let report = format!(
        "| {} | {} | {} | {:.2} | {} MiB |\n",
        args.runs,
        ms(recreate),
        ms(pod),
        ratio,
        rss / 1024
    );
    println!(
        "| runs | recreate (median) | delete + re-create pod (median) | ratio | agent peak RSS |\n|---|---|---|---|---|\n{report}"
    );
    if let Some(path) = &args.write {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
        write!(file, "{report}")?;
    }
    Ok(())
}
