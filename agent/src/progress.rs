//! Pull progress for people: bars on a terminal (layer, bytes, rate, ETA), plain lines
//! otherwise (logs, CI, `systemctl status`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use rigger_pull::{LayerBytes, Progress, ProgressEvent};

fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}

fn bytes(n: u64) -> String {
    ByteSize::b(n).display().iec().to_string()
}

/// One bar per layer.
pub struct TerminalProgress {
    bars: MultiProgress,
    layers: Mutex<HashMap<String, ProgressBar>>,
    style: ProgressStyle,
}

impl std::fmt::Debug for TerminalProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalProgress").finish_non_exhaustive()
    }
}

impl TerminalProgress {
    pub fn new() -> Self {
        let style = ProgressStyle::with_template(
            "{prefix:.bold} {bar:30.cyan/blue} {bytes:>10}/{total_bytes:<10} {bytes_per_sec:>12} eta {eta:>4} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        Self {
            bars: MultiProgress::new(),
            layers: Mutex::default(),
            style,
        }
    }
}

impl Default for TerminalProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress for TerminalProgress {
    fn event(&self, event: ProgressEvent) {
        let Ok(mut layers) = self.layers.lock() else {
            return;
        };
        match event {
            ProgressEvent::Resolved {
                image,
                digest,
                layers: list,
            } => {
                let _ = self.bars.println(format!(
                    "{image}: resolved to {digest}, {} layers",
                    list.len()
                ));
                for (layer, size) in list {
                    let bar = self.bars.add(ProgressBar::new(size));
                    bar.set_style(self.style.clone());
                    bar.set_prefix(short(&layer).to_owned());
                    bar.set_message("waiting");
                    layers.insert(layer, bar);
                }
            }
            ProgressEvent::BlobStarted {
                digest,
                resumed_from,
                ..
            } => {
                if let Some(bar) = layers.get(&digest) {
                    bar.set_position(resumed_from);
                    bar.reset_eta();
                    bar.set_message(if resumed_from > 0 {
                        format!("resumed at {}", bytes(resumed_from))
                    } else {
                        "downloading".to_owned()
                    });
                }
            }
            ProgressEvent::BlobBytes { digest, bytes } => {
                if let Some(bar) = layers.get(&digest) {
                    bar.inc(bytes);
                }
            }
            ProgressEvent::BlobDone { digest, skipped } => {
                if let Some(bar) = layers.get(&digest) {
                    if skipped {
                        bar.set_position(bar.length().unwrap_or(0));
                        bar.set_message("already present");
                    } else {
                        bar.set_message("downloaded");
                    }
                }
            }
            ProgressEvent::BlobStalled { digest, reason } => {
                if let Some(bar) = layers.get(&digest) {
                    bar.set_message(reason);
                }
            }
            ProgressEvent::BlobResumed { digest, offset } => {
                if let Some(bar) = layers.get(&digest) {
                    bar.set_position(offset);
                    bar.reset_eta();
                    bar.set_message(format!("resumed at {}", bytes(offset)));
                }
            }
            ProgressEvent::LayerUnpacked { digest } => {
                if let Some(bar) = layers.get(&digest) {
                    bar.finish_with_message("unpacked");
                }
            }
            ProgressEvent::Done { image } => {
                for bar in layers.values() {
                    if !bar.is_finished() {
                        bar.finish();
                    }
                }
                let _ = self.bars.println(format!("{image}: done"));
            }
        }
    }
}

/// Plain lines: one per milestone, and a byte count at most every few seconds.
#[derive(Debug)]
pub struct LineProgress {
    state: Mutex<LineState>,
    every: Duration,
}

#[derive(Debug)]
struct LineState {
    layers: LayerBytes,
    /// Bytes downloaded by this pull: what the rate is of.
    fetched: u64,
    started: Instant,
    last_line: Instant,
}

impl LineProgress {
    pub fn new(every: Duration) -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(LineState {
                layers: LayerBytes::default(),
                fetched: 0,
                started: now,
                last_line: now,
            }),
            every,
        }
    }
}

impl Progress for LineProgress {
    fn event(&self, event: ProgressEvent) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.layers.count(&event);
        let line = match event {
            ProgressEvent::Resolved {
                image,
                digest,
                layers,
            } => Some(format!(
                "{image}: resolved to {digest}, {} layers, {}",
                layers.len(),
                bytes(s.layers.total())
            )),
            ProgressEvent::BlobStarted {
                digest,
                size,
                resumed_from,
            } if resumed_from > 0 => Some(format!(
                "layer {}: resuming at {} of {}",
                short(&digest),
                bytes(resumed_from),
                bytes(size)
            )),
            ProgressEvent::BlobStarted { .. } => None,
            ProgressEvent::BlobBytes { bytes: n, .. } => {
                s.fetched += n;
                if s.last_line.elapsed() >= self.every {
                    s.last_line = Instant::now();
                    let secs = s.started.elapsed().as_secs_f64().max(0.001);
                    Some(format!(
                        "downloaded {} of {} ({}/s)",
                        bytes(s.layers.done()),
                        bytes(s.layers.total()),
                        bytes((s.fetched as f64 / secs) as u64)
                    ))
                } else {
                    None
                }
            }
            ProgressEvent::BlobDone { digest, skipped } => {
                let what = if skipped {
                    "already present"
                } else {
                    "downloaded"
                };
                Some(format!("layer {}: {what}", short(&digest)))
            }
            ProgressEvent::BlobStalled { digest, reason } => {
                Some(format!("layer {}: {reason}", short(&digest)))
            }
            ProgressEvent::BlobResumed { digest, offset } => Some(format!(
                "layer {}: going on from {}",
                short(&digest),
                bytes(offset)
            )),
            ProgressEvent::LayerUnpacked { digest } => {
                Some(format!("layer {}: unpacked", short(&digest)))
            }
            ProgressEvent::Done { image } => Some(format!(
                "{image}: done in {:.1}s",
                s.started.elapsed().as_secs_f64()
            )),
        };
        if let Some(line) = line {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_that_goes_on_from_an_earlier_offset_is_not_counted_twice() {
        let progress = LineProgress::new(Duration::from_secs(3600));
        let layer = |digest: &str| digest.to_owned();
        progress.event(ProgressEvent::Resolved {
            image: "i".into(),
            digest: "sha256:d".into(),
            layers: vec![(layer("a"), 100), (layer("b"), 50)],
        });
        progress.event(ProgressEvent::BlobStarted {
            digest: layer("a"),
            size: 100,
            resumed_from: 0,
        });
        progress.event(ProgressEvent::BlobBytes {
            digest: layer("a"),
            bytes: 60,
        });
        progress.event(ProgressEvent::BlobStalled {
            digest: layer("a"),
            reason: "retrying".into(),
        });
        // containerd kept 40 of the 60: the other 20 come again.
        progress.event(ProgressEvent::BlobResumed {
            digest: layer("a"),
            offset: 40,
        });
        progress.event(ProgressEvent::BlobBytes {
            digest: layer("a"),
            bytes: 30,
        });
        let state = progress.state.lock().unwrap();
        assert_eq!(
            (state.layers.done(), state.layers.total(), state.fetched),
            (70, 150, 90)
        );
        drop(state);
        progress.event(ProgressEvent::BlobDone {
            digest: layer("b"),
            skipped: true,
        });
        progress.event(ProgressEvent::BlobBytes {
            digest: layer("a"),
            bytes: 30,
        });
        let state = progress.state.lock().unwrap();
        assert_eq!((state.layers.done(), state.layers.total()), (150, 150));
    }
}
