//! The lab (`scripts/lab`): a registry and real containerd nodes with CRI, one per
//! containerd version Rigger supports, and what tests read off them (image records,
//! content labels, mounted snapshots).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::{repo_root, sha256_hex};

/// A containerd version the lab runs, each on a node of its own: 1.6 is Debian 12's
/// package (the lab's `node1`, and `node2` for fleet tests); 1.7 and 2.1 are Debian's
/// trixie and sid packages, unpacked privately by `scripts/lab`; 2.3 (the first
/// long-term release) and 2.4 are built from the Go module proxy (`scripts/lab-containerd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Containerd {
    V1_6,
    V1_7,
    V2_1,
    V2_3,
    V2_4,
}

impl Containerd {
    pub const ALL: [Self; 5] = [Self::V1_6, Self::V1_7, Self::V2_1, Self::V2_3, Self::V2_4];

    /// `1.6`, `1.7`, `2.1`, `2.3` or `2.4`, as `scripts/lab up --containerd` takes it.
    pub fn series(self) -> &'static str {
        match self {
            Self::V1_6 => "1.6",
            Self::V1_7 => "1.7",
            Self::V2_1 => "2.1",
            Self::V2_3 => "2.3",
            Self::V2_4 => "2.4",
        }
    }

    /// Whether the lab's node of this version unpacks an image's layers in parallel
    /// (2.3 and later, tuned by `scripts/lab-containerd-config --multipart-fetch`:
    /// `max_concurrent_unpacks = 4` in the transfer service, which `ctr images pull` and
    /// CRI use).
    pub fn unpacks_in_parallel(self) -> bool {
        matches!(self, Self::V2_3 | Self::V2_4)
    }

    /// Whether `ctr images pull` goes through the daemon's transfer service (2.x) rather
    /// than pulling in the client (1.x).
    pub fn ctr_pulls_by_transfer(self) -> bool {
        !matches!(self, Self::V1_6 | Self::V1_7)
    }

    /// The prefix of this version's settings in `scripts/lab env`.
    fn env_prefix(self) -> String {
        format!("RIGGER_LAB_CONTAINERD_{}", self.series().replace('.', "_"))
    }
}

/// One containerd node of the lab.
#[derive(Debug, Clone)]
pub struct LabNode {
    pub containerd: Containerd,
    /// The Debian package's version, e.g. `2.1.9+ds1-5`.
    pub version: String,
    /// containerd's socket (CRI is served on it too).
    pub address: PathBuf,
    pub root: PathBuf,
    /// Its registry configuration (containerd's `certs.d` layout).
    pub hosts_dir: PathBuf,
    /// `ctr` of this containerd version: containerd's own pull to compare with is the
    /// pull of the same version.
    pub ctr_path: PathBuf,
}

impl LabNode {
    /// Run this node's `ctr` in namespace `ns`; its standard output. Panics on failure.
    pub fn ctr(&self, ns: &str, args: &[&str]) -> String {
        run_ctr(&self.ctr_path, &self.address, ns, args)
    }

    /// This node's `ctr`, aimed at its socket, for callers that handle failure
    /// themselves (clean-ups).
    pub fn ctr_command(&self) -> Command {
        let mut command = Command::new(&self.ctr_path);
        command.arg("--address").arg(&self.address);
        command
    }

    /// `ctr images pull` (containerd's own pull, of this version) of a lab image into `ns`.
    pub fn ctr_pull(&self, ns: &str, reference: &str) {
        let hosts = self.hosts_dir.to_str().unwrap().to_owned();
        self.ctr(ns, &["images", "pull", "--hosts-dir", &hosts, reference]);
    }

    /// Labels of each blob in namespace `ns`, from `ctr content ls`.
    pub fn content_labels(&self, ns: &str) -> HashMap<String, BTreeMap<String, String>> {
        self.ctr(ns, &["content", "ls"])
            .lines()
            .skip(1)
            .filter_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                let digest = cols.first()?.to_string();
                let labels = cols
                    .last()
                    .filter(|l| l.contains('='))
                    .map(|l| {
                        l.split(',')
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_owned(), v.to_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                Some((digest, labels))
            })
            .collect()
    }
}

/// The shared lab, started on first use (`scripts/lab up` is idempotent and locked).
#[derive(Debug, Clone)]
pub struct Lab {
    pub dir: PathBuf,
    /// `127.0.0.1:PORT` of the lab registry.
    pub registry: String,
    /// The lab's first node (containerd 1.6), which most tests use.
    pub containerd_address: PathBuf,
    pub containerd_root: PathBuf,
    pub hosts_dir: PathBuf,
    /// The lab's second node (fleet tests).
    pub node2_containerd_address: PathBuf,
    pub node2_hosts_dir: PathBuf,
    pub node2_containerd_root: PathBuf,
    /// One node per containerd version running (the 1.6 one is the first node).
    nodes: Vec<LabNode>,
}

/// The containerd versions the tests want the lab to run: `RIGGER_LAB_CONTAINERD`, or all.
fn wanted_containerds() -> String {
    std::env::var("RIGGER_LAB_CONTAINERD").unwrap_or_else(|_| "1.6,1.7,2.1,2.3,2.4".to_owned())
}

impl Lab {
    pub fn get() -> &'static Lab {
        static LAB: OnceLock<Lab> = OnceLock::new();
        LAB.get_or_init(|| {
            let script = repo_root().join("scripts/lab");
            let dir = PathBuf::from(
                std::env::var("RIGGER_LAB_DIR").unwrap_or_else(|_| "/tmp/rigger-lab".into()),
            );
            let wanted = wanted_containerds();
            let running = read_env(&dir).is_some_and(|env| {
                let have = env
                    .get("RIGGER_LAB_CONTAINERDS")
                    .cloned()
                    .unwrap_or_default();
                wanted.split(',').all(|v| have.split(',').any(|h| h == v))
            }) && Command::new(&script)
                .arg("status")
                .stdout(Stdio::null())
                .status()
                .unwrap()
                .success();
            if !running {
                let out = Command::new(&script)
                    .args(["up", "--containerd", &wanted])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "scripts/lab up --containerd {wanted} failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let env = read_env(&dir).unwrap();
            let nodes = Containerd::ALL
                .into_iter()
                .filter_map(|containerd| {
                    let prefix = containerd.env_prefix();
                    let var = |name: &str| env.get(&format!("{prefix}_{name}")).cloned();
                    Some(LabNode {
                        containerd,
                        address: var("ADDRESS")?.into(),
                        version: var("VERSION")?,
                        root: var("ROOT")?.into(),
                        hosts_dir: var("HOSTS_DIR")?.into(),
                        ctr_path: PathBuf::from(var("BIN")?).join("ctr"),
                    })
                })
                .collect();
            Lab {
                dir,
                registry: env["RIGGER_LAB_REGISTRY"].clone(),
                containerd_address: env["RIGGER_LAB_CONTAINERD_ADDRESS"].clone().into(),
                containerd_root: env["RIGGER_LAB_CONTAINERD_ROOT"].clone().into(),
                hosts_dir: env["RIGGER_LAB_HOSTS_DIR"].clone().into(),
                node2_containerd_address: env["RIGGER_LAB_NODE2_CONTAINERD_ADDRESS"].clone().into(),
                node2_hosts_dir: env["RIGGER_LAB_NODE2_HOSTS_DIR"].clone().into(),
                node2_containerd_root: env["RIGGER_LAB_NODE2_CONTAINERD_ROOT"].clone().into(),
                nodes,
            }
        })
    }

    /// The node running `containerd`; panics, naming the setting, when the lab runs none.
    pub fn node(&self, containerd: Containerd) -> &LabNode {
        self.nodes
            .iter()
            .find(|n| n.containerd == containerd)
            .unwrap_or_else(|| {
                panic!(
                    "the lab runs no containerd {}: RIGGER_LAB_CONTAINERD={} (scripts/lab up --containerd 1.6,1.7,2.1,2.3,2.4 starts every version)",
                    containerd.series(),
                    wanted_containerds()
                )
            })
    }

    /// The lab's second containerd 1.6 node (`node2`), for tests of more than one node.
    pub fn second_node(&self) -> LabNode {
        LabNode {
            address: self.node2_containerd_address.clone(),
            hosts_dir: self.node2_hosts_dir.clone(),
            root: self.node2_containerd_root.clone(),
            ..self.first_node().clone()
        }
    }

    /// The lab's first node (containerd 1.6).
    pub fn first_node(&self) -> &LabNode {
        self.node(Containerd::V1_6)
    }

    /// Full reference of a lab image, e.g. `image("rigger-lab/busybox:1")`.
    pub fn image(&self, repo_and_tag: &str) -> String {
        format!("{}/{repo_and_tag}", self.registry)
    }

    /// The manifest the lab pushed for `repo:tag`, and its digest.
    pub fn manifest(&self, repo_and_tag: &str) -> (serde_json::Value, String) {
        self.pushed_document(repo_and_tag, "manifest")
    }

    /// The index (manifest list) the lab pushed for `repo:tag`, and its digest.
    pub fn index(&self, repo_and_tag: &str) -> (serde_json::Value, String) {
        self.pushed_document(repo_and_tag, "index")
    }

    /// `scripts/lab-images` keeps what it pushed as `<repo>_<tag>.<kind>.json`.
    fn pushed_document(&self, repo_and_tag: &str, kind: &str) -> (serde_json::Value, String) {
        let (repo, tag) = repo_and_tag.split_once(':').unwrap();
        let path = self
            .dir
            .join("images")
            .join(format!("{}_{tag}.{kind}.json", repo.replace('/', "_")));
        let bytes = std::fs::read(&path).unwrap();
        let digest = sha256_hex(&bytes);
        (
            serde_json::from_slice(&bytes).unwrap(),
            format!("sha256:{digest}"),
        )
    }

    /// Run `ctr` against the lab's first containerd in namespace `ns`; panics on failure.
    pub fn ctr(&self, ns: &str, args: &[&str]) -> String {
        self.first_node().ctr(ns, args)
    }

    /// `ctr images pull` (containerd's own pull) of a lab image into `ns` on the first node.
    pub fn ctr_pull(&self, ns: &str, reference: &str) {
        self.first_node().ctr_pull(ns, reference);
    }
}

/// `scripts/lab env`'s file as a map, if the lab has written one.
fn read_env(dir: &Path) -> Option<HashMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("env")).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// Tests run once per containerd version the lab runs. Each `fn NAME(node: &LabNode)`
/// listed becomes a module `NAME` of five tests, `containerd_1_6`, `containerd_1_7`,
/// `containerd_2_1`, `containerd_2_3` and `containerd_2_4`, so a failure names the
/// version it happened on.
#[macro_export]
macro_rules! on_every_containerd {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[test]
            fn containerd_1_6() {
                let lab = $crate::Lab::get();
                super::$name(lab.node($crate::Containerd::V1_6));
            }
            #[test]
            fn containerd_1_7() {
                let lab = $crate::Lab::get();
                super::$name(lab.node($crate::Containerd::V1_7));
            }
            #[test]
            fn containerd_2_1() {
                let lab = $crate::Lab::get();
                super::$name(lab.node($crate::Containerd::V2_1));
            }
            #[test]
            fn containerd_2_3() {
                let lab = $crate::Lab::get();
                super::$name(lab.node($crate::Containerd::V2_3));
            }
            #[test]
            fn containerd_2_4() {
                let lab = $crate::Lab::get();
                super::$name(lab.node($crate::Containerd::V2_4));
            }
        }
    )+};
}

/// Run the system's `ctr` (containerd 1.6's) against the containerd at `address` in
/// namespace `ns`; its standard output. Panics on failure.
pub fn ctr_at(address: &Path, ns: &str, args: &[&str]) -> String {
    run_ctr(Path::new("ctr"), address, ns, args)
}

fn run_ctr(ctr: &Path, address: &Path, ns: &str, args: &[&str]) -> String {
    let out = Command::new(ctr)
        .arg("--address")
        .arg(address)
        .args(["--namespace", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        ctr.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A containerd namespace of this test alone, removed (with its images) when dropped.
#[derive(Debug)]
pub struct TestNamespace {
    pub name: String,
    node: LabNode,
}

impl TestNamespace {
    /// A namespace on the lab's first node.
    pub fn new(test: &str) -> Self {
        Self::on(Lab::get().first_node(), test)
    }

    /// A namespace on `node`.
    pub fn on(node: &LabNode, test: &str) -> Self {
        Self {
            name: format!("itest-{test}-{}", std::process::id()),
            node: node.clone(),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let ctr = |args: &[&str]| {
            self.node
                .ctr_command()
                .args(["--namespace", &self.name])
                .args(args)
                .output()
        };
        if let Ok(out) = ctr(&["images", "ls", "-q"]) {
            for image in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = ctr(&["images", "rm", "--sync", image]);
            }
        }
        let _ = self
            .node
            .ctr_command()
            .args(["namespaces", "rm", &self.name])
            .output();
    }
}

/// A read-only view of a committed snapshot, mounted at a temporary directory, unmounted
/// and removed when dropped.
#[derive(Debug)]
pub struct MountedSnapshot {
    pub path: PathBuf,
    /// The mounts below `path` (an erofs view's layers, in `_layers_dir`), unmounted
    /// after it.
    layers: Vec<PathBuf>,
    _layers_dir: tempfile::TempDir,
    snapshotter: String,
    namespace: String,
    key: String,
    node: LabNode,
    _dir: tempfile::TempDir,
}

/// `mount -t KIND -o OPTIONS SOURCE TARGET`; panics naming `what` when it fails.
fn mount(kind: &str, options: &[String], source: &str, target: &Path, what: &str) {
    let status = Command::new("mount")
        .args(["-t", kind])
        .args(["-o", &options.join(",")])
        .arg(source)
        .arg(target)
        .status()
        .unwrap();
    assert!(status.success(), "mount of {what} failed");
}

/// An option of a containerd 2.3+ formatted mount (`format/...`) with its templates
/// filled in: `{{ overlay A B }}` is the targets of mounts A to B, `:`-joined.
fn fill_mount_template(option: &str, targets: &[PathBuf]) -> String {
    let (Some(start), Some(end)) = (option.find("{{"), option.find("}}")) else {
        return option.to_owned();
    };
    let words: Vec<&str> = option[start + 2..end].split_whitespace().collect();
    let ["overlay", from, to] = words[..] else {
        panic!("a mount template the tests do not know: {option}");
    };
    let (from, to): (usize, usize) = (from.parse().unwrap(), to.parse().unwrap());
    let indices: Vec<usize> = if from <= to {
        (from..=to).collect()
    } else {
        (to..=from).rev().collect()
    };
    let dirs: Vec<String> = indices
        .into_iter()
        .map(|i| targets[i].display().to_string())
        .collect();
    format!(
        "{}{}{}",
        &option[..start],
        dirs.join(":"),
        &option[end + 2..]
    )
}

impl MountedSnapshot {
    /// Mount the overlayfs snapshot `chain_id` of namespace `ns` on `node` (it must
    /// exist: no unpacking here).
    pub fn view_on(node: &LabNode, ns: &str, chain_id: &str) -> Self {
        Self::view_with(node, "overlayfs", ns, chain_id)
    }

    /// As [`MountedSnapshot::view_on`], in `snapshotter`.
    pub fn view_with(node: &LabNode, snapshotter: &str, ns: &str, chain_id: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = format!("itest-view-{}-{}", std::process::id(), &chain_id[7..19]);
        let json = node.ctr(
            ns,
            &[
                "snapshots",
                "--snapshotter",
                snapshotter,
                "view",
                "--mounts",
                &key,
                chain_id,
            ],
        );
        let mounts: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
        assert!(!mounts.is_empty(), "{json}");
        // All but the last mount are layers (containerd 2.3+'s erofs: one erofs image
        // each) that the last one's `{{ overlay A B }}` names.
        let layers_dir = tempfile::tempdir().unwrap();
        let mut layers = Vec::new();
        for (i, m) in mounts.iter().enumerate() {
            let last = i == mounts.len() - 1;
            let target = if last {
                dir.path().to_owned()
            } else {
                let target = layers_dir.path().join(i.to_string());
                std::fs::create_dir(&target).unwrap();
                target
            };
            let options: Vec<String> = m["Options"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| fill_mount_template(o.as_str().unwrap(), &layers))
                .collect();
            // `format/mkdir/overlay`: the mount is an overlay once its templates are filled.
            let kind = m["Type"].as_str().unwrap();
            let kind = kind.rsplit('/').next().unwrap();
            mount(
                kind,
                &options,
                m["Source"].as_str().unwrap(),
                &target,
                chain_id,
            );
            if !last {
                layers.push(target);
            }
        }
        Self {
            path: dir.path().to_owned(),
            layers,
            _layers_dir: layers_dir,
            snapshotter: snapshotter.to_owned(),
            namespace: ns.to_owned(),
            key,
            node: node.clone(),
            _dir: dir,
        }
    }
}

impl Drop for MountedSnapshot {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
        for layer in self.layers.iter().rev() {
            let _ = Command::new("umount").arg(layer).status();
        }
        let _ = self
            .node
            .ctr_command()
            .args(["--namespace", &self.namespace, "snapshots", "--snapshotter"])
            .args([&self.snapshotter, "rm", &self.key])
            .output();
    }
}

/// Everything about a file tree that unpacking must reproduce: per path its type, mode,
/// owner, size, modification time, link count, and content hash or link target.
pub fn tree_listing(root: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            // overlayfs lists the whiteout of a directory that only one layer has, and
            // lookup then finds nothing: that entry is not in the tree.
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => panic!("{}: {e}", path.display()),
            };
            let ft = meta.file_type();
            let what = if ft.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else if ft.is_symlink() {
                format!(
                    "symlink -> {}",
                    std::fs::read_link(&path).unwrap().display()
                )
            } else if ft.is_file() {
                format!(
                    "file sha256:{} nlink {}",
                    sha256_hex(&std::fs::read(&path).unwrap()),
                    meta.nlink()
                )
            } else if ft.is_fifo() {
                "fifo".to_owned()
            } else if ft.is_char_device() || ft.is_block_device() {
                format!("device {}", meta.rdev())
            } else {
                "socket".to_owned()
            };
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            // A directory created implicitly while unpacking gets "now" as its mtime once
            // files land in it (containerd's unpack does the same): only compare old ones.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let mtime = if ft.is_dir() && now - meta.mtime() < 3600 {
                "recent".to_owned()
            } else {
                format!("{}.{:09}", meta.mtime(), meta.mtime_nsec())
            };
            out.insert(
                rel,
                format!(
                    "{what} mode {:o} owner {}:{} size {} mtime {mtime}",
                    meta.mode(),
                    meta.uid(),
                    meta.gid(),
                    if ft.is_dir() { 0 } else { meta.size() },
                ),
            );
        }
    }
    out
}

/// ChainID of the top layer of a manifest's config (as containerd names snapshots).
pub fn top_chain_id(diff_ids: &[String]) -> String {
    let mut chain = diff_ids[0].clone();
    for diff_id in &diff_ids[1..] {
        chain = format!(
            "sha256:{}",
            sha256_hex(format!("{chain} {diff_id}").as_bytes())
        );
    }
    chain
}
