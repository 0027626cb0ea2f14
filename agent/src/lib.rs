//! `rigger-agent`: Rigger's node agent.
//!
//! It talks to containerd's gRPC API and the CRI socket directly, through
//! `rigger_runtime`, and pulls images with `rigger_pull`. Modules:
//! - [`inventory`]: what the node has (images, pods with their owner, containers, host resources);
//! - [`labels`]: kubelet's and Rigger's label keys on CRI objects;
//! - [`render`]: the inventory as tables or JSON;
//! - [`config`]: the `rigger-agent run` configuration (file, env, flags);
//! - [`service`]: `rigger-agent run`, the long-running agent (health endpoints, readiness, shutdown);
//! - [`link`]: the agent's stream to the controller (register, heartbeats, tasks);
//! - [`tasks`]: the controller's work on this node, persisted, run once, reported;
//! - [`pods`]: agent-managed pods, run through CRI, adopted after a restart;
//! - [`recreate`]: restarting containers of a pod in place (ContainerRecreateRequest);
//! - [`handlers`]: probes and lifecycle hooks (exec, httpGet, tcpSocket), as kubelet runs them;
//! - [`lifecycle`]: a pod's lifecycle state and the cooperators asked around operations;
//! - [`sharing`]: fleet sharing — [`sharing::peers`] serves blobs to the other nodes of a job,
//!   [`sharing::mirror`] gives containerd's own pulls the fleet's copies.

pub mod config;
pub mod cri;
pub mod handlers;
pub mod inventory;
pub mod labels;
pub mod lifecycle;
pub mod link;
pub mod metrics;
pub mod pods;
pub mod progress;
pub mod recreate;
pub mod render;
pub mod service;
pub mod sharing;
pub mod tasks;

/// The agent's version, as reported to users and to the controller.
pub use rigger_version::VERSION;

/// Where the agent keeps what must outlive it (spooled downloads, accepted tasks).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/rigger";
