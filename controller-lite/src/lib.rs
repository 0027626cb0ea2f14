//! `rigger-controller`: the slim controller. It never touches containers itself; it holds
//! what the fleet should do, hands each node's share to that node's agent over the agent
//! link, and folds the agents' reports into status. The kinds it serves are
//! `rigger_api`'s.
//!
//! Its rooms, from the top down (each imports only from those below it):
//! - [`server`]: wiring, health endpoints, graceful shutdown;
//! - [`config`]: its settings (file, environment, flags), validated before binding;
//! - [`serve`]: what it serves — the agents' link, the user API riggerctl speaks, the
//!   registry mirrors' questions, metrics, the SidecarSet injection webhook;
//! - [`engines`]: what it does — ImagePullJobs, ContainerRecreateRequests, NodeImages,
//!   agent-managed pods, SidecarSets: tasks dispatched to agents, their reports folded
//!   into status;
//! - [`cluster`]: what it watches of a cluster (its Nodes, Pods, namespaces);
//! - [`fleet`]: what it knows of its nodes, as their agents report, and how to reach them;
//! - [`events`]: what happened to an object, as Kubernetes Events where there are any;
//! - [`certs`]: `rigger-controller certs`, a CA and certificates for labs.
//!
//! Where objects are kept, and which replica leads, is `rigger_store`'s.

pub mod certs;
pub mod cluster;
pub mod config;
pub mod engines;
pub mod events;
pub mod fleet;
pub mod serve;
pub mod server;

/// The controller's version (its release; `rigger_version` has its commit too).
pub use rigger_version::VERSION;
