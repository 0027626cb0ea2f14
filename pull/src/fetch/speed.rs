//! What the node has learnt of a registry host's speed, shared by all its pulls.
//!
//! A blob of a host the node has no recent word on starts on one connection, judged as
//! it runs; when that proves slow, the stream goes on as the blob's first ranged
//! request and the rest comes as parallel ranges ([`super::ranges`]). What the streams
//! showed then holds for all pulls for a while: once the host is found slow, their blobs
//! start as ranges at once, not one slow stream each.
//!
//! One stream's showing is not the host's verdict: judged by the time spent waiting for
//! bytes, a stream of a loopback registry starved of CPU can look slow, and a stream
//! of a distant one whose bytes gathered in its buffers while the agent was busy can look
//! fast. So the streams vote: the host is slow when slow showings lead fast ones by two.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long the streams' showings hold after the last: networks change, and a judgement
/// costs only one blob's start.
const VERDICT_HOLDS: Duration = Duration::from_secs(60);
/// How far slow showings must lead fast ones for the host to be slow.
const SLOW_LEAD: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No recent showing, or no clear one: blobs start as streams, each judged.
    Unknown,
    /// Slower than one stream should be: blobs start as ranges, and streams are handed
    /// on to ranges.
    Slow,
    /// Streams were fast: blobs start as streams (still judged as they run).
    Fast,
}

/// What the streams showed of a host since it was last without a word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Showings {
    slow: u32,
    fast: u32,
    /// When the last was shown (`None`: never).
    last: Option<Instant>,
}

impl Showings {
    /// The verdict they give at `now`.
    fn standing(&self, now: Instant) -> Verdict {
        match self.last {
            Some(at) if now.saturating_duration_since(at) < VERDICT_HOLDS => {
                if self.slow >= self.fast.saturating_add(SLOW_LEAD) {
                    Verdict::Slow
                } else if self.fast > self.slow {
                    Verdict::Fast
                } else {
                    Verdict::Unknown
                }
            }
            _ => Verdict::Unknown,
        }
    }

    /// With one more `shown` at `now` (those past holding forgotten first).
    fn with(self, shown: Verdict, now: Instant) -> Self {
        let forgotten = self
            .last
            .is_none_or(|at| now.saturating_duration_since(at) >= VERDICT_HOLDS);
        let mut showings = if forgotten { Self::default() } else { self };
        match shown {
            Verdict::Slow => showings.slow = showings.slow.saturating_add(1),
            Verdict::Fast => showings.fast = showings.fast.saturating_add(1),
            Verdict::Unknown => return showings,
        }
        showings.last = Some(now);
        showings
    }
}

/// One registry host's speed, as the node's pulls found it.
#[derive(Debug, Default)]
pub(crate) struct HostSpeed {
    showings: Mutex<Showings>,
}

impl HostSpeed {
    pub(crate) fn verdict(&self) -> Verdict {
        self.showings().standing(Instant::now())
    }

    /// Count what a stream showed.
    pub(crate) fn show(&self, shown: Verdict) {
        let mut showings = self.showings();
        *showings = showings.with(shown, Instant::now());
    }

    fn showings(&self) -> std::sync::MutexGuard<'_, Showings> {
        self.showings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The hosts' speeds, per registry host, for one engine.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostSpeeds(Arc<Mutex<HashMap<String, Arc<HostSpeed>>>>);

impl HostSpeeds {
    /// The speed record of `host`.
    pub(crate) fn of(&self, host: &str) -> Arc<HostSpeed> {
        let mut hosts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Hosts a node pulls from are few; a verdict long past is only forgotten.
        if hosts.len() >= 256 {
            hosts.retain(|_, speed| Arc::strong_count(speed) > 1);
        }
        hosts.entry(host.to_owned()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_streams_vote_and_their_showings_hold_for_a_while() {
        use Verdict::{Fast, Slow, Unknown};
        let now = Instant::now();
        let none = Showings::default();
        assert_eq!(none.standing(now), Unknown);
        // One fast showing: fast. One slow one against it: no clear word.
        let one_fast = none.with(Fast, now);
        assert_eq!(one_fast.standing(now), Fast);
        assert_eq!(one_fast.with(Slow, now).standing(now), Unknown);
        // A loopback stream starved of CPU among fast ones does not make the host slow.
        let loopback = (0..5).fold(none, |s, _| s.with(Fast, now)).with(Slow, now);
        assert_eq!(loopback.standing(now), Fast);
        // A distant registry: slow after two, and a stream that looked fast (its bytes
        // waited in its buffers) does not undo it.
        let distant = none.with(Slow, now);
        assert_eq!(distant.standing(now), Unknown);
        let distant = distant.with(Slow, now).with(Slow, now);
        assert_eq!(distant.standing(now), Slow);
        assert_eq!(distant.with(Fast, now).standing(now), Slow);
        // They hold a while after the last, then are forgotten.
        let later = now + VERDICT_HOLDS - Duration::from_secs(1);
        assert_eq!(distant.standing(later), Slow);
        let past = now + VERDICT_HOLDS;
        assert_eq!(distant.standing(past), Unknown);
        assert_eq!(distant.with(Fast, past), none.with(Fast, past));
    }
}
