//! Unpacking layers into containerd's snapshotter as containerd does: one committed
//! snapshot per layer, named by its chain ID and labelled `containerd.io/snapshot.ref`.
//!
//! For overlayfs (and its bind-mounted base layer) the layer is applied by Rigger's own
//! applier (`rigger_layer`, which never writes outside the snapshot) straight into the
//! snapshot directory — while the layer is still downloading ([`StreamingApply`]), or
//! from the content store afterwards ([`apply_from_store`]). Other snapshotters (native
//! among them: its whiteouts are removals, not overlayfs' device nodes) go through
//! containerd's diff service.
//!
//! A snapshot can only be prepared on a committed parent, but layers download (and
//! decompress) in parallel. So a layer whose parent is not unpacked yet is applied into
//! a parentless staging snapshot, then moved into its real snapshot once the parent is
//! committed: overlayfs keeps a layer's files in one directory of its own, which is all
//! that moves.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::decompress::decompress;
use super::unverified::{Account, Bounded};
use crate::containerd::SNAPSHOT_REF_LABEL;
use crate::containerd::{Descriptor, Mount};
use crate::media::Compression;
use rigger_layer::{Applied, ApplyError, ApplyTarget, adopt_lowers, apply_layer};
use sha2::{Digest as _, Sha256};
use tonic::Code;

use crate::store::Store;
use rigger_runtime::{CallError, describe_status};

/// Pieces handed to the applier are at most this big, and at most this many wait for
/// it, so a slow applier holds little (and slows its download down instead).
const FEED_PIECE: usize = 256 << 10;
const FEED_QUEUE: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("layer {digest}: {source}")]
    Apply { digest: String, source: ApplyError },
    #[error("layer {digest} was refused by containerd's unpack: {detail}")]
    Refused { digest: String, detail: String },
    #[error("layer {digest}: moving it onto its parent layer: {detail}")]
    Promote { digest: String, detail: String },
    #[error("layer {digest}: the layer below it failed")]
    ParentFailed { digest: String },
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
                format!("sha256:{}", hex::encode(hash))
            }
        };
        chain.push(next);
    }
    chain
}

/// The snapshot the layer goes to, from the mounts `Snapshots.Prepare` returned, when it
/// is one Rigger applies to itself: overlayfs' bind mount (the base layer) or overlay
/// mount (its `upperdir` and `lowerdir`s). `None` for anything else, which containerd's
/// diff service unpacks. Without a `parent` it is the image's bottom layer.
fn apply_target(snapshotter: &str, mounts: &[Mount], parent: Option<&str>) -> Option<ApplyTarget> {
    if snapshotter != "overlayfs" {
        return None;
    }
    let [mount] = mounts else { return None };
    match mount.kind.as_str() {
        "bind" => Some(ApplyTarget {
            root: PathBuf::from(&mount.source),
            lowers: Vec::new(),
            bottom: parent.is_none(),
        }),
        "overlay" => {
            let option = |key: &str| {
                mount
                    .options
                    .iter()
                    .find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            };
            Some(ApplyTarget {
                root: PathBuf::from(option("upperdir")?),
                lowers: option("lowerdir")
                    .map(|l| l.split(':').map(PathBuf::from).collect())
                    .unwrap_or_default(),
                bottom: parent.is_none(),
            })
        }
        _ => None,
    }
}

/// Whether the snapshot `chain_id` is already unpacked.
pub async fn is_unpacked(
    store: &Store,
    snapshotter: &str,
    chain_id: &str,
) -> Result<bool, UnpackError> {
    Ok(store
        .containerd()
        .snapshot_exists(store.scope(), snapshotter, chain_id)
        .await
        .map_err(|s| CallError::new("stat snapshot", s))?)
}

/// Apply `layer` into the prepared snapshot through containerd's diff service (for
/// snapshotters whose mounts Rigger does not write to itself), then commit it as
/// `chain_id`. A failed apply leaves no snapshot behind.
async fn apply_with_diff_service(
    store: &Store,
    snapshotter: &str,
    prepared: Prepared,
    layer: &Descriptor,
    diff_id: &str,
    chain_id: &str,
) -> Result<(), UnpackError> {
    let applied = async {
        let applied = store
            .containerd()
            .diff_apply(store.scope(), layer, prepared.mounts)
            .await
            .map_err(|status| UnpackError::Refused {
                digest: layer.digest.clone(),
                detail: describe_status(&status),
            })?;
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
    mounts: Vec<Mount>,
}

/// Prepare the snapshot `chain_id` is unpacked into; `None` when it exists already:
/// another pull (or containerd) committed it since this one looked. The snapshot ref
/// label makes containerd answer that with AlreadyExists, as its own unpacker expects.
async fn prepare(
    store: &Store,
    snapshotter: &str,
    parent: Option<&str>,
    chain_id: &str,
) -> Result<Option<Prepared>, UnpackError> {
    let labels = HashMap::from([(SNAPSHOT_REF_LABEL.to_owned(), chain_id.to_owned())]);
    match prepare_key(store, snapshotter, parent, extract_key(chain_id), labels).await {
        Ok(prepared) => Ok(Some(prepared)),
        Err(UnpackError::Call(e))
            if e.status.code() == Code::AlreadyExists
                && is_unpacked(store, snapshotter, chain_id).await? =>
        {
            tracing::debug!(chain_id, "unpacked meanwhile by another pull");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// containerd's own key format for unpacking: "extract-<unique> <chain id>".
fn extract_key(what: &str) -> String {
    format!(
        "extract-{}-{:08x} {what}",
        std::process::id(),
        fastrand::u32(..)
    )
}

/// A parentless snapshot to apply a layer into before its parent is committed.
async fn prepare_staging(
    store: &Store,
    snapshotter: &str,
    chain_id: &str,
) -> Result<Prepared, UnpackError> {
    let key = extract_key(&format!("staging {chain_id}"));
    prepare_key(store, snapshotter, None, key, HashMap::new()).await
}

async fn prepare_key(
    store: &Store,
    snapshotter: &str,
    parent: Option<&str>,
    key: String,
    labels: HashMap<String, String>,
) -> Result<Prepared, UnpackError> {
    let mounts = store
        .containerd()
        .snapshot_prepare(store.scope(), snapshotter, &key, parent, labels)
        .await
        .map_err(|s| CallError::new("prepare snapshot", s))?;
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
    match store
        .containerd()
        .snapshot_commit(store.scope(), snapshotter, chain_id, key, labels)
        .await
    {
        Ok(()) => Ok(()),
        Err(status) if status.code() == Code::AlreadyExists => {
            remove(store, snapshotter, key).await;
            Ok(())
        }
        Err(status) => Err(CallError::new("commit snapshot", status).into()),
    }
}

async fn remove(store: &Store, snapshotter: &str, key: &str) {
    if let Err(status) = store
        .containerd()
        .snapshot_remove(store.scope(), snapshotter, key)
        .await
    {
        tracing::warn!(%key, error = %describe_status(&status), "could not remove a half-unpacked snapshot");
    }
}

/// A `Read` over byte pieces sent from async code, counting them into `account`.
struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
    account: Option<Arc<Account>>,
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
        if let Some(account) = &self.account {
            account.read_compressed(n);
        }
        Ok(n)
    }
}

/// Decompress and apply on a blocking thread; returns the diff ID.
/// With an `account`, the output is held to its bound until the blob is verified.
fn spawn_applier(
    target: ApplyTarget,
    compression: Compression,
    rx: mpsc::Receiver<Bytes>,
    account: Option<Arc<Account>>,
) -> JoinHandle<Result<Applied, ApplyError>> {
    tokio::task::spawn_blocking(move || {
        let reader = ChannelReader {
            rx,
            current: Bytes::new(),
            account: account.clone(),
        };
        let decompressed = decompress(compression, reader).map_err(ApplyError::Read)?;
        match account {
            Some(account) => apply_layer(
                Bounded::new(decompressed, account, target.root.clone()),
                &target,
            ),
            None => apply_layer(decompressed, &target),
        }
    })
}

/// A layer being unpacked while its bytes download.
#[derive(Debug)]
pub struct StreamingApply {
    snapshotter: String,
    chain_id: String,
    parent: Option<String>,
    /// The snapshot the files go to: the layer's own, or a staging one.
    key: String,
    /// Where the files go, when that is a staging snapshot (parent not committed yet).
    staging_root: Option<PathBuf>,
    tx: Option<mpsc::Sender<Bytes>>,
    handle: JoinHandle<Result<Applied, ApplyError>>,
    /// What its unverified bytes may write (none for bytes containerd verified).
    account: Option<Arc<Account>>,
}

impl StreamingApply {
    /// Prepare the snapshot and start the applier: on `parent` when it is committed
    /// (`parent_ready`), else in a staging snapshot. `None` when the snapshotter's mounts
    /// are not ones Rigger applies to directly (then the layer is unpacked afterwards).
    pub async fn start(
        store: &Store,
        snapshotter: &str,
        parent: Option<&str>,
        parent_ready: bool,
        chain_id: &str,
        compression: Compression,
        reserve_percent: u64,
    ) -> Result<Option<Self>, UnpackError> {
        let staged = parent.is_some() && !parent_ready;
        let prepared = if staged {
            prepare_staging(store, snapshotter, chain_id).await?
        } else {
            // Unpacked meanwhile: nothing to stream into (the layer is then checked,
            // and found, afterwards).
            let Some(prepared) = prepare(store, snapshotter, parent, chain_id).await? else {
                return Ok(None);
            };
            prepared
        };
        let target = apply_target(snapshotter, &prepared.mounts, parent);
        let Some(target) = target.filter(|t| !staged || t.lowers.is_empty()) else {
            remove(store, snapshotter, &prepared.key).await;
            return Ok(None);
        };
        if staged {
            tracing::debug!(
                chain_id,
                "unpacking into a staging snapshot until the layer below is committed"
            );
        }
        let (tx, rx) = mpsc::channel(FEED_QUEUE);
        let account = Arc::new(Account::keeping(reserve_percent));
        Ok(Some(Self {
            snapshotter: snapshotter.to_owned(),
            chain_id: chain_id.to_owned(),
            parent: parent.map(str::to_owned),
            key: prepared.key,
            staging_root: staged.then(|| target.root.clone()),
            tx: Some(tx),
            handle: spawn_applier(target, compression, rx, Some(account.clone())),
            account: Some(account),
        }))
    }

    /// containerd accepted the blob's digest: its bytes are no longer bounded.
    pub fn verified(&self) {
        if let Some(account) = &self.account {
            account.verified();
        }
    }

    /// The account of what its unverified bytes wrote ([`super::unverified`]).
    pub fn account(&self) -> Option<Arc<Account>> {
        self.account.clone()
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

    /// All bytes are in: wait for the applier and check the diff ID; a staged layer then
    /// waits for `parent_unpacked` (false: the parent failed) and moves onto its parent.
    /// Finally the snapshot is committed as the chain ID.
    pub async fn finish(
        mut self,
        store: &Store,
        layer_digest: &str,
        diff_id: &str,
        parent_unpacked: impl Future<Output = bool>,
    ) -> Result<(), UnpackError> {
        self.tx = None;
        let applied = match (&mut self.handle).await {
            Ok(result) => result,
            Err(join) => Err(ApplyError::Read(std::io::Error::other(join.to_string()))),
        };
        let applied = match applied {
            Ok(applied) if applied.diff_id == diff_id => applied,
            Ok(applied) => {
                remove(store, &self.snapshotter, &self.key).await;
                return Err(UnpackError::DiffIdMismatch {
                    digest: layer_digest.to_owned(),
                    expected: diff_id.to_owned(),
                    actual: applied.diff_id,
                });
            }
            Err(source) => {
                remove(store, &self.snapshotter, &self.key).await;
                return Err(UnpackError::Apply {
                    digest: layer_digest.to_owned(),
                    source,
                });
            }
        };
        let Some(staging_root) = self.staging_root.take() else {
            let outcome = commit(store, &self.snapshotter, &self.key, &self.chain_id).await;
            if outcome.is_err() {
                remove(store, &self.snapshotter, &self.key).await;
            }
            return outcome;
        };
        let outcome = if parent_unpacked.await {
            self.promote(store, layer_digest, staging_root, applied)
                .await
        } else {
            Err(UnpackError::ParentFailed {
                digest: layer_digest.to_owned(),
            })
        };
        remove(store, &self.snapshotter, &self.key).await;
        outcome
    }

    /// Move the staged files into the layer's own snapshot on its (now committed)
    /// parent, complete implied directories from the layers below, and commit.
    async fn promote(
        &self,
        store: &Store,
        layer_digest: &str,
        staging_root: PathBuf,
        applied: Applied,
    ) -> Result<(), UnpackError> {
        let promote_err = |detail: String| UnpackError::Promote {
            digest: layer_digest.to_owned(),
            detail,
        };
        let Some(prepared) = prepare(
            store,
            &self.snapshotter,
            self.parent.as_deref(),
            &self.chain_id,
        )
        .await?
        else {
            // Another pull committed this layer first: the staged copy is not needed.
            return Ok(());
        };
        let moved = async {
            let target = apply_target(&self.snapshotter, &prepared.mounts, self.parent.as_deref())
                .ok_or_else(|| promote_err("the snapshot is not an overlay".to_owned()))?;
            tokio::task::spawn_blocking(move || -> Result<(), String> {
                // The new snapshot's directory is empty: the staged one takes its place,
                // and the staging snapshot gets an empty one back for its removal.
                rigger_layer::move_snapshot_dir(&staging_root, &target.root)
                    .map_err(|e| e.to_string())?;
                adopt_lowers(&target.root, &target.lowers, &applied.implied_parents)
                    .map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| promote_err(e.to_string()))?
            .map_err(promote_err)?;
            commit(store, &self.snapshotter, &prepared.key, &self.chain_id).await
        }
        .await;
        if moved.is_err() {
            remove(store, &self.snapshotter, &prepared.key).await;
        }
        moved
    }

    /// Give up (the download failed or restarted): stop the applier, drop the snapshot.
    pub async fn abandon(mut self, store: &Store) {
        self.tx = None;
        let _ = (&mut self.handle).await;
        remove(store, &self.snapshotter, &self.key).await;
    }
}

/// Unpack a layer whose blob is in the content store.
pub async fn apply_from_store(
    store: &Store,
    snapshotter: &str,
    layer: &Descriptor,
    compression: Compression,
    diff_id: &str,
    parent: Option<&str>,
    chain_id: &str,
) -> Result<(), UnpackError> {
    let Some(prepared) = prepare(store, snapshotter, parent, chain_id).await? else {
        return Ok(()); // Another pull unpacked it first.
    };
    let Some(target) = apply_target(snapshotter, &prepared.mounts, parent) else {
        return apply_with_diff_service(store, snapshotter, prepared, layer, diff_id, chain_id)
            .await;
    };
    let (tx, rx) = mpsc::channel(FEED_QUEUE);
    let mut streaming = StreamingApply {
        snapshotter: snapshotter.to_owned(),
        chain_id: chain_id.to_owned(),
        parent: parent.map(str::to_owned),
        key: prepared.key,
        staging_root: None,
        tx: Some(tx),
        // Verified bytes: containerd holds the blob.
        handle: spawn_applier(target, compression, rx, None),
        account: None,
    };
    let read = async {
        let mut stream = store
            .containerd()
            .content_read(store.scope(), &layer.digest, 0, 0)
            .await
            .map_err(|s| CallError::new("read content", s))?;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|s| CallError::new("read content", s))?;
            let len = chunk.len() as u64;
            if streaming.feed(chunk).await < len {
                break; // the applier failed; finish() reports why
            }
        }
        Ok::<_, UnpackError>(())
    }
    .await;
    match read {
        Ok(()) => {
            streaming
                .finish(store, &layer.digest, diff_id, async { true })
                .await
        }
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
            hex::encode(Sha256::digest(b"sha256:aaaa sha256:bbbb"))
        );
        assert_eq!(ids[1], expected);
    }
}
