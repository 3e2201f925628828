//! Split by load: when a data shard holds at least
//! `controller.split_above_locks` locks, the meta leader splits it in two
//! through the same protocol as `admin reshard split` (a new shard on the
//! same nodes takes the upper half of its slots, at a new, higher epoch, so
//! tokens keep rising for every moved resource).
//!
//! The choice is [`plan_split`]'s (pure): the busiest shard over the
//! threshold that owns two slots or more. One split at a time — nothing
//! while a migration is open — and nothing while paused or while a node is
//! unreachable (repair first). Lock counts come from the shards' leaders.

use std::collections::BTreeMap;

use fencelock_placement::{plan_split, ShardLoad};

use crate::error::ControllerError;
use crate::nodes::NodeApi;
use crate::ops::Ops;
use crate::reshard::Resharded;

impl<N: NodeApi> Ops<N> {
    /// One split round: split the busiest data shard holding at least
    /// `split_above_locks` locks (0: never), or do nothing. Returns the
    /// split shard and what the split did.
    pub async fn split_round(
        &self,
        split_above_locks: u64,
    ) -> Result<Option<(u64, Resharded)>, ControllerError> {
        if split_above_locks == 0 {
            return Ok(None);
        }
        let map = self.fresh_map().await?;
        if map.scheduler_paused() || map.migration().is_some() {
            return Ok(None);
        }
        let statuses = self.statuses(&map).await;
        if map.nodes().any(|n| !statuses.contains_key(&n.node_id)) {
            return Ok(None);
        }
        let mut loads = BTreeMap::new();
        for status in statuses.values() {
            for r in status.replicas.iter().filter(|r| r.is_leader) {
                loads.insert(
                    r.shard_id,
                    ShardLoad {
                        held_locks: r.held_locks,
                        owned_slots: r.owned_slots,
                    },
                );
            }
        }
        let Some(shard_id) = plan_split(&loads, split_above_locks, map.shards().count()) else {
            return Ok(None);
        };
        let done = self.split(shard_id, 0).await?;
        Ok(Some((shard_id, done)))
    }
}
