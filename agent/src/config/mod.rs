//! Configuration of `rigger-agent run`.
//!
//! Every setting can come from the TOML file (`--config`), an environment variable or a
//! flag; a flag beats the environment, which beats the file, which beats the default.
//! The whole configuration is validated before the agent binds or connects anything, and
//! an error names the setting in all three spellings.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rigger_daemon::config::{ConfigError, LOG_FORMAT, LOG_LEVEL, Setting, load_toml};
use rigger_daemon::logging::LogFormat;

pub use crate::link::LinkConfig;

mod peer;
mod pull;
mod tls;

pub use self::pull::PullSettings;
use self::tls::{TlsSettings, controller_endpoint};
pub use crate::sharing::peers::PeerSettings;
use rigger_runtime::DEFAULT_CONTAINERD_ADDRESS;
use rigger_runtime::socket::AUTO;

/// Default address of the health/inventory HTTP endpoint.
pub const DEFAULT_HEALTH_LISTEN: &str = "127.0.0.1:9440";

/// The config file: every key optional, unknown keys refused.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfigFile {
    pub containerd_address: Option<PathBuf>,
    pub runtime_socket_dir: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub health_listen: Option<String>,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
    pub drain_timeout: Option<String>,
    pub inventory_interval: Option<String>,
    pub controller: Option<String>,
    pub node_name: Option<String>,
    pub node_labels: Option<String>,
    pub namespace: Option<String>,
    pub registry_config: Option<PathBuf>,
    pub max_connections: Option<usize>,
    pub limit_rate: Option<String>,
    pub max_document_size: Option<String>,
    pub max_parallel_image_pulls: Option<usize>,
    pub image_fs_threshold_percent: Option<u8>,
    pub through_content_api: Option<bool>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub insecure_plaintext: Option<bool>,
    pub peer_listen: Option<String>,
    pub peer_address: Option<String>,
    pub peer_max_connections: Option<usize>,
    pub peer_upload_rate: Option<String>,
    pub peer_min_rate: Option<String>,
    pub mirror_listen: Option<String>,
}

/// Flags (and their environment variables) of `rigger-agent run`.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct RunArgs {
    /// TOML config file; flags and environment variables override its keys.
    #[arg(long, env = "RIGGER_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// containerd's gRPC socket (CRI is served on the same socket), or `auto` to look
    /// for it under runtime_socket_dir [default: /run/containerd/containerd.sock].
    #[arg(
        long = "address",
        visible_alias = "containerd-address",
        env = "RIGGER_CONTAINERD_ADDRESS",
        value_name = "SOCK"
    )]
    pub containerd_address: Option<PathBuf>,
    /// Where `containerd_address = "auto"` looks: the host's /run, wherever it is mounted
    /// (containerd, k3s; CRI-O and cri-dockerd are named as unsupported) [default: /run].
    #[arg(long, env = "RIGGER_AGENT_RUNTIME_SOCKET_DIR", value_name = "DIR")]
    pub runtime_socket_dir: Option<PathBuf>,
    /// What must outlive the agent: downloads in progress, accepted tasks
    /// [default: /var/lib/rigger].
    #[arg(long, env = "RIGGER_AGENT_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Address for /healthz, /readyz and /inventory [default: 127.0.0.1:9440].
    #[arg(long, env = "RIGGER_AGENT_HEALTH_LISTEN", value_name = "ADDR")]
    pub health_listen: Option<String>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "RIGGER_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log filter, e.g. `info` or `info,rigger_agent=debug` [default: info].
    #[arg(long, env = "RIGGER_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,
    /// How long to wait for work in flight on shutdown, e.g. `10s` [default: 10s].
    #[arg(long, env = "RIGGER_AGENT_DRAIN_TIMEOUT", value_name = "DURATION")]
    pub drain_timeout: Option<String>,
    /// How often the inventory is refreshed, e.g. `30s` [default: 30s].
    #[arg(long, env = "RIGGER_AGENT_INVENTORY_INTERVAL", value_name = "DURATION")]
    pub inventory_interval: Option<String>,
    /// Controller URL, e.g. `https://controller:9450`, or several (comma-separated) for
    /// replicas of an HA controller; without it the agent runs alone.
    #[arg(long, env = "RIGGER_AGENT_CONTROLLER", value_name = "URL")]
    pub controller: Option<String>,
    /// This node's name at the controller [default: the hostname].
    #[arg(long, env = "RIGGER_AGENT_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Labels of this node, `key=value,key2=value2`, for job selectors.
    #[arg(long, env = "RIGGER_AGENT_NODE_LABELS", value_name = "LABELS")]
    pub node_labels: Option<String>,
    /// containerd namespace that pulls go to [default: k8s.io, kubelet's].
    #[arg(long, env = "RIGGER_AGENT_NAMESPACE", value_name = "NS")]
    pub namespace: Option<String>,
    /// containerd's `certs.d` directory of `hosts.toml` files [default: /etc/containerd/certs.d].
    #[arg(long, env = "RIGGER_AGENT_REGISTRY_CONFIG", value_name = "DIR")]
    pub registry_config: Option<PathBuf>,
    /// Registry connections open at once, over all pulls [default: 16].
    #[arg(long, env = "RIGGER_AGENT_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Bandwidth cap for all pulls together, e.g. `50MiB` (per second) [default: none].
    #[arg(long, env = "RIGGER_AGENT_LIMIT_RATE", value_name = "BYTES_PER_S")]
    pub limit_rate: Option<String>,
    /// Largest manifest, index or image config read from a registry, e.g. `16MiB`;
    /// bigger ones are refused as they stream [default: 8MiB].
    #[arg(long, env = "RIGGER_AGENT_MAX_DOCUMENT_SIZE", value_name = "BYTES")]
    pub max_document_size: Option<String>,
    /// Images pulled at once on this node, over jobs, pods and updates (kubelet's
    /// `maxParallelImagePulls`); the others wait their turn [default: no limit].
    #[arg(long, env = "RIGGER_AGENT_MAX_PARALLEL_IMAGE_PULLS", value_name = "N")]
    pub max_parallel_image_pulls: Option<usize>,
    /// A pull that would take the image filesystem past this percent used is refused
    /// before it downloads (kubelet's `imageGCHighThresholdPercent`); 100: only what
    /// does not fit at all [default: 85].
    #[arg(
        long,
        env = "RIGGER_AGENT_IMAGE_FS_THRESHOLD_PERCENT",
        value_name = "PERCENT"
    )]
    pub image_fs_threshold_percent: Option<u8>,
    /// Send every byte of a pull through containerd's content API (`Content.Write`)
    /// instead of writing big blobs beside its store and committing them through the API
    /// [default: off].
    #[arg(long, env = "RIGGER_AGENT_THROUGH_CONTENT_API")]
    pub through_content_api: bool,
    /// CA (PEM) that signed the controller's certificate (https:// controllers).
    #[arg(long, env = "RIGGER_AGENT_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// This agent's client certificate (PEM), issued for the node name.
    #[arg(long, env = "RIGGER_AGENT_CERT_FILE", value_name = "FILE")]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "RIGGER_AGENT_KEY_FILE", value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Allow an http:// controller: no encryption, no authentication (trusted networks).
    #[arg(long, env = "RIGGER_AGENT_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// Serve blobs to the other nodes of jobs on this address, e.g. `0.0.0.0:9441`
    /// (HTTPS with this node's certificate; needs an https:// controller) [default: off].
    #[arg(long, env = "RIGGER_AGENT_PEER_LISTEN", value_name = "ADDR")]
    pub peer_listen: Option<String>,
    /// Where the other nodes reach peer_listen, `host:port` [default: peer_listen, when
    /// that is a specific address].
    #[arg(long, env = "RIGGER_AGENT_PEER_ADDRESS", value_name = "HOST:PORT")]
    pub peer_address: Option<String>,
    /// Peer connections served at once; more are closed at once and the peer goes to
    /// its next source [default: 8].
    #[arg(long, env = "RIGGER_AGENT_PEER_MAX_CONNECTIONS", value_name = "N")]
    pub peer_max_connections: Option<usize>,
    /// Cap on the bytes per second served to peers, all together, e.g. `100MiB`
    /// [default: 200MiB].
    #[arg(
        long,
        env = "RIGGER_AGENT_PEER_UPLOAD_RATE",
        value_name = "BYTES_PER_S"
    )]
    pub peer_upload_rate: Option<String>,
    /// The pace a peer must keep while this node fetches from it, e.g. `4MiB`: a peer
    /// slower than this over a 5 s window (a stall included) is left for the next source
    /// or the registry, from the bytes already received. Lower it where the registry
    /// gives a node less than 16 MiB/s (a node still downloading passes a layer on at a
    /// sixteenth of its link) [default: 1MiB].
    #[arg(long, env = "RIGGER_AGENT_PEER_MIN_RATE", value_name = "BYTES_PER_S")]
    pub peer_min_rate: Option<String>,
    /// Answer the node's containerd as a registry mirror on this loopback address, e.g.
    /// `127.0.0.1:9442`: kubelet's pulls of an image a job put on this node fetch it from
    /// the other nodes that hold it (containerd's hosts.toml names it with
    /// `capabilities = ["pull"]`; needs an https:// controller) [default: off].
    #[arg(long, env = "RIGGER_AGENT_MIRROR_LISTEN", value_name = "ADDR")]
    pub mirror_listen: Option<String>,
    /// Check the configuration and exit: 0 if it is usable, 64 naming the bad key.
    #[arg(long)]
    pub check_config: bool,
}

/// Flags of `run` that are not configuration keys (the config reference skips them).
pub const NOT_CONFIG_KEYS: &[&str] = &["config", "check_config"];

/// The validated configuration the agent runs with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub containerd_address: PathBuf,
    /// Spooled downloads live in its `spool/`.
    pub state_dir: PathBuf,
    pub health_listen: SocketAddr,
    pub log_format: LogFormat,
    pub log_level: String,
    pub drain_timeout: Duration,
    pub inventory_interval: Duration,
    /// The controller link; `None` when the agent runs alone.
    pub link: Option<LinkConfig>,
    pub pull: PullSettings,
    /// Serving blobs to peers; `None` when off.
    pub peer: Option<PeerSettings>,
    /// The registry mirror for the node's containerd; `None` when off.
    pub mirror_listen: Option<std::net::SocketAddr>,
    /// This node's certificate, key and the fleet's CA (an https:// controller's), with
    /// which it fetches from peers a job names.
    pub node_identity: Option<rigger_pull::peers::PeerIdentity>,
    /// The pace peers must keep while this node fetches from them.
    pub peer_pace: rigger_pull::peers::PeerPace,
}

impl AgentConfig {
    /// Merge defaults, the file named by `--config` (if any) and `args`, then validate.
    pub fn resolve(args: &RunArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => load_toml::<AgentConfigFile>(path)?,
            None => AgentConfigFile::default(),
        };
        Self::from_layers(file, args.clone())
    }

    /// Merge a parsed file with flags and validate (what `resolve` does after reading).
    pub fn from_layers(file: AgentConfigFile, args: RunArgs) -> Result<Self, ConfigError> {
        let containerd_address = args
            .containerd_address
            .or(file.containerd_address)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONTAINERD_ADDRESS));
        let runtime_socket_dir = args.runtime_socket_dir.or(file.runtime_socket_dir);
        if runtime_socket_dir.is_some() && containerd_address != Path::new(AUTO) {
            return Err(
                RUNTIME_SOCKET_DIR.invalid("is only used with containerd_address = \"auto\"")
            );
        }
        let containerd_address = if containerd_address == Path::new(AUTO) {
            let dir = runtime_socket_dir.unwrap_or_else(|| {
                PathBuf::from(rigger_runtime::socket::DEFAULT_RUNTIME_SOCKET_DIR)
            });
            rigger_runtime::socket::detect(&dir)
                .map_err(|e| CONTAINERD_ADDRESS.invalid(e.to_string()))?
        } else {
            containerd_address
        };
        if !containerd_address.is_absolute() {
            return Err(CONTAINERD_ADDRESS.invalid(format!(
                "{} is not an absolute path",
                containerd_address.display()
            )));
        }
        let state_dir = args
            .state_dir
            .or(file.state_dir)
            .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_STATE_DIR));
        if !state_dir.is_absolute() {
            return Err(
                STATE_DIR.invalid(format!("{} is not an absolute path", state_dir.display()))
            );
        }
        let health_listen = HEALTH_LISTEN.socket_addr(
            args.health_listen.or(file.health_listen),
            DEFAULT_HEALTH_LISTEN,
        )?;
        let log_format = LOG_FORMAT.log_format(args.log_format.or(file.log_format).as_deref())?;
        let log_level = LOG_LEVEL.log_filter(args.log_level.or(file.log_level))?;
        let drain_timeout = DRAIN_TIMEOUT.duration(
            args.drain_timeout.or(file.drain_timeout),
            Duration::from_secs(10),
        )?;
        if drain_timeout > Duration::from_secs(600) {
            return Err(DRAIN_TIMEOUT.invalid("must be at most 10m"));
        }
        let inventory_interval = INVENTORY_INTERVAL.duration(
            args.inventory_interval.or(file.inventory_interval),
            Duration::from_secs(30),
        )?;
        if inventory_interval < Duration::from_secs(1) {
            return Err(INVENTORY_INTERVAL.invalid("must be at least 1s"));
        }

        let node_labels = parse_labels(args.node_labels.or(file.node_labels).as_deref())?;
        let node_name = args.node_name.or(file.node_name);
        let tls = TlsSettings {
            ca_file: args.ca_file.or(file.ca_file),
            cert_file: args.cert_file.or(file.cert_file),
            key_file: args.key_file.or(file.key_file),
            insecure_plaintext: args.insecure_plaintext || file.insecure_plaintext == Some(true),
        };
        let controller = args.controller.or(file.controller);
        // Read from the TLS files once, for the first https:// controller.
        let mut node_identity = None;
        let link = match controller.clone() {
            None => {
                if node_name.is_some() || !node_labels.is_empty() {
                    return Err(CONTROLLER.invalid("node_name and node_labels need a controller"));
                }
                None
            }
            Some(url) => {
                // Several URLs: replicas of an HA controller; the agent moves on from a
                // follower or an unreachable one.
                let controllers = url
                    .split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(|u| controller_endpoint(u, &tls, &mut node_identity))
                    .collect::<Result<Vec<_>, _>>()?;
                if controllers.is_empty() {
                    return Err(CONTROLLER.invalid("names no URL"));
                }
                let node_name = match node_name {
                    Some(name) => name,
                    None => hostname().ok_or_else(|| {
                        NODE_NAME.invalid("the hostname cannot be read: set the node name")
                    })?,
                };
                rigger_proto::check_node_name(&node_name).map_err(|e| NODE_NAME.invalid(e))?;
                Some(LinkConfig {
                    controllers,
                    node_name,
                    node_labels,
                    plaintext: url.contains("http://"),
                })
            }
        };

        let peer = peer::resolve(
            peer::PeerArgs {
                listen: args.peer_listen.or(file.peer_listen),
                address: args.peer_address.or(file.peer_address),
                max_connections: args.peer_max_connections.or(file.peer_max_connections),
                upload_rate: args.peer_upload_rate.or(file.peer_upload_rate),
            },
            controller.as_deref(),
            link.as_ref().map(|l| l.node_name.as_str()),
            node_identity.as_ref(),
        )?;
        let mirror_listen = peer::mirror(
            args.mirror_listen.or(file.mirror_listen),
            controller.as_deref(),
            node_identity.as_ref(),
        )?;
        let peer_pace = peer::pace(bytes(
            peer::PEER_MIN_RATE,
            args.peer_min_rate.or(file.peer_min_rate),
        )?)?;

        let pull = pull::resolve(pull::PullArgs {
            namespace: args.namespace.or(file.namespace),
            registry_config: args.registry_config.or(file.registry_config),
            max_connections: args.max_connections.or(file.max_connections),
            limit_rate: args.limit_rate.or(file.limit_rate),
            max_document_size: args.max_document_size.or(file.max_document_size),
            max_parallel_image_pulls: args
                .max_parallel_image_pulls
                .or(file.max_parallel_image_pulls),
            image_fs_threshold_percent: args
                .image_fs_threshold_percent
                .or(file.image_fs_threshold_percent),
            through_content_api: args.through_content_api || file.through_content_api == Some(true),
        })?;

        Ok(Self {
            containerd_address,
            state_dir,
            health_listen,
            log_format,
            log_level,
            drain_timeout,
            inventory_interval,
            link,
            pull,
            peer,
            mirror_listen,
            node_identity,
            peer_pace,
        })
    }

    /// Where the containerd socket is; for messages.
    pub fn containerd_address(&self) -> &Path {
        &self.containerd_address
    }
}

/// A size or rate like `50MiB` or `1000000` (bytes), when given.
pub(super) fn bytes(setting: Setting, value: Option<String>) -> Result<Option<u64>, ConfigError> {
    value
        .map(|text| {
            text.parse::<bytesize::ByteSize>()
                .map(|b| b.as_u64())
                .map_err(|e| setting.invalid(format!("{text:?}: {e}")))
        })
        .transpose()
}

/// The node's hostname, lowercased as node names are.
fn hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()?
        .into_string()
        .ok()
        .map(|h| h.to_ascii_lowercase())
}

/// `key=value,key2=value2` with Kubernetes' label syntax (optional `prefix/` on keys).
fn parse_labels(text: Option<&str>) -> Result<HashMap<String, String>, ConfigError> {
    let mut labels = HashMap::new();
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        return Ok(labels);
    };
    let name_ok = |s: &str, allow_empty: bool| {
        (allow_empty && s.is_empty())
            || (!s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
    };
    for pair in text.split(',') {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| NODE_LABELS.invalid(format!("{pair:?} is not key=value")))?;
        let (key, value) = (key.trim(), value.trim());
        let name = key.rsplit_once('/').map_or(key, |(prefix, name)| {
            if prefix.is_empty() || prefix.len() > 253 {
                ""
            } else {
                name
            }
        });
        if !name_ok(name, false) || !name_ok(value, true) {
            return Err(NODE_LABELS.invalid(format!(
                "{pair:?} is not a valid label (names and values: up to 63 of [A-Za-z0-9._-], alphanumeric at both ends)"
            )));
        }
        if labels.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(NODE_LABELS.invalid(format!("label {key:?} is given twice")));
        }
    }
    Ok(labels)
}

pub(super) const CONTROLLER: Setting = Setting {
    key: "controller",
    flag: "--controller",
    env: "RIGGER_AGENT_CONTROLLER",
};
const NODE_NAME: Setting = Setting {
    key: "node_name",
    flag: "--node-name",
    env: "RIGGER_AGENT_NODE_NAME",
};
const NODE_LABELS: Setting = Setting {
    key: "node_labels",
    flag: "--node-labels",
    env: "RIGGER_AGENT_NODE_LABELS",
};
const CONTAINERD_ADDRESS: Setting = Setting {
    key: "containerd_address",
    flag: "--address",
    env: "RIGGER_CONTAINERD_ADDRESS",
};
const RUNTIME_SOCKET_DIR: Setting = Setting {
    key: "runtime_socket_dir",
    flag: "--runtime-socket-dir",
    env: "RIGGER_AGENT_RUNTIME_SOCKET_DIR",
};
const STATE_DIR: Setting = Setting {
    key: "state_dir",
    flag: "--state-dir",
    env: "RIGGER_AGENT_STATE_DIR",
};
const HEALTH_LISTEN: Setting = Setting {
    key: "health_listen",
    flag: "--health-listen",
    env: "RIGGER_AGENT_HEALTH_LISTEN",
};
const DRAIN_TIMEOUT: Setting = Setting {
    key: "drain_timeout",
    flag: "--drain-timeout",
    env: "RIGGER_AGENT_DRAIN_TIMEOUT",
};
const INVENTORY_INTERVAL: Setting = Setting {
    key: "inventory_interval",
    flag: "--inventory-interval",
    env: "RIGGER_AGENT_INVENTORY_INTERVAL",
};

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> AgentConfigFile {
        rigger_daemon::config::parse_toml(Path::new("agent.toml"), text).unwrap()
    }

    #[test]
    fn auto_finds_the_containerd_socket_under_the_runtime_socket_dir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("containerd")).unwrap();
        let socket = dir.path().join("containerd/containerd.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let args = RunArgs {
            containerd_address: Some(PathBuf::from("auto")),
            runtime_socket_dir: Some(dir.path().to_owned()),
            ..RunArgs::default()
        };
        let config = AgentConfig::from_layers(AgentConfigFile::default(), args).unwrap();
        assert_eq!(config.containerd_address, socket);

        let empty = tempfile::tempdir().unwrap();
        let args = RunArgs {
            containerd_address: Some(PathBuf::from("auto")),
            runtime_socket_dir: Some(empty.path().to_owned()),
            ..RunArgs::default()
        };
        let error = AgentConfig::from_layers(AgentConfigFile::default(), args).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("config field `containerd_address`"),
            "{error}"
        );

        let args = RunArgs {
            runtime_socket_dir: Some(dir.path().to_owned()),
            ..RunArgs::default()
        };
        let error = AgentConfig::from_layers(AgentConfigFile::default(), args).unwrap_err();
        assert!(error.to_string().contains("runtime_socket_dir"), "{error}");
    }

    #[test]
    fn every_flag_of_run_is_a_file_key() {
        let run = <RunArgs as clap::Args>::augment_args(clap::Command::new("run"));
        let missing =
            rigger_daemon::config::keys_missing_from_file::<AgentConfigFile>(&run, NOT_CONFIG_KEYS);
        assert!(missing.is_empty(), "flags without a file key: {missing:?}");
    }

    #[test]
    fn defaults() {
        let config =
            AgentConfig::from_layers(AgentConfigFile::default(), RunArgs::default()).unwrap();
        assert_eq!(
            config.containerd_address,
            PathBuf::from(DEFAULT_CONTAINERD_ADDRESS)
        );
        assert_eq!(config.health_listen.to_string(), DEFAULT_HEALTH_LISTEN);
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.drain_timeout, Duration::from_secs(10));
    }

    #[test]
    fn big_blobs_are_written_beside_containerds_store_unless_told_otherwise() {
        let config =
            AgentConfig::from_layers(AgentConfigFile::default(), RunArgs::default()).unwrap();
        assert!(config.pull.write_content_directly);
        assert!(
            config
                .pull
                .pull_options(Path::new("/s"))
                .write_content_directly
        );
        let config =
            AgentConfig::from_layers(file("through_content_api = true"), RunArgs::default())
                .unwrap();
        assert!(!config.pull.write_content_directly);
        let args = RunArgs {
            through_content_api: true,
            ..RunArgs::default()
        };
        let config = AgentConfig::from_layers(AgentConfigFile::default(), args).unwrap();
        assert!(
            !config
                .pull
                .pull_options(Path::new("/s"))
                .write_content_directly
        );
    }

    #[test]
    fn flags_override_the_file() {
        let f = file(
            "health_listen = \"127.0.0.1:1\"\ndrain_timeout = \"3s\"\nlog_format = \"json\"\n",
        );
        let args = RunArgs {
            health_listen: Some("127.0.0.1:2".into()),
            ..RunArgs::default()
        };
        let config = AgentConfig::from_layers(f, args).unwrap();
        assert_eq!(config.health_listen.port(), 2);
        assert_eq!(config.drain_timeout, Duration::from_secs(3));
        assert_eq!(config.log_format, LogFormat::Json);
    }

    #[test]
    fn bad_values_name_the_setting() {
        let cases = [
            (
                "drain_timeout = \"soon\"",
                "`drain_timeout` (--drain-timeout",
            ),
            ("health_listen = \"localhost\"", "health_listen"),
            ("log_format = \"xml\"", "log_format"),
            ("log_level = \"info,x=loud\"", "log_level"),
            (
                "containerd_address = \"relative.sock\"",
                "containerd_address",
            ),
            ("inventory_interval = \"10ms\"", "inventory_interval"),
        ];
        for (text, field) in cases {
            let err = AgentConfig::from_layers(file(text), RunArgs::default()).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(field), "{text}: {msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    #[test]
    fn controller_link_settings() {
        let f = file(
            "controller = \"http://127.0.0.1:9450\"\ninsecure_plaintext = true\nnode_name = \"n1\"\nnode_labels = \"zone=a, example.com/gpu=true\"\n",
        );
        let link = AgentConfig::from_layers(f, RunArgs::default())
            .unwrap()
            .link
            .unwrap();
        assert_eq!(link.node_name, "n1");
        assert_eq!(link.node_labels["zone"], "a");
        assert_eq!(link.node_labels["example.com/gpu"], "true");

        let cases = [
            ("controller = \"ftp://c:1\"", "`controller`"),
            ("controller = \"http://c:1\"", "is plain text"),
            ("controller = \"https://c:1\"", "`ca_file`"),
            (
                "controller = \"https://c:1\"\nca_file = \"/nonexistent/ca.pem\"",
                "/nonexistent/ca.pem",
            ),
            (
                "controller = \"http://c:1\"\ninsecure_plaintext = true\nnode_name = \"Bad_Name\"",
                "`node_name`",
            ),
            (
                "controller = \"http://c:1\"\ninsecure_plaintext = true\nnode_labels = \"zone\"",
                "`node_labels`",
            ),
            (
                "controller = \"http://c:1\"\ninsecure_plaintext = true\nnode_labels = \"-x=1\"",
                "`node_labels`",
            ),
            ("node_name = \"n1\"", "`controller`"),
            ("state_dir = \"relative/dir\"", "`state_dir`"),
            ("max_connections = 0", "`max_connections`"),
            ("limit_rate = \"fast\"", "`limit_rate`"),
            ("max_document_size = \"huge\"", "`max_document_size`"),
            ("max_document_size = \"2GiB\"", "`max_document_size`"),
            ("max_parallel_image_pulls = 0", "`max_parallel_image_pulls`"),
            (
                "max_parallel_image_pulls = 100000",
                "`max_parallel_image_pulls`",
            ),
            (
                "image_fs_threshold_percent = 0",
                "`image_fs_threshold_percent`",
            ),
            (
                "image_fs_threshold_percent = 101",
                "`image_fs_threshold_percent`",
            ),
            ("namespace = \"a/b\"", "`namespace`"),
        ];
        for (text, field) in cases {
            let err = AgentConfig::from_layers(file(text), RunArgs::default()).unwrap_err();
            assert!(err.to_string().contains(field), "{text}: {err}");
        }
    }

    #[test]
    fn documented_example_is_valid_and_matches_the_defaults() {
        let example = file(include_str!("../../../docs/config/agent.toml"));
        let config = AgentConfig::from_layers(example, RunArgs::default()).unwrap();
        let defaults =
            AgentConfig::from_layers(AgentConfigFile::default(), RunArgs::default()).unwrap();
        assert_eq!(format!("{config:?}"), format!("{defaults:?}"));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = rigger_daemon::config::parse_toml::<AgentConfigFile>(
            Path::new("agent.toml"),
            "containerd_adress = \"/x.sock\"",
        )
        .unwrap_err();
        assert!(err.to_string().contains("containerd_adress"), "{err}");
    }
}
