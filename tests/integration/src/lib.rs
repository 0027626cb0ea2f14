//! Support for Rigger's integration tests: the lab (real containerd, CRI and registry
//! from `scripts/lab`), the built binaries, and daemons that stop when a test ends.
//!
//! Tests run in parallel (nextest runs each in its own process), so each test works in
//! its own containerd namespace or CRI pod names; the lab itself is shared.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support

mod cri_pod;
mod etcd;
pub mod fake_node;
pub mod fidelity;
pub mod kubectl;
pub mod kubernetes;
mod lab;
mod pki;
mod private_containerd;
pub mod real_cluster;
mod registries;
mod relay;

pub use cri_pod::{CriPod, CriPodSpec};
pub use etcd::{Etcd, EtcdClientTls};
pub use lab::{
    Containerd, Lab, LabNode, MountedSnapshot, TestNamespace, ctr_at, top_chain_id, tree_listing,
};
pub use pki::PrivateCa;
pub use private_containerd::PrivateContainerd;
pub use registries::{
    AuthRegistry, Proxy, TlsRegistry, mirror_client, mirror_client_hosts_dir, mirror_hosts_dir,
    plain_http_hosts_dir,
};
pub use relay::TcpRelay;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Path of a binary of this workspace, built next to the test executables.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let path = exe.parent().unwrap().parent().unwrap().join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` first (make test does)",
        path.display()
    );
    path
}

/// The bin directory of Rigger's previous release (its rigger-agent, rigger-controller
/// and riggerctl), which `scripts/lab-previous build` made in the lab's cache (make
/// test's lab stage does): the version skew tests run it beside this tree's.
pub fn previous_release() -> PathBuf {
    let out = Command::new(repo_root().join("scripts/lab-previous"))
        .arg("dir")
        .output()
        .unwrap();
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !dir.is_empty(),
        "the previous release is not built: run `scripts/lab-previous build` (make test's lab stage does){}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(dir)
}

/// Run `rigger-agent ARGS` to completion.
pub fn agent(args: &[&str]) -> Output {
    Command::new(binary("rigger-agent"))
        .args(args)
        .output()
        .unwrap()
}

/// A child process killed (SIGKILL) if the test ends before it exits.
#[derive(Debug)]
pub struct Daemon {
    pub child: Child,
}

impl Daemon {
    pub fn spawn(command: &mut Command) -> Self {
        Self {
            child: command.spawn().unwrap(),
        }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// Send SIGTERM and wait (up to `timeout`) for the exit status.
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A daemon's log file, opened for appending (a restarted daemon adds to it).
fn append_log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

/// A loopback TCP port for a daemon of this test to listen on ([`free_ports`]).
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// The ports [`free_ports`] hands out: below the kernel's ephemeral range
/// (`ip_local_port_range`, from 32768 by default), where no process's outgoing
/// connection is given one. A port the kernel chose (`bind` to port 0) and let go could
/// be taken by any connection before the daemon bound it: seen as a controller's
/// "Address already in use" with six tests running side by side.
const DAEMON_PORTS: std::ops::Range<u16> = 24000..32000;

/// Ports this test process holds ([`free_ports`]), each by a lock on its file, released
/// when the process ends (nextest runs every test in a process of its own).
static HELD_PORTS: std::sync::Mutex<Vec<nix::fcntl::Flock<std::fs::File>>> =
    std::sync::Mutex::new(Vec::new());

/// `N` loopback TCP ports, all different, for daemons this test starts: free now, and
/// held for this test until it ends, so no other test process is given one, and outside
/// the range the kernel hands to outgoing connections.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let dir = std::env::temp_dir().join("rigger-test-ports");
    std::fs::create_dir_all(&dir).unwrap();
    let span = u32::from(DAEMON_PORTS.end - DAEMON_PORTS.start);
    // Each process starts somewhere else in the range, so that few locks are tried.
    let start = std::process::id().wrapping_mul(7919) % span;
    let mut held = HELD_PORTS.lock().unwrap();
    let mut candidates = (0..span).map(|i| {
        let offset = u16::try_from((start + i) % span).unwrap();
        DAEMON_PORTS.start + offset
    });
    std::array::from_fn(|_| {
        candidates
            .by_ref()
            .find_map(|port| {
                let file = std::fs::File::create(dir.join(port.to_string())).ok()?;
                let lock =
                    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
                        .ok()?;
                // Free now: nothing (a daemon of a test before, say) listens on it.
                std::net::TcpListener::bind(("127.0.0.1", port)).ok()?;
                held.push(lock);
                Some(port)
            })
            .expect("a free port in 24000..32000")
    })
}

/// Minimal HTTP/1.0 GET: (status code, body). `None` if nothing listens yet.
pub fn http_get(address: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// An HTTP listener of the test on a free loopback port: answers every request 200 and
/// records its request line.
pub fn http_recorder() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::BufRead as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            record.lock().unwrap().push(line.trim().to_owned());
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
        }
    });
    (port, seen)
}

/// Poll `check` every 100 ms until it returns `Some`, or panic after `timeout`.
pub fn wait_until<T>(what: &str, timeout: Duration, check: impl FnMut() -> Option<T>) -> T {
    poll_until(timeout, Duration::from_millis(100), check)
        .unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Poll `check` every `period` until it returns `Some`; `None` after `timeout` (for a
/// caller that says more than "timed out" when it fails).
pub fn poll_until<T>(
    timeout: Duration,
    period: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(period);
    }
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(data))
}

/// Build and push an image no other test uses (its content is unique to `name`).
pub fn unique_image(name: &str, layers: usize, size: usize) -> String {
    unique_image_with(name, layers, size, &["--base", "none"])
}

/// Like [`unique_image`], with more `scripts/lab image layers` flags (`--compression zstd`,
/// `--format docker`, `--base busybox`, ...).
pub fn unique_image_with(name: &str, layers: usize, size: usize, flags: &[&str]) -> String {
    let repo = format!("rigger-lab/{name}-{}", std::process::id());
    let (layers, size) = (layers.to_string(), size.to_string());
    let mut args = vec![
        "layers", "--name", &repo, "--count", &layers, "--size", &size,
    ];
    args.extend(["--compressibility", "0.1"]);
    args.extend_from_slice(flags);
    lab_image(&args);
    format!("{repo}:1")
}

/// `scripts/lab image ARGS...`: build and push one more lab image; panics on failure.
pub fn lab_image(args: &[&str]) {
    let out = Command::new(repo_root().join("scripts/lab"))
        .arg("image")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/lab image {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run `command` with `stdin` as its standard input; its output.
pub fn output_with_stdin(command: &mut Command, stdin: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Fail with the command's stderr unless it succeeded.
pub fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where the agent writes big blobs beside the content store of the containerd rooted at
/// `containerd_root` (rigger_pull::store::direct).
pub fn incoming_dir(containerd_root: &Path) -> PathBuf {
    containerd_root.join("io.containerd.content.v1.content/rigger-incoming")
}

/// The names the agent left in [`incoming_dir`] (none once its pulls ended or gave back).
pub fn incoming_left(containerd_root: &Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(incoming_dir(containerd_root))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

/// The image records of containerd namespace `ns` on the lab's node.
pub fn image_records(ns: &str) -> Vec<String> {
    Lab::get()
        .ctr(ns, &["images", "ls", "-q"])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The tail of a log file, for assertion messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A `rigger-controller` on loopback with a data directory of the test, fast heartbeats
/// (1 s) and node timeout (3 s), serving mTLS with a lab PKI made by
/// `rigger-controller certs` in `<data_dir>/pki`; its log goes to
/// `<data_dir>/controller.log`.
#[derive(Debug)]
pub struct Controller {
    /// `https://127.0.0.1:PORT`
    pub server: String,
    /// What riggerctl and agents are given: this server, or every replica's.
    pub endpoints: String,
    pub data_dir: PathBuf,
    pub pki: PathBuf,
    pub log: PathBuf,
    /// `127.0.0.1:PORT` of `/healthz`, `/readyz` and `/metrics`.
    pub health: String,
    listen: String,
    extra: Vec<String>,
    /// The `rigger-controller` run (this tree's; another release's for the skew tests),
    /// from the next start on.
    pub program: PathBuf,
    daemon: Option<Daemon>,
}

/// A failing test shows what its controller said last: on a loaded CI machine, the log
/// is the only account of what it was doing.
impl Drop for Controller {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail("controller", &self.log);
        }
    }
}

/// The last 60 lines of the log at `path` on stderr, headed by `what` and the path.
pub fn print_log_tail(what: &str, path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(60)..];
    eprintln!(
        "--- the last {} lines of the {what}'s log ({}):",
        tail.len(),
        path.display()
    );
    for line in tail {
        eprintln!("{line}");
    }
    eprintln!("--- end of the {what}'s log");
}

/// `rigger-controller certs ARGS`; panics on failure.
pub fn controller_certs(out: &Path, nodes: &[&str]) {
    let mut command = Command::new(binary("rigger-controller"));
    command.arg("certs").arg("--out").arg(out);
    for node in nodes {
        command.args(["--node", node]);
    }
    let result = command.output().unwrap();
    assert!(
        result.status.success(),
        "rigger-controller certs: {}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// A token of `role` (admin or viewer) from a PKI directory's tokens.csv.
pub fn token(pki: &Path, role: &str) -> String {
    std::fs::read_to_string(pki.join("tokens.csv"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.ends_with(&format!(",{role}")))
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_owned()
}

/// A controller under `dir/controller` and an agent for `node` on the lab's first node
/// (pulls into `namespace`, state under `dir/agent`), once the node is ready.
pub fn controller_with_agent(dir: &Path, node: &str, namespace: &str) -> (Controller, Agent) {
    controller_with_agent_on(Lab::get().first_node(), dir, node, namespace)
}

/// As [`controller_with_agent`], the agent on the lab node `lab_node`.
pub fn controller_with_agent_on(
    lab_node: &LabNode,
    dir: &Path,
    node: &str,
    namespace: &str,
) -> (Controller, Agent) {
    let controller = Controller::start(&dir.join("controller"));
    let state = dir.join("agent");
    std::fs::create_dir_all(&state).unwrap();
    let agent = Agent::start(
        &controller,
        node,
        &lab_node.address,
        &lab_node.hosts_dir,
        namespace,
        &state,
    );
    wait_until("the node to be ready", Duration::from_secs(30), || {
        let n = controller.get_json(&["node", node])?;
        (n["status"]["conditions"][0]["status"] == "True").then_some(())
    });
    (controller, agent)
}

impl Controller {
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, &[])
    }

    /// [`Controller::start`] with more `rigger-controller` flags.
    pub fn start_with(data_dir: &Path, flags: &[&str]) -> Self {
        let pki = data_dir.join("pki");
        controller_certs(&pki, &[]);
        let extra = flags.iter().map(|f| (*f).to_owned()).collect();
        let mut controller = Self::new(data_dir, &pki, extra);
        controller.spawn();
        controller
    }

    fn new(data_dir: &Path, pki: &Path, extra: Vec<String>) -> Self {
        let [listen_port, health_port] = free_ports();
        let listen = format!("127.0.0.1:{listen_port}");
        let server = format!("https://{listen}");
        Self {
            endpoints: server.clone(),
            server,
            data_dir: data_dir.to_owned(),
            pki: pki.to_owned(),
            log: data_dir.join("controller.log"),
            health: format!("127.0.0.1:{health_port}"),
            listen,
            extra,
            program: binary("rigger-controller"),
            daemon: None,
        }
    }

    /// `count` replicas on `etcd` sharing one lab PKI (made in `dir/pki`), with a short
    /// leader lease (3 s); each one's `endpoints` lists them all.
    pub fn replicas(dir: &Path, etcd: &Etcd, count: usize) -> Vec<Self> {
        let store = format!("etcd://{}", etcd.endpoint);
        Self::replicas_with(dir, count, &["--store", &store, "--leader-lease", "3s"])
    }

    /// `count` replicas started with `flags` (a shared store and lease), sharing one lab
    /// PKI (made in `dir/pki`); each one's `endpoints` lists them all.
    pub fn replicas_with(dir: &Path, count: usize, flags: &[&str]) -> Vec<Self> {
        let pki = dir.join("pki");
        controller_certs(&pki, &[]);
        let mut replicas: Vec<Self> = (0..count)
            .map(|i| {
                let data = dir.join(format!("controller-{}", i + 1));
                std::fs::create_dir_all(&data).unwrap();
                let extra = flags.iter().map(|f| (*f).to_owned()).collect();
                Self::new(&data, &pki, extra)
            })
            .collect();
        let endpoints: Vec<String> = replicas.iter().map(|r| r.server.clone()).collect();
        for replica in &mut replicas {
            replica.endpoints = endpoints.join(",");
            replica.spawn();
        }
        replicas
    }

    /// Whether this replica has won the election (its log says so).
    pub fn is_leader(&self) -> bool {
        self.daemon.is_some()
            && std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .rev()
                .take_while(|l| !l.contains("campaigning for leadership"))
                .any(|l| l.contains("elected leader"))
    }

    fn spawn(&mut self) {
        let before = std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize);
        let log = append_log(&self.log);
        self.daemon = Some(Daemon::spawn(
            Command::new(&self.program)
                .arg("--data-dir")
                .arg(&self.data_dir)
                .args(["--listen", &self.listen])
                .args(["--health-listen", &self.health])
                .args(["--heartbeat-interval", "1s", "--node-timeout", "3s"])
                .arg("--tls-cert-file")
                .arg(self.pki.join("controller.pem"))
                .arg("--tls-key-file")
                .arg(self.pki.join("controller-key.pem"))
                .arg("--client-ca-file")
                .arg(self.pki.join("ca.pem"))
                .arg("--tokens-file")
                .arg(self.pki.join("tokens.csv"))
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(log),
        ));
        // Serving (a follower serves too, saying it does not lead): look at what this
        // process wrote only.
        // A controller that stopped (refused its configuration, could not bind) fails the
        // test at once, with what it said.
        let log = self.log.clone();
        let daemon = self.daemon.as_mut().unwrap();
        wait_until("the controller to serve", Duration::from_secs(20), || {
            let text = std::fs::read(&log).ok()?;
            let written = String::from_utf8_lossy(&text[before.min(text.len())..]).into_owned();
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("the controller stopped ({status}) before serving:\n{written}");
            }
            written.contains("controller started").then_some(())
        });
    }

    /// Issue an agent certificate for `node`: (ca, cert, key) paths.
    pub fn agent_certs(&self, node: &str) -> (PathBuf, PathBuf, PathBuf) {
        let cert = self.pki.join(format!("agent-{node}.pem"));
        if !cert.exists() {
            controller_certs(&self.pki, &[node]);
        }
        (
            self.pki.join("ca.pem"),
            cert,
            self.pki.join(format!("agent-{node}-key.pem")),
        )
    }

    /// SIGKILL: no drain, no last status write.
    pub fn kill(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.child.kill().unwrap();
            daemon.child.wait().unwrap();
        }
    }

    /// Start again on the same address and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// `riggerctl ARGS` as the admin user.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_as("admin", args)
    }

    /// `riggerctl ARGS` with the token of `role`.
    pub fn ctl_as(&self, role: &str, args: &[&str]) -> Output {
        self.ctl_command(role, &self.endpoints, args)
            .output()
            .unwrap()
    }

    /// The `riggerctl ARGS` command with the token of `role`, for `servers` (to spawn:
    /// `get -w`, `logs -f`; or to list the replicas in another order).
    pub fn ctl_command(&self, role: &str, servers: &str, args: &[&str]) -> Command {
        let mut command = Command::new(binary("riggerctl"));
        command
            .args(["--server", servers])
            .arg("--ca-file")
            .arg(self.pki.join("ca.pem"))
            .args(["--token", &token(&self.pki, role)])
            .args(args);
        command
    }

    /// Pod `name` once it is ready (condition Ready=True), waited for up to `within`.
    pub fn ready_pod(&self, name: &str, within: Duration) -> serde_json::Value {
        wait_until(&format!("pod {name} to be ready"), within, || {
            let pod = self.get_json(&["pod", name])?;
            pod_ready(&pod).then_some(pod)
        })
    }

    /// `riggerctl ... -o json` parsed; `None` when riggerctl fails.
    pub fn get_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend(["-o", "json"]);
        let out = self.ctl(&all);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    /// `riggerctl apply -f -` with `yaml` on stdin, as the admin.
    /// `riggerctl apply` that must succeed (the test fails with riggerctl's message and
    /// the controller's log otherwise); its standard output.
    pub fn apply_ok(&self, yaml: &str) -> String {
        let out = self.apply(yaml);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            log_tail(&self.log, 20)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn apply(&self, yaml: &str) -> Output {
        output_with_stdin(
            Command::new(binary("riggerctl"))
                .args(["--server", &self.endpoints])
                .arg("--ca-file")
                .arg(self.pki.join("ca.pem"))
                .args(["--token", &token(&self.pki, "admin")])
                .args(["apply", "-f", "-"]),
            yaml,
        )
    }
}

/// A `rigger-agent run` for one lab node, linked to a controller; its state directory
/// and log (`agent.log`) live in `state_dir`.
#[derive(Debug)]
pub struct Agent {
    pub node: String,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    /// `127.0.0.1:PORT` of `/healthz`, `/readyz`, `/inventory` and `/metrics`.
    pub health: String,
    /// The node's containerd socket.
    containerd: PathBuf,
    args: Vec<String>,
    /// The `rigger-agent` run (this tree's; another release's for the skew tests), from
    /// the next start on.
    pub program: PathBuf,
    daemon: Option<Daemon>,
}

/// A test leaves no pods behind: the lab's containerds live across runs, and every
/// sandbox left there lengthens the listings of every later test.
impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log_tail("agent", &self.log);
        }
        self.kill();
        remove_agent_pods(&self.containerd, &self.node);
    }
}

/// Stop and remove the sandboxes (with their containers) agent `node` made on
/// `containerd`; best effort.
fn remove_agent_pods(containerd: &Path, node: &str) {
    use k8s_cri::v1::{
        ListPodSandboxRequest, PodSandboxFilter, runtime_service_client::RuntimeServiceClient,
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let Ok(connected) =
            rigger_runtime::Runtime::connect(containerd, rigger_runtime::DEFAULT_CONNECT_TIMEOUT)
                .await
        else {
            return;
        };
        let mut cri = RuntimeServiceClient::new(connected.channel())
            .max_decoding_message_size(rigger_runtime::MAX_RECEIVE_MESSAGE_SIZE);
        let filter = PodSandboxFilter {
            label_selector: [
                ("rigger.dev/managed".to_owned(), "true".to_owned()),
                ("rigger.dev/node".to_owned(), node.to_owned()),
            ]
            .into(),
            ..PodSandboxFilter::default()
        };
        let Ok(listed) = cri
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await
        else {
            return;
        };
        for sandbox in listed.into_inner().items {
            cri_pod::remove_sandbox(&mut cri, sandbox.id).await;
        }
    });
}

impl Agent {
    /// `containerd`: the node's socket; `namespace`: where pulls go;
    /// `hosts_dir`: its registry configuration. The agent gets a certificate for `node`
    /// from the controller's lab PKI.
    pub fn start(
        controller: &Controller,
        node: &str,
        containerd: &Path,
        hosts_dir: &Path,
        namespace: &str,
        state_dir: &Path,
    ) -> Self {
        let endpoints = controller.endpoints.clone();
        Self::start_via(
            controller, &endpoints, node, containerd, hosts_dir, namespace, state_dir,
        )
    }

    /// As `start`, reaching the controller at `endpoints` (a [`TcpRelay`]'s, say).
    pub fn start_via(
        controller: &Controller,
        endpoints: &str,
        node: &str,
        containerd: &Path,
        hosts_dir: &Path,
        namespace: &str,
        state_dir: &Path,
    ) -> Self {
        let (ca, cert, key) = controller.agent_certs(node);
        let args = vec![
            "run".to_owned(),
            "--address".to_owned(),
            containerd.display().to_string(),
            "--controller".to_owned(),
            endpoints.to_owned(),
            "--ca-file".to_owned(),
            ca.display().to_string(),
            "--cert-file".to_owned(),
            cert.display().to_string(),
            "--key-file".to_owned(),
            key.display().to_string(),
            "--node-name".to_owned(),
            node.to_owned(),
            "--namespace".to_owned(),
            namespace.to_owned(),
            "--registry-config".to_owned(),
            hosts_dir.display().to_string(),
            "--state-dir".to_owned(),
            state_dir.display().to_string(),
            "--max-connections".to_owned(),
            "1".to_owned(),
            "--inventory-interval".to_owned(),
            "2s".to_owned(),
            "--node-labels".to_owned(),
            "rigger.test/agent=yes".to_owned(),
        ];
        let mut agent = Self {
            node: node.to_owned(),
            state_dir: state_dir.to_owned(),
            log: state_dir.join("agent.log"),
            health: format!("127.0.0.1:{}", free_port()),
            containerd: containerd.to_owned(),
            args,
            program: binary("rigger-agent"),
            daemon: None,
        };
        agent.spawn();
        agent
    }

    fn spawn(&mut self) {
        let log = append_log(&self.log);
        self.daemon = Some(Daemon::spawn(
            Command::new(&self.program)
                .args(&self.args)
                .args(["--health-listen", &self.health])
                .env(
                    "RIGGER_LOG_LEVEL",
                    "info,rigger_agent=debug,rigger_pull=debug",
                )
                .stdout(Stdio::null())
                .stderr(log),
        ));
    }

    pub fn kill(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.child.kill().unwrap();
            daemon.child.wait().unwrap();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The running agent's process id.
    pub fn pid(&self) -> u32 {
        self.daemon
            .as_ref()
            .map(|d| d.child.id())
            .expect("the agent runs")
    }

    /// Start again with more `rigger-agent run` flags (kept for later restarts).
    pub fn restart_with_flags(&mut self, flags: &[&str]) {
        self.args.extend(flags.iter().map(|f| (*f).to_owned()));
        self.restart();
    }

    /// Start again, reporting `labels` (`k=v,k2=v2`) about its node.
    pub fn restart_with_node_labels(&mut self, labels: &str) {
        self.restart_with_flag("--node-labels", labels);
    }

    /// Start again with `flag` set to `value` (replacing the value it had).
    pub fn restart_with_flag(&mut self, flag: &str, value: &str) {
        match self.args.iter().position(|a| a == flag) {
            Some(at) => value.clone_into(&mut self.args[at + 1]),
            None => self.args.extend([flag.to_owned(), value.to_owned()]),
        }
        self.restart();
    }
}

/// Running containers named `name` of the pod with sandbox uid `uid`, as CRI of the
/// lab's first node lists them.
pub fn running_containers(uid: &str, name: &str) -> usize {
    running_containers_on(Lab::get().first_node(), uid, name)
}

/// As [`running_containers`], on `node`.
pub fn running_containers_on(node: &LabNode, uid: &str, name: &str) -> usize {
    let out = std::process::Command::new(binary("rigger-agent"))
        .args(["status", "-o", "json", "--no-disk-usage", "--address"])
        .arg(&node.address)
        .output()
        .unwrap();
    let inventory: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sandboxes: Vec<&serde_json::Value> = inventory["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["uid"] == uid)
        .map(|p| &p["id"])
        .collect();
    inventory["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            c["name"] == name
                && c["state"] == "running"
                && sandboxes.contains(&&c["pod_sandbox_id"])
        })
        .count()
}

/// A container's status in a pod as riggerctl shows it (`Null` when it has none yet).
pub fn container_status(pod: &serde_json::Value, name: &str) -> serde_json::Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name).cloned())
        .unwrap_or_default()
}

/// Whether a pod as riggerctl shows it has the condition Ready=True.
pub fn pod_ready(pod: &serde_json::Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// A fenced code block of a Markdown document: its info string, its text, the line it
/// starts on.
#[derive(Debug)]
pub struct CodeBlock {
    pub info: String,
    pub text: String,
    pub line: usize,
}

/// The fenced code blocks of `markdown`, in order.
pub fn code_blocks(markdown: &str) -> Vec<CodeBlock> {
    let mut found = Vec::new();
    let mut open: Option<CodeBlock> = None;
    for (index, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(CodeBlock {
                    info: info.trim().to_owned(),
                    text: String::new(),
                    line: index + 1,
                });
            }
            (Some(_), Some(_)) => found.push(open.take().unwrap()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block");
    found
}
