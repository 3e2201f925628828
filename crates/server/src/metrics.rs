//! The node's Prometheus metrics.
//!
//! This module owns the node's metric registry and every metric in it. Names
//! follow `fencelock_<subsystem>_<what>_<unit>` (base units: seconds;
//! counters end in `_total`). No label ever carries a resource name: label
//! values come from small fixed sets (operation, outcome, shard id); the
//! hottest resources are an admin call (`fencelock admin hot`) instead.
//!
//! One registry per node, not the process-global default: the in-process
//! cluster tests run three nodes in one process.
//!
//! Three kinds of sources, each as cheap as its path needs:
//! * the request path ([`RequestMetrics`]) updates counters and histograms
//!   resolved once at start: a few atomic adds per request, no label lookup;
//! * the store loop owns thread-local copies ([`StoreMetrics`]) and flushes
//!   them once per Raft tick, so the hot loop touches no shared memory for
//!   a metric;
//! * gauges that describe state (per-shard locks, waiters, leadership,
//!   queue depths, transport counters) are read at scrape time from what the
//!   node already publishes ([`NodeSnapshot`], [`Metrics::render`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use fencelock_api::v1::{ErrorDetail, Reason};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::security::conn::Refusal;
pub use crate::store::metrics::StoreMetrics;
use crate::store::metrics::{counter, counter_vec, StoreHandles};
use crate::store::ShardStatus;

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
}

impl Op {
    pub const ALL: [Op; 5] = [Op::Acquire, Op::Renew, Op::RenewBatch, Op::Release, Op::Get];

    pub fn label(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Renew => "renew",
            Op::RenewBatch => "renew_batch",
            Op::Release => "release",
            Op::Get => "get",
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
            | TenantQuotaExceeded => Outcome::Conflict,
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

/// Per-shard gauges, rebuilt from the store's published status at scrape.
struct ShardGauges {
    locks_held: IntGaugeVec,
    waiters: IntGaugeVec,
    is_leader: IntGaugeVec,
    epoch: IntGaugeVec,
    term: IntGaugeVec,
    applied_index: IntGaugeVec,
    commit_index: IntGaugeVec,
    leaderless_seconds: prometheus::GaugeVec,
    voters: IntGaugeVec,
    dedup_entries: IntGaugeVec,
    snapshot_bytes: IntGaugeVec,
}

/// Node-wide gauges and counters read at scrape.
struct NodeGauges {
    shards_without_leader: IntGauge,
    store_queue_depth: IntGauge,
    store_queue_capacity: IntGauge,
    waiting_acquires: IntGauge,
    in_flight_requests: IntGauge,
    draining: IntGauge,
    transport_dropped: IntCounter,
    transport_batches: IntCounter,
    transport_messages: IntCounter,
    audit_lines: IntCounter,
    audit_dropped: IntCounter,
    resident_bytes: IntGauge,
    memtable_bytes: IntGauge,
    block_cache_bytes: IntGauge,
    table_readers_bytes: IntGauge,
}

/// What the node publishes, read at scrape time.
#[derive(Clone, Debug, Default)]
pub struct NodeSnapshot {
    pub shards: Vec<ShardStatus>,
    pub store_queue_depth: usize,
    pub store_queue_capacity: usize,
    pub in_flight_requests: usize,
    pub draining: bool,
    pub transport_dropped_total: u64,
    pub transport_batches_total: u64,
    pub transport_messages_total: u64,
    pub audit_lines_total: u64,
    pub audit_dropped_total: u64,
    pub engine_memory: fencelock_storage::EngineMemory,
    /// The process's resident set size.
    pub resident_bytes: u64,
}

/// The node's registry and every metric handle; see the module docs.
pub struct Metrics {
    registry: Registry,
    pub requests: RequestMetrics,
    store: StoreHandles,
    shard: ShardGauges,
    node: NodeGauges,
    /// Connections the gRPC port closed unserved, in `Refusal::ALL` order.
    connections_refused: [IntCounter; 3],
    /// The controller's own moves, as this node made them while leading
    /// the meta shard.
    pub controller: ControllerMetrics,
    /// Scrapes rebuild the per-shard gauges and advance the mirrored
    /// counters; one at a time, so two scrapes never interleave the two.
    scrape: Mutex<()>,
}

/// The controller's own rounds (crates/controller/src/act.rs).
#[derive(Clone)]
pub struct ControllerMetrics {
    /// Repair moves, balance steps and splits begun (each ends done or
    /// failed).
    pub moves_started: IntCounter,
    pub balance_started: IntCounter,
    pub splits_started: IntCounter,
    /// Repair moves that completed.
    pub moves_done: IntCounter,
    /// Repair moves that failed (the next round plans again).
    pub moves_failed: IntCounter,
    /// Balance steps (replica moves, leader transfers) that completed.
    pub balance_done: IntCounter,
    /// Balance steps that failed (the next round plans again).
    pub balance_failed: IntCounter,
    /// Shards split by load that completed.
    pub splits_done: IntCounter,
    /// Splits by load that failed (the next round chooses again).
    pub splits_failed: IntCounter,
    /// Nodes the controller marked `DOWN` in the map.
    pub marked_down: IntCounter,
    /// `DOWN` nodes the controller made `UP` again (emptied, answering).
    pub returned_up: IntCounter,
    /// Nodes counted as down (unreachable for at least
    /// `controller.node_down_after_ms`, or marked `DOWN`), as of the last
    /// round (0 when this node does not lead the meta shard).
    pub nodes_down: IntGauge,
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("unique name");
    g
}

/// A count or size as an integer gauge's value (Prometheus gauges are
/// signed): saturates instead of wrapping to a negative number.
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One `key:  <n> kB` field of a Linux `/proc/<pid>/status` file, in KiB
/// (`VmRSS:`, `VmHWM:`, ...); `None` if absent or malformed. (The load-test
/// harness reads the same fields of the nodes' processes with its own copy:
/// it deliberately does not link the server.)
fn proc_status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// This process's resident set size (`VmRSS`), or 0 where the platform
/// does not report it.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| proc_status_kib(&status, "VmRSS:"))
        .map_or(0, |kib| kib * 1024)
}

fn shard_gauge(registry: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), &["shard"]).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("unique name");
    g
}

impl Metrics {
    /// A registry with every metric of node `node_id` (a constant `node`
    /// label, so metrics of several nodes can be told apart even when a
    /// scraper does not add an instance label).
    pub fn new(node_id: u64) -> Metrics {
        let registry = Registry::new_custom(
            None,
            Some(std::iter::once(("node".to_owned(), node_id.to_string())).collect()),
        )
        .expect("valid registry");
        let r = &registry;

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
        let requests = RequestMetrics {
            outcomes,
            latency,
            batch_items,
            forwarded: counter(
                r,
                "fencelock_service_forwarded_requests_total",
                "Client requests this node forwarded to the node serving their shard.",
            ),
        };

        let store = StoreHandles::register(r);

        let shard = ShardGauges {
            locks_held: shard_gauge(
                r,
                "fencelock_shard_locks_held",
                "Held locks of a shard; reported by its serving leader only, so sums over nodes count each shard once.",
            ),
            waiters: shard_gauge(
                r,
                "fencelock_shard_waiters",
                "Queued acquires of a shard; reported by its serving leader only.",
            ),
            is_leader: shard_gauge(
                r,
                "fencelock_shard_is_leader",
                "1 when this node's replica of the shard leads and serves, else 0.",
            ),
            epoch: shard_gauge(
                r,
                "fencelock_shard_epoch",
                "The shard's epoch as this replica has applied it.",
            ),
            term: shard_gauge(r, "fencelock_shard_term", "This replica's Raft term."),
            applied_index: shard_gauge(
                r,
                "fencelock_shard_applied_index",
                "Highest log index this replica applied.",
            ),
            commit_index: shard_gauge(
                r,
                "fencelock_shard_commit_index",
                "Highest log index this replica knows committed.",
            ),
            leaderless_seconds: {
                let g = prometheus::GaugeVec::new(
                    Opts::new(
                        "fencelock_shard_leaderless_seconds",
                        "Seconds this replica has known no leader for its shard (0 while it knows one).",
                    ),
                    &["shard"],
                )
                .expect("valid gauge");
                r.register(Box::new(g.clone())).expect("unique name");
                g
            },
            voters: shard_gauge(
                r,
                "fencelock_shard_voters",
                "Voters in the shard's configuration as this replica sees it.",
            ),
            dedup_entries: shard_gauge(
                r,
                "fencelock_shard_dedup_entries",
                "Acquire outcomes this replica keeps for retries by request id (live leases and waits, and ended ones for lock.dedup_retention_ms); every replica reports, as each holds them in memory.",
            ),
            snapshot_bytes: shard_gauge(
                r,
                "fencelock_shard_snapshot_bytes",
                "Size of the latest state-machine snapshot of this replica: the one it restarted from, took or installed.",
            ),
        };

        let node = NodeGauges {
            shards_without_leader: gauge(
                r,
                "fencelock_raft_shards_without_leader",
                "Shard replicas on this node that know no leader.",
            ),
            store_queue_depth: gauge(
                r,
                "fencelock_store_queue_depth",
                "Requests and messages waiting in the store loop's inbox.",
            ),
            store_queue_capacity: gauge(
                r,
                "fencelock_store_queue_capacity",
                "Capacity of the store loop's inbox (raft.store_queue_depth); a full inbox answers SERVER_BUSY.",
            ),
            waiting_acquires: gauge(
                r,
                "fencelock_store_waiting_acquires",
                "Queued acquires over every shard this node leads.",
            ),
            in_flight_requests: gauge(
                r,
                "fencelock_service_in_flight_requests",
                "Client requests being served by this node now.",
            ),
            draining: gauge(
                r,
                "fencelock_node_draining",
                "1 while the node shuts down gracefully (leaderships moving away, requests draining).",
            ),
            transport_dropped: counter(
                r,
                "fencelock_transport_dropped_messages_total",
                "Raft messages dropped before reaching a peer stream (full queue, unreachable peer, oversize, fault rule); Raft retransmits.",
            ),
            transport_batches: counter(
                r,
                "fencelock_transport_batches_sent_total",
                "Batches of Raft messages handed to peer streams.",
            ),
            transport_messages: counter(
                r,
                "fencelock_transport_messages_sent_total",
                "Raft messages handed to peer streams.",
            ),
            audit_lines: counter(
                r,
                "fencelock_audit_lines_total",
                "Audit log lines written.",
            ),
            audit_dropped: counter(
                r,
                "fencelock_audit_dropped_lines_total",
                "Audit log lines dropped because the writer fell behind or the file could not be written.",
            ),
            resident_bytes: gauge(
                r,
                "fencelock_process_resident_memory_bytes",
                "Resident set size of the node process.",
            ),
            memtable_bytes: gauge(
                r,
                "fencelock_storage_memtable_bytes",
                "RocksDB memtables (written, not yet flushed), all column families.",
            ),
            block_cache_bytes: gauge(
                r,
                "fencelock_storage_block_cache_bytes",
                "RocksDB block cache in use, all column families.",
            ),
            table_readers_bytes: gauge(
                r,
                "fencelock_storage_table_readers_bytes",
                "RocksDB index and filter blocks of open SST files held outside the block cache.",
            ),
        };
        let info = IntGaugeVec::new(
            Opts::new(
                "fencelock_build_info",
                "Always 1; the `version` label is the running binary's version.",
            ),
            &["version"],
        )
        .expect("valid gauge");
        r.register(Box::new(info.clone())).expect("unique name");
        info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        let refused_vec = counter_vec(
            r,
            "fencelock_connections_refused_total",
            "Connections the gRPC port closed before serving a call, by reason: max_connections, per_source (edge.max_connections_per_source), handshake_timeout.",
            &["reason"],
        );
        let connections_refused =
            Refusal::ALL.map(|why| refused_vec.with_label_values(&[why.label()]));

        let repair_moves = counter_vec(
            r,
            "fencelock_controller_repair_moves_total",
            "Replica moves the controller made by itself to replace replicas on down nodes, by outcome: started, done, failed.",
            &["outcome"],
        );
        let balance_steps = counter_vec(
            r,
            "fencelock_controller_balance_steps_total",
            "Replica moves and leader transfers the controller made by itself to even out the UP nodes (controller.balance), by outcome: started, done, failed.",
            &["outcome"],
        );
        let splits = counter_vec(
            r,
            "fencelock_controller_splits_total",
            "Data shards the controller split by itself for holding controller.split_above_locks locks or writing controller.split_above_writes_per_sec, by outcome: started, done, failed.",
            &["outcome"],
        );
        let marks = counter_vec(
            r,
            "fencelock_controller_node_marks_total",
            "Node states the controller recorded by itself, by state: down (unreachable for controller.node_down_after_ms), up (a DOWN node answering again with no replica left).",
            &["state"],
        );
        let controller = ControllerMetrics {
            moves_started: repair_moves.with_label_values(&["started"]),
            balance_started: balance_steps.with_label_values(&["started"]),
            splits_started: splits.with_label_values(&["started"]),
            marked_down: marks.with_label_values(&["down"]),
            returned_up: marks.with_label_values(&["up"]),
            splits_done: splits.with_label_values(&["done"]),
            splits_failed: splits.with_label_values(&["failed"]),
            moves_done: repair_moves.with_label_values(&["done"]),
            moves_failed: repair_moves.with_label_values(&["failed"]),
            balance_done: balance_steps.with_label_values(&["done"]),
            balance_failed: balance_steps.with_label_values(&["failed"]),
            nodes_down: gauge(
                r,
                "fencelock_controller_nodes_down",
                "Nodes the controller counts as down (unreachable for controller.node_down_after_ms, or marked DOWN); reported by the meta shard's leader, 0 elsewhere.",
            ),
        };

        Metrics {
            registry,
            requests,
            store,
            shard,
            node,
            connections_refused,
            controller,
            scrape: Mutex::new(()),
        }
    }

    /// The counters of the gRPC port's connection refusals, for
    /// `security::conn::Refusals`.
    pub fn connection_refusals(&self) -> [IntCounter; 3] {
        self.connections_refused.clone()
    }

    /// Thread-local accumulators for the store loop.
    pub fn store_locals(&self) -> StoreMetrics {
        self.store.locals()
    }

    /// The Prometheus text exposition of every metric, with the state
    /// gauges taken from `snapshot`.
    pub fn render(&self, snapshot: &NodeSnapshot) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        self.refresh(snapshot);
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding of valid metrics");
        String::from_utf8(out).expect("text exposition is UTF-8")
    }

    fn refresh(&self, snap: &NodeSnapshot) {
        let g = &self.shard;
        for vec in [
            &g.locks_held,
            &g.waiters,
            &g.is_leader,
            &g.epoch,
            &g.term,
            &g.applied_index,
            &g.commit_index,
            &g.voters,
            &g.dedup_entries,
            &g.snapshot_bytes,
        ] {
            // Replicas come and go (moves, splits): only current ones stay.
            vec.reset();
        }
        g.leaderless_seconds.reset();
        let mut leaderless = 0;
        let mut waiting = 0;
        for s in &snap.shards {
            let shard = s.shard_id.to_string();
            let l = [shard.as_str()];
            if s.is_leader {
                g.locks_held.with_label_values(&l).set(s.held as i64);
                g.waiters.with_label_values(&l).set(s.waiters as i64);
                waiting += s.waiters;
            }
            for (vec, value) in [
                (&g.is_leader, i64::from(s.is_leader)),
                (&g.epoch, gauge_value(s.epoch)),
                (&g.term, gauge_value(s.term)),
                (&g.applied_index, gauge_value(s.applied_index)),
                (&g.commit_index, gauge_value(s.commit_index)),
                (&g.voters, s.voters.len() as i64),
                (&g.dedup_entries, s.dedup_entries as i64),
                (&g.snapshot_bytes, gauge_value(s.snapshot_bytes)),
            ] {
                vec.with_label_values(&l).set(value);
            }
            g.leaderless_seconds
                .with_label_values(&l)
                .set(s.leaderless_ms as f64 / 1_000.0);
            if s.leader_id == 0 {
                leaderless += 1;
            }
        }
        let n = &self.node;
        n.shards_without_leader.set(leaderless);
        n.waiting_acquires.set(waiting as i64);
        n.store_queue_depth.set(snap.store_queue_depth as i64);
        n.store_queue_capacity.set(snap.store_queue_capacity as i64);
        n.in_flight_requests.set(snap.in_flight_requests as i64);
        n.draining.set(i64::from(snap.draining));
        let memory = &snap.engine_memory;
        for (g, bytes) in [
            (&n.resident_bytes, snap.resident_bytes),
            (&n.memtable_bytes, memory.memtable_bytes),
            (&n.block_cache_bytes, memory.block_cache_bytes),
            (&n.table_readers_bytes, memory.table_readers_bytes),
        ] {
            g.set(gauge_value(bytes));
        }
        // Counters kept elsewhere (transport, audit) are mirrored by
        // advancing ours to theirs.
        for (c, now) in [
            (&n.transport_dropped, snap.transport_dropped_total),
            (&n.transport_batches, snap.transport_batches_total),
            (&n.transport_messages, snap.transport_messages_total),
            (&n.audit_lines, snap.audit_lines_total),
            (&n.audit_dropped, snap.audit_dropped_total),
        ] {
            c.inc_by(now.saturating_sub(c.get()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_fields_are_read_in_kib_and_absent_ones_are_none() {
        let status = "Name:\tfencelock\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(proc_status_kib(status, "VmRSS:"), Some(10_240));
        assert_eq!(proc_status_kib(status, "VmHWM:"), Some(20_480));
        assert_eq!(proc_status_kib(status, "VmSwap:"), None);
        assert_eq!(proc_status_kib("VmRSS:\tlots kB\n", "VmRSS:"), None);
        // This process reports its own resident memory.
        assert!(resident_bytes() > 0);
    }

    #[test]
    fn every_reason_has_an_outcome_class_and_names_follow_the_convention() {
        let m = Metrics::new(1);
        let text = m.render(&NodeSnapshot {
            shards: vec![ShardStatus {
                shard_id: 3,
                is_leader: true,
                held: 7,
                dedup_entries: 11,
                snapshot_bytes: 4096,
                ..Default::default()
            }],
            engine_memory: fencelock_storage::EngineMemory {
                memtable_bytes: 1 << 20,
                ..Default::default()
            },
            resident_bytes: 5 << 20,
            ..Default::default()
        });
        for line in [
            "fencelock_shard_locks_held{shard=\"3\",node=\"1\"} 7",
            "fencelock_shard_dedup_entries{shard=\"3\",node=\"1\"} 11",
            "fencelock_shard_snapshot_bytes{shard=\"3\",node=\"1\"} 4096",
            "fencelock_storage_memtable_bytes{node=\"1\"} 1048576",
            "fencelock_process_resident_memory_bytes{node=\"1\"} 5242880",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line.split_whitespace().skip(2);
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(name.starts_with("fencelock_"), "{name}");
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            } else {
                assert!(!name.ends_with("_total"), "{name}");
            }
        }
        // Every reason maps somewhere (the match is exhaustive) and the
        // retriable ones are not reported as conflicts.
        assert_eq!(Outcome::of_reason(Reason::NotLeader), Outcome::Unavailable);
        assert_eq!(Outcome::of_reason(Reason::LockHeld), Outcome::Conflict);
        assert_eq!(Outcome::of_reason(Reason::OutcomeUnknown), Outcome::Unknown);
    }

    #[test]
    fn an_abandoned_request_counts_as_cancelled() {
        let m = Metrics::new(1);
        drop(m.requests.start(Op::Acquire));
        m.requests.start(Op::Renew).finish(Outcome::Ok);
        let text = m.render(&NodeSnapshot::default());
        assert!(text.contains(
            "fencelock_service_requests_total{op=\"acquire\",outcome=\"cancelled\",node=\"1\"} 1"
        ));
        assert!(text.contains(
            "fencelock_service_requests_total{op=\"renew\",outcome=\"ok\",node=\"1\"} 1"
        ));
    }
}
