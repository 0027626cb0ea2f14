//! The containerd side of a pull: a lease that keeps everything safe from garbage
//! collection until the image record exists, content ingestion through `Content.Write`
//! (resumable under a stable ingest ref), content labels, and image records.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rigger_runtime::{CallError, describe_status};

use crate::arriving::ArrivalGuard;
use crate::containerd::{
    Containerd, Descriptor, ImageRecord, Ingest, IngestMessage, LeaseResource, Scope,
};
use crate::presence::{Presence, Present};

/// Bytes per `Content.Write` message, at most: containerd's cost per message shows
/// (2.1 spent 0.47-0.52 s of CPU on a 128 MiB layer in 1 MiB messages, 0.50-0.62 s in
/// 256 KiB ones); far below its 16 MiB message limit.
pub const WRITE_CHUNK_MAX: usize = 1 << 20;
/// Bytes per message, at least, however many blobs are written at once.
pub const WRITE_CHUNK_MIN: usize = 256 << 10;
/// Memory the gathered messages of one pull's open writers share: many layers written
/// at once each get smaller messages (eight layers at 1 MiB each held 24 MiB more).
const WRITE_BUDGET: usize = 2 << 20;
/// Messages sent ahead of containerd's acknowledgements, per blob.
pub const WRITES_IN_FLIGHT: usize = 2;

/// Leases expire by themselves if the agent dies before deleting them.
const LEASE_EXPIRY: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("{what}: {detail}")]
    Write { what: String, detail: String },
    /// containerd went away mid-write (stopped, restarted, crashed): the pull waits for
    /// it and resumes from what it kept.
    #[error("{what}: containerd went away mid-write (stopped or restarted?)")]
    Lost { what: String },
    #[error(
        "digest mismatch for {digest}: the bytes received hash to something else (corrupt transfer or a registry serving wrong content)"
    )]
    DigestMismatch { digest: String },
}

/// containerd access for one pull: namespace plus lease on every request.
#[derive(Debug, Clone)]
pub struct Store {
    containerd: Arc<dyn Containerd>,
    namespace: String,
    lease: Option<String>,
    /// Ingest refs this pull opened: what `abort_opened` frees when the disk is full.
    opened: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// Blob writers of this pull open now: they share [`WRITE_BUDGET`].
    writers: Presence,
}

impl Store {
    pub fn new(containerd: Arc<dyn Containerd>, namespace: &str) -> Self {
        Self {
            containerd,
            namespace: namespace.to_owned(),
            lease: None,
            opened: std::sync::Arc::default(),
            writers: Presence::default(),
        }
    }

    /// Abort every ingest this pull opened (partial downloads containerd holds): used
    /// when the disk is full, where keeping them to resume would keep the node full.
    /// Returns how many were aborted.
    pub async fn abort_opened(&self) -> usize {
        let refs: Vec<String> = match self.opened.lock() {
            Ok(opened) => opened.iter().cloned().collect(),
            Err(_) => return 0,
        };
        let mut aborted = 0;
        for reference in refs {
            match self.containerd.ingest_abort(self.scope(), &reference).await {
                Ok(()) => aborted += 1,
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => {
                    tracing::warn!(%reference, error = %status.message(), "could not abort the ingest");
                }
            }
        }
        aborted
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// containerd, for the stages that use it beyond this store (the snapshotter).
    pub(crate) fn containerd(&self) -> &dyn Containerd {
        self.containerd.as_ref()
    }

    /// Where this pull's calls act: its namespace, and its lease once taken.
    pub(crate) fn scope(&self) -> Scope<'_> {
        Scope {
            namespace: &self.namespace,
            lease: self.lease.as_deref(),
        }
    }

    /// Take a lease; everything written from now on is kept until [`Store::release`].
    pub async fn take_lease(&mut self, purpose: &str) -> Result<(), StoreError> {
        let id = format!(
            "rigger-{purpose}-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let expire =
            humantime::format_rfc3339_seconds(SystemTime::now() + LEASE_EXPIRY).to_string();
        let labels = HashMap::from([("containerd.io/gc.expire".to_owned(), expire)]);
        self.containerd
            .lease_create(&self.namespace, &id, labels)
            .await
            .map_err(|s| CallError::new("create lease", s))?;
        self.lease = Some(id);
        Ok(())
    }

    /// Release the snapshots held by leases of pulls whose process is gone (killed
    /// mid-pull): they would otherwise keep half-unpacked snapshots for a day. The lease
    /// itself, and the ingests it holds, stay until it expires: the bytes already
    /// downloaded are resumed from.
    pub async fn reap_stale_leases(&self) -> Result<(), StoreError> {
        let leases = self
            .containerd
            .leases(&self.namespace)
            .await
            .map_err(|s| CallError::new("list leases", s))?;
        for lease in leases {
            let Some(pid) = lease
                .strip_prefix("rigger-pull-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<i32>().ok())
            else {
                continue;
            };
            let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
            if alive {
                continue;
            }
            let resources = self
                .containerd
                .lease_resources(&self.namespace, &lease)
                .await
                .map_err(|s| CallError::new("list lease resources", s))?;
            for resource in resources
                .into_iter()
                .filter(|r| r.kind.starts_with("snapshots/"))
            {
                tracing::info!(%lease, snapshot = %resource.id, "releasing a snapshot of an interrupted pull");
                let released: LeaseResource = resource;
                if let Err(status) = self
                    .containerd
                    .lease_delete_resource(&self.namespace, &lease, released)
                    .await
                {
                    tracing::warn!(%lease, error = %describe_status(&status), "could not release a snapshot");
                }
            }
        }
        Ok(())
    }

    /// Drop the lease: what the image record references stays, the rest becomes garbage.
    pub async fn release(&mut self) -> Result<(), StoreError> {
        let Some(id) = self.lease.take() else {
            return Ok(());
        };
        self.containerd
            .lease_delete(&self.namespace, &id)
            .await
            .map_err(|s| CallError::new("delete lease", s))?;
        Ok(())
    }

    /// Labels of a blob already in the content store; `None` if it is not there.
    pub async fn blob_labels(
        &self,
        digest: &str,
    ) -> Result<Option<HashMap<String, String>>, StoreError> {
        Ok(self
            .containerd
            .content_info(self.scope(), digest)
            .await
            .map_err(|s| CallError::new("content info", s))?
            .map(|(_, labels)| labels))
    }

    /// Add `labels` to a blob already in the store (keeping the others).
    pub async fn add_labels(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), StoreError> {
        if labels.is_empty() {
            return Ok(());
        }
        self.containerd
            .content_add_labels(self.scope(), digest, labels)
            .await
            .map_err(|s| CallError::new("content update", s))?;
        Ok(())
    }

    /// Open (or resume) the ingest `reference` for a blob of `size` bytes and `digest`.
    pub async fn open_writer(
        &self,
        reference: &str,
        digest: &str,
        size: u64,
    ) -> Result<BlobWriter, StoreError> {
        let what = format!("write {digest}");
        if let Ok(mut opened) = self.opened.lock() {
            opened.insert(reference.to_owned());
        }
        let mut ingest = self
            .containerd
            .ingest_open(self.scope(), reference, size, digest)
            .await
            .map_err(|s| CallError::new("content write", s))?;
        let offset = next_response(ingest.as_mut(), &what).await?;
        Ok(BlobWriter {
            ingest,
            reference: reference.to_owned(),
            digest: digest.to_owned(),
            size,
            offset,
            acked: offset,
            pending: Vec::new(),
            in_flight: 0,
            what,
            open: self.writers.enter(),
            arrival: None,
        })
    }

    /// Create or update an image record pointing at `target`.
    pub async fn put_image(
        &self,
        name: &str,
        target: &Descriptor,
        labels: &HashMap<String, String>,
    ) -> Result<(), StoreError> {
        let image = ImageRecord {
            name: name.to_owned(),
            target: target.clone(),
            labels: labels.clone(),
        };
        self.containerd
            .image_put(self.scope(), image)
            .await
            .map_err(|s| CallError::new("put image", s))?;
        Ok(())
    }
}

/// A status that means containerd is not there (any more), rather than refusing.
fn is_gone(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable
        || (status.code() == tonic::Code::Unknown
            && ["transport", "broken pipe", "connection", "stream closed"]
                .iter()
                .any(|sign| status.message().to_ascii_lowercase().contains(sign)))
}

impl StoreError {
    /// containerd went away (or was not there to answer): worth waiting for.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Self::Lost { .. } => true,
            Self::Call(call) => is_gone(&call.status),
            Self::Write { .. } | Self::DigestMismatch { .. } => false,
        }
    }
}

/// The next offset an ingest's stream confirms.
async fn next_response(ingest: &mut dyn Ingest, what: &str) -> Result<u64, StoreError> {
    match ingest.next().await {
        Ok(Some(offset)) => Ok(offset),
        Ok(None) => Err(StoreError::Lost {
            what: what.to_owned(),
        }),
        Err(status) if is_gone(&status) => Err(StoreError::Lost {
            what: what.to_owned(),
        }),
        Err(status) => Err(StoreError::Write {
            what: what.to_owned(),
            detail: describe_status(&status),
        }),
    }
}

/// An open ingest: bytes go in order from `offset()`, then `commit`.
///
/// Writes are gathered into messages of up to [`WRITE_CHUNK_MAX`] and sent without
/// waiting for containerd's acknowledgement of each (at most [`WRITES_IN_FLIGHT`]
/// unacknowledged): a round trip per network read would leave containerd idle between
/// them. `acked()` tells what containerd confirmed holding; `flush()` waits for all of
/// it.
#[derive(Debug)]
pub struct BlobWriter {
    ingest: Box<dyn Ingest>,
    reference: String,
    digest: String,
    size: u64,
    /// Bytes taken by `write` (sent, in flight or gathered).
    offset: u64,
    /// Bytes containerd confirmed.
    acked: u64,
    /// Gathered bytes not sent yet.
    pending: Vec<u8>,
    /// Messages sent and not acknowledged yet.
    in_flight: usize,
    what: String,
    /// Counted among the pull's open writers, which share [`WRITE_BUDGET`].
    open: Present,
    /// Where peers follow this write (a blob the node serves while it arrives).
    arrival: Option<ArrivalGuard>,
}

/// Bytes per message when `open` writers share [`WRITE_BUDGET`].
fn message_size(open: usize) -> usize {
    (WRITE_BUDGET / open.max(1)).clamp(WRITE_CHUNK_MIN, WRITE_CHUNK_MAX)
}

impl BlobWriter {
    /// End this write stream and open a new one on the same ingest, to learn the offset
    /// containerd really holds (after a failed transfer, say). containerd keeps the
    /// ingest locked until it sees the old stream end, so that comes first.
    pub async fn reopen(&mut self, store: &Store) -> Result<(), StoreError> {
        self.ingest.close();
        while let Ok(Some(_)) = self.ingest.next().await {}
        let arrival = self.arrival.take();
        let ours = self.acked;
        *self = store
            .open_writer(&self.reference, &self.digest, self.size)
            .await?;
        // Announced still only while the ingest holds this write's own bytes: another
        // writer (containerd's own pull of the same layer, say) may have gone on with
        // it meanwhile.
        if let Some(arrival) = arrival
            && self.acked <= ours
        {
            self.announce(arrival);
        }
        Ok(())
    }

    /// Tell `arrival` how far this write comes, from now on.
    pub fn announce(&mut self, arrival: ArrivalGuard) {
        arrival.held(self.acked);
        self.arrival = Some(arrival);
    }

    /// The blob's whole size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether this write is announced to the peer endpoint.
    pub fn announced(&self) -> bool {
        self.arrival.is_some()
    }

    /// The ingest's ref in containerd.
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// Bytes taken so far (where the next `write` goes; where a resumed download starts).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes containerd has confirmed holding.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Start over from byte 0 (the held bytes are unusable, e.g. after a digest mismatch).
    pub async fn truncate(&mut self) -> Result<(), StoreError> {
        self.pending.clear();
        self.drain(0).await?;
        self.send(IngestMessage::Write {
            offset: 0,
            data: Vec::new(),
        })
        .await?;
        self.offset = 0;
        self.acked = 0;
        if let Some(arrival) = &mut self.arrival {
            arrival.restart();
        }
        Ok(())
    }

    /// Append `data` at the current offset.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        self.pending.extend_from_slice(data);
        self.offset += data.len() as u64;
        let size = message_size(self.open.now());
        while self.pending.len() >= size {
            let rest = self.pending.split_off(size);
            let message = std::mem::replace(&mut self.pending, rest);
            self.send_data(message).await?;
        }
        Ok(())
    }

    /// Send what is gathered and wait until containerd confirmed all of it.
    pub async fn flush(&mut self) -> Result<(), StoreError> {
        if !self.pending.is_empty() {
            let message = std::mem::take(&mut self.pending);
            self.send_data(message).await?;
        }
        self.drain(0).await?;
        if self.acked != self.offset {
            return Err(StoreError::Write {
                what: self.what.clone(),
                detail: format!(
                    "containerd holds {} bytes, expected {}",
                    self.acked, self.offset
                ),
            });
        }
        Ok(())
    }

    async fn send_data(&mut self, data: Vec<u8>) -> Result<(), StoreError> {
        let at = self.offset - (self.pending.len() + data.len()) as u64;
        self.ingest
            .send(IngestMessage::Write { offset: at, data })
            .await
            .map_err(|()| StoreError::Lost {
                what: self.what.clone(),
            })?;
        self.in_flight += 1;
        self.drain(WRITES_IN_FLIGHT).await
    }

    /// Read acknowledgements until at most `left` messages are unacknowledged.
    async fn drain(&mut self, left: usize) -> Result<(), StoreError> {
        while self.in_flight > left {
            let offset = next_response(self.ingest.as_mut(), &self.what).await?;
            self.in_flight -= 1;
            self.acked = offset;
            if let Some(arrival) = &self.arrival {
                arrival.held(self.acked);
            }
        }
        Ok(())
    }

    /// Verify and commit; containerd checks size and digest. `AlreadyExists` (another
    /// pull finished the same blob) counts as success.
    pub async fn commit(&mut self, labels: HashMap<String, String>) -> Result<(), StoreError> {
        self.flush().await?;
        let request = IngestMessage::Commit {
            total: self.size,
            offset: self.offset,
            expected: self.digest.clone(),
            labels,
        };
        let committed = match self.send(request).await {
            Ok(_) => Ok(()),
            Err(StoreError::Write { detail, .. }) if detail.starts_with("AlreadyExists") => Ok(()),
            Err(StoreError::Write { detail, .. })
                if detail.contains("unexpected commit digest")
                    || detail.contains("digest") && detail.contains("FailedPrecondition") =>
            {
                Err(StoreError::DigestMismatch {
                    digest: self.digest.clone(),
                })
            }
            Err(e) => Err(e),
        };
        if committed.is_ok()
            && let Some(arrival) = &self.arrival
        {
            arrival.committed();
        }
        committed
    }

    async fn send(&mut self, message: IngestMessage) -> Result<u64, StoreError> {
        self.ingest
            .send(message)
            .await
            .map_err(|()| StoreError::Lost {
                what: self.what.clone(),
            })?;
        next_response(self.ingest.as_mut(), &self.what).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_share_the_message_budget_within_bounds() {
        assert_eq!(message_size(0), WRITE_CHUNK_MAX);
        assert_eq!(message_size(1), WRITE_CHUNK_MAX);
        assert_eq!(message_size(2), WRITE_CHUNK_MAX);
        assert_eq!(message_size(4), 512 << 10);
        assert_eq!(message_size(8), WRITE_CHUNK_MIN);
        assert_eq!(message_size(1000), WRITE_CHUNK_MIN);
        let open = Presence::default();
        let writers: Vec<_> = (0..4).map(|_| open.enter()).collect();
        assert_eq!(message_size(writers[0].now()), 512 << 10);
    }
}
