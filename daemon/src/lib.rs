//! Process plumbing shared by `rigger-agent` and `rigger-controller`.
//!
//! Each daemon parses and validates its whole configuration first ([`config`]), then sets
//! up logging ([`logging`]), binds, tells systemd it is ready ([`systemd`]), serves its
//! health endpoints ([`health`]) and stops gracefully on SIGTERM/SIGINT ([`shutdown`]).

pub mod config;
pub mod health;
pub mod logging;
pub mod shutdown;
pub mod systemd;
