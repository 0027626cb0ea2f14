//! A SidecarSet's `volumes`: Kubernetes' volumes, every source as written, read strictly
//! (a field Kubernetes' Volume lacks is refused with its path) and written in Rigger's
//! form where Rigger's pods run them, as they were written before they took every
//! source, so that stored versions keep their hashes.

use k8s_openapi::api::core::v1 as core;
use serde::de::Error as _;
use serde::ser::SerializeSeq as _;
use serde::{Deserialize, Deserializer, Serializer};

use crate::kube_types;

pub fn serialize<S: Serializer>(
    volumes: &[core::Volume],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(volumes.len()))?;
    for volume in volumes {
        match kube_types::to_rigger::<_, rigger_proto::pod::Volume>(volume) {
            Ok(rigger) => seq.serialize_element(&rigger)?,
            Err(_) => seq.serialize_element(volume)?,
        }
    }
    seq.end()
}

pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<core::Volume>, D::Error> {
    let written: Vec<serde_json::Value> = Vec::deserialize(deserializer)?;
    written
        .iter()
        .enumerate()
        .map(|(i, volume)| {
            kube_types::decode_strict(volume).map_err(|e| D::Error::custom(format!("[{i}]: {e}")))
        })
        .collect()
}
