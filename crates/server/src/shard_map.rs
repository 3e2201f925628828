//! Which slot a resource belongs to. The hash and the slot space live in
//! the state machine (`fencelock_statemachine::slots`), because shards check
//! slot ownership at apply; the slot → shard table is the placement map's
//! (see [`crate::router`]). Re-exported here for the server's callers.

pub use fencelock_statemachine::slots::{fnv1a64, slot_of, SLOT_COUNT};
