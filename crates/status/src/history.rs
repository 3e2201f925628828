//! The status page's memory: a bounded ring of cluster samples and the
//! rates and latencies between consecutive ones. Pure: samples arrive with
//! their time as a value (the sampler reads the clock), so every figure the
//! charts draw is a function of the samples and is unit-tested.

use std::collections::{BTreeMap, VecDeque};

use fencelock_api::internal::RequestTotals;

/// One look at the cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    /// Wall-clock time of the look, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Locks held, over every shard whose leader answered.
    pub held_locks: u64,
    /// Acquires queued, over the same shards.
    pub waiters: u64,
    /// What each node that answered had served since it started.
    pub requests: BTreeMap<u64, RequestTotals>,
}

/// The figures between two consecutive samples, stamped with the later one
/// (also `/status.json`'s `series` entries, field for field).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Point {
    pub at_ms: u64,
    /// Client requests answered per second, cluster-wide; `None` when no
    /// node could be compared (each missing or restarted in between).
    pub requests_per_s: Option<f64>,
    /// Acquires granted per second, cluster-wide.
    pub grants_per_s: Option<f64>,
    /// Median and 99th-percentile request latency over the interval, in
    /// milliseconds (queued acquires included); `None` without requests.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Nodes whose counters entered the figures above.
    pub nodes_counted: usize,
    /// From the later sample.
    pub held_locks: u64,
    pub waiters: u64,
}

/// The last `capacity` samples, oldest first.
#[derive(Debug)]
pub struct History {
    samples: VecDeque<Sample>,
    capacity: usize,
}

impl History {
    pub fn new(capacity: usize) -> History {
        assert!(capacity >= 2, "rates need two samples");
        History {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds the newest sample, forgetting the oldest past the capacity. A
    /// sample older than the newest kept one (the wall clock stepped back)
    /// restarts the history: rates across a clock step would be invented.
    pub fn push(&mut self, sample: Sample) {
        if self
            .samples
            .back()
            .is_some_and(|last| sample.at_ms <= last.at_ms)
        {
            self.samples.clear();
        }
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        debug_assert!(self.samples.len() <= self.capacity);
        debug_assert!(self
            .samples
            .iter()
            .zip(self.samples.iter().skip(1))
            .all(|(a, b)| a.at_ms < b.at_ms));
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Time the kept samples span, in milliseconds.
    pub fn span_ms(&self) -> u64 {
        match (self.samples.front(), self.samples.back()) {
            (Some(first), Some(last)) => last.at_ms - first.at_ms,
            _ => 0,
        }
    }

    /// One point per pair of consecutive samples, oldest first.
    pub fn points(&self) -> Vec<Point> {
        self.samples
            .iter()
            .zip(self.samples.iter().skip(1))
            .map(|(a, b)| between(a, b))
            .collect()
    }
}

/// The figures from sample `a` to the later sample `b`.
pub fn between(a: &Sample, b: &Sample) -> Point {
    assert!(b.at_ms > a.at_ms, "samples out of order");
    let seconds = (b.at_ms - a.at_ms) as f64 / 1000.0;
    let mut answered = 0u64;
    let mut granted = 0u64;
    let mut counted = 0usize;
    let mut bounds: Option<&[u64]> = None;
    let mut buckets: Vec<u64> = Vec::new();
    // Every answered request is in its node's histogram (counted together),
    // those past the last bound too: the quantiles' total is the answered
    // count, not the last bucket's, so slow queued acquires stay in p99.
    let mut latency_total = 0u64;
    for (node, later) in &b.requests {
        let Some(earlier) = a.requests.get(node) else {
            continue;
        };
        // A counter that fell is a process that restarted in between: its
        // interval is unknown, so it is left out rather than guessed.
        if later.answered < earlier.answered || later.granted < earlier.granted {
            continue;
        }
        counted += 1;
        answered += later.answered - earlier.answered;
        granted += later.granted - earlier.granted;
        let comparable = later.latency_bucket_upper_us == earlier.latency_bucket_upper_us
            && later.latency_bucket_counts.len() == later.latency_bucket_upper_us.len()
            && earlier.latency_bucket_counts.len() == earlier.latency_bucket_upper_us.len()
            && bounds.is_none_or(|b| b == later.latency_bucket_upper_us.as_slice());
        if !comparable {
            continue;
        }
        bounds = Some(&later.latency_bucket_upper_us);
        latency_total += later.answered - earlier.answered;
        buckets.resize(later.latency_bucket_counts.len(), 0);
        for (i, (l, e)) in later
            .latency_bucket_counts
            .iter()
            .zip(&earlier.latency_bucket_counts)
            .enumerate()
        {
            buckets[i] += l.saturating_sub(*e);
        }
    }
    let quantile = |q: f64| -> Option<f64> {
        let bounds = bounds?;
        quantile_ms(bounds, &buckets, latency_total, q)
    };
    let rate = |n: u64| (counted > 0).then(|| n as f64 / seconds);
    Point {
        at_ms: b.at_ms,
        requests_per_s: rate(answered),
        grants_per_s: rate(granted),
        p50_ms: quantile(0.5),
        p99_ms: quantile(0.99),
        nodes_counted: counted,
        held_locks: b.held_locks,
        waiters: b.waiters,
    }
}

/// The `q` quantile of the requests counted in cumulative `buckets` (one
/// per upper bound in `bounds_us`), in milliseconds, interpolated linearly
/// inside the bucket it falls in (as Prometheus's `histogram_quantile`).
/// Requests past the last bound are not in `buckets`: when the quantile
/// falls among them the answer is the last bound (a floor, not a guess).
/// `None` when no request was counted.
pub fn quantile_ms(bounds_us: &[u64], buckets: &[u64], total: u64, q: f64) -> Option<f64> {
    debug_assert_eq!(bounds_us.len(), buckets.len());
    debug_assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative");
    debug_assert!((0.0..=1.0).contains(&q));
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower_us = 0u64;
    let mut below = 0u64;
    for (upper_us, count) in bounds_us.iter().zip(buckets) {
        if *count as f64 >= rank {
            let inside = (count - below) as f64;
            let fraction = if inside > 0.0 {
                (rank - below as f64) / inside
            } else {
                1.0
            };
            let us = lower_us as f64 + (upper_us - lower_us) as f64 * fraction.clamp(0.0, 1.0);
            return Some(us / 1000.0);
        }
        lower_us = *upper_us;
        below = *count;
    }
    Some(*bounds_us.last()? as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS_US: [u64; 4] = [1_000, 10_000, 100_000, 1_000_000];

    fn totals(answered: u64, granted: u64, buckets: [u64; 4]) -> RequestTotals {
        RequestTotals {
            answered,
            granted,
            latency_bucket_upper_us: BOUNDS_US.to_vec(),
            latency_bucket_counts: buckets.to_vec(),
        }
    }

    fn sample(at_ms: u64, requests: &[(u64, RequestTotals)]) -> Sample {
        Sample {
            at_ms,
            requests: requests.iter().cloned().collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn rates_add_up_over_nodes_per_second() {
        let a = sample(
            10_000,
            &[(1, totals(100, 10, [100; 4])), (2, totals(0, 0, [0; 4]))],
        );
        let b = sample(
            12_000,
            &[
                (1, totals(300, 30, [300; 4])),
                (2, totals(100, 0, [100; 4])),
            ],
        );
        let p = between(&a, &b);
        assert_eq!(p.requests_per_s, Some(150.0));
        assert_eq!(p.grants_per_s, Some(10.0));
        assert_eq!(p.nodes_counted, 2);
        assert_eq!(p.at_ms, 12_000);
    }

    #[test]
    fn a_restarted_or_missing_node_is_left_out_not_counted_negative() {
        let a = sample(
            0,
            &[(1, totals(500, 5, [500; 4])), (2, totals(10, 0, [10; 4]))],
        );
        let b = sample(
            1_000,
            &[(1, totals(20, 1, [20; 4])), (3, totals(7, 0, [7; 4]))],
        );
        let p = between(&a, &b);
        assert_eq!(p.requests_per_s, None, "node 1 restarted, 2 gone, 3 new");
        assert_eq!(p.p99_ms, None);
        assert_eq!(p.nodes_counted, 0);
    }

    #[test]
    fn latency_quantiles_come_from_the_interval_not_the_process_lifetime() {
        // Before: 1000 slow requests (all in the 100 ms–1 s bucket).
        let a = sample(0, &[(1, totals(1000, 0, [0, 0, 0, 1000]))]);
        // Then 100 fast ones: 90 under 1 ms, 10 between 1 and 10 ms.
        let b = sample(1_000, &[(1, totals(1100, 0, [90, 100, 100, 1100]))]);
        let p = between(&a, &b);
        let p50 = p.p50_ms.unwrap();
        assert!(p50 > 0.0 && p50 <= 1.0, "{p50}");
        let p99 = p.p99_ms.unwrap();
        assert!(p99 > 1.0 && p99 <= 10.0, "{p99}");
    }

    #[test]
    fn requests_slower_than_the_last_bound_stay_in_the_p99() {
        // 100 answered in the interval, only 90 within the last bound.
        let a = sample(0, &[(1, totals(0, 0, [0; 4]))]);
        let b = sample(1_000, &[(1, totals(100, 0, [90, 90, 90, 90]))]);
        assert_eq!(between(&a, &b).p99_ms, Some(1_000.0));
    }

    #[test]
    fn a_quantile_past_the_last_bound_reports_the_last_bound() {
        // 10 requests, only 5 within the last bound.
        assert_eq!(
            quantile_ms(&BOUNDS_US, &[0, 0, 0, 5], 10, 0.99),
            Some(1_000.0)
        );
        assert_eq!(quantile_ms(&BOUNDS_US, &[0; 4], 0, 0.5), None);
        // All in the first bucket: interpolated from 0.
        assert_eq!(quantile_ms(&BOUNDS_US, &[4; 4], 4, 0.5), Some(0.5));
    }

    #[test]
    fn history_keeps_the_newest_samples_and_restarts_on_a_clock_step_back() {
        let mut h = History::new(3);
        for t in 1..=5 {
            h.push(sample(t * 1_000, &[]));
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.span_ms(), 2_000);
        assert_eq!(h.points().len(), 2);
        h.push(sample(4_500, &[]));
        assert_eq!(h.len(), 1, "a step back forgets the rest");
        assert!(h.points().is_empty());
    }
}
