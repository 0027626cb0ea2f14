//! One stream from the ingest's offset to the end, judged for speed as it runs.

use std::time::Duration;

use super::speed::Verdict;
use super::{OpenStream, PROBE_TIME, SLOW_STREAM_RATE, Sink, StreamEnd, Transfer};
use crate::error::PullError;
use crate::progress::ProgressEvent;
use crate::registry::RegistryError;

/// Whether a stream is judged for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Not judged: the blob is too small for ranges, or they are not to be used.
    Off,
    /// Judged: when slow, it goes on as the blob's first ranged request.
    Judged,
}

impl Transfer {
    /// One stream from the writer's offset to the end, written as it arrives. A
    /// [`Probe::Judged`] stream's showing is a vote on the host's speed, and it is handed
    /// on open ([`StreamEnd::Ranges`]) when it or its host was found slower than
    /// [`SLOW_STREAM_RATE`] ([`hands_on`]), so the rest comes as parallel ranges beside it.
    pub(super) async fn fetch_stream(
        &self,
        digest: &str,
        size: u64,
        sink: &mut Sink,
        probe: Probe,
    ) -> Result<StreamEnd, PullError> {
        let probe = probe == Probe::Judged;
        // What this stream last showed: each change is one vote on the host.
        let mut shown: Option<Verdict> = None;
        let mut connection = self.connections.acquire().await;
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
            let began = std::time::Instant::now();
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
                        if !probe {
                            continue;
                        }
                        let own = judge(probed, waited);
                        if let Some(verdict) = own.filter(|&v| shown != Some(v)) {
                            shown = Some(verdict);
                            tracing::debug!(%digest, probed, ?waited, elapsed = ?began.elapsed(), ?verdict, "stream judged");
                            self.speed.show(verdict);
                        }
                        let hand_on = hands_on(own, self.speed.verdict());
                        if hand_on && size - sink.writer.offset() > 2 * self.chunk_size {
                            // Not dropped (HTTP/1.1 would close its connection): it goes
                            // on as the first of the blob's ranges.
                            return Ok(StreamEnd::Ranges(Some(OpenStream {
                                endpoint: i,
                                at: sink.writer.offset(),
                                body,
                                connection: connection.take(),
                            })));
                        }
                    }
                    Ok(None) => {
                        // Ended before the probe's time: judged by what it brought then
                        // (a fast host's small blobs would otherwise never say).
                        if probe
                            && shown.is_none()
                            && sink.writer.offset() >= size
                            && ended_fast(probed, waited)
                        {
                            self.speed.show(Verdict::Fast);
                        }
                        break;
                    }
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

/// Whether a judged stream is handed on as the first of its blob's ranges, from what it
/// shows itself (`own`) and the host's `standing` verdict: when found slow, and when the
/// host was, whatever it shows itself — judged by the time spent waiting for bytes, a
/// stream whose bytes gathered in its buffers while the agent was busy looks fast, and
/// left alone it would run to its blob's end on one connection.
fn hands_on(own: Option<Verdict>, standing: Verdict) -> bool {
    own == Some(Verdict::Slow) || standing == Verdict::Slow
}

/// What a stream that brought `probed` bytes while waiting `waited` for them shows: slow
/// once it waited [`PROBE_TIME`] at less than [`SLOW_STREAM_RATE`]; fast as soon as it
/// brought what that rate brings in that time, sooner (a fast host's blob may spend most
/// of its time being stored, not waited for, and never wait that long).
fn judge(probed: u64, waited: Duration) -> Option<Verdict> {
    if waited >= PROBE_TIME {
        return Some(match ended_fast(probed, waited) {
            true => Verdict::Fast,
            false => Verdict::Slow,
        });
    }
    ended_fast(probed, PROBE_TIME).then_some(Verdict::Fast)
}

/// Whether `probed` bytes brought while waiting `waited` for them came at least at
/// [`SLOW_STREAM_RATE`] (also how a judged stream that ended early is judged).
fn ended_fast(probed: u64, waited: Duration) -> bool {
    probed as f64 >= SLOW_STREAM_RATE as f64 * waited.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_judged_slow_after_its_probe_and_fast_as_soon_as_it_shows_it() {
        let mib = 1u64 << 20;
        // 16 MiB/s (the bench's distant registry) over the probe: slow.
        assert_eq!(judge(mib * 16 / 20, PROBE_TIME), Some(Verdict::Slow));
        // Not waited long enough, not enough bytes: no word yet.
        assert_eq!(judge(mib, PROBE_TIME / 2), None);
        // 3 MiB after 5 ms of waiting: fast at once.
        assert_eq!(
            judge(3 * mib, Duration::from_millis(5)),
            Some(Verdict::Fast)
        );
        assert_eq!(judge(100 * mib, 2 * PROBE_TIME), Some(Verdict::Fast));
        // A small blob that ended sooner: fast if it came at the rate.
        assert!(ended_fast(mib, Duration::from_millis(10)));
        assert!(!ended_fast(mib / 4, Duration::from_millis(10)));
        assert!(ended_fast(0, Duration::ZERO));
    }

    #[test]
    fn a_stream_is_handed_on_when_it_or_its_host_was_found_slow() {
        use Verdict::{Fast, Slow, Unknown};
        assert!(hands_on(Some(Slow), Unknown));
        assert!(hands_on(Some(Slow), Fast));
        // The host was found slow: even looking fast (its bytes may have waited in its
        // buffers while the agent was busy).
        assert!(hands_on(Some(Fast), Slow));
        assert!(hands_on(None, Slow));
        assert!(!hands_on(Some(Fast), Unknown));
        assert!(!hands_on(None, Fast));
    }
}
