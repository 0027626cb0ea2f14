//! Structured logging through `tracing`, as human text or JSON lines.
//!
//! Under systemd, stderr goes to journald, which reads a `<N>` syslog priority at the
//! start of each line (`SyslogLevelPrefix=`, on by default): each line carries its
//! level's, so `journalctl -p err` finds the errors (without it every line is info).

use std::io::IsTerminal as _;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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
    let journal = stderr_is_journal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for people at a terminal, never into journald or files.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder
            .map_event_format(|f| SyslogPriority { inner: f, journal })
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .map_event_format(|f| SyslogPriority { inner: f, journal })
            .try_init(),
    };
    result.map_err(|_| LoggingError::AlreadyInstalled)
}

/// Whether stderr is the journald stream systemd gave this process (`JOURNAL_STREAM`
/// names its device and inode, as sd_journal_stream_fd(3) says to check).
pub(crate) fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stderr) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    stream
        .to_str()
        .and_then(|s| s.split_once(':'))
        .is_some_and(|(dev, ino)| {
            dev.parse() == Ok(stderr.dev()) && ino.parse() == Ok(stderr.ino())
        })
}

/// The syslog priority journald files a line of `level` under.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// A line format, with the line's syslog priority in front when it goes to journald.
struct SyslogPriority<F> {
    inner: F,
    journal: bool,
}

impl<S, N, F> FormatEvent<S, N> for SyslogPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if self.journal {
            write!(writer, "<{}>", priority(*event.metadata().level()))?;
        }
        self.inner.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_reaches_journald_under_its_syslog_priority() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(Level::DEBUG)
            .with_writer(move || writer.clone())
            .map_event_format(|f| SyslogPriority {
                inner: f,
                journal: true,
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!("e");
            tracing::warn!("w");
            tracing::info!("i");
            tracing::debug!("d");
        });
        let text = String::from_utf8(
            lines
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
        .unwrap_or_default();
        let starts: Vec<&str> = text.lines().map(|l| &l[..3]).collect();
        assert_eq!(starts, ["<3>", "<4>", "<6>", "<7>"], "{text}");
    }

    #[test]
    fn filters_are_checked() {
        assert!(parse_filter("info,rigger_agent=debug").is_ok());
        assert!(parse_filter("info,rigger_agent=loud").is_err());
    }
}
