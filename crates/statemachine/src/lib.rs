//! The fencelock lock state machine.
//!
//! This crate owns the rules of the lock service and nothing else: exclusive
//! leases, fencing tokens, FIFO waiters with direct hand-off, `requestId`
//! dedup, expiry and the leader-change rule. [`LockTable::apply`] is a pure
//! function of `(table, command, context)`: the context carries the Raft log
//! index and term, the shard epoch and the leader-stamped time, so the crate
//! never reads a clock, draws a random number or touches I/O. Raft, RocksDB
//! and gRPC live in other crates and feed it.
//!
//! * [`types`] — ids, commands, the apply context, replies and events.
//! * [`machine`] — the table and `apply`.
//! * [`token`] — the fencing token layout.
//! * [`name`] — resource name rules.
//! * [`slots`] — resource → slot hashing and slot sets (what a shard owns).
//! * [`migrate`] — moving slots' lock state between shards (resharding).
//! * `waiters` — read access to the queued waiters.
//! * [`limits`] — every bound, in one place.
//! * [`codec`] — byte encodings of commands and snapshots.
//! * `cow_map` — the map behind the table's resources and remembered
//!   acquires, whose copy is cheap (a snapshot encodes one off the loop).
//! * [`error`] — the one error type, with retry hints.

pub mod codec;
mod cow_map;
mod dedup_key;
pub mod error;
pub mod limits;
pub mod machine;
pub mod migrate;
pub mod name;
pub mod slots;
pub mod token;
pub mod types;
mod waiters;

pub use codec::{DecodeError, FrozenTable};
pub use error::{LockError, Retry};
pub use limits::Limits;
pub use machine::{LockTable, FIRST_ATTEMPT};
pub use name::{NameError, ResourceName};
pub use slots::{slot_of, SlotSet, SLOT_COUNT};
pub use token::FencingToken;
pub use types::*;
pub use waiters::QueuedWaiter;
