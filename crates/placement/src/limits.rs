//! Every bound the placement map and the planner enforce, in one place.
//!
//! The map is applied on every replica of the meta shard, so its limits are
//! compile-time constants rather than configuration: two replicas built from
//! the same code can never disagree about whether a command fits.

/// Size of the slot space. Fixed forever: a resource's slot is a hash of its
/// name modulo this number, so changing it would move every resource.
/// The resource → slot hash itself lives with the lock state machine.
pub const SLOT_COUNT: u32 = 1024;

/// The meta shard: the Raft group that replicates this map. It owns no slots
/// and never mints fencing tokens, so its epoch stays 0.
pub const META_SHARD_ID: u64 = 0;

/// Nodes the map may name at once (including draining and drained ones).
pub const MAX_NODES: usize = 64;

/// Shards, the meta shard included. Shard ids are never reused, so this also
/// bounds the shard id space: ids are exactly `0..next_shard_id`.
pub const MAX_SHARDS: usize = 1024;

/// Data shards [`crate::PlacementMap::bootstrap`] may create: every one of
/// them must own at least one slot, and the meta shard needs its place too.
pub const MAX_BOOTSTRAP_SHARDS: u32 = (MAX_SHARDS - 1) as u32;

/// Longest node address (`host:port`), in bytes.
pub const MAX_ADDR_LEN: usize = 256;

/// Largest replication factor a cluster may be bootstrapped with.
pub const MAX_REPLICATION_FACTOR: usize = 7;

/// Largest replica set of one shard. More voters make every commit wait for
/// more acknowledgements; seven already survives three failures.
pub const MAX_REPLICAS_PER_SHARD: usize = 7;

/// Slots one migration may move. A migration's data travels through Raft
/// entries of both shards, so its size is bounded; half the slot space is
/// enough to split any shard in two in one step.
pub const MAX_SLOTS_PER_MIGRATION: usize = (SLOT_COUNT / 2) as usize;

/// Largest epoch the map hands out: the epoch field of a fencing token is 23
/// bits wide (see `fencelock_statemachine::token`), and a test checks that
/// the two constants agree.
pub const MAX_EPOCH: u64 = (1 << 23) - 1;

/// Actions one plan may hold. A full drain needs at most one leader transfer
/// and one replica move per shard, so it always fits in one plan; a very
/// skewed rebalance may not, and then planning again continues the work.
pub const MAX_ACTIONS_PER_PLAN: usize = 2 * MAX_SHARDS;

// Every bootstrap layout gives each data shard at least one slot.
const _: () = assert!(MAX_BOOTSTRAP_SHARDS <= SLOT_COUNT);
// Every shard id fits in the map and the epochs bootstrap hands out fit a token.
const _: () = assert!((MAX_BOOTSTRAP_SHARDS as u64) < MAX_EPOCH);
const _: () = assert!(MAX_REPLICATION_FACTOR <= MAX_REPLICAS_PER_SHARD);
const _: () = assert!(MAX_SLOTS_PER_MIGRATION <= SLOT_COUNT as usize);
