//! Configuration of `rigger-controller`: defaults < TOML file < environment < flags,
//! validated as a whole before anything binds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rigger_daemon::config::{ConfigError, LOG_FORMAT, LOG_LEVEL, Setting, load_toml};
use rigger_daemon::logging::LogFormat;

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

impl ControllerConfig {
    pub fn resolve(args: &ControllerArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => load_toml::<ControllerConfigFile>(path)?,
            None => ControllerConfigFile::default(),
        };
        Self::from_layers(file, args.clone())
    }

    fn from_layers(file: ControllerConfigFile, args: ControllerArgs) -> Result<Self, ConfigError> {
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
        Ok(Self {
            listen,
            health_listen,
            data_dir,
            log_format,
            log_level,
            drain_timeout,
            heartbeat_interval,
            node_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_example_is_valid_and_matches_the_defaults() {
        let example: ControllerConfigFile = rigger_daemon::config::parse_toml(
            std::path::Path::new("controller.toml"),
            include_str!("../../docs/config/controller.toml"),
        )
        .unwrap();
        let config = ControllerConfig::from_layers(example, ControllerArgs::default()).unwrap();
        let defaults = ControllerConfig::from_layers(
            ControllerConfigFile::default(),
            ControllerArgs::default(),
        )
        .unwrap();
        assert_eq!(config, defaults);
    }

    #[test]
    fn defaults_and_checks() {
        let c = ControllerConfig::from_layers(
            ControllerConfigFile::default(),
            ControllerArgs::default(),
        )
        .unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        let args = ControllerArgs {
            heartbeat_interval: Some("20s".into()),
            ..ControllerArgs::default()
        };
        let err = ControllerConfig::from_layers(ControllerConfigFile::default(), args).unwrap_err();
        assert!(err.to_string().contains("`node_timeout`"), "{err}");
        let args = ControllerArgs {
            data_dir: Some("state".into()),
            ..ControllerArgs::default()
        };
        let err = ControllerConfig::from_layers(ControllerConfigFile::default(), args).unwrap_err();
        assert!(err.to_string().contains("`data_dir`"), "{err}");
    }
}
