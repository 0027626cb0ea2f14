//! Prometheus histograms read from the text of `/metrics`: the buckets of one series
//! summed across replicas, and a quantile of what was observed between two readings.

use std::collections::BTreeMap;

/// The cumulative buckets of histogram `metric` (its `_bucket` series) in Prometheus
/// texts, the series whose line holds `filter` added up by bound: upper bound (seconds)
/// → cumulative count, sorted (pure).
pub fn buckets_of<'a>(
    texts: impl IntoIterator<Item = &'a str>,
    metric: &str,
    filter: &str,
) -> Vec<(f64, f64)> {
    let series = format!("{metric}{{");
    let mut buckets: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in texts.into_iter().flat_map(str::lines) {
        if !line.starts_with(&series) || !line.contains(filter) {
            continue;
        }
        let Some(le) = line
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        let count: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0.0);
        let slot = buckets.entry(le.to_owned()).or_insert((bound, 0.0));
        slot.1 += count;
    }
    let mut out: Vec<(f64, f64)> = buckets.into_values().collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The `q` quantile (seconds) of what was observed between two readings of a histogram,
/// interpolated within its bucket as Prometheus's `histogram_quantile` does.
pub fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(bound, count)| {
            let earlier = before
                .iter()
                .find(|(b, _)| b == bound)
                .map_or(0.0, |(_, c)| *c);
            (*bound, count - earlier)
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (bound, count) in counts {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let within = (rank - lower.1) / (count - lower.1).max(f64::MIN_POSITIVE);
            return Some(lower.0 + (bound - lower.0) * within);
        }
        lower = (bound, count);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_within_the_bucket_of_the_delta() {
        let before = [
            (0.005, 10.0),
            (0.025, 10.0),
            (0.1, 10.0),
            (f64::INFINITY, 10.0),
        ];
        let after = [
            (0.005, 60.0),
            (0.025, 150.0),
            (0.1, 160.0),
            (f64::INFINITY, 160.0),
        ];
        // 150 observed: 50 under 5 ms, 90 in 5–25 ms, 10 in 25–100 ms.
        let p50 = quantile(&before, &after, 0.5).unwrap_or_default();
        assert!((p50 - (0.005 + 0.02 * (25.0 / 90.0))).abs() < 1e-9, "{p50}");
        let p99 = quantile(&before, &after, 0.99).unwrap_or_default();
        assert!((p99 - (0.025 + 0.075 * (8.5 / 10.0))).abs() < 1e-9, "{p99}");
        assert_eq!(quantile(&after, &after, 0.99), None);
    }

    #[test]
    fn buckets_add_up_across_series_and_replicas_and_skip_other_metrics() {
        let leader = "# TYPE rigger_controller_webhook_review_duration_seconds histogram\n\
            rigger_controller_webhook_review_duration_seconds_sum{answer=\"allowed\"} 0.5\n\
            rigger_controller_webhook_review_duration_seconds_bucket{le=\"0.005\",answer=\"allowed\"} 3\n\
            rigger_controller_webhook_review_duration_seconds_bucket{le=\"+Inf\",answer=\"allowed\"} 4\n\
            rigger_controller_webhook_review_duration_seconds_bucket{le=\"0.005\",answer=\"denied\"} 1\n\
            rigger_controller_webhook_review_duration_seconds_bucket{le=\"+Inf\",answer=\"denied\"} 1\n";
        let follower = "rigger_controller_webhook_review_duration_seconds_bucket{le=\"0.005\",answer=\"allowed\"} 2\n\
            rigger_controller_webhook_review_duration_seconds_bucket{le=\"+Inf\",answer=\"allowed\"} 2\n";
        let buckets = buckets_of(
            [leader, follower],
            "rigger_controller_webhook_review_duration_seconds_bucket",
            "",
        );
        assert_eq!(buckets, vec![(0.005, 6.0), (f64::INFINITY, 7.0)]);
        let denied = buckets_of(
            [leader],
            "rigger_controller_webhook_review_duration_seconds_bucket",
            "answer=\"denied\"",
        );
        assert_eq!(denied, vec![(0.005, 1.0), (f64::INFINITY, 1.0)]);
    }
}
