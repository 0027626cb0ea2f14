//! How long this controller was kept from running. On a loaded machine a whole process
//! was seen to stall for seconds; its agents' heartbeats then wait unread on their
//! sockets, and a silence measured by the wall clock across the stall blames the agents.
//! A watch task that wakes every [`TICK`] adds up how late it woke, and an agent's
//! silence is counted net of the stalls inside it ([`net_silence`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the watch task wakes.
const TICK: Duration = Duration::from_millis(100);

/// A wake this late or later was a stall, not a busy machine's timer (a few
/// milliseconds late).
pub const STALLED_PAST: Duration = Duration::from_millis(500);

/// Not yet watching: no wake is due.
const NOT_WATCHING: u64 = u64::MAX;

/// The stalls seen so far, shared; cheap to clone.
#[derive(Debug, Clone)]
pub struct StallClock(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    start: Instant,
    /// Stalls added up, in milliseconds.
    stalled_ms: AtomicU64,
    /// When the watch task is due next, in milliseconds since `start`.
    due_ms: AtomicU64,
}

impl Default for StallClock {
    fn default() -> Self {
        Self(Arc::new(Inner {
            start: Instant::now(),
            stalled_ms: AtomicU64::new(0),
            due_ms: AtomicU64::new(NOT_WATCHING),
        }))
    }
}

impl StallClock {
    /// The stalls so far, including the one under way: a watch task overdue by
    /// [`STALLED_PAST`] has not counted its stall yet, and whatever reads the clock in the
    /// same turn must see it.
    pub fn stalled(&self) -> Duration {
        let now = self.since_start(Instant::now());
        let counted = self.0.stalled_ms.load(Ordering::Acquire);
        let due = self.0.due_ms.load(Ordering::Acquire);
        let pending = Duration::from_millis(now.saturating_sub(due));
        let pending = if is_stall(pending) {
            pending
        } else {
            Duration::ZERO
        };
        Duration::from_millis(counted).saturating_add(pending)
    }

    /// Count `late` as a stall (the watch task; tests).
    pub(crate) fn add(&self, late: Duration) {
        let ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX);
        self.0.stalled_ms.fetch_add(ms, Ordering::AcqRel);
    }

    /// Wake every [`TICK`] until `shutdown`, counting each wake [`STALLED_PAST`] late or
    /// later.
    pub async fn watch(self, shutdown: CancellationToken) {
        let mut due = Instant::now() + TICK;
        loop {
            self.0
                .due_ms
                .store(self.since_start(due), Ordering::Release);
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(due) => {}
            }
            let woke = Instant::now();
            let late = woke.saturating_duration_since(due);
            if is_stall(late) {
                tracing::debug!(
                    ?late,
                    "this controller did not run for a while: agents' silences are counted without it"
                );
                // Counted before the next due time is set, so that `stalled` never sees
                // the stall twice or not at all.
                self.add(late);
            }
            due = woke + TICK;
        }
    }

    fn since_start(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.0.start).as_millis()).unwrap_or(u64::MAX)
    }
}

/// Whether a wake `late` past its time was a stall (pure).
pub fn is_stall(late: Duration) -> bool {
    late >= STALLED_PAST
}

/// A silence of `silent` by the wall clock, without the `stalled` part of it this
/// controller did not run (pure).
pub fn net_silence(silent: Duration, stalled: Duration) -> Duration {
    silent.saturating_sub(stalled)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_late_timer_is_a_stall_only_past_half_a_second() {
        assert!(
            !is_stall(Duration::from_millis(120)),
            "a busy machine's timer"
        );
        assert!(is_stall(STALLED_PAST));
        assert!(is_stall(Duration::from_secs(3)));
    }

    #[test]
    fn silence_is_counted_without_the_stalls_in_it() {
        assert_eq!(
            net_silence(Duration::from_secs(4), Duration::from_secs(3)),
            Duration::from_secs(1)
        );
        assert_eq!(
            net_silence(Duration::from_secs(1), Duration::from_secs(3)),
            Duration::ZERO
        );
    }

    #[test]
    fn an_overdue_watch_counts_its_stall_before_it_runs() {
        let clock = StallClock(Arc::new(Inner {
            start: Instant::now() - Duration::from_secs(10),
            stalled_ms: AtomicU64::new(0),
            due_ms: AtomicU64::new(NOT_WATCHING),
        }));
        assert_eq!(clock.stalled(), Duration::ZERO, "not watching yet");
        // Due a second ago: the stall is under way and already counted.
        let due = clock.since_start(Instant::now()).saturating_sub(1_000);
        clock.0.due_ms.store(due, Ordering::Release);
        assert!(clock.stalled() >= Duration::from_secs(1));
        // Due just now: a timer a little late is no stall.
        clock
            .0
            .due_ms
            .store(clock.since_start(Instant::now()), Ordering::Release);
        assert!(clock.stalled() < STALLED_PAST);
        clock.add(Duration::from_secs(2));
        assert!(clock.stalled() >= Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_counts_nothing_on_time() {
        let clock = StallClock::default();
        let shutdown = CancellationToken::new();
        let watch = tokio::spawn(clock.clone().watch(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        shutdown.cancel();
        watch.await.unwrap();
        assert_eq!(clock.0.stalled_ms.load(Ordering::Acquire), 0);
    }
}
