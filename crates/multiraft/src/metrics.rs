//! The store loop's metrics: the shared handles registered in the node's
//! registry ([`StoreHandles`]) and the loop's thread-local accumulators
//! flushed into them once per Raft tick ([`StoreMetrics`]), so the hot loop
//! touches no shared memory for a metric. The server's metrics module owns
//! the registry and everything else in it.

use prometheus::local::{LocalHistogram, LocalIntCounter};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

/// Raft and disk latency buckets, in seconds: an fsync on a good SSD is tens
/// of microseconds; a commit across zones a few milliseconds; anything near
/// a second is an incident.
pub const RAFT_BUCKETS_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];
/// Batch-size buckets (entries or commands per synced write): powers of two
/// up to the store loop's per-iteration drain bound.
pub const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("valid histogram");
    registry.register(Box::new(h.clone())).expect("unique name");
    h
}

pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("unique name");
    c
}

pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("unique name");
    c
}

/// The store loop's metrics, as thread-local accumulators flushed into the
/// shared registry by [`StoreMetrics::flush`] (once per Raft tick).
pub struct StoreMetrics {
    pub fsync_seconds: LocalHistogram,
    pub fsync_entries: LocalHistogram,
    pub fsync_commands: LocalHistogram,
    pub iteration_seconds: LocalHistogram,
    pub snapshot_seconds: LocalHistogram,
    pub propose_commit_seconds: LocalHistogram,
    pub commit_apply_seconds: LocalHistogram,
    pub leader_changes: LocalIntCounter,
    pub snapshots_taken: LocalIntCounter,
    pub snapshots_installed: LocalIntCounter,
    pub snapshots_sent: LocalIntCounter,
    pub grants: LocalIntCounter,
    pub grants_from_queue: LocalIntCounter,
    pub releases: LocalIntCounter,
    pub expiries: LocalIntCounter,
    pub lease_cancels: LocalIntCounter,
    pub proclaims: LocalIntCounter,
    pub wait_timeouts: LocalIntCounter,
    pub wait_cancels: LocalIntCounter,
    pub renewals: LocalIntCounter,
    pub renewal_failures: LocalIntCounter,
    /// Commands this node proposed since the last synced write; observed
    /// into `fsync_commands` at the next one.
    pub commands_since_sync: u64,
}

impl StoreMetrics {
    pub fn flush(&mut self) {
        for h in [
            &self.iteration_seconds,
            &self.fsync_seconds,
            &self.fsync_entries,
            &self.fsync_commands,
            &self.snapshot_seconds,
            &self.propose_commit_seconds,
            &self.commit_apply_seconds,
        ] {
            h.flush();
        }
        for c in [
            &self.leader_changes,
            &self.snapshots_taken,
            &self.snapshots_installed,
            &self.snapshots_sent,
            &self.grants,
            &self.grants_from_queue,
            &self.releases,
            &self.expiries,
            &self.lease_cancels,
            &self.proclaims,
            &self.wait_timeouts,
            &self.wait_cancels,
            &self.renewals,
            &self.renewal_failures,
        ] {
            c.flush();
        }
    }
}

/// Shared handles the store loop's locals flush into.
pub struct StoreHandles {
    fsync_seconds: Histogram,
    fsync_entries: Histogram,
    fsync_commands: Histogram,
    iteration_seconds: Histogram,
    snapshot_seconds: Histogram,
    propose_commit_seconds: Histogram,
    commit_apply_seconds: Histogram,
    leader_changes: IntCounter,
    snapshots: IntCounterVec,
    lock_events: IntCounterVec,
    renewals: IntCounter,
    renewal_failures: IntCounter,
}

impl StoreHandles {
    /// Registers every store metric in `r`.
    pub fn register(r: &Registry) -> StoreHandles {
        StoreHandles {
        fsync_seconds: histogram(
            r,
            "fencelock_store_fsync_duration_seconds",
            "Duration of one synced RocksDB write on the writer thread (group commit: every shard's staged Raft state; the loop keeps going meanwhile).",
            RAFT_BUCKETS_SECONDS,
        ),
        fsync_entries: histogram(
            r,
            "fencelock_store_fsync_entries",
            "Raft log entries (all shards) persisted by one synced write.",
            BATCH_BUCKETS,
        ),
        fsync_commands: histogram(
            r,
            "fencelock_store_fsync_commands",
            "Lock commands this node proposed that one synced write carried (group commit).",
            BATCH_BUCKETS,
        ),
        iteration_seconds: histogram(
            r,
            "fencelock_store_iteration_duration_seconds",
            "Busy time of one store-loop iteration (handle, propose, stage, send, apply, answer; the synced write runs off the loop): every shard on the node waits for it.",
            RAFT_BUCKETS_SECONDS,
        ),
        snapshot_seconds: histogram(
            r,
            "fencelock_store_snapshot_duration_seconds",
            "Time one shard's state-machine snapshot took to encode, on the snapshot thread (off the store loop).",
            RAFT_BUCKETS_SECONDS,
        ),
        propose_commit_seconds: histogram(
            r,
            "fencelock_raft_propose_commit_duration_seconds",
            "Time from proposing an entry on the leader to seeing it committed by a majority.",
            RAFT_BUCKETS_SECONDS,
        ),
        commit_apply_seconds: histogram(
            r,
            "fencelock_raft_commit_apply_duration_seconds",
            "Time from a replica learning an entry is committed to having applied it.",
            RAFT_BUCKETS_SECONDS,
        ),
        leader_changes: counter(
            r,
            "fencelock_raft_leader_changes_total",
            "Times a shard replica on this node became leader.",
        ),
        snapshots: counter_vec(
            r,
            "fencelock_raft_snapshots_total",
            "Raft snapshots: taken (log compaction), sent to a lagging replica, installed from a leader.",
            &["kind"],
        ),
        lock_events: counter_vec(
            r,
            "fencelock_lock_events_total",
            "Lock state changes applied by shards this node leads: granted, granted_from_queue, released, expired, cancelled, wait_timed_out, wait_cancelled.",
            &["event"],
        ),
        renewals: counter(
            r,
            "fencelock_lock_renewals_total",
            "Renewals applied by shards this node leads.",
        ),
        renewal_failures: counter(
            r,
            "fencelock_lock_renewal_failures_total",
            "Renewals refused at apply by shards this node leads (the lease was no longer held).",
        ),
    }
    }

    /// Thread-local accumulators for the store loop.
    pub fn locals(&self) -> StoreMetrics {
        let s = self;
        let event = |name: &str| s.lock_events.with_label_values(&[name]).local();
        StoreMetrics {
            fsync_seconds: s.fsync_seconds.local(),
            fsync_entries: s.fsync_entries.local(),
            fsync_commands: s.fsync_commands.local(),
            iteration_seconds: s.iteration_seconds.local(),
            snapshot_seconds: s.snapshot_seconds.local(),
            propose_commit_seconds: s.propose_commit_seconds.local(),
            commit_apply_seconds: s.commit_apply_seconds.local(),
            leader_changes: s.leader_changes.local(),
            snapshots_taken: s.snapshots.with_label_values(&["taken"]).local(),
            snapshots_installed: s.snapshots.with_label_values(&["installed"]).local(),
            snapshots_sent: s.snapshots.with_label_values(&["sent"]).local(),
            grants: event("granted"),
            grants_from_queue: event("granted_from_queue"),
            releases: event("released"),
            expiries: event("expired"),
            lease_cancels: event("cancelled"),
            proclaims: event("value_changed"),
            wait_timeouts: event("wait_timed_out"),
            wait_cancels: event("wait_cancelled"),
            renewals: s.renewals.local(),
            renewal_failures: s.renewal_failures.local(),
            commands_since_sync: 0,
        }
    }
}
