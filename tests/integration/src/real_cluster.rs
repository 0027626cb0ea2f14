//! The lab's real Kubernetes cluster (`scripts/lab-cluster`: kube-apiserver,
//! kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS, and nodes that are
//! each a kubelet on a containerd of their own) with Rigger deployed in it as a user
//! deploys it (`scripts/lab-rigger`: its image, the Secrets, `kubectl apply -k`). `make
//! test` brings both up in its lab step; a test run alone brings them up on first use.
//!
//! The tests on it run one at a time (nextest's `real-cluster` group): some restart
//! Rigger's own pods or add a node, which every other test there would see.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Lab, repo_root, wait_until};

/// The cluster, as kubectl and the tests reach it.
#[derive(Debug)]
pub struct RealCluster {
    /// kubectl as the cluster's admin (what `cluster.kubectl_ok(...)` and the others run;
    /// `cluster.binary` and `cluster.kubeconfig` are its paths).
    pub client: crate::kubectl::Kubectl,
    pub dir: PathBuf,
    /// `HOST:PORT` of the registry as the cluster's nodes and pods reach it (the lab
    /// registry's data).
    pub registry: String,
    /// The API server's audit log (every request, who made it).
    pub audit_log: PathBuf,
    /// Where `scripts/lab-rigger` keeps Rigger's PKI (`riggerctl.toml`, `tokens.csv`).
    pub rigger_pki: PathBuf,
}

use crate::kubernetes::read_env;

fn run_script(script: &str, args: &[&str]) -> String {
    let out = Command::new(repo_root().join(script))
        .args(args)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// How Rigger is deployed in the cluster: alone (`deploy/kubernetes-lab`), or as Kruise's
/// daemon beside Kruise's own manager (`deploy/kubernetes-lab-beside-kruise`, with
/// `scripts/lab-kruise up --without-daemon`), or not at all, Kruise (manager and daemon)
/// in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deployment {
    Alone,
    BesideKruise,
    KruiseAlone,
}

impl Deployment {
    /// The deployment `scripts/lab-rigger` last made (the overlay it records), if any.
    fn current(dir: &std::path::Path) -> Option<Deployment> {
        let overlay = std::fs::read_to_string(dir.join(".rigger-overlay")).ok()?;
        Some(
            if overlay.trim().ends_with("kubernetes-lab-beside-kruise") {
                Deployment::BesideKruise
            } else {
                Deployment::Alone
            },
        )
    }

    /// Make it so, unless it is (one test process at a time: the others wait, then find
    /// it made): Kruise's manager installed or removed, Rigger deployed to match.
    fn make_unless_made(self, dir: &std::path::Path, deployed: impl Fn() -> bool) {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(".deployment-lock"))
            .unwrap();
        let _only_us = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).unwrap();
        if self != Deployment::KruiseAlone && deployed() && Deployment::current(dir) == Some(self) {
            return;
        }
        match self {
            Deployment::Alone => {
                run_script("scripts/lab-kruise", &["down"]);
                run_script("scripts/lab-rigger", &["up", "--no-build"]);
            }
            Deployment::BesideKruise => {
                // Rigger alone goes first: its CRDs have the names of Kruise's.
                run_script("scripts/lab-rigger", &["down"]);
                run_script("scripts/lab-kruise", &["up", "--without-daemon"]);
                run_script(
                    "scripts/lab-rigger",
                    &["up", "--no-build", "--beside-kruise"],
                );
            }
            Deployment::KruiseAlone => {
                // Kruise afresh: a manager that saw its CRDs deleted (by `lab-rigger down`
                // of Rigger alone, whose CRDs have the same names) keeps stale caches.
                run_script("scripts/lab-rigger", &["down"]);
                run_script("scripts/lab-kruise", &["down"]);
                run_script("scripts/lab-kruise", &["up"]);
            }
        }
    }
}

impl RealCluster {
    /// The cluster, started if it is not running, with Rigger deployed alone and rolled
    /// out (redeployed so if it runs beside Kruise's manager).
    pub fn get() -> &'static RealCluster {
        static CLUSTER: OnceLock<RealCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| RealCluster::connect(Deployment::Alone))
    }

    /// The cluster with Kruise v1.9.0's own manager (its controllers and webhooks,
    /// `scripts/lab-kruise`) and Rigger's agents in kruise-daemon's place, deployed so if
    /// it is not. The tests on it run in a stage of their own (nextest's `beside-kruise`
    /// profile), never beside the tests of Rigger alone.
    pub fn beside_kruise() -> &'static RealCluster {
        static CLUSTER: OnceLock<RealCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| RealCluster::connect(Deployment::BesideKruise))
    }

    /// The cluster with OpenKruise v1.9.0 alone (its manager and kruise-daemon) and no
    /// Rigger: where a move to Rigger starts. Made anew in each test process that asks;
    /// the one test that uses it runs in a stage of its own (nextest's `migration`
    /// profile), and ends with [`RealCluster::forget_deployment`]: the next
    /// [`RealCluster::get`] removes Kruise and deploys Rigger afresh.
    pub fn kruise_alone() -> &'static RealCluster {
        static CLUSTER: OnceLock<RealCluster> = OnceLock::new();
        CLUSTER.get_or_init(|| RealCluster::connect(Deployment::KruiseAlone))
    }

    /// Forget which deployment `scripts/lab-rigger` made last (a test changed it by
    /// other means).
    pub fn forget_deployment(&self) {
        let _ = std::fs::remove_file(self.dir.join(".rigger-overlay"));
    }

    fn connect(wanted: Deployment) -> RealCluster {
        let lab = Lab::get();
        let env_file = lab.dir.join("cluster/env");
        if read_env(&env_file).is_none() {
            run_script("scripts/lab-cluster", &["up"]);
        }
        let env = read_env(&env_file).expect("scripts/lab-cluster wrote no env file");
        let cluster = RealCluster {
            dir: env["RIGGER_LAB_CLUSTER_DIR"].clone().into(),
            client: crate::kubectl::Kubectl {
                binary: env["RIGGER_LAB_CLUSTER_KUBECTL"].clone().into(),
                kubeconfig: env["RIGGER_LAB_CLUSTER_KUBECONFIG"].clone().into(),
            },
            registry: env["RIGGER_LAB_CLUSTER_REGISTRY"].clone(),
            audit_log: env["RIGGER_LAB_CLUSTER_AUDIT_LOG"].clone().into(),
            rigger_pki: lab.dir.join("cluster/rigger-pki"),
        };
        wanted.make_unless_made(&cluster.dir, || {
            cluster
                .kubectl(&["-n", "rigger-system", "get", "deployment/rigger-controller"])
                .status
                .success()
        });
        cluster
    }

    /// `kubectl apply -f -` of `yaml`; panics with the error.
    pub fn apply(&self, yaml: &str) {
        let out = self.kubectl_stdin(&["apply"], yaml);
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The nodes' names (kube-1, kube-2, ...).
    pub fn nodes(&self) -> Vec<String> {
        self.kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"])
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// `REGISTRY/REPO:TAG` as the cluster pulls it, of an image the lab pushed as
    /// `repo_and_tag` (`rigger-lab/...`).
    pub fn image(&self, repo_and_tag: &str) -> String {
        format!("{}/{repo_and_tag}", self.registry)
    }

    /// `ctr ARGS` in namespace `k8s.io` of `node`'s containerd (in the node's own mount
    /// namespace, where its socket is containerd's default).
    pub fn ctr(&self, node: &str, args: &[&str]) -> String {
        let series = std::fs::read_to_string(self.dir.join(format!("nodes/{node}/series")))
            .unwrap_or_else(|e| panic!("node {node} is not one of the lab's: {e}"));
        let cache = std::env::var("RIGGER_LAB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|_| Lab::get().dir.join("cache"));
        let ctr = cache.join(format!("containerd/{}/usr/bin/ctr", series.trim()));
        let out = Command::new("nsenter")
            .arg(format!(
                "--mount={}",
                self.dir.join("ns").join(node).display()
            ))
            .arg("--")
            .arg(ctr)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ctr {} on {node}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Whether `node`'s containerd has an image record named `reference`.
    pub fn has_image(&self, node: &str, reference: &str) -> bool {
        self.ctr(node, &["images", "ls", "-q"])
            .lines()
            .any(|line| line == reference)
    }

    /// `kind/name`'s status in `namespace` (`null` when it is absent).
    pub fn object_status(&self, namespace: &str, kind: &str, name: &str) -> serde_json::Value {
        self.get_json(&[kind, name, "-n", namespace])
            .map(|object| object["status"].clone())
            .unwrap_or_default()
    }

    /// Wait until `kind/name`'s status satisfies `done`; that status. Panics with the last
    /// status seen and Rigger's state.
    pub fn wait_status(
        &self,
        namespace: &str,
        kind: &str,
        name: &str,
        within: Duration,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        let found = crate::poll_until(within, Duration::from_millis(500), || {
            last = self.object_status(namespace, kind, name);
            done(&last).then(|| last.clone())
        });
        found.unwrap_or_else(|| {
            panic!(
                "{kind}/{name}: not done within {within:?}; its status: {last}\n{}",
                self.rigger_state()
            )
        })
    }

    /// The cluster's nodes (their containerd, and so kubelet, kruise-daemon and Rigger's
    /// agent) reach `address` (`HOST:PORT`) as a plain-HTTP registry, by containerd's
    /// hosts directory; undone when dropped.
    pub fn registry_host(&self, address: &str) -> RegistryHost {
        let dirs: Vec<PathBuf> = self
            .nodes()
            .iter()
            .map(|node| {
                self.dir
                    .join("nodes")
                    .join(node)
                    .join("etc/upper/containerd/certs.d")
                    .join(address)
            })
            .collect();
        for dir in &dirs {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(
                dir.join("hosts.toml"),
                format!(
                    "server = \"http://{address}\"\n[host.\"http://{address}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )
            .unwrap();
        }
        RegistryHost { dirs }
    }

    /// A namespace of the test's own (deleted, with what is in it, when dropped).
    pub fn namespace(&'static self, prefix: &str) -> ClusterNamespace {
        let name = format!("{prefix}-{}", std::process::id());
        self.kubectl_ok(&["create", "namespace", &name]);
        // Pods need the namespace's default ServiceAccount, which a controller makes.
        wait_until(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            || {
                self.kubectl(&["-n", &name, "get", "serviceaccount", "default"])
                    .status
                    .success()
                    .then_some(())
            },
        );
        ClusterNamespace {
            cluster: self,
            name,
        }
    }

    /// `kubectl rollout status` of `object` (`KIND/NAME`) in `namespace` within `timeout`;
    /// on failure, panics with what Rigger's pods look like (`rigger_state`).
    pub fn rollout_status(&self, namespace: &str, object: &str, timeout: Duration) {
        let timeout = format!("--timeout={}s", timeout.as_secs());
        let out = self.kubectl(&["-n", namespace, "rollout", "status", object, &timeout]);
        assert!(
            out.status.success(),
            "rollout status {object}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.rigger_state()
        );
    }

    /// What Rigger's pods look like now, for a failure's message: its pods, the latest
    /// events of rigger-system, the Lease's holder and the controllers' last log lines.
    pub fn rigger_state(&self) -> String {
        let text = |args: &[&str]| {
            let out = self.kubectl(args);
            format!(
                "$ kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        // The namespace's events reach back to the cluster's start (a failure in CI
        // printed hundreds): the newest, as the controller's log lines.
        let events = self.kubectl(&[
            "-n",
            "rigger-system",
            "get",
            "events",
            "--sort-by=.lastTimestamp",
        ]);
        [
            text(&["-n", "rigger-system", "get", "pods", "-o", "wide"]),
            format!(
                "events of rigger-system (the last 30):\n{}{}",
                last_lines(&String::from_utf8_lossy(&events.stdout), 30),
                String::from_utf8_lossy(&events.stderr)
            ),
            text(&[
                "-n",
                "rigger-system",
                "get",
                "lease",
                "rigger-controller",
                "-o",
                "yaml",
            ]),
            format!(
                "controller logs (last 60 lines):\n{}",
                last_lines(&self.rigger_logs("rigger-controller"), 60)
            ),
        ]
        .join("\n")
    }

    /// The events of `namespace` about `object` (`NAME`), as `reason: message` lines.
    pub fn events_of(&self, namespace: &str, object: &str) -> Vec<String> {
        let selector = format!("involvedObject.name={object}");
        let events = self
            .get_json(&["events", "-n", namespace, "--field-selector", &selector])
            .unwrap();
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                format!(
                    "{}: {}",
                    e["reason"].as_str().unwrap_or_default(),
                    e["message"].as_str().unwrap_or_default()
                )
            })
            .collect()
    }

    /// The agent pod on `node`.
    pub fn agent_pod(&self, node: &str) -> String {
        let selector = format!("spec.nodeName={node}");
        self.kubectl_ok(&[
            "-n",
            "rigger-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=rigger-agent",
            "--field-selector",
            &selector,
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
    }

    /// The logs of every pod of Rigger's component `name` (rigger-agent,
    /// rigger-controller), including the ones before a restart.
    pub fn rigger_logs(&self, name: &str) -> String {
        let selector = format!("app.kubernetes.io/name={name}");
        let out = self.kubectl(&[
            "-n",
            "rigger-system",
            "logs",
            "-l",
            &selector,
            "--tail=-1",
            "--prefix",
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A test's steps on its standard error with the time since it began: when a step hangs
/// until the harness ends the test, its output says which.
#[derive(Debug)]
pub struct Progress(std::time::Instant);

impl Progress {
    pub fn start() -> Self {
        Self(std::time::Instant::now())
    }

    pub fn say(&self, what: &str) {
        eprintln!("[{:6.1} s] {what}", self.0.elapsed().as_secs_f64());
    }
}

/// A namespace of one test in the real cluster: its namespace controller empties it.
/// A cluster-scoped object the test made (`KIND`, `NAME`), deleted when the test ends,
/// passed or not.
#[derive(Debug)]
pub struct DeletedOnDrop(pub &'static RealCluster, pub &'static str, pub String);

impl Drop for DeletedOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kubectl(&["delete", self.1, &self.2, "--wait=false"]);
    }
}

/// What [`RealCluster::registry_host`] wrote, removed when dropped.
#[derive(Debug)]
pub struct RegistryHost {
    dirs: Vec<PathBuf>,
}

impl Drop for RegistryHost {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[derive(Debug)]
pub struct ClusterNamespace {
    cluster: &'static RealCluster,
    pub name: String,
}

impl Drop for ClusterNamespace {
    fn drop(&mut self) {
        let _ = self
            .cluster
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// The status of container `name` in `pod` (a Pod as kubectl prints it in JSON).
pub fn container_status<'a>(pod: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("the pod has no container {name}: {pod}"))
}

/// Seconds since the epoch of an RFC 3339 time the API server wrote
/// (`2026-11-29T14:10:42Z`: whole seconds, UTC).
pub fn epoch_seconds(rfc3339: &serde_json::Value) -> i64 {
    let text = rfc3339
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {rfc3339}"));
    let out = Command::new("date")
        .args(["-u", "-d", text, "+%s"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// `scripts/lab-cluster ARGS` (join a node, let one leave); its standard output.
pub fn lab_cluster(args: &[&str]) -> String {
    run_script("scripts/lab-cluster", args).trim().to_owned()
}

/// `scripts/lab-rigger ARGS`; its standard output.
pub fn lab_rigger(args: &[&str]) -> String {
    run_script("scripts/lab-rigger", args).trim().to_owned()
}

impl std::ops::Deref for RealCluster {
    type Target = crate::kubectl::Kubectl;

    fn deref(&self) -> &Self::Target {
        &self.client
    }
}
