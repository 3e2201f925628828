//! The values the placement map stores, the commands that change it and the
//! replies it gives.

use std::collections::BTreeSet;

/// What an operator (or the controller) declared about a node. Whether a
/// node answers right now is observed by the server, not stored here (see
/// [`crate::ClusterView`]); `Down` is the controller's replicated verdict
/// that it stopped answering for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeState {
    /// Serving; may receive replicas and leaderships.
    Up,
    /// Being emptied before maintenance: keeps what it holds until the
    /// planner moves it away, receives nothing new.
    Draining,
    /// Holds no replica (the map refuses the state otherwise); may be
    /// removed or brought back `Up`.
    Drained,
    /// Declared down by the controller after `node_down_after_ms` without
    /// an answer: receives nothing new, and every replica it holds is
    /// replaced even if it answers again meanwhile, so it never comes back
    /// as the voter it was. Once it holds nothing and answers, the
    /// controller makes it `Up` again (an empty node, filled like a new
    /// one); an operator may drain it (`Drained`) to remove it instead.
    Down,
}

/// One node of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEntry {
    /// Never 0 (0 is Raft's "no node").
    pub node_id: u64,
    /// Where peers and routers reach the node (`host:port`); unique.
    pub addr: String,
    pub state: NodeState,
}

/// Where one shard lives and which epoch its tokens carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlacement {
    pub shard_id: u64,
    /// The epoch of the shard's fencing tokens. Rises whenever the shard
    /// gains slots; 0 only for the meta shard, which mints no tokens.
    pub epoch: u64,
    /// Node ids of the shard's Raft voters; never empty.
    pub replicas: BTreeSet<u64>,
}

/// A slot migration between two data shards. While it is in progress the
/// slots still belong to `from_shard`: routing changes only on commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migration {
    /// Unique and increasing across the cluster's life: the lock state
    /// machine makes imports idempotent by this id.
    pub id: u64,
    pub from_shard: u64,
    pub to_shard: u64,
    /// Sorted, unique, all owned by `from_shard`.
    pub slots: Vec<u32>,
    /// The target's epoch once the migration commits: allocated at begin,
    /// above every epoch handed out before. If the migration is rolled back
    /// instead, the source takes the slots back at this epoch.
    pub epoch: u64,
    /// The target was created for this migration (a split, `BeginSplit`):
    /// its replicas start from the same bootstrap snapshot, and finishing
    /// the migration includes starting any that are missing.
    pub new_shard: bool,
}

/// A change to the placement map, proposed through the meta shard's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementCommand {
    /// Adds a node in state `Up`.
    AddNode { node_id: u64, addr: String },
    /// Forgets a `Drained` node (which by then holds nothing).
    RemoveNode { node_id: u64 },
    /// Declares a node `Up`, `Draining`, `Down` or `Drained` (only once
    /// empty).
    SetNodeState { node_id: u64, state: NodeState },
    /// Records a finished replica change of one shard.
    SetReplicas {
        shard_id: u64,
        replicas: BTreeSet<u64>,
    },
    /// Creates an empty data shard (for splits) on `Up` nodes, with the next
    /// shard id and a fresh epoch.
    CreateShard { replicas: BTreeSet<u64> },
    /// Starts moving `slots` from one data shard to another; allocates the
    /// target's new epoch.
    BeginMigration {
        from_shard: u64,
        to_shard: u64,
        slots: Vec<u32>,
    },
    /// The target imported the slots: they now route to it, at its new epoch.
    CommitMigration { migration_id: u64 },
    /// Gives up a migration nothing left the source for; its epoch is never
    /// handed out again.
    AbortMigration { migration_id: u64 },
    /// Ends a migration whose source took its exported slots back (after
    /// the target was closed without importing them) at the migration's
    /// epoch: the slots stay with the source, whose epoch becomes it.
    RollBackMigration { migration_id: u64 },
    /// A split, as one decision: creates an empty data shard on the
    /// source's replicas (next shard id, a fresh epoch) and begins moving
    /// `slots` to it (`BeginMigration` with a second fresh epoch). Nothing
    /// is left half-made if the orchestrator dies: the open migration names
    /// the new shard.
    BeginSplit { from_shard: u64, slots: Vec<u32> },
    /// Gives a data shard a fresh epoch, e.g. when its token positions run
    /// out (`TokenSpaceExhausted`).
    AdvanceEpoch { shard_id: u64 },
    /// Pauses (`true`) or resumes the placement controller's own moves.
    /// Restating the current value succeeds too.
    SetSchedulerPaused { paused: bool },
    /// Makes every epoch handed out from now on higher than `above_epoch`:
    /// after a restore from backup or a rebuild after losing every
    /// replica, tokens must start above any the protected systems have
    /// seen. Changes no shard's epoch (`AdvanceEpoch` then does, shard by
    /// shard). Refused while a migration is open, or without room above
    /// `above_epoch` for every data shard to take one more epoch.
    RaiseEpochFloor { above_epoch: u64 },
    /// Records that every member reads placement format `format`: the
    /// features that need it (holder values, `PlacementMap::cluster_format`)
    /// are on from this entry. Never lowers it (a lower or equal format
    /// changes nothing), so a node of an older build can no longer join
    /// without being refused (docs/operations.md, "Formats").
    RaiseClusterFormat { format: u32 },
}

/// What a successful command did. Every success bumps the map's version by
/// exactly one, including one that restates the current node state or
/// replica set: a retried proposal is harmless, and watchers can count on
/// "one success, one version".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementReply {
    NodeAdded,
    NodeRemoved,
    /// A node state or a replica set was recorded.
    Updated,
    ShardCreated {
        shard_id: u64,
        epoch: u64,
    },
    MigrationBegun {
        migration_id: u64,
        epoch: u64,
    },
    MigrationCommitted {
        migration_id: u64,
        to_shard: u64,
        epoch: u64,
    },
    MigrationAborted {
        migration_id: u64,
    },
    MigrationRolledBack {
        migration_id: u64,
        from_shard: u64,
        epoch: u64,
    },
    SplitBegun {
        shard_id: u64,
        migration_id: u64,
        epoch: u64,
    },
    EpochAdvanced {
        shard_id: u64,
        epoch: u64,
    },
}

impl PlacementReply {
    /// The epoch this reply handed out, if any.
    pub fn new_epoch(&self) -> Option<u64> {
        match *self {
            PlacementReply::ShardCreated { epoch, .. }
            | PlacementReply::MigrationBegun { epoch, .. }
            | PlacementReply::SplitBegun { epoch, .. }
            | PlacementReply::EpochAdvanced { epoch, .. } => Some(epoch),
            _ => None,
        }
    }
}
