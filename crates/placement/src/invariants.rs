//! [`PlacementMap::check_invariants`]: every rule the map relies on,
//! checked after each apply in debug builds and on every snapshot restore,
//! so a forged or corrupted snapshot can never become the map.

use std::collections::BTreeSet;

use crate::limits::*;
use crate::map::{check_addr, PlacementMap};
use crate::types::{Migration, NodeState};

impl PlacementMap {
    /// Checks every invariant the map relies on. Run after each apply in
    /// debug builds and on every snapshot restore.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.version == 0 {
            return Err("version 0".into());
        }
        if !(1..=MAX_REPLICATION_FACTOR).contains(&self.replication_factor) {
            return Err(format!("replication factor {}", self.replication_factor));
        }
        if self.nodes.len() > MAX_NODES {
            return Err(format!("{} nodes", self.nodes.len()));
        }
        let mut addrs = BTreeSet::new();
        for (&id, node) in &self.nodes {
            if id == 0 || node.node_id != id {
                return Err(format!("node {id} stored as {}", node.node_id));
            }
            check_addr(&node.addr).map_err(|e| format!("node {id}: {e}"))?;
            if !addrs.insert(node.addr.as_str()) {
                return Err(format!("node {id}: address {:?} used twice", node.addr));
            }
        }
        if self.shards.len() > MAX_SHARDS || self.next_shard_id != self.shards.len() as u64 {
            return Err(format!(
                "{} shards with next shard id {}",
                self.shards.len(),
                self.next_shard_id
            ));
        }
        if self.next_epoch == 0 || self.next_epoch > MAX_EPOCH + 1 || self.next_migration_id == 0 {
            return Err("counter out of range".into());
        }
        let mut epochs = BTreeSet::new();
        for (&id, shard) in &self.shards {
            // With `len == next_shard_id`, ids below it make the key set
            // exactly `0..next_shard_id`.
            if shard.shard_id != id || id >= self.next_shard_id {
                return Err(format!("shard {id} stored as {}", shard.shard_id));
            }
            if shard.replicas.is_empty() || shard.replicas.len() > MAX_REPLICAS_PER_SHARD {
                return Err(format!("shard {id}: {} replicas", shard.replicas.len()));
            }
            for node_id in &shard.replicas {
                match self.nodes.get(node_id) {
                    None => return Err(format!("shard {id} on unknown node {node_id}")),
                    Some(n) if n.state == NodeState::Drained => {
                        return Err(format!("shard {id} on drained node {node_id}"))
                    }
                    Some(_) => {}
                }
            }
            if id == META_SHARD_ID {
                if shard.epoch != 0 {
                    return Err(format!("meta shard at epoch {}", shard.epoch));
                }
            } else if shard.epoch == 0 || shard.epoch >= self.next_epoch {
                return Err(format!("shard {id}: epoch {} not handed out", shard.epoch));
            } else if !epochs.insert(shard.epoch) {
                return Err(format!("shard {id}: epoch {} shared", shard.epoch));
            }
        }
        if !self.shards.contains_key(&META_SHARD_ID) {
            return Err("no meta shard".into());
        }
        if self.slot_owners.len() != SLOT_COUNT as usize {
            return Err(format!("{} slots", self.slot_owners.len()));
        }
        for (slot, owner) in self.slot_owners.iter().enumerate() {
            if *owner == META_SHARD_ID || !self.shards.contains_key(owner) {
                return Err(format!("slot {slot} owned by shard {owner}"));
            }
        }
        if let Some(m) = &self.migration {
            self.check_migration(m, &epochs)?;
        }
        Ok(())
    }

    fn check_migration(&self, m: &Migration, shard_epochs: &BTreeSet<u64>) -> Result<(), String> {
        let bad = |why: &str| Err(format!("migration {}: {why}", m.id));
        if m.id == 0 || m.id >= self.next_migration_id {
            return bad("id not handed out");
        }
        let (Some(from), Some(to)) = (self.shards.get(&m.from_shard), self.shards.get(&m.to_shard))
        else {
            return bad("unknown shard");
        };
        if m.from_shard == m.to_shard
            || m.from_shard == META_SHARD_ID
            || m.to_shard == META_SHARD_ID
        {
            return bad("shards");
        }
        if m.slots.is_empty() || m.slots.len() > MAX_SLOTS_PER_MIGRATION {
            return bad("slot count");
        }
        if m.slots.windows(2).any(|w| w[0] >= w[1]) {
            return bad("slots not sorted");
        }
        if m.slots
            .iter()
            .any(|&s| s >= SLOT_COUNT || self.slot_owners[s as usize] != m.from_shard)
        {
            return bad("slot not owned by the source");
        }
        if m.epoch >= self.next_epoch || m.epoch <= from.epoch || m.epoch <= to.epoch {
            return bad("epoch not above both shards");
        }
        if shard_epochs.contains(&m.epoch) {
            return bad("epoch shared with a shard");
        }
        Ok(())
    }
}
