//! The leadership hand-off of a node that stops (step 2 of the server's
//! graceful shutdown): every shard it leads hands leadership to another
//! voter that is serving, so no shard waits out an election timeout for a
//! leader that is gone.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::nodes::NodeApi;
use crate::ops::{join_all, Ops};

/// One leadership transfer may take this long before the next voter is
/// tried: a transfer completes within an election timeout or not at all.
const TRANSFER_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a peer's health check may take before it counts as not serving.
const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between rounds of handovers: longer than a Raft tick at the
/// slowest allowed setting would be wasteful; this covers the default.
const STATUS_SETTLE: Duration = Duration::from_millis(200);

/// A shard the stopping node leads, as its store last published it.
#[derive(Clone, Debug)]
pub struct LedShard {
    pub shard_id: u64,
    pub voters: Vec<u64>,
}

/// Hands every shard `led_here` lists to another voter that is serving.
/// Returns the shards still led here when it stops: at `deadline`, or at
/// once when no other voter serves (the whole cluster is stopping, or the
/// shard has a single replica), since waiting could not help.
pub async fn move_leaderships_away<N: NodeApi>(
    node_id: u64,
    led_here: impl Fn() -> Vec<LedShard>,
    ops: &Ops<N>,
    deadline: Instant,
) -> Vec<u64> {
    loop {
        let led = led_here();
        if led.is_empty() || Instant::now() >= deadline {
            return led.iter().map(|r| r.shard_id).collect();
        }
        let candidates: BTreeSet<u64> = led
            .iter()
            .flat_map(|r| r.voters.iter().copied())
            .filter(|v| *v != node_id)
            .collect();
        let checks = candidates.iter().map(|n| async move {
            let check = ops.nodes().is_serving(*n);
            let serving = tokio::time::timeout(HEALTH_CHECK_TIMEOUT, check).await;
            (*n, matches!(serving, Ok(true)))
        });
        let serving_nodes: BTreeSet<u64> = join_all(checks)
            .await
            .into_iter()
            .filter_map(|(n, ok)| ok.then_some(n))
            .collect();
        let plans: Vec<(u64, Vec<u64>)> = led
            .iter()
            .filter_map(|r| {
                // Spread the shards over the other serving voters (by shard
                // id), then fall back to the rest in order.
                let mut to: Vec<u64> = r
                    .voters
                    .iter()
                    .copied()
                    .filter(|v| serving_nodes.contains(v))
                    .collect();
                if to.is_empty() {
                    return None;
                }
                let first = (r.shard_id as usize) % to.len();
                to.rotate_left(first);
                Some((r.shard_id, to))
            })
            .collect();
        if plans.is_empty() {
            return led.iter().map(|r| r.shard_id).collect();
        }
        let moves = plans.iter().map(|(shard_id, targets)| async move {
            for &to in targets {
                let attempt = ops.transfer_leader(*shard_id, to);
                match tokio::time::timeout(TRANSFER_ATTEMPT_TIMEOUT, attempt).await {
                    Ok(Ok(_)) => {
                        tracing::info!(shard_id, to, "leadership handed over");
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(shard_id, to, "leader transfer failed: {e}"),
                    Err(_) => tracing::warn!(shard_id, to, "leader transfer timed out"),
                }
                if Instant::now() >= deadline {
                    return;
                }
            }
        });
        let all = join_all(moves);
        let _ = tokio::time::timeout_at(deadline, all).await;
        // The node publishes its status once per Raft tick: give the
        // handovers time to show before looking again.
        tokio::time::sleep(STATUS_SETTLE).await;
    }
}
