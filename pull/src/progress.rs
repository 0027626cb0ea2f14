//! What a pull tells progress displays, and byte counting that survives resumes.

use std::collections::HashMap;

/// What progress displays are told.
#[derive(Debug, Clone)]
pub enum ProgressEvent {
    Resolved {
        image: String,
        digest: String,
        layers: Vec<(String, u64)>,
    },
    BlobStarted {
        digest: String,
        size: u64,
        /// Bytes containerd already held from an interrupted pull.
        resumed_from: u64,
    },
    BlobBytes {
        digest: String,
        bytes: u64,
    },
    BlobDone {
        digest: String,
        skipped: bool,
    },
    /// The blob's download stopped and will go on: `reason` says what it waits for (a
    /// registry to answer again, containerd to come back).
    BlobStalled {
        digest: String,
        reason: String,
    },
    /// The stalled blob goes on from `offset`, the bytes containerd holds of it (what
    /// arrived but was not stored comes again).
    BlobResumed {
        digest: String,
        offset: u64,
    },
    LayerUnpacked {
        digest: String,
    },
    Done {
        image: String,
    },
}

pub trait Progress: Send + Sync {
    fn event(&self, event: ProgressEvent);
}

/// Bytes per layer of a pull as containerd holds them, for progress that counts: a
/// layer that goes on from an earlier offset after a stall is not counted twice.
#[derive(Debug, Default)]
pub struct LayerBytes {
    /// Per layer: (size, bytes held or sent).
    layers: HashMap<String, (u64, u64)>,
}

impl LayerBytes {
    /// Count `event`; `false` for the events that carry no byte counts.
    pub fn count(&mut self, event: &ProgressEvent) -> bool {
        match event {
            ProgressEvent::Resolved { layers, .. } => {
                for (digest, size) in layers {
                    self.layers.entry(digest.clone()).or_insert((*size, 0));
                }
            }
            ProgressEvent::BlobStarted {
                digest,
                size,
                resumed_from,
            } => {
                let entry = self.layers.entry(digest.clone()).or_insert((*size, 0));
                entry.1 = entry.1.max(*resumed_from).min(entry.0);
            }
            ProgressEvent::BlobBytes { digest, bytes } => {
                if let Some(entry) = self.layers.get_mut(digest) {
                    entry.1 = (entry.1 + bytes).min(entry.0);
                }
            }
            ProgressEvent::BlobDone { digest, .. } => self.set(digest, u64::MAX),
            // What containerd holds is what counts: bytes fetched but not stored before
            // the stall come again.
            ProgressEvent::BlobResumed { digest, offset } => self.set(digest, *offset),
            ProgressEvent::BlobStalled { .. }
            | ProgressEvent::LayerUnpacked { .. }
            | ProgressEvent::Done { .. } => return false,
        }
        true
    }

    /// The layer's bytes held: `done`, at most its size.
    fn set(&mut self, digest: &str, done: u64) {
        if let Some(entry) = self.layers.get_mut(digest) {
            entry.1 = done.min(entry.0);
        }
    }

    pub fn total(&self) -> u64 {
        self.layers.values().map(|(size, _)| size).sum()
    }

    pub fn done(&self) -> u64 {
        self.layers.values().map(|(_, done)| done).sum()
    }
}

/// A progress sink that ignores everything.
#[derive(Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn event(&self, _event: ProgressEvent) {}
}

/// The result of a pull.
#[derive(Debug, Clone)]
pub struct PulledImage {
    pub name: String,
    /// Digest of what the name points at (index or manifest).
    pub digest: String,
    pub config_digest: String,
    pub layers: usize,
    /// Bytes fetched from registries (resumed and present blobs not counted).
    pub bytes_downloaded: u64,
    /// Bytes received from peers (see [`crate::peers`]).
    pub bytes_from_peers: u64,
    /// Peers whose bytes went into a blob that did not match its digest.
    pub suspected_peers: Vec<String>,
}
