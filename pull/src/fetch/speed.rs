//! What the node has learnt of a registry host's speed, shared by all its pulls.
//!
//! A blob of a host the node has no recent word on starts on one connection, judged as
//! it runs; when that proves slow, the stream goes on as the blob's first ranged
//! request and the rest comes as parallel ranges ([`super::ranges`]). The verdict then
//! holds for all pulls for a while: their blobs start as ranges at once, not one slow
//! stream each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a verdict holds: networks change, and a judgement costs only one blob's start.
const VERDICT_HOLDS: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No recent judgement: blobs start as streams, each judged.
    Unknown,
    /// Slower than one stream should be: blobs start as ranges.
    Slow,
    /// A stream was fast: blobs start as streams (still judged as they run).
    Fast,
}

/// The verdict given at `given` (`None`: never), as it stands at `now`.
fn standing(given: Option<(Verdict, Instant)>, now: Instant) -> Verdict {
    match given {
        Some((verdict, at)) if now.saturating_duration_since(at) < VERDICT_HOLDS => verdict,
        _ => Verdict::Unknown,
    }
}

/// One registry host's speed, as the node's pulls found it.
#[derive(Debug, Default)]
pub(crate) struct HostSpeed {
    given: Mutex<Option<(Verdict, Instant)>>,
}

impl HostSpeed {
    pub(crate) fn verdict(&self) -> Verdict {
        standing(*self.given(), Instant::now())
    }

    /// Record what a stream showed.
    pub(crate) fn judge(&self, verdict: Verdict) {
        *self.given() = Some((verdict, Instant::now()));
    }

    fn given(&self) -> std::sync::MutexGuard<'_, Option<(Verdict, Instant)>> {
        self.given.lock().unwrap_or_else(PoisonError::into_inner)
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
    fn a_verdict_holds_for_a_while_then_is_asked_again() {
        let now = Instant::now();
        assert_eq!(standing(None, now), Verdict::Unknown);
        assert_eq!(standing(Some((Verdict::Slow, now)), now), Verdict::Slow);
        assert_eq!(
            standing(
                Some((Verdict::Fast, now)),
                now + VERDICT_HOLDS - Duration::from_secs(1)
            ),
            Verdict::Fast
        );
        assert_eq!(
            standing(Some((Verdict::Slow, now)), now + VERDICT_HOLDS),
            Verdict::Unknown
        );
    }
}
