//! The one error type of the placement map and the planner.
//!
//! Every refusal is a value carrying the numbers a caller needs to act on it
//! (which node, which slot and who owns it, which migration is in the way).
//! A refused command changed nothing.

use crate::types::NodeState;

/// Why a command, bootstrap or plan was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementError {
    /// Bootstrap needs at least one node.
    NoNodes,
    /// Bootstrap shard count outside `1..=max`.
    InvalidShardCount {
        shard_count: u32,
        max: u32,
    },
    /// Replication factor outside `1..=max`.
    InvalidReplicationFactor {
        factor: usize,
        max: usize,
    },
    /// Node id 0 is Raft's "no node".
    InvalidNodeId {
        node_id: u64,
    },
    /// The address is empty, too long or not printable ASCII without spaces.
    InvalidAddr {
        len_bytes: usize,
        reason: &'static str,
    },
    DuplicateNode {
        node_id: u64,
    },
    /// Another node already has this address.
    DuplicateAddr {
        owner: u64,
    },
    TooManyNodes {
        limit: usize,
    },
    UnknownNode {
        node_id: u64,
    },
    /// The node cannot receive replicas or leadership in its state.
    NodeNotUp {
        node_id: u64,
        state: NodeState,
    },
    /// Only a `Drained` node can be removed.
    NodeNotDrained {
        node_id: u64,
        state: NodeState,
    },
    /// A node cannot be `Drained` while it holds replicas (`shard_id` is the
    /// lowest of them).
    NodeHoldsReplicas {
        node_id: u64,
        shard_id: u64,
        count: usize,
    },
    UnknownShard {
        shard_id: u64,
    },
    /// The meta shard cannot take part in migrations or epochs.
    NotADataShard {
        shard_id: u64,
    },
    /// A shard needs at least one replica.
    NoReplicas,
    TooManyReplicas {
        count: usize,
        max: usize,
    },
    TooManyShards {
        limit: usize,
    },
    /// Only one migration runs at a time, and its shards keep their epochs
    /// until it ends.
    MigrationInProgress {
        migration_id: u64,
    },
    /// The id does not name the migration in progress (`current`, if any).
    NoSuchMigration {
        migration_id: u64,
        current: Option<u64>,
    },
    /// A migration needs two different shards.
    SameShard {
        shard_id: u64,
    },
    /// A migration moves `1..=max` slots.
    InvalidSlotCount {
        count: usize,
        max: usize,
    },
    SlotOutOfRange {
        slot: u32,
    },
    /// Slots must be strictly increasing; `slot` is the first that is not.
    SlotsNotSorted {
        slot: u32,
    },
    SlotNotOwned {
        slot: u32,
        owner: u64,
    },
    /// Every epoch that fits a fencing token was handed out.
    EpochsExhausted {
        max_epoch: u64,
    },
    /// A 64-bit counter reached its end (only a forged snapshot gets there).
    CounterExhausted {
        counter: &'static str,
    },
    /// The planner was given an inconsistent view.
    InvalidView {
        reason: String,
    },
    NotAReplica {
        shard_id: u64,
        node_id: u64,
    },
    AlreadyAReplica {
        shard_id: u64,
        node_id: u64,
    },
    /// The node was observed down: it receives nothing.
    NodeDown {
        node_id: u64,
    },
    /// Leadership can only move away from a known leader.
    NoLeader {
        shard_id: u64,
    },
    AlreadyLeader {
        shard_id: u64,
        node_id: u64,
    },
    /// Draining would need an `Up` node that does not hold the shard yet, and
    /// there is none.
    CannotDrain {
        node_id: u64,
        shard_id: u64,
        up_nodes: usize,
    },
}

impl PlacementError {
    /// A stable, machine-readable name for logs and metric labels.
    pub fn code(&self) -> &'static str {
        use PlacementError::*;
        match self {
            NoNodes => "no_nodes",
            InvalidShardCount { .. } => "invalid_shard_count",
            InvalidReplicationFactor { .. } => "invalid_replication_factor",
            InvalidNodeId { .. } => "invalid_node_id",
            InvalidAddr { .. } => "invalid_addr",
            DuplicateNode { .. } => "duplicate_node",
            DuplicateAddr { .. } => "duplicate_addr",
            TooManyNodes { .. } => "too_many_nodes",
            UnknownNode { .. } => "unknown_node",
            NodeNotUp { .. } => "node_not_up",
            NodeNotDrained { .. } => "node_not_drained",
            NodeHoldsReplicas { .. } => "node_holds_replicas",
            UnknownShard { .. } => "unknown_shard",
            NotADataShard { .. } => "not_a_data_shard",
            NoReplicas => "no_replicas",
            TooManyReplicas { .. } => "too_many_replicas",
            TooManyShards { .. } => "too_many_shards",
            MigrationInProgress { .. } => "migration_in_progress",
            NoSuchMigration { .. } => "no_such_migration",
            SameShard { .. } => "same_shard",
            InvalidSlotCount { .. } => "invalid_slot_count",
            SlotOutOfRange { .. } => "slot_out_of_range",
            SlotsNotSorted { .. } => "slots_not_sorted",
            SlotNotOwned { .. } => "slot_not_owned",
            EpochsExhausted { .. } => "epochs_exhausted",
            CounterExhausted { .. } => "counter_exhausted",
            InvalidView { .. } => "invalid_view",
            NotAReplica { .. } => "not_a_replica",
            AlreadyAReplica { .. } => "already_a_replica",
            NodeDown { .. } => "node_down",
            NoLeader { .. } => "no_leader",
            AlreadyLeader { .. } => "already_leader",
            CannotDrain { .. } => "cannot_drain",
        }
    }
}

impl std::fmt::Display for PlacementError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use PlacementError::*;
        match self {
            NoNodes => write!(f, "a cluster needs at least one node"),
            InvalidShardCount { shard_count, max } => {
                write!(f, "shard count {shard_count} is outside 1..={max}")
            }
            InvalidReplicationFactor { factor, max } => {
                write!(f, "replication factor {factor} is outside 1..={max}")
            }
            InvalidNodeId { node_id } => write!(f, "node id {node_id} is reserved"),
            InvalidAddr { len_bytes, reason } => {
                write!(f, "node address of {len_bytes} bytes is invalid: {reason}")
            }
            DuplicateNode { node_id } => write!(f, "node {node_id} already exists"),
            DuplicateAddr { owner } => write!(f, "address already used by node {owner}"),
            TooManyNodes { limit } => write!(f, "the cluster already has {limit} nodes"),
            UnknownNode { node_id } => write!(f, "no node {node_id}"),
            NodeNotUp { node_id, state } => {
                write!(f, "node {node_id} is {state:?}, not Up")
            }
            NodeNotDrained { node_id, state } => {
                write!(f, "node {node_id} is {state:?}; only a Drained node can be removed")
            }
            NodeHoldsReplicas {
                node_id,
                shard_id,
                count,
            } => write!(
                f,
                "node {node_id} still holds {count} replicas (shard {shard_id} among them)"
            ),
            UnknownShard { shard_id } => write!(f, "no shard {shard_id}"),
            NotADataShard { shard_id } => write!(f, "shard {shard_id} is the meta shard"),
            NoReplicas => write!(f, "a shard needs at least one replica"),
            TooManyReplicas { count, max } => {
                write!(f, "{count} replicas exceed the maximum of {max}")
            }
            TooManyShards { limit } => write!(f, "the cluster already has {limit} shards"),
            MigrationInProgress { migration_id } => {
                write!(f, "migration {migration_id} is in progress")
            }
            NoSuchMigration {
                migration_id,
                current: Some(current),
            } => write!(
                f,
                "migration {migration_id} is not in progress (migration {current} is)"
            ),
            NoSuchMigration {
                migration_id,
                current: None,
            } => write!(
                f,
                "migration {migration_id} is not in progress (none is)"
            ),
            SameShard { shard_id } => {
                write!(f, "cannot migrate shard {shard_id} onto itself")
            }
            InvalidSlotCount { count, max } => {
                write!(f, "a migration moves 1..={max} slots, not {count}")
            }
            SlotOutOfRange { slot } => write!(f, "slot {slot} is out of range"),
            SlotsNotSorted { slot } => {
                write!(f, "slots must be strictly increasing; {slot} is out of order")
            }
            SlotNotOwned { slot, owner } => {
                write!(f, "slot {slot} belongs to shard {owner}")
            }
            EpochsExhausted { max_epoch } => {
                write!(f, "every epoch up to {max_epoch} was handed out")
            }
            CounterExhausted { counter } => write!(f, "the {counter} counter is exhausted"),
            InvalidView { reason } => write!(f, "inconsistent cluster view: {reason}"),
            NotAReplica { shard_id, node_id } => {
                write!(f, "node {node_id} is not a replica of shard {shard_id}")
            }
            AlreadyAReplica { shard_id, node_id } => {
                write!(f, "node {node_id} already holds shard {shard_id}")
            }
            NodeDown { node_id } => write!(f, "node {node_id} is observed down"),
            NoLeader { shard_id } => write!(f, "shard {shard_id} has no known leader"),
            AlreadyLeader { shard_id, node_id } => {
                write!(f, "node {node_id} already leads shard {shard_id}")
            }
            CannotDrain {
                node_id,
                shard_id,
                up_nodes,
            } => write!(
                f,
                "cannot drain node {node_id}: shard {shard_id} has no Up node to move to ({up_nodes} Up nodes, all already holding it)"
            ),
        }
    }
}

impl std::error::Error for PlacementError {}
