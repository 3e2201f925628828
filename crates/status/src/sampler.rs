//! The task that feeds the status page's history: every
//! [`STATUS_SAMPLE_MS`] it asks every node of the map for its status (the
//! same bounded fan-out as `ListShards`) and records one [`Sample`]. It
//! runs while the admin port serves; each node keeps its own history, so
//! any node's page shows the whole cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::history::{History, Sample};
use super::STATUS_SAMPLE_MS;
use fencelock_api::internal::NodeStatus;
use fencelock_controller::nodes::NodeApi;
use fencelock_controller::ops::{Ops, LIST_STATUS_TIMEOUT};

/// Samples until the task is aborted. `wall_ms` is the node's wall clock
/// (milliseconds since the epoch), which stamps each sample.
pub fn spawn<N: NodeApi>(
    ops: Ops<N>,
    history: Arc<Mutex<History>>,
    wall_ms: fn() -> u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(STATUS_SAMPLE_MS));
        // A slow fan-out delays the next look; it never queues a burst.
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            // The node's own map: asking every node for a newer one first
            // would cost a timeout per unreachable node.
            let Some(map) = ops.router().map() else {
                continue;
            };
            let statuses = ops.statuses_within(&map, LIST_STATUS_TIMEOUT).await;
            let sample = sample_of(wall_ms(), &statuses);
            // A poisoned lock still holds a usable history (a panic
            // elsewhere cannot leave a half-pushed sample).
            history
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(sample);
        }
    })
}

/// The sample the statuses make: each shard counted once, at the replica
/// that serves as its leader.
pub fn sample_of(at_ms: u64, statuses: &BTreeMap<u64, NodeStatus>) -> Sample {
    let mut counted_shards = std::collections::BTreeSet::new();
    let mut held_locks = 0;
    let mut waiters = 0;
    for status in statuses.values() {
        for r in status.replicas.iter().filter(|r| r.is_leader) {
            // Two replicas that both believe they lead (an old leader not
            // yet told) would count a shard's locks twice.
            if counted_shards.insert(r.shard_id) {
                held_locks += r.held_locks;
                waiters += r.waiters;
            }
        }
    }
    Sample {
        at_ms,
        held_locks,
        waiters,
        requests: statuses
            .iter()
            .filter_map(|(node, s)| Some((*node, s.requests.clone()?)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_api::internal::{ReplicaStatus, RequestTotals};

    fn leader(shard_id: u64, held_locks: u64) -> ReplicaStatus {
        ReplicaStatus {
            shard_id,
            is_leader: true,
            held_locks,
            waiters: 1,
            ..ReplicaStatus::default()
        }
    }

    #[test]
    fn each_shard_counts_once_and_only_nodes_that_sent_totals_have_rates() {
        let statuses: BTreeMap<u64, NodeStatus> = [
            (
                1,
                NodeStatus {
                    node_id: 1,
                    replicas: vec![leader(1, 5), leader(2, 7)],
                    requests: Some(RequestTotals {
                        answered: 9,
                        ..RequestTotals::default()
                    }),
                    ..NodeStatus::default()
                },
            ),
            (
                2,
                NodeStatus {
                    node_id: 2,
                    // A stale leader of shard 2.
                    replicas: vec![leader(2, 6)],
                    ..NodeStatus::default()
                },
            ),
        ]
        .into_iter()
        .collect();
        let s = sample_of(42, &statuses);
        assert_eq!(s.at_ms, 42);
        assert_eq!(s.held_locks, 12);
        assert_eq!(s.waiters, 2);
        assert_eq!(s.requests.len(), 1, "node 2 sent no totals");
        assert_eq!(s.requests[&1].answered, 9);
    }
}
