//! Rigger's controller as deployed in the lab's cluster (`scripts/lab-rigger`): its
//! replicas' memory, the leading replica's address, and simulated agents connected to it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::simulated;

/// A simulated agent for each Node (`simulated`, the fleet bench's), connected to the
/// leading replica's pod (only the leader serves agents) with a certificate from the
/// lab cluster's PKI: the agents, what they share, and how long until all registered.
pub async fn connect_agents(
    client: &kube::Client,
    nodes: usize,
    images: usize,
) -> anyhow::Result<(tokio::task::JoinSet<()>, Arc<simulated::Shared>, Duration)> {
    let pki = std::env::var_os("RIGGER_LAB_CLUSTER_DIR")
        .map(PathBuf::from)
        .context("RIGGER_LAB_CLUSTER_DIR (source <(scripts/lab env)), or --no-agents")?
        .join("rigger-pki");
    let ca = std::fs::read(pki.join("ca.pem"))
        .with_context(|| format!("the lab cluster's CA in {}", pki.display()))?;
    let identity = simulated::agent_identity(&pki)?;
    let endpoint = Endpoint::from_shared(format!("https://{}", leader_address(client).await?))?
        .connect_timeout(Duration::from_secs(30))
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(identity)
                .domain_name("localhost"),
        )?;
    let (shared, agents) = simulated::spawn_fleet(&endpoint, nodes, images);
    let took = simulated::wait_registered(&shared, nodes, nodes).await?;
    Ok((agents, shared, took))
}

/// The controller's Lease holder: the leading replica's pod and its agent link's listen
/// address (the identity is `<pod>/<listen address>`).
async fn leader(client: &kube::Client) -> anyhow::Result<(String, String)> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "rigger-system");
    let holder = leases
        .get("rigger-controller")
        .await
        .context("the controller's Lease")?
        .spec
        .and_then(|spec| spec.holder_identity)
        .context("the controller's Lease has no holder")?;
    let (pod, listen) = holder
        .split_once('/')
        .with_context(|| format!("the Lease's holder {holder:?} is not <pod>/<address>"))?;
    Ok((pod.to_owned(), listen.to_owned()))
}

/// The leading replica's agent link: its pod's address, at the port of the Lease's
/// holder identity.
pub async fn leader_address(client: &kube::Client) -> anyhow::Result<String> {
    let (pod, listen) = leader(client).await?;
    let port = listen
        .rsplit_once(':')
        .map(|(_, port)| port)
        .with_context(|| format!("no port in the Lease's holder {pod}/{listen}"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rigger-system");
    let ip = pods
        .get(&pod)
        .await
        .with_context(|| format!("the leading controller's pod {pod}"))?
        .status
        .and_then(|status| status.pod_ip)
        .with_context(|| format!("pod {pod} has no IP"))?;
    Ok(format!("{ip}:{port}"))
}

/// RSS now and peak (bytes) of the leading and the following controller replica.
pub async fn controller_rss(client: &kube::Client) -> ((u64, u64), (u64, u64)) {
    // No Lease or no holder (between leaders): both counted as following.
    let leader = leader(client).await.map(|(pod, _)| pod).unwrap_or_default();
    let (mut leading, mut following) = ((0, 0), (0, 0));
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return (leading, following);
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "rigger-controll" {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let hostname = environ
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(b"HOSTNAME="))
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        if !hostname.starts_with("rigger-controller-") {
            continue;
        }
        let Ok((rss, peak, _)) = simulated::proc_stats(pid) else {
            continue;
        };
        let rss = (rss, peak);
        if hostname == leader {
            leading = rss;
        } else {
            following = rss;
        }
    }
    (leading, following)
}

/// Until the leader has written a NodeImage for each of the simulated agents' `nodes`
/// Nodes (Kruise's kind, one per node, written once the node's agent registered), as a
/// cluster Rigger has run in has them: how long that took.
pub async fn wait_node_images(client: &kube::Client, nodes: usize) -> anyhow::Result<Duration> {
    let resource = kube::discovery::ApiResource {
        group: "apps.kruise.io".into(),
        version: "v1beta1".into(),
        api_version: "apps.kruise.io/v1beta1".into(),
        kind: "NodeImage".into(),
        plural: "nodeimages".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    let started = std::time::Instant::now();
    loop {
        let written = api
            .list_metadata(&kube::api::ListParams::default())
            .await
            .context("listing the NodeImages")?
            .items
            .iter()
            .filter(|image| {
                image
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| name.ends_with(".bench.rigger"))
            })
            .count();
        if written >= nodes {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(900) {
            anyhow::bail!("only {written} of {nodes} NodeImages written in 15 minutes");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
