//! `rigger-controller`: the slim controller. It never touches containers itself; it holds
//! what the fleet should do, hands each node's share to that node's agent over the agent
//! link, and folds the agents' reports into status. The kinds it serves are
//! `rigger_api`'s.
//!
//! - [`config`]: configuration (file, env, flags), validated before binding;
//! - [`auth`]: agents by client certificate (mTLS), users by bearer token and role;
//! - [`certs`]: `rigger-controller certs`, a CA and certificates for labs;
//! - [`nodes`]: the registry of nodes, fed by agents' registrations and heartbeats;
//! - [`node_labels`]: admin-set and agent-reported node labels, and whom selectors trust;
//! - [`cluster`]: in a cluster, its Nodes' labels and Pods are the truth;
//! - [`link`]: the agent link (`rigger.v1.AgentLink`), one stream per agent;
//! - [`events`]: what happened to an object, as Kubernetes Events where there are any;
//! - [`engine`]: the loop every engine runs (pass, wake or tick, cancel, flush);
//! - [`jobs`]: the ImagePullJob engine (who pulls when, status from reports);
//! - [`job_status`]: a job's status in the store, its nodes in shards;
//! - [`node_images`]: in a cluster, NodeImages' tags pulled (Kruise's daemon's part);
//! - [`pods`]: agent-managed pods: each node's set to its agent, statuses back;
//! - [`relay`]: users' questions to agents (logs, exec) and their answers;
//! - [`control`]: the user API (`rigger.v1.Control`) that riggerctl speaks;
//! - [`store`]: the object store (embedded redb, etcd, or a Kubernetes API server),
//!   conditional writes by revision;
//! - [`leader`]: leader election among replicas (an etcd election, or a Lease);
//! - [`server`]: wiring, health endpoints, graceful shutdown.

pub mod auth;
pub mod certs;
pub mod cluster;
pub mod cluster_sidecars;
pub mod config;
pub mod control;
pub mod engine;
pub mod events;
pub mod job_status;
pub mod jobs;
pub mod leader;
pub mod link;
pub mod metrics;
pub mod node_events;
pub mod node_images;
pub mod node_labels;
pub mod nodes;
pub mod peer_queries;
pub mod pods;
pub mod predownload;
pub mod rate_limit;
pub mod recreate_requests;
pub mod relay;
pub mod report_limits;
pub mod server;
pub mod sidecars;
pub mod stall;
pub mod store;
pub mod undecodable;

/// The controller's version (its release; `rigger_version` has its commit too).
pub use rigger_version::VERSION;
