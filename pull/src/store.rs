//! The containerd side of a pull: a lease that keeps everything safe from garbage
//! collection until the image record exists, content ingestion through `Content.Write`
//! (resumable under a stable ingest ref), content labels, and image records.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use containerd_client::services::v1::content_client::ContentClient;
use containerd_client::services::v1::images_client::ImagesClient;
use containerd_client::services::v1::leases_client::LeasesClient;
use containerd_client::services::v1::{
    CreateImageRequest, CreateRequest, DeleteRequest, Image, InfoRequest, UpdateImageRequest,
    UpdateRequest, WriteAction, WriteContentRequest, WriteContentResponse,
};
use containerd_client::types::Descriptor as ContainerdDescriptor;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};

use rigger_runtime::{CallError, Runtime, describe_status};

use crate::arriving::ArrivalGuard;
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
    channel: Channel,
    namespace: String,
    lease: Option<String>,
    /// Ingest refs this pull opened: what `abort_opened` frees when the disk is full.
    opened: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// Blob writers of this pull open now: they share [`WRITE_BUDGET`].
    writers: Presence,
}

impl Store {
    pub fn new(runtime: &Runtime, namespace: &str) -> Self {
        Self {
            channel: runtime.channel(),
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
            let request = containerd_client::services::v1::AbortRequest {
                r#ref: reference.clone(),
            };
            let Ok(request) = self.request(request) else {
                continue;
            };
            match ContentClient::new(self.channel()).abort(request).await {
                Ok(_) => aborted += 1,
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

    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A request carrying our namespace (and lease, once taken).
    pub(crate) fn request<T>(&self, message: T) -> Result<Request<T>, Status> {
        let mut request = rigger_runtime::namespaced(message, &self.namespace)?;
        if let Some(lease) = &self.lease {
            let value = lease
                .parse()
                .map_err(|_| Status::invalid_argument("invalid lease id"))?;
            request.metadata_mut().insert("containerd-lease", value);
        }
        Ok(request)
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
        let request = self
            .request(CreateRequest {
                id: id.clone(),
                labels: HashMap::from([("containerd.io/gc.expire".to_owned(), expire)]),
            })
            .map_err(|s| CallError::new("create lease", s))?;
        LeasesClient::new(self.channel())
            .create(request)
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
        use containerd_client::services::v1::{
            DeleteResourceRequest, ListRequest, ListResourcesRequest,
        };
        let request = rigger_runtime::namespaced(ListRequest { filters: vec![] }, &self.namespace)
            .map_err(|s| CallError::new("list leases", s))?;
        let leases = LeasesClient::new(self.channel())
            .list(request)
            .await
            .map_err(|s| CallError::new("list leases", s))?
            .into_inner()
            .leases;
        for lease in leases {
            let Some(pid) = lease
                .id
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
            let request = rigger_runtime::namespaced(
                ListResourcesRequest {
                    id: lease.id.clone(),
                },
                &self.namespace,
            )
            .map_err(|s| CallError::new("list lease resources", s))?;
            let resources = LeasesClient::new(self.channel())
                .list_resources(request)
                .await
                .map_err(|s| CallError::new("list lease resources", s))?
                .into_inner()
                .resources;
            for resource in resources
                .into_iter()
                .filter(|r| r.r#type.starts_with("snapshots/"))
            {
                tracing::info!(lease = %lease.id, snapshot = %resource.id, "releasing a snapshot of an interrupted pull");
                let request = rigger_runtime::namespaced(
                    DeleteResourceRequest {
                        id: lease.id.clone(),
                        resource: Some(resource),
                    },
                    &self.namespace,
                )
                .map_err(|s| CallError::new("release lease resource", s))?;
                if let Err(status) = LeasesClient::new(self.channel())
                    .delete_resource(request)
                    .await
                {
                    tracing::warn!(lease = %lease.id, error = %describe_status(&status), "could not release a snapshot");
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
        let request =
            rigger_runtime::namespaced(DeleteRequest { id, sync: false }, &self.namespace)
                .map_err(|s| CallError::new("delete lease", s))?;
        LeasesClient::new(self.channel())
            .delete(request)
            .await
            .map_err(|s| CallError::new("delete lease", s))?;
        Ok(())
    }

    /// Labels of a blob already in the content store; `None` if it is not there.
    pub async fn blob_labels(
        &self,
        digest: &str,
    ) -> Result<Option<HashMap<String, String>>, StoreError> {
        let request = self
            .request(InfoRequest {
                digest: digest.to_owned(),
            })
            .map_err(|s| CallError::new("content info", s))?;
        match ContentClient::new(self.channel()).info(request).await {
            Ok(response) => Ok(Some(
                response
                    .into_inner()
                    .info
                    .map(|i| i.labels)
                    .unwrap_or_default(),
            )),
            Err(status) if status.code() == Code::NotFound => Ok(None),
            Err(status) => Err(CallError::new("content info", status).into()),
        }
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
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        let request = self
            .request(UpdateRequest {
                info: Some(containerd_client::services::v1::Info {
                    digest: digest.to_owned(),
                    labels,
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask { paths }),
            })
            .map_err(|s| CallError::new("content update", s))?;
        ContentClient::new(self.channel())
            .update(request)
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
        let (tx, rx) = mpsc::channel::<WriteContentRequest>(16);
        let stat = WriteContentRequest {
            action: WriteAction::Stat as i32,
            r#ref: reference.to_owned(),
            total: i64::try_from(size).unwrap_or(i64::MAX),
            expected: digest.to_owned(),
            ..Default::default()
        };
        tx.send(stat)
            .await
            .map_err(|_| StoreError::Lost { what: what.clone() })?;
        let request = self
            .request(ReceiverStream::new(rx))
            .map_err(|s| CallError::new("content write", s))?;
        let mut responses = ContentClient::new(self.channel())
            .write(request)
            .await
            .map_err(|s| CallError::new("content write", s))?
            .into_inner();
        let status = next_response(&mut responses, &what).await?;
        let offset = u64::try_from(status.offset).unwrap_or(0);
        Ok(BlobWriter {
            tx,
            responses,
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
        target: &ContainerdDescriptor,
        labels: &HashMap<String, String>,
    ) -> Result<(), StoreError> {
        let image = Image {
            name: name.to_owned(),
            labels: labels.clone(),
            target: Some(target.clone()),
            created_at: None,
            updated_at: None,
        };
        let create = self
            .request(CreateImageRequest {
                image: Some(image.clone()),
                source_date_epoch: None,
            })
            .map_err(|s| CallError::new("create image", s))?;
        match ImagesClient::new(self.channel()).create(create).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::AlreadyExists => {
                let update = self
                    .request(UpdateImageRequest {
                        image: Some(image),
                        update_mask: None,
                        source_date_epoch: None,
                    })
                    .map_err(|s| CallError::new("update image", s))?;
                ImagesClient::new(self.channel())
                    .update(update)
                    .await
                    .map_err(|s| CallError::new("update image", s))?;
                Ok(())
            }
            Err(status) => Err(CallError::new("create image", status).into()),
        }
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

async fn next_response(
    responses: &mut Streaming<WriteContentResponse>,
    what: &str,
) -> Result<WriteContentResponse, StoreError> {
    match responses.message().await {
        Ok(Some(r)) => Ok(r),
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
    tx: mpsc::Sender<WriteContentRequest>,
    responses: Streaming<WriteContentResponse>,
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
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.tx, closed));
        while let Ok(Some(_)) = self.responses.message().await {}
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

    /// Bytes another node sent are about to go into this write: whoever reads it while
    /// it arrives is told the bytes are relayed (a relay is not their author).
    pub fn relaying(&self) {
        if let Some(arrival) = &self.arrival {
            arrival.relaying();
        }
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
        self.send(WriteContentRequest {
            action: WriteAction::Write as i32,
            r#ref: self.reference.clone(),
            offset: 0,
            ..Default::default()
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
        let request = WriteContentRequest {
            action: WriteAction::Write as i32,
            r#ref: self.reference.clone(),
            offset: i64::try_from(at).unwrap_or(i64::MAX),
            data,
            ..Default::default()
        };
        self.tx.send(request).await.map_err(|_| StoreError::Lost {
            what: self.what.clone(),
        })?;
        self.in_flight += 1;
        self.drain(WRITES_IN_FLIGHT).await
    }

    /// Read acknowledgements until at most `left` messages are unacknowledged.
    async fn drain(&mut self, left: usize) -> Result<(), StoreError> {
        while self.in_flight > left {
            let response = next_response(&mut self.responses, &self.what).await?;
            self.in_flight -= 1;
            self.acked = u64::try_from(response.offset).unwrap_or(self.acked);
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
        let request = WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: self.reference.clone(),
            total: i64::try_from(self.size).unwrap_or(i64::MAX),
            expected: self.digest.clone(),
            offset: i64::try_from(self.offset).unwrap_or(i64::MAX),
            labels,
            ..Default::default()
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

    async fn send(
        &mut self,
        request: WriteContentRequest,
    ) -> Result<WriteContentResponse, StoreError> {
        self.tx.send(request).await.map_err(|_| StoreError::Lost {
            what: self.what.clone(),
        })?;
        next_response(&mut self.responses, &self.what).await
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
