//! The containerd side of a pull: a lease that keeps everything safe from garbage
//! collection until the image record exists, content ingestion (through `Content.Write`,
//! resumable under a stable ingest ref, or for big blobs straight into the content store:
//! [`direct`]), content labels, and image records.

pub mod direct;
mod writer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rigger_runtime::{CallError, describe_status};

use self::direct::{DirectContent, digest_hex};
pub use self::writer::BlobWriter;
use crate::containerd::{Containerd, Descriptor, ImageRecord, LeaseResource, Scope};
use crate::presence::Presence;

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
/// Blobs this big or bigger are written straight into the content store when it can be
/// (smaller ones: containerd's cost per blob is not in their bytes).
pub const DIRECT_MIN_SIZE: u64 = 1 << 20;
/// How long a writer waits, at most, for another process's ingest of the same blob.
const LOCKED_WAIT: Duration = Duration::from_secs(300);

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
    /// Another process writes the blob beside containerd's store now (as containerd's
    /// ingest lock says for a write through its API): worth waiting for.
    #[error("{what}: another process writes it beside containerd's store")]
    Busy { what: String },
}

/// What a pull opened: ingest refs, and blobs written beside the store.
#[derive(Debug, Default)]
struct Opened {
    ingests: std::collections::BTreeSet<String>,
    direct: std::collections::BTreeSet<String>,
}

/// What a direct write of a blob found.
enum Opening {
    /// Its file, locked by this process.
    Ours(direct::Incoming),
    /// containerd's store holds the blob already (in some namespace).
    InTheStore,
    /// Another process writes it now.
    Held,
}

/// containerd access for one pull: namespace plus lease on every request.
#[derive(Debug, Clone)]
pub struct Store {
    containerd: Arc<dyn Containerd>,
    namespace: String,
    lease: Option<String>,
    /// Ingest refs this pull opened, and the blobs (hex) it wrote beside the store:
    /// what `abort_opened` frees when the disk is full.
    opened: Arc<std::sync::Mutex<Opened>>,
    /// Blob writers of this pull open now: they share [`WRITE_BUDGET`].
    writers: Presence,
    /// containerd's content root, when big blobs are written into it directly.
    direct: Option<Arc<DirectContent>>,
}

impl Store {
    pub fn new(containerd: Arc<dyn Containerd>, namespace: &str) -> Self {
        Self {
            containerd,
            namespace: namespace.to_owned(),
            lease: None,
            opened: std::sync::Arc::default(),
            writers: Presence::default(),
            direct: None,
        }
    }

    /// Write big blobs straight into `content` (containerd's content root).
    #[must_use]
    pub fn writing_into(mut self, content: Option<Arc<DirectContent>>) -> Self {
        self.direct = content;
        self
    }

    /// Abort every ingest this pull opened (partial downloads containerd holds): used
    /// when the disk is full, where keeping them to resume would keep the node full.
    /// Returns how many were aborted.
    pub async fn abort_opened(&self) -> usize {
        let (ingests, direct): (Vec<String>, Vec<String>) = match self.opened.lock() {
            Ok(opened) => (
                opened.ingests.iter().cloned().collect(),
                opened.direct.iter().cloned().collect(),
            ),
            Err(_) => return 0,
        };
        let mut aborted = 0;
        if let Some(content) = self.direct.clone() {
            let removed = tokio::task::spawn_blocking(move || {
                direct
                    .iter()
                    .filter(|hex| match content.discard(hex) {
                        Ok(removed) => removed,
                        Err(error) => {
                            tracing::warn!(blob = %hex, %error, "could not remove the blob's file");
                            false
                        }
                    })
                    .count()
            })
            .await;
            aborted += removed.unwrap_or(0);
        }
        for reference in ingests {
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
            // Signal 0 probes without signalling. Only "no such process" means gone: a
            // refusal (EPERM, a process of another user now has the pid) is someone's,
            // so the lease is kept, and the agent needs no CAP_KILL to ask.
            let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
            if !gone {
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

    /// Open (or resume) a write of the blob `digest` of `size` bytes: straight into the
    /// content store when it is big and this process can, else the ingest `reference`.
    pub async fn open_writer(
        &self,
        reference: &str,
        digest: &str,
        size: u64,
    ) -> Result<BlobWriter, StoreError> {
        // Asked per blob: pulls under way see a pause that started after they did.
        if size >= DIRECT_MIN_SIZE
            && let Some(content) = &self.direct
            && content.in_use()
            && let Some(hex) = digest_hex(digest).map(str::to_owned)
        {
            let opening = content.clone();
            let incoming = tokio::task::spawn_blocking(move || {
                // A blob the store holds (for another namespace) is recorded through
                // the ingest, which answers at once that it holds all of it.
                match opening.holds(&hex) {
                    true => Ok(Opening::InTheStore),
                    false => opening.incoming(&hex, size).map(|incoming| match incoming {
                        // Stored by another process between the look and the lock.
                        Some(_) if opening.holds(&hex) => Opening::InTheStore,
                        Some(incoming) => Opening::Ours(incoming),
                        None => Opening::Held,
                    }),
                }
            })
            .await;
            match incoming {
                Ok(Ok(Opening::Ours(incoming))) => {
                    if let Ok(mut opened) = self.opened.lock() {
                        opened.direct.insert(incoming.hex().to_owned());
                    }
                    return Ok(BlobWriter::direct(
                        self.clone(),
                        content.clone(),
                        incoming,
                        reference,
                        digest,
                        size,
                        self.writers.enter(),
                    ));
                }
                Ok(Ok(Opening::InTheStore)) => {}
                // Another process writes it now: waited for as containerd's ingest lock
                // is (`open_writer_waiting`).
                Ok(Ok(Opening::Held)) => {
                    return Err(StoreError::Busy {
                        what: format!("write {digest}"),
                    });
                }
                Ok(Err(error)) => {
                    tracing::warn!(%digest, %error, "cannot write the blob beside containerd's store; writing it through Content.Write");
                }
                Err(error) => {
                    tracing::warn!(%digest, %error, "cannot write the blob beside containerd's store")
                }
            }
        }
        self.open_ingest(reference, digest, size).await
    }

    /// Open (or resume) the ingest `reference` for a blob of `size` bytes and `digest`.
    pub async fn open_ingest(
        &self,
        reference: &str,
        digest: &str,
        size: u64,
    ) -> Result<BlobWriter, StoreError> {
        let what = format!("write {digest}");
        if let Ok(mut opened) = self.opened.lock() {
            opened.ingests.insert(reference.to_owned());
        }
        let mut ingest = self
            .containerd
            .ingest_open(self.scope(), reference, size, digest)
            .await
            .map_err(|s| CallError::new("content write", s))?;
        let offset = writer::next_response(ingest.as_mut(), &what).await?;
        Ok(BlobWriter::through_ingest(
            ingest,
            reference,
            digest,
            size,
            offset,
            self.writers.enter(),
        ))
    }

    /// [`Self::open_writer`] (`direct`) or [`Self::open_ingest`]; if another process (a
    /// concurrent `ctr pull`) holds the ingest's lock, wait for it to finish or give up
    /// the lock. `None` when the blob appeared in the store while we waited (another
    /// pull, ours or containerd's, fetched it): then there is nothing to write.
    pub async fn open_writer_waiting(
        &self,
        reference: &str,
        digest: &str,
        size: u64,
        direct: bool,
    ) -> Result<Option<BlobWriter>, StoreError> {
        let deadline = tokio::time::Instant::now() + LOCKED_WAIT;
        loop {
            let opened = match direct {
                true => self.open_writer(reference, digest, size).await,
                false => self.open_ingest(reference, digest, size).await,
            };
            match opened {
                Ok(writer) => return Ok(Some(writer)),
                // Committed by a concurrent pull between our look and the open.
                Err(StoreError::Call(call)) if call.status.code() == tonic::Code::AlreadyExists => {
                    return Ok(None);
                }
                Err(e) if e.to_string().contains("AlreadyExists") => return Ok(None),
                Err(e) => {
                    let text = e.to_string();
                    let busy = matches!(e, StoreError::Busy { .. })
                        || text.contains("locked")
                        || text.contains("Unavailable");
                    if busy && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if self.blob_labels(digest).await?.is_some() {
                            return Ok(None);
                        }
                        continue;
                    }
                    return Err(e);
                }
            }
        }
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
            Self::Write { .. } | Self::DigestMismatch { .. } | Self::Busy { .. } => false,
        }
    }
}
