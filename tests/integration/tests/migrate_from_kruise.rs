//! docs/guides/migrate-from-kruise.md, run as written on the lab's real cluster: OpenKruise
//! v1.9.0 (manager and kruise-daemon, `scripts/lab-kruise up`) with jobs in flight, a list,
//! a SidecarSet and its pods moves to Rigger alone, then back. Every command block of the
//! guide runs in order in one bash session per direction (`set -euo pipefail`, `kubectl`
//! the lab's, the guide's `helpers` first); the guide's own checks are part of it. What the
//! lab changes: the blocks that install each system (`install-rigger`,
//! `install-kruise`: "as its documentation says") are the lab's installers, which apply the
//! same manifests with the lab's images (`scripts/lab-rigger up`, `scripts/lab-kruise up`).
//!
//! What the test adds around the guide, as a user would check it: no job lost (each
//! finishes, or keeps running if Never, under the new owner), no node fetching an image
//! twice (the bytes a counting proxy in front of the registry served, per image, against
//! its size and the nodes), every pod of the SidecarSet's Deployment with its sidecar, and
//! new pods injected by the new owner.
//!
//! `make test` runs it in a stage of its own (nextest's `migration` profile).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rigger_integration_tests::real_cluster::{ClusterNamespace, DeletedOnDrop, RealCluster};
use rigger_integration_tests::{Proxy, code_blocks, repo_root, unique_image_with, wait_until};
use serde_json::{Value, json};

const GUIDE: &str = "docs/guides/migrate-from-kruise.md";

/// The guide's blocks for one direction (`to-rigger` or `to-kruise`, with `helpers`
/// first and the install block of that direction in its place), as one bash script.
fn script(direction: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(GUIDE)).unwrap();
    let install = match direction {
        "to-rigger" => "install-rigger",
        _ => "install-kruise",
    };
    let mut script = String::from("set -euo pipefail\n");
    let mut ran = 0;
    for block in code_blocks(&text) {
        let Some(info) = block.info.strip_prefix("sh ") else {
            assert!(
                !block.info.starts_with("sh"),
                "{GUIDE}:{}: a shell block names its direction",
                block.line
            );
            continue;
        };
        let body = match info {
            "helpers" => block.text.clone(),
            i if i == direction => block.text.clone(),
            i if i == install => {
                // The lab's installer applies the same manifests, with the lab's images.
                let lab = match install {
                    "install-rigger" => "scripts/lab-rigger up --no-build >/dev/null",
                    _ => "scripts/lab-kruise up >/dev/null",
                };
                format!("\"$RIGGER_REPO\"/{lab}\n")
            }
            "to-rigger" | "to-kruise" | "install-rigger" | "install-kruise" => continue,
            other => panic!("{GUIDE}:{}: unknown block `sh {other}`", block.line),
        };
        script.push_str(&format!("echo '--- {GUIDE}:{}' >&2\n{body}", block.line));
        ran += 1;
    }
    assert!(ran > 3, "{GUIDE}: no `sh {direction}` blocks");
    script
}

/// Run the guide's `direction` in `dir` (its backups stay there between directions).
fn run_guide(cluster: &RealCluster, dir: &Path, direction: &str, namespace: &str) {
    let deploy = dir.join("deploy");
    if !deploy.exists() {
        std::os::unix::fs::symlink(repo_root().join("deploy"), &deploy).unwrap();
    }
    // The lab's kubectl, as the README's cluster quick start runs it (docs.rs).
    let kubectl_dir = cluster.client.binary.parent().unwrap();
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(script(direction))
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", &cluster.client.kubeconfig)
        .env("RIGGER_REPO", repo_root())
        .env("PROBE_NAMESPACE", namespace)
        .env("PROBE_SET", format!("migrated-{}", std::process::id()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{GUIDE}, {direction}: failed\n--- stdout\n{}\n--- stderr\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cluster.rigger_state()
    );
}

/// Wait (3 minutes at most) until `kind/name`'s status satisfies `done`.
fn wait_status(
    cluster: &RealCluster,
    ns: &str,
    kind: &str,
    name: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    cluster.wait_status(ns, kind, name, Duration::from_secs(180), done)
}

/// The `Never` job on every node and the `Never` list's image done: what each owner in
/// turn shows of the work done before the move. The job's status.
fn never_work_done(cluster: &RealCluster, ns: &str, nodes: usize) -> Value {
    let always_on = wait_status(cluster, ns, "imagepulljob", "always-on", |s| {
        s["succeeded"] == nodes
    });
    wait_status(cluster, ns, "imagelistpulljob", "listed", |s| {
        s["succeeded"] == 1
    });
    always_on
}

/// Bytes the proxy served of the blobs of `repo` (`rigger-lab/NAME-PID`).
fn blob_bytes(proxy: &Proxy, repo: &str) -> u64 {
    let prefix = format!("/v2/{repo}/blobs/");
    proxy
        .requests()
        .iter()
        .filter(|r| r["method"] == "GET" && r["path"].as_str().unwrap().starts_with(&prefix))
        .map(|r| r["sent"].as_u64().unwrap_or(0))
        .sum()
}

/// The pods of the SidecarSet's Deployment, each with whether it has the sidecar.
fn app_pods(cluster: &RealCluster, ns: &ClusterNamespace) -> Vec<(String, bool)> {
    cluster
        .get_json(&["pods", "-n", &ns.name, "-l", "app=migrated"])
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let sidecar = p["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["name"] == "proxy");
            (p["metadata"]["name"].as_str().unwrap().to_owned(), sidecar)
        })
        .collect()
}

/// Scale the Deployment to `replicas` and wait until that many pods run, each with the
/// sidecar (a pod without it fails the test: it was started bare).
fn scale_and_check(cluster: &RealCluster, ns: &ClusterNamespace, replicas: usize, who: &str) {
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "scale",
        "deployment/migrated",
        &format!("--replicas={replicas}"),
    ]);
    cluster.rollout_status(&ns.name, "deployment/migrated", Duration::from_secs(180));
    let pods = app_pods(cluster, ns);
    assert_eq!(pods.len(), replicas, "{pods:?}");
    for (pod, sidecar) in &pods {
        assert!(
            sidecar,
            "pod {pod} runs without the sidecar ({who} injects now)"
        );
    }
}

#[test]
fn a_cluster_moves_from_kruise_to_rigger_with_jobs_in_flight_and_back() {
    let cluster = RealCluster::kruise_alone();
    let ns = cluster.namespace("migrate");
    let nodes = cluster.nodes();
    let work = tempfile::tempdir().unwrap();

    // A registry seen through a counting proxy, slow enough (1 MiB/s a connection) that
    // the big job is still going when the move starts.
    let proxy = Proxy::start_to(
        &format!("http://{}", cluster.registry),
        &json!([]),
        &["--listen", "10.250.0.1:0", "--connection-rate", "1MiB"],
    );
    let _hosts = cluster.registry_host(&proxy.address);
    let big_repo = unique_image_with("migrate-big", 3, 8 << 20, &["--base", "none"]);
    let small_repo = unique_image_with("migrate-small", 1, 512 << 10, &["--base", "none"]);
    let listed_repo = unique_image_with("migrate-listed", 1, 512 << 10, &["--base", "none"]);
    let done_repo = unique_image_with("migrate-done", 1, 256 << 10, &["--base", "none"]);
    let via_proxy = |repo: &str| format!("{}/{repo}", proxy.address);
    let repo_of = |image: &str| image.rsplit_once(':').unwrap().0.to_owned();

    // Under Kruise: a finished job, a Never job done on every node, a Never list, a
    // SidecarSet with a Deployment, and an Always job one node at a time, under way.
    let names: Vec<String> = nodes.iter().map(|n| format!("'{n}'")).collect();
    let names = names.join(", ");
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: done, namespace: {ns}}}\n\
         spec:\n  image: {done}\n  selector: {{names: [{first}]}}\n  \
         completionPolicy: {{type: Always, ttlSecondsAfterFinished: 3600}}\n---\n\
         apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: always-on, namespace: {ns}}}\n\
         spec:\n  image: {small}\n  selector: {{names: [{names}]}}\n  completionPolicy: {{type: Never}}\n---\n\
         apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {{name: listed, namespace: {ns}}}\n\
         spec:\n  images: [{listed}]\n  selector: {{names: [{names}]}}\n  completionPolicy: {{type: Never}}\n---\n\
         apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: migrated-{pid}}}\n\
         spec:\n  selector: {{matchLabels: {{app: migrated}}}}\n  \
         namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n  \
         containers:\n  - name: proxy\n    image: {busybox}\n    command: [/bin/sleep, '3600']\n",
        ns = ns.name,
        done = via_proxy(&done_repo),
        small = via_proxy(&small_repo),
        listed = via_proxy(&listed_repo),
        first = nodes[0],
        pid = std::process::id(),
        busybox = cluster.image("rigger-lab/busybox:1"),
    ));
    let _set = DeletedOnDrop(
        cluster,
        "sidecarset",
        format!("migrated-{}", std::process::id()),
    );
    // Kruise's webhook reads SidecarSets from its cache: the Deployment comes once a pod
    // of its labels would be injected.
    let probe = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{generateName: probe-, namespace: {ns}, labels: {{app: migrated}}}}\n\
         spec: {{containers: [{{name: app, image: {busybox}}}]}}\n",
        ns = ns.name,
        busybox = cluster.image("rigger-lab/busybox:1"),
    );
    wait_until("Kruise to inject the set", Duration::from_secs(60), || {
        let out = cluster.kubectl_stdin(&["create", "--dry-run=server", "-o", "json"], &probe);
        let pod: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        pod["spec"]["containers"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["name"] == "proxy"))
            .then_some(())
    });
    cluster.apply(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: migrated, namespace: {ns}}}\n\
         spec:\n  replicas: 2\n  selector: {{matchLabels: {{app: migrated}}}}\n  template:\n    \
         metadata: {{labels: {{app: migrated}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      \
         containers:\n      - name: app\n        image: {busybox}\n        command: [/bin/sleep, '3600']\n",
        ns = ns.name,
        busybox = cluster.image("rigger-lab/busybox:1"),
    ));
    wait_status(cluster, &ns.name, "imagepulljob", "done", |s| {
        !s["completionTime"].is_null()
    });
    never_work_done(cluster, &ns.name, nodes.len());
    cluster.rollout_status(&ns.name, "deployment/migrated", Duration::from_secs(180));
    assert!(app_pods(cluster, &ns).iter().all(|(_, sidecar)| *sidecar));
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: in-flight, namespace: {ns}}}\n\
         spec:\n  image: {big}\n  parallelism: 1\n  selector: {{names: [{names}]}}\n  \
         completionPolicy: {{type: Always}}\n",
        ns = ns.name,
        big = via_proxy(&big_repo),
    ));
    wait_status(cluster, &ns.name, "imagepulljob", "in-flight", |s| {
        s["succeeded"].as_u64().unwrap_or(0) >= 1
    });
    let done_before = cluster.object_status(&ns.name, "imagepulljob", "done");

    // Kruise to Rigger, by the guide.
    run_guide(cluster, work.path(), "to-rigger", &ns.name);
    // The job was under way when the move began (the guide's backup, before its pause).
    let backup: Value = serde_json::from_slice(
        &std::fs::read(work.path().join("kruise-backup/objects.json")).unwrap(),
    )
    .unwrap();
    let at_move = backup["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["metadata"]["name"] == "in-flight")
        .map(|o| o["status"].clone())
        .unwrap();
    assert!(
        at_move["completionTime"].is_null()
            && at_move["succeeded"].as_u64().unwrap_or(0) < nodes.len() as u64,
        "the job had finished before the move: {at_move}"
    );
    eprintln!("in-flight at the move (Kruise's status): {at_move}");

    let big = wait_status(cluster, &ns.name, "imagepulljob", "in-flight", |s| {
        !s["completionTime"].is_null()
    });
    assert_eq!(big["succeeded"], nodes.len(), "{big}");
    let always_on = never_work_done(cluster, &ns.name, nodes.len());
    assert!(
        always_on["completionTime"].is_null(),
        "a Never job completed: {always_on}"
    );
    let done = cluster.object_status(&ns.name, "imagepulljob", "done");
    assert_eq!(
        done["completionTime"], done_before["completionTime"],
        "{done}"
    );
    for node in &nodes {
        assert!(
            cluster.has_image(node, &via_proxy(&big_repo)),
            "{node} lacks the big image"
        );
    }
    // Each node fetched each image once at most (Rigger may fetch less: nodes share).
    let size = |repo: &str, layers: u64, per_layer: u64| (repo.to_owned(), layers * per_layer);
    let images = [
        size(&repo_of(&big_repo), 3, 8 << 20),
        size(&repo_of(&small_repo), 1, 512 << 10),
        size(&repo_of(&listed_repo), 1, 512 << 10),
    ];
    let served: Vec<u64> = images
        .iter()
        .map(|(repo, _)| blob_bytes(&proxy, repo))
        .collect();
    for ((repo, bytes), served) in images.iter().zip(&served) {
        let most = (nodes.len() as u64) * bytes * 11 / 10;
        eprintln!(
            "{repo}: {served} bytes served for {} nodes of {bytes}",
            nodes.len()
        );
        assert!(
            *served <= most,
            "{repo}: {served} bytes served, more than once per node ({most})"
        );
    }
    scale_and_check(cluster, &ns, 3, "Rigger");

    // And back, by the guide.
    run_guide(cluster, work.path(), "to-kruise", &ns.name);

    let big = cluster.object_status(&ns.name, "imagepulljob", "in-flight");
    assert!(!big["completionTime"].is_null(), "{big}");
    never_work_done(cluster, &ns.name, nodes.len());
    let after: Vec<u64> = images
        .iter()
        .map(|(repo, _)| blob_bytes(&proxy, repo))
        .collect();
    assert_eq!(
        after, served,
        "a node fetched an image again after the move back"
    );
    scale_and_check(cluster, &ns, 4, "Kruise");

    cluster.forget_deployment();
}
