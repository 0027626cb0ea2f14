//! Pull progress for people: bars on a terminal (layer, bytes, rate, ETA), plain lines
//! otherwise (logs, CI, `systemctl status`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::pull::{Progress, ProgressEvent};

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
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
}

impl LineProgress {
    pub fn new(every: Duration) -> Self {
        let now = Instant::now();
        Self {
            state: Mutex::new(LineState {
                total: 0,
                done: 0,
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
        let line = match event {
            ProgressEvent::Resolved {
                image,
                digest,
                layers,
            } => {
                s.total += layers.iter().map(|(_, size)| size).sum::<u64>();
                Some(format!(
                    "{image}: resolved to {digest}, {} layers, {}",
                    layers.len(),
                    bytes(s.total)
                ))
            }
            ProgressEvent::BlobStarted {
                digest,
                size,
                resumed_from,
            } if resumed_from > 0 => {
                s.done += resumed_from;
                Some(format!(
                    "layer {}: resuming at {} of {}",
                    short(&digest),
                    bytes(resumed_from),
                    bytes(size)
                ))
            }
            ProgressEvent::BlobStarted { .. } => None,
            ProgressEvent::BlobBytes { bytes: n, .. } => {
                s.done += n;
                if s.last_line.elapsed() >= self.every {
                    s.last_line = Instant::now();
                    let secs = s.started.elapsed().as_secs_f64().max(0.001);
                    Some(format!(
                        "downloaded {} of {} ({}/s)",
                        bytes(s.done),
                        bytes(s.total),
                        bytes((s.done as f64 / secs) as u64)
                    ))
                } else {
                    None
                }
            }
            ProgressEvent::BlobDone {
                digest,
                skipped: true,
            } => Some(format!("layer {}: already present", short(&digest))),
            ProgressEvent::BlobDone {
                digest,
                skipped: false,
            } => Some(format!("layer {}: downloaded", short(&digest))),
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
