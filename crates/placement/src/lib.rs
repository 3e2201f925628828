//! Placement: the cluster map the meta shard replicates, and the pure
//! planner that decides what to move where.
//!
//! Like a storage controller that keeps the *intended* placement in its own
//! durable store and reconciles the *observed* cluster towards it, this crate
//! keeps the two apart:
//!
//! * **Intent** — [`PlacementMap`], written only through Raft. The meta shard
//!   ([`META_SHARD_ID`]) applies committed [`PlacementCommand`]s to it on
//!   every replica: nodes and their declared states, each shard's replica
//!   set and epoch, the slot → shard table, the one migration in progress
//!   and the global epoch counter that fencing tokens rest on. `apply` is
//!   deterministic and total, so every replica holds the same map.
//! * **Observation** — [`ClusterView`]: the map's replica sets joined with
//!   what the server sees right now (which node leads each shard, which
//!   nodes do not answer). It is never replicated; it goes stale and is
//!   rebuilt.
//!
//! The planner ([`plan_balance`], [`plan_drain`]) turns an observation into
//! [`Action`]s. The server executes each one against the shard's Raft group
//! and, once a replica move has finished, records it in the map with
//! `SetReplicas`: intent follows completed facts, and a plan is only ever a
//! proposal computed from a snapshot of both. Leaderships are observation
//! only; the map never stores them.
//!
//! The crate does no I/O and reads no clock or randomness
//! (`tests/no_io_dependencies.rs` enforces it).
//!
//! * [`limits`] — every bound, in one place.
//! * [`types`] — node, shard and migration records, commands, replies.
//! * [`map`] — the map and its `apply`.
//! * [`codec`] — command and snapshot encodings.
//! * [`format`] — the placement-log format each command needs.
//! * [`view`] — the observed view, actions and `simulate`.
//! * [`planner`] — balance and drain plans.
//! * [`error`] — the one error type.

pub mod codec;
pub mod error;
pub mod format;
mod invariants;
pub mod limits;
pub mod map;
pub mod planner;
pub mod types;
pub mod view;

pub use codec::DecodeError;
pub use error::PlacementError;
pub use format::{
    FIRST_PLACEMENT_FORMAT, IMPORT_AT_CLOCK_FORMAT, MODES_FORMAT, PLACEMENT_FORMAT, VALUES_FORMAT,
};
pub use limits::*;
pub use map::PlacementMap;
pub use planner::{
    plan_balance, plan_drain, plan_load_leaders, plan_rebalance, plan_repair, plan_split, LoadRule,
    ShardLoad, DEFAULT_LOAD_GAIN_PERCENT, DEFAULT_LOAD_MIN_WEIGHT, HELD_LOCKS_PER_WRITE,
    REBALANCE_REPLICA_SPREAD,
};
pub use types::*;
pub use view::{simulate, Action, ClusterView, ShardView};
