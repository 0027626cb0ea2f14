//! `rigger-bench-api-load`: what Rigger asks of a Kubernetes API server as the fleet
//! grows. A real controller on the lab's API server (`scripts/lab-k8s`) with N simulated
//! agents (real agent-link sessions, as `rigger-bench-fleet` runs them) and N Node
//! objects; the API server's own request counters (`apiserver_request_total`, and the
//! watches it holds, `apiserver_longrunning_requests`) are read before and after each
//! phase: the fleet registering, the steady state, and an ImagePullJob over every node
//! applied with kubectl.
//!
//! Agents never talk to the API server (they keep their link to the controller, which is
//! the only API client), so what is counted is the controller's load; the job is
//! followed through the controller's own API, not the API server's, so that following
//! it adds nothing to the count.

use rigger_bench::{report, simulated};

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use rigger_proto::v1::GetRequest;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use simulated::{Lab, control_client, wait_registered};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-bench-api-load",
    about = "Rigger's load on a Kubernetes API server"
)]
struct Args {
    /// Fleet sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    nodes: Vec<usize>,
    /// How long the steady state (heartbeats only) is sampled.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    steady: Duration,
    /// The lab's Kubernetes settings [default: $RIGGER_LAB_DIR/k8s/env, from
    /// `scripts/lab-k8s up`].
    #[arg(long)]
    k8s_env: Option<PathBuf>,
    /// The controller binary [default: rigger-controller next to this one].
    #[arg(long)]
    controller: Option<PathBuf>,
    /// Write the results into this markdown file (its API-load section).
    #[arg(long)]
    write: Option<PathBuf>,
    /// The controller's `write_node_images`: measure with and without each node's
    /// NodeImage written [default: both].
    #[arg(long, value_delimiter = ',', default_value = "false,true")]
    write_node_images: Vec<bool>,
}

/// Requests the API server counted, by verb and resource.
type Counts = BTreeMap<String, u64>;

#[derive(Debug)]
struct Row {
    nodes: usize,
    node_images: bool,
    register: Counts,
    steady: Counts,
    steady_seconds: f64,
    watches: u64,
    job: Counts,
    job_time: Duration,
}

struct Kubectl {
    binary: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    fn from_env(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "{}: is the lab's API server up (scripts/lab-k8s up)?",
                path.display()
            )
        })?;
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .map(PathBuf::from)
                .with_context(|| format!("{}: no {key}", path.display()))
        };
        Ok(Self {
            binary: value("RIGGER_LAB_KUBECTL")?,
            kubeconfig: value("RIGGER_LAB_KUBECONFIG")?,
        })
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        let mut child = Command::new(&self.binary)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(input) = stdin
            && let Some(mut pipe) = child.stdin.take()
        {
            pipe.write_all(input.as_bytes())?;
        }
        drop(child.stdin.take());
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Requests counted so far by verb (WATCH as the watches held now), from the
    /// API server's metrics.
    fn counts(&self) -> anyhow::Result<(Counts, u64)> {
        let metrics = self.run(&["get", "--raw", "/metrics"], None)?;
        let mut counts = Counts::new();
        let mut watches = 0;
        for line in metrics.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value: f64 = value.parse().unwrap_or(0.0);
            let label = |name: &str| {
                series
                    .split(&format!("{name}=\""))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("")
                    .to_owned()
            };
            if series.starts_with("apiserver_request_total{") && label("verb") != "WATCH" {
                let resource = match label("subresource").as_str() {
                    "" => label("resource"),
                    sub => format!("{}/{sub}", label("resource")),
                };
                *counts
                    .entry(format!("{} {resource}", label("verb")))
                    .or_default() += value as u64;
            } else if series.starts_with("apiserver_longrunning_requests{")
                && label("verb") == "WATCH"
            {
                watches += value as u64;
            }
        }
        Ok((counts, watches))
    }
}

fn difference(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(verb, n)| {
            (
                verb.clone(),
                n.saturating_sub(before.get(verb).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn total(counts: &Counts) -> u64 {
    counts.values().sum()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rigger_daemon::limits::raise_open_files_limit()?;
    let controller = simulated::controller_binary(args.controller.as_ref())?;
    let env = args.k8s_env.clone().unwrap_or_else(|| {
        PathBuf::from(std::env::var("RIGGER_LAB_DIR").unwrap_or_else(|_| "/tmp/rigger-lab".into()))
            .join("k8s/env")
    });
    let kubectl = Kubectl::from_env(&env)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &node_images in &args.write_node_images {
        for &nodes in &args.nodes {
            eprintln!(
                "== {nodes} simulated agents on the Kubernetes store, NodeImages written: {node_images}"
            );
            let row = runtime.block_on(run(&controller, &kubectl, nodes, node_images, &args))?;
            eprintln!("{row:?}");
            rows.push(row);
        }
    }
    let table = render(&rows, &args);
    print!("{table}");
    if let Some(path) = &args.write {
        report::API_LOAD.write(path, &table)?;
    }
    Ok(())
}

fn show(counts: &Counts) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(verb, n)| format!("{n} {verb}"))
        .collect();
    format!("{} ({})", total(counts), parts.join(", "))
}

fn render(rows: &[Row], args: &Args) -> String {
    let mut out = String::from(
        "## API server load in Kubernetes mode\n\nReproduce with:\n\n```sh\nscripts/lab-k8s up\ncargo build --release -p rigger-controller -p rigger-bench\n",
    );
    out.push_str(&format!(
        "target/release/rigger-bench-api-load --nodes {} --steady {} --write BENCHMARKS.md\n```\n\n",
        args.nodes.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        humantime::format_duration(args.steady)
    ));
    out.push_str("| nodes | NodeImages written | requests while the fleet registers | requests per second, steady | watches held by Rigger | requests for an ImagePullJob over every node | the job took |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {} | {} | {:.1} s |\n",
            r.nodes,
            if r.node_images { "yes" } else { "no" },
            show(&r.register),
            total(&r.steady) as f64 / r.steady_seconds,
            r.watches,
            show(&r.job),
            r.job_time.as_secs_f64(),
        ));
    }
    out.push('\n');
    out
}

async fn run(
    controller: &Path,
    kubectl: &Kubectl,
    nodes: usize,
    node_images: bool,
    args: &Args,
) -> anyhow::Result<Row> {
    let namespace = format!("api-load-{}-{nodes}-{node_images}", std::process::id());
    kubectl.run(&["create", "namespace", &namespace], None)?;
    // The cluster's Nodes, labelled as the job selects them (agents' own labels are not
    // believed in a cluster).
    let items: Vec<serde_json::Value> = (0..nodes)
        .map(|node| {
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": format!("node-{node:05}.bench.rigger"), "labels": {"bench": "fleet"}}})
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    kubectl.run(
        &["apply", "--server-side", "-f", "-"],
        Some(&list.to_string()),
    )?;

    // The SidecarSet webhook as deployed: its certificate's Secret and configuration.
    let webhook = include_str!("../../../deploy/kubernetes/webhook.yaml").replace(
        "namespace: rigger-system",
        &format!("namespace: {namespace}"),
    );
    kubectl.run(&["apply", "-f", "-"], Some(&webhook))?;
    let (before, watches_before) = kubectl.counts()?;
    let extra: Vec<String> = [
        "--store",
        "kubernetes",
        "--kubeconfig",
        kubectl.kubeconfig.to_str().context("kubeconfig path")?,
        "--kubernetes-namespace",
        &namespace,
        "--write-node-images",
        if node_images { "true" } else { "false" },
        "--sidecar-webhook-listen",
        "127.0.0.1:0",
        "--sidecar-webhook-url",
        "https://127.0.0.1:9443",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let (lab, ca, identity) = Lab::start(controller, false, &extra)?;
    let endpoint = Endpoint::from_shared(format!("https://{}", lab.address))?
        .connect_timeout(Duration::from_secs(30))
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca.clone()))
                .identity(identity)
                .domain_name("localhost"),
        )?;
    let control_endpoint = Endpoint::from_shared(format!("https://{}", lab.address))?.tls_config(
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name("localhost"),
    )?;
    let (shared, mut agents) = simulated::spawn_fleet(&endpoint, nodes, 10);
    wait_registered(&shared, nodes, nodes).await?;
    let (registered, _) = kubectl.counts()?;

    tokio::time::sleep(args.steady).await;
    let (steady_end, watches) = kubectl.counts()?;

    let job = format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata:\n  name: fleet\n  namespace: {namespace}\nspec:\n  image: registry.example.com/app:1\n  parallelism: 1000\n  selector:\n    matchLabels: {{bench: fleet}}\n  imagePullPolicy: Always\n  completionPolicy: {{type: Always}}\n"
    );
    let (job_before, _) = kubectl.counts()?;
    let applied = Instant::now();
    kubectl.run(&["apply", "-f", "-"], Some(&job))?;
    let mut control = control_client(&control_endpoint, &lab.token).await?;
    loop {
        let found = control
            .get(GetRequest {
                kind: "ImagePullJob".to_owned(),
                namespace: namespace.clone(),
                name: "fleet".to_owned(),
            })
            .await;
        if let Ok(object) = found {
            let value: serde_json::Value = serde_json::from_str(&object.into_inner().json)?;
            if value["status"]["completionTime"].is_string() {
                if value["status"]["succeeded"].as_u64() != Some(nodes as u64) {
                    bail!("the job ended with {}", value["status"]);
                }
                break;
            }
        }
        if applied.elapsed() > Duration::from_secs(300) {
            bail!("the job did not complete in 300 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let job_time = applied.elapsed();
    // Its last status write lands after completion is visible in the controller (and
    // the NodeImages are written every 10 s).
    tokio::time::sleep(Duration::from_secs(if node_images { 12 } else { 2 })).await;
    let (job_after, _) = kubectl.counts()?;
    agents.abort_all();
    drop(lab);
    let _ = kubectl.run(
        &["delete", "nodes", "-l", "bench=fleet", "--wait=false"],
        None,
    );
    Ok(Row {
        nodes,
        node_images,
        register: difference(&registered, &before),
        steady: difference(&steady_end, &registered),
        steady_seconds: args.steady.as_secs_f64(),
        watches: watches.saturating_sub(watches_before),
        job: difference(&job_after, &job_before),
        job_time,
    })
}
