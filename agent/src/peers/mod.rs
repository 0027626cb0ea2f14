//! Serving blobs to other nodes (fleet distribution, issue 23; being built).
//!
//! A node that holds an image's blobs in containerd serves them to the other nodes of a
//! job, so a fleet fetches an image from the registry about once. What a request may
//! get, and from whom:
//! - only over mTLS with the fleet's CA, and only from a node certificate (the peer is
//!   the node its certificate names);
//! - only blobs by digest ([`request`]), never manifests by tag;
//! - only with a peer grant the controller signed for that node and an image whose
//!   blobs include the one asked for ([`reach`], `rigger_proto::peer_grant`).

pub mod reach;
pub mod request;
