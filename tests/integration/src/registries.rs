//! Registries for tests beyond the lab's own: the fault-injecting proxy, registries that
//! want credentials (basic or bearer tokens), and a TLS registry with a private CA that
//! can require client certificates.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{Daemon, Lab, binary, free_port, http_get, repo_root, wait_until};

/// `rigger-lab-proxy` in front of the lab registry, with fault rules; stopped on drop.
#[derive(Debug)]
pub struct Proxy {
    /// `127.0.0.1:PORT`
    pub address: String,
    _daemon: Daemon,
}

impl Proxy {
    /// Start the proxy with `faults` (a JSON list of rules, see the proxy's docs) and
    /// extra flags.
    pub fn start(faults: &serde_json::Value, flags: &[&str]) -> Self {
        Self::start_to(&format!("http://{}", Lab::get().registry), faults, flags)
    }

    /// [`Proxy::start`] in front of `upstream` (`http://host:port`).
    pub fn start_to(upstream: &str, faults: &serde_json::Value, flags: &[&str]) -> Self {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("faults.json");
        std::fs::write(&rules, faults.to_string()).unwrap();
        let mut daemon = Daemon::spawn(
            Command::new(binary("rigger-lab-proxy"))
                .args(["--upstream", upstream])
                .arg("--faults")
                .arg(&rules)
                .args(flags)
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        );
        let mut line = String::new();
        std::io::BufReader::new(daemon.child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line.split_whitespace().last().unwrap().to_owned();
        Self {
            address,
            _daemon: daemon,
        }
    }

    /// Replace the fault rules (`PUT /_proxy/faults`).
    pub fn set_faults(&self, rules: &serde_json::Value) {
        use std::io::{Read as _, Write as _};
        let body = rules.to_string();
        let mut stream = std::net::TcpStream::connect(&self.address).unwrap();
        write!(
            stream,
            "PUT /_proxy/faults HTTP/1.0\r\nHost: {}\r\nContent-Length: {}\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(
            response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200"),
            "{response}"
        );
    }

    /// Requests served so far: `[{method, path, range, status, fault, authorization,
    /// headers}]` (`authorization` is the scheme of the header, or null).
    pub fn requests(&self) -> Vec<serde_json::Value> {
        let (code, body) = http_get(&self.address, "/_proxy/requests").unwrap();
        assert_eq!(code, 200);
        serde_json::from_str(&body).unwrap()
    }
}

/// `docker-registry serve CONFIG`, stopped on drop.
fn registry_daemon(config: &Path) -> Daemon {
    Daemon::spawn(
        Command::new("docker-registry")
            .arg("serve")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
}

/// A distribution registry on a free port, storing under `storage`, with the `auth:`
/// section `auth` (YAML, indented by two); returns once it answers 401 on `/v2/`.
fn serve_registry(dir: &Path, storage: &Path, auth: &str) -> (String, Daemon) {
    let port = free_port();
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog: {{level: error, accesslog: {{disabled: true}}}}\nstorage: {{filesystem: {{rootdirectory: {}}}}}\nauth:\n{auth}http: {{addr: 127.0.0.1:{port}}}\n",
            storage.display()
        ),
    )
    .unwrap();
    let daemon = registry_daemon(&config);
    let address = format!("127.0.0.1:{port}");
    wait_until(
        "the registry that wants credentials",
        Duration::from_secs(20),
        || http_get(&address, "/v2/").filter(|(code, _)| *code == 401),
    );
    (address, daemon)
}

/// A second registry that wants credentials, for auth tests: basic auth (htpasswd,
/// bcrypt) with [`AuthRegistry::start`], or bearer tokens from `rigger-lab-token-server`
/// with [`AuthRegistry::with_tokens`].
#[derive(Debug)]
pub struct AuthRegistry {
    /// `127.0.0.1:PORT`
    pub address: String,
    pub user: String,
    pub password: String,
    /// The token server's `127.0.0.1:PORT`, for a token registry.
    pub token_server: Option<String>,
    /// The docker `identitytoken` the token server accepts, for a token registry.
    pub identity_token: Option<String>,
    _dir: tempfile::TempDir,
    _daemons: Vec<Daemon>,
}

impl AuthRegistry {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (user, password) = (
            "rigger".to_owned(),
            format!("secret-{}", std::process::id()),
        );
        // bcrypt, as the registry's htpasswd wants; Python's crypt module has it.
        let hash = Command::new("python3")
            .args(["-W", "ignore", "-c", "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))"])
            .arg(&password)
            .output()
            .unwrap();
        assert!(hash.status.success());
        let htpasswd = dir.path().join("htpasswd");
        std::fs::write(
            &htpasswd,
            format!("{user}:{}", String::from_utf8(hash.stdout).unwrap()),
        )
        .unwrap();
        let (address, daemon) = serve_registry(
            dir.path(),
            &dir.path().join("data"),
            &format!(
                "  htpasswd:\n    realm: rigger-lab\n    path: {}\n",
                htpasswd.display()
            ),
        );
        Self {
            address,
            user,
            password,
            token_server: None,
            identity_token: None,
            _dir: dir,
            _daemons: vec![daemon],
        }
    }

    /// A registry serving the lab registry's images (read-only, same storage) that wants
    /// bearer tokens, issued by `rigger-lab-token-server` to this registry's user (and to
    /// anyone with `allow_anonymous`).
    pub fn with_tokens(allow_anonymous: bool) -> Self {
        Self::with_tokens_expiring(allow_anonymous, Duration::from_secs(300))
    }

    /// [`AuthRegistry::with_tokens`] whose tokens expire after `lifetime`.
    pub fn with_tokens_expiring(allow_anonymous: bool, lifetime: Duration) -> Self {
        let lab = Lab::get();
        let dir = tempfile::tempdir().unwrap();
        let (user, password) = (
            "rigger".to_owned(),
            format!("token-secret-{}", std::process::id()),
        );
        let identity_token = format!("refresh-secret-{}", std::process::id());
        let cert = dir.path().join("token-cert.pem");
        let mut command = Command::new(binary("rigger-lab-token-server"));
        command
            .arg("--cert-out")
            .arg(&cert)
            .args(["--user", &user, "--password", &password])
            .args(["--refresh-token", &identity_token])
            .args(["--expires-in", &lifetime.as_secs().to_string()]);
        if allow_anonymous {
            command.arg("--allow-anonymous");
        }
        let mut token_daemon = Daemon::spawn(command.stdout(Stdio::piped()).stderr(Stdio::null()));
        let token_server = {
            use std::io::BufRead as _;
            let stdout = token_daemon.child.stdout.take().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(stdout)
                .read_line(&mut line)
                .unwrap();
            line.split_whitespace().last().unwrap().to_owned()
        };
        let (address, registry) = serve_registry(
            dir.path(),
            &lab.dir.join("registry/data"),
            &format!(
                "  token:\n    realm: http://{token_server}/token\n    service: rigger-lab\n    issuer: rigger-lab-token-server\n    rootcertbundle: {}\n",
                cert.display()
            ),
        );
        Self {
            address,
            user,
            password,
            token_server: Some(token_server),
            identity_token: Some(identity_token),
            _dir: dir,
            _daemons: vec![token_daemon, registry],
        }
    }

    /// The token server's record of every token it issued (`account`, `scope`,
    /// `grant`, `authorization`).
    fn issued(&self) -> Vec<serde_json::Value> {
        let server = self.token_server.as_deref().expect("a token registry");
        let (_, body) = http_get(server, "/_token/issued").unwrap();
        serde_json::from_str(&body).unwrap()
    }

    /// Who the token server gave tokens to: `(account, scope)`; account is empty for
    /// anonymous clients.
    pub fn tokens_issued(&self) -> Vec<(String, String)> {
        let text = |v: &serde_json::Value| v.as_str().unwrap().to_owned();
        self.issued()
            .iter()
            .map(|i| (text(&i["account"]), text(&i["scope"])))
            .collect()
    }

    /// How each token was granted (`basic`, `anonymous`, `refresh_token`) and whether
    /// its request carried an `Authorization` header.
    pub fn token_grants(&self) -> Vec<(String, bool)> {
        self.issued()
            .iter()
            .map(|i| {
                let grant = i["grant"].as_str().unwrap().to_owned();
                (grant, i["authorization"].as_bool().unwrap())
            })
            .collect()
    }

    /// A docker config.json giving this registry's identity token, as `docker login`
    /// writes it for registries with an OAuth2 token service.
    pub fn identity_docker_config(&self, dir: &Path) -> PathBuf {
        let path = dir.join("config.json");
        let token = self.identity_token.as_deref().expect("a token registry");
        let config = serde_json::json!({
            "auths": {
                self.address.as_str(): {"auth": "PHRva2VuPjo=", "identitytoken": token}
            }
        });
        std::fs::write(&path, config.to_string()).unwrap();
        path
    }

    /// Push a small image (`repo:1`) with the registry's credentials.
    pub fn push(&self, repo: &str) {
        self.push_with(repo, &[]);
    }

    /// [`push`](Self::push) with more `lab-images layers` flags (`--base busybox` for an
    /// image a container can run).
    pub fn push_with(&self, repo: &str, flags: &[&str]) {
        let out = Command::new("python3")
            .arg(repo_root().join("scripts/lab-images"))
            .arg("--work")
            .arg(self._dir.path().join("images"))
            .args(["--registry", &self.address])
            .args(["--user", &format!("{}:{}", self.user, self.password)])
            .args(["layers", "--name", repo, "--count", "1", "--size", "65536"])
            .args(flags)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A docker config.json with this registry's credentials.
    pub fn docker_config(&self, dir: &Path) -> PathBuf {
        use std::io::Write as _;
        let path = dir.join("config.json");
        let token = {
            // base64 without a crate: python is already a lab dependency.
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import base64,sys; print(base64.b64encode(sys.argv[1].encode()).decode())",
                ])
                .arg(format!("{}:{}", self.user, self.password))
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        };
        let mut f = std::fs::File::create(&path).unwrap();
        write!(
            f,
            r#"{{"auths":{{"{}":{{"auth":"{token}"}}}}}}"#,
            self.address
        )
        .unwrap();
        path
    }
}

/// A `certs.d` directory under `dir` whose `hosts.toml` for `registry` (`host:port`,
/// served over plain HTTP) lists the mirror at `mirror_url` first, able to pull and
/// resolve, with the extra `settings` lines of that host (e.g. `  skip_verify = true\n`).
pub fn mirror_hosts_dir(dir: &Path, registry: &str, mirror_url: &str, settings: &str) -> PathBuf {
    let hosts = dir.join("certs.d");
    std::fs::create_dir_all(hosts.join(registry)).unwrap();
    std::fs::write(
        hosts.join(registry).join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n[host.\"{mirror_url}\"]\n  capabilities = [\"pull\", \"resolve\"]\n{settings}"
        ),
    )
    .unwrap();
    hosts
}

/// A `certs.d` directory under `dir` saying that each of `registries` (`host:port`)
/// speaks plain HTTP, for agents pulling through a test proxy.
pub fn plain_http_hosts_dir(dir: &Path, registries: &[&str]) -> PathBuf {
    let hosts = dir.join("certs.d");
    for registry in registries {
        let at = hosts.join(registry);
        std::fs::create_dir_all(&at).unwrap();
        std::fs::write(
            at.join("hosts.toml"),
            format!(
                "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap();
    }
    hosts
}

/// A `certs.d` directory in `dir` sending containerd's pulls of `registry` (plain HTTP)
/// to the agent's mirror at `mirror` first, for pulls only, over TLS with the mirror's
/// client certificate from the agent's `state_dir` — the operator guide's hosts.toml.
pub fn mirror_client_hosts_dir(dir: &Path, registry: &str, mirror: &str, state_dir: &Path) {
    let at = dir.join(registry);
    std::fs::create_dir_all(&at).unwrap();
    let files = state_dir.join("mirror");
    let file = |name: &str| files.join(name).display().to_string();
    std::fs::write(
        at.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"https://{mirror}\"]\n  capabilities = [\"pull\"]\n  ca = \"{}\"\n  client = [[\"{}\", \"{}\"]]\n",
            file("ca.pem"),
            file("client.pem"),
            file("client-key.pem"),
        ),
    )
    .unwrap();
}

/// An HTTPS client as the node's containerd is to the agent's mirror: its CA trusted
/// and its client certificate presented (from the agent's `state_dir`).
pub fn mirror_client(state_dir: &Path) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let files = state_dir.join("mirror");
    let read = |name: &str| std::fs::read(files.join(name)).unwrap();
    let mut identity = read("client.pem");
    identity.extend_from_slice(&read("client-key.pem"));
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&read("ca.pem")).unwrap())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .no_proxy()
        .build()
        .unwrap()
}

/// A registry serving the lab registry's images over HTTPS with a certificate from a
/// private CA (not in the system's roots), optionally requiring client certificates
/// from that CA. Its files are under [`TlsRegistry::dir`]: `ca.pem`, `client.pem`,
/// `client.key`.
#[derive(Debug)]
pub struct TlsRegistry {
    /// `127.0.0.1:PORT`
    pub address: String,
    dir: tempfile::TempDir,
    _daemon: Daemon,
}

impl TlsRegistry {
    pub fn start(require_client_certificates: bool) -> Self {
        let lab = Lab::get();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca = crate::pki::PrivateCa::new(dir.path());
        let (server_pem, server_key) = ca.issue("server", "127.0.0.1", &["127.0.0.1", "localhost"]);
        ca.issue("client", "rigger-agent", &[]);

        let port = free_port();
        let client_cas = if require_client_certificates {
            format!(", clientcas: [{}]", dir.path().join("ca.pem").display())
        } else {
            String::new()
        };
        let config = write(
            "config.yml",
            format!(
                "version: 0.1\nlog: {{level: error, accesslog: {{disabled: true}}}}\nstorage: {{filesystem: {{rootdirectory: {}}}, maintenance: {{readonly: {{enabled: true}}}}}}\nhttp: {{addr: 127.0.0.1:{port}, tls: {{certificate: {}, key: {}{client_cas}}}}}\n",
                lab.dir.join("registry/data").display(),
                server_pem.display(),
                server_key.display()
            ),
        );
        let daemon = registry_daemon(&config);
        let address = format!("127.0.0.1:{port}");
        wait_until("the TLS registry", Duration::from_secs(20), || {
            std::net::TcpStream::connect(&address).ok()
        });
        Self {
            address,
            dir,
            _daemon: daemon,
        }
    }

    /// Where `ca.pem`, `client.pem` and `client.key` are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
