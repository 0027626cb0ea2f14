//! The pace a peer must keep: a peer is only worth asking while it is faster than a
//! floor. A node that trickles bytes (a compromised one, or one whose own download
//! stalled) would otherwise hold a blob back for as long as it likes; judged per window,
//! it costs at most one window before the pull goes on from the next source.

use std::time::{Duration, Instant};

/// The floor a peer must keep, and the window it is judged over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerPace {
    /// Bytes per second, averaged over a window.
    pub min_rate: u64,
    /// How long a window lasts; nothing received in one is a stall.
    pub window: Duration,
}

/// The default floor: far below what a peer on a LAN serves (hundreds of MiB/s), and
/// below what a node still downloading passes on to its followers while its registry
/// gives it 16 MiB/s or more (the range at its write position gets a sixteenth of its
/// link); `peer_min_rate` in the agent's configuration, lower for slower registries.
pub const DEFAULT_PEER_MIN_RATE: u64 = 1 << 20;
/// The window a peer is judged over: long enough for the bursts a node still
/// downloading passes on, short enough that a stalled peer costs little.
pub const DEFAULT_PEER_WINDOW: Duration = Duration::from_secs(5);

impl Default for PeerPace {
    fn default() -> Self {
        Self {
            min_rate: DEFAULT_PEER_MIN_RATE,
            window: DEFAULT_PEER_WINDOW,
        }
    }
}

/// Whether a peer keeps the pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Still fast enough (or its window is not over yet).
    Keeps,
    /// Slower than the floor over the window that just ended.
    TooSlow { rate: u64 },
}

/// One transfer judged window by window (pure: the caller tells the time).
#[derive(Debug)]
pub(crate) struct PaceJudge {
    pace: PeerPace,
    window_start: Instant,
    window_bytes: u64,
}

impl PaceJudge {
    pub(crate) fn new(pace: PeerPace, now: Instant) -> Self {
        Self {
            pace,
            window_start: now,
            window_bytes: 0,
        }
    }

    /// When the current window ends: the latest a next piece may come before the peer
    /// is judged.
    pub(crate) fn window_end(&self) -> Instant {
        self.window_start + self.pace.window
    }

    /// `bytes` arrived at `now` (0 when the window ended with nothing).
    pub(crate) fn record(&mut self, now: Instant, bytes: u64) -> Verdict {
        self.window_bytes = self.window_bytes.saturating_add(bytes);
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed < self.pace.window {
            return Verdict::Keeps;
        }
        let millis = u64::try_from(elapsed.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let rate = self.window_bytes.saturating_mul(1000) / millis;
        if rate < self.pace.min_rate {
            return Verdict::TooSlow { rate };
        }
        self.window_start = now;
        self.window_bytes = 0;
        Verdict::Keeps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pace() -> PeerPace {
        PeerPace {
            min_rate: 1000,
            window: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_fast_peer_keeps_the_pace_window_after_window() {
        let start = Instant::now();
        let mut judge = PaceJudge::new(pace(), start);
        for second in 1..=10 {
            let now = start + Duration::from_secs(second);
            assert_eq!(judge.record(now, 5000), Verdict::Keeps, "second {second}");
        }
    }

    #[test]
    fn a_trickle_is_dropped_at_the_end_of_its_first_window() {
        let start = Instant::now();
        let mut judge = PaceJudge::new(pace(), start);
        assert_eq!(
            judge.record(start + Duration::from_secs(1), 1),
            Verdict::Keeps
        );
        assert_eq!(
            judge.record(start + Duration::from_secs(2), 1),
            Verdict::TooSlow { rate: 1 }
        );
    }

    #[test]
    fn a_stall_is_judged_when_its_window_ends() {
        let start = Instant::now();
        let mut judge = PaceJudge::new(pace(), start);
        assert_eq!(judge.window_end(), start + Duration::from_secs(2));
        assert_eq!(
            judge.record(judge.window_end(), 0),
            Verdict::TooSlow { rate: 0 }
        );
    }

    #[test]
    fn a_burst_then_silence_is_judged_per_window_not_over_the_whole_transfer() {
        let start = Instant::now();
        let mut judge = PaceJudge::new(pace(), start);
        // A fast first window earns no credit for the next one.
        assert_eq!(
            judge.record(start + Duration::from_secs(2), 1 << 20),
            Verdict::Keeps
        );
        assert!(matches!(
            judge.record(start + Duration::from_secs(4), 10),
            Verdict::TooSlow { .. }
        ));
    }
}
