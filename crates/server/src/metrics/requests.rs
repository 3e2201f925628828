//! Client requests: a counter per (operation, outcome class) and a
//! latency histogram per operation, resolved once at start so a request
//! costs a few atomic adds and no label lookup.

use std::time::{Duration, Instant};

use fencelock_api::v1::{ErrorDetail, Reason};
use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};

use crate::store::metrics::{counter, counter_vec};

/// Request latency buckets, in seconds: sub-millisecond group commits up to
/// the longest proposal timeout, plus queued acquires that wait a minute.
const REQUEST_BUCKETS_SECONDS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
/// The client-facing operations that are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Acquire,
    Renew,
    RenewBatch,
    Release,
    Get,
    Proclaim,
    Watch,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Acquire,
        Op::Renew,
        Op::RenewBatch,
        Op::Release,
        Op::Get,
        Op::Proclaim,
        Op::Watch,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::RenewBatch => "renew_batch",
            Op::Release => "release",
            Op::Get => "get",
            Op::Proclaim => "proclaim",
            Op::Watch => "watch",
        }
    }
}

/// What became of a request, in the classes an operator alerts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered successfully (a release that released nothing included:
    /// release is idempotent).
    Ok,
    /// Refused by the lock rules: held by another, not the holder, queue
    /// full, hold limit, request id reused, wait cancelled.
    Conflict,
    /// A queued acquire's wait timed out.
    Timeout,
    /// Could not be served now; a retry may succeed (no leader, no quorum,
    /// not the leader, busy, shutting down, stale route, shard full).
    Unavailable,
    /// Proposed, but whether it committed is unknown (OUTCOME_UNKNOWN).
    Unknown,
    /// Malformed request.
    Invalid,
    /// A bug or storage failure (INTERNAL).
    Error,
    /// The caller went away before the answer.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Ok,
        Outcome::Conflict,
        Outcome::Timeout,
        Outcome::Unavailable,
        Outcome::Unknown,
        Outcome::Invalid,
        Outcome::Error,
        Outcome::Cancelled,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Conflict => "conflict",
            Outcome::Timeout => "timeout",
            Outcome::Unavailable => "unavailable",
            Outcome::Unknown => "unknown",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// The class of a wire reason.
    pub fn of_reason(reason: Reason) -> Outcome {
        use Reason::*;
        match reason {
            LockHeld
            | LeaseNotHeld
            | QueueFull
            | TenantWaitersExceeded
            | HoldLimitReached
            | RequestIdReused
            | LeaseIdCollision
            | WaitCancelled
            | TenantQuotaExceeded
            | ValuesFull
            | ModeMismatch => Outcome::Conflict,
            WaitTimedOut => Outcome::Timeout,
            NotLeader | LeaderUnknown | NoQuorum | LeaderNotReady | ShuttingDown | ServerBusy
            | EpochNotMatch | ShardNotFound | TokenSpaceExhausted | DedupTableFull | TableFull
            | RateLimited => Outcome::Unavailable,
            OutcomeUnknown => Outcome::Unknown,
            InvalidResource
            | InvalidRequestId
            | InvalidLeaseId
            | TtlOutOfRange
            | WaitTimeoutOutOfRange
            | BatchTooLarge
            | InvalidAdminRequest
            | MalformedRequest
            | MessageTooLarge
            | NodeNotFound
            | PlacementConflict
            | ValueTooLarge
            | FeatureNotEnabled
            | InvalidPermits
            | PermissionDenied => Outcome::Invalid,
            Internal | Unspecified => Outcome::Error,
        }
    }

    /// The class of a gRPC status: by its `ErrorDetail` when it has one,
    /// else by its code (a forwarded call that failed in transport).
    pub fn of_status(status: &tonic::Status) -> Outcome {
        if let Some(detail) = ErrorDetail::from_status(status) {
            return Outcome::of_reason(detail.reason());
        }
        match status.code() {
            tonic::Code::Ok => Outcome::Ok,
            tonic::Code::Unavailable | tonic::Code::ResourceExhausted => Outcome::Unavailable,
            tonic::Code::DeadlineExceeded => Outcome::Timeout,
            tonic::Code::Cancelled => Outcome::Cancelled,
            tonic::Code::InvalidArgument => Outcome::Invalid,
            _ => Outcome::Error,
        }
    }
}

/// Request counters and latency histograms, resolved per (op, outcome) at
/// start.
pub struct RequestMetrics {
    /// Indexed `op * Outcome::ALL.len() + outcome`.
    outcomes: Vec<IntCounter>,
    /// Indexed by op.
    latency: Vec<Histogram>,
    /// Renew-batch items by outcome, indexed like `Outcome::ALL`.
    batch_items: Vec<IntCounter>,
    forwarded: IntCounter,
}

impl RequestMetrics {
    fn index(op: Op) -> usize {
        Op::ALL.iter().position(|o| *o == op).expect("listed")
    }

    /// Starts timing one request; record its end with
    /// [`RequestTimer::finish`]. Dropped unfinished (the caller went away
    /// and the handler future with it), it counts as `cancelled`.
    pub fn start(&self, op: Op) -> RequestTimer<'_> {
        RequestTimer {
            metrics: self,
            op,
            started: Instant::now(),
            done: false,
        }
    }

    fn outcome_index(outcome: Outcome) -> usize {
        Outcome::ALL
            .iter()
            .position(|x| *x == outcome)
            .expect("listed")
    }

    /// The counter of (`op`, `outcome`).
    fn counter(&self, op: Op, outcome: Outcome) -> &IntCounter {
        &self.outcomes[Self::index(op) * Outcome::ALL.len() + Self::outcome_index(outcome)]
    }

    fn record(&self, op: Op, outcome: Outcome, elapsed: Duration) {
        self.counter(op, outcome).inc();
        self.latency[Self::index(op)].observe(elapsed.as_secs_f64());
    }

    /// Counts one item of a renew batch.
    pub fn batch_item(&self, outcome: Outcome) {
        self.batch_items[Self::outcome_index(outcome)].inc();
    }

    /// Counts a request this node forwarded to another node.
    pub fn forwarded(&self) {
        self.forwarded.inc();
    }

    /// What this node answered since its process started, over every
    /// operation: the status page charts rates and latency from these
    /// (read by `NodeControl.Status`).
    pub fn totals(&self) -> crate::internal::RequestTotals {
        let answered = self.outcomes.iter().map(IntCounter::get).sum();
        let granted = self.counter(Op::Acquire, Outcome::Ok).get();
        let mut counts = vec![0u64; REQUEST_BUCKETS_SECONDS.len()];
        for histogram in &self.latency {
            let metric = prometheus::core::Metric::metric(histogram);
            let buckets = metric.get_histogram().get_bucket();
            debug_assert_eq!(buckets.len(), counts.len(), "one count per bound");
            for (sum, bucket) in counts.iter_mut().zip(buckets) {
                *sum += bucket.cumulative_count();
            }
        }
        crate::internal::RequestTotals {
            answered,
            granted,
            latency_bucket_upper_us: REQUEST_BUCKETS_SECONDS
                .iter()
                .map(|s| (s * 1e6).round() as u64)
                .collect(),
            latency_bucket_counts: counts,
        }
    }
}

/// One request being timed; see [`RequestMetrics::start`].
pub struct RequestTimer<'a> {
    metrics: &'a RequestMetrics,
    op: Op,
    started: Instant,
    done: bool,
}

impl RequestTimer<'_> {
    pub fn finish(mut self, outcome: Outcome) {
        self.done = true;
        self.metrics
            .record(self.op, outcome, self.started.elapsed());
    }

    /// Finishes with the outcome of a handler's result.
    pub fn finish_result<T>(self, result: &Result<T, tonic::Status>) {
        let outcome = match result {
            Ok(_) => Outcome::Ok,
            Err(status) => Outcome::of_status(status),
        };
        self.finish(outcome);
    }
}

impl Drop for RequestTimer<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.metrics
                .record(self.op, Outcome::Cancelled, self.started.elapsed());
        }
    }
}

impl RequestMetrics {
    /// Registers the request families in `r`.
    pub(super) fn register(r: &Registry) -> RequestMetrics {
        let outcomes_vec = counter_vec(
            r,
            "fencelock_service_requests_total",
            "Client requests answered by this node (the node the client called), by operation and outcome class.",
            &["op", "outcome"],
        );
        let latency_vec = prometheus::HistogramVec::new(
            HistogramOpts::new(
                "fencelock_service_request_duration_seconds",
                "Time from receiving a client request to answering it, forwarding and queueing included, by operation.",
            )
            .buckets(REQUEST_BUCKETS_SECONDS.to_vec()),
            &["op"],
        )
        .expect("valid histogram");
        r.register(Box::new(latency_vec.clone()))
            .expect("unique name");
        let mut outcomes = Vec::new();
        let mut latency = Vec::new();
        for op in Op::ALL {
            for outcome in Outcome::ALL {
                outcomes.push(outcomes_vec.with_label_values(&[op.label(), outcome.label()]));
            }
            latency.push(latency_vec.with_label_values(&[op.label()]));
        }
        let items_vec = counter_vec(
            r,
            "fencelock_service_renew_batch_items_total",
            "Items of RenewBatch requests, by outcome class.",
            &["outcome"],
        );
        let batch_items = Outcome::ALL
            .iter()
            .map(|o| items_vec.with_label_values(&[o.label()]))
            .collect();
        RequestMetrics {
            outcomes,
            latency,
            batch_items,
            forwarded: counter(
                r,
                "fencelock_service_forwarded_requests_total",
                "Client requests this node forwarded to the node serving their shard.",
            ),
        }
    }
}
