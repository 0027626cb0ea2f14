//! Process plumbing shared by `rigger-agent` and `rigger-controller`.
//!
//! Each daemon parses and validates its whole configuration first ([`config`]), then sets
//! up logging ([`logging`]), binds, tells systemd it is ready ([`systemd`]), serves its
//! health endpoints ([`health`]) and stops gracefully on SIGTERM/SIGINT ([`shutdown`]).
//! Both raise their open-files limit at start ([`limits`]) and write state files only
//! durably ([`durable`]). HTTPS clients and servers share one crypto provider ([`tls`]).

pub mod backoff;
pub mod cli;
pub mod config;
pub mod durable;
pub mod health;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod shutdown;
pub mod systemd;
pub mod tls;

/// An error and its sources on one line: `outer: cause: root cause`.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
