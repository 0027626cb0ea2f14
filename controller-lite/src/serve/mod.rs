//! What the controller serves: the agents' link ([`link`]), the user API riggerctl
//! speaks ([`control`]) with who may call it ([`auth`], [`rate_limit`]), the registry
//! mirrors' questions ([`peer_queries`]), its Prometheus series ([`metrics`]) and, in a
//! cluster, the SidecarSet injection webhook ([`webhook`]). The server binds them
//! and serves health beside them.

pub mod auth;
pub mod control;
pub mod link;
pub mod metrics;
pub mod peer_queries;
pub mod rate_limit;
pub mod webhook;
