//! Blobs this node's pulls are writing into containerd now, and how much of each
//! containerd confirmed holding: what the agent's peer endpoint serves of a layer still
//! arriving, so a fleet's nodes fetch from a node that is itself still downloading.
//!
//! Also the images those pulls resolved (the blobs each reaches, from manifests the
//! pull checked against their digests), by digest and by the name pulled: containerd
//! holds an image's manifests and record only when its pull ends, and a peer's grant
//! names an image reference, which this node resolved itself.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

/// How far a blob being written has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub size: u64,
    /// Bytes from the start that containerd confirmed writing to its ingest.
    pub held: u64,
    pub state: ArrivalState,
    /// Some of the bytes came from other nodes (unverified until the commit): a node
    /// that relays them says so, and is not taken for their author if they are wrong.
    pub relayed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalState {
    Writing,
    /// containerd accepted the digest: the blob is in its content store.
    Committed,
    /// The write stopped (the pull failed or found the bytes wrong): what a reader got
    /// may not be the blob's.
    Abandoned,
}

/// Where a blob being written keeps its bytes until the commit.
#[derive(Debug, Clone)]
pub enum BytesAt {
    /// containerd's ingest of this ref.
    Ingest(String),
    /// A file the pull writes beside containerd's store (a descriptor of it).
    File(Arc<std::fs::File>),
    /// Nowhere a reader can see.
    Nowhere,
}

/// A blob being written, as a reader follows it.
#[derive(Debug, Clone)]
pub struct Following {
    pub bytes_at: BytesAt,
    pub arrival: watch::Receiver<Arrival>,
}

#[derive(Debug, Default)]
struct Inner {
    blobs: HashMap<String, (BytesAt, watch::Sender<Arrival>)>,
    /// Image (its top digest) → how many pulls of it run, and the blobs it reaches.
    images: HashMap<String, (usize, Arc<BTreeSet<String>>)>,
    /// Image name (containerd's record name) → the digest the latest pull of it
    /// resolved, and how many pulls of that name run.
    names: HashMap<String, (usize, String)>,
}

/// The node's arriving blobs and resolving images. Cheap to clone; shared by the pull
/// engine (which writes it) and the peer endpoint (which reads it).
#[derive(Debug, Clone, Default)]
pub struct Arriving(Arc<Mutex<Inner>>);

impl Arriving {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The blob `digest`, written now to `bytes_at`, from `held` bytes on.
    pub fn begin(&self, digest: &str, bytes_at: BytesAt, size: u64, held: u64) -> ArrivalGuard {
        let (sender, _) = watch::channel(Arrival {
            size,
            held: held.min(size),
            state: ArrivalState::Writing,
            relayed: false,
        });
        let earlier = self
            .lock()
            .blobs
            .insert(digest.to_owned(), (bytes_at.clone(), sender.clone()));
        // One fetch per blob per process: an earlier entry is a write that ended
        // without saying so.
        if let Some((_, earlier)) = earlier {
            abandon(&earlier);
        }
        ArrivalGuard {
            arriving: self.clone(),
            digest: digest.to_owned(),
            bytes_at,
            sender,
        }
    }

    /// The blob `digest` when a pull is writing it now.
    pub fn follow(&self, digest: &str) -> Option<Following> {
        let inner = self.lock();
        let (bytes_at, sender) = inner.blobs.get(digest)?;
        Some(Following {
            bytes_at: bytes_at.clone(),
            arrival: sender.subscribe(),
        })
    }

    /// A pull of `name` resolved it to `image` (its top digest), which reaches
    /// `blobs`; they count until the guard drops (when the pull ends).
    pub fn resolving(&self, name: &str, image: &str, blobs: BTreeSet<String>) -> ResolvingGuard {
        let mut inner = self.lock();
        let entry = inner
            .images
            .entry(image.to_owned())
            .or_insert_with(|| (0, Arc::new(blobs)));
        entry.0 += 1;
        let named = inner
            .names
            .entry(name.to_owned())
            .or_insert_with(|| (0, image.to_owned()));
        named.0 += 1;
        named.1 = image.to_owned();
        ResolvingGuard {
            arriving: self.clone(),
            name: name.to_owned(),
            image: image.to_owned(),
        }
    }

    /// The digest a pull of `name` running here resolved it to.
    pub fn resolved(&self, name: &str) -> Option<String> {
        self.lock().names.get(name).map(|(_, image)| image.clone())
    }

    /// The blobs `image` reaches, while a pull of it runs here.
    pub fn reached_by(&self, image: &str) -> Option<Arc<BTreeSet<String>>> {
        self.lock()
            .images
            .get(image)
            .map(|(_, blobs)| blobs.clone())
    }
}

fn abandon(sender: &watch::Sender<Arrival>) {
    sender.send_if_modified(|a| {
        let writing = a.state == ArrivalState::Writing;
        if writing {
            a.state = ArrivalState::Abandoned;
        }
        writing
    });
}

/// One blob's write, announced while it lives: abandoned when dropped uncommitted.
#[derive(Debug)]
pub struct ArrivalGuard {
    arriving: Arriving,
    digest: String,
    bytes_at: BytesAt,
    sender: watch::Sender<Arrival>,
}

impl ArrivalGuard {
    /// containerd confirmed holding `held` bytes.
    pub fn held(&self, held: u64) {
        self.sender.send_if_modified(|a| {
            let held = held.min(a.size);
            let changed = a.state == ArrivalState::Writing && a.held != held;
            if changed {
                a.held = held;
            }
            changed
        });
    }

    /// The ingest starts over from byte 0: readers of the bytes so far are cut off (the
    /// bytes were wrong), and later readers follow the new write.
    pub fn restart(&mut self) {
        let (size, relayed) = {
            let arrival = self.sender.borrow();
            (arrival.size, arrival.relayed)
        };
        let replacement = self
            .arriving
            .begin(&self.digest, self.bytes_at.clone(), size, 0);
        if relayed {
            replacement.relaying();
        }
        let old = std::mem::replace(self, replacement);
        drop(old);
    }

    /// Bytes from other nodes go into this write from now on.
    pub fn relaying(&self) {
        self.sender.send_if_modified(|a| {
            let changed = !a.relayed;
            a.relayed = true;
            changed
        });
    }

    /// containerd holds the whole blob under its digest.
    pub fn committed(&self) {
        self.sender.send_modify(|a| {
            a.held = a.size;
            a.state = ArrivalState::Committed;
        });
    }
}

impl Drop for ArrivalGuard {
    fn drop(&mut self) {
        abandon(&self.sender);
        let mut inner = self.arriving.lock();
        if inner
            .blobs
            .get(&self.digest)
            .is_some_and(|(_, s)| s.same_channel(&self.sender))
        {
            inner.blobs.remove(&self.digest);
        }
    }
}

/// One pull's resolution of an image, counted while it lives.
#[derive(Debug)]
pub struct ResolvingGuard {
    arriving: Arriving,
    name: String,
    image: String,
}

impl Drop for ResolvingGuard {
    fn drop(&mut self) {
        let mut inner = self.arriving.lock();
        if let Some((count, _)) = inner.images.get_mut(&self.image) {
            *count -= 1;
            if *count == 0 {
                inner.images.remove(&self.image);
            }
        }
        if let Some((count, _)) = inner.names.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                inner.names.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_follows_a_write_until_it_is_committed_and_then_it_is_gone() {
        let arriving = Arriving::default();
        assert!(arriving.follow("sha256:a").is_none());
        let guard = arriving.begin(
            "sha256:a",
            BytesAt::Ingest("layer-sha256:a".to_owned()),
            100,
            10,
        );
        let following = arriving.follow("sha256:a").unwrap();
        assert!(matches!(&following.bytes_at, BytesAt::Ingest(r) if r == "layer-sha256:a"));
        assert_eq!(following.arrival.borrow().held, 10);
        guard.held(60);
        guard.held(500); // never past the size
        assert_eq!(following.arrival.borrow().held, 100);
        guard.committed();
        assert_eq!(following.arrival.borrow().state, ArrivalState::Committed);
        drop(guard);
        // A committed blob stays committed for its readers; new ones find it in
        // containerd.
        assert_eq!(following.arrival.borrow().state, ArrivalState::Committed);
        assert!(arriving.follow("sha256:a").is_none());
    }

    #[test]
    fn a_write_that_ends_or_starts_over_cuts_its_readers_off() {
        let arriving = Arriving::default();
        let mut guard = arriving.begin("sha256:a", BytesAt::Ingest("r".to_owned()), 100, 0);
        guard.held(40);
        let before = arriving.follow("sha256:a").unwrap();
        guard.restart();
        assert_eq!(before.arrival.borrow().state, ArrivalState::Abandoned);
        let after = arriving.follow("sha256:a").unwrap();
        assert_eq!(
            *after.arrival.borrow(),
            Arrival {
                size: 100,
                held: 0,
                state: ArrivalState::Writing,
                relayed: false,
            }
        );
        guard.held(10);
        assert_eq!(after.arrival.borrow().held, 10);
        drop(guard);
        assert_eq!(after.arrival.borrow().state, ArrivalState::Abandoned);
        assert!(arriving.follow("sha256:a").is_none());
        // Held bytes no longer move once abandoned.
        assert_eq!(after.arrival.borrow().held, 10);
    }

    #[test]
    fn a_relaying_write_says_so_again_when_it_starts_over() {
        // A reader that starts after the restart must still learn that the bytes it
        // gets may be another node's (else a relay is blamed for a liar's bytes).
        let arriving = Arriving::default();
        let mut guard = arriving.begin("sha256:a", BytesAt::Ingest("r".to_owned()), 100, 0);
        guard.relaying();
        guard.restart();
        let after = arriving.follow("sha256:a").unwrap();
        assert!(after.arrival.borrow().relayed);
    }

    #[test]
    fn an_image_counts_while_any_pull_of_it_runs() {
        let arriving = Arriving::default();
        let blobs = BTreeSet::from(["sha256:l".to_owned()]);
        let first = arriving.resolving("r.example/a:1", "sha256:i", blobs.clone());
        let second = arriving.resolving("r.example/a:1", "sha256:i", blobs);
        drop(first);
        assert!(
            arriving
                .reached_by("sha256:i")
                .unwrap()
                .contains("sha256:l")
        );
        assert_eq!(
            arriving.resolved("r.example/a:1").as_deref(),
            Some("sha256:i")
        );
        drop(second);
        assert!(arriving.reached_by("sha256:i").is_none());
        assert!(arriving.resolved("r.example/a:1").is_none());
    }
}
