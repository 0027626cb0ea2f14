//! Reading a daemon's TOML config file.
//!
//! Daemons layer their settings as: built-in default < config file < environment variable
//! < command-line flag. The file is parsed into a struct of `Option`s with
//! `deny_unknown_fields`, so a misspelt key is an error naming the key, not a silent default.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

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
    #[error("config field `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

impl ConfigError {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// Parse the TOML file at `path` into `T`.
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_toml(path, &text)
}

/// Parse TOML `text` (read from `path`, used in messages) into `T`.
pub fn parse_toml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: one_line_toml_error(text, &e),
    })
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
        let err = parse_toml::<Sample>(Path::new("a.toml"), "name = \"x\"\ncuont = 3\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("config file a.toml: line 2, column 1:"), "{msg}");
        assert!(msg.contains("cuont"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }

    #[test]
    fn wrong_type_is_reported() {
        let err = parse_toml::<Sample>(Path::new("a.toml"), "count = \"many\"").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = load_toml::<Sample>(Path::new("/nonexistent/rigger.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/rigger.toml"), "{err}");
    }
}
