//! One stream from the ingest's offset to the end, judged for speed as it runs.

use std::time::Duration;

use super::speed::{Judging, Verdict};
use super::{PROBE_TIME, SLOW_STREAM_RATE, Sink, StreamEnd, Transfer};
use crate::error::PullError;
use crate::progress::ProgressEvent;
use crate::registry::RegistryError;

impl Transfer {
    /// One stream from the writer's offset to the end, written as it arrives. With
    /// `probe`, it is judged: it gives up early (`Slow`) when the connection is slower
    /// than [`SLOW_STREAM_RATE`], so the rest can be fetched as parallel ranges, and the
    /// host's verdict is recorded either way; the turn to judge the host (`Some(Some)`)
    /// is given back with it.
    pub(super) async fn fetch_stream(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
        probe: Option<Option<Judging<'_>>>,
    ) -> Result<StreamEnd, PullError> {
        let (probe, mut turn) = (probe.is_some(), probe.flatten());
        let _permit = self.connections.acquire().await;
        let mut last: Option<RegistryError> = None;
        for i in self.registry.blob_endpoints() {
            let start = sink.writer.offset();
            let range = (start > 0).then(|| (start, size - 1));
            let (partial, mut body) = match self.registry.fetch_blob(i, digest, range).await {
                Ok(ok) => ok,
                Err(e) if e.is_retryable() => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            // A server that ignores Range sends from byte 0: skip what we hold.
            let mut skip = if partial { 0 } else { start };
            // The connection is judged by the time spent waiting for its bytes, not by
            // the time spent storing and unpacking them or waiting for the node's
            // `limit_rate` (shared with the node's other pulls): a busy agent or a
            // capped node is no reason for more connections — judged on wall time, a
            // capped stream was left for ranges after 50 ms with its body in the
            // socket's buffers, and the node fetched it twice.
            let mut waited = Duration::ZERO;
            let mut probed = 0u64;
            loop {
                let asked = std::time::Instant::now();
                let next = body.next().await;
                waited += asked.elapsed();
                match next {
                    Ok(Some(mut piece)) => {
                        if skip > 0 {
                            let n = skip.min(piece.len() as u64) as usize;
                            skip -= n as u64;
                            piece = piece.slice(n..);
                            if piece.is_empty() {
                                continue;
                            }
                        }
                        if sink.writer.offset() + piece.len() as u64 > size {
                            return Err(RegistryError::Transfer {
                                what: format!("blob {digest}"),
                                endpoint: self.registry.endpoint_url(i).to_owned(),
                                detail: format!("more than the {size} bytes the manifest promises"),
                                retryable: false,
                                retry_after: None,
                            }
                            .into());
                        }
                        if let Some(rate) = &self.rate {
                            rate.acquire(piece.len()).await;
                        }
                        sink.write(piece.clone())
                            .await
                            .map_err(|e| self.store_err(e))?;
                        sink.fetched += piece.len() as u64;
                        self.progress.event(ProgressEvent::BlobBytes {
                            digest: digest.to_owned(),
                            bytes: piece.len() as u64,
                        });
                        probed += piece.len() as u64;
                        if probe && waited >= PROBE_TIME {
                            let slow =
                                (probed as f64 / waited.as_secs_f64()) < SLOW_STREAM_RATE as f64;
                            if slow && size - sink.writer.offset() > 2 * self.chunk_size {
                                self.speed.judge(Verdict::Slow);
                                return Ok(StreamEnd::Slow);
                            }
                            if !slow && turn.take().is_some() {
                                self.speed.judge(Verdict::Fast);
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(detail) => {
                        return Err(RegistryError::Transfer {
                            what: format!("blob {digest}"),
                            endpoint: self.registry.endpoint_url(i).to_owned(),
                            detail,
                            retryable: true,
                            retry_after: None,
                        }
                        .into());
                    }
                }
            }
            if sink.writer.offset() < size {
                return Err(RegistryError::Transfer {
                    what: format!("blob {digest}"),
                    endpoint: self.registry.endpoint_url(i).to_owned(),
                    detail: format!("body ended at byte {} of {size}", sink.writer.offset()),
                    retryable: true,
                    retry_after: None,
                }
                .into());
            }
            return Ok(StreamEnd::Complete);
        }
        Err(last.map_or_else(
            || PullError::Image {
                image: self.image.clone(),
                detail: "no registry host may serve blobs (check hosts.toml capabilities)"
                    .to_owned(),
            },
            PullError::from,
        ))
    }
}
