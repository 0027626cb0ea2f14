//! Parallel byte ranges through the spool, written to containerd in order.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::spool::Spool;
use super::{RANGE_WINDOW, RangeOutcome, SPOOL_PIECE, Sink, Transfer, backoff};
use crate::error::PullError;
use crate::progress::ProgressEvent;

impl Transfer {
    /// Parallel byte ranges from the writer's offset to the end, written to containerd
    /// in order. Ranges are aligned to the chunk size and wait in the blob's spool, so a
    /// killed agent continues each one where its bytes end. At most [`RANGE_WINDOW`]
    /// ranges run ahead of the write position.
    pub(super) async fn fetch_ranges(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
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
        // Each range in its own task: they keep downloading while a finished one is
        // being written (a stream polled only between writes would stall them).
        let mut ranges = futures::stream::iter(first..spool.ranges())
            .map(|k| {
                let transfer = self.clone();
                let digest = digest.to_owned();
                let spool = spool.clone();
                AbortOnDrop(tokio::spawn(async move {
                    transfer.fetch_range(&digest, &spool, k).await
                }))
            })
            .buffered(RANGE_WINDOW);
        // Written ranges leave the spool once containerd confirmed holding them.
        let mut written = std::collections::VecDeque::new();
        while let Some(joined) = ranges.next().await {
            let (k, fetched) = joined.map_err(|e| {
                RangeOutcome::Failed(PullError::Image {
                    image: self.image.clone(),
                    detail: format!("range task failed: {e}"),
                })
            })??;
            sink.fetched += fetched;
            let end = k * chunk + spool.range_len(k);
            loop {
                let from = sink.writer.offset().max(k * chunk);
                if from >= end {
                    break;
                }
                let len = (end - from).min(SPOOL_PIECE as u64 * 4);
                let data = spool
                    .read(from, usize::try_from(len).unwrap_or(usize::MAX))
                    .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                sink.write(Bytes::from(data))
                    .await
                    .map_err(|e| RangeOutcome::Failed(self.store_err(e)))?;
            }
            written.push_back(k);
            while let Some(&done) = written.front()
                && (done + 1) * chunk <= sink.writer.acked()
            {
                written.pop_front();
                if let Err(error) = spool.discard(done) {
                    tracing::debug!(%error, "could not free a written range");
                }
            }
        }
        Ok(())
    }

    /// Fetch range `k` of the blob into the spool, from where its bytes end. Returns `k`
    /// and the bytes fetched now (an earlier run may have spooled some).
    async fn fetch_range(
        &self,
        digest: &str,
        spool: &Spool,
        k: u64,
    ) -> Result<(u64, u64), RangeOutcome> {
        let begin = k * spool.range_size();
        let len = spool.range_len(k);
        let mut last = String::new();
        let mut fetched = 0u64;
        for attempt in 0..self.attempts {
            let have = spool.received(k);
            if have >= len {
                return Ok((k, fetched));
            }
            let (start, end) = (begin + have, begin + len - 1);
            for i in self.registry.blob_endpoints() {
                let _permit = self.connections.acquire().await;
                let began = std::time::Instant::now();
                let (partial, mut body) = match self
                    .registry
                    .fetch_blob(i, digest, Some((start, end)))
                    .await
                {
                    Ok(ok) => ok,
                    Err(e) if e.is_retryable() => {
                        last = e.to_string();
                        if let Some(after) = e.retry_after() {
                            tokio::time::sleep(after.min(Duration::from_secs(60))).await;
                        }
                        continue;
                    }
                    Err(e) => return Err(RangeOutcome::Failed(e.into())),
                };
                if !partial {
                    return Err(RangeOutcome::Ignored);
                }
                let mut pending: Vec<u8> = Vec::with_capacity(SPOOL_PIECE * 2);
                let mut failed = None;
                loop {
                    match body.next().await {
                        Ok(Some(piece)) => {
                            if let Some(rate) = &self.rate {
                                rate.acquire(piece.len()).await;
                            }
                            if spool.received(k) + (pending.len() + piece.len()) as u64 > len {
                                failed =
                                    Some(format!("range {start}-{end} returned more than asked"));
                                break;
                            }
                            pending.extend_from_slice(&piece);
                            fetched += piece.len() as u64;
                            self.progress.event(ProgressEvent::BlobBytes {
                                digest: digest.to_owned(),
                                bytes: piece.len() as u64,
                            });
                            if pending.len() >= SPOOL_PIECE {
                                spool
                                    .append(k, &pending)
                                    .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                                pending.clear();
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                // What arrived is kept even when the transfer broke: the retry continues.
                if !pending.is_empty() {
                    spool
                        .append(k, &pending)
                        .map_err(|e| RangeOutcome::Failed(self.spool_err(e)))?;
                }
                match failed {
                    None if spool.received(k) == len => {
                        tracing::debug!(%digest, range = k, bytes = end + 1 - start, elapsed = ?began.elapsed(), "range fetched");
                        return Ok((k, fetched));
                    }
                    None => {
                        last = format!(
                            "range {start}-{end}: body ended at byte {} of the range",
                            spool.received(k)
                        );
                    }
                    Some(e) => last = format!("{}: {e}", self.registry.endpoint_url(i)),
                }
            }
            backoff(attempt, None).await;
        }
        Err(RangeOutcome::Failed(self.exhausted(
            &format!("{digest} bytes {begin}-{}", begin + len - 1),
            last,
        )))
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
