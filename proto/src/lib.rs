//! Rigger's agent <-> controller protocol, generated from `proto/rigger/v1/*.proto`.
//!
//! The wire types are the contract between versions of the agent and the controller;
//! change them only in backward-compatible ways (new fields, new oneof cases).

#![allow(missing_debug_implementations)] // generated gRPC clients/servers
#![allow(clippy::derive_partial_eq_without_eq)]

/// `rigger.v1`: node inventory and the agent link.
pub mod v1 {
    tonic::include_proto!("rigger.v1");
}
