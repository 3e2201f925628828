//! Gauges that describe the node's state (per-shard locks, waiters,
//! leadership, Raft indexes; queue depths, memory, transport and audit
//! counters), rebuilt at each scrape from what the node already publishes
//! ([`NodeSnapshot`]): nothing on the request path or in the store loop
//! writes them.

use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts, Registry};

use super::{gauge, gauge_value, shard_gauge};
use crate::store::metrics::counter;
use crate::store::ShardStatus;

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
    disk_free_bytes: IntGauge,
    disk_low: IntGauge,
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
    /// Free bytes on the data directory's file system at the last check
    /// (`u64::MAX` before the first).
    pub disk_free_bytes: u64,
    /// Whether new acquires are refused for want of disk space.
    pub disk_low: bool,
}

/// Every scrape-time gauge.
pub(super) struct StateGauges {
    shard: ShardGauges,
    node: NodeGauges,
}

impl StateGauges {
    /// Registers the state families in `r`.
    pub(super) fn register(r: &Registry) -> StateGauges {
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
            disk_free_bytes: gauge(
                r,
                "fencelock_disk_free_bytes",
                "Free bytes on the data directory's file system, read every second.",
            ),
            disk_low: gauge(
                r,
                "fencelock_disk_low",
                "1 while the data directory's free space is below edge.min_free_disk_bytes and new acquires are refused, else 0.",
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
        StateGauges { shard, node }
    }

    /// Sets every gauge from `snap`.
    pub(super) fn refresh(&self, snap: &NodeSnapshot) {
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
            (
                &n.disk_free_bytes,
                if snap.disk_free_bytes == u64::MAX {
                    0
                } else {
                    snap.disk_free_bytes
                },
            ),
            (&n.disk_low, u64::from(snap.disk_low)),
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
}
