//! Configuration of `rigger-controller`: defaults < TOML file < environment < flags,
//! validated as a whole before anything binds.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use rigger_daemon::config::{ConfigError, LOG_FORMAT, LOG_LEVEL, Setting, load_toml};
use rigger_daemon::logging::LogFormat;

use crate::serve::rate_limit::ApiRate;

mod peer_grant;
mod store;
mod webhook;

pub use peer_grant::PeerGrantKey;
use peer_grant::{PEER_GRANT_VERIFY_KEYS, peer_grant_key, peer_grant_verify_key};
pub use store::{EtcdTls, StoreConfig};
use store::{etcd_tls, kubernetes_settings, parse_store};
pub use webhook::{SidecarWebhookSettings, WebhookAddress, WebhookArgs};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:9450";
pub const DEFAULT_HEALTH_LISTEN: &str = "127.0.0.1:9451";
/// systemd's `StateDirectory=rigger-controller`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/rigger-controller";

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfigFile {
    pub listen: Option<String>,
    pub health_listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub log_format: Option<String>,
    pub log_level: Option<String>,
    pub drain_timeout: Option<String>,
    pub heartbeat_interval: Option<String>,
    pub node_timeout: Option<String>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    pub tokens_file: Option<PathBuf>,
    pub insecure_plaintext: Option<bool>,
    pub store: Option<String>,
    pub etcd_ca_file: Option<PathBuf>,
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    pub leader_lease: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub kubernetes_namespace: Option<String>,
    pub kruise_manager: Option<bool>,
    pub write_node_images: Option<bool>,
    pub api_requests_per_second: Option<u32>,
    pub api_burst: Option<u32>,
    pub peer_grant_key: Option<PathBuf>,
    pub peer_grant_verify_keys: Option<Vec<PathBuf>>,
    pub sidecar_webhook_listen: Option<String>,
    pub sidecar_webhook_service: Option<String>,
    pub sidecar_webhook_url: Option<String>,
}

#[derive(Debug, Default, Clone, clap::Args)]
pub struct ControllerArgs {
    /// TOML config file; flags and environment variables override its keys.
    #[arg(long, env = "RIGGER_CONTROLLER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// gRPC address for agents and riggerctl [default: 127.0.0.1:9450].
    #[arg(long, env = "RIGGER_CONTROLLER_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Address for /healthz and /readyz [default: 127.0.0.1:9451].
    #[arg(long, env = "RIGGER_CONTROLLER_HEALTH_LISTEN", value_name = "ADDR")]
    pub health_listen: Option<String>,
    /// Where the embedded store keeps objects [default: /var/lib/rigger-controller].
    #[arg(long, env = "RIGGER_CONTROLLER_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Log format: text or json [default: text].
    #[arg(long, env = "RIGGER_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Log filter, e.g. `info,rigger_controller=debug` [default: info].
    #[arg(long, env = "RIGGER_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,
    /// How long to wait for work in flight on shutdown [default: 10s].
    #[arg(long, env = "RIGGER_CONTROLLER_DRAIN_TIMEOUT", value_name = "DURATION")]
    pub drain_timeout: Option<String>,
    /// How often agents send heartbeats [default: 10s].
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_HEARTBEAT_INTERVAL",
        value_name = "DURATION"
    )]
    pub heartbeat_interval: Option<String>,
    /// A node silent this long is not ready [default: 30s].
    #[arg(long, env = "RIGGER_CONTROLLER_NODE_TIMEOUT", value_name = "DURATION")]
    pub node_timeout: Option<String>,
    /// The controller's TLS certificate (PEM), for agents and riggerctl.
    #[arg(long, env = "RIGGER_CONTROLLER_TLS_CERT_FILE", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "RIGGER_CONTROLLER_TLS_KEY_FILE", value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// CA (PEM) that signs agents' client certificates.
    #[arg(long, env = "RIGGER_CONTROLLER_CLIENT_CA_FILE", value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Users: lines of `token,user,role` (role admin or viewer).
    #[arg(long, env = "RIGGER_CONTROLLER_TOKENS_FILE", value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Ed25519 private key (PKCS#8 PEM) the controller signs peer grants with; agents
    /// serve blobs to other nodes only with such a grant (`rigger-controller certs`
    /// writes one) [default: none: no node serves peers].
    #[arg(long, env = "RIGGER_CONTROLLER_PEER_GRANT_KEY", value_name = "FILE")]
    pub peer_grant_key: Option<PathBuf>,
    /// More Ed25519 keys (public or private PEM, comma-separated) agents accept grants
    /// of, besides peer_grant_key's: to rotate it, list the next key here on every
    /// replica first, then make it peer_grant_key and list the old one here, and drop
    /// that one two hours later (no grant lasts longer) [default: none].
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_PEER_GRANT_VERIFY_KEYS",
        value_name = "FILE,...",
        value_delimiter = ','
    )]
    pub peer_grant_verify_keys: Option<Vec<PathBuf>>,
    /// Serve without TLS: agents are not authenticated (trusted networks only; logged).
    #[arg(long, env = "RIGGER_CONTROLLER_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// `embedded` (a redb file in data_dir), `etcd://h1:2379,h2:2379` for several
    /// replicas with leader election, or `kubernetes`: the cluster's API server, where
    /// Kruise's kinds are CRDs users drive with kubectl (replicas elect a leader on a
    /// Lease) [default: embedded].
    #[arg(long, env = "RIGGER_CONTROLLER_STORE", value_name = "STORE")]
    pub store: Option<String>,
    /// With etcd: the CA (PEM) that signed etcd's server certificate; etcd is then
    /// reached over TLS.
    #[arg(long, env = "RIGGER_CONTROLLER_ETCD_CA_FILE", value_name = "FILE")]
    pub etcd_ca_file: Option<PathBuf>,
    /// With etcd over TLS: the controller's client certificate (PEM), for an etcd that
    /// requires client certificates.
    #[arg(long, env = "RIGGER_CONTROLLER_ETCD_CERT_FILE", value_name = "FILE")]
    pub etcd_cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "RIGGER_CONTROLLER_ETCD_KEY_FILE", value_name = "FILE")]
    pub etcd_key_file: Option<PathBuf>,
    /// With etcd or the kubernetes store: how long a leader that stopped renewing stays
    /// leader [default: 15s].
    #[arg(long, env = "RIGGER_CONTROLLER_LEADER_LEASE", value_name = "DURATION")]
    pub leader_lease: Option<String>,
    /// With the kubernetes store: the kubeconfig to reach the API server with [default:
    /// in-cluster (the pod's ServiceAccount), else $KUBECONFIG or ~/.kube/config].
    #[arg(long, env = "RIGGER_CONTROLLER_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With the kubernetes store: the namespace of the controller's own records and its
    /// leader Lease [default: $POD_NAMESPACE, else rigger-system].
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_KUBERNETES_NAMESPACE",
        value_name = "NAME"
    )]
    pub kubernetes_namespace: Option<String>,
    /// With the kubernetes store: Kruise's manager runs in this cluster, with its daemon
    /// switched off. Rigger does the daemon's part only (NodeImages, and the
    /// ContainerRecreateRequests Kruise's webhook labelled) and leaves ImagePullJobs,
    /// ImageListPullJobs and SidecarSets to Kruise's manager.
    #[arg(long, env = "RIGGER_CONTROLLER_KRUISE_MANAGER")]
    pub kruise_manager: bool,
    /// With the kubernetes store, Rigger alone: write each node's NodeImage in Kruise's
    /// shape (spec from the jobs, status from the pulls). Each costs the API server about
    /// two writes per node per job: turn it off for the least load [default: true].
    #[arg(long, env = "RIGGER_CONTROLLER_WRITE_NODE_IMAGES", value_name = "BOOL")]
    pub write_node_images: Option<bool>,
    /// Requests per second each API client (user, or address without tokens) may send;
    /// more are refused with RESOURCE_EXHAUSTED and riggerctl waits and retries [default: 50].
    #[arg(
        long,
        env = "RIGGER_CONTROLLER_API_REQUESTS_PER_SECOND",
        value_name = "N"
    )]
    pub api_requests_per_second: Option<u32>,
    /// Requests an API client may send at once before api_requests_per_second applies
    /// [default: 200].
    #[arg(long, env = "RIGGER_CONTROLLER_API_BURST", value_name = "N")]
    pub api_burst: Option<u32>,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    /// Check the configuration and exit: 0 if it is usable, 64 naming the bad key.
    #[arg(long)]
    pub check_config: bool,
}

/// Flags that are not configuration keys (the config reference skips them).
pub const NOT_CONFIG_KEYS: &[&str] = &["config", "check_config"];

/// The controller's TLS material (paths; read and checked when the config is resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    pub listen: SocketAddr,
    pub health_listen: SocketAddr,
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub log_level: String,
    pub drain_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub node_timeout: Duration,
    /// `None`: plain text (explicitly asked for with `insecure_plaintext`).
    pub tls: Option<TlsFiles>,
    /// `None`: no user authentication (plain-text mode only).
    pub tokens_file: Option<PathBuf>,
    pub store: StoreConfig,
    pub leader_lease: Duration,
    pub api_rate: ApiRate,
    /// What peer grants are signed with; `None`: no grants, so no node serves peers.
    pub peer_grant_key: Option<PeerGrantKey>,
    /// The SidecarSet injection webhook (Kubernetes mode, Rigger alone).
    pub sidecar_webhook: Option<SidecarWebhookSettings>,
}

const LISTEN: Setting = Setting {
    key: "listen",
    flag: "--listen",
    env: "RIGGER_CONTROLLER_LISTEN",
};
const DATA_DIR: Setting = Setting {
    key: "data_dir",
    flag: "--data-dir",
    env: "RIGGER_CONTROLLER_DATA_DIR",
};
const HEALTH_LISTEN: Setting = Setting {
    key: "health_listen",
    flag: "--health-listen",
    env: "RIGGER_CONTROLLER_HEALTH_LISTEN",
};
const DRAIN_TIMEOUT: Setting = Setting {
    key: "drain_timeout",
    flag: "--drain-timeout",
    env: "RIGGER_CONTROLLER_DRAIN_TIMEOUT",
};
const HEARTBEAT_INTERVAL: Setting = Setting {
    key: "heartbeat_interval",
    flag: "--heartbeat-interval",
    env: "RIGGER_CONTROLLER_HEARTBEAT_INTERVAL",
};
const NODE_TIMEOUT: Setting = Setting {
    key: "node_timeout",
    flag: "--node-timeout",
    env: "RIGGER_CONTROLLER_NODE_TIMEOUT",
};

const TLS_CERT_FILE: Setting = Setting {
    key: "tls_cert_file",
    flag: "--tls-cert-file",
    env: "RIGGER_CONTROLLER_TLS_CERT_FILE",
};
const TLS_KEY_FILE: Setting = Setting {
    key: "tls_key_file",
    flag: "--tls-key-file",
    env: "RIGGER_CONTROLLER_TLS_KEY_FILE",
};
const CLIENT_CA_FILE: Setting = Setting {
    key: "client_ca_file",
    flag: "--client-ca-file",
    env: "RIGGER_CONTROLLER_CLIENT_CA_FILE",
};
const TOKENS_FILE: Setting = Setting {
    key: "tokens_file",
    flag: "--tokens-file",
    env: "RIGGER_CONTROLLER_TOKENS_FILE",
};
const LEADER_LEASE: Setting = Setting {
    key: "leader_lease",
    flag: "--leader-lease",
    env: "RIGGER_CONTROLLER_LEADER_LEASE",
};

const API_REQUESTS_PER_SECOND: Setting = Setting {
    key: "api_requests_per_second",
    flag: "--api-requests-per-second",
    env: "RIGGER_CONTROLLER_API_REQUESTS_PER_SECOND",
};
const API_BURST: Setting = Setting {
    key: "api_burst",
    flag: "--api-burst",
    env: "RIGGER_CONTROLLER_API_BURST",
};

/// A count that must be at least 1, or `default` when unset.
fn positive(
    setting: Setting,
    value: Option<u32>,
    default: NonZeroU32,
) -> Result<NonZeroU32, ConfigError> {
    match value {
        None => Ok(default),
        Some(n) => NonZeroU32::new(n).ok_or_else(|| setting.invalid("must be at least 1")),
    }
}

const INSECURE_PLAINTEXT: Setting = Setting {
    key: "insecure_plaintext",
    flag: "--insecure-plaintext",
    env: "RIGGER_CONTROLLER_INSECURE_PLAINTEXT",
};

/// A PEM file that must hold at least one `label` block (CERTIFICATE, PRIVATE KEY).
/// A DNS label, as Kubernetes names namespaces and Services: 1 to 63 of lowercase
/// letters, digits and '-', not at either end.
fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn check_pem(setting: Setting, path: &std::path::Path, label: &str) -> Result<(), ConfigError> {
    let bytes = rigger_daemon::config::read_small_file(path)
        .map_err(|e| setting.invalid(format!("{}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains(&format!("-----BEGIN {label}")) && !text.contains(&format!(" {label}-----")) {
        return Err(setting.invalid(format!("{}: no PEM {label} in it", path.display())));
    }
    Ok(())
}

impl ControllerConfig {
    pub fn resolve(args: &ControllerArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => load_toml::<ControllerConfigFile>(path)?,
            None => ControllerConfigFile::default(),
        };
        Self::from_layers(file, args.clone())
    }

    /// Merge a parsed file with flags and validate (what `resolve` does after reading).
    pub fn from_layers(
        file: ControllerConfigFile,
        args: ControllerArgs,
    ) -> Result<Self, ConfigError> {
        let listen = LISTEN.socket_addr(args.listen.or(file.listen), DEFAULT_LISTEN)?;
        let health_listen = HEALTH_LISTEN.socket_addr(
            args.health_listen.or(file.health_listen),
            DEFAULT_HEALTH_LISTEN,
        )?;
        if health_listen == listen && listen.port() != 0 {
            return Err(HEALTH_LISTEN.invalid(format!("{health_listen} is already `listen`")));
        }
        let data_dir = args
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        if !data_dir.is_absolute() {
            return Err(DATA_DIR.invalid(format!("{} is not an absolute path", data_dir.display())));
        }
        let log_format = LOG_FORMAT.log_format(args.log_format.or(file.log_format).as_deref())?;
        let log_level = LOG_LEVEL.log_filter(args.log_level.or(file.log_level))?;
        let drain_timeout = DRAIN_TIMEOUT.duration(
            args.drain_timeout.or(file.drain_timeout),
            Duration::from_secs(10),
        )?;
        let heartbeat_interval = HEARTBEAT_INTERVAL.duration(
            args.heartbeat_interval.or(file.heartbeat_interval),
            Duration::from_secs(10),
        )?;
        if heartbeat_interval < Duration::from_secs(1) {
            return Err(HEARTBEAT_INTERVAL.invalid("must be at least 1s"));
        }
        let node_timeout = NODE_TIMEOUT.duration(
            args.node_timeout.or(file.node_timeout),
            Duration::from_secs(30),
        )?;
        if node_timeout < heartbeat_interval.saturating_mul(2) {
            return Err(NODE_TIMEOUT.invalid(format!(
                "must be at least twice heartbeat_interval ({})",
                humantime::format_duration(heartbeat_interval)
            )));
        }
        let insecure_plaintext = args.insecure_plaintext || file.insecure_plaintext == Some(true);
        let cert = args.tls_cert_file.or(file.tls_cert_file);
        let key = args.tls_key_file.or(file.tls_key_file);
        let client_ca = args.client_ca_file.or(file.client_ca_file);
        let tls = match (cert, key, client_ca) {
            (None, None, None) if insecure_plaintext => None,
            (None, None, None) => {
                return Err(TLS_CERT_FILE.invalid(
                    "no TLS configured: set tls_cert_file, tls_key_file and client_ca_file (`rigger-controller certs` makes a lab set), or insecure_plaintext for trusted networks",
                ));
            }
            (Some(cert), Some(key), Some(client_ca)) => {
                if insecure_plaintext {
                    return Err(INSECURE_PLAINTEXT.invalid("contradicts the TLS files given"));
                }
                check_pem(TLS_CERT_FILE, &cert, "CERTIFICATE")?;
                check_pem(TLS_KEY_FILE, &key, "PRIVATE KEY")?;
                check_pem(CLIENT_CA_FILE, &client_ca, "CERTIFICATE")?;
                Some(TlsFiles {
                    cert,
                    key,
                    client_ca,
                })
            }
            (None, _, _) => return Err(TLS_CERT_FILE.invalid("is needed with the other TLS files")),
            (_, None, _) => return Err(TLS_KEY_FILE.invalid("is needed with tls_cert_file")),
            (_, _, None) => {
                return Err(CLIENT_CA_FILE.invalid(
                    "is needed with tls_cert_file: agents authenticate with client certificates",
                ));
            }
        };
        let tokens_file = args.tokens_file.or(file.tokens_file);
        match &tokens_file {
            Some(path) => {
                crate::serve::auth::Users::load(path)
                    .map_err(|e| TOKENS_FILE.invalid(format!("{}: {e}", path.display())))?;
            }
            None if tls.is_some() => {
                return Err(TOKENS_FILE
                    .invalid("is needed with TLS: users authenticate with bearer tokens"));
            }
            None => {}
        }
        let mut store = parse_store(args.store.or(file.store))?;
        let tls_for_etcd = etcd_tls(
            &store,
            args.etcd_ca_file.clone().or(file.etcd_ca_file),
            args.etcd_cert_file.clone().or(file.etcd_cert_file),
            args.etcd_key_file.clone().or(file.etcd_key_file),
        )?;
        if let StoreConfig::Etcd { tls, .. } = &mut store {
            *tls = tls_for_etcd;
        }
        kubernetes_settings(
            &mut store,
            args.kubeconfig.clone().or(file.kubeconfig),
            args.kubernetes_namespace
                .clone()
                .or(file.kubernetes_namespace),
            args.kruise_manager || file.kruise_manager == Some(true),
            args.write_node_images.or(file.write_node_images),
        )?;
        let sidecar_webhook = webhook::sidecar_webhook(
            &store,
            WebhookArgs {
                sidecar_webhook_listen: args
                    .webhook
                    .sidecar_webhook_listen
                    .or(file.sidecar_webhook_listen),
                sidecar_webhook_service: args
                    .webhook
                    .sidecar_webhook_service
                    .or(file.sidecar_webhook_service),
                sidecar_webhook_url: args
                    .webhook
                    .sidecar_webhook_url
                    .or(file.sidecar_webhook_url),
            },
        )?;
        let leader_lease = LEADER_LEASE.duration(
            args.leader_lease.or(file.leader_lease),
            Duration::from_secs(15),
        )?;
        if leader_lease < Duration::from_secs(2) {
            return Err(LEADER_LEASE.invalid("must be at least 2s"));
        }
        let defaults = ApiRate::default();
        let api_rate = ApiRate {
            per_second: positive(
                API_REQUESTS_PER_SECOND,
                args.api_requests_per_second
                    .or(file.api_requests_per_second),
                defaults.per_second,
            )?,
            burst: positive(API_BURST, args.api_burst.or(file.api_burst), defaults.burst)?,
        };
        let mut peer_grant_key = args
            .peer_grant_key
            .or(file.peer_grant_key)
            .map(|path| peer_grant_key(&path))
            .transpose()?;
        let verify_keys = args
            .peer_grant_verify_keys
            .or(file.peer_grant_verify_keys)
            .unwrap_or_default();
        match &mut peer_grant_key {
            Some(key) => {
                for path in &verify_keys {
                    let pem = peer_grant_verify_key(path)?;
                    if pem != key.public_pem && !key.verify_pems.contains(&pem) {
                        key.verify_pems.push(pem);
                    }
                }
            }
            None if !verify_keys.is_empty() => {
                return Err(PEER_GRANT_VERIFY_KEYS.invalid("needs peer_grant_key"));
            }
            None => {}
        }
        Ok(Self {
            listen,
            health_listen,
            data_dir,
            log_format,
            log_level,
            drain_timeout,
            heartbeat_interval,
            node_timeout,
            tls,
            tokens_file,
            store,
            leader_lease,
            api_rate,
            peer_grant_key,
            sidecar_webhook,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_is_a_file_key() {
        let args = <ControllerArgs as clap::Args>::augment_args(clap::Command::new("c"));
        let missing = rigger_daemon::config::keys_missing_from_file::<ControllerConfigFile>(
            &args,
            NOT_CONFIG_KEYS,
        );
        assert!(missing.is_empty(), "flags without a file key: {missing:?}");
    }

    #[test]
    fn documented_example_is_valid_and_matches_the_defaults() {
        let example: ControllerConfigFile = rigger_daemon::config::parse_toml(
            std::path::Path::new("controller.toml"),
            include_str!("../../../docs/config/controller.toml"),
        )
        .unwrap();
        let config = ControllerConfig::from_layers(example, plaintext()).unwrap();
        let defaults =
            ControllerConfig::from_layers(ControllerConfigFile::default(), plaintext()).unwrap();
        assert_eq!(config, defaults);
    }

    fn plaintext() -> ControllerArgs {
        ControllerArgs {
            insecure_plaintext: true,
            ..ControllerArgs::default()
        }
    }

    /// A lab certificate set (`rigger-controller certs`) in a temporary directory.
    fn lab_certs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        crate::certs::create(&crate::certs::CertsRequest {
            out: dir.path().to_owned(),
            hosts: Vec::new(),
            nodes: vec!["n1".into()],
        })
        .unwrap();
        dir
    }

    #[test]
    fn tls_or_an_explicit_plaintext_flag() {
        let err = ControllerConfig::from_layers(
            ControllerConfigFile::default(),
            ControllerArgs::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no TLS configured"), "{err}");

        let dir = lab_certs();
        let tls = |tokens: bool| ControllerArgs {
            tls_cert_file: Some(dir.path().join("controller.pem")),
            tls_key_file: Some(dir.path().join("controller-key.pem")),
            client_ca_file: Some(dir.path().join("ca.pem")),
            tokens_file: tokens.then(|| dir.path().join("tokens.csv")),
            ..ControllerArgs::default()
        };
        let config =
            ControllerConfig::from_layers(ControllerConfigFile::default(), tls(true)).unwrap();
        assert!(config.tls.is_some());
        let err =
            ControllerConfig::from_layers(ControllerConfigFile::default(), tls(false)).unwrap_err();
        assert!(err.to_string().contains("`tokens_file`"), "{err}");
        let mut swapped = tls(true);
        swapped.tls_cert_file = Some(dir.path().join("controller-key.pem"));
        let err =
            ControllerConfig::from_layers(ControllerConfigFile::default(), swapped).unwrap_err();
        assert!(err.to_string().contains("no PEM CERTIFICATE"), "{err}");
    }

    #[test]
    fn defaults_and_checks() {
        let c =
            ControllerConfig::from_layers(ControllerConfigFile::default(), plaintext()).unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        let args = ControllerArgs {
            heartbeat_interval: Some("20s".into()),
            ..plaintext()
        };
        let err = ControllerConfig::from_layers(ControllerConfigFile::default(), args).unwrap_err();
        assert!(err.to_string().contains("`node_timeout`"), "{err}");
        let args = ControllerArgs {
            data_dir: Some("state".into()),
            ..plaintext()
        };
        let err = ControllerConfig::from_layers(ControllerConfigFile::default(), args).unwrap_err();
        assert!(err.to_string().contains("`data_dir`"), "{err}");
        for (store, expected) in [
            ("etcd://a:2379,b:2379", Ok(2)),
            ("etcd://", Err("names no etcd endpoint")),
            ("etcd://a", Err("not host:port")),
            ("redis://a:1", Err("expected embedded")),
        ] {
            let args = ControllerArgs {
                store: Some(store.into()),
                ..plaintext()
            };
            match (
                ControllerConfig::from_layers(ControllerConfigFile::default(), args),
                expected,
            ) {
                (Ok(c), Ok(n)) => {
                    assert!(
                        matches!(c.store, StoreConfig::Etcd { ref endpoints, .. } if endpoints.len() == n)
                    );
                }
                (Err(e), Err(text)) => assert!(e.to_string().contains(text), "{e}"),
                (other, _) => panic!("{store}: {other:?}"),
            }
        }
    }

    #[test]
    fn etcd_tls_settings_go_together_and_with_an_etcd_store() {
        let dir = lab_certs();
        let pem = |name: &str| Some(dir.path().join(name));
        let args = |store: &str, ca: bool, cert: bool, key: bool| ControllerArgs {
            store: Some(store.into()),
            etcd_ca_file: if ca { pem("ca.pem") } else { None },
            etcd_cert_file: if cert { pem("controller.pem") } else { None },
            etcd_key_file: if key { pem("controller-key.pem") } else { None },
            ..plaintext()
        };
        let resolve = |a| ControllerConfig::from_layers(ControllerConfigFile::default(), a);
        let c = resolve(args("etcd://a:2379", true, true, true)).unwrap();
        assert!(matches!(
            c.store,
            StoreConfig::Etcd {
                tls: Some(EtcdTls {
                    identity: Some(_),
                    ..
                }),
                ..
            }
        ));
        let c = resolve(args("etcd://a:2379", true, false, false)).unwrap();
        assert!(matches!(
            c.store,
            StoreConfig::Etcd {
                tls: Some(EtcdTls { identity: None, .. }),
                ..
            }
        ));
        for (a, expected) in [
            (args("embedded", true, false, false), "`etcd_ca_file`"),
            (args("etcd://a:2379", false, true, true), "`etcd_ca_file`"),
            (args("etcd://a:2379", true, true, false), "`etcd_key_file`"),
            (args("etcd://a:2379", true, false, true), "`etcd_cert_file`"),
        ] {
            let err = resolve(a).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
        let mut swapped = args("etcd://a:2379", true, true, true);
        swapped.etcd_ca_file = pem("controller-key.pem");
        let err = resolve(swapped).unwrap_err().to_string();
        assert!(err.contains("no PEM CERTIFICATE"), "{err}");
    }

    #[test]
    fn the_peer_grant_key_is_an_ed25519_key_that_signs() {
        let dir = lab_certs();
        let with_key = |path: PathBuf| ControllerArgs {
            peer_grant_key: Some(path),
            ..plaintext()
        };
        let config = ControllerConfig::from_layers(
            ControllerConfigFile::default(),
            with_key(dir.path().join(crate::certs::PEER_GRANT_KEY_FILE)),
        )
        .unwrap();
        let key = config.peer_grant_key.unwrap();
        assert!(key.public_pem.contains("BEGIN PUBLIC KEY"), "{key:?}");
        assert!(
            !format!("{key:?}").contains("PRIVATE"),
            "the private key leaks in Debug"
        );
        rigger_proto::peer_grant::GrantVerifier::from_pems([key.public_pem.as_bytes()]).unwrap();
        assert_eq!(key.public_pems(), std::slice::from_ref(&key.public_pem));
        // Not a key; a key of another kind (the CA's ECDSA key); a missing file.
        for wrong in ["ca.pem", "ca-key.pem", "missing.pem"] {
            let error = ControllerConfig::from_layers(
                ControllerConfigFile::default(),
                with_key(dir.path().join(wrong)),
            )
            .unwrap_err()
            .to_string();
            assert!(error.contains("`peer_grant_key`"), "{wrong}: {error}");
        }
        let unset = ControllerConfig::from_layers(ControllerConfigFile::default(), plaintext());
        assert!(unset.unwrap().peer_grant_key.is_none());
    }

    #[test]
    fn keys_agents_also_accept_are_public_or_private_ed25519_keys() {
        let dir = lab_certs();
        let next = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let (private, public) = (dir.path().join("next.pem"), dir.path().join("next.pub"));
        std::fs::write(&private, next.serialize_pem()).unwrap();
        std::fs::write(&public, next.public_key_pem()).unwrap();
        let signing = dir.path().join(crate::certs::PEER_GRANT_KEY_FILE);
        let with = |verify: Vec<PathBuf>, key: Option<PathBuf>| {
            ControllerConfig::from_layers(
                ControllerConfigFile::default(),
                ControllerArgs {
                    peer_grant_key: key,
                    peer_grant_verify_keys: Some(verify),
                    ..plaintext()
                },
            )
        };
        for given in [private, public] {
            let key = with(vec![given, signing.clone()], Some(signing.clone()))
                .unwrap()
                .peer_grant_key
                .unwrap();
            // The signing key first, the other once; the signing key not twice.
            assert_eq!(
                key.public_pems(),
                [key.public_pem.clone(), next.public_key_pem()]
            );
        }
        for (verify, key) in [
            (vec![dir.path().join("ca-key.pem")], Some(signing.clone())),
            (vec![dir.path().join("missing.pem")], Some(signing.clone())),
            (vec![signing], None),
        ] {
            let error = with(verify, key).unwrap_err().to_string();
            assert!(error.contains("`peer_grant_verify_keys`"), "{error}");
        }
    }
}
