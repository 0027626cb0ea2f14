//! Unpacking layers into containerd's snapshotter exactly as containerd does: one
//! committed snapshot per layer named by its chain ID, applied through containerd's own
//! diff service (so whiteouts, hardlinks and unsafe paths are handled, and refused, by
//! the same code as containerd's pull).

use std::collections::HashMap;

use containerd_client::services::v1::ApplyRequest;
use containerd_client::services::v1::diff_client::DiffClient;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::types::Descriptor as ContainerdDescriptor;
use sha2::{Digest as _, Sha256};
use tonic::Code;

use super::store::Store;
use crate::runtime::{CallError, describe_status};

/// The label containerd puts on every unpacked layer snapshot.
pub const SNAPSHOT_REF_LABEL: &str = "containerd.io/snapshot.ref";

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("layer {digest} was refused by containerd's unpack: {detail}")]
    Refused { digest: String, detail: String },
    #[error("layer {digest} unpacked to {actual}, but the image config says {expected}")]
    DiffIdMismatch {
        digest: String,
        expected: String,
        actual: String,
    },
}

/// ChainID(L0) = DiffID(L0); ChainID(Ln) = sha256(ChainID(Ln-1) + " " + DiffID(Ln)).
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut chain: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match chain.last() {
            None => diff_id.clone(),
            Some(parent) => {
                let hash = Sha256::digest(format!("{parent} {diff_id}").as_bytes());
                format!("sha256:{}", hex(&hash))
            }
        };
        chain.push(next);
    }
    chain
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether the snapshot `chain_id` is already unpacked.
pub async fn is_unpacked(
    store: &Store,
    snapshotter: &str,
    chain_id: &str,
) -> Result<bool, UnpackError> {
    let request = store
        .request(StatSnapshotRequest {
            snapshotter: snapshotter.to_owned(),
            key: chain_id.to_owned(),
        })
        .map_err(|s| CallError::new("stat snapshot", s))?;
    match SnapshotsClient::new(store.channel()).stat(request).await {
        Ok(_) => Ok(true),
        Err(status) if status.code() == Code::NotFound => Ok(false),
        Err(status) => Err(CallError::new("stat snapshot", status).into()),
    }
}

/// Apply `layer` on top of `parent` (a chain ID, or `None` for the base layer) and commit
/// it as `chain_id`. A failed apply leaves no snapshot behind.
pub async fn apply_layer(
    store: &Store,
    snapshotter: &str,
    layer: &ContainerdDescriptor,
    diff_id: &str,
    parent: Option<&str>,
    chain_id: &str,
) -> Result<(), UnpackError> {
    let labels = HashMap::from([(SNAPSHOT_REF_LABEL.to_owned(), chain_id.to_owned())]);
    // containerd's own key format for unpacking: "extract-<unique> <chain id>".
    let key = format!(
        "extract-{}-{:08x} {chain_id}",
        std::process::id(),
        fastrand::u32(..)
    );
    let mut snapshots = SnapshotsClient::new(store.channel());
    let prepare = store
        .request(PrepareSnapshotRequest {
            snapshotter: snapshotter.to_owned(),
            key: key.clone(),
            parent: parent.unwrap_or_default().to_owned(),
            labels: labels.clone(),
        })
        .map_err(|s| CallError::new("prepare snapshot", s))?;
    let mounts = snapshots
        .prepare(prepare)
        .await
        .map_err(|s| CallError::new("prepare snapshot", s))?
        .into_inner()
        .mounts;

    let applied = async {
        let apply = store
            .request(ApplyRequest {
                diff: Some(layer.clone()),
                mounts,
                payloads: HashMap::new(),
                sync_fs: false,
            })
            .map_err(|s| CallError::new("apply layer", s))?;
        let applied = DiffClient::new(store.channel())
            .apply(apply)
            .await
            .map_err(|status| UnpackError::Refused {
                digest: layer.digest.clone(),
                detail: describe_status(&status),
            })?
            .into_inner()
            .applied
            .map(|d| d.digest)
            .unwrap_or_default();
        if applied != diff_id {
            return Err(UnpackError::DiffIdMismatch {
                digest: layer.digest.clone(),
                expected: diff_id.to_owned(),
                actual: applied,
            });
        }
        let commit = store
            .request(CommitSnapshotRequest {
                snapshotter: snapshotter.to_owned(),
                name: chain_id.to_owned(),
                key: key.clone(),
                labels,
            })
            .map_err(|s| CallError::new("commit snapshot", s))?;
        match SnapshotsClient::new(store.channel()).commit(commit).await {
            Ok(_) => Ok(()),
            // Another pull unpacked the same layer meanwhile: theirs is as good.
            Err(status) if status.code() == Code::AlreadyExists => {
                Err(UnpackError::Call(CallError::new("commit snapshot", status)))
            }
            Err(status) => Err(CallError::new("commit snapshot", status).into()),
        }
    }
    .await;

    match applied {
        Ok(()) => Ok(()),
        Err(error) => {
            if let Ok(remove) = store.request(RemoveSnapshotRequest {
                snapshotter: snapshotter.to_owned(),
                key,
            }) {
                let _ = snapshots.remove(remove).await;
            }
            match &error {
                UnpackError::Call(call) if call.status.code() == Code::AlreadyExists => Ok(()),
                _ => Err(error),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_oci_definition() {
        let a = "sha256:aaaa".to_owned();
        let b = "sha256:bbbb".to_owned();
        let ids = chain_ids(&[a.clone(), b]);
        assert_eq!(ids[0], a);
        let expected = format!(
            "sha256:{}",
            hex(&Sha256::digest(b"sha256:aaaa sha256:bbbb"))
        );
        assert_eq!(ids[1], expected);
    }
}
