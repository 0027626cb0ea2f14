//! Structured logging through `tracing`, as human text or JSON lines.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for journald/Loki/Elasticsearch pipelines.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        filter: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Check a filter directive such as `info,rigger_agent=debug` without installing it.
pub fn parse_filter(filter: &str) -> Result<EnvFilter, LoggingError> {
    EnvFilter::try_new(filter).map_err(|source| LoggingError::Filter {
        filter: filter.to_owned(),
        source,
    })
}

/// Install the global subscriber. Call once, after the configuration has been validated.
pub fn init(format: LogFormat, filter: &str) -> Result<(), LoggingError> {
    let filter = parse_filter(filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for people at a terminal, never into journald or files.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    result.map_err(|_| LoggingError::AlreadyInstalled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_checked() {
        assert!(parse_filter("info,rigger_agent=debug").is_ok());
        assert!(parse_filter("info,rigger_agent=loud").is_err());
    }
}
