//! `rigger-bench-cluster-scale`: Rigger's controller, as deployed in the lab's real
//! cluster (`scripts/lab-cluster`, `scripts/lab-rigger`), while the cluster grows to
//! `--nodes` Nodes and `--pods` Pods, `--matched` of which a SidecarSet matches (so the
//! API server calls Rigger's webhook for each), created at `--rate` a second while as
//! many pod statuses change a second, for `--duration`.
//!
//! The Nodes are virtual (`type: virtual-kubelet`, as Virtual Kubelet labels its nodes:
//! no kubelet, so the agent DaemonSet leaves them out) and the Pods are bound to them
//! (`nodeName`, tolerating every taint, so the node lifecycle controller evicts none).
//! Read while it runs: both controller replicas' RSS (from `/proc` on the machine, the
//! leader told by the Lease), the API server's own webhook latency histogram
//! (`apiserver_admission_webhook_admission_duration_seconds`) beside the controller's
//! own time per review (`rigger_controller_webhook_review_duration_seconds`, through the
//! API server's pod proxy), and the controller's API requests per minute from the audit
//! log, beside the pod count of that minute.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::StreamExt as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use rigger_bench::histogram::{buckets_of, quantile};
use rigger_bench::{in_cluster, machine, report, simulated};

#[derive(Debug, Parser)]
#[command(
    name = "rigger-bench-cluster-scale",
    about = "Rigger's controller as a real cluster grows"
)]
struct Args {
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    #[arg(long, default_value_t = 50000)]
    pods: usize,
    /// Of the pods, how many a SidecarSet matches.
    #[arg(long, default_value_t = 10000)]
    matched: usize,
    /// Pods created a second (until `--pods`), and pod statuses changed a second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The lab cluster's audit log [default: $RIGGER_LAB_CLUSTER_AUDIT_LOG].
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// Write the results into this markdown file (its cluster-scale section).
    #[arg(long)]
    write: Option<PathBuf>,
    /// Leave the Nodes and Pods in place afterwards.
    #[arg(long)]
    keep: bool,
    /// Write the API server's CPU profile (Go's pprof, the run's middle minute) here.
    #[arg(long)]
    profiles: Option<PathBuf>,
    /// Connect no simulated agent (by default each Node has one, registered with the
    /// leader as a node's agent is).
    #[arg(long)]
    no_agents: bool,
    /// Images in each simulated agent's inventory.
    #[arg(long, default_value_t = 10)]
    images: usize,
}

const NAMESPACE: &str = "rigger-scale";
const SET: &str = "rigger-scale";
const CONTROLLER: &str = "system:serviceaccount:rigger-system:rigger-controller";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.matched > args.pods || args.nodes == 0 || args.rate == 0 {
        bail!("--matched must be at most --pods, and --nodes and --rate above 0");
    }
    let audit_log = match &args.audit_log {
        Some(path) => path.clone(),
        None => std::env::var("RIGGER_LAB_CLUSTER_AUDIT_LOG")
            .context("--audit-log or RIGGER_LAB_CLUSTER_AUDIT_LOG (source <(scripts/lab env))")?
            .into(),
    };
    // The lab cluster's admin [default: $RIGGER_LAB_CLUSTER_KUBECONFIG, else kube's own
    // search: $KUBECONFIG, ~/.kube/config].
    let client = match std::env::var_os("RIGGER_LAB_CLUSTER_KUBECONFIG") {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(&path)
                .context("the lab cluster's kubeconfig")?;
            let config = kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await?;
            kube::Client::try_from(config)?
        }
        None => kube::Client::try_default().await.context("a kubeconfig")?,
    };
    let outcome = run(&client, &args, &audit_log).await;
    if !args.keep {
        clean(&client).await;
    }
    let report = outcome?;
    println!("{report}");
    if let Some(path) = &args.write {
        report::CLUSTER_SCALE.write(path, &report)?;
    }
    Ok(())
}

/// One sample of the run.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    pods: u64,
    leader_rss: u64,
    follower_rss: u64,
}

/// Rigger's injection webhook configuration, the one the bench measures.
const RIGGER_WEBHOOK: &str = "rigger-sidecar-injection";

/// Refuse a cluster where another mutating webhook sees the bench's pods (Kruise's
/// manager left by an earlier run, say): its injection would meet Rigger's, and its
/// latency would be measured as Rigger's.
async fn alone(client: &kube::Client) -> anyhow::Result<()> {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let others: Vec<String> = configurations
        .list(&ListParams::default())
        .await
        .context("listing the mutating webhook configurations")?
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|name| name != RIGGER_WEBHOOK)
        .collect();
    if !others.is_empty() {
        bail!(
            "another mutating webhook is installed ({}): the bench measures Rigger's alone (`scripts/lab clean` starts the cluster afresh)",
            others.join(", ")
        );
    }
    Ok(())
}

async fn run(client: &kube::Client, args: &Args, audit_log: &Path) -> anyhow::Result<String> {
    alone(client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await
        .context("creating the bench's namespace (a run left it? delete it first)")?;
    apply_sidecar_set(client).await?;
    let nodes_made = Instant::now();
    create_nodes(client, args.nodes).await?;
    let nodes_took = nodes_made.elapsed();
    println!("{} Nodes in {nodes_took:?}", args.nodes);
    // Held until the run ends: dropping the set ends the agents' sessions.
    let agents = if args.no_agents {
        None
    } else {
        let agents = in_cluster::connect_agents(client, args.nodes, args.images).await?;
        println!("{} agents registered in {:?}", args.nodes, agents.2);
        // Registration writes each node's NodeImage: done before the pods come, as in a
        // cluster Rigger has run in (a one-time cost per node, not the pods' load).
        let written = in_cluster::wait_node_images(client, args.nodes).await?;
        println!("{} NodeImages written in {written:?}", args.nodes);
        Some((agents.0, agents.1, agents.2, written))
    };
    let webhook_before = apiserver_histogram(client, ADMISSION, &webhook_entry()).await?;
    let scheduling_before = apiserver_histogram(client, SCHEDULING, "").await?;
    let reviews_before = review_histogram(client).await?;
    let audit_from = audit_now();
    let cpu_before = machine::read()?;
    let started = Instant::now();
    let created = Arc::new(AtomicU64::new(0));
    let changed = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn(load(
        client.clone(),
        args.pods,
        args.matched,
        args.nodes,
        args.rate,
        args.duration,
        [created.clone(), changed.clone(), failed.clone()],
    ));
    let profile = args.profiles.clone().map(|dir| {
        let client = client.clone();
        let middle = args.duration.saturating_sub(PROFILED) / 2;
        tokio::spawn(async move {
            tokio::time::sleep(middle).await;
            apiserver_profile(&client, &dir).await
        })
    });
    let mut samples = Vec::new();
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (leader, follower) = in_cluster::controller_rss(client).await;
        samples.push(Sample {
            at: started.elapsed(),
            pods: created.load(Ordering::Relaxed),
            leader_rss: leader.0,
            follower_rss: follower.0,
        });
        println!(
            "{:>5.0} s: {} pods, {} statuses changed, {} failed; leader RSS {} MiB, follower {} MiB",
            started.elapsed().as_secs_f64(),
            created.load(Ordering::Relaxed),
            changed.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            leader.0 >> 20,
            follower.0 >> 20
        );
    }
    load.await??;
    let cpu = machine::table(&cpu_before, &machine::read()?, cores(), 0.01);
    let agents = agents.map(|(_fleet, shared, took, written)| {
        (took, written, shared.failures.load(Ordering::Relaxed))
    });
    if let Some(profile) = profile {
        let path = profile.await??;
        println!(
            "the API server's CPU profile: go tool pprof -top {}",
            path.display()
        );
    }
    let (leader, follower) = in_cluster::controller_rss(client).await;
    let webhook_after = apiserver_histogram(client, ADMISSION, &webhook_entry()).await?;
    let scheduling_after = apiserver_histogram(client, SCHEDULING, "").await?;
    let reviews_after = review_histogram(client).await?;
    let latency = |before: &[(f64, f64)], after: &[(f64, f64)]| {
        (quantile(before, after, 0.5), quantile(before, after, 0.99))
    };
    let admission = latency(&webhook_before, &webhook_after);
    let scheduling = latency(&scheduling_before, &scheduling_after);
    let reviews = latency(&reviews_before, &reviews_after);
    let per_minute = requests_per_minute(audit_log, &audit_from)?;
    Ok(report(
        args,
        &Measured {
            nodes_took,
            samples: &samples,
            rss: [leader, follower],
            latencies: [admission, reviews, scheduling],
            per_minute: &per_minute,
            cpu: &cpu,
            agents,
            counts: [
                created.load(Ordering::Relaxed),
                changed.load(Ordering::Relaxed),
                failed.load(Ordering::Relaxed),
            ],
        },
    ))
}

/// The cluster's SidecarSets (Kruise's kind, served by Rigger's CRD).
fn sidecar_sets(client: &kube::Client) -> Api<kube::api::DynamicObject> {
    let resource = kube::discovery::ApiResource {
        group: "apps.kruise.io".into(),
        version: "v1alpha1".into(),
        api_version: "apps.kruise.io/v1alpha1".into(),
        kind: "SidecarSet".into(),
        plural: "sidecarsets".into(),
    };
    Api::all_with(client.clone(), &resource)
}

async fn apply_sidecar_set(client: &kube::Client) -> anyhow::Result<()> {
    let sets = sidecar_sets(client);
    let set: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
        "metadata": {"name": SET},
        "spec": {
            "namespace": NAMESPACE,
            "selector": {"matchLabels": {"rigger-scale/sidecar": "yes"}},
            "containers": [{"name": "proxy", "image": "10.250.0.1:5000/rigger-lab/busybox:1",
                            "command": ["sleep", "3600"]}],
        },
    }))?;
    sets.create(&PostParams::default(), &set)
        .await
        .context("creating the bench's SidecarSet")?;
    // Its webhook entry reaches the API server a moment later.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let entry = format!("{SET}.sidecarsets.rigger.dev");
    let waited = Instant::now();
    loop {
        let configuration = configurations.get(RIGGER_WEBHOOK).await?;
        if configuration
            .webhooks
            .iter()
            .flatten()
            .any(|w| w.name == entry)
        {
            // The API server reads the configuration from its own watch.
            tokio::time::sleep(Duration::from_secs(2)).await;
            return Ok(());
        }
        if waited.elapsed() > Duration::from_secs(60) {
            bail!("the SidecarSet's webhook entry never came");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn create_nodes(client: &kube::Client, count: usize) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let made = futures::stream::iter(0..count).map(|index| {
        let api = api.clone();
        async move {
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": simulated::node_name(index), "labels": {
                    "type": "virtual-kubelet", "rigger-scale": "yes",
                    "topology.kubernetes.io/zone": format!("zone-{}", index % 3)}},
                "spec": {"taints": [{"key": "virtual-kubelet.io/provider",
                                     "value": "rigger-scale", "effect": "NoSchedule"}]},
            }))?;
            api.create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating node {}", simulated::node_name(index)))
        }
    });
    let results: Vec<_> = made.buffer_unordered(16).collect().await;
    for result in results {
        result?;
    }
    Ok(())
}

/// Pods created at `rate` a second until `pods`, and as many statuses changed a second,
/// for `duration`; counts created, changed and failed.
async fn load(
    client: kube::Client,
    pods: usize,
    matched: usize,
    nodes: usize,
    rate: u32,
    duration: Duration,
    [created, changed, failed]: [Arc<AtomicU64>; 3],
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(64));
    let every = pods.checked_div(matched).unwrap_or(usize::MAX).max(1);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut next = 0usize;
    let mut tasks = tokio::task::JoinSet::new();
    while started.elapsed() < duration {
        tick.tick().await;
        let made = usize::try_from(created.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        // A new pod, while there are fewer than asked.
        if next < pods {
            let index = next;
            next += 1;
            let (api, created, failed) = (api.clone(), created.clone(), failed.clone());
            let permit = in_flight.clone().acquire_owned().await?;
            tasks.spawn(async move {
                let _permit = permit;
                let sidecar = if index.is_multiple_of(every) { "yes" } else { "no" };
                let pod: Pod = match serde_json::from_value(json!({
                    "metadata": {"name": format!("p-{index:06}"), "labels": {
                        "app": format!("app-{}", index % 200), "rigger-scale/sidecar": sidecar}},
                    "spec": {"nodeName": simulated::node_name(index % nodes),
                             "tolerations": [{"operator": "Exists"}],
                             "containers": [{"name": "app", "image": "10.250.0.1:5000/rigger-lab/busybox:1"}]},
                })) {
                    Ok(pod) => pod,
                    Err(_) => return,
                };
                match api.create(&PostParams::default(), &pod).await {
                    Ok(_) => created.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            });
        }
        // A status change of a pod made already: readiness flips, a container restarts.
        if made > 0 {
            let index = fastrand::usize(0..made);
            let (api, changed, failed) = (api.clone(), changed.clone(), failed.clone());
            let permit = in_flight.clone().acquire_owned().await?;
            tasks.spawn(async move {
                let _permit = permit;
                let ready = fastrand::bool();
                let restarts = fastrand::u32(0..5);
                let status = json!({"status": {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                    "containerStatuses": [{"name": "app", "image": "busybox", "imageID": "sha256:app",
                        "containerID": format!("containerd://{index}-{restarts}"), "ready": ready,
                        "restartCount": restarts, "state": {"running": {}}}],
                }});
                let patched = api
                    .patch_status(
                        &format!("p-{index:06}"),
                        &PatchParams::default(),
                        &Patch::Merge(&status),
                    )
                    .await;
                match patched {
                    Ok(_) => changed.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// How long the API server's CPU profile samples.
const PROFILED: Duration = Duration::from_secs(60);

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The API server's CPU profile over [`PROFILED`] (its `/debug/pprof/profile`, which
/// `--profiling` serves by default to whom may `get` that path), written into `dir`.
async fn apiserver_profile(client: &kube::Client, dir: &Path) -> anyhow::Result<PathBuf> {
    use futures::AsyncReadExt as _;
    let path = format!("/debug/pprof/profile?seconds={}", PROFILED.as_secs());
    let request = http::Request::get(path).body(Vec::new())?;
    let mut body = Vec::new();
    client
        .request_stream(request)
        .await
        .context("the API server's CPU profile")?
        .read_to_end(&mut body)
        .await
        .context("reading the API server's CPU profile")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("kube-apiserver-cpu.pprof");
    std::fs::write(&file, body).with_context(|| format!("writing {}", file.display()))?;
    Ok(file)
}

/// The API server's webhook admission latency histogram.
const ADMISSION: &str = "apiserver_admission_webhook_admission_duration_seconds_bucket";
/// How long the API server's goroutines waited, runnable, for a CPU (Go's runtime).
const SCHEDULING: &str = "go_sched_latencies_seconds_bucket";

/// The bench's set's entry in the webhook histogram's labels.
fn webhook_entry() -> String {
    format!("name=\"{SET}.sidecarsets.rigger.dev\"")
}

/// A histogram of the API server's own `/metrics` (its series whose line holds
/// `filter`): bucket upper bound (seconds) → cumulative count.
async fn apiserver_histogram(
    client: &kube::Client,
    metric: &str,
    filter: &str,
) -> anyhow::Result<Vec<(f64, f64)>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(buckets_of([text.as_str()], metric, filter))
}

/// The webhook's own time per review, from every controller replica's `/metrics` (read
/// through the API server's pod proxy, as Prometheus in the cluster would scrape it),
/// whatever the answer: what of the API server's figure the controller spends.
async fn review_histogram(client: &kube::Client) -> anyhow::Result<Vec<(f64, f64)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rigger-system");
    let replicas = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=rigger-controller"))
        .await
        .context("listing the controller's pods")?;
    let mut texts = Vec::new();
    for pod in replicas {
        let name = pod.metadata.name.unwrap_or_default();
        let path = format!("/api/v1/namespaces/rigger-system/pods/{name}:9451/proxy/metrics");
        let request = http::Request::get(path).body(Vec::new())?;
        texts.push(
            client
                .request_text(request)
                .await
                .with_context(|| format!("the metrics of controller pod {name}"))?,
        );
    }
    Ok(buckets_of(
        texts.iter().map(String::as_str),
        "rigger_controller_webhook_review_duration_seconds_bucket",
        "",
    ))
}

/// Now as the audit log's timestamps begin (RFC 3339 to the second, without its zone):
/// its lines compare as text, an event of this very second not before it.
fn audit_now() -> String {
    rigger_proto::time::now_rfc3339()
        .trim_end_matches('Z')
        .to_owned()
}

/// The audit log and the backups the API server rotated it into
/// (`<stem>-<time>.log` beside it: a long run at scale passes its size limit).
fn audit_files(audit_log: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let stem = audit_log
        .file_stem()
        .and_then(|s| s.to_str())
        .context("the audit log's name")?;
    let dir = audit_log.parent().unwrap_or(Path::new("."));
    let mut files = vec![audit_log.to_path_buf()];
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(&format!("{stem}-")) && name.ends_with(".log") {
            files.push(path);
        }
    }
    Ok(files)
}

/// The controller's requests by minute since `since` (the audit log's
/// `requestReceivedTimestamp`, to the minute), each with its verbs.
fn requests_per_minute(
    audit_log: &Path,
    since: &str,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u64>>> {
    let mut minutes: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for file in audit_files(audit_log)? {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if event["user"]["username"] != CONTROLLER {
                continue;
            }
            let Some(at) = event["requestReceivedTimestamp"].as_str() else {
                continue;
            };
            if at < since {
                continue;
            }
            let minute = at.get(..16).unwrap_or(at).to_owned();
            let resource = event["objectRef"]["resource"].as_str().unwrap_or("?");
            let verb = event["verb"].as_str().unwrap_or("?");
            *minutes
                .entry(minute)
                .or_default()
                .entry(format!("{verb} {resource}"))
                .or_default() += 1;
        }
    }
    Ok(minutes)
}

/// What a run measured, for its report.
struct Measured<'a> {
    nodes_took: Duration,
    samples: &'a [Sample],
    /// RSS now and peak of the leader, and of the follower.
    rss: [(u64, u64); 2],
    /// p50 and p99 of admission, of the webhook's own time, and of the API server's
    /// goroutines' wait for a CPU.
    latencies: [(Option<f64>, Option<f64>); 3],
    per_minute: &'a BTreeMap<String, BTreeMap<String, u64>>,
    /// Where the machine's CPU went ([`machine::table`]).
    cpu: &'a str,
    /// How long the simulated agents took to register, then their NodeImages to be
    /// written, and how many sessions failed.
    agents: Option<(Duration, Duration, usize)>,
    /// Pods created, statuses changed, requests failed.
    counts: [u64; 3],
}

fn report(args: &Args, measured: &Measured<'_>) -> String {
    let &Measured {
        nodes_took,
        samples,
        rss: [leader, follower],
        latencies: [admission, reviews, scheduling],
        per_minute,
        cpu,
        agents,
        counts: [created, changed, failed],
    } = measured;
    let ms = |s: Option<f64>| s.map_or("—".to_owned(), |s| format!("{:.1} ms", s * 1000.0));
    let mib = |bytes: u64| format!("{} MiB", bytes >> 20);
    let mut out = format!(
        "Reproduce with (the lab's cluster with Rigger deployed, nothing else running on it):\n\n\
         ```sh\nscripts/lab up --k8s --cluster && scripts/lab-rigger up --profile release\n\
         source <(scripts/lab env)\n\
         target/release/rigger-bench-cluster-scale --nodes {} --pods {} --matched {} --rate {} --duration {}{} --write BENCHMARKS.md\n```\n\n",
        args.nodes,
        args.pods,
        args.matched,
        args.rate,
        humantime::format_duration(args.duration),
        args.profiles.as_ref().map_or(String::new(), |dir| format!(
            " --profiles {}",
            dir.display()
        ))
    );
    out.push_str(&format!(
        "{} virtual Nodes made in {:.0} s; then for {}: {created} Pods created ({} matched by the SidecarSet), {changed} pod statuses changed, {failed} requests failed.\n\n",
        args.nodes,
        nodes_took.as_secs_f64(),
        humantime::format_duration(args.duration),
        (created as usize).div_ceil(args.pods.checked_div(args.matched).unwrap_or(usize::MAX).max(1)),
    ));
    if let Some((took, written, lost)) = agents {
        out.push_str(&format!(
            "Each Node had a simulated agent ({} images in its inventory) registered with the leader, as a node's agent is: all {} in {:.0} s, and their NodeImages written {:.0} s later, before the pods came; {lost} sessions lost.\n\n",
            args.images,
            args.nodes,
            took.as_secs_f64(),
            written.as_secs_f64()
        ));
    }
    out.push_str("| measure | target | measured |\n|---|---|---|\n");
    out.push_str(&format!(
        "| leader's peak RSS | ≤ 1 GiB | {} (now {}) |\n",
        mib(leader.1),
        mib(leader.0)
    ));
    out.push_str(&format!(
        "| follower's peak RSS | ≤ 512 MiB | {} (now {}) |\n",
        mib(follower.1),
        mib(follower.0)
    ));
    out.push_str(&format!(
        "| webhook admission, the API server's histogram | p99 ≤ 50 ms | p50 {}, p99 {} |\n",
        ms(admission.0),
        ms(admission.1)
    ));
    out.push_str(&format!(
        "| of which the webhook's own time per review (the controller's histogram) | | p50 {}, p99 {} |\n",
        ms(reviews.0),
        ms(reviews.1)
    ));
    out.push_str(&format!(
        "| the API server's goroutines waiting, runnable, for a CPU (Go's `{}`) | | p50 {}, p99 {} |\n\n",
        SCHEDULING.trim_end_matches("_bucket"),
        ms(scheduling.0),
        ms(scheduling.1)
    ));
    out.push_str("Where the machine's CPU went while the pods came (`/proc`; commands under 1 % summed):\n\n");
    out.push_str(cpu);
    out.push_str("\nThe controller's API requests by minute (audit log), and the pods there were:\n\n| minute (UTC) | pods at its end | requests | of which |\n|---|---|---|---|\n");
    let start = samples.first().map_or(Duration::ZERO, |s| s.at);
    for (index, (minute, verbs)) in per_minute.iter().enumerate() {
        let pods = samples
            .iter()
            .take_while(|s| s.at <= start + Duration::from_secs(60 * (index as u64 + 1)))
            .last()
            .map_or(0, |s| s.pods);
        let total: u64 = verbs.values().sum();
        let mut top: Vec<(&String, &u64)> = verbs.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = top
            .iter()
            .take(4)
            .map(|(verb, n)| format!("{n} {verb}"))
            .collect();
        out.push_str(&format!(
            "| {minute} | {pods} | {total} | {} |\n",
            top.join(", ")
        ));
    }
    out.push_str("\nRSS over the run (every 30 s):\n\n| at | pods | leader RSS | follower RSS |\n|---|---|---|---|\n");
    for sample in samples.iter().step_by(6) {
        out.push_str(&format!(
            "| {:.0} s | {} | {} | {} |\n",
            sample.at.as_secs_f64(),
            sample.pods,
            mib(sample.leader_rss),
            mib(sample.follower_rss)
        ));
    }
    out
}

/// Remove what the bench made: the pods at once (no kubelet will confirm their end),
/// the namespace, the SidecarSet and the Nodes.
async fn clean(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let _ = pods.delete_collection(&now, &ListParams::default()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(NAMESPACE, &DeleteParams::default()).await;
    let sets = sidecar_sets(client);
    let _ = sets.delete(SET, &DeleteParams::default()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("rigger-scale=yes"),
        )
        .await;
}
