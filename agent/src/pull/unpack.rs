//! Unpacking layers into containerd's snapshotter as containerd does: one committed
//! snapshot per layer, named by its chain ID and labelled `containerd.io/snapshot.ref`.
//!
//! For overlayfs (and the bind-mounted base layer) the layer is applied by Rigger's own
//! applier ([`super::apply`]) straight into the snapshot directory — while the layer is
//! still downloading ([`StreamingApply`]), or from the content store afterwards
//! ([`apply_from_store`]). Other snapshotters go through containerd's diff service.

use std::collections::HashMap;

use bytes::Bytes;
use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::{ApplyRequest, ReadContentRequest};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::apply::{ApplyError, ApplyTarget, apply_layer};
use super::media::Compression;
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

/// Pieces handed to the applier are at most this big, so a slow applier holds little.
const FEED_PIECE: usize = 256 << 10;

/// The label containerd puts on every unpacked layer snapshot.
pub const SNAPSHOT_REF_LABEL: &str = "containerd.io/snapshot.ref";

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("layer {digest}: {source}")]
    Apply { digest: String, source: ApplyError },
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

/// Apply `layer` into the prepared snapshot through containerd's diff service (for
/// snapshotters whose mounts Rigger does not write to itself), then commit it as
/// `chain_id`. A failed apply leaves no snapshot behind.
async fn apply_with_diff_service(
    store: &Store,
    snapshotter: &str,
    prepared: Prepared,
    layer: &ContainerdDescriptor,
    diff_id: &str,
    chain_id: &str,
) -> Result<(), UnpackError> {
    let applied = async {
        let apply = store
            .request(ApplyRequest {
                diff: Some(layer.clone()),
                mounts: prepared.mounts,
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
        commit(store, snapshotter, &prepared.key, chain_id).await
    }
    .await;
    if applied.is_err() {
        remove(store, snapshotter, &prepared.key).await;
    }
    applied
}

/// A layer snapshot being prepared: the key it lives under until committed.
#[derive(Debug)]
struct Prepared {
    key: String,
    mounts: Vec<containerd_client::types::Mount>,
}

async fn prepare(
    store: &Store,
    snapshotter: &str,
    parent: Option<&str>,
    chain_id: &str,
) -> Result<Prepared, UnpackError> {
    let labels = HashMap::from([(SNAPSHOT_REF_LABEL.to_owned(), chain_id.to_owned())]);
    // containerd's own key format for unpacking: "extract-<unique> <chain id>".
    let key = format!(
        "extract-{}-{:08x} {chain_id}",
        std::process::id(),
        fastrand::u32(..)
    );
    let request = store
        .request(PrepareSnapshotRequest {
            snapshotter: snapshotter.to_owned(),
            key: key.clone(),
            parent: parent.unwrap_or_default().to_owned(),
            labels,
        })
        .map_err(|s| CallError::new("prepare snapshot", s))?;
    let mounts = SnapshotsClient::new(store.channel())
        .prepare(request)
        .await
        .map_err(|s| CallError::new("prepare snapshot", s))?
        .into_inner()
        .mounts;
    Ok(Prepared { key, mounts })
}

/// Commit `key` as `chain_id`; another pull having committed it first is fine.
async fn commit(
    store: &Store,
    snapshotter: &str,
    key: &str,
    chain_id: &str,
) -> Result<(), UnpackError> {
    let labels = HashMap::from([(SNAPSHOT_REF_LABEL.to_owned(), chain_id.to_owned())]);
    let request = store
        .request(CommitSnapshotRequest {
            snapshotter: snapshotter.to_owned(),
            name: chain_id.to_owned(),
            key: key.to_owned(),
            labels,
        })
        .map_err(|s| CallError::new("commit snapshot", s))?;
    match SnapshotsClient::new(store.channel()).commit(request).await {
        Ok(_) => Ok(()),
        Err(status) if status.code() == Code::AlreadyExists => {
            remove(store, snapshotter, key).await;
            Ok(())
        }
        Err(status) => Err(CallError::new("commit snapshot", status).into()),
    }
}

async fn remove(store: &Store, snapshotter: &str, key: &str) {
    if let Ok(request) = store.request(RemoveSnapshotRequest {
        snapshotter: snapshotter.to_owned(),
        key: key.to_owned(),
    }) && let Err(status) = SnapshotsClient::new(store.channel()).remove(request).await
    {
        tracing::warn!(%key, error = %describe_status(&status), "could not remove a half-unpacked snapshot");
    }
}

/// A `Read` over byte pieces sent from async code.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(next) => self.current = next,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = self.current.slice(n..);
        Ok(n)
    }
}

/// Decompress and apply on a blocking thread; returns the diff ID.
fn spawn_applier(
    target: ApplyTarget,
    compression: Compression,
    rx: mpsc::Receiver<Bytes>,
) -> JoinHandle<Result<String, ApplyError>> {
    tokio::task::spawn_blocking(move || {
        let reader = std::io::BufReader::with_capacity(
            256 << 10,
            ChannelReader {
                rx,
                current: Bytes::new(),
            },
        );
        match compression {
            Compression::None => apply_layer(reader, &target),
            // Multi-member gzip, as Go's reader (and so containerd) accepts.
            Compression::Gzip => apply_layer(flate2::read::MultiGzDecoder::new(reader), &target),
            Compression::Zstd => {
                let decoder =
                    zstd::stream::read::Decoder::with_buffer(reader).map_err(ApplyError::Read)?;
                apply_layer(decoder, &target)
            }
        }
    })
}

/// A layer being unpacked while its bytes download.
#[derive(Debug)]
pub struct StreamingApply {
    snapshotter: String,
    chain_id: String,
    key: String,
    tx: Option<mpsc::Sender<Bytes>>,
    handle: JoinHandle<Result<String, ApplyError>>,
}

impl StreamingApply {
    /// Prepare the snapshot and start the applier; `None` when the snapshotter's mounts
    /// are not ones Rigger applies to directly (then the layer is unpacked afterwards).
    pub async fn start(
        store: &Store,
        snapshotter: &str,
        parent: Option<&str>,
        chain_id: &str,
        compression: Compression,
    ) -> Result<Option<Self>, UnpackError> {
        let prepared = prepare(store, snapshotter, parent, chain_id).await?;
        let Some(target) = ApplyTarget::from_mounts(&prepared.mounts) else {
            remove(store, snapshotter, &prepared.key).await;
            return Ok(None);
        };
        let (tx, rx) = mpsc::channel(16);
        Ok(Some(Self {
            snapshotter: snapshotter.to_owned(),
            chain_id: chain_id.to_owned(),
            key: prepared.key,
            tx: Some(tx),
            handle: spawn_applier(target, compression, rx),
        }))
    }

    /// Hand downloaded bytes to the applier, in pieces of at most [`FEED_PIECE`] (cheap
    /// slices of one buffer, so a slow applier holds little). Returns how many bytes it
    /// took: fewer than given once the applier stopped ([`StreamingApply::finish`] tells
    /// why).
    pub async fn feed(&mut self, mut bytes: Bytes) -> u64 {
        let Some(tx) = &self.tx else { return 0 };
        let mut taken = 0;
        while !bytes.is_empty() {
            let piece = bytes.split_to(bytes.len().min(FEED_PIECE));
            let n = piece.len() as u64;
            if tx.send(piece).await.is_err() {
                break;
            }
            taken += n;
        }
        taken
    }

    /// All bytes are in: wait for the applier, check the diff ID and commit.
    pub async fn finish(
        mut self,
        store: &Store,
        layer_digest: &str,
        diff_id: &str,
    ) -> Result<(), UnpackError> {
        self.tx = None;
        let applied = match self.handle.await {
            Ok(result) => result,
            Err(join) => Err(ApplyError::Read(std::io::Error::other(join.to_string()))),
        };
        let outcome = match applied {
            Ok(actual) if actual == diff_id => {
                commit(store, &self.snapshotter, &self.key, &self.chain_id).await
            }
            Ok(actual) => Err(UnpackError::DiffIdMismatch {
                digest: layer_digest.to_owned(),
                expected: diff_id.to_owned(),
                actual,
            }),
            Err(source) => Err(UnpackError::Apply {
                digest: layer_digest.to_owned(),
                source,
            }),
        };
        if outcome.is_err() {
            remove(store, &self.snapshotter, &self.key).await;
        }
        outcome
    }

    /// Give up (the download failed or restarted): stop the applier, drop the snapshot.
    pub async fn abandon(mut self, store: &Store) {
        self.tx = None;
        let _ = self.handle.await;
        remove(store, &self.snapshotter, &self.key).await;
    }
}

/// Unpack a layer whose blob is in the content store.
pub async fn apply_from_store(
    store: &Store,
    snapshotter: &str,
    layer: &ContainerdDescriptor,
    compression: Compression,
    diff_id: &str,
    parent: Option<&str>,
    chain_id: &str,
) -> Result<(), UnpackError> {
    let prepared = prepare(store, snapshotter, parent, chain_id).await?;
    let Some(target) = ApplyTarget::from_mounts(&prepared.mounts) else {
        return apply_with_diff_service(store, snapshotter, prepared, layer, diff_id, chain_id)
            .await;
    };
    let (tx, rx) = mpsc::channel(16);
    let mut streaming = StreamingApply {
        snapshotter: snapshotter.to_owned(),
        chain_id: chain_id.to_owned(),
        key: prepared.key,
        tx: Some(tx),
        handle: spawn_applier(target, compression, rx),
    };
    let read = async {
        let request = store
            .request(ReadContentRequest {
                digest: layer.digest.clone(),
                offset: 0,
                size: 0,
            })
            .map_err(|s| CallError::new("read content", s))?;
        let mut stream = ContentClient::new(store.channel())
            .read(request)
            .await
            .map_err(|s| CallError::new("read content", s))?
            .into_inner();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|s| CallError::new("read content", s))?;
            let len = chunk.data.len() as u64;
            if streaming.feed(Bytes::from(chunk.data)).await < len {
                break; // the applier failed; finish() reports why
            }
        }
        Ok::<_, UnpackError>(())
    }
    .await;
    match read {
        Ok(()) => streaming.finish(store, &layer.digest, diff_id).await,
        Err(e) => {
            streaming.abandon(store).await;
            Err(e)
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
