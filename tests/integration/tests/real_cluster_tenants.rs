//! RBAC on the lab's real cluster, enforced by its API server (`Node,RBAC`): Rigger's
//! controller has only deploy/kubernetes/rbac.yaml, and a tenant with rights in one
//! namespace cannot make Rigger act in another.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rigger_integration_tests::real_cluster::{ClusterNamespace, DeletedOnDrop, RealCluster};
use rigger_integration_tests::{unique_image_with, wait_until};
use serde_json::Value;

const CONTROLLER: &str = "system:serviceaccount:rigger-system:rigger-controller";

/// Every request the controller's ServiceAccount made in this cluster (all the real
/// cluster's tests before this one too) was allowed: rbac.yaml grants what its code does.
#[test]
fn the_controller_is_never_refused_by_rbac() {
    let cluster = RealCluster::get();
    // At least one job's worth of calls.
    let ns = cluster.namespace("rbac");
    let image = cluster.image(&unique_image_with("rbac", 1, 16 << 10, &["--base", "none"]));
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: j, namespace: {ns}}}\n\
         spec:\n  image: {image}\n  completionPolicy: {{type: Always}}\n",
        ns = ns.name
    ));
    cluster.kubectl_ok(&[
        "-n",
        &ns.name,
        "wait",
        "imagepulljob/j",
        "--for=jsonpath={.status.completionTime}",
        "--timeout=120s",
    ]);
    let audit = std::fs::read_to_string(&cluster.audit_log).unwrap();
    let mut calls = 0;
    let refused: Vec<String> = audit
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event["user"]["username"] == CONTROLLER)
        .inspect(|_| calls += 1)
        // RBAC's refusals (a write into a namespace being deleted is a 403 too, not RBAC's).
        .filter(|event| event["annotations"]["authorization.k8s.io/decision"] == "forbid")
        .map(|event| format!("{} {}", event["verb"], event["requestURI"]))
        .collect();
    assert!(calls > 0, "the audit log has no call of {CONTROLLER}");
    assert!(
        refused.is_empty(),
        "RBAC refused the controller: {refused:#?}"
    );
}

/// A tenant with every right on Rigger's kinds, pods and Secrets in namespace A only:
/// a recreate request of theirs that names B's pod does not touch it, a job of theirs
/// that names B's pull Secret does not get it, and they can make no SidecarSet (a
/// cluster-wide kind) and nothing in B.
#[test]
fn a_tenant_of_one_namespace_cannot_make_rigger_act_in_another() {
    let cluster = RealCluster::get();
    let (mine, theirs) = (cluster.namespace("tenant"), cluster.namespace("victim"));
    let tenant = format!("tenant-{}", std::process::id());
    cluster.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: everything, namespace: {ns}}}\n\
         rules:\n- {{apiGroups: [apps.kruise.io, '', apps], resources: ['*'], verbs: ['*']}}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: everything, namespace: {ns}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: everything}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {tenant}}}]\n",
        ns = mine.name
    ));
    let busybox = cluster.image("rigger-lab/busybox:1");
    cluster.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: app, namespace: {ns}}}\nspec:\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {busybox}\n    \
         command: [sleep, '3600']\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: cred, namespace: {ns}}}\n\
         type: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{{\"auths\": {{}}}}'\n",
        ns = theirs.name
    ));
    let running = |cluster: &RealCluster| {
        let pod = cluster.get_json(&["pod", "app", "-n", &theirs.name])?;
        let status = pod["status"]["containerStatuses"][0].clone();
        (status["ready"] == true).then_some(status)
    };
    let before = wait_until(
        "the other namespace's pod",
        Duration::from_secs(120),
        || running(cluster),
    );
    let as_tenant = |args: &[&str], yaml: &str| {
        let mut all = vec!["--as", tenant.as_str()];
        all.extend_from_slice(args);
        cluster.kubectl_stdin(&all, yaml)
    };

    // Nothing in the other namespace, and no cluster-wide SidecarSet.
    let refused = as_tenant(
        &["create"],
        &format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\n\
             metadata: {{name: r, namespace: {ns}}}\nspec: {{podName: app, containers: [{{name: app}}]}}\n",
            ns = theirs.name
        ),
    );
    assert!(
        !refused.status.success(),
        "the tenant made a request in another namespace"
    );
    let refused = as_tenant(
        &["create"],
        &format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {{name: {tenant}}}\n\
             spec: {{selector: {{matchLabels: {{app: x}}}}, containers: [{{name: s, image: {busybox}}}]}}\n"
        ),
    );
    assert!(!refused.status.success(), "the tenant made a SidecarSet");

    // A recreate request in their own namespace names the other's pod: there is no such
    // pod in theirs; the other's is not touched.
    let out = as_tenant(
        &["create"],
        &format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ContainerRecreateRequest\n\
             metadata: {{name: r, namespace: {ns}}}\nspec: {{podName: app, containers: [{{name: app}}]}}\n",
            ns = mine.name
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let request = wait_until("the request to end", Duration::from_secs(60), || {
        let request = cluster.get_json(&["containerrecreaterequest", "r", "-n", &mine.name])?;
        (request["status"]["phase"] == "Completed").then_some(request)
    });
    assert_ne!(
        request["status"]["containerRecreateStates"][0]["phase"], "Succeeded",
        "{request}"
    );

    // A job in their namespace names a pull Secret that exists only in the other's.
    let image = cluster.image(&unique_image_with(
        "tenant",
        1,
        16 << 10,
        &["--base", "none"],
    ));
    let node = &cluster.nodes()[0];
    let out = as_tenant(
        &["create"],
        &format!(
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {{name: j, namespace: {ns}}}\n\
             spec:\n  image: {image}\n  selector: {{names: [{node}]}}\n  pullSecrets: [cred]\n  \
             completionPolicy: {{type: Always}}\n",
            ns = mine.name
        ),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = wait_until("the job to end", Duration::from_secs(60), || {
        let job = cluster.get_json(&["imagepulljob", "j", "-n", &mine.name])?;
        job["status"]["completionTime"].is_string().then_some(job)
    });
    assert_eq!(job["status"]["failed"], 1, "{job}");
    // Why, as Kruise tells a node's pull: an Event on the job.
    let said = wait_until("the job's event", Duration::from_secs(30), || {
        let events = cluster.events_of(&mine.name, "j");
        events
            .iter()
            .any(|e| e.contains("cred") && e.contains("does not exist"))
            .then_some(events)
    });
    assert!(
        !said.iter().any(|e| e.contains(&theirs.name)),
        "the other namespace's Secret was read: {said:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let after = running(cluster).expect("the other namespace's pod is still running");
    assert_eq!(after["containerID"], before["containerID"]);
    assert_eq!(after["restartCount"], before["restartCount"]);
}

/// Scenario 6: a node's own credentials (its kubelet's) may label its Node, but cannot draw
/// a job's pull secrets to it. The rule: a job with `pullSecrets` chooses nodes by name or
/// by Node labels under `node-restriction.kubernetes.io/`, which the API server's
/// NodeRestriction keeps from kubelets.
#[test]
fn a_nodes_own_credentials_labelling_its_node_cannot_draw_a_jobs_pull_secrets() {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("drawn");
    let nodes = cluster.nodes();
    let (chosen, greedy) = (&nodes[0], &nodes[1]);
    let id = std::process::id();
    let (plain, fenced) = (
        format!("pool-{id}"),
        format!("node-restriction.kubernetes.io/pool-{id}"),
    );
    let as_kubelet = |args: &[&str]| {
        let kubeconfig = cluster.dir.join(format!("kubelet-{greedy}.kubeconfig"));
        std::process::Command::new(&cluster.binary)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .unwrap()
    };
    // The kubelet labels its own Node as the job's selector asks; it may not set the
    // fenced label.
    let out = as_kubelet(&["label", "node", greedy, &format!("{plain}=warm")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = as_kubelet(&["label", "node", greedy, &format!("{fenced}=warm")]);
    assert!(
        !out.status.success(),
        "NodeRestriction let a kubelet set {fenced}"
    );
    // The admin fences the chosen node.
    cluster.kubectl_ok(&[
        "label",
        "node",
        chosen,
        &format!("{fenced}=warm"),
        &format!("{plain}=warm"),
    ]);

    cluster.apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: cred, namespace: {ns}}}\ntype: kubernetes.io/dockerconfigjson\n\
         stringData:\n  .dockerconfigjson: '{{\"auths\": {{}}}}'\n",
        ns = ns.name
    ));
    let image = cluster.image(&unique_image_with(
        "drawn",
        1,
        16 << 10,
        &["--base", "none"],
    ));
    for (job, key) in [("by-plain", &plain), ("by-fenced", &fenced)] {
        cluster.apply(&format!(
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {{name: {job}, namespace: {ns}}}\n\
             spec:\n  image: {image}\n  selector: {{matchLabels: {{{key}: warm}}}}\n  pullSecrets: [cred]\n  \
             completionPolicy: {{type: Always}}\n",
            ns = ns.name
        ));
    }
    let done = |job: &str| {
        wait_until(
            &format!("job {job} to end"),
            Duration::from_secs(90),
            || {
                let job = cluster.get_json(&["imagepulljob", job, "-n", &ns.name])?;
                job["status"]["completionTime"]
                    .is_string()
                    .then_some(job["status"].clone())
            },
        )
    };
    let by_plain = done("by-plain");
    assert_eq!(
        by_plain["desired"], 0,
        "a label a kubelet can set chose nodes for a secret: {by_plain}"
    );
    let by_fenced = done("by-fenced");
    assert_eq!(by_fenced["desired"], 1, "{by_fenced}");
    assert_eq!(by_fenced["succeeded"], 1, "{by_fenced}");
    assert!(cluster.has_image(chosen, &image));
    assert!(
        !cluster.has_image(greedy, &image),
        "{greedy} drew the job to it"
    );

    for node in [chosen, greedy] {
        let _ = cluster.kubectl(&[
            "label",
            "node",
            node,
            &format!("{plain}-"),
            &format!("{fenced}-"),
        ]);
    }
}

/// Tenants flood the SidecarSet webhook: four addresses each hold 64 connections to
/// every replica (48 silent, 16 sending garbage), opened again as soon as the webhook
/// closes them. Pods a SidecarSet matches, created six at once, are still admitted with
/// their sidecar: each answered within the webhook's 10 s timeout, since past it the API
/// server refuses the pod (failure policy Fail). A namespace, or a pod, labelled
/// `rigger.dev/sidecar-injection: disabled` is never sent.
///
/// The flood comes from this process (`Flood`: 512 sockets on one thread, no process
/// forked per connection), from four of the machine's cluster addresses that are not the
/// API server's: what the webhook tells apart is the source address, as it would be four
/// tenant pods'.
#[test]
fn the_webhook_answers_the_api_server_while_tenants_flood_it_and_skips_opted_out_pods() {
    sidecars_among_tenants(true);
}

/// A namespace, or a pod, labelled `rigger.dev/sidecar-injection: disabled` is never
/// sent to the SidecarSet webhook, whatever a set selects; six matched pods created at
/// once beside them get their sidecar.
#[test]
fn pods_and_namespaces_that_opt_out_are_never_sent_to_the_webhook() {
    sidecars_among_tenants(false);
}

fn sidecars_among_tenants(flood: bool) {
    let cluster = RealCluster::get();
    let ns = cluster.namespace("flood");
    let opted_out = cluster.namespace("optout");
    cluster.kubectl_ok(&[
        "label",
        "namespace",
        &opted_out.name,
        "rigger.dev/sidecar-injection=disabled",
    ]);
    let set = format!("flood-{}", std::process::id());
    let _guard = DeletedOnDrop(cluster, "sidecarset", set.clone());
    let busybox = cluster.image("rigger-lab/busybox:1");
    cluster.apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {{name: {set}}}\n\
         spec:\n  selector: {{matchLabels: {{app: {set}}}}}\n  containers:\n  - name: side\n    \
         image: {busybox}\n    command: [sleep, '3600']\n"
    ));
    let pod = |namespace: &str, name: &str, extra_labels: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}, \
             labels: {{app: {set}{extra_labels}}}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  \
             containers:\n  - name: app\n    image: {busybox}\n    command: [sleep, '3600']\n"
        )
    };
    let containers = |namespace: &str, name: &str| {
        cluster
            .get_json(&["pod", name, "-n", namespace])
            .map(|p| p["spec"]["containers"].as_array().map_or(0, Vec::len))
    };
    // The set's webhook entry reaches the API server a moment after the set.
    let mut probe = 0;
    wait_until(
        "the set's webhook entry to inject",
        Duration::from_secs(120),
        || {
            probe += 1;
            let name = format!("probe-{probe}");
            let created = cluster.kubectl_stdin(&["create"], &pod(&ns.name, &name, ""));
            let injected = created.status.success() && containers(&ns.name, &name) == Some(2);
            let _ = cluster.kubectl(&["-n", &ns.name, "delete", "pod", &name, "--wait=false"]);
            injected.then_some(())
        },
    );

    let (_flood, held) = if flood {
        let (flood, held) = start_flood(cluster);
        (Some(flood), held)
    } else {
        (None, Vec::new())
    };

    // Six matched pods at once: each admitted with its sidecar, within the timeout.
    let admitted = create_matched(cluster, &ns, &pod);
    for (index, (said, took, ok)) in admitted.iter().enumerate() {
        // Created is answered in time: the API server waits 10 s, then refuses.
        assert!(
            *ok,
            "pod matched-{index} refused after {took:?} while tenants held {held:?} connections: {said}"
        );
        eprintln!("matched-{index} admitted in {took:?} (kubectl's whole run)");
        assert_eq!(
            containers(&ns.name, &format!("matched-{index}")),
            Some(2),
            "matched-{index} has no sidecar"
        );
    }

    // Opted out, by its namespace or by its own label: admitted as written.
    let created = cluster.kubectl_stdin(&["create"], &pod(&opted_out.name, "free", ""));
    assert!(created.status.success(), "{created:?}");
    assert_eq!(containers(&opted_out.name, "free"), Some(1));
    let created = cluster.kubectl_stdin(
        &["create"],
        &pod(
            &ns.name,
            "own-label",
            ", rigger.dev/sidecar-injection: disabled",
        ),
    );
    assert!(created.status.success(), "{created:?}");
    assert_eq!(containers(&ns.name, "own-label"), Some(1));
}

/// Six pods made at once from `pod`: what kubectl said, how long it took, whether it
/// succeeded.
fn create_matched(
    cluster: &'static RealCluster,
    ns: &ClusterNamespace,
    pod: &(dyn Fn(&str, &str, &str) -> String + Sync),
) -> Vec<(String, Duration, bool)> {
    std::thread::scope(|scope| {
        let creating: Vec<_> = (0..6)
            .map(|index| {
                scope.spawn(move || {
                    let name = format!("matched-{index}");
                    let started = std::time::Instant::now();
                    let out = cluster.kubectl_stdin(&["create"], &pod(&ns.name, &name, ""));
                    let took = started.elapsed();
                    let said = format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    (said, took, out.status.success())
                })
            })
            .collect();
        creating.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// The flood, from four of the machine's cluster addresses at every replica's own
/// address; how many connections each address holds once it runs.
fn start_flood(cluster: &'static RealCluster) -> (Flood, Vec<usize>) {
    let replicas: Vec<SocketAddr> = cluster
        .get_json(&[
            "pods",
            "-n",
            "rigger-system",
            "-l",
            "app.kubernetes.io/name=rigger-controller",
        ])
        .unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["status"]["podIP"].as_str()?.parse().ok())
        .map(|ip| SocketAddr::new(ip, 9443))
        .collect();
    assert!(!replicas.is_empty(), "no controller replica has an address");
    let flood = Flood::start(&tenant_addresses(), &replicas);
    let held = wait_until(
        "the tenants to hold connections to the webhook",
        Duration::from_secs(60),
        || {
            let held = flood.held();
            held.iter().all(|held| *held >= 4).then_some(held)
        },
    );
    std::thread::sleep(Duration::from_secs(5));
    (flood, held)
}

/// Four of the lab's cluster addresses on this machine (the nodes' 10.250.0.1N and
/// CoreDNS's 10.250.0.10), none the API server's (10.250.0.1; its calls to the webhook
/// come through the Service, masqueraded to a bridge's address).
fn tenant_addresses() -> Vec<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", "lo"])
        .output()
        .unwrap();
    let addresses: Vec<IpAddr> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|word| word.strip_suffix("/32")?.parse::<Ipv4Addr>().ok())
        .filter(|ip| ip.octets()[..3] == [10, 250, 0] && ip.octets()[3] >= 10)
        .map(IpAddr::V4)
        .take(4)
        .collect();
    assert_eq!(
        addresses.len(),
        4,
        "the lab's cluster addresses on lo: {addresses:?}"
    );
    addresses
}

/// 64 connections from each source to each target, on one thread: 48 silent (a TLS
/// handshake that never comes), 16 sending 300 bytes of garbage; each opened again 2 s
/// after the far end closes it. Stopped when dropped.
struct Flood {
    held: Arc<Vec<AtomicUsize>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(sources: &[IpAddr], targets: &[SocketAddr]) -> Self {
        let held: Arc<Vec<AtomicUsize>> =
            Arc::new(sources.iter().map(|_| AtomicUsize::new(0)).collect());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let connections: Vec<(usize, IpAddr, SocketAddr, bool)> = sources
            .iter()
            .enumerate()
            .flat_map(|(index, source)| {
                targets
                    .iter()
                    .flat_map(move |target| (0..64).map(move |n| (index, *source, *target, n < 16)))
            })
            .collect();
        let counts = Arc::clone(&held);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                for (index, source, target, garbage) in connections {
                    tokio::spawn(hold(Arc::clone(&counts), index, source, target, garbage));
                }
                let _ = stopped.await;
            });
        });
        Flood {
            held,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// How many connections each source holds now.
    fn held(&self) -> Vec<usize> {
        self.held
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One of the flood's connections, for ever: connect from `source`, send garbage or
/// nothing, wait for the far end to close, 2 s, again.
async fn hold(
    held: Arc<Vec<AtomicUsize>>,
    index: usize,
    source: IpAddr,
    target: SocketAddr,
    garbage: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut noise = (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    loop {
        let connected = async {
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(SocketAddr::new(source, 0)).ok()?;
            tokio::time::timeout(Duration::from_secs(3), socket.connect(target))
                .await
                .ok()?
                .ok()
        }
        .await;
        if let Some(mut stream) = connected {
            held[index].fetch_add(1, Ordering::Relaxed);
            if garbage {
                let bytes: Vec<u8> = (0..300)
                    .map(|_| {
                        noise ^= noise << 13;
                        noise ^= noise >> 7;
                        noise ^= noise << 17;
                        noise.to_le_bytes()[0]
                    })
                    .collect();
                let _ = stream.write_all(&bytes).await;
            }
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            held[index].fetch_sub(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
