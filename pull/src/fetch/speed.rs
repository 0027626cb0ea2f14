//! What the node has learnt of a registry host's speed, shared by all its pulls.
//!
//! A blob starts on one connection; when that proves slow, the rest comes as parallel
//! ranges and the connection is dropped mid-body (HTTP/1.1 cannot stop a response
//! otherwise), so the next request needs a new one. Judged per blob, six images pulled
//! at once through a distant registry dropped sixteen connections at their start and
//! waited for sixteen new ones. So one blob at a time judges a host the node has no
//! recent word on, the others wait for its verdict, and the verdict holds for all pulls
//! for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a verdict holds: networks change, and a judgement costs only one blob's start.
const VERDICT_HOLDS: Duration = Duration::from_secs(60);
/// How long a blob waits for another's verdict: a judge whose stream is slow to start
/// (its unpacker's start is not counted as waiting for the network) or stalls holds no
/// other blob longer. A blob left without a word fetches as ranges, which a fast host
/// serves too.
const VERDICT_WAIT: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No recent judgement: a blob judges it, the others wait.
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
    /// Held by the blob judging the host.
    judging: tokio::sync::Mutex<()>,
}

/// The blob judging a host holds this until it gives its verdict (or ends without one,
/// too small to tell: then the next blob judges).
pub(crate) type Judging<'a> = tokio::sync::MutexGuard<'a, ()>;

impl HostSpeed {
    pub(crate) fn verdict(&self) -> Verdict {
        standing(*self.given(), Instant::now())
    }

    /// Record what a stream showed.
    pub(crate) fn judge(&self, verdict: Verdict) {
        *self.given() = Some((verdict, Instant::now()));
    }

    /// The verdict, waiting (up to [`VERDICT_WAIT`]) for the blob judging the host when
    /// there is none; `Unknown` comes with the turn to judge, or without it when the wait
    /// ran out.
    pub(crate) async fn verdict_or_turn(&self) -> (Verdict, Option<Judging<'_>>) {
        match self.verdict() {
            Verdict::Unknown => {}
            known => return (known, None),
        }
        let Ok(turn) = tokio::time::timeout(VERDICT_WAIT, self.judging.lock()).await else {
            return (self.verdict(), None);
        };
        match self.verdict() {
            Verdict::Unknown => (Verdict::Unknown, Some(turn)),
            known => (known, None),
        }
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

    #[tokio::test]
    async fn one_blob_judges_a_host_and_the_others_wait_for_its_verdict() {
        let speeds = HostSpeeds::default();
        let speed = speeds.of("registry.example");
        let (verdict, turn) = speed.verdict_or_turn().await;
        assert_eq!(verdict, Verdict::Unknown);
        assert!(turn.is_some());
        let other = speeds.of("registry.example");
        let waiting = tokio::spawn(async move {
            let (verdict, turn) = other.verdict_or_turn().await;
            (verdict, turn.is_some())
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "waits for the judge");
        speed.judge(Verdict::Slow);
        drop(turn);
        assert_eq!(waiting.await.unwrap(), (Verdict::Slow, false));
        // Another host is judged on its own.
        assert_eq!(
            speeds.of("mirror.example").verdict_or_turn().await.0,
            Verdict::Unknown
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_judge_that_stalls_holds_the_others_a_moment_at_most() {
        let speed = HostSpeed::default();
        let (_, stalled) = speed.verdict_or_turn().await;
        assert!(stalled.is_some());
        let started = tokio::time::Instant::now();
        let (verdict, turn) = speed.verdict_or_turn().await;
        assert_eq!((verdict, turn.is_some()), (Verdict::Unknown, false));
        assert_eq!(started.elapsed(), VERDICT_WAIT);
    }
}
