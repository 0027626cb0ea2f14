//! Fetch: blobs from the registry into containerd's ingest, resuming what it holds.
//!
//! One connection first; when it proves slow, it goes on as the first of parallel byte
//! ranges ([`ranges`]) that wait in an on-disk [`spool`] until the ingest reaches them.
//! Bytes go to the content store and, for a layer, to its unpacker at once ([`Sink`]).

pub mod limit;
mod peer;
mod ranges;
mod span;
mod speed;
pub mod spool;
mod stream;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Mutex;

use self::limit::{Connections, RateLimit};
use self::spool::SpoolError;
use self::stream::Probe;
use oci_client::Reference;

use crate::error::PullError;
use crate::options::PullOptions;
use crate::progress::{Progress, ProgressEvent};
use crate::reference::distribution_source;
use crate::registry::Registry;
use crate::stack::unpack::{self, StreamingApply};
use crate::stack::{Stack, StreamPlan};
use crate::store::{BlobWriter, Store, StoreError};

/// Layers smaller than this are not unpacked in a staging snapshot.
const STAGING_MIN_SIZE: u64 = 1 << 20;
/// Range requests running at once, per blob (their bytes wait in the spool, on disk,
/// until containerd's ingest reaches them).
const RANGE_WINDOW: usize = 16;
/// Range data is appended to the spool in pieces of at least this much: few syscalls,
/// and little lost if the agent is killed.
const SPOOL_PIECE: usize = 64 << 10;
/// A single connection slower than this (bytes/s) is supplemented by parallel ranges.
const SLOW_STREAM_RATE: u64 = 48 << 20;
/// How long the agent waits on a single connection's bytes (not its own work, not the
/// rate cap) before judging its speed: long enough that
/// the bytes a connection's buffers gathered while the headers came do not pass for
/// speed (the lab's proxy lets 50 ms of its rate through at once), short because a
/// slow registry's ranges wait for it (100 ms cost ~5 % of a 128 MiB pull at 16 MiB/s
/// per connection).
const PROBE_TIME: Duration = Duration::from_millis(50);

/// What every pull of one engine shares, so the limits are the node's.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    pub(crate) connections: Connections,
    pub(crate) rate: Option<Arc<RateLimit>>,
    /// One fetch per blob at a time in this agent; concurrent pulls wait and reuse it.
    pub(crate) in_flight: Arc<Mutex<HashMap<String, Arc<Mutex<()>>>>>,
    /// Blobs being fetched as parallel ranges now, in all pulls: they share the
    /// connections, which decides how long their requests should be.
    pub(crate) ranging: crate::presence::Presence,
    /// Where the node's peer endpoint follows blobs still being written (`None`: the
    /// node serves no peers).
    pub(crate) arriving: Option<crate::arriving::Arriving>,
    /// The registries' HTTP clients: the pulls share their connections.
    pub(crate) clients: crate::registry::endpoint_client::Clients,
    /// What the pulls learnt of each registry host's speed.
    pub(crate) speeds: speed::HostSpeeds,
}

/// Everything one blob transfer needs, cheap to clone into a task.
#[derive(Clone)]
pub(crate) struct Transfer {
    pub(crate) image: String,
    pub(crate) registry: Arc<Registry>,
    pub(crate) store: Store,
    pub(crate) progress: Arc<dyn Progress>,
    pub(crate) connections: Connections,
    pub(crate) rate: Option<Arc<RateLimit>>,
    pub(crate) in_flight: Arc<Mutex<HashMap<String, Arc<Mutex<()>>>>>,
    /// Blobs fetched as ranges now, node-wide, and the connections they share.
    pub(crate) ranging: crate::presence::Presence,
    pub(crate) max_connections: usize,
    pub(crate) chunk_size: u64,
    pub(crate) attempts: u32,
    pub(crate) source_label: (String, String),
    /// More than one connection allowed: ranges can help a slow single stream.
    pub(crate) parallel: bool,
    /// What the node's pulls learnt of the registry host's speed: after a slow stream,
    /// blobs start with ranges.
    pub(crate) speed: Arc<speed::HostSpeed>,
    pub(crate) spool_dir: PathBuf,
    /// How far this image's layers are unpacked.
    pub(crate) stack: Arc<tokio::sync::watch::Sender<Stack>>,
    /// Nodes to ask for blobs before the registry (a job's plan).
    pub(crate) peers: Option<Arc<crate::peers::Peers>>,
    /// The image's repository: the path peers are asked under.
    pub(crate) repository: String,
    /// Where blobs being written are announced to the node's peer endpoint.
    pub(crate) arriving: Option<crate::arriving::Arriving>,
    /// Free space (percent) a streaming unpack's unverified bytes leave on the snapshot's
    /// filesystem: what the disk guard's threshold leaves.
    pub(crate) unverified_reserve_percent: u64,
}

impl Transfer {
    /// The transfers of one pull of `image`, sharing the engine's node-wide limits.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        image: &str,
        reference: &Reference,
        registry: Arc<Registry>,
        store: &Store,
        progress: Arc<dyn Progress>,
        shared: &Shared,
        options: &PullOptions,
        peers: Option<Arc<crate::peers::Peers>>,
    ) -> Self {
        Self {
            image: image.to_owned(),
            registry,
            store: store.clone(),
            progress,
            connections: shared.connections.clone(),
            rate: shared.rate.clone(),
            in_flight: shared.in_flight.clone(),
            ranging: shared.ranging.clone(),
            max_connections: options.max_connections.max(1),
            chunk_size: options.chunk_size.clamp(1 << 20, 64 << 20),
            attempts: options.attempts.max(1),
            source_label: distribution_source(reference),
            parallel: options.max_connections > 1,
            speed: shared.speeds.of(reference.registry()),
            spool_dir: options.spool_dir.clone(),
            stack: Arc::new(tokio::sync::watch::Sender::new(Stack::default())),
            peers,
            repository: reference.repository().to_owned(),
            arriving: shared.arriving.clone(),
            unverified_reserve_percent: crate::stack::unverified::reserve_percent(
                options.image_fs_threshold_percent,
            ),
        }
    }

    pub(crate) fn exhausted(&self, blob: &str, last: String) -> PullError {
        PullError::Exhausted {
            image: self.image.clone(),
            blob: blob.to_owned(),
            attempts: self.attempts,
            last,
        }
    }

    pub(crate) fn spool_err(&self, source: SpoolError) -> PullError {
        PullError::Spool {
            image: self.image.clone(),
            source,
        }
    }

    /// The blob is in containerd (or its bytes were wrong): its spool is not needed.
    pub(crate) fn remove_spool(&self, digest: &str) {
        if let Err(error) = spool::remove(&self.spool_dir, digest) {
            tracing::warn!(%error, "could not remove a spool");
        }
    }

    pub(crate) fn store_err(&self, source: StoreError) -> PullError {
        PullError::Store {
            image: self.image.clone(),
            source,
        }
    }

    pub(crate) fn labels_with_source(
        &self,
        mut labels: HashMap<String, String>,
        existing: Option<&HashMap<String, String>>,
    ) -> HashMap<String, String> {
        let (key, repo) = &self.source_label;
        let value = match existing.and_then(|l| l.get(key)) {
            Some(have) if have.split(',').any(|r| r == repo) => have.clone(),
            Some(have) => format!("{have},{repo}"),
            None => repo.clone(),
        };
        labels.insert(key.clone(), value);
        labels
    }

    /// A small blob (config) in memory, from the registry; when it cannot be reached,
    /// from the job's peers (checked against its digest).
    pub(crate) async fn fetch_small(&self, digest: &str) -> Result<Vec<u8>, PullError> {
        let mut last = String::new();
        for attempt in 0..self.attempts {
            for i in self.registry.blob_endpoints() {
                let _permit = self.connections.acquire().await;
                match self.registry.fetch_blob(i, digest, None).await {
                    Ok((_, mut body)) => {
                        let mut data = Vec::new();
                        loop {
                            match body.next().await {
                                Ok(Some(piece)) => {
                                    // `limit_rate` is for all downloads, configs too.
                                    if let Some(rate) = &self.rate {
                                        rate.acquire(piece.len()).await;
                                    }
                                    data.extend_from_slice(&piece);
                                    if data.len() as u64 > self.registry.max_document_size() {
                                        return Err(PullError::Image {
                                            image: self.image.clone(),
                                            detail: format!(
                                                "{digest} is bigger than a config may be"
                                            ),
                                        });
                                    }
                                }
                                Ok(None) => return Ok(data),
                                Err(e) => {
                                    last = format!("{}: {e}", self.registry.endpoint_url(i));
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) if !e.is_retryable() => return Err(e.into()),
                    Err(e) => last = e.to_string(),
                }
            }
            if attempt == 0
                && let Some(peers) = &self.peers
                && let Some(document) = peers
                    .document(&self.repository, digest, self.registry.max_document_size())
                    .await
            {
                return Ok(document);
            }
            backoff(attempt, None).await;
        }
        Err(self.exhausted(digest, last))
    }

    /// Store a small blob we already hold (config, manifest, index) with `labels`.
    pub(crate) async fn put_small(
        &self,
        digest: &str,
        data: &[u8],
        labels: HashMap<String, String>,
    ) -> Result<(), StoreError> {
        if let Some(existing) = self.store.blob_labels(digest).await? {
            let labels = self.labels_with_source(labels, Some(&existing));
            return self.store.add_labels(digest, labels).await;
        }
        match self.open_writer_waiting(digest, data.len() as u64).await? {
            Some(mut writer) => {
                if writer.offset() != 0 {
                    writer.truncate().await?;
                }
                writer.write(data).await?;
                writer.commit(self.labels_with_source(labels, None)).await
            }
            // A concurrent pull of the same image stored it: label what it stored.
            None => {
                let existing = self.store.blob_labels(digest).await?;
                let labels = self.labels_with_source(labels, existing.as_ref());
                self.store.add_labels(digest, labels).await
            }
        }
    }

    /// The blob is in the store already: add this image's labels to it.
    async fn mark_present(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
        existing: Option<HashMap<String, String>>,
    ) -> Result<u64, PullError> {
        let existing = match existing {
            Some(existing) => Some(existing),
            None => self
                .store
                .blob_labels(digest)
                .await
                .map_err(|e| self.store_err(e))?,
        };
        let labels = self.labels_with_source(labels, existing.as_ref());
        self.store
            .add_labels(digest, labels)
            .await
            .map_err(|e| self.store_err(e))?;
        self.progress.event(ProgressEvent::BlobDone {
            digest: digest.to_owned(),
            skipped: true,
        });
        Ok(0)
    }

    /// Download a blob into the store (resuming what containerd holds), unpacking it on
    /// the way when `plan` allows. Returns the bytes fetched from the registry.
    pub(crate) async fn fetch_blob(
        &self,
        digest: &str,
        size: u64,
        labels: HashMap<String, String>,
        layer: Option<(StreamPlan, tokio::sync::OwnedSemaphorePermit)>,
    ) -> Result<u64, PullError> {
        let (plan, slot) = layer.unzip();
        // One fetch per blob in this agent: a concurrent pull of the same layer waits here
        // and then finds the blob present.
        let gate = {
            let mut map = self.in_flight.lock().await;
            map.entry(digest.to_owned()).or_default().clone()
        };
        let _turn = gate.lock().await;

        if let Some(existing) = self
            .store
            .blob_labels(digest)
            .await
            .map_err(|e| self.store_err(e))?
        {
            return self.mark_present(digest, labels, Some(existing)).await;
        }
        let Some(mut writer) = self
            .open_writer_waiting(digest, size)
            .await
            .map_err(|e| self.store_err(e))?
        else {
            // Fetched meanwhile by a concurrent pull: only our labels are missing.
            return self.mark_present(digest, labels, None).await;
        };
        // Peers are served a blob while it arrives only when every byte of its ingest is
        // this pull's own: bytes another writer (or a run before a crash) left there are
        // nobody's word until containerd checks the digest, so a resumed blob is served
        // once committed.
        if let Some(arriving) = &self.arriving
            && writer.offset() == 0
        {
            let arrival = self.begin_arrival(arriving, digest, writer.bytes_at(), size);
            writer.announce(arrival);
        }
        let labels = self.labels_with_source(labels, None);
        self.progress.event(ProgressEvent::BlobStarted {
            digest: digest.to_owned(),
            size,
            resumed_from: writer.offset(),
        });
        let mut sink = Sink {
            writer,
            streaming: None,
            store: self.store.clone(),
            fetched: 0,
            fed: 0,
            peer_nodes: Vec::new(),
            broken_peers: Vec::new(),
            relayed_peers: Vec::new(),
        };
        // Unpacking streams along from byte 0 (a resumed download is unpacked from the
        // content store afterwards). Staging costs two more snapshot calls, which small
        // layers do not win back: they wait for their parent and unpack from the store.
        if let Some(plan) = &plan
            && sink.writer.offset() == 0
            && (size >= STAGING_MIN_SIZE || self.stack.borrow().unpacked >= plan.index)
        {
            sink.streaming = self.start_streaming(plan).await;
        }
        let result = self.download(digest, size, labels, &mut sink).await;
        // The download slot goes to the next layer; applying and stacking this one may
        // still take a while.
        drop(slot);
        match (result, sink.streaming.take(), &plan) {
            (Ok(()), Some(streaming), Some(plan)) => {
                // containerd accepted the digest: the bytes are the layer's.
                streaming.verified();
                let account = streaming.account();
                let stopped = || account.as_ref().is_some_and(|a| a.stopped());
                if stopped() {
                    // Its unverified bytes inflated past the bound: the layer unpacks
                    // from the content store (`stack_layer`), verified.
                    tracing::warn!(%digest, "the layer inflated past what unverified bytes may write; unpacking it from the content store instead");
                    streaming.abandon(&self.store).await;
                    return Ok(sink.fetched);
                }
                let mut stack = self.stack.subscribe();
                let below = plan.index;
                let parent_unpacked = async move {
                    stack
                        .wait_for(|s| s.unpacked >= below || s.failed)
                        .await
                        .is_ok_and(|s| !s.failed)
                };
                match streaming
                    .finish(&self.store, digest, &plan.diff_id, parent_unpacked)
                    .await
                {
                    Ok(()) => Ok(sink.fetched),
                    // Stopped by the bound just before the commit: as above.
                    Err(_) if stopped() => Ok(sink.fetched),
                    Err(source) => Err(PullError::Unpack {
                        image: self.image.clone(),
                        source,
                    }),
                }
            }
            (Ok(()), _, _) => Ok(sink.fetched),
            (Err(e), streaming, _) => {
                if let Some(streaming) = streaming {
                    streaming.abandon(&self.store).await;
                }
                Err(e)
            }
        }
    }

    /// Fetch until containerd holds the whole blob and accepts its digest.
    async fn download(
        &self,
        digest: &str,
        size: u64,
        labels: HashMap<String, String>,
        sink: &mut Sink,
    ) -> Result<(), PullError> {
        let mut last = String::new();
        let mut ranges_supported = true;
        if let peer::FromPeers::Committed =
            self.fetch_from_peers(digest, size, &labels, sink).await?
        {
            return Ok(());
        }
        for attempt in 0..self.attempts {
            let start = sink.writer.offset();
            let outcome = if start >= size {
                Ok(())
            } else {
                // One connection first: on a fast registry it is all we need, and ranges only
                // cost CPU. When it proves slow, it goes on as the first of parallel ranges
                // for the rest; once a blob found the host slow, the node's others start
                // with ranges. So does a blob an interrupted pull left ranges of.
                let ranged =
                    ranges_supported && self.parallel && size - start > 2 * self.chunk_size;
                let first = if !ranged {
                    self.fetch_stream(digest, size, sink, Probe::Off).await
                } else if spool::exists(&self.spool_dir, digest)
                    || self.speed.verdict() == speed::Verdict::Slow
                {
                    Ok(StreamEnd::Ranges(None))
                } else {
                    self.fetch_stream(digest, size, sink, Probe::Judged).await
                };
                match first {
                    Ok(StreamEnd::Complete) => Ok(()),
                    Ok(StreamEnd::Ranges(open)) => {
                        match self.fetch_ranges(digest, size, sink, open).await {
                            Err(RangeOutcome::Ignored) => {
                                ranges_supported = false;
                                self.remove_spool(digest);
                                self.fetch_stream(digest, size, sink, Probe::Off)
                                    .await
                                    .map(drop)
                            }
                            Err(RangeOutcome::Failed(e)) => Err(e),
                            Ok(()) => Ok(()),
                        }
                    }
                    Err(e) => Err(e),
                }
            };
            match outcome {
                Ok(()) => {
                    match sink.writer.commit(labels.clone()).await {
                        Ok(()) => {
                            self.remove_spool(digest);
                            self.progress.event(ProgressEvent::BlobDone {
                                digest: digest.to_owned(),
                                skipped: false,
                            });
                            return Ok(());
                        }
                        Err(StoreError::DigestMismatch { .. }) => {
                            // The bytes are wrong: start over (maybe from another host).
                            last = format!("{digest}: content does not match its digest");
                            tracing::warn!(%digest, "digest mismatch; downloading again");
                            if let Some(peers) = &self.peers {
                                peers.blame(
                                    &sink.peer_nodes,
                                    &sink.broken_peers,
                                    &sink.relayed_peers,
                                );
                            }
                            self.restart_blob(digest, sink).await?;
                        }
                        Err(e) if e.is_connection_lost() => {
                            last = e.to_string();
                            self.resume_after_containerd(digest, sink).await?;
                        }
                        Err(e) => return Err(self.store_err(e)),
                    }
                }
                Err(PullError::Store { source, .. }) if source.is_connection_lost() => {
                    last = source.to_string();
                    self.resume_after_containerd(digest, sink).await?;
                }
                Err(e) => {
                    if let PullError::Registry(re) = &e {
                        if !re.is_retryable() {
                            return Err(e);
                        }
                        last = re.to_string();
                        // What arrived before the failure is good: store it all, then
                        // reopen the writer to learn the offset containerd really holds.
                        if let Err(error) = sink.writer.flush().await {
                            tracing::debug!(%error, "could not store the bytes before a failure");
                        }
                        self.stalled(digest, &format!("retrying after: {re}"));
                        backoff(attempt, re.retry_after()).await;
                        sink.writer
                            .reopen(&self.store)
                            .await
                            .map_err(|e| self.store_err(e))?;
                        self.resumed(digest, sink.writer.offset());
                        if sink.writer.offset() != sink.fed {
                            sink.drop_streaming(&self.store).await;
                        }
                        continue;
                    }
                    return Err(e);
                }
            }
        }
        Err(self.exhausted(digest, last))
    }

    /// The blob's bytes were wrong: drop them (ingest, spool, the unpack under way) and
    /// start again from byte 0.
    async fn restart_blob(&self, digest: &str, sink: &mut Sink) -> Result<(), PullError> {
        self.stalled(
            digest,
            "content did not match its digest; downloading it again",
        );
        self.remove_spool(digest);
        sink.drop_streaming(&self.store).await;
        sink.peer_nodes.clear();
        sink.broken_peers.clear();
        sink.relayed_peers.clear();
        sink.writer
            .reopen(&self.store)
            .await
            .map_err(|e| self.store_err(e))?;
        if sink.writer.offset() != 0 {
            sink.writer
                .truncate()
                .await
                .map_err(|e| self.store_err(e))?;
        }
        // From byte 0 again, every byte this pull's own: peers may follow it anew.
        if let Some(arriving) = &self.arriving
            && sink.writer.offset() == 0
            && !sink.writer.announced()
        {
            let size = sink.writer.size();
            let arrival = self.begin_arrival(arriving, digest, sink.writer.bytes_at(), size);
            sink.writer.announce(arrival);
        }
        self.resumed(digest, sink.writer.offset());
        Ok(())
    }

    /// Announce a write of `digest` from byte 0. When this pull has peers, their bytes
    /// may go into it: that is said before any is written, so no answer that began
    /// earlier passes them on as this node's own.
    fn begin_arrival(
        &self,
        arriving: &crate::arriving::Arriving,
        digest: &str,
        bytes_at: crate::arriving::BytesAt,
        size: u64,
    ) -> crate::arriving::ArrivalGuard {
        let arrival = arriving.begin(digest, bytes_at, size, 0);
        if self.peers.is_some() {
            arrival.relaying();
        }
        arrival
    }

    fn stalled(&self, digest: &str, reason: &str) {
        self.progress.event(ProgressEvent::BlobStalled {
            digest: digest.to_owned(),
            reason: reason.to_owned(),
        });
    }

    fn resumed(&self, digest: &str, offset: u64) {
        self.progress.event(ProgressEvent::BlobResumed {
            digest: digest.to_owned(),
            offset,
        });
    }

    /// containerd went away mid-write (a restart, an upgrade): wait for it to answer
    /// again (up to [`CONTAINERD_RETURN`]), reopen the ingest at the offset it kept and
    /// go on from there.
    async fn resume_after_containerd(
        &self,
        digest: &str,
        sink: &mut Sink,
    ) -> Result<(), PullError> {
        tracing::warn!(%digest, "containerd went away mid-write; waiting for it to resume");
        self.stalled(
            digest,
            &format!(
                "containerd went away; waiting up to {} for it to come back",
                humantime::format_duration(CONTAINERD_RETURN)
            ),
        );
        let deadline = tokio::time::Instant::now() + CONTAINERD_RETURN;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match sink.writer.reopen(&self.store).await {
                Ok(()) => break,
                Err(e) if e.is_connection_lost() && tokio::time::Instant::now() < deadline => {}
                Err(e) => return Err(self.store_err(e)),
            }
        }
        tracing::info!(%digest, offset = sink.writer.offset(), "containerd is back; resuming the blob");
        self.resumed(digest, sink.writer.offset());
        if sink.writer.offset() != sink.fed {
            sink.drop_streaming(&self.store).await;
        }
        Ok(())
    }

    /// The blob's writer (see [`Store::open_writer_waiting`]).
    async fn open_writer_waiting(
        &self,
        digest: &str,
        size: u64,
    ) -> Result<Option<BlobWriter>, StoreError> {
        self.store
            .open_writer_waiting(&ingest_ref(digest), digest, size, true)
            .await
    }
}

/// Where downloaded bytes go: containerd's ingest, and the unpacker when streaming.
struct Sink {
    writer: BlobWriter,
    streaming: Option<StreamingApply>,
    /// Where a streaming unpack's snapshot is removed from.
    store: Store,
    /// Bytes fetched from registries in this run (not what an earlier run spooled).
    fetched: u64,
    /// Bytes handed to the unpacker (equals the ingest offset while streaming works).
    fed: u64,
    /// Peers whose bytes are in the ingest now: suspected if the digest does not match.
    peer_nodes: Vec<String>,
    /// Of those, the ones whose answer ended before the blob did (a broken stream, too
    /// slow): left for the pull when the blob turns out wrong.
    broken_peers: Vec<String>,
    /// Of those, the ones that said they relayed another node's bytes.
    relayed_peers: Vec<String>,
}

impl Sink {
    /// Store and unpack at once: the unpacker works while containerd writes.
    async fn write(&mut self, bytes: Bytes) -> Result<(), StoreError> {
        let Self {
            writer,
            streaming,
            fed,
            ..
        } = self;
        let feed = async {
            if let Some(streaming) = streaming {
                *fed += streaming.feed(bytes.clone()).await;
            }
        };
        let (written, ()) = tokio::join!(writer.write_bytes(bytes.clone()), feed);
        // Unverified bytes inflated past their bound: what they wrote goes now, not when
        // the download ends (a peer could take its time), and the layer unpacks from
        // the content store once verified.
        if self
            .streaming
            .as_ref()
            .and_then(StreamingApply::account)
            .is_some_and(|a| a.stopped())
        {
            self.drop_streaming_now().await;
        }
        written
    }

    async fn drop_streaming_now(&mut self) {
        let store = self.store.clone();
        self.drop_streaming(&store).await;
    }

    async fn drop_streaming(&mut self, store: &Store) {
        if let Some(streaming) = self.streaming.take() {
            streaming.abandon(store).await;
        }
    }
}

/// How a single stream ended.
enum StreamEnd {
    Complete,
    /// The rest comes as ranges: slower than [`SLOW_STREAM_RATE`] (the stream, still
    /// open, goes on as the first of them), or a blob started as ranges.
    Ranges(Option<OpenStream>),
}

/// A blob's stream found slow, still open.
struct OpenStream {
    /// The registry endpoint answering it.
    endpoint: usize,
    /// The blob's byte its body goes on with.
    at: u64,
    body: crate::registry::BlobBody,
    /// The node's connection it holds.
    connection: Option<tokio::sync::OwnedSemaphorePermit>,
}

enum RangeOutcome {
    /// The server answered a range request with the whole blob.
    Ignored,
    Failed(PullError),
}

impl From<PullError> for RangeOutcome {
    fn from(e: PullError) -> Self {
        Self::Failed(e)
    }
}

/// How long a pull waits for a containerd that went away mid-write to come back.
const CONTAINERD_RETURN: Duration = Duration::from_secs(60);

/// containerd's ingest ref for a blob (remotes.MakeRefKey), so concurrent pulls by
/// containerd and Rigger of the same blob share one ingest and its lock. (A blob written
/// beside the store takes that lock only to be recorded: a containerd pull of the same
/// layer meanwhile downloads it too, and the first commit stands.)
fn ingest_ref(digest: &str) -> String {
    format!("layer-{digest}")
}

async fn backoff(attempt: u32, retry_after: Option<Duration>) {
    let exponential =
        Duration::from_millis(200).saturating_mul(2u32.saturating_pow(attempt.min(8)));
    let delay = retry_after
        .unwrap_or(exponential)
        .min(Duration::from_secs(60));
    tokio::time::sleep(delay.mul_f64(0.75 + fastrand::f64() / 2.0)).await;
}

impl Transfer {
    /// Layers `0..=index` are in the snapshotter.
    pub(crate) fn mark_unpacked(&self, index: usize) {
        self.stack.send_if_modified(|s| {
            let changed = s.unpacked < index + 1;
            s.unpacked = s.unpacked.max(index + 1);
            changed
        });
    }

    /// A layer failed: the ones above it will never be stacked.
    pub(crate) fn mark_failed(&self) {
        self.stack.send_modify(|s| s.failed = true);
    }

    /// Unpack while downloading: onto the parent when it is unpacked, else staged.
    pub(crate) async fn start_streaming(&self, plan: &StreamPlan) -> Option<StreamingApply> {
        let done = unpack::is_unpacked(&self.store, &plan.snapshotter, &plan.chain_id)
            .await
            .unwrap_or(true);
        if done {
            return None;
        }
        let parent_ready = self.stack.borrow().unpacked >= plan.index;
        match StreamingApply::start(
            &self.store,
            &plan.snapshotter,
            plan.parent.as_deref(),
            parent_ready,
            &plan.chain_id,
            plan.compression,
            self.unverified_reserve_percent,
        )
        .await
        {
            Ok(streaming) => streaming,
            Err(error) => {
                tracing::debug!(%error, "unpacking after the download instead");
                None
            }
        }
    }
}
