//! How long this controller was kept from running. On a loaded machine a whole process
//! was seen to stall for seconds; its agents' heartbeats then wait unread on their
//! sockets, and a silence measured by the wall clock across the stall blames the agents.
//! A watch task that wakes every [`TICK`] adds up how late it woke, and an agent's
//! silence is counted net of the stalls inside it ([`net_silence`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the watch task wakes.
const TICK: Duration = Duration::from_millis(100);

/// A wake this late or later was a stall, not a busy machine's timer (a few
/// milliseconds late).
pub const STALLED_PAST: Duration = Duration::from_millis(500);

/// The stalls seen so far, shared; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct StallClock(Arc<Mutex<Stalls>>);

/// Behind one lock, so that a reader never sees a stall both counted and still pending,
/// or neither.
#[derive(Debug, Default)]
struct Stalls {
    counted: Duration,
    /// When the watch task is due next (`None`: not watching).
    due: Option<Instant>,
}

impl StallClock {
    /// The stalls so far, including the one under way: a watch task overdue by
    /// [`STALLED_PAST`] has not counted its stall yet, and whatever reads the clock in the
    /// same turn must see it.
    pub fn stalled(&self) -> Duration {
        let Ok(stalls) = self.0.lock() else {
            return Duration::ZERO;
        };
        let pending = stalls
            .due
            .map(|due| Instant::now().saturating_duration_since(due))
            .filter(|late| is_stall(*late))
            .unwrap_or_default();
        stalls.counted.saturating_add(pending)
    }

    /// Count `late` as a stall (tests).
    #[cfg(test)]
    pub(crate) fn add(&self, late: Duration) {
        if let Ok(mut stalls) = self.0.lock() {
            stalls.counted = stalls.counted.saturating_add(late);
        }
    }

    /// Wake every [`TICK`] until `shutdown`, counting each wake [`STALLED_PAST`] late or
    /// later.
    pub async fn watch(self, shutdown: CancellationToken) {
        let mut due = Instant::now() + TICK;
        loop {
            self.set_due(Some(due));
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep_until(due) => {}
            }
            let woke = Instant::now();
            let late = woke.saturating_duration_since(due);
            due = woke + TICK;
            if !is_stall(late) {
                continue;
            }
            tracing::debug!(
                ?late,
                "this controller did not run for a while: agents' silences are counted without it"
            );
            // Counted and the next wake set at once: `stalled` sees the stall once.
            if let Ok(mut stalls) = self.0.lock() {
                stalls.counted = stalls.counted.saturating_add(late);
                stalls.due = Some(due);
            }
        }
        self.set_due(None);
    }

    fn set_due(&self, due: Option<Instant>) {
        if let Ok(mut stalls) = self.0.lock() {
            stalls.due = due;
        }
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
        let clock = StallClock::default();
        assert_eq!(clock.stalled(), Duration::ZERO, "not watching yet");
        // Due a second ago: the stall is under way and already counted.
        clock.set_due(Instant::now().checked_sub(Duration::from_secs(1)));
        assert!(clock.stalled() >= Duration::from_secs(1));
        // Due just now: a timer a little late is no stall.
        clock.set_due(Some(Instant::now()));
        assert!(clock.stalled() < STALLED_PAST);
        clock.add(Duration::from_secs(2));
        assert!(clock.stalled() >= Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_counts_a_stall_once() {
        let clock = StallClock::default();
        let shutdown = CancellationToken::new();
        let watch = tokio::spawn(clock.clone().watch(shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(clock.stalled(), Duration::ZERO, "on time");
        // The whole runtime held up for 3 s, as a blocked thread or a starved process.
        tokio::time::advance(Duration::from_secs(3)).await;
        let seen = clock.stalled();
        assert!(seen >= Duration::from_secs(2), "{seen:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let counted = clock.stalled();
        assert!(
            counted >= seen && counted < seen + STALLED_PAST,
            "{seen:?} then {counted:?}"
        );
        shutdown.cancel();
        watch.await.unwrap();
        assert_eq!(clock.stalled(), counted);
    }
}
