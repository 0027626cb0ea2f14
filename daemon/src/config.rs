//! Reading a daemon's TOML config file.
//!
//! Daemons layer their settings as: built-in default < config file < environment variable
//! < command-line flag. The file is parsed into a struct of `Option`s with
//! `deny_unknown_fields`, so a misspelt key is an error naming the key, not a silent default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::logging::{LogFormat, parse_filter};

/// Exit status for a configuration the daemon refuses (`EX_USAGE` from sysexits.h).
pub const EXIT_BAD_CONFIG: i32 = 64;

/// A configuration that cannot be used. Its message names the file or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config field {setting}: {reason}")]
    Invalid { setting: Setting, reason: String },
}

/// One setting, with the three ways a user may have written it, so an error can name it
/// whichever way it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Key in the TOML file.
    pub key: &'static str,
    /// Command-line flag, with its dashes.
    pub flag: &'static str,
    /// Environment variable.
    pub env: &'static str,
}

/// The log format; every Rigger daemon spells it the same way.
pub const LOG_FORMAT: Setting = Setting {
    key: "log_format",
    flag: "--log-format",
    env: "RIGGER_LOG_FORMAT",
};

/// The log filter; every Rigger daemon spells it the same way.
pub const LOG_LEVEL: Setting = Setting {
    key: "log_level",
    flag: "--log-level",
    env: "RIGGER_LOG_LEVEL",
};

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` ({}, {})", self.key, self.flag, self.env)
    }
}

impl Setting {
    pub fn invalid(self, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            setting: self,
            reason: reason.into(),
        }
    }

    /// A duration like `10s` or `2m`, or `default` when unset.
    pub fn duration(
        self,
        value: Option<String>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            None => Ok(default),
            Some(text) => humantime::parse_duration(&text).map_err(|e| {
                self.invalid(format!("{text:?} is not a duration like 10s or 2m ({e})"))
            }),
        }
    }

    /// An `IP:port` socket address.
    pub fn socket_addr(
        self,
        value: Option<String>,
        default: &str,
    ) -> Result<SocketAddr, ConfigError> {
        let text = value.unwrap_or_else(|| default.to_owned());
        text.parse()
            .map_err(|_| self.invalid(format!("{text:?} is not an IP:port address")))
    }

    /// `text` (the default) or `json`.
    pub fn log_format(self, value: Option<&str>) -> Result<LogFormat, ConfigError> {
        match value {
            None | Some("text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(other) => Err(self.invalid(format!("{other:?} is not one of text, json"))),
        }
    }

    /// A tracing filter such as `info,rigger_agent=debug` (default `info`).
    pub fn log_filter(self, value: Option<String>) -> Result<String, ConfigError> {
        let filter = value.unwrap_or_else(|| "info".to_owned());
        parse_filter(&filter).map_err(|e| self.invalid(e.to_string()))?;
        Ok(filter)
    }
}

/// The largest configuration, certificate, key or token file a daemon reads: a path
/// that names a device or a huge file by mistake is refused instead of read forever.
pub const MAX_SMALL_FILE: u64 = 1 << 20;

/// Read a small file (configuration, PEM, tokens): at most [`MAX_SMALL_FILE`] bytes.
pub fn read_small_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_SMALL_FILE + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_SMALL_FILE {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_SMALL_FILE} bytes: not a configuration, certificate or key file"
        )));
    }
    Ok(bytes)
}

/// Parse the TOML file at `path` into `T`.
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let read = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let bytes = read_small_file(path).map_err(read)?;
    let text = String::from_utf8(bytes)
        .map_err(|e| read(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    parse_toml(path, &text)
}

/// Parse TOML `text` (read from `path`, used in messages) into `T`.
pub fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: one_line_toml_error(text, &e),
    })
}

/// The arguments of `command` that are configuration keys (the file key is the
/// argument's id): those with a long flag, but `not_keys` and clap's own help and version.
pub fn config_keys<'a>(
    command: &'a clap::Command,
    not_keys: &'a [&str],
) -> impl Iterator<Item = &'a clap::Arg> {
    command.get_arguments().filter(|arg| {
        let id = arg.get_id().as_str();
        arg.get_long().is_some() && !not_keys.contains(&id) && id != "help" && id != "version"
    })
}

/// The configuration keys of `args` ([`config_keys`]) that the file type `T` does not
/// accept: keeps flags, file keys and the generated reference in step (every daemon's
/// tests call it).
pub fn keys_missing_from_file<T: DeserializeOwned>(
    args: &clap::Command,
    not_keys: &[&str],
) -> Vec<String> {
    config_keys(args, not_keys)
        .map(|arg| arg.get_id().as_str())
        .filter(|id| {
            // Any value: a wrong type is a different error than an unknown key.
            toml::from_str::<T>(&format!("{id} = 0"))
                .is_err_and(|e| e.message().contains("unknown field"))
        })
        .map(ToOwned::to_owned)
        .collect()
}

/// toml's own message spans several lines with a source excerpt; daemons log one line.
fn one_line_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().to_owned();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_or_huge_file_is_refused_not_read_forever() {
        let error = read_small_file(Path::new("/dev/zero")).unwrap_err();
        assert!(error.to_string().contains("larger than"), "{error}");
        let dir = std::env::temp_dir().join(format!("rigger-small-{}", std::process::id()));
        std::fs::write(&dir, b"key = 1").unwrap();
        assert_eq!(read_small_file(&dir).unwrap(), b"key = 1");
        let _ = std::fs::remove_file(&dir);
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        #[allow(dead_code)]
        name: Option<String>,
        #[allow(dead_code)]
        count: Option<u32>,
    }

    #[test]
    fn unknown_key_is_named_with_its_position() {
        let err =
            parse_toml::<Sample>(Path::new("a.toml"), "name = \"x\"\ncuont = 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("config file a.toml: line 2, column 1:"),
            "{msg}"
        );
        assert!(msg.contains("cuont"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn wrong_type_is_reported() {
        let err = parse_toml::<Sample>(Path::new("a.toml"), "count = \"many\"").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    const SAMPLE: Setting = Setting {
        key: "drain_timeout",
        flag: "--drain-timeout",
        env: "RIGGER_DRAIN_TIMEOUT",
    };

    #[test]
    fn invalid_settings_name_all_spellings() {
        let err = SAMPLE
            .duration(Some("soon".into()), Duration::ZERO)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "config field `drain_timeout` (--drain-timeout, RIGGER_DRAIN_TIMEOUT):"
            ),
            "{msg}"
        );
        assert_eq!(
            SAMPLE.duration(None, Duration::from_secs(3)).unwrap(),
            Duration::from_secs(3)
        );
        assert!(SAMPLE.socket_addr(Some("localhost".into()), "").is_err());
        assert!(SAMPLE.log_format(Some("xml")).is_err());
        assert!(SAMPLE.log_filter(Some("info,x=loud".into())).is_err());
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = load_toml::<Sample>(Path::new("/nonexistent/rigger.toml")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/rigger.toml"),
            "{err}"
        );
    }
}
