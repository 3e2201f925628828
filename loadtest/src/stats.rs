//! What the harness measures: one HDR histogram per operation over the
//! whole measured window, outcome counts, and per-second buckets (their own
//! small histograms) for the latency-over-time and throughput charts.
//!
//! Latencies are in microseconds and are recorded for successful requests
//! only (a timeout's "latency" is the harness's deadline, which says nothing
//! of the server); failures are counted by outcome. For open-loop requests
//! the latency runs from the *scheduled* start, not from when the request
//! was actually sent.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::outcome::{Op, Outcome};

/// Largest latency a histogram can hold; longer ones are clamped to it.
pub const MAX_LATENCY_US: u64 = 300_000_000;
/// Significant figures of the whole-run histograms (0.1% resolution).
const RUN_SIGFIG: u8 = 3;
/// Significant figures of the per-second histograms: 1% is plenty for a
/// chart, and they are many.
const SERIES_SIGFIG: u8 = 2;
/// Error messages kept per outcome, as examples for the report.
const MAX_ERROR_SAMPLES: usize = 5;

fn new_histogram(sigfig: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, sigfig).expect("static histogram bounds")
}

struct OpStats {
    latency_us: Histogram<u64>,
    outcomes: [u64; Outcome::ALL.len()],
}

impl OpStats {
    fn new() -> OpStats {
        OpStats {
            latency_us: new_histogram(RUN_SIGFIG),
            outcomes: [0; Outcome::ALL.len()],
        }
    }
}

/// One second of the run.
#[derive(Default)]
struct Bucket {
    latency_us: BTreeMap<Op, Histogram<u64>>,
    failed: BTreeMap<Op, u64>,
}

struct State {
    /// Start of the measured window; buckets count seconds from it.
    start: Instant,
    ops: BTreeMap<Op, OpStats>,
    buckets: Vec<Bucket>,
    error_samples: BTreeMap<Outcome, Vec<String>>,
}

impl State {
    fn new(start: Instant) -> State {
        State {
            start,
            ops: BTreeMap::new(),
            buckets: Vec::new(),
            error_samples: BTreeMap::new(),
        }
    }
}

/// Collects measurements from every request task. Cheap to share
/// (`Arc<Recorder>`); one short lock per recorded request.
pub struct Recorder {
    state: Mutex<State>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            state: Mutex::new(State::new(Instant::now())),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Plain counters: a panicked recorder leaves nothing inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets everything recorded so far and starts the measured window
    /// now (the end of a warm-up).
    pub fn restart(&self) {
        *self.state() = State::new(Instant::now());
    }

    /// Records one request of `op` that was due at `due` and ended at
    /// `done` with `outcome` (`error` describes a failure).
    pub fn record(
        &self,
        op: Op,
        due: Instant,
        done: Instant,
        outcome: Outcome,
        error: Option<&str>,
    ) {
        let latency_us = clamp_us(done.saturating_duration_since(due));
        let mut st = self.state();
        if done < st.start {
            // Finished before the measured window began (warm-up).
            return;
        }
        let second = done.duration_since(st.start).as_secs() as usize;
        let stats = st.ops.entry(op).or_insert_with(OpStats::new);
        stats.outcomes[outcome.index()] += 1;
        if outcome == Outcome::Ok {
            stats.latency_us.saturating_record(latency_us);
        }
        if st.buckets.len() <= second {
            st.buckets.resize_with(second + 1, Bucket::default);
        }
        let bucket = &mut st.buckets[second];
        if outcome == Outcome::Ok {
            bucket
                .latency_us
                .entry(op)
                .or_insert_with(|| new_histogram(SERIES_SIGFIG))
                .saturating_record(latency_us);
        } else {
            *bucket.failed.entry(op).or_default() += 1;
            if let Some(message) = error {
                let samples = st.error_samples.entry(outcome).or_default();
                if samples.len() < MAX_ERROR_SAMPLES {
                    samples.push(format!("{}: {message}", op.name()));
                }
            }
        }
    }

    /// Seconds since the measured window began.
    pub fn elapsed(&self) -> Duration {
        self.state().start.elapsed()
    }

    /// Totals so far per operation: (ok, failed), and the p99 of the last
    /// complete second, for the progress line.
    pub fn progress(&self) -> Vec<(Op, u64, u64, Option<f64>)> {
        let st = self.state();
        let last = st.start.elapsed().as_secs() as usize;
        st.ops
            .iter()
            .map(|(&op, s)| {
                let ok = s.outcomes[Outcome::Ok.index()];
                let failed = s.outcomes.iter().sum::<u64>() - ok;
                let p99 = last
                    .checked_sub(1)
                    .and_then(|i| st.buckets.get(i))
                    .and_then(|b| b.latency_us.get(&op))
                    .map(|h| us_to_ms(h.value_at_quantile(0.99)));
                (op, ok, failed, p99)
            })
            .collect()
    }

    /// Everything measured, in a serializable form.
    pub fn summary(&self) -> Summary {
        let st = self.state();
        let window_s = st.start.elapsed().as_secs_f64();
        let ops = st
            .ops
            .iter()
            .map(|(&op, s)| (op, OpSummary::new(s, window_s)))
            .collect();
        let series = st
            .buckets
            .iter()
            .enumerate()
            .map(|(second, b)| SeriesPoint {
                t_s: second as u64,
                ops: b
                    .latency_us
                    .iter()
                    .map(|(&op, h)| {
                        (
                            op,
                            SeriesOp {
                                ok: h.len(),
                                failed: b.failed.get(&op).copied().unwrap_or(0),
                                p50_ms: us_to_ms(h.value_at_quantile(0.50)),
                                p99_ms: us_to_ms(h.value_at_quantile(0.99)),
                            },
                        )
                    })
                    .chain(
                        b.failed
                            .iter()
                            .filter(|(op, _)| !b.latency_us.contains_key(op))
                            .map(|(&op, &failed)| {
                                (
                                    op,
                                    SeriesOp {
                                        ok: 0,
                                        failed,
                                        p50_ms: 0.0,
                                        p99_ms: 0.0,
                                    },
                                )
                            }),
                    )
                    .collect(),
            })
            .collect();
        Summary {
            window_s,
            ops,
            series,
            error_samples: st.error_samples.clone(),
        }
    }
}

fn clamp_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_LATENCY_US)
}

pub fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// One operation over the measured window.
#[derive(Clone, Debug, Serialize)]
pub struct OpSummary {
    /// Requests that ended in the window, any outcome.
    pub total: u64,
    /// Count per outcome name (`ok`, `conflict`, `timeout`, `unavailable`,
    /// `unknown`).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Successful requests per second of the window.
    pub ok_per_s: f64,
    /// Latency of successful requests, in ms.
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

impl OpSummary {
    fn new(s: &OpStats, window_s: f64) -> OpSummary {
        let h = &s.latency_us;
        let q = |quantile: f64| {
            if h.is_empty() {
                0.0
            } else {
                us_to_ms(h.value_at_quantile(quantile))
            }
        };
        let ok = s.outcomes[Outcome::Ok.index()];
        OpSummary {
            total: s.outcomes.iter().sum(),
            outcomes: Outcome::ALL
                .iter()
                .map(|o| (o.name(), s.outcomes[o.index()]))
                .collect(),
            ok_per_s: if window_s > 0.0 {
                ok as f64 / window_s
            } else {
                0.0
            },
            p50_ms: q(0.50),
            p95_ms: q(0.95),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: if h.is_empty() { 0.0 } else { us_to_ms(h.max()) },
            mean_ms: if h.is_empty() { 0.0 } else { h.mean() / 1000.0 },
        }
    }

    /// Requests that did not succeed.
    pub fn failed(&self) -> u64 {
        self.total - self.outcomes.get("ok").copied().unwrap_or(0)
    }
}

/// One second of the run, per operation.
#[derive(Clone, Debug, Serialize)]
pub struct SeriesPoint {
    /// Seconds since the measured window began.
    pub t_s: u64,
    pub ops: BTreeMap<Op, SeriesOp>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SeriesOp {
    pub ok: u64,
    pub failed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Length of the measured window.
    pub window_s: f64,
    pub ops: BTreeMap<Op, OpSummary>,
    pub series: Vec<SeriesPoint>,
    /// A few failure messages per outcome, as examples.
    pub error_samples: BTreeMap<Outcome, Vec<String>>,
}

impl Summary {
    /// Failed requests of every operation.
    pub fn failed(&self) -> u64 {
        self.ops.values().map(OpSummary::failed).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_counts_from_the_due_time_and_failures_are_counted_not_timed() {
        let recorder = Recorder::new();
        let due = Instant::now();
        recorder.record(
            Op::Acquire,
            due,
            due + Duration::from_millis(40),
            Outcome::Ok,
            None,
        );
        recorder.record(
            Op::Acquire,
            due,
            due + Duration::from_secs(9),
            Outcome::Timeout,
            Some("deadline"),
        );
        let summary = recorder.summary();
        let acquire = &summary.ops[&Op::Acquire];
        assert_eq!(acquire.total, 2);
        assert_eq!(acquire.outcomes["ok"], 1);
        assert_eq!(acquire.outcomes["timeout"], 1);
        assert!((acquire.max_ms - 40.0).abs() < 0.1, "{}", acquire.max_ms);
        assert_eq!(summary.failed(), 1);
        assert_eq!(summary.error_samples[&Outcome::Timeout].len(), 1);
    }

    #[test]
    fn restart_discards_the_warm_up() {
        let recorder = Recorder::new();
        let t = Instant::now();
        recorder.record(Op::Renew, t, t, Outcome::Ok, None);
        recorder.restart();
        recorder.record(Op::Renew, t, t, Outcome::Ok, None);
        assert!(recorder.summary().ops.is_empty());
    }
}
