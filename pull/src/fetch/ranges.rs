//! Parallel byte ranges through the spool, written to containerd in order.
//!
//! The spool is cut into ranges of the chunk size (its layout, which a resumed pull
//! finds again). Requests ([`Span`]s) cover one range each at first, then more as the
//! download goes on: the first bytes arrive soon and in order (containerd's ingest and
//! the unpack start at once), while a big blob still costs few requests (each costs the
//! registry a lookup: 2 MiB requests of a 128 MiB layer cost the lab's registry 0.38 s of
//! CPU, 8 MiB ones 0.15 s).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc, watch};

use super::span::{AHEAD, Reach, Span, next_span, open_span};
use super::spool::{Spool, SpoolError};
use super::{OpenStream, RANGE_WINDOW, RangeOutcome, SPOOL_PIECE, Sink, Transfer, backoff};
use crate::error::PullError;
use crate::progress::ProgressEvent;

/// How often a blob whose ranges are all requested looks for an idle connection to
/// share its longest request with.
const IDLE_LOOK: Duration = Duration::from_millis(10);

/// What a request brings: the bytes it fetched now.
type SpanResult = Result<u64, RangeOutcome>;

impl Transfer {
    /// Parallel byte ranges from the writer's offset to the end, written to containerd
    /// in order. They wait in the blob's spool, so a killed agent continues each where
    /// its bytes end. [`RANGE_WINDOW`] requests run at once, whatever order they finish
    /// in, none starting more than [`AHEAD`] ranges past the write position. The range
    /// at the write position goes to containerd as its bytes arrive, not when it is
    /// complete. A stream found slow (`open`) is the request for the ranges from the
    /// write position on, shared out as connections come free.
    pub(super) async fn fetch_ranges(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
        open: Option<OpenStream>,
    ) -> Result<(), RangeOutcome> {
        let spool = Spool::open(&self.spool_dir, digest, size, self.chunk_size)
            .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
        let spool = Arc::new(spool);
        let chunk = spool.range_size();
        // The start of the first range is taken as held by containerd: make it so.
        sink.writer
            .flush()
            .await
            .map_err(|e| RangeOutcome::Failed(self.store_err(e)))?;
        let start = sink.writer.offset();
        let first = start / chunk;
        // containerd holds the start of the first range already.
        spool
            .skip_to(first, start - first * chunk)
            .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
        let arrived = Arc::new(Notify::new());
        let (head_tx, head_rx) = watch::channel(first);
        let _ranging = self.ranging.enter();
        let (mut started, _dispatcher) =
            self.dispatch_spans(digest, &spool, first, head_rx, &arrived, open);
        // Ranges containerd confirmed holding leave the spool, in order from here.
        let mut discarded = first;
        // Requests finish in any order; their bytes go to containerd in order.
        while let Some(request) = started.recv().await {
            let mut request = std::pin::pin!(request);
            let fetched = loop {
                tokio::select! {
                    joined = &mut request => break joined.map_err(|e| {
                        RangeOutcome::Failed(PullError::Image {
                            image: self.image.clone(),
                            detail: format!("range task failed: {e}"),
                        })
                    })??,
                    // What arrived at the write position goes to containerd now, not
                    // when its request is complete.
                    () = arrived.notified() => {
                        self.write_arrived(&spool, sink).await?;
                        head_tx.send_replace(sink.writer.offset() / chunk);
                        // A long request (a stream found slow) does not keep what
                        // containerd holds on disk twice until it ends.
                        discard_written(&spool, &mut discarded, sink.writer.acked());
                    }
                }
            };
            sink.fetched += fetched;
            self.write_arrived(&spool, sink).await?;
            head_tx.send_replace(sink.writer.offset() / chunk);
            discard_written(&spool, &mut discarded, sink.writer.acked());
        }
        if sink.writer.offset() < size {
            return Err(RangeOutcome::Failed(PullError::Image {
                image: self.image.clone(),
                detail: format!(
                    "{digest}: range requests ended at byte {} of {size}",
                    sink.writer.offset()
                ),
            }));
        }
        Ok(())
    }

    /// Start requests for ranges `first..` in order, each in its own task, as soon as
    /// one of [`RANGE_WINDOW`] slots is free, independent of how fast containerd takes
    /// the bytes (waiting for the writer left most connections idle). Each is sized by
    /// [`next_span`] for the connections this blob gets now (the node's, shared by the
    /// blobs fetched as ranges). A request starts only within [`AHEAD`] ranges of the
    /// write position (`head`), which bounds the spool on disk. An `open` stream is the
    /// first request, for its share of the ranges ([`open_span`]). The started requests
    /// come out in order; dropping the receiver and the dispatcher cancels them all.
    fn dispatch_spans(
        &self,
        digest: &str,
        spool: &Arc<Spool>,
        first: u64,
        mut head: watch::Receiver<u64>,
        arrived: &Arc<Notify>,
        open: Option<OpenStream>,
    ) -> (
        mpsc::UnboundedReceiver<AbortOnDrop<SpanResult>>,
        AbortOnDrop<()>,
    ) {
        let (started_tx, started) = mpsc::unbounded_channel();
        let window = Arc::new(Semaphore::new(RANGE_WINDOW));
        let transfer = self.clone();
        let digest = digest.to_owned();
        let spool = spool.clone();
        let arrived = arrived.clone();
        let dispatcher = tokio::spawn(async move {
            let ranges = spool.ranges();
            let (mut k, mut issued) = (first, 0);
            // The requests started, while they may still be split.
            let mut live: Vec<Arc<Reach>> = Vec::new();
            // Start a request for `span`, kept among the live ones; false once nobody
            // takes the requests any more.
            let launch = |live: &mut Vec<Arc<Reach>>, span: Span, slot, start| {
                let reach = Arc::new(Reach::new(span));
                live.push(reach.clone());
                let request = transfer.start_span(&digest, &spool, reach, &arrived, slot, start);
                started_tx.send(request).is_ok()
            };
            if let Some(open) = open {
                let span = open_span(first, ranges, transfer.connections.idle());
                let Ok(slot) = window.clone().try_acquire_owned() else {
                    return;
                };
                (k, issued) = (first + span.count, 1);
                if !launch(&mut live, span, slot, Start::Open(open)) {
                    return;
                }
            }
            while k < ranges {
                let Ok(slot) = window.clone().acquire_owned().await else {
                    return;
                };
                let span = next_span(k, ranges, issued, transfer.sharing());
                let near = head.wait_for(|&at| span.first + span.count <= at + AHEAD);
                if near.await.is_err() {
                    return;
                }
                (k, issued) = (k + span.count, issued + 1);
                if !launch(&mut live, span, slot, Start::Fresh) {
                    return;
                }
            }
            // Every range is requested. While the node has a connection nobody waits
            // for, the request with the most untouched ranges shares them with a new
            // one: the blob's end does not wait on one long request.
            loop {
                live.retain(|reach| reach.untouched() > 0);
                let most = live.iter().map(|reach| (reach.untouched(), reach));
                let Some((untouched, longest)) = most.max_by_key(|(untouched, _)| *untouched)
                else {
                    return;
                };
                if untouched < 2 {
                    // Untouched ranges only ever get fewer: nothing left to share.
                    return;
                }
                // The connection is taken here, so one idle connection starts one
                // request, whichever blob sees it first.
                let Some(connection) = transfer.connections.take_idle() else {
                    tokio::time::sleep(IDLE_LOOK).await;
                    continue;
                };
                let slot = match window.clone().try_acquire_owned() {
                    Ok(slot) => slot,
                    Err(TryAcquireError::NoPermits) => {
                        drop(connection);
                        tokio::time::sleep(IDLE_LOOK).await;
                        continue;
                    }
                    Err(TryAcquireError::Closed) => return,
                };
                let Some(span) = longest.split(|k| spool.received(k) == 0) else {
                    continue;
                };
                tracing::debug!(%digest, first = span.first, ranges = span.count, "ranges shared with an idle connection");
                if !launch(&mut live, span, slot, Start::Connection(connection)) {
                    return;
                }
            }
        });
        (started, AbortOnDrop(dispatcher))
    }

    /// A request for the ranges `reach` holds, in a task of its own holding `slot` of the
    /// blob's window, its first try as `start` says.
    fn start_span(
        &self,
        digest: &str,
        spool: &Arc<Spool>,
        reach: Arc<Reach>,
        arrived: &Arc<Notify>,
        slot: OwnedSemaphorePermit,
        start: Start,
    ) -> AbortOnDrop<SpanResult> {
        let (transfer, digest, spool, arrived) = (
            self.clone(),
            digest.to_owned(),
            spool.clone(),
            arrived.clone(),
        );
        AbortOnDrop(tokio::spawn(async move {
            let fetched = transfer
                .fetch_span(&digest, &spool, &reach, &arrived, start)
                .await;
            reach.close();
            if fetched.is_err() {
                // The blob fails (or ranges are ignored): start nothing more.
                slot.semaphore().close();
            }
            fetched
        }))
    }

    /// How many requests of one blob run at once: its window, or its share of the
    /// node's connections when other blobs are fetched as ranges too.
    fn sharing(&self) -> u64 {
        let blobs = self.ranging.now().max(1);
        (self.max_connections / blobs).clamp(1, RANGE_WINDOW) as u64
    }

    /// Write the spooled bytes from the write position on, as far as they go without a
    /// gap (across ranges).
    async fn write_arrived(&self, spool: &Spool, sink: &mut Sink) -> Result<(), RangeOutcome> {
        let chunk = spool.range_size();
        loop {
            let from = sink.writer.offset();
            let k = from / chunk;
            let end = k * chunk + spool.received(k);
            if k >= spool.ranges() || from >= end {
                return Ok(());
            }
            let len = (end - from).min(SPOOL_PIECE as u64 * 4);
            let data = spool
                .read(from, usize::try_from(len).unwrap_or(usize::MAX))
                .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
            sink.write(Bytes::from(data))
                .await
                .map_err(|e| RangeOutcome::Failed(self.store_err(e)))?;
        }
    }

    /// Fetch the ranges `reach` holds into the spool, each from where its bytes end. One
    /// request covers the first range missing bytes and the untouched ones after it;
    /// ranges an earlier run left partly there start requests of their own. Ranges split
    /// off meanwhile are left to their new request. The first try is as `start` says.
    /// Returns the bytes fetched now.
    async fn fetch_span(
        &self,
        digest: &str,
        spool: &Spool,
        reach: &Reach,
        arrived: &Notify,
        mut start: Start,
    ) -> SpanResult {
        let mut last = String::new();
        let mut fetched = 0u64;
        let mut attempt = 0;
        loop {
            let end_range = reach.end();
            // The first range still missing bytes, and the run of untouched ones after it.
            let Some(k) =
                (reach.first..end_range).find(|&k| spool.received(k) < spool.range_len(k))
            else {
                return Ok(fetched);
            };
            if attempt >= self.attempts {
                return Err(RangeOutcome::Failed(self.exhausted(
                    &format!(
                        "{digest} bytes {}-{}",
                        reach.first * spool.range_size(),
                        (end_range * spool.range_size()).min(spool.size()) - 1
                    ),
                    last,
                )));
            }
            if !reach.enter(k) {
                // Split off since `end_range` was read: look again.
                continue;
            }
            let mut progressed = false;
            let mut filled_a_range = false;
            let from = k * spool.range_size() + spool.received(k);
            let request = match std::mem::replace(&mut start, Start::Fresh) {
                // Its body runs on to the blob's end from the write position, which is
                // where range `k` misses bytes.
                Start::Open(open) if open.at == from => Some(SpanRequest {
                    endpoint: open.endpoint,
                    body: open.body,
                    run_end: spool.ranges(),
                    _connection: open.connection,
                }),
                taken => {
                    self.request_span(digest, spool, reach, k, taken, &mut last)
                        .await?
                }
            };
            if let Some(mut request) = request {
                let to = (request.run_end * spool.range_size()).min(spool.size()) - 1;
                let began = std::time::Instant::now();
                let mut filling = SpanFill {
                    spool,
                    range: k,
                    end_range: request.run_end,
                    reach,
                    left_to_another: false,
                    pending: Vec::with_capacity(SPOOL_PIECE),
                    arrived,
                };
                let mut failed = None;
                loop {
                    match request.body.next().await {
                        Ok(Some(piece)) => {
                            if let Some(rate) = &self.rate {
                                rate.acquire(piece.len()).await;
                            }
                            let kept = match filling.add(&piece) {
                                Ok(kept) => kept,
                                Err(SpanError::Excess) => {
                                    failed = Some(format!(
                                        "range {from}-{to}: the registry returned more than asked"
                                    ));
                                    break;
                                }
                                Err(SpanError::Spool(e)) => {
                                    return Err(RangeOutcome::Failed(self.spool_err(e)));
                                }
                            };
                            fetched += kept as u64;
                            progressed = true;
                            self.progress.event(ProgressEvent::BlobBytes {
                                digest: digest.to_owned(),
                                bytes: kept as u64,
                            });
                            if filling.left_to_another {
                                // The rest is another request's now: this body is dropped
                                // (its connection with it).
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let host = self.registry.endpoint_url(request.endpoint);
                            failed = Some(format!("{host}: {e}"));
                            break;
                        }
                    }
                }
                // What arrived is kept even when the transfer broke: the retry continues.
                filling
                    .flush()
                    .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                filled_a_range = filling.range > k;
                match failed {
                    None if filling.range == request.run_end || filling.left_to_another => {
                        tracing::debug!(%digest, ranges = filling.range - k, bytes = to + 1 - from, elapsed = ?began.elapsed(), "ranges fetched");
                    }
                    None => last = format!("range {from}-{to}: the body ended early"),
                    Some(e) => last = e,
                }
            }
            // Every request counts against `attempts` (a registry dripping a few bytes
            // per request must not keep a range going for ever) unless it filled a range:
            // a long request (up to [`AHEAD`] ranges) broken now and then still ends, each
            // try a range further. One that brought bytes is retried at once, from where it
            // stopped.
            attempt = match filled_a_range {
                true => 1,
                false => attempt + 1,
            };
            if !progressed && attempt < self.attempts {
                backoff(attempt - 1, None).await;
            }
        }
    }

    /// Ask a registry host for range `k` from where its bytes end and the untouched ranges
    /// after it that `reach` holds, on the connection `start` took for it or the next
    /// free one. `None` when every host failed in a way worth another try (`last` says
    /// how).
    async fn request_span(
        &self,
        digest: &str,
        spool: &Spool,
        reach: &Reach,
        k: u64,
        start: Start,
        last: &mut String,
    ) -> Result<Option<SpanRequest>, RangeOutcome> {
        let mut taken = match start {
            Start::Connection(connection) => Some(connection),
            Start::Fresh => None,
            // Not at the range's missing bytes: of no use, and its connection is freed
            // before this request waits for one.
            Start::Open(open) => {
                drop(open);
                None
            }
        };
        let from = k * spool.range_size() + spool.received(k);
        for i in self.registry.blob_endpoints() {
            let connection = match taken.take() {
                Some(connection) => Some(connection),
                None => self.connections.acquire().await,
            };
            // Read once the connection is ours: ranges split off while the request
            // waited for it are not asked for.
            let end_range = reach.end();
            let run_end = (k + 1..end_range)
                .find(|&j| spool.received(j) > 0)
                .unwrap_or(end_range);
            let to = (run_end * spool.range_size()).min(spool.size()) - 1;
            match self.registry.fetch_blob(i, digest, Some((from, to))).await {
                Ok((true, body)) => {
                    return Ok(Some(SpanRequest {
                        endpoint: i,
                        body,
                        run_end,
                        _connection: connection,
                    }));
                }
                Ok((false, _)) => return Err(RangeOutcome::Ignored),
                Err(e) if e.is_retryable() => {
                    *last = e.to_string();
                    if let Some(after) = e.retry_after() {
                        tokio::time::sleep(after.min(Duration::from_secs(60))).await;
                    }
                }
                Err(e) => return Err(RangeOutcome::Failed(e.into())),
            }
        }
        Ok(None)
    }
}

/// Free the spool's ranges from `discarded` on that containerd confirmed holding
/// (`acked` bytes), in order.
fn discard_written(spool: &Spool, discarded: &mut u64, acked: u64) {
    let chunk = spool.range_size();
    while *discarded < spool.ranges() && (*discarded + 1) * chunk <= acked {
        if let Err(error) = spool.discard(*discarded) {
            tracing::debug!(%error, "could not free a written range");
        }
        *discarded += 1;
    }
}

/// How a request's first try starts.
enum Start {
    /// Asking on the next free connection.
    Fresh,
    /// Asking on a connection taken for it.
    Connection(OwnedSemaphorePermit),
    /// Reading a stream found slow, already open at the blob's write position.
    Open(OpenStream),
}

/// A request's answer being read: ranges `..run_end` come on `body`.
struct SpanRequest {
    endpoint: usize,
    body: crate::registry::BlobBody,
    run_end: u64,
    _connection: Option<OwnedSemaphorePermit>,
}

/// Why a request's bytes could not go into the spool.
#[derive(Debug)]
enum SpanError {
    /// More bytes than the request asked for.
    Excess,
    Spool(SpoolError),
}

/// Bytes of one request going into consecutive ranges of the spool, in pieces of at
/// least [`SPOOL_PIECE`], each next range only while the request still holds it
/// ([`Reach`]).
struct SpanFill<'a> {
    spool: &'a Spool,
    /// The range being filled; `end_range` when all are full.
    range: u64,
    /// Where the request's bytes end.
    end_range: u64,
    reach: &'a Reach,
    /// The range filled next was split off to another request: what else arrives is
    /// not this request's to write.
    left_to_another: bool,
    pending: Vec<u8>,
    arrived: &'a Notify,
}

impl SpanFill<'_> {
    /// Take `piece`; the bytes kept (fewer when the rest is another request's).
    fn add(&mut self, mut piece: &[u8]) -> Result<usize, SpanError> {
        let whole = piece.len();
        while !piece.is_empty() {
            if self.left_to_another {
                return Ok(whole - piece.len());
            }
            if self.range >= self.end_range {
                return Err(SpanError::Excess);
            }
            let room = self.spool.range_len(self.range)
                - self.spool.received(self.range)
                - self.pending.len() as u64;
            if room == 0 {
                // Full: appending what is pending moves on to the next range.
                if self.pending.is_empty() {
                    self.next_range();
                } else {
                    self.flush().map_err(SpanError::Spool)?;
                }
                continue;
            }
            let room = usize::try_from(room).unwrap_or(usize::MAX);
            if self.pending.is_empty() && piece.len().min(room) >= SPOOL_PIECE {
                // A big piece goes to the spool as it came: no copy, nothing to grow.
                let (now, rest) = piece.split_at(piece.len().min(room));
                self.append(now).map_err(SpanError::Spool)?;
                piece = rest;
                continue;
            }
            // Small pieces are gathered, never past SPOOL_PIECE: the body's pieces can be
            // as big as the connection's read buffer, and sixteen requests hold one each.
            let take = room.min(piece.len()).min(SPOOL_PIECE - self.pending.len());
            let (now, rest) = piece.split_at(take);
            self.pending.extend_from_slice(now);
            piece = rest;
            if take == room || self.pending.len() >= SPOOL_PIECE {
                self.flush().map_err(SpanError::Spool)?;
            }
        }
        Ok(whole)
    }

    /// Append what is pending to the range being filled; on to the next when full.
    fn flush(&mut self) -> Result<(), SpoolError> {
        if self.pending.is_empty() || self.range >= self.end_range || self.left_to_another {
            return Ok(());
        }
        let mut pending = std::mem::take(&mut self.pending);
        let appended = self.append(&pending);
        pending.clear();
        self.pending = pending;
        appended
    }

    /// Append `data` to the range being filled (which has room for it; `add` checked);
    /// on to the next when full.
    fn append(&mut self, data: &[u8]) -> Result<(), SpoolError> {
        self.spool.append(self.range, data)?;
        if self.spool.received(self.range) == self.spool.range_len(self.range) {
            self.next_range();
        }
        self.arrived.notify_one();
        Ok(())
    }

    /// On to the next range, if it is still this request's.
    fn next_range(&mut self) {
        self.range += 1;
        if self.range < self.end_range && !self.reach.enter(self.range) {
            self.left_to_another = true;
        }
    }
}

/// A spawned task that is cancelled when its handle is dropped: ranges of a failed or
/// abandoned blob stop downloading.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_fills_its_ranges_in_turn_and_refuses_bytes_past_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), "sha256:abc", 10_000, 4096).unwrap();
        let arrived = Notify::new();
        // Range 1 already holds 100 bytes (an earlier run): a request covers range 0 only.
        spool.append(1, &[7u8; 100]).unwrap();
        let reach = Reach::new(Span { first: 0, count: 3 });
        let mut fill = SpanFill {
            spool: &spool,
            range: 0,
            end_range: 1,
            reach: &reach,
            left_to_another: false,
            pending: Vec::new(),
            arrived: &arrived,
        };
        fill.add(&[1u8; 4000]).unwrap();
        fill.add(&[1u8; 96]).unwrap();
        assert_eq!(fill.range, 1);
        assert!(matches!(fill.add(&[1u8; 1]), Err(SpanError::Excess)));
        assert_eq!(spool.received(0), 4096);
        assert_eq!(spool.received(1), 100);
        // The rest in one request: into range 1 after its bytes, then range 2 (short).
        let mut fill = SpanFill {
            spool: &spool,
            range: 1,
            end_range: 3,
            reach: &reach,
            left_to_another: false,
            pending: Vec::new(),
            arrived: &arrived,
        };
        fill.add(&vec![2u8; 3996 + 1808]).unwrap();
        fill.flush().unwrap();
        assert_eq!(fill.range, 3);
        assert_eq!((spool.received(1), spool.received(2)), (4096, 1808));
        assert_eq!(spool.read(4096, 101).unwrap()[99..], [7, 2]);
    }

    #[test]
    fn big_pieces_go_to_the_spool_as_they_came_and_small_ones_gather_up_to_a_piece() {
        let dir = tempfile::tempdir().unwrap();
        let range = 4 * SPOOL_PIECE as u64;
        let size = 3 * range + 999;
        let spool = Spool::open(dir.path(), "sha256:abc", size, range).unwrap();
        let arrived = Notify::new();
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let reach = Reach::new(Span { first: 0, count: 4 });
        let mut fill = SpanFill {
            spool: &spool,
            range: 0,
            end_range: 4,
            reach: &reach,
            left_to_another: false,
            pending: Vec::with_capacity(SPOOL_PIECE),
            arrived: &arrived,
        };
        // Small pieces, one piece longer than a whole range (as a connection's read
        // buffer can deliver), then small ones again to the end.
        let mut cuts = vec![100, 1000, 5 * SPOOL_PIECE + 7];
        cuts.extend(std::iter::repeat_n(3000, data.len() / 3000 + 1));
        let mut at = 0;
        for cut in cuts {
            let end = (at + cut).min(data.len());
            fill.add(&data[at..end]).unwrap();
            at = end;
            assert!(fill.pending.len() < SPOOL_PIECE);
            assert_eq!(
                fill.pending.capacity(),
                SPOOL_PIECE,
                "the gathering buffer grew"
            );
        }
        fill.flush().unwrap();
        assert_eq!(fill.range, 4);
        assert_eq!(spool.read(0, data.len()).unwrap(), data);
    }

    #[test]
    fn a_range_split_off_is_never_filled_by_the_request_it_left() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), "sha256:abc", 6 * 4096, 4096).unwrap();
        let arrived = Notify::new();
        let reach = Reach::new(Span { first: 0, count: 6 });
        assert_eq!(reach.untouched(), 5);
        let mut fill = SpanFill {
            spool: &spool,
            range: 0,
            end_range: 6,
            reach: &reach,
            left_to_another: false,
            pending: Vec::new(),
            arrived: &arrived,
        };
        fill.add(&[1u8; 4096 + 100]).unwrap();
        // Filling range 1: ranges 2..6 untouched, 4..6 go to another request.
        let taken = reach.split(|k| spool.received(k) == 0).unwrap();
        assert_eq!(taken, Span { first: 4, count: 2 });
        assert_eq!((reach.end(), reach.untouched()), (4, 2));
        // The request goes on to the end of range 3, and what it brings past that
        // (the rest of its body) is dropped, not counted.
        assert_eq!(fill.add(&vec![2u8; 3 * 4096]).unwrap(), 3 * 4096 - 100);
        fill.flush().unwrap();
        assert!(fill.left_to_another);
        assert_eq!(fill.range, 4);
        assert_eq!(
            (0..6).map(|k| spool.received(k)).collect::<Vec<_>>(),
            [4096, 4096, 4096, 4096, 0, 0]
        );
        // The new request fills them.
        let thief = Reach::new(taken);
        let mut fill = SpanFill {
            spool: &spool,
            range: 4,
            end_range: 6,
            reach: &thief,
            left_to_another: false,
            pending: Vec::new(),
            arrived: &arrived,
        };
        fill.add(&[3u8; 2 * 4096]).unwrap();
        assert_eq!(spool.read(4 * 4096 - 1, 2).unwrap(), [2, 3]);
        // A closed request is not split; nor are ranges an earlier run left bytes in.
        reach.close();
        assert_eq!(reach.split(|_| true), None);
        let partly = Reach::new(Span { first: 0, count: 6 });
        assert_eq!(partly.split(|k| k != 5), None);
        assert_eq!(partly.untouched(), 0, "not offered again");
        // A request does not enter a range split off before it got there.
        let late = Reach::new(Span { first: 0, count: 6 });
        let taken = late.split(|_| true).unwrap();
        assert!(!late.enter(taken.first));
        assert!(late.enter(taken.first - 1));
    }
}
