//! The lab's Kubernetes API (`scripts/lab-k8s`): a real API server built from
//! Kubernetes' own libraries, on etcd, with kubectl. Started on first use. Tests share
//! it, so each works in a namespace of its own ([`Cluster::namespace`]) and names the
//! cluster-wide objects it makes (Nodes) uniquely.
//!
//! A controller on a cluster acts on every namespace's objects, as one Rigger per cluster
//! does; two tests' controllers on one API server would each take the other's jobs. So a
//! test that runs a controller holds [`Cluster::exclusive`] (a file lock: nextest runs
//! tests in separate processes).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::{Agent, Controller, LabNode, repo_root};

/// The lab's API server, as kubectl reaches it.
#[derive(Debug)]
pub struct Cluster {
    /// kubectl as the cluster's admin (what `cluster.kubectl_ok(...)` and the others run;
    /// `cluster.binary` and `cluster.kubeconfig` are its paths).
    pub client: crate::kubectl::Kubectl,
    /// The identity Rigger's controller runs as in tests (`CN=rigger-controller`): its
    /// calls are told apart in the audit log.
    pub controller_kubeconfig: PathBuf,
    /// Every request the API server served, with who made it (JSON lines).
    pub audit_log: PathBuf,
    /// Where the lab's Kubernetes CA lives (`ca.pem`, `ca-key.pem`).
    pub dir: PathBuf,
}

/// The `NAME=value` lines of a lab script's env file.
pub(crate) fn read_env(
    path: &std::path::Path,
) -> Option<std::collections::HashMap<String, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

impl Cluster {
    /// The lab's API server, started if it is not running, with Rigger's CRDs applied
    /// and established.
    pub fn get() -> &'static Cluster {
        static CLUSTER: OnceLock<Cluster> = OnceLock::new();
        CLUSTER.get_or_init(|| {
            let out = Command::new(repo_root().join("scripts/lab-k8s"))
                .arg("up")
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(out.status.success(), "scripts/lab-k8s up failed");
            let env_file = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
            let env = read_env(&env_file).expect("scripts/lab-k8s wrote no env file");
            let cluster = Cluster {
                controller_kubeconfig: env["RIGGER_LAB_CONTROLLER_KUBECONFIG"].clone().into(),
                audit_log: env["RIGGER_LAB_K8S_AUDIT_LOG"].clone().into(),
                client: crate::kubectl::Kubectl {
                    binary: env["RIGGER_LAB_KUBECTL"].clone().into(),
                    kubeconfig: env["RIGGER_LAB_KUBECONFIG"].clone().into(),
                },
                dir: env["RIGGER_LAB_K8S_DIR"].clone().into(),
            };
            cluster.install_crds();
            cluster
        })
    }

    /// The cluster to this test alone while the guard lives (a controller acts on every
    /// namespace). Under nextest, such a test belongs to a test group that runs its tests
    /// one at a time (.config/nextest.toml): outside one it would wait for the lock while
    /// holding one of the run's test threads.
    pub fn exclusive(&self) -> Exclusive {
        if let Ok(group) = std::env::var("NEXTEST_TEST_GROUP") {
            assert!(
                SERIAL_TEST_GROUPS.contains(&group.as_str()),
                "this test takes the lab's cluster in turn but runs in nextest's test group \
                 {group:?}: add it to one of {SERIAL_TEST_GROUPS:?} in .config/nextest.toml"
            );
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("tests.lock"))
            .unwrap();
        Exclusive(nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).unwrap())
    }

    /// Rigger's CRDs (`deploy/kubernetes/crds.yaml`), applied and established.
    fn install_crds(&self) {
        let crds = repo_root().join("deploy/kubernetes/crds.yaml");
        self.kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            crds.to_str().unwrap(),
        ]);
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "-f",
            crds.to_str().unwrap(),
        ]);
    }

    /// A fresh namespace for one test (deleted objects and all when dropped).
    pub fn namespace(&'static self, prefix: &str) -> Namespace {
        self.namespace_labelled(prefix, &[])
    }

    /// A namespace made with its `labels` from the start: the API server matches a
    /// webhook's namespaceSelector from its own cache of namespaces, which a label added
    /// later reaches only a moment later (as on any cluster).
    pub fn namespace_labelled(&'static self, prefix: &str, labels: &[(&str, &str)]) -> Namespace {
        let name = format!("{prefix}-{}-{}", std::process::id(), fastrand_suffix());
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let namespace = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}});
        let out = self.kubectl_stdin(&["create"], &namespace.to_string());
        assert!(
            out.status.success(),
            "kubectl create namespace {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Namespace {
            cluster: self,
            name,
        }
    }

    /// A Node object named `name` with `labels` (no kubelet: nothing else about it is real).
    pub fn create_node(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
        });
        let out = self.kubectl_stdin(&["create"], &node.to_string());
        assert!(
            out.status.success(),
            "create node {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn fastrand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{:x}", nanos % 0xfffff)
}

/// Kruise's example `file` from `tests/integration/kruise-corpus/`, its placeholders filled
/// (`${POD}` is `web`, `${GONE}` a containerd ID that runs nowhere).
pub fn corpus(file: &str, id: &str, node: &str, image: &str) -> String {
    std::fs::read_to_string(
        repo_root()
            .join("tests/integration/kruise-corpus")
            .join(file),
    )
    .unwrap()
    .replace("${ID}", id)
    .replace("${NODE}", node)
    .replace("${IMAGE1}", image)
    .replace("${IMAGE2}", image)
    .replace("${IMAGE}", image)
    .replace("${POD}", "web")
    .replace("${GONE}", &"0".repeat(64))
}

impl Cluster {
    /// A controller on this API server as Rigger's controller identity, its records and
    /// Lease in `namespace`, a short lease (3 s); its agents are started on lab
    /// containerd nodes named as the cluster's Nodes.
    pub fn controller(&self, dir: &std::path::Path, namespace: &str) -> Controller {
        self.controller_with(dir, namespace, &[])
    }

    /// A real agent on `lab_node`, registered with `controller` as the cluster's Node
    /// `node_name` (made here, with `labels`), pulling into `containerd_namespace`, its
    /// state under `dir/<node_name>`.
    pub fn node_agent(
        &self,
        controller: &Controller,
        dir: &std::path::Path,
        node_name: &str,
        labels: &[(&str, &str)],
        lab_node: &LabNode,
        containerd_namespace: &str,
    ) -> Agent {
        self.create_node(node_name, labels);
        let state = dir.join(node_name);
        std::fs::create_dir_all(&state).unwrap();
        Agent::start(
            controller,
            node_name,
            &lab_node.address,
            &lab_node.hosts_dir,
            containerd_namespace,
            &state,
        )
    }

    /// [`Cluster::controller`] with more flags (`--kruise-manager`, say).
    pub fn controller_with(
        &self,
        dir: &std::path::Path,
        namespace: &str,
        flags: &[&str],
    ) -> Controller {
        let mut all = vec![
            "--store",
            "kubernetes",
            "--kubeconfig",
            self.controller_kubeconfig.to_str().unwrap(),
            "--kubernetes-namespace",
            namespace,
            // The shipped lease (deploy/kubernetes/controller.yaml, Kubernetes' own
            // default): CI's API server, beside a full test run, left a 6 s lease's
            // renewal unanswered past its 4 s deadline, and the leader stepped down as
            // it must. A fresh Lease is taken a whole term after the replica first saw
            // none (a deleted one's holder may lead that long), so the start waits for
            // the election below; the tests of a handover between replicas set their
            // own lease and wait as they need.
            "--leader-lease",
            "15s",
        ];
        all.extend_from_slice(flags);
        // Rigger alone serves the SidecarSet webhook: on a port of its own, which the
        // API server (on this host) calls by URL; its certificate's Secret and its
        // configuration as deploy/kubernetes/webhook.yaml ships them.
        let (listen, url);
        if !flags.contains(&"--kruise-manager") {
            self.install_webhook(namespace);
            let port = crate::free_port();
            listen = format!("127.0.0.1:{port}");
            url = format!("https://127.0.0.1:{port}");
            all.extend_from_slice(&[
                "--sidecar-webhook-listen",
                &listen,
                "--sidecar-webhook-url",
                &url,
            ]);
        }
        let controller = Controller::start_with(&dir.join("controller"), &all);
        if !flags.contains(&"--leader-lease") {
            // Leading, as a deployed controller is by the time users apply anything: a
            // test that acts before the election races the leader's first passes.
            crate::wait_until(
                "the controller to be elected",
                std::time::Duration::from_secs(60),
                || {
                    std::fs::read_to_string(&controller.log)
                        .ok()?
                        .contains("elected leader")
                        .then_some(())
                },
            );
        }
        controller
    }
}

impl Cluster {
    /// `deploy/kubernetes/webhook.yaml` in `namespace` (the controller's): its empty
    /// certificate Secret, and the MutatingWebhookConfiguration (cluster-wide).
    pub fn install_webhook(&self, namespace: &str) {
        let manifest = std::fs::read_to_string(repo_root().join("deploy/kubernetes/webhook.yaml"))
            .unwrap()
            .replace(
                "namespace: rigger-system",
                &format!("namespace: {namespace}"),
            );
        let out = self.kubectl_stdin(&["apply"], &manifest);
        assert!(
            out.status.success(),
            "kubectl apply webhook.yaml: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Cluster {
    /// Wait until the SidecarSet webhook's configuration has an entry for each of `sets`
    /// (the leader writes them once it has read the sets).
    pub fn wait_for_sidecar_webhook(&self, sets: &[String]) {
        // Each set's revision history first (a pod pinned to a `customVersion` is refused
        // until it is written): the leader writes the history, then the status naming
        // its latest revision. The webhook's entries are written apart from both.
        crate::wait_until(
            "the SidecarSets' revisions to be recorded",
            std::time::Duration::from_secs(30),
            || {
                sets.iter()
                    .all(|set| {
                        self.get_json(&["sidecarset", set]).is_some_and(|read| {
                            read["status"]["latestRevision"]
                                .as_str()
                                .is_some_and(|r| !r.is_empty())
                        })
                    })
                    .then_some(())
            },
        );
        crate::wait_until(
            "the webhook configuration to list the SidecarSets",
            std::time::Duration::from_secs(30),
            || {
                let configuration =
                    self.get_json(&["mutatingwebhookconfiguration", "rigger-sidecar-injection"])?;
                let names: Vec<&str> = configuration["webhooks"]
                    .as_array()?
                    .iter()
                    .filter_map(|w| w["name"].as_str())
                    .collect();
                sets.iter()
                    .all(|set| names.contains(&format!("{set}.sidecarsets.rigger.dev").as_str()))
                    .then_some(())
            },
        );
    }
}

/// Cluster-scoped objects a test made (`kind`, `name`), deleted when it ends, passed
/// or not: a SidecarSet left behind would keep a webhook entry for its pods.
#[derive(Debug)]
pub struct Made {
    pub cluster: &'static Cluster,
    pub objects: Vec<(String, String)>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for (kind, name) in &self.objects {
            let _ = self
                .cluster
                .kubectl(&["delete", kind, name, "--wait=false"]);
        }
    }
}

/// One kind of call to the API server: API group, resource (with `/subresource`), verb.
pub type Call = (String, String, String);

impl Cluster {
    /// Where the audit log ends now: [`Cluster::calls_since`] reads what comes after.
    pub fn audit_mark(&self) -> u64 {
        std::fs::metadata(&self.audit_log).map_or(0, |m| m.len())
    }

    /// The calls `user` made after `mark` (all of the log with 0).
    pub fn calls_since(&self, user: &str, mark: u64) -> std::collections::BTreeSet<Call> {
        use std::io::{BufRead as _, Seek as _};
        let mut file = std::fs::File::open(&self.audit_log).unwrap();
        file.seek(std::io::SeekFrom::Start(mark)).unwrap();
        let mut calls = std::collections::BTreeSet::new();
        for line in std::io::BufReader::new(file).lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line.unwrap()) else {
                continue;
            };
            if event["user"]["username"] != user || event["objectRef"].is_null() {
                continue;
            }
            let object = &event["objectRef"];
            let mut resource = object["resource"].as_str().unwrap_or_default().to_owned();
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            calls.insert((
                object["apiGroup"].as_str().unwrap_or_default().to_owned(),
                resource,
                event["verb"].as_str().unwrap_or_default().to_owned(),
            ));
        }
        calls
    }
}

/// nextest's test groups whose tests run one at a time (.config/nextest.toml): the tests
/// that run a controller on the cluster, and the docs' sessions (one of which does).
const SERIAL_TEST_GROUPS: [&str; 2] = ["kubernetes-controller", "docs"];

/// Holds the cluster for one test (see [`Cluster::exclusive`]).
#[derive(Debug)]
pub struct Exclusive(#[allow(dead_code)] nix::fcntl::Flock<std::fs::File>);

/// A namespace of one test.
#[derive(Debug)]
pub struct Namespace {
    cluster: &'static Cluster,
    pub name: String,
}

/// The API server has no namespace controller to empty a deleted namespace: the test's
/// objects are deleted first, then the namespace (best effort).
impl Drop for Namespace {
    fn drop(&mut self) {
        for kind in [
            "imagepulljobs.apps.kruise.io",
            "imagelistpulljobs.apps.kruise.io",
            "containerrecreaterequests.apps.kruise.io",
            "controllerrecords.rigger.dev",
            "leases",
            "pods",
            "secrets",
        ] {
            let _ =
                self.cluster
                    .kubectl(&["delete", kind, "--all", "-n", &self.name, "--wait=false"]);
        }
        let _ = self
            .cluster
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

impl std::ops::Deref for Cluster {
    type Target = crate::kubectl::Kubectl;

    fn deref(&self) -> &Self::Target {
        &self.client
    }
}
