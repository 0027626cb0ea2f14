//! A blob being written into containerd: through `Content.Write` (an ingest), or, for a
//! big blob when containerd's content root is this process's to see, straight into its
//! store and then committed through the API ([`super::direct`]). The fetch stage sees one
//! writer either way.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use rigger_runtime::describe_status;

use super::direct::{DirectContent, Incoming, digest_hex};
use super::{
    Store, StoreError, WRITE_BUDGET, WRITE_CHUNK_MAX, WRITE_CHUNK_MIN, WRITES_IN_FLIGHT, is_gone,
};
use crate::arriving::{ArrivalGuard, BytesAt};
use crate::containerd::{Ingest, IngestMessage};
use crate::presence::Present;

/// The next offset an ingest's stream confirms.
pub(super) async fn next_response(ingest: &mut dyn Ingest, what: &str) -> Result<u64, StoreError> {
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

/// An open blob write: bytes go in order from `offset()`, then `commit`.
#[derive(Debug)]
pub struct BlobWriter {
    reference: String,
    digest: String,
    size: u64,
    /// Bytes taken by `write` (sent, in flight, gathered or written).
    offset: u64,
    what: String,
    /// Counted among the pull's open writers, which share [`WRITE_BUDGET`].
    open: Present,
    /// Where peers follow this write (a blob the node serves while it arrives).
    arrival: Option<ArrivalGuard>,
    to: Destination,
}

#[derive(Debug)]
enum Destination {
    Ingest(IngestWrite),
    Direct(Box<DirectWrite>),
}

/// Writes through `Content.Write`, gathered into messages of up to [`WRITE_CHUNK_MAX`]
/// and sent without waiting for containerd's acknowledgement of each (at most
/// [`WRITES_IN_FLIGHT`] unacknowledged): a round trip per network read would leave
/// containerd idle between them.
#[derive(Debug)]
struct IngestWrite {
    ingest: Box<dyn Ingest>,
    /// Bytes containerd confirmed.
    acked: u64,
    /// Gathered bytes not sent yet.
    pending: Vec<u8>,
    /// Messages sent and not acknowledged yet.
    in_flight: usize,
}

/// Writes into this agent's file beside containerd's store.
#[derive(Debug)]
struct DirectWrite {
    store: Store,
    content: Arc<DirectContent>,
    /// `None` only while a blocking task holds it (or after that task died).
    incoming: Option<Incoming>,
    /// Gathered pieces not written yet (`offset - written` bytes).
    pending: Vec<Bytes>,
    /// Bytes in the file (what peers may read of it).
    written: u64,
}

/// Bytes per message when `open` writers share [`WRITE_BUDGET`].
fn message_size(open: usize) -> usize {
    (WRITE_BUDGET / open.max(1)).clamp(WRITE_CHUNK_MIN, WRITE_CHUNK_MAX)
}

impl BlobWriter {
    fn new(
        reference: &str,
        digest: &str,
        size: u64,
        offset: u64,
        open: Present,
        to: Destination,
    ) -> Self {
        Self {
            reference: reference.to_owned(),
            digest: digest.to_owned(),
            size,
            offset,
            what: format!("write {digest}"),
            open,
            arrival: None,
            to,
        }
    }

    /// A write through the ingest `ingest`, whose first answer was `offset`.
    pub(super) fn through_ingest(
        ingest: Box<dyn Ingest>,
        reference: &str,
        digest: &str,
        size: u64,
        offset: u64,
        open: Present,
    ) -> Self {
        let to = Destination::Ingest(IngestWrite {
            ingest,
            acked: offset,
            pending: Vec::new(),
            in_flight: 0,
        });
        Self::new(reference, digest, size, offset, open, to)
    }

    /// A write into `incoming`, beside containerd's store.
    pub(super) fn direct(
        store: Store,
        content: Arc<DirectContent>,
        incoming: Incoming,
        reference: &str,
        digest: &str,
        size: u64,
        open: Present,
    ) -> Self {
        let offset = incoming.written();
        let to = Destination::Direct(Box::new(DirectWrite {
            store,
            content,
            written: offset,
            incoming: Some(incoming),
            pending: Vec::new(),
        }));
        Self::new(reference, digest, size, offset, open, to)
    }

    /// Learn again the offset held (after a failed transfer, say): an ingest's stream is
    /// ended and opened anew (containerd keeps the ingest locked until it sees the old
    /// stream end, so that comes first); a direct write's gathered bytes are written.
    pub async fn reopen(&mut self, store: &Store) -> Result<(), StoreError> {
        let ingest = match &mut self.to {
            Destination::Direct(_) => {
                // What is in the file is where the download goes on (a failed write
                // dropped what it did not write).
                let gathered = self.write_gathered().await;
                self.offset = self.acked();
                return gathered;
            }
            Destination::Ingest(write) => write,
        };
        ingest.ingest.close();
        while let Ok(Some(_)) = ingest.ingest.next().await {}
        let arrival = self.arrival.take();
        let ours = ingest.acked;
        *self = store
            .open_ingest(&self.reference, &self.digest, self.size)
            .await?;
        // Announced still only while the ingest holds this write's own bytes: another
        // writer (containerd's own pull of the same layer, say) may have gone on with
        // it meanwhile.
        if let Some(arrival) = arrival
            && self.acked() <= ours
        {
            self.announce(arrival);
        }
        Ok(())
    }

    /// Tell `arrival` how far this write comes, from now on.
    pub fn announce(&mut self, arrival: ArrivalGuard) {
        arrival.held(self.acked());
        self.arrival = Some(arrival);
    }

    /// Where a reader finds the bytes written so far, for [`Self::announce`].
    pub fn bytes_at(&self) -> BytesAt {
        match &self.to {
            Destination::Direct(write) => match write
                .incoming
                .as_ref()
                .map(|incoming| write.content.reader(incoming))
            {
                Some(Ok(file)) => BytesAt::File(Arc::new(file)),
                Some(Err(error)) => {
                    tracing::debug!(%error, "peers cannot follow this blob as it arrives");
                    BytesAt::Nowhere
                }
                None => BytesAt::Nowhere,
            },
            Destination::Ingest(_) => BytesAt::Ingest(self.reference.clone()),
        }
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

    /// Bytes held for sure: confirmed by containerd, or written to the direct file.
    pub fn acked(&self) -> u64 {
        match &self.to {
            Destination::Ingest(write) => write.acked,
            Destination::Direct(write) => write.written,
        }
    }

    /// Start over from byte 0 (the held bytes are unusable, e.g. after a digest mismatch).
    pub async fn truncate(&mut self) -> Result<(), StoreError> {
        match &mut self.to {
            Destination::Ingest(write) => {
                write.pending.clear();
                self.drain(0).await?;
                self.send(IngestMessage::Write {
                    offset: 0,
                    data: Vec::new(),
                })
                .await?;
                if let Destination::Ingest(write) = &mut self.to {
                    write.acked = 0;
                }
            }
            Destination::Direct(write) => {
                write.pending.clear();
                self.with_incoming(Incoming::truncate).await?;
            }
        }
        self.offset = 0;
        if let Some(arrival) = &mut self.arrival {
            arrival.restart();
        }
        Ok(())
    }

    /// Append `data` at the current offset.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), StoreError> {
        match &mut self.to {
            Destination::Direct(_) => self.write_bytes(Bytes::copy_from_slice(data)).await,
            Destination::Ingest(_) => self.write_ingest(data).await,
        }
    }

    async fn write_ingest(&mut self, data: &[u8]) -> Result<(), StoreError> {
        let size = message_size(self.open.now());
        if let Destination::Ingest(write) = &mut self.to {
            write.pending.extend_from_slice(data);
            self.offset += data.len() as u64;
        }
        loop {
            let Destination::Ingest(write) = &mut self.to else {
                return Ok(());
            };
            if write.pending.len() < size {
                return Ok(());
            }
            let rest = write.pending.split_off(size);
            let message = std::mem::replace(&mut write.pending, rest);
            self.send_data(message).await?;
        }
    }

    /// Append `data` at the current offset (a direct write keeps it without a copy).
    pub async fn write_bytes(&mut self, data: Bytes) -> Result<(), StoreError> {
        let Destination::Direct(write) = &mut self.to else {
            return self.write_ingest(&data).await;
        };
        self.offset += data.len() as u64;
        write.pending.push(data);
        // Gathered as an ingest's messages are (one blocking task per append).
        let gathered = self.offset - write.written;
        if gathered >= message_size(self.open.now()) as u64 {
            self.write_gathered().await?;
        }
        Ok(())
    }

    /// Write what is gathered and wait until it is held.
    pub async fn flush(&mut self) -> Result<(), StoreError> {
        if let Destination::Direct(_) = self.to {
            return self.write_gathered().await;
        }
        if let Destination::Ingest(write) = &mut self.to
            && !write.pending.is_empty()
        {
            let message = std::mem::take(&mut write.pending);
            self.send_data(message).await?;
        }
        self.drain(0).await?;
        if self.acked() != self.offset {
            return Err(StoreError::Write {
                what: self.what.clone(),
                detail: format!(
                    "containerd holds {} bytes, expected {}",
                    self.acked(),
                    self.offset
                ),
            });
        }
        Ok(())
    }

    /// Verify and commit. `AlreadyExists` (another pull finished the same blob) counts
    /// as success.
    pub async fn commit(&mut self, labels: HashMap<String, String>) -> Result<(), StoreError> {
        let committed = match self.to {
            Destination::Ingest(_) => self.commit_ingest(labels).await,
            Destination::Direct(_) => self.commit_direct(labels).await,
        };
        if committed.is_ok()
            && let Some(arrival) = &self.arrival
        {
            arrival.committed();
        }
        committed
    }

    /// containerd checks size and digest.
    async fn commit_ingest(&mut self, labels: HashMap<String, String>) -> Result<(), StoreError> {
        self.flush().await?;
        let request = IngestMessage::Commit {
            total: self.size,
            offset: self.offset,
            expected: self.digest.clone(),
            labels,
        };
        match self.send(request).await {
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
        }
    }

    /// This process checks the digest, links the file into containerd's store and has
    /// containerd record it; when containerd does not take the file, its bytes go
    /// through `Content.Write`.
    async fn commit_direct(&mut self, labels: HashMap<String, String>) -> Result<(), StoreError> {
        self.write_gathered().await?;
        let Destination::Direct(write) = &mut self.to else {
            return Ok(());
        };
        let (store, content) = (write.store.clone(), write.content.clone());
        let hex = digest_hex(&self.digest).unwrap_or_default().to_owned();
        let Some(incoming) = &write.incoming else {
            return Err(file_lost(&self.what));
        };
        if incoming.written() != self.size || !incoming.matches(&hex) {
            return Err(StoreError::DigestMismatch {
                digest: self.digest.clone(),
            });
        }
        let publish = content.clone();
        if let Err(error) = self
            .with_incoming(move |incoming| publish.publish(incoming))
            .await
        {
            // Not linked (another filesystem, a policy): containerd takes the bytes
            // through its API instead.
            tracing::warn!(digest = %self.digest, %error, "could not link the blob into containerd's store; writing it through Content.Write");
        }
        let file = self
            .with_incoming(|incoming| incoming.file())
            .await
            .map(Arc::new)?;
        // A digest mismatch here is not the file's (its bytes hash right): containerd
        // checked an ingest of its own under the ref, left by an earlier write. It goes,
        // and the file's bytes go in its place, once.
        for attempt in 0..2 {
            match record(
                &store,
                &content,
                &self.reference,
                &self.digest,
                self.size,
                labels.clone(),
                &file,
            )
            .await
            {
                Err(StoreError::DigestMismatch { .. }) if attempt == 0 => {
                    tracing::warn!(digest = %self.digest, "containerd's ingest of the blob held other bytes; writing it again from the file");
                    match store
                        .containerd()
                        .ingest_abort(store.scope(), &self.reference)
                        .await
                    {
                        Ok(()) => {}
                        Err(status) if status.code() == tonic::Code::NotFound => {}
                        Err(status) => {
                            return Err(StoreError::Write {
                                what: self.what.clone(),
                                detail: describe_status(&status),
                            });
                        }
                    }
                }
                Err(StoreError::DigestMismatch { .. }) => {
                    return Err(StoreError::Write {
                        what: self.what.clone(),
                        detail: "containerd found the blob's checked bytes wrong".to_owned(),
                    });
                }
                recorded => {
                    recorded?;
                    break;
                }
            }
        }
        let remove = content.clone();
        self.with_incoming(move |incoming| remove.remove(incoming.hex()))
            .await
    }

    /// Run `work` on the direct write's file in a blocking task (file I/O and hashing
    /// stay off the runtime's threads).
    async fn with_incoming<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Incoming) -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let what = self.what.clone();
        let Destination::Direct(write) = &mut self.to else {
            return Err(StoreError::Write {
                what,
                detail: "not a direct write".to_owned(),
            });
        };
        let Some(mut incoming) = write.incoming.take() else {
            return Err(file_lost(&what));
        };
        let (incoming, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut incoming);
            (incoming, result)
        })
        .await
        .map_err(|e| StoreError::Write {
            what: what.clone(),
            detail: format!("writing the blob's file: {e}"),
        })?;
        write.written = incoming.written();
        write.incoming = Some(incoming);
        result.map_err(|e| StoreError::Write {
            what,
            detail: format!("the blob's file beside containerd's store: {e}"),
        })
    }

    /// A direct write's gathered pieces, into its file.
    async fn write_gathered(&mut self) -> Result<(), StoreError> {
        let Destination::Direct(write) = &mut self.to else {
            return Ok(());
        };
        if write.pending.is_empty() {
            return Ok(());
        }
        let pieces = std::mem::take(&mut write.pending);
        let appended = self
            .with_incoming(move |incoming| incoming.append(&pieces))
            .await;
        if appended.is_err() {
            // What was not written is dropped: the write goes on from the file's end.
            self.offset = self.acked();
        }
        if let Some(arrival) = &self.arrival {
            arrival.held(self.acked());
        }
        appended
    }

    async fn send_data(&mut self, data: Vec<u8>) -> Result<(), StoreError> {
        let Destination::Ingest(write) = &mut self.to else {
            return Ok(());
        };
        let at = self.offset - (write.pending.len() + data.len()) as u64;
        write
            .ingest
            .send(IngestMessage::Write { offset: at, data })
            .await
            .map_err(|()| StoreError::Lost {
                what: self.what.clone(),
            })?;
        write.in_flight += 1;
        self.drain(WRITES_IN_FLIGHT).await
    }

    /// Read acknowledgements until at most `left` messages are unacknowledged.
    async fn drain(&mut self, left: usize) -> Result<(), StoreError> {
        let Destination::Ingest(write) = &mut self.to else {
            return Ok(());
        };
        while write.in_flight > left {
            let offset = next_response(write.ingest.as_mut(), &self.what).await?;
            write.in_flight -= 1;
            write.acked = offset;
            if let Some(arrival) = &self.arrival {
                arrival.held(offset);
            }
        }
        Ok(())
    }

    async fn send(&mut self, message: IngestMessage) -> Result<u64, StoreError> {
        let Destination::Ingest(write) = &mut self.to else {
            return Err(StoreError::Write {
                what: self.what.clone(),
                detail: "not an ingest".to_owned(),
            });
        };
        write
            .ingest
            .send(message)
            .await
            .map_err(|()| StoreError::Lost {
                what: self.what.clone(),
            })?;
        next_response(write.ingest.as_mut(), &self.what).await
    }
}

/// The direct write's file is gone (a blocking task holding it failed).
fn file_lost(what: &str) -> StoreError {
    StoreError::Write {
        what: what.to_owned(),
        detail: "the blob's file was lost by an earlier failure".to_owned(),
    }
}

/// Have containerd record the blob linked into its store (`file` holds its bytes):
/// an ingest opened for a digest its store holds answers that it holds all of it, and
/// its commit only records the blob in the namespace. When containerd answers less (the
/// link went before it looked: its garbage collection), the bytes go through the
/// ingest from `file`.
async fn record(
    store: &Store,
    content: &DirectContent,
    reference: &str,
    digest: &str,
    size: u64,
    labels: HashMap<String, String>,
    file: &Arc<std::fs::File>,
) -> Result<(), StoreError> {
    let Some(mut writer) = store
        .open_writer_waiting(reference, digest, size, false)
        .await?
    else {
        // In the namespace already (another pull recorded it meanwhile).
        return Ok(());
    };
    if writer.offset() < size {
        tracing::info!(%digest, held = writer.offset(), "containerd did not take the blob written beside its store; writing it through Content.Write");
        content.not_taken();
        if writer.offset() != 0 {
            writer.truncate().await?;
        }
        while writer.offset() < size {
            let (file, at) = (file.clone(), writer.offset());
            let length =
                usize::try_from(size - at).map_or(WRITE_CHUNK_MAX, |l| l.min(WRITE_CHUNK_MAX));
            let piece = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt as _;
                let mut buffer = vec![0; length];
                file.read_exact_at(&mut buffer, at).map(|()| buffer)
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|read| read.map_err(|e| e.to_string()))
            .map_err(|detail| StoreError::Write {
                what: format!("write {digest}"),
                detail: format!("reading the blob's file again: {detail}"),
            })?;
            writer.write_ingest(&piece).await?;
        }
    }
    writer.commit_ingest(labels).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::Presence;

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
