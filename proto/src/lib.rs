//! Rigger's agent <-> controller protocol, generated from `proto/rigger/v1/*.proto`.
//!
//! The wire types are the contract between versions of the agent and the controller;
//! change them only in backward-compatible ways (new fields, new oneof cases).

#![allow(missing_debug_implementations)] // generated gRPC clients/servers
#![allow(clippy::derive_partial_eq_without_eq)]

pub mod lifecycle;
pub mod peer_grant;
pub mod pod;
pub mod time;

/// Metadata of a refusal by the controller's request-rate limit: milliseconds until the
/// client's next request is admitted. riggerctl waits this long before retrying (gRPC
/// has no Retry-After of its own).
pub const RETRY_AFTER_MS: &str = "rigger-retry-after-ms";

/// Metadata of a follower's refusal (`unavailable`, value `1`): another replica leads.
/// Behind a Service every replica is Ready and a connection lands on any of them, so a
/// client that meets a follower tries a new connection soon rather than backing off as
/// from a fault.
pub const NOT_LEADER: &str = "rigger-not-leader";

/// A refusal marked as a follower's ([`NOT_LEADER`]): another replica leads, or will
/// once this one is gone (a leader shutting down says so too).
pub fn not_leader(message: &str) -> tonic::Status {
    let mut refusal = tonic::Status::unavailable(message);
    refusal
        .metadata_mut()
        .insert(NOT_LEADER, tonic::metadata::MetadataValue::from_static("1"));
    refusal
}

/// Whether a refusal is a follower's: [`NOT_LEADER`], or the message of controllers
/// from before it was sent.
pub fn refused_by_follower(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable
        && (status.metadata().get(NOT_LEADER).is_some()
            || status.message().starts_with("not the leader"))
}

/// `rigger.v1`: node inventory and the agent link.
pub mod v1 {
    tonic::include_proto!("rigger.v1");
}

/// prost encoding with small initial buffers. tonic's default (8 KiB for each direction
/// of each stream) is most of what one idle agent link costs the controller; messages
/// on the link are small, and the buffers still grow for the rare large one (an
/// inventory, a fleet-wide list).
#[derive(Debug)]
pub struct LeanCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

fn lean_buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(1024, 32 << 10)
}

impl<T, U> tonic::codec::Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<T, U>::raw_encoder(lean_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstCodec::<T, U>::raw_decoder(lean_buffers())
    }
}

/// Longest node name (a DNS subdomain, as Kubernetes node names are).
pub const MAX_NODE_NAME_LEN: usize = 253;

/// Node names follow Kubernetes' rule for node names: a DNS subdomain. Both ends of the
/// link check it, so a bad name fails at the agent's start, not at the controller.
pub fn check_node_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NODE_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|part| !part.is_empty() && !part.starts_with('-') && !part.ends_with('-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "node name {name:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert!(check_node_name("node-1.example").is_ok());
        for bad in ["", "Node", "-a", "a-", "a..b", "a_b"] {
            assert!(check_node_name(bad).is_err(), "{bad}");
        }
    }
}
