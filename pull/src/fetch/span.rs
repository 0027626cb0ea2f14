//! How a blob's ranges are cut into requests: their spans as the download goes on, what a
//! stream found slow keeps, and the back half of a long request shared with an idle
//! connection ([`Reach`]). Decisions only; [`super::ranges`] makes the requests.

use std::sync::{Mutex, PoisonError};

/// Ranges one request covers at most.
pub(super) const MAX_SPAN: u64 = 8;
/// How far past the write position requests may start, in ranges: the spool never
/// holds more than this ahead of containerd (128 MiB of 2 MiB ranges; more lets
/// the download run ahead of an applier that cannot catch up anyway).
pub(super) const AHEAD: u64 = 64;

/// Consecutive ranges `first..first + count` fetched by one request (or, when a retry or
/// an earlier run left some of them partly there, by a few).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) first: u64,
    pub(super) count: u64,
}

/// The request starting at range `k` of `ranges`, the `issued`-th of its blob, when
/// `sharing` requests of the blob run at once: one range each for the first `sharing`
/// (the first bytes come soon and in order: containerd's ingest and the unpack start at
/// once), then two each, then four, up to [`MAX_SPAN`] (each request costs the registry
/// a lookup: 2 MiB requests of a 128 MiB layer cost the lab's registry 0.38 s of CPU,
/// 8 MiB ones 0.15 s); but never longer than an even share of what is left, so the last
/// requests end together instead of a few long ones running on alone (four 8 MiB
/// requests took the last 0.65 s of a 128 MiB blob at 16 MiB/s per connection while
/// twelve connections idled).
pub(super) fn next_span(k: u64, ranges: u64, issued: u64, sharing: u64) -> Span {
    let sharing = sharing.max(1);
    let wave = issued / sharing;
    let share = ranges.saturating_sub(k).div_ceil(sharing).max(1);
    Span {
        first: k,
        count: (1u64 << wave.min(8)).min(MAX_SPAN).min(share),
    }
}

/// The ranges `first..` of `ranges` a stream found slow goes on fetching, when the node
/// has `idle` connections nobody waits for: an even share of them and of the blob's next
/// [`AHEAD`] ranges with the new requests (so it ends with them; it closes its
/// connection there), all of those when there are none (the node's connections are
/// busy, and a stream costs the registry one lookup). Of a blob longer than that, no
/// more than a request's [`MAX_SPAN`]: the requests past [`AHEAD`] wait for the write
/// position, which only this stream moves.
pub(super) fn open_span(first: u64, ranges: u64, idle: usize) -> Span {
    let rest = ranges.saturating_sub(first);
    let share = rest.min(AHEAD).div_ceil(1 + idle as u64);
    let count = match rest > AHEAD {
        true => share.min(MAX_SPAN),
        false => share,
    };
    Span {
        first,
        count: count.max(1),
    }
}

/// Of a request filling range `filling` whose ranges end at `end`, the ranges another
/// request takes over: the back half (the larger, as the request going on still has its
/// current range to finish) of the untouched ranges after the one being filled, when
/// there are two or more. One untouched range is left to the request: a new one would
/// spend about as long reaching the registry as it saves.
pub(super) fn split_off(filling: u64, end: u64) -> Option<Span> {
    let untouched = end.saturating_sub(filling + 1);
    (untouched >= 2).then(|| {
        let count = untouched.div_ceil(2);
        Span {
            first: end - count,
            count,
        }
    })
}

/// How far one request may go. At a blob's end its last requests can be long (up to
/// [`MAX_SPAN`] ranges, a second at 16 MiB/s) while the node's other connections idle:
/// their last untouched ranges are then split off to requests of their own
/// ([`split_off`]). The request checks here before it fills each next range, so a range
/// is only ever filled by the one request that holds it.
#[derive(Debug)]
pub(super) struct Reach {
    pub(super) first: u64,
    state: Mutex<ReachState>,
}

#[derive(Debug)]
struct ReachState {
    /// The range the request fills now (or fills first).
    filling: u64,
    /// Ranges from here on are not the request's.
    end: u64,
    /// Ended (every range of its own filled, or failed), or not to be split.
    closed: bool,
}

impl Reach {
    pub(super) fn new(span: Span) -> Self {
        Self {
            first: span.first,
            state: Mutex::new(ReachState {
                filling: span.first,
                end: span.first + span.count,
                closed: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ReachState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn end(&self) -> u64 {
        self.state().end
    }

    /// The request goes on into range `k`: whether `k` is still its own.
    pub(super) fn enter(&self, k: u64) -> bool {
        let mut state = self.state();
        if k >= state.end {
            return false;
        }
        state.filling = state.filling.max(k);
        true
    }

    /// Untouched ranges after the one being filled (0 once closed).
    pub(super) fn untouched(&self) -> u64 {
        let state = self.state();
        match state.closed {
            true => 0,
            false => state.end.saturating_sub(state.filling + 1),
        }
    }

    /// Take the ranges a new request fetches instead ([`split_off`]), when none of them
    /// holds a byte (`untouched`): an earlier run's partial ranges stay where they are,
    /// and such a request is not split again.
    pub(super) fn split(&self, untouched: impl Fn(u64) -> bool) -> Option<Span> {
        let mut state = self.state();
        if state.closed {
            return None;
        }
        let span = split_off(state.filling, state.end)?;
        if !(span.first..span.first + span.count).all(untouched) {
            state.closed = true;
            return None;
        }
        state.end = span.first;
        Some(span)
    }

    pub(super) fn close(&self) {
        self.state().closed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::RANGE_WINDOW;

    /// The requests for ranges `first..ranges` when `sharing` run at once throughout.
    fn spans(first: u64, ranges: u64, sharing: u64) -> Vec<Span> {
        let mut plan: Vec<Span> = Vec::new();
        let mut k = first;
        while k < ranges {
            let span = next_span(k, ranges, plan.len() as u64, sharing);
            k += span.count;
            plan.push(span);
        }
        plan
    }

    #[test]
    fn requests_start_with_one_range_grow_to_the_longest_span_and_end_short() {
        let window = RANGE_WINDOW as u64;
        let counts = |plan: &[Span]| plan.iter().map(|s| s.count).collect::<Vec<_>>();
        let plan = spans(0, 100, window);
        assert!(plan.iter().take(RANGE_WINDOW).all(|s| s.count == 1));
        assert!(
            plan.iter()
                .skip(RANGE_WINDOW)
                .take(RANGE_WINDOW)
                .all(|s| s.count == 2)
        );
        assert_eq!(
            spans(0, 1000, window).iter().map(|s| s.count).max(),
            Some(MAX_SPAN)
        );
        for sharing in [1, 2, 4, window] {
            // Every range exactly once, in order.
            for (first, ranges) in [(0, 100), (0, 1000), (1, 64), (37, 40), (0, 1)] {
                let mut next = first;
                for span in spans(first, ranges, sharing) {
                    assert_eq!(span.first, next);
                    assert!(span.count >= 1);
                    next += span.count;
                }
                assert_eq!(next, ranges);
            }
            // No request is longer than an even share of what is left among the
            // requests running at once, so those running at the end are short.
            for (first, ranges) in [(0, 100), (0, 1000), (1, 64)] {
                let plan = spans(first, ranges, sharing);
                for span in &plan {
                    assert!(span.count <= (ranges - span.first).div_ceil(sharing));
                }
                if sharing > 1 {
                    let tail = &plan[plan.len() - sharing as usize / 2..];
                    assert!(tail.iter().all(|s| s.count == 1), "{:?}", counts(tail));
                }
            }
        }
        // 100 ranges: 16 of one, 16 of two, then shorter and shorter ones: 62 requests
        // instead of 100.
        let plan = spans(0, 100, window);
        assert_eq!(plan.len(), 62, "{:?}", counts(&plan));
        // With four blobs sharing 16 connections, the requests grow after four: a 128
        // range blob takes 31 requests instead of 69.
        let plan = spans(1, 128, 4);
        assert_eq!(counts(&plan[..12]), [1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4]);
        assert_eq!(plan.len(), 31, "{:?}", counts(&plan));
        assert_eq!(spans(1, 128, window).len(), 69);
        // 1000 ranges: mostly of MAX_SPAN.
        assert!(spans(0, 1000, window).len() < 1000 / MAX_SPAN as usize + 4 * RANGE_WINDOW);
        assert!(spans(0, window, window).iter().all(|s| s.count == 1));
        // A resumed blob starts where containerd's ingest is.
        assert_eq!(
            spans(98, 100, window),
            vec![
                Span {
                    first: 98,
                    count: 1
                },
                Span {
                    first: 99,
                    count: 1
                }
            ]
        );
        assert!(spans(5, 5, window).is_empty());
        // Nothing left or nothing shared still makes a request of one range.
        assert_eq!(next_span(7, 7, 100, 0).count, 1);
    }

    #[test]
    fn a_slow_stream_keeps_its_share_of_the_blob() {
        // The node's connections all busy: the stream keeps the whole rest.
        assert_eq!(
            open_span(3, 15, 0),
            Span {
                first: 3,
                count: 12
            }
        );
        // Fifteen idle: it keeps a sixteenth, the others take the rest.
        assert_eq!(open_span(0, 64, 15), Span { first: 0, count: 4 });
        assert_eq!(open_span(0, 10, 15), Span { first: 0, count: 1 });
        // Of a blob longer than the spool may hold ahead of containerd, a request's
        // span at most: the others wait for the write position it moves.
        assert_eq!(open_span(0, AHEAD, 0).count, AHEAD);
        assert_eq!(open_span(0, 1000, 0).count, MAX_SPAN);
        assert_eq!(open_span(5, 5 + 3 * AHEAD, 1).count, MAX_SPAN);
        assert_eq!(open_span(0, 1000, 15).count, AHEAD / 16);
        // At least the range it is in.
        assert_eq!(open_span(7, 7, 3).count, 1);
    }

    #[test]
    fn the_back_half_of_a_requests_untouched_ranges_is_split_off() {
        // Filling range 10 of 10..20: nine untouched, five go.
        assert_eq!(
            split_off(10, 20),
            Some(Span {
                first: 15,
                count: 5
            })
        );
        assert_eq!(
            split_off(10, 13),
            Some(Span {
                first: 12,
                count: 1
            })
        );
        // One untouched range (or none) stays with its request.
        assert_eq!(split_off(10, 12), None);
        assert_eq!(split_off(10, 11), None);
        assert_eq!(split_off(10, 10), None);
    }
}
