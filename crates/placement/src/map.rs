//! The placement map: the meta shard's replicated state machine.
//!
//! It owns the *intent* of the cluster: which nodes exist and what operators
//! declared about them, which shards exist, on which nodes each shard's
//! replicas live, which shard owns each slot, the epoch of every shard, the
//! one migration in progress, and the global epoch counter.
//!
//! [`PlacementMap::apply`] is the only way it changes. It is deterministic
//! and total: every command is fully validated before anything is touched,
//! so a refused command leaves the map exactly as it was, and a successful
//! one bumps [`PlacementMap::version`] by exactly one.
//!
//! Epochs are the map's safety duty. The counter only rises, every epoch it
//! hands out is above every epoch a shard ever had, and a shard that gains
//! slots moves to such a fresh epoch, so fencing tokens (epoch, then log
//! position) never go backwards when a resource changes shard.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::PlacementError;
use crate::limits::*;
use crate::types::*;

/// The replicated placement state. Equal maps encode to equal snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementMap {
    /// Number of successful commands since (and including) bootstrap.
    pub(crate) version: u64,
    pub(crate) replication_factor: usize,
    /// The next epoch to hand out; above every epoch ever handed out.
    pub(crate) next_epoch: u64,
    /// Shard ids are never reused, so the ids in use are `0..next_shard_id`.
    pub(crate) next_shard_id: u64,
    pub(crate) next_migration_id: u64,
    pub(crate) nodes: BTreeMap<u64, NodeEntry>,
    pub(crate) shards: BTreeMap<u64, ShardPlacement>,
    /// Owner of every slot, indexed by slot: always `SLOT_COUNT` entries,
    /// each a data shard.
    pub(crate) slot_owners: Vec<u64>,
    pub(crate) migration: Option<Migration>,
    /// The placement controller makes no move by itself while set
    /// (`fencelock admin scheduler pause`); operators' actions still run.
    pub(crate) scheduler_paused: bool,
    /// The placement format every member was seen to read when the
    /// controller last raised it (`RaiseClusterFormat`): the lock features
    /// that need a newer format than the first (holder values) are
    /// accepted only at or above theirs. Only rises.
    pub(crate) cluster_format: u32,
}

impl PlacementMap {
    /// The deterministic initial map: every node `Up`; the meta shard (epoch
    /// 0) and data shards `1..=shard_count` (shard `n` at epoch `n`), each
    /// on `min(nodes, replication_factor)` nodes taken in id order starting
    /// at position `shard_id % nodes`; the slots split into `shard_count`
    /// contiguous ranges in order (slot `s` owned by shard
    /// `s * shard_count / SLOT_COUNT + 1`), so that operators can name them
    /// as ranges.
    pub fn bootstrap(
        nodes: &[(u64, String)],
        shard_count: u32,
        replication_factor: usize,
    ) -> Result<PlacementMap, PlacementError> {
        if nodes.is_empty() {
            return Err(PlacementError::NoNodes);
        }
        if !(1..=MAX_BOOTSTRAP_SHARDS).contains(&shard_count) {
            return Err(PlacementError::InvalidShardCount {
                shard_count,
                max: MAX_BOOTSTRAP_SHARDS,
            });
        }
        if !(1..=MAX_REPLICATION_FACTOR).contains(&replication_factor) {
            return Err(PlacementError::InvalidReplicationFactor {
                factor: replication_factor,
                max: MAX_REPLICATION_FACTOR,
            });
        }
        let mut map = PlacementMap {
            version: 1,
            replication_factor,
            next_epoch: u64::from(shard_count) + 1,
            next_shard_id: u64::from(shard_count) + 1,
            next_migration_id: 1,
            nodes: BTreeMap::new(),
            shards: BTreeMap::new(),
            slot_owners: (0..SLOT_COUNT)
                .map(|slot| bootstrap_shard_of(slot, shard_count))
                .collect(),
            migration: None,
            scheduler_paused: false,
            cluster_format: crate::format::FIRST_PLACEMENT_FORMAT,
        };
        for (node_id, addr) in nodes {
            // The same rules as `AddNode`, so a bootstrapped map is one the
            // commands could have built.
            map.check_new_node(*node_id, addr)?;
            map.nodes.insert(*node_id, up_node(*node_id, addr));
        }
        let ids: Vec<u64> = map.nodes.keys().copied().collect();
        let per_shard = ids.len().min(replication_factor);
        for shard_id in 0..=u64::from(shard_count) {
            // Rotating the starting node spreads replicas (and first
            // leaders) evenly without any randomness.
            let start = (shard_id % ids.len() as u64) as usize;
            let replicas = (0..per_shard)
                .map(|i| ids[(start + i) % ids.len()])
                .collect();
            map.shards.insert(
                shard_id,
                ShardPlacement {
                    shard_id,
                    // Data shard n starts at epoch n; the meta shard at 0.
                    epoch: shard_id,
                    replicas,
                },
            );
        }
        debug_assert_eq!(map.check_invariants(), Ok(()));
        Ok(map)
    }

    /// Applies one committed command. Refused commands change nothing.
    pub fn apply(&mut self, cmd: &PlacementCommand) -> Result<PlacementReply, PlacementError> {
        let next_version = self
            .version
            .checked_add(1)
            .ok_or(PlacementError::CounterExhausted { counter: "version" })?;
        let reply = match cmd {
            PlacementCommand::AddNode { node_id, addr } => self.add_node(*node_id, addr),
            PlacementCommand::RemoveNode { node_id } => self.remove_node(*node_id),
            PlacementCommand::SetNodeState { node_id, state } => {
                self.set_node_state(*node_id, *state)
            }
            PlacementCommand::SetReplicas { shard_id, replicas } => {
                self.set_replicas(*shard_id, replicas)
            }
            PlacementCommand::CreateShard { replicas } => self.create_shard(replicas),
            PlacementCommand::BeginMigration {
                from_shard,
                to_shard,
                slots,
            } => self.begin_migration(*from_shard, *to_shard, slots),
            PlacementCommand::CommitMigration { migration_id } => {
                self.end_migration(*migration_id, true)
            }
            PlacementCommand::AbortMigration { migration_id } => {
                self.end_migration(*migration_id, false)
            }
            PlacementCommand::AdvanceEpoch { shard_id } => self.advance_epoch(*shard_id),
            PlacementCommand::RollBackMigration { migration_id } => {
                self.roll_back_migration(*migration_id)
            }
            PlacementCommand::BeginSplit { from_shard, slots } => {
                self.begin_split(*from_shard, slots)
            }
            PlacementCommand::SetSchedulerPaused { paused } => {
                self.scheduler_paused = *paused;
                Ok(PlacementReply::Updated)
            }
            PlacementCommand::RaiseEpochFloor { above_epoch } => {
                self.raise_epoch_floor(*above_epoch)
            }
            PlacementCommand::RaiseClusterFormat { format } => {
                // Whatever this build knows of formats: apply must not
                // depend on the build, or replicas of two builds diverge.
                self.cluster_format = self.cluster_format.max(*format);
                Ok(PlacementReply::Updated)
            }
        }?;
        self.version = next_version;
        // Cheap enough (a few thousand entries at most) to run on every apply
        // in debug builds, where the tests drive long random sequences.
        if cfg!(debug_assertions) {
            if let Err(broken) = self.check_invariants() {
                panic!("invariant broken after {cmd:?}: {broken}");
            }
        }
        Ok(reply)
    }

    // ----- commands: each validates everything, then mutates -----

    fn add_node(&mut self, node_id: u64, addr: &str) -> Result<PlacementReply, PlacementError> {
        self.check_new_node(node_id, addr)?;
        self.nodes.insert(node_id, up_node(node_id, addr));
        Ok(PlacementReply::NodeAdded)
    }

    fn remove_node(&mut self, node_id: u64) -> Result<PlacementReply, PlacementError> {
        let node = self.known_node(node_id)?;
        if node.state != NodeState::Drained {
            return Err(PlacementError::NodeNotDrained {
                node_id,
                state: node.state,
            });
        }
        // Drained implies empty (`set_node_state` and `check_replica_set`
        // keep it so), which is why removing cannot orphan a replica.
        debug_assert!(self.shards_on_node(node_id).is_empty());
        self.nodes.remove(&node_id);
        Ok(PlacementReply::NodeRemoved)
    }

    fn set_node_state(
        &mut self,
        node_id: u64,
        state: NodeState,
    ) -> Result<PlacementReply, PlacementError> {
        self.known_node(node_id)?;
        if state == NodeState::Drained {
            let held = self.shards_on_node(node_id);
            if let Some(&shard_id) = held.first() {
                return Err(PlacementError::NodeHoldsReplicas {
                    node_id,
                    shard_id,
                    count: held.len(),
                });
            }
        }
        if let Some(node) = self.nodes.get_mut(&node_id) {
            node.state = state;
        }
        Ok(PlacementReply::Updated)
    }

    fn set_replicas(
        &mut self,
        shard_id: u64,
        replicas: &BTreeSet<u64>,
    ) -> Result<PlacementReply, PlacementError> {
        self.known_shard(shard_id)?;
        // A finished move may have landed on a node that started draining
        // meanwhile: the map records that fact; only Drained nodes hold nothing.
        self.check_replica_set(replicas, |state| state != NodeState::Drained)?;
        if let Some(shard) = self.shards.get_mut(&shard_id) {
            shard.replicas = replicas.clone();
        }
        Ok(PlacementReply::Updated)
    }

    fn create_shard(&mut self, replicas: &BTreeSet<u64>) -> Result<PlacementReply, PlacementError> {
        // A new shard is a fresh decision, so it goes to Up nodes only.
        self.check_replica_set(replicas, |state| state == NodeState::Up)?;
        if self.shards.len() >= MAX_SHARDS {
            return Err(PlacementError::TooManyShards { limit: MAX_SHARDS });
        }
        let epoch = self.peek_epoch()?;
        let shard_id = self.next_shard_id;
        debug_assert!(!self.shards.contains_key(&shard_id));
        self.shards.insert(
            shard_id,
            ShardPlacement {
                shard_id,
                epoch,
                replicas: replicas.clone(),
            },
        );
        self.next_shard_id += 1;
        self.next_epoch = epoch + 1;
        Ok(PlacementReply::ShardCreated { shard_id, epoch })
    }

    fn begin_migration(
        &mut self,
        from_shard: u64,
        to_shard: u64,
        slots: &[u32],
    ) -> Result<PlacementReply, PlacementError> {
        self.check_begin(from_shard, Some(to_shard), slots)?;
        let (migration_id, epoch) = self.open_migration(from_shard, to_shard, slots, false)?;
        Ok(PlacementReply::MigrationBegun {
            migration_id,
            epoch,
        })
    }

    /// `CreateShard` on the source's replicas plus `BeginMigration` to it,
    /// validated as a whole before either changes anything.
    fn begin_split(
        &mut self,
        from_shard: u64,
        slots: &[u32],
    ) -> Result<PlacementReply, PlacementError> {
        let replicas = self.data_shard(from_shard)?.replicas.clone();
        self.check_replica_set(&replicas, |state| state == NodeState::Up)?;
        if self.shards.len() >= MAX_SHARDS {
            return Err(PlacementError::TooManyShards { limit: MAX_SHARDS });
        }
        // The new shard takes the next epoch and the migration the one
        // after: both must exist before anything changes.
        let shard_epoch = self.peek_epoch()?;
        if shard_epoch >= MAX_EPOCH {
            return Err(PlacementError::EpochsExhausted {
                max_epoch: MAX_EPOCH,
            });
        }
        // The target is the shard about to be created: a new data shard.
        self.check_begin(from_shard, None, slots)?;
        let PlacementReply::ShardCreated { shard_id, .. } = self.create_shard(&replicas)? else {
            unreachable!("create_shard answers ShardCreated");
        };
        let (migration_id, epoch) = self.open_migration(from_shard, shard_id, slots, true)?;
        Ok(PlacementReply::SplitBegun {
            shard_id,
            migration_id,
            epoch,
        })
    }

    /// Everything `BeginMigration` checks, changing nothing (`to_shard`
    /// `None`: a shard the split is about to create).
    fn check_begin(
        &self,
        from_shard: u64,
        to_shard: Option<u64>,
        slots: &[u32],
    ) -> Result<(), PlacementError> {
        if let Some(m) = &self.migration {
            return Err(PlacementError::MigrationInProgress { migration_id: m.id });
        }
        self.data_shard(from_shard)?;
        if let Some(to_shard) = to_shard {
            self.data_shard(to_shard)?;
            if from_shard == to_shard {
                return Err(PlacementError::SameShard {
                    shard_id: from_shard,
                });
            }
        }
        if slots.is_empty() || slots.len() > MAX_SLOTS_PER_MIGRATION {
            return Err(PlacementError::InvalidSlotCount {
                count: slots.len(),
                max: MAX_SLOTS_PER_MIGRATION,
            });
        }
        let mut previous: Option<u32> = None;
        for &slot in slots {
            if slot >= SLOT_COUNT {
                return Err(PlacementError::SlotOutOfRange { slot });
            }
            if previous.is_some_and(|p| p >= slot) {
                return Err(PlacementError::SlotsNotSorted { slot });
            }
            previous = Some(slot);
            let owner = self.slot_owners[slot as usize];
            if owner != from_shard {
                return Err(PlacementError::SlotNotOwned { slot, owner });
            }
        }
        self.peek_epoch()?;
        if self.next_migration_id.checked_add(1).is_none() {
            return Err(PlacementError::CounterExhausted {
                counter: "migration id",
            });
        }
        Ok(())
    }

    /// Records the migration (after `check_begin`); its id and epoch.
    fn open_migration(
        &mut self,
        from_shard: u64,
        to_shard: u64,
        slots: &[u32],
        new_shard: bool,
    ) -> Result<(u64, u64), PlacementError> {
        let epoch = self.peek_epoch()?;
        let id = self.next_migration_id;
        let next_id = id.checked_add(1).ok_or(PlacementError::CounterExhausted {
            counter: "migration id",
        })?;
        self.migration = Some(Migration {
            id,
            from_shard,
            to_shard,
            slots: slots.to_vec(),
            epoch,
            new_shard,
        });
        self.next_migration_id = next_id;
        self.next_epoch = epoch + 1;
        Ok((id, epoch))
    }

    fn roll_back_migration(&mut self, migration_id: u64) -> Result<PlacementReply, PlacementError> {
        let current = self.migration.as_ref().map(|m| m.id);
        let Some(m) = self.migration.take_if(|m| m.id == migration_id) else {
            return Err(PlacementError::NoSuchMigration {
                migration_id,
                current,
            });
        };
        if let Some(source) = self.shards.get_mut(&m.from_shard) {
            // The migration's epoch was handed out after the source's and
            // the target never took it (it was closed without importing).
            debug_assert!(m.epoch > source.epoch);
            source.epoch = m.epoch;
        }
        Ok(PlacementReply::MigrationRolledBack {
            migration_id,
            from_shard: m.from_shard,
            epoch: m.epoch,
        })
    }

    fn end_migration(
        &mut self,
        migration_id: u64,
        commit: bool,
    ) -> Result<PlacementReply, PlacementError> {
        let current = self.migration.as_ref().map(|m| m.id);
        let m = match self.migration.take() {
            Some(m) if m.id == migration_id => m,
            other => {
                self.migration = other;
                return Err(PlacementError::NoSuchMigration {
                    migration_id,
                    current,
                });
            }
        };
        if !commit {
            // The epoch stays consumed: the target may already have imported
            // at it before the abort was decided, so it is never reused.
            return Ok(PlacementReply::MigrationAborted { migration_id });
        }
        for &slot in &m.slots {
            // Slots move only here and only one migration runs, so the
            // source still owns what it owned at begin.
            debug_assert_eq!(self.slot_owners[slot as usize], m.from_shard);
            self.slot_owners[slot as usize] = m.to_shard;
        }
        if let Some(target) = self.shards.get_mut(&m.to_shard) {
            // Neither shard's epoch changes during a migration
            // (`advance_epoch` refuses), so this is a rise.
            debug_assert!(m.epoch > target.epoch);
            target.epoch = m.epoch;
        }
        Ok(PlacementReply::MigrationCommitted {
            migration_id,
            to_shard: m.to_shard,
            epoch: m.epoch,
        })
    }

    fn advance_epoch(&mut self, shard_id: u64) -> Result<PlacementReply, PlacementError> {
        self.data_shard(shard_id)?;
        if let Some(m) = &self.migration {
            // The migration's epoch must stay above both shards' epochs: a
            // source that moved past it could mint tokens the target would
            // then undercut for the moved resources.
            if m.from_shard == shard_id || m.to_shard == shard_id {
                return Err(PlacementError::MigrationInProgress { migration_id: m.id });
            }
        }
        let epoch = self.peek_epoch()?;
        if let Some(shard) = self.shards.get_mut(&shard_id) {
            shard.epoch = epoch;
        }
        self.next_epoch = epoch + 1;
        Ok(PlacementReply::EpochAdvanced { shard_id, epoch })
    }

    fn raise_epoch_floor(&mut self, above_epoch: u64) -> Result<PlacementReply, PlacementError> {
        if let Some(m) = &self.migration {
            // An open migration's epoch was allocated below the new floor;
            // finish or abort it first.
            return Err(PlacementError::MigrationInProgress { migration_id: m.id });
        }
        let data_shards = self.shards.len() as u64 - 1;
        let last_needed = above_epoch
            .checked_add(data_shards)
            .filter(|&e| e <= MAX_EPOCH)
            .ok_or(PlacementError::EpochsExhausted {
                max_epoch: MAX_EPOCH,
            })?;
        debug_assert!(last_needed >= above_epoch);
        self.next_epoch = self.next_epoch.max(above_epoch + 1);
        Ok(PlacementReply::Updated)
    }

    // ----- validation helpers (no mutation) -----

    fn check_new_node(&self, node_id: u64, addr: &str) -> Result<(), PlacementError> {
        if node_id == 0 {
            return Err(PlacementError::InvalidNodeId { node_id });
        }
        if self.nodes.contains_key(&node_id) {
            return Err(PlacementError::DuplicateNode { node_id });
        }
        check_addr(addr)?;
        if let Some(owner) = self.nodes.values().find(|n| n.addr == addr) {
            return Err(PlacementError::DuplicateAddr {
                owner: owner.node_id,
            });
        }
        if self.nodes.len() >= MAX_NODES {
            return Err(PlacementError::TooManyNodes { limit: MAX_NODES });
        }
        Ok(())
    }

    fn check_replica_set(
        &self,
        replicas: &BTreeSet<u64>,
        allowed: impl Fn(NodeState) -> bool,
    ) -> Result<(), PlacementError> {
        if replicas.is_empty() {
            return Err(PlacementError::NoReplicas);
        }
        if replicas.len() > MAX_REPLICAS_PER_SHARD {
            return Err(PlacementError::TooManyReplicas {
                count: replicas.len(),
                max: MAX_REPLICAS_PER_SHARD,
            });
        }
        for &node_id in replicas {
            let node = self.known_node(node_id)?;
            if !allowed(node.state) {
                return Err(PlacementError::NodeNotUp {
                    node_id,
                    state: node.state,
                });
            }
        }
        Ok(())
    }

    fn known_node(&self, node_id: u64) -> Result<&NodeEntry, PlacementError> {
        self.nodes
            .get(&node_id)
            .ok_or(PlacementError::UnknownNode { node_id })
    }

    fn known_shard(&self, shard_id: u64) -> Result<&ShardPlacement, PlacementError> {
        self.shards
            .get(&shard_id)
            .ok_or(PlacementError::UnknownShard { shard_id })
    }

    fn data_shard(&self, shard_id: u64) -> Result<&ShardPlacement, PlacementError> {
        let shard = self.known_shard(shard_id)?;
        if shard_id == META_SHARD_ID {
            return Err(PlacementError::NotADataShard { shard_id });
        }
        Ok(shard)
    }

    /// The epoch the next hand-out would use, if one is left.
    fn peek_epoch(&self) -> Result<u64, PlacementError> {
        if self.next_epoch > MAX_EPOCH {
            return Err(PlacementError::EpochsExhausted {
                max_epoch: MAX_EPOCH,
            });
        }
        Ok(self.next_epoch)
    }

    // ----- queries -----

    /// Successful commands applied, bootstrap counting as the first.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether the placement controller is paused: it makes no move by
    /// itself (repair) until resumed.
    pub fn cluster_format(&self) -> u32 {
        self.cluster_format
    }

    pub fn scheduler_paused(&self) -> bool {
        self.scheduler_paused
    }

    pub fn replication_factor(&self) -> usize {
        self.replication_factor
    }

    /// The epoch the next hand-out will use (above every epoch so far).
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch
    }

    /// The id the next `CreateShard` will use.
    pub fn next_shard_id(&self) -> u64 {
        self.next_shard_id
    }

    /// The id the next migration will get: every migration with a lower id
    /// has begun (and, unless it is the one in progress, ended).
    pub fn next_migration_id(&self) -> u64 {
        self.next_migration_id
    }

    /// The data shard that owns `slot`.
    ///
    /// # Panics
    /// If `slot >= SLOT_COUNT`: slots come from a hash modulo `SLOT_COUNT`,
    /// so a larger one is a caller bug.
    pub fn shard_of_slot(&self, slot: u32) -> u64 {
        assert!(slot < SLOT_COUNT, "slot {slot} out of range");
        self.slot_owners[slot as usize]
    }

    /// The slots `shard_id` owns, ascending.
    pub fn slots_of(&self, shard_id: u64) -> Vec<u32> {
        (0..SLOT_COUNT)
            .filter(|&slot| self.slot_owners[slot as usize] == shard_id)
            .collect()
    }

    /// The slots `shard_id` owns as maximal inclusive ranges, ascending.
    pub fn slot_ranges_of(&self, shard_id: u64) -> Vec<(u32, u32)> {
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        for slot in self.slots_of(shard_id) {
            match ranges.last_mut() {
                Some((_, end)) if *end + 1 == slot => *end = slot,
                _ => ranges.push((slot, slot)),
            }
        }
        ranges
    }

    /// Every shard, meta shard first, in id order.
    pub fn shards(&self) -> impl Iterator<Item = &ShardPlacement> {
        self.shards.values()
    }

    pub fn shard(&self, shard_id: u64) -> Option<&ShardPlacement> {
        self.shards.get(&shard_id)
    }

    /// Every node, in id order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeEntry> {
        self.nodes.values()
    }

    pub fn node(&self, node_id: u64) -> Option<&NodeEntry> {
        self.nodes.get(&node_id)
    }

    /// Shards with a replica on `node_id`, ascending.
    pub fn shards_on_node(&self, node_id: u64) -> Vec<u64> {
        self.shards
            .values()
            .filter(|s| s.replicas.contains(&node_id))
            .map(|s| s.shard_id)
            .collect()
    }

    /// The migration in progress, if any.
    pub fn migration(&self) -> Option<&Migration> {
        self.migration.as_ref()
    }
}

fn up_node(node_id: u64, addr: &str) -> NodeEntry {
    NodeEntry {
        node_id,
        addr: addr.to_owned(),
        state: NodeState::Up,
    }
}

/// Addresses are `host:port`-like: printable ASCII without spaces, so they
/// log, compare and travel in configs unambiguously.
pub(crate) fn check_addr(addr: &str) -> Result<(), PlacementError> {
    let len_bytes = addr.len();
    let reason = if addr.is_empty() {
        "empty"
    } else if len_bytes > MAX_ADDR_LEN {
        "too long"
    } else if !addr.bytes().all(|b| b.is_ascii_graphic()) {
        "not printable ASCII without spaces"
    } else {
        return Ok(());
    };
    Err(PlacementError::InvalidAddr { len_bytes, reason })
}

/// The data shard that owns `slot` in a freshly bootstrapped map: the slot
/// space cut into `shard_count` contiguous ranges of (nearly) equal size.
pub fn bootstrap_shard_of(slot: u32, shard_count: u32) -> u64 {
    debug_assert!(slot < SLOT_COUNT && shard_count >= 1);
    (u64::from(slot) * u64::from(shard_count) / u64::from(SLOT_COUNT)) + 1
}
