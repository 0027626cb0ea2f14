//! Things of one kind present at once (blobs fetched as ranges, open blob writers),
//! counted by a guard each holds: shares are worked out from the count.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many are present now; cheap to clone, shared by all that count.
#[derive(Debug, Clone, Default)]
pub(crate) struct Presence(Arc<AtomicUsize>);

impl Presence {
    /// Counted until the guard drops.
    pub(crate) fn enter(&self) -> Present {
        self.0.fetch_add(1, Ordering::Relaxed);
        Present(self.clone())
    }

    /// How many are present now.
    pub(crate) fn now(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One counted presence.
#[derive(Debug)]
pub(crate) struct Present(Presence);

impl Present {
    /// How many are present now, this one included.
    pub(crate) fn now(&self) -> usize {
        self.0.now()
    }
}

impl Drop for Present {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_guard_counts_while_it_lives() {
        let presence = Presence::default();
        let first = presence.enter();
        let second = presence.enter();
        assert_eq!((presence.now(), first.now()), (2, 2));
        drop(second);
        assert_eq!(first.now(), 1);
        drop(first);
        assert_eq!(presence.now(), 0);
    }
}
