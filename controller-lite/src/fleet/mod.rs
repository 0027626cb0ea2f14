//! What the controller knows of its nodes, as their agents tell it, and the way to reach
//! them: the registry of nodes ([`nodes`]) fed by the agents' registrations and
//! heartbeats, whose silence is counted net of this controller's own stalls ([`stall`]);
//! node labels and whom selectors trust ([`node_labels`]); what an agent may report
//! ([`report_limits`]); nodes' events ([`node_events`]); users' questions relayed to
//! agents and their answers ([`relay`]).

pub mod node_events;
pub mod node_labels;
pub mod nodes;
pub mod relay;
pub mod report_limits;
pub mod stall;
