//! Fleet sharing: a job's image fetched once from the registry and passed between its
//! nodes. Everything here faces other nodes, so everything here treats them as hostile
//! (RELIABILITY.md's trust model):
//! - [`peers`]: this node's endpoint serving the blobs it holds or is receiving to the
//!   other nodes of a job, under the controller's grants;
//! - [`mirror`]: the loopback registry mirror that lets containerd's own pulls (`ctr`,
//!   CRI) use the fleet's copies, for a job's repository only.

pub mod mirror;
pub mod peers;
